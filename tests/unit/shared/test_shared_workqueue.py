"""The keyed work queue: one pass per burst, never two passes over one key at once, backoff on failure."""

from __future__ import annotations

import asyncio
import contextlib

from shared.workqueue import WorkQueue


async def run_until(queue: WorkQueue[str], worker: object, done: asyncio.Event, concurrency: int = 4) -> None:
    task = asyncio.create_task(queue.run(worker, concurrency))  # type: ignore[arg-type]
    try:
        await asyncio.wait_for(done.wait(), timeout=5)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_burst_of_wakeups_is_one_pass() -> None:
    queue: WorkQueue[str] = WorkQueue()
    passes: list[str] = []
    done = asyncio.Event()

    async def worker(key: str) -> None:
        passes.append(key)
        done.set()

    for _ in range(100):
        queue.add("a")
    await run_until(queue, worker, done)
    assert passes == ["a"]


async def test_a_key_woken_while_in_flight_runs_once_more_never_concurrently() -> None:
    queue: WorkQueue[str] = WorkQueue()
    running, most, passes = 0, 0, 0
    release = asyncio.Event()
    done = asyncio.Event()

    async def worker(key: str) -> None:
        nonlocal running, most, passes
        running += 1
        most = max(most, running)
        passes += 1
        if passes == 1:
            for _ in range(10):
                queue.add(key)  # woken again and again while in flight
            await release.wait()
        running -= 1
        if passes == 2:
            done.set()

    queue.add("a")
    task = asyncio.create_task(queue.run(worker, 4))
    await asyncio.sleep(0)  # let the first pass start (a scheduling point, not a wait for an effect)
    release.set()
    try:
        await asyncio.wait_for(done.wait(), timeout=5)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert (passes, most) == (2, 1)


async def test_a_failing_pass_is_retried_with_growing_backoff_then_forgotten() -> None:
    queue: WorkQueue[str] = WorkQueue(base_delay=0.01, max_delay=0.05)
    attempts = 0
    done = asyncio.Event()

    async def worker(key: str) -> None:
        nonlocal attempts
        attempts += 1
        if attempts < 3:
            raise RuntimeError("transient")
        queue.forget(key)
        done.set()

    queue.add("a")
    await run_until(queue, worker, done)
    assert attempts == 3
    assert queue.retry("b") == 0.01  # a forgotten or new key starts from the base delay
    assert queue.retry("b") == 0.02
    assert queue.retry("b") == 0.04
    assert queue.retry("b") == 0.05  # capped
