"""The Events an attachment's passes record, decided as data: which, of what type, action and note.

Decides:

* **what the operator did**, with Cozystack's controller's reasons: ``ClaimMinted`` (from the API's
  answer to the mint, which names the claim), ``Rendered`` (the Service created: its name, the
  endpoint, the claim), ``Withdrawn`` (the Service deleted while the attachment stays, with why: the
  plan's Provisioned message). Each comes from one write, so once per write.
* **transitions** (``transitions``): Provisioned became True (``Provisioned``, Normal), or became
  False for a reason a tenant or hoster must act on (``ClaimInUse``, ``FamilyConflict``, the VM
  datapath refusing: ``DatapathContractUnavailable``, ``BackendAlreadyDelegated``,
  ``MultipleBackends``; the API refusing the Service: ``RenderFailed``; ``AddressNotAnnounced``;
  Warning), named as the condition's reason, the note its message. A transition is the stored
  status's Provisioned reason against the plan's: the glue asks only when it writes the status, so
  a pass that writes the same status (a steady state) or holds it back records nothing.

Cozystack's controller records ``ClaimMinted``, ``Rendered`` and ``Withdrawn`` only, through the
core/v1 recorder; the condition transitions are ours (a hoster reads ``kubectl describe``, and a
refused claim or datapath is what they look for there).

Does not: post anything, aggregate repeats or bound them (``shared.events.Recorder``: a repeat of
the same reason and note within its window patches the first Event's series, and a flapping
attachment spends a bounded budget), or decide any condition (``reconcile``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from operators.endpointattachment.api import CLAIM_ANNOTATION, spec_of
from operators.endpointattachment.reasons import (
    CONDITION_PROVISIONED,
    EVENT_ADDRESS_NOT_ANNOUNCED,
    EVENT_BACKEND_ALREADY_DELEGATED,
    EVENT_CLAIM_IN_USE,
    EVENT_CLAIM_MINTED,
    EVENT_DATAPATH_CONTRACT_UNAVAILABLE,
    EVENT_FAMILY_CONFLICT,
    EVENT_MULTIPLE_BACKENDS,
    EVENT_NORMAL,
    EVENT_PROVISIONED,
    EVENT_RENDER_FAILED,
    EVENT_RENDERED,
    EVENT_WARNING,
    EVENT_WITHDRAWN,
)
from shared.conditions import Condition

# The Event's action (what the operator did or was refused), by reason.
ACTION_MINT: Final = "Mint"
ACTION_RENDER: Final = "Render"
ACTION_WITHDRAW: Final = "Withdraw"
ACTION_PROVISION: Final = "Provision"
ACTION_CLAIM: Final = "Claim"
ACTION_DELEGATE: Final = "Delegate"
ACTION_ANNOUNCE: Final = "Announce"

# Provisioned reasons whose arrival is an Event: (type, action).
TRANSITIONS: Final[Mapping[str, tuple[str, str]]] = {
    EVENT_PROVISIONED: (EVENT_NORMAL, ACTION_PROVISION),
    EVENT_CLAIM_IN_USE: (EVENT_WARNING, ACTION_CLAIM),
    EVENT_FAMILY_CONFLICT: (EVENT_WARNING, ACTION_CLAIM),
    EVENT_DATAPATH_CONTRACT_UNAVAILABLE: (EVENT_WARNING, ACTION_DELEGATE),
    EVENT_BACKEND_ALREADY_DELEGATED: (EVENT_WARNING, ACTION_DELEGATE),
    EVENT_MULTIPLE_BACKENDS: (EVENT_WARNING, ACTION_DELEGATE),
    EVENT_RENDER_FAILED: (EVENT_WARNING, ACTION_RENDER),
    EVENT_ADDRESS_NOT_ANNOUNCED: (EVENT_WARNING, ACTION_ANNOUNCE),
}


@dataclass(frozen=True)
class EventNote:
    """One Event to record about the attachment."""

    type: str  # Normal | Warning
    reason: str
    action: str
    note: str


def _name(obj: Mapping[str, Any] | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("name") or "")


def minted(claim: Mapping[str, Any]) -> EventNote:
    """The claim the API created for a mint (its answer names it)."""
    class_name = (claim.get("spec") or {}).get("className")
    of_class = f" of class {class_name}" if class_name else " of the default class"
    return EventNote(
        EVENT_NORMAL, EVENT_CLAIM_MINTED, ACTION_MINT, f"minted IPAddressClaim {_name(claim)}{of_class}"
    )


def rendered(service: Mapping[str, Any], attachment: Mapping[str, Any]) -> EventNote:
    """The Service the API created for the attachment: its name, the endpoint it mirrors, the claim."""
    claim = (((service.get("metadata") or {}).get("annotations")) or {}).get(CLAIM_ANNOTATION, "")
    return EventNote(
        EVENT_NORMAL,
        EVENT_RENDERED,
        ACTION_RENDER,
        f"rendered Service {_name(service)} for endpoint {spec_of(attachment).endpoint} with "
        f"IPAddressClaim {claim}",
    )


def withdrawn(service: Mapping[str, Any], provisioned: Condition | None) -> EventNote:
    """The Service deleted while the attachment stays, with the plan's Provisioned condition (why)."""
    why = f": {provisioned.reason}: {provisioned.message}" if provisioned is not None else ""
    return EventNote(
        EVENT_NORMAL, EVENT_WITHDRAWN, ACTION_WITHDRAW, f"withdrew Service {_name(service)}{why}"
    )


def _stored_reason(stored_status: Mapping[str, Any] | None) -> str | None:
    for condition in (stored_status or {}).get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == CONDITION_PROVISIONED:
            return str(condition.get("reason") or "")
    return None


def transitions(
    stored_status: Mapping[str, Any] | None, provisioned: Condition | None
) -> tuple[EventNote, ...]:
    """The Event of the planned Provisioned condition when its reason is new to the stored status
    and one of ``TRANSITIONS``; nothing otherwise (a steady state, a reason no one acts on)."""
    if provisioned is None or provisioned.reason == _stored_reason(stored_status):
        return ()
    found = TRANSITIONS.get(provisioned.reason)
    if found is None:
        return ()
    type_, action = found
    return (EventNote(type_, provisioned.reason, action, provisioned.message),)
