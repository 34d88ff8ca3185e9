"""hack.waterfall: OTLP JSON from a trace store into spans, and one object's story drawn as text."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from hack.waterfall import (
    BAR,
    LINK_PREVIOUS,
    LINK_WRITTEN_BY,
    TRACK,
    Link,
    Span,
    passes_of,
    render_waterfall,
    spans_from_otlp,
    story,
)

ATTACHMENT_UID = "uid-attachment"
CLAIM_UID = "uid-claim"
SECOND = 1_000_000_000


def pass_span(
    trace: str,
    uid: str,
    start: float,
    took: float,
    *,
    kind: str = "EndpointAttachment",
    name: str = "bound",
    outcome: str = "changed",
    reasons: Sequence[str] = (),
    links: Sequence[Link] = (),
    error: str = "",
) -> Span:
    return Span(
        trace_id=trace * 32,
        span_id=trace * 16,
        parent_span_id="",
        name=f"reconcile {kind}",
        service="cozystack-endpointattachment-operator",
        start_ns=int(start * SECOND),
        end_ns=int((start + took) * SECOND),
        attributes={
            "k8s.object.kind": kind,
            "k8s.object.namespace": "tenant",
            "k8s.object.name": name,
            "k8s.object.uid": uid,
            "outcome": outcome,
            "condition.reasons": list(reasons),
        },
        links=tuple(links),
        error=error,
    )


def link_to(span: Span, kind: str) -> Link:
    return Link(span.trace_id, span.span_id, kind)


def write(parent: Span, name: str, at: float) -> Span:
    return Span(
        parent.trace_id, "f" * 16, parent.span_id, name, parent.service, int(at * SECOND), int(at * SECOND)
    )


CLAIM_PASS = pass_span("c", CLAIM_UID, 0.0, 0.05, kind="IPAddressClaim", name="reserved", reasons=["Bound"])
FIRST = pass_span(
    "1", ATTACHMENT_UID, 1.0, 0.02, reasons=["AddressPending"], links=[link_to(CLAIM_PASS, LINK_WRITTEN_BY)]
)
SECOND_PASS = pass_span(
    "2", ATTACHMENT_UID, 3.0, 0.01, reasons=["Published"], links=[link_to(FIRST, LINK_PREVIOUS)]
)
UNRELATED = pass_span("9", "uid-other", 2.0, 0.01, name="other")
SPANS = [SECOND_PASS, UNRELATED, FIRST, CLAIM_PASS, write(FIRST, "POST services", 1.01)]


def lines_with(text: str, needle: str) -> list[str]:
    return [line for line in text.splitlines() if needle in line]


RENDERED = render_waterfall(SPANS, ATTACHMENT_UID, width=20)

# One row per invariant of the drawing: (what it shows, check on the text).
DRAWING: list[tuple[str, Callable[[str], bool]]] = [
    (
        "a header naming the object and counting its passes",
        lambda t: "EndpointAttachment tenant/bound" in t and "2 passes" in t,
    ),
    (
        "the writer's pass as a row of its own, marked",
        lambda t: any(
            row.startswith("⇠") and "IPAddressClaim tenant/reserved" in row for row in t.splitlines()
        ),
    ),
    (
        "each pass's offset from the first row",
        lambda t: bool(lines_with(t, "+1.000s")) and bool(lines_with(t, "+3.000s")),
    ),
    ("each pass's outcome and reasons", lambda t: bool(lines_with(t, "changed  Published"))),
    ("the pass's API writes", lambda t: bool(lines_with(t, "writes: POST services"))),
    (
        "the link to the previous pass, by row",
        lambda t: bool(lines_with(t, "← follows the previous pass #2")),
    ),
    (
        "the link to the writer, by row and object",
        lambda t: bool(lines_with(t, "read what was written by #1 (IPAddressClaim tenant/reserved)")),
    ),
    ("no other object's pass", lambda t: "other" not in t.replace("other objects", "")),
]


@pytest.mark.parametrize(("shows", "check"), DRAWING, ids=[row[0] for row in DRAWING])
def test_the_waterfall_shows(shows: str, check: Callable[[str], bool]) -> None:
    assert check(RENDERED), f"{shows}:\n{RENDERED}"


def test_bars_share_one_time_axis() -> None:
    rows = [line for line in RENDERED.splitlines() if BAR in line]
    assert len(rows) == 3
    starts = [row.index(BAR) for row in rows]
    assert starts == sorted(starts), "later passes start further right"
    assert starts[0] < starts[-1]
    bars = {re.search(f"[{BAR}{TRACK}]+", row) for row in rows}
    assert len({len(bar.group()) for bar in bars if bar}) == 1, "every bar is the same width"


def test_a_link_to_a_span_the_store_does_not_have_is_shown_as_such() -> None:
    lost = pass_span("e" * 1, ATTACHMENT_UID, 5.0, 0.01, links=[Link("d" * 32, "d" * 16, LINK_PREVIOUS)])
    assert "(not in the store)" in render_waterfall([lost], ATTACHMENT_UID)


def test_an_error_pass_says_why() -> None:
    failed = pass_span("e", ATTACHMENT_UID, 0.0, 0.5, outcome="error", error="409 Conflict")
    drawn = render_waterfall([failed], ATTACHMENT_UID)
    assert "error: 409 Conflict" in drawn


def test_no_pass_no_waterfall() -> None:
    assert "no pass" in render_waterfall([UNRELATED], ATTACHMENT_UID)


def test_story_is_the_objects_passes_and_their_writers_in_order() -> None:
    assert story(SPANS, ATTACHMENT_UID) == [CLAIM_PASS, FIRST, SECOND_PASS]
    assert passes_of(SPANS, ATTACHMENT_UID) == [FIRST, SECOND_PASS]


def otlp_document(trace_id: Any, span_id: Any) -> dict[str, Any]:
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "svc"}}]},
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": trace_id,
                                "spanId": span_id,
                                "name": "reconcile GPUClass",
                                "startTimeUnixNano": "1000",
                                "endTimeUnixNano": "3000",
                                "attributes": [
                                    {"key": "k8s.object.generation", "value": {"intValue": "3"}},
                                    {
                                        "key": "condition.reasons",
                                        "value": {"arrayValue": {"values": [{"stringValue": "Ready"}]}},
                                    },
                                ],
                                "links": [
                                    {
                                        "traceId": trace_id,
                                        "spanId": span_id,
                                        "attributes": [
                                            {"key": "link.kind", "value": {"stringValue": "previous_pass"}}
                                        ],
                                    }
                                ],
                                "status": {"code": 2, "message": "boom"},
                            }
                        ]
                    }
                ],
            }
        ]
    }


TRACE_HEX, SPAN_HEX = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
ID_FORMS = [
    ("hex, as OTLP/JSON says", TRACE_HEX, SPAN_HEX),
    ("upper-case hex", TRACE_HEX.upper(), SPAN_HEX.upper()),
    (
        "base64, as protobuf's JSON mapping says",
        base64.b64encode(bytes.fromhex(TRACE_HEX)).decode(),
        base64.b64encode(bytes.fromhex(SPAN_HEX)).decode(),
    ),
]


@pytest.mark.parametrize(("form", "trace_id", "span_id"), ID_FORMS, ids=[row[0] for row in ID_FORMS])
def test_spans_from_otlp_reads_ids_attributes_links_and_status(
    form: str, trace_id: str, span_id: str
) -> None:
    (span,) = spans_from_otlp(otlp_document(trace_id, span_id))
    assert (span.trace_id, span.span_id, span.parent_span_id) == (TRACE_HEX, SPAN_HEX, "")
    assert span.service == "svc"
    assert (span.start_ns, span.duration_ns) == (1000, 2000)
    assert span.attributes == {"k8s.object.generation": 3, "condition.reasons": ["Ready"]}
    assert span.links == (Link(TRACE_HEX, SPAN_HEX, LINK_PREVIOUS),)
    assert span.error == "boom"
    assert span.is_pass
