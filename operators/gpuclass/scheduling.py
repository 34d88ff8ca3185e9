"""What the kube-scheduler would say about a Node and a Pod, for one GPUClass's resource.

Decides, from Node and Pod objects as the API returns them:

* whether a node is Ready (a ``Ready`` condition with status ``"True"``; False, Unknown or missing is
  not ready), cordoned (``spec.unschedulable``), and which of its taints block new pods (``NoSchedule``
  and ``NoExecute``; ``PreferNoSchedule`` never excludes);
* whether a class's tolerations tolerate those taints, matched exactly as the scheduler does: effect
  empty or equal; key equal, or empty with ``Exists``; ``Exists`` matches any value; ``Equal`` or an
  empty operator compares values (empty equals empty); any other operator matches nothing;
* one verdict per node for a class (eligible, or why not), and ``eligible(node, tolerations)``;
* the scheduler's request of a pod for a resource (KEP-753, sidecar containers): app containers plus
  restartable init containers (``restartPolicy: Always``), versus the peak over init containers in
  order (a plain init container's request plus the sidecars started before it), plus
  ``spec.overhead``; a container's request falls back to its limit, as API defaulting does;
* which pods hold resources: bound (``spec.nodeName`` set) and not ``Succeeded``/``Failed``. Pending
  but bound, ``Unknown`` and terminating pods all count, as they do for the scheduler.

Deliberately differs from the scheduler: a cordoned node is never eligible, even for a class that
tolerates ``node.kubernetes.io/unschedulable`` — for GPUClass, cordon means maintenance. A toleration
with an empty key and ``Equal`` matches nothing (the API rejects it; the scheduler's matcher would
match any key). ``tolerationSeconds`` is ignored: it bounds eviction, not scheduling.

``compute_requests`` gives a pod's cpu and memory the same way, for whole-VM fits.

Does not: look at pod-level ``spec.resources`` (KEP-2837, cpu and memory only: a virt-launcher pod
sets none), in-place resize status, affinity, or anything but the resources counted; log (garbage
quantities are returned to the caller, which knows the object and logs once).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, NamedTuple

from operators.gpuclass.quantity import Exact, parse_exact

# Taint effects that keep new pods off a node; PreferNoSchedule only steers, so it never excludes.
BLOCKING_EFFECTS: Final = frozenset({"NoSchedule", "NoExecute"})
# Toleration operators of core/v1; an empty operator means Equal.
OPERATOR_EXISTS: Final = "Exists"
OPERATOR_EQUAL: Final = "Equal"
# Pods in these phases have released their resources; every other phase still holds them.
FINISHED_PHASES: Final = frozenset({"Succeeded", "Failed"})
# The init-container restart policy that makes it a sidecar (KEP-753).
SIDECAR_RESTART_POLICY: Final = "Always"
# isinstance against dict first: the API's objects are dicts, and the ABC check alone costs more than
# the rest of a pod event; other Mappings still pass.
_MAPPING: Final = (dict, Mapping)
# Resource names containing this are Kubernetes' own (native), never extended.
NATIVE_RESOURCE_MARK: Final = "kubernetes.io/"
# Quota-style names; Kubernetes does not count them as extended resources.
QUOTA_PREFIX: Final = "requests."


class NodeVerdict(StrEnum):
    """Why a node does or does not serve a class; the values are the metric's ``state`` labels."""

    ELIGIBLE = "eligible"
    NOT_READY = "not_ready"
    CORDONED = "cordoned"
    UNTOLERATED_TAINT = "untolerated_taint"


class Taint(NamedTuple):
    """A node taint. A tuple, so a node's taints hash cheaply and group nodes alike."""

    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = ""
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == OPERATOR_EXISTS:
            return not self.key or self.key == taint.key
        if self.operator in ("", OPERATOR_EQUAL):
            # An empty key needs Exists; the API rejects it with Equal, so it matches nothing here.
            return bool(self.key) and self.key == taint.key and self.value == taint.value
        return False


@dataclass(frozen=True, slots=True)
class PodRequests:
    """A pod's requests, rounded up per resource (zero requests left out), and the garbage met."""

    amounts: Mapping[str, int]
    garbage: tuple[tuple[str, object], ...] = ()  # (resource, the text that is not a quantity)


def is_extended_resource(name: str) -> bool:
    """An extended resource: has a ``/``, is not Kubernetes' own (``kubernetes.io/``), not a quota name."""
    return "/" in name and NATIVE_RESOURCE_MARK not in name and not name.startswith(QUOTA_PREFIX)


# --- nodes -------------------------------------------------------------------------------------


def is_ready(node: Mapping[str, Any]) -> bool:
    for condition in _get(node, "status", "conditions") or ():
        if isinstance(condition, _MAPPING) and condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def is_cordoned(node: Mapping[str, Any]) -> bool:
    return _get(node, "spec", "unschedulable") is True


def blocking_taints(node: Mapping[str, Any]) -> tuple[Taint, ...]:
    """The taints that keep pods off, sorted and without duplicates (so equal sets compare equal)."""
    taints = {
        Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
        for t in _get(node, "spec", "taints") or ()
        if isinstance(t, _MAPPING) and t.get("effect") in BLOCKING_EFFECTS
    }
    return tuple(sorted(taints))


def parse_tolerations(tolerations: Iterable[object] | None) -> tuple[Toleration, ...]:
    """Tolerations from a core/v1 list as stored; entries that are not objects are dropped."""
    return tuple(
        Toleration(
            key=str(t.get("key") or ""),
            operator=str(t.get("operator") or ""),
            value=str(t.get("value") or ""),
            effect=str(t.get("effect") or ""),
        )
        for t in tolerations or ()
        if isinstance(t, _MAPPING)
    )


def tolerates_all(taints: Iterable[Taint], tolerations: Sequence[Toleration]) -> bool:
    return all(any(toleration.tolerates(taint) for toleration in tolerations) for taint in taints)


def verdict(
    ready: bool, cordoned: bool, taints: Iterable[Taint], tolerations: Sequence[Toleration]
) -> NodeVerdict:
    """One verdict per node: not ready, then cordoned, then untolerated taints take precedence."""
    if not ready:
        return NodeVerdict.NOT_READY
    if cordoned:
        return NodeVerdict.CORDONED
    if not tolerates_all(taints, tolerations):
        return NodeVerdict.UNTOLERATED_TAINT
    return NodeVerdict.ELIGIBLE


def eligible(node: Mapping[str, Any], tolerations: Sequence[Toleration]) -> bool:
    """Ready, not cordoned, and every blocking taint tolerated by some toleration."""
    verdict_ = verdict(is_ready(node), is_cordoned(node), blocking_taints(node), tolerations)
    return verdict_ is NodeVerdict.ELIGIBLE


# --- pods --------------------------------------------------------------------------------------


def bound_node(pod: Mapping[str, Any]) -> str | None:
    """The node a pod holds resources on: bound and not finished; else ``None``."""
    spec = pod.get("spec")
    node = spec.get("nodeName") if isinstance(spec, _MAPPING) else None
    if not node or not isinstance(node, str):
        return None
    status = pod.get("status")
    if isinstance(status, _MAPPING) and status.get("phase") in FINISHED_PHASES:
        return None
    return node


def pod_request(pod: Mapping[str, Any], resource: str) -> int:
    """The scheduler's request of ``pod`` for ``resource``, rounded up; garbage counts 0."""
    return pod_requests(pod, lambda name: name == resource).amounts.get(resource, 0)


def extended_requests(pod: Mapping[str, Any]) -> PodRequests:
    """The scheduler's request of ``pod`` for every extended resource it names."""
    return _pod_requests(pod, _EXTENDED)


def pod_requests(pod: Mapping[str, Any], wanted: Callable[[str], bool]) -> PodRequests:
    """KEP-753 pod requests for the resources ``wanted`` accepts; exact sums, rounded up at the end.

    Called for every pod event: a pod naming no wanted resource (most pods) gets one shared empty
    result, so the caller stores nothing for it.
    """
    return _pod_requests(pod, _Names(wanted))


# Past this many resource names (only malformed objects name that many) a memo of names starts
# over: bounded memory.
NAME_MEMO_LIMIT: Final = 4_096


class _Names:
    """What ``wanted`` said of each resource name met so far. A pod event names ~20 resources, cpu
    and memory of every container mostly: a container whose names are all known to be unwanted is
    passed over in one set comparison, and a set lookup costs less than asking ``wanted`` again."""

    __slots__ = ("unwanted", "wanted", "wanted_names")

    def __init__(self, wanted: Callable[[str], bool]) -> None:
        self.wanted = wanted
        self.wanted_names: set[str] = set()
        self.unwanted: set[str] = set()

    def learn(self, name: str) -> bool:
        """Ask ``wanted`` about a name met for the first time, and remember the answer."""
        if len(self.wanted_names) + len(self.unwanted) >= NAME_MEMO_LIMIT:
            self.wanted_names.clear()
            self.unwanted.clear()
        answer = self.wanted(name)
        (self.wanted_names if answer else self.unwanted).add(name)
        return answer


# The names of extended resources, remembered across every pod event of the process.
_EXTENDED: Final = _Names(is_extended_resource)


# The scheduler's own resources a whole VM needs besides its GPUs (``compute_requests``).
CPU: Final = "cpu"
MEMORY: Final = "memory"
_COMPUTE: Final = _Names(lambda name: name in (CPU, MEMORY))


def compute_requests(pod: Mapping[str, Any]) -> tuple[int, int]:
    """The scheduler's cpu (in millicores, rounded up) and memory (bytes) requests of ``pod``, by
    the same rules as extended resources (KEP-753, overhead, limits as requests); garbage counts 0."""
    spec = pod.get("spec")
    if not isinstance(spec, _MAPPING):
        return 0, 0
    total = _pod_totals(spec, _COMPUTE, [])
    cpu, memory = total.get(CPU, 0), total.get(MEMORY, 0)
    return max(0, math.ceil(cpu * 1000)), max(0, math.ceil(memory))


def _pod_requests(pod: Mapping[str, Any], names: _Names) -> PodRequests:
    spec = pod.get("spec")
    if not isinstance(spec, _MAPPING):
        return _NOTHING
    garbage: list[tuple[str, object]] = []
    total = _pod_totals(spec, names, garbage)
    if not total and not garbage:
        return _NOTHING
    amounts = {
        name: amount if type(amount) is int else math.ceil(amount)
        for name, amount in total.items()
        if amount > 0
    }
    return PodRequests(amounts, tuple(garbage))


def _pod_totals(
    spec: Mapping[str, Any], names: _Names, garbage: list[tuple[str, object]]
) -> dict[str, Exact]:
    """The exact KEP-753 totals of a pod's spec for the resources ``names`` wants."""
    total: dict[str, Exact] = {}
    for container in spec.get("containers") or ():
        requests = _container_requests(container, names, garbage)
        if requests:
            _add(total, requests)

    init_containers = spec.get("initContainers")
    if init_containers:
        sidecars: dict[str, Exact] = {}  # the sidecars started so far, summed
        init_peak: dict[str, Exact] = {}
        for container in init_containers:
            requests = _container_requests(container, names, garbage)
            if isinstance(container, _MAPPING) and container.get("restartPolicy") == SIDECAR_RESTART_POLICY:
                _add(total, requests)  # a sidecar runs beside the app containers
                _add(sidecars, requests)
                _raise_to(init_peak, sidecars)
            elif requests or sidecars:
                _raise_to(init_peak, _summed(requests, sidecars))
        _raise_to(total, init_peak)
    overhead = spec.get("overhead")
    if overhead:
        _add(total, _quantities(overhead, _NO_NAMES, names, garbage))
    return total


_NOTHING: Final = PodRequests({}, ())
_NO_NAMES: Final[Mapping[str, object]] = {}
_NO_AMOUNTS: Final[Mapping[str, Exact]] = {}  # shared, never written: most containers want nothing


def _container_requests(
    container: object, names: _Names, garbage: list[tuple[str, object]]
) -> Mapping[str, Exact]:
    resources = container.get("resources") if isinstance(container, _MAPPING) else None
    if not resources or not isinstance(resources, _MAPPING):  # `not` first: None skips the ABC check
        return _NO_AMOUNTS
    requests = resources.get("requests")
    limits = resources.get("limits")
    unwanted = names.unwanted
    no_request = not requests or (type(requests) is dict and requests.keys() <= unwanted)
    if no_request and (not limits or (type(limits) is dict and limits.keys() <= unwanted)):
        return _NO_AMOUNTS  # cpu and memory only: nothing to read
    amounts = _quantities(requests, _NO_NAMES, names, garbage)
    # A limit without a request is the request (API defaulting does this for stored pods).
    if limits:
        shadowed = requests if requests and isinstance(requests, _MAPPING) else _NO_NAMES
        from_limits = _quantities(limits, shadowed, names, garbage)
        if from_limits:
            amounts = {**amounts, **from_limits} if amounts else from_limits
    return amounts


def _quantities(
    listed: object, shadowed: Mapping[str, object], names: _Names, garbage: list[tuple[str, object]]
) -> Mapping[str, Exact]:
    """The wanted quantities of a resource list, leaving out names ``shadowed`` (a list) has; the
    shared empty result when there are none."""
    if not listed or not isinstance(listed, _MAPPING):
        return _NO_AMOUNTS
    amounts: dict[str, Exact] | None = None
    unwanted, wanted = names.unwanted, names.wanted_names
    for name, text in listed.items():
        if name in unwanted or name in shadowed or (name not in wanted and not names.learn(name)):
            continue
        amount = parse_exact(text)
        if amount is None:
            garbage.append((name, text))
        elif amounts is None:
            amounts = {name: amount}
        else:
            amounts[name] = amount
    return _NO_AMOUNTS if amounts is None else amounts


def _add(into: dict[str, Exact], amounts: Mapping[str, Exact]) -> None:
    for name, amount in amounts.items():
        into[name] = into.get(name, 0) + amount


def _raise_to(into: dict[str, Exact], amounts: Mapping[str, Exact]) -> None:
    for name, amount in amounts.items():
        if amount > into.get(name, 0):
            into[name] = amount


def _summed(a: Mapping[str, Exact], b: Mapping[str, Exact]) -> dict[str, Exact]:
    summed = dict(a)
    _add(summed, b)
    return summed


def _get(obj: Mapping[str, Any], *path: str) -> Any:
    current: Any = obj
    for key in path:
        if not isinstance(current, _MAPPING):
            return None
        current = current.get(key)
    return current
