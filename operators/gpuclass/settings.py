"""The GPUClass operator's settings: flags, each with an environment variable as its default.

Decides only names and defaults. Cozystack runs one KubeVirt CR named ``kubevirt`` in
``cozy-kubevirt``; an empty name means "list the namespace and take the single CR".
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    kubeconfig: str | None = None
    kubevirt_namespace: str = "cozy-kubevirt"
    kubevirt_name: str = "kubevirt"
    # Where the metrics are served; port 0 turns the server off (tests that need no scrape).
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 8080
    health_port: int = 8081  # /healthz; 0 turns it off
    # Liveness fails when no Node/Pod/class event arrived for this long: kubelets report Node status
    # every few minutes, so a silence this long means the watches are stuck. 0 disables the check.
    watch_silence_seconds: float = 1800.0
    # A burst of Node/Pod events becomes one pass once the stream has been quiet this long...
    debounce_seconds: float = 0.5
    # ...but a steady stream cannot hold a pass back longer than this.
    max_delay_seconds: float = 5.0
    # The KubeVirt CR is read, never watched: a pass runs at least this often to pick up its changes.
    kubevirt_recheck_seconds: float = 60.0
    # The first pass waits for kopf's initial listing of every Node, Pod and class, at most this long.
    initial_listing_timeout_seconds: float = 120.0
    # Namespace for Events about classes (cluster-scoped objects have none of their own).
    events_namespace: str = "default"


def parse(argv: Sequence[str] | None = None) -> Settings:
    env = os.environ.get
    defaults = Settings()
    parser = argparse.ArgumentParser(prog="python -m operators.gpuclass", description=__doc__)
    parser.add_argument("--kubeconfig", default=env("KUBECONFIG"), help="default: in-cluster, or $KUBECONFIG")
    parser.add_argument(
        "--kubevirt-namespace", default=env("GPUCLASS_KUBEVIRT_NAMESPACE", defaults.kubevirt_namespace)
    )
    parser.add_argument(
        "--kubevirt-name",
        default=env("GPUCLASS_KUBEVIRT_NAME", defaults.kubevirt_name),
        help="empty: list the namespace and take the single KubeVirt CR",
    )
    parser.add_argument(
        "--metrics-address", default=env("GPUCLASS_METRICS_ADDRESS", defaults.metrics_address)
    )
    parser.add_argument(
        "--metrics-port", type=int, default=int(env("GPUCLASS_METRICS_PORT", str(defaults.metrics_port)))
    )
    parser.add_argument(
        "--health-port", type=int, default=int(env("GPUCLASS_HEALTH_PORT", str(defaults.health_port)))
    )
    parser.add_argument(
        "--watch-silence-seconds",
        type=float,
        default=float(env("GPUCLASS_WATCH_SILENCE_SECONDS", str(defaults.watch_silence_seconds))),
    )
    parser.add_argument(
        "--debounce-seconds",
        type=float,
        default=float(env("GPUCLASS_DEBOUNCE_SECONDS", str(defaults.debounce_seconds))),
    )
    parser.add_argument(
        "--kubevirt-recheck-seconds",
        type=float,
        default=float(env("GPUCLASS_KUBEVIRT_RECHECK_SECONDS", str(defaults.kubevirt_recheck_seconds))),
    )
    parser.add_argument(
        "--events-namespace", default=env("GPUCLASS_EVENTS_NAMESPACE", defaults.events_namespace)
    )
    args = parser.parse_args(argv)
    return Settings(
        kubeconfig=args.kubeconfig or None,
        kubevirt_namespace=args.kubevirt_namespace,
        kubevirt_name=args.kubevirt_name,
        metrics_address=args.metrics_address,
        metrics_port=args.metrics_port,
        health_port=args.health_port,
        watch_silence_seconds=args.watch_silence_seconds,
        debounce_seconds=args.debounce_seconds,
        kubevirt_recheck_seconds=args.kubevirt_recheck_seconds,
        events_namespace=args.events_namespace,
    )
