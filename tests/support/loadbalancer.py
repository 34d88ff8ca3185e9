"""Play the load balancer (MetalLB) through the API: give each rendered Service the address it asks
for in its provider annotation, by patching ``status.loadBalancer.ingress`` as a real one would.

It answers only Services carrying the attachment label, and only once per Service UID; ``hold``
names Services (namespace, name) it must leave unanswered, so a test can watch ``AddressPending``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from operators.endpointattachment.constants import (
    ATTACHMENT_LABEL,
    CILIUM_IPS_ANNOTATION,
    METALLB_IPS_ANNOTATION,
)
from shared.kube import SERVICES, ApiError, Kube, Obj


class FakeLoadBalancer:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.hold: set[tuple[str, str]] = set()
        self.answered = 0

    async def answer(self, service: Obj) -> None:
        metadata = service["metadata"]
        if (metadata["namespace"], metadata["name"]) in self.hold or metadata.get("deletionTimestamp"):
            return
        annotations = metadata.get("annotations") or {}
        address = annotations.get(METALLB_IPS_ANNOTATION) or annotations.get(CILIUM_IPS_ANNOTATION)
        ingress = (service.get("status") or {}).get("loadBalancer", {}).get("ingress") or []
        if not address or [i.get("ip") for i in ingress] == [address]:
            return
        patch = {"status": {"loadBalancer": {"ingress": [{"ip": address, "ipMode": "VIP"}]}}}
        with contextlib.suppress(ApiError):  # deleted meanwhile: nothing to announce
            await self.kube.patch(
                SERVICES.path(metadata["namespace"], metadata["name"]) + "/status", patch, "merge"
            )
            self.answered += 1

    async def run(self) -> None:
        while True:
            listing = await self.kube.list(SERVICES.path(), label_selector=ATTACHMENT_LABEL)
            for service in listing["items"]:
                await self.answer(service)
            try:
                async for kind, service in self.kube.watch(
                    SERVICES.path(),
                    resource_version=listing["metadata"]["resourceVersion"],
                    label_selector=ATTACHMENT_LABEL,
                ):
                    if kind in ("ADDED", "MODIFIED"):
                        await self.answer(service)
            except ApiError:
                continue  # 410 Gone and the like: list again


@contextlib.asynccontextmanager
async def load_balancer(kube: Kube) -> AsyncIterator[FakeLoadBalancer]:
    balancer = FakeLoadBalancer(kube)
    task = asyncio.create_task(balancer.run())
    try:
        yield balancer
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
