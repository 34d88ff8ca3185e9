"""GPUs handed out by DRA: per DeviceClass and node, what kube-scheduler's allocator could grant now.

Decides, from ``resource.k8s.io/v1`` DeviceClasses, ResourceSlices, ResourceClaims and
DeviceTaintRules as the API returns them, one watch event at a time and without rescans:

* **a node's devices**: the devices of the ResourceSlices whose ``spec.nodeName`` is that node, in
  the allocator's order (pools by driver and name, slices by name, devices as listed). A pool
  (``spec.driver``, ``spec.pool.name``) counts only its slices of the newest ``spec.pool.generation``
  seen, as the allocator does: a driver republishing a pool retires the old slices' devices at once;
* **which pools the allocator uses** (``GatherPools``/``buildPool`` of
  ``k8s.io/dynamic-resource-allocation`` v0.37, ``structured/internal/incubating``): none of an
  incomplete pool (fewer slices of the newest generation than its ``resourceSliceCount``: also a
  pool half republished), none of an invalid one (a device name twice, a counter set name twice, a
  counter consumed that no counter set declares); the counter sets (``sharedCounters``, in slices
  of their own) of the others;
* **which devices a DeviceClass selects**: the driver's devices for which every CEL selector of the
  class is true (``device_selectors``; compiled once per DeviceClass spec), judged when a device
  appears or changes, or when its DeviceClass changes, never in a pass (a new version of a slice
  has each device compared with the stored one; only a device new, changed or moved is judged);
* **what claims hold** (``dra_objects.holding``): a device named by a claim's allocation results is
  taken (once, however many claims name it) and takes its counters; a result with admin access
  takes nothing; a share of a device with ``allowMultipleAllocations`` takes its
  ``consumedCapacity``. A pod that asked by a DeviceClass's ``extendedResourceName`` (KEP-5004) has
  such a claim too;
* **taints**: a device with a ``NoSchedule``/``NoExecute`` taint, its slice's or a DeviceTaintRule's,
  is not counted: a VM's claim carries no device tolerations (DeviceClasses have none to give);
* per DeviceClass and node, the devices selected (``selected_on``) and held (``allocated_on``),
  for the figures; and ``offer``: what a node would grant claims of ``k`` devices of a class, one
  after another (``allocator.grants``), kept until something on that node changes.

One unit of a shareable device is one share with the capacity's ``requestPolicy.default`` (or the
whole capacity), what a claim asking no capacity gets. Deliberately: slices not tied to one node
(``nodeSelector``, ``allNodes``, per-device node selection: network-attached devices) offer no units,
since a GPU class counts what one node holds. Nothing of an object is kept beyond what these need.

Does not: decide eligibility of nodes or classes (``reconcile`` does, with the Node inventory), talk
to the API, read a clock, or log per event (a DeviceClass whose selector does not compile is logged
once per spec).
"""

from __future__ import annotations

import logging
import operator
import re
from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import compress, islice, repeat
from typing import Any, Final

from operators.gpuclass.allocator import Candidate, CounterSetId, Physical, grants
from operators.gpuclass.device_selectors import (
    Selector,
    device_context,
    device_variable,
    quantity_value,
    version_value,
)
from operators.gpuclass.dra_objects import (
    NOTHING_HELD,
    PLAIN,
    CounterUse,
    DeviceFacts,
    DeviceId,
    Holding,
    TaintRule,
    consumed_counters,
    counter_sets,
    device_facts,
    holding,
    taint_rule,
)
from operators.gpuclass.quantity import Exact

log = logging.getLogger(__name__)

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
_CONSUMES: Final = repeat("consumesCounters")
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
    name: str = ""
    slice_count: int = 1  # spec.pool.resourceSliceCount
    facts: _SliceFacts | None = None  # what the pool's validity reads of it; None: not read yet


@dataclass(frozen=True, slots=True)
class _SliceFacts:
    """What a pool's validity needs of one version of a slice, read once when it comes."""

    counter_sets: tuple[tuple[str, Mapping[str, Exact]], ...] = ()
    names: frozenset[str] = frozenset()  # its devices' names
    listed: int = 0  # how many devices it lists (more than ``names``: a name twice)
    consumed: frozenset[tuple[str, str]] = frozenset()  # (counter set, counter) its devices consume


_NO_SLICE_FACTS: Final = _SliceFacts()


@dataclass(slots=True)
class _Device:
    node: str
    selected: frozenset[str]  # DeviceClass names
    facts: DeviceFacts = PLAIN
    uses: CounterUse = ()  # the counters it consumes, by (driver, pool, counter set)
    candidate: Candidate | None = None  # as a claim gets it while free (made at the first offer)


@dataclass(frozen=True, slots=True)
class _PoolFacts:
    """What the allocator decides of a pool as a whole: usable (complete and valid), its counters."""

    usable: bool = True
    counters: Mapping[str, Mapping[str, Exact]] = field(default_factory=dict)


_USABLE: Final = _PoolFacts()
_PLAIN_CANDIDATE: Final = Candidate()  # a device that consumes no counter, is not shared nor a sibling


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
        self._pool_facts: dict[tuple[str, str], _PoolFacts] = {}  # pools not usable or with counters
        self._shares: dict[DeviceId, dict[str, Exact]] = {}  # shared device -> capacity its shares take
        self._claim_shares: dict[ObjKey, Holding] = {}  # claims holding shares
        self._taint_rules: dict[str, TaintRule] = {}
        # node -> pool -> how many current devices of the pool are on it
        self._node_pools: dict[str, dict[tuple[str, str], int]] = {}
        self._epochs: dict[str, int] = {}  # node -> moves with every change of its devices' availability
        self._epoch = 0  # moves with every change that may touch any node (taint rules, classes)
        # (class, node) -> (the node's epoch, the global epoch, the offer then)
        self._offers: dict[tuple[str, str], tuple[int, int, DeviceOffer]] = {}

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
            _name(obj),
            count if type(count := pool_spec.get("resourceSliceCount")) is int else 1,
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
        held = holding(obj)
        return self._hold_shares(key, held) | self._hold(key, held.devices)

    def delete_claim(self, key: ObjKey) -> bool:
        return self._hold_shares(key, NOTHING_HELD) | self._hold(key, frozenset())

    # --- events: DeviceTaintRules ----------------------------------------------------------------

    def upsert_taint_rule(self, obj: Mapping[str, Any]) -> bool:
        name, rule = _name(obj), taint_rule(obj)
        if rule is None:
            return self.delete_taint_rule(name)
        if self._taint_rules.get(name) == rule:
            return False
        self._taint_rules[name] = rule
        self._epoch += 1
        return True

    def delete_taint_rule(self, name: str) -> bool:
        if self._taint_rules.pop(name, None) is None:
            return False
        self._epoch += 1
        return True

    def taint_rule_names(self) -> list[str]:
        return list(self._taint_rules)

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

    def offer(self, device_class: str, node: str) -> DeviceOffer:
        """What the allocator would grant claims of ``device_class`` on ``node`` now (kept until a
        device, claim, pool or rule there changes)."""
        epochs = (self._epochs.get(node, 0), self._epoch)
        known = self._offers.get((device_class, node))
        if known is not None and known[:2] == epochs:
            return known[2]
        offer = DeviceOffer(*self._candidates(device_class, node))
        self._offers[(device_class, node)] = (*epochs, offer)
        return offer

    def _candidates(
        self, device_class: str, node: str
    ) -> tuple[list[Candidate], dict[CounterSetId, dict[str, Exact]], Physical]:
        """The node's devices the class selects that the allocator could hand a new claim, in its
        order; what each counter set has left after the devices held; the physical GPUs held."""
        candidates: list[Candidate] = []
        counters: dict[CounterSetId, dict[str, Exact]] = {}
        held_physical: dict[str, list[frozenset[CounterSetId]]] = {}
        for pool in sorted(self._node_pools.get(node, ())):
            driver, pool_name = pool
            facts = self._pool_facts.get(pool, _USABLE)
            pool_counters = {(driver, pool_name, n): dict(c) for n, c in facts.counters.items()}
            for name in self._pool_devices.get(pool, _NO_POOL)[1]:
                device_id = (driver, pool_name, name)
                device = self._devices[device_id]
                held = self._holders.get(device_id, 0) > 0
                if held:
                    _charge(pool_counters, device.uses)
                    if device.facts.physical and device.node == node:
                        sets = frozenset(u for u, _ in device.uses)
                        held_physical.setdefault(device.facts.physical, []).append(sets)
                if device.node != node or not facts.usable or device_class not in device.selected:
                    continue
                candidate = self._candidate(device_id, device, held)
                if candidate is not None:
                    candidates.append(candidate)
            counters.update(pool_counters)
        return candidates, counters, held_physical

    def _candidate(self, device_id: DeviceId, device: _Device, held: bool) -> Candidate | None:
        """A device as a new claim could get it: None when tainted, held (and not shared) or full."""
        facts = device.facts
        if facts.tainted or (
            self._taint_rules and any(r.matches(device_id) for r in self._taint_rules.values())
        ):
            return None
        if not facts.shared:
            if held:
                return None
            if device.candidate is None:  # a plain or partitioned device free: the same every offer
                device.candidate = (
                    _PLAIN_CANDIDATE if facts is PLAIN else Candidate(device.uses, 1, False, facts.physical)
                )
            return device.candidate
        shares = facts.shares(self._shares.get(device_id, _EMPTY))
        return Candidate(device.uses, shares, held, facts.physical) if shares >= 1 else None

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
            self._pool_facts.pop(pool, None)
        facts_before = self._pool_facts.get(pool, _USABLE)
        counted = self._counted_slices(keys)
        if self._pool_facts.get(pool, _USABLE) != facts_before:
            self._touch_pool(pool)
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
        """The slices whose devices count: those tied to a node, of the pool's newest generation, in
        the allocator's order (by name); the pool's facts are decided on the way."""
        slices = [self._slices[k] for k in keys]
        if len(slices) > 1:
            newest = max(s.generation for s in slices)
            slices = sorted((s for s in slices if s.generation == newest), key=_slice_name)
        pool = slices[0].pool if slices else None
        if pool is not None:
            facts = _pool_facts(slices)
            if facts is _USABLE:
                self._pool_facts.pop(pool, None)
            else:
                self._pool_facts[pool] = facts
        return [s for s in slices if s.node and not s.spec.get("sharedCounters")]

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
        facts = device_facts(raw, device_id[0])
        device = _Device(node, self._select(device_id, raw), facts, facts.counter_use(*device_id[:2]))
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
        self._epoch += 1
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
        self._touch(device.node)
        pools = self._node_pools.setdefault(device.node, {})
        pool = device_id[:2]
        if (count := pools.get(pool, 0) + sign) > 0:
            pools[pool] = count
        else:
            pools.pop(pool, None)
            if not pools:
                del self._node_pools[device.node]
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

    def _hold_shares(self, key: ObjKey, held: Holding) -> bool:
        """Account the capacity a claim's shares take of shared devices."""
        old = self._claim_shares.pop(key, NOTHING_HELD)
        if held.shares:
            self._claim_shares[key] = held
        if old.shares == held.shares:
            return False
        for shares, sign in ((old.shares, -1), (held.shares, +1)):
            for device_id, consumed in shares:
                used = self._shares.setdefault(device_id, {})
                for name, amount in consumed:
                    used[name] = used.get(name, 0) + sign * amount
                if not any(used.values()):
                    del self._shares[device_id]
                if (device := self._devices.get(device_id)) is not None:
                    self._touch(device.node)
        return True

    def _touch(self, node: str) -> None:
        self._epochs[node] = self._epochs.get(node, 0) + 1

    def _touch_pool(self, pool: tuple[str, str]) -> None:
        for node, pools in self._node_pools.items():
            if pool in pools:
                self._touch(node)

    def _flip(self, device_id: DeviceId, sign: int) -> None:
        """A device became held (+1) or free (-1)."""
        device = self._devices.get(device_id)
        if device is not None:
            self._touch(device.node)
            for name in device.selected:
                _add(self._allocated, name, device.node, sign)


class DeviceOffer:
    """What claims of one DeviceClass would get on one node: ``vms(k)`` claims of ``k`` devices."""

    __slots__ = ("_candidates", "_counters", "_grants", "_held")

    def __init__(
        self, candidates: list[Candidate], counters: dict[CounterSetId, dict[str, Exact]], held: Physical
    ) -> None:
        self._candidates = candidates
        self._counters = counters
        self._held = held
        self._grants: dict[int, tuple[bool, ...]] = {}  # k -> each claim granted: whether it starts

    @property
    def free(self) -> int:
        """Units a new VM could get: claims of one device granted one after another."""
        return self.vms(1)

    @property
    def largest(self) -> int:
        """The most devices one claim could get (a subset of what one claim gets fits too)."""
        k = 0
        while k < len(self._candidates) and self.vms(k + 1):
            k += 1
        return k

    def vms(self, k: int, placed: int | None = None) -> int:
        """Claims of ``k`` devices that would start, of the first ``placed`` granted (all when None:
        a node's CPU or memory may hold fewer VMs than its devices)."""
        known = self._grants.get(k)
        if known is None:
            known = self._grants[k] = grants(self._candidates, self._counters, k, self._held)
        return sum(known[:placed]) if placed is not None else sum(known)

    def granted(self, k: int) -> int:
        """Claims of ``k`` devices the allocator would grant, whether or not they would start."""
        self.vms(k)
        return len(self._grants[k])


def _charge(counters: dict[CounterSetId, dict[str, Exact]], uses: CounterUse) -> None:
    for set_id, amounts in uses:
        left = counters.get(set_id)
        if left is not None:
            for name, amount in amounts:
                left[name] = left.get(name, 0) - amount


def _pool_facts(slices: list[_Slice]) -> _PoolFacts:
    """Whether the allocator uses a pool's devices (all its slices of the newest generation are
    there; device and counter set names unique; every counter consumed declared), and its counters."""
    if not slices or len(slices) != slices[0].slice_count:
        return _PoolFacts(usable=False)
    if len(slices) == 1 and _plain_slice(slices[0].spec):
        return _USABLE  # the most common pool: one slice, no counters (its names are unique: the API checks)
    counters: dict[str, Mapping[str, Exact]] = {}
    names: set[str] = set()
    listed = 0
    consumed: set[tuple[str, str]] = set()
    for slice_ in slices:
        facts = _slice_facts(slice_)
        for name, values in facts.counter_sets:
            if name in counters:
                return _PoolFacts(usable=False)
            counters[name] = values
        names.update(facts.names)
        listed += facts.listed
        consumed.update(facts.consumed)
    if listed != len(names):
        return _PoolFacts(usable=False)  # a device name twice: the allocator calls the pool invalid
    if any(name not in counters or counter not in counters[name] for name, counter in consumed):
        return _PoolFacts(usable=False)  # a counter consumed that no counter set of the pool declares
    return _PoolFacts(counters=counters) if counters else _USABLE


def _plain_slice(spec: Mapping[str, Any]) -> bool:
    """No counter set, and no device consuming one."""
    devices = spec.get("devices") or ()
    # At C speed: every slice event of a one-slice pool asks this of each of its devices.
    return not spec.get("sharedCounters") and not any(map(operator.contains, devices, _CONSUMES))


def _slice_facts(slice_: _Slice) -> _SliceFacts:
    """A slice's ``_SliceFacts``, read the first time they are asked for (one version: kept)."""
    if slice_.facts is None:
        spec = slice_.spec
        sets = counter_sets(spec)
        devices = spec.get("devices") if not sets else None  # the allocator reads no device beside counters
        if not sets and not devices:
            slice_.facts = _NO_SLICE_FACTS
        else:
            named = _named_devices(devices)
            consumed = frozenset().union(
                *(consumed_counters(d) for d in named.values() if "consumesCounters" in d)
            )
            slice_.facts = _SliceFacts(sets, frozenset(named), len(devices or ()), consumed)
    return slice_.facts


def _slice_name(slice_: _Slice) -> str:
    return slice_.name


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
