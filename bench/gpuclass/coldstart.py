"""Scenario 3: the operator's cold start on a large cluster, against a plain LIST of the same objects.

The benchmark fills a fresh local control plane with the synthetic world of ``harness.gpuclass_world`` at
``COLD_NODES`` Nodes and ``COLD_PODS`` Pods (5,000 and 150,000: one replica's envelope; created
``COLD_CONCURRENCY`` at a time over several clients, as fast as the API answers, each create tried
again on a 429, a 5xx or no answer; Nodes with their kubelet's status, Pods bound as the generator
placed them, finished ones patched to their phase; a running pod is left Pending, which holds its
resources the same), the GPUClass and KubeVirt CRDs, the KubeVirt CR and the classes. The filled
etcd stays under its default 2 GiB quota (about 1 GB at 150,000 Pods, 6.5 kB a Pod, measured at
25,000), and the API server's default in-flight limits (200 writes) are above ``COLD_CONCURRENCY``,
so the local control plane runs with its defaults. Then, in turns:

* **baseline**: a plain paged LIST of the same Nodes and Pods (every Node; Pods with the operator's
  field selector; the operator's page size; both kinds at once, as the operator's informers list
  them), each page parsed by the same client (``shared.kube``) and dropped;
* **operator**: every class's status cleared, then the operator process started; the time from its
  spawn until a poll of the API first shows every class's ``freeUnits`` equal to what the pure
  ``decide`` computes from the same Nodes, Pods, classes and KubeVirt CR as listed from the API
  (polled every ``POLL_SECONDS`` once the operator's log says it leads, not during its LIST).

Each turn's ratio operator ÷ baseline is taken (the machine's load drifts between turns, less within
one), and the median turn's has the target ``TARGET_RATIO`` (1.5 x): an operator that only lists,
folds and decides once should cost little more than the listing itself. The operator's peak resident
memory (``VmHWM``) is read when its status is first correct and again ``HOLD_SECONDS`` later, just
before it is stopped; the figure is the later one (the peak of its whole run, first watches and the
pass after the start included), the highest of the turns, with the target ``TARGET_RSS_BYTES``
(256 MiB): the Pods are folded, never stored, so it must not grow with their number. The baseline
runs in a fresh process as the operator does (``plainlist``). The operator's log dates its steps
(started, caches synced, leading), shown as context with both processes' CPU; with ``profile`` one
more start runs under cProfile and its top functions are printed.

Decides: the cold-start figures, their target and the shape of the filled cluster. Does not: change
the world's generator, or measure the operator under churn (``live``) or in process (``pure``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from bench.gpuclass.plainlist import COMMAND, PAGE_SIZE, pages
from hack.devcluster import ClusterInfo
from harness.bulk import pool, retrying
from harness.controlplane import on_own_control_plane
from harness.gpuclass_world import World, WorldSpec, build_world
from harness.manifests import ROOT, apply_all, load
from harness.oplog import LEADING_LINE, check_log, load_average, log_tail, profile_summary, steps
from harness.procfs import cpu_seconds, memory_bytes
from harness.report import Row, seconds, times
from harness.waiting import wait_for_object
from operators.gpuclass.api import GPUCLASSES
from operators.gpuclass.controller import POD_FIELD_SELECTOR
from operators.gpuclass.inventory import Inventory
from operators.gpuclass.kubevirt import Found
from operators.gpuclass.reconcile import decide
from shared.kube import REQUEST_POOL_SIZE, Kube, Obj
from shared.resources import NAMESPACES, NODES, PODS, SERVICE_ACCOUNTS

# The envelope for one replica: the pure world's cluster, 5,000 Nodes and 150,000 Pods.
COLD_NODES: Final = 5_000
COLD_PODS: Final = 150_000
COLD_GPU_PODS: Final = 20_000  # as many GPU VMs as the pure world has; the rest cpu/memory only
# Creates in flight while filling, spread over clients of ``REQUEST_POOL_SIZE`` kept-alive
# connections each (a client never opens more; a create beyond them would wait for one): the API
# server handles each connection's requests apart, so more connections keep both cores busy.
COLD_CONCURRENCY: Final = 4 * REQUEST_POOL_SIZE
# The longest a start may take to the first correct status (the LIST alone takes tens of seconds).
START_TIMEOUT_SECONDS: Final = 600.0
# The longest a new namespace may wait for its default ServiceAccount (the controller makes it).
SERVICE_ACCOUNT_TIMEOUT_SECONDS: Final = 120.0
# Turns of (baseline LIST, operator start); the median turn's ratio is the figure.
COLD_RUNS: Final = 3
TARGET_RATIO: Final = 1.5
# The operator's peak resident memory over a start (VmHWM at the end of the turn), at most this.
TARGET_RSS_BYTES: Final = 256 * 2**20
# After its first correct status the operator runs this much longer before it is stopped, so the
# peak memory covers its first watches and the pass after the start, not only the LIST.
HOLD_SECONDS: Final = 5.0
KUBEVIRT_NAMESPACE: Final = "cozy-kubevirt"
LEASE_NAMESPACE: Final = "default"
POLL_SECONDS: Final = 0.05  # the poll interval while waiting for the first correct status
STOP_SECONDS: Final = 30.0  # a stopped operator (and its profile dump) gets this long to exit


@dataclass(frozen=True)
class ColdOptions:
    nodes: int = COLD_NODES
    pods: int = COLD_PODS
    gpu_pods: int = COLD_GPU_PODS
    concurrency: int = COLD_CONCURRENCY
    runs: int = COLD_RUNS
    timeout: float = START_TIMEOUT_SECONDS
    profile: Path | None = None


@dataclass(frozen=True)
class ColdResult:
    rows: list[Row]
    notes: list[str]


@dataclass(frozen=True)
class Start:
    """One operator start: seconds from spawn to the first correct status, to each logged step, the
    CPU the process used until that status showed, and its peak resident memory (VmHWM) then and at
    the end of the turn (``HOLD_SECONDS`` later, just before it is stopped)."""

    seconds: float
    steps: dict[str, float]
    cpu_seconds: float
    peak_rss_at_correct: int
    peak_rss: int


def run(options: ColdOptions, say: Callable[[str], None]) -> ColdResult:
    return on_own_control_plane(
        "coldstart", lambda cluster, workdir: _run(options, cluster, workdir, say), say
    )


@dataclass(frozen=True)
class Fill:
    """How filling the API went: objects created, on how many clients, and the seconds of each part."""

    nodes: int
    pods: int
    clients: int
    seconds: float  # the whole fill
    install_seconds: float  # CRDs and namespaces
    nodes_seconds: float
    pods_seconds: float


async def _run(
    options: ColdOptions, cluster: ClusterInfo, workdir: Path, say: Callable[[str], None]
) -> ColdResult:
    kube = await Kube.connect(cluster.kubeconfig)
    spec = WorldSpec(
        nodes=options.nodes, gpu_nodes=options.nodes // 5, pods=options.pods, gpu_pods=options.gpu_pods
    )
    world = build_world(spec)
    fill = await _fill(kube, world, options, say)
    expected, listed_pods, agrees = await _expected(kube, world)
    turns: list[tuple[Listing, Start]] = []
    for turn in range(options.runs):
        listing = await _baseline(cluster.kubeconfig)
        assert listing.pods == listed_pods, f"the baseline listed {listing.pods} pods, not {listed_pods}"
        await _clear_statuses(kube)
        start = await _start(cluster, kube, expected, workdir / f"operator-{turn}.log", options.timeout, None)
        turns.append((listing, start))
        say(
            f"coldstart: turn {turn + 1}/{options.runs}: baseline LIST {listing.seconds:.2f}s, "
            f"operator {start.seconds:.2f}s (÷ {start.seconds / listing.seconds:.2f}), peak RSS "
            f"{start.peak_rss / 2**20:.0f} MiB; load average {load_average()}"
        )
    profile_notes: list[str] = []
    if options.profile is not None:
        await _clear_statuses(kube)
        profiled = await _start(
            cluster, kube, expected, workdir / "operator-profiled.log", options.timeout, options.profile
        )
        say(f"coldstart: profiled start {profiled.seconds:.2f}s; profile in {options.profile}")
        profile_notes = profile_summary(options.profile)
    notes = [
        f"coldstart: {fill.nodes:,} nodes ({spec.gpu_nodes:,} with GPUs), {fill.pods:,} pods of which "
        f"{listed_pods:,} bound and not finished (the operator's field selector), {len(world.classes)} "
        f"classes; LIST pages of {PAGE_SIZE}; context rows are of the median turn; load average at "
        f"the end {load_average()} (a shared machine: the figures are noisy)",
        *profile_notes,
    ]
    return ColdResult(_rows(options, fill, turns, listed_pods, agrees), notes)


async def _fill(kube: Kube, world: World, options: ColdOptions, say: Callable[[str], None]) -> Fill:
    """The world's namespaces, Nodes, Pods and classes created, ``options.concurrency`` in flight."""
    started = time.perf_counter()
    await _install(kube, world)
    installed = time.perf_counter()
    # One client per REQUEST_POOL_SIZE creates in flight, each with connections of its own.
    clients = [kube.with_own_connections() for _ in range(-(-options.concurrency // REQUEST_POOL_SIZE))]
    say(f"coldstart: creating {len(world.nodes):,} nodes ({options.concurrency} in flight)")
    nodes = await pool(clients, options.concurrency, world.nodes, _create_node)
    nodes_seconds = time.perf_counter() - installed
    say(f"coldstart: creating {options.pods:,} pods")
    pods = await pool(clients, options.concurrency, world.pods(), _create_pod)
    await asyncio.gather(*(client.close() for client in clients))
    for gpu_class in world.classes:  # oldest first: the first class of each name owns it
        await kube.create(
            GPUCLASSES.path(), {**gpu_class, "metadata": {"name": gpu_class["metadata"]["name"]}}
        )
    fill_seconds = time.perf_counter() - started
    pods_seconds = fill_seconds - nodes_seconds - (installed - started)
    say(
        f"coldstart: filled in {fill_seconds:.0f}s ({(nodes + pods) / fill_seconds:,.0f} objects/s; "
        f"pods {pods / pods_seconds:,.0f}/s); load average {load_average()}"
    )
    return Fill(nodes, pods, len(clients), fill_seconds, installed - started, nodes_seconds, pods_seconds)


def _rows(
    options: ColdOptions, fill: Fill, turns: list[tuple[Listing, Start]], listed_pods: int, agrees: bool
) -> list[Row]:
    # Each start is compared with the LIST made just before it: the load on the machine drifts,
    # so a turn's two figures are closer to each other than figures of different turns.
    ratios = [start.seconds / listing.seconds for listing, start in turns]
    ratio = statistics.median(ratios)
    listing, start = turns[ratios.index(sorted(ratios)[len(ratios) // 2])]  # the median turn
    baselines = [listing.seconds for listing, _ in turns]
    starts = [start.seconds for _, start in turns]
    peak = max(start.peak_rss for _, start in turns)
    return [
        Row(
            f"coldstart: plain paged LIST of {fill.nodes:,} Nodes + {listed_pods:,} Pods (baseline)",
            seconds(listing.seconds),
            ratio=f"min {seconds(min(baselines))}, median {seconds(statistics.median(baselines))}; "
            f"all turns: {', '.join(seconds(s) for s in baselines)}",
        ),
        Row(
            "coldstart: operator spawn → every class's freeUnits correct",
            seconds(start.seconds),
            f"≤ {times(TARGET_RATIO)} baseline",
            ratio <= TARGET_RATIO,
            f"this ÷ baseline = {times(ratio)} (median turn; all: {', '.join(times(r) for r in ratios)}); "
            f"min {seconds(min(starts))}, median {seconds(statistics.median(starts))}",
        ),
        Row(
            "coldstart: operator peak RSS (VmHWM at the end of a turn; the highest turn)",
            _mib(peak),
            f"≤ {_mib(TARGET_RSS_BYTES)}",
            peak <= TARGET_RSS_BYTES,
            f"at the first correct status: {', '.join(_mib(s.peak_rss_at_correct) for _, s in turns)}; "
            f"at the end: {', '.join(_mib(s.peak_rss) for _, s in turns)}",
        ),
        Row(
            "  expected freeUnits: decide on the API's lists = decide on the generated world",
            "yes" if agrees else "no",
            "yes",
            agrees,
        ),
        *(Row(f"context: operator spawn → {label}", seconds(at)) for label, at in start.steps.items()),
        Row(
            "context: CPU of the baseline LIST (its process, connecting not counted)",
            seconds(listing.cpu_seconds),
            ratio=f"{listing.cpu_seconds / listing.seconds:.0%} of its wall time",
        ),
        Row(
            "context: operator CPU from spawn to the first correct status",
            seconds(start.cpu_seconds),
            ratio=f"{start.cpu_seconds / start.seconds:.0%} of its wall time; "
            f"÷ baseline CPU = {times(start.cpu_seconds / listing.cpu_seconds)}",
        ),
        Row(
            f"context: filling the API ({fill.nodes:,} nodes, {fill.pods:,} pods, {options.concurrency} "
            f"in flight on {fill.clients} clients)",
            seconds(fill.seconds),
            ratio=f"{(fill.nodes + fill.pods) / fill.seconds:,.0f} objects/s; CRDs and namespaces "
            f"{seconds(fill.install_seconds)}, nodes {seconds(fill.nodes_seconds)}, pods "
            f"{seconds(fill.pods_seconds)} ({fill.pods / fill.pods_seconds:,.0f}/s)",
        ),
    ]


# --- filling the API ----------------------------------------------------------------------------


async def _install(kube: Kube, world: World) -> None:
    namespaces = {KUBEVIRT_NAMESPACE} | {pod["metadata"]["namespace"] for pod in _namespace_samples(world)}
    await apply_all(
        kube,
        [
            *load("config/crd/gpuclass/gpu.cozystack.io_gpuclasses.yaml"),
            *load("tests/fixtures/kubevirt-crd.yaml"),
        ],
    )
    for name in sorted(namespaces):
        if await kube.get(NAMESPACES.path(name=name)) is None:
            await kube.create(
                NAMESPACES.path(), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
            )
    await apply_all(kube, [world.kubevirt_cr])
    # A pod is admitted only once its namespace's default ServiceAccount exists.
    for name in sorted(namespaces):
        await wait_for_object(
            kube,
            SERVICE_ACCOUNTS,
            "default",
            lambda o: o is not None,
            namespace=name,
            timeout=SERVICE_ACCOUNT_TIMEOUT_SECONDS,
        )


def _namespace_samples(world: World) -> Iterator[Obj]:
    """One pod of every namespace the world's pods use (the generator's namespaces are few)."""
    seen: set[str] = set()
    for pod in world.pods():
        namespace = pod["metadata"]["namespace"]
        if namespace not in seen:
            seen.add(namespace)
            yield pod


async def _create_node(kube: Kube, built: Mapping[str, Any]) -> None:
    """A Node as its kubelet registers it (status included), then its taints as built: admission
    taints every new Node not-ready, and no node lifecycle controller runs here to lift that."""
    name = built["metadata"]["name"]
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": built["metadata"]["labels"]},
        "spec": built["spec"],
        "status": built["status"],
    }
    await retrying(lambda: kube.create(NODES.path(), body))
    taints = {"spec": {"taints": built["spec"].get("taints")}}
    await retrying(lambda: kube.patch(NODES.path(name=name), taints, kind="merge"))


async def _create_pod(kube: Kube, built: Mapping[str, Any]) -> None:
    """A Pod as generated (bound or not); a finished one gets its phase through the status."""
    metadata = built["metadata"]
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {k: metadata[k] for k in ("name", "namespace", "labels", "annotations") if k in metadata},
        "spec": built["spec"],
    }
    namespace, name = metadata["namespace"], metadata["name"]
    await retrying(lambda: kube.create(PODS.path(namespace), body))
    phase = built["status"]["phase"]
    if phase in ("Succeeded", "Failed"):
        patch = {"status": {"phase": phase}}
        await retrying(lambda: kube.patch(PODS.path(namespace, name) + "/status", patch, kind="merge"))


# --- what is measured ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Listing:
    """One baseline LIST (``plainlist``, in a process of its own)."""

    seconds: float
    cpu_seconds: float
    pods: int


async def _baseline(kubeconfig: str) -> Listing:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        COMMAND,
        kubeconfig,
        stdout=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    out, _ = await process.communicate()
    assert process.returncode == 0, f"the baseline LIST failed ({process.returncode})"
    answer = json.loads(out)
    return Listing(float(answer["seconds"]), float(answer["cpu_seconds"]), int(answer["pods"]))


async def _expected(kube: Kube, world: World) -> tuple[dict[str, int], int, bool]:
    """Every class's freeUnits as ``decide`` computes it from the API's lists; the number of pods the
    operator lists; and whether the generated world gives the same figures."""
    listed = Inventory()
    async for items in pages(kube, NODES.path()):
        for node in items:
            listed.upsert_node(node)
    listed_pods = 0
    async for items in pages(kube, PODS.path(), POD_FIELD_SELECTOR):
        listed_pods += len(items)
        for pod in items:
            listed.upsert_pod(pod)
    classes = (await kube.list(GPUCLASSES.path()))["items"]
    cr = await kube.get(f"/apis/kubevirt.io/v1/namespaces/{KUBEVIRT_NAMESPACE}/kubevirts/kubevirt")
    assert cr is not None, "the KubeVirt CR is missing"
    view = Found(cr)
    from_api = {name: d.status.free_units for name, d in decide(classes, listed, view).items()}
    generated = Inventory()
    for node in world.nodes:
        generated.upsert_node(node)
    for pod in world.pods():
        generated.upsert_pod(pod)
    from_world = {name: d.status.free_units for name, d in decide(classes, generated, view).items()}
    return from_api, listed_pods, from_api == from_world


async def _clear_statuses(kube: Kube) -> None:
    """Every class without status, so a start must write each one."""
    for gpu_class in (await kube.list(GPUCLASSES.path()))["items"]:
        if gpu_class.get("status"):
            name = gpu_class["metadata"]["name"]
            await kube.patch(GPUCLASSES.path(name=name) + "/status", {"status": None}, kind="merge")
    left = [
        c
        for c in (await kube.list(GPUCLASSES.path()))["items"]
        if (c.get("status") or {}).get("freeUnits") is not None
    ]
    assert not left, f"{len(left)} classes kept their status"


async def _start(
    cluster: ClusterInfo,
    kube: Kube,
    expected: Mapping[str, int],
    log_path: Path,
    within: float,
    profile: Path | None,
) -> Start:
    """Spawn the operator, wait for every class's freeUnits to be ``expected``, stop it."""
    spawned = time.time()
    async with _operator(cluster.kubeconfig, log_path, profile) as process:
        deadline = time.perf_counter() + within
        seen: dict[str, Any] = {}
        leading = False
        while True:
            # The API is polled only once the operator leads (its log says so): no status can be
            # written before, and polls during its LIST would load the API server the baseline had
            # to itself (on a small machine, that is CPU taken from serving the operator's pages).
            leading = leading or _logged(log_path, LEADING_LINE)
            if leading:
                listed = (await kube.list(GPUCLASSES.path()))["items"]
                seen = {c["metadata"]["name"]: (c.get("status") or {}).get("freeUnits") for c in listed}
                if seen == expected:
                    break
            if process.returncode is not None or time.perf_counter() > deadline:
                wrong = {n: (seen.get(n), v) for n, v in expected.items() if seen.get(n) != v}
                raise AssertionError(
                    f"no correct status in {within}s; (seen, expected): {wrong}\n{log_tail(log_path)}"
                )
            await asyncio.sleep(POLL_SECONDS)  # the poll interval of a bounded poll
        took = time.time() - spawned
        cpu = cpu_seconds(process.pid)
        peak_at_correct = memory_bytes(process.pid, "VmHWM")
        await asyncio.sleep(HOLD_SECONDS)  # a measurement window: the memory of the first watches
        peak = memory_bytes(process.pid, "VmHWM")
    return Start(took, steps(log_path, spawned), cpu, peak_at_correct, peak)


@contextlib.asynccontextmanager
async def _operator(
    kubeconfig: str, log_path: Path, profile: Path | None
) -> AsyncIterator[asyncio.subprocess.Process]:
    """The operator as a subprocess (under cProfile when ``profile`` is set), stopped by SIGTERM at
    the end, as a Pod is; it must not have died or logged a traceback."""
    profiler = ["-m", "cProfile", "-o", str(profile)] if profile is not None else []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("KUBECONFIG", None)
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *profiler,
            "-m",
            "operators.gpuclass",
            f"--kubeconfig={kubeconfig}",
            "--metrics-port=0",
            "--health-port=0",
            f"--kubevirt-namespace={KUBEVIRT_NAMESPACE}",
            f"--leader-election-namespace={LEASE_NAMESPACE}",
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            cwd=ROOT,
            env=env,
        )
    try:
        yield process
        assert process.returncode is None, "the operator died"
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), STOP_SECONDS)
            except TimeoutError:
                process.kill()
                await process.wait()
    check_log(log_path)


def _logged(log_path: Path, text: str) -> bool:
    """Whether the operator's log holds ``text`` yet (a small local file, read whole)."""
    return text in log_path.read_text(errors="replace")


def _mib(size: int) -> str:
    return f"{size / 2**20:.0f} MiB"
