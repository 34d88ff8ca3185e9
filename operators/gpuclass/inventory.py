"""The in-memory inventory: per node, what it offers of each extended resource and what pods hold.

Decides: how Node and Pod watch events change the aggregates a pass reads, one event at a time and
without rescans. A node becomes a ``NodeState`` (ready, cordoned, blocking taints, allocatable of each
extended resource rounded up like ``Quantity.Value()``); a pod becomes its contribution, the
scheduler's request per extended resource on the node it is bound to. The last contribution of every
pod is remembered under its key, so an update subtracts the old one and adds the new one: O(resources
in the pod). The key is the caller's (the runtime's informer gives ``(namespace, name)``: a pod
recreated under its name is then an update, which replaces the old life's contribution); without
one, ``pod_key`` (the UID) is used.
An index from resource name to the nodes advertising it (the name is in ``status.allocatable``, even
with ``"0"``) is kept the same way, so a class walks only the nodes that matter to it.

With ``compute`` (the operator's inventory; whole-VM fits need it), a node's allocatable cpu (in
millicores) and memory (bytes) and every bound pod's cpu and memory requests are tracked too, under
the names ``cpu`` and ``memory`` (never an extended resource's name): then every bound pod stores
its contribution, a few tuples.

Deliberately:

* only extended resources are tracked without ``compute`` (GPU classes name nothing else); a pod
  requesting none of them, unbound or finished then stores nothing at all;
* pods bound to a node that does not exist are kept (they count once the node appears) but are
  invisible to every sum over nodes, which only walk existing nodes;
* a garbage or negative quantity counts 0 and is logged once per (object, resource, text);
* a pod's requests are read from its spec only when the spec is new to the inventory: a pod that
  contributes remembers the ``spec_version`` (UID, ``metadata.generation``) they were read from, so a
  later event of the same spec version (a status change: most pod events) takes only the node and
  phase from the object. A pod without both fields has its spec read on every event.

Does not: decide eligibility for a class, clamp free units, talk to the API or read a clock.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Hashable, Iterator, KeysView, Mapping
from dataclasses import dataclass
from typing import Any, Final

from operators.gpuclass.quantity import parse_exact, parse_value
from operators.gpuclass.scheduling import (
    CPU,
    MEMORY,
    Taint,
    blocking_taints,
    bound_node,
    compute_requests,
    extended_requests,
    is_cordoned,
    is_extended_resource,
    is_ready,
)

log = logging.getLogger(__name__)

# A pod's contribution: the node it holds resources on, and (resource, amount) pairs.
Contribution = tuple[str, tuple[tuple[str, int], ...]]
# What identifies a pod across its events: ``pod_key`` (a string), or the caller's key.
PodKey = Hashable
# One version of a pod's spec: (UID, metadata.generation); see ``spec_version``.
SpecVersion = tuple[object, int]
# Past this many distinct request shapes, the memo that shares them starts over (bounded memory).
AMOUNTS_MEMO_LIMIT: Final = 16_384


@dataclass(frozen=True, slots=True)
class NodeState:
    """What a pass needs of one node; equal states mean an event changed nothing that matters."""

    name: str
    ready: bool
    cordoned: bool
    taints: tuple[Taint, ...]  # NoSchedule/NoExecute only, sorted
    allocatable: Mapping[str, int]  # extended resources only, rounded up; garbage is 0


@dataclass(frozen=True)
class Snapshot:
    """Everything the inventory holds, as plain values: two inventories fed the same objects are equal."""

    nodes: Mapping[str, NodeState]
    requested: Mapping[str, Mapping[str, int]]  # resource -> node -> summed requests (nodes may be absent)
    pods: Mapping[PodKey, Contribution]


class Inventory:
    """The aggregates, fed one watch event at a time; queries never rescan pods."""

    def __init__(self, *, compute: bool = False) -> None:
        self.compute = compute  # track cpu and memory too (whole-VM fits)
        self._nodes: dict[str, NodeState] = {}
        # resource -> node name -> state, for the existing nodes that advertise the resource
        self._advertisers: dict[str, dict[str, NodeState]] = {}
        # resource -> node name -> summed pod requests (zero entries dropped; the node may not exist)
        self._requested: dict[str, dict[str, int]] = {}
        # pod key -> its last contribution; pods contributing nothing are absent
        self._pods: dict[PodKey, Contribution] = {}
        # pod key -> the (uid, generation) its contribution's amounts were read from, for the pods
        # in ``_pods`` whose metadata has both: a later version with the same pair has the same spec
        self._spec_versions: dict[PodKey, SpecVersion] = {}
        # object -> the garbage already logged for it, so each is logged once per object life
        self._logged_garbage: dict[Hashable, set[str]] = {}
        # amounts -> the one tuple of them every contribution with those amounts shares: most pods
        # ask for a few shapes of cpu and memory (bounded: started over past AMOUNTS_MEMO_LIMIT)
        self._amounts: dict[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]] = {}

    # --- events --------------------------------------------------------------------------------

    def upsert_node(self, node: Mapping[str, Any]) -> bool:
        """Record a node's current state; ``True`` when that changed anything a pass reads."""
        state = self._node_state(node)
        if state is None:
            return False
        old = self._nodes.get(state.name)
        if old == state:
            return False
        self._nodes[state.name] = state
        for resource in old.allocatable if old else ():
            if resource not in state.allocatable:
                self._unadvertise(resource, state.name)
        for resource in state.allocatable:
            self._advertisers.setdefault(resource, {})[state.name] = state
        return True

    def delete_node(self, name: str) -> bool:
        """Forget a node; pods bound to it stay remembered. ``True`` when it was known."""
        old = self._nodes.pop(name, None)
        if old is None:
            return False
        for resource in old.allocatable:
            self._unadvertise(resource, name)
        self._logged_garbage.pop(_node_key(name), None)
        return True

    def upsert_pod(self, pod: Mapping[str, Any], key: PodKey | None = None) -> bool:
        """Record a pod's current contribution under ``key`` (default ``pod_key``); ``True`` when
        it changed."""
        if key is None:
            key = pod_key(pod)
        old = self._pods.get(key)
        node = bound_node(pod)
        version = spec_version(pod) if node is not None else None
        if node is None:
            new = None
        elif old is not None and version is not None and self._spec_versions.get(key) == version:
            # The same spec as the contribution was read from: only the node can have moved.
            new = old if old[0] == node else (node, old[1])
        else:
            new = self._contribution(pod, key, node)
        if new is None or version is None:
            self._spec_versions.pop(key, None)
        else:
            self._spec_versions[key] = version
        if new == old:
            return False
        if old is not None:
            self._apply(old, -1)
        if new is None:
            del self._pods[key]
        else:
            self._pods[key] = new
            self._apply(new, +1)
        return True

    def delete_pod(self, key: PodKey) -> bool:
        """Forget a pod by the key it was recorded under; ``True`` when it contributed."""
        self._logged_garbage.pop(key, None)
        self._spec_versions.pop(key, None)
        old = self._pods.pop(key, None)
        if old is None:
            return False
        self._apply(old, -1)
        return True

    # --- queries -------------------------------------------------------------------------------

    def node(self, name: str) -> NodeState | None:
        return self._nodes.get(name)

    def nodes(self) -> Iterator[NodeState]:
        return iter(self._nodes.values())

    def advertisers(self, resource: str) -> Mapping[str, NodeState]:
        """The existing nodes whose allocatable names ``resource``, by name."""
        return self._advertisers.get(resource, {})

    def requested_on(self, resource: str) -> Mapping[str, int]:
        """Summed pod requests of ``resource`` per node name (nodes may not exist; look them up)."""
        return self._requested.get(resource, {})

    def requested(self, node: str, resource: str) -> int:
        return self._requested.get(resource, {}).get(node, 0)

    def snapshot(self) -> Snapshot:
        return Snapshot(
            nodes=dict(self._nodes),
            requested={resource: dict(by_node) for resource, by_node in self._requested.items()},
            pods=dict(self._pods),
        )

    def tracked_pods(self) -> int:
        """Pods with a contribution (the only ones that cost memory)."""
        return len(self._pods)

    def pod_keys(self) -> KeysView[PodKey]:
        """The keys of the pods with a contribution (a live view: copy it before changing pods)."""
        return self._pods.keys()

    # --- internals -----------------------------------------------------------------------------

    def _node_state(self, node: Mapping[str, Any]) -> NodeState | None:
        name = (node.get("metadata") or {}).get("name")
        if not name or not isinstance(name, str):
            return None
        allocatable: dict[str, int] = {}
        listed = (node.get("status") or {}).get("allocatable") or {}
        for resource, text in listed.items() if isinstance(listed, dict | Mapping) else ():
            if self.compute and resource in (CPU, MEMORY):
                exact = parse_exact(text)
                scale = 1000 if resource == CPU else 1
                allocatable[resource] = math.ceil(exact * scale) if exact is not None else 0
                continue
            if not is_extended_resource(resource):
                continue
            value = parse_value(text)
            if value is None:
                self._log_garbage(_node_key(name), _node_key(name), resource, text)
            allocatable[resource] = value or 0
        return NodeState(name, is_ready(node), is_cordoned(node), blocking_taints(node), allocatable)

    def _contribution(self, pod: Mapping[str, Any], key: PodKey, node: str) -> Contribution | None:
        requests = extended_requests(pod)
        if requests.garbage:
            metadata = pod.get("metadata") or {}
            label = f"Pod {metadata.get('namespace')}/{metadata.get('name')}"
            for resource, text in requests.garbage:
                self._log_garbage(key, label, resource, text)
        amounts = requests.amounts
        if self.compute:
            cpu, memory = compute_requests(pod)
            amounts = {**amounts, **{name: n for name, n in ((CPU, cpu), (MEMORY, memory)) if n}}
        if not amounts:
            return None
        pairs = tuple(sorted(amounts.items()))
        shared = self._amounts.get(pairs)
        if shared is None:
            if len(self._amounts) >= AMOUNTS_MEMO_LIMIT:
                self._amounts.clear()
            shared = self._amounts[pairs] = pairs
        return node, shared

    def _apply(self, contribution: Contribution, sign: int) -> None:
        node, amounts = contribution
        for resource, amount in amounts:
            by_node = self._requested.setdefault(resource, {})
            total = by_node.get(node, 0) + sign * amount
            if total:
                by_node[node] = total
            else:
                del by_node[node]
                if not by_node:
                    del self._requested[resource]

    def _unadvertise(self, resource: str, name: str) -> None:
        nodes = self._advertisers.get(resource)
        if nodes is not None:
            nodes.pop(name, None)
            if not nodes:
                del self._advertisers[resource]

    def _log_garbage(self, key: Hashable, label: str, resource: str, text: object) -> None:
        seen = self._logged_garbage.setdefault(key, set())
        mark = f"{resource}={text!r}"
        if mark not in seen:
            seen.add(mark)
            log.warning("%s: %s is %r, not a non-negative quantity; counting 0", label, resource, text)


def spec_version(pod: Mapping[str, Any]) -> SpecVersion | None:
    """What names one version of a pod's spec: its UID and ``metadata.generation``, which the API
    server sets on every pod and raises on every change of its spec, resizes included (KEP-5067:
    Kubernetes 1.33 on, by default since 1.34). ``None`` without either (an older server, a
    hand-made object): the spec is then read on every event."""
    metadata = pod.get("metadata")
    if not isinstance(metadata, dict | Mapping):
        return None
    generation = metadata.get("generation")
    if type(generation) is not int or generation <= 0:
        return None
    uid = metadata.get("uid")
    return (uid, generation) if uid else None


def pod_key(pod: Mapping[str, Any]) -> str:
    """A pod's identity across its events: the UID (a recreated pod of the same name is another
    pod), else namespace/name."""
    metadata = pod.get("metadata") or {}
    uid = metadata.get("uid")
    if uid:
        return str(uid)
    return f"{metadata.get('namespace') or ''}/{metadata.get('name') or ''}"


def _node_key(name: str) -> str:
    """A node's key among logged objects; "Node/" cannot collide with a pod's UID or namespace/name."""
    return f"Node/{name}"
