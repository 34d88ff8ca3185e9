"""A keyed work queue for level-based reconcilers: many wake-ups of one key become one pass.

Decides: a key is queued at most once; a key is never worked on by two workers at once (a key woken
while in flight runs again once, after the current pass); a retry is delayed with capped exponential
backoff per key, and forgotten after a pass that succeeds.

Does not: know what a key means or what a pass does. Passes read the world afresh, so dropping
duplicate wake-ups loses nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
log = logging.getLogger(__name__)


class WorkQueue(Generic[K]):
    def __init__(self, base_delay: float = 0.2, max_delay: float = 30.0) -> None:
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._queued: set[K] = set()
        self._running: set[K] = set()
        self._again: set[K] = set()
        self._failures: dict[K, int] = {}
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self.base_delay, self.max_delay = base_delay, max_delay

    def add(self, key: K) -> None:
        """Wake ``key`` now (cancelling any delayed wake-up of it)."""
        timer = self._timers.pop(key, None)
        if timer:
            timer.cancel()
        if key in self._running:
            self._again.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def add_after(self, key: K, delay: float) -> None:
        """Wake ``key`` after ``delay`` seconds, unless something wakes it sooner."""
        if key in self._timers or key in self._queued:
            return
        loop = asyncio.get_running_loop()
        self._timers[key] = loop.call_later(delay, self._fire, key)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def retry(self, key: K) -> float:
        """Wake ``key`` again after a backoff that grows with its consecutive failures."""
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        delay = min(self.max_delay, self.base_delay * 2.0 ** (failures - 1))
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)

    def __len__(self) -> int:
        return len(self._queued) + len(self._running)

    async def run(self, worker: Callable[[K], Awaitable[None]], concurrency: int) -> None:
        """Run ``worker`` over woken keys with ``concurrency`` tasks; returns only when cancelled."""
        async with asyncio.TaskGroup() as group:
            for _ in range(concurrency):
                group.create_task(self._work(worker))

    async def _work(self, worker: Callable[[K], Awaitable[None]]) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            self._running.add(key)
            try:
                await worker(key)
            except Exception:
                log.exception("pass over %s failed; retrying in %.1fs", key, self.retry(key))
            finally:
                self._running.discard(key)
                if key in self._again:
                    self._again.discard(key)
                    self.add(key)
