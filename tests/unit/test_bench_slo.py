"""harness.slo: a quantile from a histogram's buckets as Prometheus computes it; a churn step's verdict."""

from __future__ import annotations

import math

import pytest

from harness.slo import (
    Buckets,
    StepFigures,
    Verdict,
    bucket_delta,
    buckets,
    highest_sustained,
    histogram_quantile,
    judge,
    tail_quantile,
)

INF = math.inf
# client-go's workqueue buckets around a second, as the operators serve them (cumulative counts).
DECADES: Buckets = [(0.001, 0.0), (0.01, 50.0), (0.1, 90.0), (1.0, 99.0), (10.0, 100.0), (INF, 100.0)]

# One row per invariant: (what, q, buckets, expected), expected as Prometheus answers
# ``histogram_quantile(q, ...)`` over the same buckets (None where it answers NaN); the rows
# answering 1.25, 1.0 and 5.5 were checked against ``promtool test rules`` (``hack/build-tool.sh``).
QUANTILES: list[tuple[str, float, Buckets, float | None]] = [
    ("interpolated inside the bucket holding the rank", 0.5, [(1.0, 10.0), (2.0, 30.0), (INF, 30.0)], 1.25),
    ("the first bucket interpolates from 0", 0.5, [(1.0, 10.0), (2.0, 10.0), (INF, 10.0)], 0.5),
    ("rank exactly on a bound answers that bound", 0.99, DECADES, 1.0),
    ("rank past a bound is interpolated in the next decade", 0.995, DECADES, 5.5),
    ("rank in the +Inf bucket answers the largest finite bound", 0.99, [(1.0, 5.0), (INF, 10.0)], 1.0),
    ("no observation answers nothing (NaN)", 0.99, [(1.0, 0.0), (INF, 0.0)], None),
    ("no +Inf bucket answers nothing (NaN)", 0.5, [(1.0, 1.0), (2.0, 2.0)], None),
    ("a single bucket answers nothing (NaN)", 0.5, [(INF, 3.0)], None),
    ("a count decreasing mid-scrape is made monotonic", 0.5, [(1.0, 10.0), (2.0, 8.0), (INF, 20.0)], 1.0),
    (
        "q = 0 over an empty first bucket answers its lower end",
        0.0,
        [(1.0, 0.0), (2.0, 4.0), (INF, 4.0)],
        0.0,
    ),
]


@pytest.mark.parametrize(("what", "q", "cumulative", "expected"), QUANTILES, ids=[c[0] for c in QUANTILES])
def test_histogram_quantile(what: str, q: float, cumulative: Buckets, expected: float | None) -> None:
    found = histogram_quantile(q, cumulative)
    if expected is None:
        assert found is None
    else:
        assert found == pytest.approx(expected)


def test_a_quantile_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match="outside"):
        histogram_quantile(1.5, DECADES)


def _scrape(queue: str, counts: dict[str, float]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Samples as ``RunningOperator.scrape`` returns them: (name, sorted labels) -> value."""
    return {
        ("workqueue_queue_duration_seconds_bucket", (("le", le), ("name", queue))): value
        for le, value in counts.items()
    }


def test_buckets_are_read_per_queue_and_sorted_by_bound() -> None:
    samples = {
        **_scrape("endpointattachment", {"+Inf": 7.0, "0.1": 5.0, "1.0": 6.0}),
        **_scrape("other", {"+Inf": 100.0, "0.1": 100.0, "1.0": 100.0}),
    }
    assert buckets(samples, "workqueue_queue_duration_seconds", name="endpointattachment") == [
        (0.1, 5.0),
        (1.0, 6.0),
        (INF, 7.0),
    ]


def test_the_window_is_the_difference_of_two_scrapes() -> None:
    before = [(0.1, 100.0), (1.0, 100.0), (INF, 100.0)]
    after = [(0.1, 190.0), (1.0, 199.0), (INF, 200.0)]
    window = bucket_delta(after, before)
    assert window == [(0.1, 90.0), (1.0, 99.0), (INF, 100.0)]
    # Over the window alone the p99 is 1 s; over the cumulative series it would look better.
    assert histogram_quantile(0.99, window) == pytest.approx(1.0)
    assert histogram_quantile(0.99, after) == pytest.approx(0.9)  # rank 198 of 200: 8/9 into (0.1, 1]


def test_a_bound_missing_before_counts_from_zero() -> None:
    assert bucket_delta([(1.0, 3.0), (INF, 4.0)], []) == [(1.0, 3.0), (INF, 4.0)]


# (what, latencies, unanswered, expected nearest-rank p99)
TAILS: list[tuple[str, list[float], int, float | None]] = [
    ("nearest rank: p99 of 100 is the 99th smallest", [float(n) for n in range(1, 101)], 0, 99.0),
    ("an unanswered change counts as infinitely late", [1.0] * 99, 1, 1.0),
    ("two unanswered in a hundred make p99 infinite", [1.0] * 98, 2, INF),
    ("nothing measured answers nothing", [], 0, None),
]


@pytest.mark.parametrize(("what", "latencies", "unanswered", "expected"), TAILS, ids=[c[0] for c in TAILS])
def test_tail_quantile(what: str, latencies: list[float], unanswered: int, expected: float | None) -> None:
    assert tail_quantile(latencies, unanswered) == expected


# (what, step, verdict)
VERDICTS: list[tuple[str, StepFigures, Verdict]] = [
    ("kept up, both SLOs hold", StepFigures(10, 9.9, 0.05, 1.2), Verdict(True, True, True)),
    (
        "exactly 95 % of the asked rate is kept up",
        StepFigures(20, 19.0, 0.05, 1.2),
        Verdict(True, True, True),
    ),
    ("below 95 % of the asked rate is not", StepFigures(20, 18.9, 0.05, 1.2), Verdict(False, True, True)),
    ("queue p99 exactly 1 s holds", StepFigures(10, 10, 1.0, 1.2), Verdict(True, True, True)),
    ("queue p99 past 1 s does not", StepFigures(10, 10, 1.01, 1.2), Verdict(True, False, True)),
    ("status p99 past 5 s does not", StepFigures(10, 10, 0.05, 5.5), Verdict(True, True, False)),
    (
        "an unanswered change (infinite p99) does not",
        StepFigures(10, 10, 0.05, INF),
        Verdict(True, True, False),
    ),
    ("no key queued shows nothing", StepFigures(10, 10, None, 1.2), Verdict(True, False, True)),
    ("no change made shows nothing", StepFigures(10, 0, 0.05, None), Verdict(False, True, False)),
]


@pytest.mark.parametrize(("what", "step", "verdict"), VERDICTS, ids=[c[0] for c in VERDICTS])
def test_judge(what: str, step: StepFigures, verdict: Verdict) -> None:
    assert judge(step) == verdict
    assert judge(step).holds == (verdict.kept_up and verdict.queue_ok and verdict.status_ok)


HOLDS, FAILS = (0.05, 1.0), (2.0, 9.0)  # (queue p99, status p99)
# (what, steps as (asked, achieved, figures), highest sustained)
RAMPS: list[tuple[str, list[tuple[float, float, tuple[float, float]]], float | None]] = [
    ("the highest step that holds", [(2, 2, HOLDS), (5, 5, HOLDS), (10, 10, FAILS)], 5),
    ("a step not kept up does not count", [(2, 2, HOLDS), (5, 3, HOLDS)], 2),
    ("a step holding above a failing one still counts", [(2, 2, HOLDS), (5, 5, FAILS), (10, 10, HOLDS)], 10),
    ("none holds", [(2, 2, FAILS)], None),
    ("no step", [], None),
]


@pytest.mark.parametrize(("what", "ramp", "highest"), RAMPS, ids=[c[0] for c in RAMPS])
def test_highest_sustained(
    what: str, ramp: list[tuple[float, float, tuple[float, float]]], highest: float | None
) -> None:
    steps = [StepFigures(asked, achieved, *figures) for asked, achieved, figures in ramp]
    assert highest_sustained(steps) == highest
