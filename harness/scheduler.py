"""kube-scheduler of the control plane's own release, under a scheduler name of its own.

It schedules only the pods that name it (``schedulerName``), binds onto registered Nodes (no kubelet
is needed for a binding), and runs every plugin of the release with its default feature gates: DRA
with partitionable devices, consumable capacity, admin access and device taints. The oracle of the
GPUClass tests: what it binds is what would start, as far as scheduling goes.
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import yaml

from hack.devcluster import ClusterInfo
from harness.node import _component_flags, build_node

# The flags of _component_flags the config file does not carry (client and leader election are there).
_SERVING_FLAGS = (
    "--authentication-kubeconfig",
    "--authorization-kubeconfig",
    "--bind-address",
    "--secure-port",
)


@contextlib.contextmanager
def kube_scheduler(cluster: ClusterInfo, scheduler_name: str) -> Iterator[Path]:
    """Run it until the block ends; yields its log's path."""
    bin_dir = build_node()
    with tempfile.TemporaryDirectory(prefix="kube-scheduler-") as directory:
        config = Path(directory) / "config.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {"kubeconfig": cluster.kubeconfig, "qps": 200, "burst": 400},
                    "leaderElection": {"leaderElect": False},
                    "percentageOfNodesToScore": 100,
                    "profiles": [{"schedulerName": scheduler_name}],
                }
            )
        )
        log_path = Path(directory) / "scheduler.log"
        flags = [f for f in _component_flags(cluster.kubeconfig) if f.split("=", 1)[0] in _SERVING_FLAGS]
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [str(bin_dir / "kube-scheduler"), f"--config={config}", *flags],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            try:
                yield log_path
            finally:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
