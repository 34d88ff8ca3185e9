"""bench.soak.analysis: what a soak run's samples say (memory flat, cost per change constant)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bench.soak.analysis import Sample, analyse, growth_trend, rate_row, thirds

OPERATORS = ("gpuclass", "endpointattachment")
MIB = 2**20


def run(
    rss: Callable[[float], float] = lambda t: 100 * MIB,
    passes_per_change: Callable[[float], float] = lambda t: 2.0,
    requests_per_change: Callable[[float], float] = lambda t: 8.0,
    seconds: int = 600,
    step: int = 5,
) -> list[Sample]:
    """Samples of a run making 10 changes a second, with the given RSS and costs over time."""
    samples: list[Sample] = []
    passes = requests = 0.0
    for at in range(0, seconds + 1, step):
        if at:
            passes += passes_per_change(at) * 10 * step
            requests += requests_per_change(at) * 10 * step
        samples.append(
            Sample(
                at=float(at),
                changes=10 * at,
                api_requests=int(requests),
                rss={name: int(rss(at)) for name in OPERATORS},
                passes={name: passes for name in OPERATORS},
            )
        )
    return samples


def verdicts(samples: list[Sample], warmup: float = 120.0) -> dict[str, bool | None]:
    rows, _ = analyse(samples, warmup, OPERATORS)
    return {row.figure: row.met for row in rows}


# One row per invariant: (what happens in the run, figure, verdict).
CASES: list[tuple[str, list[Sample], str, bool]] = [
    ("flat memory meets", run(), "endpointattachment: RSS, last third vs first", True),
    (
        "memory growing 30% after warm-up misses",
        run(rss=lambda t: (100 + 0.06 * t) * MIB),
        "endpointattachment: RSS, last third vs first",
        False,
    ),
    (
        "growth only during warm-up meets",
        run(rss=lambda t: (50 + t / 2.4 if t < 120 else 100) * MIB),
        "gpuclass: RSS, last third vs first",
        True,
    ),
    ("constant passes per change meet", run(), "gpuclass: passes per change", True),
    (
        "passes per change that double miss",
        run(passes_per_change=lambda t: 1.0 if t < 300 else 2.0),
        "endpointattachment: passes per change",
        False,
    ),
    (
        "fewer API requests per change meet",
        run(requests_per_change=lambda t: 8.0 if t < 300 else 6.0),
        "API requests per change (all clients)",
        True,
    ),
    (
        "more API requests per change miss",
        run(requests_per_change=lambda t: 8.0 if t < 300 else 10.0),
        "API requests per change (all clients)",
        False,
    ),
]


@pytest.mark.parametrize(("case", "samples", "figure", "met"), CASES, ids=[c[0] for c in CASES])
def test_verdicts(case: str, samples: list[Sample], figure: str, met: bool) -> None:
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


def test_too_few_passes_to_compare_get_no_verdict() -> None:
    rare = run(passes_per_change=lambda t: 0.001 if t < 300 else 0.004)  # a coalescing controller
    assert verdicts(rare)["gpuclass: passes per change"] is None
