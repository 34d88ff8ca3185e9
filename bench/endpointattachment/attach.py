"""Scenario ``attach``: many EndpointAttachments converge to Provisioned, against the same claims
and LoadBalancer Services made by hand.

The addresses come from the address substrate: its real CRDs, and its real controllers when
``COZY_SUBSTRATE_BIN`` names them (``hack/substrate.py``), else the documented model of its
controllers (``harness.substrate``: the core binds claims, the MetalLB driver renders one
``IPAddressPool`` per class and pins a bound claim's addresses on the Service naming it). The load
balancer is MetalLB's real controller (``hack.metallb``); a watch (``harness.streams.BalancerWatch``) records
when it answers. The benchmark plays what else the local control plane lacks: Cozystack's lineage
webhook (labels on the applications' endpoint Services) and the kubelet (one Pod per application,
marked Ready with an IP). The operator runs as a subprocess (``python -m
operators.endpointattachment``) with the admin kubeconfig: its RBAC is the integration tests' concern.

Measured, at the same steady concurrency (``in_flight`` objects created and not yet done, each slot
refilled as soon as its object is done), timestamps in the benchmark process:

* baseline, by hand: ``create`` of an ``IPAddressClaim`` of the baseline's class, then at once of a
  LoadBalancer Service shaped exactly as the operator renders one (the operator's own
  ``render_service``, minus the owner reference) naming the claim, until a watch on Services sees
  MetalLB's ``status.loadBalancer.ingress`` holding the address the driver pinned;
* attachments: ``create`` of an EndpointAttachment until a watch on attachments sees ``Provisioned``
  True. Stages on the way, from the same watches: the operator's first pass (our finalizer), the
  minted claim (watch on claims), its binding, the rendered Service and MetalLB's answer.

The baseline runs first, with the operator already running (and warmed up by one attachment), so both
see the same control plane, the same operator process, the same substrate model and the same MetalLB;
its Services are deleted before the attachments' phase (and MetalLB has released their addresses),
because MetalLB reprocesses every Service after each new allocation: both phases then run beside as
many Services. Context figures say where the time goes: CPU seconds of the operator, MetalLB, the API
server, the controller manager and etcd (the launcher process), of the benchmark (with the substrate
model, which runs in it) and of anything else on the machine; the operator's passes from its own
metrics; and the requests the API server counted by verb and resource (``apiserver_request_total``):
the operator's requests per attachment are those no one else makes (attachment patches, claim and
Service creates and deletes; the substrate model patches Services and claims' status, the benchmark
creates the attachments).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hack.metallb import MetalLB, metallb
from hack.substrate import pool_name
from harness.apimetrics import ApiServerMetrics, RequestKey, count
from harness.lane import address_substrate
from harness.operators import RunningOperator, operator_process
from harness.procfs import cpu_seconds
from harness.report import MULTIPLY, Row, duration, percentile, ratio
from harness.streams import (
    BalancerWatch,
    follow,
    ingress_ips,
    machine_cpu_seconds,
    own_cpu_seconds,
    supervised,
)
from harness.substrate import METALLB_PROVISIONER
from harness.waiting import wait_for_object
from operators.endpointattachment.api import (
    API_VERSION,
    ATTACHMENT_KIND,
    ATTACHMENT_LABEL,
    ATTACHMENTS,
    CLAIM_KIND,
    CLAIMS,
    CLASSES,
    METALLB_IPS_ANNOTATION,
    spec_of,
)
from operators.endpointattachment.controller import FINALIZER
from operators.endpointattachment.render import RenderSettings, render_service
from shared.kube import ApiError, Kube, Obj
from shared.lineage import (
    LABEL_TRUE,
    TENANT_RESOURCE_LABEL,
    ApplicationRef,
)
from shared.resources import HELMRELEASES, NAMESPACES, NODES, PODS, SERVICE_ACCOUNTS, SERVICES

NAMESPACE = "bench-ea"
NODE = "bench-ea-node"
CLASS_NAME = "bench-attach"
# The hand-made baseline's class: its own addresses, its own MetalLB pool (the driver names it so).
BASELINE_CLASS = "bench-baseline"
# RFC 2544's benchmarking range: attachments mint from the first /22, the baseline uses the next one.
ATTACH_NETWORK = "198.18.0.0"
BASELINE_NETWORK = "198.18.16.0"
APPLICATION_GROUP = "apps.cozystack.io"
# What MetalLB's log says when it reprocesses every Service, and when the API refused its status write.
METALLB_RELOAD = '"event":"force service reload"'
METALLB_CONFLICT = "Operation cannot be fulfilled on services"
# Issue 16: create -> Provisioned p50 at most 1.2 times the same claim and Service made by hand, and
# at most 8 API requests of the operator's per attachment.
RATIO_TARGET = 1.2
REQUESTS_TARGET = 8.0
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


# --- setting up -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    app: str
    name: str
    selector: dict[str, str]
    ports: list[dict[str, Any]]


def _lineage(app: str) -> dict[str, str]:
    return ApplicationRef(APPLICATION_GROUP, "Postgres", app).labels()


def address_class(name: str, network: str, prefix: int) -> Obj:
    """A class of the substrate's MetalLB driver over one network."""
    return {
        "apiVersion": API_VERSION,
        "kind": "IPAddressClass",
        "metadata": {"name": name},
        "spec": {
            "provisioner": METALLB_PROVISIONER,
            "reclaimPolicy": "Delete",  # a deleted claim frees its address in MetalLB (no placeholder)
            "parameters": {"addresses": [f"{network}/{prefix}"]},
        },
    }


def attachment(
    name: str, endpoint: Endpoint, namespace: str = NAMESPACE, class_name: str = CLASS_NAME
) -> Obj:
    """An attachment as a tenant writes it from Cozystack's documentation, minting from the class."""
    return {
        "apiVersion": API_VERSION,
        "kind": ATTACHMENT_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "applicationRef": {"kind": "Postgres", "name": endpoint.app},
            "endpoint": {"serviceName": endpoint.name},
            "loadBalancer": {"className": class_name},
        },
    }


def helmrelease(app: str) -> Obj:
    """The application's HelmRelease, with the lineage labels Cozystack's webhook gives it."""
    return {
        "apiVersion": "helm.toolkit.fluxcd.io/v2",
        "kind": "HelmRelease",
        "metadata": {"name": f"postgres-{app}", "labels": _lineage(app)},
        "spec": {
            "interval": "5m",
            "chart": {"spec": {"chart": "postgres", "sourceRef": {"kind": "HelmRepository", "name": "apps"}}},
        },
    }


def endpoint_service(app: str) -> Obj:
    """The application's tenant-facing endpoint Service (lineage labels, selecting its pods)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": f"postgres-{app}-rw",
            "labels": {**_lineage(app), TENANT_RESOURCE_LABEL: LABEL_TRUE},
        },
        "spec": {"selector": {"app": app}, "ports": [{"name": "postgres", "port": 5432, "targetPort": 5432}]},
    }


async def install_world(kube: Kube, options: AttachOptions) -> list[Endpoint]:
    """The namespace, a Node, the applications (HelmRelease, endpoint Service, one Ready Pod each)
    and the two classes."""
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
        endpoint = await install_application(kube, NAMESPACE, app)
        endpoints.append(endpoint)
        await _ready_pod(kube, f"{app}-0", endpoint.selector, f"10.244.1.{10 + index}")
    for name, network in ((CLASS_NAME, ATTACH_NETWORK), (BASELINE_CLASS, BASELINE_NETWORK)):
        await kube.create(CLASSES.path(), address_class(name, network, options.prefix))
    return endpoints


async def install_application(kube: Kube, namespace: str, app: str) -> Endpoint:
    """One application: its HelmRelease and its endpoint Service (no Pod)."""
    await kube.create(HELMRELEASES.path(namespace), helmrelease(app))
    created = await kube.create(SERVICES.path(namespace), endpoint_service(app))
    spec = created["spec"]
    return Endpoint(app, created["metadata"]["name"], dict(spec["selector"]), list(spec["ports"]))


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


def baseline_claim(name: str) -> Obj:
    return {
        "apiVersion": API_VERSION,
        "kind": CLAIM_KIND,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"className": BASELINE_CLASS},
    }


def baseline_service(name: str, endpoint: Endpoint) -> Obj:
    """A LoadBalancer Service exactly as the operator renders one (labels, annotations, spec) for a
    claim of the same name, without the owner reference (no attachment is behind it) and named
    outright (a person picks a name)."""
    stand_in = {
        **attachment(name, endpoint),
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": f"baseline-{name}"},
    }
    rendered = render_service(
        stand_in,
        spec_of(stand_in),
        claim_name=name,
        family="IPv4",
        selector=endpoint.selector,
        ports=[{**p, "protocol": p.get("protocol", "TCP")} for p in endpoint.ports],
        load_balancer_class="",
        settings=RenderSettings(),
    )
    metadata = {k: v for k, v in rendered["metadata"].items() if k not in ("ownerReferences", "generateName")}
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
            {"stamped": has_finalizer, "provisioned": lambda o: condition_true(o, "Provisioned")},
            final="provisioned",
        )
    )
    baseline: Milestones = field(
        default_factory=lambda: Milestones({"answered": lb_answered}, final="answered")
    )
    minted_at: dict[str, float] = field(default_factory=dict)  # attachment name -> its claim first seen
    bound_at: dict[str, float] = field(default_factory=dict)  # attachment name -> its claim first Bound
    service_of: dict[str, str] = field(default_factory=dict)  # attachment name -> status.serviceName

    def on_attachment(self, kind: str, obj: Obj) -> None:
        self.attachments.on_event(kind, obj)
        service = (obj.get("status") or {}).get("serviceName")
        if service:
            self.service_of[str((obj.get("metadata") or {}).get("name"))] = str(service)

    def on_claim(self, kind: str, obj: Obj) -> None:
        owners = (obj.get("metadata") or {}).get("ownerReferences") or []
        owner = next((str(o.get("name")) for o in owners if o.get("kind") == ATTACHMENT_KIND), None)
        if kind == "DELETED" or owner is None:
            return
        now = time.perf_counter()
        self.minted_at.setdefault(owner, now)
        if (obj.get("status") or {}).get("phase") == "Bound":
            self.bound_at.setdefault(owner, now)


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
    requests: Counter[RequestKey] = field(default_factory=Counter)  # what the API server served


async def run(
    options: AttachOptions,
    kubeconfig: str,
    pids: ClusterPids,
    log_path: Path,
    say: Callable[[str], None],
) -> AttachResult:
    kube = await Kube.connect(kubeconfig)
    async with (
        metallb(kube, kubeconfig, log_path.parent / "metallb.log") as balancer,
        address_substrate(kube),
    ):
        endpoints = await install_world(kube, options)
        for pool in (CLASS_NAME, BASELINE_CLASS):
            await balancer.wait_for_pool(pool_name(pool))
        say(f"attach: MetalLB up, the driver's pools {CLASS_NAME} and {BASELINE_CLASS} loaded")
        return await _run_with(options, kube, kubeconfig, endpoints, balancer, pids, log_path, say)


async def _run_with(
    options: AttachOptions,
    kube: Kube,
    kubeconfig: str,
    endpoints: list[Endpoint],
    balancer: MetalLB,
    pids: ClusterPids,
    log_path: Path,
    say: Callable[[str], None],
) -> AttachResult:
    seen = Observers(BalancerWatch(await Kube.connect(kubeconfig)))
    watches = [
        supervised(follow(kube, ATTACHMENTS.path(NAMESPACE), seen.on_attachment), "attachment watch", say),
        supervised(follow(kube, CLAIMS.path(NAMESPACE), seen.on_claim), "claim watch", say),
    ]
    seen.balancer.start(say)
    api = ApiServerMetrics(kubeconfig, log_path.parent)
    args = [f"--workers={options.operator_workers}"]
    try:
        async with operator_process("operators.endpointattachment", kubeconfig, args, log_path) as operator:
            return await _measure(options, kube, endpoints, operator, balancer, pids, seen, api, say)
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

    async def create_attachment(name: str) -> None:
        await kube.create(ATTACHMENTS.path(NAMESPACE), attachment(name, endpoint_of[name]))

    async def create_baseline(name: str) -> None:
        await kube.create(CLAIMS.path(NAMESPACE), baseline_claim(name))
        await kube.create(SERVICES.path(NAMESPACE), baseline_service(name, endpoint_of[name]))

    say("attach: operator up; warming it up with one attachment")
    warm = dataclasses.replace(options, in_flight=1, item_timeout=WARMUP_TIMEOUT)
    warmup = await drive(["warmup"], create_attachment, seen.attachments, warm)
    if warmup.timed_out or warmup.failed:
        raise AssertionError(f"the warm-up attachment was not Provisioned:\n{operator.log_tail(60)}")
    usage = Usage(pids, operator, balancer)
    base = await _baseline(kube, balancer, seen, api, usage, base_names, create_baseline, options, say)

    say(f"attach: {count:,} EndpointAttachments, {options.in_flight} in flight")
    before, served = await operator.scrape(), await api.requests()
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
        requests=served_after - served,
    )
    say(f"attach: done in {driven.wall:.1f}s; checking what the API holds")
    rows, more = _rows(options, phase, base, seen)
    return AttachResult(rows, [*more, *await _health(kube, names, operator, balancer)])


async def _baseline(
    kube: Kube,
    balancer: MetalLB,
    seen: Observers,
    api: ApiServerMetrics,
    usage: Usage,
    names: list[str],
    create: Callable[[str], Awaitable[None]],
    options: AttachOptions,
    say: Callable[[str], None],
) -> Phase:
    """The baseline phase: a claim and a LoadBalancer Service by hand for each name, then all deleted
    until MetalLB has released every address."""
    warm = dataclasses.replace(options, in_flight=1, item_timeout=WARMUP_TIMEOUT)
    # Watched only while the baseline runs: in the attachments' phase it would only add work here.
    baseline_watch = supervised(
        follow(kube, SERVICES.path(NAMESPACE), seen.baseline.on_event, label_selector=ATTACHMENT_LABEL),
        "baseline watch",
        say,
    )
    try:
        await drive(["base-warmup"], create, seen.baseline, warm)
        say(f"attach: baseline, {len(names):,} claims and Services by hand, {options.in_flight} in flight")
        served = await api.requests()
        usage.begin()
        base_driven = await drive(names, create, seen.baseline, options)
        base = Phase(base_driven, usage.end(), requests=await api.requests() - served)
    finally:
        baseline_watch.cancel()
        with contextlib.suppress(asyncio.CancelledError, ApiError):
            await baseline_watch
    # MetalLB reprocesses every Service after each new allocation: both phases must run beside as many.
    # A claim's address outlives its Service (the driver's placeholder holds it): the claims go too,
    # and their class reclaims with Delete, so MetalLB releases every address.
    say("attach: deleting the baseline's Services and claims; MetalLB releases their addresses")
    for name in ["base-warmup", *base.driven.created_at]:
        await kube.delete(SERVICES.path(NAMESPACE, name))
        await kube.delete(CLAIMS.path(NAMESPACE, name))
    await balancer.wait_for_pool(pool_name(BASELINE_CLASS), WARMUP_TIMEOUT, assigned=0)
    return base


async def _health(
    kube: Kube, names: Sequence[str], operator: RunningOperator, balancer: MetalLB
) -> list[str]:
    """What the API holds after the run, and whether the operator and MetalLB came through it."""
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
    return notes


async def _check(kube: Kube, names: Sequence[str]) -> str:
    """Every measured attachment Provisioned with its own addresses, from a claim it controls."""
    listed = (await kube.list(ATTACHMENTS.path(NAMESPACE)))["items"]
    wanted = set(names)
    ours = [a for a in listed if a["metadata"]["name"] in wanted]
    addresses = [x for a in ours for x in (a.get("status") or {}).get("addresses") or []]
    claims = (await kube.list(CLAIMS.path(NAMESPACE)))["items"]
    owner_of = {
        c["metadata"]["name"]: str(r.get("uid"))
        for c in claims
        for r in c["metadata"].get("ownerReferences") or []
        if r.get("kind") == ATTACHMENT_KIND and r.get("controller")
    }
    held_right = sum(
        1 for a in ours if owner_of.get(str((a.get("status") or {}).get("claimName"))) == a["metadata"]["uid"]
    )
    provisioned = sum(1 for a in ours if condition_true(a, "Provisioned"))
    return (
        f"API check: {provisioned}/{len(names)} attachments Provisioned, {len(set(addresses))} distinct "
        f"addresses among {len(addresses)}, {held_right} from a claim they control; {len(owner_of)} minted "
        "claims in all (warm-up included)"
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
    ready = _latencies(driven, seen.attachments.at["provisioned"])
    base_done = _latencies(base.driven, seen.baseline.at["answered"])
    rows = [
        Row(
            f"attach: attachments Provisioned ({options.in_flight} in flight)",
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
                    f"attach: create → Provisioned, {label}",
                    duration(mine),
                    f"≤ {RATIO_TARGET:.1f}{MULTIPLY} baseline" if targeted else "",
                    mine / theirs <= RATIO_TARGET if targeted else None,
                    f"÷ baseline {duration(theirs)} = {ratio(mine / theirs)}",
                )
            )
    rows.append(
        Row(
            "  baseline: claim + LB Service by hand → ingress, p50 / p99",
            _p50_p99(base_done),
            ratio="same MetalLB, same concurrency",
        )
    )
    rows += _stage_rows(driven, base.driven, seen)
    if driven.wall > 0 and base.driven.wall > 0:
        rate, base_rate = len(ready) / driven.wall, len(base_done) / base.driven.wall
        rows.append(
            Row(
                "context: throughput, attachments Provisioned/s",
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
    writes, requests, breakdown = _writes_row(phase, base, len(driven.created_at))
    rows += [requests, writes]
    notes = [breakdown]
    if driven.timed_out:
        notes.append(
            f"{len(driven.timed_out)} attachments not Provisioned within {options.item_timeout:.0f}s, e.g. "
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
    keys = {n: (NAMESPACE, seen.service_of[n]) for n in names if n in seen.service_of}
    service_seen = {n: balancer.seen_at[k] for n, k in keys.items() if k in balancer.seen_at}
    answered = {n: balancer.answered_at[k] for n, k in keys.items() if k in balancer.answered_at}
    stamped, done = seen.attachments.at["stamped"], seen.attachments.at["provisioned"]
    stages = [
        ("POST answered", driven.created_at, driven.returned_at),
        ("first pass (create → finalizer)", driven.created_at, stamped),
        ("mint (finalizer → claim)", stamped, seen.minted_at),
        ("substrate (claim → Bound)", seen.minted_at, seen.bound_at),
        ("render (Bound → Service)", seen.bound_at, service_seen),
        ("pin and MetalLB (Service → ingress)", service_seen, answered),
        ("status (ingress → Provisioned)", answered, done),
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
            "  baseline: claim POST answered; create → Service seen → MetalLB's answer seen",
            " / ".join(duration(percentile(v, 0.5)) if v else "-" for v in steps),
            ratio="p50 of each",
        )
    )
    return rows


WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE")


def _writes_row(phase: Phase, base: Phase, created: int) -> tuple[Row, Row, str]:
    """The operator's API requests per attachment (target), API writes of everyone per attachment
    (context), and a note saying what the operator's were."""
    delta, n = phase.requests, max(1, created)
    writes = sum(v for (verb, *_), v in delta.items() if verb in WRITE_VERBS)
    base_writes = sum(v for (verb, *_), v in base.requests.items() if verb in WRITE_VERBS)
    parts = [
        ("attachment PATCH", count(delta, "PATCH", "endpointattachments")),
        ("attachment status PATCH", count(delta, "PATCH", "endpointattachments", "status")),
        ("claim POST", count(delta, "POST", "ipaddressclaims")),
        ("claim DELETE", count(delta, "DELETE", "ipaddressclaims")),
        ("Service POST", count(delta, "POST", "services")),
        ("Service DELETE", count(delta, "DELETE", "services")),
    ]
    mine = sum(value for _, value in parts) / n
    requests = Row(
        "attach: the operator's API requests per attachment",
        f"{mine:.1f}",
        f"≤ {REQUESTS_TARGET:.0f}",
        mine <= REQUESTS_TARGET,
        "writes only: its reads are the informers' LIST and WATCH",
    )
    row = Row(
        "context: API writes per attachment (API server's count, every writer)",
        f"{writes / n:.1f}",
        ratio=f"baseline {base_writes / max(1, len(base.driven.created_at)):.1f} per claim and Service",
    )
    note = "operator's requests per attachment: " + ", ".join(
        f"{label} {value / n:.2f}" for label, value in parts
    )
    return row, requests, note
