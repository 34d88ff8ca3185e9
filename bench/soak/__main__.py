"""python -m bench.soak [--minutes N] [--help]: the soak benchmark alone."""

from __future__ import annotations

from bench.soak import run

if __name__ == "__main__":
    raise SystemExit(run())
