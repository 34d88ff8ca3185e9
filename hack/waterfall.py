"""One object's story, read back from a trace store, as a terminal waterfall.

Decides: how the spans a trace store returns (OTLP JSON, as Jaeger's v3 query API serves it) become
plain records (``spans_from_otlp``), which of them tell one object's story (its pass spans, plus the
passes over other objects that wrote what it read, found through its ``written_by`` links), and how
that story is drawn (``render_waterfall``): one row per pass with its time offset, a duration bar on a
shared time axis, its outcome and condition reasons, its API writes, and where each of its links
points (the previous pass, or the writer of what it read; a link to a span the store does not have
is shown as such).

Does not: talk to any server or read a clock (pure: the same spans always draw the same text).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

PASS_PREFIX: Final = "reconcile "
LINK_PREVIOUS: Final = "previous_pass"
LINK_WRITTEN_BY: Final = "written_by"
BAR: Final = "█"
TRACK: Final = "·"
DEFAULT_WIDTH: Final = 40


@dataclass(frozen=True)
class Link:
    trace_id: str
    span_id: str
    kind: str  # the link's ``link.kind`` attribute: previous_pass, written_by (or "")


@dataclass(frozen=True)
class Span:
    trace_id: str  # hex, 32 digits
    span_id: str  # hex, 16 digits
    parent_span_id: str  # "" for a trace's root
    name: str
    service: str
    start_ns: int
    end_ns: int
    attributes: Mapping[str, object] = field(default_factory=dict)
    links: tuple[Link, ...] = ()
    error: str = ""  # the status message of a span that ended in error

    @property
    def is_pass(self) -> bool:
        return self.name.startswith(PASS_PREFIX) and not self.parent_span_id

    @property
    def uid(self) -> str:
        return str(self.attributes.get("k8s.object.uid") or "")

    @property
    def object_label(self) -> str:
        kind = str(self.attributes.get("k8s.object.kind") or self.name.removeprefix(PASS_PREFIX))
        namespace = str(self.attributes.get("k8s.object.namespace") or "")
        name = str(self.attributes.get("k8s.object.name") or "")
        where = f"{namespace}/{name}" if namespace else name
        return f"{kind} {where}".strip()

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)


# --- OTLP JSON -> Span ---------------------------------------------------------------------------


def _hex_id(value: object, digits: int) -> str:
    """An OTLP JSON id: hex (the OTLP/JSON rule), or base64 (protobuf's JSON mapping of bytes)."""
    text = str(value or "")
    if not text:
        return ""
    if len(text) == digits and all(c in "0123456789abcdefABCDEF" for c in text):
        return text.lower()
    try:
        return base64.b64decode(text, validate=True).hex()
    except (binascii.Error, ValueError):
        return text.lower()


def _value(value: Mapping[str, Any]) -> object:
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "arrayValue" in value:
        return [_value(v) for v in (value["arrayValue"].get("values") or [])]
    return None


def _attributes(items: Iterable[Mapping[str, Any]] | None) -> dict[str, object]:
    return {str(a["key"]): _value(a.get("value") or {}) for a in items or []}


def spans_from_otlp(traces: Mapping[str, Any]) -> list[Span]:
    """Every span of an OTLP JSON ``TracesData`` (``{"resourceSpans": [...]}``)."""
    spans: list[Span] = []
    for resource_spans in traces.get("resourceSpans") or []:
        resource = _attributes((resource_spans.get("resource") or {}).get("attributes"))
        service = str(resource.get("service.name") or "")
        for scope_spans in resource_spans.get("scopeSpans") or []:
            for raw in scope_spans.get("spans") or []:
                links = tuple(
                    Link(
                        _hex_id(link.get("traceId"), 32),
                        _hex_id(link.get("spanId"), 16),
                        str(_attributes(link.get("attributes")).get("link.kind") or ""),
                    )
                    for link in raw.get("links") or []
                )
                status = raw.get("status") or {}
                error = (
                    str(status.get("message") or "error")
                    if status.get("code") in (2, "STATUS_CODE_ERROR")
                    else ""
                )
                spans.append(
                    Span(
                        trace_id=_hex_id(raw.get("traceId"), 32),
                        span_id=_hex_id(raw.get("spanId"), 16),
                        parent_span_id=_hex_id(raw.get("parentSpanId"), 16),
                        name=str(raw.get("name") or ""),
                        service=service,
                        start_ns=int(raw.get("startTimeUnixNano") or 0),
                        end_ns=int(raw.get("endTimeUnixNano") or 0),
                        attributes=_attributes(raw.get("attributes")),
                        links=links,
                        error=error,
                    )
                )
    return spans


# --- the story of one object ---------------------------------------------------------------------


def passes_of(spans: Iterable[Span], uid: str) -> list[Span]:
    """The pass spans over the object with this UID, in the order they started."""
    return sorted((s for s in spans if s.is_pass and s.uid == uid), key=lambda s: (s.start_ns, s.span_id))


def story(spans: Sequence[Span], uid: str) -> list[Span]:
    """The object's passes and the passes over other objects they link to as writers, in order."""
    by_id = {(s.trace_id, s.span_id): s for s in spans}
    own = passes_of(spans, uid)
    writers = {
        (link.trace_id, link.span_id)
        for p in own
        for link in p.links
        if link.kind == LINK_WRITTEN_BY and (link.trace_id, link.span_id) in by_id
    }
    rows = {(s.trace_id, s.span_id): s for s in own}
    for key in writers:
        writer = by_id[key]
        if writer.is_pass and writer.uid != uid:
            rows[key] = writer
    return sorted(rows.values(), key=lambda s: (s.start_ns, s.span_id))


def _duration(ns: int) -> str:
    if ns >= 1_000_000_000:
        return f"{ns / 1e9:.2f}s"
    return f"{ns / 1e6:.1f}ms"


def _bar(start: int, duration: int, origin: int, total: int, width: int) -> str:
    first = min(width - 1, (start - origin) * width // total) if total else 0
    length = max(1, min(width - first, -(-duration * width // total) if total else 1))
    return TRACK * first + BAR * length + TRACK * (width - first - length)


def render_waterfall(spans: Sequence[Span], uid: str, width: int = DEFAULT_WIDTH) -> str:
    """The story of the object with ``uid`` as text: one row per pass (its own, and the passes over
    other objects that wrote what it read, marked ``⇠``), each with its offset from the first row,
    a bar on the shared time axis, its duration, outcome and reasons, its writes, and its links."""
    rows = story(spans, uid)
    own = [r for r in rows if r.uid == uid]
    if not own:
        return f"no pass over the object with uid {uid} in these spans\n"
    number = {(r.trace_id, r.span_id): i for i, r in enumerate(rows, 1)}
    children: dict[tuple[str, str], list[Span]] = {}
    for s in spans:
        if s.parent_span_id:
            children.setdefault((s.trace_id, s.parent_span_id), []).append(s)
    origin = min(r.start_ns for r in rows)
    total = max(r.end_ns for r in rows) - origin
    subject = own[0]
    lines = [
        f"{subject.object_label} ({subject.service}): {len(own)} passes over {_duration(total)}, "
        "one trace each",
        f"  {'#':>3}  {'start':>9}  {'took':>8}  {'time ' + '-' * (width - 5)}  pass",
    ]
    for row in rows:
        key = (row.trace_id, row.span_id)
        mark = " " if row.uid == uid else "⇠"
        outcome = "error" if row.error else str(row.attributes.get("outcome") or "")
        reasons = row.attributes.get("condition.reasons") or []
        listed = [str(r) for r in reasons] if isinstance(reasons, list) else [str(reasons)]
        reason_text = ",".join(dict.fromkeys(listed))  # each reason once, in the order set
        what = row.object_label if row.uid != uid else ""
        summary = "  ".join(x for x in (what, outcome, reason_text) if x)
        offset = (row.start_ns - origin) / 1e9
        bar = _bar(row.start_ns, row.duration_ns, origin, total, width)
        took = _duration(row.duration_ns)
        start = f"+{offset:.3f}s"
        lines.append(f"{mark} {number[key]:>3}  {start:>9}  {took:>8}  {bar}  {summary}")
        detail = " " * 17
        writes = sorted(children.get(key, []), key=lambda s: s.start_ns)
        if writes:
            lines.append(f"{detail}writes: {', '.join(w.name for w in writes)}")
        if row.error:
            lines.append(f"{detail}error: {row.error}")
        for link in row.links:
            target = number.get((link.trace_id, link.span_id))
            found = next((s for s in spans if (s.trace_id, s.span_id) == (link.trace_id, link.span_id)), None)
            if link.kind == LINK_PREVIOUS:
                label = "follows the previous pass"
            elif link.kind == LINK_WRITTEN_BY:
                label = "read what was written by"
            else:
                label = "linked to"
            if target is not None:
                where = f"#{target}"
                if found is not None and found.uid != row.uid:
                    where += f" ({found.object_label})"
            elif found is not None:
                where = f"{found.object_label} trace {link.trace_id[:8]}"
            else:
                where = f"trace {link.trace_id[:8]} (not in the store)"
            lines.append(f"{detail}{'←' if link.kind == LINK_PREVIOUS else '⇠'} {label} {where}")
    lines.append(
        "  one row per reconcile pass (each its own trace); ⇠ rows are passes over other objects "
        "that wrote what this one read"
    )
    return "\n".join(lines) + "\n"
