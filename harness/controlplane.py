"""A benchmark scenario on a local control plane of its own (``hack.devcluster.LocalControlPlane``).

Decides: how a scenario that needs a fresh cluster runs (its coroutine given the cluster and the
control plane's directory, where operator logs go; the API server's NodePort range when the scenario
asks for one), that a failure keeps that directory for a look (said with the scenario's name), and
that a success removes it. Does not: fill the cluster, or share one control plane between scenarios.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from hack.devcluster import ClusterInfo, LocalControlPlane

T = TypeVar("T")


def on_own_control_plane(
    name: str,
    scenario: Callable[[ClusterInfo, Path], Coroutine[Any, Any, T]],
    say: Callable[[str], None],
    node_port_range: str | None = None,
) -> T:
    """Start a control plane (its API server's ``--service-node-port-range`` ``node_port_range``,
    Kubernetes' default when None), run ``scenario(cluster, its directory)`` to the end, stop it."""
    say(f"{name}: starting a local control plane of its own")
    control_plane = LocalControlPlane(node_port_range=node_port_range)
    with control_plane as cluster:
        say(f"{name}: control plane ready in {cluster.ready_seconds or 0:.1f}s")
        try:
            result = asyncio.run(scenario(cluster, control_plane.dir))
        except BaseException:
            say(f"{name}: failed; the control plane's files and operator logs stay in {control_plane.dir}")
            raise
    shutil.rmtree(control_plane.dir, ignore_errors=True)
    return result
