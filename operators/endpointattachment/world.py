"""What the EndpointAttachment operator has observed: watch caches with the indexes a pass needs.

Decides: how watched objects are kept (one dict per kind, updated from watch events and from the
answers of our own writes, so a pass right after a write sees it), which attachments a change to
any other object wakes, and how the ``Observed`` of one attachment (or ``ClaimObserved`` of one claim)
is assembled from the caches, without any LIST.

Does not: talk to the API, decide anything about an attachment, or trust a label for ownership: the
rendered Service is found by its name and judged by its controller reference in ``reconcile``.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from operators.endpointattachment.addresses import InvalidAddress, canonical
from operators.endpointattachment.constants import (
    ATTACHMENT_LABEL,
    ENDPOINT_ATTACHMENT_KIND,
    ENDPOINTSLICE_SERVICE_NAME_LABEL,
    MODE_STANDARD,
    SERVICE_PROXY_NAME_LABEL,
)
from operators.endpointattachment.datapath import ProxiedService, rank_of, ready_backends
from operators.endpointattachment.reconcile import Observed
from operators.endpointattachment.render import service_name
from shared.lineage import application_of, belongs_to
from shared.ownership import sole_controller

Key = tuple[str, str]  # (namespace, name); cluster-scoped objects use "" as namespace
_NAMESPACED = frozenset({"attachment", "claim", "service", "slice", "helmrelease"})
Obj = Mapping[str, Any]


def key_of(obj: Obj) -> Key:
    metadata = obj.get("metadata") or {}
    return str(metadata.get("namespace") or ""), str(metadata.get("name") or "")


def labels(obj: Obj) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


@dataclass
class World:
    attachments: dict[Key, Obj] = field(default_factory=dict)
    claims: dict[Key, Obj] = field(default_factory=dict)
    classes: dict[str, Obj] = field(default_factory=dict)
    allocations: dict[str, Obj] = field(default_factory=dict)
    proxies: dict[str, Obj] = field(default_factory=dict)
    services: dict[Key, Obj] = field(default_factory=dict)
    slices: dict[Key, Obj] = field(default_factory=dict)
    helmreleases: dict[Key, Obj] = field(default_factory=dict)
    namespace_labels: dict[str, Mapping[str, str]] = field(default_factory=dict)
    # indexes, kept by the updates below so a pass or a wake-up never scans every object
    # holder UID -> names of the allocations it holds (one, unless a mint raced a stale cache)
    _holder_allocations: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    _taken: dict[str, str] = field(default_factory=dict)  # allocation name -> canonical address
    _taken_frozen: frozenset[str] | None = None  # the values of _taken, rebuilt only after a change
    _by_endpoint: dict[Key, set[Key]] = field(default_factory=lambda: defaultdict(set))  # (ns, svc)
    _by_class: dict[str, set[Key]] = field(default_factory=lambda: defaultdict(set))  # spec.className
    _by_claim: dict[Key, set[Key]] = field(default_factory=lambda: defaultdict(set))  # (ns, claimName)
    _slices_of_service: dict[Key, set[Key]] = field(default_factory=lambda: defaultdict(set))
    _proxied: set[Key] = field(default_factory=set)

    # --- updates ---------------------------------------------------------------------------------

    def put(self, kind: str, obj: Obj) -> None:
        getattr(self, f"_put_{kind}")(obj)

    def drop(self, kind: str, obj: Obj) -> None:
        getattr(self, f"_drop_{kind}")(obj)

    def get(self, kind: str, obj: Obj) -> Obj | None:
        """The cached version of ``obj`` (same kind and key), if any."""
        namespace, name = key_of(obj)
        stores: dict[str, Mapping[Any, Obj]] = {
            "attachment": self.attachments,
            "claim": self.claims,
            "service": self.services,
            "slice": self.slices,
            "helmrelease": self.helmreleases,
            "class": self.classes,
            "allocation": self.allocations,
            "proxy": self.proxies,
        }
        store = stores.get(kind, {})
        return store.get((namespace, name)) if kind in _NAMESPACED else store.get(name)

    def _put_attachment(self, obj: Obj) -> None:
        self._drop_attachment(obj)
        key = key_of(obj)
        self.attachments[key] = obj
        spec = obj.get("spec") or {}
        self._by_endpoint[(key[0], str((spec.get("endpoint") or {}).get("name")))].add(key)
        address = _address_spec(obj)
        if address.get("className"):
            self._by_class[str(address["className"])].add(key)
        if address.get("claimName"):
            self._by_claim[(key[0], str(address["claimName"]))].add(key)

    def _drop_attachment(self, obj: Obj) -> None:
        key = key_of(obj)
        old = self.attachments.pop(key, None)
        if old is None:
            return
        spec = old.get("spec") or {}
        self._by_endpoint[(key[0], str((spec.get("endpoint") or {}).get("name")))].discard(key)
        address = _address_spec(old)
        self._by_class[str(address.get("className"))].discard(key)
        self._by_claim[(key[0], str(address.get("claimName")))].discard(key)

    def _put_claim(self, obj: Obj) -> None:
        self.claims[key_of(obj)] = obj

    def _drop_claim(self, obj: Obj) -> None:
        self.claims.pop(key_of(obj), None)

    def _put_class(self, obj: Obj) -> None:
        self.classes[key_of(obj)[1]] = obj

    def _drop_class(self, obj: Obj) -> None:
        self.classes.pop(key_of(obj)[1], None)

    def _put_allocation(self, obj: Obj) -> None:
        name = key_of(obj)[1]
        self._drop_allocation(obj)
        self.allocations[name] = obj
        holder = ((obj.get("spec") or {}).get("holder") or {}).get("uid")
        if holder:
            self._holder_allocations[str(holder)].add(name)
        # The CRD refuses unreadable addresses; one that slipped in holds nothing we could mint.
        with contextlib.suppress(InvalidAddress):
            self._taken[name] = canonical(str((obj.get("spec") or {}).get("address")))
        self._taken_frozen = None

    def _drop_allocation(self, obj: Obj) -> None:
        old = self.allocations.pop(key_of(obj)[1], None)
        holder = ((old or {}).get("spec") or {}).get("holder") or {}
        if holder.get("uid"):
            self._holder_allocations[str(holder["uid"])].discard(key_of(obj)[1])
        if self._taken.pop(key_of(obj)[1], None) is not None:
            self._taken_frozen = None

    def _put_proxy(self, obj: Obj) -> None:
        self.proxies[key_of(obj)[1]] = obj

    def _drop_proxy(self, obj: Obj) -> None:
        self.proxies.pop(key_of(obj)[1], None)

    def _put_service(self, obj: Obj) -> None:
        key = key_of(obj)
        self.services[key] = obj
        if SERVICE_PROXY_NAME_LABEL in labels(obj):
            self._proxied.add(key)
        else:
            self._proxied.discard(key)

    def _drop_service(self, obj: Obj) -> None:
        key = key_of(obj)
        self.services.pop(key, None)
        self._proxied.discard(key)

    def _put_slice(self, obj: Obj) -> None:
        self._drop_slice(obj)
        key = key_of(obj)
        self.slices[key] = obj
        service = labels(obj).get(ENDPOINTSLICE_SERVICE_NAME_LABEL)
        if service:
            self._slices_of_service[(key[0], service)].add(key)

    def _drop_slice(self, obj: Obj) -> None:
        key = key_of(obj)
        old = self.slices.pop(key, None)
        service = labels(old or {}).get(ENDPOINTSLICE_SERVICE_NAME_LABEL)
        if service:
            self._slices_of_service[(key[0], service)].discard(key)

    def _put_helmrelease(self, obj: Obj) -> None:
        self.helmreleases[key_of(obj)] = obj

    def _drop_helmrelease(self, obj: Obj) -> None:
        self.helmreleases.pop(key_of(obj), None)

    def _put_namespace(self, obj: Obj) -> None:
        self.namespace_labels[key_of(obj)[1]] = dict(labels(obj))

    def _drop_namespace(self, obj: Obj) -> None:
        self.namespace_labels.pop(key_of(obj)[1], None)

    # --- who a change concerns -------------------------------------------------------------------

    def attachments_affected_by(self, kind: str, obj: Obj) -> Iterator[Key]:
        """The attachments whose pass may change because ``obj`` (of ``kind``) changed."""
        namespace, name = key_of(obj)
        if kind == "attachment":
            yield namespace, name
        elif kind == "service":
            yield from self._by_endpoint.get((namespace, name), ())
            owner = sole_controller(obj)
            if owner and owner.get("kind") == ENDPOINT_ATTACHMENT_KIND:
                yield namespace, str(owner.get("name"))
            elif ATTACHMENT_LABEL in labels(obj):
                yield from self._rendering(namespace, name)  # a name squatter: report the conflict
            if SERVICE_PROXY_NAME_LABEL in labels(obj):
                yield from self._vm_mode()
        elif kind == "slice":
            service = labels(obj).get(ENDPOINTSLICE_SERVICE_NAME_LABEL, "")
            yield from self._by_endpoint.get((namespace, service), ())
            yield from self._vm_mode()  # backends of any proxied Service decide exclusivity
        elif kind == "helmrelease":
            app = application_of(obj)
            for key in [k for k in self.attachments if k[0] == namespace]:
                endpoint = self.endpoint_of(self.attachments[key])
                if app is None or endpoint is None or belongs_to(endpoint, app):
                    yield key
        elif kind == "claim":
            yield from self._by_claim.get((namespace, name), ())
        elif kind == "class":
            yield from self._of_class(name)
        elif kind == "allocation":
            holder = (obj.get("spec") or {}).get("holder") or {}
            if holder.get("kind") == ENDPOINT_ATTACHMENT_KIND:
                yield str(holder.get("namespace") or ""), str(holder.get("name") or "")
            # A freed address may end another attachment's PoolExhausted.
            for key in self._of_class(str((obj.get("spec") or {}).get("className"))):
                if not self.held_address(self.attachments[key]):
                    yield key
        elif kind == "proxy":
            yield from self._vm_mode()
        elif kind == "namespace":
            yield from (key for key in self.attachments if key[0] == name)

    def _of_class(self, class_name: str) -> list[Key]:
        """Attachments minting from the class, and those whose claim is of that class."""
        keys = [k for k in self._by_class.get(class_name, ()) if k in self.attachments]
        for (namespace, claim_name), users in self._by_claim.items():
            claim = self.claims.get((namespace, claim_name))
            if users and claim is not None and (claim.get("spec") or {}).get("className") == class_name:
                keys.extend(k for k in users if k in self.attachments)
        return keys

    def claims_affected_by(self, kind: str, obj: Obj) -> Iterator[Key]:
        namespace, name = key_of(obj)
        if kind == "claim":
            yield namespace, name
        elif kind == "allocation":
            holder = (obj.get("spec") or {}).get("holder") or {}
            if holder.get("kind") != ENDPOINT_ATTACHMENT_KIND and holder.get("name"):
                yield str(holder.get("namespace") or ""), str(holder["name"])
        elif kind == "class":
            yield from (
                key
                for key, claim in self.claims.items()
                if (claim.get("spec") or {}).get("className") == name
            )
        elif kind == "namespace":
            yield from (key for key in self.claims if key[0] == name)

    def _using_endpoint(self, namespace: str, service: str) -> Iterator[Key]:
        for key, attachment in self.attachments.items():
            if (
                key[0] == namespace
                and ((attachment.get("spec") or {}).get("endpoint") or {}).get("name") == service
            ):
                yield key

    def _rendering(self, namespace: str, service: str) -> Iterator[Key]:
        yield from (
            key for key in self.attachments if key[0] == namespace and service_name(key[1]) == service
        )

    def _vm_mode(self) -> Iterator[Key]:
        for key, attachment in self.attachments.items():
            if ((attachment.get("spec") or {}).get("mode") or MODE_STANDARD) != MODE_STANDARD:
                yield key

    # --- what one pass sees ----------------------------------------------------------------------

    def endpoint_of(self, attachment: Obj) -> Obj | None:
        namespace, _ = key_of(attachment)
        return self.services.get(
            (namespace, str(((attachment.get("spec") or {}).get("endpoint") or {}).get("name")))
        )

    def class_name_of(self, attachment: Obj) -> str | None:
        address = _address_spec(attachment)
        if address.get("className"):
            return str(address["className"])
        claim = self.claims.get((key_of(attachment)[0], str(address.get("claimName"))))
        return str((claim.get("spec") or {}).get("className")) if claim else None

    def held_address(self, holder: Obj) -> str | None:
        """The address of the allocation held by this object's UID, if any."""
        address = ((self.held_allocation(holder) or {}).get("spec") or {}).get("address")
        return str(address) if address else None

    def held_allocation(self, holder: Obj) -> Obj | None:
        """The allocation this object holds: the one its status already names, else the first by
        name, so every pass picks the same one when a raced mint left two."""
        held = self.held_allocations(holder)
        recorded = (holder.get("status") or {}).get("address")
        return next((a for a in held if (a.get("spec") or {}).get("address") == recorded), None) or (
            held[0] if held else None
        )

    def held_allocations(self, holder: Obj) -> list[Obj]:
        uid = (holder.get("metadata") or {}).get("uid")
        names = sorted(self._holder_allocations.get(str(uid), ())) if uid else []
        return [self.allocations[n] for n in names if n in self.allocations]

    def surplus_allocations(self, holder: Obj) -> list[Obj]:
        """Allocations this object holds beyond the one it uses: to be released, not leaked (the
        repair pass never touches an allocation whose holder is alive)."""
        kept = self.held_allocation(holder)
        return [a for a in self.held_allocations(holder) if a is not kept]

    def taken_addresses(self) -> frozenset[str]:
        """Canonical text of every allocated address; rebuilt only after allocations change."""
        if self._taken_frozen is None:
            self._taken_frozen = frozenset(self._taken.values())
        return self._taken_frozen

    def slices_of(self, namespace: str, service: str) -> list[Obj]:
        return [
            self.slices[k] for k in self._slices_of_service.get((namespace, service), ()) if k in self.slices
        ]

    def proxied_services(self) -> list[ProxiedService]:
        """Every Service delegated to a proxy, with its ready backends and, if an attachment rendered
        it (controller reference of kind EndpointAttachment), that attachment's rank."""
        result = []
        for key in self._proxied:
            service = self.services[key]
            owner = sole_controller(service)
            rank = None
            if owner and owner.get("kind") == ENDPOINT_ATTACHMENT_KIND:
                attachment = self.attachments.get((key[0], str(owner.get("name"))))
                if attachment is not None and (attachment.get("metadata") or {}).get("uid") == owner.get(
                    "uid"
                ):
                    rank = rank_of(attachment)
                else:
                    rank = rank_of(
                        {
                            "metadata": {
                                "name": owner.get("name"),
                                "namespace": key[0],
                                "uid": owner.get("uid"),
                            }
                        }
                    )
            result.append(
                ProxiedService(
                    namespace=key[0],
                    name=key[1],
                    proxy_name=labels(service)[SERVICE_PROXY_NAME_LABEL],
                    backends=ready_backends(self.slices_of(*key)),
                    attachment=rank,
                )
            )
        return result

    def helmrelease_for(self, namespace: str, endpoint: Obj | None) -> Obj | None:
        """The application object: the HelmRelease in the namespace with the endpoint's lineage."""
        app = application_of(endpoint) if endpoint is not None else None
        if app is None:
            return None
        matches = [hr for (ns, _), hr in self.helmreleases.items() if ns == namespace and belongs_to(hr, app)]
        return matches[0] if len(matches) == 1 else None

    def observe(self, key: Key) -> Observed | None:
        attachment = self.attachments.get(key)
        if attachment is None:
            return None
        namespace, name = key
        address = _address_spec(attachment)
        claim = (
            self.claims.get((namespace, str(address.get("claimName")))) if address.get("claimName") else None
        )
        class_name = self.class_name_of(attachment)
        endpoint = self.endpoint_of(attachment)
        held = self.held_address(attachment)
        vm_mode = ((attachment.get("spec") or {}).get("mode") or MODE_STANDARD) != MODE_STANDARD
        endpoint_name = str(((attachment.get("spec") or {}).get("endpoint") or {}).get("name"))
        return Observed(
            attachment=attachment,
            endpoint=endpoint,
            helmrelease=self.helmrelease_for(namespace, endpoint),
            address_class=self.classes.get(class_name) if class_name else None,
            claim=claim,
            service_proxies=list(self.proxies.values()),
            held_address=held,
            taken_addresses=self.taken_addresses() if held is None else frozenset(),
            service=self.services.get((namespace, service_name(name))),
            endpoint_slices=self.slices_of(namespace, endpoint_name),
            proxied_services=self.proxied_services() if vm_mode else (),
            namespace_labels=self.namespace_labels.get(namespace, {}),
        )

    def live_holders(self) -> dict[str, tuple[str, str, str]]:
        """UID -> (kind, namespace, name) of every object that may hold an allocation."""
        holders: dict[str, tuple[str, str, str]] = {}
        for kind, objects in (("EndpointAttachment", self.attachments), ("IPAddressClaim", self.claims)):
            for (namespace, name), obj in objects.items():
                uid = (obj.get("metadata") or {}).get("uid")
                if uid:
                    holders[str(uid)] = (kind, namespace, name)
        return holders


def _address_spec(attachment: Obj) -> Mapping[str, Any]:
    return (attachment.get("spec") or {}).get("address") or {}
