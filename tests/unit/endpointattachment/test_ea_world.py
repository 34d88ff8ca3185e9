"""world: the read view over the EndpointAttachment operator's caches and their named indexes. Tables per
invariant, over stores built with the indexes ``build`` declares; who a change wakes is
``test_ea_controller``'s."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from operators.endpointattachment.constants import ENDPOINT_ATTACHMENT_KIND, IP_ADDRESS_CLAIM_KIND
from operators.endpointattachment.datapath import AttachmentRank, ProxiedService, rank_of, uncached_rank
from operators.endpointattachment.render import service_name
from operators.endpointattachment.world import (
    BY_CLAIM,
    BY_ENDPOINT,
    INDEXERS,
    RESOURCES,
    World,
    slim,
)
from shared.ownership import owner_reference
from shared.runtime.cache import Obj
from tests.ea_builders import (
    CREATED,
    NAMESPACE,
    lineage_labels,
    make_allocation,
    make_attachment,
    make_claim,
    make_class,
    make_endpointslice,
    make_helmrelease,
    make_service,
    make_serviceproxy,
)
from tests.ea_caches import KINDS, Step, drop, put, world_of

Probe = Callable[[World], object]
NS, OTHER_NS = NAMESPACE, "tenant-b"
PROXIED = {"service.kubernetes.io/service-proxy-name": "cozy-proxy"}
VM_APP = lineage_labels(kind="VirtualMachine", name="vm1")
A = make_attachment(uid="ea-a")
V = make_attachment("db-vm", uid="ea-v", endpoint="vm-svc", class_name="private-v4", mode="WholeIP")
KA = (NS, "db-public")
VIP = make_claim("vip", class_name="private-v4")
NS_OBJ = {"metadata": {"name": NS, "labels": {"team": "a"}}}
NOBODY = {**A, "metadata": {"name": "nobody", "uid": "x"}}  # an attachment not cached
POD = {"metadata": {"name": "vm", "namespace": NS, "uid": "pod-uid-2", "labels": {"app": "db"}}}
DEPLOYMENT = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "uid": "d-uid"}}


def held(holder: Obj) -> Probe:
    return lambda world: world.held_address(holder)


def controlled_by(owner: Obj) -> list[dict[str, Any]]:
    return [owner_reference(owner, controller=True, block_owner_deletion=True)]


def svc(name: str, labels: Mapping[str, str] | None = None, owner: Obj | None = None) -> Obj:
    """A Service without lineage labels, controlled by ``owner`` if given."""
    return make_service(name, labels=labels or {}, owner_references=controlled_by(owner) if owner else ())


def held_by(attachment: Obj) -> tuple[str, str, str, str]:
    metadata = attachment["metadata"]
    return ENDPOINT_ATTACHMENT_KIND, metadata["namespace"], metadata["name"], metadata["uid"]


def test_every_cached_kind_has_a_short_name_and_every_index_a_cached_kind() -> None:
    assert set(KINDS.values()) == set(RESOURCES)
    assert set(INDEXERS) <= set(RESOURCES)


def test_slim_drops_managed_fields_only() -> None:
    obj: dict[str, Any] = {
        "metadata": {"name": "x", "managedFields": [{"manager": "kubectl"}]},
        "spec": {"a": 1},
    }
    assert slim(obj) == {"metadata": {"name": "x"}, "spec": {"a": 1}}
    assert "managedFields" in obj["metadata"]  # the informer's object is not changed in place
    plain = {"metadata": {"name": "x"}}
    assert slim(plain) is plain


# --- indexes follow updates ------------------------------------------------------------------------

MOVED = make_attachment(uid="ea-a", endpoint="postgres-db-ro", claim_name="vip")
MOVE = [put("claim", VIP), put("attachment", A), put("attachment", MOVED)]
GONE = [*MOVE, put("attachment", V), drop("attachment", MOVED), drop("attachment", V)]
S1, S1_MOVED = make_endpointslice(name="s1"), make_endpointslice("other", name="s1")
CHART_PROXY = make_service("chart-proxy", labels=PROXIED)
ALLOC_A = make_allocation(holder=held_by(A))
ALLOC_11 = make_allocation("203.0.113.11", holder=None)
ALLOC_12 = make_allocation("203.0.113.12", holder=held_by(A))
BOGUS = {**ALLOC_11, "spec": {"address": "not-an-address", "className": "public-v4"}}
CLAIM_ALLOC = make_allocation(holder=(IP_ADDRESS_CLAIM_KIND, NS, "my-ip", "claim-uid-my-ip"))
MINE, ELEVEN = put("allocation", ALLOC_A), put("allocation", ALLOC_11)
NO_UID = {**A, "metadata": {"name": "db-public", "namespace": NS}}
HOLDERS = {"ea-a": ("EndpointAttachment", NS, "db-public"), "claim-uid-vip": ("IPAddressClaim", NS, "vip")}


def users_of_endpoint(name: str) -> Probe:
    return lambda world: world.attachments.index_keys(BY_ENDPOINT, (NS, name))


def users_of_claim(name: str) -> Probe:
    return lambda world: world.attachments.index_keys(BY_CLAIM, (NS, name))


@pytest.mark.parametrize(
    ("steps", "probe", "expected"),
    [
        (MOVE, users_of_endpoint("postgres-db-ro"), {KA}),
        (MOVE, users_of_endpoint("postgres-db-rw"), set()),
        (MOVE, users_of_claim("vip"), {KA}),
        (MOVE, lambda world: world.of_class("private-v4"), {KA}),  # through its claim's class
        (MOVE, lambda world: world.of_class("public-v4"), set()),
        ([*MOVE, put("attachment", A)], users_of_claim("vip"), set()),
        (GONE, users_of_endpoint("postgres-db-ro"), set()),
        (GONE, users_of_claim("vip"), set()),
        (GONE, lambda world: world.of_class("private-v4"), set()),
        (GONE, World.in_vm_mode, set()),
        (GONE, lambda world: world.observe(KA), None),
        (GONE, World.live_holders, {"claim-uid-vip": HOLDERS["claim-uid-vip"]}),
        ([put("attachment", A), put("claim", VIP)], World.live_holders, HOLDERS),
        ([put("attachment", NO_UID)], World.live_holders, {}),
        ([put("attachment", A), put("attachment", V)], World.in_vm_mode, {(NS, "db-vm")}),
        ([put("attachment", A)], lambda world: world.attachment_with_uid(NS, "ea-a"), A),
        ([put("attachment", A)], lambda world: world.attachment_with_uid(OTHER_NS, "ea-a"), None),
        ([put("slice", S1), put("slice", S1_MOVED)], lambda world: world.slices_of(NS, "postgres-db-rw"), []),
        ([put("slice", S1), put("slice", S1_MOVED)], lambda world: world.slices_of(NS, "other"), [S1_MOVED]),
        ([put("slice", S1), drop("slice", S1)], lambda world: world.slices_of(NS, "postgres-db-rw"), []),
        ([put("service", CHART_PROXY), put("service", svc("chart-proxy"))], World.proxied_services, []),
        ([put("service", CHART_PROXY), drop("service", CHART_PROXY)], World.proxied_services, []),
        ([put("namespace", NS_OBJ)], lambda world: world.namespace_labels(NS), {"team": "a"}),
        ([put("namespace", NS_OBJ), drop("namespace", NS_OBJ)], lambda world: world.namespace_labels(NS), {}),
        ([put("class", make_class())], lambda world: world.address_class("public-v4"), make_class()),
        ([put("class", make_class())], lambda world: world.address_class(None), None),
        ([MINE, ELEVEN], World.taken_addresses, {"203.0.113.10", "203.0.113.11"}),
        ([MINE, ELEVEN, drop("allocation", ALLOC_A)], World.taken_addresses, {"203.0.113.11"}),
        ([put("allocation", make_allocation("2001:DB8:0::1"))], World.taken_addresses, {"2001:db8::1"}),
        ([ELEVEN, put("allocation", BOGUS)], World.taken_addresses, set()),  # unreadable: holds nothing
        ([MINE, ELEVEN], lambda world: world.allocations_of_class("public-v4"), [ALLOC_A, ALLOC_11]),
        ([MINE], held(A), "203.0.113.10"),
        ([MINE, put("allocation", make_allocation(holder=held_by(V)))], held(A), None),
        ([MINE, put("allocation", make_allocation(holder=held_by(V)))], held(V), "203.0.113.10"),
        ([MINE, drop("allocation", ALLOC_A)], held(A), None),
        ([MINE], lambda world: world.held_allocation(A), ALLOC_A),
        ([ELEVEN], held(A), None),  # held by no one
        ([put("allocation", CLAIM_ALLOC)], held(make_claim()), "203.0.113.10"),
        ([MINE], held(NO_UID), None),
        ([MINE, put("allocation", ALLOC_12)], lambda world: world.surplus_allocations(A), [ALLOC_12]),
        pytest.param(
            [MINE, put("allocation", ALLOC_12), drop("allocation", ALLOC_12)],
            held(A),
            "203.0.113.10",
            id="second-allocation-of-one-holder-dropped",
        ),
    ],
)
def test_indexes_follow_upserts_and_deletes(steps: list[Step], probe: Probe, expected: object) -> None:
    found = probe(world_of(*steps))
    if isinstance(expected, list) and isinstance(found, list):
        assert sorted(map(repr, found)) == sorted(map(repr, expected))
    else:
        assert found == expected


def test_taken_addresses_answer_from_the_live_index() -> None:
    """A view, not a copy: membership follows the allocations as they change, one lookup each."""
    world = world_of(put("allocation", ALLOC_A))
    taken = world.taken_addresses()
    assert "203.0.113.10" in taken
    assert "203.0.113.11" not in taken
    world.allocations.upsert(ALLOC_11)
    assert "203.0.113.11" in taken
    assert len(taken) == 2
    world.allocations.delete(("", "203.0.113.10"))
    assert set(taken) == {"203.0.113.11"}


# --- what a pass sees ------------------------------------------------------------------------------

PRIVATE = make_class("private-v4", cidrs=["10.0.0.0/24"])
CHART_SLICE = make_endpointslice("chart-proxy", backends=[("pod-9", "10.244.0.9", True)])
SELECTOR = {"app": "db", "role": "primary"}  # every builder Service's
CHART_RANK = ProxiedService(
    NS, "chart-proxy", "cozy-proxy", frozenset({"pod-9"}), None, SELECTOR, "svc-uid-chart-proxy", "1"
)
PORT_LIST = make_attachment(mode="PortList")
# A VM-mode attachment is a rival under the name it renders, rendered or not, with what its endpoint
# selects (the default endpoint's slice: pod-uid-1).
PORT_LIST_RIVAL = ProxiedService(
    NS, "ea-db-public", "cozy-proxy", frozenset({"pod-uid-1"}), rank_of(PORT_LIST), SELECTOR
)
GOES_NOWHERE, USES_VIP = make_attachment(endpoint="gone"), make_attachment(claim_name="vip")


@pytest.mark.parametrize(
    ("attachment", "extra", "field", "expected"),
    [
        (A, [], "endpoint", make_service()),
        (A, [], "helmrelease", make_helmrelease()),
        (A, [put("helmrelease", make_helmrelease("twin", uid="hr-2"))], "helmrelease", None),  # ambiguous
        (A, [put("helmrelease", make_helmrelease(namespace=OTHER_NS))], "helmrelease", make_helmrelease()),
        (GOES_NOWHERE, [], "helmrelease", None),
        (GOES_NOWHERE, [], "endpoint_slices", []),
        (A, [], "address_class", make_class()),
        (USES_VIP, [put("claim", VIP)], "address_class", PRIVATE),
        (USES_VIP, [put("claim", VIP)], "claim", VIP),
        (USES_VIP, [], "address_class", None),
        (A, [put("claim", make_claim())], "claim", None),
        (A, [], "service", svc(service_name("db-public"))),
        (A, [], "endpoint_slices", [make_endpointslice()]),
        (A, [], "service_proxies", [make_serviceproxy()]),
        (A, [], "namespace_labels", {"team": "a"}),
        (A, [], "proxied_services", ()),
        (PORT_LIST, [], "proxied_services", [CHART_RANK, PORT_LIST_RIVAL]),
        (PORT_LIST, [put("pod", POD)], "pods", [POD]),
        (A, [put("pod", POD)], "pods", ()),
        (A, [ELEVEN], "taken_addresses", {"203.0.113.11"}),
        (A, [ELEVEN, MINE], "held_address", "203.0.113.10"),
        (A, [ELEVEN, MINE], "taken_addresses", frozenset()),
    ],
)
def test_observe_assembles_the_right_objects(
    attachment: Obj, extra: list[Step], field: str, expected: object
) -> None:
    world = world_of(
        put("attachment", attachment),
        *[put("service", s) for s in (make_service(), svc(service_name("db-public")), CHART_PROXY)],
        *[put("slice", s) for s in (make_endpointslice(), make_endpointslice("unrelated"), CHART_SLICE)],
        put("helmrelease", make_helmrelease()),
        put("helmrelease", make_helmrelease("vm1", uid="hr-vm", labels=VM_APP)),
        put("class", make_class()),
        put("class", PRIVATE),
        put("proxy", make_serviceproxy()),
        put("namespace", NS_OBJ),
        *extra,
    )
    observed = world.observe(KA)
    assert observed is not None
    assert observed.attachment is attachment
    assert getattr(observed, field) == expected
    assert world.observe((NS, "absent")) is None


@pytest.mark.parametrize(
    ("owner", "expected"),
    [
        (A, AttachmentRank(CREATED, "db-public", NS, "ea-a")),
        # Not cached (another incarnation, or none): from the owner reference, never the oldest.
        ({**A, "metadata": {"name": "db-public", "uid": "old"}}, uncached_rank("db-public", NS, "old")),
        (NOBODY, uncached_rank("nobody", NS, "x")),
        (DEPLOYMENT, None),
        (None, None),
    ],
)
def test_proxied_services_rank_the_controlling_attachment(
    owner: Obj | None, expected: AttachmentRank | None
) -> None:
    name = service_name("db-public")
    service, endpoints = svc(name, PROXIED, owner), make_endpointslice(name)
    world = world_of(put("attachment", A), put("service", service), put("slice", endpoints))
    assert world.proxied_services() == [
        ProxiedService(
            NS, name, "cozy-proxy", frozenset({"pod-uid-1"}), expected, SELECTOR, f"svc-uid-{name}", "1"
        )
    ]
