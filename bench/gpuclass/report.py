"""The benchmark's table: one row per figure, with its target, verdict and ratio against a baseline.

Decides only presentation: units (s, ms, µs; MB) and the column layout. A row without a target is
context (a baseline, or a figure the brief sets no target for) and has no verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

TIMES = "\u00d7"  # the multiplication sign
COLUMNS = ("figure", "value", "target", "verdict", "ratio")


@dataclass(frozen=True)
class Row:
    figure: str
    value: str
    target: str = ""
    met: bool | None = None  # None: no target
    ratio: str = ""

    @property
    def verdict(self) -> str:
        return "" if self.met is None else ("meets" if self.met else "misses")


def seconds(value: float) -> str:
    """A duration in the unit that keeps three significant figures readable."""
    if value >= 1:
        return f"{value:.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.2f} ms"
    return f"{value * 1e6:.2f} µs"


def megabytes(value: float) -> str:
    return f"{value / 1e6:.1f} MB"


def times(value: float) -> str:
    """A ratio, with the multiplication sign: 1,234, 12.3 or 0.12 times."""
    if value >= 100:
        return f"{value:,.0f}{TIMES}"
    if value >= 10:
        return f"{value:.1f}{TIMES}"
    return f"{value:.2f}{TIMES}"


def render(title: str, rows: Sequence[Row], notes: Sequence[str] = ()) -> str:
    cells = [COLUMNS, *((r.figure, r.value, r.target, r.verdict, r.ratio) for r in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    rule = "+".join("-" * (w + 2) for w in widths)
    lines = [title, rule]
    for n, row in enumerate(cells):
        lines.append("|".join(f" {cell:<{w}} " for cell, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            lines.append(rule)
    lines.append(rule)
    lines += [f"  {note}" for note in notes]
    return "\n".join(lines)
