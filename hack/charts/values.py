"""A chart's values: one list gives values.yaml, values.schema.json and the docs' values table.

Decides: which fields are values and their help, the default of each being config/'s own setting
(read while templating: ``Chart``), plus optional scheduling fields config/ leaves unset. Does not:
place a value in a template (``hack.charts.templates`` does).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import yaml

from hack.charts.chart import Chart

# What a user name value may hold, so that it stays one CEL string literal ('...').
USERNAME_PATTERN: Final = r"^[^'\\]+$"


@dataclass(frozen=True)
class Value:
    path: str  # dotted, e.g. "image.repository"
    default: Any
    schema: Mapping[str, Any]
    help: str


def values_of(chart: Chart) -> list[Value]:
    return [*_deployment_values(chart), *_monitoring_values(chart), *_operator_values(chart)]


def _deployment_values(chart: Chart) -> list[Value]:
    image, prefix = chart.image, chart.env_prefix
    return [
        Value("image.repository", image[0], {"type": "string", "minLength": 1}, "The operators' image."),
        Value("image.tag", image[1], {"type": "string"}, "Its tag (ignored when a digest is set)."),
        Value("image.digest", image[2], {"type": "string"}, "A digest (sha256:...), preferred to the tag."),
        Value(
            "image.pullPolicy",
            "",
            {"enum": ["", "Always", "IfNotPresent", "Never"]},
            "Empty: the cluster's default.",
        ),
        Value("imagePullSecrets", [], {"type": "array"}, "Secrets to pull the image with ([{name: ...}])."),
        Value(
            "replicas",
            chart.replicas,
            {"type": "integer", "minimum": 1},
            "Replicas; one leads (writes), the others stand by with warm caches. Above 1 needs "
            "leaderElection.enabled.",
        ),
        Value(
            "leaderElection.enabled",
            True,
            {"type": "boolean"},
            f"Elect a leader through a Lease in the release namespace ({prefix}_LEADER_ELECT).",
        ),
        Value(
            "leaderElection.id",
            chart.leader_election_id,
            {"type": "string", "minLength": 1},
            f"The Lease's name ({prefix}_LEADER_ELECTION_ID).",
        ),
        Value(
            "otel.endpoint",
            chart.otel_endpoint,
            {"type": "string"},
            "OTLP/HTTP collector for traces (OTEL_EXPORTER_OTLP_ENDPOINT), e.g. "
            "http://otel-collector.cozy-monitoring:4318; empty: tracing off.",
        ),
        Value(
            "extraEnv",
            [],
            {"type": "array", "items": {"type": "object"}},
            "More environment variables, e.g. OTEL_TRACES_SAMPLER or " + prefix + "_* flags.",
        ),
        Value("resources", chart.resources, {"type": "object"}, "The container's requests and limits."),
        Value("nodeSelector", {}, {"type": "object"}, "The Pods' nodeSelector."),
        Value("tolerations", [], {"type": "array"}, "The Pods' tolerations."),
        Value(
            "priorityClassName",
            "",
            {"type": "string"},
            "The Pods' priority class (e.g. system-cluster-critical).",
        ),
        *_budget_values(chart),
    ]


def _budget_values(chart: Chart) -> list[Value]:
    return [
        Value(
            "podDisruptionBudget.enabled",
            True,
            {"type": "boolean"},
            "A PodDisruptionBudget keeping minAvailable replicas through drains.",
        ),
        Value(
            "podDisruptionBudget.minAvailable",
            chart.min_available,
            {"type": ["integer", "string"]},
            "Must be below replicas, or no drain can evict a replica.",
        ),
    ]


def _monitoring_values(chart: Chart) -> list[Value]:
    extra_labels = {"type": "object", "additionalProperties": {"type": "string"}}
    return [
        Value(
            "monitoring.serviceMonitor.enabled",
            False,
            {"type": "boolean"},
            "A ServiceMonitor for the metrics Service (needs the monitoring.coreos.com CRDs).",
        ),
        Value("monitoring.serviceMonitor.interval", chart.scrape[0], {"type": "string"}, "Scrape interval."),
        Value(
            "monitoring.serviceMonitor.scrapeTimeout", chart.scrape[1], {"type": "string"}, "Scrape timeout."
        ),
        Value(
            "monitoring.serviceMonitor.labels",
            {},
            extra_labels,
            "Extra labels, for a Prometheus whose serviceMonitorSelector needs them.",
        ),
        Value(
            "monitoring.prometheusRule.enabled",
            False,
            {"type": "boolean"},
            "The alerts, as a PrometheusRule (needs the monitoring.coreos.com CRDs).",
        ),
        Value(
            "monitoring.prometheusRule.labels",
            {},
            extra_labels,
            "Extra labels, for a Prometheus whose ruleSelector needs them.",
        ),
        Value(
            "monitoring.dashboards.enabled",
            False,
            {"type": "boolean"},
            "The Grafana dashboard, as a ConfigMap labelled grafana_dashboard=1 for Grafana's sidecar.",
        ),
        Value(
            "monitoring.dashboards.namespace",
            chart.dashboards_namespace,
            {"type": "string", "minLength": 1},
            "Where the dashboard ConfigMap goes (the namespace Grafana's sidecar watches).",
        ),
    ]


def _operator_values(chart: Chart) -> list[Value]:
    """The values only one operator's config/ has a field for."""
    values = []
    if chart.vm_datapath is not None:
        values.append(
            Value(
                "vmDatapath",
                chart.vm_datapath,
                {"type": "string", "enum": ["none", "cozy-proxy"]},
                f"The VM datapath the platform runs ({chart.env_prefix}_VM_DATAPATH): cozy-proxy "
                "when a cozy-proxy contract implementor is deployed; none: the VM methods render "
                "nothing.",
            )
        )
    if chart.driver_username is not None:
        values.append(
            Value(
                "admission.substrateDriverUsername",
                chart.driver_username,
                {"type": "string", "minLength": 1, "pattern": USERNAME_PATTERN},
                "The address substrate's driver (its ServiceAccount's user name): the one identity "
                "the rendered-Services admission policy lets change the address pin of a rendered "
                "Service.",
            )
        )
    return values


def values_yaml(values: Sequence[Value], name: str) -> str:
    lines = [
        f"# Values of the {name} chart. Generated by hack/charts from config/ (the defaults are",
        "# config/'s own settings); the schema is values.schema.json; docs/hosters/install.md explains them.",
    ]
    written: list[str] = []
    for value in values:
        parts = value.path.split(".")
        for depth in range(len(parts) - 1):
            prefix = parts[: depth + 1]
            if written[: depth + 1] != prefix:
                lines.append(f"{'  ' * depth}{parts[depth]}:")
        written = parts
        indent = "  " * (len(parts) - 1)
        lines.append(f"{indent}# {value.help}")
        body = yaml.safe_dump({parts[-1]: value.default}, sort_keys=False, default_flow_style=False)
        if value.default in ({}, []):
            body = f"{parts[-1]}: {json.dumps(value.default)}\n"
        lines.extend(f"{indent}{line}" for line in body.rstrip("\n").splitlines())
    return "\n".join(lines) + "\n"


def values_schema(values: Sequence[Value]) -> str:
    root: dict[str, Any] = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "additionalProperties": False,
        "properties": {},
    }
    for value in values:
        node = root
        parts = value.path.split(".")
        for part in parts[:-1]:
            node = node["properties"].setdefault(
                part, {"type": "object", "additionalProperties": False, "properties": {}}
            )
        node["properties"][parts[-1]] = {**value.schema, "description": value.help}
    return json.dumps(root, indent=2) + "\n"


def values_table(values: Sequence[Value]) -> str:
    """The Markdown table of a chart's values (docs/hosters/install.md carries it, checked)."""
    rows = ["| value | default | meaning |", "|---|---|---|"]
    for value in values:
        default = json.dumps(value.default, separators=(", ", ": "))
        rows.append(f"| `{value.path}` | `{default}` | {value.help} |")
    return "\n".join(rows) + "\n"
