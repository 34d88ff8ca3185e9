"""Proofs of the GPUClass operator's runtime under restarts and a broken network (issue 9).

The operator runs as in test_gpuclass_operator.py: a subprocess under its own ServiceAccount and
roles (config/rbac/gpuclass), on the local control plane. These tests decide nothing new about
figures: every world here is GPU nodes with no taints (every class sees every unit), one class per
test on a resource name of this file alone, and GPU pods bound to those nodes, so ``freeUnits`` is
the units the nodes advertise minus what the live pods ask for.

Decides, for the operator as it is deployed:

* a restart (SIGTERM, and SIGKILL) in the middle of a steady stream of deletions never shows a
  wrong or stale ``freeUnits`` and the new process writes within a bound of being able to lead;
* pods deleted while the operator's connection was refused are released once the network is back
  (the re-list's replace), and a half-open network (blackhole) costs the client's timeout, not
  the operator;
* liveness fails while a pass is stuck on an API call, and passes again once the call returns;
* after a half-open network (every connection open but dead, new ones served), a change reaches the
  status within 15 s (issue 18).

Does not: test figures (test_gpuclass_operator.py and the unit tests do), or leader election with
an outage longer than its renew deadline (10 s): by design the leader then stops and the process
exits for the kubelet to restart it, so the network tests run a single replica without election.

Every wait here is on a condition with a deadline (the API's watch, the proxy's connections, a
bounded poll of the operator's metrics or health endpoint); the only sleep is the pace of the
deletions in the restart proofs, which is the workload itself, not a wait for an effect.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import httpx
import pytest

from hack.devcluster import ClusterInfo
from harness.faultproxy import FaultProxy, Mode, fault_proxy, kubeconfig_server, proxy_kubeconfig
from harness.identity import serviceaccount_kubeconfig
from harness.manifests import apply_all, load
from harness.operators import RunningOperator, operator_process
from harness.waiting import eventually, wait_for_object
from operators.gpuclass.api import GPUCLASSES
from shared.kube import ApiError, Kube, Obj
from shared.resources import LEASES, PODS, SERVICE_ACCOUNTS
from shared.runtime.manager import LeaderElection
from tests.gpuclass_builders import gpu_pod, make_class, make_node
from tests.integration.test_gpuclass_operator import LEASE, OPERATOR_NAMESPACE, GPUWorld, operator_rbac

# A resource name no other test uses, so no other test's nodes or classes count here.
RESOURCE: Final = "example.com/resilience-gpu"
# The operator's debounce here: each deletion of the stream gets a pass of its own.
DEBOUNCE_SECONDS: Final = 0.2
# The periodic pass (KubeVirt recheck): the network tests rely on passes coming this often.
RECHECK_SECONDS: Final = 2.0
# The bound of issue 9: a restarted operator's first status write, from the moment it may lead.
FIRST_WRITE_SECONDS: Final = 10.0
# Leader election's timings as the operator runs them (controller-runtime's defaults): after a
# SIGKILL nobody releases the lease, so the successor waits for it to expire by its own clock.
ELECTION: Final = LeaderElection(enabled=True, namespace=OPERATOR_NAMESPACE, name=LEASE)
# Upper bound of the waits for a status (an operator starting and listing, a re-list after backoff).
STATUS_DEADLINE_SECONDS: Final = 45.0
# How long a killed operator gets to exit.
EXIT_DEADLINE_SECONDS: Final = 20.0

# --- the restart proofs' world ---
RESTART_NODES: Final = 3
RESTART_NODE_UNITS: Final = 128
RESTART_PODS: Final = 160  # enough for the stream to outlast a successor waiting out the lease
UNITS_OF_POD: Final = (1, 2)  # pods alternate: every deletion moves freeUnits, by 1 or 2
DELETION_PACE_SECONDS: Final = 0.25
DELETIONS_BEFORE_KILL: Final = 8
DELETIONS_AFTER_FIRST_WRITE: Final = 8  # the stream goes on after the successor's first write
CREATE_CONCURRENCY: Final = 16

# --- the network proofs ---
SHORT_API_TIMEOUT_SECONDS: Final = 2.0  # blackholed calls fail this fast
LONG_API_TIMEOUT_SECONDS: Final = 60.0  # ...or hang this long, far past the stuck bound
STUCK_SECONDS: Final = 3.0
HEALTH_DEADLINE_SECONDS: Final = RECHECK_SECONDS + STUCK_SECONDS + 10.0
# A pass that got no answer from the API took at least the client's timeout; a pass that got its
# answers takes milliseconds. The operator's pass histogram has a bucket at one second between them.
SLOW_PASS_BUCKET: Final = "1.0"
PASS_HISTOGRAM: Final = "cozystack_gpuclass_pass_duration_seconds"
# Issue 18's bound: after a half-open network, a change reaches the status within this.
HALF_OPEN_BOUND_SECONDS: Final = 15.0
# The half-open proof waits this long (so that a slower client is measured, not just failed).
HALF_OPEN_WAIT_SECONDS: Final = 150.0
# What the runtime's informer logs when its LIST or WATCH of pods failed and it will LIST again.
POD_INFORMER_FAILED: Final = "shared.runtime.cache: pods: "


def now() -> float:
    return asyncio.get_running_loop().time()


# --- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def gpuclass_crd(kube: Kube) -> None:
    await apply_all(kube, load("config/crd/gpuclass/gpu.cozystack.io_gpuclasses.yaml"))


@pytest.fixture
async def gpu_world(kube: Kube, namespace: str, gpuclass_crd: None) -> AsyncIterator[GPUWorld]:
    await wait_for_object(kube, SERVICE_ACCOUNTS, "default", lambda o: o is not None, namespace=namespace)
    world = GPUWorld(kube, namespace)
    yield world
    await world.cleanup()


@pytest.fixture
async def operator_kubeconfig(kube: Kube, cluster: ClusterInfo, gpuclass_crd: None, tmp_path: Path) -> str:
    """A kubeconfig of the operator's ServiceAccount, authorised by config/rbac/gpuclass only."""
    namespace_doc = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NAMESPACE}}
    await apply_all(kube, [namespace_doc, *operator_rbac()])
    return await serviceaccount_kubeconfig(
        kube, cluster.kubeconfig, OPERATOR_NAMESPACE, "gpuclass-operator", tmp_path / "operator.kubeconfig"
    )


@pytest.fixture
async def proxy(cluster: ClusterInfo) -> AsyncIterator[FaultProxy]:
    async with fault_proxy(kubeconfig_server(cluster.kubeconfig)) as running:
        yield running


@dataclass
class Started:
    """An operator process, the loop time just before it was spawned, and the signal the test
    stopped it with (None: still running, as far as the test is concerned)."""

    running: RunningOperator
    at: float
    stopped_by: signal.Signals | None = None

    async def stop(self, how: signal.Signals) -> None:
        """Send ``how`` and wait for the process to end."""
        self.stopped_by = how
        self.running.process.send_signal(how)
        await asyncio.wait_for(self.running.process.wait(), EXIT_DEADLINE_SECONDS)


@contextlib.asynccontextmanager
async def gpuclass_operator(kubeconfig: str, log_path: Path, *args: str) -> AsyncIterator[Started]:
    """The operator as a subprocess. At the end of the block it must be running, or have ended the
    way the test stopped it (SIGTERM: cleanly); either way with no traceback logged."""
    common = [
        f"--debounce-seconds={DEBOUNCE_SECONDS}",
        f"--kubevirt-recheck-seconds={RECHECK_SECONDS}",
        f"--leader-election-namespace={OPERATOR_NAMESPACE}",
    ]
    at = now()
    async with operator_process("operators.gpuclass", kubeconfig, [*common, *args], log_path) as running:
        started = Started(running, at)
        yield started
        code = running.process.returncode
        if started.stopped_by is None:
            assert code is None, f"the operator died:\n{running.log_tail()}"
        elif started.stopped_by is signal.SIGTERM:
            assert code == 0, f"the operator ended with {code} on SIGTERM:\n{running.log_tail()}"
        assert "Traceback" not in running.log_path.read_text(), running.log_tail(200)


# --- what the API showed ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shown:
    """One version of the class as the API showed it: when the test's watch saw it."""

    seen_at: float
    resource_version: int
    free_units: int | None  # None: no status written yet


@dataclass
class StatusHistory:
    """Every version of one class the API shows, through a watch the test holds from ``start`` to
    ``stop`` (resumed from the last resourceVersion when the server ends it; a 410 re-lists, which
    the restart proofs tolerate: the values seen are still values the API showed)."""

    kube: Kube
    name: str
    shown: list[Shown] = field(default_factory=list)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        version = await self._list()
        self._task = asyncio.create_task(self._follow(version))
        self._task.add_done_callback(lambda _: self._notify())

    async def stop(self) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def wait_for(self, predicate: Callable[[Shown], bool], timeout: float, what: str) -> Shown:
        """The first version shown (from the start) that satisfies ``predicate``."""
        checked = 0
        try:
            async with asyncio.timeout(timeout):
                while True:
                    for shown in self.shown[checked:]:
                        if predicate(shown):
                            return shown
                    checked = len(self.shown)
                    if self._task is not None and self._task.done():
                        self._task.result()  # the watch failed: say why
                    await self._changed.wait()
        except TimeoutError:
            last = self.shown[-1] if self.shown else None
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what}; last shown: {last}"
            ) from None

    def _record(self, obj: Obj) -> None:
        metadata = obj["metadata"]
        free = (obj.get("status") or {}).get("freeUnits")
        self.shown.append(Shown(now(), int(metadata["resourceVersion"]), free))
        self._notify()

    def _notify(self) -> None:
        """Wake every waiter (each re-checks); later waiters wait on a fresh event."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _list(self) -> str:
        listed = await self.kube.list(GPUCLASSES.path(), field_selector=f"metadata.name={self.name}")
        for obj in listed["items"]:
            self._record(obj)
        return str(listed["metadata"]["resourceVersion"])

    async def _follow(self, version: str) -> None:
        selector = f"metadata.name={self.name}"
        while True:
            try:
                async for kind, obj in self.kube.watch(
                    GPUCLASSES.path(), resource_version=version, field_selector=selector
                ):
                    if kind == "ERROR":
                        raise ApiError(int(obj.get("code") or 0), str(obj.get("reason") or ""), "watch")
                    version = obj["metadata"]["resourceVersion"]
                    if kind in ("ADDED", "MODIFIED"):
                        self._record(obj)
            except ApiError as error:
                if error.status != 410:
                    raise
                version = await self._list()


# --- the restart proofs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Truth:
    """The true ``freeUnits`` after each deletion of the stream, and when that deletion began."""

    began_at: float  # -inf for the value before the first deletion
    free_units: int


def history_problems(shown: Sequence[Shown], truth: Sequence[Truth]) -> list[str]:
    """What is wrong with the ``freeUnits`` values the API showed while pods were only deleted.

    ``truth`` is the true free count after each deletion, in order: deletions are made one at a time,
    so the true count runs through exactly these values, rising with each. A value is right only if
    it is one of them (it was the true count at some moment), and it may not show before the
    deletion that made it true began (no operator may count a release ahead of the API). The values
    must never go down (a stale cache, say a restarted operator's first pass written from an old
    list, would make a value that was true once reappear after a later one) and must end at the
    final true count. Versions with no status yet (before the first write) are skipped."""
    problems: list[str] = []
    index = {t.free_units: i for i, t in enumerate(truth)}
    previous: int | None = None
    for item in shown:
        value = item.free_units
        if value is None:
            continue
        position = index.get(value)
        if position is None:
            problems.append(f"freeUnits={value} (rv {item.resource_version}) was never the true count")
        elif item.seen_at < truth[position].began_at:
            problems.append(
                f"freeUnits={value} (rv {item.resource_version}) showed before the deletion making it true"
            )
        if previous is not None and value < previous:
            problems.append(f"freeUnits went down from {previous} to {value} (rv {item.resource_version})")
        previous = value
    if previous != truth[-1].free_units:
        problems.append(f"the last value shown is {previous}, not the final {truth[-1].free_units}")
    return problems


async def create_pods(world: GPUWorld, pods: Sequence[Obj]) -> None:
    limit = asyncio.Semaphore(CREATE_CONCURRENCY)

    async def one(pod: Obj) -> None:
        async with limit:
            await world.pod(pod)

    await asyncio.gather(*(one(pod) for pod in pods))


@dataclass
class DeletionStream:
    """Deletes pods one at a time at a steady pace until told to stop or out of pods; records the
    true ``freeUnits`` after each deletion."""

    kube: Kube
    namespace: str
    pods: list[tuple[str, int]]  # (name, units), in deletion order
    free_before: int
    truth: list[Truth] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    _progress: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.truth.append(Truth(float("-inf"), self.free_before))

    @property
    def deleted(self) -> int:
        return len(self.truth) - 1

    async def run(self) -> None:
        free = self.free_before
        for name, units in self.pods:
            if self.stop.is_set():
                return
            began = now()
            await self.kube.delete(PODS.path(self.namespace, name), grace_period_seconds=0)
            free += units
            self.truth.append(Truth(began, free))
            changed, self._progress = self._progress, asyncio.Event()
            changed.set()
            await asyncio.sleep(DELETION_PACE_SECONDS)  # the stream's pace: the workload, not a wait

    async def until_deleted(self, count: int, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while self.deleted < count:
                await self._progress.wait()


def holder_of(lease: Obj | None) -> str:
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


async def lease_holder(kube: Kube) -> str:
    return holder_of(await kube.get(LEASES.path(OPERATOR_NAMESPACE, LEASE)))


async def successor_leads(kube: Kube, predecessor: str) -> float:
    """When the test first saw the lease name a holder other than ``predecessor`` (loop time)."""
    await wait_for_object(
        kube,
        LEASES,
        LEASE,
        lambda lease: holder_of(lease) not in ("", predecessor),
        namespace=OPERATOR_NAMESPACE,
        timeout=ELECTION.lease_duration + STATUS_DEADLINE_SECONDS,
        what="the successor holding the lease",
    )
    return now()


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
async def test_restart_during_deletions_never_shows_a_wrong_free_count(
    kube: Kube,
    gpu_world: GPUWorld,
    operator_kubeconfig: str,
    tmp_path: Path,
    stop_signal: signal.Signals,
) -> None:
    """Pods are deleted one at a time at a steady pace; the operator is stopped (SIGTERM: it hands
    the lease over; SIGKILL: it cannot) and a new one started while the deletions go on. Every
    ``freeUnits`` the API ever showed meanwhile passes ``history_problems``: a true count of some
    moment, not ahead of the API, never going down, ending at the exact final count.

    The successor's first status write comes within ``FIRST_WRITE_SECONDS`` of the moment it may
    lead: its start after a SIGTERM (the lease was released), the lease's expiry after a SIGKILL
    (by its own clock, a lease duration after it first saw the dead holder's record: a successor
    cannot tell a dead leader from a partitioned one, so it waits that long by design)."""
    class_name = f"resilience-{stop_signal.name.lower()}"
    for n in range(RESTART_NODES):
        await gpu_world.node(make_node(f"restart-{n}", allocatable={RESOURCE: str(RESTART_NODE_UNITS)}))
    pods = [(f"vm-{i}", UNITS_OF_POD[i % len(UNITS_OF_POD)]) for i in range(RESTART_PODS)]
    await create_pods(
        gpu_world,
        [
            gpu_pod(name, RESOURCE, units, node=f"restart-{i % RESTART_NODES}")
            for i, (name, units) in enumerate(pods)
        ],
    )
    free_before = RESTART_NODES * RESTART_NODE_UNITS - sum(units for _, units in pods)
    await gpu_world.gpu_class(make_class(class_name, RESOURCE))
    history = StatusHistory(kube, class_name)
    await history.start()
    stream = DeletionStream(kube, gpu_world.namespace, pods, free_before)
    deleting: asyncio.Task[None] | None = None
    taking_over: asyncio.Task[float] | None = None
    try:
        async with gpuclass_operator(operator_kubeconfig, tmp_path / "first.log") as first:
            await history.wait_for(
                lambda s: s.free_units == free_before, STATUS_DEADLINE_SECONDS, "the first operator's status"
            )
            first_holder = await lease_holder(kube)
            assert first_holder, "the first operator leads, so the lease names it"
            deleting = asyncio.create_task(stream.run())
            await stream.until_deleted(DELETIONS_BEFORE_KILL, STATUS_DEADLINE_SECONDS)
            await first.stop(stop_signal)

        # Every write of the first operator is in the API by now: later versions are the successor's.
        listed = await kube.list(GPUCLASSES.path(), field_selector=f"metadata.name={class_name}")
        version_before = int(listed["metadata"]["resourceVersion"])
        deleted_at_restart = stream.deleted
        async with gpuclass_operator(operator_kubeconfig, tmp_path / "second.log") as second:
            taking_over = asyncio.create_task(successor_leads(kube, first_holder))
            first_write = await history.wait_for(
                lambda s: s.resource_version > version_before,
                ELECTION.lease_duration + STATUS_DEADLINE_SECONDS,
                "the successor's first status write",
            )
            took_over_at = await taking_over
            assert deleting is not None
            assert not deleting.done(), "the deletions ended before the successor's first write"
            await stream.until_deleted(stream.deleted + DELETIONS_AFTER_FIRST_WRITE, STATUS_DEADLINE_SECONDS)
            stream.stop.set()
            await deleting
            final = stream.truth[-1].free_units
            await history.wait_for(
                lambda s: s.free_units == final and s.seen_at >= stream.truth[-1].began_at,
                STATUS_DEADLINE_SECONDS,
                f"the final freeUnits {final}",
            )
    finally:
        stream.stop.set()
        if taking_over is not None:
            taking_over.cancel()
        await asyncio.gather(*(t for t in (deleting, taking_over) if t is not None), return_exceptions=True)
        await history.stop()

    assert stream.deleted > deleted_at_restart, "no deletion ran while the successor started"
    problems = history_problems(history.shown, stream.truth)
    assert not problems, "\n".join(problems) + f"\ntruth: {[t.free_units for t in stream.truth]}"

    since_start = first_write.seen_at - second.at
    if stop_signal is signal.SIGTERM:
        assert since_start <= FIRST_WRITE_SECONDS, f"first write {since_start:.1f}s after the start"
    else:
        may_lead = second.at + ELECTION.lease_duration
        assert first_write.seen_at - may_lead <= FIRST_WRITE_SECONDS, (
            f"first write {since_start:.1f}s after the start, lease duration {ELECTION.lease_duration}s"
        )
        assert first_write.seen_at <= took_over_at + FIRST_WRITE_SECONDS


# --- the network proofs ---------------------------------------------------------------------------------


async def free_units(kube: Kube, name: str) -> int | None:
    obj = await kube.get(GPUCLASSES.path(name=name))
    value = ((obj or {}).get("status") or {}).get("freeUnits")
    return value if isinstance(value, int) else None


async def wait_for_free(kube: Kube, name: str, expected: int, operator: RunningOperator) -> None:
    async def right() -> bool:
        return await free_units(kube, name) == expected

    try:
        await eventually(right, timeout=STATUS_DEADLINE_SECONDS, what=f"{name} freeUnits={expected}")
    except AssertionError as error:
        seen = await free_units(kube, name)
        raise AssertionError(f"{error}\nnow: {seen}\noperator log:\n{operator.log_tail()}") from None


async def small_world(world: GPUWorld, class_name: str, node_units: int, pods: int) -> None:
    """One node of ``node_units``, ``pods`` one-unit pods on it (named vm-0...), one class."""
    await world.node(make_node(f"{class_name}-node", allocatable={RESOURCE: str(node_units)}))
    await create_pods(
        world, [gpu_pod(f"vm-{i}", RESOURCE, 1, node=f"{class_name}-node") for i in range(pods)]
    )
    await world.gpu_class(make_class(class_name, RESOURCE))


def log_lines(operator: RunningOperator) -> list[str]:
    return operator.log_path.read_text(errors="replace").splitlines()


async def slow_passes(operator: RunningOperator) -> float:
    """Passes of the operator that took longer than the slow bucket (got no answer in time)."""
    samples = await operator.scrape()
    total = samples.get((f"{PASS_HISTOGRAM}_count", ()), 0.0)
    fast = samples.get((f"{PASS_HISTOGRAM}_bucket", (("le", SLOW_PASS_BUCKET),)), 0.0)
    return total - fast


async def test_pods_deleted_while_refused_are_released_and_a_blackhole_times_out(
    kube: Kube, gpu_world: GPUWorld, operator_kubeconfig: str, proxy: FaultProxy, tmp_path: Path
) -> None:
    """Through the fault proxy: with the connection refused, pods are deleted (by the admin, not
    through the proxy) and the operator's pods informer finds its watch broken and its LIST refused;
    once forwarded again it lists, and the list's replace releases them (the informer never resumes
    a watch after a failure, so no watch event could have told it). Then a half-open network
    (blackhole): a pass's API call gets no answer and is cut by the client's timeout, so passes still
    finish; once forwarded again the status follows a change made after the restore."""
    name, node_units, pods, deleted_while_down = "resilience-network", 16, 8, 5
    await small_world(gpu_world, name, node_units, pods)
    kubeconfig = proxy_kubeconfig(operator_kubeconfig, proxy, tmp_path / "proxied.kubeconfig")
    args = ["--leader-elect=false", f"--api-timeout-seconds={SHORT_API_TIMEOUT_SECONDS}"]
    async with gpuclass_operator(kubeconfig, tmp_path / "operator.log", *args) as started:
        operator = started.running
        await wait_for_free(kube, name, node_units - pods, operator)

        logged_before = len(log_lines(operator))
        await proxy.set_mode(Mode.REFUSE)  # returns once every connection is closed
        for i in range(deleted_while_down):
            await kube.delete(PODS.path(gpu_world.namespace, f"vm-{i}"), grace_period_seconds=0)

        async def pods_refused() -> bool:
            """The pods informer's watch broke, and a LIST after it was refused too."""
            failures = [line for line in log_lines(operator)[logged_before:] if POD_INFORMER_FAILED in line]
            return len(failures) >= 2

        await eventually(pods_refused, timeout=STATUS_DEADLINE_SECONDS, what="the pods informer refused")
        assert await free_units(kube, name) == node_units - pods
        await proxy.set_mode(Mode.FORWARD)
        await wait_for_free(kube, name, node_units - pods + deleted_while_down, operator)

        slow_before = await slow_passes(operator)
        await proxy.set_mode(Mode.BLACKHOLE)

        async def a_pass_timed_out() -> bool:
            return await slow_passes(operator) > slow_before

        await eventually(
            a_pass_timed_out,
            timeout=RECHECK_SECONDS + SHORT_API_TIMEOUT_SECONDS + STATUS_DEADLINE_SECONDS,
            what="a pass cut short by the client's timeout",
        )
        assert operator.process.returncode is None
        await proxy.set_mode(Mode.FORWARD)
        await kube.delete(PODS.path(gpu_world.namespace, f"vm-{deleted_while_down}"), grace_period_seconds=0)
        await wait_for_free(kube, name, node_units - pods + deleted_while_down + 1, operator)


async def test_after_a_half_open_network_the_status_follows_within_the_bound(
    kube: Kube, gpu_world: GPUWorld, operator_kubeconfig: str, proxy: FaultProxy, tmp_path: Path
) -> None:
    """Every connection the operator has goes half-open for good (``FaultProxy.strand``: open, but
    nothing forwarded, no reset), while new connections are served: a network that lost its flows.
    A pod deleted at that moment (by the admin, not through the proxy) reaches the class's status
    within ``HALF_OPEN_BOUND_SECONDS``: the pods watch's idle bound notices its dead connection, the
    client dials afresh, the re-list tells the deletion, and no call waits out the API timeout on a
    stale connection. ``/healthz`` passes after (and the operator never restarted)."""
    name, node_units, pods = "resilience-half-open", 8, 3
    await small_world(gpu_world, name, node_units, pods)
    kubeconfig = proxy_kubeconfig(operator_kubeconfig, proxy, tmp_path / "proxied.kubeconfig")
    async with gpuclass_operator(kubeconfig, tmp_path / "operator.log", "--leader-elect=false") as started:
        operator = started.running
        await wait_for_free(kube, name, node_units - pods, operator)
        # The periodic pass keeps the request pool warm: its kept connections are stranded too.
        assert proxy.strand() >= 2  # at least a watch and a kept request connection
        stranded_at = now()
        await kube.delete(PODS.path(gpu_world.namespace, "vm-0"), grace_period_seconds=0)

        async def released() -> bool:
            return await free_units(kube, name) == node_units - pods + 1

        await eventually(released, timeout=HALF_OPEN_WAIT_SECONDS, what="the deletion in the status")
        took = now() - stranded_at
        print(f"half-open network: status followed the deletion after {took:.1f}s")  # the figure
        assert took <= HALF_OPEN_BOUND_SECONDS, f"{took:.1f}s\n{operator.log_tail()}"
        assert (await healthz(operator))[0] == 200
        assert operator.process.returncode is None


async def healthz(operator: RunningOperator) -> tuple[int, str]:
    async with httpx.AsyncClient() as client:
        response = await client.get(f"http://127.0.0.1:{operator.health_port}/healthz", timeout=5)
    return response.status_code, response.text


async def test_liveness_fails_while_a_pass_is_stuck_and_recovers(
    kube: Kube, gpu_world: GPUWorld, operator_kubeconfig: str, proxy: FaultProxy, tmp_path: Path
) -> None:
    """A pass stuck on an API call makes ``/healthz`` fail within the stuck bound, and pass again
    once the call returns. The proxy blackholes (``HANG`` would not do: it keeps serving open
    connections, and the pass's call goes out on the client's open keep-alive connection); the
    periodic pass (every ``RECHECK_SECONDS``) reads the KubeVirt CR and waits on it, with an API
    timeout far beyond the stuck bound."""
    name = "resilience-stuck"
    await small_world(gpu_world, name, node_units=4, pods=1)
    kubeconfig = proxy_kubeconfig(operator_kubeconfig, proxy, tmp_path / "proxied.kubeconfig")
    args = [
        "--leader-elect=false",
        f"--api-timeout-seconds={LONG_API_TIMEOUT_SECONDS}",
        f"--stuck-seconds={STUCK_SECONDS}",
    ]
    async with gpuclass_operator(kubeconfig, tmp_path / "operator.log", *args) as started:
        operator = started.running
        await wait_for_free(kube, name, 3, operator)
        assert (await healthz(operator))[0] == 200

        await proxy.set_mode(Mode.BLACKHOLE)

        async def failing() -> tuple[int, str] | None:
            answer = await healthz(operator)
            return answer if answer[0] == 500 else None

        _, reason = await eventually(failing, timeout=HEALTH_DEADLINE_SECONDS, what="/healthz failing")
        assert "reconcile" in reason, reason

        await proxy.set_mode(Mode.FORWARD)

        async def passing() -> bool:
            return (await healthz(operator))[0] == 200

        await eventually(passing, timeout=HEALTH_DEADLINE_SECONDS, what="/healthz passing again")
        # And the operator works on: a change made now reaches the status.
        await kube.delete(PODS.path(gpu_world.namespace, "vm-0"), grace_period_seconds=0)
        await wait_for_free(kube, name, 4, operator)
