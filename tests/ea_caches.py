"""The EndpointAttachment operator's caches for unit tests.

Decides: one store per cached kind, with exactly the named indexes ``controller.build`` declares
(``world.INDEXERS``), filled by upserts and deletes in the order given; the substrate's kinds served
unless a test says otherwise (``unserved``); a CRD builder for the substrate's CRDs; and a writer
that answers as the API server would, into those stores (``RecordingWriter``).

Does not: run informers or handlers (the tests call the wiring's handlers themselves)."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any, Final

import jsonpatch
import pytest
from opentelemetry.trace import NoOpTracerProvider
from prometheus_client import CollectorRegistry

from harness.mergepatch import merge_patch
from operators.endpointattachment.api import ADDRESSES, ATTACHMENTS, CLAIMS, CLASSES
from operators.endpointattachment.controller import ATTACHMENT_CONTROLLER
from operators.endpointattachment.render import RenderSettings
from operators.endpointattachment.world import World, empty_stores
from shared.kube import ApiError
from shared.resources import ENDPOINT_SLICES, ENDPOINTS, HELMRELEASES, PODS, SERVICES, Resource
from shared.runtime.cache import Key, Obj, key_of
from shared.runtime.controller import Controller, Result, StaticCaches
from shared.runtime.metrics import ControllerMetrics, QueueMetrics
from shared.runtime.served import CRDS, crd_name
from shared.telemetry.tracing import Tracing
from tests.ea_builders import CREATED

# The short names tables use for each cached kind.
KINDS: Final[dict[str, Resource]] = {
    "attachment": ATTACHMENTS,
    "claim": CLAIMS,
    "class": CLASSES,
    "address": ADDRESSES,
    "service": SERVICES,
    "slice": ENDPOINT_SLICES,
    "endpoints": ENDPOINTS,
    "helmrelease": HELMRELEASES,
    "pod": PODS,
    "crd": CRDS,
}

Step = tuple[str, str, Obj]  # ("put" | "drop", kind, object)


def put(kind: str, obj: Obj) -> Step:
    return "put", kind, obj


def drop(kind: str, obj: Obj) -> Step:
    return "drop", kind, obj


def make_crd(resource: Resource, *, established: bool = True) -> Obj:
    """The (slim) CRD that defines ``resource``, Established or not."""
    status = "True" if established else "False"
    return {
        "apiVersion": CRDS.api_version,
        "kind": "CustomResourceDefinition",
        "metadata": {"name": crd_name(resource), "uid": f"crd-uid-{resource.plural}", "resourceVersion": "1"},
        "status": {"conditions": [{"type": "Established", "status": status}]},
    }


def caches_of(*steps: Step, unserved: Iterable[Resource] = ()) -> StaticCaches:
    """Stores after these upserts and deletes, in order; ``unserved``: optional kinds not served."""
    caches = StaticCaches(empty_stores(), set(unserved))
    for action, kind, obj in steps:
        store = caches.store(KINDS[kind])
        if action == "put":
            store.upsert(obj)
        else:
            store.delete(key_of(obj))
    return caches


def world_of(
    *steps: Step, settings: RenderSettings | None = None, unserved: Iterable[Resource] = ()
) -> World:
    return World(caches_of(*steps, unserved=unserved), settings)


class RecordingWriter:
    """The ``Writer`` surface the attachment reconciler uses, answering as the API server would: each
    write is recorded as (verb, plural, name) and its answer goes into the caches at once
    (write-through, as the runtime's writer does); a create names a ``generateName`` object with the
    suffix ``x7ktq`` (then ``x7ktr``...). ``refuse`` makes every Service create and patch fail with
    that error."""

    def __init__(self, caches: StaticCaches, refuse: ApiError | None = None) -> None:
        self.caches, self.refuse = caches, refuse
        self.calls: list[tuple[str, str, str]] = []
        self._generated = 0

    def _answer(self, resource: Resource, obj: Mapping[str, Any]) -> Obj:
        answer = copy.deepcopy(dict(obj))
        metadata = answer.setdefault("metadata", {})
        metadata.setdefault("uid", f"uid-{metadata.get('name')}")
        metadata.setdefault("creationTimestamp", CREATED)
        metadata["resourceVersion"] = str(int(metadata.get("resourceVersion") or 1) + 1)
        self.caches.store(resource).upsert(answer)
        return answer

    def _refused(self, resource: Resource) -> None:
        if resource == SERVICES and self.refuse is not None:
            raise self.refuse

    async def create(self, resource: Resource, body: Mapping[str, Any]) -> Obj:
        named = copy.deepcopy(dict(body))
        metadata = named["metadata"]
        if "name" not in metadata:
            metadata["name"] = f"{metadata.pop('generateName')}x7kt{'qrstuvwxyz'[self._generated % 10]}"
            self._generated += 1
        self.calls.append(("create", resource.plural, metadata["name"]))
        self._refused(resource)
        return self._answer(resource, named)

    async def patch(self, resource: Resource, obj: Mapping[str, Any], patch: Any, kind: str = "merge") -> Obj:
        self.calls.append(("patch", resource.plural, obj["metadata"]["name"]))
        self._refused(resource)
        current = self.caches.store(resource).get(key_of(obj)) or obj
        return self._answer(resource, merge_patch(current, patch))

    async def delete(self, resource: Resource, obj: Mapping[str, Any], *, forget: bool = False) -> bool:
        self.calls.append(("delete", resource.plural, obj["metadata"]["name"]))
        self.caches.store(resource).delete(key_of(obj))
        return True

    async def patch_status(self, resource: Resource, obj: Mapping[str, Any], ops: list[Any]) -> Obj | None:
        if not ops:
            return None
        self.calls.append(("status", resource.plural, obj["metadata"]["name"]))
        return self._answer(resource, jsonpatch.apply_patch(copy.deepcopy(dict(obj)), ops))

    async def ensure_metadata(
        self,
        resource: Resource,
        obj: Obj,
        *,
        finalizer: str | None = None,
        owner_reference: Mapping[str, Any] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> Obj:
        metadata = dict(obj["metadata"])
        finalizers = list(metadata.get("finalizers") or [])
        changed = False
        if finalizer is not None and finalizer not in finalizers:
            metadata["finalizers"], changed = [*finalizers, finalizer], True
        if owner_reference is not None:
            metadata["ownerReferences"] = [*metadata.get("ownerReferences", []), dict(owner_reference)]
            changed = True
        if labels:
            metadata["labels"], changed = {**metadata.get("labels", {}), **labels}, True
        if not changed:
            return obj
        self.calls.append(("metadata", resource.plural, metadata["name"]))
        return self._answer(resource, {**obj, "metadata": metadata})

    async def remove_finalizer(self, resource: Resource, obj: Obj, finalizer: str) -> Obj | None:
        self.calls.append(("unfinalize", resource.plural, obj["metadata"]["name"]))
        self.caches.store(resource).delete(key_of(obj))  # being deleted, its last finalizer gone
        return None


class Idle:
    """A reconciler that is never called: tests of what a change enqueues look at the queue only."""

    async def reconcile(self, key: Key) -> Result:
        raise AssertionError(f"no reconcile expected, got {key}")


def enqueued(
    caches: StaticCaches,
    resource: Resource,
    old: Obj | None,
    new: Obj | None,
    monkeypatch: pytest.MonkeyPatch,
) -> set[Key]:
    """The keys the operator's controller enqueues when ``resource`` changes from ``old`` to ``new``
    (``caches`` holds ``old``; the store takes the change first, as an informer does)."""
    store = caches.store(resource)
    if new is not None:
        store.upsert(new)
    elif old is not None:
        store.delete(key_of(old))
    registry = CollectorRegistry()
    running = Controller(
        ATTACHMENT_CONTROLLER,
        Idle(),
        caches,
        metrics=ControllerMetrics(registry),
        queue_metrics=QueueMetrics(registry),
        tracing=Tracing(NoOpTracerProvider(), "test"),
    )
    keys: set[Key] = set()
    monkeypatch.setattr(running, "enqueue", lambda key, *_: keys.add(key))  # the key; not what changed
    for handled, handler in running.handlers():
        if handled == resource:
            handler(old, new)
    return keys
