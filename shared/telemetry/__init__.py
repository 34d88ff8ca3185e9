"""Telemetry both operators share: tracing across passes, the common reconcile metrics, liveness."""
