"""The GPUClass controller: what wakes the pass, the folds over the inventory, and one pass against a
fake API (status written only where it differs, Events on transitions, the KubeVirt grace period on
a timeout, the leader gate)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any, cast

import aiohttp
import pytest
from opentelemetry import trace
from prometheus_client import CollectorRegistry

from harness.manifests import load
from harness.memapi import MemApi
from operators.gpuclass.api import (
    DEVICE_CLASSES,
    DEVICE_TAINT_RULES,
    GPUCLASSES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
)
from operators.gpuclass.controller import (
    ALL_CLASSES,
    POD_FIELD_SELECTOR,
    NodeFold,
    PodFold,
    Reconciler,
    all_classes,
    all_classes_key,
    build,
    wiring,
)
from operators.gpuclass.inventory import Inventory
from operators.gpuclass.kubevirt import STALE_READ_GRACE, Found, NotInstalled, Unavailable
from operators.gpuclass.kubevirt_read import KUBEVIRT_VERBS, read_kubevirt
from operators.gpuclass.metrics import Metrics
from operators.gpuclass.settings import Settings
from shared.kube import ApiError, ApiTimeoutError, Kube
from shared.resources import EVENTS_V1, KUBEVIRTS, NODES, PODS, Resource
from shared.runtime.cache import Informer, Key, Obj, Store, key_of
from shared.runtime.controller import Conflict, Controller, NotLeader, StaticCaches
from shared.runtime.manager import Manager
from shared.runtime.metrics import ControllerMetrics, QueueMetrics
from shared.runtime.rbac import granted_rules
from shared.runtime.reads import Reads
from shared.runtime.writes import Writer
from shared.telemetry.tracing import Tracing
from tests.gpuclass_builders import (
    H200,
    L40S,
    gpu_pod,
    make_class,
    make_kubevirt_cr,
    make_node,
    make_pod,
    reference_classes,
    reference_kubevirt_cr,
    reference_nodes,
    reference_pods,
)

NOW = datetime.fromisoformat("2025-03-01T12:00:00+00:00")
SETTINGS = Settings(debounce_seconds=0.0)  # no hold: a woken key is ready at once


def stub(obj: Obj) -> Obj:
    """What a fold informer hands over for a deletion."""
    namespace, name = key_of(obj)
    return {"metadata": {"namespace": namespace, "name": name}}


# --- what wakes the pass --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (None, make_node("n1", allocatable={H200: "8"})),
        (None, gpu_pod("p", H200, 1, node="n1")),
        (stub(gpu_pod("p", H200, 1, node="n1")), None),
        (stub(make_node("n1")), None),
    ],
)
def test_a_node_or_pod_change_wakes_the_one_pass(old: Obj | None, new: Obj | None) -> None:
    version = new if new is not None else old
    assert version is not None
    assert list(all_classes(StaticCaches(), version)) == [ALL_CLASSES]


@pytest.mark.parametrize("name", ["h200", "l40s", "anything"])
def test_every_class_wakes_the_one_pass(name: str) -> None:
    assert all_classes_key(make_class(name, H200)) == ALL_CLASSES


STATUS = {"freeUnits": 4, "maxFreeUnitsPerNode": 2, "observedGeneration": 1}


@pytest.mark.parametrize(
    ("old", "new", "wakes"),
    [
        (None, make_class("a", H200), True),  # created
        (make_class("a", H200), None, True),  # deleted
        (make_class("a", H200), make_class("a", L40S, generation=2), True),  # spec changed
        (make_class("a", H200), make_class("a", H200, deleting=True), True),  # terminating
        (make_class("a", H200), make_class("a", H200, status=STATUS), False),  # our status write
    ],
)
def test_what_a_class_change_wakes(old: Obj | None, new: Obj | None, wakes: bool) -> None:
    c = controller(StaticCaches({GPUCLASSES: Store(), NODES: Store(), PODS: Store()}))
    deliver(c, GPUCLASSES, old, new)
    assert len(c.queue) == (1 if wakes else 0)


def test_the_wiring_declares_what_a_pass_writes() -> None:
    declared = {(w.resource, w.verbs, w.subresource) for w in wiring(SETTINGS, Inventory()).writes}
    assert declared == {(GPUCLASSES, ("patch",), "status"), (EVENTS_V1, ("create", "patch"), "")}
    assert set(wiring(SETTINGS, Inventory()).resources()) == {
        GPUCLASSES,
        NODES,
        PODS,
        DEVICE_CLASSES,
        RESOURCE_SLICES,
        RESOURCE_CLAIMS,
        DEVICE_TAINT_RULES,
    }


def test_the_cluster_role_grants_exactly_what_the_operator_declares() -> None:
    registry = CollectorRegistry()
    manager = Manager(cast(Kube, None), registry, Tracing(trace.NoOpTracerProvider(), "test"))
    build(manager, registry, SETTINGS)  # declared, never run: no request is made
    role = next(d for d in load("config/rbac/gpuclass/role.yaml") if d["kind"] == "ClusterRole")
    assert granted_rules(role) == manager.required_rules()


# --- the folds ------------------------------------------------------------------------------------


def test_node_fold_reports_what_moved_the_inventory() -> None:
    inventory = Inventory()
    fold = NodeFold(inventory)
    node = make_node("n1", allocatable={H200: "8"})
    assert fold.upsert(key_of(node), node) is True
    assert fold.upsert(key_of(node), node) is False  # nothing a pass reads changed
    assert list(fold.keys()) == [("", "n1")]
    assert fold.delete(("", "n1")) is True
    assert fold.delete(("", "n1")) is False
    assert list(fold.keys()) == []


def test_pod_fold_holds_only_pods_that_hold_resources() -> None:
    inventory = Inventory()
    fold = PodFold(inventory)
    gpu, cpu = gpu_pod("gpu", H200, 2, node="n1"), make_pod("cpu", node="n1")
    assert fold.upsert(key_of(gpu), gpu) is True
    assert fold.upsert(key_of(cpu), cpu) is False
    assert list(fold.keys()) == [key_of(gpu)]
    assert inventory.requested("n1", H200) == 2


def test_pod_fold_a_pod_recreated_under_its_name_replaces_the_old_life() -> None:
    inventory = Inventory()
    fold = PodFold(inventory)
    first = gpu_pod("vm", H200, 2, node="n1")
    second = gpu_pod("vm", H200, 1, node="n2")
    second["metadata"]["uid"] = "another-life"
    fold.upsert(key_of(first), first)
    assert fold.upsert(key_of(second), second) is True
    assert (inventory.requested("n1", H200), inventory.requested("n2", H200)) == (0, 1)
    assert fold.delete(key_of(second)) is True
    assert inventory.requested_on(H200) == {}


def replace(fold: NodeFold | PodFold, listed: Iterable[Obj]) -> None:
    """A re-list applied as the informer applies it: every listed object upserted, then every key
    the fold holds that the list did not name delivered as a deletion."""
    seen: set[Key] = set()
    for obj in listed:
        seen.add(key_of(obj))
        fold.upsert(key_of(obj), obj)
    for key in list(fold.keys()):
        if key not in seen:
            fold.delete(key)


def test_a_pod_missing_from_a_relist_is_released() -> None:
    inventory = Inventory()
    fold = PodFold(inventory)
    kept, missed = gpu_pod("kept", H200, 1, node="n1"), gpu_pod("missed", H200, 3, node="n1")
    replace(fold, [kept, missed])
    assert inventory.requested("n1", H200) == 4
    replace(fold, [kept])  # "missed" was deleted while the watch was down
    assert inventory.requested("n1", H200) == 1
    assert list(fold.keys()) == [key_of(kept)]


async def no_pause(seconds: float) -> None:
    return None


async def until(condition: Callable[[], bool]) -> None:
    """Once ``condition`` holds (the loop turned at most 10,000 times)."""
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("never")


def listed_selectors(api: MemApi) -> list[str]:
    return [r.params.get("fieldSelector", "") for r in api.requests if r.verb == "list"]


async def test_the_pod_informer_releases_a_pod_missing_from_a_relist() -> None:
    kept, missed = gpu_pod("kept", H200, 1, node="n1"), gpu_pod("missed", H200, 3, node="n1")
    api = MemApi()
    for pod in (kept, missed):
        api.seed(PODS, pod)
    inventory = Inventory()
    informer = Informer(api, PODS, fold=PodFold(inventory), field_selector=POD_FIELD_SELECTOR, sleep=no_pause)
    woken: list[Key] = []
    informer.add_handler(lambda old, new: woken.extend(all_classes(StaticCaches(), new or old or {})))
    task = asyncio.create_task(informer.run())
    try:
        await until(lambda: api.open_watches() == 1)
        # "missed" is deleted while no watch is open, and the API's history forgets it (410 Gone)
        api.end_watches()
        api.remove(PODS.path(*key_of(missed)))
        api.compact()
        await until(lambda: len(listed_selectors(api)) == 2 and api.open_watches() == 1)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert inventory.requested("n1", H200) == 1
    assert list(PodFold(inventory).keys()) == [key_of(kept)]
    assert woken == [ALL_CLASSES] * 3  # two pods folded in, one released
    assert listed_selectors(api) == [POD_FIELD_SELECTOR] * 2


def test_a_node_missing_from_a_relist_is_forgotten() -> None:
    inventory = Inventory()
    fold = NodeFold(inventory)
    replace(fold, [make_node("n1", allocatable={H200: "8"}), make_node("n2", allocatable={H200: "4"})])
    replace(fold, [make_node("n1", allocatable={H200: "8"})])
    assert set(inventory.advertisers(H200)) == {"n1"}


# --- one pass against a fake API -------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now


class World:
    """A reconciler over the reference fixture: the in-memory API holding the KubeVirt CR and the
    classes, the classes' cache (a real informer's store, not run: the writer's answers go into it),
    and what it reports."""

    def __init__(self, kubevirt: Obj | None = None, *, leader: bool = True) -> None:
        self.api = MemApi(clock=lambda: NOW)
        kubevirt = kubevirt if kubevirt is not None else reference_kubevirt_cr()
        location = {"namespace": SETTINGS.kubevirt_namespace, "name": SETTINGS.kubevirt_name}
        self.api.seed(KUBEVIRTS, {**kubevirt, "metadata": {**kubevirt.get("metadata", {}), **location}})
        self.inventory = Inventory()
        for node in reference_nodes():
            self.inventory.upsert_node(node)
        for pod in reference_pods():
            self.inventory.upsert_pod(pod, key_of(pod))
        self.classes = Store()
        for obj in reference_classes():
            self.classes.upsert(self.api.seed(GPUCLASSES, obj))
        self.informer = Informer(self.api, GPUCLASSES, store=self.classes)
        self.leader = leader
        self.clock = Clock()
        self.registry = CollectorRegistry()
        self.caches = StaticCaches({GPUCLASSES: self.classes, NODES: Store(), PODS: Store()})
        informers = {GPUCLASSES: self.informer}
        self.writer = Writer(self.api, informers.get, lambda: self.leader)
        self.reconciler = Reconciler(
            self.caches,
            self.writer,
            Reads(self.api, KUBEVIRTS, frozenset(KUBEVIRT_VERBS)),
            Tracing(trace.NoOpTracerProvider(), "test", ratio=1.0),
            self.inventory,
            Metrics(self.registry),
            SETTINGS,
            clock=self.clock,
        )

    @property
    def patches(self) -> list[tuple[str, Any]]:
        """The class status patches sent: (class, JSON patch)."""
        return [(r.target.name, r.body) for r in self.api.requests if r.verb == "patch"]

    @property
    def events(self) -> list[Obj]:
        """The Events sent."""
        return [r.body for r in self.api.requests if r.verb == "create" and r.target.plural == "events"]

    def status(self, name: str) -> dict[str, tuple[str, str]]:
        stored = self.classes.get(("", name)) or {}
        conditions = (stored.get("status") or {}).get("conditions") or []
        return {c["type"]: (c["status"], c["reason"]) for c in conditions}

    def sample(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)


async def test_a_pass_writes_each_differing_status_once_and_a_quiet_pass_writes_nothing() -> None:
    world = World()
    await world.reconciler.reconcile(ALL_CLASSES)
    written = sorted(name for name, _ in world.patches)
    assert written == sorted(c["metadata"]["name"] for c in reference_classes())
    for _, patch in world.patches:  # pinned to the class's incarnation
        assert patch[0] == {"op": "test", "path": "/metadata/uid", "value": patch[0]["value"]}
    assert world.status("h200-premium")["ResourceNameConflict"] == ("True", "ResourceNameInUse")
    assert world.status("h200")["Ready"] == ("True", "Ready")
    warnings = sorted((e["regarding"]["name"], e["reason"]) for e in world.events)
    assert warnings == [
        ("a10-24q", "NotPermitted"),
        ("h200-premium", "ResourceNameConflict"),
        ("rtx4090", "NotPermitted"),
    ]
    assert {e["metadata"]["namespace"] for e in world.events} == {"default"}
    assert world.sample("cozystack_gpuclass_free", gpuclass="h200", resource=H200) == 4
    fits = {
        units: world.sample("cozystack_gpuclass_fits", gpuclass="h200", resource=H200, units=units)
        for units in ("1", "2", "4", "8")
    }
    assert fits == {"1": 4, "2": 2, "4": 0, "8": 0}
    stored = world.classes.get(("", "h200"))
    assert stored is not None
    assert stored["status"]["fits"] == [
        {"units": 1, "vms": 4},
        {"units": 2, "vms": 2},
        {"units": 4, "vms": 0},
        {"units": 8, "vms": 0},
    ]
    assert stored["status"]["fitsSummary"] == "1:4 2:2 4:0 8:0"

    world.api.requests.clear()
    await world.reconciler.reconcile(ALL_CLASSES)
    assert (world.patches, world.events) == ([], [])
    assert world.sample("cozystack_gpuclass_pass_duration_seconds_count") == 2


async def test_our_own_status_writes_do_not_wake_the_pass() -> None:
    world = World()
    c = controller(world.caches, world.reconciler)
    for resource, handler in c.handlers():
        if resource == GPUCLASSES:
            world.informer.add_handler(handler)
    assert await c.reconcile_once(ALL_CLASSES) == "success"
    assert world.patches, "the first pass writes every status"
    assert len(c.queue) == 0


TIMEOUTS: list[BaseException] = [
    ApiTimeoutError("Timeout while waiting for the Kubernetes API server"),
    aiohttp.ServerDisconnectedError(),
    TimeoutError(),
    ApiError(503, "ServiceUnavailable", "etcd is restarting"),
]


@pytest.mark.parametrize("failure", TIMEOUTS, ids=lambda f: type(f).__name__)
async def test_a_timeout_keeps_the_last_kubevirt_read_for_the_grace_period(failure: BaseException) -> None:
    world = World()
    await world.reconciler.reconcile(ALL_CLASSES)
    assert world.status("h200")["KubeVirtPermitted"] == ("True", "Permitted")
    world.api.requests.clear()

    world.api.refuse(failure, verb="get", plural="kubevirts")
    world.clock.now = NOW + timedelta(minutes=1)
    await world.reconciler.reconcile(ALL_CLASSES)  # the outage begins: the last read still holds
    world.clock.now = NOW + timedelta(minutes=1) + STALE_READ_GRACE
    await world.reconciler.reconcile(ALL_CLASSES)  # the grace period's last moment
    assert world.patches == []
    assert world.status("h200")["KubeVirtPermitted"] == ("True", "Permitted")

    world.clock.now += timedelta(seconds=1)
    await world.reconciler.reconcile(ALL_CLASSES)
    assert world.status("h200")["KubeVirtPermitted"] == ("Unknown", "KubeVirtUnreadable")


@pytest.mark.parametrize("failure", TIMEOUTS, ids=lambda f: type(f).__name__)
async def test_read_kubevirt_maps_every_timeout_to_an_ongoing_outage(failure: BaseException) -> None:
    api = MemApi()
    location = {"namespace": "cozy-kubevirt", "name": "kubevirt"}
    api.seed(KUBEVIRTS, {**make_kubevirt_cr(), "metadata": location})
    api.refuse(failure, verb="get")
    kube = Reads(api, KUBEVIRTS, frozenset(KUBEVIRT_VERBS))
    first = await read_kubevirt(kube, "cozy-kubevirt", "kubevirt", Found(make_kubevirt_cr()), NOW)
    assert isinstance(first, Unavailable)
    assert first.since == NOW
    later = await read_kubevirt(kube, "cozy-kubevirt", "kubevirt", first, NOW + timedelta(minutes=1))
    assert isinstance(later, Unavailable)
    assert later.since == NOW  # the outage began with the first failure


async def test_read_kubevirt_absent_is_not_installed() -> None:
    kube = Reads(MemApi(), KUBEVIRTS, frozenset(KUBEVIRT_VERBS))
    assert isinstance(await read_kubevirt(kube, "cozy-kubevirt", "kubevirt", None, NOW), NotInstalled)


async def test_a_replica_that_does_not_lead_writes_nothing() -> None:
    world = World(leader=False)
    with pytest.raises(NotLeader):
        await world.reconciler.reconcile(ALL_CLASSES)
    assert (world.patches, world.events) == ([], [])
    assert world.sample("cozystack_gpuclass_pass_errors_total", stage="status_write") == 0


@pytest.mark.parametrize(
    ("refusal", "raised", "counted"),
    [
        (ApiError(422, "Invalid", "test failed"), Conflict, 0),  # recreated meanwhile: retried quietly
        (ApiError(500, "InternalError", "boom"), ApiError, 1),
    ],
)
async def test_one_refused_write_does_not_hold_back_the_others(
    refusal: ApiError, raised: type[Exception], counted: int
) -> None:
    world = World()
    world.api.refuse(refusal, verb="patch", name="l40s")
    with pytest.raises(raised):
        await world.reconciler.reconcile(ALL_CLASSES)
    assert world.status("h200")["Ready"] == ("True", "Ready")  # written all the same
    assert world.status("l40s") == {}
    assert world.sample("cozystack_gpuclass_pass_errors_total", stage="status_write") == counted


async def test_a_class_gone_under_the_pass_is_skipped() -> None:
    world = World()
    world.api.remove(GPUCLASSES.path(None, "h200-premium"))  # gone from the API, still cached
    await world.reconciler.reconcile(ALL_CLASSES)
    assert "h200-premium" not in {e["regarding"]["name"] for e in world.events}


async def test_an_event_the_api_refuses_does_not_fail_the_pass() -> None:
    world = World()
    world.api.refuse(ApiError(403, "Forbidden", "no events for you"), verb="create", plural="events")
    await world.reconciler.reconcile(ALL_CLASSES)
    assert world.status("h200-premium")["ResourceNameConflict"] == ("True", "ResourceNameInUse")


# --- helpers -----------------------------------------------------------------------------------------


class Idle:
    async def reconcile(self, key: Key) -> None:
        return None


def controller(caches: StaticCaches, reconciler: Reconciler | Idle | None = None) -> Controller:
    registry = CollectorRegistry()
    return Controller(
        wiring(SETTINGS, Inventory()),
        reconciler or Idle(),
        caches,
        metrics=ControllerMetrics(registry),
        queue_metrics=QueueMetrics(registry),
        tracing=Tracing(trace.NoOpTracerProvider(), "test", ratio=1.0),
    )


def deliver(c: Controller, resource: Resource, old: Obj | None, new: Obj | None) -> None:
    for watched, handler in c.handlers():
        if watched == resource:
            handler(old, new)
