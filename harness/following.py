"""Following the real API for the test world's event-driven models (``cozyproxy``; the substrate model
runs on the project's runtime instead): what their controllers' informers do, reduced to what the
models need.

Decides: how a model follows one kind, LIST then WATCH for ever, and after a broken watch (410 Gone,
an ERROR event, an API error) LIST again with replace semantics (what vanished meanwhile is handed
over as a deletion); and how a test waits on a model (a condition re-checked on every change, with a
deadline).

Does not: cache anything itself (the model's handler does), resync periodically, or page a LIST.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

from shared.kube import ApiError, Kube, Obj
from shared.resources import Resource

# Between two LISTs after an API error (e.g. 429 while the API server starts, a CRD not served yet).
RETRY_SECONDS: Final = 0.5

Key = tuple[str, str]


def object_key(obj: Mapping[str, Any]) -> Key:
    metadata = obj.get("metadata") or {}
    return str(metadata.get("namespace") or ""), str(metadata.get("name") or "")


async def follow(
    kube: Kube,
    resource: Resource,
    namespace: str | None,
    handle: Callable[[str, Obj], None],
    after: Callable[[], Awaitable[None]],
) -> None:
    """Hand every object of ``resource`` (in ``namespace``; None: all) to ``handle(kind, obj)``, for
    ever; ``after()`` runs once a LIST was handed over and after each watch event."""
    known: dict[Key, Obj] = {}
    while True:
        try:
            listing = await kube.list(resource.path(namespace))
        except ApiError:
            await asyncio.sleep(RETRY_SECONDS)  # a retry interval, not a wait for an effect
            continue
        current = {object_key(o): o for o in listing.get("items", [])}
        for key, obj in known.items():
            if key not in current:
                handle("DELETED", obj)
        for key, obj in current.items():
            handle("MODIFIED" if key in known else "ADDED", obj)
        known = current
        await after()
        try:
            events = kube.watch(
                resource.path(namespace), resource_version=listing["metadata"]["resourceVersion"]
            )
            async with contextlib.aclosing(events):
                async for kind, obj in events:
                    if kind == "BOOKMARK":
                        continue
                    if kind == "ERROR":
                        break
                    if kind == "DELETED":
                        known.pop(object_key(obj), None)
                    else:
                        known[object_key(obj)] = obj
                    handle(kind, obj)
                    await after()
        except ApiError:  # 410 Gone and the like: list again
            continue


@contextlib.asynccontextmanager
async def following(
    kube: Kube,
    namespace: str | None,
    handlers: Sequence[tuple[Resource, Callable[[str, Obj], None]]],
    changed: asyncio.Condition | None = None,
) -> AsyncIterator[None]:
    """``follow`` each (resource, handle) for the duration (``changed`` notified after each event);
    the followers are cancelled on the way out."""

    async def after() -> None:
        if changed is not None:
            await notify(changed)

    tasks = [
        asyncio.create_task(follow(kube, resource, namespace, handle, after)) for resource, handle in handlers
    ]
    try:
        yield
    finally:
        await cancel_all(tasks)


async def cancel_all(tasks: Sequence[asyncio.Task[Any]]) -> None:
    """Cancel the tasks and wait until each has ended."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def notify(changed: asyncio.Condition) -> None:
    async with changed:
        changed.notify_all()


async def wait_until(
    changed: asyncio.Condition, predicate: Callable[[], bool], timeout: float, describe: Callable[[], str]
) -> None:
    """Until ``predicate()`` holds, re-checked whenever ``changed`` is notified; after ``timeout`` an
    AssertionError whose message ends with ``describe()`` (the model's state, for the reader)."""
    try:
        async with asyncio.timeout(timeout):
            async with changed:
                await changed.wait_for(predicate)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout}s waiting for {describe()}") from None
