"""The alerts and dashboards of config/monitoring, checked by the real promtool and against what the
running operators export.

* ``promtool check rules`` on the spec of every PrometheusRule (config/monitoring/<operator>/);
* ``promtool test rules`` with tests/fixtures/promtool/<operator>.test.yaml, which has for every alert
  a case where it fires, with the ``job`` and ``namespace`` labels alerts are routed on, and a case
  where it stays silent (held here: no alert without both);
* every dashboard query and variable, Grafana's variables replaced by values, parsed by promtool as a
  recording rule; panel titles are there and distinct;
* both operators run on the local control plane (each under its own ServiceAccount and RBAC, with an
  object of each kind they count, one attachment never Provisioned), and every metric an alert or a
  panel names is in what they serve on /metrics, with the labels the expression matches or groups on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from hack.devcluster import ClusterInfo
from harness.ea_cluster import ATTACHMENTS, attachment_body, ea_crds_and_node, ea_operator
from harness.identity import serviceaccount_kubeconfig
from harness.manifests import ROOT, apply_all, load
from harness.operators import RunningOperator, operator_process
from harness.waiting import eventually
from operators.gpuclass.api import GPUCLASSES
from shared.kube import Kube, Obj
from shared.resources import NODES

OPERATORS = ("gpuclass", "endpointattachment")
PROMTOOL_FIXTURES = ROOT / "tests" / "fixtures" / "promtool"
DASHBOARDS = ROOT / "config" / "monitoring" / "dashboards"
TOOL_TIMEOUT = 120.0
# The labels alerts are routed on: every firing case of every alert must carry them.
ROUTING_LABELS = ("job", "namespace")
# What a dashboard's Grafana variables stand for when promtool parses its queries.
GRAFANA_VARIABLES = {
    "$__rate_interval": "5m",
    "$__interval": "1m",
    "$__range": "1h",
    "$gpuclass": ".*",
    "$condition": "Provisioned",
}
LABEL_VALUES = re.compile(r"^label_values\(\s*(\w+)\s*,\s*(\w+)\s*\)$")
# A metric of ours an expression names: the operators' domain prefixes and controller-runtime's.
METRIC = re.compile(
    r"\b((?:cozystack_gpuclass|cozystack_endpointattachment|controller_runtime|workqueue|leader_election)_\w+)"
)
SELECTOR = re.compile(r"\b([A-Za-z_:][\w:]*)\s*\{([^}]*)\}")
MATCHER = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")
# Labels Prometheus adds to every scraped sample (the target's), and Prometheus' own series.
TARGET_LABELS = frozenset({"job", "instance", "namespace", "pod", "service", "endpoint", "container"})
PROMETHEUS_SERIES = frozenset({"up"})
# The GPUClass operator, as config/ deploys it.
GPUCLASS_NAMESPACE = "cozy-gpuclass"
GPUCLASS_RBAC = "config/rbac/gpuclass"
GPUCLASS_CRD = "config/crd/gpuclass/gpu.cozystack.io_gpuclasses.yaml"
GPU_RESOURCE = "nvidia.com/GH100_H200_SXM_141GB"
MONITORING_NODE = "monitoring-gpu-node"
MONITORING_NAMESPACE_KINDS = frozenset({"ServiceAccount", "Role", "RoleBinding"})


async def run(*argv: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=ROOT
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), timeout=TOOL_TIMEOUT)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError(f"{' '.join(argv)} took over {TOOL_TIMEOUT}s") from None
    assert process.returncode is not None
    return process.returncode, out.decode()


@pytest.fixture(scope="module")
async def promtool() -> str:
    code, out = await run(str(ROOT / "hack" / "build-tool.sh"), "promtool")
    assert code == 0, out
    return out.strip().splitlines()[-1]


def prometheus_rules() -> dict[str, Obj]:
    """Each operator's PrometheusRule, from config/monitoring/<operator>/."""
    rules = {}
    for operator in OPERATORS:
        [rule] = [
            doc
            for path in sorted((ROOT / "config" / "monitoring" / operator).glob("*.yaml"))
            for doc in load(path)
            if doc["kind"] == "PrometheusRule"
        ]
        rules[operator] = rule
    return rules


def alerts(rule: Obj) -> list[Obj]:
    return [item for group in rule["spec"]["groups"] for item in group["rules"] if "alert" in item]


def write_rules(directory: Path) -> list[Path]:
    """Each PrometheusRule's spec as a Prometheus rules file, <operator>.rules.yaml."""
    paths = []
    for operator, rule in prometheus_rules().items():
        path = directory / f"{operator}.rules.yaml"
        path.write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
        paths.append(path)
    return paths


# --- promtool ------------------------------------------------------------------------------------


async def test_promtool_checks_every_prometheus_rule(promtool: str, tmp_path: Path) -> None:
    paths = write_rules(tmp_path)
    code, out = await run(promtool, "check", "rules", "--lint=all", "--lint-fatal", *map(str, paths))
    assert code == 0, out
    for path, rule in zip(paths, prometheus_rules().values(), strict=True):
        assert f"SUCCESS: {len(alerts(rule))} rules found" in out.split(f"Checking {path}")[1], out


async def test_promtool_unit_tests_pass(promtool: str, tmp_path: Path) -> None:
    write_rules(tmp_path)
    tests = []
    for path in sorted(PROMTOOL_FIXTURES.glob("*.test.yaml")):
        shutil.copy(path, tmp_path / path.name)
        tests.append(str(tmp_path / path.name))
    assert len(tests) == len(OPERATORS), tests
    code, out = await run(promtool, "test", "rules", *tests)
    assert code == 0, out


def promtool_cases() -> Iterator[tuple[str, Obj]]:
    """(test file, alert_rule_test case) of every promtool test file."""
    for path in sorted(PROMTOOL_FIXTURES.glob("*.test.yaml")):
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test") or []:
                yield path.name, case


@pytest.mark.parametrize("operator", OPERATORS)
def test_every_alert_has_a_firing_and_a_silent_case_with_routing_labels(operator: str) -> None:
    test_file = yaml.safe_load((PROMTOOL_FIXTURES / f"{operator}.test.yaml").read_text())
    assert test_file["rule_files"] == [f"{operator}.rules.yaml"]
    cases = [case for name, case in promtool_cases() if name == f"{operator}.test.yaml"]
    problems = []
    for alert in alerts(prometheus_rules()[operator]):
        name = alert["alert"]
        mine = [case for case in cases if case["alertname"] == name]
        if not any(case["exp_alerts"] for case in mine):
            problems.append(f"{name}: no case where it fires")
        if not any(not case["exp_alerts"] for case in mine):
            problems.append(f"{name}: no case where it stays silent")
        for case in mine:
            for expected in case["exp_alerts"]:
                missing = [label for label in ROUTING_LABELS if label not in expected["exp_labels"]]
                if missing:
                    problems.append(f"{name} at {case['eval_time']}: fires without {missing}")
    assert not problems, "\n".join(problems)


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, PromQL) of every dashboard panel target and query variable, Grafana's variables
    replaced by values (a label_values() variable becomes the query Grafana makes of it)."""
    found = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        dashboard = json.loads(path.read_text())
        for panel in dashboard["panels"]:
            for target in panel.get("targets") or []:
                found.append((f"{path.name} panel {panel['title']!r} {target['refId']}", target["expr"]))
        for variable in dashboard["templating"]["list"]:
            query = variable.get("query")
            if variable.get("type") == "query" and isinstance(query, dict):
                match = LABEL_VALUES.match(query["query"])
                assert match, f"{path.name} variable {variable['name']}: {query['query']}"
                found.append(
                    (f"{path.name} variable {variable['name']}", f"group by ({match[2]}) ({match[1]})")
                )
    replaced = []
    for where, expr in found:
        for variable, value in sorted(GRAFANA_VARIABLES.items(), key=lambda item: -len(item[0])):
            expr = expr.replace(variable, value)
        assert "$" not in expr, f"{where}: a Grafana variable this test does not know: {expr}"
        replaced.append((where, expr))
    return replaced


async def test_promtool_parses_every_dashboard_query(promtool: str, tmp_path: Path) -> None:
    queries = dashboard_queries()
    rules = [{"record": f"dashboard:query_{index}", "expr": expr} for index, (_, expr) in enumerate(queries)]
    path = tmp_path / "dashboards.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    code, out = await run(promtool, "check", "rules", str(path))
    where = "\n".join(f"dashboard:query_{i}: {w}" for i, (w, _) in enumerate(queries))
    assert code == 0, f"{out}\n{where}"
    assert f"SUCCESS: {len(rules)} rules found" in out


@pytest.mark.parametrize("path", sorted(p.name for p in DASHBOARDS.glob("*.json")))
def test_panel_titles_are_there_and_distinct(path: str) -> None:
    panels = json.loads((DASHBOARDS / path).read_text())["panels"]
    titles = [panel.get("title") for panel in panels]
    assert all(titles), f"a panel without a title in {path}"
    assert len(titles) == len(set(titles)), f"two panels with one title in {path}"
    undescribed = [p["title"] for p in panels if p.get("targets") and not p.get("description")]
    assert not undescribed, f"panels with queries but no description: {undescribed}"


# --- what the running operators export ------------------------------------------------------------


Exported = dict[str, frozenset[str]]  # sample name -> its label names (over every sample)


async def exported(operator: RunningOperator) -> Exported:
    """Every sample name the operator serves, with the label names seen on it; a family with no
    sample yet (a labelled metric nothing has touched) counts with its declared suffixes."""
    async with httpx.AsyncClient() as client:
        response = await client.get(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5)
    response.raise_for_status()
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(response.text):
        for suffix in suffixes.get(family.type, ("",)):
            labels.setdefault(family.name + suffix, set())
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    return {name: frozenset(names) for name, names in labels.items()}


def monitoring_expressions() -> list[tuple[str, str]]:
    found = [
        (f"alert {alert['alert']}", alert["expr"])
        for rule in prometheus_rules().values()
        for alert in alerts(rule)
    ]
    return [*found, *dashboard_queries()]


def expression_problems(where: str, expr: str, exported: Exported) -> list[str]:
    problems = []
    metrics = set(METRIC.findall(expr))
    for metric in sorted(metrics - exported.keys()):
        problems.append(f"{where}: {metric} is not exported")
    known = {metric for metric in metrics if metric in exported}
    for metric, matchers in SELECTOR.findall(expr):
        if metric in known:
            for label in set(MATCHER.findall(matchers)) - exported[metric] - TARGET_LABELS:
                problems.append(f"{where}: {metric} has no label {label!r}")
        elif metric not in PROMETHEUS_SERIES and metric not in metrics:
            problems.append(f"{where}: {metric} is neither an operator's metric nor Prometheus' own")
    available = set(TARGET_LABELS).union(*(exported[m] for m in known))
    for clause in GROUPING.findall(expr):
        for label in {x.strip() for x in clause.split(",") if x.strip()} - available:
            problems.append(f"{where}: no metric of the expression has label {label!r}")
    return problems


@contextlib.asynccontextmanager
async def gpuclass_operator(
    kube: Kube, cluster: ClusterInfo, tmp_path: Path
) -> AsyncIterator[RunningOperator]:
    """The GPUClass operator under its own ServiceAccount and config/rbac/gpuclass."""
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": GPUCLASS_NAMESPACE}}
    listed = load(f"{GPUCLASS_RBAC}/kustomization.yaml")[0]["resources"]
    rbac = [doc for name in listed for doc in load(f"{GPUCLASS_RBAC}/{name}")]
    for doc in rbac:
        if doc["kind"] in MONITORING_NAMESPACE_KINDS:
            doc["metadata"].setdefault("namespace", GPUCLASS_NAMESPACE)
    await apply_all(kube, [*load(GPUCLASS_CRD), namespace, *rbac])
    kubeconfig = await serviceaccount_kubeconfig(
        kube, cluster.kubeconfig, GPUCLASS_NAMESPACE, "gpuclass-operator", tmp_path / "gpuclass.kubeconfig"
    )
    args = ["--debounce-seconds=0.2", f"--leader-election-namespace={GPUCLASS_NAMESPACE}"]
    async with operator_process("operators.gpuclass", kubeconfig, args, tmp_path / "gpuclass.log") as running:
        yield running
        assert running.process.returncode is None, f"operator died:\n{running.log_tail()}"


async def gpu_world(kube: Kube) -> tuple[str, str]:
    """A Ready node advertising a GPU resource and a class of it (so every per-class series has a
    sample); returns (node, class)."""
    await kube.create(
        NODES.path(), {"apiVersion": "v1", "kind": "Node", "metadata": {"name": MONITORING_NODE}}
    )
    status = {
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": ""}],
        "capacity": {GPU_RESOURCE: "8", "cpu": "64", "memory": "1Ti", "pods": "110"},
        "allocatable": {GPU_RESOURCE: "8", "cpu": "64", "memory": "1Ti", "pods": "110"},
    }
    await kube.patch(NODES.path(name=MONITORING_NODE) + "/status", {"status": status}, kind="merge")
    await kube.patch(NODES.path(name=MONITORING_NODE), {"spec": {"taints": None}}, kind="merge")
    [gpu_class] = load("config/samples/gpu_v1alpha1_gpuclass.yaml")
    gpu_class["metadata"]["name"] = "monitoring-h200"
    gpu_class["spec"]["resourceName"] = GPU_RESOURCE
    await kube.create(GPUCLASSES.path(), gpu_class)
    return MONITORING_NODE, "monitoring-h200"


async def test_alerts_and_dashboards_name_what_the_running_operators_export(
    kube: Kube, cluster: ClusterInfo, namespace: str, tmp_path: Path
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(ea_crds_and_node(kube))
        gpuclass = await stack.enter_async_context(gpuclass_operator(kube, cluster, tmp_path))
        endpointattachment = await stack.enter_async_context(ea_operator(kube, cluster, tmp_path))
        node, gpu_class = await gpu_world(kube)
        stack.push_async_callback(kube.delete, NODES.path(name=node))
        stack.push_async_callback(kube.delete, GPUCLASSES.path(name=gpu_class))
        # An attachment whose application and endpoint do not exist: never Provisioned, so the
        # not-ready gauge has a series.
        attachment = attachment_body("monitoring", "no-such-service")
        await kube.create(ATTACHMENTS.path(namespace), attachment)
        stack.push_async_callback(kube.delete, ATTACHMENTS.path(namespace, "monitoring"))

        async def every_kind_counted() -> Exported | None:
            try:
                both = {**await exported(gpuclass), **await exported(endpointattachment)}
            except httpx.TransportError:  # a metrics server not listening yet
                return None
            wanted = (
                "cozystack_gpuclass_allocatable",
                "cozystack_endpointattachment_not_provisioned_since_timestamp_seconds",
            )
            has_samples = all(both.get(name) for name in wanted)
            return both if has_samples else None

        both = await eventually(every_kind_counted, timeout=120, what="samples of every per-object metric")
        problems = [
            problem
            for where, expr in monitoring_expressions()
            for problem in expression_problems(where, expr, both)
        ]
        assert not problems, "\n".join(problems)
