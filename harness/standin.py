"""A fast stand-in for the address substrate and the load balancer, to fill the cold start's world.

The cold start needs thousands of attachments settled (Provisioned) before it measures anything, and
the documented substrate model (``harness.substrate``: it plans over every object after each
batch of events) with MetalLB's real controller settle about 1.5 attachments a second. This stand-in
writes, per minted claim and per rendered Service, the very objects and statuses they would leave
behind, in the shapes the substrate publishes (``tests/fixtures/address-substrate/``) and the model
writes, through the real API:

* a claim the operator minted (no ``Bound`` phase yet): the next free host address of the class's
  first CIDR, as an ``IPAddress`` named by ``address_name`` (``spec.claimRef`` with the claim's UID,
  ``spec.className``, ``reclaimPolicy`` ``Retain``, ``source.fromClass``), its status ``Bound``; then
  the claim's status: ``Bound``, its class, its address, conditions ``ClassResolved`` and ``Bound``;
* a rendered Service naming a claim it bound: the driver's pin (``METALLB_IPS_ANNOTATION``), the
  address's ``status.associatedTo`` naming the Service, and the load balancer's answer
  (``status.loadBalancer.ingress``).

Decides: those bodies (pure: ``address_body``, ``claim_status``, ``associated_status``,
``ingress_status``) and the order of the writes (an address before the claim that shows it, a pin
before the ingress). Does not: resolve default classes, provision a second family, reclaim, unpin or
judge between two Services naming one claim (the model's ``SubstrateModel`` does all of that; the
benchmark's world never needs it), or write anything while no operator asks for it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from harness.bulk import retrying
from harness.streams import Handler, follow, supervised
from harness.substrate import (
    BOUND,
    CLASS_RESOLVED,
    REASON_BOUND,
    REASON_RESOLVED,
    RETAIN,
    address_name,
    class_cidrs,
)
from operators.endpointattachment.api import (
    ADDRESSES,
    API_VERSION,
    ATTACHMENT_LABEL,
    CLAIM_ANNOTATION,
    CLAIM_PHASE_BOUND,
    CLAIMS,
    METALLB_IPS_ANNOTATION,
)
from shared.conditions import TRUE, Condition, render, rfc3339
from shared.kube import NO_ANSWER, ApiError, Kube, Obj
from shared.resources import SERVICES

# Writes in flight (as many as the fill's creates: the API server is shared).
WRITERS: Final = 8
Work = Callable[[], Awaitable[None]]


def _metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def address_body(ip: str, class_name: str, claim: Mapping[str, Any]) -> Obj:
    """The ``IPAddress`` the driver creates for a claim, with the claim's UID the core completes."""
    metadata = _metadata(claim)
    return {
        "apiVersion": API_VERSION,
        "kind": "IPAddress",
        "metadata": {"name": address_name(ip)},
        "spec": {
            "address": ip,
            "className": class_name,
            "claimRef": {key: metadata[key] for key in ("namespace", "name", "uid")},
            "reclaimPolicy": RETAIN,
            "source": {"fromClass": {}},
        },
    }


def claim_status(claim: Mapping[str, Any], class_name: str, ip: str, now: str) -> Obj:
    """The core's status of a claim bound to one address (as ``SubstrateModel`` renders it)."""
    generation = int(_metadata(claim).get("generation") or 0)
    conditions = (
        Condition(CLASS_RESOLVED, TRUE, REASON_RESOLVED, f"class {class_name}"),
        Condition(BOUND, TRUE, REASON_BOUND, ip),
    )
    return {
        "status": {
            "phase": CLAIM_PHASE_BOUND,
            "className": class_name,
            "addresses": [{"name": address_name(ip), "address": ip}],
            "conditions": [render(c, None, generation, now) for c in conditions],
        }
    }


def associated_status(service: Mapping[str, Any]) -> Obj:
    """An address's status once the driver pinned it on ``service``."""
    metadata = _metadata(service)
    to = {"kind": "Service", "namespace": metadata["namespace"], "name": metadata["name"]}
    return {"status": {"phase": BOUND, "associatedTo": to}}


def ingress_status(ip: str) -> Obj:
    """The load balancer's answer on a Service it announces ``ip`` for."""
    return {"status": {"loadBalancer": {"ingress": [{"ip": ip}]}}}


def hosts(address_class: Mapping[str, Any]) -> Iterator[str]:
    """The class's host addresses, in the order the driver hands them out."""
    for network in class_cidrs(address_class):
        for host in network.hosts():
            yield str(host)


async def following(kube: Kube, path: str, on_event: Handler, *, label_selector: str = "") -> None:
    """``follow``, started over (listing again) when the connection gives no answer: on a loaded
    machine the API server's answers can be late, and the handlers here take an object twice alike."""
    while True:
        with contextlib.suppress(*NO_ANSWER):
            await follow(kube, path, on_event, label_selector=label_selector)


class StandIn:
    """Follows the benchmark namespace's claims and labelled Services; see the module docstring."""

    def __init__(self, kube: Kube, namespace: str, address_class: Mapping[str, Any]) -> None:
        self.kube, self.namespace = kube, namespace
        self.class_name = str(_metadata(address_class)["name"])
        self._free = hosts(address_class)
        self.ip_of: dict[str, str] = {}  # claim name -> its address (once its binding is written)
        self._binding: set[str] = set()
        self._answered: set[str] = set()  # Service names
        self.failures: list[str] = []
        self._work: asyncio.Queue[Work] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []

    def on_claim(self, kind: str, claim: Obj) -> None:
        name = str(_metadata(claim).get("name"))
        status = claim.get("status") or {}
        if kind == "DELETED" or name in self._binding or status.get("phase") == CLAIM_PHASE_BOUND:
            return
        if (claim.get("spec") or {}).get("className") != self.class_name:
            return
        self._binding.add(name)
        ip = next(self._free)
        self._work.put_nowait(lambda: self._bind(claim, ip))

    def on_service(self, kind: str, service: Obj) -> None:
        metadata = _metadata(service)
        name = str(metadata.get("name"))
        claim = (metadata.get("annotations") or {}).get(CLAIM_ANNOTATION)
        ip = self.ip_of.get(str(claim))
        if kind == "DELETED" or name in self._answered or ip is None:
            return
        self._answered.add(name)
        self._work.put_nowait(lambda: self._answer(service, ip))

    async def _bind(self, claim: Obj, ip: str) -> None:
        namespace, name = self.namespace, str(_metadata(claim)["name"])
        kube, address = self.kube, address_body(ip, self.class_name, claim)
        await retrying(lambda: kube.create(ADDRESSES.path(), address))  # a 409 on a retry: it got through
        status = {"status": {"phase": BOUND}}
        await retrying(lambda: kube.patch(ADDRESSES.path(name=address_name(ip)) + "/status", status, "merge"))
        self.ip_of[name] = ip  # before the claim shows it: the operator renders on that
        body = claim_status(claim, self.class_name, ip, rfc3339(datetime.now(UTC)))
        await retrying(lambda: kube.patch(CLAIMS.path(namespace, name) + "/status", body, "merge"))

    async def _answer(self, service: Obj, ip: str) -> None:
        kube, path = self.kube, SERVICES.path(self.namespace, str(_metadata(service)["name"]))
        pin = {"metadata": {"annotations": {METALLB_IPS_ANNOTATION: ip}}}
        await retrying(lambda: kube.patch(path, pin, "merge"))
        address, associated = ADDRESSES.path(name=address_name(ip)) + "/status", associated_status(service)
        await retrying(lambda: kube.patch(address, associated, "merge"))
        await retrying(lambda: kube.patch(path + "/status", ingress_status(ip), "merge"))

    async def _writer(self) -> None:
        while True:
            work = await self._work.get()
            try:
                await work()
            except (ApiError, *NO_ANSWER) as error:  # retried already: told when the fill stalls
                self.failures.append(str(error))
            finally:
                self._work.task_done()

    def start(self, say: Callable[[str], None]) -> None:
        services = following(
            self.kube, SERVICES.path(self.namespace), self.on_service, label_selector=ATTACHMENT_LABEL
        )
        self._tasks = [
            supervised(
                following(self.kube, CLAIMS.path(self.namespace), self.on_claim), "stand-in claims", say
            ),
            supervised(services, "stand-in Services", say),
            *(supervised(self._writer(), "stand-in writer", say) for _ in range(WRITERS)),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, ApiError):
                await task
