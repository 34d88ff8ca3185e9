"""Scenario ``coldstart``: the operator's start on thousands of settled attachments, against a plain
paged LIST of the same objects.

The benchmark fills a fresh local control plane of its own (as the GPUClass cold start does: no
other scenario's leftovers) with ``COLD_ATTACHMENTS`` EndpointAttachments (5,000, issue 18's
envelope), settled: the applications (``attach.install_world``: a HelmRelease, an endpoint Service
and a Ready Pod each) and their IPAddressClass, then every attachment created and made Provisioned
by one warm-up operator process, with ``harness.standin.StandIn`` playing the address substrate and the load
balancer (the documented model and MetalLB settle about 1.5 attachments a second; the stand-in
writes the same objects and statuses at the API's pace). Each attachment then has its minted claim,
its bound ``IPAddress`` and its rendered LoadBalancer Service with the address in its ingress (and,
from the control plane's controllers, the Service's Endpoints and EndpointSlice). The warm-up
operator is stopped (SIGTERM: it hands the Lease over); the world stays as it is. Each rendered
Service takes a health-check NodePort, so that control plane's API server runs with the NodePort
range ``COLD_NODE_PORT_RANGE`` (10,000 ports; Kubernetes' default has 2,768), and a run asking for
more attachments than its range has ports (``node_ports``) is refused before any control plane
starts. Then, in turns:

* **baseline**: a plain paged LIST, in a fresh process (``listing``), of every kind the operator's
  informers list (read from its wiring), with their field selectors and page size, all at once,
  each page parsed by the same client and dropped; timed from the process's spawn to the last page,
  as the operator is timed from its spawn (both pay an interpreter, their imports and a connection;
  the operator's heavier imports are its own). The LIST alone, connecting not counted (the GPUClass
  cold start's baseline), is shown beside it;
* **operator**: the operator process spawned; the time from the spawn until its own metrics say
  that every attachment was reconciled once and nothing is left (``drained``:
  ``controller_runtime_reconcile_total`` of the attachments' controller at least the number of
  attachments, ``workqueue_depth`` 0, no worker active), polled with the metrics server's ``name[]``
  filter so the poll runs none of the operator's collectors. The API server's own count of write
  requests (``apiserver_request_total``, every verb that writes, every resource but Leases, which
  leader election and the controller manager renew) over the turn must be 0: a settled world gives
  a cold start nothing to write.

Each turn's ratio operator ÷ baseline is taken (the machine's load drifts between turns, less within
one) and the median turn's has the target ``TARGET_RATIO``. Context: the logged steps of the start
(started, caches synced, leading), both processes' CPU, the operator's VmRSS and VmHWM when it
has drained, and per attachment: (VmRSS - the warm-up operator's VmRSS on the world before any
attachment) ÷ attachments.

Decides: the cold-start figures, their targets and the shape of the filled world. Does not: measure
attachments converging (``attach``), or change the operator's wiring (the baseline reads it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import httpx

from bench.endpointattachment import attach
from bench.endpointattachment.listing import COMMAND, LISTS
from bench.gpuclass.plainlist import PAGE_SIZE
from harness.apimetrics import ApiServerMetrics, RequestKey
from harness.bulk import pool, retrying
from harness.controlplane import on_own_control_plane
from harness.ea_cluster import CRD_FILES
from harness.manifests import ROOT, apply_all, load
from harness.operators import RunningOperator, operator_process
from harness.oplog import check_log, log_tail, profile_summary
from harness.oplog import steps as logged_steps
from harness.procfs import cpu_seconds
from harness.report import MULTIPLY, Row, duration, ratio
from harness.standin import StandIn, following
from harness.streams import supervised
from operators.endpointattachment.api import ATTACHMENTS, CLASSES
from operators.endpointattachment.controller import ATTACHMENT_CONTROLLER
from shared.kube import Kube, Obj

COLD_ATTACHMENTS: Final = 5_000  # issue 18: one replica's envelope
# Every rendered Service (LoadBalancer, externalTrafficPolicy Local) takes a health-check NodePort, and
# kube-apiserver's default --service-node-port-range (30000-32767) has 2,768 ports: a 5,000 run on it
# stopped at exactly 2,768 Provisioned ("failed to allocate a HealthCheck NodePort: range is full").
# So the bench's own control plane gets a range wide enough for COLD_ATTACHMENTS twice over (nothing
# listens on a NodePort there: no kube-proxy). It overlaps Linux's ephemeral ports, harmless for the
# same reason; a cluster that serves traffic would pick its range with more care.
COLD_NODE_PORT_RANGE: Final = "30000-39999"
HIGHEST_PORT: Final = 65535  # the last TCP port: no range reaches past it
COLD_APPS: Final = 20  # applications whose endpoints the attachments publish (round robin)
COLD_RUNS: Final = 3  # turns of (baseline LIST, operator start); the median turn's ratio is the figure
# The warm-up operator's --workers: its passes wait on the API server (a mint, a create, each 0.1-1 s on
# a loaded machine), not on its CPU, so more of them settle the world sooner.
FILL_WORKERS: Final = 16
COLD_CONCURRENCY: Final = 8  # attachment creates in flight while filling (the API server is shared)
TARGET_RATIO: Final = 2.0  # issue 18: cold start at most 2x a LIST of the same objects
WRITES_TARGET: Final = 0  # a settled world: a cold start writes nothing
FILL_TIMEOUT_SECONDS: Final = 1_800.0  # every attachment Provisioned by the warm-up operator
START_TIMEOUT_SECONDS: Final = 300.0  # one start, spawn to drained
POLL_SECONDS: Final = 0.05  # the interval of the bounded poll of the operator's metrics
PROGRESS_SECONDS: Final = 30.0  # how often the fill says how far it is
LEASE_NAMESPACE: Final = "default"
CONTROLLER: Final = ATTACHMENT_CONTROLLER.name  # its queue carries the same name
# The samples ``drained`` reads (the metrics server serves only these to the poll).
RECONCILES: Final = "controller_runtime_reconcile_total"
DEPTH: Final = "workqueue_depth"
ACTIVE: Final = "controller_runtime_active_workers"
LEADER: Final = "leader_election_master_status"
DRAIN_SAMPLES: Final = (RECONCILES, DEPTH, ACTIVE, LEADER)
SYNCED: Final = "caches synced:"  # the manager's log line once every informer has listed
# The verbs of apiserver_request_total that change something; Leases are renewed by whoever leads.
WRITE_VERBS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE", "APPLY", "DELETECOLLECTION"})
UNCOUNTED_RESOURCES: Final = frozenset({"leases"})
KIB: Final = 1024

Samples = Mapping[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass(frozen=True)
class ColdOptions:
    attachments: int = COLD_ATTACHMENTS
    apps: int = COLD_APPS
    runs: int = COLD_RUNS
    concurrency: int = COLD_CONCURRENCY
    workers: int = 8  # the operator's --workers
    fill_workers: int = FILL_WORKERS  # the warm-up operator's
    fill_timeout: float = FILL_TIMEOUT_SECONDS
    start_timeout: float = START_TIMEOUT_SECONDS
    profile: Path | None = None  # one more start under cProfile, its profile saved here
    node_port_range: str = COLD_NODE_PORT_RANGE  # its control plane's --service-node-port-range


@dataclass(frozen=True)
class ColdResult:
    rows: list[Row]
    notes: list[str]


# --- pure: what the operator's metrics, /proc and the API server's counts say -----------------------


def _total(samples: Samples, metric: str, /, **labels: str) -> float:
    return attach._metric(samples, {}, metric, **labels)


def drained(samples: Samples, attachments: int, elected: bool = True) -> bool:
    """The operator leads (when it is ``elected``), has reconciled at least ``attachments`` keys and
    has nothing queued or running: each attachment had its pass (keys queued before the workers
    start are one per key)."""
    return (
        (_total(samples, LEADER) >= 1 or not elected)
        and _total(samples, RECONCILES, controller=CONTROLLER) >= attachments
        and _total(samples, DEPTH, name=CONTROLLER) == 0
        and _total(samples, ACTIVE, controller=CONTROLLER) == 0
    )


def passes_by_result(samples: Samples) -> dict[str, int]:
    """The attachments' controller's passes so far, by result label (the results seen only)."""
    found: Counter[str] = Counter()
    for (sample, labels), value in samples.items():
        label = dict(labels)
        if sample == RECONCILES and label.get("controller") == CONTROLLER and value:
            found[label.get("result", "")] += int(value)
    return dict(sorted(found.items()))


def writes(delta: Mapping[RequestKey, int]) -> Counter[str]:
    """Write requests by "VERB resource[/subresource]", Leases left out."""
    found: Counter[str] = Counter()
    for (verb, resource, subresource, _code), n in delta.items():
        if verb in WRITE_VERBS and resource not in UNCOUNTED_RESOURCES and n > 0:
            found[f"{verb} {resource}{'/' + subresource if subresource else ''}"] += n
    return found


def memory(status_text: str) -> dict[str, int]:
    """VmRSS and VmHWM, in bytes, of a ``/proc/<pid>/status`` text (those it has)."""
    found: dict[str, int] = {}
    for line in status_text.splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            found[name] = int(value.split()[0]) * KIB
    return found


def node_ports(port_range: str) -> int:
    """The ports of a ``--service-node-port-range`` written "first-last" (both included): the
    attachments a control plane with that range can hold, one health-check NodePort each."""
    first, dash, last = port_range.partition("-")
    if not (dash and first.isdigit() and last.isdigit() and 0 < int(first) <= int(last) <= HIGHEST_PORT):
        raise ValueError(f"not a NodePort range first-last within 1-{HIGHEST_PORT}: {port_range!r}")
    return int(last) - int(first) + 1


def class_prefix(addresses: int) -> int:
    """The longest IPv4 prefix whose network holds ``addresses`` hosts (network and broadcast apart)."""
    return 32 - max(2, math.ceil(math.log2(addresses + 2)))


def _memory_of(pid: int) -> dict[str, int]:
    try:
        return memory(Path(f"/proc/{pid}/status").read_text())
    except OSError:
        return {}


# --- the run -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Listing:
    """One baseline LIST (``listing``, in a process of its own)."""

    seconds: float  # the LIST alone, connecting not counted
    cpu_seconds: float
    objects: dict[str, int]
    from_spawn: float  # spawn -> listed: the interpreter, the client and connecting included


@dataclass(frozen=True)
class Start:
    """One operator start: spawn to drained, its logged steps, CPU and memory at that moment, its
    passes by result and the API's write requests over the turn."""

    seconds: float
    steps: dict[str, float]
    cpu_seconds: float
    memory: dict[str, int]
    passes: dict[str, int]
    writes: Counter[str] = field(default_factory=Counter)
    load: float = 0.0  # the machine's 1-minute load average when it drained


def run(options: ColdOptions, say: Callable[[str], None]) -> ColdResult:
    ports = node_ports(options.node_port_range)
    if options.attachments > ports:
        raise ValueError(
            f"{options.attachments:,} attachments need as many health-check NodePorts; the control plane's "
            f"range {options.node_port_range} has {ports:,} (see COLD_NODE_PORT_RANGE)"
        )
    return on_own_control_plane(
        "coldstart",
        lambda cluster, workdir: _run(options, cluster.kubeconfig, workdir, say),
        say,
        node_port_range=options.node_port_range,
    )


async def _run(
    options: ColdOptions, kubeconfig: str, workdir: Path, say: Callable[[str], None]
) -> ColdResult:
    kube = await Kube.connect(kubeconfig)
    await apply_all(kube, [doc for path in CRD_FILES for doc in load(path)])
    started = time.perf_counter()
    world = attach.AttachOptions(apps=options.apps, prefix=class_prefix(options.attachments))
    endpoints = await attach.install_world(kube, world)
    address_class = await kube.get(CLASSES.path(name=attach.CLASS_NAME))
    assert address_class is not None
    empty = await _fill(options, kube, kubeconfig, endpoints, address_class, workdir, say)
    fill_seconds = time.perf_counter() - started
    say(f"coldstart: settled in {fill_seconds:.0f}s; {await _check(kube, options.attachments)}")

    api = ApiServerMetrics(kubeconfig, workdir)
    turns: list[tuple[Listing, Start]] = []
    try:
        for turn in range(options.runs):
            listing = await _baseline(kubeconfig)
            start = await _start(options, kubeconfig, api, workdir / f"operator-{turn}.log")
            turns.append((listing, start))
            say(
                f"coldstart: turn {turn + 1}/{options.runs}: baseline LIST {listing.seconds:.2f}s, operator "
                f"{start.seconds:.2f}s, {sum(start.writes.values())} writes, load {start.load:.1f}"
            )
        profile_notes: list[str] = []
        if options.profile is not None:
            profiled = await _start(
                options, kubeconfig, api, workdir / "operator-profiled.log", options.profile
            )
            say(f"coldstart: profiled start {profiled.seconds:.2f}s; profile in {options.profile}")
            profile_notes = (
                profile_summary(options.profile)
                if options.profile.exists()
                else [f"no profile was written to {options.profile} (the operator did not exit in time)"]
            )
    finally:
        await api.close()
        await kube.close()
    result = _report(options, turns, empty, fill_seconds)
    return ColdResult(result.rows, [*result.notes, *profile_notes])


async def _fill(
    options: ColdOptions,
    kube: Kube,
    kubeconfig: str,
    endpoints: Sequence[attach.Endpoint],
    address_class: Obj,
    workdir: Path,
    say: Callable[[str], None],
) -> dict[str, int]:
    """Every attachment created and Provisioned by a warm-up operator; returns that operator's memory
    on the world before the attachments (its empty-world figure)."""
    count = options.attachments
    provisioned: set[str] = set()
    everyone = asyncio.Event()

    def on_attachment(kind: str, obj: Obj) -> None:
        if kind != "DELETED" and attach.condition_true(obj, "Provisioned"):
            provisioned.add(str(obj["metadata"]["name"]))
            if len(provisioned) >= count:
                everyone.set()

    stand_in = StandIn(kube, attach.NAMESPACE, address_class)
    stand_in.start(say)
    watch = supervised(following(kube, ATTACHMENTS.path(attach.NAMESPACE), on_attachment), "fill watch", say)
    # No Lease to lose while the API server is swamped by the fill; its timeout as long as the wait.
    args = [f"--workers={options.fill_workers}", "--leader-elect=false", "--api-timeout-seconds=120"]
    log_path = workdir / "operator-warmup.log"
    creating: asyncio.Task[int] | None = None
    try:
        async with operator_process("operators.endpointattachment", kubeconfig, args, log_path) as operator:
            await _drained(operator, 0, options.start_timeout, elected=False)
            empty = _memory_of(operator.process.pid)
            say(f"coldstart: creating {count:,} attachments over {len(endpoints)} applications")
            names = [f"ea-{n:05d}" for n in range(count)]

            async def create(client: Kube, index_name: tuple[int, str]) -> None:
                index, name = index_name
                body = attach.attachment(name, endpoints[index % len(endpoints)])
                await retrying(lambda: client.create(ATTACHMENTS.path(attach.NAMESPACE), body))

            creating = asyncio.create_task(pool([kube], options.concurrency, enumerate(names), create))
            deadline = time.perf_counter() + options.fill_timeout
            while not everyone.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(everyone.wait(), PROGRESS_SECONDS)
                say(f"coldstart: {len(provisioned):,}/{count:,} Provisioned")
                if operator.process.returncode is not None or time.perf_counter() > deadline:
                    raise AssertionError(
                        f"the fill stopped at {len(provisioned):,}/{count:,} Provisioned (stand-in failures: "
                        f"{stand_in.failures[:3]}):\n{operator.log_tail(40)}"
                    )
            await creating
            await _drained(operator, count, options.start_timeout, elected=False)
    finally:
        for task in (watch, *([creating] if creating is not None else [])):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await stand_in.stop()
    check_log(log_path)
    return empty


async def _check(kube: Kube, count: int) -> str:
    listed = (await kube.list(ATTACHMENTS.path()))["items"]
    provisioned = sum(attach.condition_true(a, "Provisioned") for a in listed)
    assert len(listed) == count, f"{len(listed)} attachments, not {count}"
    assert provisioned == count, f"{provisioned}/{count} Provisioned"
    return f"{provisioned:,}/{count:,} attachments Provisioned"


async def _drained(
    operator: RunningOperator, attachments: int, within: float, *, elected: bool = True
) -> Samples:
    """Poll the operator's metrics (``DRAIN_SAMPLES`` only) until ``drained`` (not ``elected``: once
    its log says its caches synced); the last samples."""
    deadline = time.perf_counter() + within
    while True:
        with contextlib.suppress(httpx.HTTPError):  # its metrics server is not up yet
            samples = await operator.scrape(DRAIN_SAMPLES)
            synced = elected or SYNCED in operator.log_path.read_text(errors="replace")
            if synced and drained(samples, attachments, elected):
                return samples
        if operator.process.returncode is not None or time.perf_counter() > deadline:
            tail = log_tail(operator.log_path)
            raise AssertionError(f"the operator did not drain in {within:.0f}s:\n{tail}")
        await asyncio.sleep(POLL_SECONDS)  # the interval of a bounded poll


async def _baseline(kubeconfig: str) -> Listing:
    spawned = time.time()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", COMMAND, kubeconfig, stdout=asyncio.subprocess.PIPE, cwd=ROOT
    )
    out, _ = await process.communicate()
    assert process.returncode == 0, f"the baseline LIST failed ({process.returncode})"
    answer = json.loads(out)
    seconds, cpu = float(answer["seconds"]), float(answer["cpu_seconds"])
    return Listing(seconds, cpu, dict(answer["objects"]), float(answer["finished_at"]) - spawned)


async def _start(
    options: ColdOptions, kubeconfig: str, api: ApiServerMetrics, log_path: Path, profile: Path | None = None
) -> Start:
    """Spawn the operator (under cProfile with ``profile``), wait until it has drained, read its
    figures, stop it."""
    args = [f"--workers={options.workers}", f"--leader-election-namespace={LEASE_NAMESPACE}"]
    profiler = ("-m", "cProfile", "-o", str(profile)) if profile is not None else ()
    before = await api.requests()
    spawned, wall = time.time(), time.perf_counter()
    async with operator_process(
        "operators.endpointattachment", kubeconfig, args, log_path, python_args=profiler
    ) as operator:
        samples = await _drained(operator, options.attachments, options.start_timeout)
        took = time.perf_counter() - wall
        pid = operator.process.pid
        cpu, used, load = cpu_seconds(pid), _memory_of(pid), os.getloadavg()[0]
        after = await api.requests()
        assert operator.process.returncode is None, "the operator died"
    check_log(log_path)
    steps = logged_steps(log_path, spawned)
    return Start(took, steps, cpu, used, passes_by_result(samples), writes(after - before), load)


# --- the table ---------------------------------------------------------------------------------------


def _mb(value: float) -> str:
    return f"{value / 1e6:.1f} MB"


def _report(
    options: ColdOptions,
    turns: Sequence[tuple[Listing, Start]],
    empty: Mapping[str, int],
    fill_seconds: float,
) -> ColdResult:
    count = options.attachments
    ratios = [start.seconds / listing.from_spawn for listing, start in turns]
    median = statistics.median(ratios)
    listing, start = turns[ratios.index(sorted(ratios)[len(ratios) // 2])]  # the median turn
    of_list = [start.seconds / listing.seconds for listing, start in turns]
    objects = sum(listing.objects.values())
    written = Counter[str]()
    for _, each in turns:
        written += each.writes
    rss, hwm, empty_rss = start.memory.get("VmRSS", 0), start.memory.get("VmHWM", 0), empty.get("VmRSS", 0)
    rows = [
        Row(
            f"coldstart: baseline process spawn → plain paged LIST of {objects:,} objects "
            f"({len(listing.objects)} kinds) done",
            duration(listing.from_spawn),
            ratio="all turns: " + ", ".join(duration(each.from_spawn) for each, _ in turns),
        ),
        Row(
            f"coldstart: operator spawn → {count:,} attachments reconciled, queue empty",
            duration(start.seconds),
            f"≤ {TARGET_RATIO:.0f}{MULTIPLY} baseline",
            median <= TARGET_RATIO,
            f"÷ baseline = {ratio(median)} (median turn; all: {', '.join(ratio(r) for r in ratios)}; "
            f"min {ratio(min(ratios))})",
        ),
        Row(
            "context: the LIST alone (connecting not counted, as the GPUClass baseline)",
            duration(listing.seconds),
            ratio=f"operator ÷ this: {', '.join(ratio(r) for r in of_list)} (all turns)",
        ),
        Row(
            "coldstart: API writes during the starts (all turns; Leases apart)",
            f"{sum(written.values())}",
            f"= {WRITES_TARGET}",
            sum(written.values()) == WRITES_TARGET,
            ", ".join(f"{what} {n}" for what, n in written.most_common(5)),
        ),
        *(Row(f"context: operator spawn → {label}", duration(at)) for label, at in start.steps.items()),
        Row(
            "context: the operator's passes, by result",
            f"{sum(start.passes.values()):,}",
            ratio=", ".join(f"{result} {n:,}" for result, n in start.passes.items()),
        ),
        Row(
            "context: operator VmRSS / VmHWM when drained",
            f"{_mb(rss)} / {_mb(hwm)}",
            ratio=f"empty world (warm-up operator before the attachments): {_mb(empty_rss)}",
        ),
        Row(
            "context: operator RSS per attachment ((VmRSS - empty world's) ÷ attachments)",
            f"{(rss - empty_rss) / count / KIB:.1f} KiB" if count else "-",
            ratio=f"VmHWM: {(hwm - empty_rss) / count / KIB:.1f} KiB" if count else "",
        ),
        Row(
            "context: CPU of the baseline LIST (its process, connecting not counted)",
            duration(listing.cpu_seconds),
            ratio=f"{listing.cpu_seconds / listing.seconds:.0%} of its wall time",
        ),
        Row(
            "context: operator CPU, spawn to drained",
            duration(start.cpu_seconds),
            ratio=f"{start.cpu_seconds / start.seconds:.0%} of its wall time; ÷ baseline CPU = "
            f"{ratio(start.cpu_seconds / max(listing.cpu_seconds, 1e-9))}",
        ),
        Row(f"context: filling and settling {count:,} attachments", duration(fill_seconds)),
    ]
    notes = [
        "coldstart: listed per kind: " + ", ".join(f"{kind} {n:,}" for kind, n in listing.objects.items()),
        f"coldstart: the control plane's NodePort range {options.node_port_range} "
        f"({node_ports(options.node_port_range):,} ports, one per attachment's Service)",
        f"coldstart: LIST pages of {PAGE_SIZE}; context rows are of the median turn; load average (1 min) "
        "at each drain: " + ", ".join(f"{each.load:.1f}" for _, each in turns),
    ]
    return ColdResult(rows, notes)


__all__ = ["LISTS", "ColdOptions", "ColdResult", "node_ports", "run"]
