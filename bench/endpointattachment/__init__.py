"""The EndpointAttachment benchmark: ``python -m bench.endpointattachment [--quick]``.

One run starts its own local control plane (``hack.devcluster.LocalControlPlane``), serves the
operator's CRD, Flux's HelmRelease CRD and the address substrate's CRDs, and measures:

* ``attach``: 1,000 EndpointAttachments minting claims from one IPAddressClass on a few applications'
  endpoints, made Provisioned by the operator (a subprocess), the substrate model and MetalLB's real
  controller; create-to-Provisioned p50 and p99 as ratios against making the same claim and
  LoadBalancer Service by hand, at the same concurrency (target: p50 at most 1.2x), and the
  operator's API requests per attachment (target: at most 8). See ``attach``.
* ``churn``: the controller's SLOs under a ramp of churn the operator alone answers (attachments
  created and deleted, their endpoint Services deleted and back): ``workqueue_queue_duration_seconds``
  p99 at most 1 s and change to status p99 at most 5 s, against the API server's own answer to the
  same writes; reports the highest churn that holds both. See ``churn``.

* ``coldstart``: the operator's start on 5,000 settled attachments (their claims, addresses and
  rendered Services) against a plain paged LIST of the same objects, on a control plane of its own
  whose NodePort range holds a health-check port for each rendered Service (target: the median turn
  at most 2x; no API write), the operator's RSS per attachment. See ``coldstart``.

* ``heal`` (only with ``--scenario heal``): a VM-mode attachment's ``MultipleBackends`` healing,
  two ready backends back to one, with the cozy-proxy model: to Attached p50 and max at most 0.3 s,
  no moment of two backends in the rendered Service's Endpoints while healing, the address held
  (one Service throughout). See ``heal``.

``--quick`` runs 100 attachments (``coldstart``: 500). Targets live here, never in tests; ``run``
returns 1 when a figure misses its target (``python -m bench`` wires ``run`` in), 0 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.endpointattachment import attach, churn, coldstart, heal
from hack.devcluster import LocalControlPlane
from harness.manifests import apply_all, load
from harness.report import Row, progress, report
from shared.kube import Kube

CRD_FILES = (
    "tests/fixtures/helmrelease-crd.yaml",
    "config/crd/endpointattachment/local.sdn.cozystack.io_endpointattachments.yaml",
    "tests/fixtures/address-substrate/local.sdn.cozystack.io_ipaddressclasses.yaml",
    "tests/fixtures/address-substrate/local.sdn.cozystack.io_ipaddresses.yaml",
    "tests/fixtures/address-substrate/local.sdn.cozystack.io_ipaddressclaims.yaml",
)


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench endpointattachment", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="100 attachments")
    parser.add_argument("--scenario", choices=("all", "attach", "churn", "coldstart", "heal"), default="all")
    parser.add_argument("--heal-rounds", type=int, default=heal.ROUNDS, help="heal: rounds")
    parser.add_argument("--attachments", type=int, help="default 1,000 (100 with --quick)")
    parser.add_argument("--apps", type=int, default=4, help="applications whose endpoints are attached")
    parser.add_argument("--in-flight", type=int, default=20, help="objects created and not yet done")
    parser.add_argument("--attach-prefix", type=int, default=22, help="the attachments' class is a /N")
    parser.add_argument("--item-timeout", type=float, default=120.0, help="one object's create-to-done")
    parser.add_argument(
        "--phase-timeout", type=float, help="no new object after this (default 300 s, quick 90 s)"
    )
    parser.add_argument("--operator-workers", type=int, default=8, help="the operator's --workers")
    parser.add_argument("--churn-rates", default="2,5,10,15,20,30,40", help="churn: changes/s, one step each")
    parser.add_argument("--churn-step-seconds", type=float, help="churn: one step (default 60 s, quick 15 s)")
    parser.add_argument("--churn-slots", type=int, default=200, help="churn: applications changes cycle on")
    parser.add_argument("--churn-whole-ramp", action="store_true", help="churn: go on past a step that fails")
    parser.add_argument(
        "--churn-workers", type=int, help="churn: the operator's --workers (default: its own)"
    )
    parser.add_argument("--cold-attachments", type=int, help="coldstart: default 5,000 (500 with --quick)")
    parser.add_argument("--cold-runs", type=int, default=coldstart.COLD_RUNS, help="coldstart: turns")
    parser.add_argument("--cold-profile", type=Path, help="coldstart: a profiled start, saved here")
    return parser.parse_args(list(argv))


def run(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    attachments = args.attachments or (100 if args.quick else 1_000)
    attach_options = attach.AttachOptions(
        attachments=attachments,
        apps=args.apps,
        in_flight=args.in_flight,
        prefix=args.attach_prefix,
        item_timeout=args.item_timeout,
        phase_timeout=args.phase_timeout or (90.0 if args.quick else 300.0),
        operator_workers=args.operator_workers,
    )
    churn_options = churn.ChurnOptions(
        rates=tuple(float(rate) for rate in args.churn_rates.split(",")),
        step_seconds=args.churn_step_seconds or (15.0 if args.quick else 60.0),
        slots=args.churn_slots,
        operator_workers=args.churn_workers,
        whole_ramp=args.churn_whole_ramp,
    )
    started = time.perf_counter()
    say = progress(started)
    cold = coldstart.ColdOptions(
        attachments=args.cold_attachments or (500 if args.quick else coldstart.COLD_ATTACHMENTS),
        runs=args.cold_runs,
        workers=args.operator_workers,
        profile=args.cold_profile,
    )
    if args.scenario == "heal":  # on a control plane of its own
        heal_rows, heal_notes = heal.run(heal.HealOptions(rounds=args.heal_rounds), say)
        return report("EndpointAttachment MultipleBackends heal", heal_rows, heal_notes, started)
    if args.scenario == "coldstart":  # on a control plane of its own
        result = coldstart.run(cold, say)
        title = f"EndpointAttachment cold start ({cold.attachments:,} attachments)"
        return report(title, result.rows, result.notes, started)
    say("starting the local control plane")
    control_plane = LocalControlPlane()
    with control_plane as cluster:
        say(f"control plane ready in {cluster.ready_seconds or 0:.1f}s")
        ready = json.loads((control_plane.dir / "ready").read_text())
        pids = attach.ClusterPids(
            apiserver=int(ready["apiserverPID"]),
            controllers=int(ready["controllersPID"]),
            launcher=int(ready["pid"]),
        )
        try:
            rows, notes = asyncio.run(
                _run(
                    args.scenario,
                    attach_options,
                    churn_options,
                    cluster.kubeconfig,
                    pids,
                    control_plane.dir,
                    say,
                )
            )
        except BaseException:
            say(f"failed; the control plane's files and the logs stay in {control_plane.dir}")
            raise
    shutil.rmtree(control_plane.dir, ignore_errors=True)
    if args.scenario == "all":
        result = coldstart.run(cold, say)
        rows, notes = [*rows, *result.rows], [*notes, *result.notes]
    return report(f"EndpointAttachment benchmark ({attachments:,} attachments)", rows, notes, started)


async def _run(
    scenario: str,
    attach_options: attach.AttachOptions,
    churn_options: churn.ChurnOptions,
    kubeconfig: str,
    pids: attach.ClusterPids,
    log_dir: Path,
    say: Callable[[str], None],
) -> tuple[list[Row], list[str]]:
    kube = await Kube.connect(kubeconfig)
    await apply_all(kube, [doc for path in CRD_FILES for doc in load(path)])
    rows: list[Row] = []
    notes: list[str] = []
    if scenario in ("all", "attach"):
        result = await attach.run(
            attach_options, kubeconfig, pids, log_dir / "endpointattachment-operator.log", say
        )
        rows += result.rows
        notes += result.notes
    if scenario in ("all", "churn"):
        churn_rows, churn_notes = await churn.run(
            churn_options, kubeconfig, pids, log_dir / "endpointattachment-churn-operator.log", say
        )
        rows += churn_rows
        notes += churn_notes
    return rows, notes
