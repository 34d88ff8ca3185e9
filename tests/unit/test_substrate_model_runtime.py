"""The substrate model declared on the project's runtime (``harness.substrate.wiring`` and
``SubstrateController``), without a cluster: what it caches and wakes, and its passes against a tiny
API whose answers the runtime's ``Writer`` hands to the informers' stores (write-through): a claim
bound in one pass of several decisions, a taken name (409) skipped, and nothing written again."""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import Mapping
from typing import Any, cast

from opentelemetry.trace import NoOpTracerProvider
from prometheus_client import CollectorRegistry

from harness.mergepatch import merge_patch
from harness.substrate import (
    ADDRESSES,
    CLAIMS,
    CLASSES,
    DEFAULT_CLASS_ANNOTATION,
    KINDS,
    METALLB_PROVISIONER,
    MODEL_KEY,
    POOLS,
    SubstrateController,
    SubstrateModel,
    address_name,
    wiring,
)
from shared.kube import ApiError, Kube, Obj
from shared.resources import SERVICES
from shared.runtime.controller import Result
from shared.runtime.manager import Manager
from shared.telemetry.tracing import Tracing

NS = "tenant-a"


class Api:
    """The verbs ``SubstrateController`` sends, by path (a create's name taken: 409)."""

    def __init__(self) -> None:
        self.objects: dict[str, Obj] = {}
        self.versions = itertools.count(1)
        self.sent: list[tuple[str, str]] = []

    def put(self, path: str, obj: Obj) -> Obj:
        metadata = obj.setdefault("metadata", {})
        metadata.setdefault("uid", f"uid-{path}")
        metadata["resourceVersion"] = str(next(self.versions))
        self.objects[path] = obj
        return copy.deepcopy(obj)

    async def create(self, path: str, body: Mapping[str, Any]) -> Obj:
        self.sent.append(("create", path))
        named = f"{path}/{body['metadata']['name']}"
        if named in self.objects:
            raise ApiError(409, "AlreadyExists", f"{named} exists")
        return self.put(named, copy.deepcopy(dict(body)))

    async def apply(self, path: str, obj: Mapping[str, Any], field_manager: str) -> Obj:
        self.sent.append(("apply", path))
        return self.put(path, copy.deepcopy(dict(obj)))

    async def replace(self, path: str, body: Mapping[str, Any]) -> Obj:
        self.sent.append(("update", path))
        return self.put(path, {**copy.deepcopy(dict(body)), "status": self.objects[path].get("status")})

    async def patch(self, path: str, patch: Any, kind: str = "json") -> Obj:
        self.sent.append(("patch", path))
        target = path.removesuffix("/status")
        patch = copy.deepcopy(patch)
        (patch.get("metadata") or {}).pop("resourceVersion", None)
        return self.put(target, merge_patch(self.objects[target], patch))

    async def delete(self, path: str, *, uid: str | None = None, **options: Any) -> bool:
        self.sent.append(("delete", path))
        return self.objects.pop(path, None) is not None

    async def get(self, path: str) -> Obj | None:
        found = self.objects.get(path)
        return copy.deepcopy(found) if found is not None else None


def declared(api: Api) -> tuple[SubstrateModel, SubstrateController]:
    manager = Manager(cast(Kube, api), CollectorRegistry(), Tracing(NoOpTracerProvider(), "test"))
    substrate = wiring()
    manager.declare_caches(substrate)
    model = SubstrateModel(stores={kind: manager.store(kind) for kind in substrate.resources()})
    controller = SubstrateController(
        model, cast(Kube, api), manager.writer, {SERVICES: manager.reads(SERVICES, "get")}
    )
    manager.add(substrate, controller)
    return model, controller


def seen(api: Api, model: SubstrateModel, path: str, resource: Any, obj: Obj) -> None:
    """An object someone else made, in the API and (as its watch event) in the model's store."""
    stored = api.put(path, copy.deepcopy(obj))
    model.on_event(resource, "ADDED", stored)


async def settle(controller: SubstrateController) -> list[Result]:
    """One pass: decisions until one asks for nothing more (the runtime's ``decide``, unbounded)."""
    results = []
    for _ in range(20):
        results.append(await controller.reconcile(MODEL_KEY))
        await asyncio.sleep(0)  # the answers enter the stores, as the runtime yields after a decision
        if not results[-1].again:
            return results
    raise AssertionError(f"no fixed point: {controller.model.log}")


def a_world() -> tuple[Api, SubstrateModel, SubstrateController]:
    api = Api()
    model, controller = declared(api)
    public = {
        "metadata": {"name": "public", "annotations": {DEFAULT_CLASS_ANNOTATION: "true"}},
        "spec": {"provisioner": METALLB_PROVISIONER, "parameters": {"addresses": ["198.51.100.0/30"]}},
    }
    seen(api, model, CLASSES.path(None, "public"), CLASSES, public)
    claim = {"metadata": {"name": "c1", "namespace": NS}, "spec": {"family": "IPv4"}}
    seen(api, model, CLAIMS.path(NS, "c1"), CLAIMS, claim)
    return api, model, controller


def test_the_wiring_caches_every_kind_the_model_reads_and_wakes_one_key() -> None:
    substrate = wiring()
    assert set(substrate.resources()) == set(KINDS)
    assert {cache.resource for cache in substrate.caches} == set(KINDS)
    assert all(cache.transform is None for cache in substrate.caches)  # kept as listed
    assert {cache.field_selector for cache in substrate.caches if cache.resource == POOLS} == {
        "metadata.namespace=metallb-system"
    }
    assert substrate.key({"metadata": {"name": "any"}}) == MODEL_KEY
    assert all(list(w.map(None, {}) or ()) == [MODEL_KEY] for w in substrate.watches)
    assert POOLS in wiring(l2_advertisements=False).resources()
    assert len(wiring(l2_advertisements=False).resources()) == len(KINDS) - 1


async def test_a_claim_is_bound_in_one_pass_its_answers_in_the_stores() -> None:
    api, model, controller = a_world()
    results = await settle(controller)
    assert [r.again for r in results[:-1]] == [True] * (len(results) - 1)
    assert results[-1] == Result()
    assert model.synced.is_set()
    claim = model.claim(NS, "c1")
    assert claim is not None
    assert claim["status"]["phase"] == "Bound"
    assert claim == api.objects[CLAIMS.path(NS, "c1")]  # the stores hold the API's answers
    assert model.address(address_name("198.51.100.0")) is not None
    sent = len(api.sent)
    assert await settle(controller) == [Result()]
    assert len(api.sent) == sent  # a second pass writes nothing


async def test_a_taken_name_is_skipped_and_the_next_address_provisioned() -> None:
    api, model, controller = a_world()
    taken = address_name("198.51.100.0")
    api.objects[ADDRESSES.path(None, taken)] = {"metadata": {"name": taken}, "spec": {}}  # not watched yet
    await settle(controller)
    assert taken in model.taken
    claim = model.claim(NS, "c1")
    assert claim is not None
    assert [a["address"] for a in claim["status"]["addresses"]] == ["198.51.100.1"]
