"""Scenario 1: many EndpointAttachments from one class converge to Ready, against a plain LB Service.

The load balancer is MetalLB's real controller (``hack.metallb``), with an IPAddressPool for the
attachments' class (declared by the mirror, as a hoster would) and one for the baseline's addresses
(declared directly); a watch (``streams.BalancerWatch``) records when it answers. The benchmark plays
what else the local control plane lacks: Cozystack's lineage webhook (labels on the applications'
endpoint Services) and the kubelet (one Pod per application, marked Ready with an IP, so the
endpoint-slice controller gives every rendered Service a backend). The operator runs as a subprocess
(``python -m operators.endpointattachment``) with the admin kubeconfig: its RBAC is the integration
tests' concern.

Measured, at the same steady concurrency (``in_flight`` objects created and not yet done, each slot
refilled as soon as its object is done), timestamps in the benchmark process:

* baseline: ``create`` of a LoadBalancer Service shaped exactly as the operator renders one (the
  operator's own ``render_service``, minus the owner reference) until a watch on Services sees
  MetalLB's ``status.loadBalancer.ingress`` holding its address;
* attachments: ``create`` of an EndpointAttachment until a watch on attachments sees its ``Ready``
  condition True. Stages on the way, from the same watches: the operator's first pass (our finalizer
  on the attachment), the allocation of its address (watch on allocations), the rendered Service (the
  load balancer's watch), MetalLB's answer, and Ready.

The baseline runs first, with the operator already running (and warmed up by one attachment), so both
see the same control plane, the same operator process and the same MetalLB; its Services are deleted
before the attachments' phase (and MetalLB has released their addresses), because MetalLB reprocesses
every Service after each new allocation: both phases then run beside as many Services. Context
figures say where the time goes: CPU seconds of the operator, MetalLB, the API server, the controller
manager and etcd (the launcher process), of the benchmark itself and of anything else on the
machine; the operator's passes from its own metrics; the status writes to the class (each wakes every
attachment of the class); and the requests the API server counted by verb and resource
(``apiserver_request_total``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.endpointattachment.apimetrics import ApiServerMetrics, RequestKey, count
from bench.endpointattachment.report import MULTIPLY, Row, duration, percentile, ratio
from bench.endpointattachment.streams import (
    BalancerWatch,
    cpu_seconds,
    follow,
    ingress_ips,
    machine_cpu_seconds,
    own_cpu_seconds,
    supervised,
)
from hack.metallb import MetalLB, declare_pool, metallb
from operators.endpointattachment.addresses import parse_address
from operators.endpointattachment.constants import (
    API_VERSION,
    ATTACHMENT_LABEL,
    ENDPOINT_ATTACHMENT_KIND,
    METALLB_IPS_ANNOTATION,
)
from operators.endpointattachment.controller import FINALIZER
from operators.endpointattachment.render import class_settings, render_service, service_name
from shared.kube import ApiError, Kube, Obj
from shared.resources import HELMRELEASES, NAMESPACES, NODES, PODS, SERVICE_ACCOUNTS, SERVICES, Resource
from tests.ea_builders import (
    for_create,
    lineage_labels,
    make_attachment,
    make_class,
    make_helmrelease,
    make_service,
)
from tests.support.operators import RunningOperator, operator_process
from tests.support.waiting import wait_for_object

ATTACHMENTS = Resource(API_VERSION, "endpointattachments")
ALLOCATIONS = Resource(API_VERSION, "ipaddressallocations", namespaced=False)
CLASSES = Resource(API_VERSION, "ipaddressclasses", namespaced=False)

NAMESPACE = "bench-ea"
NODE = "bench-ea-node"
CLASS_NAME = "bench-attach"
# RFC 2544's benchmarking range: attachments mint from the first /22, the baseline uses the next one.
ATTACH_NETWORK = "198.18.0.0"
BASELINE_NETWORK = "198.18.16.0"
BASELINE_POOL = "bench-baseline"  # the hoster's own MetalLB pool of the baseline's addresses
# What MetalLB's log says when it reprocesses every Service, and when the API refused its status write.
METALLB_RELOAD = '"event":"force service reload"'
METALLB_CONFLICT = "Operation cannot be fulfilled on services"
RATIO_TARGET = 2.0  # issue 9: create → Ready p50 at most twice a direct LoadBalancer Service create
OTHERS = "everything else on the machine"
SHARED_MACHINE_WARNING = 0.2  # of a core
WARMUP_TIMEOUT = 90.0
ATTACHMENT_QUEUE = "endpointattachment"  # the attachments controller's work queue (its metrics' name)


@dataclass(frozen=True)
class AttachOptions:
    attachments: int = 1_000
    apps: int = 4
    in_flight: int = 20
    prefix: int = 22
    item_timeout: float = 120.0  # one object's create-to-done, at most
    phase_timeout: float = 300.0  # no new object is created after this
    operator_workers: int = 8


@dataclass(frozen=True)
class AttachResult:
    rows: list[Row]
    notes: list[str]


@dataclass(frozen=True)
class ClusterPids:
    apiserver: int
    controllers: int
    launcher: int  # devcluster, which embeds etcd


class Milestones:
    """Per object name, the first moment a watch showed it passing each check; a future per object
    resolves when it passes ``final``."""

    def __init__(self, checks: Mapping[str, Callable[[Obj], bool]], final: str) -> None:
        self.checks = dict(checks)
        self.final = final
        self.at: dict[str, dict[str, float]] = {milestone: {} for milestone in checks}
        self._waiters: dict[str, asyncio.Future[float]] = {}

    def expect(self, name: str) -> asyncio.Future[float]:
        """Register before creating the object, so no event can come before the waiter."""
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiters[name] = future
        return future

    def forget(self, name: str) -> None:
        self._waiters.pop(name, None)

    def on_event(self, kind: str, obj: Obj) -> None:
        if kind == "DELETED":
            return
        name = str((obj.get("metadata") or {}).get("name"))
        now = time.perf_counter()
        for milestone, check in self.checks.items():
            if name not in self.at[milestone] and check(obj):
                self.at[milestone][name] = now
        reached = self.at[self.final].get(name)
        if reached is None:
            return
        future = self._waiters.pop(name, None)
        if future is not None and not future.done():
            future.set_result(reached)


@dataclass
class Driven:
    """What one driven phase did: create times, objects that never got done in time, failed creates."""

    created_at: dict[str, float] = field(default_factory=dict)  # just before the POST
    returned_at: dict[str, float] = field(default_factory=dict)  # when the POST answered
    timed_out: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    started: float = 0.0
    finished: float = 0.0

    @property
    def wall(self) -> float:
        return self.finished - self.started


async def drive(
    names: Sequence[str],
    create: Callable[[str], Awaitable[None]],
    milestones: Milestones,
    options: AttachOptions,
) -> Driven:
    """Create every name through ``in_flight`` slots: each creates, waits for ``final``, takes the next."""
    driven = Driven(started=time.perf_counter())
    stop_creating = driven.started + options.phase_timeout
    pending: Iterator[str] = iter(names)  # shared by the slots; next() never awaits, so no two take one

    async def slot() -> None:
        for name in pending:
            if time.perf_counter() > stop_creating:
                return
            waiter = milestones.expect(name)
            driven.created_at[name] = time.perf_counter()
            try:
                await create(name)
            except ApiError as error:
                milestones.forget(name)
                driven.failed.append(f"{name}: {error}")
                continue
            driven.returned_at[name] = time.perf_counter()
            try:
                await asyncio.wait_for(waiter, timeout=options.item_timeout)
            except TimeoutError:
                driven.timed_out.append(name)

    await asyncio.gather(*(slot() for _ in range(options.in_flight)))
    driven.finished = time.perf_counter()
    return driven


def condition_true(obj: Obj, type_: str) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == type_ and c.get("status") == "True" for c in conditions)


def has_finalizer(obj: Obj) -> bool:
    return FINALIZER in ((obj.get("metadata") or {}).get("finalizers") or [])


def lb_answered(service: Obj) -> bool:
    annotations = (service.get("metadata") or {}).get("annotations") or {}
    address = annotations.get(METALLB_IPS_ANNOTATION)
    return bool(address) and ingress_ips(service) == [address]


def addresses_of(network: str, count: int) -> list[str]:
    """``count`` addresses from ``network`` upwards, skipping its first (the network address)."""
    first = ipaddress.IPv4Address(network) + 1
    return [str(first + n) for n in range(count)]


# --- setting up -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    name: str
    selector: dict[str, str]
    ports: list[dict[str, Any]]


async def install_world(kube: Kube, options: AttachOptions) -> list[Endpoint]:
    """The namespace, a Node, the applications (HelmRelease, endpoint Service, one Ready Pod each)
    and the class."""
    await kube.create(
        NAMESPACES.path(), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    )
    await kube.create(NODES.path(), {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    await wait_for_object(
        kube, SERVICE_ACCOUNTS, "default", lambda o: o is not None, namespace=NAMESPACE, timeout=60
    )
    endpoints = []
    for index in range(options.apps):
        app = f"app{index}"
        release = for_create(
            make_helmrelease(
                f"postgres-{app}", NAMESPACE, labels=lineage_labels(name=app, tenant_facing=False)
            )
        )
        await kube.create(HELMRELEASES.path(NAMESPACE), release)
        selector = {"app": app}
        body = for_create(
            make_service(f"postgres-{app}-rw", NAMESPACE, labels=lineage_labels(name=app), selector=selector)
        )
        created = await kube.create(SERVICES.path(NAMESPACE), body)
        endpoints.append(Endpoint(created["metadata"]["name"], selector, list(created["spec"]["ports"])))
        await _ready_pod(kube, f"{app}-0", selector, f"10.244.1.{10 + index}")
    spec_class = for_create(make_class(CLASS_NAME, cidrs=[f"{ATTACH_NETWORK}/{options.prefix}"]))
    await kube.create(CLASSES.path(), spec_class)
    return endpoints


async def _ready_pod(kube: Kube, name: str, labels: Mapping[str, str], ip: str) -> None:
    """A Pod on the benchmark's Node, Running and Ready with an IP, as the kubelet would report it."""
    await kube.create(
        PODS.path(NAMESPACE),
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": dict(labels)},
            "spec": {"nodeName": NODE, "containers": [{"name": "app", "image": "example.invalid/app:1"}]},
        },
    )
    status = {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    await kube.patch(PODS.path(NAMESPACE, name) + "/status", {"status": status}, kind="merge")


def baseline_service(name: str, endpoint: Endpoint, address: str, address_class: Obj) -> Obj:
    """A LoadBalancer Service exactly as the operator renders one (labels, annotations, spec), without
    the owner reference: there is no attachment behind it for garbage collection to look for."""
    stand_in = {
        "apiVersion": API_VERSION,
        "kind": ENDPOINT_ATTACHMENT_KIND,
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": f"baseline-{name}"},
    }
    rendered = render_service(
        stand_in,
        selector=endpoint.selector,
        ports=endpoint.ports,
        address=parse_address(address),
        settings=class_settings(address_class),
        mode="Standard",
        allow_icmp=True,
        proxy_name=None,
    )
    metadata = {k: v for k, v in rendered["metadata"].items() if k != "ownerReferences"}
    return {**rendered, "metadata": {**metadata, "name": name}}


# --- the run ---------------------------------------------------------------------------------------


@dataclass
class Usage:
    """CPU seconds of the processes that do the work, over one phase."""

    pids: ClusterPids
    operator: RunningOperator
    balancer: MetalLB
    start: dict[str, float] = field(default_factory=dict)

    def sample(self) -> dict[str, float]:
        tracked = {
            "operator": cpu_seconds(self.operator.process.pid or 0),
            "MetalLB controller": cpu_seconds(self.balancer.process.pid or 0),
            "kube-apiserver": cpu_seconds(self.pids.apiserver),
            "etcd (in the launcher)": cpu_seconds(self.pids.launcher),
            "kube-controller-manager": cpu_seconds(self.pids.controllers),
            "benchmark (driver, watches)": own_cpu_seconds(),
        }
        # Whatever else ran on the machine meanwhile (other benchmarks, tests) competes for its cores.
        tracked[OTHERS] = machine_cpu_seconds() - sum(tracked.values())
        return tracked

    def begin(self) -> None:
        self.start = self.sample()

    def end(self) -> dict[str, float]:
        now = self.sample()
        # Clamped: the samples are not taken at one instant, so a quiet machine can read a hair below 0.
        return {name: max(0.0, now[name] - self.start.get(name, 0.0)) for name in now}


@dataclass
class Observers:
    """Everything the benchmark watches while the operator runs."""

    balancer: BalancerWatch
    attachments: Milestones = field(
        default_factory=lambda: Milestones(
            {"stamped": has_finalizer, "ready": lambda o: condition_true(o, "Ready")}, final="ready"
        )
    )
    baseline: Milestones = field(
        default_factory=lambda: Milestones({"answered": lb_answered}, final="answered")
    )
    allocated_at: dict[str, float] = field(default_factory=dict)  # holder (attachment) name -> first seen
    class_writes: list[float] = field(default_factory=list)  # MODIFIED events of the attachments' class

    def on_allocation(self, kind: str, obj: Obj) -> None:
        holder = (obj.get("spec") or {}).get("holder") or {}
        if kind == "ADDED" and holder.get("namespace") == NAMESPACE:
            self.allocated_at.setdefault(str(holder.get("name")), time.perf_counter())

    def on_class(self, kind: str, obj: Obj) -> None:
        if kind == "MODIFIED" and (obj.get("metadata") or {}).get("name") == CLASS_NAME:
            self.class_writes.append(time.perf_counter())


@dataclass(frozen=True)
class Phase:
    """One measured phase: what was driven, and what it cost."""

    driven: Driven
    cpu: Mapping[str, float]
    passes: float = 0.0
    pass_seconds: float = 0.0
    queued: float = 0.0  # keys the attachments' queue handed to a worker
    queued_seconds: float = 0.0  # and how long they had waited in it, in all
    errors: float = 0.0
    class_writes: list[float] = field(default_factory=list)
    requests: Counter[RequestKey] = field(default_factory=Counter)  # what the API server served


async def run(
    options: AttachOptions,
    kubeconfig: str,
    pids: ClusterPids,
    log_path: Path,
    say: Callable[[str], None],
) -> AttachResult:
    kube = await Kube.connect(kubeconfig)
    endpoints = await install_world(kube, options)
    address_class = await kube.get(CLASSES.path(name=CLASS_NAME))
    assert address_class is not None
    async with metallb(kube, kubeconfig, log_path.parent / "metallb.log") as balancer:
        await declare_pool(kube, BASELINE_POOL, [f"{BASELINE_NETWORK}/{options.prefix}"])
        await balancer.wait_for_pool(BASELINE_POOL)
        say(f"attach: MetalLB up, pool {BASELINE_POOL} loaded (log: {balancer.log_path})")
        return await _run_with(
            options, kube, kubeconfig, endpoints, address_class, balancer, pids, log_path, say
        )


async def _run_with(
    options: AttachOptions,
    kube: Kube,
    kubeconfig: str,
    endpoints: list[Endpoint],
    address_class: Obj,
    balancer: MetalLB,
    pids: ClusterPids,
    log_path: Path,
    say: Callable[[str], None],
) -> AttachResult:
    seen = Observers(BalancerWatch(await Kube.connect(kubeconfig)))
    watches = [
        supervised(
            follow(kube, ATTACHMENTS.path(NAMESPACE), seen.attachments.on_event), "attachment watch", say
        ),
        supervised(follow(kube, ALLOCATIONS.path(), seen.on_allocation), "allocation watch", say),
        supervised(follow(kube, CLASSES.path(), seen.on_class), "class watch", say),
    ]
    seen.balancer.start(say)
    api = ApiServerMetrics(kubeconfig, log_path.parent)
    args = [f"--workers={options.operator_workers}"]
    try:
        async with operator_process("operators.endpointattachment", kubeconfig, args, log_path) as operator:
            return await _measure(
                options, kube, endpoints, address_class, operator, balancer, pids, seen, api, say
            )
    finally:
        await api.close()
        await seen.balancer.stop()
        for task in watches:
            task.cancel()
        for task in watches:
            with contextlib.suppress(asyncio.CancelledError, ApiError):
                await task


async def _measure(
    options: AttachOptions,
    kube: Kube,
    endpoints: list[Endpoint],
    address_class: Obj,
    operator: RunningOperator,
    balancer: MetalLB,
    pids: ClusterPids,
    seen: Observers,
    api: ApiServerMetrics,
    say: Callable[[str], None],
) -> AttachResult:
    count = options.attachments
    names = [f"ea-{n:04d}" for n in range(count)]
    base_names = [f"base-{n:04d}" for n in range(count)]
    endpoint_of = {
        name: endpoints[index % len(endpoints)]
        for index, name in enumerate(["warmup", *names, "base-warmup", *base_names])
    }
    base_address = dict(
        zip(["base-warmup", *base_names], addresses_of(BASELINE_NETWORK, count + 1), strict=True)
    )

    async def create_attachment(name: str) -> None:
        built = make_attachment(
            name, NAMESPACE, endpoint=endpoint_of[name].name, class_name=CLASS_NAME, owner_uid=None
        )
        await kube.create(ATTACHMENTS.path(NAMESPACE), for_create(built))

    async def create_baseline(name: str) -> None:
        body = baseline_service(name, endpoint_of[name], base_address[name], address_class)
        await kube.create(SERVICES.path(NAMESPACE), body)

    say("attach: operator up; warming it up with one attachment")
    warm = dataclasses.replace(options, in_flight=1, item_timeout=WARMUP_TIMEOUT)
    warmup = await drive(["warmup"], create_attachment, seen.attachments, warm)
    if warmup.timed_out or warmup.failed:
        raise AssertionError(f"the warm-up attachment did not get Ready:\n{operator.log_tail(60)}")
    usage = Usage(pids, operator, balancer)
    # Watched only while the baseline runs: in the attachments' phase it would only add work here.
    baseline_watch = supervised(
        follow(kube, SERVICES.path(NAMESPACE), seen.baseline.on_event, label_selector=ATTACHMENT_LABEL),
        "baseline watch",
        say,
    )
    try:
        await drive(["base-warmup"], create_baseline, seen.baseline, warm)
        say(f"attach: baseline, {count:,} LoadBalancer Services, {options.in_flight} in flight")
        served = await api.requests()
        usage.begin()
        base_driven = await drive(base_names, create_baseline, seen.baseline, options)
        base = Phase(base_driven, usage.end(), requests=await api.requests() - served)
    finally:
        baseline_watch.cancel()
        with contextlib.suppress(asyncio.CancelledError, ApiError):
            await baseline_watch
    # MetalLB reprocesses every Service after each new allocation: both phases must run beside as many.
    say("attach: deleting the baseline's Services; MetalLB releases their addresses")
    for name in ["base-warmup", *base.driven.created_at]:
        await kube.delete(SERVICES.path(NAMESPACE, name))
    await balancer.wait_for_pool(BASELINE_POOL, WARMUP_TIMEOUT, assigned=0)

    say(f"attach: {count:,} EndpointAttachments, {options.in_flight} in flight")
    before, writes_before, served = await operator.scrape(), len(seen.class_writes), await api.requests()
    usage.begin()
    driven = await drive(names, create_attachment, seen.attachments, options)
    cpu = usage.end()
    after, served_after = await operator.scrape(), await api.requests()
    phase = Phase(
        driven,
        cpu,
        passes=_metric(after, before, "controller_runtime_reconcile_total"),
        pass_seconds=_metric(after, before, "controller_runtime_reconcile_time_seconds_sum"),
        errors=_metric(after, before, "controller_runtime_reconcile_total", result="error"),
        queued=_metric(after, before, "workqueue_queue_duration_seconds_count", name=ATTACHMENT_QUEUE),
        queued_seconds=_metric(after, before, "workqueue_queue_duration_seconds_sum", name=ATTACHMENT_QUEUE),
        class_writes=seen.class_writes[writes_before:],
        requests=served_after - served,
    )
    say(f"attach: done in {driven.wall:.1f}s; checking what the API holds")
    notes = [await _check(kube, names)]
    if operator.process.returncode is not None:
        notes.append(f"the operator DIED during the run; log: {operator.log_path}")
    if not balancer.running():
        notes.append(f"MetalLB DIED during the run; log: {balancer.log_path}")
    log = balancer.log_path.read_text(errors="replace")
    notes.append(
        f"MetalLB over the whole run: {log.count(METALLB_RELOAD)} reloads (each reprocesses every "
        f"Service), {log.count(METALLB_CONFLICT)} Service status writes refused by a conflict and retried"
    )
    if "Traceback" in operator.log_path.read_text(errors="replace"):
        notes.append(f"the operator logged a traceback; log: {operator.log_path}")
    rows, more = _rows(options, phase, base, seen)
    return AttachResult(rows, [*more, *notes])


async def _check(kube: Kube, names: Sequence[str]) -> str:
    """Every measured attachment Ready with its own address, held by its own allocation."""
    listed = (await kube.list(ATTACHMENTS.path(NAMESPACE)))["items"]
    wanted = set(names)
    ours = [a for a in listed if a["metadata"]["name"] in wanted]
    addresses = [
        str((a.get("status") or {}).get("address")) for a in ours if (a.get("status") or {}).get("address")
    ]
    allocations = [
        a for a in (await kube.list(ALLOCATIONS.path()))["items"] if a["spec"].get("className") == CLASS_NAME
    ]
    by_address = {a["spec"]["address"]: a["spec"]["holder"]["uid"] for a in allocations}
    held_right = sum(
        1 for a in ours if by_address.get((a.get("status") or {}).get("address")) == a["metadata"]["uid"]
    )
    ready = sum(1 for a in ours if condition_true(a, "Ready"))
    return (
        f"API check: {ready}/{len(names)} attachments Ready, {len(set(addresses))} distinct addresses among "
        f"{len(addresses)} bound, {held_right} held by an allocation naming their own UID; "
        f"{len(allocations)} allocations in class {CLASS_NAME} (warm-up included)"
    )


def _latencies(driven: Driven, reached: Mapping[str, float]) -> list[float]:
    return [reached[name] - start for name, start in driven.created_at.items() if name in reached]


def _stage(starts: Mapping[str, float], ends: Mapping[str, float], names: Sequence[str]) -> list[float]:
    return [ends[n] - starts[n] for n in names if n in starts and n in ends and ends[n] >= starts[n]]


def _p50_p99(values: Sequence[float]) -> str:
    if not values:
        return "-"
    return f"{duration(percentile(values, 0.5))} / {duration(percentile(values, 0.99))}"


Samples = Mapping[tuple[str, tuple[tuple[str, str], ...]], float]


def _metric(after: Samples, before: Samples, metric: str, /, **labels: str) -> float:
    """How much a (summed) metric grew between two scrapes, over the samples with these labels."""

    def total(samples: Samples) -> float:
        return sum(
            value
            for (sample, sample_labels), value in samples.items()
            if sample == metric and labels.items() <= dict(sample_labels).items()
        )

    return total(after) - total(before)


def _rows(options: AttachOptions, phase: Phase, base: Phase, seen: Observers) -> tuple[list[Row], list[str]]:
    count, driven = options.attachments, phase.driven
    ready = _latencies(driven, seen.attachments.at["ready"])
    base_done = _latencies(base.driven, seen.baseline.at["answered"])
    rows = [
        Row(
            f"attach: attachments Ready ({options.in_flight} in flight)",
            f"{len(ready):,}/{count:,}",
            f"= {count:,}",
            len(ready) == count,
            f"baseline: {len(base_done):,}/{count:,} answered",
        )
    ]
    if ready and base_done:
        for q, label in ((0.5, "p50"), (0.99, "p99")):
            mine, theirs = percentile(ready, q), percentile(base_done, q)
            targeted = q == 0.5
            rows.append(
                Row(
                    f"attach: create → Ready, {label}",
                    duration(mine),
                    f"≤ {RATIO_TARGET:.0f}{MULTIPLY} baseline" if targeted else "",
                    mine / theirs <= RATIO_TARGET if targeted else None,
                    f"÷ baseline {duration(theirs)} = {ratio(mine / theirs)}",
                )
            )
    rows.append(
        Row(
            "  baseline: LB Service create → ingress, p50 / p99",
            _p50_p99(base_done),
            ratio="same MetalLB, same concurrency",
        )
    )
    rows += _stage_rows(driven, base.driven, seen)
    if driven.wall > 0 and base.driven.wall > 0:
        rate, base_rate = len(ready) / driven.wall, len(base_done) / base.driven.wall
        rows.append(
            Row(
                "context: throughput, attachments Ready/s",
                f"{rate:.1f}/s",
                ratio=f"baseline {base_rate:.1f}/s ({base.driven.wall:.1f}s); phase took {driven.wall:.1f}s",
            )
        )
    for name, seconds in phase.cpu.items():
        rows.append(
            Row(
                f"context: CPU, {name}",
                f"{seconds:.1f} s",
                ratio=f"{seconds / driven.wall:.0%} of a core; baseline phase {base.cpu.get(name, 0):.1f} s",
            )
        )
    if phase.passes:
        rows.append(
            Row(
                "context: operator passes (its metrics)",
                f"{phase.passes:,.0f}",
                ratio=f"{phase.passes / max(1, len(ready)):.1f} per attachment; "
                f"mean {duration(phase.pass_seconds / phase.passes)}; {phase.errors:.0f} errors"
                + (
                    f"; queued {duration(phase.queued_seconds / phase.queued)} (mean)" if phase.queued else ""
                ),
            )
        )
    # A status-only write to the class wakes no attachment (the operator's wiring filters it by
    # generation): how many there were, as context for the class controller's debounce.
    rows.append(
        Row(
            f"context: status writes to IPAddressClass {CLASS_NAME} (watched)",
            f"{len(phase.class_writes):,}",
            ratio=f"{len(phase.class_writes) / max(1, len(ready)):.2f} per attachment; they wake no pass",
        )
    )
    writes, breakdown = _writes_row(phase, base, len(driven.created_at))
    rows.append(writes)
    notes = [breakdown]
    if driven.timed_out:
        notes.append(
            f"{len(driven.timed_out)} attachments not Ready within {options.item_timeout:.0f}s, e.g. "
            f"{', '.join(driven.timed_out[:5])}"
        )
    if len(driven.created_at) < count:
        notes.append(
            f"only {len(driven.created_at):,} of {count:,} attachments were created before the phase "
            f"deadline ({options.phase_timeout:.0f}s)"
        )
    if driven.failed or base.driven.failed:
        notes.append(f"failed creates: {[*driven.failed, *base.driven.failed][:5]}")
    others = phase.cpu.get(OTHERS, 0.0) / driven.wall if driven.wall else 0.0
    if others > SHARED_MACHINE_WARNING:
        notes.append(
            f"the machine was shared: other processes used {others:.0%} of a core during the attachments "
            f"(and {base.cpu.get(OTHERS, 0.0) / max(base.driven.wall, 1e-9):.0%} during the baseline)"
        )
    return rows, notes


def _stage_rows(driven: Driven, base: Driven, seen: Observers) -> list[Row]:
    """Where an attachment's time goes, from the watches; and the baseline's steps."""
    names = list(driven.created_at)
    balancer = seen.balancer
    service_seen = {
        n: balancer.seen_at[k] for n in names if (k := (NAMESPACE, service_name(n))) in balancer.seen_at
    }
    answered = {
        n: balancer.answered_at[k]
        for n in names
        if (k := (NAMESPACE, service_name(n))) in balancer.answered_at
    }
    stamped, done = seen.attachments.at["stamped"], seen.attachments.at["ready"]
    stages = [
        ("POST answered", driven.created_at, driven.returned_at),
        ("first pass (create → finalizer)", driven.created_at, stamped),
        ("mint (finalizer → allocation)", stamped, seen.allocated_at),
        ("render (allocation → Service)", seen.allocated_at, service_seen),
        ("MetalLB (Service → ingress)", service_seen, answered),
        ("publish (ingress → Ready)", answered, done),
    ]
    rows = [Row(f"  stage: {label}, p50 / p99", _p50_p99(_stage(a, b, names))) for label, a, b in stages]
    base_names = list(base.created_at)
    base_seen = {
        n: balancer.seen_at[(NAMESPACE, n)] for n in base_names if (NAMESPACE, n) in balancer.seen_at
    }
    base_answer = {
        n: balancer.answered_at[(NAMESPACE, n)] for n in base_names if (NAMESPACE, n) in balancer.answered_at
    }
    steps = (
        _stage(base.created_at, base.returned_at, base_names),
        _stage(base.created_at, base_seen, base_names),
        _stage(base_seen, base_answer, base_names),
    )
    rows.append(
        Row(
            "  baseline: POST answered; create → seen → MetalLB's answer seen",
            " / ".join(duration(percentile(v, 0.5)) if v else "-" for v in steps),
            ratio="p50 of each",
        )
    )
    return rows


WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE")


def _writes_row(phase: Phase, base: Phase, created: int) -> tuple[Row, str]:
    """API writes per attachment as the API server counted them, and (a note) what they were."""
    delta, n = phase.requests, max(1, created)
    writes = sum(v for (verb, *_), v in delta.items() if verb in WRITE_VERBS)
    base_writes = sum(v for (verb, *_), v in base.requests.items() if verb in WRITE_VERBS)
    parts = [
        ("attachment PATCH", count(delta, "PATCH", "endpointattachments")),
        ("attachment status PATCH", count(delta, "PATCH", "endpointattachments", "status")),
        ("allocation POST", count(delta, "POST", "ipaddressallocations")),
        ("of which 409", count(delta, "POST", "ipaddressallocations", code="409")),
        ("Service POST", count(delta, "POST", "services")),
        ("of which 409", count(delta, "POST", "services", code="409")),
        ("class status PATCH", count(delta, "PATCH", "ipaddressclasses", "status")),
        ("allocation GET", count(delta, "GET", "ipaddressallocations")),
    ]
    row = Row(
        "context: API writes per attachment (API server's count)",
        f"{writes / n:.1f}",
        ratio=f"baseline {base_writes / max(1, len(base.driven.created_at)):.1f} per Service (all writers)",
    )
    note = "operator's requests per attachment: " + ", ".join(
        f"{label} {value / n:.2f}" for label, value in parts
    )
    return row, note
