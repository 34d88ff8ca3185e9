"""Whole-VM sizes: a VM of a class is its GPU units plus the CPU and memory its virt-launcher asks for.

Decides:

* ``VmShape``: one entry of a class's ``spec.vmShapes``: a ``name`` (the key of its ``status.fits``
  entry), GPU ``units``, and optionally ``cpu`` (the virt-launcher's CPU request for the guest:
  its vCPUs with dedicated CPU placement, what KubeVirt's ``cpuAllocationRatio`` makes of them
  otherwise) and ``memory`` (the guest's memory);
* ``launcher_request``: what the VM's virt-launcher pod asks the scheduler for, as cpu millicores
  and memory bytes: the shape's, plus KubeVirt's overhead (``Overhead``, the operator's settings):
  a fixed amount of memory for virt-launcher, libvirt, QEMU and, with a GPU passed through, the
  1 GiB KubeVirt adds for VFIO; per vCPU (the shape's cpu, rounded up) a few MiB; the guest's page
  tables, 1/512 of its memory; and a CPU share. A shape with neither cpu nor memory asks for GPU
  units only (today's ``vmSizes`` meaning): no overhead, and any node's CPU and memory do;
* ``vms_on_node``: how many such VMs one node holds: the fewest of its free GPU units, CPU and
  memory, each divided by what one VM asks.

The defaults of ``Overhead`` follow KubeVirt's ``GetMemoryOverhead`` for an x86 VM with a GPU
passed through and a video device, rounded up: they overestimate a little rather than under, so a
counted VM starts. A hoster whose VMs differ sets them (see the operator's flags).

A shape may instead name a KubeVirt cluster instance type (``instancetype``, a
``VirtualMachineClusterInstancetype`` of ``instancetype.kubevirt.io/v1beta1``): ``resolve`` reads
its ``spec.cpu.guest`` vCPUs, ``spec.memory.guest`` and, for the GPU units, the number of
``spec.gpus`` (or the shape's own ``units``). Its CPU request is the vCPUs with
``spec.cpu.dedicatedCPUPlacement``, else the vCPUs divided by the KubeVirt CR's
``developerConfiguration.cpuAllocationRatio`` (default 10), as KubeVirt renders the virt-launcher.
An instance type that does not exist (or is not served) resolves to nothing: the shape fits 0.

Does not: read an instance type (the glue lists them on a pass), or look at anything but the
shape, the instance type and the overhead.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from operators.gpuclass.quantity import parse_exact

MIB: Final = 1024 * 1024
# KubeVirt's page tables: one byte for every 512 bytes of guest memory.
PAGE_TABLE_DIVISOR: Final = 512
# At most this many shapes a class (the CRD's maxItems).
MAX_VM_SHAPES: Final = 8
# A shape's name: a DNS label (the CRD checks it too).
_NAME: Final = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True, slots=True)
class Overhead:
    """What KubeVirt adds to a VM's virt-launcher request (defaults: see the module docstring)."""

    memory_fixed: int = 1280 * MIB  # virt-launcher ~250 MiB with libvirt, QEMU, video; VFIO 1 GiB
    memory_per_cpu: int = 8 * MIB
    cpu_millis: int = 0


DEFAULT_OVERHEAD: Final = Overhead()


@dataclass(frozen=True, slots=True)
class VmShape:
    name: str
    units: int
    cpu_millis: int = 0  # 0: the shape does not ask for CPU
    memory: int = 0  # bytes; 0: the shape does not ask for memory
    instancetype: str = ""  # a VirtualMachineClusterInstancetype to read the figures from

    @property
    def whole(self) -> bool:
        """Whether the shape asks for CPU or memory (else GPU units only)."""
        return bool(self.cpu_millis or self.memory)


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


def launcher_request(shape: VmShape, overhead: Overhead) -> tuple[int, int]:
    """(cpu millicores, memory bytes) the VM's virt-launcher asks for; (0, 0) for GPU units only."""
    if not shape.whole:
        return 0, 0
    cpus = math.ceil(shape.cpu_millis / 1000)
    memory = (
        shape.memory
        + overhead.memory_fixed
        + overhead.memory_per_cpu * cpus
        + math.ceil(shape.memory / PAGE_TABLE_DIVISOR)
    )
    return shape.cpu_millis + overhead.cpu_millis, memory


def vms_on_node(units: int, cpu: int, memory: int, free_units: int, free_cpu: int, free_memory: int) -> int:
    """VMs of ``units`` GPUs, ``cpu`` millicores and ``memory`` bytes one node holds (0 asks none)."""
    vms = free_units // units
    if cpu and vms:
        vms = min(vms, max(0, free_cpu) // cpu)
    if memory and vms:
        vms = min(vms, max(0, free_memory) // memory)
    return vms


def resolve(
    shape: VmShape, instancetypes: Mapping[str, Mapping[str, Any]], cpu_allocation_ratio: int
) -> VmShape | None:
    """The shape with an instance type's figures filled in; None when it names one that is not
    there (or one without GPUs, when the shape sets no units). A shape naming none is itself."""
    if not shape.instancetype:
        return shape
    found = instancetypes.get(shape.instancetype)
    spec = found.get("spec") if isinstance(found, Mapping) else None
    if not isinstance(spec, Mapping):
        return None
    cpu_spec = _mapping(spec.get("cpu"))
    memory_spec = _mapping(spec.get("memory"))
    vcpus = cpu_spec.get("guest")
    memory = _amount(memory_spec.get("guest"), 1)
    gpus = spec.get("gpus")
    units = shape.units or (len(gpus) if isinstance(gpus, list) else 0)
    if type(vcpus) is not int or vcpus < 1 or not memory or units < 1:
        return None
    dedicated = cpu_spec.get("dedicatedCPUPlacement") is True
    ratio = max(1, cpu_allocation_ratio)
    cpu_millis = vcpus * 1000 if dedicated else math.ceil(vcpus * 1000 / ratio)
    return VmShape(shape.name, units, cpu_millis, memory, shape.instancetype)


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
