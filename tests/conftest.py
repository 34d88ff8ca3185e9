"""Fixtures shared by every test.

Unit tests use none of these. Integration tests get ``cluster`` (the local control plane, started
once per session, or the cluster named by ``COZY_TEST_KUBECONFIG``), ``kube`` (an admin client) and
``namespace`` (a fresh namespace per test, deleted afterwards) and ``lb`` (the session's MetalLB).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator, Iterator

import pytest

from hack.devcluster import ClusterInfo, LocalControlPlane, external_cluster
from hack.metallb import MetalLB
from harness.loadbalancer import load_balancer, load_balancer_session
from harness.waiting import wait_for_object
from shared.kube import Kube
from shared.resources import NAMESPACES, PODS, SERVICE_ACCOUNTS


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration/" in str(item.path).replace(os.sep, "/"):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def cluster() -> Iterator[ClusterInfo]:
    external = external_cluster()
    if external:
        yield external
        return
    with LocalControlPlane() as info:
        yield info


@pytest.fixture(scope="session")
async def kube(cluster: ClusterInfo) -> AsyncIterator[Kube]:
    # The first load_balancer(kube) starts MetalLB, later ones share it; it stops here, before the
    # control plane does.
    async with load_balancer_session():
        yield await Kube.connect(cluster.kubeconfig)


@pytest.fixture
async def namespace(kube: Kube, request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A namespace named after the test (plus a short hash, so reruns and long names stay valid)."""
    digest = hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:6]
    stem = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:40].strip("-")
    name = f"t-{stem}-{digest}"
    await kube.create(
        NAMESPACES.path(), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    # A Pod is refused until the service-account controller has made the namespace's default one.
    await wait_for_object(kube, SERVICE_ACCOUNTS, "default", lambda o: o is not None, namespace=name)
    yield name
    # No kubelet confirms a bound Pod's graceful deletion here, so Pods go first, at once; otherwise
    # the namespace would stay Terminating (and its Pods would still count for GPU inventory).
    for pod in (await kube.list(PODS.path(name)))["items"]:
        await kube.delete(PODS.path(name, pod["metadata"]["name"]), grace_period_seconds=0)
    await kube.delete(NAMESPACES.path(name=name))


@pytest.fixture
async def lb(kube: Kube) -> AsyncIterator[MetalLB]:
    """MetalLB (one per session), answering every Service whose address is in a served pool."""
    async with load_balancer(kube) as balancer:
        yield balancer
