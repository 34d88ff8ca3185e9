"""Serving an operator's metrics registry.

Decides only that the server starts when the operator starts (``serve``), never at import, on the
operator's own registry. The metric families themselves live in ``shared.runtime.metrics``
(controller-runtime's names, common to both operators) and beside each operator (its domain).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, start_http_server


def serve(registry: CollectorRegistry, address: str, port: int) -> None:
    """Serve ``registry`` on ``address:port`` (0: do not serve)."""
    if port:
        start_http_server(port, address, registry=registry)
