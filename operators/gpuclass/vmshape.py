"""Whole-VM sizes: a VM of a class is its GPU units plus the CPU and memory its virt-launcher asks for.

Decides:

* ``VmShape``: one entry of a class's ``spec.vmShapes``: a ``name`` (the key of its ``status.fits``
  entry), GPU ``units``, and either ``cpu`` and ``memory`` or ``instancetype``. A shape with neither
  asks for GPU units only (today's ``vmSizes`` meaning): any node's CPU and memory do.
* ``resolve``: the VM a shape stands for, as KubeVirt's virt-controller sees it
  (``launcher.Vm``), whose virt-launcher ``launcher.launcher_request`` renders as KubeVirt does:
  the compute container (the VM's request plus KubeVirt's overhead, see ``launcher``) and the
  console-log sidecar. Every shape has GPUs, so every VM gets KubeVirt's 1 GiB for VFIO.

  - ``{cpu, memory}`` is a VM written with ``resources.requests`` ``{cpu, memory}``: ``cpu`` is what
    the virt-launcher requests for the guest (as before; KubeVirt keeps a VM's own CPU request), its
    vCPUs that rounded up (KubeVirt's default topology: one socket per CPU requested); ``memory`` is
    the guest's and its request (its page tables count). A shape with only ``memory`` is a 1-vCPU VM
    requesting ``1/cpuAllocationRatio`` of a CPU; one with only ``cpu`` asks the overhead's memory.
  - ``instancetype`` names a ``VirtualMachineClusterInstancetype`` (``instancetype.kubevirt.io/v1beta1``):
    ``spec.cpu.guest`` vCPUs, ``dedicatedCPUPlacement``, ``isolateEmulatorThread``,
    ``spec.memory.guest`` (and ``overcommitPercent``, which KubeVirt turns into a memory request in
    float32 arithmetic), ``spec.gpus`` (their count is the units unless the shape sets ``units``),
    ``spec.hostDevices``, ``spec.ioThreads.supplementalPoolThreadCount`` (the IOThreads of
    ``ioThreadsPolicy: supplementalPool``, which KubeVirt adds to the CPUs; ``shared`` and ``auto``
    change no request) and ``spec.launchSecurity`` (SEV). One that does not exist (or is not
    served, or has neither vCPUs nor memory) resolves to nothing: the shape fits 0.
* ``vms_on_node``: how many such VMs one node holds: the fewest of its free GPU units, CPU and
  memory, each divided by what one VM asks.

Does not: read an instance type (the glue lists them on a pass), or a preference (a preference
turning off the graphics device or the serial console makes the VM ask less than counted here).
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

# Re-exported (``as``): a pass needs only this module to turn shapes into virt-launcher requests.
from operators.gpuclass.launcher import MIB as MIB
from operators.gpuclass.launcher import MILLIS_PER_CPU, Vm
from operators.gpuclass.launcher import KubeVirt as KubeVirt
from operators.gpuclass.launcher import kubevirt_of as kubevirt_of
from operators.gpuclass.launcher import launcher_containers as launcher_containers
from operators.gpuclass.launcher import launcher_request as launcher_request
from operators.gpuclass.quantity import parse_exact

# The whole of a percentage (an instance type's memory.overcommitPercent).
PERCENT: Final = 100
# At most this many shapes a class (the CRD's maxItems).
MAX_VM_SHAPES: Final = 8
# A shape's name: a DNS label (the CRD checks it too).
_NAME: Final = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True, slots=True)
class VmShape:
    name: str
    units: int
    cpu_millis: int = 0  # the VM's CPU request; 0: none
    memory: int = 0  # bytes, the VM's memory request; 0: none
    instancetype: str = ""  # a VirtualMachineClusterInstancetype to read the VM from

    @property
    def whole(self) -> bool:
        """Whether the shape is a VM (CPU, memory or an instance type), else GPU units only."""
        return bool(self.cpu_millis or self.memory or self.instancetype)


def vm_shapes(value: object) -> tuple[VmShape, ...]:
    """``spec.vmShapes``, by name; entries the CRD would refuse are left out."""
    if not isinstance(value, list):
        return ()
    shapes: dict[str, VmShape] = {}
    for entry in value[:MAX_VM_SHAPES]:
        shape = _shape(entry) if isinstance(entry, Mapping) else None
        if shape is not None and shape.name not in shapes:
            shapes[shape.name] = shape
    return tuple(shapes.values())


def vms_on_node(units: int, cpu: int, memory: int, free_units: int, free_cpu: int, free_memory: int) -> int:
    """VMs of ``units`` GPUs, ``cpu`` millicores and ``memory`` bytes one node holds (0 asks none)."""
    vms = free_units // units
    if cpu and vms:
        vms = min(vms, max(0, free_cpu) // cpu)
    if memory and vms:
        vms = min(vms, max(0, free_memory) // memory)
    return vms


def resolve(shape: VmShape, instancetypes: Mapping[str, Mapping[str, Any]]) -> Vm | None:
    """The VM a whole shape stands for; None when it names an instance type that is not there (or
    one without GPUs, when the shape sets no units)."""
    if not shape.instancetype:
        vcpus = max(1, math.ceil(shape.cpu_millis / MILLIS_PER_CPU))
        return Vm(vcpus, shape.memory, shape.memory, shape.cpu_millis, gpus=shape.units)
    found = instancetypes.get(shape.instancetype)
    spec = found.get("spec") if isinstance(found, Mapping) else None
    if not isinstance(spec, Mapping):
        return None
    cpu_spec, memory_spec = _mapping(spec.get("cpu")), _mapping(spec.get("memory"))
    guest_cpus, guest = cpu_spec.get("guest"), _amount(memory_spec.get("guest"), 1)
    gpus, host_devices = spec.get("gpus"), spec.get("hostDevices")
    units = shape.units or (len(gpus) if isinstance(gpus, list) else 0)
    if type(guest_cpus) is not int or guest_cpus < 1 or not guest or units < 1:
        return None
    pool = _mapping(spec.get("ioThreads")).get("supplementalPoolThreadCount")
    security = _mapping(spec.get("launchSecurity"))
    return Vm(
        guest_cpus,
        guest,
        memory_request=_overcommitted(guest, memory_spec.get("overcommitPercent")),
        gpus=units,
        host_devices=len(host_devices) if isinstance(host_devices, list) else 0,
        dedicated=cpu_spec.get("dedicatedCPUPlacement") is True,
        isolate_emulator_thread=cpu_spec.get("isolateEmulatorThread") is True,
        io_thread_cpus=pool if type(pool) is int and pool > 0 else 0,
        sev=security.get("sev") is not None or security.get("snp") is not None,
    )


def _overcommitted(guest: int, percent: object) -> int:
    """The memory request an instance type's ``overcommitPercent`` gives (``applyMemory``, in Go's
    float32 arithmetic, truncated); 0 (none: the renderer uses the guest memory) when unset."""
    if type(percent) is not int or not 0 < percent <= PERCENT:
        return 0
    share = _float32(1 - _float32(_float32(percent) / PERCENT))
    return int(_float32(_float32(guest) * share))


def _float32(value: float) -> float:
    """``value`` rounded to a float32 (each float32 operation of Go, done in float64 then rounded,
    gives the same result: float64 carries more than twice float32's precision)."""
    rounded: float = struct.unpack("f", struct.pack("f", value))[0]
    return rounded


def _shape(entry: Mapping[str, Any]) -> VmShape | None:
    name, units = entry.get("name"), entry.get("units")
    if not isinstance(name, str) or not _NAME.match(name):
        return None
    instancetype = entry.get("instancetype")
    if isinstance(instancetype, str) and instancetype:
        if units is not None and (type(units) is not int or units < 1):
            return None
        return VmShape(name, units or 0, instancetype=instancetype)
    if type(units) is not int or units < 1:
        return None
    cpu = _amount(entry.get("cpu"), 1000)
    memory = _amount(entry.get("memory"), 1)
    if cpu is None or memory is None:
        return None
    return VmShape(name, units, cpu, memory)


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _amount(text: object, scale: int) -> int | None:
    """A quantity scaled and rounded up; 0 when absent; None when not a quantity."""
    if text is None:
        return 0
    exact = parse_exact(text if not isinstance(text, int) or isinstance(text, bool) else str(text))
    return None if exact is None else math.ceil(exact * scale)
