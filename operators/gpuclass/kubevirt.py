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
  v1.8 (Cozystack's today) has the gate off by default, and the CR does not say which version runs.

Does not: read the CR. The glue that does (async GET of the named CR, or LIST of the namespace taking
the single item; 404 or no item -> ``NotInstalled``; 403 -> ``Forbidden``; 5xx or timeout ->
``Unavailable``) lives in ``operators/gpuclass/kubevirt_read.py``, which imports this module.
Nor does it decide conditions: ``decide`` maps the view to ``KubeVirtPermitted``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

# How long a 5xx/timeout keeps the last definitive read before the permission becomes Unknown:
# long enough to ride out an API server restart, short enough that a hoster is not misled for long.
STALE_READ_GRACE: Final = timedelta(minutes=3)
# The tables of permittedHostDevices that carry a resourceName (KubeVirt v1 API).
DEVICE_TABLES: Final = ("pciHostDevices", "mediatedDevices", "usb")
# KubeVirt's feature gate (v1.9: beta, on by default) that gives VMs GPUs through DRA ResourceClaims.
GPUS_WITH_DRA: Final = "GPUsWithDRA"
# KubeVirt's default cpuAllocationRatio: a VM's vCPU requests a tenth of a CPU unless dedicated.
DEFAULT_CPU_ALLOCATION_RATIO: Final = 10


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
