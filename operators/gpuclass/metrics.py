"""The GPUClass metrics of the design: the inventory lives here, not in the world-readable status.

Decides: the domain metrics' names (one prefix, ``cozystack_gpuclass_``), types and labels. The
per-class series are produced at scrape time from the last pass's decisions (a custom collector), so
a deleted class's series disappear with the pass that no longer sees it, and a scrape never observes
half a pass. No node names or UIDs are label values; ``units`` (a VM size of the class) is bounded
by the eight sizes a class may list, ``shape`` by its eight whole-VM shapes.

Does not: serve HTTP (the operator starts the server on its own registry and port), compute any
figure (``decide`` does), or count reconciles, queue depth or leadership: those are
controller-runtime's metrics (``controller_runtime_reconcile_total{controller="gpuclass"}`` and the
rest, ``shared.runtime.metrics``), registered by the manager on the same registry.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from operators.gpuclass.reconcile import ClassDecision
from operators.gpuclass.scheduling import NodeVerdict
from shared.conditions import FALSE, TRUE, UNKNOWN

PREFIX: Final = "cozystack_gpuclass"
# Where a pass can fail: a status write the API refused (not a conflict: that is retried quietly),
# or anything else in the pass. Both series exist from the start, so an increase() works at once.
STAGE_STATUS_WRITE: Final = "status_write"
STAGE_PASS: Final = "pass"
STAGES: Final = (STAGE_STATUS_WRITE, STAGE_PASS)
# A quiet pass over a few classes takes about a millisecond; a pass writing during churn, seconds.
PASS_BUCKETS: Final = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class ClassCollector(Collector):
    """Per-class gauges from the decisions of the last completed pass."""

    def __init__(self) -> None:
        self.decisions: Mapping[str, ClassDecision] = {}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        decisions = self.decisions  # one consistent snapshot, even if a pass replaces it meanwhile
        labels = ["gpuclass", "resource"]
        allocatable = GaugeMetricFamily(
            f"{PREFIX}_allocatable",
            "Units advertised for the class's resource (owner of the name only, so sums count once).",
            labels=labels,
        )
        requested = GaugeMetricFamily(
            f"{PREFIX}_requested",
            "Units requested by live pods on nodes advertising the resource.",
            labels=labels,
        )
        free = GaugeMetricFamily(
            f"{PREFIX}_free", "Units a new VM could get now (status.freeUnits).", labels=labels
        )
        nodes = GaugeMetricFamily(
            f"{PREFIX}_nodes", "Nodes advertising the class's resource, by state.", labels=[*labels, "state"]
        )
        fits = GaugeMetricFamily(
            f"{PREFIX}_fits",
            "VMs of the size in label units that could start now, one node per VM (status.fits).",
            labels=[*labels, "units"],
        )
        shape_fits = GaugeMetricFamily(
            f"{PREFIX}_vm_shape_fits",
            "Whole VMs of the shape (spec.vmShapes) that could start now, their GPUs, CPU and memory "
            "from one node (status.fits).",
            labels=[*labels, "shape", "units"],
        )
        conditions = GaugeMetricFamily(
            f"{PREFIX}_status_condition",
            "1 for the class's current condition status and reason, 0 for the other statuses.",
            labels=["gpuclass", "type", "status", "reason"],
        )
        for name, decision in sorted(decisions.items()):
            figures = decision.figures
            key = [name, figures.resource]
            if figures.allocatable is not None:
                allocatable.add_metric(key, figures.allocatable)
            requested.add_metric(key, figures.requested)
            free.add_metric(key, figures.free)
            for state in NodeVerdict:
                nodes.add_metric([*key, state.value], figures.nodes.get(state, 0))
            for fit in decision.status.fits:
                if fit.name:
                    shape_fits.add_metric([*key, fit.name, str(fit.units)], fit.vms)
                else:
                    fits.add_metric([*key, str(fit.units)], fit.vms)
            for condition in decision.status.conditions:
                for status in (TRUE, FALSE, UNKNOWN):
                    conditions.add_metric(
                        [name, condition.type, status, condition.reason],
                        1.0 if status == condition.status else 0.0,
                    )
        yield from (allocatable, requested, free, nodes, fits, shape_fits, conditions)


class Metrics:
    """The domain metrics, on the operator's own registry (never the process-global one)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.classes = ClassCollector()
        self.registry.register(self.classes)
        self.pass_duration = Histogram(
            f"{PREFIX}_pass_duration_seconds",
            "Time of one pass over every class, from the KubeVirt read to the last status write.",
            buckets=PASS_BUCKETS,
            registry=self.registry,
        )
        self.last_pass = Gauge(
            f"{PREFIX}_last_pass_timestamp_seconds", "When the last pass completed.", registry=self.registry
        )
        self.pass_errors = Counter(
            f"{PREFIX}_pass_errors_total",
            "Failures within passes, by stage.",
            ["stage"],
            registry=self.registry,
        )
        for stage in STAGES:
            self.pass_errors.labels(stage=stage)
