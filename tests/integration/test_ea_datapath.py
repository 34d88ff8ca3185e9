"""Provisioned means programmed: the VM modes (``spec.loadBalancer.method``) against a model of
cozy-proxy (``harness.cozyproxy``), on the local control plane, with the operator as a
subprocess under its own ServiceAccount, run with ``--vm-datapath=cozy-proxy`` (the platform's
declaration that a cozy-proxy contract implementor is deployed).

Addresses come from the address substrate's model (``harness.substrate``: a class per test,
a claim minted by each attachment, the pin on the rendered Service), assigned by real MetalLB.

Every test asserts the datapath (which pod an address reaches, a pod's port filter), not only
conditions, and checks one invariant throughout (``Invariant``): no attachment is ever Provisioned
while the model says its address reaches no pod, or a pod another Service holds (beyond the moment
two watches take to deliver one change). The tests play the kubelet (Pods with an IP, Ready or not;
the endpoints controllers do the rest) and the chart's own cozy-proxy Service; MetalLB assigns the
attachments' addresses, and the chart's from a pool declared for it as a hoster would. One test
runs the operator without the declaration: a method attachment then renders nothing and draws no
address (``DatapathContractUnavailable``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import pytest

from hack.devcluster import ClusterInfo
from hack.metallb import declare_pool
from harness.cozyproxy import (
    ALLOW_ICMP_ANNOTATION,
    PROXY_NAME_LABEL,
    WHOLE_IP_ANNOTATION,
    CozyProxyModel,
    cozy_proxy,
)
from harness.ea_cluster import (
    ATTACHED,
    ATTACHMENT_LABEL,
    ATTACHMENTS,
    CLAIMS,
    CONDITION_PROVISIONED,
    CONDITION_RESOLVED,
    NODE,
    POOLS,
    Tenant,
    World,
    addresses,
    attachment_body,
    condition,
    ea_operator,
    ea_world,
    ingress,
    leading,
    message,
    wait_attachment,
)
from harness.following import cancel_all, following
from harness.operators import RunningOperator
from harness.substrate import DELETE, METALLB_IPS_ANNOTATION
from harness.waiting import eventually, wait_for_object
from shared.kube import ApiError, Kube, Obj
from shared.resources import ENDPOINT_SLICES, ENDPOINTS, PODS, SERVICE_ACCOUNTS, SERVICES

# How long one change may take to travel through two watches (the operator's, the model's) before a
# Provisioned attachment whose address the model does not deliver to its own pod counts as broken.
GRACE: Final = 10.0
TIMEOUT: Final = 60.0
VM_KIND: Final = "VMInstance"
SSH_PORT: Final = 22
SSH: Final = [{"name": "ssh", "protocol": "TCP", "port": SSH_PORT, "targetPort": SSH_PORT}]
# Between two attempts to follow a kind after an API error.
RETRY_SECONDS: Final = 0.5
# The chart's own Service asks MetalLB for this address, from a pool a hoster declared for it (outside
# every class's addresses in this file, so no class's pool overlaps it).
CHART_ADDRESS: Final = "100.64.0.10"
CHART_POOL: Final = "dp-chart-addresses"
# The operator's setting declaring cozy-proxy deployed (without it a method renders nothing).
VM_DATAPATH: Final = ("--vm-datapath=cozy-proxy",)

# The contract's vocabulary (docs/ and the design reference): reasons and methods.
TRUE: Final = "True"
FALSE: Final = "False"
REASON_PROVISIONED: Final = "Provisioned"
REASON_BACKEND_ALREADY_DELEGATED: Final = "BackendAlreadyDelegated"
REASON_MULTIPLE_BACKENDS: Final = "MultipleBackends"
REASON_DATAPATH_CONTRACT_UNAVAILABLE: Final = "DatapathContractUnavailable"
# Ours, beyond Cozystack's list: a VM mode with no ready backend in the Service's v1 Endpoints.
REASON_NO_READY_BACKEND: Final = "NoReadyBackend"
WHOLE_IP: Final = "WholeIP"
PORT_LIST: Final = "PortList"
# The operator's own annotations: on a surviving cozy-proxy Service after it deleted or changed one
# that shared its pods, and once on its own VM-mode Service when address and backend are both there.
REPROGRAM_ANNOTATION: Final = "local.sdn.cozystack.io/reprogrammed-after"
PROGRAMMED_ANNOTATION: Final = "local.sdn.cozystack.io/programmed-backend"


@pytest.fixture(scope="module")
async def world(kube: Kube) -> AsyncIterator[World]:
    """The CRDs, MetalLB and the substrate's model, for the module."""
    async with ea_world(kube) as running:
        yield running


def first_address(attachment: Obj | None) -> str | None:
    found = addresses(attachment)
    return found[0] if found else None


class Invariant:
    """Follows the namespace's attachments and checks, on every attachment event and every model
    change, that each Provisioned one's address reaches, through the model, a pod its own rendered
    Service (``status.serviceName``) holds. A breach is recorded with how long it lasted; ``check``
    fails on one longer than GRACE (breaches that begin while the operator is deliberately stopped
    are excused)."""

    def __init__(self, kube: Kube, namespace: str, model: CozyProxyModel) -> None:
        self.kube, self.namespace, self.model = kube, namespace, model
        self.provisioned: dict[str, tuple[str, str]] = {}  # attachment -> (address, Service)
        self.open: dict[str, float] = {}  # attachment -> since when broken
        self.breaches: list[tuple[str, float, str]] = []  # (attachment, seconds, what)
        self.excused = False
        self.transitions: list[tuple[str, str, str]] = []  # (attachment, Provisioned status, reason)

    def _broken(self, address: str, service: str) -> str | None:
        pod = self.model.reaches(address)
        if pod is None:
            return f"{address} reaches no pod"
        owner = self.model.owner_of(pod)
        if owner != (self.namespace, service):
            return f"{address} reaches {pod}, held by {owner}"
        return None

    def evaluate(self) -> None:
        now = asyncio.get_running_loop().time()
        for name, (address, service) in self.provisioned.items():
            what = self._broken(address, service)
            if what is not None and name not in self.open and not self.excused:
                self.open[name] = now
            elif what is None and name in self.open:
                self.breaches.append((name, now - self.open.pop(name), "healed"))
        for name in [n for n in self.open if n not in self.provisioned]:
            self.breaches.append((name, now - self.open.pop(name), "no longer Provisioned"))

    async def _follow(self) -> None:
        while True:
            try:
                await self._list_and_watch()
            except ApiError:  # e.g. 429 while a new CRD's storage starts, 410 Gone: list again
                await asyncio.sleep(RETRY_SECONDS)  # a retry interval, not a wait for an effect

    async def _list_and_watch(self) -> None:
        listing = await self.kube.list(ATTACHMENTS.path(self.namespace))
        self.provisioned.clear()
        for item in listing["items"]:
            self._saw(item)
        self.evaluate()
        events = self.kube.watch(
            ATTACHMENTS.path(self.namespace), resource_version=listing["metadata"]["resourceVersion"]
        )
        async with contextlib.aclosing(events):
            async for kind, obj in events:
                if kind == "ERROR":
                    break
                if kind == "DELETED":
                    self.provisioned.pop(obj["metadata"]["name"], None)
                elif kind != "BOOKMARK":
                    self._saw(obj)
                self.evaluate()

    def _saw(self, attachment: Obj) -> None:
        name = attachment["metadata"]["name"]
        status, reason = condition(attachment, CONDITION_PROVISIONED)
        if not self.transitions or self.transitions[-1] != (name, status, reason):
            self.transitions.append((name, status, reason))
        address = first_address(attachment)
        service = (attachment.get("status") or {}).get("serviceName")
        if (status, reason) == (TRUE, REASON_PROVISIONED) and address and service:
            self.provisioned[name] = (address, str(service))
        else:
            self.provisioned.pop(name, None)

    async def _on_model(self) -> None:
        while True:
            async with self.model.changed:
                await self.model.changed.wait()
            self.evaluate()

    async def check(self) -> None:
        """No breach lasted longer than GRACE, and none is open GRACE from now."""

        async def closed() -> bool:
            self.evaluate()
            return not self.open

        await eventually(closed, timeout=GRACE, what=f"broken Provisioned attachments to heal: {self.open}")
        long = [b for b in self.breaches if b[1] > GRACE]
        assert not long, f"Provisioned while the datapath was broken: {long}; transitions {self.transitions}"


@contextlib.asynccontextmanager
async def invariant(kube: Kube, namespace: str, model: CozyProxyModel) -> AsyncIterator[Invariant]:
    watcher = Invariant(kube, namespace, model)
    tasks = [asyncio.create_task(watcher._follow()), asyncio.create_task(watcher._on_model())]
    try:
        yield watcher
        await watcher.check()
    finally:
        await cancel_all(tasks)


class VMTenant(Tenant):
    """One namespace with a VM application, its tenant-facing endpoint and a class of its own; its
    pods keep their IP when their readiness changes (a VM's launcher pod does)."""

    def __init__(self, kube: Kube, namespace: str, world: World) -> None:
        super().__init__(kube, namespace, world)
        self.balancer = world.balancer
        self.charts: list[str] = []  # the chart Services made here, holding CHART_ADDRESS

    @property
    def class_name(self) -> str:
        return f"dp-{self.namespace}"[:60]

    async def setup(self, cidr: str, app: str = "vm1", selector: Mapping[str, str] | None = None) -> None:
        """The class (its pool loaded by MetalLB; its addresses deleted with their claim), the VM's
        HelmRelease and its endpoint Service."""
        await self.address_class(self.class_name, cidr, reclaim=DELETE)
        await self.app(app, VM_KIND)
        await self.endpoint(app, app, kind=VM_KIND, selector=selector or {"vm": app}, ports=SSH)

    async def pod(self, name: str, labels: Mapping[str, str], ready: bool = True, *, ip: bool = True) -> Obj:
        """A VM pod on the test node: with an IP (Running, Ready or not), or not yet scheduled."""
        pod = await self.kube.create(
            PODS.path(self.namespace),
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "labels": dict(labels)},
                "spec": {"nodeName": NODE, "containers": [{"name": "vm", "image": "example.invalid/vm:1"}]},
            },
        )
        if ip:
            await self.set_ready(name, ready)
        return pod

    async def set_ready(self, name: str, ready: bool) -> None:
        pod = await self.kube.get(PODS.path(self.namespace, name))
        assert pod is not None
        ip = (pod.get("status") or {}).get("podIP") or f"10.244.2.{next(self.ips)}"
        status = {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": TRUE if ready else FALSE}],
        }
        await self.kube.patch(PODS.path(self.namespace, name) + "/status", {"status": status}, kind="merge")

    async def pod_ip(self, name: str) -> str:
        pod = await self.kube.get(PODS.path(self.namespace, name))
        assert pod is not None
        return str(pod["status"]["podIP"])

    async def vm_attachment(
        self,
        name: str,
        method: str = WHOLE_IP,
        ports: Sequence[int] | None = None,
        allow_icmp: bool | None = None,
    ) -> Obj:
        """An attachment of the VM's endpoint in ``method``, minting from the tenant's class."""
        body = attachment_body(
            name,
            "vm1",
            app="vm1",
            kind=VM_KIND,
            class_name=self.class_name,
            method=method,
            ports=ports,
            allow_icmp=allow_icmp,
        )
        return await self.kube.create(ATTACHMENTS.path(self.namespace), body)

    async def ssh_attachment(self, name: str, allow_icmp: bool | None = None) -> Obj:
        """A PortList attachment publishing the VM's ssh port."""
        return await self.vm_attachment(name, method=PORT_LIST, ports=[SSH_PORT], allow_icmp=allow_icmp)

    async def chart_service(self, name: str, selector: Mapping[str, str]) -> None:
        """The application's own cozy-proxy Service in PortList mode (a ``vm-instance`` with
        ``external: true``), asking MetalLB for CHART_ADDRESS from the hoster's pool, once MetalLB
        assigned it. It asks only once its Endpoints exist: the chart's Service is not ours, and
        cozy-proxy's address-before-Endpoints race (which the model plays) would leave it
        unprogrammed whatever the operator does."""
        await declare_pool(self.kube, CHART_POOL, [f"{CHART_ADDRESS}/32"], self.balancer.namespace)
        await self.balancer.wait_for_pool(CHART_POOL)
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": name,
                "labels": {PROXY_NAME_LABEL: "cozy-proxy"},
                "annotations": {WHOLE_IP_ANNOTATION: "false", ALLOW_ICMP_ANNOTATION: "false"},
            },
            "spec": {
                "type": "LoadBalancer",
                "allocateLoadBalancerNodePorts": False,
                "externalTrafficPolicy": "Local",
                "selector": dict(selector),
                "ports": SSH,
            },
        }
        await self.kube.create(SERVICES.path(self.namespace), body)
        self.charts.append(name)
        await wait_for_object(
            self.kube, ENDPOINTS, name, lambda e: e is not None, namespace=self.namespace, timeout=TIMEOUT
        )
        annotate = {"metadata": {"annotations": {METALLB_IPS_ANNOTATION: CHART_ADDRESS}}}
        await self.kube.patch(SERVICES.path(self.namespace, name), annotate, "merge")
        await wait_for_object(
            self.kube,
            SERVICES,
            name,
            lambda s: CHART_ADDRESS in ingress(s),
            namespace=self.namespace,
            timeout=TIMEOUT,
            what=f"MetalLB to assign {CHART_ADDRESS} to {name} (log: {self.balancer.log_path})",
        )

    async def claims_of(self, attachment: str) -> list[Obj]:
        """The claims in the namespace labelled as minted for ``attachment``."""
        listing = await self.kube.list(
            CLAIMS.path(self.namespace), label_selector=f"{ATTACHMENT_LABEL}={attachment}"
        )
        return list(listing["items"])

    async def cleanup(self) -> None:
        await super().cleanup()
        if self.charts:
            # CHART_ADDRESS is free again (MetalLB says so) before the next test asks for it.
            for name in self.charts:
                await self.kube.delete(SERVICES.path(self.namespace, name))
                await wait_for_object(
                    self.kube, SERVICES, name, lambda s: s is None, namespace=self.namespace, timeout=TIMEOUT
                )
            await self.balancer.wait_for_pool(CHART_POOL, TIMEOUT, assigned=0)
            await self.kube.delete(POOLS.path(self.balancer.namespace, CHART_POOL))


def rendered_seen(model: CozyProxyModel, attachment: str) -> list[str]:
    """Every Service name the model ever saw that the operator would generate for ``attachment``."""
    return sorted(name for name in model.seen if name.startswith(f"{attachment}-"))


@pytest.fixture
async def vm(kube: Kube, namespace: str, world: World) -> AsyncIterator[VMTenant]:
    await wait_for_object(kube, SERVICE_ACCOUNTS, "default", lambda o: o is not None, namespace=namespace)
    tenant = VMTenant(kube, namespace, world)
    yield tenant
    await tenant.cleanup()


@pytest.fixture
async def model(kube: Kube, namespace: str) -> AsyncIterator[CozyProxyModel]:
    async with cozy_proxy(kube, namespace) as running:
        yield running


async def wait_provisioned(kube: Kube, ns: str, name: str, reason: str = REASON_PROVISIONED) -> Obj:
    """The attachment once Provisioned is True (``reason`` ``Provisioned``) or False with ``reason``."""
    status = TRUE if reason == REASON_PROVISIONED else FALSE
    return await wait_attachment(
        kube,
        ns,
        name,
        lambda o: condition(o, CONDITION_PROVISIONED) == (status, reason),
        timeout=TIMEOUT,
        what=f"{name}: {CONDITION_PROVISIONED}={status} {reason}",
    )


def provisioned_message(attachment: Obj) -> str:
    return message(attachment, CONDITION_PROVISIONED)


def operator(
    kube: Kube, cluster: ClusterInfo, tmp_path: Path, log_name: str = "operator.log"
) -> contextlib.AbstractAsyncContextManager[RunningOperator]:
    """The operator with the VM datapath declared."""
    return ea_operator(kube, cluster, tmp_path, extra_args=VM_DATAPATH, log_name=log_name)


# --- the tests -------------------------------------------------------------------------------------


async def test_two_attachments_to_a_stopped_vm_the_loser_never_renders(
    kube: Kube, cluster: ClusterInfo, tmp_path: Path, vm: VMTenant, model: CozyProxyModel
) -> None:
    ns = vm.namespace
    await vm.setup("198.51.100.128/29")
    async with operator(kube, cluster, tmp_path), invariant(kube, ns, model):
        # The VM is stopped: no pod at all. The two attachments still meet (one endpoint).
        await vm.vm_attachment("a-winner")
        await vm.vm_attachment("b-loser")
        lost = await wait_provisioned(kube, ns, "b-loser", REASON_BACKEND_ALREADY_DELEGATED)
        assert "a-winner" in provisioned_message(lost), provisioned_message(
            lost
        )  # the message names the winner
        winner = await wait_provisioned(kube, ns, "a-winner", REASON_NO_READY_BACKEND)
        address = first_address(winner)
        assert address is not None, winner["status"]
        # The VM starts: a pod without an IP, then Running but not Ready, then Ready.
        await vm.pod("vm1-launcher", {"vm": "vm1"}, ip=False)
        await vm.set_ready("vm1-launcher", False)
        await wait_provisioned(kube, ns, "a-winner", REASON_NO_READY_BACKEND)
        await vm.set_ready("vm1-launcher", True)
        provisioned = await wait_provisioned(kube, ns, "a-winner")
        assert "vm1-launcher" in provisioned_message(provisioned)  # the Provisioned message names the pod
        assert provisioned["status"]["phase"] == ATTACHED
        await model.wait_for(lambda m: m.pod_reached(address) == "vm1-launcher", TIMEOUT, "the winner's path")
        # Once it had its address and its backend, the operator updated it once (cozy-proxy's
        # address-before-Endpoints race, which the model plays): nothing is left unprogrammed.
        rendered = await kube.get(SERVICES.path(ns, provisioned["status"]["serviceName"]))
        assert rendered is not None
        assert rendered["metadata"]["labels"][PROXY_NAME_LABEL] == "cozy-proxy"
        assert rendered["metadata"]["annotations"][WHOLE_IP_ANNOTATION] == "true"
        assert rendered["metadata"]["annotations"][PROGRAMMED_ANNOTATION].startswith(f"{address}/")
        assert not model.stuck, model.log
        # The VM stops and starts again: still exactly one.
        await vm.set_ready("vm1-launcher", False)
        await wait_provisioned(kube, ns, "a-winner", REASON_NO_READY_BACKEND)
        await vm.set_ready("vm1-launcher", True)
        await wait_provisioned(kube, ns, "a-winner")
        await model.wait_for(lambda m: m.pod_reached(address) == "vm1-launcher", TIMEOUT, "the winner's path")
        assert condition(await kube.get(ATTACHMENTS.path(ns, "b-loser")), CONDITION_PROVISIONED) == (
            FALSE,
            REASON_BACKEND_ALREADY_DELEGATED,
        )
        assert await vm.labelled_services("b-loser") == []
    assert rendered_seen(model, "b-loser") == [], model.log


async def test_the_charts_own_service_wins_and_its_port_filter_stays(
    kube: Kube, cluster: ClusterInfo, tmp_path: Path, vm: VMTenant, model: CozyProxyModel
) -> None:
    ns = vm.namespace
    await vm.setup("198.51.100.136/29")
    await vm.pod("vm1-launcher", {"vm": "vm1"})
    await vm.chart_service("vm1-chart", {"vm": "vm1"})
    pod_ip = await vm.pod_ip("vm1-launcher")
    await model.wait_for(lambda m: m.reaches(CHART_ADDRESS) == pod_ip, TIMEOUT, "the chart's path")
    async with operator(kube, cluster, tmp_path), invariant(kube, ns, model):
        await vm.ssh_attachment("ssh", allow_icmp=True)
        lost = await wait_provisioned(kube, ns, "ssh", REASON_BACKEND_ALREADY_DELEGATED)
        assert f"{ns}/vm1-chart" in provisioned_message(lost), provisioned_message(lost)
        assert await vm.labelled_services("ssh") == []
    assert rendered_seen(model, "ssh") == [], model.log
    assert model.reaches(CHART_ADDRESS) == pod_ip
    assert model.owner_of(pod_ip) == (ns, "vm1-chart")
    assert model.port_filter(pod_ip) == frozenset({("TCP", SSH_PORT)})
    assert not model.icmp_allowed(pod_ip)


async def test_port_list_with_two_ready_backends_stays_dark(
    kube: Kube, cluster: ClusterInfo, tmp_path: Path, vm: VMTenant, model: CozyProxyModel
) -> None:
    ns = vm.namespace
    await vm.setup("198.51.100.144/29")
    await vm.pod("vm1-a", {"vm": "vm1"})
    await vm.pod("vm1-b", {"vm": "vm1"})
    async with operator(kube, cluster, tmp_path), invariant(kube, ns, model):
        await vm.ssh_attachment("ssh", allow_icmp=True)
        await wait_provisioned(kube, ns, "ssh", REASON_MULTIPLE_BACKENDS)
        # One backend again: it provisions, at that pod, with its port filter and its ICMP allow.
        await vm.set_ready("vm1-b", False)
        provisioned = await wait_provisioned(kube, ns, "ssh")
        assert "vm1-a" in provisioned_message(provisioned)
        address = first_address(provisioned)
        assert address is not None
        claim = provisioned["status"]["claimName"]
        await model.wait_for(lambda m: m.pod_reached(address) == "vm1-a", TIMEOUT, "the path to vm1-a")
        pod_ip = await vm.pod_ip("vm1-a")
        assert model.port_filter(pod_ip) == frozenset({("TCP", SSH_PORT)})
        assert model.icmp_allowed(pod_ip)
        # A second ready backend again: dark (cozy-proxy programs nothing for the address), never
        # Provisioned with two; the claim, and so the address, is kept.
        await vm.set_ready("vm1-b", True)
        dark = await wait_provisioned(kube, ns, "ssh", REASON_MULTIPLE_BACKENDS)
        await model.wait_for(lambda m: m.reaches(address) is None, TIMEOUT, "the address to go dark")
        assert dark["status"].get("claimName") == claim, dark["status"]
        kept = await kube.get(CLAIMS.path(ns, claim))
        assert kept is not None
        assert [a["address"] for a in kept["status"]["addresses"]] == [address]
        # Whichever way it went dark (Service withdrawn, or no backend left in its Endpoints), no
        # Service of ours names a ready backend cozy-proxy could program.
        for service in await vm.labelled_services("ssh"):
            endpoints = await kube.get(ENDPOINTS.path(ns, service["metadata"]["name"]))
            ready = [a for s in (endpoints or {}).get("subsets") or [] for a in s.get("addresses") or []]
            assert ready == [], endpoints
        # Back at one: the same address, at the remaining pod.
        await vm.set_ready("vm1-a", False)
        again = await wait_provisioned(kube, ns, "ssh")
        assert first_address(again) == address
        assert "vm1-b" in provisioned_message(again)
        await model.wait_for(lambda m: m.pod_reached(address) == "vm1-b", TIMEOUT, "the path to vm1-b")


class RenderedBackends:
    """Follows the namespace's v1 Endpoints and EndpointSlices and records, per Service, the most
    ready backends either ever listed at once (all slices of a Service together) while ``watching``."""

    def __init__(self) -> None:
        self.watching: str | None = None  # the rendered Service followed
        self.most = 0
        self.seen: list[tuple[str, int]] = []  # (kind, ready count) as events came
        self.slices: dict[str, int] = {}

    def on_endpoints(self, kind: str, endpoints: Obj) -> None:
        if endpoints["metadata"]["name"] != self.watching:
            return
        ready = (
            0
            if kind == "DELETED"
            else sum(len(s.get("addresses") or []) for s in endpoints.get("subsets") or [])
        )
        self._count("Endpoints", ready)

    def on_slice(self, kind: str, endpoint_slice: Obj) -> None:
        labels = endpoint_slice["metadata"].get("labels") or {}
        if self.watching is None or labels.get("kubernetes.io/service-name") != self.watching:
            return
        ready = [
            e
            for e in endpoint_slice.get("endpoints") or []
            if (e.get("conditions") or {}).get("ready") is not False
        ]
        self.slices[endpoint_slice["metadata"]["name"]] = 0 if kind == "DELETED" else len(ready)
        self._count("EndpointSlices", sum(self.slices.values()))

    def _count(self, kind: str, ready: int) -> None:
        self.seen.append((kind, ready))
        self.most = max(self.most, ready)


async def test_two_backends_back_to_one_heal_on_the_same_service_never_listing_two(
    kube: Kube, cluster: ClusterInfo, tmp_path: Path, vm: VMTenant, model: CozyProxyModel
) -> None:
    """MultipleBackends keeps the rendered Service and its address (its selector withdrawn: its
    Endpoints list no backend, cozy-proxy programs nothing); the second backend going publishes
    again on that very Service, its Endpoints and slices never listing two backends meanwhile, and
    the address never leaving it."""
    ns = vm.namespace
    await vm.setup("198.51.100.232/29")
    await vm.pod("vm1-a", {"vm": "vm1"})
    await vm.pod("vm1-b", {"vm": "vm1"}, ready=False)
    backends = RenderedBackends()
    services: list[tuple[str, Obj]] = []  # (event, the rendered Service) as events came

    def on_service(kind: str, service: Obj) -> None:
        if service["metadata"]["name"] == backends.watching:
            services.append((kind, service))

    handlers = [
        (ENDPOINTS, backends.on_endpoints),
        (ENDPOINT_SLICES, backends.on_slice),
        (SERVICES, on_service),
    ]
    async with following(kube, ns, handlers), operator(kube, cluster, tmp_path), invariant(kube, ns, model):
        await vm.ssh_attachment("ssh")
        provisioned = await wait_provisioned(kube, ns, "ssh")
        address = first_address(provisioned)
        assert address is not None
        rendered = provisioned["status"]["serviceName"]
        await model.wait_for(lambda m: m.pod_reached(address) == "vm1-a", TIMEOUT, "the path to vm1-a")
        service = await kube.get(SERVICES.path(ns, rendered))
        assert service is not None
        uid = service["metadata"]["uid"]
        # A second ready backend: dark, on the same Service, which keeps its address.
        await vm.set_ready("vm1-b", True)
        dark = await wait_provisioned(kube, ns, "ssh", REASON_MULTIPLE_BACKENDS)
        assert dark["status"].get("serviceName") == rendered, dark["status"]
        await model.wait_for(lambda m: m.reaches(address) is None, TIMEOUT, "the address to go dark")
        await wait_for_object(
            kube,
            ENDPOINTS,
            rendered,
            lambda e: e is not None and not any(s.get("addresses") for s in e.get("subsets") or []),
            namespace=ns,
            timeout=TIMEOUT,
            what="the rendered Service's Endpoints to list no ready backend",
        )
        # From here on: the rendered Service's Endpoints and slices, and the Service itself.
        backends.watching = rendered
        # The second backend goes: published again on the same Service, at the remaining pod.
        await vm.set_ready("vm1-a", False)
        healed = await wait_provisioned(kube, ns, "ssh")
        assert "vm1-b" in provisioned_message(healed)
        assert healed["status"]["serviceName"] == rendered
        assert first_address(healed) == address
        await model.wait_for(lambda m: m.pod_reached(address) == "vm1-b", TIMEOUT, "the path to vm1-b")
        assert backends.most <= 1, backends.seen
        assert ("Endpoints", 1) in backends.seen, backends.seen
        assert services, "the Service was changed in place (its selector restored)"
        for kind, seen in services:
            assert kind != "DELETED", "the Service was withdrawn"
            assert seen["metadata"]["uid"] == uid
            assert address in ingress(seen), f"the address left the Service: {seen.get('status')}"
        assert model.stuck == set(), model.log


async def test_the_survivor_is_programmed_again_after_the_loser_is_deleted(
    kube: Kube, cluster: ClusterInfo, tmp_path: Path, vm: VMTenant, model: CozyProxyModel
) -> None:
    """An attachment provisions; while the operator is down the chart's own cozy-proxy Service comes
    and cozy-proxy programs it onto the pod. The restarted operator must withdraw the attachment's
    Service (the chart wins); cozy-proxy's delete then clears the pod's entries, the chart's. The
    operator's annotation on the chart's Service makes cozy-proxy program it again."""
    ns = vm.namespace
    await vm.setup("198.51.100.152/29")
    await vm.pod("vm1-launcher", {"vm": "vm1"})
    pod_ip = await vm.pod_ip("vm1-launcher")
    async with invariant(kube, ns, model) as watcher:
        async with operator(kube, cluster, tmp_path, log_name="first.log"):
            await vm.ssh_attachment("ssh")
            provisioned = await wait_provisioned(kube, ns, "ssh")
            address = first_address(provisioned)
            rendered = provisioned["status"]["serviceName"]
            await model.wait_for(
                lambda m: m.reaches(address or "") == pod_ip, TIMEOUT, "the attachment's path"
            )
        watcher.excused = True  # the operator is down: nobody can answer for the datapath now
        await vm.chart_service("vm1-chart", {"vm": "vm1"})
        await model.wait_for(lambda m: m.owner_of(pod_ip) == (ns, "vm1-chart"), TIMEOUT, "the chart's path")
        async with operator(kube, cluster, tmp_path, log_name="second.log"):
            lost = await wait_provisioned(kube, ns, "ssh", REASON_BACKEND_ALREADY_DELEGATED)
            assert f"{ns}/vm1-chart" in provisioned_message(lost), provisioned_message(lost)
            watcher.excused = False  # the operator answers again: from here on, the invariant holds
            await wait_for_object(
                kube, SERVICES, rendered, lambda s: s is None, namespace=ns, timeout=TIMEOUT
            )
            await model.wait_for(
                lambda m: (
                    m.reaches(CHART_ADDRESS) == pod_ip
                    and m.port_filter(pod_ip) == frozenset({("TCP", SSH_PORT)})
                ),
                TIMEOUT,
                "the chart's path and port filter, programmed again",
            )
            # ...because the operator asked cozy-proxy to program the survivor again.
            chart = await wait_for_object(
                kube,
                SERVICES,
                "vm1-chart",
                lambda s: REPROGRAM_ANNOTATION in ((s or {}).get("metadata") or {}).get("annotations", {}),
                namespace=ns,
                timeout=TIMEOUT,
            )
            # The delete did clear the chart's entries (the model saw it), and the annotation healed it.
            assert any(line.startswith(f"delete {rendered}") for line in model.log), model.log
            assert model.programs[(ns, "vm1-chart")] >= 2, model.log
            assert not model.icmp_allowed(pod_ip)
            # A second pass writes nothing more on the survivor.
            assert chart is not None
            value = chart["metadata"]["annotations"][REPROGRAM_ANNOTATION]
            await vm.kube.patch(
                SERVICES.path(ns, "vm1"), {"metadata": {"annotations": {"touch": "1"}}}, "merge"
            )
            await wait_provisioned(kube, ns, "ssh", REASON_BACKEND_ALREADY_DELEGATED)
            again = await kube.get(SERVICES.path(ns, "vm1-chart"))
            assert again is not None
            assert again["metadata"]["annotations"][REPROGRAM_ANNOTATION] == value


async def test_an_operator_restart_never_renders_a_loser(
    kube: Kube, cluster: ClusterInfo, tmp_path: Path, vm: VMTenant, model: CozyProxyModel
) -> None:
    ns = vm.namespace
    await vm.setup("198.51.100.160/29")
    await vm.pod("vm1-launcher", {"vm": "vm1"})
    async with invariant(kube, ns, model):
        async with operator(kube, cluster, tmp_path, log_name="first.log"):
            await vm.vm_attachment("a-winner")
            provisioned = await wait_provisioned(kube, ns, "a-winner")
            address = first_address(provisioned)
        # While the operator is down, a second attachment and a second VM start.
        await vm.vm_attachment("b-loser")
        await vm.pod("vm1-launcher-2", {"vm": "vm1"}, ready=False)
        async with operator(kube, cluster, tmp_path, log_name="second.log"):
            await wait_provisioned(kube, ns, "b-loser", REASON_BACKEND_ALREADY_DELEGATED)
            await wait_provisioned(kube, ns, "a-winner")
            await model.wait_for(
                lambda m: m.pod_reached(address or "") == "vm1-launcher",
                TIMEOUT,
                "the winner's path after restart",
            )
        async with operator(kube, cluster, tmp_path, log_name="third.log") as third:
            # Changes made while no operator runs are reported late, whatever it does: this part
            # is about what the running operator provisions, so it changes the pods once it leads.
            await leading(third)
            await vm.set_ready("vm1-launcher", False)
            await wait_provisioned(kube, ns, "a-winner", REASON_NO_READY_BACKEND)
            await vm.set_ready("vm1-launcher-2", True)
            provisioned = await wait_provisioned(kube, ns, "a-winner")
            assert "vm1-launcher-2" in provisioned_message(provisioned)
            assert first_address(provisioned) == address
            await model.wait_for(
                lambda m: m.pod_reached(address or "") == "vm1-launcher-2", TIMEOUT, "the path to the new pod"
            )
        assert await vm.labelled_services("b-loser") == []
    assert rendered_seen(model, "b-loser") == [], model.log


async def test_without_the_datapath_declared_a_method_renders_nothing_and_draws_no_address(
    kube: Kube, cluster: ClusterInfo, tmp_path: Path, vm: VMTenant, model: CozyProxyModel
) -> None:
    """With the default ``--vm-datapath=none`` kube-proxy would skip a cozy-proxy Service that no
    cozy-proxy programs, while MetalLB announces its address: a black hole. So a method attachment
    renders nothing, mints no claim, and says why; declared, the same attachment provisions."""
    ns = vm.namespace
    await vm.setup("198.51.100.168/29")
    await vm.pod("vm1-launcher", {"vm": "vm1"})
    async with ea_operator(kube, cluster, tmp_path, log_name="undeclared.log"):
        await vm.vm_attachment("a-whole")
        await vm.ssh_attachment("b-ssh")
        for name in ("a-whole", "b-ssh"):
            found = await wait_provisioned(kube, ns, name, REASON_DATAPATH_CONTRACT_UNAVAILABLE)
            assert condition(found, CONDITION_RESOLVED) == (TRUE, "Resolved"), found["status"]
            assert not found["status"].get("serviceName"), found["status"]
        # The pass that wrote those conditions rendered nothing; what it drew is checked last.
        drawn = {}
        for name in ("a-whole", "b-ssh"):
            assert await vm.labelled_services(name) == []
            current = await vm.get(name)
            drawn[name] = ((current or {}).get("status") or {}).get("addresses"), await vm.claims_of(name)
    assert rendered_seen(model, "a-whole") == rendered_seen(model, "b-ssh") == [], model.log
    async with operator(kube, cluster, tmp_path, log_name="declared.log"), invariant(kube, ns, model):
        # Both select the one pod: the older one (first by name within the same second) provisions,
        # the other is delegated already.
        provisioned = await wait_provisioned(kube, ns, "a-whole")
        assert "vm1-launcher" in provisioned_message(provisioned)
        address = first_address(provisioned)
        await model.wait_for(
            lambda m: m.pod_reached(address or "") == "vm1-launcher", TIMEOUT, "the path once declared"
        )
        await wait_provisioned(kube, ns, "b-ssh", REASON_BACKEND_ALREADY_DELEGATED)
    # Issue 16: nothing can be published without the declaration, so no address was drawn for it.
    assert drawn == {name: (None, []) for name in drawn}, drawn


async def test_the_loser_takes_over_once_the_winner_is_deleted(
    kube: Kube, cluster: ClusterInfo, tmp_path: Path, vm: VMTenant, model: CozyProxyModel
) -> None:
    """Deleting the winning attachment withdraws its Service first (its finalizer), and only then
    does the loser render: its address reaches the pod, programmed by its own Service, and no
    address was ever Provisioned on two Services at once (the invariant)."""
    ns = vm.namespace
    await vm.setup("198.51.100.176/29")
    await vm.pod("vm1-launcher", {"vm": "vm1"})
    pod_ip = await vm.pod_ip("vm1-launcher")
    async with operator(kube, cluster, tmp_path), invariant(kube, ns, model):
        await vm.vm_attachment("a-winner")
        await vm.vm_attachment("b-loser")
        winner = await wait_provisioned(kube, ns, "a-winner")
        await wait_provisioned(kube, ns, "b-loser", REASON_BACKEND_ALREADY_DELEGATED)
        first = first_address(winner)
        await model.wait_for(lambda m: m.reaches(first or "") == pod_ip, TIMEOUT, "the winner's path")
        await kube.delete(ATTACHMENTS.path(ns, "a-winner"))
        await wait_for_object(
            kube, ATTACHMENTS, "a-winner", lambda o: o is None, namespace=ns, timeout=TIMEOUT
        )
        taken = await wait_provisioned(kube, ns, "b-loser")
        assert "vm1-launcher" in provisioned_message(taken)
        second, service = first_address(taken), taken["status"]["serviceName"]
        assert second is not None
        await model.wait_for(
            lambda m: m.reaches(second) == pod_ip and m.owner_of(pod_ip) == (ns, service),
            TIMEOUT,
            "the path through the former loser's Service",
        )
        assert model.reaches(first or "") is None, model.log
        assert await vm.labelled_services("a-winner") == []
        # cozy-proxy saw the winner's Service go before it saw the loser's with an address.
        log = model.log
        withdrawn = next(
            i for i, line in enumerate(log) if line.startswith(f"delete {winner['status']['serviceName']}")
        )
        rendered = next(i for i, line in enumerate(log) if line.startswith(f"program {service}"))
        assert withdrawn < rendered, log
