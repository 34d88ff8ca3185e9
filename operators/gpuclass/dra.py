"""GPUs handed out by DRA: per DeviceClass and node, the devices it selects and those already allocated.

Decides, from ``resource.k8s.io/v1`` DeviceClasses, ResourceSlices and ResourceClaims as the API
returns them, one watch event at a time and without rescans:

* **a node's devices**: the devices of the ResourceSlices whose ``spec.nodeName`` is that node. A
  pool (``spec.driver``, ``spec.pool.name``) counts only its slices of the newest
  ``spec.pool.generation`` seen, as the scheduler's allocator does: a driver republishing a pool
  under a new generation retires the old slices' devices at once, even before it deletes them. A
  device is known by (driver, pool, device name);
* **which devices a DeviceClass selects**: the driver's devices for which every CEL selector of the
  class is true (``device_selectors``; compiled once per DeviceClass spec). A selection is decided
  when a device appears or changes, or when its DeviceClass changes, never in a pass;
* **which devices are allocated**: every device a ResourceClaim's ``status.allocation.devices
  .results`` names (a device named by two claims counts once: it is taken either way). A claim of a
  pod that asked by a DeviceClass's ``extendedResourceName`` (KEP-5004) is such a claim too, so a
  device is counted once whichever way a pod asked for it;
* the aggregates a pass reads, kept current by every change: per DeviceClass, per node, the number
  of selected devices (``selected_on``) and of those that are allocated (``allocated_on``).

Deliberately: slices not tied to one node (``nodeSelector``, ``allNodes``, per-device node
selection: network-attached devices) offer no units, since a GPU class counts what one node holds.
Devices of an incomplete pool (fewer slices seen than ``resourceSliceCount``) are counted: the
allocator uses them for exact-count requests. A device's consumable capacity, shared counters,
taints and ``allowMultipleAllocations`` are not looked at: a GPU is one unit, allocated or free.
Nothing of an object is kept beyond what these aggregates need.

Does not: decide eligibility of nodes or classes (``reconcile`` does, with the Node inventory), talk
to the API, read a clock, or log per event (a DeviceClass whose selector does not compile is logged
once per spec).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from operators.gpuclass.device_selectors import (
    Selector,
    device_context,
    device_variable,
    quantity_value,
    version_value,
)

log = logging.getLogger(__name__)

# A device, as the allocator names it: (driver, pool, device name).
DeviceId = tuple[str, str, str]
# The key a fold gets from its informer: (namespace, name).
ObjKey = Hashable
# The typed attribute values of a ResourceSlice device (one of these is set).
ATTRIBUTE_TYPES: Final = ("int", "bool", "string", "version")
_MAPPING: Final = (dict, Mapping)
_EMPTY: Final[Mapping[str, int]] = {}
_NO_DEVICES: Final[frozenset[DeviceId]] = frozenset()
# At most this many devices that went are remembered with what was decided for them.
GONE_MEMO_LIMIT: Final = 4_096
# A first selector ``device.driver == "<name>"`` (alone, or before ``&&``): the class selects only that
# driver's devices, so the others are never converted into CEL values for it.
_DRIVER_FIRST: Final = re.compile(r'^\s*device\.driver\s*==\s*"([^"\\]+)"\s*(?:&&|$)')


@dataclass(frozen=True, slots=True)
class DeviceClassView:
    """What a pass needs of one DeviceClass."""

    name: str
    extended_resource_name: str  # KEP-5004; "" when the class names none
    error: str  # why the class selects nothing ("" when its selectors compile)


@dataclass(slots=True)
class _Slice:
    spec: Mapping[str, Any]  # as given: an event with an equal spec changes nothing
    pool: tuple[str, str]
    generation: int
    node: str  # "" when the slice is not tied to one node
    version: tuple[object, int] | None = None  # (UID, metadata.generation): the spec's version


@dataclass(slots=True)
class _Device:
    node: str
    raw: Mapping[str, Any]  # the device as the slice lists it: an equal one is the same device
    selected: frozenset[str] = field(default_factory=frozenset)  # DeviceClass names


@dataclass(slots=True)
class _Class:
    view: DeviceClassView
    selectors: tuple[str, ...]
    selector: Selector
    driver: str = ""  # the one driver its selectors require (``device.driver == "..."`` first), if any


class DraInventory:
    """The DRA aggregates, fed one watch event at a time; queries never rescan."""

    def __init__(self) -> None:
        self._slices: dict[ObjKey, _Slice] = {}
        self._pools: dict[tuple[str, str], set[ObjKey]] = {}  # pool -> its slices' keys
        self._devices: dict[DeviceId, _Device] = {}  # the devices of every pool's newest generation
        self._pool_devices: dict[tuple[str, str], frozenset[DeviceId]] = {}
        self._classes: dict[str, _Class] = {}
        self._claims: dict[ObjKey, frozenset[DeviceId]] = {}  # claims holding some device
        self._holders: dict[DeviceId, int] = {}  # device -> how many claims hold it (> 0)
        self._selected: dict[str, dict[str, int]] = {}  # class -> node -> selected devices
        self._allocated: dict[str, dict[str, int]] = {}  # class -> node -> of those, allocated
        # Devices that went: (class epoch, raw, selected); the epoch moves with every class change.
        self._gone: dict[DeviceId, tuple[int, Mapping[str, Any], frozenset[str]]] = {}
        self._class_epoch = 0

    # --- events: DeviceClasses -------------------------------------------------------------------

    def upsert_class(self, obj: Mapping[str, Any]) -> bool:
        """Record a DeviceClass; re-select every device when its selectors changed."""
        name = _name(obj)
        if not name:
            return False
        spec = obj.get("spec")
        spec = spec if isinstance(spec, _MAPPING) else {}
        selectors = _selector_expressions(spec)
        extended = spec.get("extendedResourceName")
        extended = extended if isinstance(extended, str) else ""
        old = self._classes.get(name)
        if old is not None and old.selectors == selectors:
            if old.view.extended_resource_name == extended:
                return False
            old.view = DeviceClassView(name, extended, old.view.error)
            return True
        selector = Selector.compile(selectors)
        if selector.error:
            log.warning("DeviceClass %s selects no device: %s", name, selector.error)
        self._classes[name] = _Class(
            DeviceClassView(name, extended, selector.error), selectors, selector, required_driver(selectors)
        )
        self._reselect_all(name)
        return True

    def delete_class(self, name: str) -> bool:
        if self._classes.pop(name, None) is None:
            return False
        self._reselect_all(name)
        self._selected.pop(name, None)
        self._allocated.pop(name, None)
        return True

    # --- events: ResourceSlices ------------------------------------------------------------------

    def upsert_slice(self, key: ObjKey, obj: Mapping[str, Any]) -> bool:
        spec = obj.get("spec")
        if not isinstance(spec, _MAPPING):
            return self.delete_slice(key)
        old = self._slices.get(key)
        version = _spec_version(obj)
        if old is not None and ((version is not None and old.version == version) or old.spec == spec):
            # Nothing but metadata changed (most slice events): the API server raises
            # metadata.generation with every change of the spec, so no deep comparison is needed.
            return False
        pool_spec = spec.get("pool")
        pool_spec = pool_spec if isinstance(pool_spec, _MAPPING) else {}
        generation = pool_spec.get("generation")
        new = _Slice(
            spec,
            (str(spec.get("driver") or ""), str(pool_spec.get("name") or "")),
            generation if type(generation) is int else 0,
            node if isinstance(node := spec.get("nodeName"), str) else "",
            version,
        )
        self._slices[key] = new
        changed = False
        if old is not None and old.pool != new.pool:
            self._pools[old.pool].discard(key)
            changed = self._refresh_pool(old.pool)
        self._pools.setdefault(new.pool, set()).add(key)
        return self._refresh_pool(new.pool) or changed

    def delete_slice(self, key: ObjKey) -> bool:
        old = self._slices.pop(key, None)
        if old is None:
            return False
        self._pools[old.pool].discard(key)
        self._refresh_pool(old.pool)
        return True

    def class_names(self) -> list[str]:
        return list(self._classes)

    def slice_keys(self) -> Iterable[ObjKey]:
        return self._slices.keys()

    # --- events: ResourceClaims ------------------------------------------------------------------

    def upsert_claim(self, key: ObjKey, obj: Mapping[str, Any]) -> bool:
        return self._hold(key, allocated_devices(obj))

    def delete_claim(self, key: ObjKey) -> bool:
        return self._hold(key, frozenset())

    def claim_keys(self) -> Iterable[ObjKey]:
        return self._claims.keys()

    # --- queries ---------------------------------------------------------------------------------

    def device_class(self, name: str) -> DeviceClassView | None:
        known = self._classes.get(name)
        return None if known is None else known.view

    def selected_on(self, device_class: str) -> Mapping[str, int]:
        """Node name -> the devices of that node the class selects (nodes may not exist)."""
        return self._selected.get(device_class, _EMPTY)

    def allocated_on(self, device_class: str) -> Mapping[str, int]:
        """Node name -> of the devices the class selects there, those some claim holds."""
        return self._allocated.get(device_class, _EMPTY)

    def devices(self) -> Iterator[tuple[DeviceId, str, frozenset[str]]]:
        """(device, node, the classes selecting it) for every current device (for tests)."""
        for device_id, device in self._devices.items():
            yield device_id, device.node, device.selected

    def tracked_claims(self) -> int:
        return len(self._claims)

    # --- internals -------------------------------------------------------------------------------

    def _refresh_pool(self, pool: tuple[str, str]) -> bool:
        """Make the pool's current devices those of its slices of the newest generation."""
        keys = self._pools.get(pool) or set()
        slices = [self._slices[k] for k in keys]
        newest = max((s.generation for s in slices), default=0) if len(slices) > 1 else 0
        current: dict[DeviceId, tuple[str, Mapping[str, Any]]] = {}  # device -> (node, raw)
        driver, pool_name = pool
        for slice_ in slices:
            node = slice_.node
            if (newest and slice_.generation != newest) or not node:
                continue
            for device in slice_.spec.get("devices") or ():
                name = device.get("name") if isinstance(device, _MAPPING) else None
                if name:
                    current[(driver, pool_name, str(name))] = (node, device)
        if not keys:
            self._pools.pop(pool, None)
        before = self._pool_devices.get(pool, _NO_DEVICES)
        same_devices = current.keys() == before
        if not same_devices:
            if current:
                self._pool_devices[pool] = frozenset(current)
            else:
                self._pool_devices.pop(pool, None)
        changed = False
        for device_id in () if same_devices else before - current.keys():
            gone = self._devices.pop(device_id)
            self._account(device_id, gone, -1)
            self._remember(device_id, gone)
            changed = True
        devices = self._devices
        for device_id, (node, raw) in current.items():
            known = devices.get(device_id)
            if known is not None and known.node == node and (known.raw is raw or known.raw == raw):
                continue  # the same device (a republished slice, a new pool generation): no CEL
            if known is not None:
                self._account(device_id, known, -1)
            device = _Device(node, raw)
            device.selected = self._select(device_id, device)
            self._devices[device_id] = device
            self._account(device_id, device, +1)
            changed = True
        return changed

    def _select(self, device_id: DeviceId, device: _Device) -> frozenset[str]:
        """The classes selecting a new or changed device: one conversion into CEL values, then every
        class's programs (those naming another driver skip it); a device that went and came back
        unchanged, with no DeviceClass changed meanwhile, keeps what was decided for it."""
        gone = self._gone.pop(device_id, None)
        if gone is not None and gone[0] == self._class_epoch and gone[1] == device.raw:
            return gone[2]
        driver = device_id[0]
        candidates = [(n, c) for n, c in self._classes.items() if c.driver in ("", driver)]
        if not candidates:
            return frozenset()
        context = device_context(device_variable_of(driver, device.raw))
        return frozenset(name for name, cls in candidates if cls.selector.selects(context))

    def _remember(self, device_id: DeviceId, device: _Device) -> None:
        """Keep what was decided for a device that went (bounded): it often comes back as it was."""
        if len(self._gone) >= GONE_MEMO_LIMIT:
            del self._gone[next(iter(self._gone))]
        self._gone[device_id] = (self._class_epoch, device.raw, device.selected)

    def _reselect_all(self, name: str) -> None:
        self._class_epoch += 1
        self._gone.clear()
        known = self._classes.get(name)
        for device_id, device in self._devices.items():
            selects = (
                known is not None
                and known.driver in ("", device_id[0])
                and known.selector.selects(device_variable_of(device_id[0], device.raw))
            )
            if selects == (name in device.selected):
                continue
            held = self._holders.get(device_id, 0) > 0
            sign = 1 if selects else -1
            _add(self._selected, name, device.node, sign)
            if held:
                _add(self._allocated, name, device.node, sign)
            device.selected = device.selected | {name} if selects else device.selected - {name}

    def _account(self, device_id: DeviceId, device: _Device, sign: int) -> None:
        held = self._holders.get(device_id, 0) > 0
        for name in device.selected:
            _add(self._selected, name, device.node, sign)
            if held:
                _add(self._allocated, name, device.node, sign)

    def _hold(self, key: ObjKey, devices: frozenset[DeviceId]) -> bool:
        old = self._claims.get(key, frozenset())
        if old == devices:
            return False
        if devices:
            self._claims[key] = devices
        else:
            self._claims.pop(key, None)
        for device_id in old - devices:
            holders = self._holders[device_id] - 1
            if holders:
                self._holders[device_id] = holders
            else:
                del self._holders[device_id]
                self._flip(device_id, -1)
        for device_id in devices - old:
            holders = self._holders.get(device_id, 0) + 1
            self._holders[device_id] = holders
            if holders == 1:
                self._flip(device_id, +1)
        return True

    def _flip(self, device_id: DeviceId, sign: int) -> None:
        """A device became held (+1) or free (-1)."""
        device = self._devices.get(device_id)
        if device is not None:
            for name in device.selected:
                _add(self._allocated, name, device.node, sign)


def allocated_devices(claim: Mapping[str, Any]) -> frozenset[DeviceId]:
    """The devices a ResourceClaim's allocation holds."""
    status = claim.get("status")
    allocation = status.get("allocation") if isinstance(status, _MAPPING) else None
    devices = allocation.get("devices") if isinstance(allocation, _MAPPING) else None
    results = devices.get("results") if isinstance(devices, _MAPPING) else None
    if not results:
        return frozenset()
    return frozenset(
        (str(r.get("driver") or ""), str(r.get("pool") or ""), str(r.get("device") or ""))
        for r in results
        if isinstance(r, _MAPPING)
    )


def device_variable_of(driver: str, device: Mapping[str, Any]) -> Mapping[str, Any]:
    """What a selector sees as ``device`` of a ResourceSlice's device entry."""
    attributes: dict[str, dict[str, object]] = {}
    for qualified, value in (device.get("attributes") or {}).items():
        converted = _attribute(value)
        if converted is not None:
            domain, name = _split(qualified, driver)
            attributes.setdefault(domain, {})[name] = converted
    capacity: dict[str, dict[str, str]] = {}
    for qualified, value in (device.get("capacity") or {}).items():
        text = value.get("value") if isinstance(value, _MAPPING) else None
        converted_quantity = quantity_value(text)
        if converted_quantity is not None:
            domain, name = _split(qualified, driver)
            capacity.setdefault(domain, {})[name] = converted_quantity
    return device_variable(driver, attributes, capacity)


def _attribute(value: object) -> object | None:
    if not isinstance(value, _MAPPING):
        return None
    for type_ in ATTRIBUTE_TYPES:
        if type_ in value:
            raw = value[type_]
            return version_value(raw) if type_ == "version" else raw
    return None


def _split(qualified: str, driver: str) -> tuple[str, str]:
    """An attribute or capacity name as (domain, id); an unqualified name is in the driver's domain."""
    domain, slash, name = qualified.rpartition("/")
    return (domain, name) if slash else (driver, qualified)


def required_driver(selectors: tuple[str, ...]) -> str:
    """The driver every selected device must have, when the first selector starts by saying so."""
    if not selectors or "||" in selectors[0] or "?" in selectors[0]:
        return ""  # ``a && b || c`` may select any driver's device through ``c``
    match = _DRIVER_FIRST.match(selectors[0])
    return match[1] if match else ""


def _selector_expressions(spec: Mapping[str, Any]) -> tuple[str, ...]:
    expressions = []
    for selector in spec.get("selectors") or ():
        expression = (selector.get("cel") or {}).get("expression") if isinstance(selector, _MAPPING) else None
        if isinstance(expression, str):
            expressions.append(expression)
    return tuple(expressions)


def _spec_version(obj: Mapping[str, Any]) -> tuple[object, int] | None:
    """(UID, metadata.generation) of an object, which names one version of its spec; None without."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, _MAPPING):
        return None
    generation, uid = metadata.get("generation"), metadata.get("uid")
    return (uid, generation) if uid and type(generation) is int and generation > 0 else None


def _name(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, _MAPPING) else None
    return name if isinstance(name, str) else ""


def _add(table: dict[str, dict[str, int]], name: str, node: str, sign: int) -> None:
    by_node = table.setdefault(name, {})
    total = by_node.get(node, 0) + sign
    if total:
        by_node[node] = total
    else:
        del by_node[node]
        if not by_node:
            del table[name]
