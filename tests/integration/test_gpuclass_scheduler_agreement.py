"""The count agrees with the real kube-scheduler: for a VM size, ``fits`` VMs bind and one more does not.

The kube-scheduler of the control plane's own release (``hack/build-node.sh``) runs against the
local control plane under a scheduler name of its own, and binds onto registered Nodes (no kubelet
is needed for a binding). Each generated world (``plan``, from a seed) has device-plugin nodes
(the GPUs in ``status.allocatable``) and DRA nodes (the GPUs in a ResourceSlice), with GPUs, CPU
and memory partly taken by pods and claims already bound, and nodes not ready (with the taint the
node lifecycle controller adds), cordoned, tainted for GPUs (the class tolerates it) or for
something else (it does not). The pure core decides the class's ``fits`` for one VM shape from the
objects as the API returns them; then ``fits + 1`` pods shaped as that VM's virt-launcher are
created (for DRA, each with a ResourceClaim of ``count: units`` from the DeviceClass, or, in every
other DRA world, asking by the DeviceClass's ``extendedResourceName`` (KEP-5004: the scheduler makes
the claim)), and the scheduler must bind exactly ``fits`` of them and find no node for the last.
Any disagreement fails, whichever side is wrong.

``GPUCLASS_AGREEMENT_WORLDS`` sets the number of worlds (30 by default, as ``make test`` runs it;
500 for the longer run in docs/development.md), ``GPUCLASS_AGREEMENT_SEED`` the first seed.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from hack.devcluster import ClusterInfo
from harness.node import _component_flags, build_node
from harness.waiting import eventually
from operators.gpuclass.api import DEVICE_CLASSES, RESOURCE_CLAIMS, RESOURCE_SLICES
from operators.gpuclass.dra import DraInventory
from operators.gpuclass.inventory import Inventory
from operators.gpuclass.kubevirt import Found
from operators.gpuclass.reconcile import decide
from operators.gpuclass.vmshape import DEFAULT_OVERHEAD, MIB, launcher_request, vm_shapes
from shared.kube import ApiError, Kube, Obj
from shared.resources import NODES, PODS
from tests.gpuclass_builders import GPU_TOLERATION, make_class, make_kubevirt_cr, taint

WORLDS: Final = int(os.environ.get("GPUCLASS_AGREEMENT_WORLDS", "30"))
FIRST_SEED: Final = int(os.environ.get("GPUCLASS_AGREEMENT_SEED", "1"))
SCHEDULER_NAME: Final = "gpuclass-agreement"
RESOURCE: Final = "nvidia.com/AGREEMENT_H200"
DRIVER: Final = "gpu.agreement.cozystack.io"
DEVICE_CLASS: Final = "agreement-h200"
EXTENDED_RESOURCE: Final = "agreement.cozystack.io/h200"
WORLD_LABEL: Final = "agreement.gpu.cozystack.io/world"
ROLE_LABEL: Final = "agreement.gpu.cozystack.io/role"
NOT_READY_TAINT: Final = taint("node.kubernetes.io/not-ready", "NoSchedule")
GPU_TAINT: Final = taint("nvidia.com/gpu", "NoSchedule", "present")
OTHER_TAINT: Final = taint("dedicated", "NoSchedule", "ml")
PERMITS: Final = Found(make_kubevirt_cr(pci=[RESOURCE], dra=True))
SETTLE_SECONDS: Final = 60.0
GIB: Final = 1024 * MIB


@dataclass(frozen=True)
class NodePlan:
    name: str
    dra: bool  # GPUs in a ResourceSlice, else in allocatable
    gpus: int
    used_gpus: int
    cpu_millis: int
    memory: int
    used_cpu_millis: int
    used_memory: int
    ready: bool
    cordoned: bool
    gpu_taint: bool
    other_taint: bool


@dataclass(frozen=True)
class WorldPlan:
    seed: int
    dra: bool  # the class counted: DRA devices, else the device plugin's resource
    nodes: tuple[NodePlan, ...]
    shape: dict[str, Any]
    by_extended_name: bool = False  # DRA: the VMs ask by the DeviceClass's extendedResourceName


def plan(seed: int) -> WorldPlan:
    """A world from ``seed``: both kinds of node, mixed free units, CPU and memory, taints, cordons."""
    rng = random.Random(seed)
    counted_dra = seed % 2 == 0  # the class counts DRA devices, else the device plugin's
    nodes = []
    for index in range(rng.randint(3, 6)):
        gpus = rng.choice((0, 1, 2, 4, 4, 8, 8))
        cpu = rng.choice((4000, 8000, 16000, 64000))
        memory = rng.choice((16, 64, 256, 1024)) * GIB
        nodes.append(
            NodePlan(
                name=f"agree-{seed}-n{index}",
                dra=rng.random() < (0.7 if counted_dra else 0.3),  # mostly the class's kind
                gpus=gpus,
                used_gpus=rng.choice((0, 0, rng.randint(0, gpus))),
                cpu_millis=cpu,
                memory=memory,
                used_cpu_millis=rng.choice((0, 0, cpu // 4, cpu // 2, cpu - 500)),
                used_memory=rng.choice((0, 0, memory // 4, memory // 2, memory - GIB)),
                ready=rng.random() > 0.1,
                cordoned=rng.random() < 0.1,
                gpu_taint=rng.random() < 0.5,
                other_taint=rng.random() < 0.1,
            )
        )
    shape: dict[str, Any] = {"name": "vm", "units": rng.choice((1, 1, 2, 2, 3, 4))}
    if rng.random() < 0.7:
        shape["cpu"] = f"{rng.choice((500, 1000, 2000, 3000, 4000, 8000))}m"
    if rng.random() < 0.7:
        shape["memory"] = f"{rng.choice((1, 2, 8, 16, 32))}Gi"
    return WorldPlan(seed, counted_dra, tuple(nodes), shape, counted_dra and seed % 4 == 0)


# --- the scheduler ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scheduler(cluster: ClusterInfo) -> Iterator[None]:
    """kube-scheduler of the pinned release, under its own name: it schedules only these pods."""
    bin_dir = build_node()
    with tempfile.TemporaryDirectory(prefix="agreement-scheduler-") as directory:
        config = Path(directory) / "config.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {"kubeconfig": cluster.kubeconfig, "qps": 200, "burst": 400},
                    "leaderElection": {"leaderElect": False},
                    "percentageOfNodesToScore": 100,
                    "profiles": [{"schedulerName": SCHEDULER_NAME}],
                }
            )
        )
        log = (Path(directory) / "scheduler.log").open("wb")
        # The serving and delegated-auth flags; the rest (client, leader election) is in the config.
        flags = [
            f
            for f in _component_flags(cluster.kubeconfig)
            if f.split("=", 1)[0]
            in (
                "--authentication-kubeconfig",
                "--authorization-kubeconfig",
                "--bind-address",
                "--secure-port",
            )
        ]
        process = subprocess.Popen(
            [str(bin_dir / "kube-scheduler"), f"--config={config}", *flags],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            yield
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.close()


@pytest.fixture(scope="module")
async def device_class(kube: Kube) -> AsyncIterator[None]:
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS},
        "spec": {
            "selectors": [
                {
                    "cel": {
                        "expression": f'device.driver == "{DRIVER}" && '
                        f'device.attributes["{DRIVER}"].productName == "H200"'
                    }
                }
            ],
            # Pods may ask for these devices by this name too (KEP-5004): the scheduler then makes
            # the claim itself. Never in any node's allocatable here.
            "extendedResourceName": EXTENDED_RESOURCE,
        },
    }
    with contextlib.suppress(ApiError):
        await kube.delete(DEVICE_CLASSES.path(name=DEVICE_CLASS))
    await kube.create(DEVICE_CLASSES.path(), body)
    yield
    await kube.delete(DEVICE_CLASSES.path(name=DEVICE_CLASS))


# --- building a world ------------------------------------------------------------------------------


def device(name: str, product: str = "H200") -> dict[str, Any]:
    return {"name": name, "attributes": {"productName": {"string": product}}}


async def build(kube: Kube, namespace: str, world: WorldPlan) -> None:
    label = str(world.seed)
    for node in world.nodes:
        taints = [t for t, on in ((GPU_TAINT, node.gpu_taint), (OTHER_TAINT, node.other_taint)) if on]
        if not node.ready:
            taints.append(NOT_READY_TAINT)  # what the node lifecycle controller adds
        spec: dict[str, Any] = {"taints": taints} if taints else {}
        if node.cordoned:
            spec["unschedulable"] = True
        metadata = {"name": node.name, "labels": {WORLD_LABEL: label}}
        await kube.create(
            NODES.path(), {"apiVersion": "v1", "kind": "Node", "metadata": metadata, "spec": spec}
        )
        allocatable = {"cpu": f"{node.cpu_millis}m", "memory": str(node.memory), "pods": "110"}
        if not node.dra:
            allocatable[RESOURCE] = str(node.gpus)
        ready = "True" if node.ready else "Unknown"
        status = {
            "conditions": [{"type": "Ready", "status": ready}],
            "capacity": allocatable,
            "allocatable": allocatable,
        }
        await kube.patch(NODES.path(name=node.name) + "/status", {"status": status}, kind="merge")
        # Admission tainted the new Node not-ready; keep exactly the planned taints.
        await kube.patch(NODES.path(name=node.name), {"spec": {"taints": taints or None}}, kind="merge")
        if node.dra and node.gpus:
            devices = [device(f"gpu-{i}") for i in range(node.gpus)] + [device("other-0", "L40S")]
            await kube.create(
                RESOURCE_SLICES.path(),
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceSlice",
                    "metadata": {"name": node.name, "labels": {WORLD_LABEL: label}},
                    "spec": {
                        "driver": DRIVER,
                        "nodeName": node.name,
                        "pool": {"name": node.name, "generation": 1, "resourceSliceCount": 1},
                        "devices": devices,
                    },
                },
            )
        await take(kube, namespace, world, node)


async def take(kube: Kube, namespace: str, world: WorldPlan, node: NodePlan) -> None:
    """What tenants already hold on ``node``: a bound pod's CPU and memory (and device-plugin GPUs),
    and for DRA an allocated claim of the used devices."""
    labels = {WORLD_LABEL: str(world.seed), ROLE_LABEL: "tenant"}
    requests: dict[str, str] = {}
    if node.used_cpu_millis:
        requests["cpu"] = f"{node.used_cpu_millis}m"
    if node.used_memory:
        requests["memory"] = str(node.used_memory)
    if node.used_gpus and not node.dra:
        requests[RESOURCE] = str(node.used_gpus)
    if requests:
        limits = {RESOURCE: requests[RESOURCE]} if RESOURCE in requests else {}
        await kube.create(
            PODS.path(namespace),
            pod_body(f"{node.name}-tenant", labels, {"nodeName": node.name}, requests, limits),
        )
    if node.used_gpus and node.dra:
        name = f"{node.name}-tenant"
        await kube.create(RESOURCE_CLAIMS.path(namespace), claim_body(name, labels, node.used_gpus))
        results = [
            {"request": "gpu", "driver": DRIVER, "pool": node.name, "device": f"gpu-{i}"}
            for i in range(node.used_gpus)
        ]
        await kube.patch(
            RESOURCE_CLAIMS.path(namespace, name) + "/status",
            {"status": {"allocation": {"devices": {"results": results}}}},
            kind="merge",
        )


def pod_body(
    name: str,
    labels: dict[str, str],
    spec: dict[str, Any],
    requests: dict[str, str],
    limits: dict[str, str],
    claim: str | None = None,
) -> Obj:
    resources: dict[str, Any] = {"requests": requests} if requests else {}
    if limits:
        resources["limits"] = limits
    if claim is not None:
        resources["claims"] = [{"name": "gpu"}]
        spec = {**spec, "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            **spec,
            "containers": [
                {"name": "compute", "image": "registry.k8s.io/pause:3.10", "resources": resources}
            ],
        },
    }


def claim_body(name: str, labels: dict[str, str], count: int) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS, "count": count}}]
            }
        },
    }


async def fits(kube: Kube, namespace: str, world: WorldPlan) -> int:
    """The pure core's figure for the shape, from the world as the API returns it."""
    selector = f"{WORLD_LABEL}={world.seed}"
    inventory, dra = Inventory(compute=True), DraInventory()
    for node in (await kube.list(NODES.path(), label_selector=selector))["items"]:
        inventory.upsert_node(node)
    for pod in (await kube.list(PODS.path(namespace), label_selector=selector))["items"]:
        inventory.upsert_pod(pod)
    dra_class = await kube.get(DEVICE_CLASSES.path(name=DEVICE_CLASS))
    assert dra_class is not None
    dra.upsert_class(dra_class)
    for slice_ in (await kube.list(RESOURCE_SLICES.path(), label_selector=selector))["items"]:
        dra.upsert_slice(("", slice_["metadata"]["name"]), slice_)
    for claim in (await kube.list(RESOURCE_CLAIMS.path(namespace), label_selector=selector))["items"]:
        dra.upsert_claim((namespace, claim["metadata"]["name"]), claim)
    cls = make_class(
        "agreement",
        "" if world.dra else RESOURCE,
        device_class=DEVICE_CLASS if world.dra else None,
        tolerations=[GPU_TOLERATION],
        vm_sizes=[world.shape["units"]],
        vm_shapes=[world.shape],
    )
    status = decide([cls], inventory, PERMITS, dra)["agreement"].status
    (fit,) = [f for f in status.fits if f.name]
    return fit.vms


async def start_vms(kube: Kube, namespace: str, world: WorldPlan, count: int) -> None:
    (shape,) = vm_shapes([world.shape])
    cpu, memory = launcher_request(shape, DEFAULT_OVERHEAD)
    labels = {WORLD_LABEL: str(world.seed), ROLE_LABEL: "vm"}
    requests = {
        name: text
        for name, text, amount in (("cpu", f"{cpu}m", cpu), ("memory", str(memory), memory))
        if amount
    }
    spec = {
        "schedulerName": SCHEDULER_NAME,
        "nodeSelector": {WORLD_LABEL: str(world.seed)},
        "tolerations": [GPU_TOLERATION],
    }
    for index in range(count):
        name = f"vm-{world.seed}-{index}"
        if world.by_extended_name:  # no claim: the scheduler makes one from the DeviceClass
            gpus = {EXTENDED_RESOURCE: str(shape.units)}
            await kube.create(PODS.path(namespace), pod_body(name, labels, spec, {**requests, **gpus}, gpus))
        elif world.dra:
            await kube.create(RESOURCE_CLAIMS.path(namespace), claim_body(name, labels, shape.units))
            await kube.create(PODS.path(namespace), pod_body(name, labels, spec, requests, {}, claim=name))
        else:
            gpus = {RESOURCE: str(shape.units)}
            await kube.create(PODS.path(namespace), pod_body(name, labels, spec, {**requests, **gpus}, gpus))


def unschedulable(pod: Obj) -> bool:
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in (pod.get("status") or {}).get("conditions") or ()
    )


async def settled(kube: Kube, namespace: str, world: WorldPlan, count: int) -> tuple[int, int]:
    """(bound, unschedulable) once every VM pod is one or the other."""
    selector = f"{WORLD_LABEL}={world.seed},{ROLE_LABEL}=vm"

    async def probe() -> tuple[int, int] | None:
        pods = (await kube.list(PODS.path(namespace), label_selector=selector))["items"]
        bound = sum(1 for p in pods if p["spec"].get("nodeName"))
        stuck = sum(1 for p in pods if not p["spec"].get("nodeName") and unschedulable(p))
        return (bound, stuck) if len(pods) == count and bound + stuck == count else None

    return await eventually(probe, timeout=SETTLE_SECONDS, what=f"world {world.seed}'s VMs settled")


async def clear(kube: Kube, namespace: str, world: WorldPlan) -> None:
    """Remove the world: pods at once (no kubelet), claims without the scheduler's finalizer (the
    ones it made for pods that asked by the extended name too: they carry no label of ours)."""
    selector = f"{WORLD_LABEL}={world.seed}"
    pods = (await kube.list(PODS.path(namespace), label_selector=selector))["items"]
    for pod in pods:
        await kube.delete(PODS.path(namespace, pod["metadata"]["name"]), grace_period_seconds=0)
    uids = {pod["metadata"]["uid"] for pod in pods}
    for claim in (await kube.list(RESOURCE_CLAIMS.path(namespace)))["items"]:
        owners = {o.get("uid") for o in claim["metadata"].get("ownerReferences") or ()}
        labelled = (claim["metadata"].get("labels") or {}).get(WORLD_LABEL) == str(world.seed)
        if not labelled and not owners & uids:
            continue
        path = RESOURCE_CLAIMS.path(namespace, claim["metadata"]["name"])
        with contextlib.suppress(ApiError):
            await kube.patch(path, {"metadata": {"finalizers": None}}, kind="merge")
            await kube.delete(path)
    for slice_ in (await kube.list(RESOURCE_SLICES.path(), label_selector=selector))["items"]:
        await kube.delete(RESOURCE_SLICES.path(name=slice_["metadata"]["name"]))
    for node in world.nodes:
        with contextlib.suppress(ApiError):
            await kube.delete(NODES.path(name=node.name))


async def test_the_scheduler_binds_exactly_fits_vms_and_no_more(
    kube: Kube, namespace: str, scheduler: None, device_class: None
) -> None:
    started = time.monotonic()
    disagreements: list[str] = []
    counted = {"fit": 0, "zero": 0, "dra": 0, "by_extended_name": 0, "vms": 0, "vms_by_extended_name": 0}
    for seed in range(FIRST_SEED, FIRST_SEED + WORLDS):
        world = plan(seed)
        await build(kube, namespace, world)
        try:
            expected = await fits(kube, namespace, world)
            await start_vms(kube, namespace, world, expected + 1)
            bound, stuck = await settled(kube, namespace, world, expected + 1)
            if (bound, stuck) != (expected, 1):
                disagreements.append(f"seed {seed}: fits {expected}, the scheduler bound {bound}: {world}")
            counted["fit" if expected else "zero"] += 1
            counted["dra"] += world.dra
            counted["by_extended_name"] += world.by_extended_name
            counted["vms_by_extended_name"] += expected if world.by_extended_name else 0
            counted["vms"] += expected
        finally:
            await clear(kube, namespace, world)
    print(f"\n{WORLDS} worlds ({counted}) agreed in {time.monotonic() - started:.1f} s")
    assert not disagreements, "\n".join(disagreements)
