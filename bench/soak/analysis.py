"""What a soak run's samples say: memory flat after warm-up, passes and API calls per change constant.

Decides (pure: samples in, report rows out):

* the warm-up is cut off first (caches filling, the allocator's arenas growing); what is left is
  split into thirds by time, and the first third is compared with the last;
* memory: each operator's median RSS in the last third against its median in the first third
  (target: within ``MEMORY_TOLERANCE``, i.e. 10%); a median, so one sample taken mid-burst does not
  decide;
* cost per change: passes (``controller_runtime_reconcile_total``, every controller of both
  operators) and API requests (the API server's ``apiserver_request_total``, whoever sent them)
  in each third, divided by the changes the churn made in it; the last third's against the first's
  (target: at most ``COST_GROWTH_TOLERANCE`` more: a cost that grows with the run's history is a
  leak of work, as a growing RSS is a leak of memory);
* the churn itself: the rate achieved against the rate asked for (the run is only a soak at the rate
  it really reached).

Does not: take samples, or read a clock.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from bench.endpointattachment.report import MULTIPLY, Row, ratio

MEMORY_TOLERANCE: Final = 0.10
# Fewer passes than this in a third is too few to compare (Poisson noise alone is ±18% at 30): a
# controller that coalesces bursts (GPUClass) passes by time, not by change, in a short run.
MIN_PASSES_TO_COMPARE: Final = 30
COST_GROWTH_TOLERANCE: Final = 0.10
RATE_TOLERANCE: Final = 0.10  # the churn counts as run at the asked rate within this much


@dataclass(frozen=True)
class Sample:
    """One reading, ``at`` seconds after the churn started."""

    at: float
    changes: int  # creates and deletes the churn made so far (all kinds)
    api_requests: int  # the API server's request count so far
    rss: Mapping[str, int] = field(default_factory=dict)  # operator -> bytes
    passes: Mapping[str, float] = field(default_factory=dict)  # operator -> reconciles so far
    mix: Mapping[str, int] = field(default_factory=dict)  # kind -> changes so far


@dataclass(frozen=True)
class Window:
    first: float  # seconds: samples in [first, last]
    last: float


def thirds(samples: Sequence[Sample], warmup: float) -> tuple[list[Sample], list[Sample]] | None:
    """The samples of the first and the last third after ``warmup``; None if too few to compare."""
    after = [s for s in samples if s.at >= warmup]
    if len(after) < 6:
        return None
    start, end = after[0].at, after[-1].at
    span = end - start
    first = [s for s in after if s.at <= start + span / 3]
    last = [s for s in after if s.at >= end - span / 3]
    if len(first) < 2 or len(last) < 2:
        return None
    return first, last


def _per_change(window: Sequence[Sample], count: float) -> float | None:
    changes = window[-1].changes - window[0].changes
    return count / changes if changes > 0 else None


def _mib(value: float) -> str:
    return f"{value / 2**20:.1f} MiB"


def _percent(value: float) -> str:
    return f"{value * 100:+.1f}%"


def memory_rows(first: Sequence[Sample], last: Sequence[Sample], operators: Sequence[str]) -> list[Row]:
    rows: list[Row] = []
    for name in operators:
        before = statistics.median(s.rss[name] for s in first if name in s.rss)
        after = statistics.median(s.rss[name] for s in last if name in s.rss)
        growth = (after - before) / before if before else 0.0
        rows.append(
            Row(
                f"{name}: RSS, last third vs first",
                f"{_mib(before)} → {_mib(after)} ({_percent(growth)})",
                f"within ±{MEMORY_TOLERANCE:.0%}",
                abs(growth) <= MEMORY_TOLERANCE,
                ratio(after / before) if before else "",
            )
        )
    return rows


def cost_row(figure: str, before: float | None, after: float | None, counted: float | None = None) -> Row:
    if counted is not None and counted < MIN_PASSES_TO_COMPARE and before is not None and after is not None:
        return Row(
            figure, f"{before:.2f} → {after:.2f} ({counted:.0f} in the smaller third: too few to judge)"
        )
    if before is None or after is None or before == 0:
        return Row(
            figure, "no changes in a third", f"≤ {1 + COST_GROWTH_TOLERANCE:.2f}{MULTIPLY} first", False
        )
    growth = after / before
    return Row(
        figure,
        f"{before:.2f} → {after:.2f}",
        f"≤ {1 + COST_GROWTH_TOLERANCE:.2f}{MULTIPLY} first",
        growth <= 1 + COST_GROWTH_TOLERANCE,
        ratio(growth),
    )


def cost_rows(first: Sequence[Sample], last: Sequence[Sample], operators: Sequence[str]) -> list[Row]:
    rows: list[Row] = []
    for name in operators:
        passes_first = first[-1].passes.get(name, 0) - first[0].passes.get(name, 0)
        passes_last = last[-1].passes.get(name, 0) - last[0].passes.get(name, 0)
        before, after = _per_change(first, passes_first), _per_change(last, passes_last)
        rows.append(cost_row(f"{name}: passes per change", before, after, min(passes_first, passes_last)))
    before = _per_change(first, first[-1].api_requests - first[0].api_requests)
    after = _per_change(last, last[-1].api_requests - last[0].api_requests)
    rows.append(cost_row("API requests per change (all clients)", before, after))
    return rows


def rate_row(kind: str, created: int, deleted: int, seconds: float, asked_per_minute: float) -> Row:
    """Lifecycles per minute: a create and a delete make one (so filling the population, all
    creates, counts half)."""
    achieved = (created + deleted) / 2 / seconds * 60 if seconds > 0 else 0.0
    return Row(
        f"{kind} churned per minute",
        f"{achieved:,.0f}",
        f"≥ {asked_per_minute * (1 - RATE_TOLERANCE):,.0f} (asked {asked_per_minute:,.0f})",
        achieved >= asked_per_minute * (1 - RATE_TOLERANCE),
        ratio(achieved / asked_per_minute) if asked_per_minute else "",
    )


def analyse(
    samples: Sequence[Sample], warmup: float, operators: Sequence[str]
) -> tuple[list[Row], list[str]]:
    """The memory and cost rows of a run; notes say what could not be compared."""
    split = thirds(samples, warmup)
    if split is None:
        return [], [f"too few samples after the {warmup:.0f}s warm-up to compare thirds"]
    first, last = split
    notes = [
        f"warm-up {warmup:.0f}s cut off; first third {first[0].at:.0f}-{first[-1].at:.0f}s, "
        f"last third {last[0].at:.0f}-{last[-1].at:.0f}s ({len(samples)} samples)",
        f"changes by kind, first third {_mix(first)}; last third {_mix(last)} "
        "(a cost per change moves with the mix)",
    ]
    return memory_rows(first, last, operators) + cost_rows(first, last, operators), notes


def _mix(window: Sequence[Sample]) -> str:
    kinds = sorted(set(window[-1].mix) | set(window[0].mix))
    return ", ".join(f"{kind} {window[-1].mix.get(kind, 0) - window[0].mix.get(kind, 0):,}" for kind in kinds)


def growth_trend(samples: Sequence[Sample], name: str, warmup: float) -> float | None:
    """Least-squares RSS slope after warm-up, in bytes per minute (context for a growth verdict)."""
    points = [(s.at, float(s.rss[name])) for s in samples if s.at >= warmup and name in s.rss]
    if len(points) < 3:
        return None
    mean_t = statistics.fmean(t for t, _ in points)
    mean_r = statistics.fmean(r for _, r in points)
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return None
    return sum((t - mean_t) * (r - mean_r) for t, r in points) / var * 60
