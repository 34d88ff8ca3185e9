"""The rate-limited keyed work queue of a controller: many wake-ups of one key become one pass.

Decides:

* a key is queued at most once, and is never handed to two workers at once: a key added while a
  worker has it is marked dirty and queued again when that worker calls ``done``;
* with ``debounce`` a key is held until ``debounce`` seconds pass with no new add, but never longer
  than ``max_delay`` after the first add of the burst (GPUClass folds a burst of Pod events into one
  pass); an add of a key that is already queued changes nothing;
* ``add_after``: of several delayed adds of one key the soonest wins, and any add that queues the
  key cancels the delayed ones (the pass it causes reads the world afresh and asks again if needed);
* retries are delayed by the ``RateLimiter`` (controller-runtime's default: the larger of a per-key
  exponential backoff and an overall token bucket); ``forget`` resets a key's backoff;
* ``shutdown`` drops what is queued and makes every ``get`` raise ``QueueShutDown`` at once (a
  stopping operator does not drain: the next leader starts from a fresh list).

Timers run on the running loop (``call_later``); every time decision (hold, backoff, bucket, the
metrics' durations) reads the injected ``clock``, which must advance with the loop's time.

Does not: know what a key means or what a pass does, or run workers (the controller does).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from shared.runtime.metrics import QueueMetrics, QueueMetricsHandle

K = TypeVar("K", bound=Hashable)

# Beyond this many consecutive failures the backoff is max_delay whatever the base: 2**64 times any
# sensible base exceeds any sensible cap, and the exponent stays far from float overflow.
MAX_BACKOFF_EXPONENT: Final = 64
# A hold timer may fire a hair before its due time by the clock (the loop fires timers within its
# clock resolution); within this slack the key counts as due instead of being re-armed for nothing.
TIMER_SLACK_SECONDS: Final = 1e-6


class QueueShutDown(Exception):
    """The queue was shut down: the worker calling ``get`` should return."""


class RateLimiter:
    """controller-runtime's default limiter: the larger of a per-key exponential backoff
    (``base_delay * 2**failures``, capped at ``max_delay``) and an overall token bucket (``qps``
    refill, ``burst`` capacity) shared by every key, so that many keys failing at once cannot make
    the controller hammer the API server."""

    def __init__(
        self,
        base_delay: float = 0.005,
        max_delay: float = 1000.0,
        qps: float = 10.0,
        burst: int = 100,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base_delay, self.max_delay = base_delay, max_delay
        self.qps, self.burst = qps, burst
        self._clock = clock
        self._failures: dict[Hashable, int] = {}
        self._tokens = float(burst)
        self._refilled = clock()

    def when(self, key: Hashable) -> float:
        """How long to wait before retrying ``key``; counts one more failure of it and takes a token."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        if failures >= MAX_BACKOFF_EXPONENT:
            backoff = self.max_delay
        else:
            backoff = min(self.max_delay, self.base_delay * 2.0**failures)
        return max(backoff, self._reserve())

    def _reserve(self) -> float:
        """Take one token (the balance may go negative: a reservation); the wait until it is ours."""
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._refilled) * self.qps)
        self._refilled = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def forget(self, key: Hashable) -> None:
        self._failures.pop(key, None)

    def retries(self, key: Hashable) -> int:
        return self._failures.get(key, 0)


@dataclass
class _Hold:
    """A debounced key: when its burst started, when its last add came, and its pending timer."""

    first: float
    last: float
    timer: asyncio.TimerHandle | None = None


@dataclass
class _Delayed:
    """A key waiting for ``add_after``: when it is due (by the clock) and its timer."""

    due: float
    timer: asyncio.TimerHandle


class WorkQueue(Generic[K]):
    def __init__(
        self,
        name: str,
        *,
        metrics: QueueMetrics | None = None,
        rate_limiter: RateLimiter | None = None,
        debounce: float = 0.0,
        max_delay: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.debounce, self.max_delay = debounce, max_delay
        self._clock = clock
        self._limiter = rate_limiter if rate_limiter is not None else RateLimiter(clock=clock)
        self._metrics: QueueMetricsHandle | None = (
            metrics.for_queue(name, clock=clock) if metrics is not None else None
        )
        self._ready: deque[K] = deque()  # dirty and not processing: what get() hands out, in order
        self._dirty: set[K] = set()  # needs a pass: in _ready, or waiting for its worker's done()
        self._processing: set[K] = set()
        self._held: dict[K, _Hold] = {}
        self._delayed: dict[K, _Delayed] = {}
        self._wakeup = asyncio.Event()  # set while _ready is not empty (or the queue is shut down)
        self._shut = False

    # --- adding ----------------------------------------------------------------------------------

    def add(self, key: K, *, since: float | None = None) -> None:
        """Queue ``key`` (after its debounce hold when ``debounce`` is set). ``since``: when the wake
        really came, by the clock, if earlier (its time in the queue is counted from then)."""
        if self._shut or key in self._dirty:
            return
        if self.debounce <= 0:
            self._enqueue(key, since)
            return
        now = self._clock()
        hold = self._held.get(key)
        if hold is not None:
            hold.last = now  # the pending timer notices the extension when it fires
            return
        hold = self._held[key] = _Hold(first=now, last=now)
        self._arm_hold(key, hold, now)

    def add_after(self, key: K, delay: float) -> None:
        """Queue ``key`` after ``delay`` seconds, unless it is queued (or due) sooner."""
        if self._shut or key in self._dirty:
            return
        if delay <= 0:
            self._enqueue(key)
            return
        due = self._clock() + delay
        hold = self._held.get(key)
        if hold is not None and self._hold_due(hold) <= due:
            return
        delayed = self._delayed.get(key)
        if delayed is not None:
            if delayed.due <= due:
                return
            delayed.timer.cancel()
        timer = asyncio.get_running_loop().call_later(delay, self._fire_delayed, key)
        self._delayed[key] = _Delayed(due, timer)

    def add_rate_limited(self, key: K) -> float:
        """Queue ``key`` after its backoff (one more failure counted); returns the delay."""
        delay = self._limiter.when(key)
        if self._metrics is not None:
            self._metrics.retry()
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        """Reset ``key``'s backoff (its pass succeeded)."""
        self._limiter.forget(key)

    def retries(self, key: K) -> int:
        return self._limiter.retries(key)

    # --- working ---------------------------------------------------------------------------------

    async def get(self) -> K:
        """The next key; it is the caller's until ``done(key)``."""
        while not self._ready:
            if self._shut:
                raise QueueShutDown(self.name)
            self._wakeup.clear()
            await self._wakeup.wait()
        if self._shut:
            raise QueueShutDown(self.name)
        key = self._ready.popleft()
        self._dirty.discard(key)
        self._processing.add(key)
        if self._metrics is not None:
            self._metrics.get(key)
        return key

    def done(self, key: K) -> None:
        """The worker is finished with ``key``; queue it again if it was added meanwhile."""
        if key not in self._processing:
            return
        self._processing.discard(key)
        if self._metrics is not None:
            self._metrics.done(key)
        if key in self._dirty and not self._shut:
            self._push(key)

    def shutdown(self) -> None:
        """Drop everything queued or waiting; every ``get`` raises ``QueueShutDown`` from now on."""
        self._shut = True
        for hold in self._held.values():
            if hold.timer is not None:
                hold.timer.cancel()
        for delayed in self._delayed.values():
            delayed.timer.cancel()
        self._held.clear()
        self._delayed.clear()
        self._ready.clear()
        self._dirty.clear()
        if self._metrics is not None:
            self._metrics.clear()
        self._wakeup.set()

    def __len__(self) -> int:
        """Keys ready to be handed out (neither held, delayed, nor being processed)."""
        return len(self._ready)

    # --- internals -------------------------------------------------------------------------------

    def _enqueue(self, key: K, since: float | None = None) -> None:
        """Mark ``key`` dirty now: it goes to a worker, or right after its current worker is done."""
        hold = self._held.pop(key, None)
        if hold is not None and hold.timer is not None:
            hold.timer.cancel()
        delayed = self._delayed.pop(key, None)
        if delayed is not None:
            delayed.timer.cancel()
        if self._shut or key in self._dirty:
            return
        self._dirty.add(key)
        if self._metrics is not None:
            self._metrics.add(key, since)
        if key not in self._processing:
            self._push(key)

    def _push(self, key: K) -> None:
        self._ready.append(key)
        self._wakeup.set()

    def _hold_due(self, hold: _Hold) -> float:
        due = hold.last + self.debounce
        if self.max_delay > 0:
            due = min(due, hold.first + self.max_delay)
        return due

    def _arm_hold(self, key: K, hold: _Hold, now: float) -> None:
        delay = max(0.0, self._hold_due(hold) - now)
        hold.timer = asyncio.get_running_loop().call_later(delay, self._fire_hold, key)

    def _fire_hold(self, key: K) -> None:
        hold = self._held.get(key)
        if hold is None:
            return
        now = self._clock()
        if now + TIMER_SLACK_SECONDS < self._hold_due(hold):
            self._arm_hold(key, hold, now)  # more adds came meanwhile: hold on
            return
        self._enqueue(key)

    def _fire_delayed(self, key: K) -> None:
        if key in self._delayed:  # a replaced timer was cancelled, so this one is current
            self._enqueue(key)
