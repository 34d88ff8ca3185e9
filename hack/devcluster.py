"""The local control plane for tests, benchmarks and the demo: build it (once), start it, wait, stop it.

Decides: where the control plane runs (a fresh temp dir per session, so runs never share state),
when it counts as up (devcluster writes ``ready`` after /readyz answers), and its API server's
NodePort range (Kubernetes' default unless a caller asks for another). Its Service CIDRs are the
launcher's, dual-stack with IPv4 primary (a Service naming no family is single-stack IPv4). Does
not: fake any part of Kubernetes. Set ``COZY_TEST_KUBECONFIG`` to run the suite against another
cluster (kind, say) instead; the suite then creates and deletes its own namespaces and
cluster-scoped test objects there.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_SECONDS = 120.0


@dataclass(frozen=True)
class ClusterInfo:
    kubeconfig: str
    server: str
    bin_dir: Path | None  # where kubectl is; None for an external cluster
    ready_seconds: float | None = None

    @property
    def kubectl(self) -> str:
        return str(self.bin_dir / "kubectl") if self.bin_dir else "kubectl"


def build_controlplane() -> Path:
    """Build (or find cached) binaries; returns their directory."""
    result = subprocess.run(
        [str(ROOT / "hack" / "build-controlplane.sh")], check=True, stdout=subprocess.PIPE, text=True
    )
    return Path(result.stdout.strip().splitlines()[-1])


class LocalControlPlane:
    """A context manager running ``devcluster`` until exit; stdin ties its life to ours."""

    def __init__(self, bin_dir: Path | None = None, node_port_range: str | None = None) -> None:
        """``node_port_range`` ("first-last") is the API server's ``--service-node-port-range``;
        None keeps Kubernetes' default (30000-32767)."""
        self.bin_dir = bin_dir or build_controlplane()
        self.node_port_range = node_port_range
        self.dir = Path(tempfile.mkdtemp(prefix="devcluster-"))
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ClusterInfo:
        log = (self.dir / "devcluster.log").open("wb")
        ports = ["-service-node-port-range", self.node_port_range] if self.node_port_range else []
        self.process = subprocess.Popen(
            [str(self.bin_dir / "devcluster"), "-dir", str(self.dir), "-exit-on-stdin-close", *ports],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        ready = self.dir / "ready"
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while not ready.exists():
            if self.process.poll() is not None:
                raise RuntimeError(f"devcluster exited: {(self.dir / 'devcluster.log').read_text()[-3000:]}")
            if time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise TimeoutError(
                    f"control plane not ready in {READY_TIMEOUT_SECONDS}s; see {self.dir}/logs"
                )
            time.sleep(0.1)  # polling a file the launcher writes, bounded by the deadline above
        info = json.loads(ready.read_text())
        return ClusterInfo(
            kubeconfig=info["kubeconfig"],
            server=info["server"],
            bin_dir=self.bin_dir,
            ready_seconds=info["readySeconds"],
        )

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.process is None:
            return
        if self.process.stdin:
            self.process.stdin.close()  # devcluster stops its children and etcd
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None


def external_cluster() -> ClusterInfo | None:
    kubeconfig = os.environ.get("COZY_TEST_KUBECONFIG")
    if not kubeconfig:
        return None
    return ClusterInfo(kubeconfig=kubeconfig, server="", bin_dir=None)
