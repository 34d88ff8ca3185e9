"""What a benchmark reads of an operator run as a process: its log and its profile.

Decides: how much of a log is shown when a start fails, that a logged traceback fails the run, how
the steps of a start are timed from the log's own timestamps, and how a cProfile dump is summarised
as note lines. Does not: start or stop the operator (``harness.operators`` and the scenarios do).
"""

from __future__ import annotations

import contextlib
import io
import os
import pstats
from datetime import datetime
from pathlib import Path
from typing import Final

from shared.operator import STARTED_LOG

TRACEBACK: Final = "Traceback"
LOG_TAIL_LINES: Final = 40  # of the operator's log, shown when a start fails
PROFILE_LINES: Final = 25  # functions shown from the profile, by own time and by cumulative time
# The operator's log lines start with ``%(asctime)s``: local time, milliseconds after a comma.
LOG_TIME_FORMAT: Final = "%Y-%m-%d %H:%M:%S,%f"
LOG_TIME_LENGTH: Final = len("2025-03-01 10:00:00,000")
# The steps of a start the operator logs, as (row label, text of the log line).
LEADING_LINE: Final = "leading: starting controllers"
LOG_STEPS: Final = (
    ("started (interpreter, imports, credentials)", STARTED_LOG),
    ("caches synced", "caches synced:"),
    ("leading", LEADING_LINE),
)


def log_tail(log_path: Path) -> str:
    return "\n".join(log_path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:])


def check_log(log_path: Path) -> None:
    assert TRACEBACK not in log_path.read_text(errors="replace"), (
        f"the operator logged a traceback:\n{log_tail(log_path)}"
    )


def steps(log_path: Path, spawned: float) -> dict[str, float]:
    """Seconds from the spawn to each logged step of the start (the first line naming it)."""
    found: dict[str, float] = {}
    for line in log_path.read_text(errors="replace").splitlines():
        for label, text in LOG_STEPS:
            if label not in found and text in line:
                with contextlib.suppress(ValueError):
                    at = datetime.strptime(line[:LOG_TIME_LENGTH], LOG_TIME_FORMAT).timestamp()
                    found[label] = at - spawned
    return {label: found[label] for label, _ in LOG_STEPS if label in found}


def profile_summary(path: Path) -> list[str]:
    """The profile's top functions by own time and by cumulative time, as note lines."""
    notes: list[str] = []
    for order in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(str(path), stream=out).sort_stats(order).print_stats(PROFILE_LINES)
        notes.append(f"profile of one start, by {order}:")
        notes += [line for line in out.getvalue().splitlines() if line.strip()]
    return notes


def load_average() -> str:
    """The machine's 1, 5 and 15 minute load averages (other work on a shared machine)."""
    return " ".join(f"{load:.1f}" for load in os.getloadavg())
