"""Published means programmed: the VM modes against a model of cozy-proxy (``tests.support.cozyproxy``),
on the local control plane, with the operator as a subprocess under its own ServiceAccount.

Every test asserts the datapath (which pod an address reaches, a pod's port filter), not only
conditions, and checks one invariant throughout (``Invariant``): no attachment is ever Published
while the model says its address reaches no pod, or a pod another Service holds (beyond the moment
two watches take to deliver one change). The tests play the kubelet (Pods with an IP, Ready or not;
the endpoints controllers do the rest) and the chart's own cozy-proxy Service; MetalLB assigns the
attachments' addresses, and the chart's from a pool declared for it as a hoster would.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, Final

import pytest

from hack.devcluster import ClusterInfo
from hack.metallb import POOLS, MetalLB, declare_pool
from operators.endpointattachment.constants import (
    METALLB_IPS_ANNOTATION,
    PROGRAMMED_ANNOTATION,
    REPROGRAM_ANNOTATION,
    SERVICE_PROXY_NAME_LABEL,
)
from shared.kube import ApiError, Kube, Obj
from shared.resources import ENDPOINTS, HELMRELEASES, PODS, SERVICE_ACCOUNTS, SERVICES
from tests.ea_builders import (
    for_create,
    lineage_labels,
    make_attachment,
    make_class,
    make_helmrelease,
    make_service,
    make_serviceproxy,
)
from tests.support.cozyproxy import CozyProxyModel, cozy_proxy
from tests.support.ea_cluster import (
    ATTACHMENTS,
    CLASSES,
    NODE,
    PROXIES,
    condition,
    ea_crds_and_node,
    ea_operator,
    leading,
)
from tests.support.loadbalancer import load_balancer
from tests.support.waiting import eventually, wait_for_object

# How long one change may take to travel through two watches (the operator's, the model's) before a
# Published attachment whose address the model does not deliver to its own pod counts as broken.
GRACE: Final = 10.0
TIMEOUT: Final = 60.0
VM_KIND: Final = "VMInstance"
SSH: Final = [{"name": "ssh", "protocol": "TCP", "port": 22, "targetPort": 22}]
# Between two attempts to follow a kind after an API error.
RETRY_SECONDS: Final = 0.5
# The chart's own Service asks MetalLB for this address, from a pool a hoster declared for it (outside
# every class's addresses in this file, so no class's pool overlaps it).
CHART_ADDRESS: Final = "100.64.0.10"
CHART_POOL: Final = "dp-chart-addresses"


@pytest.fixture(scope="module")
async def ea_crds(kube: Kube) -> AsyncIterator[None]:
    async with ea_crds_and_node(kube):
        yield


class Invariant:
    """Follows the namespace's attachments and checks, on every attachment event and every model
    change, that each Published one's address reaches, through the model, a pod its own Service
    holds. A breach is recorded with how long it lasted; ``check`` fails on one longer than GRACE
    (breaches that begin while the operator is deliberately stopped are excused)."""

    def __init__(self, kube: Kube, namespace: str, model: CozyProxyModel) -> None:
        self.kube, self.namespace, self.model = kube, namespace, model
        self.published: dict[str, str] = {}  # attachment -> address, while Published
        self.open: dict[str, float] = {}  # attachment -> since when broken
        self.breaches: list[tuple[str, float, str]] = []  # (attachment, seconds, what)
        self.excused = False
        self.transitions: list[tuple[str, str, str]] = []  # (attachment, Ready status, reason)

    def _broken(self, name: str, address: str) -> str | None:
        pod = self.model.reaches(address)
        if pod is None:
            return f"{address} reaches no pod"
        owner = self.model.owner_of(pod)
        if owner != (self.namespace, f"ea-{name}"):
            return f"{address} reaches {pod}, held by {owner}"
        return None

    def evaluate(self) -> None:
        now = asyncio.get_running_loop().time()
        for name, address in self.published.items():
            what = self._broken(name, address)
            if what is not None and name not in self.open and not self.excused:
                self.open[name] = now
            elif what is None and name in self.open:
                self.breaches.append((name, now - self.open.pop(name), "healed"))
        for name in [n for n in self.open if n not in self.published]:
            self.breaches.append((name, now - self.open.pop(name), "no longer Published"))

    async def _follow(self) -> None:
        while True:
            try:
                await self._list_and_watch()
            except ApiError:  # e.g. 429 while a new CRD's storage starts, 410 Gone: list again
                await asyncio.sleep(RETRY_SECONDS)  # a retry interval, not a wait for an effect

    async def _list_and_watch(self) -> None:
        listing = await self.kube.list(ATTACHMENTS.path(self.namespace))
        self.published.clear()
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
                    self.published.pop(obj["metadata"]["name"], None)
                elif kind != "BOOKMARK":
                    self._saw(obj)
                self.evaluate()

    def _saw(self, attachment: Obj) -> None:
        name = attachment["metadata"]["name"]
        status, reason = condition(attachment, "Ready")
        if not self.transitions or self.transitions[-1] != (name, status, reason):
            self.transitions.append((name, status, reason))
        address = (attachment.get("status") or {}).get("address")
        if (status, reason) == ("True", "Published") and address:
            self.published[name] = address
        else:
            self.published.pop(name, None)

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

        await eventually(closed, timeout=GRACE, what=f"broken Published attachments to heal: {self.open}")
        long = [b for b in self.breaches if b[1] > GRACE]
        assert not long, f"Published while the datapath was broken: {long}; transitions {self.transitions}"


@contextlib.asynccontextmanager
async def invariant(kube: Kube, namespace: str, model: CozyProxyModel) -> AsyncIterator[Invariant]:
    watcher = Invariant(kube, namespace, model)
    tasks = [asyncio.create_task(watcher._follow()), asyncio.create_task(watcher._on_model())]
    try:
        yield watcher
        await watcher.check()
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


class VMTenant:
    """One namespace with a VM application, its tenant-facing endpoint, a pool and the proxy declared."""

    def __init__(self, kube: Kube, namespace: str, balancer: MetalLB) -> None:
        self.kube, self.namespace, self.balancer = kube, namespace, balancer
        self.class_name = f"dp-{namespace}"[:60]
        self.ips = iter(range(10, 250))
        self.declared = False
        self.charts: list[str] = []  # the chart Services made here, holding CHART_ADDRESS

    async def setup(self, cidr: str, app: str = "vm1", selector: Mapping[str, str] | None = None) -> None:
        await self.kube.create(CLASSES.path(), for_create(make_class(self.class_name, cidrs=[cidr])))
        if await self.kube.get(PROXIES.path(name="cozy-proxy")) is None:
            await self.kube.create(PROXIES.path(), for_create(make_serviceproxy()))
            self.declared = True
        release = for_create(
            make_helmrelease(
                f"vm-{app}",
                self.namespace,
                labels=lineage_labels(kind=VM_KIND, name=app, tenant_facing=False),
            )
        )
        await self.kube.create(HELMRELEASES.path(self.namespace), release)
        endpoint = for_create(
            make_service(
                app,
                self.namespace,
                labels=lineage_labels(kind=VM_KIND, name=app),
                selector=selector or {"vm": app},
                ports=SSH,
            )
        )
        await self.kube.create(SERVICES.path(self.namespace), endpoint)

    async def pod(self, name: str, labels: Mapping[str, str], *, ip: bool = True, ready: bool = True) -> None:
        """A VM pod on the test node: with an IP (Running, Ready or not), or not yet scheduled."""
        await self.kube.create(
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

    async def set_ready(self, name: str, ready: bool) -> None:
        pod = await self.kube.get(PODS.path(self.namespace, name))
        assert pod is not None
        ip = (pod.get("status") or {}).get("podIP") or f"10.244.2.{next(self.ips)}"
        status = {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        }
        await self.kube.patch(PODS.path(self.namespace, name) + "/status", {"status": status}, kind="merge")

    async def pod_ip(self, name: str) -> str:
        pod = await self.kube.get(PODS.path(self.namespace, name))
        assert pod is not None
        return str(pod["status"]["podIP"])

    async def attachment(self, name: str, endpoint: str = "vm1", mode: str = "WholeIP") -> Obj:
        built = make_attachment(
            name, self.namespace, endpoint=endpoint, class_name=self.class_name, owner_uid=None, mode=mode
        )
        return await self.kube.create(ATTACHMENTS.path(self.namespace), for_create(built))

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
                "labels": {SERVICE_PROXY_NAME_LABEL: "cozy-proxy"},
                "annotations": {
                    "networking.cozystack.io/wholeIP": "false",
                    "networking.cozystack.io/allowICMP": "false",
                },
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
            lambda s: CHART_ADDRESS in _ingress_ips(s),
            namespace=self.namespace,
            timeout=TIMEOUT,
            what=f"MetalLB to assign {CHART_ADDRESS} to {name} (log: {self.balancer.log_path})",
        )

    async def cleanup(self) -> None:
        for attachment in (await self.kube.list(ATTACHMENTS.path(self.namespace)))["items"]:
            await self.kube.delete(ATTACHMENTS.path(self.namespace, attachment["metadata"]["name"]))
        await self.kube.delete(CLASSES.path(name=self.class_name))
        if self.declared:
            await self.kube.delete(PROXIES.path(name="cozy-proxy"))
        if self.charts:
            # CHART_ADDRESS is free again (MetalLB says so) before the next test asks for it.
            for name in self.charts:
                await self.kube.delete(SERVICES.path(self.namespace, name))
                await wait_for_object(
                    self.kube, SERVICES, name, lambda s: s is None, namespace=self.namespace, timeout=TIMEOUT
                )
            await self.balancer.wait_for_pool(CHART_POOL, TIMEOUT, assigned=0)
            await self.kube.delete(POOLS.path(self.balancer.namespace, CHART_POOL))


def _ingress_ips(service: Obj | None) -> list[str]:
    ingress = (((service or {}).get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
    return [str(entry.get("ip")) for entry in ingress]


@pytest.fixture
async def vm(kube: Kube, namespace: str, lb: MetalLB) -> AsyncIterator[VMTenant]:
    await wait_for_object(kube, SERVICE_ACCOUNTS, "default", lambda o: o is not None, namespace=namespace)
    tenant = VMTenant(kube, namespace, lb)
    yield tenant
    await tenant.cleanup()


@pytest.fixture
async def model(kube: Kube, namespace: str) -> AsyncIterator[CozyProxyModel]:
    async with cozy_proxy(kube, namespace) as running:
        yield running


@pytest.fixture
async def lb(kube: Kube, ea_crds: None) -> AsyncIterator[MetalLB]:
    async def classes_served() -> bool:
        try:
            await kube.list(CLASSES.path())
        except ApiError as error:  # a CRD just established answers 429 while its storage starts
            if error.status != 429:
                raise
            return False
        return True

    await eventually(classes_served, timeout=TIMEOUT, what="the IPAddressClass CRD to serve")
    async with load_balancer(kube) as balancer:
        yield balancer


async def wait_condition(kube: Kube, ns: str, name: str, type_: str, status: str, reason: str) -> Obj:
    found = await wait_for_object(
        kube,
        ATTACHMENTS,
        name,
        lambda o: condition(o, type_) == (status, reason),
        namespace=ns,
        timeout=TIMEOUT,
        what=f"{name}: {type_}={status} {reason}",
    )
    assert found is not None
    return found


def ready_message(attachment: Obj) -> str:
    return str(next(c["message"] for c in attachment["status"]["conditions"] if c["type"] == "Ready"))


# --- the tests -------------------------------------------------------------------------------------


async def test_two_attachments_to_a_stopped_vm_the_loser_never_renders(
    kube: Kube, cluster: ClusterInfo, tmp_path: Path, vm: VMTenant, model: CozyProxyModel, lb: MetalLB
) -> None:
    ns = vm.namespace
    await vm.setup("198.51.100.128/29")
    async with ea_operator(kube, cluster, tmp_path), invariant(kube, ns, model):
        # The VM is stopped: no pod at all. The two attachments still meet (one endpoint).
        await vm.attachment("a-winner")
        await vm.attachment("b-loser")
        await wait_condition(kube, ns, "b-loser", "DatapathAdmitted", "False", "ExclusivityConflict")
        winner = await wait_condition(kube, ns, "a-winner", "Ready", "False", "NoReadyBackend")
        address = winner["status"]["address"]
        # The VM starts: a pod without an IP, then Running but not Ready, then Ready.
        await vm.pod("vm1-launcher", {"vm": "vm1"}, ip=False)
        await vm.set_ready("vm1-launcher", False)
        await wait_condition(kube, ns, "a-winner", "Ready", "False", "NoReadyBackend")
        await vm.set_ready("vm1-launcher", True)
        published = await wait_condition(kube, ns, "a-winner", "Ready", "True", "Published")
        assert "vm1-launcher" in ready_message(published)  # the Ready message names the pod
        await model.wait_for(lambda m: m.pod_reached(address) == "vm1-launcher", TIMEOUT, "the winner's path")
        # Once it had its address and its backend, the operator updated it once (cozy-proxy's
        # address-before-Endpoints race, which the model plays): nothing is left unprogrammed.
        rendered = await kube.get(SERVICES.path(ns, "ea-a-winner"))
        assert rendered is not None
        assert rendered["metadata"]["annotations"][PROGRAMMED_ANNOTATION].startswith(f"{address}/")
        assert not model.stuck, model.log
        # The VM stops and starts again: still exactly one.
        await vm.set_ready("vm1-launcher", False)
        await wait_condition(kube, ns, "a-winner", "Ready", "False", "NoReadyBackend")
        await vm.set_ready("vm1-launcher", True)
        await wait_condition(kube, ns, "a-winner", "Ready", "True", "Published")
        await model.wait_for(lambda m: m.pod_reached(address) == "vm1-launcher", TIMEOUT, "the winner's path")
        assert condition(await kube.get(ATTACHMENTS.path(ns, "b-loser")), "DatapathAdmitted") == (
            "False",
            "ExclusivityConflict",
        )
    assert "ea-b-loser" not in model.seen, model.log


async def test_the_charts_own_service_wins_and_its_port_filter_stays(
    kube: Kube, cluster: ClusterInfo, tmp_path: Path, vm: VMTenant, model: CozyProxyModel, lb: MetalLB
) -> None:
    ns = vm.namespace
    await vm.setup("198.51.100.136/29")
    await vm.pod("vm1-launcher", {"vm": "vm1"})
    await vm.chart_service("vm1-chart", {"vm": "vm1"})
    pod_ip = await vm.pod_ip("vm1-launcher")
    await model.wait_for(lambda m: m.reaches(CHART_ADDRESS) == pod_ip, TIMEOUT, "the chart's path")
    async with ea_operator(kube, cluster, tmp_path), invariant(kube, ns, model):
        await vm.attachment("ssh", mode="PortList")
        conflict = await wait_condition(kube, ns, "ssh", "DatapathAdmitted", "False", "ExclusivityConflict")
        assert f"{ns}/vm1-chart" in next(
            c["message"] for c in conflict["status"]["conditions"] if c["type"] == "DatapathAdmitted"
        )
        await wait_condition(kube, ns, "ssh", "Ready", "False", "ExclusivityConflict")
    assert "ea-ssh" not in model.seen, model.log
    assert model.reaches(CHART_ADDRESS) == pod_ip
    assert model.owner_of(pod_ip) == (ns, "vm1-chart")
    assert model.port_filter(pod_ip) == frozenset({("TCP", 22)})
    assert not model.icmp_allowed(pod_ip)


async def test_port_list_with_two_ready_backends_stays_dark(
    kube: Kube, cluster: ClusterInfo, tmp_path: Path, vm: VMTenant, model: CozyProxyModel, lb: MetalLB
) -> None:
    ns = vm.namespace
    await vm.setup("198.51.100.144/29")
    await vm.pod("vm1-a", {"vm": "vm1"})
    await vm.pod("vm1-b", {"vm": "vm1"})
    async with ea_operator(kube, cluster, tmp_path), invariant(kube, ns, model):
        await vm.attachment("ssh", mode="PortList")
        await wait_condition(kube, ns, "ssh", "DatapathAdmitted", "False", "MultipleBackends")
        assert await kube.get(SERVICES.path(ns, "ea-ssh")) is None
        # One backend again: it publishes, at that pod, with its port filter.
        await vm.set_ready("vm1-b", False)
        published = await wait_condition(kube, ns, "ssh", "Ready", "True", "Published")
        assert "vm1-a" in ready_message(published)
        address = published["status"]["address"]
        await model.wait_for(lambda m: m.pod_reached(address) == "vm1-a", TIMEOUT, "the path to vm1-a")
        pod_ip = await vm.pod_ip("vm1-a")
        assert model.port_filter(pod_ip) == frozenset({("TCP", 22)})
        assert model.icmp_allowed(pod_ip)  # allowICMP defaults to true
        # A second ready backend again: dark (the Service is gone), never Published with two.
        await vm.set_ready("vm1-b", True)
        await wait_condition(kube, ns, "ssh", "DatapathAdmitted", "False", "MultipleBackends")
        await wait_for_object(kube, SERVICES, "ea-ssh", lambda s: s is None, namespace=ns, timeout=TIMEOUT)
        await model.wait_for(lambda m: m.reaches(address) is None, TIMEOUT, "the address to go dark")


async def test_the_survivor_is_programmed_again_after_the_loser_is_deleted(
    kube: Kube, cluster: ClusterInfo, tmp_path: Path, vm: VMTenant, model: CozyProxyModel, lb: MetalLB
) -> None:
    """An attachment publishes; while the operator is down the chart's own cozy-proxy Service comes
    and cozy-proxy programs it onto the pod. The restarted operator must delete the attachment's
    Service (the chart wins); cozy-proxy's delete then clears the pod's entries, the chart's. The
    operator's annotation on the chart's Service makes cozy-proxy program it again."""
    ns = vm.namespace
    await vm.setup("198.51.100.152/29")
    await vm.pod("vm1-launcher", {"vm": "vm1"})
    pod_ip = await vm.pod_ip("vm1-launcher")
    async with invariant(kube, ns, model) as watcher:
        async with ea_operator(kube, cluster, tmp_path, log_name="first.log"):
            await vm.attachment("ssh", mode="PortList")
            published = await wait_condition(kube, ns, "ssh", "Ready", "True", "Published")
            address = published["status"]["address"]
            await model.wait_for(lambda m: m.reaches(address) == pod_ip, TIMEOUT, "the attachment's path")
        watcher.excused = True  # the operator is down: nobody can answer for the datapath now
        await vm.chart_service("vm1-chart", {"vm": "vm1"})
        await model.wait_for(lambda m: m.owner_of(pod_ip) == (ns, "vm1-chart"), TIMEOUT, "the chart's path")
        async with ea_operator(kube, cluster, tmp_path, log_name="second.log"):
            await wait_condition(kube, ns, "ssh", "DatapathAdmitted", "False", "ExclusivityConflict")
            watcher.excused = False  # the operator answers again: from here on, the invariant holds
            await wait_for_object(
                kube, SERVICES, "ea-ssh", lambda s: s is None, namespace=ns, timeout=TIMEOUT
            )
            await model.wait_for(
                lambda m: (
                    m.reaches(CHART_ADDRESS) == pod_ip and m.port_filter(pod_ip) == frozenset({("TCP", 22)})
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
            assert any(line.startswith("delete ea-ssh") for line in model.log), model.log
            assert model.programs[(ns, "vm1-chart")] >= 2, model.log
            assert not model.icmp_allowed(pod_ip)
            # A second pass writes nothing more on the survivor.
            assert chart is not None
            value = chart["metadata"]["annotations"][REPROGRAM_ANNOTATION]
            await vm.kube.patch(
                SERVICES.path(ns, "vm1"), {"metadata": {"annotations": {"touch": "1"}}}, "merge"
            )
            await wait_condition(kube, ns, "ssh", "DatapathAdmitted", "False", "ExclusivityConflict")
            again = await kube.get(SERVICES.path(ns, "vm1-chart"))
            assert again is not None
            assert again["metadata"]["annotations"][REPROGRAM_ANNOTATION] == value


async def test_an_operator_restart_never_renders_a_loser(
    kube: Kube, cluster: ClusterInfo, tmp_path: Path, vm: VMTenant, model: CozyProxyModel, lb: MetalLB
) -> None:
    ns = vm.namespace
    await vm.setup("198.51.100.160/29")
    await vm.pod("vm1-launcher", {"vm": "vm1"})
    async with invariant(kube, ns, model):
        async with ea_operator(kube, cluster, tmp_path, log_name="first.log"):
            await vm.attachment("a-winner")
            published = await wait_condition(kube, ns, "a-winner", "Ready", "True", "Published")
            address = published["status"]["address"]
        # While the operator is down, a second attachment and a second VM start.
        await vm.attachment("b-loser")
        await vm.pod("vm1-launcher-2", {"vm": "vm1"}, ready=False)
        async with ea_operator(kube, cluster, tmp_path, log_name="second.log"):
            await wait_condition(kube, ns, "b-loser", "DatapathAdmitted", "False", "ExclusivityConflict")
            await wait_condition(kube, ns, "a-winner", "Ready", "True", "Published")
            await model.wait_for(
                lambda m: m.pod_reached(address) == "vm1-launcher", TIMEOUT, "the winner's path after restart"
            )
        async with ea_operator(kube, cluster, tmp_path, log_name="third.log") as third:
            # Changes made while no operator runs are reported late, whatever it does: this part
            # is about what the running operator publishes, so it changes the pods once it leads.
            await leading(third)
            await vm.set_ready("vm1-launcher", False)
            await wait_condition(kube, ns, "a-winner", "Ready", "False", "NoReadyBackend")
            await vm.set_ready("vm1-launcher-2", True)
            published = await wait_condition(kube, ns, "a-winner", "Ready", "True", "Published")
            assert "vm1-launcher-2" in ready_message(published)
            await model.wait_for(
                lambda m: m.pod_reached(address) == "vm1-launcher-2", TIMEOUT, "the path to the new pod"
            )
    assert "ea-b-loser" not in model.seen, model.log
