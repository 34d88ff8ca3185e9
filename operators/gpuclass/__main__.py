"""python -m operators.gpuclass: read settings, serve metrics, run the kopf operator.

Runs cluster-wide and standalone (one replica, no peering objects): the Deployment uses the Recreate
strategy, so two operators never write the same status at once.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import kopf
from prometheus_client import start_http_server

from operators.gpuclass.handlers import State, build_registry, operator_settings
from operators.gpuclass.metrics import Metrics
from operators.gpuclass.settings import parse


def main(argv: Sequence[str] | None = None) -> None:
    settings = parse(argv)
    if settings.kubeconfig:
        os.environ["KUBECONFIG"] = settings.kubeconfig  # kopf's login reads it from there
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    metrics = Metrics()
    if settings.metrics_port:
        start_http_server(settings.metrics_port, settings.metrics_address, registry=metrics.registry)
    state = State(settings=settings, metrics=metrics)
    kopf.run(
        registry=build_registry(state),
        settings=operator_settings(),
        clusterwide=True,
        standalone=True,
    )


if __name__ == "__main__":
    main()
