"""The soak benchmark: ``python -m bench soak [--minutes N]``.

A bounded churn run (20 minutes by default) with both operators running as processes against the
local control plane, and the load balancer of the tests (``harness.loadbalancer``) answering
the rendered Services. Attachments (some through claims), pods and GPU nodes are created and deleted
at ten times the issue's trial rate (600 attachments and 1,800 pods churned in 10 minutes; see
``churn``). Every ``--interval`` seconds it samples both operators' RSS (``/proc/<pid>/status``),
their passes (``controller_runtime_reconcile_total`` from their /metrics) and the API server's
request count (``apiserver_request_total`` from its /metrics), then reports (``analysis``), with the
Events per attachment at the end (``analysis.events_row``: bounded by the recorder's budget):

* memory flat after warm-up: each operator's median RSS in the last third within 5% of the first
  third's;
* passes per change at most 1.5 for each operator, a change being one of the churn's writes that
  concern that operator (``analysis.CONCERNS``); API requests per change (all clients), reported;
* the churn rate achieved against the rate asked for.

Each operator runs as one replica without leader election (a renewal stalled by a loaded machine
would make it exit, by design; the soak is about memory and cost). ``--where-memory`` runs them
under ``tracemalloc`` (``memwhere``) and prints the allocation sites that grew after the warm-up.

Every sample is also written as JSON lines next to the operators' logs, for a second look; the
directory is printed and kept when a target is missed. ``run`` returns 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import shutil
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from bench.soak import analysis, churn, memwhere
from hack.devcluster import LocalControlPlane
from harness.apimetrics import ApiServerMetrics
from harness.lane import address_substrate
from harness.loadbalancer import load_balancer
from harness.operators import RunningOperator, operator_process
from harness.procfs import memory_bytes
from harness.report import MULTIPLY, Row, progress, report
from harness.waiting import eventually
from operators.endpointattachment.api import ATTACHMENTS
from shared import events
from shared.kube import Kube
from shared.resources import EVENTS_V1

OPERATORS = {"gpuclass": "operators.gpuclass", "endpointattachment": "operators.endpointattachment"}
TRACEBACK = "Traceback"
READY_SECONDS = 120.0  # an operator's caches synced after its start
SETTLE_SECONDS = 120.0  # after the churn stops, every live attachment is Provisioned within this


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=20.0, help="churn duration (default 20)")
    parser.add_argument(
        "--warmup-minutes",
        type=float,
        help="cut off before comparing thirds (default: a fifth of the run, and never before every "
        "population is full)",
    )
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--rate", type=float, default=10.0, help="times the issue's trial rate (default 10)")
    parser.add_argument(
        "--attachments", type=int, default=churn.Rates.attachment_population, help="alive at once"
    )
    parser.add_argument("--pods", type=int, default=churn.Rates.pod_population, help="alive at once")
    parser.add_argument(
        "--where-memory",
        action="store_true",
        help="run the operators under tracemalloc (slower) and print the allocation sites that grew "
        "between the end of the warm-up and the end of the run",
    )
    parser.add_argument("--concurrency", type=int, default=churn.Rates.concurrency, help="changes in flight")
    return parser.parse_args(list(argv))


def rss_bytes(pid: int) -> int:
    """The process's resident set, from /proc; 0 once it has exited."""
    return memory_bytes(pid)


class Scraper:
    """Each operator's passes so far, from its /metrics; a scrape that fails (an HTTP error, a
    500 from a collector that raised) is counted, tried again, and otherwise answered with the last
    good reading."""

    ATTEMPTS = 3

    def __init__(self) -> None:
        self.failures: collections.Counter[str] = collections.Counter()
        self.last_failure: dict[str, str] = {}
        self._last: dict[str, float] = {}

    async def passes(self, name: str, operator: RunningOperator) -> float:
        for _ in range(self.ATTEMPTS):
            try:
                samples = await operator.scrape()
            except httpx.HTTPError as error:
                self.failures[name] += 1
                self.last_failure[name] = f"{type(error).__name__}: {error}"
                continue
            value = sum(
                v for (metric, _), v in samples.items() if metric == "controller_runtime_reconcile_total"
            )
            self._last[name] = value
            return value
        return self._last.get(name, 0.0)


async def sample(
    at: float,
    counts: churn.Counts,
    api: ApiServerMetrics,
    operators: dict[str, RunningOperator],
    scraper: Scraper,
) -> analysis.Sample:
    requests = await api.requests()
    return analysis.Sample(
        at=at,
        changes=counts.changes,
        api_requests=sum(requests.values()),
        rss={name: rss_bytes(op.process.pid) for name, op in operators.items()},
        passes={name: await scraper.passes(name, op) for name, op in operators.items()},
        mix=dict(counts.created + counts.deleted),
        written=dict(counts.written),
    )


def run(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    rates = churn.Rates(
        attachments=args.rate * churn.TRIAL_ATTACHMENTS_PER_MINUTE,
        pods=args.rate * churn.TRIAL_PODS_PER_MINUTE,
        nodes=args.rate * churn.TRIAL_NODES_PER_MINUTE,
        attachment_population=args.attachments,
        pod_population=args.pods,
        concurrency=args.concurrency,
    )
    seconds = args.minutes * 60
    warmup = (args.warmup_minutes * 60) if args.warmup_minutes is not None else seconds / 5
    started = time.perf_counter()
    say = progress(started)
    say("starting the local control plane")
    control_plane = LocalControlPlane()
    with control_plane as cluster:
        say(f"control plane ready in {cluster.ready_seconds or 0:.1f}s")
        try:
            rows, notes = asyncio.run(
                _run(
                    cluster.kubeconfig,
                    control_plane.dir,
                    rates,
                    seconds,
                    warmup,
                    args.interval,
                    say,
                    args.where_memory,
                )
            )
        except BaseException:
            say(f"failed; the control plane's files and the logs stay in {control_plane.dir}")
            raise
    if any(row.met is False for row in rows):
        notes.append(f"samples and operator logs kept in {control_plane.dir}")
    else:
        shutil.rmtree(control_plane.dir, ignore_errors=True)
    title = f"Soak benchmark ({args.minutes:g} min of churn at {args.rate:g}{MULTIPLY} the trial rate)"
    return report(title, rows, notes, started)


@dataclass
class Sampling:
    """The churn's run, sampled: every reading, when it stopped, whether memwhere took a baseline."""

    samples: list[analysis.Sample] = field(default_factory=list)
    churned: float = 0.0  # seconds of churn
    baseline_taken: bool = False


async def _run(
    kubeconfig: str,
    workdir: Path,
    rates: churn.Rates,
    seconds: float,
    warmup: float,
    interval: float,
    say: Callable[[str], None],
    where_memory: bool = False,
) -> tuple[list[Row], list[str]]:
    kube = await Kube.connect(kubeconfig)
    await churn.install_world(kube)
    api = ApiServerMetrics(kubeconfig, workdir)
    driver = churn.Churn(kube, rates)
    scraper = Scraper()
    try:
        async with contextlib.AsyncExitStack() as stack:
            operators = await _start_operators(stack, kubeconfig, workdir, where_memory)
            await stack.enter_async_context(load_balancer(kube))
            # The address substrate's controllers: the real ones when named, else its model.
            await stack.enter_async_context(address_substrate(kube))
            for name, op in operators.items():
                await _wait_ready(name, op, READY_SECONDS)
            say(
                f"churning for {seconds / 60:g} min: {rates.attachments:g} attachments, {rates.pods:g} pods, "
                f"{rates.nodes:g} nodes a minute (logs and samples in {workdir})"
            )
            t0 = time.monotonic()
            run = await _churn_sampled(
                driver, api, operators, scraper, workdir, seconds, warmup, interval, say, where_memory
            )
            say("churn stopped; waiting for every live attachment to be Provisioned")
            steady = driver.full_at
            if steady is None:
                notes_before = ["the populations never filled: the whole run is warm-up"]
                warmup = run.churned
            else:
                notes_before = [f"every population full {steady:.0f}s in"]
                warmup = max(warmup, steady + 2 * interval)
            settled = await _settle(kube, SETTLE_SECONDS)
            if where_memory and run.baseline_taken:
                await _where_memory(operators, workdir, say)
            rows, notes = analysis.analyse(run.samples, warmup, list(OPERATORS))
            counts = driver.counts
            rows = [
                analysis.rate_row(
                    "attachments",
                    counts.created["attachment"],
                    counts.deleted["attachment"],
                    run.churned,
                    rates.attachments,
                ),
                analysis.rate_row(
                    "pods", counts.created["pod"], counts.deleted["pod"], run.churned, rates.pods
                ),
                Row("nodes churned per minute", f"{counts.created['node'] / run.churned * 60:,.1f}"),
                *rows,
                settled,
                analysis.events_row(
                    (await kube.list(EVENTS_V1.path(churn.NAMESPACE)))["items"],
                    time.monotonic() - t0,
                    events.BURST,
                    events.REFILL_SECONDS,
                ),
            ]
            notes = notes_before + notes
            _operator_rows(operators, scraper, run.samples, warmup, rows, notes)
            notes.append(
                f"changes: created {dict(counts.created)}, deleted {dict(counts.deleted)}"
                + (
                    f", refused {dict(counts.refused)} (last: {counts.last_refusal[:200]})"
                    if counts.refused
                    else ""
                )
            )
            return rows, notes
    finally:
        await api.close()


async def _start_operators(
    stack: contextlib.AsyncExitStack, kubeconfig: str, workdir: Path, where_memory: bool
) -> dict[str, RunningOperator]:
    operators: dict[str, RunningOperator] = {}
    for name, module in OPERATORS.items():
        # One replica each: no lease to lose when the shared machine stalls a renewal (a
        # lease lost is an exit by design; the soak is about memory and cost, not HA).
        args = ["--leader-elect=false"]
        if name == "gpuclass":
            args.append(f"--kubevirt-namespace={churn.KUBEVIRT_NAMESPACE}")
        env: dict[str, str] = {}
        if where_memory:  # the same operator, under tracemalloc
            env = {memwhere.MODULE_ENV: module, memwhere.OUT_ENV: str(workdir / f"{name}-memwhere.txt")}
            module = "bench.soak.memwhere"
        operators[name] = await stack.enter_async_context(
            operator_process(module, kubeconfig, args, workdir / f"{name}-operator.log", env)
        )
    return operators


async def _churn_sampled(
    driver: churn.Churn,
    api: ApiServerMetrics,
    operators: dict[str, RunningOperator],
    scraper: Scraper,
    workdir: Path,
    seconds: float,
    warmup: float,
    interval: float,
    say: Callable[[str], None],
    where_memory: bool,
) -> Sampling:
    """The churn for ``seconds``, sampled every ``interval`` (each reading also a line of
    samples.jsonl); under memwhere, the baseline snapshot once warm."""
    run = Sampling()
    churning = asyncio.create_task(driver.run())
    t0 = time.monotonic()
    with (workdir / "samples.jsonl").open("w") as out:
        next_report = t0 + 60
        while (now := time.monotonic()) - t0 < seconds:
            if churning.done():
                await churning  # raises what killed it
            for name, op in operators.items():
                if op.process.returncode is not None:
                    raise RuntimeError(f"the {name} operator exited:\n{op.log_tail()}")
            steady = driver.full_at
            if (
                where_memory
                and not run.baseline_taken
                and steady is not None
                and now - t0 >= max(warmup, steady)
            ):
                for op in operators.values():
                    op.process.send_signal(signal.SIGUSR1)  # memwhere: the baseline snapshot
                run.baseline_taken = True
                say("memory baseline taken")
            reading = await sample(now - t0, driver.counts, api, operators, scraper)
            run.samples.append(reading)
            out.write(json.dumps(asdict(reading)) + "\n")
            out.flush()
            if now >= next_report:
                next_report += 60
                rss = ", ".join(f"{n} {v / 2**20:.0f} MiB" for n, v in reading.rss.items())
                say(f"{reading.at / 60:4.1f} min: {reading.changes:,} changes; RSS {rss}")
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - now)))  # the sampling period
        churning.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await churning
        run.churned = time.monotonic() - t0
        run.samples.append(await sample(run.churned, driver.counts, api, operators, scraper))
    return run


def _operator_rows(
    operators: dict[str, RunningOperator],
    scraper: Scraper,
    samples: list[analysis.Sample],
    warmup: float,
    rows: list[Row],
    notes: list[str],
) -> None:
    """Each operator's failed scrapes and logged tracebacks (rows), its RSS trend (a note)."""
    for name, op in operators.items():
        log = op.log_path.read_text(errors="replace")
        failures = scraper.failures[name]
        rows.append(Row(f"{name}: /metrics scrapes that failed", str(failures), "0", not failures))
        if failures:
            notes.append(f"{name}: last failed scrape: {scraper.last_failure[name][:200]}")
        rows.append(
            Row(f"{name}: tracebacks in its log", str(log.count(TRACEBACK)), "0", TRACEBACK not in log)
        )
        trend = analysis.growth_trend(samples, name, warmup)
        if trend is not None:
            notes.append(f"{name}: RSS trend after warm-up {trend / 2**10:+,.0f} KiB/min")


async def _where_memory(
    operators: dict[str, RunningOperator], workdir: Path, say: Callable[[str], None]
) -> None:
    """Ask each operator (under memwhere) for the sites that grew since the baseline; print them."""
    for name, op in operators.items():
        path = workdir / f"{name}-memwhere.txt"
        path.unlink(missing_ok=True)
        op.process.send_signal(signal.SIGUSR1)

        async def written(path: Path = path) -> bool:
            return await asyncio.to_thread(path.exists)

        with contextlib.suppress(AssertionError):  # no answer: said below
            await eventually(written, timeout=120, interval=0.5, what=f"{path}")
        text = path.read_text() if path.exists() else "(no answer within 120 s)\n"
        say(f"{name}: allocation sites that grew after the warm-up ({path}):\n{text}")


async def _wait_ready(name: str, operator: RunningOperator, within: float) -> None:
    """The operator's /readyz answers 200 (every cache synced), within ``within`` seconds."""
    deadline = time.monotonic() + within
    async with httpx.AsyncClient() as client:
        while True:
            with contextlib.suppress(httpx.TransportError):
                response = await client.get(f"http://127.0.0.1:{operator.health_port}/readyz", timeout=5)
                if response.status_code == 200:
                    return
            if operator.process.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the {name} operator never became ready:\n{operator.log_tail()}")
            await asyncio.sleep(0.2)  # the poll interval of a bounded poll


async def _settle(kube: Kube, within: float) -> Row:
    """Every attachment still alive after the churn is Provisioned within ``within`` seconds."""
    deadline = time.monotonic() + within
    started = time.monotonic()
    while True:
        items = (await kube.list(ATTACHMENTS.path(churn.NAMESPACE)))["items"]
        live = [a for a in items if not a["metadata"].get("deletionTimestamp")]
        ready = [a for a in live if _ready(a)]
        if len(ready) == len(live) or time.monotonic() > deadline:
            took = time.monotonic() - started
            waiting = collections.Counter(_provisioned_reason(a) for a in live if not _ready(a))
            others = ", ".join(f"{reason} {n}" for reason, n in waiting.most_common())
            said = f" (the others: {others})" if waiting else ""
            return Row(
                "live attachments Provisioned after the churn",
                f"{len(ready)}/{len(live)} in {took:.1f} s{said}",
                f"all within {within:.0f} s",
                len(ready) == len(live),
            )
        await asyncio.sleep(1.0)  # the poll interval of a bounded poll


def _provisioned_reason(attachment: dict[str, object]) -> str:
    """The reason of the attachment's Provisioned condition ("no status yet" before its first)."""
    status = attachment.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    found = [c for c in conditions or [] if c.get("type") == "Provisioned"]
    return str(found[0].get("reason")) if found else "no status yet"


def _ready(attachment: dict[str, object]) -> bool:
    status = attachment.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    return any(c.get("type") == "Provisioned" and c.get("status") == "True" for c in conditions or [])
