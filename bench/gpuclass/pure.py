"""Scenario 1: the pure core in process, on a large synthetic cluster; no server.

Measures, in one run:

* one full pass (``decide`` over every class) from warm aggregates: the median of many passes;
  every class reports ``status.fits`` for the default four VM sizes. The same pass again with eight
  VM sizes per class, a different list for every class (so no class shares the per-group fit counts
  another computed): the cost of the fits at their worst, as a ratio to the default pass;
* one pod watch event into the aggregates (``Inventory.upsert_pod`` on a modified pod): the mean
  over a mix of GPU and other pods drawn like the cluster's pods are; each pod gets an event that
  changes its status (for half of the running GPU pods: the VM stopped, its units released) and
  then one that changes it back (units taken again), so every round leaves the aggregates as found;
* the aggregates' memory: tracemalloc around building the Inventory (as the operator keeps it: every
  bound pod's cpu and memory too, for whole-VM fits) from the whole world, with the
  world generated inside the traced window and dropped before the reading, so only what the
  Inventory keeps (and nothing the benchmark holds) is counted;
* one quantity parsed by ``operators.gpuclass.quantity`` (``parse_exact``, what pod events use, and
  ``parse_value``, what node allocatables use), against the official client's
  ``kubernetes.utils.parse_quantity`` (and that rounded up to an int), over two mixes drawn from the
  same pod events: the quantities the fold parses (extended resources of requests, limits not shadowed
  by a request, and overhead), and every quantity the pods' resources carry (cpu, memory, ...) plus
  canonical forms the world lacks (``512M``, hugepages, ``1k``, ...). Both parsers must give the same
  value for every quantity of both mixes, which is asserted; where they differ on purpose (text Go
  rejects, caps or rounds) is listed in a note.

Baselines from the same run, for the ratios: a naive pass that keeps no aggregates (for each class,
for each node offering its resource, the scheduler's request summed over every pod on that node; it
must agree with ``decide`` on every class's freeUnits, maxFreeUnitsPerNode and fits, which is
asserted, for the default sizes and for eight sizes per class),
and ``json.loads`` of the very watch events fed to the Inventory: the floor any Python operator pays
per event before its handler runs. ``parse_quantity`` is the baseline of the quantity rows: the
design prefers it to a parser of our own unless a figure says otherwise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import math
import random
import statistics
import sys
import time
import tracemalloc
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from fractions import Fraction
from typing import Any, TypeVar

from kubernetes.utils import parse_quantity as _untyped_parse_quantity

from harness.gpuclass_world import Obj, World, WorldSpec, build_world, is_gpu_pod, pod_status
from harness.report import Row, megabytes, seconds, times
from operators.gpuclass.inventory import Inventory
from operators.gpuclass.kubevirt import Found
from operators.gpuclass.quantity import parse_exact, parse_value
from operators.gpuclass.reconcile import DEFAULT_VM_SIZES, ClassDecision, decide
from operators.gpuclass.scheduling import (
    bound_node,
    eligible,
    is_extended_resource,
    parse_tolerations,
    pod_request,
)
from shared.conditions import rfc3339, status_patch

T = TypeVar("T")

# The targets of the brief.
PASS_TARGET_SECONDS = 20e-3
EVENT_TARGET_SECONDS = 20e-6
SPEEDUP_TARGET = 100.0
MEMORY_TARGET_BYTES = 100e6


@dataclass(frozen=True)
class PureOptions:
    world: WorldSpec = field(default_factory=WorldSpec)
    pass_runs: int = 50
    naive_runs: int = 3
    event_pods: int = 4_000  # pods sampled for events; each gets two events per round
    event_rounds: int = 7
    kubevirt_variant: bool = True  # also measure memory when plain VMs ask for devices.kubevirt.io/*


@dataclass(frozen=True)
class PureResult:
    rows: list[Row]
    notes: list[str]


@dataclass(frozen=True)
class Figures:
    """What ``_measure`` timed, read by ``_rows``."""

    classes: int
    nodes: int
    pods: int
    pass_seconds: float
    sized_seconds: float
    glue_seconds: float
    naive_seconds: float
    fill_seconds: float
    events: int
    gpu_events: int
    event_seconds: float
    gpu_event_seconds: float
    plain_event_seconds: float
    loads_seconds: float
    event_bytes: int  # the mean size of one event's text
    memory: Memory


def _measure(options: PureOptions, say: Callable[[str], None]) -> PureResult:
    spec = options.world
    say(f"pure: generating the world ({spec.nodes:,} nodes, {spec.pods:,} pods)")
    world = build_world(spec)
    pods = list(world.pods())
    say("pure: filling the aggregates under tracemalloc, then again untraced (the warm aggregates)")
    _, memory = traced_fill(world.nodes, pods)
    inventory, fill_seconds = fill(world.nodes, pods)
    view = Found(world.kubevirt_cr)

    say(f"pure: {options.pass_runs} full passes over {len(world.classes)} classes")
    decisions = decide(world.classes, inventory, view)
    pass_seconds, _ = median_time(lambda: decide(world.classes, inventory, view), options.pass_runs)
    glue_seconds = pass_with_status_diff(world.classes, inventory, view, decisions, options.pass_runs)

    say(f"pure: {options.pass_runs} full passes with {len(EIGHT_SIZES)} VM sizes per class")
    sized = with_eight_sizes(world.classes)
    sized_decisions = decide(sized, inventory, view)
    sized_seconds, _ = median_time(lambda: decide(sized, inventory, view), options.pass_runs)

    say(f"pure: {options.naive_runs} naive passes, checked against decide")
    naive_seconds, naive = median_time(
        lambda: naive_pass(world.classes, world.nodes, pods, world.kubevirt_cr), options.naive_runs
    )
    compared = check_naive(decisions, naive)
    check_naive(sized_decisions, naive_pass(sized, world.nodes, pods, world.kubevirt_cr))

    say("pure: pod events into the aggregates, and json.loads of the same events")
    events = sample_events(world, pods, options.event_pods)
    gpu_names = frozenset(r.name for r in world.resources)
    gpu_events = [e for e in events if is_gpu_pod(e, gpu_names)]
    plain_events = [e for e in events if not is_gpu_pod(e, gpu_names)]
    event_seconds = event_time(inventory, events, options.event_rounds)
    gpu_event_seconds = event_time(inventory, gpu_events, options.event_rounds)
    plain_event_seconds = event_time(inventory, plain_events, options.event_rounds)
    texts = [json.dumps({"type": "MODIFIED", "object": e}, separators=(",", ":")) for e in events]
    loads_seconds = loads_time(texts, options.event_rounds)
    after = decide(world.classes, inventory, view)
    assert after == decisions, "a round of events and their reversals changed the decisions"

    say("pure: quantities, ours against kubernetes.utils.parse_quantity, checked against each other")
    quantity = quantity_rows(events, options.event_rounds, event_seconds)
    figures = Figures(
        classes=len(world.classes),
        nodes=len(world.nodes),
        pods=len(pods),
        pass_seconds=pass_seconds,
        sized_seconds=sized_seconds,
        glue_seconds=glue_seconds,
        naive_seconds=naive_seconds,
        fill_seconds=fill_seconds,
        events=len(events),
        gpu_events=len(gpu_events),
        event_seconds=event_seconds,
        gpu_event_seconds=gpu_event_seconds,
        plain_event_seconds=plain_event_seconds,
        loads_seconds=loads_seconds,
        event_bytes=sum(map(len, texts)) // len(texts),
        memory=memory,
    )
    serving = sum(1 for d in decisions.values() if any(fit.vms for fit in d.status.fits))
    notes = [
        f"naive pass and decide agree on freeUnits, maxFreeUnitsPerNode and fits of all {compared} "
        f"classes ({serving} of them fit some VM), with the default sizes and with {len(EIGHT_SIZES)} "
        "sizes per class",
        *quantity.notes,
    ]
    return PureResult([*_rows(options, figures), *quantity.rows], notes)


def _rows(options: PureOptions, f: Figures) -> list[Row]:
    memory = f.memory
    return [
        Row(
            f"full pass over {f.classes} classes, warm aggregates (median of {options.pass_runs})",
            seconds(f.pass_seconds),
            f"≤ {seconds(PASS_TARGET_SECONDS)}",
            f.pass_seconds <= PASS_TARGET_SECONDS,
            f"naive ÷ this = {times(f.naive_seconds / f.pass_seconds)}; "
            f"this = {times(f.pass_seconds / f.loads_seconds)} json.loads of one event",
        ),
        Row(
            f"  the same pass, {len(EIGHT_SIZES)} VM sizes per class (a different list each)",
            seconds(f.sized_seconds),
            f"≤ {seconds(PASS_TARGET_SECONDS)}",
            f.sized_seconds <= PASS_TARGET_SECONDS,
            f"this ÷ pass with the default {len(DEFAULT_VM_SIZES)} sizes = "
            f"{times(f.sized_seconds / f.pass_seconds)}",
        ),
        Row(
            "  speed-up of the pass over the naive pass",
            times(f.naive_seconds / f.pass_seconds),
            f"≥ {times(SPEEDUP_TARGET)}",
            f.naive_seconds / f.pass_seconds >= SPEEDUP_TARGET,
        ),
        Row(
            f"pod event into aggregates, mean ({f.events:,} events a round, {f.gpu_events:,} GPU)",
            seconds(f.event_seconds),
            f"≤ {seconds(EVENT_TARGET_SECONDS)}",
            f.event_seconds <= EVENT_TARGET_SECONDS,
            f"this ÷ json.loads = {times(f.event_seconds / f.loads_seconds)}; "
            f"naive pass ÷ this = {times(f.naive_seconds / f.event_seconds)}",
        ),
        Row(
            "  of which GPU pods (half release, then retake units)",
            seconds(f.gpu_event_seconds),
            ratio=f"this ÷ json.loads = {times(f.gpu_event_seconds / f.loads_seconds)}",
        ),
        Row(
            "  of which cpu/memory-only pods",
            seconds(f.plain_event_seconds),
            ratio=f"this ÷ json.loads = {times(f.plain_event_seconds / f.loads_seconds)}",
        ),
        Row(
            f"aggregates' memory (tracemalloc; {memory.tracked_pods:,} pods hold units)",
            megabytes(memory.total),
            f"≤ {megabytes(MEMORY_TARGET_BYTES)}",
            memory.total <= MEMORY_TARGET_BYTES,
            f"{memory.total / max(memory.tracked_pods, 1):,.0f} B per tracked pod "
            f"({megabytes(memory.referenced)} of it strings of the objects fed)",
        ),
        Row("baseline: naive pass, recomputed from every pod", seconds(f.naive_seconds)),
        Row(
            f"baseline: json.loads of one pod watch event (mean of {f.event_bytes:,} B)",
            seconds(f.loads_seconds),
        ),
        Row(
            "context: pass + status diff of every class (nothing to write)",
            seconds(f.glue_seconds),
            ratio=f"naive ÷ this = {times(f.naive_seconds / f.glue_seconds)}",
        ),
        Row(
            f"context: initial fill, {f.nodes:,} nodes + {f.pods:,} pods",
            seconds(f.fill_seconds),
            ratio=f"{seconds(f.fill_seconds / (f.pods + f.nodes))} per object",
        ),
    ]


def run(options: PureOptions, say: Callable[[str], None]) -> PureResult:
    result = _measure(options, say)  # its world is gone before the next one is built
    if options.kubevirt_variant:
        spec = options.world
        say("pure: memory again, with plain VM pods asking for devices.kubevirt.io/* as on real KubeVirt")
        variant = build_world(dataclasses.replace(spec, kubevirt_devices_on_plain_vms=True))
        _, kv = traced_fill(variant.nodes, list(variant.pods()))
        result.rows.append(
            Row(
                f"context: memory if VMs without GPU ask for KubeVirt devices ({kv.tracked_pods:,} tracked)",
                megabytes(kv.total),
                ratio=f"{kv.total / max(kv.tracked_pods, 1):,.0f} B per tracked pod",
            )
        )
    return result


# --- the measured pieces --------------------------------------------------------------------------


def fill(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> tuple[Inventory, float]:
    # As the operator keeps it: every bound pod's cpu and memory too (whole-VM fits need them).
    inventory = Inventory(compute=True)
    started = time.perf_counter()
    for node in nodes:
        inventory.upsert_node(node)
    for pod in pods:
        inventory.upsert_pod(pod)
    return inventory, time.perf_counter() - started


@dataclass(frozen=True)
class Memory:
    traced: int  # allocated while building and still alive after it
    referenced: int  # older objects (strings of the pods and nodes fed) the inventory holds on to
    tracked_pods: int

    @property
    def total(self) -> int:
        return self.traced + self.referenced


def traced_fill(nodes: Sequence[Obj], pods: Iterable[Obj]) -> tuple[Inventory, Memory]:
    """Fill an Inventory under tracemalloc: what the filling allocated and is still alive, plus what
    the Inventory references among objects that existed before (the UID, node and resource name
    strings of the objects fed, which a decoded watch event would have allocated just for it)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        inventory, _ = fill(nodes, pods)
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0] - before
        referenced = sum(
            sys.getsizeof(obj)
            for obj in reachable(inventory)
            if tracemalloc.get_object_traceback(obj) is None
        )
    finally:
        tracemalloc.stop()
    return inventory, Memory(traced, referenced, inventory.tracked_pods())


def reachable(root: object) -> Iterator[object]:
    """Every object reachable from ``root`` through containers and instances, once; types, modules
    and functions (shared by the whole process) are not followed."""
    seen = {id(root)}
    stack = [root]
    while stack:
        obj = stack.pop()
        yield obj
        for child in gc.get_referents(obj):
            if id(child) in seen or isinstance(child, type | types.ModuleType | types.FunctionType):
                continue
            seen.add(id(child))
            stack.append(child)


def median_time(action: Callable[[], T], runs: int) -> tuple[float, T]:
    """The median duration of ``runs`` calls, and the last result. The collector is off while
    timing, as ``timeit`` has it: the benchmark's own 150,000 pods would otherwise make every full
    collection cost what the operator (which keeps no pods) never pays."""
    durations = []
    with collector_off():
        for _ in range(runs):
            started = time.perf_counter()
            result = action()
            durations.append(time.perf_counter() - started)
    return statistics.median(durations), result


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def pass_with_status_diff(
    classes: Sequence[Obj],
    inventory: Inventory,
    view: Found,
    decisions: Mapping[str, ClassDecision],
    runs: int,
) -> float:
    """A pass as the glue runs it, minus the I/O: decide, then diff each class's stored status."""
    now = rfc3339(datetime(2025, 3, 1, 12, tzinfo=UTC))
    stored = {name: stored_status(d, now) for name, d in decisions.items()}

    def once() -> None:
        for name, decision in decide(classes, inventory, view).items():
            status = decision.status
            ops = status_patch(stored[name], status.fields(), status.conditions, decision.generation, now)
            assert not ops, f"class {name}: the stored status differs: {ops}"

    return median_time(once, runs)[0]


def stored_status(decision: ClassDecision, now: str) -> Obj:
    """The status the operator would have stored for ``decision``."""
    ops = status_patch(None, decision.status.fields(), decision.status.conditions, decision.generation, now)
    status: Obj = {}
    for op in ops:
        path = op["path"].removeprefix("/status").lstrip("/")
        if path:
            status[path] = op["value"]
    return status


def sample_events(world: World, pods: Sequence[Obj], count: int) -> list[Obj]:
    """Two watch events for each of ``count`` pods drawn at random: a changed status, then the
    original one again (both with new resourceVersions). Every event object is new; the pods'
    specs are shared with the world's pods, since an upsert only reads."""
    rng = random.Random(world.spec.seed + 2)
    gpu_names = frozenset(r.name for r in world.resources)
    chosen = rng.sample(range(len(pods)), count)
    changed: list[Obj] = []
    restored: list[Obj] = []
    for n, index in enumerate(chosen):
        pod = pods[index]
        status = pod["status"]
        containers = pod["spec"]["containers"]
        if status["phase"] == "Running" and is_gpu_pod(pod, gpu_names) and n % 2 == 0:
            new_status = pod_status("Succeeded", containers, status["hostIP"], status["podIP"])  # VM stopped
        else:
            new_status = {**status, "conditions": [_touched(c) for c in status["conditions"]]}
        changed.append(_event_object(pod, new_status, 1))
        restored.append(_event_object(pod, status, 2))
    return changed + restored


def _touched(condition: Obj) -> Obj:
    """The condition after a readiness probe flipped it (other conditions: probed again)."""
    if condition["type"] in ("Ready", "ContainersReady"):
        flipped = "False" if condition["status"] == "True" else "True"
        return {**condition, "status": flipped, "lastTransitionTime": "2025-03-01T11:00:00Z"}
    return {**condition, "lastProbeTime": "2025-03-01T11:00:00Z"}


def _event_object(pod: Obj, status: Obj, bump: int) -> Obj:
    metadata = dict(pod["metadata"])
    metadata["resourceVersion"] = str(int(metadata["resourceVersion"]) + bump)
    return {**pod, "metadata": metadata, "status": status}


def event_time(inventory: Inventory, events: Sequence[Obj], rounds: int) -> float:
    """The median over rounds of the mean time of one ``upsert_pod``, after one round of warm-up."""
    upsert = inventory.upsert_pod

    def one_round() -> None:
        for event in events:
            upsert(event)

    one_round()
    return median_time(one_round, rounds)[0] / len(events)


def loads_time(texts: Sequence[str], rounds: int) -> float:
    loads = json.loads

    def one_round() -> None:
        for text in texts:
            loads(text)

    return median_time(one_round, rounds)[0] / len(texts)


# --- quantities: ours against the official client's ----------------------------------------------

# Canonical forms (what the API server stores) that a Pod's resources carry and the world lacks.
EXTRA_QUANTITIES: tuple[str, ...] = (
    *("0", "1", "2", "4", "8", "16", "110", "250", "1k", "4k"),  # counts: extended resources, devices
    *("1m", "5m", "25m", "100m", "250m", "500m", "1500m", "2500m", "127500m"),  # cpu
    *("35M", "128M", "512M", "1G", "64Ki", "100Ki", "128Mi", "1536Mi", "1Gi", "10Gi", "1Ti"),  # memory
    *("2Mi", "512Mi", "2Gi", "40Gi"),  # hugepages-2Mi / hugepages-1Gi amounts
    *("1M", "80G", "141G", "1Ei", "9223372036854775807"),  # large: device memory, int64's largest
)
# Text the two parsers answer differently on purpose: Go's resource.ParseQuantity rejects it (and so
# do we), or Go caps or rounds it (and so do we), while parse_quantity follows Python's Decimal. The
# API server stores none of it. Shown in a note, never timed.
DIFFERENT_ON_PURPOSE: tuple[str, ...] = (
    *("-1", "1K", " 1", "1 Gi", "1_000", "\u0661", "Infinity", "NaN"),  # negative, or not Go's grammar
    *("1e999", "1e-30"),  # above int64 (Go and we cap), below a nano (Go and we round up to 1n)
)
# Garbage both reject: the cross-check covers it too.
BOTH_REJECT: tuple[str, ...] = ("", "abc", "1ki", "1.2.3", "0x10", "Gi", "+", ".")


# The official client's parser (``ValueError`` for garbage): the exact value, as a Decimal. Typed by
# this binding, not by a wrapper, which would add a call to its side of the timings.
parse_quantity: Callable[[str], Decimal] = _untyped_parse_quantity


def quantity_value(text: str) -> int:
    """``parse_quantity`` rounded up to an int: what ``parse_value`` (Go's ``Value()``) returns."""
    return math.ceil(parse_quantity(text))


@dataclass(frozen=True)
class QuantityMixes:
    fold: list[str]  # what upsert_pod parses for these events, in order, repeats kept
    resources: list[str]  # every quantity of the events' resources, plus EXTRA_QUANTITIES


def quantity_mixes(events: Sequence[Obj]) -> QuantityMixes:
    """The quantity texts of the pod events: those the fold parses (extended resources: requests, a
    limit without a request, overhead), and all of them (every resource name), repeats kept."""
    fold: list[str] = []
    every: list[str] = []
    for pod in events:
        spec = pod.get("spec") or {}
        lists: list[tuple[Mapping[str, Any], Mapping[str, Any]]] = []
        for container in (*(spec.get("containers") or ()), *(spec.get("initContainers") or ())):
            resources = container.get("resources") or {}
            requests = resources.get("requests") or {}
            lists += [(requests, {}), (resources.get("limits") or {}, requests)]
        lists.append((spec.get("overhead") or {}, {}))
        for listed, shadowed in lists:
            for name, text in listed.items():
                every.append(text)
                if is_extended_resource(name) and name not in shadowed:
                    fold.append(text)
    return QuantityMixes(fold, every + list(EXTRA_QUANTITIES))


def check_quantities(texts: Iterable[str]) -> int:
    """Assert both parsers agree on every text: the same exact value and the same value rounded up,
    or both reject it. The number of distinct texts checked."""
    distinct = set(texts)
    for text in distinct:
        exact, value = parse_exact(text), parse_value(text)
        try:
            theirs = parse_quantity(text)
        except ValueError:
            assert (exact, value) == (None, None), f"{text!r}: parse_quantity rejects it, we {exact}"
            continue
        assert exact == Fraction(theirs), f"{text!r}: we give {exact}, parse_quantity {theirs}"
        assert value == quantity_value(text), f"{text!r}: we give {value}, parse_quantity {theirs} up"
    return len(distinct)


def differences(texts: Iterable[str]) -> list[str]:
    """``text: ours vs theirs`` for each text where the two parsers give different values."""
    out = []
    for text in texts:
        exact = parse_exact(text)
        try:
            theirs: Decimal | None = parse_quantity(text)
        except ValueError:
            theirs = None
        same = (
            exact is None
            if theirs is None
            else exact is not None and theirs.is_finite() and exact == Fraction(theirs)
        )
        if not same:
            out.append(f"{text!r}: {'rejected' if exact is None else exact} vs {theirs or 'rejected'}")
    return out


def per_call_times(
    parsers: Sequence[Callable[[str], object]], texts: Sequence[str], rounds: int
) -> list[float]:
    """For each parser, the median over rounds of the mean time of one call, after a round of
    warm-up. The parsers take turns within each round (each round in another order), and the time is
    this process's CPU time: a machine busy with something else slows them alike, and less."""
    durations: list[list[float]] = [[] for _ in parsers]
    order = list(range(len(parsers)))
    with collector_off():
        for n in range(rounds + 1):
            for index in order[n % len(order) :] + order[: n % len(order)]:
                parse = parsers[index]
                started = time.process_time()
                for text in texts:
                    parse(text)
                if n:  # the first round warms up
                    durations[index].append(time.process_time() - started)
    return [statistics.median(d) / len(texts) for d in durations]


def quantity_rows(events: Sequence[Obj], rounds: int, event_seconds: float) -> PureResult:
    """Rows timing both parsers on both mixes, after asserting they agree on every quantity."""
    mixes = quantity_mixes(events)
    checked = check_quantities([*mixes.fold, *mixes.resources, *BOTH_REJECT])
    different = differences(DIFFERENT_ON_PURPOSE)
    assert len(different) == len(DIFFERENT_ON_PURPOSE), f"not all differ as expected: {different}"
    per_event = len(mixes.fold) / len(events)
    rows: list[Row] = []
    for label, mix in (
        (f"the fold's (extended resources, {per_event:.2f} per pod event)", mixes.fold),
        ("every quantity of the pods' resources", mixes.resources),
    ):
        exact, value, theirs, theirs_value = per_call_times(
            (parse_exact, parse_value, parse_quantity, quantity_value), mix, rounds
        )
        effect = ""
        if mix is mixes.fold:  # what switching would do to one pod event of the fold
            shift = (theirs - exact) * per_event
            effect = (
                f"; parse_quantity instead: {'+' if shift >= 0 else '-'}{seconds(abs(shift))} "
                f"on a {seconds(event_seconds)} pod event"
            )
        rows += [
            Row(
                f"quantity, {label}: parse_exact, mean of {len(mix):,}",
                seconds(exact),
                ratio=f"parse_quantity ÷ this = {times(theirs / exact)}{effect}",
            ),
            Row(
                "  parse_value (rounded up to an int)",
                seconds(value),
                ratio=f"ceil(parse_quantity) ÷ this = {times(theirs_value / value)}",
            ),
            Row(
                "  baseline: kubernetes.utils.parse_quantity (a Decimal)",
                seconds(theirs),
                ratio=f"rounded up to an int: {seconds(theirs_value)}",
            ),
        ]
    notes = [
        f"parse_exact/parse_value and kubernetes.utils.parse_quantity agree on all {checked:,} distinct "
        "quantities of both mixes (same exact value and same value rounded up, or both reject it)",
        "they differ on purpose (ours vs parse_quantity: ours follows Go, which rejects these, caps at "
        f"int64 and rounds up to one nano): {'; '.join(different)}",
    ]
    return PureResult(rows, notes)


# --- the naive reference --------------------------------------------------------------------------


# What the naive pass gives each class: freeUnits, maxFreeUnitsPerNode, and (units, vms) per size.
NaiveFigures = tuple[int, int, tuple[tuple[int, int], ...]]


def naive_pass(
    classes: Iterable[Mapping[str, Any]],
    nodes: Sequence[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    kubevirt_cr: Mapping[str, Any],
) -> dict[str, NaiveFigures]:
    """freeUnits, maxFreeUnitsPerNode and fits of every live class, recomputed from every pod: no
    aggregates.

    Written from the design's rules, not from ``decide``: the oldest class by (creationTimestamp,
    name) owns a resource name, the others offer 0; a node counts when it is eligible and lists the
    resource in its allocatable; its free units are its allocatable minus the requests of the
    unfinished pods bound to it, clamped at 0. A size of ``spec.vmSizes`` (default 1, 2, 4, 8) fits
    ``free // size`` VMs on each such node, and none at all when the class cannot serve: it does not
    own its name, its name is not in the KubeVirt CR's ``permittedHostDevices``, or no such node
    advertises a unit.
    """
    configuration = kubevirt_cr["spec"]["configuration"]["permittedHostDevices"]
    permitted = {
        d["resourceName"] for d in (*configuration["pciHostDevices"], *configuration["mediatedDevices"])
    }
    live = [
        c
        for c in classes
        if not c["metadata"].get("deletionTimestamp") and (c.get("spec") or {}).get("resourceName")
    ]
    owner: dict[str, tuple[str, str]] = {}
    for c in live:
        key = (c["metadata"].get("creationTimestamp") or "\uffff", c["metadata"]["name"])
        resource = c["spec"]["resourceName"]
        owner[resource] = min(owner.get(resource, key), key)

    pods_on: dict[str, list[Mapping[str, Any]]] = {}
    for pod in pods:
        node_name = bound_node(pod)
        if node_name is not None:
            pods_on.setdefault(node_name, []).append(pod)

    result: dict[str, NaiveFigures] = {}
    for c in live:
        name, resource = c["metadata"]["name"], c["spec"]["resourceName"]
        tolerations = parse_tolerations(c["spec"].get("tolerations"))
        sizes = sorted(c["spec"].get("vmSizes") or (1, 2, 4, 8))
        total = largest = 0
        vms = dict.fromkeys(sizes, 0)
        offered = False
        for node in nodes:
            allocatable = (node.get("status") or {}).get("allocatable") or {}
            if resource not in allocatable or not eligible(node, tolerations):
                continue
            requested = sum(pod_request(p, resource) for p in pods_on.get(node["metadata"]["name"], ()))
            units = parse_value(allocatable[resource]) or 0
            free = max(0, units - requested)
            offered = offered or units >= 1
            total += free
            largest = max(largest, free)
            for size in sizes:
                vms[size] += free // size
        owns = owner[resource][1] == name
        if not (owns and resource in permitted and offered):
            vms = dict.fromkeys(sizes, 0)
        figures = (total, largest) if owns else (0, 0)
        result[name] = (*figures, tuple(vms.items()))
    return result


def check_naive(decisions: Mapping[str, ClassDecision], naive: Mapping[str, NaiveFigures]) -> int:
    """Assert the naive pass and ``decide`` agree on every class; the number of classes compared."""
    assert set(decisions) == set(naive), f"different classes: {set(decisions) ^ set(naive)}"
    for name, decision in decisions.items():
        status = decision.status
        fits = tuple((fit.units, fit.vms) for fit in status.fits)
        got = (status.free_units, status.max_free_units_per_node, fits)
        assert got == naive[name], f"class {name}: decide says {got}, the naive pass {naive[name]}"
    assert any(free for free, _, _ in naive.values()), "every class has 0 free units: proves nothing"
    assert any(vms for *_, fits in naive.values() for _, vms in fits[1:]), "no VM above 1 unit fits"
    return len(decisions)


# Eight VM sizes, from 1-unit VMs up to sizes larger than any node, as a hoster of vGPU profiles
# might list; class ``i`` gets the largest one plus ``i``, so no two classes share a list.
EIGHT_SIZES: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 16, 32)


def with_eight_sizes(classes: Sequence[Obj]) -> list[Obj]:
    """The classes, each with its own eight ``spec.vmSizes``."""
    return [
        {**c, "spec": {**c["spec"], "vmSizes": [*EIGHT_SIZES[:-1], EIGHT_SIZES[-1] + i]}}
        for i, c in enumerate(classes)
    ]
