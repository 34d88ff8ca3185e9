"""world: the watch caches and indexes of the EndpointAttachment operator. Tables per invariant; a wake is
asked after the ``put`` of the changed object, in the order ``handlers.Operator.observe`` uses."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from operators.endpointattachment.constants import (
    ATTACHMENT_LABEL,
    ENDPOINT_ATTACHMENT_KIND,
    IP_ADDRESS_CLAIM_KIND,
    SERVICE_PROXY_NAME_LABEL,
)
from operators.endpointattachment.datapath import AttachmentRank, ProxiedService
from operators.endpointattachment.handlers import Operator
from operators.endpointattachment.render import service_name
from operators.endpointattachment.settings import Settings
from operators.endpointattachment.world import Key, Obj, World
from shared.operator import Telemetry
from shared.ownership import owner_reference
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

Step = tuple[str, str, Obj]  # ("put" | "drop", kind, object)
Probe = Callable[[World], object]
NS, OTHER_NS = NAMESPACE, "tenant-b"
PROXIED = {SERVICE_PROXY_NAME_LABEL: "cozy-proxy"}
VM_APP = lineage_labels(kind="VirtualMachine", name="vm1")
# A mints from public-v4; B uses claim my-ip (public-v4) and its endpoint is not cached; V is WholeIP from
# private-v4; T is A's twin in another namespace.
A = make_attachment(uid="ea-a")
B = make_attachment("db-claimed", uid="ea-b", endpoint="postgres-db-ro", claim_name="my-ip", mode="Standard")
V = make_attachment("db-vm", uid="ea-v", endpoint="vm-svc", class_name="private-v4", mode="WholeIP")
T = make_attachment(namespace=OTHER_NS, uid="ea-t")
KA, KB, KV, KT = (NS, "db-public"), (NS, "db-claimed"), (NS, "db-vm"), (OTHER_NS, "db-public")
VIP = make_claim("vip", class_name="private-v4")
NS_OBJ = {"metadata": {"name": NS, "labels": {"team": "a"}}}
NOBODY = {**A, "metadata": {"name": "nobody", "uid": "x"}}  # an attachment not cached
DEPLOYMENT = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "uid": "d-uid"}}


def put(kind: str, obj: Obj) -> Step:
    return "put", kind, obj


def drop(kind: str, obj: Obj) -> Step:
    return "drop", kind, obj


def world_of(*steps: Step) -> World:
    world = World()
    for action, kind, obj in steps:
        getattr(world, action)(kind, obj)
    return world


def wakes(kind: str, obj: Obj) -> Probe:
    return lambda world: set(world.attachments_affected_by(kind, obj))


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


# --- put / drop / get ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "obj", "store", "key", "namespaced"),
    [
        ("attachment", make_attachment(), "attachments", (NS, "db-public"), True),
        ("claim", make_claim(), "claims", (NS, "my-ip"), True),
        ("service", make_service(), "services", (NS, "postgres-db-rw"), True),
        ("slice", make_endpointslice(), "slices", (NS, "postgres-db-rw-abcde"), True),
        ("helmrelease", make_helmrelease(), "helmreleases", (NS, "postgres-db"), True),
        ("class", make_class(), "classes", "public-v4", False),
        ("allocation", make_allocation(), "allocations", "203.0.113.10", False),
        ("proxy", make_serviceproxy(), "proxies", "cozy-proxy", False),
    ],
)
def test_put_get_drop_round_trip(kind: str, obj: Obj, store: str, key: object, namespaced: bool) -> None:
    world = world_of(put(kind, obj))
    assert getattr(world, store) == {key: obj}
    assert world.get(kind, obj) is obj
    elsewhere = copy.deepcopy(dict(obj))
    elsewhere["metadata"]["namespace"] = OTHER_NS
    # namespaced kinds are found by (namespace, name); cluster kinds by name, whatever the namespace
    assert (world.get(kind, elsewhere) is obj) is not namespaced
    world.drop(kind, obj)
    world.drop(kind, obj)  # a repeated DELETED is harmless
    assert getattr(world, store) == {}
    assert world.get(kind, obj) is None


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
CLUSTER = [
    *[put("attachment", attachment) for attachment in (A, B, V, T)],
    put("claim", make_claim()),
    put("service", make_service()),
    put("service", make_service(namespace=OTHER_NS)),
    put("service", make_service("vm-svc", labels=VM_APP)),
]
FREED = make_allocation("203.0.113.12", holder=None)
NO_UID = {**A, "metadata": {"name": "db-public", "namespace": NS}}
HOLDERS = {"ea-a": ("EndpointAttachment", NS, "db-public"), "claim-uid-vip": ("IPAddressClaim", NS, "vip")}


@pytest.mark.parametrize(
    ("steps", "probe", "expected"),
    [
        (MOVE, wakes("service", make_service("postgres-db-ro")), {KA}),
        (MOVE, wakes("service", make_service()), set()),
        (MOVE, wakes("claim", VIP), {KA}),
        (MOVE, wakes("class", make_class("private-v4")), {KA}),  # through its claim's class
        (MOVE, wakes("class", make_class()), set()),
        ([*MOVE, put("attachment", A)], wakes("claim", VIP), set()),
        (GONE, wakes("service", make_service("postgres-db-ro")), set()),
        (GONE, wakes("claim", VIP), set()),
        (GONE, wakes("class", make_class("private-v4")), set()),
        (GONE, wakes("allocation", make_allocation(class_name="private-v4", holder=None)), set()),
        (GONE, wakes("proxy", make_serviceproxy()), set()),
        (GONE, wakes("helmrelease", make_helmrelease()), set()),
        (GONE, wakes("namespace", NS_OBJ), set()),
        (GONE, lambda world: world.observe(KA), None),
        (GONE, World.live_holders, {"claim-uid-vip": HOLDERS["claim-uid-vip"]}),
        ([put("attachment", A), put("claim", VIP)], World.live_holders, HOLDERS),
        ([put("attachment", NO_UID)], World.live_holders, {}),
        (
            [*CLUSTER, put("allocation", make_allocation(holder=held_by(T))), put("allocation", FREED)],
            wakes("allocation", FREED),
            {KA, KB},
        ),  # a freed address wakes only the address-less
        ([put("slice", S1), put("slice", S1_MOVED)], lambda world: world.slices_of(NS, "postgres-db-rw"), []),
        ([put("slice", S1), put("slice", S1_MOVED)], lambda world: world.slices_of(NS, "other"), [S1_MOVED]),
        ([put("slice", S1), drop("slice", S1)], lambda world: world.slices_of(NS, "postgres-db-rw"), []),
        ([put("service", CHART_PROXY), put("service", svc("chart-proxy"))], World.proxied_services, []),
        ([put("service", CHART_PROXY), drop("service", CHART_PROXY)], World.proxied_services, []),
        ([put("namespace", NS_OBJ)], lambda world: world.namespace_labels, {NS: {"team": "a"}}),
        ([put("namespace", NS_OBJ), drop("namespace", NS_OBJ)], lambda world: world.namespace_labels, {}),
        ([MINE, ELEVEN], World.taken_addresses, {"203.0.113.10", "203.0.113.11"}),
        ([MINE, ELEVEN, drop("allocation", ALLOC_A)], World.taken_addresses, {"203.0.113.11"}),
        ([put("allocation", make_allocation("2001:DB8:0::1"))], World.taken_addresses, {"2001:db8::1"}),
        ([ELEVEN, put("allocation", BOGUS)], World.taken_addresses, set()),  # unreadable: holds nothing
        ([MINE], held(A), "203.0.113.10"),
        ([MINE, put("allocation", make_allocation(holder=held_by(V)))], held(A), None),
        ([MINE, put("allocation", make_allocation(holder=held_by(V)))], held(V), "203.0.113.10"),
        ([MINE, drop("allocation", ALLOC_A)], held(A), None),
        ([MINE], lambda world: world.held_allocation(A), ALLOC_A),
        ([ELEVEN], held(A), None),  # held by no one
        ([put("allocation", CLAIM_ALLOC)], held(make_claim()), "203.0.113.10"),
        ([MINE], held(NO_UID), None),
        pytest.param(
            [MINE, put("allocation", ALLOC_12), drop("allocation", ALLOC_12)],
            held(A),
            "203.0.113.10",
            id="second-allocation-of-one-holder-dropped",
        ),
    ],
)
def test_indexes_follow_puts_and_drops(steps: list[Step], probe: Probe, expected: object) -> None:
    assert probe(world_of(*steps)) == expected


def test_taken_addresses_are_cached_until_allocations_change() -> None:
    world = world_of(put("allocation", ALLOC_A))
    first = world.taken_addresses()
    world.drop("allocation", ALLOC_11)  # not cached: no change
    world.put("service", make_service())
    assert world.taken_addresses() is first
    world.put("allocation", ALLOC_11)
    assert world.taken_addresses() is not first
    assert world.taken_addresses() == {"203.0.113.10", "203.0.113.11"}


# --- who a change wakes ----------------------------------------------------------------------------

SQUAT = service_name("db-vm")


@pytest.mark.parametrize(
    ("kind", "obj", "expected"),
    [
        ("attachment", V, {KV}),
        ("service", make_service(), {KA}),  # its users in its namespace only
        ("service", make_service(namespace=OTHER_NS), {KT}),
        ("service", svc(service_name("db-public"), owner=A), {KA}),
        ("service", svc("x", owner=NOBODY), {(NS, "nobody")}),
        ("service", svc(SQUAT, owner=DEPLOYMENT), set()),
        ("service", svc(SQUAT, labels={ATTACHMENT_LABEL: "db-vm"}), {KV}),
        ("service", svc(SQUAT), set()),  # without our label a squatter is not looked for
        ("service", svc("chart-proxy", labels=PROXIED), {KV}),
        ("slice", make_endpointslice(), {KA, KV}),  # VM modes read every slice's backends
        ("slice", make_endpointslice("unrelated"), {KV}),
        ("claim", make_claim(), {KB}),
        ("claim", make_claim(namespace=OTHER_NS), set()),
        ("class", make_class(), {KA, KB, KT}),
        ("class", make_class("private-v4"), {KV}),
        ("allocation", ALLOC_A, {KA, KB, KT}),
        ("allocation", make_allocation(class_name="private-v4", holder=None), {KV}),
        ("allocation", make_allocation(class_name="private-v4", holder=held_by(V)), {KV}),
        ("allocation", CLAIM_ALLOC, {KA, KB, KT}),  # the class's address-less, not the claim's user
        ("proxy", make_serviceproxy(), {KV}),
        ("namespace", NS_OBJ, {KA, KB, KV}),
        ("namespace", {"metadata": {"name": OTHER_NS}}, {KT}),
        ("helmrelease", make_helmrelease(), {KA, KB}),  # B: its endpoint is not cached
        ("helmrelease", make_helmrelease("vm1", labels=VM_APP), {KB, KV}),
        ("helmrelease", make_helmrelease(labels={}), {KA, KB, KV}),  # no lineage: all of its namespace
        ("helmrelease", make_helmrelease(namespace=OTHER_NS), {KT}),
    ],
)
def test_attachments_affected_by(kind: str, obj: Obj, expected: set[Key]) -> None:
    assert wakes(kind, obj)(world_of(*CLUSTER, put(kind, obj))) == expected


def test_a_service_leaving_the_proxy_wakes_vm_mode_attachments() -> None:
    """The operator wakes whoever the old version concerned too: a Service that leaves the proxy
    (e.g. an attachment going from WholeIP to Standard) frees the pods it held for others."""
    operator = Operator(
        settings=Settings(), telemetry=Telemetry.create("test", CollectorRegistry()), world=world_of(*CLUSTER)
    )
    operator.world.put("service", svc(service_name("db-public"), PROXIED, A))
    left = {**svc(service_name("db-public"), owner=A)}
    left["metadata"] = {**left["metadata"], "resourceVersion": "2"}
    operator.observe("service", {"type": "MODIFIED", "object": left})  # type: ignore[typeddict-item]
    assert KV not in set(operator.world.attachments_affected_by("service", left))
    assert ("attachment", *KV) in operator.queue._queued


@pytest.mark.parametrize(
    ("kind", "obj", "expected"),
    [
        ("claim", make_claim("x"), {(NS, "x")}),
        ("allocation", CLAIM_ALLOC, {(NS, "my-ip")}),
        ("allocation", ALLOC_A, set()),
        ("allocation", ALLOC_11, set()),
        ("class", make_class(), {(NS, "my-ip"), (OTHER_NS, "my-ip")}),
        ("class", make_class("private-v4"), {(NS, "vip")}),
        ("namespace", NS_OBJ, {(NS, "my-ip"), (NS, "vip")}),
        ("service", make_service(), set()),
    ],
)
def test_claims_affected_by(kind: str, obj: Obj, expected: set[Key]) -> None:
    world = world_of(
        put("claim", make_claim()), put("claim", make_claim(namespace=OTHER_NS)), put("claim", VIP)
    )
    assert set(world.claims_affected_by(kind, obj)) == expected


# --- what a pass sees ------------------------------------------------------------------------------

PRIVATE = make_class("private-v4", cidrs=["10.0.0.0/24"])
CHART_SLICE = make_endpointslice("chart-proxy", backends=[("pod-9", "10.244.0.9", True)])
CHART_RANK = ProxiedService(NS, "chart-proxy", "cozy-proxy", frozenset({"pod-9"}), None)
GOES_NOWHERE, USES_VIP = make_attachment(endpoint="gone"), make_attachment(claim_name="vip")


@pytest.mark.parametrize(
    ("attachment", "extra", "field", "expected"),
    [
        (A, [], "endpoint", make_service()),
        (A, [], "helmrelease", make_helmrelease()),
        (A, [put("helmrelease", make_helmrelease("twin", uid="hr-2"))], "helmrelease", None),  # ambiguous
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
        (make_attachment(mode="PortList"), [], "proxied_services", [CHART_RANK]),
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
        ({**A, "metadata": {"name": "db-public", "uid": "old"}}, AttachmentRank("", "db-public", NS, "old")),
        (NOBODY, AttachmentRank("", "nobody", NS, "x")),  # from the owner reference
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
        ProxiedService(NS, name, "cozy-proxy", frozenset({"pod-uid-1"}), expected)
    ]
