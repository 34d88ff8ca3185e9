"""No key material on disk: a client that starts, re-authenticates and stops leaves nothing behind.

The local control plane's kubeconfig embeds its client certificate, key and CA as data (as most
kubeconfigs a hoster runs the operator with outside a Pod do). Every start, every re-reading of the
credentials after a 401 and a SIGTERM must leave ``TMPDIR`` as it was: a key written to a file there
outlives the process, and every ``make demo`` or test run would add three.
"""

from __future__ import annotations

import signal
import tempfile
from pathlib import Path

import httpx
import pytest

from hack.devcluster import ClusterInfo
from harness.operators import operator_process
from harness.waiting import eventually
from shared.kube import Kube
from shared.resources import NAMESPACES

REAUTHENTICATIONS = 3
STARTS = 2


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh TMPDIR for this process (and ``tempfile``'s cached choice of it) and its children."""
    directory = tmp_path / "tmp"
    directory.mkdir()
    monkeypatch.setenv("TMPDIR", str(directory))
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    return directory


async def test_connecting_and_re_authenticating_write_no_file(cluster: ClusterInfo, scratch: Path) -> None:
    kube = await Kube.connect(cluster.kubeconfig)
    try:
        for _ in range(REAUTHENTICATIONS):
            await kube._reauthenticate(kube._generation)
            assert (await kube.list(NAMESPACES.path()))["kind"] == "NamespaceList"
    finally:
        await kube.close()
    assert sorted(scratch.iterdir()) == []


async def test_an_operator_that_starts_and_is_stopped_leaves_no_file(
    cluster: ClusterInfo, scratch: Path, tmp_path: Path
) -> None:
    for start in range(STARTS):
        log = tmp_path / f"operator-{start}.log"
        args = ["--leader-elect=false"]
        async with operator_process(
            "operators.gpuclass", cluster.kubeconfig, args, log, extra_env={"TMPDIR": str(scratch)}
        ) as running:

            async def healthy() -> bool:
                assert running.process.returncode is None, running.log_tail()
                try:
                    return await running.healthz() == 200
                except httpx.HTTPError:
                    return False  # not serving yet

            await eventually(healthy, what="the operator's /healthz", timeout=60)
            running.process.send_signal(signal.SIGTERM)
            assert await running.process.wait() == 0, running.log_tail()
    assert sorted(scratch.iterdir()) == []
