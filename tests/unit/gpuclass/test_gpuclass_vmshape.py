"""Whole-VM fits: a VM's GPUs, CPU and memory (its virt-launcher as KubeVirt renders it) all from one
node. The renderer's own figures are ``test_gpuclass_launcher.py``'s table."""

from __future__ import annotations

from typing import Any

import pytest

from operators.gpuclass.dra import DraInventory
from operators.gpuclass.inventory import Inventory
from operators.gpuclass.kubevirt import Found
from operators.gpuclass.launcher import Vm
from operators.gpuclass.reconcile import decide, fits_summary, named_instancetypes
from operators.gpuclass.scheduling import compute_requests
from operators.gpuclass.vmshape import (
    MIB,
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
PERMITS = Found(make_kubevirt_cr(pci=[H200], dra=True))
BIG_VM = {"name": "g2-large", "units": 2, "cpu": "32", "memory": "256Gi"}


@pytest.mark.parametrize(
    ("shape", "vm"),
    [
        # cpu and memory: a VM requesting them; its vCPUs the CPUs rounded up; the units its GPUs
        (VmShape("bare", 1, 4000, 16 * GIB), Vm(4, 16 * GIB, 16 * GIB, 4000, gpus=1)),
        (VmShape("vm", 2, 3500, 8 * GIB), Vm(4, 8 * GIB, 8 * GIB, 3500, gpus=2)),
        # memory only: KubeVirt's default topology of one vCPU, its CPU request left to the ratio
        (VmShape("memory-only", 1, 0, 8 * GIB), Vm(1, 8 * GIB, 8 * GIB, 0, gpus=1)),
        (VmShape("cpu-only", 1, 2000), Vm(2, 0, 0, 2000, gpus=1)),
    ],
)
def test_a_plain_shape_is_a_vm_requesting_its_cpu_and_memory(shape: VmShape, vm: Vm) -> None:
    assert resolve(shape, {}) == vm


def test_a_plain_shape_asks_what_kubevirt_renders_for_it() -> None:
    # 3500m; memory: 8Gi + 8Gi/512 (16 MiB) + 240 + 4*8 + 8 + 32 + 1024 MiB (the newest rules),
    # and the console log's 5m and 35M
    vm = resolve(VmShape("vm", 1, 3500, 8 * GIB), {})
    assert vm is not None
    assert launcher_request(vm) == (3500 + 5, 8 * GIB + (16 + 240 + 32 + 8 + 32 + 1024) * MIB + 35_000_000)


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
    status = decide([cls], compute_world(), PERMITS)["h200"].status
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
    # 1031927Mi - 775Gi - 64Mi leaves ~231 GiB: 256 GiB does not fit; 200 GiB and its ~2 GiB overhead do
    assert decide([cls], inventory, PERMITS)["h200"].status.fits[-1].vms == 0
    smaller = make_class("h200", H200, vm_shapes=[{**BIG_VM, "memory": "200Gi"}])
    assert decide([smaller], inventory, PERMITS)["h200"].status.fits[-1].vms == 1
    # the CR's additionalGuestMemoryOverheadRatio multiplies that overhead: 20 x ~2 GiB is too much
    heavy = make_kubevirt_cr(pci=[H200], dra=True)
    heavy["spec"]["configuration"]["additionalGuestMemoryOverheadRatio"] = "20"
    assert decide([smaller], inventory, Found(heavy))["h200"].status.fits[-1].vms == 0


def test_a_dra_class_counts_whole_vms_too() -> None:
    inventory = compute_world()
    inventory.upsert_node(make_node("dra-a"))
    dra = DraInventory()
    dra.upsert_class(make_device_class("h200", 'device.driver == "gpu.nvidia.com"'))
    dra.upsert_slice(("", "dra-a"), make_slice("dra-a", "dra-a", [gpu_device(f"gpu-{i}") for i in range(8)]))
    dra.upsert_claim(("t", "a"), make_claim("a", "h200", allocated=[("dra-a", "gpu-0")]))
    cls = make_class("h200-dra", "", device_class="h200", vm_shapes=[BIG_VM])
    status = decide([cls], inventory, PERMITS, dra)["h200-dra"].status
    # 7 free GPUs make 3 VMs of 2; 63.5 cores make 1 VM of 32 (the CPU bounds it)
    assert [(f.name, f.vms) for f in status.fits][-1] == ("g2-large", 1)


def instancetype(
    name: str, vcpus: Any, memory: Any, gpus: int, *, dedicated: bool = False, **spec: Any
) -> dict[str, Any]:
    """A VirtualMachineClusterInstancetype as KubeVirt serves it; ``spec`` adds fields."""
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
            **spec,
        },
    }


INSTANCETYPES = {
    "g2.dedicated": instancetype("g2.dedicated", 32, "256Gi", 2, dedicated=True),
    "g2.shared": instancetype("g2.shared", 32, "256Gi", 2),
    "g2.tuned": instancetype(
        "g2.tuned",
        32,
        "256Gi",
        2,
        ioThreadsPolicy="supplementalPool",
        ioThreads={"supplementalPoolThreadCount": 2},
        hostDevices=[{"name": "nvswitch", "deviceName": "nvidia.com/NVSWITCH"}],
        launchSecurity={"sev": {}},
    ),
    "no-gpus": instancetype("no-gpus", 4, "8Gi", 0),
    "broken": instancetype("broken", "many", "8Gi", 1),
}
INSTANCETYPES["g2.tuned"]["spec"]["cpu"].update(dedicatedCPUPlacement=True, isolateEmulatorThread=True)
INSTANCETYPES["g2.tuned"]["spec"]["memory"]["overcommitPercent"] = 10


@pytest.mark.parametrize(
    ("shape", "resolved"),
    [
        # the instance type's vCPUs and guest memory (no memory request: KubeVirt renders the guest's)
        (VmShape("a", 0, instancetype="g2.dedicated"), Vm(32, 256 * GIB, gpus=2, dedicated=True)),
        (VmShape("a", 0, instancetype="g2.shared"), Vm(32, 256 * GIB, gpus=2)),
        # overcommitPercent 10, in Go's float32: float32(0.1) = 0.100000001490116..., 1 - that rounds
        # to the float32 0.89999997615814208984375 = 15099494 / 2^24; times 2^38 B (256Gi) =
        # 15099494 * 2^14 = 247390109696 B (exactly a float32)
        (
            VmShape("a", 0, instancetype="g2.tuned"),
            Vm(
                32,
                256 * GIB,
                247390109696,
                gpus=2,
                host_devices=1,
                dedicated=True,
                isolate_emulator_thread=True,
                io_thread_cpus=2,
                sev=True,
            ),
        ),
        # the shape's units win over the instance type's GPU count
        (VmShape("a", 4, instancetype="no-gpus"), Vm(4, 8 * GIB, gpus=4)),
        (VmShape("a", 0, instancetype="no-gpus"), None),  # no units at all
        (VmShape("a", 0, instancetype="missing"), None),
        (VmShape("a", 0, instancetype="broken"), None),
    ],
)
def test_a_shape_naming_an_instance_type_takes_its_figures(shape: VmShape, resolved: Vm | None) -> None:
    assert resolve(shape, INSTANCETYPES) == resolved


def test_a_shape_naming_an_instance_type_fits_by_it_and_a_missing_one_fits_none() -> None:
    shapes = [
        {"name": "dedicated", "instancetype": "g2.dedicated"},
        {"name": "gone", "instancetype": "missing"},
    ]
    cls = make_class("h200", H200, vm_sizes=[2], vm_shapes=shapes)
    assert named_instancetypes([cls]) == {"g2.dedicated", "missing"}
    status = decide([cls], compute_world(), PERMITS, instancetypes=INSTANCETYPES)
    assert fits_summary(status["h200"].status.fits) == "2:4 dedicated:1 gone:0"  # as g2-large: gpu-b only


def test_the_kubevirt_release_decides_the_overhead() -> None:
    # a node whose free memory holds 4 VMs of 1 vCPU and 1Gi by v1.9's rules but not by v1.10's:
    # 1Gi + 220 + 8 + 8 + 32 + 1024 MiB + 35M = 2316 MiB + 35M a VM (v1.10: 20 MiB more)
    per_vm_v19 = GIB + 1292 * MIB + 35_000_000
    inventory = Inventory(compute=True)
    inventory.upsert_node(make_node("gpu-a", allocatable={H200: "8", "memory": str(4 * per_vm_v19)}))
    shapes = [{"name": "small", "instancetype": "small"}]
    small = {"small": instancetype("small", 1, "1Gi", 1)}
    cls = make_class("h200", H200, vm_sizes=[1], vm_shapes=shapes)
    v19 = make_kubevirt_cr(pci=[H200])
    v19["status"] = {"observedKubeVirtVersion": "v1.9.0"}
    fits = decide([cls], inventory, Found(v19), instancetypes=small)["h200"].status.fits
    assert fits[-1].vms == 4
    fits = decide([cls], inventory, Found(v19), kubevirt_version="v1.10.0", instancetypes=small)[
        "h200"
    ].status.fits
    assert fits[-1].vms == 3
    # no version anywhere: the newest rules (v1.10's)
    fits = decide([cls], inventory, PERMITS, instancetypes=small)["h200"].status.fits
    assert fits[-1].vms == 3
