"""python -m operators.gpuclass: read settings, serve metrics and health, run the kopf operator.

Runs cluster-wide and standalone (one replica, no peering objects): the Deployment uses the Recreate
strategy, so two operators never write the same status at once.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from operators.gpuclass.handlers import State, build_registry, operator_settings
from operators.gpuclass.metrics import Metrics
from operators.gpuclass.settings import parse
from shared.operator import Endpoints, Telemetry, run


def main(argv: Sequence[str] | None = None) -> None:
    settings = parse(argv)
    registry = CollectorRegistry(auto_describe=True)
    telemetry = Telemetry.create("gpuclass", registry, silence_seconds=settings.watch_silence_seconds)
    state = State(settings=settings, metrics=Metrics(registry), telemetry=telemetry)
    endpoints = Endpoints(settings.metrics_address, settings.metrics_port, settings.health_port)
    run(build_registry(state), operator_settings(), telemetry, endpoints, settings.kubeconfig)


if __name__ == "__main__":
    main()
