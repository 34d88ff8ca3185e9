"""controller: who a change wakes, per controller, through its wiring block (primary, owns, watches,
their map functions and predicates), over stores built with the indexes ``build`` declares. The change
is in the stores when the handlers run, as the informers do it; the keys are what the controller
would enqueue (the runtime itself drops echoes and never wakes the pass that wrote)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.trace import NoOpTracerProvider
from prometheus_client import CollectorRegistry

from operators.endpointattachment import controller
from operators.endpointattachment.constants import (
    ATTACHMENT_LABEL,
    ENDPOINT_ATTACHMENT_KIND,
    IP_ADDRESS_CLAIM_KIND,
    METALLB_IPS_ANNOTATION,
    SERVICE_PROXY_NAME_LABEL,
)
from operators.endpointattachment.controller import (
    ATTACHMENT_CONTROLLER,
    CLAIM_CONTROLLER,
    CLASS_CONTROLLER,
)
from operators.endpointattachment.render import service_name
from operators.endpointattachment.world import RESOURCES, World
from shared.ownership import owner_reference
from shared.resources import Resource
from shared.runtime.cache import Key, Obj, key_of
from shared.runtime.controller import Controller, Result, StaticCaches, Wiring
from shared.runtime.metrics import ControllerMetrics, QueueMetrics
from shared.telemetry.tracing import Tracing
from tests.ea_builders import (
    NAMESPACE,
    lineage_labels,
    make_allocation,
    make_attachment,
    make_claim,
    make_class,
    make_endpoints,
    make_endpointslice,
    make_helmrelease,
    make_service,
    make_serviceproxy,
)
from tests.ea_caches import KINDS, Step, caches_of, drop, put

ROOT = Path(__file__).resolve().parents[3]
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
SQUAT = service_name("db-vm")
CLUSTER: list[Step] = [
    *[put("attachment", attachment) for attachment in (A, B, V, T)],
    put("claim", make_claim()),
    put("claim", make_claim(namespace=OTHER_NS)),
    put("claim", VIP),
    put("service", make_service()),
    put("service", make_service(namespace=OTHER_NS)),
    put("service", make_service("vm-svc", labels=VM_APP)),
]


def controlled_by(owner: Obj) -> list[dict[str, Any]]:
    return [owner_reference(owner, controller=True, block_owner_deletion=True)]


def svc(name: str, labels: Mapping[str, str] | None = None, owner: Obj | None = None) -> Obj:
    """A Service without lineage labels, controlled by ``owner`` if given."""
    return make_service(name, labels=labels or {}, owner_references=controlled_by(owner) if owner else ())


def held_by(attachment: Obj) -> tuple[str, str, str, str]:
    metadata = attachment["metadata"]
    return ENDPOINT_ATTACHMENT_KIND, metadata["namespace"], metadata["name"], metadata["uid"]


def changed(obj: Obj, **metadata: Any) -> Obj:
    """A later version of ``obj``: a new resourceVersion, ``metadata`` merged in, and a status
    (what a status-only write changes)."""
    later = copy.deepcopy(obj)
    later["metadata"] = {**later["metadata"], "resourceVersion": "2", **metadata}
    later["status"] = {**(later.get("status") or {}), "observedGeneration": 1}
    return later


def with_generation(obj: Obj, generation: int = 1) -> Obj:
    return {**obj, "metadata": {**obj["metadata"], "generation": generation}}


class Idle:
    """A reconciler that is never called: these tests look at what is enqueued only."""

    async def reconcile(self, key: Key) -> Result:
        raise AssertionError(f"no reconcile expected, got {key}")


def woken(
    wiring: Wiring,
    kind: str,
    old: Obj | None,
    new: Obj | None,
    steps: list[Step],
    monkeypatch: pytest.MonkeyPatch,
) -> set[Key]:
    """What ``wiring``'s controller enqueues when ``kind`` changes from ``old`` to ``new``, the stores
    already holding the change (after ``steps``)."""
    caches = caches_of(*steps)
    store = caches.store(KINDS[kind])
    if new is not None:
        store.upsert(new)
    elif old is not None:
        store.delete(key_of(old))
    registry = CollectorRegistry()
    running = Controller(
        wiring,
        Idle(),
        caches,
        metrics=ControllerMetrics(registry),
        queue_metrics=QueueMetrics(registry),
        tracing=Tracing(NoOpTracerProvider(), "test"),
    )
    keys: set[Key] = set()
    monkeypatch.setattr(running, "enqueue", keys.add)
    for resource, handler in running.handlers():
        if resource == KINDS[kind]:
            handler(old, new)
    return keys


# --- the attachments controller --------------------------------------------------------------------

ALLOC_A = make_allocation(holder=held_by(A))
ALLOC_11 = make_allocation("203.0.113.11", holder=None)
CLAIM_ALLOC = make_allocation(holder=(IP_ADDRESS_CLAIM_KIND, NS, "my-ip", "claim-uid-my-ip"))
FREED = make_allocation("203.0.113.12", holder=None)


@pytest.mark.parametrize(
    ("kind", "obj", "expected"),
    [
        ("attachment", V, {KV}),
        ("service", make_service(), {KA}),  # its users in its namespace only
        ("service", make_service(namespace=OTHER_NS), {KT}),
        ("service", svc(service_name("db-public"), owner=A), {KA}),  # owned: the controller reference
        ("service", svc("x", owner=NOBODY), {(NS, "nobody")}),
        # a squatter on V's name, labelled or not, controlled by something else or by nothing: V
        # reports the conflict, and renders once the squatter goes
        ("service", svc(SQUAT, owner=DEPLOYMENT), {KV}),
        ("service", svc(SQUAT, labels={ATTACHMENT_LABEL: "db-vm"}), {KV}),
        ("service", svc(SQUAT), {KV}),
        ("service", svc("chart-proxy", labels=PROXIED), {KV}),
        # Only the VM modes read slices: the backends of their endpoint's, and of proxied Services'
        ("slice", make_endpointslice(), set()),  # A's endpoint, but A is Standard
        ("slice", make_endpointslice("unrelated"), set()),  # a Service no proxy serves
        ("slice", make_endpointslice("vm-svc"), {KV}),  # V's endpoint
        ("claim", make_claim(), {KB}),
        ("claim", make_claim(namespace=OTHER_NS), set()),
        ("claim", VIP, set()),
        ("class", make_class(), {KA, KB, KT}),
        ("class", make_class("private-v4"), {KV}),
        ("class", make_class("unused"), set()),
        # a mint takes an address and frees none: its holder alone hears of it
        ("allocation", ALLOC_A, {KA}),
        ("allocation", make_allocation(class_name="private-v4", holder=None), set()),
        ("allocation", make_allocation(class_name="private-v4", holder=held_by(V)), {KV}),
        ("allocation", CLAIM_ALLOC, set()),  # a claim's: its claim's business (the claims controller)
        ("proxy", make_serviceproxy(), {KV}),
        ("namespace", NS_OBJ, {KA, KB, KV}),
        ("namespace", {"metadata": {"name": OTHER_NS}}, {KT}),
        ("helmrelease", make_helmrelease(), {KA, KB}),  # B: its endpoint is not cached
        ("helmrelease", make_helmrelease("vm1", labels=VM_APP), {KB, KV}),
        ("helmrelease", make_helmrelease(labels={}), {KA, KB, KV}),  # no lineage: all of its namespace
        ("helmrelease", make_helmrelease(namespace=OTHER_NS), {KT}),
        # which Services select a pod decides exclusivity: the VM-mode attachments of its namespace
        ("pod", {"metadata": {"name": "vm", "namespace": NS, "uid": "p", "labels": {"vm": "1"}}}, {KV}),
        ("pod", {"metadata": {"name": "vm", "namespace": OTHER_NS, "uid": "q"}}, set()),
    ],
)
def test_attachments_woken_by_an_added_object(
    kind: str, obj: Obj, expected: set[Key], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert woken(ATTACHMENT_CONTROLLER, kind, None, obj, CLUSTER, monkeypatch) == expected


def test_a_freed_address_wakes_only_the_address_less(monkeypatch: pytest.MonkeyPatch) -> None:
    """Those minting from the class without an address (T holds one; B's address is its claim's)."""
    steps = [*CLUSTER, put("allocation", make_allocation(holder=held_by(T))), put("allocation", FREED)]
    assert woken(ATTACHMENT_CONTROLLER, "allocation", FREED, None, steps, monkeypatch) == {KA}


def test_an_allocation_that_keeps_its_address_frees_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    steps = [*CLUSTER, put("allocation", FREED)]
    assert woken(ATTACHMENT_CONTROLLER, "allocation", FREED, changed(FREED), steps, monkeypatch) == set()


CHART_PROXY = svc("chart-proxy", PROXIED)
NO_VM_MODE = drop("attachment", V)
VM_SLICE = make_endpointslice("vm-svc")
MORE_BACKENDS: list[tuple[str | None, str, bool | None]] = [
    ("pod-uid-1", "10.244.0.10", True),
    ("pod-uid-2", "10.244.0.11", None),
]


@pytest.mark.parametrize(
    ("old", "new", "steps", "expected"),
    [
        # what a pass reads of a slice is its Service and its ready backends: nothing else wakes
        (VM_SLICE, changed(VM_SLICE), [], set()),
        (VM_SLICE, changed(make_endpointslice("vm-svc", backends=MORE_BACKENDS)), [], {KV}),
        (VM_SLICE, None, [], {KV}),
        # a proxied Service's backends decide exclusivity for every VM-mode attachment
        (None, make_endpointslice("chart-proxy"), [put("service", CHART_PROXY)], {KV}),
        # ... once that Service is cached (its own arrival wakes them all)
        (None, make_endpointslice("chart-proxy"), [], set()),
        # a slice of a proxied Service, with no VM-mode attachment at all
        (None, make_endpointslice("chart-proxy"), [put("service", CHART_PROXY), NO_VM_MODE], set()),
    ],
)
def test_attachments_woken_by_a_slice(
    old: Obj | None, new: Obj | None, steps: list[Step], expected: set[Key], monkeypatch: pytest.MonkeyPatch
) -> None:
    before = [*CLUSTER, *steps, *([put("slice", old)] if old is not None else [])]
    assert woken(ATTACHMENT_CONTROLLER, "slice", old, new, before, monkeypatch) == expected


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (None, CHART_PROXY, {KV}),  # joins a proxy
        (CHART_PROXY, None, {KV}),  # leaves it
        (CHART_PROXY, changed(CHART_PROXY), set()),  # its status (a balancer's answer): not read
        (CHART_PROXY, changed(svc("chart-proxy", {SERVICE_PROXY_NAME_LABEL: "other"})), {KV}),
        (CHART_PROXY, changed(svc("chart-proxy", PROXIED, V)), {KV}),  # another controller: another rank
        # another selector: other pods
        (
            CHART_PROXY,
            changed({**CHART_PROXY, "spec": {**CHART_PROXY["spec"], "selector": {"x": "y"}}}),
            {KV},
        ),
    ],
)
def test_vm_mode_attachments_woken_by_a_proxied_service(
    old: Obj | None, new: Obj | None, expected: set[Key], monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = [*CLUSTER, *([put("service", old)] if old is not None else [])]
    assert woken(ATTACHMENT_CONTROLLER, "service", old, new, steps, monkeypatch) == expected


PROXIED_OF_A = svc(service_name("db-public"), PROXIED, A)
CLASS_1 = with_generation(make_class())
PROXY_1 = with_generation(make_serviceproxy())
HR = make_helmrelease()


@pytest.mark.parametrize(
    ("kind", "old", "new", "expected"),
    [
        # Both versions map: a Service leaving the proxy frees the pods it held for VM-mode attachments.
        ("service", PROXIED_OF_A, changed(svc(service_name("db-public"), owner=A)), {KA, KV}),
        ("service", make_service(), None, {KA}),  # the endpoint is gone
        # An endpoint that lost its lineage labels: its users hear of it.
        ("service", make_service(), changed(make_service(), labels={}), {KA}),
        # status-only changes of a class or a proxy (ours, or no one's business) wake no one ...
        ("class", CLASS_1, changed(CLASS_1), set()),
        ("proxy", PROXY_1, changed(PROXY_1), set()),
        # ... a spec change (a new generation) or a deletion does
        ("class", CLASS_1, changed(CLASS_1, generation=2), {KA, KB, KT}),
        ("class", CLASS_1, None, {KA, KB, KT}),
        ("proxy", PROXY_1, changed(PROXY_1, generation=2), {KV}),
        ("proxy", PROXY_1, None, {KV}),
        # a HelmRelease is read for its lineage labels and UID only; a Namespace for its labels
        ("helmrelease", HR, changed(HR), set()),
        ("helmrelease", HR, changed(HR, labels=VM_APP), {KA, KB, KV}),  # old and new apps' attachments
        ("namespace", NS_OBJ, changed(NS_OBJ, annotations={"a": "b"}), set()),
        ("namespace", NS_OBJ, changed(NS_OBJ, labels={"team": "b"}), {KA, KB, KV}),
        ("namespace", NS_OBJ, None, {KA, KB, KV}),
        # the attachment itself: any change of it (its own pass's writes are the runtime's to skip)
        ("attachment", A, changed(A), {KA}),
        ("attachment", A, None, {KA}),
        # an allocation released: its holder, and those minting from the class without an address
        ("allocation", ALLOC_A, None, {KA, KT}),
        ("claim", make_claim(), changed(make_claim()), {KB}),  # its status (phase, user) is read
    ],
)
def test_attachments_woken_by_a_change(
    kind: str, old: Obj, new: Obj | None, expected: set[Key], monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = [*CLUSTER, put(kind, old)]
    assert woken(ATTACHMENT_CONTROLLER, kind, old, new, steps, monkeypatch) == expected


def test_a_class_whose_claims_are_used_wakes_their_users(monkeypatch: pytest.MonkeyPatch) -> None:
    uses_vip = make_attachment("uses-vip", uid="ea-vip", claim_name="vip")
    steps = [*CLUSTER, put("attachment", uses_vip)]
    private = make_class("private-v4")
    assert woken(ATTACHMENT_CONTROLLER, "class", None, private, steps, monkeypatch) == {KV, (NS, "uses-vip")}


# --- the claims controller -------------------------------------------------------------------------

USED = make_claim("used", user=("db-public", "ea-a"))


@pytest.mark.parametrize(
    ("kind", "old", "new", "expected"),
    [
        ("claim", None, make_claim("x"), {(NS, "x")}),
        ("claim", VIP, changed(VIP), {(NS, "vip")}),
        ("allocation", None, CLAIM_ALLOC, {(NS, "my-ip")}),
        ("allocation", CLAIM_ALLOC, None, {(NS, "my-ip")}),
        ("allocation", None, ALLOC_A, set()),
        ("allocation", None, ALLOC_11, set()),
        ("class", None, make_class(), {(NS, "my-ip"), (OTHER_NS, "my-ip"), (NS, "used")}),
        ("class", None, make_class("private-v4"), {(NS, "vip")}),
        ("class", CLASS_1, changed(CLASS_1), set()),  # status only
        (
            "class",
            CLASS_1,
            changed(CLASS_1, generation=2),
            {(NS, "my-ip"), (OTHER_NS, "my-ip"), (NS, "used")},
        ),
        ("namespace", None, NS_OBJ, {(NS, "my-ip"), (NS, "vip"), (NS, "used")}),
        ("namespace", NS_OBJ, changed(NS_OBJ), set()),
        ("service", None, make_service(), set()),  # not watched
        # the attachment a claim records as its user is gone: the claim is freed by its pass
        ("attachment", A, None, {(NS, "used")}),
        ("attachment", T, None, set()),  # same name, another namespace: not its user
        ("attachment", A, changed(A), set()),  # only a disappearance frees a claim
    ],
)
def test_claims_woken(
    kind: str, old: Obj | None, new: Obj | None, expected: set[Key], monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = [*CLUSTER, put("claim", USED), *([put(kind, old)] if old is not None else [])]
    assert woken(CLAIM_CONTROLLER, kind, old, new, steps, monkeypatch) == expected


# --- the classes controller ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "old", "new", "expected"),
    [
        ("allocation", None, ALLOC_A, {("", "public-v4")}),
        ("allocation", ALLOC_A, None, {("", "public-v4")}),
        ("allocation", ALLOC_A, changed(ALLOC_A), {("", "public-v4")}),
        ("class", None, make_class(), {("", "public-v4")}),
        ("class", CLASS_1, changed(CLASS_1), set()),  # its own status (ours) wakes no one
        ("class", CLASS_1, changed(CLASS_1, generation=2), {("", "public-v4")}),
        ("attachment", None, A, set()),  # not watched
    ],
)
def test_classes_woken(
    kind: str, old: Obj | None, new: Obj | None, expected: set[Key], monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = [*CLUSTER, *([put(kind, old)] if old is not None else [])]
    assert woken(CLASS_CONTROLLER, kind, old, new, steps, monkeypatch) == expected


# --- map functions on their own: one version each, nothing in the stores is assumed --------------


@pytest.mark.parametrize(
    ("map_function", "obj", "expected"),
    [
        (controller.attachments_of_claim, make_claim(), {KB}),
        (controller.attachments_of_class, make_class("private-v4"), {KV}),
        (controller.attachments_of_class, make_class(), {KA, KB, KT}),
        (controller.holder_of_allocation, ALLOC_A, {KA}),
        (controller.holder_of_allocation, CLAIM_ALLOC, set()),
        (controller.address_less_of_class, ALLOC_A, {KA, KT}),
        (controller.attachments_in_vm_mode, make_serviceproxy(), {KV}),
        (controller.attachments_of_service, make_service(), {KA}),
        (controller.attachments_of_service, make_service("vm-svc", labels=VM_APP), {KV}),
        (controller.attachments_of_slice, make_endpointslice(), set()),
        (controller.attachments_of_slice, make_endpointslice("vm-svc"), {KV}),
        (controller.attachments_of_helmrelease, make_helmrelease(namespace=OTHER_NS), {KT}),
        (controller.attachments_in_namespace, NS_OBJ, {KA, KB, KV}),
        (controller.attachments_in_namespace, {"metadata": {"name": OTHER_NS}}, {KT}),
        (controller.claims_of_allocation, CLAIM_ALLOC, {(NS, "my-ip")}),
        (controller.claims_of_allocation, ALLOC_A, set()),
        (controller.claims_of_class, make_class("private-v4"), {(NS, "vip")}),
        (controller.claims_of_class, make_class(), {(NS, "my-ip"), (NS, "used"), (OTHER_NS, "my-ip")}),
        (controller.claims_in_namespace, {"metadata": {"name": OTHER_NS}}, {(OTHER_NS, "my-ip")}),
        (controller.claims_used_by_attachment, A, {(NS, "used")}),
        (controller.class_of_allocation, make_allocation(class_name="private-v4"), {("", "private-v4")}),
        (controller.class_of_allocation, ALLOC_A, {("", "public-v4")}),
        (controller.class_of_allocation, {"metadata": {"name": "x"}}, set()),
        (controller.attachment_of_rendered_endpoints, make_endpoints("ea-db-vm"), {KV}),
        (controller.attachment_of_rendered_endpoints, make_endpoints("ea-db-public"), set()),  # Standard
    ],
)
def test_map_functions(map_function: Any, obj: Obj, expected: set[Key]) -> None:
    caches = caches_of(*CLUSTER, put("claim", USED))
    assert set(map_function(caches, obj)) == expected


@pytest.mark.parametrize(
    ("predicate", "old", "new", "expected"),
    [
        (controller.address_freed, ALLOC_A, None, True),  # deleted: its address is free
        (controller.address_freed, None, ALLOC_A, False),  # a mint frees nothing
        (controller.address_freed, ALLOC_A, changed(ALLOC_A), False),  # same address, same class
        (controller.address_freed, ALLOC_A, make_allocation(class_name="private-v4"), True),
        (controller.proxy_reading_changed, make_service(), make_service(), False),
        (controller.proxy_reading_changed, None, make_service("vm-svc", labels=VM_APP), False),
        (controller.slice_reading_changed, make_endpointslice(), make_endpointslice(), False),
        (controller.slice_reading_changed, None, make_endpointslice(), True),
        (controller.slice_reading_changed, make_endpointslice(), None, True),
        (controller.programmed_reading_changed, make_endpoints(), make_endpoints(), False),
        (controller.programmed_reading_changed, make_endpoints(), make_endpoints(backends=[]), True),
        (controller.programmed_reading_changed, None, make_endpoints(), True),
    ],
)
def test_change_predicates(predicate: Any, old: Obj | None, new: Obj | None, expected: bool) -> None:
    assert predicate(old, new) is expected


# --- the wiring, as declared -----------------------------------------------------------------------

WIRINGS = (ATTACHMENT_CONTROLLER, CLAIM_CONTROLLER, CLASS_CONTROLLER)


def test_every_kind_a_controller_reads_is_cached_and_every_cache_is_read() -> None:
    read = {resource for wiring in WIRINGS for resource in wiring.resources()}
    assert read == set(RESOURCES)
    assert len({wiring.name for wiring in WIRINGS}) == len(WIRINGS)


async def test_reconcilers_answer_a_result_for_a_key_not_cached() -> None:
    """A key whose object is gone (deleted, or never cached) is a quiet pass: nothing to do."""
    world = World(StaticCaches(caches_of().stores))
    for reconciler in (
        controller.AttachmentReconciler(world, None),  # type: ignore[arg-type]
        controller.ClaimReconciler(world, None),  # type: ignore[arg-type]
        controller.ClassReconciler(world, None),  # type: ignore[arg-type]
    ):
        assert await reconciler.reconcile((NS, "absent")) == Result()


# --- the reconcilers, over the caches, with a writer that records and writes through ---------------


class Recorded:
    """What a writer was asked to do, in order: (verb, plural, name)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []


class RecordingWriter:
    """The ``Writer`` surface the reconcilers use: each write is recorded and its answer goes into
    the caches at once (write-through), as the runtime's writer does; a delete with ``forget``
    (allocations) drops the object from the caches at once, as the runtime's writer does."""

    def __init__(self, caches: StaticCaches) -> None:
        self.caches, self.calls = caches, Recorded().calls
        self.kube = None

    def _answer(self, resource: Resource, obj: Mapping[str, Any]) -> Obj:
        answer = copy.deepcopy(dict(obj))
        metadata = answer.setdefault("metadata", {})
        metadata.setdefault("uid", f"uid-{metadata.get('name')}")
        metadata["resourceVersion"] = str(int(metadata.get("resourceVersion") or 1) + 1)
        self.caches.store(resource).upsert(answer)
        return answer

    def remember(self, resource: Resource, obj: Obj | None) -> Obj | None:
        if obj:
            self.caches.store(resource).upsert(obj)
        return obj

    async def create(self, resource: Resource, body: Mapping[str, Any]) -> Obj:
        self.calls.append(("create", resource.plural, body["metadata"]["name"]))
        return self._answer(resource, body)

    async def patch(self, resource: Resource, obj: Mapping[str, Any], patch: Any, kind: str = "merge") -> Obj:
        self.calls.append(("patch", resource.plural, obj["metadata"]["name"]))
        return self._answer(resource, obj)

    async def delete(self, resource: Resource, obj: Mapping[str, Any], *, forget: bool = False) -> bool:
        self.calls.append(("delete", resource.plural, obj["metadata"]["name"]))
        if forget:
            self.caches.store(resource).delete(key_of(obj))
        return True

    async def patch_status(self, resource: Resource, obj: Mapping[str, Any], ops: list[Any]) -> Obj | None:
        if not ops:
            return None
        self.calls.append(("status", resource.plural, obj["metadata"]["name"]))
        return self._answer(resource, obj)

    async def ensure_metadata(
        self,
        resource: Resource,
        obj: Obj,
        *,
        finalizer: str | None = None,
        owner_reference: Mapping[str, Any] | None = None,
    ) -> Obj:
        finalizers = list(obj["metadata"].get("finalizers") or [])
        if finalizer is None or finalizer in finalizers:
            return obj
        self.calls.append(("finalizer", resource.plural, obj["metadata"]["name"]))
        return self._answer(
            resource, {**obj, "metadata": {**obj["metadata"], "finalizers": [*finalizers, finalizer]}}
        )

    async def remove_finalizer(self, resource: Resource, obj: Obj, finalizer: str) -> Obj | None:
        self.calls.append(("unfinalize", resource.plural, obj["metadata"]["name"]))
        return obj


RESOLVED: list[Step] = [
    put("service", make_service()),
    put("helmrelease", make_helmrelease()),
    put("class", make_class()),
    put("namespace", NS_OBJ),
]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_a_pass_decides_again_at_once_after_its_mint() -> None:
    """The mint's answer is in the caches, so the same pass renders: one pass, not two. The status
    of a Service just created is held back (the load balancer's answer usually comes first)."""
    caches = caches_of(*RESOLVED, put("attachment", A))
    writer = RecordingWriter(caches)
    reconciler = controller.AttachmentReconciler(World(caches), writer, Clock())  # type: ignore[arg-type]
    assert await reconciler.reconcile(KA) == Result(requeue_after=controller.STATUS_HOLD_SECONDS)
    address = World(caches).held_address(caches.store(KINDS["attachment"]).get(KA) or {})
    assert address is not None
    assert writer.calls == [
        ("finalizer", "endpointattachments", "db-public"),
        ("create", "ipaddressallocations", address),
        ("create", "services", service_name("db-public")),
    ]


async def created_and_held() -> tuple[controller.AttachmentReconciler, RecordingWriter, StaticCaches, Clock]:
    """A's first pass: the Service is created, the status held back."""
    caches = caches_of(*RESOLVED, put("attachment", A))
    writer, clock = RecordingWriter(caches), Clock()
    reconciler = controller.AttachmentReconciler(World(caches), writer, clock)  # type: ignore[arg-type]
    await reconciler.reconcile(KA)
    writer.calls.clear()
    return reconciler, writer, caches, clock


async def test_the_load_balancers_answer_within_the_hold_is_the_one_status_write() -> None:
    reconciler, writer, caches, clock = await created_and_held()
    # Woken again meanwhile (our own Service's echo, say): still waiting, still held, nothing written.
    clock.now += 0.25
    assert await reconciler.reconcile(KA) == Result(requeue_after=controller.STATUS_HOLD_SECONDS - 0.25)
    assert writer.calls == []
    services = caches.store(KINDS["service"])
    ours = copy.deepcopy(services.get((NS, service_name("db-public"))) or {})
    address = ours["metadata"]["annotations"][METALLB_IPS_ANNOTATION]
    ours["status"] = {"loadBalancer": {"ingress": [{"ip": address}]}}
    services.upsert(ours)
    assert await reconciler.reconcile(KA) == Result()
    assert writer.calls == [("status", "endpointattachments", "db-public")]


async def test_without_an_answer_the_held_status_is_written_when_the_hold_runs_out() -> None:
    reconciler, writer, _, clock = await created_and_held()
    clock.now += controller.STATUS_HOLD_SECONDS
    assert await reconciler.reconcile(KA) == Result()
    assert writer.calls == [("status", "endpointattachments", "db-public")]


async def test_a_change_during_the_hold_is_reported_at_once() -> None:
    reconciler, writer, caches, _ = await created_and_held()
    caches.store(KINDS["namespace"]).upsert(NS_OBJ)
    caches.store(KINDS["class"]).upsert(make_class(allowed_namespaces={"matchLabels": {"team": "elsewhere"}}))
    assert await reconciler.reconcile(KA) == Result()
    assert writer.calls == [
        ("delete", "services", service_name("db-public")),  # dark: the namespace is not admitted
        ("status", "endpointattachments", "db-public"),
    ]


async def test_finalizing_releases_the_service_then_the_address_then_the_finalizer() -> None:
    deleting = make_attachment(uid="ea-a", deleting=True)
    deleting["metadata"]["finalizers"] = [controller.FINALIZER]
    ours = svc(service_name("db-public"), owner=deleting)
    caches = caches_of(
        *RESOLVED, put("attachment", deleting), put("service", ours), put("allocation", ALLOC_A)
    )
    writer = RecordingWriter(caches)
    reconciler = controller.AttachmentReconciler(World(caches), writer)  # type: ignore[arg-type]
    assert await reconciler.reconcile(KA) == Result()
    # The Service is asked to go; the address stays held until the Service is seen gone.
    assert writer.calls == [("delete", "services", service_name("db-public"))]
    assert caches.store(KINDS["allocation"]).get(("", "203.0.113.10")) is not None
    writer.calls.clear()
    caches.store(KINDS["service"]).delete((NS, service_name("db-public")))  # its deletion event
    assert await reconciler.reconcile(KA) == Result()
    assert writer.calls == [
        ("delete", "ipaddressallocations", "203.0.113.10"),
        ("unfinalize", "endpointattachments", "db-public"),
    ]
    assert caches.store(KINDS["allocation"]).get(("", "203.0.113.10")) is None  # forgotten at once


async def test_a_pass_that_does_not_settle_asks_to_run_again() -> None:
    """Every mint loses its race (the allocation appears held by another): after the bounded rounds
    the pass yields its worker and asks for another pass, with backoff."""
    caches = caches_of(*RESOLVED, put("attachment", A))
    writer = RecordingWriter(caches)

    async def lose(resource: Resource, body: Mapping[str, Any]) -> Obj:
        writer.calls.append(("create", resource.plural, body["metadata"]["name"]))
        other = {**body, "spec": {**body["spec"], "holder": {**body["spec"]["holder"], "uid": "another"}}}
        return writer._answer(resource, other)

    writer.create = lose  # type: ignore[method-assign]
    reconciler = controller.AttachmentReconciler(World(caches), writer)  # type: ignore[arg-type]
    assert await reconciler.reconcile(KA) == Result(requeue=True)
    assert [c[0] for c in writer.calls].count("create") == controller.MAX_ROUNDS_PER_PASS


async def test_a_claim_pass_mints_then_reports_bound_in_one_pass() -> None:
    claim = make_claim("fresh", address=None, phase=None)
    caches = caches_of(*RESOLVED, put("claim", claim))
    writer = RecordingWriter(caches)
    reconciler = controller.ClaimReconciler(World(caches), writer)  # type: ignore[arg-type]
    assert await reconciler.reconcile((NS, "fresh")) == Result()
    verbs = [(verb, plural) for verb, plural, _ in writer.calls]
    assert verbs == [
        ("finalizer", "ipaddressclaims"),
        ("create", "ipaddressallocations"),
        ("status", "ipaddressclaims"),
    ]


async def test_the_class_status_counts_its_allocations() -> None:
    caches = caches_of(put("class", make_class()), put("allocation", ALLOC_A), put("allocation", ALLOC_11))
    writer = RecordingWriter(caches)
    reconciler = controller.ClassReconciler(World(caches), writer)  # type: ignore[arg-type]
    assert await reconciler.reconcile(("", "public-v4")) == Result()
    assert writer.calls == [("status", "ipaddressclasses", "public-v4")]
