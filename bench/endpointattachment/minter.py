"""One minting worker, as its own process: ``python -m bench.endpointattachment.minter ...``.

``--mode mint`` runs the operator's own minting code for ``--holders`` synthetic holders (kind
EndpointAttachment, UIDs derived from ``--run-id`` and the worker number), one mint at a time, choosing
candidates as ``reconcile`` does: the class's pool (``addresses.pool_of``) walked from the holder's
``start_offset``, the first address not in what *this worker* has seen taken (its own mints and the
conflicts it met), the allocation built by ``addresses.allocation_manifest`` and created by
``allocator.mint``; a 409 held by another holder counts that address as taken and moves on.

``--mode plain`` is the baseline: the same number of allocation creates, of addresses dealt out to
the workers in advance (worker ``i`` of ``n`` takes every ``n``-th candidate from the ``i``-th), so
nothing is searched and nothing conflicts.

Protocol with the parent: the worker connects and builds its holders, prints ``ready``, waits (with a
deadline) for a ``go`` line on stdin, works, and prints one JSON line: what every holder got, the
conflicts it met, its errors and its wall-clock start and end (``time.time()``, comparable between
the processes of one machine).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import select
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from operators.endpointattachment import allocator
from operators.endpointattachment.addresses import (
    Holder,
    allocation_manifest,
    first_free,
    pool_of,
    start_offset,
)
from operators.endpointattachment.constants import ENDPOINT_ATTACHMENT_KIND
from operators.endpointattachment.world import ALLOCATIONS
from shared.kube import ApiError, Kube
from shared.runtime.writes import Writer

HOLDER_NAMESPACE = "bench-ea-mint"
GO_TIMEOUT = 120.0
UID_NAMESPACE = uuid.UUID("6f1c9a52-1d7e-4c53-9a36-4b8f0c1e2d3a")  # this benchmark's own UUIDv5 space


@dataclass
class WorkerReport:
    worker: int
    mode: str
    minted: dict[str, str] = field(default_factory=dict)  # holder UID -> address
    conflicts: int = 0
    longest: int = 0  # the most conflicts one holder met before its address
    exhausted: int = 0  # holders for which this worker saw every candidate taken
    errors: list[str] = field(default_factory=list)
    started: float = 0.0
    finished: float = 0.0


def holder_uid(run_id: str, worker: int, index: int) -> str:
    return str(uuid.uuid5(UID_NAMESPACE, f"{run_id}/{worker}/{index}"))


async def mint_all(kube: Kube, report: WorkerReport, args: argparse.Namespace) -> None:
    pool = pool_of({"cidrs": [args.cidr]})
    taken: set[str] = set()  # what this worker has seen taken, and only that
    writer = Writer(kube, lambda _: None)  # no cache to write through: this worker keeps ``taken``
    for index in range(args.holders):
        uid = holder_uid(args.run_id, args.worker, index)
        holder = Holder(ENDPOINT_ATTACHMENT_KIND, HOLDER_NAMESPACE, f"w{args.worker}-{index:05d}", uid)
        candidates = pool.candidates(start_offset(pool, uid))
        met = 0
        for _ in range(pool.capacity):  # each candidate at most once
            choice = first_free(candidates, taken)
            if choice is None:
                report.exhausted += 1
                break
            try:
                outcome, _ = await allocator.mint(
                    writer, allocation_manifest(choice, args.class_name, holder)
                )
            except ApiError as error:
                report.errors.append(f"{choice}: {error}")
                break
            taken.add(str(choice))
            if outcome is allocator.Minted.OURS:
                report.minted[uid] = str(choice)
                break
            report.conflicts += 1
            met += 1
        report.longest = max(report.longest, met)


async def create_plain(kube: Kube, report: WorkerReport, args: argparse.Namespace) -> None:
    pool = pool_of({"cidrs": [args.cidr]})
    dealt = itertools.islice(pool.candidates(), args.worker, None, args.workers)
    for index, address in enumerate(itertools.islice(dealt, args.holders)):
        uid = holder_uid(args.run_id, args.worker, index)
        holder = Holder(ENDPOINT_ATTACHMENT_KIND, HOLDER_NAMESPACE, f"w{args.worker}-{index:05d}", uid)
        try:
            await kube.create(ALLOCATIONS.path(), allocation_manifest(address, args.class_name, holder))
        except ApiError as error:
            if error.status == 409:
                report.conflicts += 1
            else:
                report.errors.append(f"{address}: {error}")
            continue
        report.minted[uid] = str(address)


def wait_for_go() -> None:
    readable, _, _ = select.select([sys.stdin], [], [], GO_TIMEOUT)
    if not readable or sys.stdin.readline().strip() != "go":
        raise SystemExit(f"no 'go' from the parent within {GO_TIMEOUT:.0f}s")


async def work(args: argparse.Namespace) -> WorkerReport:
    kube = await Kube.connect(args.kubeconfig)
    await kube.list(ALLOCATIONS.path())  # the session is open before the clock starts
    report = WorkerReport(worker=args.worker, mode=args.mode)
    print("ready", flush=True)
    await asyncio.to_thread(wait_for_go)
    report.started = time.time()
    if args.mode == "mint":
        await mint_all(kube, report, args)
    else:
        await create_plain(kube, report, args)
    report.finished = time.time()
    return report


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.endpointattachment.minter", description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--class-name", required=True)
    parser.add_argument("--cidr", required=True)
    parser.add_argument("--worker", type=int, required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--holders", type=int, required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--mode", choices=("mint", "plain"), default="mint")
    args = parser.parse_args(argv)
    report = asyncio.run(work(args))
    print(json.dumps(asdict(report)), flush=True)


if __name__ == "__main__":
    main()
