"""Scenario ``churn``: the controller's SLOs under a ramp of churn, and the highest churn that holds
them (issue 18): ``workqueue_queue_duration_seconds`` p99 at most 1 s and a change's time to its
status p99 at most 5 s.

A change here is one the operator alone answers, never the substrate's controllers or a load
balancer (no substrate model and no MetalLB run: a minted claim stays Pending), on a fixed set of
*slots*, each an application of its own (a HelmRelease and its endpoint Service) under which the
changes cycle:

* ``create``: an EndpointAttachment (a fresh name each time) whose status answers when ``Resolved``
  True is first written. The operator mints the claim, then holds the status back for
  ``STATUS_HOLD_SECONDS`` (1 s) waiting for a binding that never comes, and writes ClaimPending: the
  hold is part of the figure, by design;
* ``endpoint deleted``: the slot's endpoint Service deleted, answered by ``Resolved`` False,
  EndpointNotFound;
* ``endpoint back``: the Service created again, answered by ``Resolved`` True;
* ``delete``: the attachment deleted, answered when it is gone (our finalizer released).

A slot makes one change at a time: the next waits until the last is answered (or timed out). The
ramp asks for ``rates`` changes per second, one step each (``step_seconds`` long), each change made
on the next idle slot at its paced moment (the only sleep: the pacing); a step with no idle slot at
a moment skips that change, so the churn was not kept up. Measured per step:

* achieved rate: the changes the API accepted, over the longer of the step and the time to the
  last accepted write;
* ``workqueue_queue_duration_seconds`` p99 of the attachments' queue, from the histogram's buckets
  on the operator's /metrics, taken as deltas over the step (scraped before its first change and
  after its last is answered), interpolated as Prometheus's ``histogram_quantile`` does
  (``harness.slo``);
* change to status p99, nearest rank over every change made, a change unanswered within
  ``item_timeout`` counting as infinitely late; timestamps are ``time.perf_counter()`` of this
  process when the write is sent and when its watch (one of attachments, one of the slots'
  Services) delivers the answering event;
* baseline, from the same watches: the API server's own answer to the same writes, the write sent
  to its own watch event (the attachment ADDED, the Service DELETED or ADDED, the attachment's
  deletionTimestamp), p99; change to status is shown as a ratio against it;
* context: the operator's passes per change and CPU (share of a core), the benchmark's own CPU, the
  machine's 1-minute load average and the CPU everything else used (the machine is shared).

The operator runs as a subprocess with the admin kubeconfig and its own default ``--workers`` (as
deployed; ``operator_workers`` sets another).

A step holds when the achieved rate is at least 95 % of the asked one and both SLOs hold
(``harness.slo.judge``); the ramp stops at the first step that does not. The highest churn the machine
sustains is the highest step that holds (the target: there is one); the SLO figures at that step are
the targeted rows.

Does not: run the substrate model or MetalLB (``attach`` does), or measure a change whose answer
needs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.endpointattachment.attach import (
    ATTACHMENT_QUEUE,
    ClusterPids,
    Endpoint,
    address_class,
    attachment,
    condition_true,
    endpoint_service,
    install_application,
)
from harness.operators import RunningOperator, operator_process
from harness.procfs import cpu_seconds
from harness.report import Row, duration, percentile, ratio
from harness.slo import (
    KEPT_UP,
    QUANTILE,
    QUEUE_P99_TARGET,
    STATUS_P99_TARGET,
    Samples,
    StepFigures,
    bucket_delta,
    buckets,
    highest_sustained,
    histogram_quantile,
    judge,
    tail_quantile,
)
from harness.streams import (
    follow,
    machine_cpu_seconds,
    own_cpu_seconds,
    supervised,
)
from harness.waiting import eventually
from operators.endpointattachment.api import ATTACHMENTS, CLASSES
from operators.endpointattachment.reasons import CONDITION_RESOLVED, REASON_ENDPOINT_NOT_FOUND
from shared.kube import NO_ANSWER, ApiError, Kube, Obj
from shared.resources import NAMESPACES, SERVICES

NAMESPACE = "bench-churn"
CLASS_NAME = "bench-churn"
CHURN_NETWORK = "198.18.32.0"  # RFC 2544's range, after the attach scenario's two /22s
QUEUE_HISTOGRAM = "workqueue_queue_duration_seconds"
PASS_HISTOGRAM = "controller_runtime_reconcile_time_seconds"
SETTLE_TIMEOUT = 180.0  # the operator's start-up passes over what the API already holds
POPULATE_IN_FLIGHT = 20  # slots given their first attachment at once, before the ramp


class Kind(enum.Enum):
    CREATE = "create"
    DETACH = "endpoint deleted"
    REATTACH = "endpoint back"
    DELETE = "delete"


# What a slot does next, after its last change (a slot starts with no attachment: as after a delete).
NEXT: dict[Kind, Kind] = {
    Kind.DELETE: Kind.CREATE,
    Kind.CREATE: Kind.DETACH,
    Kind.DETACH: Kind.REATTACH,
    Kind.REATTACH: Kind.DELETE,
}


@dataclass(frozen=True)
class ChurnOptions:
    rates: tuple[float, ...] = (2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0)  # changes/s, one step each
    step_seconds: float = 60.0
    slots: int = 200
    item_timeout: float = 30.0  # a change unanswered after this counts as infinitely late
    operator_workers: int | None = None  # None: the operator's own default, as deployed
    whole_ramp: bool = False  # go on after a step that does not hold


def resolved(obj: Obj) -> tuple[str, str] | None:
    """The ``Resolved`` condition's status and reason, if written."""
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == CONDITION_RESOLVED:
            return str(condition.get("status")), str(condition.get("reason"))
    return None


def answers(kind: Kind, event: str, obj: Obj) -> bool:
    """The attachment's watch event ``event`` of ``obj`` is the status answering a change of ``kind``."""
    if kind is Kind.DELETE:
        return event == "DELETED"
    if event == "DELETED":
        return False
    if kind is Kind.DETACH:
        return resolved(obj) == ("False", REASON_ENDPOINT_NOT_FOUND)
    return condition_true(obj, CONDITION_RESOLVED)


def echoes(kind: Kind, event: str, obj: Obj) -> bool:
    """The watch event is the API server's own answer to the write of a change of ``kind`` (the
    attachment's for create and delete, the Service's for the endpoint's)."""
    if kind is Kind.CREATE:
        return event == "ADDED"
    if kind is Kind.DELETE:
        return event == "DELETED" or bool((obj.get("metadata") or {}).get("deletionTimestamp"))
    if kind is Kind.DETACH:
        return event == "DELETED"
    return event == "ADDED"


@dataclass
class Change:
    kind: Kind
    done: asyncio.Future[None]
    sent_at: float = 0.0
    accepted_at: float | None = None  # the write's answer; None: refused
    echoed_at: float | None = None  # the write's own watch event
    answered_at: float | None = None  # the status answering it

    @property
    def latency(self) -> float | None:
        return None if self.answered_at is None else self.answered_at - self.sent_at

    @property
    def echo(self) -> float | None:
        return None if self.echoed_at is None else self.echoed_at - self.sent_at


@dataclass
class Slot:
    index: int
    endpoint: Endpoint
    last: Kind = Kind.DELETE
    incarnation: int = 0
    change: Change | None = None

    @property
    def attachment_name(self) -> str:
        return f"churn-{self.index:04d}-{self.incarnation}"


class Churn:
    """The slots, the changes in flight, and the watches' events matched to them."""

    def __init__(self, kube: Kube, slots: Sequence[Slot], item_timeout: float) -> None:
        self.kube, self.item_timeout = kube, item_timeout
        self.idle: deque[Slot] = deque(slots)
        self.by_attachment: dict[str, Slot] = {}
        self.by_service = {slot.endpoint.name: slot for slot in slots}

    def on_attachment(self, event: str, obj: Obj) -> None:
        slot = self.by_attachment.get(str((obj.get("metadata") or {}).get("name")))
        change = slot.change if slot is not None else None
        if change is None:
            return
        now = time.perf_counter()
        if (
            change.echoed_at is None
            and change.kind in (Kind.CREATE, Kind.DELETE)
            and echoes(change.kind, event, obj)
        ):
            change.echoed_at = now
        if change.answered_at is None and answers(change.kind, event, obj):
            change.answered_at = now
            if not change.done.done():
                change.done.set_result(None)

    def on_service(self, event: str, obj: Obj) -> None:
        slot = self.by_service.get(str((obj.get("metadata") or {}).get("name")))
        change = slot.change if slot is not None else None
        if change is None or change.kind not in (Kind.DETACH, Kind.REATTACH):
            return
        if change.echoed_at is None and echoes(change.kind, event, obj):
            change.echoed_at = time.perf_counter()

    def _write(self, slot: Slot, kind: Kind) -> Awaitable[object]:
        if kind is Kind.CREATE:
            body = attachment(slot.attachment_name, slot.endpoint, NAMESPACE, CLASS_NAME)
            return self.kube.create(ATTACHMENTS.path(NAMESPACE), body)
        if kind is Kind.DELETE:
            return self.kube.delete(ATTACHMENTS.path(NAMESPACE, slot.attachment_name))
        if kind is Kind.DETACH:
            return self.kube.delete(SERVICES.path(NAMESPACE, slot.endpoint.name))
        return self.kube.create(SERVICES.path(NAMESPACE), endpoint_service(slot.endpoint.app))

    async def make(self, slot: Slot) -> Change:
        """The slot's next change: written, then awaited until answered or timed out. An answered
        slot is idle again; one whose write failed or whose answer timed out is left out of the churn
        (its state is unknown)."""
        kind = NEXT[slot.last]
        change = Change(kind, asyncio.get_running_loop().create_future())
        if kind is Kind.CREATE:
            slot.incarnation += 1
            self.by_attachment[slot.attachment_name] = slot
        slot.change = change  # before the write: its events may come before its answer
        change.sent_at = time.perf_counter()
        try:
            await self._write(slot, kind)
        except (ApiError, *NO_ANSWER):
            slot.change = None  # refused or unanswered: its state is unknown, the slot leaves the churn
            return change
        change.accepted_at = time.perf_counter()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(change.done, timeout=self.item_timeout)
        slot.change = None
        if change.answered_at is not None:
            slot.last = kind
            if kind is Kind.DELETE:
                self.by_attachment.pop(slot.attachment_name, None)
            self.idle.append(slot)
        return change


@dataclass
class Step:
    """One step of the ramp as it ran."""

    rate: float
    seconds: float
    changes: list[Change] = field(default_factory=list)
    skipped: int = 0  # paced moments with no idle slot
    started: float = 0.0
    queue: list[tuple[float, float]] = field(default_factory=list)  # bucket deltas over the step
    pass_times: list[tuple[float, float]] = field(default_factory=list)  # the passes' durations, too
    passes: float = 0.0
    pass_seconds: float = 0.0  # the passes' durations, summed
    workers: float = 0.0
    operator_cpu: float = 0.0
    own_cpu: float = 0.0
    control_plane_cpu: float = 0.0  # the API server and etcd
    others_cpu: float = 0.0
    wall: float = 0.0  # from the first change to the last answer
    load: float = 0.0  # the machine's 1-minute load average at the end

    @property
    def accepted(self) -> list[Change]:
        return [c for c in self.changes if c.accepted_at is not None]

    @property
    def achieved(self) -> float:
        accepted = self.accepted
        if not accepted:
            return 0.0
        last = max(c.accepted_at or 0.0 for c in accepted)
        return len(accepted) / max(self.seconds, last - self.started)

    @property
    def latencies(self) -> list[float]:
        return [c.latency for c in self.accepted if c.latency is not None]

    @property
    def unanswered(self) -> int:
        return sum(1 for c in self.accepted if c.answered_at is None)

    @property
    def echoes(self) -> list[float]:
        return [c.echo for c in self.accepted if c.echo is not None]

    def figures(self) -> StepFigures:
        return StepFigures(
            asked_rate=self.rate,
            achieved_rate=self.achieved,
            queue_p99=histogram_quantile(QUANTILE, self.queue),
            status_p99=tail_quantile(self.latencies, self.unanswered),
        )


def _sum(samples: Samples, metric: str, **labels: str) -> float:
    return sum(
        value
        for (name, found), value in samples.items()
        if name == metric and labels.items() <= dict(found).items()
    )


def _cpu(operator: RunningOperator, pids: ClusterPids) -> tuple[float, float, float, float]:
    """CPU seconds so far: the operator's, the benchmark's, the API server's and etcd's, the machine's."""
    control_plane = cpu_seconds(pids.apiserver) + cpu_seconds(pids.launcher)
    return cpu_seconds(operator.process.pid or 0), own_cpu_seconds(), control_plane, machine_cpu_seconds()


async def run_step(
    churn: Churn, operator: RunningOperator, pids: ClusterPids, rate: float, seconds: float
) -> Step:
    """One step: ``rate`` changes a second for ``seconds``, then every change awaited."""
    step = Step(rate, seconds)
    before = await operator.scrape()
    cpu_before = _cpu(operator, pids)
    tasks: list[asyncio.Task[Change]] = []
    step.started = time.perf_counter()
    for n in range(max(1, round(rate * seconds))):
        delay = step.started + n / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)  # the pacing of the churn
        if not churn.idle:
            step.skipped += 1
            continue
        tasks.append(asyncio.create_task(churn.make(churn.idle.popleft())))
    step.changes = list(await asyncio.gather(*tasks))
    step.wall = time.perf_counter() - step.started
    after = await operator.scrape()
    used = [now - then for now, then in zip(_cpu(operator, pids), cpu_before, strict=True)]
    step.operator_cpu, step.own_cpu, step.control_plane_cpu = used[:3]
    step.others_cpu = max(0.0, used[3] - sum(used[:3]))
    step.load = os.getloadavg()[0]
    step.queue = bucket_delta(
        buckets(after, QUEUE_HISTOGRAM, name=ATTACHMENT_QUEUE),
        buckets(before, QUEUE_HISTOGRAM, name=ATTACHMENT_QUEUE),
    )
    step.pass_times = bucket_delta(
        buckets(after, PASS_HISTOGRAM, controller=ATTACHMENT_QUEUE),
        buckets(before, PASS_HISTOGRAM, controller=ATTACHMENT_QUEUE),
    )

    def grew(metric: str) -> float:
        return _sum(after, metric, controller=ATTACHMENT_QUEUE) - _sum(
            before, metric, controller=ATTACHMENT_QUEUE
        )

    step.passes = grew("controller_runtime_reconcile_total")
    step.pass_seconds = grew(f"{PASS_HISTOGRAM}_sum")
    step.workers = _sum(after, "controller_runtime_max_concurrent_reconciles", controller=ATTACHMENT_QUEUE)
    return step


async def settled(operator: RunningOperator) -> None:
    """Wait until the operator is idle: its queue empty, no worker busy, no pass since the last look
    (its start-up passes over what the API already holds are done)."""
    last: list[float] = []

    async def idle() -> bool:
        try:
            samples = await operator.scrape()
        except httpx.HTTPError:  # not serving its metrics yet
            return False
        reading = [
            _sum(samples, "workqueue_depth", name=ATTACHMENT_QUEUE),
            _sum(samples, "controller_runtime_active_workers", controller=ATTACHMENT_QUEUE),
            _sum(samples, "controller_runtime_reconcile_total", controller=ATTACHMENT_QUEUE),
        ]
        quiet = reading[:2] == [0.0, 0.0] and reading == last
        last[:] = reading
        return quiet

    await eventually(idle, timeout=SETTLE_TIMEOUT, interval=1.0, what="the operator idle")


async def populate(churn: Churn) -> list[Change]:
    """Every slot's first attachment, then slot ``n`` taken ``n % 4`` changes further, so that the
    ramp's changes come in every kind from its first moment; ``POPULATE_IN_FLIGHT`` slots at once,
    not measured (the operator warms up). The idle slots are left in the order of their index."""
    made: list[Change] = []
    slots = sorted(churn.idle, key=lambda slot: slot.index)
    churn.idle.clear()
    pending = iter(slots)

    async def worker() -> None:
        for slot in pending:
            for again in range(1 + slot.index % len(Kind)):
                if again:
                    churn.idle.remove(slot)  # handed back by make() when answered: taken again
                change = await churn.make(slot)
                made.append(change)
                if change.answered_at is None:
                    return  # unanswered: the caller reports it

    await asyncio.gather(*(worker() for _ in range(POPULATE_IN_FLIGHT)))
    churn.idle = deque(sorted(churn.idle, key=lambda slot: slot.index))
    return made


async def run(
    options: ChurnOptions, kubeconfig: str, pids: ClusterPids, log_path: Path, say: Callable[[str], None]
) -> tuple[list[Row], list[str]]:
    kube = await Kube.connect(kubeconfig)
    await kube.create(
        NAMESPACES.path(), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    )
    await kube.create(CLASSES.path(), address_class(CLASS_NAME, CHURN_NETWORK, 22))
    say(f"churn: {options.slots} applications (HelmRelease and endpoint Service each)")
    slots = [Slot(n, await install_application(kube, NAMESPACE, f"churn{n}")) for n in range(options.slots)]
    churn = Churn(kube, slots, options.item_timeout)
    watches = [
        supervised(
            follow(kube, ATTACHMENTS.path(NAMESPACE), churn.on_attachment), "churn attachment watch", say
        ),
        supervised(follow(kube, SERVICES.path(NAMESPACE), churn.on_service), "churn Service watch", say),
    ]
    args = [f"--workers={options.operator_workers}"] if options.operator_workers else []
    try:
        async with operator_process("operators.endpointattachment", kubeconfig, args, log_path) as operator:
            await settled(operator)
            say(f"churn: operator idle; {options.slots} slots get their first attachment, then 0-3 changes")
            warm = await populate(churn)
            if any(c.answered_at is None for c in warm):
                raise AssertionError(
                    f"the slots' first attachments were not all resolved:\n{operator.log_tail(60)}"
                )
            steps: list[Step] = []
            notes = []
            for rate in options.rates:
                say(f"churn: {rate:g} changes/s for {options.step_seconds:.0f}s")
                try:
                    step = await run_step(churn, operator, pids, rate, options.step_seconds)
                except httpx.HTTPError as error:  # its /metrics gone: the operator died
                    notes.append(f"the step at {rate:g}/s lost the operator's /metrics ({error!r})")
                    break
                steps.append(step)
                verdict = judge(step.figures())
                say(f"churn: {rate:g}/s {'holds' if verdict.holds else 'does not hold'}; {_summary(step)}")
                if not verdict.holds and not options.whole_ramp:
                    break
            if operator.process.returncode is not None:
                notes.append(f"the operator EXITED during the run; log: {operator.log_path}")
            if "Traceback" in operator.log_path.read_text(errors="replace"):
                notes.append(f"the operator logged a traceback; log: {operator.log_path}")
            return rows(options, steps), notes
    finally:
        for task in watches:
            task.cancel()
        for task in watches:
            with contextlib.suppress(asyncio.CancelledError, ApiError):
                await task
        await kube.close()


def _p99(values: Sequence[float]) -> str:
    return duration(percentile(values, QUANTILE)) if values else "-"


def _quantity(value: float | None) -> str:
    if value is None:
        return "-"
    return "∞ (unanswered)" if value == float("inf") else duration(value)


def _summary(step: Step) -> str:
    figures = step.figures()
    return (
        f"achieved {figures.achieved_rate:.1f}/s, queue p99 {_quantity(figures.queue_p99)}, "
        f"status p99 {_quantity(figures.status_p99)}, load {step.load:.2f}"
    )


def rows(options: ChurnOptions, steps: Sequence[Step]) -> list[Row]:
    """Per step, context rows; the targets at the highest step that holds."""
    out: list[Row] = []
    for step in steps:
        figures, verdict = step.figures(), judge(step.figures())
        label = f"churn {step.rate:g}/s"
        out.append(
            Row(
                f"{label}: achieved ({'holds' if verdict.holds else 'does not hold'})",
                f"{figures.achieved_rate:.1f}/s",
                f"≥ {KEPT_UP:.0%} of asked: {'yes' if verdict.kept_up else 'no'}",
                ratio=f"{len(step.accepted):,} changes, {len(step.changes) - len(step.accepted)} writes "
                f"failed, {step.skipped} skipped (no idle slot); "
                f"load avg {step.load:.2f}",
            )
        )
        observed = step.queue[-1][1] if step.queue else 0.0
        out.append(
            Row(
                f"  {label}: {QUEUE_HISTOGRAM} p99",
                _quantity(figures.queue_p99),
                f"≤ {QUEUE_P99_TARGET:.0f} s: {'yes' if verdict.queue_ok else 'no'}",
                ratio=f"{observed:,.0f} keys queued; "
                f"{step.passes / max(1, len(step.accepted)):.1f} passes per change",
            )
        )
        base = tail_quantile(step.echoes, 0)
        status = figures.status_p99
        out.append(
            Row(
                f"  {label}: change → status p99",
                _quantity(status),
                f"≤ {STATUS_P99_TARGET:.0f} s: {'yes' if verdict.status_ok else 'no'}",
                ratio=(
                    f"÷ API's own answer p99 {duration(base)} = {ratio(status / base)}"
                    if base and status is not None and status != float("inf")
                    else ""
                ),
            )
        )
        busy = step.pass_seconds / max(step.wall * step.workers, 1e-9)
        out.append(
            Row(
                f"  {label}: pass duration p99; workers busy",
                f"{_quantity(histogram_quantile(QUANTILE, step.pass_times))}; {busy:.0%}",
                ratio=f"of {step.workers:.0f} workers: near 100 % the queue waits for the API's answers, "
                "far below for the operator's CPU",
            )
        )
        by_kind = " / ".join(
            _p99([c.latency for c in step.accepted if c.kind is kind and c.latency is not None])
            for kind in Kind
        )
        seconds = max(step.wall, 1e-9)
        out.append(
            Row(
                f"  {label}: {' / '.join(kind.value for kind in Kind)}, p99",
                by_kind,
                ratio=f"CPU (of a core): operator {step.operator_cpu / seconds:.0%}, API server and etcd "
                f"{step.control_plane_cpu / seconds:.0%}, benchmark {step.own_cpu / seconds:.0%}, "
                f"everything else {step.others_cpu / seconds:.0%}",
            )
        )
    best = highest_sustained([step.figures() for step in steps])
    asked = ", ".join(f"{rate:g}" for rate in options.rates)
    out.append(
        Row(
            "churn: highest churn holding both SLOs (kept up ≥ 95 %)",
            f"{best:g} changes/s" if best is not None else "none",
            "a step holds",
            best is not None,
            f"ramp asked {asked}/s, {options.step_seconds:.0f} s each"
            + (f"; stopped after {steps[-1].rate:g}/s" if steps and len(steps) < len(options.rates) else ""),
        )
    )
    if best is not None:
        at = next(step for step in steps if step.rate == best)
        held = at.figures()
        base = tail_quantile(at.echoes, 0)
        out.append(
            Row(
                f"churn at {best:g}/s: {QUEUE_HISTOGRAM} p99",
                _quantity(held.queue_p99),
                f"≤ {QUEUE_P99_TARGET:.0f} s",
                True,
                "histogram_quantile over the step's bucket deltas",
            )
        )
        out.append(
            Row(
                f"churn at {best:g}/s: change → status p99",
                _quantity(held.status_p99),
                f"≤ {STATUS_P99_TARGET:.0f} s",
                True,
                f"÷ API's own answer p99 {duration(base or 0)} = "
                f"{ratio((held.status_p99 or 0) / base) if base else '-'}",
            )
        )
    return out
