"""The reconcile metrics common to both operators, on the operator's own registry.

Decides the names (``<operator>_reconcile_total{result}``, ``<operator>_reconcile_duration_seconds``
with the trace id as an exemplar when tracing is on, ``<operator>_watch_last_event_age_seconds``) and
that no object name or UID is ever a label value here. Domain metrics live beside each operator.
Does not serve HTTP: ``serve`` starts the server when the operator starts, never at import.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from shared.telemetry.tracing import trace_id_hex

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class ReconcileMetrics:
    def __init__(self, operator: str, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.total = Counter(
            f"{operator}_reconcile_total", "Reconcile passes, by result.", ["result"], registry=registry
        )
        self.duration = Histogram(
            f"{operator}_reconcile_duration_seconds",
            "Time of one reconcile pass, API writes included.",
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self._last_event = time.monotonic()
        age = Gauge(
            f"{operator}_watch_last_event_age_seconds",
            "Seconds since the last watch event reached the operator.",
            registry=registry,
        )
        age.set_function(self.last_event_age)

    def event_seen(self) -> None:
        self._last_event = time.monotonic()

    def last_event_age(self) -> float:
        return time.monotonic() - self._last_event

    def observe(self, result: str, seconds: float) -> None:
        """Count a pass; its duration carries the current trace id as an exemplar when tracing."""
        trace_id = trace_id_hex()
        self.total.labels(result=result).inc()
        self.duration.observe(seconds, exemplar={"trace_id": trace_id} if trace_id else None)


def serve(registry: CollectorRegistry, address: str, port: int) -> None:
    """Serve ``registry`` on ``address:port`` (0: do not serve)."""
    if port:
        start_http_server(port, address, registry=registry)
