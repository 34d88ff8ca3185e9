"""The controller: predicates, the owner mapping, what wakes which key, and what a result does."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import time
from collections.abc import Iterable
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry

from shared.kube import ApiError
from shared.resources import Resource
from shared.runtime.cache import Key, Obj, Store
from shared.runtime.controller import (
    RESULT_ERROR,
    RESULT_REQUEUE,
    RESULT_REQUEUE_AFTER,
    RESULT_SUCCESS,
    Caches,
    Conflict,
    Controller,
    Memory,
    Owns,
    Result,
    StaticCaches,
    TerminalError,
    Watch,
    Wiring,
    any_change,
    decide,
    generation_changed,
    labels_changed,
    owner_key,
    reconciling,
    spec_or_metadata_changed,
    wrote,
)
from shared.runtime.metrics import ControllerMetrics, QueueMetrics
from shared.telemetry.tracing import Tracing

WIDGETS = Resource("example.io/v1", "widgets", kind="Widget")
GADGETS = Resource("v1", "gadgets")
PARTS = Resource("v1", "parts")
GEARS = Resource("v1", "gears")


def obj(name: str, namespace: str = "ns", **metadata: Any) -> Obj:
    return {"metadata": {"name": name, "namespace": namespace, **metadata}}


def owned_by(name: str, kind: str = "Widget", controller: bool = True, owner: str = "w1") -> Obj:
    reference = {"apiVersion": "example.io/v1", "kind": kind, "name": owner, "uid": "u1"}
    return obj(name, ownerReferences=[{**reference, "controller": controller}])


@pytest.mark.parametrize(
    ("predicate", "old", "new", "wakes"),
    [
        (any_change, obj("a"), obj("a"), True),
        (generation_changed, None, obj("a"), True),
        (generation_changed, obj("a"), None, True),
        (generation_changed, obj("a", generation=1), obj("a", generation=1, labels={"x": "y"}), False),
        (generation_changed, obj("a", generation=1), obj("a", generation=2), True),
        (generation_changed, obj("a", generation=1), obj("a", generation=1, deletionTimestamp="t"), True),
        (labels_changed, obj("a", labels={"x": "1"}), obj("a", labels={"x": "2"}), True),
        (labels_changed, obj("a", labels={"x": "1"}, generation=1), obj("a", labels={"x": "1"}), False),
        (spec_or_metadata_changed, obj("a", generation=1), obj("a", generation=1), False),
        (spec_or_metadata_changed, obj("a"), obj("a", finalizers=["f"]), True),
        (spec_or_metadata_changed, obj("a"), owned_by("a"), True),
    ],
)
def test_predicates(predicate: Any, old: Obj | None, new: Obj | None, wakes: bool) -> None:
    assert predicate(old, new) is wakes


@pytest.mark.parametrize(
    ("owned", "namespaced", "key"),
    [
        (owned_by("svc"), True, ("ns", "w1")),
        (owned_by("svc"), False, ("", "w1")),
        (owned_by("svc", kind="Other"), True, None),
        (  # the same kind in another API group is another kind
            {
                "metadata": {
                    **owned_by("svc")["metadata"],
                    "ownerReferences": [
                        {**owned_by("svc")["metadata"]["ownerReferences"][0], "apiVersion": "other.io/v1"}
                    ],
                }
            },
            True,
            None,
        ),
        (owned_by("svc", controller=False), True, None),
        (obj("svc"), True, None),
        (None, True, None),
    ],
)
def test_owner_key_names_the_controlling_primary(
    owned: Obj | None, namespaced: bool, key: Key | None
) -> None:
    primary = WIDGETS if namespaced else dataclasses.replace(WIDGETS, namespaced=False)
    assert owner_key(primary, owned) == key


def parts_of_gadget(caches: Caches, gadget: Obj) -> Iterable[Key]:
    """A map function: a gadget wakes the widgets named in its ``widgets`` label (the runtime maps
    the old and the new version both)."""
    for name in ((gadget.get("metadata") or {}).get("labels") or {}).get("widgets", "").split():
        yield "ns", name


WIRING = Wiring(
    name="widgets",
    primary=WIDGETS,
    predicates=(generation_changed,),
    owns=(PARTS, Owns(GEARS, (labels_changed,))),
    watches=(Watch(GADGETS, map=parts_of_gadget, predicates=(labels_changed,)),),
    workers=2,
)


class Recorder:
    def __init__(self, outcome: Any = None, expect: int = 0) -> None:
        self.keys: list[Key] = []
        self.outcome = outcome
        self.expect, self.reached = expect, asyncio.Event()

    async def reconcile(self, key: Key) -> Result | None:
        self.keys.append(key)
        if len(self.keys) >= self.expect:
            self.reached.set()
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome  # type: ignore[no-any-return]


def controller(
    reconciler: Recorder,
    registry: CollectorRegistry | None = None,
    tracing: Tracing | None = None,
    wiring: Wiring = WIRING,
) -> Controller:
    registry = registry or CollectorRegistry()
    widgets = Store()
    widgets.upsert(obj("w1"))  # the owner of the parts and gears below is cached
    caches = StaticCaches({WIDGETS: widgets, GADGETS: Store(), PARTS: Store(), GEARS: Store()})
    return Controller(
        wiring,
        reconciler,
        caches,
        metrics=ControllerMetrics(registry),
        queue_metrics=QueueMetrics(registry),
        tracing=tracing or Tracing(trace.NoOpTracerProvider(), "test", ratio=1.0),
    )


def deliver(c: Controller, resource: Resource, old: Obj | None, new: Obj | None) -> None:
    for watched, handler in c.handlers():
        if watched == resource:
            handler(old, new)


def test_wiring_lists_every_kind_it_reads_once() -> None:
    assert WIRING.resources() == (WIDGETS, PARTS, GEARS, GADGETS)


@pytest.mark.parametrize(
    ("resource", "old", "new", "woken"),
    [
        (WIDGETS, None, obj("w1"), 1),  # created
        (WIDGETS, obj("w1", generation=1), obj("w1", generation=1), 0),  # status only: filtered
        (WIDGETS, obj("w1", generation=1), None, 1),  # deleted
        (PARTS, None, owned_by("p1"), 1),  # owned: its controller
        (PARTS, None, obj("p1"), 0),  # not owned: nobody
        (PARTS, owned_by("p1", owner="gone"), None, 0),  # its owner not cached: nobody (GC, or later)
        (PARTS, owned_by("p1"), owned_by("p1"), 1),  # owned, no predicate: every change
        (GEARS, None, owned_by("g1"), 1),  # owned behind labels_changed: an add passes
        (GEARS, owned_by("g1"), owned_by("g1"), 0),  # ... a change of nothing it reads does not
        (
            GEARS,
            owned_by("g1"),
            {**owned_by("g1"), "metadata": {**owned_by("g1")["metadata"], "labels": {"a": "b"}}},
            1,
        ),
        (GADGETS, None, obj("g", labels={"widgets": "a b"}), 2),
        (GADGETS, obj("g", labels={"widgets": "a"}), obj("g", labels={"widgets": "b"}), 2),  # old and new
        (GADGETS, obj("g", labels={"widgets": "a"}), obj("g", labels={"widgets": "a"}), 0),  # predicate
    ],
)
def test_what_a_change_wakes(resource: Resource, old: Obj | None, new: Obj | None, woken: int) -> None:
    c = controller(Recorder())
    deliver(c, resource, old, new)
    assert len(c.queue) == woken


def test_a_pass_is_not_woken_by_its_own_write() -> None:
    c = controller(Recorder())
    with reconciling("widgets", ("ns", "w1")):
        deliver(c, PARTS, None, owned_by("p1"))  # the write-through of the pass over ns/w1
        deliver(c, GADGETS, None, obj("g", labels={"widgets": "w2"}))  # another key: woken
    assert len(c.queue) == 1


def test_our_write_carrying_someone_elses_spec_change_wakes_the_pass_again() -> None:
    """A spec change that landed between a pass's read and its write arrives first in our write's
    answer; the pass did not decide on it, so the key must run again (not be taken as our echo)."""
    c = controller(Recorder())
    c._read_generation[("ns", "w1")] = 1
    with reconciling("widgets", ("ns", "w1")):
        deliver(c, WIDGETS, obj("w1", generation=1), obj("w1", generation=1, finalizers=["f"]))
        assert len(c.queue) == 0  # our own metadata write: no self-wake
        deliver(c, WIDGETS, obj("w1", generation=1), obj("w1", generation=2))
    assert len(c.queue) == 1


def part(name: str, version: str) -> Obj:
    """A part of ns/w1 at a resourceVersion."""
    found = owned_by(name)
    found["metadata"]["resourceVersion"] = version
    return found


class WritesThenHears:
    """A pass over ns/w1 whose write of part p1 is answered at version 7, and which hears, from the
    informer's task (not its own), the change ``heard`` before the pass ends."""

    def __init__(self, c: Controller | None, heard: tuple[Obj | None, Obj | None]) -> None:
        self.c, self.heard = c, heard

    async def reconcile(self, key: Key) -> Result | None:
        assert self.c is not None
        contextvars.Context().run(deliver, self.c, PARTS, *self.heard)  # the watch event, first
        wrote(PARTS, part("p1", "7"))  # then the write's answer
        return None


# (what the pass heard while it ran, whether the key is queued again when it ends)
HEARD_DURING_A_PASS: list[tuple[str, tuple[Obj | None, Obj | None], bool]] = [
    ("the echo of its own write, come before the answer", (None, part("p1", "7")), False),
    ("its own object at another version: someone else's change", (part("p1", "7"), part("p1", "8")), True),
    ("another object at the same version", (None, part("p2", "7")), True),
    ("a deletion (no version of ours)", (part("p1", "7"), None), True),
]


@pytest.mark.parametrize(
    ("what", "heard", "again"), HEARD_DURING_A_PASS, ids=[c[0] for c in HEARD_DURING_A_PASS]
)
async def test_a_change_heard_during_a_pass_wakes_it_unless_its_own_echo(
    what: str, heard: tuple[Obj | None, Obj | None], again: bool
) -> None:
    reconciler = WritesThenHears(None, heard)
    c = controller(reconciler)  # type: ignore[arg-type]
    reconciler.c = c
    assert await c.reconcile_once(("ns", "w1")) == RESULT_SUCCESS
    assert len(c.queue) == (1 if again else 0)


def test_a_change_held_during_a_pass_counts_its_queue_time_from_the_change() -> None:
    c = controller(Recorder())
    key = ("ns", "w1")
    c._started[key] = 0.0  # the pass over ns/w1 is running
    before = time.monotonic()
    deliver(c, PARTS, part("p1", "7"), part("p1", "8"))
    heard = time.monotonic()
    assert len(c.queue) == 0  # held until the pass ends
    c._woken_during(key, written=set())  # the pass ends, later
    assert len(c.queue) == 1
    added = c.queue._metrics._added[key]  # type: ignore[union-attr]
    assert before <= added <= heard


async def test_a_debounced_queue_is_woken_during_a_pass_as_before() -> None:
    """Its hold folds bursts (echoes included) and starts at the change, not at the pass's end."""
    c = controller(Recorder(), wiring=dataclasses.replace(WIRING, debounce=0.5))
    c._started[("ns", "w1")] = 0.0  # the pass over ns/w1 is running
    deliver(c, PARTS, part("p1", "7"), part("p1", "8"))
    assert ("ns", "w1") in c.queue._held


@pytest.mark.parametrize(
    ("outcome", "label", "queued_later"),
    [
        (None, RESULT_SUCCESS, False),
        (Result(), RESULT_SUCCESS, False),
        (Result(requeue_after=30.0), RESULT_REQUEUE_AFTER, True),
        (Result(again=True), RESULT_REQUEUE, True),  # still asking after every decision
        (Conflict("stale"), RESULT_REQUEUE, True),
        (TerminalError("bad object"), RESULT_ERROR, False),
        (ApiError(500, "InternalError", "boom"), RESULT_ERROR, True),
        (ValueError("bug"), RESULT_ERROR, True),
    ],
)
async def test_what_a_result_does(outcome: Any, label: str, queued_later: bool) -> None:
    registry = CollectorRegistry()
    c = controller(Recorder(outcome), registry)
    assert await c.reconcile_once(("ns", "w1")) == label
    assert c.queue.retries(("ns", "w1")) == (
        1 if label in (RESULT_ERROR, RESULT_REQUEUE) and queued_later else 0
    )
    sample = registry.get_sample_value(
        "controller_runtime_reconcile_total", {"controller": "widgets", "result": label}
    )
    assert sample == 1
    terminal = registry.get_sample_value(
        "controller_runtime_terminal_reconcile_errors_total", {"controller": "widgets"}
    )
    assert terminal == (1 if isinstance(outcome, TerminalError) else 0)


async def test_a_pass_over_a_gone_object_forgets_its_link_to_the_previous_pass() -> None:
    """The last pass per key is remembered for the next pass's link; a key whose object is gone is
    forgotten, or every object ever reconciled would stay remembered."""
    tracing = Tracing(TracerProvider(), "test", ratio=1.0)
    c = controller(Recorder(), tracing=tracing)
    await c.reconcile_once(("ns", "w1"))  # cached
    await c.reconcile_once(("ns", "gone"))
    assert tracing.remembered() == 1


async def test_workers_reconcile_what_was_woken_before_they_started() -> None:
    recorder = Recorder(expect=2)
    c = controller(recorder)
    for name in ("a", "b", "a"):
        deliver(c, WIDGETS, None, obj(name))
    task = asyncio.create_task(c.run())
    try:
        await asyncio.wait_for(recorder.reached.wait(), timeout=5)
    finally:
        task.cancel()
    assert sorted(recorder.keys) == [("ns", "a"), ("ns", "b")]
    assert len(c.queue) == 0


async def test_workers_give_the_loop_back_between_passes_that_send_nothing() -> None:
    """Passes that never await anything (a settled world) must not starve the other tasks (the
    lease renewal): each pass ends with the loop given back."""
    recorder = Recorder(expect=50)
    c = controller(recorder)
    for n in range(50):
        deliver(c, WIDGETS, None, obj(f"w{n}"))
    passes_seen: list[int] = []

    async def other_task() -> None:
        while not recorder.reached.is_set():
            passes_seen.append(len(recorder.keys))
            await asyncio.sleep(0)

    task = asyncio.create_task(c.run())
    try:
        await asyncio.wait_for(asyncio.gather(other_task(), recorder.reached.wait()), timeout=5)
    finally:
        task.cancel()
    assert len(set(passes_seen)) > 10  # it ran between passes, not only before and after them


class Unsettled:
    """Asks ``again`` until it has been asked ``settles_after`` times."""

    def __init__(self, settles_after: int) -> None:
        self.settles_after, self.calls = settles_after, 0

    async def reconcile(self, key: Key) -> Result:
        self.calls += 1
        return Result(again=self.calls < self.settles_after)


@pytest.mark.parametrize(
    ("settles_after", "decisions", "again_counted", "label", "retries"),
    [
        (1, 1, 0, RESULT_SUCCESS, 0),  # settled at once
        (3, 3, 2, RESULT_SUCCESS, 0),  # a mint, then the claim seen: decided again in the same pass
        (9, 4, 4, RESULT_REQUEUE, 1),  # never settles: bounded, then again with backoff
    ],
)
async def test_decide_again_is_bounded_and_counted(
    settles_after: int, decisions: int, again_counted: int, label: str, retries: int
) -> None:
    registry = CollectorRegistry()
    reconciler = Unsettled(settles_after)
    c = Controller(
        WIRING,
        reconciler,
        StaticCaches({WIDGETS: Store()}),
        metrics=ControllerMetrics(registry),
        queue_metrics=QueueMetrics(registry),
        tracing=Tracing(trace.NoOpTracerProvider(), "test"),
    )
    assert await c.reconcile_once(("ns", "w1")) == label
    assert reconciler.calls == decisions
    assert c.queue.retries(("ns", "w1")) == retries
    counted = registry.get_sample_value("controller_runtime_decide_again_total", {"controller": "widgets"})
    assert counted == again_counted


async def test_decide_returns_the_first_settled_answer() -> None:
    assert await decide(Unsettled(2), ("ns", "w1")) == Result()


def test_a_memory_is_dropped_when_its_primary_s_deletion_is_delivered() -> None:
    memory: Memory[str] = Memory()
    c = Controller(
        WIRING,
        Recorder(),
        StaticCaches({WIDGETS: Store(), PARTS: Store(), GEARS: Store(), GADGETS: Store()}),
        metrics=ControllerMetrics(CollectorRegistry()),
        queue_metrics=QueueMetrics(CollectorRegistry()),
        tracing=Tracing(trace.NoOpTracerProvider(), "test"),
        forget=(memory.forget,),
    )
    memory.set(("ns", "w1"), "refused")
    memory.set(("ns", "w2"), "held")
    deliver(c, WIDGETS, obj("w1", generation=1), obj("w1", generation=2))  # a change: kept
    assert memory.get(("ns", "w1")) == "refused"
    deliver(c, WIDGETS, obj("w1", generation=2), None)  # deleted: forgotten
    assert memory.get(("ns", "w1")) is None
    assert memory.get(("ns", "w2")) == "held"
    assert len(memory) == 1
