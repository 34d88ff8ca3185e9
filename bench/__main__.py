"""make bench: every benchmark, each printing its figures as ratios against a baseline from the same run.

The benchmarks arrive with the operators (bench/gpuclass, bench/endpointattachment).
"""

from __future__ import annotations


def main() -> None:
    print("no benchmarks yet: they arrive with the operators (bench/gpuclass, bench/endpointattachment)")


if __name__ == "__main__":
    main()
