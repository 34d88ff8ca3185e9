"""world: the read view over the EndpointAttachment operator's caches and their named indexes. Tables per
invariant, over stores built with the indexes ``build`` declares; who a change wakes is
``test_ea_controller``'s."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from operators.endpointattachment.api import (
    ADDRESSES,
    CLAIM_ANNOTATION,
    CLAIMS,
    CLASSES,
    SERVICE_PROXY_NAME_LABEL,
)
from operators.endpointattachment.datapath import AttachmentRank, ProxiedService, rank_of, uncached_rank
from operators.endpointattachment.render import RenderSettings
from operators.endpointattachment.world import (
    BY_CLAIM,
    BY_ENDPOINT,
    CACHES,
    INDEXERS,
    RESOURCES,
    SUBSTRATE,
    World,
    slim_pod,
)
from shared.runtime.cache import Obj
from shared.runtime.cache import strip_managed_fields as slim  # the runtime's default transform
from shared.runtime.served import CRDS
from tests.ea_builders import (
    CLAIM,
    NAMESPACE,
    controlled_by,
    make_attachment,
    make_claim,
    make_class,
    make_endpoints,
    make_endpointslice,
    make_helmrelease,
    make_ip_address,
    make_pod,
    make_service,
)
from tests.ea_caches import KINDS, Step, drop, make_crd, put, world_of

Probe = Callable[[World], object]
NS, OTHER_NS = NAMESPACE, "tenant-b"
COZY = RenderSettings(proxy_name="cozy-proxy")
PROXIED = {SERVICE_PROXY_NAME_LABEL: "cozy-proxy"}
SELECTOR = {"app": "db", "role": "primary"}  # every builder Service's
A = make_attachment(uid="ea-a")
B = make_attachment("db-held", uid="ea-b", endpoint="postgres-db-ro", claim_name="held-ip")
V = make_attachment("db-vm", uid="ea-v", method="WholeIP")
KA, KB, KV = (NS, "db-public"), (NS, "db-held"), (NS, "db-vm")
NOBODY = {**A, "metadata": {"name": "nobody", "namespace": NS, "uid": "x"}}  # an attachment not cached
DEPLOYMENT = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "uid": "d-uid"}}
MINTED = make_claim(owner=A)
MINTED_LATER = make_claim("db-public-zzzzz", owner=A, created="2024-01-01T00:00:09Z")
HELD = make_claim("held-ip")


def svc(name: str, owner: Obj | None = None, **changes: Any) -> Obj:
    """A Service without lineage labels, controlled by ``owner`` if given."""
    changes.setdefault("labels", {})
    return make_service(name, owner_references=controlled_by(owner) if owner else (), **changes)


def test_every_cached_kind_has_a_short_name_and_every_index_a_cached_kind() -> None:
    assert set(KINDS.values()) == {*RESOURCES, CRDS}
    assert set(INDEXERS) <= set(RESOURCES)
    assert {c.resource for c in CACHES} == {*RESOURCES, CRDS}


def test_only_the_substrate_s_kinds_are_optional() -> None:
    assert {c.resource for c in CACHES if c.optional} == set(SUBSTRATE) == {CLAIMS, CLASSES, ADDRESSES}


def test_slim_drops_managed_fields_only() -> None:
    obj: dict[str, Any] = {
        "metadata": {"name": "x", "managedFields": [{"manager": "kubectl"}]},
        "spec": {"a": 1},
    }
    assert slim(obj) == {"metadata": {"name": "x"}, "spec": {"a": 1}}
    assert "managedFields" in obj["metadata"]  # the informer's object is not changed in place
    plain = {"metadata": {"name": "x"}}
    assert slim(plain) is plain


def test_slim_pod_keeps_what_exclusivity_reads() -> None:
    pod = make_pod()
    pod["spec"] = {"containers": [{"name": "c"}]}
    pod["metadata"]["annotations"] = {"big": "x" * 1000}
    assert slim_pod(pod) == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            k: pod["metadata"][k] for k in ("name", "namespace", "uid", "resourceVersion", "labels")
        },
        "status": {"phase": "Running"},
    }


# --- indexes follow updates ------------------------------------------------------------------------

MOVED = make_attachment(uid="ea-a", endpoint="postgres-db-ro", claim_name="held-ip")
MOVE = [put("attachment", A), put("attachment", MOVED)]
GONE = [*MOVE, put("attachment", V), drop("attachment", MOVED), drop("attachment", V)]
OURS = svc("db-public-x7ktq", A, annotations={CLAIM_ANNOTATION: CLAIM})
OURS_LATER = svc("db-public-yyyyy", A, created="2024-01-01T00:00:05Z")
ORPHANED = svc("db-public-x7ktq", annotations={CLAIM_ANNOTATION: "held-ip"})  # lost its reference
LABELLED = svc("db-public-fake", labels={"cozystack.io/endpoint-attachment": "db-public"})
OLD_INCARNATION = svc("db-public-old", {**A, "metadata": {**A["metadata"], "uid": "ea-old"}})
LEGACY = svc("legacy-lb", annotations={CLAIM_ANNOTATION: CLAIM})
S1, S1_MOVED = make_endpointslice(name="s1"), make_endpointslice("other", name="s1")


def users_of_endpoint(name: str) -> Probe:
    return lambda world: world.attachments.index_keys(BY_ENDPOINT, (NS, name))


def users_of_claim(name: str) -> Probe:
    return lambda world: world.attachments.index_keys(BY_CLAIM, (NS, name))


def names(objects: list[Obj]) -> list[str]:
    return [o["metadata"]["name"] for o in objects]


@pytest.mark.parametrize(
    ("steps", "probe", "expected"),
    [
        (MOVE, users_of_endpoint("postgres-db-ro"), {KA}),
        (MOVE, users_of_endpoint("postgres-db-rw"), set()),
        (MOVE, users_of_claim("held-ip"), {KA}),
        ([*MOVE, put("attachment", A)], users_of_claim("held-ip"), set()),
        (GONE, users_of_endpoint("postgres-db-ro"), set()),
        (GONE, users_of_claim("held-ip"), set()),
        (GONE, World.in_vm_mode, set()),
        (GONE, lambda world: world.observe(KA), None),
        ([put("attachment", A), put("attachment", V)], World.in_vm_mode, {KV}),
        # services_of / claims_of: by controller UID only, oldest first
        (
            [put("service", OURS_LATER), put("service", OURS)],
            lambda w: names(w.services_of(A)),
            [OURS["metadata"]["name"], "db-public-yyyyy"],
        ),
        ([put("service", OURS), put("service", ORPHANED)], lambda w: w.services_of(A), []),
        ([put("service", LABELLED)], lambda w: w.services_of(A), []),
        ([put("service", OLD_INCARNATION)], lambda w: w.services_of(A), []),
        ([put("service", OURS)], lambda w: w.services_of(NOBODY), []),
        (
            [put("claim", MINTED_LATER), put("claim", MINTED)],
            lambda w: names(w.claims_of(A)),
            [CLAIM, "db-public-zzzzz"],
        ),
        ([put("claim", HELD)], lambda w: w.claims_of(A), []),
        # claim_for: referenced by name (owned ones are surplus), else the oldest minted
        (
            [put("claim", MINTED_LATER), put("claim", MINTED)],
            lambda w: names([w.claim_for(A)[0] or {}]),
            [CLAIM],
        ),
        (
            [put("claim", MINTED_LATER), put("claim", MINTED)],
            lambda w: names(w.claim_for(A)[1]),
            ["db-public-zzzzz"],
        ),
        ([], lambda w: w.claim_for(A), (None, [])),
        ([put("claim", HELD)], lambda w: w.claim_for(B), (HELD, [])),
        ([put("claim", make_claim("held-ip", namespace=OTHER_NS))], lambda w: w.claim_for(B), (None, [])),
        # the claim's addresses, users and class
        (
            [
                put("address", make_ip_address()),
                put("address", make_ip_address("203.0.113.8", claim=(NS, "x"))),
            ],
            lambda w: names(w.addresses_of(MINTED)),
            ["203.0.113.7"],
        ),
        ([put("address", make_ip_address())], lambda w: w.addresses_of(None), []),
        (
            [put("service", OURS), put("service", LEGACY)],
            lambda w: names(w.claim_users(MINTED, A)),
            ["legacy-lb"],
        ),
        ([put("service", LEGACY), drop("service", LEGACY)], lambda w: w.claim_users(MINTED, A), []),
        ([put("class", make_class())], lambda w: w.class_of(MINTED), make_class()),
        (
            [put("class", make_class("spec-only"))],
            lambda w: w.class_of(make_claim(class_name="spec-only", phase=None)),
            make_class("spec-only"),
        ),
        (
            [put("class", make_class()), put("class", make_class("other"))],
            lambda w: w.class_of(make_claim(class_name="other")),
            make_class(),
        ),
        ([put("class", make_class())], lambda w: w.class_of(None), None),
        # who a claim concerns: its referrers, and the attachment controlling it (cached, same UID)
        (
            [put("attachment", A), put("attachment", B), put("claim", HELD)],
            lambda w: w.attachments_using((NS, "held-ip")),
            {KB},
        ),
        ([put("attachment", A), put("claim", MINTED)], lambda w: w.attachments_using((NS, CLAIM)), {KA}),
        ([put("claim", MINTED)], lambda w: w.attachments_using((NS, CLAIM)), set()),
        (
            [put("attachment", {**A, "metadata": {**A["metadata"], "uid": "ea-new"}}), put("claim", MINTED)],
            lambda w: w.attachments_using((NS, CLAIM)),
            set(),
        ),
        ([put("attachment", A)], lambda w: w.attachment_controlling(OURS), KA),
        ([put("attachment", A)], lambda w: w.attachment_controlling(OLD_INCARNATION), None),
        ([put("attachment", A)], lambda w: w.attachment_controlling(svc("d", DEPLOYMENT)), None),
        # single objects
        ([put("helmrelease", make_helmrelease())], lambda w: w.helmrelease_of(A), make_helmrelease()),
        (
            [
                put("helmrelease", make_helmrelease()),
                put("helmrelease", make_helmrelease("twin", uid="hr-2")),
            ],
            lambda w: w.helmrelease_of(A),
            make_helmrelease(),  # two carry the lineage: the oldest (then by name), as Cozystack picks
        ),
        ([put("helmrelease", make_helmrelease(namespace=OTHER_NS))], lambda w: w.helmrelease_of(A), None),
        ([put("service", make_service())], lambda w: w.endpoint_of(A), make_service()),
        ([put("service", make_service())], lambda w: w.endpoint_of(B), None),
        ([put("slice", S1), put("slice", S1_MOVED)], lambda w: w.slices_of(NS, "postgres-db-rw"), []),
        ([put("slice", S1), put("slice", S1_MOVED)], lambda w: w.slices_of(NS, "other"), [S1_MOVED]),
        (
            [put("pod", make_pod()), put("pod", make_pod(namespace=OTHER_NS, uid="p2"))],
            lambda w: names(w.pods_in(NS)),
            ["db-0"],
        ),
        ([put("service", svc("chart", labels=PROXIED))], lambda w: w.is_proxied((NS, "chart")), True),
        ([put("service", svc("chart"))], lambda w: w.is_proxied((NS, "chart")), False),
    ],
)
def test_indexes_and_queries_follow_upserts_and_deletes(
    steps: list[Step], probe: Probe, expected: object
) -> None:
    assert probe(world_of(*steps)) == expected


# --- the substrate coming and going ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("crds", "unserved", "served", "catching_up"),
    [
        pytest.param(True, (), True, False, id="installed and listed"),
        pytest.param(False, SUBSTRATE, False, False, id="absent"),
        pytest.param(True, (CLAIMS,), False, True, id="established, claims not listed yet"),
        pytest.param(True, SUBSTRATE, False, True, id="established, nothing listed yet"),
    ],
)
def test_substrate_served_and_catching_up(
    crds: bool, unserved: tuple[Any, ...], served: bool, catching_up: bool
) -> None:
    steps = [put("crd", make_crd(r)) for r in SUBSTRATE] if crds else []
    world = world_of(*steps, unserved=unserved)
    assert (world.substrate_served(), world.substrate_catching_up()) == (served, catching_up)


def test_a_crd_not_yet_established_is_not_catching_up() -> None:
    world = world_of(put("crd", make_crd(CLAIMS, established=False)), unserved=SUBSTRATE)
    assert not world.substrate_catching_up()


def test_observed_says_whether_the_substrate_is_served() -> None:
    observed = world_of(put("attachment", A), unserved=SUBSTRATE).observe(KA)
    assert observed is not None
    assert not observed.substrate


# --- the rivals in the VM modes --------------------------------------------------------------------

VM_SELECTOR = {"vm.kubevirt.io/name": "vm1"}
VM_ENDPOINT = make_service("vm-vm1", selector=VM_SELECTOR, ports=[{"port": 22}])
VA = make_attachment("vm-a", uid="ea-va", endpoint="vm-vm1", method="WholeIP", created="2024-01-01T00:00:00Z")
VB = make_attachment(
    "vm-b", uid="ea-vb", endpoint="vm-vm1", method="PortList", ports=[22], created="2024-01-02T00:00:00Z"
)
VM_POD = make_pod("virt-launcher", uid="pod-vm", labels=VM_SELECTOR)
CHART = svc("vm1-chart", labels=PROXIED, selector=VM_SELECTOR)
RENDERED_A = svc("vm-a-x7ktq", VA, labels=PROXIED, selector=VM_SELECTOR)


def rival(
    name: str, rank: AttachmentRank | None, uid: str = "", pods: frozenset[str] = frozenset({"pod-vm"})
) -> ProxiedService:
    return ProxiedService(NS, name, "cozy-proxy", pods, rank, VM_SELECTOR, uid, "1" if uid else "")


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param(
            [put("service", CHART)], [rival("vm1-chart", None, "svc-uid-vm1-chart")], id="a chart's own"
        ),
        pytest.param(
            [put("attachment", VA), put("service", RENDERED_A)],
            [rival("vm-a-x7ktq", rank_of(VA), "svc-uid-vm-a-x7ktq")],
            id="ours, ranked by its attachment, not counted twice",
        ),
        pytest.param(
            [put("service", RENDERED_A)],
            [rival("vm-a-x7ktq", uncached_rank("vm-a", NS, "ea-va"), "svc-uid-vm-a-x7ktq")],
            id="an attachment not cached ranks last",
        ),
        pytest.param(
            [put("attachment", VA)], [rival("", rank_of(VA))], id="a VM-mode attachment not rendered"
        ),
        pytest.param(
            [put("attachment", VA), put("attachment", VB)],
            [rival("", rank_of(VA)), rival("", rank_of(VB))],
            id="two not rendered",
        ),
        pytest.param(
            [
                put(
                    "attachment",
                    make_attachment("vm-c", uid="c", endpoint="vm-vm1", method="PortList", ports=[22]),
                )
            ],
            [],
            id="PortList that needs translation never renders",
        ),
        pytest.param(
            [put("attachment", make_attachment("vm-d", uid="d", endpoint="gone", method="WholeIP"))],
            [],
            id="its endpoint unknown",
        ),
        pytest.param(
            [
                put(
                    "attachment",
                    make_attachment("vm-e", uid="e", endpoint="vm-vm1", method="WholeIP", deleting=True),
                )
            ],
            [],
            id="being deleted",
        ),
        pytest.param(
            [
                put(
                    "attachment",
                    make_attachment("vm-f", OTHER_NS, uid="f", endpoint="vm-vm1", method="WholeIP"),
                )
            ],
            [],
            id="another namespace",
        ),
        pytest.param(
            [put("service", svc("other", namespace=OTHER_NS, labels=PROXIED))],
            [],
            id="a proxied Service of another namespace",
        ),
    ],
)
def test_proxied_services(steps: list[Step], expected: list[ProxiedService]) -> None:
    translating = make_service("vm-vm1", selector=VM_SELECTOR, ports=[{"port": 22, "targetPort": 2222}])
    endpoint = translating if any(s[2]["metadata"]["name"] == "vm-c" for s in steps) else VM_ENDPOINT
    world = world_of(
        put("service", endpoint),
        put("helmrelease", make_helmrelease()),
        put("pod", VM_POD),
        *steps,
        settings=COZY,
    )
    assert world.proxied_services(NS) == expected


@pytest.mark.parametrize(
    ("attachment", "endpoint", "helmrelease"),
    [
        pytest.param(VA, VM_ENDPOINT, None, id="its application not found"),
        pytest.param(
            VA, VM_ENDPOINT, make_helmrelease(uid="hr-uid-2"), id="a leftover of a recreated application"
        ),
        pytest.param(
            make_attachment("vm-g", uid="g", app_name="other", endpoint="vm-vm1", method="WholeIP"),
            VM_ENDPOINT,
            make_helmrelease(),
            id="an applicationRef the endpoint does not belong to",
        ),
        pytest.param(
            VA,
            make_service("vm-vm1", selector={}, ports=[{"port": 22}]),
            make_helmrelease(),
            id="an endpoint that selects nothing",
        ),
        pytest.param(
            VA,
            make_service("vm-vm1", selector=VM_SELECTOR, ports=[]),
            make_helmrelease(),
            id="an endpoint with no port",
        ),
        pytest.param(
            make_attachment("vm-h", uid="h", endpoint="vm-vm1", method="WholeIP", family="Dual"),
            VM_ENDPOINT,
            make_helmrelease(),
            id="Dual: cozy-proxy programs IPv4 only",
        ),
    ],
)
def test_an_attachment_that_can_never_render_is_no_rival(
    attachment: Obj, endpoint: Obj, helmrelease: Obj | None
) -> None:
    steps = [put("service", endpoint), put("pod", VM_POD), put("attachment", attachment)]
    if helmrelease is not None:
        steps.append(put("helmrelease", helmrelease))
    assert world_of(*steps, settings=COZY).proxied_services(NS) == []


def test_without_a_declared_datapath_no_attachment_is_a_rival() -> None:
    world = world_of(
        put("service", VM_ENDPOINT),
        put("helmrelease", make_helmrelease()),
        put("attachment", VA),
        put("service", CHART),
    )
    assert [r.name for r in world.proxied_services(NS)] == ["vm1-chart"]


def test_a_rival_s_pods_include_its_slices() -> None:
    steps = [
        put("service", CHART),
        put("slice", make_endpointslice("vm1-chart", backends=[("pod-x", "10.0.0.9", True)])),
    ]
    world = world_of(put("pod", VM_POD), *steps, settings=COZY)
    assert world.proxied_services(NS)[0].backends == {"pod-vm", "pod-x"}


def test_survivors_of_are_the_live_proxied_services_meeting_its_pods() -> None:
    world = world_of(
        put("pod", VM_POD),
        put("attachment", VA),
        put("service", RENDERED_A),
        put("service", CHART),
        put("service", svc("elsewhere", labels=PROXIED, selector={"vm.kubevirt.io/name": "vm2"})),
        settings=COZY,
    )
    assert names(world.survivors_of(RENDERED_A)) == ["vm1-chart"]
    assert world.survivors_of(svc("plain")) == []


# --- what a pass sees ------------------------------------------------------------------------------


def full_world(*extra: Step) -> World:
    return world_of(
        put("attachment", A),
        put("attachment", V),
        put("helmrelease", make_helmrelease()),
        put("service", make_service()),
        put("service", OURS),
        put("service", LEGACY),
        put("claim", MINTED),
        put("claim", MINTED_LATER),
        put("class", make_class()),
        put("address", make_ip_address(associated_to=(NS, OURS["metadata"]["name"]))),
        put("slice", make_endpointslice()),
        put("endpoints", make_endpoints(OURS["metadata"]["name"])),
        put("pod", make_pod()),
        *extra,
        settings=COZY,
    )


@pytest.mark.parametrize(
    ("key", "field", "expected"),
    [
        (KA, "helmrelease", make_helmrelease()),
        (KA, "endpoint", make_service()),
        (KA, "substrate", True),
        (KA, "claim", MINTED),
        (KA, "surplus_claims", [MINTED_LATER]),
        (KA, "claim_class", make_class()),
        (KA, "addresses", [make_ip_address(associated_to=(NS, "db-public-x7ktq"))]),
        (KA, "services", [OURS]),
        (KA, "claim_users", [LEGACY]),
        (KA, "settings", COZY),
        # Standard mode reads nothing of the VM datapath
        (KA, "endpoint_slices", ()),
        (KA, "rendered_endpoints", None),
        (KA, "rivals", ()),
        (KA, "pods", ()),
        # a VM mode does
        (KV, "endpoint_slices", [make_endpointslice()]),
        (KV, "pods", [make_pod()]),
        (KV, "rendered_endpoints", None),  # no Service of its own yet
        (KV, "claim", None),
        (KV, "rivals", []),  # its own un-rendered self is never its rival... but is listed for others
    ],
)
def test_observe_assembles_the_right_objects(key: tuple[str, str], field: str, expected: object) -> None:
    world = full_world()
    observed = world.observe(key)
    assert observed is not None
    found = getattr(observed, field)
    if field == "rivals" and key == KV:
        found = [r for r in found if r.attachment is None or r.attachment.uid != "ea-v"]
    assert found == expected
    assert world.observe((NS, "absent")) is None


def test_a_vm_mode_pass_reads_its_rendered_service_s_v1_endpoints() -> None:
    rendered = svc("db-vm-x7ktq", V, labels=PROXIED)
    world = full_world(put("service", rendered), put("endpoints", make_endpoints("db-vm-x7ktq")))
    observed = world.observe(KV)
    assert observed is not None
    assert observed.rendered_endpoints == make_endpoints("db-vm-x7ktq")


def test_a_vm_mode_pass_reads_the_live_service_s_endpoints_not_a_withdrawn_one_s() -> None:
    """A withdrawn Service can linger (a finalizer) while its successor is rendered: cozy-proxy
    programs the live one from its own v1 Endpoints."""
    withdrawn = svc("db-vm-aaaaa", V, labels=PROXIED, deleting=True)
    successor = svc("db-vm-bbbbb", V, labels=PROXIED, created="2024-01-01T00:01:00Z")
    world = full_world(
        put("service", withdrawn),
        put("service", successor),
        put("endpoints", make_endpoints("db-vm-aaaaa")),
        put("endpoints", make_endpoints("db-vm-bbbbb", backends=())),
    )
    observed = world.observe(KV)
    assert observed is not None
    assert observed.rendered_endpoints == make_endpoints("db-vm-bbbbb", backends=())


def test_observe_of_a_uid_less_attachment_owns_nothing() -> None:
    no_uid = {**A, "metadata": {k: v for k, v in A["metadata"].items() if k != "uid"}}
    world = full_world(put("attachment", no_uid))
    observed = world.observe(KA)
    assert observed is not None
    assert (observed.services, observed.claim) == ([], None)
