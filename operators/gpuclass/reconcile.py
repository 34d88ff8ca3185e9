"""One pass: the status and metric figures of every GPUClass, from the inventory and the KubeVirt view.

Decides, per live class C with resource R (the rules of the design, in one place):

* ownership: the oldest live class by ``(creationTimestamp, name)`` owns R; every other live class
  with R gets ``ResourceNameConflict=True`` naming the owner and offers 0 units. Deleting the owner
  hands R to the next class in the same pass, which is why every class is decided together.
* a class of DRA devices (``spec.deviceClassName`` D instead of ``resourceName``; exactly one of
  the two, or no decision) is decided by the same rules with R = ``DeviceClass/D`` (never a valid
  resource name), a node's ``alloc`` the devices of its ResourceSlices that D selects and ``req``
  those of them ResourceClaims hold (``dra.DraInventory``); D missing is ``Ready=False`` /
  ``DeviceClassNotFound``; KubeVirt permits it by its ``GPUsWithDRA`` feature gate, never by
  ``permittedHostDevices``.
* ``KubeVirtPermitted`` from the KubeVirt view; it never changes units or figures.
* free units: ``free(N) = max(0, alloc(N) - req(N))`` summed (and maxed) over the nodes eligible for
  C that advertise R. ``Ready`` is True when there is no conflict, R is permitted and an eligible
  node advertises ``alloc >= 1`` (the units may all be taken: that is what ``freeUnits`` says).
* fits: for each VM size ``u`` of ``spec.vmSizes`` (default ``DEFAULT_VM_SIZES``), how many VMs of
  ``u`` units could start now, ``sum over the same eligible nodes of free(N) // u`` (a VM's units
  come from one node); every size fits 0 VMs when ``Ready`` is False (the class cannot serve:
  conflict, not permitted, KubeVirt not installed, no eligible node). ``fitsSummary`` is the same
  figures as one string (``1:12 2:5 4:2 8:0``) for the printer column, which cannot format a list.
* whole-VM fits: for each shape of ``spec.vmShapes`` (``vmshape``: GPU units, and the CPU and
  memory of its virt-launcher with KubeVirt's overhead), the VMs that could start now, each with
  all of it from one eligible node: ``sum over nodes of min(free(N) // units, freeCPU(N) // cpu,
  freeMemory(N) // memory)``, where a node's free CPU and memory are its allocatable less the
  requests of every pod bound to it (the inventory's ``compute``). Listed after the ``vmSizes``
  fits, in the order of the spec; a shape asking no CPU and no memory counts as a size does.
* ``transition_events``: the Events to emit, from the stored status and the new one.

Choices where the design is silent:

* ``fits`` lists the sizes in ascending order, whatever the order of ``spec.vmSizes``: the status
  then depends only on the set of sizes, and the column reads small to large. A ``vmSizes`` the CRD
  would refuse (not a list of 1 to 8 distinct integers >= 1) is read as the default. With the
  permission Unknown (``Ready`` Unknown) the fits are computed, as ``freeUnits`` is.
* Fits are counted per taint group: the one walk over the advertising nodes a pass already makes
  keeps each node's free units in a list; a class that can serve then pays, per size and tolerated
  group with a unit free, O(distinct free values) once per pass (a histogram of the list, made the
  first time any class asks, and each size's count memoized per group: the classes of a resource
  share most sizes), never a rescan of pods; a class that cannot serve pays nothing for its fits.
* Terminating classes (``deletionTimestamp`` set) and classes without a ``resourceName`` (the CRD
  rejects those) get no decision at all: no status write, no metric series.
* A missing or unparsable ``creationTimestamp`` sorts as newest (it never steals a name).
* ``Ready`` reasons take precedence in the design's order: conflict, not permitted, not installed,
  no eligible nodes; when only the KubeVirt permission is unknown, ``Ready`` is Unknown too.
* Figures: ``allocatable`` (owner only) and ``requested`` sum over every existing node that
  advertises R, whatever its state (a hoster's capacity view); ``free`` equals ``freeUnits``. Each
  node advertising R is counted in one state: not ready, else cordoned, else untolerated taint.
* Events: a Warning fires when its condition enters that (status, reason), including on a class's
  first pass (a hoster must see a conflict at once); a Normal fires only on recovery from a stored
  different status, so a healthy new class is quiet. ``Exhausted``/``CapacityAvailable`` need a
  stored ``freeUnits`` to compare with, and ``Exhausted`` is not sent when the conflict explains it.

Does not: write anything, read a clock, or put inventory (node names, per-node counts, totals) into
status: status is readable by every authenticated user; figures go to metrics only. (``fits`` is a
count of VMs per size, never a per-node figure.)
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, NamedTuple

from operators.gpuclass import reasons
from operators.gpuclass.dra import DeviceClassView, DeviceOffer, DraInventory
from operators.gpuclass.inventory import Inventory, NodeState
from operators.gpuclass.kubevirt import (
    DEFAULT_CPU_ALLOCATION_RATIO,
    GPUS_WITH_DRA,
    Found,
    KubeVirtView,
    NotInstalled,
    PermittedDevices,
    Unrestricted,
    cpu_allocation_ratio,
    dra_gpus_enabled,
    is_permitted,
    permitted_names,
)
from operators.gpuclass.scheduling import (
    CPU,
    MEMORY,
    NodeVerdict,
    Taint,
    Toleration,
    parse_tolerations,
    tolerates_all,
)
from operators.gpuclass.vmshape import (
    KubeVirt,
    VmShape,
    kubevirt_of,
    launcher_request,
    resolve,
    vm_shapes,
    vms_on_node,
)
from shared.conditions import FALSE, TRUE, UNKNOWN, Condition, find

# Classes without a usable creationTimestamp sort after every real one.
_NEWEST: datetime = datetime.max.replace(tzinfo=UTC)
# The VM sizes (in units) a class reports fits for when spec.vmSizes is absent: the CRD's default too
# (a unit test holds them equal). Tenants start VMs with 1, 2, 4 or 8 GPUs.
DEFAULT_VM_SIZES: Final[tuple[int, ...]] = (1, 2, 4, 8)
# At most this many sizes a class (the CRD's maxItems): the printer column stays one short line.
MAX_VM_SIZES: Final = 8
# What a class of DRA devices owns and labels its metrics with: "DeviceClass/<name>". Never a valid
# resourceName (its domain has upper case), so the two kinds of class never claim one name.
DEVICE_CLASS_PREFIX: Final = "DeviceClass/"
# The DRA inventory of a world with no DRA served: nothing selected, no DeviceClass.
_NO_DRA: Final = DraInventory()
# No KubeVirt cluster instance types (none served, or no shape names one).
_NO_INSTANCETYPES: Final[Mapping[str, Mapping[str, Any]]] = {}


class Fit(NamedTuple):
    """How many VMs of ``units`` units each could start now on the class's eligible nodes (a tuple:
    a pass makes one per size per class, and a frozen dataclass costs several times more to make)."""

    units: int
    vms: int
    name: str = ""  # a whole-VM shape's name ("" for a size of spec.vmSizes)


@dataclass(frozen=True)
class ClassStatus:
    """What goes into a class's status (never inventory: every authenticated user reads it)."""

    free_units: int
    max_free_units_per_node: int
    conditions: tuple[Condition, ...]
    fits: tuple[Fit, ...] = ()  # ascending units

    def fields(self) -> dict[str, Any]:
        """The status fields beside ``conditions``, keyed as stored."""
        return {
            "freeUnits": self.free_units,
            "maxFreeUnitsPerNode": self.max_free_units_per_node,
            "fits": [
                {"name": fit.name, "units": fit.units, "vms": fit.vms}
                if fit.name
                else {"units": fit.units, "vms": fit.vms}
                for fit in self.fits
            ],
            "fitsSummary": fits_summary(self.fits),
        }

    def condition(self, type_: str) -> Condition:
        return next(c for c in self.conditions if c.type == type_)


@dataclass(frozen=True)
class ClassFigures:
    """What goes into the class's metrics."""

    resource: str
    allocatable: int | None  # only for the owner of the name, so sums by resource count it once
    requested: int
    free: int  # equals status.freeUnits
    nodes: Mapping[NodeVerdict, int]  # nodes advertising R, one state each; every state present


@dataclass(frozen=True)
class ClassDecision:
    name: str
    generation: int  # stamp as observedGeneration
    status: ClassStatus
    figures: ClassFigures


@dataclass(frozen=True)
class Event:
    type: str  # reasons.EVENT_NORMAL or reasons.EVENT_WARNING
    reason: str
    message: str


def decide(
    classes: Iterable[Mapping[str, Any]],
    inventory: Inventory,
    kubevirt: KubeVirtView,
    dra: DraInventory = _NO_DRA,
    kubevirt_version: str = "",
    instancetypes: Mapping[str, Mapping[str, Any]] = _NO_INSTANCETYPES,
) -> dict[str, ClassDecision]:
    """The decision for every live class with a resourceName or a deviceClassName, by class name.
    ``instancetypes``: the KubeVirt cluster instance types by name, for shapes that name one."""
    live = [c for c in map(_ClassView.of, classes) if c is not None]
    owner_of = _owners(live)
    # What KubeVirt permits, once per pass; None when the view is not a CR (not installed/unreadable).
    devices = permitted_names(kubevirt.cr) if isinstance(kubevirt, Found) else None
    permission = _Permission(kubevirt, devices, isinstance(kubevirt, Found) and dra_gpus_enabled(kubevirt.cr))
    ratio = cpu_allocation_ratio(kubevirt.cr) if isinstance(kubevirt, Found) else DEFAULT_CPU_ALLOCATION_RATIO
    shaping = _Shaping(
        kubevirt_of(kubevirt.cr if isinstance(kubevirt, Found) else None, kubevirt_version, ratio),
        instancetypes,
    )
    summaries: dict[str, _ResourceSummary] = {}  # computed once per resource, shared by its classes
    decisions: dict[str, ClassDecision] = {}
    for cls in live:
        summary = summaries.get(cls.resource)
        if summary is None:
            summary = summaries[cls.resource] = (
                _summarize_devices(inventory, dra, cls.device_class)
                if cls.device_class
                else _summarize(inventory, cls.resource)
            )
        decisions[cls.name] = _decide_class(cls, owner_of[cls.resource], summary, permission, shaping)
    return decisions


def named_instancetypes(classes: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """The KubeVirt cluster instance types the live classes' shapes name (a pass reads them)."""
    return frozenset(
        shape.instancetype
        for cls in map(_ClassView.of, classes)
        if cls is not None
        for shape in cls.shapes
        if shape.instancetype
    )


def fits_summary(fits: Iterable[Fit]) -> str:
    """The printer column's text: ``units:vms`` per size, space-separated (``1:12 2:5 4:2 8:0``)."""
    return " ".join(f"{fit.name or fit.units}:{fit.vms}" for fit in fits)


def vm_sizes(value: object) -> tuple[int, ...]:
    """``spec.vmSizes`` as the ascending sizes a pass reports; the default when absent or when it is
    anything the CRD would refuse (not 1 to ``MAX_VM_SIZES`` distinct integers >= 1)."""
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_VM_SIZES:
        return DEFAULT_VM_SIZES
    if not all(isinstance(size, int) and not isinstance(size, bool) and size >= 1 for size in value):
        return DEFAULT_VM_SIZES
    sizes = tuple(sorted(set(value)))
    return sizes if len(sizes) == len(value) else DEFAULT_VM_SIZES


def owners(classes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """resourceName -> the name of the live class that owns it."""
    return _owners([c for c in map(_ClassView.of, classes) if c is not None])


def transition_events(stored_status: Mapping[str, Any] | None, new: ClassStatus) -> tuple[Event, ...]:
    """The Events for the changes from the stored status to ``new`` (transitions only)."""
    stored = stored_status or {}
    old_conditions = stored.get("conditions")
    events: list[Event] = []

    conflict = new.condition(reasons.CONDITION_RESOURCE_NAME_CONFLICT)
    old_conflict = find(old_conditions, reasons.CONDITION_RESOURCE_NAME_CONFLICT)
    if conflict.status == TRUE and _status(old_conflict) != TRUE:
        events.append(_warning(reasons.EVENT_RESOURCE_NAME_CONFLICT, conflict.message))
    elif conflict.status == FALSE and _status(old_conflict) == TRUE:
        events.append(_normal(reasons.EVENT_RESOURCE_NAME_OWNED, conflict.message))

    permitted = new.condition(reasons.CONDITION_KUBEVIRT_PERMITTED)
    old_permitted = find(old_conditions, reasons.CONDITION_KUBEVIRT_PERMITTED)
    if _status(old_permitted) != permitted.status or _reason(old_permitted) != permitted.reason:
        warning = _PERMISSION_WARNINGS.get((permitted.status, permitted.reason))
        if warning is not None:
            events.append(_warning(warning, permitted.message))
        elif permitted.status == TRUE and old_permitted is not None and _status(old_permitted) != TRUE:
            events.append(_normal(reasons.EVENT_PERMITTED, permitted.message))

    old_free = stored.get("freeUnits")
    if isinstance(old_free, int) and not isinstance(old_free, bool):
        if old_free > 0 and new.free_units == 0 and conflict.status != TRUE:
            events.append(_warning(reasons.EVENT_EXHAUSTED, "no free units left on eligible nodes"))
        elif old_free == 0 and new.free_units > 0:
            events.append(_normal(reasons.EVENT_CAPACITY_AVAILABLE, "free units are available again"))
    return tuple(events)


# Which KubeVirtPermitted states are warnings, and the event each sends.
_PERMISSION_WARNINGS: dict[tuple[str, str], str] = {
    (FALSE, reasons.REASON_NOT_PERMITTED): reasons.EVENT_NOT_PERMITTED,
    (FALSE, reasons.REASON_KUBEVIRT_NOT_INSTALLED): reasons.EVENT_KUBEVIRT_NOT_INSTALLED,
    (UNKNOWN, reasons.REASON_KUBEVIRT_UNREADABLE): reasons.EVENT_KUBEVIRT_UNREADABLE,
}


# --- classes -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ClassView:
    name: str
    resource: str
    tolerations: tuple[Toleration, ...]
    created: datetime
    generation: int
    sizes: tuple[int, ...] = DEFAULT_VM_SIZES  # ascending
    shapes: tuple[VmShape, ...] = ()
    device_class: str = ""  # a class of DRA devices: its DeviceClass; ``resource`` is then derived

    @property
    def what(self) -> str:
        """The class's name of its devices, for messages."""
        if self.device_class:
            return f"deviceClassName {self.device_class}"
        return f"resourceName {self.resource}"

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> _ClassView | None:
        """The fields a pass needs; ``None`` for terminating or unusable classes (none or both of
        resourceName and deviceClassName: the CRD refuses those)."""
        metadata = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        name, resource = metadata.get("name"), spec.get("resourceName")
        device_class = spec.get("deviceClassName")
        resource = resource if isinstance(resource, str) else ""
        device_class = device_class if isinstance(device_class, str) else ""
        if metadata.get("deletionTimestamp") or not name or bool(resource) == bool(device_class):
            return None
        generation = metadata.get("generation")
        return cls(
            name=str(name),
            resource=resource or f"{DEVICE_CLASS_PREFIX}{device_class}",
            device_class=device_class,
            tolerations=parse_tolerations(spec.get("tolerations")),
            created=_timestamp(metadata.get("creationTimestamp")),
            generation=generation if isinstance(generation, int) else 0,
            sizes=vm_sizes(spec.get("vmSizes")),
            shapes=vm_shapes(spec.get("vmShapes")),
        )


def _owners(live: Iterable[_ClassView]) -> dict[str, str]:
    owners: dict[str, _ClassView] = {}
    for cls in live:
        current = owners.get(cls.resource)
        if current is None or (cls.created, cls.name) < (current.created, current.name):
            owners[cls.resource] = cls
    return {resource: cls.name for resource, cls in owners.items()}


def _timestamp(text: object) -> datetime:
    if not isinstance(text, str):
        return _NEWEST
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return _NEWEST
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


# --- nodes, summarized once per resource -------------------------------------------------------


@dataclass(slots=True)
class _NodeGroup:
    """Schedulable nodes advertising R that share one set of blocking taints."""

    nodes: int = 0
    free: int = 0
    max_free: int = 0
    any_allocatable: bool = False  # some node has alloc >= 1
    # the free units of each node with some free (appended in the walk: cheaper than counting there)
    frees: list[int] = field(default_factory=list)
    # free units -> how many nodes have that many, made from ``frees`` when a class first needs it
    _histogram: Counter[int] | None = None
    # size -> VMs of that size the group's nodes fit: the classes of one resource share most sizes
    _vms: dict[int, int] = field(default_factory=dict)
    # the nodes of ``frees``, in the same order (whole-VM shapes read their CPU and memory)
    states: list[NodeState] = field(default_factory=list)
    # (units, cpu, memory) -> VMs of that shape the group's nodes fit
    _shape_vms: dict[tuple[int, int, int], int] = field(default_factory=dict)
    # the DRA offers of the nodes of ``frees`` (None for a device plugin's node), in the same order
    node_offers: list[DeviceOffer | None] = field(default_factory=list)
    offers: bool = False  # some node's VMs are its DRA offer's, not ``free // size``

    def whole_vms(
        self, ask: tuple[int, int, int], cpu_on: Mapping[str, int], memory_on: Mapping[str, int]
    ) -> int:
        """VMs asking ``(units, cpu millicores, memory bytes)`` the group's nodes fit, each on one."""
        known = self._shape_vms.get(ask)
        if known is None:
            units, cpu, memory = ask
            known = 0
            if units <= self.max_free:
                for free, node, offer in zip(self.frees, self.states, self.node_offers, strict=True):
                    if free >= units or offer is not None:
                        placed = vms_on_node(
                            1,
                            cpu,
                            memory,
                            free // units if offer is None else offer.granted(units),
                            node.allocatable.get(CPU, 0) - cpu_on.get(node.name, 0),
                            node.allocatable.get(MEMORY, 0) - memory_on.get(node.name, 0),
                        )
                        # A DRA pod bound to a device that would not start holds CPU and memory too.
                        known += placed if offer is None else offer.vms(units, placed)
            self._shape_vms[ask] = known
        return known

    def vms(self, size: int) -> int:
        """The VMs of ``size`` units the group's nodes fit, each on one node: sum of ``free // size``."""
        known = self._vms.get(size)
        if known is None:
            if size > self.max_free:
                known = 0
            elif self.offers:
                known = sum(
                    free // size if offer is None else offer.vms(size)
                    for free, offer in zip(self.frees, self.node_offers, strict=True)
                )
            else:
                if self._histogram is None:
                    self._histogram = Counter(self.frees)
                known = sum(free // size * count for free, count in self._histogram.items())
            self._vms[size] = known
        return known


@dataclass
class _ResourceSummary:
    allocatable: int = 0
    requested: int = 0
    not_ready: int = 0
    cordoned: int = 0
    groups: dict[tuple[Taint, ...], _NodeGroup] = field(default_factory=dict)
    device_class: DeviceClassView | None = None  # for a class of DRA devices: None if not found
    cpu_on: Mapping[str, int] = field(default_factory=dict)  # node -> cpu millicores requested
    memory_on: Mapping[str, int] = field(default_factory=dict)  # node -> memory bytes requested


def _summarize(inventory: Inventory, resource: str) -> _ResourceSummary:
    """One walk over the nodes advertising R; classes then only check each taint group once."""
    requested_on = inventory.requested_on(resource)
    summary = _summary(
        (node, node.allocatable[resource], requested_on.get(name, 0), None)
        for name, node in inventory.advertisers(resource).items()
    )
    summary.cpu_on, summary.memory_on = inventory.requested_on(CPU), inventory.requested_on(MEMORY)
    return summary


def _summarize_devices(inventory: Inventory, dra: DraInventory, device_class: str) -> _ResourceSummary:
    """The same, for a DeviceClass: a node's units are the devices of its slices the class selects,
    its requested units those of them that claims hold. Slices of nodes that do not exist offer none."""
    allocated_on = dra.allocated_on(device_class)
    summary = _summary(
        (node, selected, allocated_on.get(name, 0), dra.offer(device_class, name))
        for name, selected in dra.selected_on(device_class).items()
        if (node := inventory.node(name)) is not None
    )
    summary.device_class = dra.device_class(device_class)
    summary.cpu_on, summary.memory_on = inventory.requested_on(CPU), inventory.requested_on(MEMORY)
    return summary


def _summary(nodes: Iterable[tuple[NodeState, int, int, DeviceOffer | None]]) -> _ResourceSummary:
    """One walk over (node, allocatable, requested, DRA offer) of the nodes that offer the class's
    devices. A DRA node's free units and VMs are what its offer grants (counters, shares, taints,
    pools the allocator skips), a device plugin's are its allocatable less its requests."""
    summary = _ResourceSummary()
    for node, alloc, requested, offer in nodes:
        summary.allocatable += alloc
        summary.requested += requested
        # The precedence of scheduling.verdict (not ready, then cordoned), inlined: this loop runs
        # for every advertising node on every pass. Taints depend on the class: checked per group.
        if not node.ready:
            summary.not_ready += 1
        elif node.cordoned:
            summary.cordoned += 1
        else:
            group = summary.groups.get(node.taints)
            if group is None:
                group = summary.groups[node.taints] = _NodeGroup()
            if offer is not None:
                free = offer.free
                group.offers = True
            else:
                free = alloc - requested if alloc > requested else 0  # clamp per node
            group.nodes += 1
            if free:
                group.free += free
                group.frees.append(free)
                group.states.append(node)
                group.node_offers.append(offer)
                reach = free if offer is None else offer.largest  # the largest VM it holds
                if reach > group.max_free:
                    group.max_free = reach
            if alloc >= 1:
                group.any_allocatable = True
    return summary


# --- one class ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Permission:
    """What the KubeVirt view says, read once per pass."""

    kubevirt: KubeVirtView
    devices: PermittedDevices | None  # None when the view is not a CR
    dra_gpus: bool  # the CR enables GPUsWithDRA


def _decide_class(
    cls: _ClassView, owner: str, summary: _ResourceSummary, permission: _Permission, shaping: _Shaping
) -> ClassDecision:
    eligible = untolerated = free = max_free = 0
    serves = False
    offering: list[_NodeGroup] = []  # the eligible groups with some unit free
    for taints, group in summary.groups.items():
        if tolerates_all(taints, cls.tolerations):
            eligible += group.nodes
            free += group.free
            max_free = max(max_free, group.max_free)
            serves = serves or group.any_allocatable
            if group.free:
                offering.append(group)
        else:
            untolerated += group.nodes

    conflict = _conflict_condition(cls, owner)
    permitted = _permitted_condition(cls, permission)
    ready = _ready_condition(cls, owner, conflict, permitted, serves, summary)
    if conflict.status == TRUE:
        free = max_free = 0
    if ready.status == FALSE or not offering:  # cannot serve (no VM starts, whatever is free) or full
        fits = _no_fits(cls.sizes) + tuple(Fit(shape.units, 0, shape.name) for shape in cls.shapes)
    else:
        fits = tuple(Fit(size, sum(group.vms(size) for group in offering)) for size in cls.sizes)
        if cls.shapes:
            fits += tuple(_shape_fit(shape, offering, summary, shaping) for shape in cls.shapes)
    status = ClassStatus(free, max_free, (conflict, permitted, ready), fits)
    figures = ClassFigures(
        resource=cls.resource,
        allocatable=summary.allocatable if owner == cls.name else None,
        requested=summary.requested,
        free=free,
        nodes={
            NodeVerdict.ELIGIBLE: eligible,
            NodeVerdict.NOT_READY: summary.not_ready,
            NodeVerdict.CORDONED: summary.cordoned,
            NodeVerdict.UNTOLERATED_TAINT: untolerated,
        },
    )
    return ClassDecision(cls.name, cls.generation, status, figures)


@dataclass(frozen=True, slots=True)
class _Shaping:
    """What turns a shape into a virt-launcher's request, once per pass: what the KubeVirt CR and
    release set for every virt-launcher, and the cluster instance types shapes may name."""

    kubevirt: KubeVirt
    instancetypes: Mapping[str, Mapping[str, Any]]


def _shape_fit(
    named: VmShape, offering: Iterable[_NodeGroup], summary: _ResourceSummary, shaping: _Shaping
) -> Fit:
    """How many VMs of ``named`` start now, each with its GPUs and its virt-launcher's CPU and memory
    (as KubeVirt renders it) from one node (none when it names an instance type that is not there)."""
    if not named.whole:
        return Fit(named.units, sum(group.vms(named.units) for group in offering), named.name)
    vm = resolve(named, shaping.instancetypes)
    if vm is None:
        return Fit(named.units, 0, named.name)
    cpu, memory = launcher_request(vm, shaping.kubevirt)
    ask = (vm.gpus, cpu, memory)
    vms = sum(group.whole_vms(ask, summary.cpu_on, summary.memory_on) for group in offering)
    return Fit(vm.gpus, vms, named.name)


@functools.lru_cache(maxsize=256)  # bounded: size lists come from specs a hoster edits
def _no_fits(sizes: tuple[int, ...]) -> tuple[Fit, ...]:
    """0 VMs of every size (the same few lists on every pass: made once)."""
    return tuple(Fit(size, 0) for size in sizes)


def _conflict_condition(cls: _ClassView, owner: str) -> Condition:
    if owner != cls.name:
        return Condition(
            reasons.CONDITION_RESOURCE_NAME_CONFLICT,
            TRUE,
            reasons.REASON_RESOURCE_NAME_IN_USE,
            f"{cls.what} is owned by the older GPUClass {owner}; "
            "this class offers no units while that class exists",
        )
    return Condition(
        reasons.CONDITION_RESOURCE_NAME_CONFLICT,
        FALSE,
        reasons.REASON_RESOURCE_NAME_OWNED,
        f"this class owns {cls.what}",
    )


def _permitted_condition(cls: _ClassView, permission: _Permission) -> Condition:
    type_ = reasons.CONDITION_KUBEVIRT_PERMITTED
    kubevirt, devices, resource = permission.kubevirt, permission.devices, cls.resource
    if isinstance(kubevirt, NotInstalled):
        return Condition(
            type_, FALSE, reasons.REASON_KUBEVIRT_NOT_INSTALLED, "KubeVirt is not installed: no VM can start"
        )
    if devices is None:
        # The detail of the failure goes to the log, not here: it would differ on every pass.
        return Condition(type_, UNKNOWN, reasons.REASON_KUBEVIRT_UNREADABLE, "the KubeVirt CR cannot be read")
    if cls.device_class:
        if permission.dra_gpus:
            return Condition(
                type_,
                TRUE,
                reasons.REASON_GPUS_WITH_DRA,
                f"KubeVirt's {GPUS_WITH_DRA} feature gate is enabled: VMs get DRA devices through "
                "ResourceClaims, without permittedHostDevices",
            )
        return Condition(
            type_,
            FALSE,
            reasons.REASON_NOT_PERMITTED,
            f"KubeVirt's {GPUS_WITH_DRA} feature gate is not in the KubeVirt CR's "
            "developerConfiguration.featureGates: KubeVirt gives VMs no DRA devices",
        )
    if isinstance(devices, Unrestricted):
        return Condition(
            type_,
            TRUE,
            reasons.REASON_UNRESTRICTED,
            "KubeVirt has no permittedHostDevices: every name is allowed",
        )
    if is_permitted(devices, resource):
        return Condition(type_, TRUE, reasons.REASON_PERMITTED, f"KubeVirt permits {resource}")
    return Condition(
        type_,
        FALSE,
        reasons.REASON_NOT_PERMITTED,
        f"{resource} is not in KubeVirt's permittedHostDevices: KubeVirt refuses VMs asking for it",
    )


def _ready_condition(
    cls: _ClassView,
    owner: str,
    conflict: Condition,
    permitted: Condition,
    serves: bool,
    summary: _ResourceSummary,
) -> Condition:
    type_ = reasons.CONDITION_READY
    if conflict.status == TRUE:
        return Condition(
            type_,
            FALSE,
            reasons.REASON_READY_RESOURCE_NAME_CONFLICT,
            f"{cls.what} belongs to GPUClass {owner}",
        )
    if permitted.status == FALSE:
        reason = (
            reasons.REASON_READY_NOT_PERMITTED
            if permitted.reason == reasons.REASON_NOT_PERMITTED
            else reasons.REASON_READY_KUBEVIRT_NOT_INSTALLED
        )
        return Condition(type_, FALSE, reason, permitted.message)
    if cls.device_class and summary.device_class is None:
        return Condition(
            type_,
            FALSE,
            reasons.REASON_DEVICE_CLASS_NOT_FOUND,
            f"DeviceClass {cls.device_class} does not exist (or the cluster serves no resource.k8s.io/v1)",
        )
    if not serves:
        offers = f"a device of DeviceClass {cls.device_class}" if cls.device_class else cls.resource
        return Condition(
            type_,
            FALSE,
            reasons.REASON_NO_ELIGIBLE_NODES,
            f"no Ready, uncordoned node whose taints this class tolerates offers {offers}",
        )
    if permitted.status == UNKNOWN:
        return Condition(type_, UNKNOWN, reasons.REASON_READY_KUBEVIRT_UNREADABLE, permitted.message)
    return Condition(
        type_,
        TRUE,
        reasons.REASON_READY,
        "a VM of this class can start in principle; freeUnits says how many now",
    )


def _status(condition: Mapping[str, Any] | None) -> str | None:
    return None if condition is None else condition.get("status")


def _reason(condition: Mapping[str, Any] | None) -> str | None:
    return None if condition is None else condition.get("reason")


def _warning(reason: str, message: str) -> Event:
    return Event(reasons.EVENT_WARNING, reason, message)


def _normal(reason: str, message: str) -> Event:
    return Event(reasons.EVENT_NORMAL, reason, message)
