"""The EndpointAttachment operator's caches for unit tests.

Decides: one store per cached kind, with exactly the named indexes ``controller.build`` declares
(``world.INDEXERS``), filled by upserts and deletes in the order given; the substrate's kinds served
unless a test says otherwise (``unserved``), and a CRD builder for the substrate's CRDs.

Does not: run informers or handlers (the tests call the wiring's handlers themselves)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from operators.endpointattachment.api import ADDRESSES, ATTACHMENTS, CLAIMS, CLASSES
from operators.endpointattachment.render import RenderSettings
from operators.endpointattachment.world import World, empty_stores
from shared.resources import ENDPOINT_SLICES, ENDPOINTS, HELMRELEASES, PODS, SERVICES, Resource
from shared.runtime.cache import Obj, key_of
from shared.runtime.controller import StaticCaches
from shared.runtime.served import CRDS, crd_name

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
