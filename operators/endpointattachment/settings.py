"""The EndpointAttachment operator's settings: flags, each with an environment variable as its default."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    kubeconfig: str | None = None
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 8080  # 0 turns the metrics server off
    health_port: int = 8081  # /healthz; 0 turns it off
    # Attachments can go untouched for days, so watch silence is no sign of a stuck watch here: off.
    watch_silence_seconds: float = 0.0
    # Passes over different attachments run concurrently; one attachment never runs twice at once.
    workers: int = 16
    # How often orphaned allocations are looked for, and how old one must be before it is removed:
    # long enough that a mint whose holder is not yet in our cache is never mistaken for an orphan.
    repair_interval_seconds: float = 60.0
    repair_grace_seconds: float = 300.0


def parse(argv: Sequence[str] | None = None) -> Settings:
    env = os.environ.get
    d = Settings()
    parser = argparse.ArgumentParser(prog="python -m operators.endpointattachment", description=__doc__)
    parser.add_argument("--kubeconfig", default=env("KUBECONFIG"), help="default: in-cluster, or $KUBECONFIG")
    parser.add_argument("--metrics-address", default=env("EA_METRICS_ADDRESS", d.metrics_address))
    parser.add_argument("--metrics-port", type=int, default=int(env("EA_METRICS_PORT", str(d.metrics_port))))
    parser.add_argument("--health-port", type=int, default=int(env("EA_HEALTH_PORT", str(d.health_port))))
    parser.add_argument(
        "--watch-silence-seconds",
        type=float,
        default=float(env("EA_WATCH_SILENCE_SECONDS", str(d.watch_silence_seconds))),
    )
    parser.add_argument("--workers", type=int, default=int(env("EA_WORKERS", str(d.workers))))
    parser.add_argument(
        "--repair-interval-seconds",
        type=float,
        default=float(env("EA_REPAIR_INTERVAL_SECONDS", str(d.repair_interval_seconds))),
    )
    parser.add_argument(
        "--repair-grace-seconds",
        type=float,
        default=float(env("EA_REPAIR_GRACE_SECONDS", str(d.repair_grace_seconds))),
    )
    args = parser.parse_args(argv)
    return Settings(
        kubeconfig=args.kubeconfig or None,
        metrics_address=args.metrics_address,
        metrics_port=args.metrics_port,
        health_port=args.health_port,
        watch_silence_seconds=args.watch_silence_seconds,
        workers=args.workers,
        repair_interval_seconds=args.repair_interval_seconds,
        repair_grace_seconds=args.repair_grace_seconds,
    )
