"""A model of cozy-proxy, the VM datapath, for tests: which pod each published address reaches.

cozy-proxy (cozystack/cozy-proxy) programs nftables on every node: ``pkg/controllers/
services_controller.go`` watches Services and v1 Endpoints and calls ``pkg/proxy/nft.go``. nftables
cannot run here (no kernel access, no nodes), so the tests run this model of exactly the behaviour
the EndpointAttachment operator must live with, driven by the same watch events on the local control
plane:

- It handles only Services labelled ``service.kubernetes.io/service-proxy-name: <its name>``.
- It reads one address per Service, the FIRST load-balancer ingress (``status.loadBalancer.
  ingress[0].ip``), and one backend, the FIRST ready address of the v1 Endpoints
  (``subsets[0].addresses[0].ip``; never EndpointSlices). Without both, nothing is programmed.
- Its state is keyed on the backend POD IP, not on the Service: a NAT map (address -> pod IP), an
  egress SNAT map (pod IP -> address), a port filter (pod IP -> allowed (protocol, port), PortList)
  and an ICMP allow (pod IPs). Programming a Service onto a pod (``EnsureRules``) replaces whatever
  another Service had there (and moves the Service's address off its previous pod).
- ``networking.cozystack.io/wholeIP: "true"`` clears the pod's port filter (every port is
  forwarded); otherwise the Service's ``spec.ports`` become the pod's port filter and
  ``networking.cozystack.io/allowICMP: "true"`` its ICMP allow.
- It programs a Service again on EVERY update of that Service (and of its Endpoints, but see the
  race below).
- The address-before-Endpoints race (``race=True``; what cozy-proxy does): when a Service event with
  an address finds NO Endpoints object for it (the endpoints controller has not created it yet; an
  existing Endpoints without a ready address is not this case), cozy-proxy programs the Service with
  no backend and does not come back to it: later events of its Endpoints (created, becoming ready)
  program nothing. Only an update of the Service itself (any update: an annotation, a re-list)
  programs it again, now with its Endpoints. ``stuck`` names such Services. With ``race=False`` an
  Endpoints event programs it as any other. The race is ON by default, as cozy-proxy has it: the
  operator closes it (it updates its Service once that has both its address and a backend in its
  Endpoints), and the VM-mode suite runs under it.
- Deleting any of its Services (or the Service leaving the proxy, losing its address or its ready
  endpoint) deletes the entries of the pod it had programmed, WHOEVER OWNS THEM NOW: the pod's NAT
  and SNAT entries, its port filter and its ICMP allow (``DeleteRules``, ``DeletePortFilter``).

What it does not model: nftables itself, conntrack, the 12-hour informer resync and the start-up
cleanup (a restarted cozy-proxy repairs everything; the operator must not rely on that).

Not declared on the project's runtime (as ``harness/substrate.py`` is), on purpose: cozy-proxy acts in
its informers' event handlers (``AddFunc``/``UpdateFunc``/``DeleteFunc``, no work queue), on each
event as it comes, and what the model must show follows from that: the race above, a Service
programmed again on every update of it and on a re-list (which hands every object over again), and
``programs`` counting each. A ``Wiring`` folds a burst of changes into one ``reconcile(key)`` over
the caches as they are then, and the runtime's informer hands over only what changed on a re-list,
so the model would lose exactly those. It keeps its own followers.

``on_service`` and ``on_endpoints`` take events (so unit tests drive the model without a cluster);
``run`` feeds them from watches of one namespace (``harness.following``). Queries: ``reaches``
(which pod IP an address reaches, with NAT and SNAT agreeing), ``pod_reached`` (its pod name),
``owner_of`` (the Service that programmed a pod), ``port_filter`` / ``icmp_allowed`` (a pod's
filter), ``seen`` (every Service name ever observed), ``programs`` (how often each Service was
programmed) and ``stuck`` (the Services the race left without a backend now).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from harness.following import follow, notify, object_key, wait_until
from shared.kube import Kube, Obj
from shared.resources import ENDPOINTS, SERVICES

PROXY_NAME_LABEL: Final = "service.kubernetes.io/service-proxy-name"
WHOLE_IP_ANNOTATION: Final = "networking.cozystack.io/wholeIP"
ALLOW_ICMP_ANNOTATION: Final = "networking.cozystack.io/allowICMP"
DEFAULT_PROXY_NAME: Final = "cozy-proxy"
# cozy-proxy filters these protocols; a port of another protocol is skipped.
FILTERED_PROTOCOLS: Final = frozenset({"TCP", "UDP"})

Key = tuple[str, str]
Port = tuple[str, int]


_key = object_key


def service_address(service: Mapping[str, Any] | None) -> str | None:
    """``hasValidServiceIP``: the first load-balancer ingress address, if any."""
    ingress = (((service or {}).get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
    return str(ingress[0].get("ip")) if ingress and ingress[0].get("ip") else None


def endpoint_address(endpoints: Mapping[str, Any] | None) -> str | None:
    """``hasValidEndpointIP``: the first ready address of the first subset, if any."""
    subsets = (endpoints or {}).get("subsets") or []
    addresses = (subsets[0].get("addresses") or []) if subsets else []
    return str(addresses[0].get("ip")) if addresses and addresses[0].get("ip") else None


@dataclass
class _Record:
    """What cozy-proxy's ServiceMap keeps per Service: the Service and its Endpoints as last seen."""

    service: Obj
    endpoints: Obj | None = None
    # Programmed with no backend by the address-before-Endpoints race: Endpoints events pass it by.
    stuck: bool = False


@dataclass
class CozyProxyModel:
    """cozy-proxy's pod-keyed datapath, as the module docstring describes it."""

    proxy_name: str = DEFAULT_PROXY_NAME
    race: bool = True  # the address-before-Endpoints race (module docstring)
    nat: dict[str, str] = field(default_factory=dict)  # address -> pod IP (svc_pod)
    snat: dict[str, str] = field(default_factory=dict)  # pod IP -> address (pod_svc)
    filters: dict[str, frozenset[Port]] = field(default_factory=dict)  # pod IP -> allowed ports
    icmp: set[str] = field(default_factory=set)  # pod IPs that accept ICMP
    owners: dict[str, Key] = field(default_factory=dict)  # pod IP -> Service that programmed it
    records: dict[Key, _Record] = field(default_factory=dict)
    endpoints: dict[Key, Obj] = field(default_factory=dict)  # the Endpoints informer's cache
    pod_names: dict[str, str] = field(default_factory=dict)  # pod IP -> pod name (Endpoints targetRef)
    seen: set[str] = field(default_factory=set)  # every Service name ever observed
    programs: collections.Counter[Key] = field(default_factory=collections.Counter)
    log: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.changed = asyncio.Condition()

    # --- events (services_controller.go) ---------------------------------------------------------

    def _managed(self, service: Mapping[str, Any]) -> bool:
        labels = (service.get("metadata") or {}).get("labels") or {}
        return labels.get(PROXY_NAME_LABEL) == self.proxy_name

    def on_service(self, kind: str, service: Obj) -> None:
        """A Service event: ADDED, MODIFIED or DELETED."""
        key = _key(service)
        self.seen.add(key[1])
        record = self.records.get(key)
        if kind == "DELETED":
            if record is not None:
                self._delete(record)
                del self.records[key]
            return
        if not self._managed(service) or service_address(service) is None:
            if record is not None:
                self._delete(record)
                del self.records[key]
            if self._managed(service):
                self.records[key] = _Record(service)
            return
        endpoints = self.endpoints.get(key)
        if self.race and endpoints is None:  # the address came before its Endpoints exist
            if record is not None:
                self._delete(record)
            self.records[key] = _Record(service, stuck=True)
            self.log.append(f"program {key[1]}: {service_address(service)} -> no backend (no Endpoints yet)")
            return
        if endpoint_address(endpoints) is None:
            if record is not None:
                self._delete(record)
            self.records[key] = _Record(service)
            return
        self.records[key] = _Record(service, endpoints)
        self._ensure(service, endpoints)

    def on_endpoints(self, kind: str, endpoints: Obj) -> None:
        """An Endpoints event: ADDED, MODIFIED or DELETED."""
        key = _key(endpoints)
        for subset in endpoints.get("subsets") or []:
            for address in [*(subset.get("addresses") or []), *(subset.get("notReadyAddresses") or [])]:
                target = address.get("targetRef") or {}
                if address.get("ip") and target.get("name"):
                    self.pod_names[str(address["ip"])] = str(target["name"])
        if kind == "DELETED":
            self.endpoints.pop(key, None)
        else:
            self.endpoints[key] = endpoints
        record = self.records.get(key)
        if record is None or record.stuck:  # stuck: only an update of the Service programs it again
            return
        if kind == "DELETED" or endpoint_address(endpoints) is None:
            self._delete(record)
            record.endpoints = None if kind == "DELETED" else endpoints
            return
        if service_address(record.service) is None:
            return
        record.endpoints = endpoints
        self._ensure(record.service, endpoints)

    # --- the datapath (nft.go) -------------------------------------------------------------------

    def _ensure(self, service: Obj, endpoints: Obj | None) -> None:
        """``EnsureRules`` then the port filter: the Service's address onto its first ready pod."""
        address, pod = service_address(service), endpoint_address(endpoints)
        if address is None or pod is None:
            return
        old_pod = self.nat.get(address)
        if old_pod is not None and old_pod != pod:  # the Service moved: off its previous pod
            self.nat.pop(address)
            self.snat.pop(old_pod, None)
        old_address = self.snat.get(pod)
        if old_address is not None and old_address != address:  # the pod was another Service's
            self.snat.pop(pod)
            self.nat.pop(old_address, None)
        self.nat[address], self.snat[pod] = pod, address
        key = _key(service)
        self.owners[pod] = key
        self.programs[key] += 1
        annotations = (service.get("metadata") or {}).get("annotations") or {}
        if annotations.get(WHOLE_IP_ANNOTATION) == "true":
            self.filters.pop(pod, None)
            self.icmp.discard(pod)
        else:
            ports = frozenset(
                (str(p.get("protocol") or "TCP"), int(p["port"]))
                for p in (service.get("spec") or {}).get("ports") or []
                if str(p.get("protocol") or "TCP") in FILTERED_PROTOCOLS and p.get("port")
            )
            if ports:
                self.filters[pod] = ports
            else:
                self.filters.pop(pod, None)  # an empty list means no filter
            if annotations.get(ALLOW_ICMP_ANNOTATION) == "true":
                self.icmp.add(pod)
            else:
                self.icmp.discard(pod)
        self.log.append(f"program {key[1]}: {address} -> {pod}")

    def _delete(self, record: _Record) -> None:
        """``DeleteRules`` and ``DeletePortFilter`` for the pod the record names: keyed on the pod,
        so whatever another Service programmed there since is cleared too."""
        address, pod = service_address(record.service), endpoint_address(record.endpoints)
        if address is None or pod is None:
            return
        self.snat.pop(pod, None)
        self.nat.pop(address, None)
        for other in [a for a, p in self.nat.items() if p == pod]:
            del self.nat[other]
        self.filters.pop(pod, None)
        self.icmp.discard(pod)
        self.owners.pop(pod, None)
        self.log.append(f"delete {_key(record.service)[1]}: {address} -/-> {pod}")

    # --- queries ---------------------------------------------------------------------------------

    def reaches(self, address: str) -> str | None:
        """The pod IP traffic to ``address`` reaches, with egress SNATed back to it; else None."""
        pod = self.nat.get(address)
        return pod if pod is not None and self.snat.get(pod) == address else None

    def pod_reached(self, address: str) -> str | None:
        """The name of the pod ``address`` reaches (None: none, or unknown)."""
        pod = self.reaches(address)
        return self.pod_names.get(pod) if pod is not None else None

    def owner_of(self, pod_ip: str) -> Key | None:
        """The Service whose programming holds the pod now."""
        return self.owners.get(pod_ip) if pod_ip in self.snat else None

    def port_filter(self, pod_ip: str) -> frozenset[Port] | None:
        """The ports the pod accepts from outside; None: no filter (every port)."""
        return self.filters.get(pod_ip)

    def icmp_allowed(self, pod_ip: str) -> bool:
        return pod_ip in self.icmp or pod_ip not in self.filters

    def ip_of(self, pod_name: str) -> str | None:
        return next((ip for ip, name in self.pod_names.items() if name == pod_name), None)

    @property
    def stuck(self) -> set[Key]:
        """The Services the address-before-Endpoints race left programmed with no backend."""
        return {key for key, record in self.records.items() if record.stuck}

    # --- driven by the cluster -------------------------------------------------------------------

    async def _notify(self) -> None:
        await notify(self.changed)

    async def wait_for(self, predicate: Callable[[CozyProxyModel], bool], timeout: float, what: str) -> None:
        """Until ``predicate(self)`` holds, re-checked on every event; fails after ``timeout``."""
        await wait_until(
            self.changed,
            lambda: predicate(self),
            timeout,
            lambda: (
                f"{what} (cozy-proxy model: nat={self.nat} snat={self.snat} filters={self.filters} "
                f"stuck={self.stuck} log={self.log[-10:]})"
            ),
        )

    async def run(self, kube: Kube, namespace: str) -> None:
        """Follow Endpoints, and once they are listed, Services: cozy-proxy's informers sync before it
        handles a Service (else every Service there already is would look like the race)."""
        listed = asyncio.Event()

        async def after_endpoints() -> None:
            listed.set()
            await self._notify()

        endpoints = asyncio.create_task(
            follow(kube, ENDPOINTS, namespace, self.on_endpoints, after_endpoints)
        )
        try:
            await listed.wait()
            await follow(kube, SERVICES, namespace, self.on_service, self._notify)
        finally:
            endpoints.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await endpoints


@contextlib.asynccontextmanager
async def cozy_proxy(
    kube: Kube, namespace: str, proxy_name: str = DEFAULT_PROXY_NAME, *, race: bool = True
) -> AsyncIterator[CozyProxyModel]:
    """The model, following one namespace's Services and Endpoints for the duration."""
    model = CozyProxyModel(proxy_name, race)
    task = asyncio.create_task(model.run(kube, namespace))
    try:
        yield model
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
