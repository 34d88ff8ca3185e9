"""The benchmarks' tables and the few statistics they print.

Decides only presentation, in the house style of the benchmarks (one row per figure: value, target,
verdict, ratio against a baseline measured in the same run), and how a percentile is taken: nearest
rank, so p99 of 100 samples is the 99th smallest, and every reported value was really observed.
A row without a target is context (a baseline, or a figure the brief sets no target for) and has no
verdict. Two styles of units stay as each benchmark has printed them: ``seconds``/``times`` (GPUClass)
and ``duration``/``ratio`` (EndpointAttachment, soak).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

MULTIPLY = "\u00d7"  # the multiplication sign
HEADER = ("figure", "value", "target", "verdict", "ratio")


@dataclass(frozen=True)
class Row:
    figure: str
    value: str
    target: str = ""
    met: bool | None = None  # None: context, no target
    ratio: str = ""

    def cells(self) -> tuple[str, str, str, str, str]:
        verdict = "" if self.met is None else ("meets" if self.met else "MISSES")
        return (self.figure, self.value, self.target, verdict, self.ratio)


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0 < q <= 1) of a non-empty sample."""
    if not values:
        raise ValueError("no samples")
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def duration(value: float) -> str:
    """Seconds, in the unit that reads best."""
    if value >= 10:
        return f"{value:.1f} s"
    if value >= 1:
        return f"{value:.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.1f} ms"
    return f"{value * 1e6:.0f} µs"


def seconds(value: float) -> str:
    """A duration in the unit that keeps three significant figures readable."""
    if value >= 1:
        return f"{value:.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.2f} ms"
    return f"{value * 1e6:.2f} µs"


def megabytes(value: float) -> str:
    return f"{value / 1e6:.1f} MB"


def ratio(value: float) -> str:
    return f"{value:.2f}{MULTIPLY}" if value < 10 else f"{value:.1f}{MULTIPLY}"


def times(value: float) -> str:
    """A ratio, with the multiplication sign: 1,234, 12.3 or 0.12 times."""
    if value >= 100:
        return f"{value:,.0f}{MULTIPLY}"
    if value >= 10:
        return f"{value:.1f}{MULTIPLY}"
    return f"{value:.2f}{MULTIPLY}"


def table(title: str, rows: Sequence[Row], notes: Sequence[str] = ()) -> str:
    lines = [HEADER, *(row.cells() for row in rows)]
    widths = [max(len(line[column]) for line in lines) for column in range(len(HEADER))]
    rule = "+".join("-" * (width + 2) for width in widths)
    out = [title, rule]
    for index, line in enumerate(lines):
        out.append(
            "|".join(f" {cell.ljust(width)} " for cell, width in zip(line, widths, strict=True)).rstrip()
        )
        if index == 0:
            out.append(rule)
    out.append(rule)
    out.extend(f"  {note}" for note in notes)
    return "\n".join(out)


def progress(started: float) -> Callable[[str], None]:
    """``say``: a progress line on stderr, stamped with the seconds since ``started``."""

    def say(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {message}", file=sys.stderr, flush=True)

    return say


def report(title: str, rows: Sequence[Row], notes: Sequence[str], started: float) -> int:
    """Print the table with how many targets were missed and how long it took; 1 when a figure
    misses its target, else 0."""
    missed = [row.figure.strip() for row in rows if row.met is False]
    summary = f"{len(missed)} of {sum(row.met is not None for row in rows)} targets missed" + (
        f": {'; '.join(missed)}" if missed else ""
    )
    print(table(title, rows, [*notes, summary, f"took {time.perf_counter() - started:.0f}s"]), flush=True)
    return 1 if missed else 0
