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


# A figure's units, biggest first: (least value, scale, format, unit); the last is the rest's.
Units = tuple[tuple[float, float, str, str], ...]
_DURATION: Units = (
    (10, 1, ".1f", " s"),
    (1, 1, ".2f", " s"),
    (1e-3, 1e3, ".1f", " ms"),
    (0, 1e6, ".0f", " µs"),
)
_SECONDS: Units = ((1, 1, ".2f", " s"), (1e-3, 1e3, ".2f", " ms"), (0, 1e6, ".2f", " µs"))
_RATIO: Units = ((10, 1, ".1f", MULTIPLY), (0, 1, ".2f", MULTIPLY))
_TIMES: Units = ((100, 1, ",.0f", MULTIPLY), (10, 1, ".1f", MULTIPLY), (0, 1, ".2f", MULTIPLY))


def _in_units(value: float, units: Units) -> str:
    _, scale, spec, unit = next((u for u in units[:-1] if value >= u[0]), units[-1])
    return f"{value * scale:{spec}}{unit}"


def duration(value: float) -> str:
    """Seconds, in the unit that reads best."""
    return _in_units(value, _DURATION)


def seconds(value: float) -> str:
    """A duration in the unit that keeps three significant figures readable."""
    return _in_units(value, _SECONDS)


def megabytes(value: float) -> str:
    return f"{value / 1e6:.1f} MB"


def ratio(value: float) -> str:
    return _in_units(value, _RATIO)


def times(value: float) -> str:
    """A ratio, with the multiplication sign: 1,234, 12.3 or 0.12 times."""
    return _in_units(value, _TIMES)


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
