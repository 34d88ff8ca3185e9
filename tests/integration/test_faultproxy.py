"""The fault proxy (harness/faultproxy.py) breaks the network between ``shared.kube.Kube`` and
the real API server the way each of its modes promises, and forwarding again heals it.

Each test talks to the API server through its own proxy, with a client whose timeouts are short
(``CLIENT_TIMEOUT``), so a call that gets no answer fails in seconds. The client reuses its open
(kept-alive) connection for consecutive calls, which is what lets a test tell "the connection it has"
from "a new connection".
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hack.devcluster import ClusterInfo
from harness.faultproxy import (
    LISTEN_HOST,
    FaultProxy,
    Mode,
    fault_proxy,
    kubeconfig_server,
    proxy_kubeconfig,
)
from shared.kube import NO_ANSWER, ApiTimeoutError, Kube, Timeout
from shared.resources import NAMESPACES, Resource

# A call through the proxy waits this long for a connection and for each read: short, so that a
# blackholed call fails quickly, yet far above what the local API server needs.
CLIENT_TIMEOUT_SECONDS = 2.0
CLIENT_TIMEOUT = Timeout(CLIENT_TIMEOUT_SECONDS, connect=CLIENT_TIMEOUT_SECONDS)
# A refused call fails at once, well before any timeout could fire.
REFUSED_WITHIN_SECONDS = CLIENT_TIMEOUT_SECONDS / 2
# Upper bound of every wait on a condition here.
WAIT_SECONDS = 30.0
# An object every cluster has, read to see whether a call gets through.
PROBE = NAMESPACES.path(name="default")
SELF_SUBJECT_ACCESS_REVIEWS = Resource(
    "authorization.k8s.io/v1", "selfsubjectaccessreviews", namespaced=False
)


@pytest.fixture
async def proxy(cluster: ClusterInfo) -> AsyncIterator[FaultProxy]:
    async with fault_proxy(kubeconfig_server(cluster.kubeconfig)) as running:
        yield running


@pytest.fixture
async def proxied(cluster: ClusterInfo, proxy: FaultProxy, tmp_path: Path) -> Kube:
    """An admin client whose every call goes through ``proxy`` (connected while it forwards)."""
    kubeconfig = proxy_kubeconfig(cluster.kubeconfig, proxy, tmp_path / "proxied.kubeconfig")
    return await Kube.connect(kubeconfig, timeout=CLIENT_TIMEOUT)


async def answers(kube: Kube) -> bool:
    found = await kube.get(PROBE)
    return found is not None and found["metadata"]["name"] == "default"


async def connected(proxy: FaultProxy, client: Kube) -> int:
    """The proxy's open connections once ``client`` got an answer through it (one at least: its
    kept connection)."""
    assert await answers(client)
    assert proxy.connections >= 1
    return proxy.connections


def now() -> float:
    return asyncio.get_running_loop().time()


async def test_forward_passes_tls_and_credentials_through(proxy: FaultProxy, proxied: Kube) -> None:
    assert proxy.mode is Mode.FORWARD
    assert await answers(proxied)
    # A write too: the client certificate reached the API server, which authorised it as admin.
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"verb": "delete", "resource": "namespaces"}},
    }
    answer = await proxied.create(SELF_SUBJECT_ACCESS_REVIEWS.path(), review)
    assert answer["status"]["allowed"] is True
    assert proxy.accepted >= 1
    assert proxy.held == 0


async def test_refuse_closes_connections_and_fails_fast(proxy: FaultProxy, proxied: Kube) -> None:
    assert await answers(proxied)  # the client holds an open connection now
    assert proxy.connections >= 1

    await proxy.set_mode(Mode.REFUSE)
    assert proxy.connections == 0
    started = now()
    with pytest.raises(NO_ANSWER):
        await proxied.get(PROBE)
    assert now() - started < REFUSED_WITHIN_SECONDS, "a refused call must fail at once, not time out"
    # Refused at the TCP level, as a stopped API server's port is.
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection(LISTEN_HOST, proxy.port)

    await proxy.set_mode(Mode.FORWARD)
    assert await answers(proxied)


async def test_blackhole_times_calls_out_on_open_and_new_connections(
    proxy: FaultProxy, proxied: Kube
) -> None:
    open_before = await connected(proxy, proxied)

    await proxy.set_mode(Mode.BLACKHOLE)
    # The open connection stays open (no reset tells the client anything) and answers nothing.
    assert proxy.connections == open_before
    with pytest.raises(ApiTimeoutError):
        await proxied.get(PROBE)
    # The client dropped the connection that timed out; its next call opens a new one, which is
    # accepted and held: the TLS handshake never gets an answer.
    accepted = proxy.accepted
    with pytest.raises(ApiTimeoutError):
        await proxied.get(PROBE)
    assert proxy.accepted > accepted
    assert proxy.held >= 1

    await proxy.set_mode(Mode.FORWARD)
    assert await answers(proxied)


async def test_strand_leaves_open_connections_half_open_and_serves_new_ones(
    proxy: FaultProxy, proxied: Kube
) -> None:
    open_before = await connected(proxy, proxied)

    assert proxy.strand() == open_before
    assert proxy.mode is Mode.FORWARD  # the mode is unchanged: new connections are forwarded
    # The kept connection stays open (no reset tells the client anything) and answers nothing...
    with pytest.raises(ApiTimeoutError):
        await proxied.get(PROBE)
    # The timeout retired the client's pool: its next call dials a new connection, which is served.
    accepted = proxy.accepted
    started = now()
    assert await answers(proxied)
    assert now() - started < CLIENT_TIMEOUT_SECONDS
    assert proxy.accepted == accepted + 1
    assert proxy.connections > proxy.stranded


async def test_hang_serves_open_connections_and_holds_new_ones(
    cluster: ClusterInfo, proxy: FaultProxy, proxied: Kube, tmp_path: Path
) -> None:
    assert await answers(proxied)
    newcomer = proxy_kubeconfig(cluster.kubeconfig, proxy, tmp_path / "newcomer.kubeconfig")

    await proxy.set_mode(Mode.HANG)
    # The connection the client has keeps working...
    assert await answers(proxied)
    # ...while a new client's first connection is accepted and held, unanswered.
    late = await Kube.connect(newcomer, timeout=CLIENT_TIMEOUT)  # credentials only: no call yet
    connecting = asyncio.create_task(answers(late))
    try:
        await proxy.wait_until(lambda p: p.held >= 1, WAIT_SECONDS, "the new client's connection held")
        assert not connecting.done(), "a held connection was answered"

        # Forwarding again connects the held connection upstream: the waiting client gets through.
        await proxy.set_mode(Mode.FORWARD)
        assert await asyncio.wait_for(connecting, WAIT_SECONDS)
    finally:
        connecting.cancel()
    assert await answers(late)
    assert await answers(proxied)
    assert proxy.held == 0
