"""EndpointAttachment resilience (issue 9): restarts withdraw nothing, and a network that breaks (cut,
then half-open) loses nothing the operator must act on.

Both proofs run the real operator as a subprocess under its own ServiceAccount
(``tests.support.ea_cluster``), against the local control plane, with MetalLB's real controller as the
load balancer (``tests.support.loadbalancer``: an IPAddressPool per IPAddressClass).

* ``test_restarts_withdraw_nothing`` publishes one attachment in each of ``NAMESPACE_COUNT``
  namespaces, among thousands of HelmReleases and Services (half of the attachments are admitted to
  their class only by a Namespace label), plus one exclusivity conflict between two VM-mode
  attachments; then restarts the operator ``RESTARTS`` times (SIGTERM, a new process), each time
  waiting until the new process leads and has passed over every attachment (its pass counter, an
  empty queue, no busy worker). A list-then-watch held across all the restarts must see no rendered
  Service deleted or created again, no Ready condition change, no attachment deleted, and the loser
  of the conflict never Ready; the rendered Services' UIDs and the allocations are the same after.
* ``test_deletions_while_cut_off_and_a_half_open_network`` runs the operator through the fault proxy
  (``tests.support.faultproxy``). While the proxy refuses (and the operator has lost its watches),
  an admin deletes a rendered Service, an endpoint Service, and a namespace with its attachment;
  once the proxy forwards again, the operator's re-lists must show it all: it re-creates the first,
  withdraws the Service of the second attachment (EndpointNotFound), and finalizes the third
  (its address released). Then the proxy blackholes: calls time out (``API_TIMEOUT_SECONDS``), and once
  it forwards again a change made during the blackhole and one made after it are both acted on, by
  the same process, still leading. Both outages stay well below the leader's renew deadline (10s):
  losing the lease ends the process by design, which is a restart, the first proof's subject.

Every wait is on a condition with a deadline (``tests.support.waiting``), never a bare sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx
import pytest

from hack.devcluster import ClusterInfo
from hack.metallb import MetalLB
from operators.endpointattachment.constants import (
    ATTACHMENT_LABEL,
    MODE_WHOLE_IP,
    REASON_ENDPOINT_NOT_FOUND,
    REASON_EXCLUSIVITY_CONFLICT,
    REASON_PUBLISHED,
)
from shared.kube import NO_ANSWER, ApiError, Kube, Obj
from shared.resources import HELMRELEASES, NAMESPACES, PODS, SERVICE_ACCOUNTS, SERVICES
from shared.runtime.cache import Key, key_of
from tests.ea_builders import (
    for_create,
    lineage_labels,
    make_attachment,
    make_class,
    make_helmrelease,
    make_service,
    make_serviceproxy,
)
from tests.support.ea_cluster import (
    ALLOCATIONS,
    ATTACHMENT_CONTROLLER,
    ATTACHMENTS,
    CLASSES,
    LEADER_ELECTION_ID,
    NODE,
    PROXIES,
    alive_and_no_unexpected_traceback,
    condition,
    ea_crds_and_node,
    ea_operator,
    operator_kubeconfig,
)
from tests.support.faultproxy import Mode, fault_proxy, kubeconfig_server, proxy_kubeconfig
from tests.support.operators import RunningOperator
from tests.support.waiting import eventually, wait_for_object

# --- the load of the restart proof ---------------------------------------------------------------

# Hundreds of tenant namespaces, one published attachment in each.
NAMESPACE_COUNT: Final = 200
# Thousands of HelmReleases and Services in total (the attachment's application and its endpoint
# are one of each per namespace); every one of them is cached, and must be, before any decision.
# 8 of each per namespace (1,600 + 1,600) rather than 10 (2,000 + 2,000): creating them is most of
# the proof's time on 2 shared cores, and a restart's LIST already spans thousands of objects.
RELEASES_PER_NAMESPACE: Final = 8
SERVICES_PER_NAMESPACE: Final = 8
# Creates in flight at once: enough to keep the API server busy, few enough for 2 shared cores.
CREATE_CONCURRENCY: Final = 32
# The restarts, each a SIGTERM and a new process.
RESTARTS: Final = 5
LOAD_PREFIX: Final = "ea-rs"
# Half the namespaces are "public": the class of their attachments admits only those, by this label,
# so a decision made before the Namespace cache synced would withdraw them.
TIER_LABEL: Final = "resilience.cozystack.io/tier"
PUBLIC_TIER: Final = "public"
PRIVATE_TIER: Final = "private"
OPEN_CLASS: Final = "rs-open"
PUBLIC_CLASS: Final = "rs-public"
OPEN_CIDR: Final = "100.64.0.0/23"
PUBLIC_CIDR: Final = "100.64.2.0/23"
# The VM-mode exclusivity conflict: two WholeIP attachments on one pod; the older publishes.
VM_NAMESPACE: Final = f"{LOAD_PREFIX}-vm"
VM_APP: Final = "vm1"
VM_WINNER: Final = "vm-older"
VM_LOSER: Final = "vm-younger"
VM_POD_IP: Final = "10.244.7.10"
ATTACHMENT_NAME: Final = "published"
ENDPOINT_APP: Final = "app0"  # the application of the attachment in each namespace
# Every attachment the operator passes over after a restart: one per namespace, and the VM pair.
ATTACHMENT_TOTAL: Final = NAMESPACE_COUNT + 2
PUBLISHED_TOTAL: Final = NAMESPACE_COUNT + 1  # all but the conflict's loser
# Bounds of the waits of the restart proof.
SETTLE_SECONDS: Final = 150.0  # every attachment published after the first start (cold, under load)
SETTLE_POLL_SECONDS: Final = 1.0
CAUGHT_UP_SECONDS: Final = 60.0  # a restarted operator leads and has passed over every attachment
CLEANUP_SECONDS: Final = 90.0
# After a failure, clean-up is best effort and short: the failure is the news.
CLEANUP_AFTER_FAILURE_SECONDS: Final = 20.0
# The annotation a test writes to an attachment (and the name of a Service it creates) to learn that
# the recorder's watches have delivered everything up to that write.
SENTINEL_ANNOTATION: Final = "resilience.cozystack.io/sentinel"
SENTINEL_SERVICE: Final = "recorder-sentinel"
RENDERED_PREFIX: Final = "ea-"
HEADLESS: Final = "None"  # spec.clusterIP of a headless Service
READY: Final = "Ready"
DATAPATH_ADMITTED: Final = "DatapathAdmitted"
TRUE: Final = "True"
FALSE: Final = "False"
# The recorder's first LIST of each kind, before it watches.
RECORDER_LISTED_SECONDS: Final = 30.0
# The longest name of a namespace (a DNS label).
NAMESPACE_NAME_MAX: Final = 63

# --- the broken-network proof --------------------------------------------------------------------

# Every API call of the operator but a watch gets this long through the proxy: short, so that the
# half-open network is noticed well within the leader's renew deadline (10s).
API_TIMEOUT_SECONDS: Final = 2.0
FAULT_CLASS: Final = "rs-fault"
FAULT_CIDR: Final = "100.64.8.0/28"
# Within this, the operator must have noticed the cut: its watches end at once, and it says so.
CUT_NOTICED_SECONDS: Final = 5.0
# How long after forwarding again the operator may take to act on what happened meanwhile (an
# informer's backoff is at most 5s, a pass a fraction of a second).
RECOVERY_SECONDS: Final = 30.0
# Within this, a call must time out in the blackhole: the next lease renew (every 2s) plus the
# timeout of a new connection's TLS handshake (5s); still below the 10s renew deadline.
TIMED_OUT_WITHIN_SECONDS: Final = 8.0
# Log lines that show a call timed out, and that a watch was lost and the kind listed again.
TIMED_OUT_MARK: Final = "APITimeoutError"
RELISTED_MARK: Final = "listing again"
LOG_POLL_SECONDS: Final = 0.1
ATTACHMENT_WAIT_SECONDS: Final = 40.0


@pytest.fixture(scope="module")
async def ea_crds(kube: Kube) -> AsyncIterator[None]:
    """The operator's CRDs, Flux's HelmRelease CRD and the test Node, for this module."""
    async with ea_crds_and_node(kube):
        yield


# --- building the world ----------------------------------------------------------------------------


async def run_bounded(jobs: Iterable[Callable[[], Awaitable[object]]], limit: int) -> int:
    """Run every job, at most ``limit`` at once; return how many ran."""
    pending = iter(jobs)
    done = 0

    async def worker() -> None:
        nonlocal done
        for job in pending:  # one iterator shared by the workers: each job runs once
            await job()
            done += 1

    async with asyncio.TaskGroup() as group:
        for _ in range(limit):
            group.create_task(worker())
    return done


def helmrelease_body(namespace: str, app: str, kind: str = "Postgres") -> Obj:
    """A Cozystack application's HelmRelease, as Flux's CRD accepts it, with the lineage labels."""
    release = make_helmrelease(
        f"{kind.lower()}-{app}", namespace, labels=lineage_labels(kind=kind, name=app, tenant_facing=False)
    )
    body = for_create(release)
    return body


def service_body(
    name: str,
    namespace: str,
    app: str,
    *,
    selector: Mapping[str, str],
    kind: str = "Postgres",
    tenant_facing: bool = True,
    ports: Sequence[Mapping[str, Any]] | None = None,
) -> Obj:
    """A Service of an application, labelled as Cozystack's lineage webhook labels it."""
    service = make_service(
        name,
        namespace,
        labels=lineage_labels(kind=kind, name=app, tenant_facing=tenant_facing),
        selector=selector,
        ports=ports,
    )
    body = for_create(service)
    return body


def background_service_body(name: str, namespace: str, app: str) -> Obj:
    """An application's headless Service without a selector, not tenant-facing: cached like any
    Service, and cheap to create by the thousand (no cluster IP to allocate, and no EndpointSlice or
    Endpoints for the controller-manager to add)."""
    body = service_body(name, namespace, app, selector={}, tenant_facing=False)
    body["spec"]["clusterIP"] = HEADLESS
    return body


def attachment_body(name: str, namespace: str, endpoint: str, class_name: str, **kwargs: Any) -> Obj:
    """An attachment of ``endpoint`` minting from ``class_name``, ready to create."""
    return for_create(
        make_attachment(name, namespace, endpoint=endpoint, class_name=class_name, owner_uid=None, **kwargs)
    )


def namespace_body(name: str, labels: Mapping[str, str] | None = None) -> Obj:
    """A Namespace with ``labels``."""
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": dict(labels or {})}}


@dataclass(frozen=True)
class Load:
    """What the restart proof created (for its counts and its clean-up)."""

    namespaces: tuple[str, ...]
    releases: int
    services: int
    seconds: float


def load_namespace(index: int) -> tuple[str, str]:
    """(name, tier) of load namespace ``index``: even ones are public."""
    return f"{LOAD_PREFIX}-{index:03d}", PUBLIC_TIER if index % 2 == 0 else PRIVATE_TIER


async def create_load(kube: Kube) -> Load:
    """The classes, the namespaces, and in each namespace its applications' HelmReleases and Services
    (one of them the endpoint of its attachment) and the attachment; plus the VM conflict."""
    started = time.monotonic()
    await kube.create(CLASSES.path(), for_create(make_class(OPEN_CLASS, cidrs=[OPEN_CIDR])))
    public = {"matchLabels": {TIER_LABEL: PUBLIC_TIER}}
    await kube.create(
        CLASSES.path(), for_create(make_class(PUBLIC_CLASS, cidrs=[PUBLIC_CIDR], allowed_namespaces=public))
    )
    await kube.create(PROXIES.path(), for_create(make_serviceproxy()))
    spaces = [load_namespace(i) for i in range(NAMESPACE_COUNT)]

    def create(path: str, body: Obj) -> Callable[[], Awaitable[object]]:
        return lambda: kube.create(path, body)

    await run_bounded(
        [
            *(create(NAMESPACES.path(), namespace_body(ns, {TIER_LABEL: tier})) for ns, tier in spaces),
            create(NAMESPACES.path(), namespace_body(VM_NAMESPACE, {TIER_LABEL: PRIVATE_TIER})),
        ],
        CREATE_CONCURRENCY,
    )

    def objects() -> Iterable[Callable[[], Awaitable[object]]]:
        for ns, tier in spaces:
            for j in range(RELEASES_PER_NAMESPACE):
                yield create(HELMRELEASES.path(ns), helmrelease_body(ns, f"app{j}"))
            yield create(
                SERVICES.path(ns),
                service_body(f"postgres-{ENDPOINT_APP}-rw", ns, ENDPOINT_APP, selector={"app": ENDPOINT_APP}),
            )
            # The rest: the applications' other Services, not tenant-facing.
            for j in range(1, SERVICES_PER_NAMESPACE):
                yield create(
                    SERVICES.path(ns),
                    background_service_body(f"postgres-app{j}-headless", ns, f"app{j}"),
                )
            class_name = PUBLIC_CLASS if tier == PUBLIC_TIER else OPEN_CLASS
            yield create(
                ATTACHMENTS.path(ns),
                attachment_body(ATTACHMENT_NAME, ns, f"postgres-{ENDPOINT_APP}-rw", class_name),
            )

    await run_bounded(objects(), CREATE_CONCURRENCY)
    await create_vm_conflict(kube)
    return Load(
        namespaces=(*(ns for ns, _ in spaces), VM_NAMESPACE),
        releases=NAMESPACE_COUNT * RELEASES_PER_NAMESPACE + 1,
        services=NAMESPACE_COUNT * SERVICES_PER_NAMESPACE + 1,
        seconds=time.monotonic() - started,
    )


async def create_vm_conflict(kube: Kube) -> None:
    """A VM with one ready launcher pod, and two WholeIP attachments on its Service: the older one
    (created first, and first by name) publishes, the younger one must stay dark."""
    ns = VM_NAMESPACE
    kind = "VMInstance"
    await kube.create(HELMRELEASES.path(ns), helmrelease_body(ns, VM_APP, kind))
    ssh = [{"name": "ssh", "protocol": "TCP", "port": 22, "targetPort": 22}]
    await kube.create(
        SERVICES.path(ns), service_body(VM_APP, ns, VM_APP, selector={"vm": VM_APP}, kind=kind, ports=ssh)
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{VM_APP}-launcher", "labels": {"vm": VM_APP}},
        "spec": {"nodeName": NODE, "containers": [{"name": "vm", "image": "example.invalid/vm:1"}]},
    }
    # The ServiceAccount admission wants the namespace's default ServiceAccount before any Pod.
    await wait_for_object(kube, SERVICE_ACCOUNTS, "default", lambda o: o is not None, namespace=ns)
    await kube.create(PODS.path(ns), pod)
    status = {
        "phase": "Running",
        "podIP": VM_POD_IP,
        "podIPs": [{"ip": VM_POD_IP}],
        "conditions": [{"type": "Ready", "status": TRUE}],
    }
    await kube.patch(PODS.path(ns, f"{VM_APP}-launcher") + "/status", {"status": status}, kind="merge")
    for name in (VM_WINNER, VM_LOSER):
        await kube.create(
            ATTACHMENTS.path(ns), attachment_body(name, ns, VM_APP, OPEN_CLASS, mode=MODE_WHOLE_IP)
        )


async def settled(kube: Kube) -> list[Obj] | None:
    """Every attachment published, but the conflict's loser, which is dark for its conflict."""
    items = (await kube.list(ATTACHMENTS.path()))["items"]
    published = [a for a in items if condition(a, READY) == (TRUE, REASON_PUBLISHED)]
    loser = [
        a
        for a in items
        if key_of(a) == (VM_NAMESPACE, VM_LOSER)
        and condition(a, DATAPATH_ADMITTED) == (FALSE, REASON_EXCLUSIVITY_CONFLICT)
    ]
    return items if len(items) == ATTACHMENT_TOTAL and len(published) == PUBLISHED_TOTAL and loser else None


async def remove_load(kube: Kube, load: Load, timeout: float = CLEANUP_SECONDS) -> None:
    """Delete the attachments, then the namespaces, and wait until the still running operator has
    finalized every attachment; then delete the cluster-scoped objects. The namespaces' other
    content is the namespace controller's to remove, in the background. (Leaving the attachments to
    the namespace controller would finalize them at its pace, kind by kind, after it deleted their
    rendered Services.)"""
    listed = (await kube.list(ATTACHMENTS.path()))["items"]
    await run_bounded(
        [functools.partial(kube.delete, ATTACHMENTS.path(*key_of(a))) for a in listed], CREATE_CONCURRENCY
    )
    for pod in (await kube.list(PODS.path(VM_NAMESPACE)))["items"]:
        await kube.delete(PODS.path(VM_NAMESPACE, pod["metadata"]["name"]), grace_period_seconds=0)
    await run_bounded(
        [functools.partial(kube.delete, NAMESPACES.path(name=ns)) for ns in load.namespaces],
        CREATE_CONCURRENCY,
    )

    async def attachments_gone() -> bool:
        return not (await kube.list(ATTACHMENTS.path(), limit=1))["items"]

    await eventually(
        attachments_gone, timeout=timeout, interval=SETTLE_POLL_SECONDS, what="attachments finalized"
    )
    for path in (
        CLASSES.path(name=OPEN_CLASS),
        CLASSES.path(name=PUBLIC_CLASS),
        PROXIES.path(name="cozy-proxy"),
    ):
        await kube.delete(path)


# --- the recorder ----------------------------------------------------------------------------------


@dataclass
class Recorder:
    """A list-then-watch of the rendered Services (by the attachment label) and of every attachment,
    held across a whole run: every ADDED and DELETED of a Service (with its UID), and every change of
    an attachment's Ready status. A watch that ends normally is resumed from the last version seen;
    one that fails (410 Gone, an ERROR event) is a gap, and a gap fails the proof."""

    kube: Kube
    services: dict[Key, list[tuple[str, str]]] = field(default_factory=lambda: defaultdict(list))
    service_modifications: Counter[Key] = field(default_factory=Counter)
    ready: dict[Key, str] = field(default_factory=dict)
    ready_changes: list[tuple[Key, str, str]] = field(default_factory=list)
    ever_ready: set[Key] = field(default_factory=set)
    attachment_modifications: Counter[Key] = field(default_factory=Counter)
    attachments_deleted: list[Key] = field(default_factory=list)
    sentinels: set[str] = field(default_factory=set)
    gaps: list[str] = field(default_factory=list)
    listed: dict[str, asyncio.Event] = field(
        default_factory=lambda: {"services": asyncio.Event(), "attachments": asyncio.Event()}
    )

    async def run(self) -> None:
        """Follow both kinds until cancelled."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._follow("services", SERVICES.path(), ATTACHMENT_LABEL, self._on_service))
            group.create_task(self._follow("attachments", ATTACHMENTS.path(), "", self._on_attachment))

    async def _follow(
        self, name: str, path: str, label_selector: str, on_event: Callable[[str, Obj], None]
    ) -> None:
        listing = await self.kube.list(path, label_selector=label_selector)
        for obj in listing["items"]:
            on_event("LISTED", obj)
        version = listing["metadata"]["resourceVersion"]
        self.listed[name].set()
        while True:
            try:
                async for kind, obj in self.kube.watch(
                    path, resource_version=version, label_selector=label_selector
                ):
                    if kind == "ERROR":
                        self.gaps.append(f"{name}: {obj}")
                        return
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                    if kind != "BOOKMARK":
                        on_event(kind, obj)
            except (ApiError, *NO_ANSWER) as error:
                self.gaps.append(f"{name}: {type(error).__name__}: {error}")
                return

    def _on_service(self, kind: str, service: Obj) -> None:
        key = key_of(service)
        if key[1] == SENTINEL_SERVICE:
            self.sentinels.add(str((service["metadata"].get("annotations") or {}).get(SENTINEL_ANNOTATION)))
            return
        if kind in ("LISTED", "ADDED", "DELETED"):
            self.services[key].append((kind, service["metadata"]["uid"]))
        elif kind == "MODIFIED":
            self.service_modifications[key] += 1

    def _on_attachment(self, kind: str, attachment: Obj) -> None:
        key = key_of(attachment)
        sentinel = (attachment["metadata"].get("annotations") or {}).get(SENTINEL_ANNOTATION)
        if sentinel:
            self.sentinels.add(sentinel)
        if kind == "DELETED":
            self.attachments_deleted.append(key)
            return
        if kind == "MODIFIED":
            self.attachment_modifications[key] += 1
        status = condition(attachment, READY)[0]
        if status == TRUE:
            self.ever_ready.add(key)
        before = self.ready.get(key)
        if before is not None and before != status:
            self.ready_changes.append((key, before, status))
        self.ready[key] = status

    def rendered_churn(self) -> dict[Key, list[tuple[str, str]]]:
        """Rendered Services with any event after the initial list: a deletion or a re-creation."""
        return {
            key: events
            for key, events in self.services.items()
            if key[1].startswith(RENDERED_PREFIX) and [kind for kind, _ in events] != ["LISTED"]
        }


@contextlib.asynccontextmanager
async def recording(kube: Kube) -> AsyncIterator[Recorder]:
    """A running recorder whose initial lists are done."""
    recorder = Recorder(kube)
    task = asyncio.create_task(recorder.run())
    try:
        await asyncio.wait_for(
            asyncio.gather(*(e.wait() for e in recorder.listed.values())), timeout=RECORDER_LISTED_SECONDS
        )
        yield recorder
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def sync_recorder(kube: Kube, recorder: Recorder, token: str) -> None:
    """Write a sentinel to both watched kinds and wait until the recorder has seen both: every change
    before the writes has been delivered to it by then (a watch delivers in order)."""
    annotation = {"metadata": {"annotations": {SENTINEL_ANNOTATION: token}}}
    await kube.patch(ATTACHMENTS.path(VM_NAMESPACE, VM_WINNER), annotation, "merge")
    sentinel = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": SENTINEL_SERVICE,
            "labels": {ATTACHMENT_LABEL: SENTINEL_SERVICE},
            "annotations": {SENTINEL_ANNOTATION: f"{token}-service"},
        },
        "spec": {"ports": [{"port": 1}]},
    }
    await kube.create(SERVICES.path(VM_NAMESPACE), sentinel)

    async def seen() -> bool:
        return {token, f"{token}-service"} <= recorder.sentinels

    await eventually(seen, what="the recorder to see the sentinels")


# --- the operator's progress -----------------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    """What the operator's metrics say of its leadership and its attachment controller."""

    leading: bool
    passes: float
    errors: float
    depth: float
    active: float


async def progress(operator: RunningOperator) -> Progress | None:
    """The operator's leadership and attachment controller, from its metrics (None: not serving)."""
    try:
        samples = await operator.scrape()
    except httpx.HTTPError:
        return None
    controller = ("controller", ATTACHMENT_CONTROLLER)
    passes = [
        (labels, v)
        for (name, labels), v in samples.items()
        if name == "controller_runtime_reconcile_total" and controller in labels
    ]
    return Progress(
        leading=samples.get(("leader_election_master_status", (("name", LEADER_ELECTION_ID),))) == 1,
        passes=sum(v for _, v in passes),
        errors=sum(v for labels, v in passes if ("result", "error") in labels),
        depth=samples.get(("workqueue_depth", (("name", ATTACHMENT_CONTROLLER),)), -1.0),
        active=samples.get(("controller_runtime_active_workers", (controller,)), -1.0),
    )


async def caught_up(operator: RunningOperator, passes: int) -> Progress:
    """Wait until the operator leads, has made at least ``passes`` passes over attachments, and has
    none queued or running."""

    async def probe() -> Progress | None:
        if operator.process.returncode is not None:
            raise AssertionError(f"operator exited ({operator.process.returncode}):\n{operator.log_tail()}")
        now = await progress(operator)
        done = now is not None and now.leading and now.passes >= passes and now.depth == 0 and now.active == 0
        return now if done else None

    try:
        return await eventually(probe, timeout=CAUGHT_UP_SECONDS, what=f"{passes} passes, queue drained")
    except AssertionError as error:
        raise AssertionError(f"{error}\noperator log:\n{operator.log_tail()}") from None


async def rendered_services(kube: Kube) -> dict[Key, Obj]:
    listing = await kube.list(SERVICES.path(), label_selector=ATTACHMENT_LABEL)
    return {key_of(s): s for s in listing["items"] if s["metadata"]["name"].startswith(RENDERED_PREFIX)}


async def allocations(kube: Kube) -> dict[str, str]:
    """Every allocation: name -> UID."""
    return {
        a["metadata"]["name"]: a["metadata"]["uid"] for a in (await kube.list(ALLOCATIONS.path()))["items"]
    }


# --- the proofs ------------------------------------------------------------------------------------


class Stopwatch:
    """Laps of a long proof, printed as they end (shown with ``pytest -s``): the report's figures."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def lap(self, what: str, *, quiet: bool = False) -> float:
        """Seconds since the last lap (printed with ``what`` unless ``quiet``)."""
        now = time.monotonic()
        seconds, self.started = now - self.started, now
        if not quiet:
            print(f"{what}: {seconds:.1f}s", flush=True)
        return seconds


async def test_restarts_withdraw_nothing(
    kube: Kube, cluster: ClusterInfo, ea_crds: None, lb: MetalLB, tmp_path: Path
) -> None:
    """Issue 9, proof 1: restarting the operator, with thousands of objects its caches must hold
    before it decides anything, withdraws no Service, flips no Ready and re-mints no address."""
    watch = Stopwatch()
    load = await create_load(kube)
    watch.lap(
        f"\nload: {len(load.namespaces)} namespaces, {load.releases} HelmReleases, {load.services} Services, "
        f"{ATTACHMENT_TOTAL} attachments created"
    )
    kubeconfig = await operator_kubeconfig(kube, cluster, tmp_path / "op.kubeconfig")
    stack = contextlib.AsyncExitStack()
    removed = False
    try:
        operator = await stack.enter_async_context(
            ea_operator(kube, cluster, tmp_path, kubeconfig=kubeconfig, log_name="operator-0.log")
        )
        try:
            await eventually(
                lambda: settled(kube),
                timeout=SETTLE_SECONDS,
                interval=SETTLE_POLL_SECONDS,
                what="every attachment published",
            )
        except AssertionError as error:
            raise AssertionError(f"{error}\noperator log:\n{operator.log_tail()}") from None
        await caught_up(operator, ATTACHMENT_TOTAL)
        watch.lap("first start: every attachment published")
        services_before = await rendered_services(kube)
        allocations_before = await allocations(kube)
        assert len(services_before) == PUBLISHED_TOTAL

        async with recording(kube) as recorder:
            for restart in range(1, RESTARTS + 1):
                await stack.aclose()
                assert operator.process.returncode == 0, operator.log_tail()
                stopped = watch.lap(f"restart {restart}: stopped", quiet=True)
                stack = contextlib.AsyncExitStack()
                operator = await stack.enter_async_context(
                    ea_operator(
                        kube, cluster, tmp_path, kubeconfig=kubeconfig, log_name=f"operator-{restart}.log"
                    )
                )
                after = await caught_up(operator, ATTACHMENT_TOTAL)
                watch.lap(
                    f"restart {restart}: stopped in {stopped:.1f}s; "
                    f"started, leading, {after.passes:.0f} passes"
                )
                assert after.errors == 0, operator.log_tail()
            await sync_recorder(kube, recorder, "after-restarts")

        assert not recorder.gaps, recorder.gaps
        assert recorder.rendered_churn() == {}, "rendered Services deleted or created again"
        assert recorder.ready_changes == [], "Ready changed across restarts"
        assert recorder.attachments_deleted == []
        assert (VM_NAMESPACE, VM_LOSER) not in recorder.ever_ready
        assert sum(1 for status in recorder.ready.values() if status == TRUE) == PUBLISHED_TOTAL
        services_after = await rendered_services(kube)
        assert {k: s["metadata"]["uid"] for k, s in services_after.items()} == {
            k: s["metadata"]["uid"] for k, s in services_before.items()
        }
        assert await allocations(kube) == allocations_before, "an address was released or minted again"
        watch.lap(
            f"checked: rendered Service updates {sum(recorder.service_modifications.values())}, "
            f"attachment updates {sum(recorder.attachment_modifications.values()) - 1} (not the sentinel)"
        )
        await remove_load(kube, load)
        removed = True
        watch.lap("attachments finalized, namespaces deleted")
    finally:
        if not removed:
            with contextlib.suppress(Exception):  # best effort: the failure being raised is the news
                await remove_load(kube, load, CLEANUP_AFTER_FAILURE_SECONDS)
        await stack.aclose()


async def test_deletions_while_cut_off_and_a_half_open_network(
    kube: Kube, cluster: ClusterInfo, ea_crds: None, lb: MetalLB, namespace: str, tmp_path: Path
) -> None:
    """Issue 9, proof 2: deletions made while the operator is cut off are acted on once it is back;
    a half-open network times its calls out, and it recovers without a restart."""
    ns, doomed = namespace, f"{namespace}-doomed"[:NAMESPACE_NAME_MAX]
    watch = Stopwatch()
    await wait_for_object(kube, SERVICE_ACCOUNTS, "default", lambda o: o is not None, namespace=ns)
    await kube.create(CLASSES.path(), for_create(make_class(FAULT_CLASS, cidrs=[FAULT_CIDR])))
    await kube.create(NAMESPACES.path(), namespace_body(doomed))
    for where, app in ((ns, "kept"), (ns, "lost"), (doomed, "gone")):
        await kube.create(HELMRELEASES.path(where), helmrelease_body(where, app))
        await kube.create(
            SERVICES.path(where), service_body(f"postgres-{app}-rw", where, app, selector={"app": app})
        )
        await kube.create(
            ATTACHMENTS.path(where), attachment_body(app, where, f"postgres-{app}-rw", FAULT_CLASS)
        )

    async with fault_proxy(kubeconfig_server(cluster.kubeconfig)) as proxy:
        direct = await operator_kubeconfig(kube, cluster, tmp_path / "op.kubeconfig")
        proxied = proxy_kubeconfig(direct, proxy, tmp_path / "op-proxied.kubeconfig")
        async with ea_operator(
            kube,
            cluster,
            tmp_path,
            kubeconfig=proxied,
            extra_args=[f"--api-timeout-seconds={API_TIMEOUT_SECONDS}"],
            # A pass whose call got no answer may log its traceback (see the report); nothing else.
            check_on_exit=alive_and_no_unexpected_traceback,
        ) as operator:
            published = {}
            for where, name in ((ns, "kept"), (ns, "lost"), (doomed, "gone")):
                published[name] = await wait_attachment(kube, where, name, TRUE, REASON_PUBLISHED, operator)
            kept_service = await kube.get(SERVICES.path(ns, "ea-kept"))
            assert kept_service is not None
            gone_address = published["gone"]["status"]["address"]
            watch.lap("\nthrough the proxy: three attachments published")
            log_mark = operator.log_path.stat().st_size

            # Cut: every connection closed, every new one refused; the operator notices (its watches
            # end and its lists fail). Meanwhile an admin deletes the rendered Service of one
            # attachment, the endpoint of another, and a third's namespace. The namespace
            # controller would mark that attachment for deletion at its own pace, kind by kind; the
            # test marks it at once, so that it happens while the cut lasts (our finalizer holds it).
            await proxy.set_mode(Mode.REFUSE)
            assert proxy.connections == 0
            await eventually(
                lambda: logged_since(operator, log_mark, RELISTED_MARK),
                timeout=CUT_NOTICED_SECONDS,
                interval=LOG_POLL_SECONDS,
                what="the operator to lose its watches",
            )
            await kube.delete(SERVICES.path(ns, "ea-kept"))
            await kube.delete(SERVICES.path(ns, "postgres-lost-rw"))
            await kube.delete(NAMESPACES.path(name=doomed))
            await kube.delete(ATTACHMENTS.path(doomed, "gone"))
            marked = await kube.get(ATTACHMENTS.path(doomed, "gone"))
            assert marked is not None
            assert marked["metadata"].get("deletionTimestamp")
            await proxy.set_mode(Mode.FORWARD)
            watch.lap("cut: three deletions made while refused")

            # Forwarding again: the caches list again, and every deletion is acted on.
            recreated = await wait_for_object(
                kube,
                SERVICES,
                "ea-kept",
                lambda s: s is not None and s["metadata"]["uid"] != kept_service["metadata"]["uid"],
                namespace=ns,
                timeout=RECOVERY_SECONDS,
                what="ea-kept re-created",
            )
            assert recreated is not None
            await wait_attachment(kube, ns, "kept", TRUE, REASON_PUBLISHED, operator)
            await wait_attachment(kube, ns, "lost", FALSE, REASON_ENDPOINT_NOT_FOUND, operator)
            await wait_for_object(
                kube, SERVICES, "ea-lost", lambda s: s is None, namespace=ns, timeout=RECOVERY_SECONDS
            )
            await wait_for_object(
                kube, ATTACHMENTS, "gone", lambda o: o is None, namespace=doomed, timeout=RECOVERY_SECONDS
            )
            await wait_for_object(
                kube, ALLOCATIONS, gone_address, lambda a: a is None, timeout=RECOVERY_SECONDS
            )
            watch.lap("forwarding: every deletion acted on")

            # Half-open: nothing flows, nothing is refused; only the operator's timeouts can tell.
            log_mark = operator.log_path.stat().st_size
            await proxy.set_mode(Mode.BLACKHOLE)
            ports = [
                {"name": "postgres", "protocol": "TCP", "port": 5432, "targetPort": 5432},
                {"name": "metrics", "protocol": "TCP", "port": 9187, "targetPort": 9187},
            ]
            await kube.patch(SERVICES.path(ns, "postgres-kept-rw"), {"spec": {"ports": ports}}, "merge")

            await eventually(
                lambda: logged_since(operator, log_mark, TIMED_OUT_MARK),
                timeout=TIMED_OUT_WITHIN_SECONDS,
                interval=LOG_POLL_SECONDS,
                what="a call to time out",
            )
            await proxy.set_mode(Mode.FORWARD)
            watch.lap("blackhole: a call timed out")

            # The change made during the blackhole, and one made after it, are both acted on.
            await kube.create(
                ATTACHMENTS.path(ns), attachment_body("late", ns, "postgres-kept-rw", FAULT_CLASS)
            )
            await wait_for_object(
                kube,
                SERVICES,
                "ea-kept",
                lambda s: s is not None and len(s["spec"]["ports"]) == len(ports),
                namespace=ns,
                timeout=RECOVERY_SECONDS,
                what="ea-kept mirroring the port added during the blackhole",
            )
            await wait_attachment(kube, ns, "late", TRUE, REASON_PUBLISHED, operator)
            watch.lap("forwarding: the changes made during and after the blackhole acted on")
            now = await progress(operator)
            assert now is not None
            assert now.leading, operator.log_tail()
            for name in ("kept", "lost", "late"):
                await kube.delete(ATTACHMENTS.path(ns, name))
            for name in ("kept", "lost", "late"):
                await wait_for_object(kube, ATTACHMENTS, name, lambda o: o is None, namespace=ns)
    await kube.delete(CLASSES.path(name=FAULT_CLASS))


async def logged_since(operator: RunningOperator, offset: int, text: str) -> bool:
    """Whether the operator's log holds ``text`` after byte ``offset`` (a probe for ``eventually``)."""
    with operator.log_path.open("rb") as log:
        log.seek(offset)
        return text.encode() in log.read()


async def wait_attachment(
    kube: Kube, namespace: str, name: str, status: str, reason: str, operator: RunningOperator
) -> Obj:
    """The attachment once its Ready condition is (status, reason); the operator's log if it never is."""
    try:
        found = await wait_for_object(
            kube,
            ATTACHMENTS,
            name,
            lambda o: condition(o, READY) == (status, reason),
            namespace=namespace,
            timeout=ATTACHMENT_WAIT_SECONDS,
        )
    except AssertionError as error:
        raise AssertionError(f"{error}\noperator log:\n{operator.log_tail()}") from None
    assert found is not None
    return found
