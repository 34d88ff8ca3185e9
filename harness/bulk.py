"""Many writes at once, as the benchmarks fill a control plane: bounded concurrency and retries.

Decides: how work is spread over clients ``concurrency`` at a time, and which failures of one write
are tried again (no answer, a transient status; a 409 after a retry is the earlier attempt having
got through). Does not: decide what is written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Final, TypeVar

from shared.kube import NO_ANSWER, ApiError, Kube, Obj

T = TypeVar("T")

CREATE_ATTEMPTS: Final = 5
RETRY_PAUSE_SECONDS: Final = 0.5  # the first backoff, doubled after each attempt
HTTP_CONFLICT: Final = 409


async def pool(
    clients: Sequence[Kube],
    concurrency: int,
    items: Iterable[T],
    work: Callable[[Kube, T], Awaitable[None]],
) -> int:
    """Run ``work`` on every item, ``concurrency`` at a time (items drawn lazily), the workers
    spread evenly over ``clients``; returns how many."""
    iterator = iter(items)
    done = 0

    async def worker(kube: Kube) -> None:
        nonlocal done
        for item in iterator:  # shared: each worker draws the next item
            await work(kube, item)
            done += 1

    await asyncio.gather(*(worker(clients[i % len(clients)]) for i in range(concurrency)))
    return done


async def gather(limit: asyncio.Semaphore, work: Iterable[Awaitable[T]]) -> list[T]:
    """Await every item, at most ``limit`` at a time."""

    async def bounded(item: Awaitable[T]) -> T:
        async with limit:
            return await item

    return await asyncio.gather(*(bounded(item) for item in work))


async def retrying(call: Callable[[], Awaitable[Obj]]) -> None:
    """One write, tried again on no answer or a transient status; a 409 after a retry is success."""
    pause = RETRY_PAUSE_SECONDS
    for attempt in range(CREATE_ATTEMPTS):
        try:
            await call()
            return
        except ApiError as error:
            if error.status == HTTP_CONFLICT and attempt > 0:
                return  # the earlier attempt got through after all
            if not error.transient or attempt == CREATE_ATTEMPTS - 1:
                raise
        except NO_ANSWER:
            if attempt == CREATE_ATTEMPTS - 1:
                raise
        await asyncio.sleep(pause)  # a retry's backoff, not a wait for an effect
        pause *= 2
