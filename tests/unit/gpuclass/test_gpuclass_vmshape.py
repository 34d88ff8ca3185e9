"""Whole-VM fits: a VM's GPUs, CPU and memory (with KubeVirt's overhead) all from one node."""

from __future__ import annotations

from typing import Any

import pytest

from operators.gpuclass.dra import DraInventory
from operators.gpuclass.inventory import Inventory
from operators.gpuclass.kubevirt import Found
from operators.gpuclass.reconcile import decide, fits_summary, named_instancetypes
from operators.gpuclass.scheduling import compute_requests
from operators.gpuclass.vmshape import (
    MIB,
    Overhead,
    VmShape,
    launcher_request,
    resolve,
    vm_shapes,
    vms_on_node,
)
from tests.gpuclass_builders import (
    H200,
    container,
    gpu_device,
    make_claim,
    make_class,
    make_device_class,
    make_kubevirt_cr,
    make_node,
    make_pod,
    make_slice,
)

GIB = 1024 * MIB
NO_OVERHEAD = Overhead(memory_fixed=0, memory_per_cpu=0, cpu_millis=0)
PERMITS = Found(make_kubevirt_cr(pci=[H200], dra=True))
BIG_VM = {"name": "g2-large", "units": 2, "cpu": "32", "memory": "256Gi"}


@pytest.mark.parametrize(
    ("shape", "overhead", "asks"),
    [
        # GPU units only: no overhead, any node's CPU and memory do
        (VmShape("gpus", 2), Overhead(), (0, 0)),
        (VmShape("bare", 1, 4000, 16 * GIB), NO_OVERHEAD, (4000, 16 * GIB + 16 * GIB // 512)),
        # fixed + per vCPU (rounded up) + page tables + the CPU share
        (
            VmShape("vm", 1, 3500, 8 * GIB),
            Overhead(memory_fixed=1280 * MIB, memory_per_cpu=8 * MIB, cpu_millis=100),
            (3600, 8 * GIB + 1280 * MIB + 4 * 8 * MIB + 8 * GIB // 512),
        ),
    ],
)
def test_a_launcher_asks_for_the_vm_plus_kubevirts_overhead(
    shape: VmShape, overhead: Overhead, asks: tuple[int, int]
) -> None:
    assert launcher_request(shape, overhead) == asks


@pytest.mark.parametrize(
    ("free", "vms"),
    [
        ((2, 4000, 1024 * GIB), 0),  # 2 GPUs free but 4 cores: no 32-core VM (the node)
        ((2, 64000, 1024 * GIB), 1),
        ((8, 64000, 1024 * GIB), 2),  # CPU bounds it before GPUs do
        ((8, 1_000_000, 300 * GIB), 1),  # memory bounds it
        ((1, 1_000_000, 1024 * GIB), 0),  # GPUs bound it
        ((4, -500, 1024 * GIB), 0),  # over-committed CPU is none free
    ],
)
def test_a_node_holds_the_fewest_of_its_gpus_cpu_and_memory(free: tuple[int, int, int], vms: int) -> None:
    assert vms_on_node(2, 32000, 256 * GIB, *free) == vms


def test_shapes_the_crd_would_refuse_are_left_out() -> None:
    value: list[Any] = [
        BIG_VM,
        {"name": "BAD", "units": 1},
        {"name": "zero", "units": 0},
        {"name": "garbage", "units": 1, "cpu": "lots"},
        {"name": "g2-large", "units": 4},  # a second entry of one name
        {"name": "ints", "units": 1, "cpu": 8, "memory": "64Gi"},
        "not an object",
    ]
    assert vm_shapes(value) == (
        VmShape("g2-large", 2, 32000, 256 * GIB),
        VmShape("ints", 1, 8000, 64 * GIB),
    )
    assert vm_shapes(None) == ()


def test_a_pods_cpu_and_memory_follow_the_schedulers_rules() -> None:
    pod = make_pod(
        "p",
        node="n1",
        containers=[container(requests={"cpu": "1500m", "memory": "1Gi"}), container("b")],
        init_containers=[container("init", requests={"cpu": "4", "memory": "64Mi"})],
        overhead={"cpu": "250m", "memory": "16Mi"},
    )
    # app: 1.5 + 0.1 cpu, 1Gi + 64Mi; the init container's 4 cpu is the peak; plus the overhead
    assert compute_requests(pod) == (4000 + 250, GIB + 64 * MIB + 16 * MIB)


def compute_world() -> Inventory:
    """Two H200 nodes: gpu-a with 4 free GPUs but 4 free cores, gpu-b with 4 GPUs and room."""
    inventory = Inventory(compute=True)
    inventory.upsert_node(make_node("gpu-a", allocatable={H200: "4"}))
    inventory.upsert_node(make_node("gpu-b", allocatable={H200: "4"}))
    # the builder's nodes have 63500m cpu and 1031927Mi memory; a busy tenant takes most of gpu-a's cpu
    inventory.upsert_pod(make_pod("busy", node="gpu-a", containers=[container(requests={"cpu": "59400m"})]))
    return inventory


def test_whole_vm_fits_need_gpus_cpu_and_memory_on_one_node_and_sizes_keep_their_meaning() -> None:
    shapes = [BIG_VM, {"name": "gpus-only", "units": 2}]
    cls = make_class("h200", H200, vm_sizes=[2], vm_shapes=shapes)
    status = decide([cls], compute_world(), PERMITS, overhead=NO_OVERHEAD)["h200"].status
    assert [(f.name, f.units, f.vms) for f in status.fits] == [
        ("", 2, 4),  # by GPUs alone, both nodes
        ("g2-large", 2, 1),  # only gpu-b has 32 cores free
        ("gpus-only", 2, 4),
    ]
    assert fits_summary(status.fits) == "2:4 g2-large:1 gpus-only:4"
    assert status.fields()["fits"][1] == {"name": "g2-large", "units": 2, "vms": 1}


def test_the_overhead_can_make_a_vm_not_fit() -> None:
    inventory = Inventory(compute=True)
    inventory.upsert_node(make_node("gpu-a", allocatable={H200: "2"}))
    inventory.upsert_pod(make_pod("ram", node="gpu-a", containers=[container(requests={"memory": "775Gi"})]))
    cls = make_class("h200", H200, vm_shapes=[BIG_VM])
    # 1031927Mi - 775Gi - 64Mi leaves ~231 GiB: 256 GiB does not fit; with 0 guest memory asked, it does
    assert decide([cls], inventory, PERMITS, overhead=NO_OVERHEAD)["h200"].status.fits[-1].vms == 0
    smaller = make_class("h200", H200, vm_shapes=[{**BIG_VM, "memory": "200Gi"}])
    assert decide([smaller], inventory, PERMITS, overhead=NO_OVERHEAD)["h200"].status.fits[-1].vms == 1
    heavy = Overhead(memory_fixed=40 * GIB)
    assert decide([smaller], inventory, PERMITS, overhead=heavy)["h200"].status.fits[-1].vms == 0


def test_a_dra_class_counts_whole_vms_too() -> None:
    inventory = compute_world()
    inventory.upsert_node(make_node("dra-a"))
    dra = DraInventory()
    dra.upsert_class(make_device_class("h200", 'device.driver == "gpu.nvidia.com"'))
    dra.upsert_slice(("", "dra-a"), make_slice("dra-a", "dra-a", [gpu_device(f"gpu-{i}") for i in range(8)]))
    dra.upsert_claim(("t", "a"), make_claim("a", "h200", allocated=[("dra-a", "gpu-0")]))
    cls = make_class("h200-dra", "", device_class="h200", vm_shapes=[BIG_VM])
    status = decide([cls], inventory, PERMITS, dra, overhead=NO_OVERHEAD)["h200-dra"].status
    # 7 free GPUs make 3 VMs of 2; 63.5 cores make 1 VM of 32 (the CPU bounds it)
    assert [(f.name, f.vms) for f in status.fits][-1] == ("g2-large", 1)


def instancetype(name: str, vcpus: Any, memory: Any, gpus: int, *, dedicated: bool = False) -> dict[str, Any]:
    """A VirtualMachineClusterInstancetype as KubeVirt serves it."""
    cpu: dict[str, Any] = {"guest": vcpus}
    if dedicated:
        cpu["dedicatedCPUPlacement"] = True
    return {
        "apiVersion": "instancetype.kubevirt.io/v1beta1",
        "kind": "VirtualMachineClusterInstancetype",
        "metadata": {"name": name},
        "spec": {
            "cpu": cpu,
            "memory": {"guest": memory},
            "gpus": [{"name": f"gpu{i}", "deviceName": H200} for i in range(gpus)],
        },
    }


INSTANCETYPES = {
    "g2.dedicated": instancetype("g2.dedicated", 32, "256Gi", 2, dedicated=True),
    "g2.shared": instancetype("g2.shared", 32, "256Gi", 2),
    "no-gpus": instancetype("no-gpus", 4, "8Gi", 0),
    "broken": instancetype("broken", "many", "8Gi", 1),
}


@pytest.mark.parametrize(
    ("shape", "ratio", "resolved"),
    [
        # dedicated CPUs: the vCPUs; else the vCPUs over KubeVirt's cpuAllocationRatio
        (VmShape("a", 0, instancetype="g2.dedicated"), 10, VmShape("a", 2, 32000, 256 * GIB, "g2.dedicated")),
        (VmShape("a", 0, instancetype="g2.shared"), 10, VmShape("a", 2, 3200, 256 * GIB, "g2.shared")),
        (VmShape("a", 0, instancetype="g2.shared"), 1, VmShape("a", 2, 32000, 256 * GIB, "g2.shared")),
        # the shape's units win over the instance type's GPU count
        (VmShape("a", 4, instancetype="no-gpus"), 10, VmShape("a", 4, 400, 8 * GIB, "no-gpus")),
        (VmShape("a", 0, instancetype="no-gpus"), 10, None),  # no units at all
        (VmShape("a", 0, instancetype="missing"), 10, None),
        (VmShape("a", 0, instancetype="broken"), 10, None),
        (VmShape("plain", 1, 1000, GIB), 10, VmShape("plain", 1, 1000, GIB)),  # names none
    ],
)
def test_a_shape_naming_an_instance_type_takes_its_figures(
    shape: VmShape, ratio: int, resolved: VmShape | None
) -> None:
    assert resolve(shape, INSTANCETYPES, ratio) == resolved


def test_a_shape_naming_an_instance_type_fits_by_it_and_a_missing_one_fits_none() -> None:
    shapes = [
        {"name": "dedicated", "instancetype": "g2.dedicated"},
        {"name": "gone", "instancetype": "missing"},
    ]
    cls = make_class("h200", H200, vm_sizes=[2], vm_shapes=shapes)
    assert named_instancetypes([cls]) == {"g2.dedicated", "missing"}
    status = decide([cls], compute_world(), PERMITS, overhead=NO_OVERHEAD, instancetypes=INSTANCETYPES)
    assert fits_summary(status["h200"].status.fits) == "2:4 dedicated:1 gone:0"  # as g2-large: gpu-b only
