"""How both operators run under kopf: settings, login, and start-up of metrics, health and tracing.

Decides what the two operators must not differ in: each its own kopf finalizer name and annotation
prefix (never kopf's defaults, never each other's), Events posted by the operators themselves (kopf's
log-to-Event posting off), no cluster scanning (no CRD or namespace watch, so no permission for it),
login from the in-cluster ServiceAccount or a kubeconfig, and servers started only when the operator
starts (never at import). Does not register any operator's handlers.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import kopf
from prometheus_client import CollectorRegistry

from shared.telemetry.health import Liveness
from shared.telemetry.metrics import ReconcileMetrics, serve
from shared.telemetry.tracing import Tracing, provider_from_env


class NoDiffBase(kopf.AnnotationsDiffBaseStorage):
    """kopf builds a diff of every object on every event (a deep copy of the whole body) for its
    change handlers. Both operators register only event handlers, which never see that diff, so
    building it was most of the per-event cost (a profile of 1,000 pod events): skip it."""

    def build(self, *, body: Any, extra_fields: Any = None) -> Any:
        return {}

    def fetch(self, *, body: Any) -> Any:
        return None

    def store(self, *, body: Any, patch: Any, essence: Any) -> None:
        return None


def kopf_settings(kopf_finalizer: str, storage_prefix: str) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.persistence.finalizer = kopf_finalizer
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=storage_prefix)
    settings.persistence.diffbase_storage = NoDiffBase(prefix=storage_prefix)
    settings.posting.enabled = False
    settings.scanning.disabled = True
    settings.watching.server_timeout = 600
    return settings


def add_login(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@dataclass
class Telemetry:
    """One operator's tracing, common reconcile metrics and liveness, built from its settings."""

    tracing: Tracing
    registry: CollectorRegistry
    reconciles: ReconcileMetrics
    liveness: Liveness

    @classmethod
    def create(cls, operator: str, registry: CollectorRegistry, silence_seconds: float = 0.0) -> Telemetry:
        tracing = Tracing(provider_from_env(f"cozystack-{operator}-operator"), f"cozystack.{operator}")
        reconciles = ReconcileMetrics(operator, registry)
        return cls(
            tracing,
            registry,
            reconciles,
            Liveness(reconciles.last_event_age, silence_seconds=silence_seconds),
        )


@dataclass(frozen=True)
class Endpoints:
    address: str
    metrics_port: int
    health_port: int


def run(
    registry: kopf.OperatorRegistry,
    settings: kopf.OperatorSettings,
    telemetry: Telemetry,
    endpoints: Endpoints,
    kubeconfig: str | None,
) -> None:
    """Serve metrics and health, then run kopf until it is stopped (SIGTERM, SIGINT)."""
    if kubeconfig:
        os.environ["KUBECONFIG"] = kubeconfig  # kopf's login and kr8s both read it from there
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # kopf logs "Handler ... succeeded" for every watch event at INFO: a line per Pod change.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    serve(telemetry.registry, endpoints.address, endpoints.metrics_port)
    telemetry.liveness.serve(endpoints.address, endpoints.health_port)
    try:
        kopf.run(registry=registry, settings=settings, clusterwide=True, standalone=True)
    finally:
        shutdown = getattr(telemetry.tracing.provider, "shutdown", None)
        if callable(shutdown):
            shutdown()  # flush the last spans
