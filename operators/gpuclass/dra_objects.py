"""Frozen views of what the allocator reads of DRA objects: a device's facts, a slice's counter sets, a
claim's allocation results, a DeviceTaintRule (``resource.k8s.io/v1``, Kubernetes 1.37).

Decides, per object as the API returns it:

* ``DeviceFacts``: the counters a device consumes (``consumesCounters``), whether a taint with a
  ``NoSchedule`` or ``NoExecute`` effect is on it (``taints``), whether it may be shared
  (``allowMultipleAllocations``) and how many shares its capacity allows (each share takes a
  capacity's ``requestPolicy.default``, or the whole capacity: ``fillEmptyRequest``), and the
  physical GPU it belongs to (``PHYSICAL_ATTRIBUTES``: the PCI bus ID the driver publishes);
* ``counter_sets``: a slice's ``sharedCounters`` as exact numbers;
* ``Holding``: what a claim's ``status.allocation.devices.results`` holds: dedicated devices, and
  shares (results with a ``shareID``, with their ``consumedCapacity``); results with
  ``adminAccess: true`` hold nothing, as kube-scheduler's ``foreachAllocatedDevice`` skips them;
* ``TaintRule``: a DeviceTaintRule's selector (driver, pool, device; no selector matches nothing)
  and whether its taint keeps claims off.

Does not: keep state, read the API, or decide availability (``dra``, ``allocator``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from operators.gpuclass.allocator import CounterSetId
from operators.gpuclass.quantity import Exact, parse_exact

DeviceId = tuple[str, str, str]  # (driver, pool, device name), as the allocator names a device
# Device taint effects that keep a claim without a toleration off the device (``None`` does not).
BLOCKING_TAINT_EFFECTS: Final = frozenset({"NoSchedule", "NoExecute"})
# Where a driver publishes the PCI address of the GPU a device is part of: Kubernetes' standard
# attribute (``k8s.io/dynamic-resource-allocation/deviceattribute``), or the driver's own.
PHYSICAL_ATTRIBUTES: Final = ("resource.kubernetes.io/pciBusID", "pciBusID")
# A shared device whose shares take nothing of any capacity: counted as this many units.
UNBOUNDED_SHARES: Final = 1
_MAPPING: Final = (dict, Mapping)
Consumption = tuple[tuple[str, tuple[tuple[str, Exact], ...]], ...]  # (counter set, (counter, amount)...)
CounterUse = tuple[tuple[CounterSetId, tuple[tuple[str, Exact], ...]], ...]  # the same, sets of a pool


@dataclass(frozen=True, slots=True)
class DeviceFacts:
    """What the allocator reads of one device, besides its selection."""

    consumes: Consumption = ()
    tainted: bool = False  # a NoSchedule/NoExecute taint of the slice's own
    shared: bool = False  # allowMultipleAllocations
    capacity: tuple[tuple[str, Exact, Exact], ...] = ()  # (name, value, what one share takes)
    physical: str = ""  # the PCI bus ID of its GPU ("" when not published)

    def shares(self, used: Mapping[str, Exact]) -> int:
        """Shares left of a shared device, given what its shares in use take of each capacity."""
        left: int | None = None
        for name, value, per_share in self.capacity:
            if per_share > 0:
                fits = int((value - used.get(name, 0)) // per_share)
                left = fits if left is None else min(left, fits)
        return max(0, UNBOUNDED_SHARES if left is None else left)

    def counter_use(self, driver: str, pool: str) -> CounterUse:
        return tuple(((driver, pool, name), amounts) for name, amounts in self.consumes)


PLAIN: Final = DeviceFacts()


def device_facts(device: Mapping[str, Any], driver: str) -> DeviceFacts:
    """The facts of a slice's device entry; a plain device (the common case) is the shared ``PLAIN``."""
    consumes = _consumption(device.get("consumesCounters"))
    taints = device.get("taints") or ()
    tainted = any(isinstance(t, _MAPPING) and t.get("effect") in BLOCKING_TAINT_EFFECTS for t in taints)
    shared = device.get("allowMultipleAllocations") is True
    capacity = _share_capacity(device.get("capacity")) if shared else ()
    physical = _physical(device.get("attributes"), driver)
    if not (consumes or tainted or shared or physical):
        return PLAIN
    return DeviceFacts(consumes, tainted, shared, capacity, physical)


def counter_sets(spec: Mapping[str, Any]) -> tuple[tuple[str, dict[str, Exact]], ...]:
    """A slice's ``sharedCounters``: (set name, counter -> value), in the slice's order."""
    sets = []
    for entry in spec.get("sharedCounters") or ():
        if isinstance(entry, _MAPPING) and isinstance(name := entry.get("name"), str):
            counters = {
                counter: parse_exact(value.get("value")) or 0
                for counter, value in (entry.get("counters") or {}).items()
                if isinstance(value, _MAPPING)
            }
            sets.append((name, counters))
    return tuple(sets)


@dataclass(frozen=True, slots=True)
class Holding:
    """What one claim's allocation holds."""

    dedicated: frozenset[DeviceId] = frozenset()
    shares: tuple[tuple[DeviceId, tuple[tuple[str, Exact], ...]], ...] = ()  # (device, consumed capacity)

    @property
    def devices(self) -> frozenset[DeviceId]:
        """Every device the claim holds, dedicated or a share of it."""
        return self.dedicated | {device for device, _ in self.shares}


NOTHING_HELD: Final = Holding()


def holding(claim: Mapping[str, Any]) -> Holding:
    """What a ResourceClaim's allocation holds (admin access results hold nothing)."""
    status = claim.get("status")
    allocation = status.get("allocation") if isinstance(status, _MAPPING) else None
    devices = allocation.get("devices") if isinstance(allocation, _MAPPING) else None
    results = devices.get("results") if isinstance(devices, _MAPPING) else None
    dedicated: set[DeviceId] = set()
    shares: list[tuple[DeviceId, tuple[tuple[str, Exact], ...]]] = []
    for result in results or ():
        if not isinstance(result, _MAPPING) or result.get("adminAccess") is True:
            continue
        driver, pool, name = (str(result.get(key) or "") for key in ("driver", "pool", "device"))
        device = (driver, pool, name)
        if result.get("shareID"):
            consumed = result.get("consumedCapacity")
            amounts = consumed.items() if isinstance(consumed, _MAPPING) else ()
            shares.append((device, tuple((name, parse_exact(value) or 0) for name, value in amounts)))
        else:
            dedicated.add(device)
    if not dedicated and not shares:
        return NOTHING_HELD
    return Holding(frozenset(dedicated), tuple(shares))


@dataclass(frozen=True, slots=True)
class TaintRule:
    """A DeviceTaintRule whose taint keeps claims off the devices it selects."""

    driver: str | None
    pool: str | None
    device: str | None

    def matches(self, device_id: DeviceId) -> bool:
        driver, pool, name = device_id
        return (
            (self.driver is None or self.driver == driver)
            and (self.pool is None or self.pool == pool)
            and (self.device is None or self.device == name)
        )


def taint_rule(obj: Mapping[str, Any]) -> TaintRule | None:
    """The rule of a DeviceTaintRule when its taint blocks (and it has a selector), else None."""
    spec = obj.get("spec")
    spec = spec if isinstance(spec, _MAPPING) else {}
    taint, selector = spec.get("taint"), spec.get("deviceSelector")
    if not isinstance(taint, _MAPPING) or taint.get("effect") not in BLOCKING_TAINT_EFFECTS:
        return None
    if not isinstance(selector, _MAPPING):
        return None  # without a selector, no device is matched
    fields = [selector.get(key) for key in ("driver", "pool", "device")]
    driver, pool, device = (value if isinstance(value, str) else None for value in fields)
    return TaintRule(driver, pool, device)


def consumed_counters(device: Mapping[str, Any]) -> frozenset[tuple[str, str]]:
    """(counter set, counter) of every counter a device consumes, without reading the amounts (a
    pool's validity asks only whether each is declared)."""
    uses = device.get("consumesCounters")
    if not isinstance(uses, list):
        return frozenset()
    return frozenset(
        (str(use.get("counterSet")), str(counter))
        for use in uses
        if isinstance(use, _MAPPING)
        for counter in use.get("counters") or ()
    )


def _consumption(value: object) -> Consumption:
    if not isinstance(value, list):
        return ()
    consumes = []
    for entry in value:
        if isinstance(entry, _MAPPING) and isinstance(name := entry.get("counterSet"), str):
            counters = entry.get("counters") or {}
            amounts = tuple(
                (counter, parse_exact(amount.get("value")) or 0)
                for counter, amount in counters.items()
                if isinstance(amount, _MAPPING)
            )
            consumes.append((name, amounts))
    return tuple(consumes)


def _share_capacity(value: object) -> tuple[tuple[str, Exact, Exact], ...]:
    """(name, value, what one share with no capacity request takes) of each capacity."""
    if not isinstance(value, _MAPPING):
        return ()
    capacity = []
    for name, entry in value.items():
        if not isinstance(entry, _MAPPING):
            continue
        total = parse_exact(entry.get("value")) or 0
        policy = entry.get("requestPolicy")
        default = policy.get("default") if isinstance(policy, _MAPPING) else None
        per_share = parse_exact(default) if default is not None else total
        capacity.append((str(name), total, per_share or 0))
    return tuple(capacity)


def _physical(attributes: object, driver: str) -> str:
    if not isinstance(attributes, _MAPPING):
        return ""
    for name in PHYSICAL_ATTRIBUTES:
        value = attributes.get(name) or attributes.get(f"{driver}/{name}")
        if isinstance(value, _MAPPING) and isinstance(text := value.get("string"), str) and text:
            return text
    return ""
