"""python -m operators.endpointattachment: read settings, serve metrics, run the kopf operator.

Cluster-wide and standalone (one replica, Recreate): the API server's name uniqueness already makes
minting safe across processes, but one writer per attachment keeps passes simple to reason about.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import kopf
from prometheus_client import start_http_server

from operators.endpointattachment.handlers import Operator, build_registry, operator_settings
from operators.endpointattachment.settings import parse


def main(argv: Sequence[str] | None = None) -> None:
    settings = parse(argv)
    if settings.kubeconfig:
        os.environ["KUBECONFIG"] = settings.kubeconfig  # kopf's login reads it from there
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    operator = Operator(settings=settings)
    if settings.metrics_port:
        start_http_server(settings.metrics_port, settings.metrics_address, registry=operator.metrics.registry)
    kopf.run(
        registry=build_registry(operator),
        settings=operator_settings(),
        clusterwide=True,
        standalone=True,
    )


if __name__ == "__main__":
    main()
