"""Run an operator module under ``tracemalloc``, to find where its memory grows during a soak.

    SOAK_MEMWHERE_MODULE=operators.endpointattachment SOAK_MEMWHERE_OUT=/tmp/where.txt \\
        python -m bench.soak.memwhere --kubeconfig ... (the operator's own arguments)

The first SIGUSR1 takes a baseline snapshot; each later one writes, to ``SOAK_MEMWHERE_OUT``, the
allocation sites (by traceback) that grew most since the baseline, biggest first. The operator
itself runs unchanged (``runpy``), only slower: tracing every allocation costs CPU and memory.

Decides only the diagnosis; the soak (``--where-memory``) decides when to signal.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import tracemalloc
from types import FrameType
from typing import Final

MODULE_ENV: Final = "SOAK_MEMWHERE_MODULE"
OUT_ENV: Final = "SOAK_MEMWHERE_OUT"
FRAMES: Final = 12
TOP: Final = 12
SHOWN_FRAMES: Final = 6  # the innermost frames of each site, in the report


def main() -> None:
    module, out = os.environ[MODULE_ENV], os.environ[OUT_ENV]
    tracemalloc.start(FRAMES)
    ignored = [
        tracemalloc.Filter(False, tracemalloc.__file__),
        tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
    ]
    baseline: list[tracemalloc.Snapshot] = []

    def dump(_signum: int, _frame: FrameType | None) -> None:
        snapshot = tracemalloc.take_snapshot().filter_traces(ignored)
        if not baseline:
            baseline.append(snapshot)
            return
        grown = [s for s in snapshot.compare_to(baseline[0], "traceback") if s.size_diff > 0][:TOP]
        lines: list[str] = []
        for stat in grown:
            now = stat.size / 1024
            lines.append(
                f"{stat.size_diff / 1024:+,.0f} KiB in {stat.count_diff:+,} blocks (now {now:,.0f} KiB)"
            )
            lines.extend(
                f"    {line}" for line in stat.traceback.format(most_recent_first=True)[: 2 * SHOWN_FRAMES]
            )
        partial = f"{out}.partial"
        with open(partial, "w") as file:
            file.write("\n".join(lines) + "\n")
        os.replace(partial, out)

    signal.signal(signal.SIGUSR1, dump)
    sys.argv = [module, *sys.argv[1:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
