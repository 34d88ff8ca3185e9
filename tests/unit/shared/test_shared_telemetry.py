"""Tracing across passes (links, outcome, traceparent carrier, sampling of unchanged passes with
their children, links only to exported passes) and the health verdicts, without any server."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import NoOpTracerProvider

from shared.kube import _resource_of
from shared.telemetry.health import Health
from shared.telemetry.tracing import (
    OUTCOME_CHANGED,
    OUTCOME_ERROR,
    OUTCOME_UNCHANGED,
    TRACEPARENT_ANNOTATION,
    Tracing,
    UnchangedPassFilter,
    extract,
    note_write,
    provider_from_env,
    stamp,
)


class Collect(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


def tracing(ratio: float = 1.0) -> tuple[Tracing, Collect]:
    exporter = Collect()
    provider = TracerProvider()
    provider.add_span_processor(UnchangedPassFilter(SimpleSpanProcessor(exporter), ratio))
    return Tracing(provider, "test", ratio=ratio), exporter


OBJ = {"metadata": {"name": "a", "namespace": "ns", "uid": "u-1", "generation": 2}}


def test_consecutive_passes_over_one_object_are_linked() -> None:
    traced, exported = tracing()
    for _ in range(3):
        with traced.start_pass("EndpointAttachment", OBJ):
            pass
    first, second, third = exported.spans
    assert not first.links
    assert [link.context.span_id for link in second.links] == [first.context.span_id]
    assert [link.context.span_id for link in third.links] == [second.context.span_id]
    assert first.attributes is not None
    assert first.attributes["k8s.object.uid"] == "u-1"
    assert first.attributes["k8s.object.generation"] == 2


def test_a_write_marks_the_pass_changed_and_an_exception_marks_it_error() -> None:
    traced, exported = tracing()
    with traced.start_pass("X", OBJ) as report:
        report.reasons = ["Published"]
        note_write()
    with pytest.raises(RuntimeError), traced.start_pass("X", OBJ):
        raise RuntimeError("boom")
    with traced.start_pass("X", OBJ):
        pass
    outcomes = [(s.attributes or {}).get("outcome") for s in exported.spans]
    assert outcomes == [OUTCOME_CHANGED, OUTCOME_ERROR, OUTCOME_UNCHANGED]
    assert (exported.spans[0].attributes or {})["condition.reasons"] == ("Published",)


def test_a_pass_links_to_the_pass_that_wrote_what_it_reads() -> None:
    traced, exported = tracing()
    with traced.start_pass("EndpointAttachment", OBJ):
        child = stamp({"metadata": {"name": "ea-a"}})
    writer = exported.spans[0]
    assert child["metadata"]["annotations"][TRACEPARENT_ANNOTATION].split("-")[2] == format(
        writer.context.span_id, "016x"
    )
    context = extract(child)
    assert context is not None
    assert context.span_id == writer.context.span_id
    with traced.start_pass("Service", {"metadata": {"uid": "other"}}, related=[child]):
        pass
    assert [link.context.span_id for link in exported.spans[1].links] == [writer.context.span_id]


def test_no_traceparent_is_stamped_outside_a_recording_pass() -> None:
    assert stamp({"metadata": {}}) == {"metadata": {}}
    assert extract({"metadata": {"annotations": {TRACEPARENT_ANNOTATION: "garbage"}}}) is None


@pytest.mark.parametrize(("ratio", "kept"), [(0.0, 0), (1.0, 20)])
def test_unchanged_passes_are_sampled_down_changed_ones_never(ratio: float, kept: int) -> None:
    traced, exported = tracing(ratio)
    for _ in range(20):
        with traced.start_pass("X", OBJ):
            pass
    for _ in range(5):
        with traced.start_pass("X", OBJ):
            note_write()
    outcomes = [(s.attributes or {}).get("outcome") for s in exported.spans]
    assert outcomes.count(OUTCOME_UNCHANGED) == kept
    assert outcomes.count(OUTCOME_CHANGED) == 5


def test_tracing_is_a_no_op_without_an_endpoint() -> None:
    assert isinstance(provider_from_env("x", environ={}), NoOpTracerProvider)
    assert not isinstance(
        provider_from_env("x", environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:4318"}), NoOpTracerProvider
    )


def test_children_of_a_dropped_pass_are_dropped_with_it() -> None:
    traced, exported = tracing(ratio=0.0)
    for _ in range(5):
        with traced.start_pass("GPUClass", OBJ), traced.child("read KubeVirt CR"):
            pass
    with traced.start_pass("GPUClass", OBJ), traced.child("read KubeVirt CR"):
        note_write()
    names = [s.name for s in exported.spans]
    assert names == ["read KubeVirt CR", "reconcile GPUClass"]  # the changed pass, and its child


def test_a_link_never_points_at_a_dropped_pass() -> None:
    traced, exported = tracing(ratio=0.0)
    with traced.start_pass("X", OBJ):
        note_write()
    for _ in range(3):
        with traced.start_pass("X", OBJ):
            pass  # unchanged: dropped
    with traced.start_pass("X", OBJ):
        note_write()
    first, last = exported.spans
    assert [link.context.span_id for link in last.links] == [first.context.span_id]


def test_a_pass_links_to_each_writer_once() -> None:
    traced, exported = tracing()
    with traced.start_pass("X", {"metadata": {"uid": "w"}}):
        child = stamp({"metadata": {"name": "c"}})
    with traced.start_pass("Y", {"metadata": {"uid": "r"}}, related=[child, child]) as report:
        report.read(child, child)
    assert len(exported.spans[1].links) == 1


def test_liveness_fails_on_a_stalled_loop_and_on_a_failing_check() -> None:
    problem: list[str | None] = [None]
    health = Health(live=[lambda: problem[0]], ready=[lambda: "caches not synced: pods"], stall_seconds=30)
    assert health.problem() is None
    assert health.not_ready() == "caches not synced: pods"
    problem[0] = "controller x: a reconcile has run for 400s"
    assert health.problem() == problem[0]
    problem[0] = None
    health._beat = time.monotonic() - 31
    assert (health.problem() or "").startswith("event loop stalled")


@pytest.mark.parametrize(
    ("path", "resource"),
    [
        ("/api/v1/namespaces/x/pods/y/status", "pods/status"),
        ("/apis/gpu.cozystack.io/v1alpha1/gpuclasses/h200/status", "gpuclasses/status"),
        ("/api/v1/namespaces/x/services", "services"),
        ("/api/v1/namespaces", "namespaces"),
        ("/apis/local.sdn.cozystack.io/v1alpha1/ipaddressallocations", "ipaddressallocations"),
    ],
)
def test_write_spans_are_named_by_resource_never_by_object(path: str, resource: str) -> None:
    assert _resource_of(path) == resource
