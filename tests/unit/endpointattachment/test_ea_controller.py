"""controller: who a change wakes (every map function and predicate of the wiring, as named functions of
one object, then a few rows through the declared wiring itself), and the glue of a pass over the caches
with a writer that answers as the API would. The change is in the stores when a map function runs, as
the informers do it; the keys are what the controller would enqueue (the runtime itself drops echoes
and never wakes the pass that wrote)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from operators.endpointattachment import controller
from operators.endpointattachment.api import (
    ATTACHMENTS,
    CLAIM_ANNOTATION,
    CLAIMS,
    CLASSES,
    METALLB_IPS_ANNOTATION,
    PINNED_ANNOTATION,
    PROGRAMMED_ANNOTATION,
    REPROGRAM_ANNOTATION,
    SERVICE_PROXY_NAME_LABEL,
    WITHDRAWN_SELECTOR_KEY,
)
from operators.endpointattachment.controller import ATTACHMENT_CONTROLLER, FINALIZER
from operators.endpointattachment.datapath import programmed_token
from operators.endpointattachment.reasons import (
    CONDITION_PROVISIONED,
    REASON_MULTIPLE_BACKENDS,
    REASON_PROVISIONED,
    REASON_WAITING_FOR_ADDRESS,
)
from operators.endpointattachment.render import RenderSettings
from operators.endpointattachment.world import RESOURCES, SUBSTRATE, World
from shared.resources import SERVICES
from shared.runtime.cache import Key, Obj, key_of
from shared.runtime.controller import Result, StaticCaches, decide
from shared.runtime.served import CRDS
from tests.ea_builders import (
    ADDRESS,
    CLAIM,
    CREATED,
    NAMESPACE,
    controlled_by,
    lineage_labels,
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
from tests.ea_caches import KINDS, RecordingWriter, Step, caches_of, enqueued, make_crd, put

NS, OTHER_NS = NAMESPACE, "tenant-b"
PROXIED = {SERVICE_PROXY_NAME_LABEL: "cozy-proxy"}
VM_APP = lineage_labels(kind="VMInstance", name="vm1")
VM_SELECTOR = {"vm.kubevirt.io/name": "vm1"}
# A mints from the default class; B references held-ip; V is WholeIP to vm-vm1, minting from "private";
# T is A's twin in another namespace.
A = make_attachment(uid="ea-a")
B = make_attachment("db-held", uid="ea-b", endpoint="postgres-db-ro", claim_name="held-ip")
V = make_attachment(
    "vm1-public", uid="ea-v", app_kind="VMInstance", app_name="vm1", endpoint="vm-vm1", method="WholeIP"
)
T = make_attachment(namespace=OTHER_NS, uid="ea-t")
KA, KB, KV, KT = (NS, "db-public"), (NS, "db-held"), (NS, "vm1-public"), (OTHER_NS, "db-public")
MINTED = make_claim(owner=A)
HELD = make_claim("held-ip")
V_CLAIM = make_claim("vm1-public-abcde", owner=V, class_name="private", status_class="private")
T_CLAIM = make_claim(namespace=OTHER_NS, owner=T)
OURS_A = make_service(
    "db-public-x7ktq", labels={}, annotations={CLAIM_ANNOTATION: CLAIM}, owner_references=controlled_by(A)
)
OURS_V = make_service(
    "vm1-public-x7ktq",
    labels=PROXIED,
    selector=VM_SELECTOR,
    annotations={CLAIM_ANNOTATION: "vm1-public-abcde"},
    owner_references=controlled_by(V),
)
CHART = make_service("vm1-chart", labels=PROXIED, selector=VM_SELECTOR)
CLUSTER: list[Step] = [
    *[put("attachment", attachment) for attachment in (A, B, V, T)],
    *[put("claim", claim) for claim in (MINTED, HELD, V_CLAIM, T_CLAIM)],
    put("service", make_service()),
    put("service", make_service(namespace=OTHER_NS)),
    put("service", make_service("vm-vm1", labels=VM_APP, selector=VM_SELECTOR)),
    put("service", OURS_A),
    put("service", OURS_V),
]


def changed(obj: Obj, **metadata: Any) -> Obj:
    """A later version of ``obj``: a new resourceVersion, ``metadata`` merged in, and a status."""
    later = copy.deepcopy(obj)
    later["metadata"] = {**later["metadata"], "resourceVersion": "2", **metadata}
    later["status"] = {**(later.get("status") or {}), "observedGeneration": 1}
    return later


# --- the map functions, one version of one object each ---------------------------------------------

MapFunction = Callable[[World, Obj], Any]


@pytest.mark.parametrize(
    ("map_function", "obj", "expected"),
    [
        # a claim: its referrers, and its minter (when cached, with the UID it names)
        (controller.attachments_of_claim, MINTED, {KA}),
        (controller.attachments_of_claim, HELD, {KB}),
        (controller.attachments_of_claim, T_CLAIM, {KT}),
        (controller.attachments_of_claim, make_claim("nobody-s"), set()),
        (controller.attachments_of_claim, make_claim("held-ip", namespace=OTHER_NS), set()),
        # an IPAddress: the attachments of the claim it names, once it is associated with a Service
        # (an unassociated address decides nothing), but for the one controlling that Service
        (controller.attachments_of_address, make_ip_address(), set()),
        (controller.attachments_of_address, make_ip_address(associated_to=(NS, "legacy")), {KA}),
        (
            controller.attachments_of_address,
            make_ip_address(claim=(NS, "held-ip"), associated_to=(NS, "legacy")),
            {KB},
        ),
        (controller.attachments_of_address, make_ip_address(associated_to=key_of(OURS_A)), set()),  # A's own
        (
            controller.attachments_of_address,
            make_ip_address(claim=(NS, "held-ip"), associated_to=key_of(OURS_A)),
            {KB},  # A's Service is a rival user of held-ip for B
        ),
        (controller.attachments_of_address, make_ip_address(claim=None, associated_to=(NS, "x")), set()),
        (controller.attachments_of_address, {"metadata": {"name": "x"}, "spec": {"claimRef": "x"}}, set()),
        # a class: the attachments of the claims that resolved to it
        (controller.attachments_of_class, make_class(), {KA, KB, KT}),
        (controller.attachments_of_class, make_class("private"), {KV}),
        (controller.attachments_of_class, make_class("unused"), set()),
        # the substrate arriving: every attachment
        (controller.every_attachment, make_crd(CLAIMS), {KA, KB, KV, KT}),
        # a Service: the attachments whose endpoint it is, and those whose claim it names
        (controller.attachments_of_service, make_service(), {KA}),
        (controller.attachments_of_service, make_service(namespace=OTHER_NS), {KT}),
        (controller.attachments_of_service, make_service("postgres-db-ro"), {KB}),
        (
            controller.attachments_of_service,
            make_service("legacy", annotations={CLAIM_ANNOTATION: "held-ip"}),
            {KB},
        ),
        (
            controller.attachments_of_service,
            make_service("legacy", annotations={CLAIM_ANNOTATION: "held-ip"}, namespace=OTHER_NS),
            set(),
        ),
        (controller.attachments_of_service, make_service("unrelated"), set()),
        # a proxied Service: every VM-mode attachment
        (controller.attachments_in_vm_mode, CHART, {KV}),
        # slices: VM-mode attachments only, of their endpoint, or all of them for a proxied Service's
        (controller.attachments_of_slice, make_endpointslice(), set()),  # A's endpoint, but A is Standard
        (controller.attachments_of_slice, make_endpointslice("vm-vm1"), {KV}),
        (controller.attachments_of_slice, make_endpointslice("vm1-public-x7ktq"), {KV}),  # proxied
        (controller.attachments_of_slice, make_endpointslice("unrelated"), set()),
        (controller.attachments_of_slice, make_endpointslice("vm-vm1", namespace=OTHER_NS), set()),
        # v1 Endpoints: the VM-mode attachment whose rendered Service they are of
        (controller.attachment_of_rendered_endpoints, make_endpoints("vm1-public-x7ktq"), {KV}),
        (controller.attachment_of_rendered_endpoints, make_endpoints("db-public-x7ktq"), set()),  # Standard
        (controller.attachment_of_rendered_endpoints, make_endpoints("vm-vm1"), set()),  # the endpoint's own
        (controller.attachment_of_rendered_endpoints, make_endpoints("absent"), set()),
        # pods: the VM-mode attachments of their namespace
        (controller.attachments_of_pod, make_pod(), {KV}),
        (controller.attachments_of_pod, make_pod(namespace=OTHER_NS), set()),
        # a HelmRelease: the attachments naming its application (by its lineage labels)
        (controller.attachments_of_helmrelease, make_helmrelease(), {KA, KB}),
        (controller.attachments_of_helmrelease, make_helmrelease("vm-vm1", labels=VM_APP), {KV}),
        (controller.attachments_of_helmrelease, make_helmrelease(namespace=OTHER_NS), {KT}),
        (controller.attachments_of_helmrelease, make_helmrelease(labels={}), set()),
    ],
)
def test_map_functions(map_function: MapFunction, obj: Obj, expected: set[Key]) -> None:
    caches = caches_of(*CLUSTER, put(_kind_of(obj), obj))
    assert set(map_function(World(caches), obj)) == expected


def _kind_of(obj: Obj) -> str:
    """The cache an object goes in (a map function runs with the change already stored)."""
    return {
        "IPAddressClaim": "claim",
        "IPAddress": "address",
        "IPAddressClass": "class",
        "CustomResourceDefinition": "crd",
        "Service": "service",
        "EndpointSlice": "slice",
        "Endpoints": "endpoints",
        "Pod": "pod",
        "HelmRelease": "helmrelease",
    }.get(str(obj.get("kind")), "address")  # a malformed IPAddress has no kind


def test_no_vm_mode_attachment_no_slice_wakes_anyone() -> None:
    caches = caches_of(put("attachment", A), put("service", CHART))
    assert controller.attachments_of_slice(World(caches), make_endpointslice("vm1-chart")) == set()


# --- the predicates, (old, new) ---------------------------------------------------------------------

CLAIMS_CRD = make_crd(CLAIMS)
VM_SLICE = make_endpointslice("vm-vm1")
TWO_READY: list[tuple[str | None, str, bool | None]] = [("p1", "10.0.0.1", True), ("p2", "10.0.0.2", None)]
Predicate = Callable[[Obj | None, Obj | None], bool]
PredicateRow = tuple[Predicate, Obj | None, Obj | None, bool]


def with_metadata(obj: Obj, **metadata: Any) -> Obj:
    """``obj`` with ``metadata`` merged in (None removes a key)."""
    merged = {**obj["metadata"], **metadata}
    return {**obj, "metadata": {k: v for k, v in merged.items() if v is not None}}


def with_status(obj: Obj, **status: Any) -> Obj:
    return {**obj, "status": {**(obj.get("status") or {}), **status}}


PENDING_SAYS = {
    "type": "Bound",
    "status": "False",
    "reason": "WaitingForProvisioning",
    "message": "no free IP",
}
PENDING = make_claim(owner=A, phase="Pending", conditions=[{**PENDING_SAYS, "lastTransitionTime": "t1"}])
# One row per field of a claim: what a pass reads of it wakes (phase, addresses, class, family,
# controller, deletion; while not Bound, the words of its conditions), nothing else does.
CLAIM_PREDICATE: list[PredicateRow] = [
    (controller.claim_reading_changed, None, MINTED, True),
    (controller.claim_reading_changed, MINTED, None, True),
    (controller.claim_reading_changed, MINTED, changed(MINTED), False),  # bookkeeping only
    (
        controller.claim_reading_changed,
        MINTED,
        with_metadata(
            MINTED,
            annotations={"local.sdn.cozystack.io/provisioner": "metallb"},
            finalizers=["local.sdn.cozystack.io/claim-protection"],
        ),
        False,  # the substrate's stamp and finalizer
    ),
    (controller.claim_reading_changed, MINTED, with_metadata(MINTED, labels={"x": "y"}), False),
    (controller.claim_reading_changed, PENDING, MINTED, True),  # phase and addresses
    (
        controller.claim_reading_changed,
        MINTED,
        make_claim(owner=A, addresses=(ADDRESS, "2001:db8::1")),
        True,
    ),
    (controller.claim_reading_changed, MINTED, make_claim(owner=A, status_class="other"), True),
    (controller.claim_reading_changed, MINTED, make_claim(owner=A, class_name="other"), True),
    (controller.claim_reading_changed, MINTED, make_claim(owner=A, family="IPv6"), True),
    (controller.claim_reading_changed, MINTED, make_claim(owner=A, deleting=True), True),
    (controller.claim_reading_changed, MINTED, make_claim(owner=B), True),  # another controller
    (controller.claim_reading_changed, MINTED, make_claim(), True),  # released by its controller
    (
        controller.claim_reading_changed,
        PENDING,
        make_claim(owner=A, phase="Pending", conditions=[{**PENDING_SAYS, "lastTransitionTime": "t2"}]),
        False,  # a condition's timestamp
    ),
    (
        controller.claim_reading_changed,
        PENDING,
        make_claim(owner=A, phase="Pending", conditions=[{**PENDING_SAYS, "message": "class exhausted"}]),
        True,  # ClaimPending repeats the claim's words
    ),
    (
        controller.claim_reading_changed,
        make_claim(owner=A, conditions=[{**PENDING_SAYS, "status": "True"}]),
        make_claim(owner=A, conditions=[{**PENDING_SAYS, "status": "True", "message": "bound"}]),
        False,  # Bound: its conditions' words are not read
    ),
]
ASSOCIATED = make_ip_address(associated_to=(NS, "svc-a"))
# An address: only its association (under the claim it names) is read.
ADDRESS_PREDICATE: list[PredicateRow] = [
    (controller.address_reading_changed, None, make_ip_address(), False),  # created unassociated
    (controller.address_reading_changed, make_ip_address(), None, False),
    (controller.address_reading_changed, make_ip_address(phase="Available"), make_ip_address(), False),
    (controller.address_reading_changed, make_ip_address(), ASSOCIATED, True),
    (controller.address_reading_changed, ASSOCIATED, make_ip_address(), True),
    (controller.address_reading_changed, None, ASSOCIATED, True),
    (controller.address_reading_changed, ASSOCIATED, None, True),
    (controller.address_reading_changed, ASSOCIATED, make_ip_address(associated_to=(NS, "svc-b")), True),
    (
        controller.address_reading_changed,
        ASSOCIATED,
        make_ip_address(associated_to=(OTHER_NS, "svc-a")),
        True,
    ),
    (
        controller.address_reading_changed,
        ASSOCIATED,
        make_ip_address(claim=(NS, "held-ip"), associated_to=(NS, "svc-a")),
        True,
    ),
    (controller.address_reading_changed, ASSOCIATED, with_status(ASSOCIATED, phase="Released"), False),
]
PINNED_A = with_metadata(OURS_A, annotations={CLAIM_ANNOTATION: CLAIM, METALLB_IPS_ANNOTATION: ADDRESS})
# A Service: everything but the driver's pin and a write's bookkeeping.
SERVICE_PREDICATE: list[PredicateRow] = [
    (controller.service_reading_changed, None, OURS_A, True),
    (controller.service_reading_changed, OURS_A, None, True),
    (controller.service_reading_changed, OURS_A, PINNED_A, False),
    # The driver's one Update: its pin and its marker together.
    (
        controller.service_reading_changed,
        OURS_A,
        with_metadata(
            OURS_A,
            annotations={CLAIM_ANNOTATION: CLAIM, METALLB_IPS_ANNOTATION: ADDRESS, PINNED_ANNOTATION: "true"},
        ),
        False,
    ),
    (
        controller.service_reading_changed,
        OURS_A,
        with_metadata(OURS_A, resourceVersion="9", generation=2),
        False,
    ),
    (
        controller.service_reading_changed,
        PINNED_A,
        with_status(PINNED_A, loadBalancer={"ingress": [{"ip": ADDRESS}]}),
        True,
    ),
    (
        controller.service_reading_changed,
        OURS_A,
        with_metadata(OURS_A, annotations={CLAIM_ANNOTATION: CLAIM, PROGRAMMED_ANNOTATION: "x"}),
        True,
    ),
    (controller.service_reading_changed, OURS_A, with_metadata(OURS_A, annotations=None), True),
    (controller.service_reading_changed, OURS_A, with_metadata(OURS_A, labels={"x": "y"}), True),
    (controller.service_reading_changed, OURS_A, with_metadata(OURS_A, deletionTimestamp="t"), True),
    (controller.service_reading_changed, OURS_A, with_metadata(OURS_A, ownerReferences=None), True),
    (
        controller.service_reading_changed,
        OURS_A,
        {**OURS_A, "spec": {**OURS_A["spec"], "selector": {}}},
        True,
    ),
]


@pytest.mark.parametrize(
    ("predicate", "old", "new", "expected"),
    [
        (controller.is_substrate_crd, None, CLAIMS_CRD, True),
        (controller.is_substrate_crd, CLAIMS_CRD, None, True),
        (controller.is_substrate_crd, make_crd(CLAIMS, established=False), CLAIMS_CRD, True),
        (controller.is_substrate_crd, CLAIMS_CRD, changed(CLAIMS_CRD), False),
        (controller.is_substrate_crd, None, make_crd(CLASSES), True),
        (controller.is_substrate_crd, None, make_crd(ATTACHMENTS), False),  # ours: not the substrate's
        (controller.proxy_reading_changed, None, make_service(), False),
        (controller.proxy_reading_changed, None, CHART, True),
        (controller.proxy_reading_changed, CHART, None, True),
        (controller.proxy_reading_changed, CHART, changed(CHART), False),  # its status: not read
        (
            controller.proxy_reading_changed,
            CHART,
            make_service("vm1-chart", labels={SERVICE_PROXY_NAME_LABEL: "x"}, selector=VM_SELECTOR),
            True,
        ),
        (
            controller.proxy_reading_changed,
            CHART,
            make_service("vm1-chart", labels=PROXIED, selector={"x": "y"}),
            True,
        ),
        (
            controller.proxy_reading_changed,
            CHART,
            {**CHART, "metadata": {**CHART["metadata"], "ownerReferences": controlled_by(V)}},
            True,
        ),
        (controller.slice_reading_changed, VM_SLICE, changed(VM_SLICE), False),
        (controller.slice_reading_changed, None, VM_SLICE, True),
        (controller.slice_reading_changed, VM_SLICE, None, True),
        (controller.slice_reading_changed, VM_SLICE, make_endpointslice("vm-vm1", backends=TWO_READY), True),
        (
            controller.slice_reading_changed,
            VM_SLICE,
            make_endpointslice("other", name=VM_SLICE["metadata"]["name"]),
            True,
        ),
        (controller.programmed_reading_changed, make_endpoints(), make_endpoints(), False),
        (controller.programmed_reading_changed, make_endpoints(), make_endpoints(backends=[]), True),
        (
            controller.programmed_reading_changed,
            make_endpoints(),
            make_endpoints(backends=[("pod-uid-1", "10.244.0.10", False)]),
            True,
        ),
        (controller.programmed_reading_changed, None, make_endpoints(), True),
        (controller.programmed_reading_changed, make_endpoints(), None, True),
        *CLAIM_PREDICATE,
        *ADDRESS_PREDICATE,
        *SERVICE_PREDICATE,
    ],
)
def test_change_predicates(predicate: Predicate, old: Obj | None, new: Obj | None, expected: bool) -> None:
    assert predicate(old, new) is expected


# --- through the wiring, as declared ----------------------------------------------------------------


def woken(kind: str, old: Obj | None, new: Obj | None, monkeypatch: pytest.MonkeyPatch) -> set[Key]:
    """What the controller enqueues when ``kind`` changes from ``old`` to ``new`` (stored first)."""
    caches = caches_of(*CLUSTER, *([put(kind, old)] if old is not None else []))
    return enqueued(caches, KINDS[kind], old, new, monkeypatch)


CLASS_1 = {**make_class(), "metadata": {**make_class()["metadata"], "generation": 1}}
HR = make_helmrelease()
ANSWERED_A = {**OURS_A, "status": {"loadBalancer": {"ingress": [{"ip": ADDRESS}]}}}


@pytest.mark.parametrize(
    ("kind", "old", "new", "expected"),
    [
        ("attachment", A, changed(A), {KA}),
        ("claim", PENDING, MINTED, {KA}),  # its phase and addresses are read; minted: owns
        ("claim", MINTED, changed(MINTED), set()),  # a status write changing nothing read
        ("claim", make_claim("held-ip", phase="Pending"), HELD, {KB}),
        ("claim", HELD, changed(HELD), set()),
        ("address", None, make_ip_address(associated_to=(NS, "legacy")), {KA}),
        ("address", make_ip_address(), make_ip_address(associated_to=key_of(OURS_A)), set()),  # A's own
        ("service", OURS_A, ANSWERED_A, {KA}),  # the load balancer's answer, through owns
        ("service", OURS_A, PINNED_A, set()),  # the driver's pin: nothing a pass reads
        ("service", make_service(), None, {KA}),  # the endpoint went: Detached
        ("service", CHART, changed(CHART), set()),  # a proxied Service's status: nobody's business
        ("service", None, CHART, {KV}),
        ("class", None, make_class("private"), {KV}),  # a class arriving after its claim bound
        ("class", CLASS_1, changed(CLASS_1), set()),  # status only: no new generation
        ("class", CLASS_1, changed(CLASS_1, generation=2), {KA, KB, KT}),
        ("crd", None, make_crd(CLAIMS), {KA, KB, KV, KT}),
        ("crd", None, make_crd(ATTACHMENTS), set()),
        ("helmrelease", HR, changed(HR), set()),  # read for its lineage labels and UID only
        ("helmrelease", HR, changed(HR, labels=VM_APP), {KA, KB, KV}),  # old and new apps' attachments
        ("pod", make_pod(), changed(make_pod()), set()),
        ("pod", None, make_pod(), {KV}),
        ("endpoints", None, make_endpoints("vm1-public-x7ktq"), {KV}),
        ("endpoints", make_endpoints("vm1-public-x7ktq"), changed(make_endpoints("vm1-public-x7ktq")), set()),
    ],
)
def test_woken_through_the_wiring(
    kind: str, old: Obj | None, new: Obj | None, expected: set[Key], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert woken(kind, old, new, monkeypatch) == expected


def test_every_kind_the_controller_reads_is_cached_and_every_cache_is_read() -> None:
    assert set(ATTACHMENT_CONTROLLER.resources()) == {*RESOURCES, CRDS}
    assert set(SUBSTRATE) <= set(ATTACHMENT_CONTROLLER.resources())


# --- the glue: a pass over the caches, with a writer answering as the API would -------------------

RESOLVED_WORLD: list[Step] = [
    put("service", make_service()),
    put("helmrelease", make_helmrelease()),
    put("class", make_class()),
]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def reconciler(
    *steps: Step, settings: RenderSettings | None = None, unserved: Any = ()
) -> tuple[controller.AttachmentReconciler, RecordingWriter, StaticCaches, Clock]:
    caches = caches_of(*steps, unserved=unserved)
    writer, clock = RecordingWriter(caches), Clock()
    running = controller.AttachmentReconciler(
        World(caches, settings),
        writer,
        clock,
        wall_clock=lambda: datetime.fromisoformat(CREATED),  # the writer's objects are created then
    )
    return running, writer, caches, clock


def stored_provisioned(caches: StaticCaches, key: Key = KA) -> tuple[str, str]:
    attachment = caches.store(ATTACHMENTS).get(key) or {}
    found = next(c for c in attachment["status"]["conditions"] if c["type"] == CONDITION_PROVISIONED)
    return found["status"], found["reason"]


def bind(caches: StaticCaches, address: str = ADDRESS) -> Obj:
    """The substrate binds the claim the pass minted (the one claim of the namespace)."""
    claims = caches.store(CLAIMS)
    minted = next(c for c in claims.values() if c["metadata"]["namespace"] == NS)
    bound = copy.deepcopy(minted)
    bound["status"] = make_claim(addresses=(address,))["status"]
    claims.upsert(bound)
    return bound


def announce(caches: StaticCaches, name: str = "db-public-x7ktr", address: str = ADDRESS) -> None:
    services = caches.store(KINDS["service"])
    ours = copy.deepcopy(services.get((NS, name)) or {})
    ours["status"] = {"loadBalancer": {"ingress": [{"ip": address}]}}
    services.upsert(ours)


async def test_a_key_not_cached_is_a_quiet_pass() -> None:
    running, writer, _, _ = reconciler()
    assert await decide(running, (NS, "absent")) == Result()
    assert writer.calls == []


async def test_a_first_pass_stamps_mints_and_renders_nothing_before_the_claim_is_bound() -> None:
    running, writer, caches, clock = reconciler(
        *RESOLVED_WORLD, put("attachment", make_attachment(owner_uid=None))
    )
    assert await decide(running, KA) == Result(requeue_after=controller.STATUS_HOLD_SECONDS)
    assert writer.calls == [
        ("metadata", "endpointattachments", "db-public"),  # finalizer, owner reference, lineage labels
        ("create", "ipaddressclaims", "db-public-x7ktq"),
    ], "no status while the substrate's binding is due"
    stamped = caches.store(ATTACHMENTS).get(KA) or {}
    assert FINALIZER in stamped["metadata"]["finalizers"]
    assert stamped["metadata"]["labels"] == {
        k: v for k, v in lineage_labels(tenant_facing=False).items() if k.startswith("apps.")
    }
    writer.calls.clear()
    clock.now += controller.STATUS_HOLD_SECONDS
    assert await decide(running, KA) == Result()
    assert writer.calls == [("status", "endpointattachments", "db-public")], (
        "no binding: said once the hold ends"
    )
    assert stored_provisioned(caches) == ("False", "ClaimPending")


async def test_once_bound_the_service_is_created_and_its_status_held_for_the_answer() -> None:
    running, writer, caches, clock = reconciler(*RESOLVED_WORLD, put("attachment", A))
    await decide(running, KA)
    bind(caches)
    writer.calls.clear()
    assert await decide(running, KA) == Result(requeue_after=controller.STATUS_HOLD_SECONDS)
    assert writer.calls == [("create", "services", "db-public-x7ktr")], "no status while the answer is due"
    clock.now += 0.25
    announce(caches)
    writer.calls.clear()
    assert await decide(running, KA) == Result()
    assert writer.calls == [("status", "endpointattachments", "db-public")], "one status write: Provisioned"
    assert stored_provisioned(caches) == ("True", REASON_PROVISIONED)
    writer.calls.clear()
    assert await decide(running, KA) == Result()
    assert writer.calls == [], "a second pass writes nothing"


async def test_without_an_answer_the_held_status_is_written_when_the_hold_runs_out() -> None:
    running, writer, caches, clock = reconciler(*RESOLVED_WORLD, put("attachment", A), put("claim", MINTED))
    await decide(running, KA)
    writer.calls.clear()
    clock.now += controller.STATUS_HOLD_SECONDS
    result = await decide(running, KA)
    assert writer.calls == [("status", "endpointattachments", "db-public")]
    assert stored_provisioned(caches) == ("False", REASON_WAITING_FOR_ADDRESS)
    assert result.requeue_after is not None, "the announce deadline is re-checked"


async def test_a_pass_waits_while_the_substrate_s_cache_catches_up() -> None:
    running, writer, _, _ = reconciler(
        *RESOLVED_WORLD,
        put("attachment", A),
        *[put("crd", make_crd(r)) for r in SUBSTRATE],
        unserved=SUBSTRATE,
    )
    assert await decide(running, KA) == Result(requeue_after=controller.CATCH_UP_SECONDS)
    assert writer.calls == []


async def test_finalizing_deletes_our_service_then_the_finalizer_and_never_the_claim() -> None:
    deleting = make_attachment(uid="ea-a", deleting=True, finalizers=[FINALIZER])
    running, writer, caches, _ = reconciler(
        *RESOLVED_WORLD, put("attachment", deleting), put("service", OURS_A), put("claim", MINTED)
    )
    assert await decide(running, KA) == Result()
    # The Service held no finalizer: gone once its DELETE is answered, so the same pass releases ours.
    assert writer.calls == [
        ("delete", "services", "db-public-x7ktq"),
        ("unfinalize", "endpointattachments", "db-public"),
    ]
    assert caches.store(CLAIMS).get(key_of(MINTED)) is not None, "left to garbage collection"


async def test_finalizing_waits_for_a_service_held_by_a_finalizer_to_go() -> None:
    deleting = make_attachment(uid="ea-a", deleting=True, finalizers=[FINALIZER])
    held = with_metadata(OURS_A, finalizers=["service.kubernetes.io/load-balancer-cleanup"])
    running, writer, caches, _ = reconciler(
        *RESOLVED_WORLD, put("attachment", deleting), put("service", held)
    )
    terminating = with_metadata(held, deletionTimestamp="2026-12-01T00:00:09Z")
    caches.store(SERVICES).upsert(terminating)  # what the API answered: still there, being deleted
    assert await decide(running, KA) == Result()
    assert writer.calls == []  # its deletion is under way: nothing to send, the finalizer stays
    caches.store(SERVICES).delete(key_of(terminating))
    assert await decide(running, KA) == Result()  # woken by the Service's deletion (owns)
    assert writer.calls == [("unfinalize", "endpointattachments", "db-public")]


async def test_finalizing_deletes_a_service_held_by_a_finalizer_and_waits() -> None:
    deleting = make_attachment(uid="ea-a", deleting=True, finalizers=[FINALIZER])
    held = with_metadata(OURS_A, finalizers=["service.kubernetes.io/load-balancer-cleanup"])
    running, writer, _, _ = reconciler(*RESOLVED_WORLD, put("attachment", deleting), put("service", held))
    assert await decide(running, KA) == Result()
    assert writer.calls == [("delete", "services", "db-public-x7ktq")]  # not released: not gone yet


COZY = RenderSettings(proxy_name="cozy-proxy")


def vm_world() -> list[Step]:
    """V, a WholeIP attachment of a VM with one ready launcher pod, its claim Bound."""
    return [
        put("attachment", V),
        put(
            "helmrelease",
            make_helmrelease(
                "vm-vm1", labels=lineage_labels(kind="VMInstance", name="vm1", tenant_facing=False)
            ),
        ),
        put("service", make_service("vm-vm1", labels=VM_APP, selector=VM_SELECTOR, ports=[{"port": 22}])),
        put("claim", make_claim("vm1-public-abcde", owner=V)),
        put("class", make_class()),
        put("pod", make_pod("virt-launcher", labels=VM_SELECTOR)),
        put("slice", make_endpointslice("vm-vm1")),
    ]


async def rendered_vm() -> tuple[controller.AttachmentReconciler, RecordingWriter, StaticCaches, str]:
    """``vm_world`` after the pass that created V's Service, which is now announced and whose v1
    Endpoints name the pod; the writer's calls cleared."""
    running, writer, caches, _ = reconciler(*vm_world(), settings=COZY)
    await decide(running, KV)  # creates the Service
    name = next(c[2] for c in writer.calls if c[:2] == ("create", "services"))
    announce(caches, name)
    caches.store(KINDS["endpoints"]).upsert(make_endpoints(name))
    writer.calls.clear()
    return running, writer, caches, name


async def test_the_programmed_touch_once_and_survivors_reprogrammed_after_a_delete() -> None:
    running, writer, caches, name = await rendered_vm()
    await decide(running, KV)
    assert ("patch", "services", name) in writer.calls
    touched = caches.store(KINDS["service"]).get((NS, name)) or {}
    assert touched["metadata"]["annotations"][PROGRAMMED_ANNOTATION] == programmed_token(ADDRESS, "pod-uid-1")
    writer.calls.clear()
    await decide(running, KV)
    assert writer.calls == [], "touched once"
    # the chart exposes the VM itself: ours loses the pod, is withdrawn, and the chart's is re-programmed
    caches.store(KINDS["service"]).upsert(CHART)
    writer.calls.clear()
    await decide(running, KV)
    assert writer.calls[:2] == [("delete", "services", name), ("patch", "services", "vm1-chart")]
    chart = caches.store(KINDS["service"]).get((NS, "vm1-chart")) or {}
    assert chart["metadata"]["annotations"][REPROGRAM_ANNOTATION].startswith(f"{NS}/{name}/")


async def test_multiple_backends_withdraw_in_one_patch_and_restore_with_one_status_write() -> None:
    running, writer, caches, name = await rendered_vm()
    await decide(running, KV)  # Provisioned, the programmed touch
    assert stored_provisioned(caches, KV) == ("True", REASON_PROVISIONED)
    two = (("pod-uid-1", "10.244.0.10", True), ("pod-uid-2", "10.244.0.11", True))
    caches.store(KINDS["pod"]).upsert(make_pod("virt-launcher-b", uid="pod-uid-2", labels=VM_SELECTOR))
    caches.store(KINDS["slice"]).upsert(make_endpointslice("vm-vm1", backends=two))
    writer.calls.clear()
    await decide(running, KV)
    # Withdrawn: one patch of the Service (never a delete), then the status.
    assert writer.calls == [("patch", "services", name), ("status", "endpointattachments", "vm1-public")]
    withdrawn = caches.store(KINDS["service"]).get((NS, name)) or {}
    assert withdrawn["spec"]["selector"] == {**VM_SELECTOR, WITHDRAWN_SELECTOR_KEY: V["metadata"]["uid"]}
    assert stored_provisioned(caches, KV) == ("False", REASON_MULTIPLE_BACKENDS)
    caches.store(KINDS["endpoints"]).upsert(make_endpoints(name, backends=()))  # its Endpoints empty
    writer.calls.clear()
    await decide(running, KV)
    assert writer.calls == [], "a second pass writes nothing"
    # One backend again: one patch restores the selector; the status waits for the Endpoints.
    caches.store(KINDS["slice"]).upsert(make_endpointslice("vm-vm1", backends=two[1:]))
    result = await decide(running, KV)
    assert writer.calls == [("patch", "services", name)]
    assert result.requeue_after is not None, "held, looked at again when the hold runs out"
    restored = caches.store(KINDS["service"]).get((NS, name)) or {}
    assert restored["spec"]["selector"] == VM_SELECTOR
    caches.store(KINDS["endpoints"]).upsert(make_endpoints(name, backends=two[1:]))
    writer.calls.clear()
    await decide(running, KV)
    assert ("status", "endpointattachments", "vm1-public") in writer.calls
    assert stored_provisioned(caches, KV) == ("True", REASON_PROVISIONED)
