"""Scenario 2: concurrent minting by separate processes never hands out one address twice.

``workers`` processes (``bench.endpointattachment.minter``) mint ``holders`` addresses each from one
class's CIDR with the operator's own minting code, all released at once by a ``go`` line. Then the
allocations are listed from the API and checked against what every worker says it got:

* duplicates: an address reported by two holders, a holder that got two addresses, a report that the
  API contradicts (the allocation of that address names another holder, or does not exist), or an
  allocation whose name is not the lock name of its address; must be 0;
* minted: holders that got an address (the pool holds more than asked, so every holder should);
* addresses/s: addresses minted over the wall time from ``go`` to the last worker's end;
* conflicts: 409s the workers met (an address another worker had taken meanwhile).

Baseline for the ratio: the same number of allocation creates by the same number of processes, of
addresses dealt out in advance (no search, no conflicts), in another CIDR of the same size, timed in the
same run. Both sets of allocations are deleted at the end. The operator is not running meanwhile: the
minting code is measured against the API alone (the operator's repair would in time remove allocations
of holders that do not exist).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.endpointattachment.report import Row, ratio
from operators.endpointattachment.addresses import InvalidAddress, allocation_name, pool_of
from operators.endpointattachment.world import ALLOCATIONS
from shared.kube import ApiError, Kube, Obj

ROOT = Path(__file__).resolve().parents[2]
MINT_CLASS = "bench-mint"
PLAIN_CLASS = "bench-mint-plain"
# RFC 2544's benchmarking range, away from the attachments' addresses.
MINT_NETWORK = "198.19.0.0"
PLAIN_NETWORK = "198.19.128.0"
START_TIMEOUT = 60.0
DELETE_CONCURRENCY = 16


@dataclass(frozen=True)
class MintOptions:
    workers: int = 4
    holders: int = 500  # per worker
    prefix: int = 21
    timeout: float = 180.0  # for one set of workers to finish


@dataclass(frozen=True)
class MintResult:
    rows: list[Row]
    notes: list[str]


@dataclass(frozen=True)
class Outcome:
    reports: list[dict[str, Any]]
    wall: float  # from go to the last worker's end

    @property
    def minted(self) -> int:
        return sum(len(r["minted"]) for r in self.reports)

    @property
    def conflicts(self) -> int:
        return sum(int(r["conflicts"]) for r in self.reports)

    @property
    def errors(self) -> list[str]:
        return [e for r in self.reports for e in r["errors"]]


async def run_workers(
    kubeconfig: str, mode: str, class_name: str, cidr: str, options: MintOptions, log_dir: Path
) -> Outcome:
    run_id = uuid.uuid4().hex
    processes = []
    logs = []
    try:
        for worker in range(options.workers):
            log = (log_dir / f"minter-{mode}-{worker}.log").open("wb")
            logs.append(log)
            processes.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "bench.endpointattachment.minter",
                    f"--kubeconfig={kubeconfig}",
                    f"--class-name={class_name}",
                    f"--cidr={cidr}",
                    f"--worker={worker}",
                    f"--workers={options.workers}",
                    f"--holders={options.holders}",
                    f"--run-id={run_id}",
                    f"--mode={mode}",
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=log,
                    cwd=ROOT,
                )
            )
        for process in processes:
            assert process.stdout is not None
            line = await asyncio.wait_for(process.stdout.readline(), START_TIMEOUT)
            if line.strip() != b"ready":
                raise RuntimeError(
                    f"a minter did not start (said {line!r}); see {log_dir}/minter-{mode}-*.log"
                )
        for process in processes:
            assert process.stdin is not None
            process.stdin.write(b"go\n")
            await process.stdin.drain()
            process.stdin.close()
        outputs = await asyncio.wait_for(
            asyncio.gather(*(_output(process) for process in processes)), options.timeout
        )
    finally:
        for process in processes:
            if process.returncode is None:
                process.kill()
                await process.wait()
        for log in logs:
            log.close()
    reports = [json.loads(out) for out in outputs]
    wall = max(r["finished"] for r in reports) - min(r["started"] for r in reports)
    return Outcome(reports, wall)


async def _output(process: asyncio.subprocess.Process) -> str:
    assert process.stdout is not None
    out = (await process.stdout.read()).decode()
    code = await process.wait()
    if code != 0:
        raise RuntimeError(f"a minter exited with {code}")
    return out.strip().splitlines()[-1]


async def listed_allocations(kube: Kube, class_name: str) -> list[Obj]:
    items = (await kube.list(ALLOCATIONS.path()))["items"]
    return [a for a in items if (a.get("spec") or {}).get("className") == class_name]


def duplicates(outcome: Outcome, allocations: Sequence[Obj]) -> tuple[int, list[str]]:
    """How many times the API or the reports show an address handed out twice, with examples."""
    problems: list[str] = []
    reported = [(uid, address) for r in outcome.reports for uid, address in r["minted"].items()]
    for address, times in Counter(address for _, address in reported).items():
        if times > 1:
            problems.append(f"{address} reported by {times} holders")
    for uid, times in Counter(uid for uid, _ in reported).items():
        if times > 1:
            problems.append(f"holder {uid} reported {times} addresses")
    holder_of = {}
    for allocation in allocations:
        spec = allocation.get("spec") or {}
        try:
            lock = allocation_name(str(spec.get("address")))
        except InvalidAddress:
            lock = ""
        if lock != allocation["metadata"]["name"]:
            problems.append(f"allocation {allocation['metadata']['name']} locks {spec.get('address')}")
        holder_of[str(spec.get("address"))] = str((spec.get("holder") or {}).get("uid"))
    for uid, times in Counter(holder_of.values()).items():
        if times > 1:
            problems.append(f"holder {uid} holds {times} allocations")
    for uid, address in reported:
        if holder_of.get(address) != uid:
            problems.append(f"{address} reported by {uid}, held by {holder_of.get(address)}")
    return len(problems), problems


async def delete_all(kube: Kube, allocations: Sequence[Obj]) -> None:
    limit = asyncio.Semaphore(DELETE_CONCURRENCY)

    async def delete(allocation: Obj) -> None:
        metadata = allocation["metadata"]
        async with limit:
            with contextlib.suppress(ApiError):
                await kube.delete(ALLOCATIONS.path(name=metadata["name"]), uid=metadata["uid"])

    await asyncio.gather(*(delete(a) for a in allocations))


async def run(options: MintOptions, kubeconfig: str, log_dir: Path, say: Callable[[str], None]) -> MintResult:
    kube = await Kube.connect(kubeconfig)
    total = options.workers * options.holders
    mint_cidr, plain_cidr = f"{MINT_NETWORK}/{options.prefix}", f"{PLAIN_NETWORK}/{options.prefix}"
    capacity = pool_of({"cidrs": [mint_cidr]}).capacity
    if capacity < total:
        raise ValueError(f"{mint_cidr} holds {capacity} addresses, fewer than the {total} asked for")

    say(f"mint: baseline, {total:,} plain allocation creates by {options.workers} processes")
    plain = await run_workers(kubeconfig, "plain", PLAIN_CLASS, plain_cidr, options, log_dir)
    say(f"mint: {total:,} addresses from {mint_cidr} by {options.workers} minting processes")
    minted = await run_workers(kubeconfig, "mint", MINT_CLASS, mint_cidr, options, log_dir)
    allocations = await listed_allocations(kube, MINT_CLASS)
    found, problems = duplicates(minted, allocations)
    say("mint: checked; deleting the allocations")
    await delete_all(kube, [*allocations, *await listed_allocations(kube, PLAIN_CLASS)])
    left = len(await listed_allocations(kube, MINT_CLASS)) + len(await listed_allocations(kube, PLAIN_CLASS))

    rate, plain_rate = minted.minted / minted.wall, plain.minted / plain.wall
    per_worker = ", ".join(f"{len(r['minted'])}" for r in minted.reports)
    rows = [
        Row(
            f"mint: addresses minted ({options.workers} processes, {mint_cidr}, {capacity:,} usable)",
            f"{minted.minted:,}",
            f"= {total:,}",
            minted.minted == total,
            f"per worker: {per_worker}; {len(allocations):,} allocations listed",
        ),
        Row("mint: duplicate addresses (API and reports)", str(found), "= 0", found == 0),
        Row(
            "mint: addresses/s overall",
            f"{rate:,.0f}/s",
            ratio=f"÷ plain creates {plain_rate:,.0f}/s = {ratio(rate / plain_rate)}; {minted.wall:.1f}s",
        ),
        Row(
            "mint: 409 conflicts met",
            f"{minted.conflicts:,}",
            ratio=f"{minted.conflicts / max(1, minted.minted):.2f} per address (each a POST and a GET); "
            f"one holder met {max(int(r['longest']) for r in minted.reports)}",
        ),
        Row(
            "  baseline: plain allocation creates, dealt out in advance",
            f"{plain.minted:,} in {plain.wall:.1f}s",
            ratio=f"{plain.conflicts} conflicts",
        ),
    ]
    notes = [f"mint: {p}" for p in problems[:5]]
    errors = [*minted.errors, *plain.errors]
    if errors:
        notes.append(f"mint: {len(errors)} API errors, e.g. {errors[:3]}")
    exhausted = sum(int(r["exhausted"]) for r in minted.reports)
    if exhausted:
        notes.append(f"mint: {exhausted} holders found every candidate taken")
    notes.append(f"mint: allocations left after the clean-up: {left}")
    return MintResult(rows, notes)
