"""The runtime's work queue, rate limiter and metrics, in virtual time.

Every test runs on an event loop whose clock jumps to the next timer whenever nothing is ready to
run: ``await asyncio.sleep(5)`` moves time by 5 seconds at once, timers fire in order, and a test that
would wait forever fails instead of hanging. The queue's clock is that loop's clock.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from prometheus_client import CollectorRegistry

from harness.virtualtime import now, virtual_time
from shared.runtime.metrics import RESULTS, ControllerMetrics, QueueMetrics
from shared.runtime.queue import QueueShutDown, RateLimiter, WorkQueue


async def get_within(queue: WorkQueue[str], seconds: float) -> str | None:
    """The next key if one comes within ``seconds`` (virtual), else None."""
    try:
        async with asyncio.timeout(seconds):
            return await queue.get()
    except TimeoutError:
        return None


def sample(registry: CollectorRegistry, metric: str, /, **labels: str) -> float:
    value = registry.get_sample_value(metric, labels)
    assert value is not None, f"{metric}{labels} is not exported"
    return value


# --- the queue -------------------------------------------------------------------------------------


@virtual_time
async def test_a_burst_of_adds_is_one_get() -> None:
    queue: WorkQueue[str] = WorkQueue("q", clock=now)
    for _ in range(100):
        queue.add("a")
    assert len(queue) == 1
    assert await get_within(queue, 1) == "a"
    queue.done("a")
    assert await get_within(queue, 60) is None


@virtual_time
async def test_a_key_added_while_processing_is_queued_again_on_done() -> None:
    queue: WorkQueue[str] = WorkQueue("q", clock=now)
    queue.add("a")
    assert await queue.get() == "a"
    for _ in range(5):
        queue.add("a")
    assert len(queue) == 0
    assert await get_within(queue, 60) is None  # not while the first worker has it
    queue.done("a")
    assert await get_within(queue, 1) == "a"  # once more, however many adds came meanwhile
    queue.done("a")
    assert await get_within(queue, 60) is None


@virtual_time
async def test_never_two_workers_on_one_key_and_every_add_is_followed_by_a_pass() -> None:
    rng = random.Random(7)
    queue: WorkQueue[str] = WorkQueue("q", clock=now)
    active: set[str] = set()
    overlaps: list[str] = []
    last_add: dict[str, float] = {}
    last_start: dict[str, float] = {}
    produced = asyncio.Event()
    idle = asyncio.Event()

    async def worker() -> None:
        while True:
            try:
                key = await queue.get()
            except QueueShutDown:
                return
            if key in active:
                overlaps.append(key)
            active.add(key)
            last_start[key] = now()
            await asyncio.sleep(rng.uniform(0, 2))  # the pass itself takes (virtual) time
            active.discard(key)
            queue.done(key)
            if produced.is_set() and not active and len(queue) == 0:
                idle.set()

    workers = [asyncio.create_task(worker()) for _ in range(4)]
    for _ in range(500):
        await asyncio.sleep(rng.uniform(0, 0.3))
        key = rng.choice("abcde")
        last_add[key] = now()
        queue.add(key)
    produced.set()
    async with asyncio.timeout(60):
        await idle.wait()
    queue.shutdown()
    await asyncio.gather(*workers)
    assert overlaps == []
    assert {k: last_start[k] >= t for k, t in last_add.items()} == dict.fromkeys(last_add, True)


@pytest.mark.parametrize(
    ("delays", "expected_at"),
    [
        ((10.0, 3.0), 3.0),  # a sooner add_after replaces the later one
        ((3.0, 10.0), 3.0),  # a later one is ignored
        ((5.0, 5.0, 5.0), 5.0),
        ((4.0, 0.0), 0.0),  # no delay: queued at once, the pending one cancelled
    ],
)
@virtual_time
async def test_add_after_the_soonest_wins_and_fires_once(
    delays: tuple[float, ...], expected_at: float
) -> None:
    queue: WorkQueue[str] = WorkQueue("q", clock=now)
    for delay in delays:
        queue.add_after("a", delay)
    assert await get_within(queue, 60) == "a"
    assert now() == expected_at
    queue.done("a")
    assert await get_within(queue, 60) is None


@virtual_time
async def test_an_add_cancels_a_pending_add_after() -> None:
    queue: WorkQueue[str] = WorkQueue("q", clock=now)
    queue.add_after("a", 30)
    await asyncio.sleep(1)
    queue.add("a")
    assert await get_within(queue, 1) == "a"
    assert now() == 1.0
    queue.done("a")
    assert await get_within(queue, 60) is None


@virtual_time
async def test_add_after_while_processing_queues_the_key_after_done() -> None:
    queue: WorkQueue[str] = WorkQueue("q", clock=now)
    queue.add("a")
    assert await queue.get() == "a"
    queue.add_after("a", 2)  # e.g. requeue_after from the pass, fires while the pass still runs
    await asyncio.sleep(5)
    assert len(queue) == 0
    queue.done("a")
    assert await get_within(queue, 1) == "a"
    assert now() == 5.0


@virtual_time
async def test_debounce_holds_a_key_until_adds_stop() -> None:
    queue: WorkQueue[str] = WorkQueue("q", debounce=1.0, clock=now)
    for at in (0.0, 0.5, 1.2):  # each add within a second of the previous one
        await asyncio.sleep(at - now())
        queue.add("a")
    assert len(queue) == 0
    assert await get_within(queue, 60) == "a"
    assert now() == pytest.approx(2.2)  # one second after the last add
    queue.done("a")
    assert await get_within(queue, 60) is None


@virtual_time
async def test_max_delay_caps_the_hold_of_a_steady_stream() -> None:
    queue: WorkQueue[str] = WorkQueue("q", debounce=1.0, max_delay=5.0, clock=now)
    got: list[float] = []

    async def stream() -> None:
        while True:
            queue.add("a")
            await asyncio.sleep(0.75)  # never a second of quiet

    producer = asyncio.create_task(stream())
    for _ in range(3):
        assert await get_within(queue, 60) == "a"
        got.append(now())
        queue.done("a")
    producer.cancel()
    # The first burst starts at 0; each later burst starts with the first add after the previous one
    # was handed out, and is released max_delay after that.
    assert got == [5.0, 10.25, 15.5]


@virtual_time
async def test_an_add_of_a_queued_key_is_not_held_again() -> None:
    queue: WorkQueue[str] = WorkQueue("q", debounce=1.0, clock=now)
    queue.add("a")
    await asyncio.sleep(1.5)
    assert len(queue) == 1
    queue.add("a")  # already queued: its pass will read the world after this change anyway
    assert await get_within(queue, 1) == "a"
    assert now() == 1.5
    queue.done("a")
    assert await get_within(queue, 60) is None


@virtual_time
async def test_shutdown_wakes_waiting_workers_and_drops_what_is_queued() -> None:
    queue: WorkQueue[str] = WorkQueue("q", clock=now)
    waiting = [asyncio.create_task(queue.get()) for _ in range(3)]
    await asyncio.sleep(1)
    queue.add("a")
    queue.add_after("b", 10)
    processing = await asyncio.wait_for(asyncio.shield(waiting[0]), 1)
    assert processing == "a"
    queue.add("a")  # dirty while processing
    queue.add("c")
    queue.shutdown()
    for task in waiting[1:]:
        with pytest.raises(QueueShutDown):
            await task
    queue.done("a")  # not queued again after shutdown
    queue.add("d")
    assert len(queue) == 0
    await asyncio.sleep(30)  # past b's delay: its timer was cancelled
    assert len(queue) == 0
    with pytest.raises(QueueShutDown):
        await queue.get()


@virtual_time
async def test_add_rate_limited_backs_off_per_key_until_forgotten() -> None:
    limiter = RateLimiter(base_delay=1.0, max_delay=8.0, clock=now)
    queue: WorkQueue[str] = WorkQueue("q", rate_limiter=limiter, clock=now)
    delays = []
    for _ in range(5):
        delays.append(queue.add_rate_limited("a"))
        started = now()
        assert await get_within(queue, 60) == "a"
        assert now() - started == delays[-1]
        queue.done("a")
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert queue.retries("a") == 5
    queue.forget("a")
    assert queue.retries("a") == 0
    assert queue.add_rate_limited("a") == 1.0


# --- the rate limiter ------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_backoff_doubles_per_failure_up_to_the_cap_and_forget_resets_it() -> None:
    limiter = RateLimiter(base_delay=0.005, max_delay=1.0, qps=1e9, burst=10**9, clock=FakeClock())
    delays = [limiter.when("a") for _ in range(10)]
    assert delays == pytest.approx([0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.0, 1.0])
    assert limiter.retries("a") == 10
    assert limiter.when("b") == 0.005  # per key
    limiter.forget("a")
    assert limiter.retries("a") == 0
    assert limiter.when("a") == 0.005


def test_backoff_stays_at_the_cap_after_very_many_failures() -> None:
    limiter = RateLimiter(base_delay=0.005, max_delay=1000.0, qps=1e9, burst=10**9, clock=FakeClock())
    assert [limiter.when("a") for _ in range(5000)][-1] == 1000.0


def test_the_overall_bucket_spaces_out_retries_of_many_keys() -> None:
    clock = FakeClock()
    limiter = RateLimiter(base_delay=0.005, max_delay=1000.0, qps=10.0, burst=3, clock=clock)
    # The burst goes through at the per-key delay; then each key waits for its token (0.1s apart).
    delays = [limiter.when(key) for key in "abcdef"]
    assert delays == pytest.approx([0.005, 0.005, 0.005, 0.1, 0.2, 0.3])
    clock.now = 10.0  # the bucket refills (up to its burst), the reservations are paid off
    assert [limiter.when(key) for key in "ghij"] == pytest.approx([0.005, 0.005, 0.005, 0.1])
    # The larger of the two wins: a key with a long backoff is not shortened by a full bucket.
    for _ in range(6):
        clock.now += 10.0
        limiter.when("slow")
    clock.now += 10.0
    assert limiter.when("slow") == pytest.approx(0.005 * 2**6)


# --- metrics ---------------------------------------------------------------------------------------


@virtual_time
async def test_queue_metrics_after_a_sequence() -> None:
    registry = CollectorRegistry()
    queue: WorkQueue[str] = WorkQueue("ctl", metrics=QueueMetrics(registry), clock=now)
    names = (
        "workqueue_depth",
        "workqueue_adds_total",
        "workqueue_retries_total",
        "workqueue_unfinished_work_seconds",
        "workqueue_longest_running_processor_seconds",
        "workqueue_queue_duration_seconds_count",
        "workqueue_work_duration_seconds_count",
    )
    assert {n: sample(registry, n, name="ctl") for n in names} == dict.fromkeys(names, 0.0)

    queue.add("a")
    queue.add("b")
    queue.add("a")  # already queued: not an add
    assert sample(registry, "workqueue_adds_total", name="ctl") == 2
    assert sample(registry, "workqueue_depth", name="ctl") == 2
    await asyncio.sleep(2)
    assert await queue.get() == "a"
    assert sample(registry, "workqueue_depth", name="ctl") == 1
    assert sample(registry, "workqueue_queue_duration_seconds_sum", name="ctl") == 2.0
    await asyncio.sleep(3)
    assert sample(registry, "workqueue_unfinished_work_seconds", name="ctl") == 3.0
    assert sample(registry, "workqueue_longest_running_processor_seconds", name="ctl") == 3.0
    assert await queue.get() == "b"  # at t=5, a still in progress
    await asyncio.sleep(1)
    assert sample(registry, "workqueue_unfinished_work_seconds", name="ctl") == 4.0 + 1.0
    assert sample(registry, "workqueue_longest_running_processor_seconds", name="ctl") == 4.0
    queue.done("a")
    assert sample(registry, "workqueue_work_duration_seconds_sum", name="ctl") == 4.0
    assert sample(registry, "workqueue_longest_running_processor_seconds", name="ctl") == 1.0
    queue.add_rate_limited("b")
    queue.done("b")
    assert sample(registry, "workqueue_retries_total", name="ctl") == 1
    assert sample(registry, "workqueue_queue_duration_seconds_count", name="ctl") == 2
    assert sample(registry, "workqueue_work_duration_seconds_count", name="ctl") == 2
    assert sample(registry, "workqueue_unfinished_work_seconds", name="ctl") == 0.0
    assert sample(registry, "workqueue_depth", name="ctl") == 0
    assert await get_within(queue, 60) == "b"  # after its backoff
    assert sample(registry, "workqueue_adds_total", name="ctl") == 3


def test_controller_metrics_exist_before_traffic_and_count_results() -> None:
    registry = CollectorRegistry()
    metrics = ControllerMetrics(registry)
    metrics.set_max_concurrent("gpuclass", 2)
    results = {
        r: sample(registry, "controller_runtime_reconcile_total", controller="gpuclass", result=r)
        for r in RESULTS
    }
    assert results == dict.fromkeys(RESULTS, 0.0)
    for name, value in (
        ("controller_runtime_reconcile_errors_total", 0.0),
        ("controller_runtime_terminal_reconcile_errors_total", 0.0),
        ("controller_runtime_reconcile_time_seconds_count", 0.0),
        ("controller_runtime_max_concurrent_reconciles", 2.0),
        ("controller_runtime_active_workers", 0.0),
    ):
        assert sample(registry, name, controller="gpuclass") == value, name

    with metrics.active_workers("gpuclass"), metrics.active("gpuclass"):
        assert sample(registry, "controller_runtime_active_workers", controller="gpuclass") == 2
    assert sample(registry, "controller_runtime_active_workers", controller="gpuclass") == 0
    metrics.observe("gpuclass", "success", 0.2, "0af7651916cd43dd8448eb211c80319c")
    metrics.observe("gpuclass", "error", 0.3, None)
    metrics.observe("gpuclass", "requeue_after", 0.1, None)
    metrics.terminal_error("gpuclass")
    results = {
        r: sample(registry, "controller_runtime_reconcile_total", controller="gpuclass", result=r)
        for r in RESULTS
    }
    assert results == {"success": 1.0, "error": 1.0, "requeue": 0.0, "requeue_after": 1.0}
    for metric, expected in (
        ("controller_runtime_reconcile_errors_total", 1.0),
        ("controller_runtime_terminal_reconcile_errors_total", 1.0),
        ("controller_runtime_reconcile_time_seconds_count", 3.0),
        ("controller_runtime_reconcile_time_seconds_sum", pytest.approx(0.6)),
    ):
        assert sample(registry, metric, controller="gpuclass") == expected, metric
    exemplars = [
        s.exemplar.labels
        for family in registry.collect()
        if family.name == "controller_runtime_reconcile_time_seconds"
        for s in family.samples
        if s.exemplar is not None
    ]
    assert exemplars == [{"trace_id": "0af7651916cd43dd8448eb211c80319c"}]  # on the 0.2s bucket
