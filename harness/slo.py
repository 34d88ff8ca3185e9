"""Controller SLOs under churn, judged from an operator's own /metrics and a benchmark's watch.

Decides (pure: samples in, figures and verdicts out):

* ``buckets`` and ``bucket_delta``: a histogram's cumulative buckets (``<name>_bucket{le=...}``) as
  an operator's /metrics serves them, summed over the series matching some labels, and the difference
  of two scrapes: what was observed over the measured window only;
* ``histogram_quantile``: a quantile from those buckets exactly as Prometheus's
  ``histogram_quantile`` computes it: the rank ``q * count`` is located in the first bucket whose
  cumulative count reaches it and interpolated linearly inside that bucket (from 0 for the first
  bucket); a rank falling in the ``+Inf`` bucket answers the largest finite bound; no observation
  answers None. With client-go's workqueue buckets (decades: 0.1 s, 1 s, 10 s) the interpolated
  value is coarse, but the verdict "p99 at most 1 s" is exact, 1 s being a bucket bound: it holds
  if and only if at least 99 % of the window's observations were at most 1 s;
* ``tail_quantile``: the nearest-rank quantile of latencies measured one by one, where a change that
  never got its answer counts as infinitely late (it is not dropped from the sample);
* ``judge`` and ``highest_sustained``: a churn step holds when the churn was kept up (achieved at
  least ``KEPT_UP`` of the asked rate) and both SLOs hold; the highest sustained rate is the highest
  asked rate of a step that holds.

Does not: scrape, watch, drive churn or read a clock (``bench.endpointattachment.churn`` and
``bench.gpuclass.live`` do).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

Samples = Mapping[tuple[str, tuple[tuple[str, str], ...]], float]
Buckets = list[tuple[float, float]]  # (upper bound, cumulative count), ascending, +Inf last

# The SLOs of issue 18: a key waits at most 1 s in the work queue, a change shows in its status
# within 5 s (both at the 99th percentile), at a churn the benchmark really kept up.
QUEUE_P99_TARGET: Final = 1.0
STATUS_P99_TARGET: Final = 5.0
# GPUClass (issue 33): a Pod, claim or slice change shows in its class's status within 1 s at p99.
GPUCLASS_STATUS_P99_TARGET: Final = 1.0
QUANTILE: Final = 0.99
KEPT_UP: Final = 0.95  # achieved over asked rate, at least


def buckets(samples: Samples, histogram: str, /, **labels: str) -> Buckets:
    """The cumulative buckets of ``histogram`` summed over the series carrying ``labels``."""
    summed: dict[float, float] = {}
    for (name, sample_labels), value in samples.items():
        if name != f"{histogram}_bucket":
            continue
        found = dict(sample_labels)
        if not labels.items() <= found.items() or "le" not in found:
            continue
        bound = float(found["le"])
        summed[bound] = summed.get(bound, 0.0) + value
    return sorted(summed.items())


def bucket_delta(after: Buckets, before: Buckets) -> Buckets:
    """What was observed between two scrapes: ``after`` minus ``before``, bound by bound (a bound
    missing before counts as 0: the series appeared meanwhile)."""
    earlier = dict(before)
    return [(bound, count - earlier.get(bound, 0.0)) for bound, count in after]


def histogram_quantile(q: float, cumulative: Buckets) -> float | None:
    """Prometheus's ``histogram_quantile(q, ...)`` over cumulative buckets; None when nothing was
    observed or the buckets lack their ``+Inf`` bound."""
    if not 0 <= q <= 1:
        raise ValueError(f"quantile {q} outside [0, 1]")
    if len(cumulative) < 2 or not math.isinf(cumulative[-1][0]):
        return None
    counts: list[float] = []
    for _, count in cumulative:  # Prometheus forces monotonicity (a scrape mid-update)
        counts.append(max(count, counts[-1]) if counts else count)
    total = counts[-1]
    if total <= 0:
        return None
    rank = q * total
    index = next(i for i, count in enumerate(counts) if count >= rank)
    if index == len(cumulative) - 1:
        return cumulative[-2][0]
    end = cumulative[index][0]
    if index == 0 and end <= 0:
        return end
    start = cumulative[index - 1][0] if index > 0 else 0.0
    below = counts[index - 1] if index > 0 else 0.0
    inside = counts[index] - below
    if inside <= 0:  # q = 0 over an empty first bucket
        return start
    return start + (end - start) * (rank - below) / inside


def tail_quantile(latencies: Sequence[float], unanswered: int, q: float = QUANTILE) -> float | None:
    """The nearest-rank ``q`` quantile of ``latencies`` plus ``unanswered`` infinitely late ones."""
    ordered = sorted([*latencies, *([math.inf] * unanswered)])
    if not ordered:
        return None
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


@dataclass(frozen=True)
class StepFigures:
    """What one churn step measured."""

    asked_rate: float  # changes per second
    achieved_rate: float
    queue_p99: float | None  # None: no key went through the queue
    status_p99: float | None  # None: no change was made


@dataclass(frozen=True)
class Verdict:
    kept_up: bool
    queue_ok: bool
    status_ok: bool

    @property
    def holds(self) -> bool:
        return self.kept_up and self.queue_ok and self.status_ok


def judge(
    step: StepFigures,
    *,
    queue_target: float = QUEUE_P99_TARGET,
    status_target: float = STATUS_P99_TARGET,
    kept_up: float = KEPT_UP,
) -> Verdict:
    """A step's verdict; a step with no change, or no key queued, cannot show its SLO holds."""
    return Verdict(
        kept_up=step.asked_rate > 0 and step.achieved_rate >= kept_up * step.asked_rate,
        queue_ok=step.queue_p99 is not None and step.queue_p99 <= queue_target,
        status_ok=step.status_p99 is not None and step.status_p99 <= status_target,
    )


def highest_sustained(steps: Sequence[StepFigures]) -> float | None:
    """The highest asked rate among the steps that hold (None: none did)."""
    held = [step.asked_rate for step in steps if judge(step).holds]
    return max(held) if held else None
