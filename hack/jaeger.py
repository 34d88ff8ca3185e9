"""A real Jaeger v2 for tests and the demo: build it (once), start it, wait until it answers, query it.

Decides: how Jaeger runs here (``hack/build-tool.sh jaeger`` builds
``github.com/jaegertracing/jaeger/cmd/jaeger`` from the pin in ``hack/tools/jaeger/go.mod``; one
process with in-memory storage, OTLP/HTTP in and the HTTP query API out, both on free ports of
127.0.0.1, from a config written here), when it counts as up (its query API answers and its OTLP
receiver accepts an empty export), and how its traces are read back (the query API's v3 endpoints,
which return OTLP JSON with span links and their attributes intact). Does not: render anything
(``hack.waterfall`` does), keep anything after it stops, or fake any part of Jaeger.

    python -m hack.jaeger     runs one in the foreground and prints where to send spans
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import httpx
import yaml

from hack.waterfall import Span, spans_from_otlp

ROOT: Final = Path(__file__).resolve().parents[1]
READY_TIMEOUT_SECONDS: Final = 60.0
STOP_TIMEOUT_SECONDS: Final = 10.0
# The in-memory store's bound: far above what a test or the demo sends.
MAX_TRACES: Final = 200_000


def build_jaeger() -> Path:
    """Build (or find cached) the jaeger binary; returns its path."""
    result = subprocess.run(
        [str(ROOT / "hack" / "build-tool.sh"), "jaeger"], check=True, stdout=subprocess.PIPE, text=True
    )
    return Path(result.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def config(otlp_port: int, query_port: int, query_grpc_port: int) -> dict[str, Any]:
    """Jaeger v2's configuration (an OpenTelemetry Collector's): OTLP/HTTP receiver -> batch ->
    the storage exporter, into one in-memory store the query extension reads."""
    return {
        "service": {
            "extensions": ["jaeger_storage", "jaeger_query"],
            "pipelines": {
                "traces": {
                    "receivers": ["otlp"],
                    "processors": ["batch"],
                    "exporters": ["jaeger_storage_exporter"],
                }
            },
            # No self-metrics endpoint (8888 would clash between runs) and no self-tracing.
            "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "info"}},
        },
        "extensions": {
            "jaeger_storage": {"backends": {"memstore": {"memory": {"max_traces": MAX_TRACES}}}},
            "jaeger_query": {
                "storage": {"traces": "memstore"},
                "enable_tracing": False,
                "http": {"endpoint": f"127.0.0.1:{query_port}"},
                "grpc": {"endpoint": f"127.0.0.1:{query_grpc_port}"},
            },
        },
        "receivers": {"otlp": {"protocols": {"http": {"endpoint": f"127.0.0.1:{otlp_port}"}}}},
        "processors": {"batch": {"timeout": "100ms"}},
        "exporters": {"jaeger_storage_exporter": {"trace_storage": "memstore"}},
    }


@dataclass(frozen=True)
class Jaeger:
    """A running Jaeger: where to send spans and where to ask for them."""

    otlp_endpoint: str  # OTEL_EXPORTER_OTLP_ENDPOINT for the operators
    query_url: str  # the HTTP query API (/api/services, /api/traces, /api/v3/...)
    log_path: Path

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def services(self) -> list[str]:
        response = httpx.get(f"{self.query_url}/api/services", timeout=10)
        response.raise_for_status()
        return sorted(response.json().get("data") or [])

    def find_spans(self, service: str, since: datetime, limit: int = 10_000) -> list[Span]:
        """Every span of ``service``'s traces that started after ``since``, as Jaeger stored them
        (raw: no clock-skew or other adjustment), from the v3 query API's OTLP JSON."""
        params = {
            "query.service_name": service,
            "query.start_time_min": _rfc3339(since),
            "query.start_time_max": _rfc3339(datetime.now(UTC) + timedelta(minutes=1)),
            "query.num_traces": str(limit),
            "query.raw_traces": "true",
        }
        response = httpx.get(f"{self.query_url}/api/v3/traces", params=params, timeout=30)
        if response.status_code == 404:  # "No traces found"
            return []
        response.raise_for_status()
        return spans_from_otlp(response.json().get("result") or {})

    def trace(self, trace_id: str) -> list[Span]:
        """One trace by id (hex); empty when Jaeger has none."""
        response = httpx.get(
            f"{self.query_url}/api/v3/traces/{trace_id}", params={"raw_traces": "true"}, timeout=30
        )
        if response.status_code == 404:
            return []
        response.raise_for_status()
        return spans_from_otlp(response.json().get("result") or {})


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _answers(jaeger: Jaeger) -> bool:
    """The query API lists services and the OTLP receiver accepts an (empty) export."""
    try:
        services = httpx.get(f"{jaeger.query_url}/api/services", timeout=2)
        export = httpx.post(
            f"{jaeger.otlp_endpoint}/v1/traces",
            content=b"{}",
            headers={"Content-Type": "application/json"},
            timeout=2,
        )
    except httpx.TransportError:
        return False
    return services.status_code == 200 and export.status_code == 200


@contextlib.contextmanager
def running_jaeger(workdir: Path | None = None, binary: Path | None = None) -> Iterator[Jaeger]:
    """Jaeger, running until the block exits; its config and log go to ``workdir`` (a fresh
    temporary directory when not given)."""
    binary = binary or build_jaeger()
    directory = workdir or Path(tempfile.mkdtemp(prefix="jaeger-"))
    directory.mkdir(parents=True, exist_ok=True)
    otlp_port, query_port, grpc_port = free_port(), free_port(), free_port()
    config_path = directory / "jaeger.yaml"
    config_path.write_text(yaml.safe_dump(config(otlp_port, query_port, grpc_port), sort_keys=False))
    jaeger = Jaeger(
        otlp_endpoint=f"http://127.0.0.1:{otlp_port}",
        query_url=f"http://127.0.0.1:{query_port}",
        log_path=directory / "jaeger.log",
    )
    with jaeger.log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(binary), "--config", str(config_path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=directory,
        )
    try:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while not _answers(jaeger):
            if process.poll() is not None:
                raise RuntimeError(f"jaeger exited with {process.returncode}:\n{jaeger.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"jaeger not ready after {READY_TIMEOUT_SECONDS}s:\n{jaeger.log_tail()}")
            time.sleep(0.1)  # the poll interval of a bounded readiness poll
        yield jaeger
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m hack.jaeger", description=__doc__)
    parser.parse_args(argv)
    with running_jaeger() as jaeger:
        print(f"Jaeger is up (log: {jaeger.log_path})")
        print(f"  OTEL_EXPORTER_OTLP_ENDPOINT={jaeger.otlp_endpoint}")
        print(f"  query API: {jaeger.query_url}/api/services")
        print("Ctrl-C stops it.")
        stop = False

        def on_signal(_signum: int, _frame: object) -> None:
            nonlocal stop
            stop = True

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        while not stop:
            signal.pause()


if __name__ == "__main__":
    main()
