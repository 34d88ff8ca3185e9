"""The soak's world and its churn: what exists all along, and what is created and deleted at a rate.

The world, as a hoster and a tenant would have it: the operators' CRDs, Flux's HelmRelease CRD and
KubeVirt's (with its CR), a few GPU nodes and two GPU classes on one resource name, one tenant
namespace with ``APPS`` applications (HelmRelease, tenant-facing Service, lineage labels), the address
substrate's CRDs and one ``IPAddressClass`` of its MetalLB driver large enough for every claim alive
at once (the soak runs the substrate's model and MetalLB beside the operators).

The churn, each kind paced on its own at its rate (``Rates``), each object living until the
population of its kind is full and it is the oldest:

* attachments: created against a random application's Service, minting a claim of their own, every
  ``CLAIM_EVERY``-th through a reserved ``IPAddressClaim`` created just before it (and deleted just
  after it);
* pods: an application's pod (Ready, with an IP: its endpoint slice changes, its attachments
  wake) or a GPU VM's virt-launcher pod on a GPU node (GPUClass's inventory changes), bound to a
  node as a scheduler would, and deleted with no grace (no kubelet here);
* nodes: GPU nodes joining (Ready, allocatable) and leaving.

Until a kind's population is full, its every step is a create; from then on, steps alternate
between deleting the oldest and creating a new one. ``full_at`` says when every kind got there: the
run's steady state starts then.

A change is one create or one delete that the API accepted (``Counts.created``, ``deleted``; the
rate and the API requests per change count these). Every write the API accepted is also counted by
what it was written to (``Counts.written``, by ``WRITTEN_KINDS``: an application's pod and a GPU
VM's pod apart, and a pod's status and a node's status and taints counted as the writes they are),
so each operator's changes can be counted exactly (``analysis.CONCERNS``). Work runs under one
concurrency bound: when the control plane cannot keep up, the achieved rate falls, and the report
says so.

Does not: wait for the operators (the churn never reads their status), or measure anything.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

from harness.manifests import apply_all, load
from harness.substrate import METALLB_PROVISIONER
from harness.waiting import wait_for_object
from operators.endpointattachment.api import ATTACHMENTS, CLAIMS, CLASSES
from operators.gpuclass.api import GPUCLASSES
from shared.kube import ApiError, Kube
from shared.lineage import (
    LABEL_TRUE,
    TENANT_RESOURCE_LABEL,
    ApplicationRef,
)
from shared.resources import HELMRELEASES, NAMESPACES, NODES, PODS, SERVICE_ACCOUNTS, SERVICES

GROUP_VERSION: Final = "local.sdn.cozystack.io/v1alpha1"
NAMESPACE: Final = "soak"
KUBEVIRT_NAMESPACE: Final = "cozy-kubevirt"
CLASS_NAME: Final = "soak-pool"
POOL: Final = "198.18.0.0/20"  # RFC 2544's benchmarking range: 4,094 addresses
GPU_RESOURCE: Final = "nvidia.com/GH100_H200_SXM_141GB"  # permitted by the KubeVirt CR applied here
BASE_NODES: Final = 4
APPS: Final = 8
CLAIM_EVERY: Final = 4
CRD_FILES: Final = (
    "tests/fixtures/helmrelease-crd.yaml",
    "tests/fixtures/kubevirt-crd.yaml",
    "config/crd/gpuclass/gpu.cozystack.io_gpuclasses.yaml",
    "config/crd/endpointattachment/local.sdn.cozystack.io_endpointattachments.yaml",
    *(
        f"tests/fixtures/address-substrate/local.sdn.cozystack.io_{plural}.yaml"
        for plural in ("ipaddressclaims", "ipaddressclasses", "ipaddresses")
    ),
)
# The issue's trial: 600 attachments and 1,800 pods churned in 10 minutes; the soak asks ten times.
TRIAL_ATTACHMENTS_PER_MINUTE: Final = 60.0
TRIAL_PODS_PER_MINUTE: Final = 180.0
TRIAL_NODES_PER_MINUTE: Final = 0.6  # the trial churned no nodes; one every 100 s, times ten
# What ``Counts.written`` counts writes by: attachments, reserved claims, GPU nodes, an application's
# pods (no GPU: a Service's backends) and GPU VMs' virt-launcher pods (GPUClass's inventory).
WRITTEN_KINDS: Final = ("attachment", "claim", "node", "app-pod", "vm-pod")


@dataclass(frozen=True)
class Rates:
    """Lifecycles (one create, later one delete) per minute, and how many live at once."""

    attachments: float = 10 * TRIAL_ATTACHMENTS_PER_MINUTE
    pods: float = 10 * TRIAL_PODS_PER_MINUTE
    nodes: float = 10 * TRIAL_NODES_PER_MINUTE
    attachment_population: int = 150
    pod_population: int = 300
    node_population: int = 4
    concurrency: int = 24


@dataclass
class Counts:
    """What the churn did so far: accepted creates and deletes per kind, every accepted write by what
    it was written to (``WRITTEN_KINDS``), and refusals."""

    created: collections.Counter[str] = field(default_factory=collections.Counter)
    deleted: collections.Counter[str] = field(default_factory=collections.Counter)
    written: collections.Counter[str] = field(default_factory=collections.Counter)
    refused: collections.Counter[str] = field(default_factory=collections.Counter)
    last_refusal: str = ""

    @property
    def changes(self) -> int:
        return sum(self.created.values()) + sum(self.deleted.values())


async def install_world(kube: Kube) -> None:
    """Everything that exists before the churn starts (see the module's docstring)."""
    await apply_all(kube, [doc for path in CRD_FILES for doc in load(path)])
    for namespace in (NAMESPACE, KUBEVIRT_NAMESPACE):
        await kube.create(
            NAMESPACES.path(), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        )
    await apply_all(kube, load("tests/fixtures/kubevirt-cr-passthrough.yaml"))
    await wait_for_object(kube, SERVICE_ACCOUNTS, "default", lambda o: o is not None, namespace=NAMESPACE)
    for index in range(BASE_NODES):
        await create_node(kube, f"soak-base-{index}")
    for name, tolerations in (("h200", True), ("h200-spare", False)):  # the second one conflicts
        spec: dict[str, Any] = {"resourceName": GPU_RESOURCE}
        if tolerations:
            spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        body = {"apiVersion": GPUCLASSES.api_version, "kind": "GPUClass", "metadata": {"name": name}}
        await kube.create(GPUCLASSES.path(), {**body, "spec": spec})
    address_class = {
        "apiVersion": GROUP_VERSION,
        "kind": "IPAddressClass",
        "metadata": {"name": CLASS_NAME},
        "spec": {
            "provisioner": METALLB_PROVISIONER,
            "reclaimPolicy": "Delete",
            "parameters": {"addresses": [POOL]},
        },
    }
    await kube.create(CLASSES.path(), address_class)
    for app in range(APPS):
        name = f"app{app}"
        release = {
            "apiVersion": HELMRELEASES.api_version,
            "kind": "HelmRelease",
            "metadata": {"name": f"postgres-{name}", "labels": lineage(name)},
            "spec": {
                "interval": "5m",
                "chart": {
                    "spec": {"chart": "postgres", "sourceRef": {"kind": "HelmRepository", "name": "apps"}}
                },
            },
        }
        await kube.create(HELMRELEASES.path(NAMESPACE), release)
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": f"{name}-rw",
                "labels": {**lineage(name), TENANT_RESOURCE_LABEL: LABEL_TRUE},
            },
            "spec": {
                "selector": {"app": name},
                "ports": [{"name": "postgres", "port": 5432, "targetPort": 5432}],
            },
        }
        await kube.create(SERVICES.path(NAMESPACE), service)


def lineage(app: str) -> dict[str, str]:
    """The lineage labels of a Postgres application ``app``, as Cozystack's webhook writes them."""
    return ApplicationRef("apps.cozystack.io", "Postgres", app).labels()


async def create_node(kube: Kube, name: str) -> None:
    """A GPU node as the kubelet and the device plugin would leave it: Ready, allocatable, tainted."""
    await kube.create(NODES.path(), node_body(name))
    await make_ready(kube, name)
    await taint(kube, name)


def node_body(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


async def make_ready(kube: Kube, name: str) -> None:
    """The kubelet's and the device plugin's status: Ready, with the GPUs allocatable."""
    allocatable = {"cpu": "64", "memory": "512Gi", "pods": "250", GPU_RESOURCE: "8"}
    status = {
        "conditions": [{"type": "Ready", "status": "True"}],
        "capacity": allocatable,
        "allocatable": allocatable,
    }
    await kube.patch(NODES.path(name=name) + "/status", {"status": status}, kind="merge")


async def taint(kube: Kube, name: str) -> None:
    """The GPU taint, as the GPU operator puts it on a GPU node."""
    taints = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    await kube.patch(NODES.path(name=name), {"spec": {"taints": taints}}, kind="merge")


class Churn:
    """Creates and deletes at the asked rates until ``stop``; see the module's docstring."""

    def __init__(self, kube: Kube, rates: Rates, seed: int = 12) -> None:
        self.kube, self.rates = kube, rates
        self.rng = random.Random(seed)
        self.counts = Counts()
        self.limit = asyncio.Semaphore(rates.concurrency)
        self.serial = itertools.count()
        self.ips = itertools.cycle(f"10.244.{a}.{b}" for a in range(8, 64) for b in range(1, 255))
        self.attachments: collections.deque[tuple[str, str | None]] = collections.deque()
        self.pods: collections.deque[tuple[str, str]] = collections.deque()  # (name, written kind)
        self.nodes: collections.deque[str] = collections.deque()
        self.tasks: set[asyncio.Task[None]] = set()
        self.started = 0.0
        self.full: set[str] = set()  # the kinds whose population has been full once
        self.full_at: float | None = None  # seconds into the run when every population was full

    def _filled(self, kind: str) -> None:
        self.full.add(kind)
        if self.full_at is None and self.full >= {"attachment", "pod", "node"}:
            self.full_at = time.monotonic() - self.started

    # --- one change each -----------------------------------------------------------------------

    async def _change(
        self, kind: str, created: bool, call: Callable[[], Awaitable[Any]], written: str | None = None
    ) -> bool:
        """One create or delete of ``kind`` (counted as a write to ``written``, default ``kind``)."""
        try:
            await call()
        except ApiError as error:
            if error.status == 404 and not created:
                return True  # already gone (the GC or an operator was first): not a write
            self.counts.refused[kind] += 1
            self.counts.last_refusal = f"{kind}: {error}"
            return False
        (self.counts.created if created else self.counts.deleted)[kind] += 1
        self.counts.written[written or kind] += 1
        return True

    async def _update(self, written: str, call: Callable[[], Awaitable[Any]]) -> None:
        """One more write to an object just created (a status, a taint); an object deleted meanwhile
        refuses it, and that is no write."""
        with contextlib.suppress(ApiError):
            await call()
            self.counts.written[written] += 1

    async def _attachment_lifecycle_start(self) -> None:
        n = next(self.serial)
        name = f"soak-{n}"
        app = f"app{self.rng.randrange(APPS)}"
        claim: str | None = None
        if n % CLAIM_EVERY == 0:
            claim = f"soak-claim-{n}"
            reserved = {
                "apiVersion": GROUP_VERSION,
                "kind": "IPAddressClaim",
                "metadata": {"name": claim, "namespace": NAMESPACE},
                "spec": {"className": CLASS_NAME},
            }
            if not await self._change(
                "claim", True, lambda: self.kube.create(CLAIMS.path(NAMESPACE), reserved)
            ):
                return
        load_balancer = {"claimName": claim} if claim else {"className": CLASS_NAME}
        body = {
            "apiVersion": GROUP_VERSION,
            "kind": "EndpointAttachment",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "applicationRef": {"kind": "Postgres", "name": app},
                "endpoint": {"serviceName": f"{app}-rw"},
                "loadBalancer": load_balancer,
            },
        }
        if await self._change(
            "attachment", True, lambda: self.kube.create(ATTACHMENTS.path(NAMESPACE), body)
        ):
            self.attachments.append((name, claim))
        elif claim is not None:
            await self._change("claim", False, lambda: self.kube.delete(CLAIMS.path(NAMESPACE, claim)))

    async def _attachment_lifecycle_end(self, name: str, claim: str | None) -> None:
        await self._change("attachment", False, lambda: self.kube.delete(ATTACHMENTS.path(NAMESPACE, name)))
        if claim is not None:
            await self._change("claim", False, lambda: self.kube.delete(CLAIMS.path(NAMESPACE, claim)))

    async def _pod_start(self) -> None:
        n = next(self.serial)
        app = self.rng.random() < 0.5
        name = f"app-{n}" if app else f"virt-launcher-vm-{n}"
        labels = {"app": f"app{self.rng.randrange(APPS)}"} if app else {"vm": f"vm-{n}"}
        container: dict[str, Any] = {"name": "compute", "image": "registry.k8s.io/pause:3.10"}
        if not app:
            container["resources"] = {"limits": {GPU_RESOURCE: str(self.rng.choice((1, 1, 2)))}}
        nodes = [f"soak-base-{i}" for i in range(BASE_NODES)] + list(self.nodes)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "nodeName": self.rng.choice(nodes),
                "containers": [container],
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            },
        }
        written = "app-pod" if app else "vm-pod"
        if not await self._change("pod", True, lambda: self.kube.create(PODS.path(NAMESPACE), pod), written):
            return
        self.pods.append((name, written))
        ip = next(self.ips)
        status = {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": "True"}],
        }
        path = PODS.path(NAMESPACE, name) + "/status"
        await self._update(written, lambda: self.kube.patch(path, {"status": status}, kind="merge"))

    async def _pod_end(self, name: str, written: str) -> None:
        await self._change(
            "pod",
            False,
            lambda: self.kube.delete(PODS.path(NAMESPACE, name), grace_period_seconds=0),
            written,
        )

    async def _node_start(self) -> None:
        name = f"soak-node-{next(self.serial)}"
        if await self._change("node", True, lambda: self.kube.create(NODES.path(), node_body(name))):
            self.nodes.append(name)
            await self._update("node", lambda: make_ready(self.kube, name))
            await self._update("node", lambda: taint(self.kube, name))

    async def _node_end(self, name: str) -> None:
        await self._change("node", False, lambda: self.kube.delete(NODES.path(name=name)))

    # --- pacing ----------------------------------------------------------------------------------

    def _spawn(self, work: Awaitable[None]) -> None:
        async def bounded() -> None:
            try:
                await work
            finally:
                self.limit.release()

        task = asyncio.create_task(bounded())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _paced(self, per_minute: float, step: Callable[[], None]) -> None:
        """``step`` at ``per_minute`` a minute; when the bound is full, the step waits (the rate falls)."""
        if per_minute <= 0:
            return
        interval = 60.0 / per_minute
        due = time.monotonic()
        while True:
            await self.limit.acquire()
            step()
            due = max(due + interval, time.monotonic() - interval)  # never catch up in a burst
            await asyncio.sleep(
                max(0.0, due - time.monotonic())
            )  # pacing the churn, not a wait for an effect

    def _attachment_step(self) -> None:
        if len(self.attachments) >= self.rates.attachment_population:
            self._filled("attachment")
            name, claim = self.attachments.popleft()
            self._spawn(self._attachment_lifecycle_end(name, claim))
        else:
            self._spawn(self._attachment_lifecycle_start())

    def _pod_step(self) -> None:
        if len(self.pods) >= self.rates.pod_population:
            self._filled("pod")
            self._spawn(self._pod_end(*self.pods.popleft()))
        else:
            self._spawn(self._pod_start())

    def _node_step(self) -> None:
        if len(self.nodes) >= self.rates.node_population:
            self._filled("node")
            self._spawn(self._node_end(self.nodes.popleft()))
        else:
            self._spawn(self._node_start())

    async def run(self) -> None:
        """Churn until cancelled; in-flight changes finish before this returns."""
        self.started = time.monotonic()
        # A step is one create or one delete, so a lifecycle takes two: pace steps at twice the rate.
        pacers = [
            asyncio.create_task(self._paced(2 * self.rates.attachments, self._attachment_step)),
            asyncio.create_task(self._paced(2 * self.rates.pods, self._pod_step)),
            asyncio.create_task(self._paced(2 * self.rates.nodes, self._node_step)),
        ]
        try:
            await asyncio.gather(*pacers)
        finally:
            for pacer in pacers:
                pacer.cancel()
            await asyncio.gather(*pacers, return_exceptions=True)
            if self.tasks:
                await asyncio.gather(*self.tasks, return_exceptions=True)
