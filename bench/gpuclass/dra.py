"""Scenario *dra*: the pure core with DRA GPUs and whole-VM shapes in the world; no server.

The world is *pure*'s (5,000 nodes, 150,000 pods, 100 classes), and besides: every node publishes
one ResourceSlice (a GPU node its GPUs, as NVIDIA's DRA driver would, one DeviceClass of full GPUs
per GPU model; every other node two NICs of another driver; every fourth GPU node dynamic MIG
instead: a counter slice with a counter set per GPU and a slice per GPU with the full GPU and 13
placements drawing on it), every GPU VM has a ResourceClaim (allocated on
its node when the VM is bound), every other class counts DRA devices (``spec.deviceClassName``)
instead of the device plugin's resource, and every class lists two whole-VM shapes (GPUs, CPU and
memory), so the inventory tracks every pod's CPU and memory.

Measures, in one run:

* one full pass (``decide``) from warm aggregates, the median of many: against *pure*'s pass over
  the same world without DRA and shapes, and ``json.loads`` of one pod event; and the first pass
  after the aggregates were filled, which computes every node's DRA offer;
* one event of each kind into the aggregates, the mean over rounds that leave them as found:
  a Pod event (status changes, half of the running GPU VMs stopping and starting again); a
  ResourceSlice republished unchanged (new resourceVersion: most slice events); a ResourceSlice whose
  devices changed (one GPU gone, then back: its selectors evaluated again); a vGPU node's slice of
  64 devices republished under a new pool generation, no device changed; a ResourceClaim
  deallocated and allocated again; each against ``json.loads`` of the very same events;
* the least any exact diff of a slice's devices reads: dict equality of a 64-device event's
  devices with those stored when it comes (a baseline, like ``json.loads``).

The pass must decide the same with the events' reversals done (asserted).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.gpuclass.pure import event_time, loads_time, median_time, sample_events
from harness.gpuclass_world import GPU_DRIVER, SHAPES, DraWorld, Obj, World, WorldSpec, build_world, with_dra
from harness.report import Row, seconds, times
from operators.gpuclass.dra import DraInventory
from operators.gpuclass.inventory import Inventory
from operators.gpuclass.kubevirt import Found
from operators.gpuclass.reconcile import decide

# The targets of the issue.
PASS_TARGET_SECONDS = 20e-3

# A slice of at most this many devices is a passthrough node's (the vGPU nodes' hold 32 to 64).
SMALL_SLICE = 9
VGPU_SLICE = 64  # the largest vGPU node's devices


@dataclass(frozen=True)
class DraOptions:
    world: WorldSpec = field(default_factory=WorldSpec)
    pass_runs: int = 50
    event_objects: int = 2_000  # slices and claims drawn for events; pods: twice this
    event_rounds: int = 7


@dataclass(frozen=True)
class DraResult:
    rows: list[Row]
    notes: list[str]


@dataclass(frozen=True)
class Figures:
    """What ``run`` timed, read by ``_rows``: seconds per pass or per event, and ``json.loads``."""

    classes: int
    dra_classes: int
    device_classes: int
    pass_seconds: float
    plain_seconds: float
    first_pass_seconds: float  # the pass right after the aggregates were filled: every DRA offer computed
    mig_nodes: int
    pod_events: int
    pod_seconds: float
    pod_loads: float
    same: float
    changed: float
    small: tuple[float, float]  # (upsert, json.loads) of slices of at most SMALL_SLICE devices
    large: tuple[float, float]
    renewed: tuple[float, float]
    judged: float
    claim: float
    slice_loads: float
    claim_loads: float
    equality: float


def run(options: DraOptions, say: Callable[[str], None]) -> DraResult:
    spec = options.world
    say(f"dra: generating the world ({spec.nodes:,} nodes, {spec.pods:,} pods, one slice per node)")
    world = build_world(spec)
    pods = list(world.pods())
    dra_world = with_dra(world, pods)
    view = Found(world.kubevirt_cr)

    say("dra: filling the aggregates (every pod's cpu and memory too) and the DRA inventory")
    plain = Inventory()
    inventory = Inventory(compute=True)
    for node in world.nodes:
        plain.upsert_node(node)
        inventory.upsert_node(node)
    for pod in pods:
        plain.upsert_pod(pod)
        inventory.upsert_pod(pod)
    dra = DraInventory()
    for device_class in dra_world.device_classes:
        dra.upsert_class(device_class)
    for slice_ in dra_world.slices:
        dra.upsert_slice(("", slice_["metadata"]["name"]), slice_)
    for claim in dra_world.claims:
        dra.upsert_claim(_key(claim), claim)

    say(f"dra: {options.pass_runs} full passes, with and without DRA and shapes")
    classes = dra_world.classes
    first_pass_seconds, decisions = median_time(lambda: decide(classes, inventory, view, dra), 1)
    pass_seconds, _ = median_time(lambda: decide(classes, inventory, view, dra), options.pass_runs)
    plain_seconds, _ = median_time(lambda: decide(world.classes, plain, view), options.pass_runs)

    say("dra: events of each kind, and json.loads of the same events")
    figures, allocated = _event_figures(options, world, pods, dra_world, inventory, dra)
    figures = dataclasses.replace(
        figures,
        classes=len(classes),
        dra_classes=sum(1 for c in classes if "deviceClassName" in c["spec"]),
        pass_seconds=pass_seconds,
        plain_seconds=plain_seconds,
        first_pass_seconds=first_pass_seconds,
        mig_nodes=len({s["spec"]["nodeName"] for s in dra_world.slices if s["spec"].get("sharedCounters")}),
    )
    assert decide(classes, inventory, view, dra) == decisions, "the events' reversals changed decisions"
    serving = sum(1 for d in decisions.values() if any(f.vms for f in d.status.fits if f.name))
    notes = [
        f"dra world: {len(dra_world.slices):,} ResourceSlices, {len(dra_world.claims):,} ResourceClaims "
        f"({allocated:,} allocated), {len(dra_world.device_classes)} DeviceClasses; "
        f"{serving} of {len(decisions)} classes fit some whole VM",
    ]
    return DraResult(_rows(options, figures), notes)


def _event_figures(
    options: DraOptions,
    world: World,
    pods: Sequence[Obj],
    dra_world: DraWorld,
    inventory: Inventory,
    dra: DraInventory,
) -> tuple[Figures, int]:
    """Each kind of event timed into the aggregates, with ``json.loads`` of the same events; the
    figures (the passes' left at 0) and how many claims are allocated."""
    rounds = options.event_rounds
    rng = random.Random(options.world.seed + 3)
    pod_events = sample_events(world, pods, options.event_objects * 2)
    pod_seconds = event_time(inventory, pod_events, rounds)
    gpu_slices = [
        s for s in dra_world.slices if s["spec"]["driver"] == GPU_DRIVER and s["spec"].get("devices")
    ]
    same, changed, judged = slice_events(rng.sample(gpu_slices, min(options.event_objects, len(gpu_slices))))

    def upserted(events: Sequence[Obj]) -> float:
        return _time(lambda e: dra.upsert_slice(_key(e), e), events, rounds)

    # The same by the slice's size: a passthrough node's few GPUs, a vGPU node's tens of devices.
    small = [e for e in changed if len(e["spec"]["devices"]) <= SMALL_SLICE]
    large = [e for e in changed if len(e["spec"]["devices"]) > SMALL_SLICE]
    same_seconds, changed_seconds = upserted(same), upserted(changed)
    small_seconds, large_seconds, judged_seconds = upserted(small), upserted(large), upserted(judged)
    renewed = renewed_events([s for s in gpu_slices if len(s["spec"]["devices"]) == VGPU_SLICE][: len(large)])
    renewed_seconds = upserted(renewed)
    equality_seconds = _equality_time(renewed, rounds)
    allocated = [c for c in dra_world.claims if (c.get("status") or {}).get("allocation")]
    claims = claim_events(rng.sample(allocated, min(options.event_objects, len(allocated))))
    claim_seconds = _time(lambda e: dra.upsert_claim(_key(e), e), claims, rounds)
    figures = Figures(
        classes=0,
        dra_classes=0,
        device_classes=len(dra_world.device_classes),
        pass_seconds=0.0,
        plain_seconds=0.0,
        first_pass_seconds=0.0,
        mig_nodes=0,
        pod_events=len(pod_events),
        pod_seconds=pod_seconds,
        pod_loads=loads_time(_texts(pod_events), rounds),
        same=same_seconds,
        changed=changed_seconds,
        small=(small_seconds, loads_time(_texts(small), rounds)),
        large=(large_seconds, loads_time(_texts(large), rounds)),
        renewed=(renewed_seconds, loads_time(_texts(renewed), rounds)),
        judged=judged_seconds,
        claim=claim_seconds,
        slice_loads=loads_time(_texts(changed), rounds),
        claim_loads=loads_time(_texts(claims), rounds),
        equality=equality_seconds,
    )
    return figures, len(allocated)


def _rows(options: DraOptions, f: Figures) -> list[Row]:
    pod = f.pod_seconds
    return [
        Row(
            f"full pass, {f.classes} classes ({f.dra_classes} DRA), {len(SHAPES)} whole-VM shapes each "
            f"(median of {options.pass_runs})",
            seconds(f.pass_seconds),
            f"≤ {seconds(PASS_TARGET_SECONDS)}",
            f.pass_seconds <= PASS_TARGET_SECONDS,
            f"this ÷ the pass without DRA and shapes = {times(f.pass_seconds / f.plain_seconds)}; "
            f"this = {times(f.pass_seconds / f.pod_loads)} json.loads of one pod event",
        ),
        Row(
            f"  the first pass after the aggregates were filled (every node's DRA offer computed; "
            f"{f.mig_nodes:,} nodes with dynamic MIG counters and placements)",
            seconds(f.first_pass_seconds),
            ratio=f"this ÷ the pass without DRA and shapes = {times(f.first_pass_seconds / f.plain_seconds)}",
        ),
        Row(
            f"pod event, cpu and memory tracked too (mean of {f.pod_events:,})",
            seconds(pod),
            ratio=f"this ÷ json.loads = {times(pod / f.pod_loads)}",
        ),
        _event_row("ResourceSlice event, republished unchanged", f.same, pod, f.slice_loads),
        _event_row("ResourceSlice event, a GPU gone or back", f.changed, pod, f.slice_loads),
        _event_row(
            f"  of which slices of at most {SMALL_SLICE} devices (passthrough nodes)",
            f.small[0],
            pod,
            f.small[1],
        ),
        _event_row(
            f"  of which slices of more than {SMALL_SLICE} devices (vGPU nodes: 32 to 64)",
            f.large[0],
            pod,
            f.large[1],
        ),
        _event_row(
            f"  ResourceSlice event, {VGPU_SLICE} devices: a new pool generation, no device changed",
            f.renewed[0],
            pod,
            f.renewed[1],
        ),
        Row(
            f"  ResourceSlice event, a GPU's attributes changed: judged by {f.device_classes} "
            "DeviceClasses of its driver",
            seconds(f.judged),
            ratio=f"this ÷ json.loads = {times(f.judged / f.slice_loads)}; "
            f"this ÷ a pod event = {times(f.judged / pod)}",
        ),
        _event_row("ResourceClaim event, deallocated or allocated", f.claim, pod, f.claim_loads),
        Row("baseline: the pass without DRA and shapes", seconds(f.plain_seconds)),
        Row("baseline: json.loads of one pod event", seconds(f.pod_loads)),
        Row("baseline: json.loads of one ResourceSlice event", seconds(f.slice_loads)),
        Row("baseline: json.loads of one ResourceClaim event", seconds(f.claim_loads)),
        Row(
            f"baseline: dict equality of a {VGPU_SLICE}-device slice's devices with the stored ones",
            seconds(f.equality),
            ratio=f"this ÷ a pod event = {times(f.equality / pod)}: what an exact diff reads",
        ),
    ]


def _event_row(figure: str, value: float, pod: float, loads: float) -> Row:
    return Row(
        figure,
        seconds(value),
        f"≤ a pod event ({seconds(pod)})",
        value <= pod,
        f"this ÷ json.loads = {times(value / loads)}; this ÷ a pod event = {times(value / pod)}",
    )


def _time(upsert: Callable[[Obj], object], events: Sequence[Obj], rounds: int) -> float:
    def one_round() -> None:
        for event in events:
            upsert(event)

    one_round()
    return median_time(one_round, rounds)[0] / len(events)


def _texts(events: Sequence[Obj]) -> list[str]:
    return [json.dumps({"type": "MODIFIED", "object": e}, separators=(",", ":")) for e in events]


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    metadata = obj["metadata"]
    return metadata.get("namespace", ""), metadata["name"]


def slice_events(slices: Sequence[Obj]) -> tuple[list[Obj], list[Obj], list[Obj]]:
    """For each slice: republished unchanged (twice); changed (its last device gone) then back; its
    first device's driver upgraded then downgraded (a device every DeviceClass must judge again)."""
    same: list[Obj] = []
    changed: list[Obj] = []
    judged: list[Obj] = []
    for slice_ in slices:
        spec = slice_["spec"]
        # Every object is new, as a decoded watch event's is; a spec change raises the generation.
        for bump in (1, 2):
            same.append(_bumped(slice_, bump, copy.deepcopy(spec)))
        fewer = copy.deepcopy(spec)
        fewer["devices"] = fewer["devices"][:-1]
        changed.append(_bumped(slice_, 3, fewer, generation=2))
        changed.append(_bumped(slice_, 4, copy.deepcopy(spec), generation=3))
        upgraded = copy.deepcopy(spec)
        upgraded["devices"][0]["attributes"]["driverVersion"] = {"version": "580.95.5"}
        judged.append(_bumped(slice_, 5, upgraded, generation=4))
        judged.append(_bumped(slice_, 6, copy.deepcopy(spec), generation=5))
    return same, changed, judged


def renewed_events(slices: Sequence[Obj]) -> list[Obj]:
    """For each slice: republished under a new pool generation, then the old one again; every device
    as it was (a spec change that changes no device)."""
    events: list[Obj] = []
    for slice_ in slices:
        for generation, pool_generation in ((6, 2), (7, 1)):
            spec = copy.deepcopy(slice_["spec"])
            spec["pool"]["generation"] = pool_generation
            events.append(_bumped(slice_, generation, spec, generation=generation))
    return events


def _equality_time(events: Sequence[Obj], rounds: int) -> float:
    """Dict equality of each event's devices with those of the event before it of the same slice."""
    pairs = [(e["spec"]["devices"], events[i ^ 1]["spec"]["devices"]) for i, e in enumerate(events)]

    def one_round() -> None:
        for new, stored in pairs:
            _ = new == stored

    return median_time(one_round, rounds)[0] / len(pairs)


def claim_events(claims: Sequence[Obj]) -> list[Obj]:
    """For each allocated claim: deallocated (its VM stopped), then allocated again."""
    events: list[Obj] = []
    for claim in claims:
        freed = {k: v for k, v in claim.items() if k != "status"}
        events.append(_bumped(freed, 1, copy.deepcopy(claim["spec"])))
        events.append(
            {**_bumped(claim, 2, copy.deepcopy(claim["spec"])), "status": copy.deepcopy(claim["status"])}
        )
    return events


def _bumped(obj: Obj, bump: int, spec: Obj, generation: int | None = None) -> Obj:
    metadata = dict(obj["metadata"])
    metadata["resourceVersion"] = str(int(metadata["resourceVersion"]) + bump)
    if generation is not None:
        metadata["generation"] = generation
    return {**obj, "metadata": metadata, "spec": spec}
