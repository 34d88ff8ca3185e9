"""Mint, bind and release addresses through the API (glue): the API server is the lock.

Decides: how each address operation maps to API calls so that no address is ever handed out twice:

* mint: create the ``IPAddressAllocation`` named by the address. 201 means it is ours. 409 means the
  name is taken: read it, and if its holder UID is ours (a crash between create and status write,
  or a stale cache) it is ours after all; otherwise the caller passes again with it counted as taken
  (what was read goes into the cache, so the next round of the pass sees it taken).
* bind a claim: record the attachment in the claim's ``status.attachment`` with a JSON patch that
  first tests the claim's resourceVersion, so of two attachments racing for one claim exactly one
  write succeeds (optimistic concurrency); the loser's pass is a ``Conflict``, run again once the
  caches caught up, and sees ``ClaimInUse``.
* release: delete an allocation with a UID precondition (never a newer allocation of the same
  address), and clear a claim's use only if it still names this attachment (test on the UID).
* repair: delete allocations whose holder is gone or has another UID, after a grace period, and
  only after asking the API (not the cache) that the holder is really gone.

Every write goes through the runtime's ``Writer``: refused unless this replica leads, stamped with
the pass's traceparent, and its answer put into the cache at once (write-through). An allocation
carries no finalizer, so a successful delete is the end of it: it leaves the cache at once too.

Does not: decide which address, or whether to mint (the pure ``reconcile`` and ``claims`` plans do).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from operators.endpointattachment.constants import ENDPOINT_ATTACHMENT_KIND, IP_ADDRESS_CLAIM_KIND
from operators.endpointattachment.world import ALLOCATIONS, ATTACHMENTS, CLAIMS
from shared.conditions import JsonPatch
from shared.kube import ApiError, Obj
from shared.runtime.controller import Conflict
from shared.runtime.writes import Writer

log = logging.getLogger(__name__)

HOLDER_RESOURCES = {ENDPOINT_ATTACHMENT_KIND: ATTACHMENTS, IP_ADDRESS_CLAIM_KIND: CLAIMS}


class Minted(StrEnum):
    OURS = "ours"  # created now, or found already held by our UID
    TAKEN = "taken"  # held by someone else: try another candidate


async def mint(writer: Writer, allocation: Mapping[str, Any]) -> tuple[Minted, Obj]:
    """Create the allocation; returns whether the address is ours and the stored allocation."""
    name = allocation["metadata"]["name"]
    try:
        return Minted.OURS, await writer.create(ALLOCATIONS, allocation)
    except ApiError as error:
        if error.status != 409:
            raise
    existing = await writer.kube.get(ALLOCATIONS.path(name=name))
    if existing is None:  # released between our create and our read: the next pass tries again
        return Minted.TAKEN, {}
    writer.remember(ALLOCATIONS, existing)  # counted as taken from the next round on
    ours = existing.get("spec", {}).get("holder", {}).get("uid") == allocation["spec"]["holder"]["uid"]
    return (Minted.OURS if ours else Minted.TAKEN), existing


async def release(writer: Writer, allocation: Mapping[str, Any]) -> None:
    """Delete exactly this allocation (UID precondition) and drop it from the cache."""
    await writer.delete(ALLOCATIONS, allocation, forget=True)  # allocations carry no finalizer


async def bind_claim(writer: Writer, claim: Mapping[str, Any], user: Mapping[str, str]) -> Obj | None:
    """Record ``user`` on the claim, only if the claim is still the version we decided from; a claim
    changed under us is a ``Conflict``; None when the claim is gone."""
    ops: JsonPatch = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": claim["metadata"]["resourceVersion"]},
        {"op": "add", "path": "/status/attachment", "value": dict(user)},
    ]
    if not claim.get("status"):
        ops.insert(1, {"op": "add", "path": "/status", "value": {}})
    return await writer.patch_status(CLAIMS, claim, ops)


async def unbind_claim(writer: Writer, claim: Mapping[str, Any], user_uid: str) -> Obj | None:
    """Clear the claim's use if it is still ours; None when it no longer names us (or is gone)."""
    ops: JsonPatch = [
        {"op": "test", "path": "/status/attachment/uid", "value": user_uid},
        {"op": "remove", "path": "/status/attachment"},
    ]
    try:
        return await writer.patch_status(CLAIMS, claim, ops)
    except Conflict:
        return None  # another user, or another incarnation of the claim: nothing of ours to clear


async def holder_is_gone(writer: Writer, allocation: Mapping[str, Any]) -> bool:
    """Ask the API, not a cache: is the allocation's holder (with that UID) gone?"""
    holder = allocation.get("spec", {}).get("holder", {})
    resource = HOLDER_RESOURCES.get(str(holder.get("kind")))
    if resource is None:
        return False  # a holder kind we do not know: never ours to judge
    current = await writer.kube.get(resource.path(holder.get("namespace"), holder.get("name")))
    return current is None or current.get("metadata", {}).get("uid") != holder.get("uid")
