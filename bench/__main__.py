"""make bench: every benchmark, each printing its figures as ratios against a baseline from the same run.

    python -m bench                  every benchmark with its defaults
    python -m bench NAME [ARGS...]   one benchmark; ARGS go to it (python -m bench gpuclass --help)

The exit status is 0 when every benchmark met its targets, 1 when one missed (or failed).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from bench import endpointattachment, gpuclass, soak

# Each benchmark is a function of its arguments returning an exit status (1: a target missed).
BENCHMARKS: dict[str, Callable[[Sequence[str]], int]] = {
    "gpuclass": gpuclass.main,
    "endpointattachment": endpointattachment.run,
    "soak": soak.run,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        print(f"benchmarks: {', '.join(BENCHMARKS)}")
        return 0
    if args:
        name, rest = args[0], args[1:]
        if name not in BENCHMARKS:
            print(f"no benchmark {name!r}; there are: {', '.join(BENCHMARKS)}", file=sys.stderr)
            return 2
        return BENCHMARKS[name](rest)
    status = 0
    for run in BENCHMARKS.values():
        status = max(status, run([]))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
