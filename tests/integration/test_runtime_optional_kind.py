"""An optional kind against the real API server: the operator starts before the kind's CRD exists.

The manager's informer of a kind whose CRD is not installed is synced and empty (the sync barrier
passes, ``served`` is False); when the CRD is installed and established, it lists and watches
without a restart; when the CRD is deleted, what it held is delivered as deleted and it waits again;
a second installation serves again. Every wait is on a delivered change, with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Final

import pytest
from opentelemetry.trace import NoOpTracerProvider
from prometheus_client import CollectorRegistry

from harness.waiting import wait_for_object
from shared.kube import ApiError, Kube, Obj
from shared.resources import CRDS, Resource
from shared.runtime.controller import Cache
from shared.runtime.manager import Manager
from shared.runtime.served import crd_name, established
from shared.telemetry.tracing import Tracing

GROUP: Final = "optional.test.cozystack.io"
GADGETS: Final = Resource(f"{GROUP}/v1", "gadgets", namespaced=False)
DEADLINE: Final = 30.0  # seconds; each wait is over in well under one on an idle control plane


def gadget_crd() -> Obj:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": crd_name(GADGETS)},
        "spec": {
            "group": GROUP,
            "scope": "Cluster",
            "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget", "listKind": "GadgetList"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                }
            ],
        },
    }


def gadget(name: str) -> Obj:
    return {"apiVersion": GADGETS.api_version, "kind": "Gadget", "metadata": {"name": name}}


class Seen:
    """A change handler recording (upserted | deleted, name); ``until`` waits on what it records."""

    def __init__(self) -> None:
        self.changes: list[tuple[str, str]] = []
        self._changed = asyncio.Event()

    def __call__(self, old: Obj | None, new: Obj | None) -> None:
        obj = new if new is not None else old
        assert obj is not None
        self.changes.append(("deleted" if new is None else "upserted", obj["metadata"]["name"]))
        self._changed.set()

    async def until(self, change: tuple[str, str]) -> None:
        try:
            async with asyncio.timeout(DEADLINE):
                while change not in self.changes:
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(f"timed out waiting for {change}; delivered: {self.changes}") from None


async def crd_gone(kube: Kube) -> None:
    with contextlib.suppress(ApiError):
        await kube.delete(CRDS.path(name=crd_name(GADGETS)))
    await wait_for_object(kube, CRDS, crd_name(GADGETS), lambda crd: crd is None, what="the CRD deleted")


async def install(kube: Kube) -> None:
    await kube.create(CRDS.path(), gadget_crd())
    await wait_for_object(kube, CRDS, crd_name(GADGETS), established, what="the CRD established")


@contextlib.asynccontextmanager
async def running(manager: Manager) -> AsyncIterator[None]:
    task = asyncio.create_task(manager.run())
    try:
        async with asyncio.timeout(DEADLINE):
            await manager.synced.wait()
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.fixture
async def no_gadgets(kube: Kube) -> AsyncIterator[None]:
    await crd_gone(kube)
    yield
    await crd_gone(kube)


async def test_an_optional_kind_is_served_when_its_crd_appears_and_leaves_with_it(
    kube: Kube, no_gadgets: None
) -> None:
    manager = Manager(kube, CollectorRegistry(), Tracing(NoOpTracerProvider(), "test"))
    seen = Seen()
    manager.informer(Cache(GADGETS, optional=True)).add_handler(seen)
    # The CRD cache is declared with the optional kind: RBAC follows from it (list, watch).
    assert CRDS in manager.informers
    assert manager.required_rules()[("apiextensions.k8s.io", "customresourcedefinitions")] == {
        "list",
        "watch",
    }

    async with running(manager):
        # Synced with the kind not served: an empty, complete world; readiness says nothing waits.
        assert not manager.served(GADGETS)
        assert len(manager.store(GADGETS)) == 0
        assert manager.readiness_problem() is None

        await install(kube)
        await kube.create(GADGETS.path(), gadget("first"))
        await seen.until(("upserted", "first"))  # without a restart
        assert manager.served(GADGETS)

        await crd_gone(kube)
        await seen.until(("deleted", "first"))  # gone with its CRD
        assert len(manager.store(GADGETS)) == 0

        await install(kube)
        await kube.create(GADGETS.path(), gadget("second"))
        await seen.until(("upserted", "second"))  # served again after reinstalling
        assert manager.served(GADGETS)
        assert set(manager.store(GADGETS).keys()) == {("", "second")}
