"""A VM's virt-launcher pod as KubeVirt's virt-controller renders it: its containers' CPU and memory.

Decides, for a ``Vm`` (the VMI as virt-controller sees it, after KubeVirt's defaulting) and a
``KubeVirt`` (what the KubeVirt CR and its release set for every VM), the same figures KubeVirt
computes, byte for byte and millicore for millicore:

* ``memory_overhead``: what KubeVirt adds to the guest's memory. The guest's page tables (the VMI's
  memory request rounded up to a kilobyte (1000 B), divided by 512, rounded down); a fixed 220 MiB
  (virt-launcher-monitor 25, virt-launcher 100, virtlogd 25, virtqemud 40, QEMU 30; 240 MiB once QEMU's
  share became 50 MiB); 8 MiB per vCPU (sockets x cores x threads, at least 1); 8 MiB for the
  IOThread, once, whatever the IOThreads policy or count; 32 MiB of video RAM (the graphics device is
  attached unless the VM says otherwise); 1 GiB when any GPU or host device is passed through (DRA
  GPUs too: they are entries of ``devices.gpus``); 256 MiB for SEV/SEV-SNP; 100 MiB with dedicated
  CPUs. The sum is then scaled by the CR's ``additionalGuestMemoryOverheadRatio``, if set (the
  overhead in kilobytes, rounded up, times ratio - 1, truncated, added as kilobytes).
* ``launcher_containers``: the ``compute`` container's requests and limits, and the
  ``guest-console-log`` sidecar's. Compute memory: the VMI's memory request, else its guest memory
  (times 100 / the CR's ``memoryOvercommit`` percent, truncated, when that is not 100), plus the
  overhead. Compute CPU without dedicated CPUs: the VMI's CPU request, else the CR's ``cpuRequest``
  (when set to other than 100m), else (vCPUs + supplemental IOThreads) / ``cpuAllocationRatio``, as a
  float64 printed in Go's shortest form (in millicores when below one CPU) and rounded up to a
  millicore. With dedicated CPUs: requests = limits = vCPUs + supplemental IOThreads, plus one for
  an isolated emulator thread, and the memory limit equals its request. The console-log sidecar
  (on unless the CR's ``virtualMachineOptions.disableSerialConsoleLog`` is set or the VM turns it
  off) requests 5m and 35M with limits 15m and 60M (or the CR's ``supportContainerResources`` for
  ``guest-console-log``), its requests raised to its limits with dedicated CPUs. KubeVirt (since
  v1.6) makes it a restartable init container (``restartPolicy: Always``, KEP-753).
* ``launcher_request``: the pod's CPU millicores and memory bytes as the scheduler counts them: the
  sum of the containers (with one sidecar and no other init container, KEP-753 sums the same).

Read in KubeVirt's own source (``git show <tag>:<path>``): ``v1.9.0``
(79d34c1762169e5b0370ec491cef5ca12e6b504c) and ``v1.8.4`` (dfaa398f086692d19e01be21d83a01036e07815f),
``pkg/hypervisor/kvm/hypervisorbackend.go``
``GetMemoryOverhead`` and ``MultiplyMemory`` (the ``*Overhead`` constants); ``pkg/vmitrait/vmitrait.go``
``HasVFIO`` (v1.8: ``pkg/util/util.go`` ``IsVFIOVMI``, same devices); ``pkg/util/hardware/hw_utils.go``
``GetNumberOfVCPUs``; ``pkg/virt-controller/services/renderresources.go`` ``WithMemoryRequests``,
``WithMemoryOverhead``, ``WithoutDedicatedCPU``, ``WithCPUPinning``, ``getIOThreadsCount``;
``pkg/virt-controller/services/template.go`` ``VMIResourcePredicates`` (the order of those rules),
``CalculateMemoryOverhead``, ``renderLaunchManifest`` (the console log among the init containers);
``pkg/virt-controller/services/serialconsolelog.go`` ``isSerialConsoleLogEnabled``,
``resourcesForSerialConsoleLogContainer``; ``pkg/defaults/defaults.go`` ``setDefaultResourceRequests``,
``SetDefaultGuestCPUTopology``; ``pkg/instancetype/apply/memory.go`` ``applyMemory``. The rules are
the same in v1.7, v1.8 and v1.9 (``V1_7_TO_V1_9``). Where releases differ (``RULES``; ``rules_for``
picks them from the operator's ``kubevirt_version`` setting, else the CR's
``status.observedKubeVirtVersion``, else ``NEWEST``, which err high):

* main after v1.9.0 (d923fdb815cd2016ddaebdaaa51db04133576d72; commit
  c822873795cc84b5bb0fb88b6092b31b4afce43a): QEMU's share is 50 MiB, the fixed part 240 MiB; read as
  v1.10 and later;
* v1.7.0 (50b9b4d0cf1caaf56147411a1e6765134e0e82b9, commit 51927ed13cb35760788bce50947afa57ee3865cc)
  moved the defaulting of the memory request from the VMI webhook into the renderer: since then a VM
  that states only its guest memory (an instance type's) has no memory request when the overhead is
  computed, so its page tables count 0. Up to v1.6 (d53baa7f84687d156bd8a3a80d7ea2fbd8e0a993) the
  webhook had already set the request (guest x 100 / memoryOvercommit) and the page tables counted it.
  Older releases are read as v1.6, which errs high (v1.5.0: 16 MiB of video RAM, no IOThread CPUs).

KubeVirt's own tests agree: ``pkg/hypervisor/kvm/hypervisorbackend_test.go`` (a 1Gi, 1-vCPU VMI:
270 MiB; with a GPU 1 GiB more; with 2x2x2 vCPUs 56 MiB more; dedicated 100 MiB more) and
``pkg/virt-controller/services/template_test.go`` "should add cpu and memory constraints to a
template" (1G requested: 1282971493 bytes on amd64); ``tests/unit/gpuclass/test_gpuclass_launcher.py``
holds those rows.

Does not: render anything the operator does not count. The compute container also asks for
``EPHEMERAL_STORAGE_REQUEST`` of ephemeral storage, ``devices.kubevirt.io/kvm``, ``tun`` and
``vhost-net`` (one each) and, through a device plugin, the VM's GPUs; ``launcher_containers`` leaves
those to the caller. Not modelled (none is a default): network binding plugins' memory overhead, TPM
(53 MiB), exec probes (100 MiB + 10 MiB each), downward metrics (1 MiB), arm64 (128 MiB), hugepages,
``overcommitGuestOverhead``, ``reservedOverhead``, a VMI whose requests equal its limits (Guaranteed
QoS), CPU or memory limits from a namespace's ResourceQuota or label, the emulator thread's
even-parity annotation (one CPU more), hook sidecars, container disks' init containers, virtiofs,
a RuntimeClass's pod overhead.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from operators.gpuclass import kubevirt as cr

MIB: Final = 1024 * 1024
# KubeVirt computes the page tables and the overhead ratio in kilobytes (resource.Kilo).
KILO: Final = 1000
MILLIS_PER_CPU: Final = 1000
# One byte of page table for every 512 bytes of the VMI's memory request.
PAGE_TABLE_DIVISOR: Final = 512
PER_VCPU: Final = 8 * MIB
IOTHREAD: Final = 8 * MIB  # static: one IOThread's worth, whatever the policy
VIDEO_RAM: Final = 32 * MIB
VFIO: Final = 1024 * MIB  # any GPU, host device or SR-IOV interface
SEV: Final = 256 * MIB
DEDICATED_CPUS: Final = 100 * MIB
# KubeVirt's memoryOvercommit (percent) that leaves the guest's memory as its request.
NO_OVERCOMMIT: Final = 100
# What the compute container asks of ephemeral storage (not rendered here).
EPHEMERAL_STORAGE_REQUEST: Final = 50_000_000
COMPUTE: Final = "compute"
CONSOLE_LOG: Final = "guest-console-log"
# The restart policy that makes an init container a sidecar (KEP-753): the console log's.
SIDECAR_RESTART_POLICY: Final = "Always"
# A version KubeVirt reports: v<major>.<minor>[.<patch>][-<pre-release>][+<build>].
_VERSION: Final = re.compile(r"^v?(\d+)\.(\d+)(?:\.\d+)?([-.][0-9A-Za-z.-]*)?(\+.*)?$")


@dataclass(frozen=True, slots=True)
class Rules:
    """What a range of KubeVirt releases adds, where releases differ (see the module docstring)."""

    since: tuple[int, int]  # the first (major, minor) these rules are read for
    fixed: int  # virt-launcher-monitor, virt-launcher, virtlogd, virtqemud, QEMU
    page_tables_of_guest: bool  # whether a request defaulted from the guest memory counts


UP_TO_V1_6: Final = Rules((1, 6), 220 * MIB, page_tables_of_guest=True)  # and older, erring high
V1_7_TO_V1_9: Final = Rules((1, 7), 220 * MIB, page_tables_of_guest=False)
SINCE_V1_10: Final = Rules((1, 10), 240 * MIB, page_tables_of_guest=False)  # main after v1.9.0
RULES: Final = (UP_TO_V1_6, V1_7_TO_V1_9, SINCE_V1_10)
NEWEST: Final = RULES[-1]


@dataclass(frozen=True, slots=True)
class Amounts:
    cpu_millis: int
    memory: int  # bytes


CONSOLE_LOG_REQUESTS: Final = Amounts(5, 35_000_000)  # 5m, 35M
CONSOLE_LOG_LIMITS: Final = Amounts(15, 60_000_000)  # 15m, 60M


@dataclass(frozen=True, slots=True)
class KubeVirt:
    """What the KubeVirt CR (and the release it runs) sets for every virt-launcher."""

    rules: Rules = NEWEST
    cpu_allocation_ratio: int = cr.DEFAULT_CPU_ALLOCATION_RATIO
    memory_overcommit: int = NO_OVERCOMMIT  # percent
    cpu_request_millis: int = 0  # the CR's cpuRequest when not KubeVirt's 100m; 0: none
    overhead_ratio: str = ""  # additionalGuestMemoryOverheadRatio; "": none
    console_log: bool = True  # not disabled by virtualMachineOptions.disableSerialConsoleLog
    console_log_requests: Amounts = CONSOLE_LOG_REQUESTS
    console_log_limits: Amounts = CONSOLE_LOG_LIMITS


DEFAULT_KUBEVIRT: Final = KubeVirt()


@dataclass(frozen=True, slots=True)
class Vm:
    """A VMI as virt-controller renders it (after KubeVirt's defaults); 0 means "not set"."""

    vcpus: int  # sockets x cores x threads
    guest: int = 0  # spec.domain.memory.guest, bytes
    memory_request: int = 0  # spec.domain.resources.requests.memory, bytes
    cpu_request_millis: int = 0  # spec.domain.resources.requests.cpu
    gpus: int = 0  # devices.gpus (device plugin or DRA): the class's units
    host_devices: int = 0  # devices.hostDevices
    dedicated: bool = False  # cpu.dedicatedCPUPlacement
    isolate_emulator_thread: bool = False  # cpu.isolateEmulatorThread (with dedicated CPUs only)
    io_thread_cpus: int = 0  # ioThreads.supplementalPoolThreadCount
    sev: bool = False  # launchSecurity.sev or .snp
    video: bool = True  # devices.autoattachGraphicsDevice
    console_log: bool | None = None  # the VM's own say (logSerialConsole...); None: the CR's


def rules_for(version: str) -> Rules:
    """The rules of a KubeVirt release (``v1.8.2``); unknown, or a build between releases (``+``
    build metadata): the newest known, which err high rather than low."""
    found = _VERSION.match(version.strip())
    if found is None or found.group(4):
        return NEWEST
    release = (int(found.group(1)), int(found.group(2)))
    return next((rules for rules in reversed(RULES) if rules.since <= release), RULES[0])


def kubevirt_of(kubevirt_cr: Mapping[str, Any] | None, version: str, cpu_allocation_ratio: int) -> KubeVirt:
    """What the CR sets (None: KubeVirt's defaults); ``version`` (the operator's setting) wins over
    the CR's ``status.observedKubeVirtVersion``."""
    requests, limits = cr.support_container_resources(kubevirt_cr, CONSOLE_LOG)
    return KubeVirt(
        rules=rules_for(version or cr.observed_version(kubevirt_cr)),
        cpu_allocation_ratio=cpu_allocation_ratio,
        memory_overcommit=cr.memory_overcommit(kubevirt_cr),
        cpu_request_millis=cr.cpu_request_millis(kubevirt_cr),
        overhead_ratio=cr.guest_memory_overhead_ratio(kubevirt_cr),
        console_log=not cr.serial_console_log_disabled(kubevirt_cr),
        console_log_requests=Amounts(
            requests.get("cpu", CONSOLE_LOG_REQUESTS.cpu_millis),
            requests.get("memory", CONSOLE_LOG_REQUESTS.memory),
        ),
        console_log_limits=Amounts(
            limits.get("cpu", CONSOLE_LOG_LIMITS.cpu_millis), limits.get("memory", CONSOLE_LOG_LIMITS.memory)
        ),
    )


def memory_request(vm: Vm, kubevirt: KubeVirt) -> int:
    """The compute container's memory request before the overhead (``WithMemoryRequests``)."""
    if vm.memory_request:
        return vm.memory_request
    if kubevirt.memory_overcommit in (NO_OVERCOMMIT, 0):
        return vm.guest
    return vm.guest * NO_OVERCOMMIT // kubevirt.memory_overcommit


def memory_overhead(vm: Vm, kubevirt: KubeVirt) -> int:
    """What KubeVirt adds to the guest's memory for this VM (``GetMemoryOverhead``), in bytes."""
    counted = vm.memory_request
    if not counted and kubevirt.rules.page_tables_of_guest:
        counted = memory_request(vm, kubevirt)
    overhead = _kilo_ceil(counted) * KILO // PAGE_TABLE_DIVISOR
    overhead += kubevirt.rules.fixed + PER_VCPU * max(1, vm.vcpus) + IOTHREAD
    overhead += VIDEO_RAM if vm.video else 0
    overhead += VFIO if vm.gpus or vm.host_devices else 0
    overhead += SEV if vm.sev else 0
    overhead += DEDICATED_CPUS if vm.dedicated else 0
    return _scaled(overhead, kubevirt.overhead_ratio)


def compute_cpu(vm: Vm, kubevirt: KubeVirt) -> int:
    """The compute container's CPU request in millicores (``WithCPUPinning``/``WithoutDedicatedCPU``)."""
    vcpus = max(1, vm.vcpus) + vm.io_thread_cpus
    if vm.dedicated:
        return (vcpus + (1 if vm.isolate_emulator_thread else 0)) * MILLIS_PER_CPU
    if vm.cpu_request_millis:
        return vm.cpu_request_millis
    if kubevirt.cpu_request_millis:
        return kubevirt.cpu_request_millis
    return _shared_millis(vcpus, max(1, kubevirt.cpu_allocation_ratio))


def launcher_containers(vm: Vm, kubevirt: KubeVirt = DEFAULT_KUBEVIRT) -> list[dict[str, Any]]:
    """The virt-launcher's containers with their CPU and memory ``resources``, as KubeVirt renders
    them: ``compute``, then the console log if on (``restartPolicy: Always``: it belongs in the pod's
    ``initContainers``). Quantities in canonical text: millicores, bytes."""
    cpu = compute_cpu(vm, kubevirt)
    memory = memory_request(vm, kubevirt) + memory_overhead(vm, kubevirt)
    compute: dict[str, Any] = {"name": COMPUTE, "resources": {"requests": _resources(Amounts(cpu, memory))}}
    if vm.dedicated:
        compute["resources"]["limits"] = _resources(Amounts(cpu, memory))
    containers = [compute]
    if kubevirt.console_log if vm.console_log is None else vm.console_log:
        limits = kubevirt.console_log_limits
        requests = limits if vm.dedicated else kubevirt.console_log_requests
        containers.append(
            {
                "name": CONSOLE_LOG,
                "restartPolicy": SIDECAR_RESTART_POLICY,
                "resources": {"requests": _resources(requests), "limits": _resources(limits)},
            }
        )
    return containers


def launcher_request(vm: Vm, kubevirt: KubeVirt = DEFAULT_KUBEVIRT) -> tuple[int, int]:
    """(cpu millicores, memory bytes) the VM's virt-launcher pod asks the scheduler for: the sum of
    its containers' requests (KEP-753 sums one sidecar with the containers)."""
    cpu = compute_cpu(vm, kubevirt)
    memory = memory_request(vm, kubevirt) + memory_overhead(vm, kubevirt)
    if kubevirt.console_log if vm.console_log is None else vm.console_log:
        sidecar = kubevirt.console_log_limits if vm.dedicated else kubevirt.console_log_requests
        cpu, memory = cpu + sidecar.cpu_millis, memory + sidecar.memory
    return cpu, memory


def _resources(amounts: Amounts) -> dict[str, str]:
    return {"cpu": f"{amounts.cpu_millis}m", "memory": str(amounts.memory)}


def _kilo_ceil(value: int) -> int:
    """``Quantity.ScaledValue(resource.Kilo)``: kilobytes, rounded up."""
    return -(-value // KILO)


def _scaled(overhead: int, ratio: str) -> int:
    """``MultiplyMemory``: the overhead's kilobytes (rounded up) times ratio - 1, truncated, added."""
    try:
        factor = float(ratio) if ratio else 1.0
    except ValueError:
        return overhead  # KubeVirt logs and keeps the overhead (its webhook refuses such a ratio)
    if not math.isfinite(factor):
        return overhead
    return overhead + int(float(_kilo_ceil(overhead)) * (factor - 1.0)) * KILO


def _shared_millis(cpus: int, ratio: int) -> int:
    """``cpus / ratio`` as KubeVirt writes it (float64, Go's shortest ``%g``; in millicores below one
    CPU) and the scheduler reads it: rounded up to a millicore. Python's ``repr`` is the same
    shortest round-trip form for these magnitudes."""
    value = cpus / ratio
    if value < 1:
        return math.ceil(Decimal(repr(value * MILLIS_PER_CPU)))
    return math.ceil(Decimal(repr(value)) * MILLIS_PER_CPU)
