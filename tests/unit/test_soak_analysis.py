"""bench.soak.analysis: what a soak run's samples say (memory flat, passes per change, the rate)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bench.soak.analysis import CONCERNS, Sample, analyse, events_row, growth_trend, rate_row, thirds

OPERATORS = ("gpuclass", "endpointattachment")
MIB = 2**20
# Writes a second of each kind the churn counts (``churn.WRITTEN_KINDS``): 4 concern
# EndpointAttachment (attachments, claims), 5 GPUClass (nodes, VM pods), the app pods neither.
WRITES_PER_SECOND = {"attachment": 3, "claim": 1, "node": 1, "vm-pod": 4, "app-pod": 6}


def run(
    rss: Callable[[float], float] = lambda t: 100 * MIB,
    passes_per_change: Callable[[float], float] = lambda t: 1.0,
    requests_per_change: Callable[[float], float] = lambda t: 8.0,
    seconds: int = 600,
    step: int = 5,
) -> list[Sample]:
    """Samples of a run making 10 changes a second (and ``WRITES_PER_SECOND``), with the given RSS
    and costs over time (passes per change of each operator, per the writes that concern it)."""
    samples: list[Sample] = []
    passes = dict.fromkeys(OPERATORS, 0.0)
    requests = 0.0
    for at in range(0, seconds + 1, step):
        if at:
            for name in OPERATORS:
                concern = sum(WRITES_PER_SECOND[kind] for kind in CONCERNS[name])
                passes[name] += passes_per_change(at) * concern * step
            requests += requests_per_change(at) * 10 * step
        samples.append(
            Sample(
                at=float(at),
                changes=10 * at,
                api_requests=int(requests),
                rss={name: int(rss(at)) for name in OPERATORS},
                passes=dict(passes),
                written={kind: n * at for kind, n in WRITES_PER_SECOND.items()},
            )
        )
    return samples


def verdicts(samples: list[Sample], warmup: float = 120.0) -> dict[str, bool | None]:
    rows, _ = analyse(samples, warmup, OPERATORS)
    return {row.figure: row.met for row in rows}


# One row per invariant: (what happens in the run, figure, verdict).
CASES: list[tuple[str, list[Sample], str, bool | None]] = [
    ("flat memory meets", run(), "endpointattachment: RSS, last third vs first", True),
    (
        "memory growing 30% after warm-up misses",
        run(rss=lambda t: (100 + 0.06 * t) * MIB),
        "endpointattachment: RSS, last third vs first",
        False,
    ),
    (
        "memory growing 8% after warm-up misses (the target is 5%)",
        run(rss=lambda t: (100 + 0.017 * t) * MIB),
        "gpuclass: RSS, last third vs first",
        False,
    ),
    (
        "memory growing 4% after warm-up meets",
        run(rss=lambda t: (100 + 0.0085 * t) * MIB),
        "gpuclass: RSS, last third vs first",
        True,
    ),
    (
        "growth only during warm-up meets",
        run(rss=lambda t: (50 + t / 2.4 if t < 120 else 100) * MIB),
        "gpuclass: RSS, last third vs first",
        True,
    ),
    ("one pass per change meets", run(), "gpuclass: passes per change", True),
    (
        "1.5 passes per change meet",
        run(passes_per_change=lambda t: 1.5),
        "endpointattachment: passes per change",
        True,
    ),
    (
        "1.6 passes per change miss",
        run(passes_per_change=lambda t: 1.6),
        "endpointattachment: passes per change",
        False,
    ),
    (
        "passes per change counted after the warm-up only",
        run(passes_per_change=lambda t: 9.0 if t < 120 else 1.0),
        "endpointattachment: passes per change",
        True,
    ),
    (
        "passes per change that grow past 1.5 after the warm-up miss",
        run(passes_per_change=lambda t: 1.0 if t < 300 else 2.5),
        "gpuclass: passes per change",
        False,
    ),
    (
        "API requests per change are reported, not judged",
        run(requests_per_change=lambda t: 8.0 if t < 300 else 10.0),
        "API requests per change (all clients)",
        None,
    ),
]


@pytest.mark.parametrize(("case", "samples", "figure", "met"), CASES, ids=[c[0] for c in CASES])
def test_verdicts(case: str, samples: list[Sample], figure: str, met: bool | None) -> None:
    assert verdicts(samples)[figure] is met


def test_thirds_need_enough_samples_after_warmup() -> None:
    assert thirds(run(seconds=20), warmup=10) is None
    rows, notes = analyse(run(seconds=20), 10, OPERATORS)
    assert rows == []
    assert "too few samples" in notes[0]


def test_rate_counts_a_create_and_a_delete_as_one_lifecycle() -> None:
    row = rate_row("attachments", created=600, deleted=600, seconds=60, asked_per_minute=600)
    assert row.met is True
    assert row.value == "600"
    assert rate_row("pods", created=300, deleted=0, seconds=60, asked_per_minute=300).met is False


def test_growth_trend_is_per_minute() -> None:
    trend = growth_trend(run(rss=lambda t: 100 * MIB + 1024 * t), "gpuclass", warmup=0)
    assert trend == pytest.approx(60 * 1024)


def test_a_change_counts_only_the_writes_that_concern_the_operator() -> None:
    """EndpointAttachment's changes are the attachments' and claims' writes; GPUClass's the nodes' and
    VM pods'; an application's pods are neither's."""
    sample = Sample(at=0, changes=0, api_requests=0, written=WRITES_PER_SECOND)
    assert (sample.changes_of("endpointattachment"), sample.changes_of("gpuclass")) == (4, 5)


def test_passes_per_change_is_passes_over_the_changes_after_warmup() -> None:
    rows, _ = analyse(run(passes_per_change=lambda t: 1.25), 120.0, OPERATORS)
    row = next(r for r in rows if r.figure == "endpointattachment: passes per change")
    assert row.value.startswith("1.25 over 1,920 changes")  # 4 a second for the 480 s after warm-up


def _event(uid: str, kind: str = "EndpointAttachment") -> dict[str, object]:
    return {"regarding": {"kind": kind, "uid": uid}, "reason": "Rendered"}


def test_events_per_attachment_against_the_recorders_bound() -> None:
    events = [*[_event("a")] * 3, *[_event("b")] * 5, _event("c"), _event("x", kind="GPUClass")]
    row = events_row(events, seconds=600, burst=16, refill_seconds=300)
    assert row.value == "5; 3.0 over 3 attachments"
    assert row.target == "most <= 18"
    assert row.met is True
    assert events_row([_event("a")] * 19, seconds=600, burst=16, refill_seconds=300).met is False
    assert events_row([], seconds=60, burst=16, refill_seconds=300).value == "0; 0.0 over 0 attachments"
