"""Print the catalogue's counts: ``python -m tests.catalogue``."""

from __future__ import annotations

from tests.catalogue import ROWS, counts

if __name__ == "__main__":
    counted = counts()
    print(f"rows: {len(ROWS)}")
    for answer in (
        "refused",
        "conditioned",
        "handled",
        "refused-by-kubernetes-name-rules",
        "pending-behaviour",
    ):
        print(f"{answer}: {counted[answer]}")
