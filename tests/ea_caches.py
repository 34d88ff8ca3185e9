"""The EndpointAttachment operator's caches for unit tests.

Decides: one store per cached kind, with exactly the named indexes ``controller.build`` declares
(``world.INDEXERS``), filled by upserts and deletes in the order given; the substrate's kinds served
unless a test says otherwise (``unserved``); a CRD builder for the substrate's CRDs; and the
runtime's writer over an in-memory API holding what those stores hold, its answers going into them
(``RecordingWriter``, its writes seen as ``calls``).

Does not: run informers or handlers (the tests call the wiring's handlers themselves)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final, overload

import pytest
from opentelemetry.trace import NoOpTracerProvider
from prometheus_client import CollectorRegistry

from harness.memapi import MemApi, Request, parse
from operators.endpointattachment.api import ADDRESSES, ATTACHMENTS, CLAIMS, CLASSES
from operators.endpointattachment.controller import ATTACHMENT_CONTROLLER
from operators.endpointattachment.render import RenderSettings
from operators.endpointattachment.world import World, empty_stores
from shared.kube import ApiError
from shared.resources import ENDPOINT_SLICES, ENDPOINTS, HELMRELEASES, PODS, SERVICES, Resource
from shared.runtime.cache import Informer, Key, Obj, key_of
from shared.runtime.controller import Controller, Result, StaticCaches
from shared.runtime.metrics import ControllerMetrics, QueueMetrics
from shared.runtime.served import CRDS, crd_name
from shared.runtime.writes import Writer
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


Call = tuple[str, str, str]  # (verb, plural, name)


def call_of(request: Request) -> Call:
    """A write request in the tables' words: ``create``, ``patch`` (a merge patch), ``delete``,
    ``status`` (a status patch), ``unfinalize`` (a JSON patch removing a finalizer), ``metadata``
    (any other JSON patch: the finalizer, owner reference and labels), ``update``."""
    target = request.target
    verb = request.verb
    if target.subresource == "status":
        verb = "status"
    elif request.patch_kind == "json":
        removes = any(
            op.get("op") == "remove" and str(op.get("path", "")).startswith("/metadata/finalizers")
            for op in request.body
        )
        verb = "unfinalize" if removes else "metadata"
    return verb, target.plural, request.name


class Calls(Sequence[Call]):
    """The writes the API was sent, as ``Call`` tuples: a view over its recorded requests (``clear``
    forgets them)."""

    def __init__(self, api: MemApi) -> None:
        self.api = api

    def _calls(self) -> list[Call]:
        return [call_of(r) for r in self.api.requests if r.method != "GET"]

    @overload
    def __getitem__(self, index: int) -> Call: ...
    @overload
    def __getitem__(self, index: slice) -> list[Call]: ...
    def __getitem__(self, index: int | slice) -> Call | list[Call]:
        return self._calls()[index]

    def __len__(self) -> int:
        return len(self._calls())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and self._calls() == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._calls())

    def clear(self) -> None:
        self.api.requests.clear()


class RecordingWriter(Writer):
    """The runtime's ``Writer`` over an in-memory API (``harness.memapi``) that holds what the caches
    hold, its answers going into the caches through real informers (not run: write-through only).

    The caches are the world as the tests set it: every object in them is in the API from the start,
    and before a write the API takes the cached version of the object written when it is not there
    or the cache's is as new and differs (a test's change of a cached object: another actor's write,
    which an informer delivered). A DELETE that removed its object also removes it from the cache
    (its watch event, delivered at once: no informer runs here). ``calls``: the writes sent, as
    (verb, plural, name) (``call_of``); a generated name has the suffix ``x7ktq`` (then
    ``x7ktr``...); objects are created at ``CREATED`` with the UID ``uid-<name>``. ``refuse`` makes
    every Service create and patch fail with that error."""

    def __init__(self, caches: StaticCaches, refuse: ApiError | None = None) -> None:
        self.api = MemApi(
            clock=lambda: datetime.fromisoformat(CREATED),
            uid=lambda obj: f"uid-{obj['metadata']['name']}",
            generate=self._generated_name,
        )
        super().__init__(self.api, self._informer_of)
        self.caches, self.refuse = caches, refuse
        self.calls = Calls(self.api)
        self._generated = 0
        self._informers: dict[Resource, Informer] = {}
        self._kinds = {parse(resource.path()).collection: resource for resource in caches.stores}
        for resource, store in caches.stores.items():
            for obj in list(store.values()):
                self.api.seed(resource, obj)
        self.api.faults.append(self._before)
        self.api.admission.append(self._admit)

    def _generated_name(self, prefix: str) -> str:
        name = f"{prefix}x7kt{'qrstuvwxyz'[self._generated % 10]}"
        self._generated += 1
        return name

    def _informer_of(self, resource: Resource) -> Informer | None:
        if resource not in self.caches.stores:
            return None
        if resource not in self._informers:
            self._informers[resource] = Informer(self.api, resource, store=self.caches.store(resource))
        return self._informers[resource]

    def _before(self, request: Request) -> None:
        """Before a write: the cached version of its object into the API."""
        target = request.target
        resource = self._kinds.get(target.collection)
        if request.method != "GET" and resource is not None and target.name:
            self._sync(resource, target.namespace, target.name)

    def _admit(self, request: Request, obj: Obj) -> BaseException | None:
        """The refusal due, at admission: of a Service's create or patch."""
        target = request.target
        if target.plural == "services" and request.verb in ("create", "patch") and not target.subresource:
            return self.refuse
        return None

    def _sync(self, resource: Resource, namespace: str, name: str) -> None:
        cached = self.caches.store(resource).get((namespace, name))
        if cached is None:
            return
        stored = self.api.stored(resource.path(namespace or None, name))
        if stored is None or (stored != cached and not _older(cached, stored)):
            self.api.seed(resource, cached)

    async def delete(self, resource: Resource, obj: Mapping[str, Any], *, forget: bool = False) -> bool:
        deleted = await super().delete(resource, obj, forget=forget)
        informer = self._informer_of(resource)
        namespace, name = key_of(obj)
        if informer is not None and self.api.stored(resource.path(namespace or None, name)) is None:
            informer.forget((namespace, name))
        return deleted


def _older(obj: Obj, than: Obj) -> bool:
    version, other = (str(o["metadata"].get("resourceVersion") or "") for o in (obj, than))
    return version.isdigit() and other.isdigit() and int(version) < int(other)


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
