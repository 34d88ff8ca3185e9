"""What the benchmark watches: list-then-watch streams, the load balancer's answers, process CPU.

Decides:

* ``follow``: list, then watch from the list's resourceVersion, handing every object to a callback
  (the listed ones as ADDED); a stream the server closes resumes from the last resourceVersion seen
  (bookmarks included), an expired one (410) lists again. It runs until cancelled, with a bound on
  how often it may start over.
* ``BalancerWatch``: one watch of every Service carrying the attachment label, recording when it first
  saw each Service and when it first saw the load balancer's answer (``status.loadBalancer.ingress``
  holding the address of the provider annotation). The load balancer is MetalLB's real controller
  (``hack.metallb``); the baseline Services and the rendered ones go through the very same MetalLB
  and the very same watch. Nothing here writes a Service.
* CPU seconds of this process and of the whole machine, to tell where the time went (a process of
  its own: ``harness.procfs``).

Timestamps are ``time.perf_counter()`` of the benchmark process, taken when the event is handled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from operators.endpointattachment.api import ATTACHMENT_LABEL, METALLB_IPS_ANNOTATION
from shared.kube import ApiError, Kube, Obj
from shared.resources import SERVICES

MAX_RESTARTS = 1_000  # a stream that starts over this often is broken, not busy
RETRY_PAUSE = 0.5
Handler = Callable[[str, Obj], None]
Key = tuple[str, str]


async def follow(kube: Kube, path: str, on_event: Handler, *, label_selector: str = "") -> None:
    """List and watch ``path`` until cancelled, calling ``on_event(type, object)`` for each change.

    A transient refusal (429 while a new CRD's storage initialises, 5xx) is retried after a pause."""
    version = ""
    for _ in range(MAX_RESTARTS):
        try:
            if not version:
                listing = await kube.list(path, label_selector=label_selector)
                for item in listing.get("items") or []:
                    on_event("ADDED", item)
                version = str(listing["metadata"]["resourceVersion"])
            events = kube.watch(path, resource_version=version, label_selector=label_selector)
            async with contextlib.aclosing(events):
                async for kind, obj in events:
                    if kind == "ERROR":  # 410 Gone inside the stream: list again
                        version = ""
                        break
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    if kind != "BOOKMARK":
                        on_event(kind, obj)
        except ApiError as error:
            if error.status == 410:
                version = ""
            elif error.transient:
                await asyncio.sleep(RETRY_PAUSE)  # the pause between bounded retries
            else:
                raise
    raise RuntimeError(f"the watch of {path} started over {MAX_RESTARTS} times")


def supervised(coro: Coroutine[Any, Any, None], what: str, say: Callable[[str], None]) -> asyncio.Task[None]:
    """A task whose death (other than by cancellation) is told at once, not when it is awaited."""
    task = asyncio.create_task(coro, name=what)

    def told(done: asyncio.Task[None]) -> None:
        if not done.cancelled() and done.exception() is not None:
            say(f"{what} died: {done.exception()!r}")

    task.add_done_callback(told)
    return task


def provider_address(service: Obj) -> str | None:
    annotations = (service.get("metadata") or {}).get("annotations") or {}
    address = annotations.get(METALLB_IPS_ANNOTATION)
    return str(address) if address else None


def ingress_ips(service: Obj) -> list[str]:
    ingress = ((service.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
    return [str(entry.get("ip")) for entry in ingress]


class BalancerWatch:
    """When each labelled Service was first seen, and first seen answered (see the module doc)."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.seen_at: dict[Key, float] = {}
        self.answered_at: dict[Key, float] = {}
        self._runner: asyncio.Task[None] | None = None

    def start(self, say: Callable[[str], None]) -> None:
        self._runner = supervised(
            follow(self.kube, SERVICES.path(), self.on_event, label_selector=ATTACHMENT_LABEL),
            "the load balancer's watch",
            say,
        )

    async def stop(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError, ApiError):
                await self._runner

    def on_event(self, kind: str, service: Obj) -> None:
        metadata = service.get("metadata") or {}
        key = (str(metadata.get("namespace")), str(metadata.get("name")))
        if kind == "DELETED" or metadata.get("deletionTimestamp"):
            return
        now = time.perf_counter()
        self.seen_at.setdefault(key, now)
        address = provider_address(service)
        if address and ingress_ips(service) == [address]:
            self.answered_at.setdefault(key, now)


def own_cpu_seconds() -> float:
    return time.process_time()


def machine_cpu_seconds() -> float:
    """Busy CPU seconds of the whole machine, every core and process (``/proc/stat``)."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in first[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
