"""Repair of the address substrate: which IPAddressAllocations are orphans, and how full a class is.

Decides:
- ``orphans``: an allocation is an orphan when the UID of its ``spec.holder`` belongs to no live holder
  (attachment or claim the caller observed), or belongs to a live object whose kind, namespace or name
  differ from the ones the allocation names (should not happen; a UID is never reused, so the record is
  wrong and nothing can rely on it), or when it names no holder UID at all. An orphan is reported only
  once it is older than ``grace`` by its ``creationTimestamp``: a holder's finalizer releases its own
  allocation, so repair only cleans up after crashes, and the grace covers a mint whose holder is not
  in the caller's listing yet. An allocation that cannot be dated (timestamp missing, unparsable or
  without a timezone) counts as new and is never reported. One without a name or UID is never reported
  either: the glue deletes with a UID precondition, so a lock re-created under the same name by a live
  minter between listing and deletion is never taken away.
- ``class_usage``: an IPAddressClass's ``status.capacity`` (the candidates ``addresses.pool_of`` can
  ever mint, None when the class is invalid, by the same rule as the ``ClassInvalid`` reason) and
  ``status.allocated`` (allocations whose ``spec.className`` is the class, orphans included: they hold
  an address until repaired).
- ``class_status``: the whole status of a class: those two counts and its ``Ready`` condition, True
  (``Available``: free addresses left) or False with why not: ``ClassInvalid`` (a pool that cannot be
  read, an unknown provider; the message says which), ``PoolEmpty`` (no cidrs and no ranges, or every
  address excluded), ``PoolExhausted`` (every address allocated).

Does not: list or delete anything, or read the clock (``now`` is passed in). The caller must pass
complete listings: a partial list of holders would make live allocations look orphaned. Listing the
allocations before the holders means every holder of a listed allocation already existed when the
holders were listed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from operators.endpointattachment.addresses import InvalidPool, pool_of
from operators.endpointattachment.constants import (
    COND_READY,
    REASON_AVAILABLE,
    REASON_CLASS_INVALID,
    REASON_POOL_EMPTY,
    REASON_POOL_EXHAUSTED,
)
from operators.endpointattachment.render import InvalidClassSettings, class_settings
from shared.conditions import FALSE, TRUE, Condition

# A live holder as observed: (kind, namespace, name), keyed by its UID.
HolderIdentity = tuple[str, str, str]


@dataclass(frozen=True)
class Orphan:
    """An allocation the glue may delete, with a UID precondition, and why (for the log)."""

    name: str
    uid: str
    reason: str


def orphans(
    allocations: Iterable[Mapping[str, Any]],
    holders_by_uid: Mapping[str, HolderIdentity],
    now: datetime,
    grace: timedelta,
) -> tuple[Orphan, ...]:
    """The allocations whose holder is gone (or is not who they say), older than ``grace``, by name.

    ``now`` must carry a timezone (Kubernetes timestamps are UTC); raises ValueError otherwise.
    """
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    found: list[Orphan] = []
    for allocation in allocations:
        metadata = _mapping(allocation.get("metadata"))
        name, uid = metadata.get("name"), metadata.get("uid")
        if not isinstance(name, str) or not name or not isinstance(uid, str) or not uid:
            continue  # cannot be deleted safely
        reason = _orphan_reason(allocation, holders_by_uid)
        if reason is None:
            continue
        created = _created_at(metadata)
        if created is None or now - created <= grace:
            continue  # undatable counts as new; new may belong to a holder not listed yet
        found.append(Orphan(name=name, uid=uid, reason=reason))
    return tuple(sorted(found, key=lambda orphan: orphan.name))


def class_usage(
    class_obj: Mapping[str, Any], allocations: Iterable[Mapping[str, Any]]
) -> tuple[int | None, int]:
    """(capacity, allocated) for an IPAddressClass's status; capacity is None when the class is invalid."""
    class_name = _mapping(class_obj.get("metadata")).get("name")
    try:
        capacity: int | None = pool_of(_mapping(class_obj.get("spec"))).capacity
        class_settings(class_obj)
    except (InvalidPool, InvalidClassSettings):
        capacity = None
    allocated = sum(
        1
        for allocation in allocations
        if class_name and _mapping(allocation.get("spec")).get("className") == class_name
    )
    return capacity, allocated


def class_status(
    class_obj: Mapping[str, Any], allocations: Iterable[Mapping[str, Any]], capacity_limit: int
) -> tuple[dict[str, Any], tuple[Condition, ...]]:
    """The status fields (``capacity`` saturated at ``capacity_limit``, None when invalid: removed;
    ``allocated``) and the Ready condition of an IPAddressClass."""
    capacity, allocated = class_usage(class_obj, allocations)
    fields = {"capacity": None if capacity is None else min(capacity, capacity_limit), "allocated": allocated}
    name = _mapping(class_obj.get("metadata")).get("name")
    spec = _mapping(class_obj.get("spec"))
    if capacity is None:
        try:
            pool_of(spec)
            class_settings(class_obj)
            why = "it cannot be read"
        except (InvalidPool, InvalidClassSettings) as error:
            why = str(error)
        ready = Condition(COND_READY, FALSE, REASON_CLASS_INVALID, f"IPAddressClass {name}: {why}")
    elif capacity == 0:
        why = "every address of the pool is excluded"
        if not (spec.get("cidrs") or spec.get("ranges")):
            why = "it names no cidrs and no ranges"
        ready = Condition(COND_READY, FALSE, REASON_POOL_EMPTY, f"no address to hand out: {why}")
    elif allocated >= capacity:
        message = f"all {capacity} addresses are allocated"
        ready = Condition(COND_READY, FALSE, REASON_POOL_EXHAUSTED, message)
    else:
        message = f"{capacity - allocated} of {capacity} addresses free"
        ready = Condition(COND_READY, TRUE, REASON_AVAILABLE, message)
    return fields, (ready,)


def _orphan_reason(allocation: Mapping[str, Any], holders_by_uid: Mapping[str, HolderIdentity]) -> str | None:
    """Why the allocation's holder is not live, or None when it is."""
    spec = _mapping(allocation.get("spec"))
    address = spec.get("address") or "?"
    holder = _mapping(spec.get("holder"))
    uid = holder.get("uid")
    if not isinstance(uid, str) or not uid:
        return f"allocation of {address} names no holder UID"
    recorded: HolderIdentity = (
        str(holder.get("kind") or ""),
        str(holder.get("namespace") or ""),
        str(holder.get("name") or ""),
    )
    live = holders_by_uid.get(uid)
    if live is None:
        return f"holder {_describe(recorded)} (uid {uid}) of {address} is gone"
    if tuple(live) != recorded:
        return f"holder uid {uid} of {address} is {_describe(live)}, not {_describe(recorded)}"
    return None


def _created_at(metadata: Mapping[str, Any]) -> datetime | None:
    """The creation time, or None when it cannot be read as a timezone-aware moment."""
    text = metadata.get("creationTimestamp")
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def _describe(identity: HolderIdentity) -> str:
    kind, namespace, name = identity
    return f"{kind} {namespace}/{name}"


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
