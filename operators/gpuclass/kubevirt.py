"""Which device names KubeVirt permits, and what a read of its CR means for a pass (pure part).

Decides:

* ``permitted_names``: the ``resourceName`` of every entry in the KubeVirt CR's
  ``spec.configuration.permittedHostDevices`` (``pciHostDevices``, ``mediatedDevices``, ``usb``), or
  ``UNRESTRICTED`` when that key is absent (or null) entirely: KubeVirt then checks no name. A present
  but empty table permits nothing.
* how a read result (``Found``, ``NotInstalled``, ``Forbidden``, ``Unavailable``) becomes the view a
  pass uses: a definitive read is used as is; 403 is unreadable at once; a 5xx or timeout keeps the
  last definitive read for up to ``STALE_READ_GRACE`` after the failures began, then is unreadable.
  "Last known" and "now" are inputs, never a clock or a global.
* ``dra_gpus_enabled``: whether the CR lists ``GPUS_WITH_DRA`` among
  ``spec.configuration.developerConfiguration.featureGates``: then KubeVirt gives VMs GPUs through
  DRA claims, which need no ``permittedHostDevices`` entry. Only an explicit entry counts: KubeVirt
  v1.8 (Cozystack's today) has the gate off by default.
* what the CR sets for every virt-launcher (``operators/gpuclass/launcher.py`` renders it):
  ``cpu_allocation_ratio``, ``memory_overcommit``, ``cpu_request_millis`` (``cpuRequest``),
  ``guest_memory_overhead_ratio``, ``serial_console_log_disabled``, ``support_container_resources``;
  and ``observed_version``, the release virt-operator deployed (``status.observedKubeVirtVersion``).
  Each reads KubeVirt's default when the field is absent or not of its type.

Does not: read the CR. The glue that does (async GET of the named CR, or LIST of the namespace taking
the single item; 404 or no item -> ``NotInstalled``; 403 -> ``Forbidden``; 5xx or timeout ->
``Unavailable``) lives in ``operators/gpuclass/kubevirt_read.py``, which imports this module.
Nor does it decide conditions: ``decide`` maps the view to ``KubeVirtPermitted``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from operators.gpuclass.quantity import parse_exact

# How long a 5xx/timeout keeps the last definitive read before the permission becomes Unknown:
# long enough to ride out an API server restart, short enough that a hoster is not misled for long.
STALE_READ_GRACE: Final = timedelta(minutes=3)
# The tables of permittedHostDevices that carry a resourceName (KubeVirt v1 API).
DEVICE_TABLES: Final = ("pciHostDevices", "mediatedDevices", "usb")
# KubeVirt's feature gate (v1.9: beta, on by default) that gives VMs GPUs through DRA ResourceClaims.
GPUS_WITH_DRA: Final = "GPUsWithDRA"
# KubeVirt's default cpuAllocationRatio: a VM's vCPU requests a tenth of a CPU unless dedicated.
DEFAULT_CPU_ALLOCATION_RATIO: Final = 10
# KubeVirt's default memoryOvercommit (percent): a VM's guest memory is its request.
DEFAULT_MEMORY_OVERCOMMIT: Final = 100
# KubeVirt's default cpuRequest (100m), which leaves a VM's CPU request to cpuAllocationRatio.
DEFAULT_CPU_REQUEST_MILLIS: Final = 100
# The resources of supportContainerResources the operator counts, and the scale each is read in
# (cpu in millicores, memory in bytes).
SUPPORT_RESOURCES: Final = {"cpu": 1000, "memory": 1}


@dataclass(frozen=True)
class Unrestricted:
    """``permittedHostDevices`` is absent: KubeVirt does not restrict device names."""


UNRESTRICTED: Final = Unrestricted()

PermittedDevices = frozenset[str] | Unrestricted


def permitted_names(kubevirt_cr: Mapping[str, Any] | None) -> PermittedDevices:
    """The names the CR permits; no CR at all permits nothing."""
    if kubevirt_cr is None:
        return frozenset()
    configuration = (kubevirt_cr.get("spec") or {}).get("configuration") or {}
    permitted = configuration.get("permittedHostDevices")
    if permitted is None:
        return UNRESTRICTED
    if not isinstance(permitted, Mapping):
        return frozenset()  # a table we cannot read permits nothing we could vouch for
    names: set[str] = set()
    for table in DEVICE_TABLES:
        for entry in permitted.get(table) or ():
            name = entry.get("resourceName") if isinstance(entry, Mapping) else None
            if isinstance(name, str) and name:
                names.add(name)
    return frozenset(names)


def dra_gpus_enabled(kubevirt_cr: Mapping[str, Any] | None) -> bool:
    """Whether the CR enables KubeVirt's ``GPUsWithDRA`` feature gate explicitly."""
    configuration = ((kubevirt_cr or {}).get("spec") or {}).get("configuration") or {}
    developer = configuration.get("developerConfiguration") if isinstance(configuration, Mapping) else None
    gates = developer.get("featureGates") if isinstance(developer, Mapping) else None
    return isinstance(gates, list) and GPUS_WITH_DRA in gates


def cpu_allocation_ratio(kubevirt_cr: Mapping[str, Any] | None) -> int:
    """KubeVirt's ``developerConfiguration.cpuAllocationRatio``: a virt-launcher without dedicated
    CPUs requests the VM's vCPUs divided by it (``DEFAULT_CPU_ALLOCATION_RATIO`` when unset)."""
    configuration = ((kubevirt_cr or {}).get("spec") or {}).get("configuration") or {}
    developer = configuration.get("developerConfiguration") if isinstance(configuration, Mapping) else None
    ratio = developer.get("cpuAllocationRatio") if isinstance(developer, Mapping) else None
    return ratio if type(ratio) is int and ratio >= 1 else DEFAULT_CPU_ALLOCATION_RATIO


def observed_version(kubevirt_cr: Mapping[str, Any] | None) -> str:
    """``status.observedKubeVirtVersion``: the release virt-operator deployed (its image's tag, such
    as ``v1.8.2``); "" when the CR does not say."""
    status = (kubevirt_cr or {}).get("status")
    version = status.get("observedKubeVirtVersion") if isinstance(status, Mapping) else None
    return version if isinstance(version, str) else ""


def memory_overcommit(kubevirt_cr: Mapping[str, Any] | None) -> int:
    """``developerConfiguration.memoryOvercommit`` (percent): a VM stating only its guest memory
    requests that times 100 / it (``DEFAULT_MEMORY_OVERCOMMIT`` when unset)."""
    overcommit = _developer(kubevirt_cr).get("memoryOvercommit")
    return overcommit if type(overcommit) is int and overcommit >= 1 else DEFAULT_MEMORY_OVERCOMMIT


def cpu_request_millis(kubevirt_cr: Mapping[str, Any] | None) -> int:
    """``spec.configuration.cpuRequest`` in millicores (rounded up): the CPU request of a VM without
    one and without dedicated CPUs, when set to other than KubeVirt's default; else 0."""
    exact = parse_exact(_configuration(kubevirt_cr).get("cpuRequest"))
    millis = math.ceil(exact * 1000) if exact is not None else 0
    return 0 if millis == DEFAULT_CPU_REQUEST_MILLIS else millis


def guest_memory_overhead_ratio(kubevirt_cr: Mapping[str, Any] | None) -> str:
    """``spec.configuration.additionalGuestMemoryOverheadRatio``: what KubeVirt multiplies each VM's
    memory overhead by (a decimal string); "" when unset."""
    ratio = _configuration(kubevirt_cr).get("additionalGuestMemoryOverheadRatio")
    return ratio if isinstance(ratio, str) else ""


def serial_console_log_disabled(kubevirt_cr: Mapping[str, Any] | None) -> bool:
    """Whether ``virtualMachineOptions.disableSerialConsoleLog`` is set (to anything, ``{}`` too):
    then virt-launchers get no ``guest-console-log`` sidecar unless a VM asks for one."""
    options = _configuration(kubevirt_cr).get("virtualMachineOptions")
    return isinstance(options, Mapping) and options.get("disableSerialConsoleLog") is not None


def support_container_resources(
    kubevirt_cr: Mapping[str, Any] | None, container_type: str
) -> tuple[dict[str, int], dict[str, int]]:
    """The (requests, limits) ``supportContainerResources`` sets for one type of KubeVirt's support
    containers (``guest-console-log``...): ``cpu`` in millicores and ``memory`` in bytes, rounded up;
    per resource the first entry of the type with a non-zero amount, as KubeVirt reads them."""
    entries = _configuration(kubevirt_cr).get("supportContainerResources")
    found: tuple[dict[str, int], dict[str, int]] = ({}, {})
    for entry in entries if isinstance(entries, list) else ():
        if not isinstance(entry, Mapping) or entry.get("type") != container_type:
            continue
        resources = _mapping(entry.get("resources"))
        for kind, amounts in zip(("requests", "limits"), found, strict=True):
            listed = _mapping(resources.get(kind))
            for name, scale in SUPPORT_RESOURCES.items():
                exact = parse_exact(listed.get(name)) if name not in amounts else None
                if exact:  # KubeVirt skips a zero amount, and so does this
                    amounts[name] = math.ceil(exact * scale)
    return found


def _configuration(kubevirt_cr: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return _mapping(_mapping((kubevirt_cr or {}).get("spec")).get("configuration"))


def _developer(kubevirt_cr: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return _mapping(_configuration(kubevirt_cr).get("developerConfiguration"))


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def is_permitted(devices: PermittedDevices, resource: str) -> bool:
    return isinstance(devices, Unrestricted) or resource in devices


# --- read results (built by the glue in kubevirt_read.py) ----------------------------------------


@dataclass(frozen=True)
class Found:
    """The CR was read."""

    cr: Mapping[str, Any]


@dataclass(frozen=True)
class NotInstalled:
    """The KubeVirt kind is not served (404 on the resource) or no CR exists."""


@dataclass(frozen=True)
class Forbidden:
    """403: the operator may not read the CR."""

    detail: str = ""


@dataclass(frozen=True)
class Unavailable:
    """5xx or timeout; ``since`` is when the current run of such failures began."""

    since: datetime
    detail: str = ""


@dataclass(frozen=True)
class Unreadable:
    """What a pass sees when the permission cannot be known."""

    detail: str = ""


KubeVirtRead = Found | NotInstalled | Forbidden | Unavailable
# A read that settles the permission on its own.
Definitive = Found | NotInstalled
# What a pass decides from.
KubeVirtView = Found | NotInstalled | Unreadable


def view(read: KubeVirtRead, last_known: Definitive | None, now: datetime) -> KubeVirtView:
    """The view a pass uses, given this read, the last definitive one, and the time now."""
    if isinstance(read, Found | NotInstalled):
        return read
    if isinstance(read, Forbidden):
        return Unreadable(read.detail or "forbidden to read the KubeVirt CR")
    if last_known is not None and now - read.since <= STALE_READ_GRACE:
        return last_known
    return Unreadable(read.detail or "the KubeVirt CR could not be read")


def remember(read: KubeVirtRead, last_known: Definitive | None) -> Definitive | None:
    """The last definitive read after this one. A 403 forgets it: access was taken away, so an
    outage right after must not bring back a value read before."""
    if isinstance(read, Found | NotInstalled):
        return read
    if isinstance(read, Forbidden):
        return None
    return last_known


def outage_start(previous: KubeVirtRead | None, now: datetime) -> datetime:
    """The ``since`` of a new ``Unavailable``: carried over from an ongoing outage, else now."""
    return previous.since if isinstance(previous, Unavailable) else now
