"""OpenTelemetry tracing across reconcile passes, shared by both operators.

Decides:

* configuration by the standard ``OTEL_*`` variables only (endpoint, protocol, service name, resource
  attributes, sampler); with no OTLP endpoint configured, tracing is a no-op;
* one span per pass over one object (``start_pass``), carrying kind, namespace, name, uid, generation,
  the pass outcome (``changed``, ``unchanged``, ``error``) and the condition reasons it set;
* consecutive passes over one object are tied by span links (to the previous pass over the same
  UID), and a pass over an object that carries the ``TRACEPARENT_ANNOTATION`` links to the pass that
  wrote it: so an object's life reads as one chain of linked passes;
* passes that change nothing are still recorded, but only a fraction is exported
  (``COZY_TRACE_UNCHANGED_RATIO``, default 0.1), chosen by trace id so the choice is stable.

Does not: keep global state (the caller builds one ``Tracing`` and passes it in), touch any pure
module, or ever write an object only to carry trace context (the annotation rides on writes the
operator makes anyway, and never on status writes).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Final

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Link, SpanContext, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

# The annotation of the Kubernetes proposal for asynchronous trace propagation (KEP-647 family):
# one constant, so following the proposal if it renames the key is a one-line change.
TRACEPARENT_ANNOTATION: Final = "tracing.k8s.io/traceparent"

OUTCOME_CHANGED: Final = "changed"
OUTCOME_UNCHANGED: Final = "unchanged"
OUTCOME_ERROR: Final = "error"

_UNCHANGED_RATIO_ENV: Final = "COZY_TRACE_UNCHANGED_RATIO"
_PROPAGATOR = TraceContextTextMapPropagator()
_MAX_REMEMBERED = 100_000  # previous-pass contexts kept for links; a bound, not a cache policy
_MAX_HELD_TRACES = 10_000  # passes whose child spans are held until the pass ends
# The pass the current task is in, so a client write can mark it changed without being told.
_CURRENT_PASS: ContextVar[PassSpan | None] = ContextVar("current_pass", default=None)


def tracing_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def provider_from_env(service_name: str, environ: Mapping[str, str] = os.environ) -> trace.TracerProvider:
    """A TracerProvider exporting over OTLP/HTTP as the ``OTEL_*`` variables say, or a no-op one."""
    if not tracing_enabled(environ) or environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return trace.NoOpTracerProvider()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    # Resource.create merges OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME over our default name.
    resource = Resource.create({SERVICE_NAME: environ.get("OTEL_SERVICE_NAME") or service_name})
    provider = TracerProvider(resource=resource)  # the sampler comes from OTEL_TRACES_SAMPLER(_ARG)
    provider.add_span_processor(
        UnchangedPassFilter(BatchSpanProcessor(OTLPSpanExporter()), unchanged_ratio(environ))
    )
    return provider


def unchanged_ratio(environ: Mapping[str, str] = os.environ) -> float:
    return max(0.0, min(1.0, float(environ.get(_UNCHANGED_RATIO_ENV, "0.1"))))


def exported(trace_id: int, outcome: object, ratio: float) -> bool:
    """Whether a pass span with this outcome is exported: every pass that changed something or
    failed, and ``ratio`` of the unchanged ones, chosen by trace id (so the choice is stable)."""
    if outcome != OUTCOME_UNCHANGED:
        return True
    return (trace_id & 0xFFFFFFFFFFFFFFFF) < int(ratio * (1 << 64))


class UnchangedPassFilter(SpanProcessor):
    """Forwards every span, except all but ``ratio`` of the pass spans whose outcome is unchanged;
    a pass's child spans are held until the pass ends and share its fate, so no child of a dropped
    pass is ever exported alone."""

    def __init__(self, inner: SpanProcessor, ratio: float) -> None:
        self.inner, self.ratio = inner, ratio
        self._children: dict[int, list[ReadableSpan]] = {}

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.inner.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        context = span.get_span_context()
        trace_id = context.trace_id if context else 0
        if span.parent is not None:
            if len(self._children) >= _MAX_HELD_TRACES:
                self._children.clear()  # a bound against roots that never end, not a policy
            self._children.setdefault(trace_id, []).append(span)
            return
        children = self._children.pop(trace_id, [])
        if not exported(trace_id, (span.attributes or {}).get("outcome"), self.ratio):
            return
        for child in children:
            self.inner.on_end(child)
        self.inner.on_end(span)

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


@dataclass
class PassSpan:
    """What a pass reports about itself before its span ends."""

    span: trace.Span
    outcome: str = OUTCOME_UNCHANGED
    reasons: list[str] = field(default_factory=list)
    linked: set[tuple[int, int]] = field(default_factory=set)  # (trace id, span id) already linked

    def changed(self) -> None:
        self.outcome = OUTCOME_CHANGED

    def read(self, *objects: Mapping[str, Any] | None) -> None:
        """Link this pass to the passes that wrote the objects it read (each pass once; never to
        itself, when it reads back what it wrote a moment ago)."""
        own = _id(self.span.get_span_context())
        for obj in objects:
            written_by = extract(obj)
            if written_by is not None and _id(written_by) not in self.linked and _id(written_by) != own:
                self.linked.add(_id(written_by))
                self.span.add_link(written_by, {"link.kind": "written_by"})


class Tracing:
    """One operator's tracer, and the memory of each object's last pass (for links)."""

    def __init__(self, provider: trace.TracerProvider, name: str, ratio: float | None = None) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer(name)
        self.ratio = unchanged_ratio() if ratio is None else ratio
        # The last *exported* pass per key: a link never points at a span that was dropped.
        self._last_pass: dict[str, SpanContext] = {}

    @contextmanager
    def start_pass(
        self,
        kind: str,
        obj: Mapping[str, Any] | None,
        *,
        related: Iterable[Mapping[str, Any] | None] = (),
        link_key: str = "",
    ) -> Iterator[PassSpan]:
        """A pass span over ``obj``, linked to the previous pass over the same UID (or ``link_key``)
        and to the passes that wrote ``obj`` and the ``related`` objects it reads."""
        metadata = (obj or {}).get("metadata") or {}
        uid = str(metadata.get("uid") or "")
        key = link_key or uid
        links = [Link(ctx, {"link.kind": "previous_pass"}) for ctx in [self._last_pass.get(key)] if ctx]
        linked = {_id(link.context) for link in links}
        for other in (obj, *related):
            written_by = extract(other)
            if written_by is not None and _id(written_by) not in linked:
                linked.add(_id(written_by))
                links.append(Link(written_by, {"link.kind": "written_by"}))
        attributes: dict[str, str | int] = {
            "k8s.object.kind": kind,
            "k8s.object.namespace": str(metadata.get("namespace") or ""),
            "k8s.object.name": str(metadata.get("name") or ""),
            "k8s.object.uid": uid,
            "k8s.object.generation": int(metadata.get("generation") or 0),
        }
        with self.tracer.start_as_current_span(
            f"reconcile {kind}", context=Context(), links=links, attributes=attributes
        ) as span:
            report = PassSpan(span, linked=linked)
            token = _CURRENT_PASS.set(report)
            try:
                yield report
            except BaseException as error:
                report.outcome = OUTCOME_ERROR
                span.set_status(Status(StatusCode.ERROR, str(error)))
                raise
            finally:
                _CURRENT_PASS.reset(token)
                span.set_attribute("outcome", report.outcome)
                if report.reasons:
                    span.set_attribute("condition.reasons", report.reasons)
                context = span.get_span_context()
                if key and context.is_valid and exported(context.trace_id, report.outcome, self.ratio):
                    if len(self._last_pass) >= _MAX_REMEMBERED:
                        self._last_pass.clear()
                    self._last_pass[key] = context

    def forget(self, key: str) -> None:
        """Drop the last pass remembered for ``key`` (a UID or a ``link_key``): its object is gone, and
        a later object of the same name is another incarnation, not a next pass."""
        self._last_pass.pop(key, None)

    def remembered(self) -> int:
        """How many keys a previous pass is remembered for (bounded by ``_MAX_REMEMBERED``)."""
        return len(self._last_pass)

    @contextmanager
    def child(self, name: str, **attributes: str) -> Iterator[trace.Span]:
        with self.tracer.start_as_current_span(name, attributes=attributes) as span:
            yield span


def _id(context: SpanContext) -> tuple[int, int]:
    return context.trace_id, context.span_id


def current_pass() -> PassSpan | None:
    return _CURRENT_PASS.get()


def note_write() -> None:
    """Mark the current pass as one that changed something (called by the client on each write)."""
    report = _CURRENT_PASS.get()
    if report is not None:
        report.changed()


def current_traceparent() -> str | None:
    """The W3C traceparent of the current span, if a recording span is current."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent")


def stamp(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``obj`` (an object to create, or a merge patch) carrying the current traceparent in
    its annotations; ``obj`` itself is never changed, so a plan can be stamped and kept."""
    stamped = copy.deepcopy(dict(obj))
    traceparent = current_traceparent()
    if traceparent:
        metadata = stamped.setdefault("metadata", {})
        metadata["annotations"] = {**(metadata.get("annotations") or {}), TRACEPARENT_ANNOTATION: traceparent}
    return stamped


def extract(obj: Mapping[str, Any] | None) -> SpanContext | None:
    """The span context of the pass that last wrote ``obj``, from its traceparent annotation."""
    annotations = ((obj or {}).get("metadata") or {}).get("annotations") or {}
    traceparent = annotations.get(TRACEPARENT_ANNOTATION)
    if not traceparent:
        return None
    context = trace.get_current_span(_PROPAGATOR.extract({"traceparent": traceparent})).get_span_context()
    return context if context.is_valid else None


def trace_id_hex(span: trace.Span | None = None) -> str | None:
    """The current (or given) span's trace id, for metric exemplars; None when not recording."""
    context = (span or trace.get_current_span()).get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None
