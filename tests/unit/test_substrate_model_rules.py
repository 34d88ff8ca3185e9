"""The substrate model (``harness.substrate``) itself: one row per rule of the real substrate it
stands for, driven without a cluster. ``Store`` plays the API server: it applies each planned write
(merge patches, plain Updates, the status subresource, finalizers, 409 on a taken name) and feeds the
result back as a watch event, until the model has nothing left to write."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from typing import Any

import pytest

from hack.substrate import PLACEHOLDER_NAMESPACE
from harness.mergepatch import merge_patch
from harness.substrate import (
    ADDRESSES,
    CLAIM_ANNOTATION,
    CLAIM_PROTECTION_FINALIZER,
    CLAIMS,
    CLASSES,
    DEFAULT_CLASS_ANNOTATION,
    L2_ADVERTISEMENTS,
    METALLB_IPS_ANNOTATION,
    METALLB_PROVISIONER,
    PINNED_MARKER,
    POOLS,
    PROVISIONER_ANNOTATION,
    SubstrateModel,
    Write,
    address_name,
)
from shared.resources import SERVICES, Resource

Obj = dict[str, Any]
NS = "tenant-a"
NOW = "2026-12-01T00:00:00Z"
StoreKey = tuple[str, str, str]  # (plural, namespace, name)


class Store:
    """A tiny API server for the model: objects by (plural, namespace, name)."""

    def __init__(self, model: SubstrateModel) -> None:
        self.model = model
        self.objects: dict[StoreKey, tuple[Resource, Obj]] = {}
        self.versions = itertools.count(1)
        self.writes: list[Write] = []

    def _key(self, resource: Resource, name: str, namespace: str | None) -> StoreKey:
        return resource.plural, (namespace or "") if resource.namespaced else "", name

    def get(self, resource: Resource, name: str, namespace: str | None = None) -> Obj | None:
        found = self.objects.get(self._key(resource, name, namespace))
        return found[1] if found else None

    def put(self, resource: Resource, obj: Obj, *, seen: bool = True) -> Obj:
        """Create ``obj`` (``seen=False``: the model's watch never delivers it)."""
        obj = copy.deepcopy(obj)
        metadata = obj.setdefault("metadata", {})
        version = next(self.versions)
        metadata.setdefault("uid", f"uid-{version}")
        metadata.setdefault("creationTimestamp", f"2026-12-01T00:00:{version:02d}Z")
        metadata["resourceVersion"] = str(version)
        metadata["generation"] = 1
        self.objects[self._key(resource, metadata["name"], metadata.get("namespace"))] = (resource, obj)
        if seen:
            self.model.on_event(resource, "ADDED", copy.deepcopy(obj))
        return obj

    def update(self, resource: Resource, name: str, namespace: str | None, patch: Obj) -> None:
        """A change by someone else (a tenant, a hoster): a merge patch."""
        obj = self.get(resource, name, namespace)
        assert obj is not None
        self._store(resource, merge_patch(obj, patch))

    def _store(self, resource: Resource, obj: Obj) -> None:
        metadata = obj["metadata"]
        key = self._key(resource, metadata["name"], metadata.get("namespace"))
        if metadata.get("deletionTimestamp") and not metadata.get("finalizers"):
            del self.objects[key]
            self.model.on_event(resource, "DELETED", copy.deepcopy(obj))
            return
        metadata["resourceVersion"] = str(next(self.versions))
        self.objects[key] = (resource, obj)
        self.model.on_event(resource, "MODIFIED", copy.deepcopy(obj))

    def delete(self, resource: Resource, name: str, namespace: str | None = None) -> None:
        obj = self.get(resource, name, namespace)
        assert obj is not None
        self._store(resource, merge_patch(obj, {"metadata": {"deletionTimestamp": NOW}}))

    def apply(self, write: Write) -> bool:
        """One planned write; False when the API would refuse it (409)."""
        self.writes.append(write)
        body = copy.deepcopy(write.body or {})
        existing = self.get(write.resource, write.name, write.namespace)
        if write.verb == "create":
            if existing is not None:
                self.model.on_conflict(write)
                return False
            self.put(write.resource, body)
            return True
        if write.verb == "apply":
            if existing is None:
                self.put(write.resource, body)
            else:
                self._store(write.resource, {**body, "metadata": {**existing["metadata"]}})
            return True
        if existing is None:
            return False
        if write.verb == "delete":
            self.delete(write.resource, write.name, write.namespace)
            return True
        wanted_version = (body.get("metadata") or {}).pop("resourceVersion", None)
        if wanted_version is not None and wanted_version != existing["metadata"]["resourceVersion"]:
            return False
        if write.verb == "update":  # the whole object but its status, as a plain Update replaces it
            self._store(write.resource, {**body, "status": existing.get("status")})
            return True
        if write.verb == "status":
            patch = {"status": body.get("status")}
        else:
            patch = {k: v for k, v in body.items() if k != "status"}
        self._store(write.resource, merge_patch(existing, patch))
        return True

    def settle(self, passes: int = 30) -> None:
        """Apply the model's plans until it has nothing to write (and prove a second plan is empty)."""
        for _ in range(passes):
            writes = self.model.plan(NOW)
            if not writes:
                return
            for write in writes:
                if not self.apply(write):
                    break
        raise AssertionError(f"no fixed point: {self.model.plan(NOW)}")


# --- builders ------------------------------------------------------------------------------------


def make_class(
    name: str,
    *addresses: str,
    default: bool = False,
    reclaim: str = "Retain",
    provisioner: str = METALLB_PROVISIONER,
) -> Obj:
    annotations = {DEFAULT_CLASS_ANNOTATION: "true"} if default else {}
    return {
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "provisioner": provisioner,
            "reclaimPolicy": reclaim,
            "parameters": {"addresses": list(addresses or ("198.51.100.0/29",))},
        },
    }


def make_claim(name: str, class_name: str | None = None, family: str = "IPv4") -> Obj:
    spec: Obj = {"family": family}
    if class_name:
        spec["className"] = class_name
    return {"metadata": {"name": name, "namespace": NS}, "spec": spec}


def make_service(name: str, claim: str | None) -> Obj:
    annotations = {CLAIM_ANNOTATION: claim} if claim else {}
    return {
        "metadata": {"name": name, "namespace": NS, "annotations": annotations},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]},
    }


def world(*classes: Obj) -> Store:
    store = Store(SubstrateModel())
    for address_class in classes:
        store.put(CLASSES, address_class)
    return store


def claim_status(store: Store, name: str) -> Obj:
    claim = store.get(CLAIMS, name, NS)
    assert claim is not None
    status: Obj = claim.get("status") or {}
    return status


def condition(store: Store, name: str, type_: str) -> Obj:
    conditions = claim_status(store, name).get("conditions") or []
    found: Obj = next(c for c in conditions if c["type"] == type_)
    return found


def resolved(store: Store, name: str) -> tuple[str, str, str]:
    found = condition(store, name, "ClassResolved")
    return str(found["status"]), str(found["reason"]), str(found["message"])


def reason(store: Store, name: str, type_: str) -> str:
    return str(condition(store, name, type_)["reason"])


def ips(store: Store, name: str) -> list[str]:
    return [str(a["address"]) for a in claim_status(store, name).get("addresses") or []]


def pin(store: Store, service: str) -> tuple[str | None, str | None]:
    """The Service's pin as the driver writes it: (the addresses, the marker)."""
    obj = store.get(SERVICES, service, NS)
    assert obj is not None
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return annotations.get(METALLB_IPS_ANNOTATION), annotations.get(PINNED_MARKER)


def associated(store: Store, address: str) -> str | None:
    obj = store.get(ADDRESSES, address)
    assert obj is not None
    to = (obj.get("status") or {}).get("associatedTo")
    return str(to["name"]) if to else None


def address_phase(store: Store, address: str) -> str:
    obj = store.get(ADDRESSES, address)
    assert obj is not None
    return str(obj["status"]["phase"])


def placeholders(store: Store) -> dict[str, str]:
    """The driver's placeholders: name -> the address it holds."""
    return {
        key[2]: obj["metadata"]["annotations"][METALLB_IPS_ANNOTATION]
        for key, (_, obj) in store.objects.items()
        if key[0] == SERVICES.plural and key[1] == PLACEHOLDER_NAMESPACE
    }


def written(store: Store) -> list[tuple[str, str, str]]:
    """The writes so far, as (verb, plural, name)."""
    return [(w.verb, w.resource.plural, w.name) for w in store.writes]


def claim_phases_written(store: Store, name: str) -> list[str]:
    return [
        str((w.body or {})["status"]["phase"])
        for w in store.writes
        if w.resource == CLAIMS and w.verb == "status" and w.name == name
    ]


def claim_ref(store: Store, name: str) -> Obj:
    claim = store.get(CLAIMS, name, NS)
    assert claim is not None
    return {"namespace": NS, "name": name, "uid": claim["metadata"]["uid"]}


def bound_claim(*classes: Obj, claim: Obj | None = None) -> Store:
    store = world(*(classes or (make_class("public", default=True),)))
    store.put(CLAIMS, claim or make_claim("c1"))
    store.settle()
    return store


# --- scenarios -----------------------------------------------------------------------------------

V4 = "198.51.100.0"  # the class's first address: the network's own (MetalLB hands it out)
A4 = "ip-198-51-100-0"
V6 = "2001:db8::"
A6 = "ip-2001-0db8-0000-0000-0000-0000-0000-0000"
HOLDER = "iad-uid-2-v4"  # the placeholder provisioning c1 (uid-2) created
REHOLDER = f"iad-{A4}"  # the placeholder re-holding the address once no Service uses it
PINNED = (V4, "true")
UNPINNED = (None, None)


def no_default() -> Store:
    return bound_claim(make_class("public"))


def two_defaults() -> Store:
    return bound_claim(make_class("a", default=True), make_class("b", "203.0.113.0/29", default=True))


def class_not_found() -> Store:
    return bound_claim(claim=make_claim("c1", "missing"))


def class_sticks() -> Store:
    store = bound_claim(make_class("a", default=True))
    store.put(CLASSES, make_class("b", "203.0.113.0/29", default=True))
    store.update(CLASSES, "a", None, {"metadata": {"annotations": {DEFAULT_CLASS_ANNOTATION: None}}})
    store.settle()
    return store


def slash30() -> Store:
    store = world(make_class("public", "198.51.100.0/30", default=True))
    for name in ("c1", "c2", "c3", "c4", "c5"):
        store.put(CLAIMS, make_claim(name))
    store.settle()
    return store


def dual() -> Store:
    return bound_claim(
        make_class("dual", "2001:db8::/126", "198.51.100.0/29", default=True),
        claim=make_claim("c1", family="Dual"),
    )


def taken_by_another() -> Store:
    store = world(make_class("public", default=True))
    store.put(ADDRESSES, {"metadata": {"name": A4}, "spec": {}}, seen=False)
    store.put(CLAIMS, make_claim("c1"))
    store.settle()
    return store


def with_service(*services: str, claim: Obj | None = None) -> Store:
    store = bound_claim(claim=claim)
    store.writes.clear()
    for name in services:
        store.put(SERVICES, make_service(name, "c1"))
    store.settle()
    return store


def service_deleted() -> Store:
    store = with_service("s1")
    store.delete(SERVICES, "s1", NS)
    store.settle()
    return store


def service_back() -> Store:
    store = service_deleted()
    store.put(SERVICES, make_service("s3", "c1"))
    store.settle()
    return store


def annotation_dropped() -> Store:
    store = with_service("s1")
    store.update(SERVICES, "s1", NS, {"metadata": {"annotations": {CLAIM_ANNOTATION: None}}})
    store.settle()
    return store


def first_service_gone() -> Store:
    store = with_service("s1", "s2")
    store.delete(SERVICES, "s1", NS)
    store.settle()
    return store


def claim_deleted(reclaim: str, *services: str) -> Store:
    store = bound_claim(make_class("public", default=True, reclaim=reclaim))
    for name in services:
        store.put(SERVICES, make_service(name, "c1"))
    store.settle()
    store.delete(CLAIMS, "c1", NS)
    store.settle()
    return store


def released_service_deleted() -> Store:
    store = claim_deleted("Retain", "s1")
    store.delete(SERVICES, "s1", NS)
    store.settle()
    return store


def claim_ref_cleared() -> Store:
    store = claim_deleted("Retain")
    store.update(ADDRESSES, A4, None, {"spec": {"claimRef": None}})  # the hoster
    store.settle()
    return store


def available_rebound() -> Store:
    store = claim_ref_cleared()
    store.writes.clear()
    store.put(CLAIMS, make_claim("c2"))
    store.settle()
    return store


def pending_claim_service() -> Store:
    store = world(make_class("public", "198.51.100.1/32", default=True))
    store.put(CLAIMS, make_claim("c0"))
    store.put(CLAIMS, make_claim("c1"))
    store.put(SERVICES, make_service("s1", "c1"))
    store.settle()
    return store


def dual_service() -> Store:
    store = dual()
    store.put(SERVICES, make_service("s1", "c1"))
    store.settle()
    return store


def pools() -> Store:
    store = world(make_class("public", "198.51.100.0/28"), make_class("other", provisioner="x.example"))
    store.settle()
    return store


def rendered(store: Store, resource: Resource) -> dict[str, Obj]:
    return {key[2]: obj["spec"] for key, (_, obj) in store.objects.items() if key[0] == resource.plural}


def holder(store: Store) -> tuple[object, ...]:
    """The provisioning placeholder as the driver creates it."""
    obj = store.get(SERVICES, HOLDER, PLACEHOLDER_NAMESPACE)
    assert obj is not None
    spec = obj["spec"]
    return spec["type"], "selector" in spec, obj["metadata"]["annotations"]


Probe = Callable[[Store], object]


@pytest.mark.parametrize(
    ("scenario", "probe", "expected"),
    [
        # The core: class resolution, the stamp, the finalizer.
        pytest.param(
            no_default,
            lambda s: (claim_status(s, "c1")["phase"], reason(s, "c1", "ClassResolved"), ips(s, "c1")),
            ("Pending", "NoDefaultClass", []),
            id="no default class: NoDefaultClass, Pending",
        ),
        pytest.param(
            bound_claim,
            lambda s: (claim_status(s, "c1")["className"], *resolved(s, "c1")),
            ("public", "True", "Resolved", 'resolved to IPAddressClass "public"'),
            id="one default class: the claim resolves to it (ClassResolved's message as observed)",
        ),
        pytest.param(
            two_defaults,
            lambda s: (reason(s, "c1", "ClassResolved"), "className" in claim_status(s, "c1")),
            ("MultipleDefaultClasses", False),
            id="two default classes: MultipleDefaultClasses, never a guess",
        ),
        pytest.param(
            class_not_found,
            lambda s: (claim_status(s, "c1")["phase"], reason(s, "c1", "ClassResolved")),
            ("Pending", "ClassNotFound"),
            id="a named class missing: ClassNotFound",
        ),
        pytest.param(
            class_sticks,
            lambda s: (claim_status(s, "c1")["className"], ips(s, "c1")),
            ("a", [V4]),
            id="status.className sticks when the default moves",
        ),
        pytest.param(
            bound_claim,
            lambda s: (
                s.get(CLAIMS, "c1", NS)["metadata"]["annotations"][PROVISIONER_ANNOTATION],
                s.get(CLAIMS, "c1", NS)["metadata"]["finalizers"],
            ),
            (METALLB_PROVISIONER, [CLAIM_PROTECTION_FINALIZER]),
            id="the provisioner stamp (an annotation) and the claim-protection finalizer",
        ),
        # Provisioning.
        pytest.param(
            bound_claim,
            lambda s: (
                claim_status(s, "c1")["phase"],
                claim_status(s, "c1")["addresses"],
                reason(s, "c1", "Bound"),
            ),
            ("Bound", [{"name": A4, "address": V4}], "Bound"),
            id="IPv4: Bound to the network's own address first, named ip-<IP with - for .>",
        ),
        pytest.param(
            slash30,
            lambda s: [ips(s, c) for c in ("c1", "c2", "c3", "c4")],
            [["198.51.100.0"], ["198.51.100.1"], ["198.51.100.2"], ["198.51.100.3"]],
            id="a /30 holds four addresses: network and broadcast too (avoidBuggyIPs false)",
        ),
        pytest.param(
            slash30,
            lambda s: (claim_status(s, "c5")["phase"], reason(s, "c5", "Bound"), ips(s, "c5")),
            ("Pending", "WaitingForProvisioning", []),
            id="class exhausted: the claim stays Pending, WaitingForProvisioning",
        ),
        pytest.param(
            bound_claim,
            lambda s: [w for w in written(s) if w[0] == "create"],
            [("create", "services", HOLDER), ("create", "ipaddresses", A4)],
            id="provisioning: the placeholder iad-<claim uid>-v4 first, then the address",
        ),
        pytest.param(
            bound_claim,
            holder,
            ("LoadBalancer", False, {"metallb.io/address-pool": "iad-public", METALLB_IPS_ANNOTATION: V4}),
            id="the placeholder: selectorless LoadBalancer in the driver's namespace, pool and IP pinned",
        ),
        pytest.param(
            bound_claim,
            lambda s: (s.get(ADDRESSES, A4)["spec"], address_phase(s, A4)),
            (
                {
                    "address": V4,
                    "className": "public",
                    "claimRef": {"namespace": NS, "name": "c1", "uid": "uid-2"},
                    "reclaimPolicy": "Retain",
                    "source": {"fromClass": {}},
                },
                "Bound",
            ),
            id="the address: claimRef with the claim's UID, class, reclaim policy, fromClass; Bound",
        ),
        pytest.param(
            lambda: bound_claim(
                make_class("v6", "2001:db8::/126", default=True), claim=make_claim("c1", family="IPv6")
            ),
            lambda s: claim_status(s, "c1")["addresses"],
            [{"name": A6, "address": V6}],
            id="IPv6 (its naming a guess): the network's own address, exploded (compressed ends in ':')",
        ),
        pytest.param(
            dual,
            lambda s: (claim_status(s, "c1")["phase"], ips(s, "c1")),
            ("Bound", [V4, V6]),
            id="Dual: two addresses, IPv4 first",
        ),
        pytest.param(
            lambda: bound_claim(make_class("v4only", default=True), claim=make_claim("c1", family="Dual")),
            lambda s: (claim_status(s, "c1")["phase"], ips(s, "c1"), reason(s, "c1", "Bound")),
            ("Pending", [V4], "WaitingForProvisioning"),
            id="Dual from a class without IPv6: Pending with the one it has",
        ),
        pytest.param(
            taken_by_another,
            lambda s: (ips(s, "c1"), A4 in s.model.taken, placeholders(s)),
            (["198.51.100.1"], True, {"iad-uid-3-v4": "198.51.100.1"}),
            id="409 on the IP's name: the next IP, the claim's placeholder moved to it",
        ),
        # Placeholders and pins.
        pytest.param(
            bound_claim,
            placeholders,
            {HOLDER: V4},
            id="no Service uses the address: its provisioning placeholder keeps holding it",
        ),
        pytest.param(
            lambda: with_service("s1"),
            lambda s: (associated(s, A4), placeholders(s), pin(s, "s1")),
            ("s1", {}, PINNED),
            id="an annotated Service: associated, the placeholder gone, pinned with the marker",
        ),
        pytest.param(
            lambda: with_service("s1"),
            written,
            [("status", "ipaddresses", A4), ("delete", "services", HOLDER), ("update", "services", "s1")],
            id="the driver's order: associatedTo, the placeholder deleted, then ONE Update of the Service",
        ),
        pytest.param(
            lambda: with_service("s1"),
            lambda s: next(w.body for w in s.writes if w.verb == "update")["spec"],
            make_service("s1", "c1")["spec"],
            id="the pin's Update carries the whole cached Service",
        ),
        pytest.param(
            dual_service,
            lambda s: (pin(s, "s1"), associated(s, A4), associated(s, A6), placeholders(s)),
            ((f"{V4},{V6}", "true"), "s1", "s1", {}),
            id="Dual: both addresses pinned, comma-separated, both associated, both placeholders gone",
        ),
        pytest.param(
            lambda: with_service("s1", "s2"),
            lambda s: (pin(s, "s2"), [w for w in written(s) if w[2] == "s2"], associated(s, A4)),
            (UNPINNED, [], "s1"),
            id="a second Service on the same claim: nothing written to it",
        ),
        pytest.param(
            first_service_gone,
            lambda s: (pin(s, "s2"), associated(s, A4), placeholders(s)),
            (PINNED, "s2", {}),
            id="the first Service gone: the second becomes the claim's (no placeholder in between)",
        ),
        pytest.param(
            service_deleted,
            lambda s: (
                associated(s, A4),
                placeholders(s),
                claim_status(s, "c1")["phase"],
                address_phase(s, A4),
            ),
            (None, {REHOLDER: V4}, "Bound", "Bound"),
            id="the Service deleted: associatedTo cleared, iad-<address> re-holds it, still bound",
        ),
        pytest.param(
            service_back,
            lambda s: (pin(s, "s3"), associated(s, A4), placeholders(s)),
            (PINNED, "s3", {}),
            id="a new Service naming the claim later: the same address",
        ),
        pytest.param(
            annotation_dropped,
            lambda s: (associated(s, A4), pin(s, "s1"), placeholders(s)),
            (None, UNPINNED, {REHOLDER: V4}),
            id="the annotation dropped (not observed): associatedTo cleared, the pin removed, re-held",
        ),
        pytest.param(
            pending_claim_service,
            lambda s: (claim_status(s, "c1")["phase"], pin(s, "s1")),
            ("Pending", UNPINNED),
            id="a Service naming a Pending claim: no pin",
        ),
        # Reclaim.
        pytest.param(
            lambda: claim_deleted("Retain"),
            lambda s: (s.get(CLAIMS, "c1", NS), address_phase(s, A4), placeholders(s)),
            (None, "Released", {HOLDER: V4}),
            id="Retain, no Service: Released, still held by its provisioning placeholder (not renamed)",
        ),
        pytest.param(
            lambda: claim_deleted("Retain", "s1"),
            lambda s: (
                s.get(CLAIMS, "c1", NS),
                address_phase(s, A4),
                s.get(ADDRESSES, A4)["spec"]["claimRef"]["name"],
                associated(s, A4),
                pin(s, "s1"),
                placeholders(s),
            ),
            (None, "Released", "c1", "s1", PINNED, {}),
            id="Retain with a Service: the claim goes; Released, claimRef, associatedTo and pin kept",
        ),
        pytest.param(
            released_service_deleted,
            lambda s: (address_phase(s, A4), associated(s, A4), placeholders(s)),
            ("Released", None, {REHOLDER: V4}),
            id="Retain, then the Service deleted: associatedTo cleared, iad-<address> re-holds it",
        ),
        pytest.param(
            lambda: claim_deleted("Delete", "s1"),
            lambda s: (s.get(CLAIMS, "c1", NS), s.get(ADDRESSES, A4), pin(s, "s1"), placeholders(s)),
            (None, None, UNPINNED, {}),
            id="Delete: the claim and its address go, the Service loses its pin",
        ),
        pytest.param(
            lambda: claim_deleted("Delete"),
            lambda s: (s.get(ADDRESSES, A4), placeholders(s)),
            (None, {}),
            id="Delete, no Service: the address and its placeholder go",
        ),
        pytest.param(
            claim_ref_cleared,
            lambda s: (address_phase(s, A4), placeholders(s)),
            ("Available", {HOLDER: V4}),
            id="a hoster clears claimRef of a Released address: Available (still held)",
        ),
        pytest.param(
            available_rebound,
            lambda s: (
                ips(s, "c2"),
                s.get(ADDRESSES, A4)["spec"]["claimRef"] == claim_ref(s, "c2"),
                address_phase(s, A4),
                claim_phases_written(s, "c2"),
                [w for w in written(s) if w[0] == "create"],
            ),
            ([V4], True, "Bound", ["Bound"], []),
            id="a new claim binds the Available address: straight to Bound, nothing provisioned",
        ),
        # Pools.
        pytest.param(
            pools,
            lambda s: (rendered(s, POOLS), rendered(s, L2_ADVERTISEMENTS)),
            (
                {
                    "iad-public": {
                        "addresses": ["198.51.100.0/28"],
                        "autoAssign": False,
                        "avoidBuggyIPs": False,
                    }
                },
                {"iad-public": {"ipAddressPools": ["iad-public"]}},
            ),
            id="one pool iad-<class> (autoAssign and avoidBuggyIPs false) and one L2Advertisement per class",
        ),
    ],
)
def test_model(scenario: Callable[[], Store], probe: Probe, expected: object) -> None:
    assert probe(scenario()) == expected


def test_claim_protection_holds_the_claim_until_its_addresses_are_reclaimed() -> None:
    store = bound_claim()
    store.delete(CLAIMS, "c1", NS)
    claim = store.get(CLAIMS, "c1", NS)
    assert claim is not None
    assert claim["metadata"]["finalizers"] == [CLAIM_PROTECTION_FINALIZER]
    writes = store.model.plan(NOW)
    # The address is released before the finalizer goes (the finalizer waits for the next pass).
    assert [(w.verb, w.resource.plural) for w in writes] == [("status", "ipaddresses")]
    store.settle()
    assert store.get(CLAIMS, "c1", NS) is None


def test_a_class_being_gone_does_not_rebind() -> None:
    store = bound_claim()
    store.delete(CLASSES, "public")
    store.settle()
    assert (claim_status(store, "c1")["phase"], reason(store, "c1", "ClassResolved")) == (
        "Bound",
        "ClassNotFound",
    )


def test_a_second_pass_writes_nothing() -> None:
    store = with_service("s1")
    assert store.model.plan(NOW) == []


def test_a_restarted_model_writes_nothing() -> None:
    store = with_service("s1", "s2")
    fresh = SubstrateModel()
    for resource, obj in store.objects.values():
        fresh.on_event(resource, "ADDED", copy.deepcopy(obj))
    assert fresh.plan(NOW) == []


def test_a_recreated_claim_of_the_same_name_gets_a_new_address() -> None:
    store = claim_deleted("Retain")
    store.put(CLAIMS, make_claim("c1"))
    store.settle()
    assert ips(store, "c1") == ["198.51.100.1"]


def test_claims_pending_at_once_are_provisioned_in_one_plan_without_a_conflict() -> None:
    store = world(make_class("public", default=True))
    for name in ("c1", "c2", "c3"):
        store.put(CLAIMS, make_claim(name))
    store.settle()
    creates = [(w.resource.plural, w.name) for w in store.writes if w.verb == "create"]
    assert len(creates) == len(set(creates)) == 6  # a placeholder and an address each, none twice (no 409)
    assert sorted(ip for name in ("c1", "c2", "c3") for ip in ips(store, name)) == [
        "198.51.100.0",
        "198.51.100.1",
        "198.51.100.2",
    ]


def test_an_event_older_than_the_cache_is_ignored() -> None:
    model = SubstrateModel()
    newer = {"metadata": {"name": "public", "uid": "u", "resourceVersion": "7"}, "spec": {"provisioner": "b"}}
    older = {"metadata": {"name": "public", "uid": "u", "resourceVersion": "6"}, "spec": {"provisioner": "a"}}
    model.on_event(CLASSES, "MODIFIED", newer)
    model.on_event(CLASSES, "MODIFIED", older)
    assert model.classes["public"]["spec"]["provisioner"] == "b"


@pytest.mark.parametrize(
    ("ip", "name"),
    [
        pytest.param("192.0.2.0", "ip-192-0-2-0", id="IPv4 as observed"),
        pytest.param("198.51.100.7", "ip-198-51-100-7", id="IPv4"),
        pytest.param("2001:db8::1", "ip-2001-db8--1", id="IPv6 compressed (a guess)"),
        pytest.param(
            "2001:DB8:0:0:1::", "ip-2001-0db8-0000-0000-0001-0000-0000-0000", id="IPv6 ending in ::"
        ),
        pytest.param("::1", "ip---1", id="IPv6 starting with ::"),
    ],
)
def test_address_name(ip: str, name: str) -> None:
    assert address_name(ip) == name
