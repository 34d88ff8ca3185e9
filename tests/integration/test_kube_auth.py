"""Refusals and stale credentials against the real API server, as a ServiceAccount that may read and
watch ConfigMaps in its namespace and nothing else.

* A 403 is an answer, not a reason to re-authenticate: the credentials are not loaded again, and
  the informer's watch (and the client's pools) are left alone.
* A 401 has the credentials loaded again once (``Kube.reload``), for a request and for a watch, and
  the call is sent again. To make the token a client holds invalid at once (the API server caches a
  valid token's authentication for seconds, so revoking a real one is not instant), the tests put a
  token that was never valid in the client's credentials; the kubeconfig file keeps the valid one, as
  it would after a rotation.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from hack.devcluster import ClusterInfo
from harness.identity import serviceaccount_kubeconfig
from shared.credentials import Credentials
from shared.kube import ApiError, Kube, Obj
from shared.resources import CONFIGMAPS, SERVICE_ACCOUNTS, Resource
from shared.runtime.cache import Informer, Store

SECRETS = Resource("v1", "secrets")
DEADLINE = 30.0  # seconds; each wait here is over in well under one on an idle control plane
NOT_A_TOKEN = "not-a-token"  # never issued: the API server answers 401 to it, and caches no success
FORBIDDEN_READS = 3  # none of these may re-authenticate (or replace the client's pools)


def configmap(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}}


async def reader_kubeconfig(kube: Kube, cluster: ClusterInfo, namespace: str, path: Path) -> str:
    """A ServiceAccount that may get, list and watch ConfigMaps in ``namespace``: nothing else."""
    rbac = "rbac.authorization.k8s.io/v1"
    await kube.create(
        SERVICE_ACCOUNTS.path(namespace),
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader"}},
    )
    role = {
        "apiVersion": rbac,
        "kind": "Role",
        "metadata": {"name": "reader"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}],
    }
    await kube.create(f"/apis/{rbac}/namespaces/{namespace}/roles", role)
    binding = {
        "apiVersion": rbac,
        "kind": "RoleBinding",
        "metadata": {"name": "reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
    }
    await kube.create(f"/apis/{rbac}/namespaces/{namespace}/rolebindings", binding)
    return await serviceaccount_kubeconfig(kube, cluster.kubeconfig, namespace, "reader", path)


@pytest.fixture
async def reader(kube: Kube, cluster: ClusterInfo, namespace: str, tmp_path: Path) -> Kube:
    return await Kube.connect(
        await reader_kubeconfig(kube, cluster, namespace, tmp_path / "reader.kubeconfig")
    )


class Added:
    """A change handler: the names of objects added, and an event to wait on each."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._changed = asyncio.Event()

    def __call__(self, old: Obj | None, new: Obj | None) -> None:
        if old is None and new is not None:
            self.names.append(new["metadata"]["name"])
            self._changed.set()

    async def until(self, name: str) -> None:
        async with asyncio.timeout(DEADLINE):
            while name not in self.names:
                self._changed.clear()
                await self._changed.wait()


@contextlib.asynccontextmanager
async def running(informer: Informer) -> AsyncIterator[None]:
    task = asyncio.create_task(informer.run())
    try:
        async with asyncio.timeout(DEADLINE):
            await informer.synced.wait()
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class Reauthentications:
    """Counts the client's loads of its credentials, passing each on."""

    def __init__(self, kube: Kube) -> None:
        self.count = 0
        self._reload = kube.reload
        kube.reload = self

    async def __call__(self) -> Credentials:
        self.count += 1
        return await self._reload()


def stale(kube: Kube) -> None:
    """The client's token is one the API server never issued (its kubeconfig keeps the valid one)."""
    kube.credentials = dataclasses.replace(kube.credentials, token=NOT_A_TOKEN)


async def test_a_forbidden_read_leaves_every_open_watch_alone(
    kube: Kube, reader: Kube, namespace: str
) -> None:
    informer = Informer(reader, CONFIGMAPS, store=Store(), namespace=namespace)
    added = Added()
    informer.add_handler(added)
    reauthentications = Reauthentications(reader)
    async with running(informer):
        pools = reader._pools
        for _ in range(FORBIDDEN_READS):
            with pytest.raises(ApiError) as refused:
                await reader.get(SECRETS.path(namespace, "anything"))
            assert refused.value.status == 403
            assert refused.value.reason == "Forbidden"

        await kube.create(CONFIGMAPS.path(namespace), configmap("after-the-refusals"))
        await added.until("after-the-refusals")
        assert reauthentications.count == 0  # the credentials were not loaded again
        assert reader._pools is pools  # no pool was retired
        assert informer.relists == 0  # the informer's watch never broke


async def test_a_stale_token_is_re_read_once_for_a_request(kube: Kube, reader: Kube, namespace: str) -> None:
    await reader.list(CONFIGMAPS.path(namespace))  # a kept connection, dialled with the valid token
    reauthentications = Reauthentications(reader)
    stale(reader)
    assert (await reader.list(CONFIGMAPS.path(namespace)))["kind"] == "ConfigMapList"
    assert reauthentications.count == 1
    assert reader.credentials.token != NOT_A_TOKEN  # the kubeconfig was read again


async def test_a_stale_token_is_re_read_once_for_a_watch(kube: Kube, reader: Kube, namespace: str) -> None:
    listed = await reader.list(CONFIGMAPS.path(namespace))
    stale(reader)
    await kube.create(CONFIGMAPS.path(namespace), configmap("seen-after-401"))
    events = reader.watch(CONFIGMAPS.path(namespace), resource_version=listed["metadata"]["resourceVersion"])
    async with asyncio.timeout(DEADLINE), contextlib.aclosing(events):
        kind, obj = await anext(events)
    assert (kind, obj["metadata"]["name"]) == ("ADDED", "seen-after-401")
    assert reader.credentials.token != NOT_A_TOKEN


async def first_event(events: AsyncIterator[tuple[str, Obj]]) -> tuple[str, Obj]:
    async with asyncio.timeout(DEADLINE):
        return await anext(events)


async def test_credentials_that_stay_invalid_are_a_401(reader: Kube, namespace: str, tmp_path: Path) -> None:
    # The kubeconfig now holds a token that was never valid: re-reading it cures nothing.
    path = tmp_path / "reader.kubeconfig"
    config = yaml.safe_load(path.read_text())
    config["users"][0]["user"]["token"] = NOT_A_TOKEN
    path.write_text(yaml.safe_dump(config))

    stale(reader)
    with pytest.raises(ApiError) as refused_watch:
        await first_event(reader.watch(CONFIGMAPS.path(namespace)))
    assert refused_watch.value.status == 401

    stale(reader)
    with pytest.raises(ApiError) as refused_request:
        await reader.list(CONFIGMAPS.path(namespace))
    assert refused_request.value.status == 401
