"""Run an operator as a subprocess (``python -m operators.<name>``), the way it runs in a Pod.

The operator gets a kubeconfig of its own (in the tests: a TokenRequest token of its ServiceAccount,
so RBAC sees exactly what the Deployment would), a free metrics port, and a log file whose tail is
shown when a test fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class RunningOperator:
    process: asyncio.subprocess.Process
    log_path: Path
    metrics_port: int
    health_port: int

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    async def healthz(self) -> int:
        async with httpx.AsyncClient() as client:
            response = await client.get(f"http://127.0.0.1:{self.health_port}/healthz", timeout=5)
        return response.status_code

    async def scrape(self, names: Sequence[str] = ()) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample served on the metrics port: (name, sorted labels) -> value. With ``names``,
        only those samples (the server's ``name[]`` filter: no other collector runs for the scrape)."""
        params = httpx.QueryParams([("name[]", name) for name in names])
        async with httpx.AsyncClient() as client:
            response = await client.get(
                f"http://127.0.0.1:{self.metrics_port}/metrics", params=params, timeout=5
            )
        response.raise_for_status()
        samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return samples


@contextlib.asynccontextmanager
async def operator_process(
    module: str,
    kubeconfig: str,
    args: Sequence[str],
    log_path: Path,
    extra_env: Mapping[str, str] | None = None,
    python_args: Sequence[str] = (),
) -> AsyncIterator[RunningOperator]:
    """``python_args`` go before ``-m module`` (a benchmark's ``-m cProfile -o FILE``)."""
    port, health_port = free_port(), free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    env.pop("KUBECONFIG", None)
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *python_args,
            "-m",
            module,
            "--kubeconfig",
            kubeconfig,
            "--metrics-address",
            "127.0.0.1",
            "--metrics-port",
            str(port),
            "--health-port",
            str(health_port),
            *args,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            cwd=ROOT,
            env=env,
        )
    running = RunningOperator(process, log_path, port, health_port)
    try:
        yield running
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), timeout=15)
            except TimeoutError:
                process.kill()
                await process.wait()
