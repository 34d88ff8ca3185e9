"""controller-runtime's metrics (names, labels, buckets), on the registry of one operator process.

Decides: the metric names and label sets dashboards written for controller-runtime expect
(``workqueue_*{name}``, ``controller_runtime_*{controller}``, ``leader_election_master_status{name}``);
that every series of a queue, a controller or a lease exists (at 0) from the moment the queue, the
controller or the elector is created, before any traffic; that a reconcile's duration carries the
pass's trace id as an exemplar; and that the two "work in flight" gauges of a queue are computed when
scraped, from the keys being processed at that moment.

Does not: serve HTTP, decide what a result is (the controller passes ``success``, ``error``,
``requeue`` or ``requeue_after``), or know what a key means (keys never become label values).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# The four results controller-runtime counts; all are pre-created so a rate() works from the start.
RESULTS: Final = ("success", "error", "requeue", "requeue_after")
RESULT_ERROR: Final = "error"

# controller-runtime's buckets for reconcile_time_seconds: fine below a second, where passes live.
RECONCILE_BUCKETS: Final = (
    *(0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5),
    *(0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5),
    *(5, 6, 7, 8, 9, 10, 15, 20, 25, 30, 40, 50, 60),
)
# client-go's workqueue buckets: 10ns to 1000s in decades (a key may wait for a long backoff).
WORKQUEUE_BUCKETS: Final = tuple(10.0**exponent for exponent in range(-8, 4))


class QueueMetricsHandle:
    """What one ``WorkQueue`` reports; keys are only used to pair an add with its get and done."""

    def __init__(self, metrics: QueueMetrics, name: str, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._depth = metrics.depth.labels(name=name)
        self._adds = metrics.adds.labels(name=name)
        self._queue_duration = metrics.queue_duration.labels(name=name)
        self._work_duration = metrics.work_duration.labels(name=name)
        self._retries = metrics.retries.labels(name=name)
        self._added: dict[Hashable, float] = {}  # queued key -> when it was added
        self._started: dict[Hashable, float] = {}  # key being processed -> when it was handed out
        metrics.unfinished.labels(name=name).set_function(self.unfinished_seconds)
        metrics.longest.labels(name=name).set_function(self.longest_running_seconds)

    def add(self, key: Hashable, since: float | None = None) -> None:
        """``key`` was queued (it was not queued already), woken at ``since`` (None: now)."""
        self._adds.inc()
        self._depth.inc()
        self._added.setdefault(key, self._clock() if since is None else since)

    def get(self, key: Hashable) -> None:
        """``key`` was handed to a worker."""
        now = self._clock()
        self._depth.dec()
        self._started[key] = now
        added = self._added.pop(key, None)
        if added is not None:
            self._queue_duration.observe(max(0.0, now - added))

    def done(self, key: Hashable) -> None:
        """The worker is finished with ``key``."""
        started = self._started.pop(key, None)
        if started is not None:
            self._work_duration.observe(max(0.0, self._clock() - started))

    def retry(self) -> None:
        """A key was re-queued with its rate-limited backoff."""
        self._retries.inc()

    def clear(self) -> None:
        """The queue was shut down: whatever was queued is dropped."""
        self._depth.set(0)
        self._added.clear()

    def unfinished_seconds(self) -> float:
        """Seconds of work in progress not yet observed by work_duration (a stuck worker shows here)."""
        now = self._clock()
        return sum(max(0.0, now - started) for started in self._started.values())

    def longest_running_seconds(self) -> float:
        """How long the longest-running worker has been on its key."""
        if not self._started:
            return 0.0
        return max(0.0, self._clock() - min(self._started.values()))


class QueueMetrics:
    """client-go's workqueue metrics, one label set per queue name."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["name"]
        self.depth = Gauge("workqueue_depth", "Current depth of workqueue", labels, registry=registry)
        self.adds = Counter(
            "workqueue_adds", "Total number of adds handled by workqueue", labels, registry=registry
        )
        self.queue_duration = Histogram(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            labels,
            buckets=WORKQUEUE_BUCKETS,
            registry=registry,
        )
        self.work_duration = Histogram(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes",
            labels,
            buckets=WORKQUEUE_BUCKETS,
            registry=registry,
        )
        self.retries = Counter(
            "workqueue_retries", "Total number of retries handled by workqueue", labels, registry=registry
        )
        self.unfinished = Gauge(
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has been done that is in progress and hasn't been observed by "
            "work_duration. Large values indicate stuck threads.",
            labels,
            registry=registry,
        )
        self.longest = Gauge(
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running",
            labels,
            registry=registry,
        )
        self._handles: dict[str, QueueMetricsHandle] = {}

    def for_queue(self, name: str, *, clock: Callable[[], float] = time.monotonic) -> QueueMetricsHandle:
        """The handle of the queue ``name`` (created with all its series at 0; one queue per name)."""
        handle = self._handles.get(name)
        if handle is None:
            handle = self._handles[name] = QueueMetricsHandle(self, name, clock)
        return handle


class ControllerMetrics:
    """controller-runtime's reconcile metrics, one label set per controller name."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["controller"]
        self.total = Counter(
            "controller_runtime_reconcile",
            "Total number of reconciliations per controller",
            [*labels, "result"],
            registry=registry,
        )
        self.errors = Counter(
            "controller_runtime_reconcile_errors",
            "Total number of reconciliation errors per controller",
            labels,
            registry=registry,
        )
        self.terminal_errors = Counter(
            "controller_runtime_terminal_reconcile_errors",
            "Total number of terminal reconciliation errors per controller",
            labels,
            registry=registry,
        )
        self.time = Histogram(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            labels,
            buckets=RECONCILE_BUCKETS,
            registry=registry,
        )
        self.max_concurrent = Gauge(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller",
            labels,
            registry=registry,
        )
        self.workers = Gauge(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            labels,
            registry=registry,
        )
        self.again = Counter(
            "controller_runtime_decide_again",
            "Decisions made again within a pass because its own write changed what it reads",
            labels,
            registry=registry,
        )
        self._known: set[str] = set()

    def register(self, controller: str) -> None:
        """Create every series of ``controller`` at 0 (idempotent; every other method calls it)."""
        if controller in self._known:
            return
        self._known.add(controller)
        for result in RESULTS:
            self.total.labels(controller=controller, result=result)
        self.errors.labels(controller=controller)
        self.terminal_errors.labels(controller=controller)
        self.time.labels(controller=controller)
        self.max_concurrent.labels(controller=controller)
        self.workers.labels(controller=controller)
        self.again.labels(controller=controller)

    def observe(self, controller: str, result: str, seconds: float, trace_id: str | None) -> None:
        """One finished reconcile: its result, and its duration with the trace id as exemplar."""
        self.register(controller)
        self.total.labels(controller=controller, result=result).inc()
        if result == RESULT_ERROR:
            self.errors.labels(controller=controller).inc()
        exemplar = {"trace_id": trace_id} if trace_id else None
        self.time.labels(controller=controller).observe(seconds, exemplar=exemplar)

    def decided_again(self, controller: str) -> None:
        self.register(controller)
        self.again.labels(controller=controller).inc()

    def terminal_error(self, controller: str) -> None:
        self.register(controller)
        self.terminal_errors.labels(controller=controller).inc()

    def set_max_concurrent(self, controller: str, workers: int) -> None:
        self.register(controller)
        self.max_concurrent.labels(controller=controller).set(workers)

    @contextmanager
    def active_workers(self, controller: str) -> Iterator[None]:
        """Count one busy worker of ``controller`` for the duration of the block."""
        self.register(controller)
        gauge = self.workers.labels(controller=controller)
        gauge.inc()
        try:
            yield
        finally:
            gauge.dec()

    # The name the controller calls (``with metrics.active(name):``).
    active = active_workers


class LeaderMetrics:
    """controller-runtime's leader gauge: 1 while this process holds the lease ``name``, else 0."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.status = Gauge(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, "
            "1 indicates master. 'name' is the string used to identify the lease.",
            ["name"],
            registry=registry,
        )

    def set_leading(self, name: str, leading: bool) -> None:
        self.status.labels(name=name).set(1 if leading else 0)
