"""GPUClass agrees with the real kube-scheduler on generated worlds: as many VMs of a shape start as it says.

The kube-scheduler of the control plane's own release (``harness.scheduler``) binds onto registered
Nodes. Each world (``plan``, from a seed) is a class and its nodes: for a class of DRA devices, the
nodes publish what NVIDIA's DRA driver publishes (``tests/fixtures/nvidia-dra/``: full GPUs, every
dynamic MIG placement on the GPUs' counter sets, ``gpu`` and ``vfio`` siblings of one GPU), or a
shareable device (``allowMultipleAllocations``), with devices held by claims (admin access too),
tainted (in the slice or by a DeviceTaintRule), in pools that are incomplete, being republished or
invalid; for a device plugin's class, GPUs in ``status.allocatable``. CPU and memory are partly
taken, nodes not ready, cordoned or tainted.

The expected figure is the scheduler's alone: many more VM pods than could fit are created (each
with a ResourceClaim of ``units`` devices, or asking for the device plugin's resource), shaped as
KubeVirt renders the virt-launcher (``operators.gpuclass.launcher``, checked against KubeVirt's own
figures by its unit test), and the pods it binds are counted. GPUClass's figure for the shape, from
the objects as the API returns them, must equal it, less the bound pods that would not start: a pod
granted a device whose physical GPU (PCI bus ID) another claim already holds through a sibling
device sharing no counter set (the driver cannot prepare it), worked out here from the claims the
scheduler allocated. Each such pod is reported: it is where GPUClass is deliberately more right
than the scheduler. Any other disagreement fails, whichever side is wrong.

``GPUCLASS_AGREEMENT_WORLDS`` sets the number of worlds (30 by default, as ``make test`` runs it;
500 for the longer run in docs/development.md), ``GPUCLASS_AGREEMENT_SEED`` the first seed.
"""

from __future__ import annotations

import copy
import os
import random
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from hack.devcluster import ClusterInfo
from harness.scheduler import kube_scheduler
from operators.gpuclass.api import DEVICE_CLASSES, DEVICE_TAINT_RULES, RESOURCE_CLAIMS, RESOURCE_SLICES
from operators.gpuclass.dra import DraInventory
from operators.gpuclass.inventory import Inventory
from operators.gpuclass.kubevirt import Found
from operators.gpuclass.launcher import kubevirt_of, launcher_containers
from operators.gpuclass.quantity import parse_exact
from operators.gpuclass.reconcile import decide
from operators.gpuclass.vmshape import resolve, vm_shapes
from shared.kube import Kube, Obj
from shared.resources import NAMESPACES, NODES, PODS
from tests.gpuclass_builders import GPU_TOLERATION, make_class, make_kubevirt_cr, taint
from tests.gpuclass_scheduling import add_node, bound_when_settled, claim_body, clear, installed, pod_body

WORLDS: Final = int(os.environ.get("GPUCLASS_AGREEMENT_WORLDS", "30"))
FIRST_SEED: Final = int(os.environ.get("GPUCLASS_AGREEMENT_SEED", "1"))
SCHEDULER_NAME: Final = "gpuclass-agreement"
RESOURCE: Final = "nvidia.com/AGREEMENT_H200"
NVIDIA: Final = "gpu.nvidia.com"
SHARED_DRIVER: Final = "shared.agreement.cozystack.io"
SHARED_CLASS: Final = "agreement-shared"
MIG_1G_CLASS: Final = "agreement-mig-1g"  # a hoster's class of one MIG profile
# NVIDIA's chart gives its full-GPU DeviceClass this extendedResourceName: pods may ask by it.
EXTENDED_CLASS: Final = "gpu.nvidia.com"
EXTENDED_RESOURCE: Final = "nvidia.com/gpu"
PCI_BUS_ID: Final = "resource.kubernetes.io/pciBusID"
WORLD_LABEL: Final = "agreement.gpu.cozystack.io/world"
ROLE_LABEL: Final = "agreement.gpu.cozystack.io/role"
ADMIN_NAMESPACE_LABEL: Final = "resource.kubernetes.io/admin-access"
NOT_READY_TAINT: Final = taint("node.kubernetes.io/not-ready", "NoSchedule")
GPU_TAINT: Final = taint("nvidia.com/gpu", "NoSchedule", "present")
OTHER_TAINT: Final = taint("dedicated", "NoSchedule", "ml")
CR: Final = make_kubevirt_cr(pci=[RESOURCE], dra=True)
PERMITS: Final = Found(CR)
KUBEVIRT: Final = kubevirt_of(CR, "", 10)
FIXTURES: Final = Path(__file__).parents[1] / "fixtures" / "nvidia-dra"
# What a DRA node publishes: NVIDIA's driver as its fixtures say, or a shareable device of ours.
TEMPLATES: Final = {
    "plain": "slices-plain-h100-80gb.yaml",
    "mig": "slices-dynamic-mig-h100-80gb.yaml",
    "passthrough": "slices-passthrough-h100-80gb.yaml",
}
# A class's DeviceClass, and the node templates that publish its devices.
CLASSES: Final = {
    "gpu.nvidia.com": ("plain", "mig", "passthrough"),
    "mig.nvidia.com": ("mig",),
    MIG_1G_CLASS: ("mig",),
    "vfio.gpu.nvidia.com": ("passthrough",),
    SHARED_CLASS: ("shared",),
}
MAX_PODS: Final = 80
MAX_PARTITIONS: Final = 8  # an H100 splits into at most 7 MIG instances (8 memory slices)
MAX_SHARES: Final = 4  # the shareable device's 80 GiB in default shares of 20 GiB
GIB: Final = 1024**3


@dataclass
class NodePlan:
    name: str
    cpu_millis: int
    memory: int
    used_cpu_millis: int
    used_memory: int
    ready: bool
    cordoned: bool
    gpu_taint: bool
    other_taint: bool
    gpus: int = 0  # a device plugin's node: its GPUs, and those held
    used_gpus: int = 0
    slices: list[Obj] = field(default_factory=list)  # a DRA node's
    held: list[list[tuple[str, str]]] = field(default_factory=list)  # claims: (pool, device) each
    admin: list[tuple[str, str]] = field(default_factory=list)  # devices held with admin access
    taint_rules: list[Obj] = field(default_factory=list)


@dataclass
class WorldPlan:
    seed: int
    device_class: str  # "" for the device plugin's class
    nodes: list[NodePlan]
    shape: dict[str, Any]
    # The VMs ask by the DeviceClass's extendedResourceName (KEP-5004: the scheduler makes the claim)
    by_extended_name: bool = False

    @property
    def features(self) -> set[str]:
        return {str(s["metadata"].get("labels", {}).get(ROLE_LABEL)) for n in self.nodes for s in n.slices}


# --- the world ------------------------------------------------------------------------------------


@cache
def template(name: str) -> tuple[Obj, ...]:
    if name == "shared":
        return (shared_slice(),)
    return tuple(d for d in yaml.safe_load_all((FIXTURES / TEMPLATES[name]).read_text()) if d)


def shared_slice() -> Obj:
    """One shareable device of 80 GiB, each claim taking a default 20 GiB (or 40 GiB) share."""
    device = {
        "name": "shared-0",
        "allowMultipleAllocations": True,
        "attributes": {"type": {"string": "shared"}},
        "capacity": {
            "memory": {"value": "80Gi", "requestPolicy": {"default": "20Gi", "validRange": {"min": "20Gi"}}}
        },
    }
    spec = {
        "driver": SHARED_DRIVER,
        "pool": {"name": "", "generation": 1, "resourceSliceCount": 1},
        "devices": [device],
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "shared"},
        "spec": spec,
    }


def node_slices(rng: random.Random, kind: str, node: str) -> list[Obj]:
    """A template's slices on ``node`` (its pool named after it, slice order kept), perturbed: a
    taint on a device, the pool incomplete, half republished under a new generation, or invalid."""
    slices = []
    for index, original in enumerate(template(kind)):
        obj = copy.deepcopy(original)
        obj["metadata"] = {"name": f"{node}-{index:02d}", "labels": {ROLE_LABEL: kind}}
        obj["spec"]["nodeName"] = node
        obj["spec"]["pool"]["name"] = node
        slices.append(obj)
    device_slices = [s for s in slices if s["spec"].get("devices")]
    if rng.random() < 0.25:
        device = rng.choice(rng.choice(device_slices)["spec"]["devices"])
        effect = rng.choice(("NoSchedule", "NoExecute", "None"))
        device["taints"] = [{"key": "example.com/ecc", "value": "error", "effect": effect}]
    fate = rng.random()
    if fate < 0.06:  # one slice of the pool not (yet) published
        if len(slices) > 1:
            slices.remove(device_slices[-1])
        else:
            slices[0]["spec"]["pool"]["resourceSliceCount"] = 2
        slices[0]["metadata"]["labels"][ROLE_LABEL] = "incomplete"
    elif fate < 0.12:  # republished: a new generation, of which one slice of two is there
        again = copy.deepcopy(device_slices[0])
        again["metadata"]["name"] = f"{node}-gen2"
        again["spec"]["pool"].update(generation=2, resourceSliceCount=len(slices) + 1)
        again["metadata"]["labels"][ROLE_LABEL] = "republished"
        slices.append(again)
    elif fate < 0.17:  # invalid: a device name in two slices
        twice = copy.deepcopy(device_slices[0])
        twice["metadata"]["name"] = f"{node}-twice"
        twice["spec"]["devices"] = twice["spec"]["devices"][:1]
        twice["metadata"]["labels"][ROLE_LABEL] = "invalid"
        slices.append(twice)
        for obj in slices:
            obj["spec"]["pool"]["resourceSliceCount"] = len(slices)
    return slices


def hold(rng: random.Random, node: NodePlan) -> None:
    """Claims already allocated on the node, as an allocator would have made them: devices taken
    at random while their counters allow, never two siblings of one GPU; and an admin's claim."""
    counters: dict[str, dict[str, float]] = {}
    devices: list[tuple[str, Obj]] = []
    for obj in node.slices:
        for counter_set in obj["spec"].get("sharedCounters") or ():
            counters[counter_set["name"]] = {
                n: quantity(v["value"]) for n, v in counter_set["counters"].items()
            }
        if obj["spec"]["pool"].get("generation") == 1 and "twice" not in obj["metadata"]["name"]:
            devices.extend((obj["spec"]["driver"], d) for d in obj["spec"].get("devices") or ())
    gpus: set[str] = set()
    for driver, device in rng.sample(devices, len(devices)):
        if driver != NVIDIA or rng.random() > 0.3:
            continue
        bus = device.get("attributes", {}).get(PCI_BUS_ID, {}).get("string", "")
        uses = [
            (c["counterSet"], n, quantity(v["value"]))
            for c in device.get("consumesCounters") or ()
            for n, v in c["counters"].items()
        ]
        if (bus in gpus and not uses) or any(counters[s][n] < amount for s, n, amount in uses):
            continue
        for s, n, amount in uses:
            counters[s][n] -= amount
        if not uses:
            gpus.add(bus)
        node.held.append([(node.name, device["name"])])
    if devices and rng.random() < 0.25:
        node.admin.append((node.name, rng.choice(devices)[1]["name"]))


def quantity(text: str) -> float:
    return float(parse_exact(text) or 0)


def plan(seed: int) -> WorldPlan:
    """A world from ``seed``: a class, its nodes (not all of its kind), mixed free devices, CPU and
    memory, taints, cordons, not-ready nodes."""
    rng = random.Random(seed)
    device_class = "" if seed % 5 == 0 else rng.choice(sorted(CLASSES))
    nodes = []
    for index in range(rng.randint(2, 4)):
        cpu = rng.choice((16000, 32000, 64000))
        memory = rng.choice((64, 256, 1024)) * GIB
        node = NodePlan(
            name=f"agree-{seed}-n{index}",
            cpu_millis=cpu,
            memory=memory,
            used_cpu_millis=rng.choice((0, 0, 0, cpu // 4, cpu // 2, cpu - 1000)),
            used_memory=rng.choice((0, 0, 0, memory // 4, memory // 2, memory - 4 * GIB)),
            ready=rng.random() > 0.1,
            cordoned=rng.random() < 0.1,
            gpu_taint=rng.random() < 0.5,
            other_taint=rng.random() < 0.1,
        )
        if device_class:
            kind = rng.choice(CLASSES[device_class]) if rng.random() < 0.8 else "plain"
            node.slices = node_slices(rng, kind, node.name)
            hold(rng, node)
            if rng.random() < 0.15:
                device = rng.choice([d for s in node.slices for d in s["spec"].get("devices") or ()])
                selector = {
                    "driver": NVIDIA if kind != "shared" else SHARED_DRIVER,
                    "pool": node.name,
                    "device": device["name"],
                }
                node.taint_rules.append(
                    {
                        "deviceSelector": selector,
                        "taint": {"key": "example.com/drain", "effect": "NoSchedule"},
                    }
                )
        else:
            node.gpus = rng.choice((0, 1, 2, 4, 8))
            node.used_gpus = rng.choice((0, 0, rng.randint(0, node.gpus)))
        nodes.append(node)
    # Units a node of the class can give one VM: a shareable device serves each claim one share.
    units = 1 if device_class == SHARED_CLASS else rng.choice((1, 1, 1, 2, 2, 3))
    shape: dict[str, Any] = {"name": "vm", "units": units}
    if rng.random() < 0.8:
        shape["cpu"] = f"{rng.choice((1, 2, 4, 8))}"
        shape["memory"] = f"{rng.choice((2, 8, 16, 64))}Gi"
    by_extended_name = device_class == EXTENDED_CLASS and rng.random() < 0.5
    return WorldPlan(seed, device_class, nodes, shape, by_extended_name)


# --- the cluster ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scheduler(cluster: ClusterInfo) -> Iterator[None]:
    with kube_scheduler(cluster, SCHEDULER_NAME):
        yield


def device_class_objects() -> list[Obj]:
    nvidia = [d for d in yaml.safe_load_all((FIXTURES / "deviceclasses.yaml").read_text()) if d]
    ours = {
        MIG_1G_CLASS: f"device.driver == '{NVIDIA}' && device.attributes['{NVIDIA}'].type == 'mig' && "
        f"device.attributes['{NVIDIA}'].profile == '1g.10gb'",
        SHARED_CLASS: f"device.driver == '{SHARED_DRIVER}'",
    }
    return [d for d in nvidia if d["metadata"]["name"] in CLASSES] + [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": e}}]},
        }
        for name, e in ours.items()
    ]


@pytest.fixture(scope="module")
async def device_classes(kube: Kube) -> AsyncIterator[None]:
    async with installed(kube, device_class_objects()):
        yield


async def build(kube: Kube, namespace: str, world: WorldPlan) -> list[str]:
    """The world's objects; returns the paths of its cluster-scoped ones (nodes aside)."""
    label = {WORLD_LABEL: str(world.seed)}
    paths: list[str] = []
    for node in world.nodes:
        taints = [t for t, on in ((GPU_TAINT, node.gpu_taint), (OTHER_TAINT, node.other_taint)) if on]
        if not node.ready:
            taints.append(NOT_READY_TAINT)  # what the node lifecycle controller adds
        allocatable = {"cpu": f"{node.cpu_millis}m", "memory": str(node.memory), "pods": "110"}
        if not world.device_class:
            allocatable[RESOURCE] = str(node.gpus)
        await add_node(
            kube, node.name, label, allocatable, taints=taints, ready=node.ready, cordoned=node.cordoned
        )
        for obj in node.slices:
            await kube.create(
                RESOURCE_SLICES.path(),
                {**obj, "metadata": {**obj["metadata"], "labels": {**obj["metadata"]["labels"], **label}}},
            )
            paths.append(RESOURCE_SLICES.path(name=obj["metadata"]["name"]))
        for index, spec in enumerate(node.taint_rules):
            name = f"{node.name}-{index}"
            await kube.create(
                DEVICE_TAINT_RULES.path(),
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "DeviceTaintRule",
                    "metadata": {"name": name},
                    "spec": spec,
                },
            )
            paths.append(DEVICE_TAINT_RULES.path(name=name))
        await take(kube, namespace, world, node)
    return paths


async def take(kube: Kube, namespace: str, world: WorldPlan, node: NodePlan) -> None:
    """What tenants hold on ``node``: a bound pod's CPU and memory (and device-plugin GPUs), and the
    node's claims, allocated (one of them with admin access)."""
    labels = {WORLD_LABEL: str(world.seed), ROLE_LABEL: "tenant"}
    requests = {"cpu": f"{node.used_cpu_millis}m", "memory": str(node.used_memory)}
    limits = {}
    if node.used_gpus:
        requests[RESOURCE] = limits[RESOURCE] = str(node.used_gpus)
    container = {"name": "tenant", "resources": {"requests": requests, "limits": limits}}
    await kube.create(
        PODS.path(namespace), pod_body(f"{node.name}-tenant", labels, {"nodeName": node.name}, [container])
    )
    driver = NVIDIA if not node.slices or node.slices[0]["spec"]["driver"] == NVIDIA else SHARED_DRIVER
    claims = [(devices, False) for devices in node.held] + [([device], True) for device in node.admin]
    for index, (devices, admin) in enumerate(claims):
        name = f"{node.name}-held-{index}"
        body = claim_body(name, len(devices), "gpu.nvidia.com", labels, admin)
        await kube.create(RESOURCE_CLAIMS.path(namespace), body)
        results = [
            {
                "request": "gpu",
                "driver": driver,
                "pool": pool,
                "device": device,
                **({"adminAccess": True} if admin else {}),
            }
            for pool, device in devices
        ]
        selector = {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node.name]}]}
            ]
        }
        status = {"allocation": {"devices": {"results": results}, "nodeSelector": selector}}
        await kube.patch(RESOURCE_CLAIMS.path(namespace, name) + "/status", {"status": status}, kind="merge")


async def gpuclass_fits(kube: Kube, namespace: str, world: WorldPlan) -> int:
    """GPUClass's figure for the shape, from the world as the API returns it, through its folds."""
    selector = f"{WORLD_LABEL}={world.seed}"
    inventory, dra = Inventory(compute=True), DraInventory()
    for node in (await kube.list(NODES.path(), label_selector=selector))["items"]:
        inventory.upsert_node(node)
    for pod in (await kube.list(PODS.path(namespace), label_selector=selector))["items"]:
        inventory.upsert_pod(pod)
    for body in device_class_objects():
        found = await kube.get(DEVICE_CLASSES.path(name=body["metadata"]["name"]))
        assert found is not None
        dra.upsert_class(found)
    for obj in (await kube.list(RESOURCE_SLICES.path(), label_selector=selector))["items"]:
        dra.upsert_slice(("", obj["metadata"]["name"]), obj)
    for obj in (await kube.list(DEVICE_TAINT_RULES.path()))["items"]:
        dra.upsert_taint_rule(obj)
    for obj in (await kube.list(RESOURCE_CLAIMS.path(namespace), label_selector=selector))["items"]:
        dra.upsert_claim((namespace, obj["metadata"]["name"]), obj)
    cls = make_class(
        "agreement",
        "" if world.device_class else RESOURCE,
        device_class=world.device_class or None,
        tolerations=[GPU_TOLERATION],
        vm_sizes=[world.shape["units"]],
        vm_shapes=[world.shape],
    )
    status = decide([cls], inventory, PERMITS, dra)["agreement"].status
    (fit,) = [f for f in status.fits if f.name]
    return fit.vms


def vm_containers(world: WorldPlan) -> list[dict[str, Any]]:
    """The virt-launcher's containers for the shape, as KubeVirt renders them (GPU units only: one
    small container)."""
    (shape,) = vm_shapes([world.shape])
    vm = resolve(shape, {})
    if not shape.whole or vm is None:
        return [{"name": "compute", "resources": {}}]
    return launcher_containers(vm, KUBEVIRT)


def pod_count(world: WorldPlan) -> int:
    """More VM pods than can bind, from the world's make-up alone: per node, its devices drawing on
    no counter (a shareable one's four shares), eight for each counter set (no GPU splits further),
    its device plugin's GPUs; by the shape's units, and one more."""
    most = 0
    for node in world.nodes:
        most += node.gpus
        for obj in node.slices:
            most += MAX_PARTITIONS * len(obj["spec"].get("sharedCounters") or ())
            for device in obj["spec"].get("devices") or ():
                if not device.get("consumesCounters"):
                    most += MAX_SHARES if device.get("allowMultipleAllocations") else 1
    units: int = world.shape["units"]
    return min(MAX_PODS, most // units + 1)


async def start_vms(kube: Kube, namespace: str, world: WorldPlan, count: int) -> None:
    labels = {WORLD_LABEL: str(world.seed), ROLE_LABEL: "vm"}
    spec = {
        "schedulerName": SCHEDULER_NAME,
        "nodeSelector": {WORLD_LABEL: str(world.seed)},
        "tolerations": [GPU_TOLERATION],
    }
    containers = vm_containers(world)
    units = world.shape["units"]
    app = [c for c in containers if "restartPolicy" not in c]
    sidecars = [c for c in containers if "restartPolicy" in c]
    for index in range(count):
        name = f"vm-{world.seed}-{index:02d}"
        if world.device_class and not world.by_extended_name:
            claim = claim_body(name, units, world.device_class, labels)
            await kube.create(RESOURCE_CLAIMS.path(namespace), claim)
            body = pod_body(name, labels, spec, app, claim=name)
        else:
            gpus = {EXTENDED_RESOURCE if world.by_extended_name else RESOURCE: str(units)}
            first = app[0].get("resources", {})
            with_gpus = {
                **app[0],
                "resources": {
                    "requests": {**first.get("requests", {}), **gpus},
                    "limits": {**first.get("limits", {}), **gpus},
                },
            }
            body = pod_body(name, labels, spec, [with_gpus, *app[1:]])
        if sidecars:
            body["spec"]["initContainers"] = [{"image": "registry.k8s.io/pause:3.10", **c} for c in sidecars]
        await kube.create(PODS.path(namespace), body)


async def would_not_start(kube: Kube, namespace: str, world: WorldPlan) -> list[str]:
    """The bound VM pods (in the order they were made) granted a device whose physical GPU another
    claim holds through a device sharing no counter set with it: the driver prepares only one."""
    selector = f"{WORLD_LABEL}={world.seed}"
    facts: dict[tuple[str, str], tuple[str, frozenset[str]]] = {}  # (pool, device) -> (gpu, counter sets)
    for obj in (await kube.list(RESOURCE_SLICES.path(), label_selector=selector))["items"]:
        for device in obj["spec"].get("devices") or ():
            bus = device.get("attributes", {}).get(PCI_BUS_ID, {}).get("string", "")
            sets = frozenset(c["counterSet"] for c in device.get("consumesCounters") or ())
            facts[(obj["spec"]["pool"]["name"], device["name"])] = (
                f"{obj['spec']['nodeName']}/{bus}" if bus else "",
                sets,
            )
    claims: dict[str, Obj] = {}  # the held claims by name, a VM's by its pod's (the scheduler's own too)
    for claim in (await kube.list(RESOURCE_CLAIMS.path(namespace)))["items"]:
        owners = [o["name"] for o in claim["metadata"].get("ownerReferences") or () if o.get("kind") == "Pod"]
        claims[owners[0] if owners else claim["metadata"]["name"]] = claim
    held: dict[str, list[frozenset[str]]] = {}

    def devices_of(claim: Obj) -> list[tuple[str, frozenset[str]]]:
        results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get(
            "results"
        ) or ()
        return [
            facts.get((r["pool"], r["device"]), ("", frozenset()))
            for r in results
            if not r.get("adminAccess")
        ]

    for name, claim in claims.items():
        if "-held-" in name:
            for gpu, sets in devices_of(claim):
                if gpu:
                    held.setdefault(gpu, []).append(sets)
    doomed = []
    pods = (await kube.list(PODS.path(namespace), label_selector=f"{selector},{ROLE_LABEL}=vm"))["items"]
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        if not pod["spec"].get("nodeName") or pod["metadata"]["name"] not in claims:
            continue
        devices = [(gpu, sets) for gpu, sets in devices_of(claims[pod["metadata"]["name"]]) if gpu]
        if not starts(devices, held):
            doomed.append(pod["metadata"]["name"])
            continue
        for gpu, sets in devices:
            held.setdefault(gpu, []).append(sets)
    return doomed


def starts(
    devices: Sequence[tuple[str, frozenset[str]]], held: Mapping[str, Sequence[frozenset[str]]]
) -> bool:
    """No device's GPU is held (nor held by another device of the same claim) through a device that
    shares no counter set with it."""
    taken: dict[str, list[frozenset[str]]] = {}
    for gpu, sets in devices:
        if not all(sets & other for other in [*held.get(gpu, ()), *taken.get(gpu, ())]):
            return False
        taken.setdefault(gpu, []).append(sets)
    return True


async def test_gpuclass_counts_what_the_scheduler_starts(
    kube: Kube, namespace: str, scheduler: None, device_classes: None
) -> None:
    started = time.monotonic()
    await kube.patch(
        NAMESPACES.path(name=namespace),
        {"metadata": {"labels": {ADMIN_NAMESPACE_LABEL: "true"}}},
        kind="merge",
    )
    disagreements: list[str] = []
    seen: dict[str, int] = {}
    for seed in range(FIRST_SEED, FIRST_SEED + WORLDS):
        world = plan(seed)
        paths = await build(kube, namespace, world)
        try:
            says = await gpuclass_fits(kube, namespace, world)
            count = pod_count(world)
            await start_vms(kube, namespace, world, count)
            bound = await bound_when_settled(kube, namespace, f"{WORLD_LABEL}={seed},{ROLE_LABEL}=vm", count)
            doomed = await would_not_start(kube, namespace, world)
        finally:
            await clear(kube, namespace, f"{WORLD_LABEL}={seed}", [n.name for n in world.nodes], paths)
        if bound == count:
            disagreements.append(f"seed {seed}: all {count} pods bound; the world needs more")
        if says != bound - len(doomed):
            disagreements.append(
                f"seed {seed}: GPUClass says {says}, the scheduler bound {bound} "
                f"({len(doomed)} would not start): {world}"
            )
        print(f"seed {seed}: {world.device_class or RESOURCE}, {world.shape}: {bound} of {count} bound")
        if doomed:
            print(f"seed {seed}: the scheduler bound {len(doomed)} pods whose GPU a sibling holds: {doomed}")
        for feature in [
            world.device_class or "device-plugin",
            *(["by-extended-name"] if world.by_extended_name else []),
            *world.features,
            *(["held"] if any(n.held for n in world.nodes) else []),
            *(["admin"] if any(n.admin for n in world.nodes) else []),
            *(["taint-rule"] if any(n.taint_rules for n in world.nodes) else []),
            "fit" if says else "zero",
        ]:
            seen[feature] = seen.get(feature, 0) + 1
    print(f"\n{WORLDS} worlds ({seen}) in {time.monotonic() - started:.1f} s")
    assert not disagreements, "\n".join(disagreements)


def test_the_generator_makes_every_hard_shape() -> None:
    """Over the make-test worlds: every template, pool fate and DRA feature appears."""
    worlds = [plan(seed) for seed in range(FIRST_SEED, FIRST_SEED + max(WORLDS, 30))]
    features = set().union(*(w.features for w in worlds))
    assert {"plain", "mig", "passthrough", "shared", "incomplete", "republished", "invalid"} <= features
    assert any(n.admin for w in worlds for n in w.nodes)
    assert any(n.held for w in worlds for n in w.nodes)
    assert any(n.taint_rules for w in worlds for n in w.nodes)
    assert any(
        d.get("taints")
        for w in worlds
        for n in w.nodes
        for s in n.slices
        for d in s["spec"].get("devices") or ()
    )
    assert {w.device_class for w in worlds} >= {"", *CLASSES}
    assert any(w.by_extended_name for w in worlds)
