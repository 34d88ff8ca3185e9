"""The DRA worlds of issue 33's table, one node each, as objects the API server accepts.

Each world is one node's ResourceSlices (and DeviceTaintRules, and claims already allocated) and the
size ``k`` of the VMs asked for: claims of ``k`` devices of ``DEVICE_CLASS``. ``binds`` is how many
such claims kube-scheduler 1.37's allocator grants one after another, worked out by hand from its
rules (``structured/internal/incubating``: devices in slice-name then listed order, counters,
taints, admin access, shares, incomplete and invalid pools); the integration test asks the real
kube-scheduler, the unit test the pure core. ``gpuclass`` is what GPUClass says where it differs on
purpose (a physical GPU whose sibling is held: the scheduler would bind a pod that cannot start).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.gpuclass_scheduling import claim_body

DRIVER = "gpu.rows.cozystack.io"
DEVICE_CLASS = "rows-gpu"
SELECTOR = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "gpu"'
VFIO_CLASS = "rows-vfio"
VFIO_SELECTOR = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "vfio"'
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
ADMIN_NAMESPACE_LABEL = "resource.kubernetes.io/admin-access"
GIB = 1024**3


@dataclass(frozen=True)
class Held:
    """A claim already allocated: its devices (pool, device), with admin access or as shares."""

    devices: tuple[tuple[str, str], ...]
    admin: bool = False
    device_class: str = DEVICE_CLASS
    consumed: Mapping[str, str] = field(default_factory=dict)  # a share's consumedCapacity


@dataclass(frozen=True)
class World:
    name: str
    slices: tuple[Mapping[str, Any], ...]  # specs without nodeName (the test's node is set)
    k: int
    binds: int  # what the scheduler grants, by hand
    held: tuple[Held, ...] = ()
    taint_rules: tuple[Mapping[str, Any], ...] = ()  # DeviceTaintRule specs
    device_class: str = DEVICE_CLASS
    gpuclass: int | None = None  # what GPUClass says where it differs on purpose (else binds)
    pods: int = 6  # how many VM pods the integration test creates (more than can bind)

    @property
    def counted(self) -> int:
        return self.binds if self.gpuclass is None else self.gpuclass


def device(name: str, type_: str = "gpu", **more: Any) -> dict[str, Any]:
    attributes: dict[str, Any] = {"type": {"string": type_}}
    if "pci" in more:
        attributes[PCI_BUS_ID] = {"string": more.pop("pci")}
    return {"name": name, "attributes": attributes, **more}


def partition(name: str, counter_set: str, memory_gib: int) -> dict[str, Any]:
    consumes = [{"counterSet": counter_set, "counters": {"memory": {"value": f"{memory_gib}Gi"}}}]
    return device(name, consumesCounters=consumes)


def pool(name: str, count: int = 1, generation: int = 1) -> dict[str, Any]:
    return {"name": name, "generation": generation, "resourceSliceCount": count}


def devices_slice(pool_name: str, devices: Sequence[Mapping[str, Any]], **pool_fields: int) -> dict[str, Any]:
    return {"driver": DRIVER, "pool": pool(pool_name, **pool_fields), "devices": list(devices)}


def counters_slice(pool_name: str, sets: Mapping[str, int], **pool_fields: int) -> dict[str, Any]:
    shared = [{"name": n, "counters": {"memory": {"value": f"{gib}Gi"}}} for n, gib in sets.items()]
    return {"driver": DRIVER, "pool": pool(pool_name, **pool_fields), "sharedCounters": shared}


def halves(gpu: int) -> list[dict[str, Any]]:
    """A whole GPU and its two halves, all drawing on the GPU's one counter set of 80 GiB."""
    counters = f"gpu-{gpu}"
    return [
        partition(f"whole-{gpu}", counters, 80),
        partition(f"half-{gpu}a", counters, 40),
        partition(f"half-{gpu}b", counters, 40),
    ]


def tainted(name: str, effect: str) -> dict[str, Any]:
    return device(name, taints=[{"key": "example.com/broken", "value": "ecc", "effect": effect}])


WORLDS: tuple[World, ...] = (
    # whole-0 needs all 80 GiB, half-0a holds 40: only half-0b is left.
    World(
        "a whole GPU, one of its two halves held",
        (counters_slice("p", {"gpu-0": 80}, count=2), devices_slice("p", halves(0), count=2)),
        k=1,
        binds=1,
        held=(Held((("p", "half-0a"),)),),
    ),
    # Devices in order: whole-0 takes GPU 0, its halves no longer fit; whole-1 takes GPU 1.
    World(
        "one class over whole GPUs and halves of them",
        (
            counters_slice("p", {"gpu-0": 80, "gpu-1": 80}, count=2),
            devices_slice("p", halves(0) + halves(1), count=2),
        ),
        k=1,
        binds=2,
    ),
    # A claim of two: whole-0, then nothing more of GPU 0 fits, then whole-1; none left for a second.
    World(
        "two-device claims over whole GPUs and halves",
        (
            counters_slice("p", {"gpu-0": 80, "gpu-1": 80}, count=2),
            devices_slice("p", halves(0) + halves(1), count=2),
        ),
        k=2,
        binds=1,
    ),
    # gpu-1 NoSchedule and gpu-3 NoExecute in the slice, gpu-4 by a rule; gpu-2's None keeps none off.
    World(
        "devices tainted NoSchedule and NoExecute (slice taints and a DeviceTaintRule)",
        (
            devices_slice(
                "p",
                [
                    device("gpu-0"),
                    tainted("gpu-1", "NoSchedule"),
                    tainted("gpu-2", "None"),
                    tainted("gpu-3", "NoExecute"),
                    device("gpu-4"),
                ],
            ),
        ),
        k=1,
        binds=2,
        taint_rules=(
            {
                "deviceSelector": {"driver": DRIVER, "pool": "p", "device": "gpu-4"},
                "taint": {"key": "example.com/maintenance", "effect": "NoSchedule"},
            },
        ),
    ),
    World(
        "an incomplete pool (1 of its 2 slices published)",
        (devices_slice("p", [device(f"gpu-{i}") for i in range(3)], count=2),),
        k=1,
        binds=0,
    ),
    World(
        "an invalid pool (one device name in two slices)",
        (
            devices_slice("p", [device("gpu-0"), device("gpu-1")], count=2),
            devices_slice("p", [device("gpu-1"), device("gpu-2")], count=2),
        ),
        k=1,
        binds=0,
    ),
    # Generation 1 is whole; generation 2 has one of its two slices: the pool is being updated.
    World(
        "a pool republished under a new generation, half published",
        (
            devices_slice("p", [device("gpu-0"), device("gpu-1")], count=2),
            devices_slice("p", [device("gpu-2"), device("gpu-3")], count=2),
            devices_slice("p", [device("gpu-0"), device("gpu-1")], count=2, generation=2),
        ),
        k=1,
        binds=0,
    ),
    # A monitoring agent's claim with admin access holds gpu-0, and takes nothing from others.
    World(
        "a device held by an adminAccess claim",
        (devices_slice("p", [device(f"gpu-{i}") for i in range(3)]),),
        k=1,
        binds=3,
        held=(Held((("p", "gpu-0"),), admin=True),),
    ),
    # One shareable device of 80 GiB, each claim taking the 20 GiB default: four shares.
    World(
        "one device with allowMultipleAllocations",
        (
            devices_slice(
                "p",
                [
                    device(
                        "gpu-0",
                        allowMultipleAllocations=True,
                        capacity={
                            "memory": {
                                "value": "80Gi",
                                "requestPolicy": {"default": "20Gi", "validRange": {"min": "20Gi"}},
                            }
                        },
                    )
                ],
            ),
        ),
        k=1,
        binds=4,
    ),
    # The driver publishes each GPU as a gpu and a vfio device with the same PCI address and no
    # counter between them; gpu-0 is held. The scheduler would hand vfio-0 to a VM, whose start then
    # fails when the driver cannot prepare it: GPUClass counts the one GPU that is free.
    World(
        "a physical GPU published twice (gpu and vfio), its gpu sibling held",
        (
            devices_slice(
                "p",
                [
                    device("gpu-0", pci="0000:17:00.0"),
                    device("gpu-1", pci="0000:65:00.0"),
                    device("vfio-0", "vfio", pci="0000:17:00.0"),
                    device("vfio-1", "vfio", pci="0000:65:00.0"),
                ],
            ),
        ),
        k=1,
        binds=2,
        gpuclass=1,
        device_class=VFIO_CLASS,
        held=(Held((("p", "gpu-0"),)),),
    ),
)


# --- the objects, as the API server takes them ------------------------------------------------------


def device_classes() -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": selector}}]},
        }
        for name, selector in ((DEVICE_CLASS, SELECTOR), (VFIO_CLASS, VFIO_SELECTOR))
    ]


def slices(world: World, node: str) -> list[dict[str, Any]]:
    """The world's ResourceSlices on ``node`` (pools are named after the node too)."""
    out = []
    for index, spec in enumerate(world.slices):
        pool_spec = {**spec["pool"], "name": f"{node}-{spec['pool']['name']}"}
        out.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{node}-{index}"},
                "spec": {**spec, "pool": pool_spec, "nodeName": node},
            }
        )
    return out


def taint_rules(world: World, node: str) -> list[dict[str, Any]]:
    rules = []
    for index, spec in enumerate(world.taint_rules):
        selector = dict(spec["deviceSelector"])
        if "pool" in selector:
            selector["pool"] = f"{node}-{selector['pool']}"
        rules.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceTaintRule",
                "metadata": {"name": f"{node}-{index}"},
                "spec": {**spec, "deviceSelector": selector},
            }
        )
    return rules


def allocation(held: Held, node: str) -> dict[str, Any]:
    """The status of a claim that holds ``held`` on ``node``."""
    results = []
    for pool_name, device_name in held.devices:
        result: dict[str, Any] = {
            "request": "gpu",
            "driver": DRIVER,
            "pool": f"{node}-{pool_name}",
            "device": device_name,
        }
        if held.admin:
            result["adminAccess"] = True
        results.append(result)
    selector = {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
    }
    return {"allocation": {"devices": {"results": results}, "nodeSelector": selector}}


def held_claims(world: World, node: str) -> list[dict[str, Any]]:
    """The world's claims already allocated, with their status."""
    return [
        {
            **claim_body(f"{node}-held-{index}", len(held.devices), held.device_class, admin=held.admin),
            "status": allocation(held, node),
        }
        for index, held in enumerate(world.held)
    ]
