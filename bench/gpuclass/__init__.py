"""The GPUClass benchmark: ``python -m bench gpuclass`` (or ``python -m bench.gpuclass``).

Four scenarios, one table. *pure*: the pure core in process on 5,000 nodes and 150,000 pods (a full
pass, with the default and with eight VM sizes per class; one pod event; the aggregates' memory)
against a naive recomputation and ``json.loads``. *dra*: the same world with a ResourceSlice per node,
a ResourceClaim per GPU VM, half the classes counting DRA devices and whole-VM shapes on every class
(a full pass; a Pod, ResourceSlice and ResourceClaim event, each against ``json.loads``).
*live*: the operator as a subprocess on the local control plane under GPU pod churn (convergence
after the last change, status writes while nothing changes). *coldstart*: the operator's start on a
control plane holding 5,000 Nodes and 150,000 Pods (the issue's envelope for one replica), against a
plain paged LIST of them, and its peak memory. Targets live here,
never in tests; the exit status is 1 when a figure misses its target.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from bench.gpuclass import coldstart, dra, live, pure
from harness.gpuclass_world import WorldSpec
from harness.report import Row, progress, report


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench gpuclass", description=__doc__)
    parser.add_argument("--scenario", choices=("all", "pure", "dra", "live", "coldstart"), default="all")
    parser.add_argument("--pass-runs", type=int, default=50, help="passes timed (median)")
    parser.add_argument("--naive-runs", type=int, default=3, help="naive passes timed (median)")
    parser.add_argument("--event-pods", type=int, default=4_000, help="pods drawn for events (two each)")
    parser.add_argument(
        "--no-kubevirt-variant",
        action="store_true",
        help="skip the memory of a world whose VMs without GPU ask for devices.kubevirt.io/*",
    )
    parser.add_argument("--pods", type=int, default=2_000, help="live: GPU pods created before the churn")
    parser.add_argument("--churn-rounds", type=int, default=3, help="live: rounds of churn")
    parser.add_argument("--concurrency", type=int, default=16, help="live: API calls in flight")
    parser.add_argument(
        "--quiet-seconds", type=float, default=60.0, help="live: time without changes to count writes over"
    )
    parser.add_argument("--cold-nodes", type=int, default=coldstart.COLD_NODES, help="coldstart: Nodes")
    parser.add_argument("--cold-pods", type=int, default=coldstart.COLD_PODS, help="coldstart: Pods")
    parser.add_argument(
        "--cold-gpu-pods", type=int, default=coldstart.COLD_GPU_PODS, help="coldstart: of them GPU VMs"
    )
    parser.add_argument(
        "--cold-concurrency",
        type=int,
        default=coldstart.COLD_CONCURRENCY,
        help="coldstart: creates in flight",
    )
    parser.add_argument(
        "--cold-runs", type=int, default=coldstart.COLD_RUNS, help="coldstart: baseline/start turns (median)"
    )
    parser.add_argument(
        "--cold-profile", type=Path, default=None, help="coldstart: one more start under cProfile, saved here"
    )
    return parser.parse_args(argv)


class Result(Protocol):
    @property
    def rows(self) -> list[Row]: ...

    @property
    def notes(self) -> list[str]: ...


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    started = time.perf_counter()
    say = progress(started)
    scenarios: dict[str, Callable[[], Result]] = {
        "pure": lambda: pure.run(
            pure.PureOptions(
                world=WorldSpec(),
                pass_runs=args.pass_runs,
                naive_runs=args.naive_runs,
                event_pods=args.event_pods,
                kubevirt_variant=not args.no_kubevirt_variant,
            ),
            say,
        ),
        "dra": lambda: dra.run(
            dra.DraOptions(world=WorldSpec(), pass_runs=args.pass_runs, event_objects=args.event_pods // 2),
            say,
        ),
        "live": lambda: live.run(
            live.LiveOptions(
                pods=args.pods,
                churn_rounds=args.churn_rounds,
                concurrency=args.concurrency,
                quiet_seconds=args.quiet_seconds,
            ),
            say,
        ),
        "coldstart": lambda: coldstart.run(
            coldstart.ColdOptions(
                nodes=args.cold_nodes,
                pods=args.cold_pods,
                gpu_pods=args.cold_gpu_pods,
                concurrency=args.cold_concurrency,
                runs=args.cold_runs,
                profile=args.cold_profile,
            ),
            say,
        ),
    }
    rows: list[Row] = []
    notes: list[str] = []
    for name, scenario in scenarios.items():  # in this order: each world is gone before the next
        if args.scenario in ("all", name):
            result = scenario()
            rows += result.rows
            notes += result.notes
    return report("GPUClass benchmark", rows, notes, started)
