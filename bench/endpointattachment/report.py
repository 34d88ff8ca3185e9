"""The EndpointAttachment benchmark's table and the few statistics it prints.

Decides only presentation, in the house style of the benchmarks (one row per figure: value, target,
verdict, ratio against a baseline measured in the same run), and how a percentile is taken: nearest
rank, so p99 of 100 samples is the 99th smallest, and every reported value was really observed.
A row without a target is context and has no verdict.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MULTIPLY = "\u00d7"
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


def ratio(value: float) -> str:
    return f"{value:.2f}{MULTIPLY}" if value < 10 else f"{value:.1f}{MULTIPLY}"


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
