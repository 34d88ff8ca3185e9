"""Bounded waits for tests: on a watch, or polling with a deadline. Never a bare sleep.

``wait_for_object`` reads the object, and if it is not yet what the test expects, watches it from
that read's resourceVersion, so no change between the read and the watch is missed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

from shared.kube import ApiError, Kube, Obj
from shared.resources import RESOURCE_QUOTAS, Resource

T = TypeVar("T")
DEFAULT_TIMEOUT = 30.0


async def wait_for_object(
    kube: Kube,
    resource: Resource,
    name: str,
    predicate: Callable[[Obj | None], bool],
    *,
    namespace: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    what: str = "",
) -> Obj | None:
    """The first state of one object (None: absent) that satisfies ``predicate``, within ``timeout``."""
    last: Obj | None = None

    async def watch() -> Obj | None:
        nonlocal last
        while True:
            listing = await kube.list(resource.path(namespace), field_selector=f"metadata.name={name}")
            items = listing.get("items", [])
            last = items[0] if items else None
            if predicate(last):
                return last
            version = listing["metadata"]["resourceVersion"]
            events = kube.watch(
                resource.path(namespace), resource_version=version, field_selector=f"metadata.name={name}"
            )
            try:
                # aclosing: returning from inside the loop closes the watch's HTTP stream now, not at GC.
                async with contextlib.aclosing(events):
                    async for kind, obj in events:
                        if kind == "BOOKMARK":
                            continue
                        if kind == "ERROR":
                            break  # e.g. 410 Gone: list again
                        last = None if kind == "DELETED" else obj
                        if predicate(last):
                            return last
            except ApiError as error:
                if error.status != 410:
                    raise

    try:
        async with asyncio.timeout(timeout):
            return await watch()
    except TimeoutError:
        target = what or f"{resource.plural}/{name}"
        raise AssertionError(f"timed out after {timeout}s waiting for {target}; last seen: {last}") from None


async def eventually(
    probe: Callable[[], Awaitable[T | None]],
    *,
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = 0.2,
    what: str = "a condition",
) -> T:
    """Poll ``probe`` until it returns something truthy, or fail after ``timeout``."""
    deadline = asyncio.get_running_loop().time() + timeout
    last: T | None = None
    while True:
        last = await probe()
        if last:
            return last
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")
        await asyncio.sleep(interval)  # the poll interval of a bounded poll, not a wait for an effect


async def quota_in_force(kube: Kube, namespace: str, quota: Obj) -> None:
    """Create ``quota`` and wait until admission enforces it: it refuses a kind until the resource-quota
    controller has counted its usage. The controller discovers CRD kinds every 30 seconds, and counts
    a quota it already synced again only every 5 minutes: a quota created before it knew the kind is
    created once more, until it is counted."""
    name = quota["metadata"]["name"]

    def counted(found: Obj | None) -> bool:
        hard = quota["spec"]["hard"]
        status = (found or {}).get("status") or {}
        return status.get("hard") == hard and set(hard) <= set(status.get("used") or {})

    async def attempt() -> bool:
        if await kube.get(RESOURCE_QUOTAS.path(namespace, name)) is not None:
            await kube.delete(RESOURCE_QUOTAS.path(namespace, name))
            await wait_for_object(kube, RESOURCE_QUOTAS, name, lambda q: q is None, namespace=namespace)
        await kube.create(RESOURCE_QUOTAS.path(namespace), quota)
        try:
            await wait_for_object(kube, RESOURCE_QUOTAS, name, counted, namespace=namespace, timeout=10)
        except AssertionError:
            return False
        return True

    await eventually(attempt, timeout=120, interval=0.5, what=f"quota {name} counted")
