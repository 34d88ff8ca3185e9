"""The EndpointAttachment operator's caches for unit tests.

Decides: one store per cached kind, with exactly the named indexes ``controller.build`` declares
(``world.INDEXERS``), filled by upserts and deletes in the order given.

Does not: run informers or handlers (the tests call the wiring's handlers themselves)."""

from __future__ import annotations

from typing import Final

from operators.endpointattachment.world import (
    ALLOCATIONS,
    ATTACHMENTS,
    CLAIMS,
    CLASSES,
    HELMRELEASES,
    PROXIES,
    World,
    empty_stores,
)
from shared.resources import ENDPOINT_SLICES, ENDPOINTS, NAMESPACES, PODS, SERVICES, Resource
from shared.runtime.cache import Obj, key_of
from shared.runtime.controller import StaticCaches

# The short names tables use for each cached kind.
KINDS: Final[dict[str, Resource]] = {
    "attachment": ATTACHMENTS,
    "claim": CLAIMS,
    "class": CLASSES,
    "allocation": ALLOCATIONS,
    "proxy": PROXIES,
    "service": SERVICES,
    "slice": ENDPOINT_SLICES,
    "endpoints": ENDPOINTS,
    "helmrelease": HELMRELEASES,
    "namespace": NAMESPACES,
    "pod": PODS,
}

Step = tuple[str, str, Obj]  # ("put" | "drop", kind, object)


def put(kind: str, obj: Obj) -> Step:
    return "put", kind, obj


def drop(kind: str, obj: Obj) -> Step:
    return "drop", kind, obj


def caches_of(*steps: Step) -> StaticCaches:
    """Stores after these upserts and deletes, in order."""
    caches = StaticCaches(empty_stores())
    for action, kind, obj in steps:
        store = caches.store(KINDS[kind])
        if action == "put":
            store.upsert(obj)
        else:
            store.delete(key_of(obj))
    return caches


def world_of(*steps: Step) -> World:
    return World(caches_of(*steps))
