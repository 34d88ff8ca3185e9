"""What a soak run's samples say: memory flat after warm-up, few passes per change, the churn's rate.

Decides (pure: samples in, report rows out):

* the warm-up is cut off first (caches filling, the allocator's arenas growing; the caller's cut:
  a fifth of the run, and never before every population is full); what is left is split into thirds
  by time;
* memory: each operator's median RSS in the last third against its median in the first third
  (target: within ``MEMORY_TOLERANCE``, i.e. 5%); a median, so one sample taken mid-burst does not
  decide;
* passes per change, for each operator: its passes (``controller_runtime_reconcile_total``, every
  controller it runs) after the warm-up divided by the changes that concern it in the same span
  (target: at most ``MAX_PASSES_PER_CHANGE``, 1.5). A **change** of an operator is one of the churn's
  writes the API accepted to an object of a kind that operator acts on (``CONCERNS``, counted by
  the churn write by write, ``churn.Counts.written``): for EndpointAttachment every create and
  delete of an attachment and of a reserved claim (the churn writes nothing else of them); for
  GPUClass every write of a GPU node (its create, status, taint and delete) and of a GPU VM's pod
  (its create, status and delete). An application's pods concern neither: they request no GPU, and
  EndpointAttachment reads pods only for its VM modes, which the soak does not churn. What the
  operators' own writes cause (a claim binding, a Service answered) is the cost, not a change. The
  first third's and the last third's figures are shown beside it (a cost growing with the run's
  history is a leak of work, as a growing RSS is a leak of memory);
* API requests per change (the API server's ``apiserver_request_total``, whoever sent them, per
  create or delete the churn made), first third and last third: reported, no target;
* the churn itself: the rate achieved against the rate asked for (the run is only a soak at the rate
  it really reached).

Does not: take samples, or read a clock.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from harness.report import Row, ratio

MEMORY_TOLERANCE: Final = 0.05
MAX_PASSES_PER_CHANGE: Final = 1.5
RATE_TOLERANCE: Final = 0.10  # the churn counts as run at the asked rate within this much
# Each operator's changes: the kinds of ``churn.WRITTEN_KINDS`` whose writes concern it (see above).
CONCERNS: Final[Mapping[str, tuple[str, ...]]] = {
    "endpointattachment": ("attachment", "claim"),
    "gpuclass": ("node", "vm-pod"),
}


@dataclass(frozen=True)
class Sample:
    """One reading, ``at`` seconds after the churn started."""

    at: float
    changes: int  # creates and deletes the churn made so far (all kinds)
    api_requests: int  # the API server's request count so far
    rss: Mapping[str, int] = field(default_factory=dict)  # operator -> bytes
    passes: Mapping[str, float] = field(default_factory=dict)  # operator -> reconciles so far
    mix: Mapping[str, int] = field(default_factory=dict)  # kind -> creates and deletes so far
    written: Mapping[str, int] = field(default_factory=dict)  # churn.WRITTEN_KINDS -> writes so far

    def changes_of(self, operator: str) -> int:
        """The churn's writes so far that concern ``operator`` (``CONCERNS``)."""
        return sum(self.written.get(kind, 0) for kind in CONCERNS.get(operator, ()))


@dataclass(frozen=True)
class Window:
    first: float  # seconds: samples in [first, last]
    last: float


def after_warmup(samples: Sequence[Sample], warmup: float) -> list[Sample]:
    return [s for s in samples if s.at >= warmup]


def thirds(samples: Sequence[Sample], warmup: float) -> tuple[list[Sample], list[Sample]] | None:
    """The samples of the first and the last third after ``warmup``; None if too few to compare."""
    after = after_warmup(samples, warmup)
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


def _passes_per_change(window: Sequence[Sample], operator: str) -> float | None:
    changes = window[-1].changes_of(operator) - window[0].changes_of(operator)
    passes = window[-1].passes.get(operator, 0) - window[0].passes.get(operator, 0)
    return passes / changes if changes > 0 else None


def _mib(value: float) -> str:
    return f"{value / 2**20:.1f} MiB"


def _percent(value: float) -> str:
    return f"{value * 100:+.1f}%"


def _figure(value: float | None) -> str:
    return "no changes" if value is None else f"{value:.2f}"


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


def cost_rows(
    after: Sequence[Sample], first: Sequence[Sample], last: Sequence[Sample], operators: Sequence[str]
) -> list[Row]:
    """Passes per change of each operator after the warm-up (judged), with its thirds beside it;
    API requests per change in the first and the last third (reported)."""
    rows: list[Row] = []
    for name in operators:
        whole = _passes_per_change(after, name)
        changes = after[-1].changes_of(name) - after[0].changes_of(name)
        early, late = _passes_per_change(first, name), _passes_per_change(last, name)
        rows.append(
            Row(
                f"{name}: passes per change",
                f"{_figure(whole)} over {changes:,} changes "
                f"(first third {_figure(early)}, last {_figure(late)})",
                f"≤ {MAX_PASSES_PER_CHANGE:g}",
                whole is not None and whole <= MAX_PASSES_PER_CHANGE,
                ratio(whole / MAX_PASSES_PER_CHANGE) if whole is not None else "",
            )
        )
    before = _per_change(first, first[-1].api_requests - first[0].api_requests)
    later = _per_change(last, last[-1].api_requests - last[0].api_requests)
    rows.append(
        Row(
            "API requests per change (all clients)",
            f"{_figure(before)} → {_figure(later)} (first third → last)",
            "",
            None,
            ratio(later / before) if before and later is not None else "",
        )
    )
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
    after = after_warmup(samples, warmup)
    notes = [
        f"warm-up {warmup:.0f}s cut off; first third {first[0].at:.0f}-{first[-1].at:.0f}s, "
        f"last third {last[0].at:.0f}-{last[-1].at:.0f}s ({len(samples)} samples)",
        f"changes by kind, first third {_mix(first)}; last third {_mix(last)} "
        "(a cost per change moves with the mix)",
    ]
    return memory_rows(first, last, operators) + cost_rows(after, first, last, operators), notes


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


def events_row(
    events: Sequence[Mapping[str, object]], seconds: float, burst: int, refill_seconds: float
) -> Row:
    """Events per attachment over the soak: the events.k8s.io/v1 Events regarding each attachment
    (by its UID), the most any one has and the mean, against what the recorder allows one attachment
    in that time (its burst, plus one write per refill)."""
    per: dict[str, int] = {}
    for event in events:
        regarding = event.get("regarding")
        if isinstance(regarding, Mapping) and regarding.get("kind") == "EndpointAttachment":
            uid = str(regarding.get("uid") or "")
            per[uid] = per.get(uid, 0) + 1
    most = max(per.values(), default=0)
    mean = sum(per.values()) / len(per) if per else 0.0
    bound = burst + int(seconds // refill_seconds)
    return Row(
        "endpointattachment: Events per attachment (most; mean)",
        f"{most}; {mean:.1f} over {len(per)} attachments",
        f"most <= {bound}",
        most <= bound,
    )
