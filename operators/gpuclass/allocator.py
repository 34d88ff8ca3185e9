"""How many claims of ``k`` devices kube-scheduler's DRA allocator would grant on one node, one after another.

A model of the structured allocator of ``k8s.io/dynamic-resource-allocation`` v0.37 (its
``incubating`` implementation, the one kube-scheduler 1.37 runs with partitionable devices,
consumable capacity, admin access and device taints on), for the claims a VM's GPUs make: one
request of ``exactly`` ``k`` devices of one DeviceClass, no constraints, no tolerations, no capacity
requests. Read from ``structured/internal/incubating/allocator_incubating.go``
(``allocateOne``, ``allocateDevice``, ``checkAvailableCounters``) and ``consumable_capacity.go``
(``CmpRequestOverCapacity``, ``fillEmptyRequest``). Decides, given the node's candidates in the
allocator's order (``dra`` puts them there: pools by driver and name, slices by name, devices as
listed):

* one claim takes the **first** ``k`` distinct candidates, in that order, that can all be allocated
  together (the allocator searches depth first and backtracks, the next device of a request always
  after the last one taken); a candidate can be allocated while its counters allow it (the counters
  its pool's counter sets have left, less what the claim's own earlier devices took) and it has a
  share left;
* a device with ``allowMultipleAllocations`` is shared: each claim takes one share (each capacity's
  ``requestPolicy.default``, or the whole capacity), its counters are charged once, with the first
  share; ``Candidate.shares`` says how many shares are left;
* claims are granted until the next one cannot be; those that would start are what a node holds.

**Physical GPUs** (where the count is deliberately more right than the allocator): a driver may
publish one GPU as several devices that share no counter (NVIDIA's ``gpu`` and ``vfio`` device of a
GPU, the same PCI bus ID in ``Candidate.physical``). The allocator hands out either, but the driver
prepares only one of them: a claim granted a device whose GPU another claim already holds (a claim
seen before, ``held``, or one granted earlier in the count and not itself failed) would bind and
then fail to start. Such a claim is granted (it holds its devices as the scheduler's would) but not
counted. Devices drawing on a common counter set (MIG partitions of one GPU) are never in conflict:
the counters govern them.

The search is bounded (``SEARCH_BUDGET`` steps a claim): past it the claim counts as not granted,
so the count errs low, never high. Does not: read objects, decide which devices a class selects or
which are tainted or held (``dra`` does), or log.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from operators.gpuclass.quantity import Exact

# A counter set of a pool: (driver, pool, counter set name).
CounterSetId = tuple[str, str, str]
# At most this many devices tried for one claim, backtracking included: the count then errs low.
SEARCH_BUDGET: Final = 20_000
# At most this many claims counted on one node (a shared device may allow very many).
MAX_CLAIMS: Final = 4_096


@dataclass(frozen=True, slots=True)
class Candidate:
    """One device the class selects, available as far as the inventory knows."""

    consumes: tuple[tuple[CounterSetId, tuple[tuple[str, Exact], ...]], ...] = ()
    shares: int = 1  # claims it can still serve (1: a plain device)
    charged: bool = False  # a shared device in use: its counters are already taken
    physical: str = ""  # the physical GPU it is part of ("" when unknown)

    @property
    def counter_sets(self) -> frozenset[CounterSetId]:
        return frozenset(set_id for set_id, _ in self.consumes)


# Physical GPU -> the counter sets of each of its devices a claim holds (one entry a device).
Physical = Mapping[str, Sequence[frozenset[CounterSetId]]]
_NONE_HELD: Final[Physical] = {}


@dataclass(slots=True)
class _State:
    counters: dict[CounterSetId, dict[str, Exact]]
    shares: list[int]
    charged: list[bool]
    steps: int = 0


def claims_granted(
    candidates: Sequence[Candidate],
    counters: Mapping[CounterSetId, Mapping[str, Exact]],
    k: int,
    held: Physical = _NONE_HELD,
) -> int:
    """How many claims of ``k`` devices the allocator grants one after another from ``candidates``,
    given what each counter set has left, that would also start (``held``: the physical GPUs of
    devices claims hold already)."""
    return sum(grants(candidates, counters, k, held))


def grants(
    candidates: Sequence[Candidate],
    counters: Mapping[CounterSetId, Mapping[str, Exact]],
    k: int,
    held: Physical = _NONE_HELD,
) -> tuple[bool, ...]:
    """Every claim of ``k`` devices the allocator grants one after another, in that order: whether it
    would start. A claim that would not still holds its devices, and its pod the node's CPU and
    memory: what else fits a node is counted in this order."""
    if k < 1 or len(candidates) < k:
        return ()
    if all(_plain(c) for c in candidates):
        return (True,) * (len(candidates) // k)
    state = _State(
        {set_id: dict(left) for set_id, left in counters.items()},
        [c.shares for c in candidates],
        [c.charged for c in candidates],
    )
    physical = {gpu: list(sets) for gpu, sets in held.items()}
    granted: list[bool] = []
    while len(granted) < MAX_CLAIMS:
        state.steps = 0
        claim = _first(candidates, state, k, 0)
        if claim is None:
            break
        devices = [candidates[index] for index in claim]
        granted.append(_starts(devices, physical))
        if granted[-1]:
            for device in devices:
                if device.physical:
                    physical.setdefault(device.physical, []).append(device.counter_sets)
    return tuple(granted)


def _starts(devices: Sequence[Candidate], physical: Mapping[str, Sequence[frozenset[CounterSetId]]]) -> bool:
    """No device of the claim is of a GPU held through a device it shares no counter set with (nor
    two of its own devices)."""
    taken: dict[str, list[frozenset[CounterSetId]]] = {}
    for device in devices:
        if device.physical:
            sets = device.counter_sets
            others = [*physical.get(device.physical, ()), *taken.get(device.physical, ())]
            if not all(sets & other for other in others):
                return False
            taken.setdefault(device.physical, []).append(sets)
    return True


def _plain(candidate: Candidate) -> bool:
    return not candidate.consumes and candidate.shares == 1 and not candidate.physical


def _first(candidates: Sequence[Candidate], state: _State, k: int, start: int) -> list[int] | None:
    """Take the first ``k`` candidates from ``start`` on that fit together (left taken in ``state``)."""
    for index in range(start, len(candidates) - k + 1):
        state.steps += 1
        if state.steps > SEARCH_BUDGET:
            return None
        charged = _take(candidates[index], index, state)
        if charged is None:
            continue
        rest = [] if k == 1 else _first(candidates, state, k - 1, index + 1)
        if rest is not None:
            return [index, *rest]
        _give_back(candidates[index], index, state, charged)
    return None


def _take(candidate: Candidate, index: int, state: _State) -> bool | None:
    """Take one share of a candidate: None when it cannot be, else whether its counters were charged
    by this take (a shared device's first share charges them, later shares do not)."""
    if state.shares[index] < 1:
        return None
    charging = not state.charged[index] and bool(candidate.consumes)
    if charging:
        for set_id, amounts in candidate.consumes:
            left = state.counters.get(set_id)
            if left is None or any(left.get(name, 0) < amount for name, amount in amounts):
                return None
        for set_id, amounts in candidate.consumes:
            left = state.counters[set_id]
            for name, amount in amounts:
                left[name] = left.get(name, 0) - amount
        state.charged[index] = True
    state.shares[index] -= 1
    return charging


def _give_back(candidate: Candidate, index: int, state: _State, charged: bool) -> None:
    state.shares[index] += 1
    if charged:
        state.charged[index] = False
        for set_id, amounts in candidate.consumes:
            left = state.counters[set_id]
            for name, amount in amounts:
                left[name] += amount
