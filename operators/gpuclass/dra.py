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
  when a device appears or changes, or when its DeviceClass changes, never in a pass: a new version
  of a slice has each device compared with the stored one (dict equality: in the list's order when
  only its end changed, else by name), and only a device new, changed or moved to another node is
  judged again, the others keeping their verdicts;
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
import operator
import re
from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import compress, islice
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
# A pool's devices anew: (name -> device, their node or nodes by name, names new or changed, names gone).
_Diff = tuple[dict[str, Mapping[str, Any]], str | dict[str, str], list[str], list[str]]
_NO_POOL: Final[tuple[str, Mapping[str, Mapping[str, Any]]]] = ("", {})
_STR: Final = frozenset({str})
_NAME: Final = operator.itemgetter("name")
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
    selected: frozenset[str]  # DeviceClass names


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
        # pool -> (the node of all its devices, "" when several; device name -> the device as listed)
        self._pool_devices: dict[tuple[str, str], tuple[str, dict[str, Mapping[str, Any]]]] = {}
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
        """Make the pool's current devices those of its slices of the newest generation. Only a device
        that is new, moved to another node or not equal to the stored one is judged again; the others
        keep their verdicts (one dict equality each, at C speed)."""
        keys = self._pools.get(pool) or set()
        if not keys:
            self._pools.pop(pool, None)
        counted = self._counted_slices(keys)
        before_node, before = self._pool_devices.get(pool, _NO_POOL)
        diff = _in_order(before, before_node, counted) or _by_name(before, before_node, counted)
        raws, nodes, changed, gone = diff
        if raws:
            self._pool_devices[pool] = (nodes if isinstance(nodes, str) else "", raws)
        else:
            self._pool_devices.pop(pool, None)
        driver, pool_name = pool
        for name in gone:
            self._drop((driver, pool_name, name), before[name])
        judged = False
        for name in changed:
            node = nodes if isinstance(nodes, str) else nodes[name]
            judged = self._judge((driver, pool_name, name), node, raws[name], before.get(name)) or judged
        return judged or bool(gone)

    def _counted_slices(self, keys: set[ObjKey]) -> list[_Slice]:
        """The slices whose devices count: those tied to a node, of the pool's newest generation."""
        slices = [self._slices[k] for k in keys]
        newest = max((s.generation for s in slices), default=0) if len(slices) > 1 else 0
        return [s for s in slices if s.node and not (newest and s.generation != newest)]

    def _judge(
        self, device_id: DeviceId, node: str, raw: Mapping[str, Any], stored: Mapping[str, Any] | None
    ) -> bool:
        """Account a device that is new, moved or changed; one equal to the stored one on the same node
        keeps its verdict."""
        known = self._devices.get(device_id)
        if known is not None and known.node == node and (stored is raw or stored == raw):
            return False  # the same device (a republished slice, a new pool generation): no CEL
        if known is not None:
            self._account(device_id, known, -1)
        device = _Device(node, self._select(device_id, raw))
        self._devices[device_id] = device
        self._account(device_id, device, +1)
        return True

    def _drop(self, device_id: DeviceId, raw: Mapping[str, Any]) -> None:
        gone = self._devices.pop(device_id)
        self._account(device_id, gone, -1)
        self._remember(device_id, raw, gone.selected)

    def _select(self, device_id: DeviceId, raw: Mapping[str, Any]) -> frozenset[str]:
        """The classes selecting a new or changed device: one conversion into CEL values, then every
        class's programs (those naming another driver skip it); a device that went and came back
        unchanged, with no DeviceClass changed meanwhile, keeps what was decided for it."""
        gone = self._gone.pop(device_id, None)
        if gone is not None and gone[0] == self._class_epoch and gone[1] == raw:
            return gone[2]
        driver = device_id[0]
        candidates = [(n, c) for n, c in self._classes.items() if c.driver in ("", driver)]
        if not candidates:
            return frozenset()
        context = device_context(device_variable_of(driver, raw))
        return frozenset(name for name, cls in candidates if cls.selector.selects(context))

    def _remember(self, device_id: DeviceId, raw: Mapping[str, Any], selected: frozenset[str]) -> None:
        """Keep what was decided for a device that went (bounded): it often comes back as it was."""
        if len(self._gone) >= GONE_MEMO_LIMIT:
            del self._gone[next(iter(self._gone))]
        self._gone[device_id] = (self._class_epoch, raw, selected)

    def _reselect_all(self, name: str) -> None:
        self._class_epoch += 1
        self._gone.clear()
        known = self._classes.get(name)
        for device_id, device in self._devices.items():
            selects = (
                known is not None
                and known.driver in ("", device_id[0])
                and known.selector.selects(device_variable_of(device_id[0], self._raw(device_id)))
            )
            if selects == (name in device.selected):
                continue
            held = self._holders.get(device_id, 0) > 0
            sign = 1 if selects else -1
            _add(self._selected, name, device.node, sign)
            if held:
                _add(self._allocated, name, device.node, sign)
            device.selected = device.selected | {name} if selects else device.selected - {name}

    def _raw(self, device_id: DeviceId) -> Mapping[str, Any]:
        driver, pool, name = device_id
        return self._pool_devices[(driver, pool)][1][name]

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


def _device_raws(slices: list[_Slice]) -> tuple[dict[str, Mapping[str, Any]], str | dict[str, str]]:
    """Device name -> the device as its slice lists it (a later slice's wins), and the node of every
    device: one node when all the slices share it ("" without slices), else by device name."""
    if len(slices) == 1:
        return _named_devices(slices[0].spec.get("devices")), slices[0].node
    raws: dict[str, Mapping[str, Any]] = {}
    if len({s.node for s in slices}) <= 1:
        for slice_ in slices:
            raws.update(_named_devices(slice_.spec.get("devices")))
        return raws, slices[0].node if slices else ""
    nodes: dict[str, str] = {}
    for slice_ in slices:
        named = _named_devices(slice_.spec.get("devices"))
        raws.update(named)
        nodes.update(dict.fromkeys(named, slice_.node))
    return raws, nodes


def _in_order(before: Mapping[str, Mapping[str, Any]], node: str, slices: list[_Slice]) -> _Diff | None:
    """When the pool's one slice, on the node of the stored devices, lists them in their order (equal
    dicts) but for devices added at its end or gone from it: the diff, the devices in step not even
    named; else None."""
    if len(slices) != 1 or slices[0].node != node or not before:
        return None
    devices = slices[0].spec.get("devices")
    if type(devices) is not list or any(map(operator.ne, before.values(), devices)):
        return None
    raws = dict(zip(before, devices, strict=False))  # the devices in step: their names are the stored ones
    added = _named_devices(devices[len(raws) :])
    changed = [name for name, device in added.items() if raws.get(name) != device]
    raws.update(added)
    return raws, node, changed, list(islice(before, len(devices), None))


def _by_name(before: Mapping[str, Mapping[str, Any]], node: str, slices: list[_Slice]) -> _Diff:
    """The diff of every device of the slices with the stored one of its name."""
    raws, nodes = _device_raws(slices)
    # All on the node they were on: only unequal devices can change; else each one is looked at.
    changed = _unequal(before, raws) if isinstance(nodes, str) and nodes == node else list(raws)
    gone = list(before.keys() - raws.keys()) if changed or len(before) != len(raws) else []
    return raws, nodes, changed, gone


def _named_devices(devices: Any) -> dict[str, Mapping[str, Any]]:
    """Name -> device of a slice's device list, entries without a name skipped; at C speed when every
    entry is a mapping with a non-empty string name (as the API server's validation makes them)."""
    devices = devices or ()
    try:
        named = dict(zip(map(_NAME, devices), devices, strict=True))  # a later same name wins
    except (TypeError, KeyError):
        named = {}
    else:
        if set(map(type, named)) <= _STR and "" not in named:
            return named
        named.clear()
    for device in devices:
        name = device.get("name") if isinstance(device, _MAPPING) else None
        if name:
            named[str(name)] = device
    return named


def _unequal(before: Mapping[str, Mapping[str, Any]], raws: dict[str, Mapping[str, Any]]) -> list[str]:
    """The names whose device is not in ``before`` or not equal to it there (C-speed dict equality)."""
    return list(compress(raws, map(operator.ne, map(before.get, raws), raws.values())))


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
