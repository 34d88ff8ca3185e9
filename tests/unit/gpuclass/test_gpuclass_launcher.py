"""The virt-launcher pod as KubeVirt renders it: a table of VMs whose figures are worked by hand from
KubeVirt's code (``operators/gpuclass/launcher.py`` cites the files and functions), the first rows
taken from KubeVirt's own unit tests (v1.9.0).

Each row's comment is its arithmetic, in MiB unless said: page tables (the VMI's memory request,
rounded up to 1000 B, / 512, rounded down; a request of n GiB gives n * 2 MiB, plus 1 B when the
rounding adds 512 B or more) + fixed (220; 240 since v1.10) + 8 per vCPU + 8 for the IOThread
+ 32 video + 1024 with a GPU or host device + 100 with dedicated CPUs.
"""

from __future__ import annotations

from typing import Any

import pytest

from operators.gpuclass.launcher import (
    COMPUTE,
    CONSOLE_LOG,
    NEWEST,
    SINCE_V1_10,
    UP_TO_V1_6,
    V1_7_TO_V1_9,
    Amounts,
    KubeVirt,
    Vm,
    kubevirt_of,
    launcher_containers,
    launcher_request,
    memory_overhead,
    rules_for,
)
from operators.gpuclass.scheduling import compute_requests

MIB = 1024 * 1024
GIB = 1024 * MIB
V19 = KubeVirt(rules=V1_7_TO_V1_9)
RATIO_3 = KubeVirt(rules=V1_7_TO_V1_9, cpu_allocation_ratio=3)
NO_CONSOLE = KubeVirt(rules=V1_7_TO_V1_9, console_log=False)
SIDECAR = (5, 35_000_000)  # the console log's requests: 5m, 35M
SIDECAR_DEDICATED = (15, 60_000_000)  # raised to its limits with dedicated CPUs
NONE = None

# (id, VM, KubeVirt, the compute container's (cpu millicores, memory bytes), the sidecar's requests)
ROWS: list[tuple[str, Vm, KubeVirt, tuple[int, int], tuple[int, int] | None]] = [
    # KubeVirt's template_test.go "should add cpu and memory constraints to a template", amd64:
    # 1G and 1m requested render 1282971493 = 1G + 1G/512 (1953125 B) + 220 + 8 + 8 + 32 MiB
    ("kubevirt-template-1G", Vm(1, 10**9, 10**9, 1), V19, (1, 1282971493), SIDECAR),
    # KubeVirt's hypervisorbackend_test.go: 1Gi requested, 1 vCPU: 2 + 220 + 8 + 8 + 32 = 270
    ("kubevirt-backend-1Gi", Vm(1, GIB, GIB), V19, (100, GIB + 270 * MIB), SIDECAR),
    # ... "with GPU": 270 + 1024
    ("kubevirt-backend-gpu", Vm(1, GIB, GIB, gpus=1), V19, (100, GIB + 1294 * MIB), SIDECAR),
    # ... 2 sockets x 2 cores x 2 threads: 2 + 220 + 8*8 + 8 + 32 = 326; CPU 8/10
    ("kubevirt-backend-2x2x2", Vm(8, GIB, GIB), V19, (800, GIB + 326 * MIB), SIDECAR),
    # ... "with DedicatedCPU": 270 + 100; requests = limits = 1 CPU
    (
        "kubevirt-backend-dedicated",
        Vm(1, GIB, GIB, dedicated=True),
        V19,
        (1000, GIB + 370 * MIB),
        SIDECAR_DEDICATED,
    ),
    # ... "should not add videoRAMOverhead": 2 + 220 + 8 + 8 = 238
    ("kubevirt-backend-no-video", Vm(1, GIB, GIB, video=False), V19, (100, GIB + 238 * MIB), SIDECAR),
    # guest memory only (an instance type's): no request, no page tables: 0 + 220 + 8 + 8 + 32 + 1024
    ("guest-1cpu-1Gi-1gpu", Vm(1, GIB, gpus=1), V19, (100, GIB + 1292 * MIB), SIDECAR),
    # up to v1.6 the webhook set the request from the guest: 2 + 220 + 8 + 8 + 32 + 1024
    (
        "guest-1cpu-1Gi-1gpu-v1.6",
        Vm(1, GIB, gpus=1),
        KubeVirt(rules=UP_TO_V1_6),
        (100, GIB + 1294 * MIB),
        SIDECAR,
    ),
    # since v1.10 QEMU's share is 50 MiB: 0 + 240 + 8 + 8 + 32 + 1024
    (
        "guest-1cpu-1Gi-1gpu-v1.10",
        Vm(1, GIB, gpus=1),
        KubeVirt(rules=SINCE_V1_10),
        (100, GIB + 1312 * MIB),
        SIDECAR,
    ),
    # a plain shape (requests 8 CPUs, 8Gi): 8Gi/512 = 16 + 220 + 8*8 + 8 + 32 + 1024 = 1364
    (
        "plain-8cpu-8Gi-1gpu",
        Vm(8, 8 * GIB, 8 * GIB, 8000, gpus=1),
        V19,
        (8000, 8 * GIB + 1364 * MIB),
        SIDECAR,
    ),
    # 4 vCPUs / 10 = 400m; 0 + 220 + 32 + 8 + 32 + 1024 = 1316
    ("guest-4cpu-16Gi-2gpu", Vm(4, 16 * GIB, gpus=2), V19, (400, 16 * GIB + 1316 * MIB), SIDECAR),
    # dedicated: 16 CPUs; 0 + 220 + 128 + 8 + 32 + 1024 + 100 = 1512
    (
        "dedicated-16cpu-64Gi-8gpu",
        Vm(16, 64 * GIB, gpus=8, dedicated=True),
        V19,
        (16000, 64 * GIB + 1512 * MIB),
        SIDECAR_DEDICATED,
    ),
    # the emulator thread isolated: 16 + 1 CPUs; memory as above
    (
        "dedicated-isolated-16cpu-64Gi-8gpu",
        Vm(16, 64 * GIB, gpus=8, dedicated=True, isolate_emulator_thread=True),
        V19,
        (17000, 64 * GIB + 1512 * MIB),
        SIDECAR_DEDICATED,
    ),
    # 32 + 2 supplemental IOThreads + 1 emulator = 35 CPUs; 0 + 220 + 256 + 8 + 32 + 1024 + 100 = 1640
    (
        "dedicated-isolated-pool-32cpu-256Gi-2gpu",
        Vm(32, 256 * GIB, gpus=2, dedicated=True, isolate_emulator_thread=True, io_thread_cpus=2),
        V19,
        (35000, 256 * GIB + 1640 * MIB),
        SIDECAR_DEDICATED,
    ),
    # (32 + 4 IOThreads) / 10 = 3.6 = 3600m; 0 + 220 + 256 + 8 + 32 + 1024 = 1540 (the IOThread once)
    (
        "shared-pool-32cpu-256Gi-2gpu",
        Vm(32, 256 * GIB, gpus=2, io_thread_cpus=4),
        V19,
        (3600, 256 * GIB + 1540 * MIB),
        SIDECAR,
    ),
    # an isolated emulator thread without dedicated CPUs changes nothing: 8/10; 0 + 220 + 64 + 8 + 32 + 1024
    (
        "shared-isolated-8cpu-32Gi",
        Vm(8, 32 * GIB, gpus=1, isolate_emulator_thread=True),
        V19,
        (800, 32 * GIB + 1348 * MIB),
        SIDECAR,
    ),
    # 64/3 = 21.333333333333332 -> 21334m; 0 + 220 + 512 + 8 + 32 + 1024 = 1796
    ("ratio3-64cpu-512Gi-8gpu", Vm(64, 512 * GIB, gpus=8), RATIO_3, (21334, 512 * GIB + 1796 * MIB), SIDECAR),
    # 7/3 = 2.3333333333333335 -> 2334m; 0 + 220 + 56 + 8 + 32 + 1024 = 1340
    ("ratio3-7cpu-32Gi-1gpu", Vm(7, 32 * GIB, gpus=1), RATIO_3, (2334, 32 * GIB + 1340 * MIB), SIDECAR),
    # 1/3 = 0.333... < 1: 333.3333333333333m -> 334m; 0 + 220 + 8 + 8 + 32 + 1024 = 1292
    ("ratio3-1cpu-2Gi-1gpu", Vm(1, 2 * GIB, gpus=1), RATIO_3, (334, 2 * GIB + 1292 * MIB), SIDECAR),
    # ratio 1: 2 CPUs; 0 + 220 + 16 + 8 + 32 + 1024 = 1300
    (
        "ratio1-2cpu-4Gi-1gpu",
        Vm(2, 4 * GIB, gpus=1),
        KubeVirt(rules=V1_7_TO_V1_9, cpu_allocation_ratio=1),
        (2000, 4 * GIB + 1300 * MIB),
        SIDECAR,
    ),
    # no GPU, console log off in the CR: 0 + 220 + 8 + 8 + 32 = 268, no sidecar
    ("no-gpu-console-off", Vm(1, 2 * GIB), NO_CONSOLE, (100, 2 * GIB + 268 * MIB), NONE),
    # the VM asks for the console log the CR turns off
    ("vm-console-on", Vm(1, 2 * GIB, console_log=True), NO_CONSOLE, (100, 2 * GIB + 268 * MIB), SIDECAR),
    # the VM turns it off
    ("vm-console-off", Vm(1, 2 * GIB, console_log=False), V19, (100, 2 * GIB + 268 * MIB), NONE),
    # 16Gi rounded up to 1000 B adds 816 B: 32 MiB + 1 B; + 220 + 96 + 8 + 32 + 1024 = 1412 MiB + 1 B
    (
        "plain-12cpu-16Gi-1gpu",
        Vm(12, 16 * GIB, 16 * GIB, 12000, gpus=1),
        V19,
        (12000, 16 * GIB + 1412 * MIB + 1),
        SIDECAR,
    ),
    # 3500m: 4 vCPUs; 4Gi + 704 B: 8 MiB + 1 B; + 220 + 32 + 8 + 32 + 1024 = 1324 MiB + 1 B
    (
        "plain-3500m-4Gi-1gpu",
        Vm(4, 4 * GIB, 4 * GIB, 3500, gpus=1),
        V19,
        (3500, 4 * GIB + 1324 * MIB + 1),
        SIDECAR,
    ),
    # memoryOvercommit 150: 128Gi * 100 // 150 = 91625968981 B; 0 + 220 + 128 + 8 + 32 + 1024 = 1412
    (
        "overcommit150-16cpu-128Gi-4gpu",
        Vm(16, 128 * GIB, gpus=4),
        KubeVirt(rules=V1_7_TO_V1_9, memory_overcommit=150),
        (1600, 91625968981 + 1412 * MIB),
        SIDECAR,
    ),
    # up to v1.6 that request had its page tables: 91625969000 // 512 = 178956970 B
    (
        "overcommit150-16cpu-128Gi-4gpu-v1.6",
        Vm(16, 128 * GIB, gpus=4),
        KubeVirt(rules=UP_TO_V1_6, memory_overcommit=150),
        (1600, 91625968981 + 178956970 + 1412 * MIB),
        SIDECAR,
    ),
    # an instance type's overcommitPercent 10 on 256Gi requests 247390109696 B (float32, see the
    # vmshape tests): 247390110000 // 512 = 483183808 B; + 220 + 256 + 8 + 32 + 1024 = 1540
    (
        "overcommit-percent-32cpu-256Gi-2gpu",
        Vm(32, 256 * GIB, 247390109696, gpus=2),
        V19,
        (3200, 247390109696 + 483183808 + 1540 * MIB),
        SIDECAR,
    ),
    # additionalGuestMemoryOverheadRatio 1.5: 270 MiB = 283115520 B = 283116 kB (up) * 0.5 = 141558 kB
    (
        "overhead-ratio-1.5",
        Vm(1, GIB, GIB),
        KubeVirt(rules=V1_7_TO_V1_9, overhead_ratio="1.5"),
        (100, GIB + 283115520 + 141558000),
        SIDECAR,
    ),
    # the CR's cpuRequest 250m for a VM without one; 0 + 220 + 32 + 8 + 32 + 1024 = 1316
    (
        "cpu-request-250m",
        Vm(4, 8 * GIB, gpus=1),
        KubeVirt(rules=V1_7_TO_V1_9, cpu_request_millis=250),
        (250, 8 * GIB + 1316 * MIB),
        SIDECAR,
    ),
    # SEV: 0 + 220 + 16 + 8 + 32 + 1024 + 256 = 1556
    ("sev-2cpu-8Gi-1gpu", Vm(2, 8 * GIB, gpus=1, sev=True), V19, (200, 8 * GIB + 1556 * MIB), SIDECAR),
    # a host device alone is VFIO too: 0 + 220 + 16 + 8 + 32 + 1024 = 1300
    ("host-device-2cpu-8Gi", Vm(2, 8 * GIB, host_devices=1), V19, (200, 8 * GIB + 1300 * MIB), SIDECAR),
    # the newest rules are the default: 0 + 240 + 16 + 8 + 32 + 1024 = 1320
    ("default-rules", Vm(2, 8 * GIB, gpus=1), KubeVirt(), (200, 8 * GIB + 1320 * MIB), SIDECAR),
]
IDS = [row[0] for row in ROWS]


@pytest.mark.parametrize(("name", "vm", "kubevirt", "compute", "sidecar"), ROWS, ids=IDS)
def test_the_containers_are_rendered_as_kubevirt_renders_them(
    name: str, vm: Vm, kubevirt: KubeVirt, compute: tuple[int, int], sidecar: tuple[int, int] | None
) -> None:
    requests = {"cpu": f"{compute[0]}m", "memory": str(compute[1])}
    expected: list[dict[str, Any]] = [
        {
            "name": COMPUTE,
            "resources": {"requests": requests, **({"limits": requests} if vm.dedicated else {})},
        }
    ]
    if sidecar is not None:
        expected.append(
            {
                "name": CONSOLE_LOG,
                "restartPolicy": "Always",
                "resources": {
                    "requests": {"cpu": f"{sidecar[0]}m", "memory": str(sidecar[1])},
                    "limits": {"cpu": "15m", "memory": "60000000"},
                },
            }
        )
    assert launcher_containers(vm, kubevirt) == expected


@pytest.mark.parametrize(("name", "vm", "kubevirt", "compute", "sidecar"), ROWS, ids=IDS)
def test_the_pod_asks_the_sum_of_its_containers_as_the_scheduler_counts_it(
    name: str, vm: Vm, kubevirt: KubeVirt, compute: tuple[int, int], sidecar: tuple[int, int] | None
) -> None:
    cpu, memory = compute
    if sidecar is not None:
        cpu, memory = cpu + sidecar[0], memory + sidecar[1]
    assert launcher_request(vm, kubevirt) == (cpu, memory)
    # the operator's own scheduler rules (KEP-753) on a pod built of the rendered containers agree
    containers = launcher_containers(vm, kubevirt)
    pod = {"spec": {"containers": containers[:1], "initContainers": containers[1:]}}
    assert compute_requests(pod) == (cpu, memory)


def test_kubevirts_own_overhead_figures() -> None:
    # hypervisorbackend_test.go (v1.9.0): a 1Gi VMI of 1 vCPU, then with a GPU, 2x2x2 vCPUs, dedicated
    assert memory_overhead(Vm(1, GIB, GIB), V19) == 270 * MIB
    assert memory_overhead(Vm(1, GIB, GIB, gpus=1), V19) == (270 + 1024) * MIB
    assert memory_overhead(Vm(8, GIB, GIB), V19) == (270 + 7 * 8) * MIB
    assert memory_overhead(Vm(1, GIB, GIB, dedicated=True), V19) == (270 + 100) * MIB


@pytest.mark.parametrize(
    ("version", "rules"),
    [
        ("v1.9.0", V1_7_TO_V1_9),
        ("v1.8.2", V1_7_TO_V1_9),
        ("v1.7.0", V1_7_TO_V1_9),
        ("v1.9.0-rc.1", V1_7_TO_V1_9),  # a release candidate of v1.9
        ("1.8.4", V1_7_TO_V1_9),
        ("v1.6.3", UP_TO_V1_6),
        ("v1.5.0", UP_TO_V1_6),  # older: read as v1.6, which errs high
        ("v0.59.0", UP_TO_V1_6),
        ("v1.10.0", SINCE_V1_10),
        ("v2.0.0", SINCE_V1_10),
        ("v1.9.0-beta.0.1264+d923fdb815cd20", NEWEST),  # a build of main between releases
        ("", NEWEST),
        ("devel", NEWEST),
        ("sha256:0123", NEWEST),
    ],
)
def test_a_release_picks_its_rules(version: str, rules: object) -> None:
    assert rules_for(version) == rules


def test_the_kubevirt_cr_sets_what_every_launcher_gets() -> None:
    cr = {
        "spec": {
            "configuration": {
                "developerConfiguration": {"memoryOvercommit": 150, "cpuAllocationRatio": 4},
                "cpuRequest": "250m",
                "additionalGuestMemoryOverheadRatio": "1.5",
                "virtualMachineOptions": {"disableSerialConsoleLog": {}},
                "supportContainerResources": [
                    {"type": "hotplug-disk", "resources": {"requests": {"cpu": "1"}}},
                    {"type": "guest-console-log", "resources": {"requests": {"cpu": "0", "memory": "50Mi"}}},
                    {
                        "type": "guest-console-log",
                        "resources": {"requests": {"cpu": "10m"}, "limits": {"memory": "100M"}},
                    },
                ],
            }
        },
        "status": {"observedKubeVirtVersion": "v1.8.2"},
    }
    assert kubevirt_of(cr, "", 4) == KubeVirt(
        rules=V1_7_TO_V1_9,
        cpu_allocation_ratio=4,
        memory_overcommit=150,
        cpu_request_millis=250,
        overhead_ratio="1.5",
        console_log=False,
        console_log_requests=Amounts(10, 50 * MIB),  # per resource, the first non-zero entry
        console_log_limits=Amounts(15, 100_000_000),
    )
    assert kubevirt_of(cr, "v1.10.1", 4).rules == SINCE_V1_10  # the setting wins over the CR


def test_without_a_cr_kubevirts_defaults_and_the_newest_rules_hold() -> None:
    assert kubevirt_of(None, "", 10) == KubeVirt()
    assert kubevirt_of(None, "v1.9.0", 10) == KubeVirt(rules=V1_7_TO_V1_9)
    # KubeVirt's default cpuRequest (100m) is no override; garbage is KubeVirt's default
    odd = {
        "spec": {"configuration": {"cpuRequest": "100m", "developerConfiguration": {"memoryOvercommit": "x"}}}
    }
    assert kubevirt_of(odd, "", 10) == KubeVirt()
