"""What the EndpointAttachment operator has observed: the kinds it caches, their named indexes, and
the read view a pass assembles its ``Observed`` from.

Decides: every kind the operator caches (``RESOURCES``) and the named indexes each cache keeps
(``INDEXERS``: the runtime's ``Store`` files every object under its index values on each change, so a
pass or a wake-up never scans every object); what each query of the read view ``World`` answers
(the allocation an object holds, the taken addresses, an endpoint's slices, the rivals for a
namespace's pods (proxied Services and VM-mode attachments, with the pods each selects and its rank),
the application of an endpoint, the live holders of allocations); and how
the ``Observed`` of one attachment is assembled from the caches, without any LIST.

Does not: talk to the API or keep any object itself (the runtime's informers fill the stores, from
watches and from the answers of our own writes), decide which pass a change wakes (``controller``'s
map functions do), decide anything about an attachment, or trust a label for ownership: the rendered
Service is found by its name and judged by its controller reference in ``reconcile``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from typing import Any, Final

from operators.endpointattachment.addresses import InvalidAddress, canonical
from operators.endpointattachment.constants import (
    API_VERSION,
    ENDPOINT_ATTACHMENT_KIND,
    ENDPOINT_ATTACHMENT_PLURAL,
    ENDPOINTSLICE_SERVICE_NAME_LABEL,
    HELMRELEASE_API_VERSION,
    HELMRELEASE_PLURAL,
    IP_ADDRESS_ALLOCATION_PLURAL,
    IP_ADDRESS_CLAIM_KIND,
    IP_ADDRESS_CLAIM_PLURAL,
    IP_ADDRESS_CLASS_PLURAL,
    MODE_STANDARD,
    SERVICE_PROXY_NAME_LABEL,
    SERVICE_PROXY_PLURAL,
)
from operators.endpointattachment.datapath import (
    ProxiedService,
    could_render,
    rank_of,
    selected_pods,
    slice_pods,
    survivors,
    uncached_rank,
)
from operators.endpointattachment.reconcile import Observed
from operators.endpointattachment.render import service_name
from shared.lineage import application_of, belongs_to
from shared.ownership import sole_controller
from shared.resources import ENDPOINT_SLICES, ENDPOINTS, NAMESPACES, PODS, SERVICES, Resource
from shared.runtime.cache import Indexer, Key, Obj, Store, key_of
from shared.runtime.controller import Cache, Caches, StaticCaches

# --- the cached kinds ------------------------------------------------------------------------------

ATTACHMENTS: Final = Resource(API_VERSION, ENDPOINT_ATTACHMENT_PLURAL)
CLAIMS: Final = Resource(API_VERSION, IP_ADDRESS_CLAIM_PLURAL)
CLASSES: Final = Resource(API_VERSION, IP_ADDRESS_CLASS_PLURAL, namespaced=False)
ALLOCATIONS: Final = Resource(API_VERSION, IP_ADDRESS_ALLOCATION_PLURAL, namespaced=False)
PROXIES: Final = Resource(API_VERSION, SERVICE_PROXY_PLURAL, namespaced=False)
HELMRELEASES: Final = Resource(HELMRELEASE_API_VERSION, HELMRELEASE_PLURAL)
# Every kind a pass or a wake-up reads; nothing else is watched.
# The v1 Endpoints of the rendered VM-mode Services: what cozy-proxy reads (never EndpointSlices).
RESOURCES: Final = (
    ATTACHMENTS,
    CLAIMS,
    CLASSES,
    ALLOCATIONS,
    PROXIES,
    SERVICES,
    ENDPOINT_SLICES,
    ENDPOINTS,
    HELMRELEASES,
    NAMESPACES,
    PODS,
)
# Pods that are done never back a Service again: the Pod cache leaves them out (the API server then
# delivers a pod that finishes as a deletion).
POD_FIELD_SELECTOR: Final = "status.phase!=Succeeded,status.phase!=Failed"

# --- index names (the value each object is filed under is in the comment) --------------------------

# (namespace, spec.endpoint.name): the attachments a change of that Service (or its slices) concerns.
BY_ENDPOINT: Final = "endpoint"
# The class an object takes its address from: an attachment's spec.address.className, a claim's or an
# allocation's spec.className.
BY_CLASS: Final = "class"
# (namespace, spec.address.claimName): the attachments that use a claim.
BY_CLAIM: Final = "claim"
# metadata.namespace: the attachments (claims, HelmReleases) a namespace's labels concern.
BY_NAMESPACE: Final = "namespace"
# metadata.uid: an attachment by the UID a claim records as its user.
BY_UID: Final = "uid"
# (namespace, rendered Service name): the attachment a squatter on that name keeps dark.
BY_RENDERED_SERVICE: Final = "rendered-service"
# True for attachments in a VM mode: the only ones proxied Services and every slice concern.
VM_MODE: Final = "vm-mode"
# status.attachment.uid of a claim: the claims an attachment's disappearance may free.
BY_USER: Final = "user"
# spec.holder.uid of an allocation: what an attachment or a claim holds.
BY_HOLDER: Final = "holder"
# The canonical text of an allocation's address: whether an address is taken, in one lookup.
BY_ADDRESS: Final = "address"
# True for Services delegated to a datapath proxy (exclusivity is judged among them).
PROXIED: Final = "proxied"
# (namespace, kubernetes.io/service-name) of an EndpointSlice: the slices of one Service.
BY_SERVICE: Final = "service"


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("spec") or {}


def _metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return _metadata(obj).get("labels") or {}


def address_spec(attachment: Mapping[str, Any]) -> Mapping[str, Any]:
    return _spec(attachment).get("address") or {}


def endpoint_name(attachment: Mapping[str, Any]) -> str:
    return str((_spec(attachment).get("endpoint") or {}).get("name"))


def in_vm_mode(attachment: Mapping[str, Any]) -> bool:
    return (_spec(attachment).get("mode") or MODE_STANDARD) != MODE_STANDARD


def holder_of(allocation: Mapping[str, Any]) -> Mapping[str, Any]:
    return _spec(allocation).get("holder") or {}


def _namespace(obj: Obj) -> list[str]:
    return [key_of(obj)[0]]


def _uid(obj: Obj) -> list[str]:
    uid = _metadata(obj).get("uid")
    return [str(uid)] if uid else []


def _attachment_endpoint(obj: Obj) -> list[Key]:
    return [(key_of(obj)[0], endpoint_name(obj))]


def _attachment_class(obj: Obj) -> list[str]:
    class_name = address_spec(obj).get("className")
    return [str(class_name)] if class_name else []


def _attachment_claim(obj: Obj) -> list[Key]:
    claim_name = address_spec(obj).get("claimName")
    return [(key_of(obj)[0], str(claim_name))] if claim_name else []


def _attachment_rendered_service(obj: Obj) -> list[Key]:
    namespace, name = key_of(obj)
    return [(namespace, service_name(name))]


def _attachment_vm_mode(obj: Obj) -> list[bool]:
    return [True] if in_vm_mode(obj) else []


def _spec_class(obj: Obj) -> list[str]:
    class_name = _spec(obj).get("className")
    return [str(class_name)] if class_name else []


def _claim_user(obj: Obj) -> list[str]:
    user = ((obj.get("status") or {}).get("attachment") or {}).get("uid")
    return [str(user)] if user else []


def _allocation_holder(obj: Obj) -> list[str]:
    uid = holder_of(obj).get("uid")
    return [str(uid)] if uid else []


def _allocation_address(obj: Obj) -> list[str]:
    # The CRD refuses unreadable addresses; one that slipped in holds nothing we could mint.
    with contextlib.suppress(InvalidAddress):
        return [canonical(str(_spec(obj).get("address")))]
    return []


def _service_proxied(obj: Obj) -> list[bool]:
    return [True] if SERVICE_PROXY_NAME_LABEL in labels(obj) else []


def _slice_service(obj: Obj) -> list[Key]:
    service = labels(obj).get(ENDPOINTSLICE_SERVICE_NAME_LABEL)
    return [(key_of(obj)[0], service)] if service else []


# The named indexes of each cache; ``build`` and the tests make their stores from these alone.
INDEXERS: Final[Mapping[Resource, Mapping[str, Indexer]]] = {
    ATTACHMENTS: {
        BY_ENDPOINT: _attachment_endpoint,
        BY_CLASS: _attachment_class,
        BY_CLAIM: _attachment_claim,
        BY_NAMESPACE: _namespace,
        BY_UID: _uid,
        BY_RENDERED_SERVICE: _attachment_rendered_service,
        VM_MODE: _attachment_vm_mode,
    },
    CLAIMS: {BY_CLASS: _spec_class, BY_NAMESPACE: _namespace, BY_USER: _claim_user},
    ALLOCATIONS: {BY_HOLDER: _allocation_holder, BY_CLASS: _spec_class, BY_ADDRESS: _allocation_address},
    SERVICES: {PROXIED: _service_proxied},
    ENDPOINT_SLICES: {BY_SERVICE: _slice_service},
    HELMRELEASES: {BY_NAMESPACE: _namespace},
    PODS: {BY_NAMESPACE: _namespace},
}


def slim(obj: Obj) -> Obj:
    """What a cache keeps of an object: everything but ``managedFields``, which no pass reads and
    which is often the largest part of a Service or an EndpointSlice (Pods: ``slim_pod``)."""
    metadata = obj.get("metadata")
    if isinstance(metadata, dict) and "managedFields" in metadata:
        obj = {**obj, "metadata": {k: v for k, v in metadata.items() if k != "managedFields"}}
    return obj


def slim_pod(pod: Obj) -> Obj:
    """A Pod reduced to what exclusivity reads (which Services select it), whatever else it carries."""
    metadata = pod.get("metadata") or {}
    kept = ("name", "namespace", "uid", "resourceVersion", "labels", "deletionTimestamp")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {k: metadata[k] for k in kept if k in metadata},
        "status": {"phase": (pod.get("status") or {}).get("phase")},
    }


# How the operator caches each kind, for every wiring to declare: the named indexes, objects slimmed
# on arrival, and only the unfinished Pods (what selection reads).
CACHES: Final = tuple(
    Cache(
        resource,
        indexers=INDEXERS.get(resource, {}),
        transform=slim_pod if resource == PODS else slim,
        field_selector=POD_FIELD_SELECTOR if resource == PODS else "",
    )
    for resource in RESOURCES
)


def empty_stores() -> dict[Resource, Store]:
    """One empty store per cached kind, with the indexes ``build`` declares (tests, metrics checks)."""
    return {resource: Store(INDEXERS.get(resource)) for resource in RESOURCES}


class TakenAddresses(AbstractSet[str]):
    """Canonical text of every allocated address (any class, any holder), answered from the
    allocations' address index: a membership test is one lookup, whatever the number of allocations,
    and nothing is rebuilt when an allocation changes."""

    def __init__(self, allocations: Store) -> None:
        self._allocations = allocations

    def __contains__(self, address: object) -> bool:
        return isinstance(address, str) and bool(self._allocations.index_keys(BY_ADDRESS, address))

    def __iter__(self) -> Iterator[str]:
        return iter({a for obj in list(self._allocations.values()) for a in _allocation_address(obj)})

    def __len__(self) -> int:
        return sum(1 for _ in self)


class World:
    """A read view over the operator's caches: the queries a pass and a wake-up ask."""

    def __init__(self, caches: Caches) -> None:
        self.attachments = caches.store(ATTACHMENTS)
        self.claims = caches.store(CLAIMS)
        self.classes = caches.store(CLASSES)
        self.allocations = caches.store(ALLOCATIONS)
        self.proxies = caches.store(PROXIES)
        self.services = caches.store(SERVICES)
        self.slices = caches.store(ENDPOINT_SLICES)
        self.endpoints = caches.store(ENDPOINTS)
        self.helmreleases = caches.store(HELMRELEASES)
        self.namespaces = caches.store(NAMESPACES)
        self.pods = caches.store(PODS)

    @classmethod
    def empty(cls) -> World:
        """A world over fresh, empty stores (tests, and checks of what the metrics export)."""
        return cls(StaticCaches(empty_stores()))

    # --- single objects --------------------------------------------------------------------------

    def address_class(self, name: str | None) -> Obj | None:
        return self.classes.get(("", name)) if name else None

    def namespace_labels(self, namespace: str) -> Mapping[str, str]:
        found = self.namespaces.get(("", namespace))
        return labels(found) if found is not None else {}

    def endpoint_of(self, attachment: Mapping[str, Any]) -> Obj | None:
        return self.services.get((key_of(attachment)[0], endpoint_name(attachment)))

    def class_name_of(self, attachment: Mapping[str, Any]) -> str | None:
        address = address_spec(attachment)
        if address.get("className"):
            return str(address["className"])
        claim = self.claims.get((key_of(attachment)[0], str(address.get("claimName"))))
        return str(_spec(claim).get("className")) if claim else None

    def helmrelease_for(self, namespace: str, endpoint: Mapping[str, Any] | None) -> Obj | None:
        """The application object: the HelmRelease in the namespace with the endpoint's lineage."""
        app = application_of(endpoint) if endpoint is not None else None
        if app is None:
            return None
        matches = [hr for hr in self.helmreleases.index(BY_NAMESPACE, namespace) if belongs_to(hr, app)]
        return matches[0] if len(matches) == 1 else None

    # --- addresses -------------------------------------------------------------------------------

    def held_allocations(self, holder: Mapping[str, Any]) -> list[Obj]:
        """Every allocation held by this object's UID, by name (one, unless a mint raced)."""
        uid = _metadata(holder).get("uid")
        if not uid:
            return []
        return sorted(self.allocations.index(BY_HOLDER, str(uid)), key=lambda a: key_of(a)[1])

    def held_allocation(self, holder: Mapping[str, Any]) -> Obj | None:
        """The allocation this object holds: the one its status already names, else the first by
        name, so every pass picks the same one when a raced mint left two."""
        held = self.held_allocations(holder)
        recorded = (holder.get("status") or {}).get("address")
        return next((a for a in held if _spec(a).get("address") == recorded), None) or (
            held[0] if held else None
        )

    def held_address(self, holder: Mapping[str, Any]) -> str | None:
        """The address of the allocation held by this object's UID, if any."""
        address = _spec(self.held_allocation(holder) or {}).get("address")
        return str(address) if address else None

    def surplus_allocations(self, holder: Mapping[str, Any]) -> list[Obj]:
        """Allocations this object holds beyond the one it uses: to be released, not leaked (the
        repair pass never touches an allocation whose holder is alive)."""
        kept = self.held_allocation(holder)
        return [a for a in self.held_allocations(holder) if a is not kept]

    def taken_addresses(self) -> TakenAddresses:
        return TakenAddresses(self.allocations)

    def allocations_of_class(self, class_name: str) -> list[Obj]:
        return self.allocations.index(BY_CLASS, class_name)

    # --- who is concerned ------------------------------------------------------------------------

    def of_class(self, class_name: str) -> set[Key]:
        """Attachments minting from the class, and those whose claim is of that class."""
        keys = set(self.attachments.index_keys(BY_CLASS, class_name))
        for claim in self.claims.index(BY_CLASS, class_name):
            keys |= self.attachments.index_keys(BY_CLAIM, key_of(claim))
        return keys

    def in_vm_mode(self) -> frozenset[Key]:
        return self.attachments.index_keys(VM_MODE, True)

    def address_less(self, class_name: str) -> set[Key]:
        """Attachments minting from the class that hold no allocation (one lookup each)."""
        keys: set[Key] = set()
        for key in self.attachments.index_keys(BY_CLASS, class_name):
            uid = _metadata(self.attachments.get(key) or {}).get("uid")
            if not uid or not self.allocations.index_keys(BY_HOLDER, str(uid)):
                keys.add(key)
        return keys

    def is_proxied(self, service: Key) -> bool:
        """Whether the Service (cached) is delegated to a proxy."""
        found = self.services.get(service)
        return found is not None and SERVICE_PROXY_NAME_LABEL in labels(found)

    def attachment_with_uid(self, namespace: str, uid: str) -> Obj | None:
        return next((a for a in self.attachments.index(BY_UID, uid) if key_of(a)[0] == namespace), None)

    # --- what one pass sees ----------------------------------------------------------------------

    def slices_of(self, namespace: str, service: str) -> list[Obj]:
        return sorted(self.slices.index(BY_SERVICE, (namespace, service)), key=key_of)

    def pods_in(self, namespace: str) -> list[Obj]:
        return self.pods.index(BY_NAMESPACE, namespace)

    def proxied_services(self, namespace: str | None = None) -> list[ProxiedService]:
        """Every rival for pods (of ``namespace``, or everywhere): each Service delegated to a proxy,
        with the pods its selector selects (ready or not) and its endpoints' pods, ranked by the
        attachment that rendered it (controller reference of kind EndpointAttachment; one not cached
        ranks after every cached one); then each VM-mode attachment not being deleted that could
        render (``datapath.could_render``), under the name of the Service it renders, with the pods
        its endpoint selects (rendered or not: a loser must never render, not even once)."""
        result: list[ProxiedService] = []
        services = self.services.index(PROXIED, True)
        if namespace is not None:
            services = [s for s in services if key_of(s)[0] == namespace]
        proxy_names: dict[str, str] = {}
        for service in sorted(services, key=key_of):
            ns, name = key_of(service)
            owner = sole_controller(service)
            rank = None
            if owner and owner.get("kind") == ENDPOINT_ATTACHMENT_KIND:
                attachment = self.attachments.get((ns, str(owner.get("name"))))
                if attachment is None or _metadata(attachment).get("uid") != owner.get("uid"):
                    rank = uncached_rank(str(owner.get("name") or ""), ns, str(owner.get("uid") or ""))
                else:
                    rank = rank_of(attachment)
                    proxy_names[str(owner.get("uid"))] = labels(service)[SERVICE_PROXY_NAME_LABEL]
            selector = _spec(service).get("selector") or None
            result.append(
                ProxiedService(
                    namespace=ns,
                    name=name,
                    proxy_name=labels(service)[SERVICE_PROXY_NAME_LABEL],
                    backends=selected_pods(selector, self.pods_in(ns)) | slice_pods(self.slices_of(ns, name)),
                    attachment=rank,
                    selector=selector,
                    uid=str(_metadata(service).get("uid") or ""),
                    resource_version=str(_metadata(service).get("resourceVersion") or ""),
                )
            )
        declared = self.declared_proxy_names()
        for key in sorted(self.in_vm_mode()):
            if namespace is not None and key[0] != namespace:
                continue
            attachment = self.attachments.get(key)
            if attachment is None or _metadata(attachment).get("deletionTimestamp"):
                continue
            endpoint = self.endpoint_of(attachment)
            mode = str(_spec(attachment).get("mode") or MODE_STANDARD)
            ports = _spec(endpoint).get("ports") or [] if endpoint is not None else None
            if not could_render(mode, ports, list(self.proxies.values())):
                continue  # never renders as it is: takes no pod from anyone
            selector = _spec(endpoint).get("selector") or None if endpoint is not None else None
            ns, name = key
            uid = str(_metadata(attachment).get("uid") or "")
            # Under every proxy name it could render with (the one it renders with, when rendered).
            for proxy_name in sorted({proxy_names[uid]} if uid in proxy_names else declared):
                result.append(
                    ProxiedService(
                        namespace=ns,
                        name=service_name(name),
                        proxy_name=proxy_name,
                        backends=selected_pods(selector, self.pods_in(ns))
                        | slice_pods(self.slices_of(ns, endpoint_name(attachment))),
                        attachment=rank_of(attachment),
                        selector=selector,
                    )
                )
        return result

    def declared_proxy_names(self) -> frozenset[str]:
        """Every proxy name a live ServiceProxy declares."""
        return frozenset(
            str(_spec(p).get("serviceProxyName"))
            for p in self.proxies.values()
            if _spec(p).get("serviceProxyName") and not _metadata(p).get("deletionTimestamp")
        )

    def survivors_of(self, service: Mapping[str, Any]) -> list[Obj]:
        """The existing proxied Services cozy-proxy must program again once ``service`` (a proxied
        Service of ours, as last seen) is deleted or changed (``datapath.survivors``)."""
        changed = self.as_proxied(service)
        if changed is None:
            return []
        keys = survivors(changed, self.proxied_services(key_of(service)[0]))
        return [found for k in keys if (found := self.services.get(k)) is not None]

    def as_proxied(self, service: Mapping[str, Any]) -> ProxiedService | None:
        """A proxied Service as the exclusivity check sees it (None when not delegated to a proxy)."""
        proxy_name = labels(service).get(SERVICE_PROXY_NAME_LABEL)
        if not proxy_name:
            return None
        ns, name = key_of(service)
        selector = _spec(service).get("selector") or None
        return ProxiedService(
            namespace=ns,
            name=name,
            proxy_name=str(proxy_name),
            backends=selected_pods(selector, self.pods_in(ns)) | slice_pods(self.slices_of(ns, name)),
            selector=selector,
            uid=str(_metadata(service).get("uid") or ""),
            resource_version=str(_metadata(service).get("resourceVersion") or ""),
        )

    def observe(self, key: Key) -> Observed | None:
        attachment = self.attachments.get(key)
        return self.observed(attachment) if attachment is not None else None

    def observed(self, attachment: Obj) -> Observed:
        """Everything ``reconcile`` needs about this attachment, from the caches."""
        namespace, name = key_of(attachment)
        address = address_spec(attachment)
        claim = self.claims.get((namespace, str(address["claimName"]))) if address.get("claimName") else None
        endpoint = self.endpoint_of(attachment)
        held = self.held_address(attachment)
        return Observed(
            attachment=attachment,
            endpoint=endpoint,
            helmrelease=self.helmrelease_for(namespace, endpoint),
            address_class=self.address_class(self.class_name_of(attachment)),
            claim=claim,
            service_proxies=list(self.proxies.values()),
            held_address=held,
            taken_addresses=self.taken_addresses() if held is None else frozenset(),
            service=self.services.get((namespace, service_name(name))),
            endpoint_slices=self.slices_of(namespace, endpoint_name(attachment)),
            rendered_endpoints=self.endpoints.get((namespace, service_name(name)))
            if in_vm_mode(attachment)
            else None,
            proxied_services=self.proxied_services(namespace) if in_vm_mode(attachment) else (),
            namespace_labels=self.namespace_labels(namespace),
            pods=self.pods_in(namespace) if in_vm_mode(attachment) else (),
        )

    def live_holders(self) -> dict[str, tuple[str, str, str]]:
        """UID -> (kind, namespace, name) of every object that may hold an allocation."""
        holders: dict[str, tuple[str, str, str]] = {}
        kinds: Iterable[tuple[str, Store]] = (
            (ENDPOINT_ATTACHMENT_KIND, self.attachments),
            (IP_ADDRESS_CLAIM_KIND, self.claims),
        )
        for kind, store in kinds:
            for (namespace, name), obj in list(store.items()):
                uid = _metadata(obj).get("uid")
                if uid:
                    holders[str(uid)] = (kind, namespace, name)
        return holders
