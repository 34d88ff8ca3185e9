"""Events of attachments, decided by the pure ``events`` module: which Provisioned transitions are
Events (a table), and the notes of what the operator did. The glue: ``test_ea_events_glue``."""

from __future__ import annotations

from typing import Any

import pytest

from operators.endpointattachment.api import CLAIM_ANNOTATION
from operators.endpointattachment.events import (
    EventNote,
    minted,
    rendered,
    transitions,
    withdrawn,
)
from operators.endpointattachment.reasons import (
    CONDITION_PROVISIONED,
    REASON_ADDRESS_NOT_ANNOUNCED,
    REASON_BACKEND_ALREADY_DELEGATED,
    REASON_CLAIM_IN_USE,
    REASON_CLAIM_PENDING,
    REASON_DATAPATH_CONTRACT_UNAVAILABLE,
    REASON_ENDPOINT_DETACHED,
    REASON_MULTIPLE_BACKENDS,
    REASON_PROVISIONED,
    REASON_RENDER_FAILED,
    REASON_WAITING_FOR_ADDRESS,
)
from shared.conditions import FALSE, TRUE, Condition
from tests.ea_builders import (
    NAMESPACE,
    make_attachment,
    make_claim,
    make_service,
)

KEY = (NAMESPACE, "db-public")


def stored(reason: str | None) -> dict[str, Any] | None:
    if reason is None:
        return None
    return {"conditions": [{"type": CONDITION_PROVISIONED, "status": FALSE, "reason": reason}]}


def planned(reason: str, message: str = "why") -> Condition:
    return Condition(CONDITION_PROVISIONED, TRUE if reason == REASON_PROVISIONED else FALSE, reason, message)


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        (None, REASON_PROVISIONED, ("Normal", REASON_PROVISIONED, "Provision")),
        (REASON_WAITING_FOR_ADDRESS, REASON_PROVISIONED, ("Normal", REASON_PROVISIONED, "Provision")),
        (REASON_PROVISIONED, REASON_PROVISIONED, None),
        (None, REASON_CLAIM_IN_USE, ("Warning", REASON_CLAIM_IN_USE, "Claim")),
        (REASON_PROVISIONED, REASON_CLAIM_IN_USE, ("Warning", REASON_CLAIM_IN_USE, "Claim")),
        (REASON_CLAIM_IN_USE, REASON_CLAIM_IN_USE, None),
        (
            None,
            REASON_DATAPATH_CONTRACT_UNAVAILABLE,
            ("Warning", REASON_DATAPATH_CONTRACT_UNAVAILABLE, "Delegate"),
        ),
        (None, REASON_BACKEND_ALREADY_DELEGATED, ("Warning", REASON_BACKEND_ALREADY_DELEGATED, "Delegate")),
        (REASON_PROVISIONED, REASON_MULTIPLE_BACKENDS, ("Warning", REASON_MULTIPLE_BACKENDS, "Delegate")),
        (REASON_WAITING_FOR_ADDRESS, REASON_RENDER_FAILED, ("Warning", REASON_RENDER_FAILED, "Render")),
        (
            REASON_WAITING_FOR_ADDRESS,
            REASON_ADDRESS_NOT_ANNOUNCED,
            ("Warning", REASON_ADDRESS_NOT_ANNOUNCED, "Announce"),
        ),
        # Reasons no one acts on: the condition says them, no Event.
        (None, REASON_CLAIM_PENDING, None),
        (REASON_CLAIM_PENDING, REASON_WAITING_FOR_ADDRESS, None),
        (REASON_PROVISIONED, REASON_ENDPOINT_DETACHED, None),
    ],
)
def test_transitions(before: str | None, after: str, expected: tuple[str, str, str] | None) -> None:
    notes = transitions(stored(before), planned(after, "the condition's message"))
    if expected is None:
        assert notes == ()
    else:
        assert notes == (EventNote(*expected, "the condition's message"),)


def test_no_planned_condition_no_event() -> None:
    assert transitions(stored(REASON_PROVISIONED), None) == ()


def test_the_notes_of_what_the_operator_did() -> None:
    attachment = make_attachment(endpoint="postgres-db-ro")
    claim = make_claim("db-public-k2m9p", class_name="public")
    assert minted(claim) == EventNote(
        "Normal", "ClaimMinted", "Mint", "minted IPAddressClaim db-public-k2m9p of class public"
    )
    assert minted(make_claim("db-public-k2m9p", class_name=None)).note.endswith("of the default class")
    service = make_service("db-public-x7ktq", annotations={CLAIM_ANNOTATION: "db-public-k2m9p"})
    assert rendered(service, attachment) == EventNote(
        "Normal",
        "Rendered",
        "Render",
        "rendered Service db-public-x7ktq for endpoint postgres-db-ro with IPAddressClaim db-public-k2m9p",
    )
    gone = planned(REASON_ENDPOINT_DETACHED, "Service postgres-db-ro not found")
    assert withdrawn(service, gone) == EventNote(
        "Normal",
        "Withdrawn",
        "Withdraw",
        "withdrew Service db-public-x7ktq: EndpointDetached: Service postgres-db-ro not found",
    )
