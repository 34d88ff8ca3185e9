"""What every generator of checked-in files does last: write the files, or, with ``--check``, name
the stale ones and exit 1 (``python -m hack.docgen``, ``python -m hack.charts``)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path


def check_or_write(
    check: bool,
    stale: Callable[[], Sequence[str | Path]],
    write: Callable[[], Sequence[str | Path]],
    command: str,
) -> int:
    if check:
        outdated = stale()
        for path in outdated:
            print(f"stale: {path} (run: {command})", file=sys.stderr)
        return 1 if outdated else 0
    for path in write():
        print(f"wrote {path}")
    return 0
