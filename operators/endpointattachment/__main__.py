"""python -m operators.endpointattachment: read settings, serve metrics and health, run the operator.

Cluster-wide and standalone (one replica, Recreate): the API server's name uniqueness already makes
minting safe across processes, but one writer per attachment keeps passes simple to reason about.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from operators.endpointattachment.handlers import Operator, build_registry, operator_settings
from operators.endpointattachment.metrics import WorldCollector
from operators.endpointattachment.settings import parse
from shared.operator import Endpoints, Telemetry, run


def main(argv: Sequence[str] | None = None) -> None:
    settings = parse(argv)
    registry = CollectorRegistry(auto_describe=True)
    telemetry = Telemetry.create(
        "endpointattachment", registry, silence_seconds=settings.watch_silence_seconds
    )
    operator = Operator(settings=settings, telemetry=telemetry)
    registry.register(WorldCollector(operator.world))
    endpoints = Endpoints(settings.metrics_address, settings.metrics_port, settings.health_port)
    run(build_registry(operator), operator_settings(), telemetry, endpoints, settings.kubeconfig)


if __name__ == "__main__":
    main()
