"""Mint, bind and release addresses through the API (glue): the API server is the lock.

Decides how each address operation maps to API calls so that no address is ever handed out twice:

* mint: create the ``IPAddressAllocation`` named by the address. 201 means it is ours. 409 means the
  name is taken: read it, and if its holder UID is ours (a crash between create and status write,
  or a stale cache) it is ours after all; otherwise the caller passes again with it counted as taken.
* bind a claim: record the attachment in the claim's ``status.attachment`` with a JSON patch that
  first tests the claim's resourceVersion, so of two attachments racing for one claim exactly one
  write succeeds (optimistic concurrency); the loser sees ``ClaimInUse`` on its next pass.
* release: delete an allocation with a UID precondition (never a newer allocation of the same
  address), and clear a claim's use only if it still names this attachment (test on the UID).
* repair: delete allocations whose holder is gone or has another UID, after a grace period, and
  only after asking the API (not the cache) that the holder is really gone.

Does not decide which address, or whether to mint: the pure ``reconcile`` and ``claims`` plans do.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from operators.endpointattachment.constants import (
    API_VERSION,
    ENDPOINT_ATTACHMENT_KIND,
    ENDPOINT_ATTACHMENT_PLURAL,
    IP_ADDRESS_ALLOCATION_PLURAL,
    IP_ADDRESS_CLAIM_KIND,
    IP_ADDRESS_CLAIM_PLURAL,
)
from shared.kube import ApiError, Kube, Obj, Resource

log = logging.getLogger(__name__)

ALLOCATIONS = Resource(API_VERSION, IP_ADDRESS_ALLOCATION_PLURAL, namespaced=False)
CLAIMS = Resource(API_VERSION, IP_ADDRESS_CLAIM_PLURAL)
ATTACHMENTS = Resource(API_VERSION, ENDPOINT_ATTACHMENT_PLURAL)
HOLDER_RESOURCES = {ENDPOINT_ATTACHMENT_KIND: ATTACHMENTS, IP_ADDRESS_CLAIM_KIND: CLAIMS}


class Minted(StrEnum):
    OURS = "ours"  # created now, or found already held by our UID
    TAKEN = "taken"  # held by someone else: try another candidate


async def mint(kube: Kube, allocation: Mapping[str, Any]) -> tuple[Minted, Obj]:
    """Create the allocation; returns whether the address is ours and the stored allocation."""
    name = allocation["metadata"]["name"]
    try:
        return Minted.OURS, await kube.create(ALLOCATIONS.path(), allocation)
    except ApiError as error:
        if error.status != 409:
            raise
    existing = await kube.get(ALLOCATIONS.path(name=name))
    if existing is None:  # released between our create and our read: the next pass tries again
        return Minted.TAKEN, {}
    ours = existing.get("spec", {}).get("holder", {}).get("uid") == allocation["spec"]["holder"]["uid"]
    return (Minted.OURS if ours else Minted.TAKEN), existing


async def release(kube: Kube, allocation: Mapping[str, Any]) -> None:
    metadata = allocation["metadata"]
    await kube.delete(ALLOCATIONS.path(name=metadata["name"]), uid=metadata["uid"])


async def bind_claim(kube: Kube, claim: Mapping[str, Any], user: Mapping[str, str]) -> Obj | None:
    """Record ``user`` on the claim; None when the claim changed under us (pass again)."""
    metadata = claim["metadata"]
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": metadata["resourceVersion"]},
        {"op": "add", "path": "/status/attachment", "value": dict(user)},
    ]
    if not claim.get("status"):
        ops.insert(1, {"op": "add", "path": "/status", "value": {}})
    try:
        return await kube.patch(CLAIMS.path(metadata["namespace"], metadata["name"]) + "/status", ops)
    except ApiError as error:
        if error.status in (409, 422, 404):
            return None
        raise


async def unbind_claim(kube: Kube, claim: Mapping[str, Any], user_uid: str) -> Obj | None:
    """Clear the claim's use if it is still ours; None when it no longer names us."""
    metadata = claim["metadata"]
    ops = [
        {"op": "test", "path": "/status/attachment/uid", "value": user_uid},
        {"op": "remove", "path": "/status/attachment"},
    ]
    try:
        return await kube.patch(CLAIMS.path(metadata["namespace"], metadata["name"]) + "/status", ops)
    except ApiError as error:
        if error.status in (404, 422):
            return None
        raise


async def holder_is_gone(kube: Kube, allocation: Mapping[str, Any]) -> bool:
    """Ask the API, not a cache: is the allocation's holder (with that UID) gone?"""
    holder = allocation.get("spec", {}).get("holder", {})
    resource = HOLDER_RESOURCES.get(str(holder.get("kind")))
    if resource is None:
        return False  # a holder kind we do not know: never ours to judge
    current = await kube.get(resource.path(holder.get("namespace"), holder.get("name")))
    return current is None or current.get("metadata", {}).get("uid") != holder.get("uid")
