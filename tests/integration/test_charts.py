"""The Helm charts (charts/<operator>, generated from config/ by hack/charts) with the real Helm and
the local control plane: ``helm lint``; ``helm template`` with the default values renders exactly the
objects of config/ (``kubectl kustomize``) and each value changes only its own fields; values that
would break the operator are refused; a server-side dry run accepts everything the chart renders
(CRDs, RBAC, the Deployment under Pod Security "restricted", admission policies, ServiceMonitor,
PrometheusRule, dashboard); and ``helm install`` installs each chart, whose ServiceAccount, token in
hand, runs the operator (as the Deployment would: its arguments and environment) and reconciles a
sample object, with the Lease in the release namespace — least privilege proved by use.

The Prometheus Operator's CRDs come from tests/fixtures/monitoring-crds.yaml (removed afterwards when
this module added them). No kubelet runs the installed Deployment; the test runs its container's
command as a local process instead. Each release is uninstalled at the end.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack.devcluster import ClusterInfo
from hack.substrate import DRIVER_USERNAME
from harness.identity import serviceaccount_kubeconfig
from harness.manifests import ROOT, apply_all, load
from harness.operators import RunningOperator, operator_process
from harness.waiting import eventually
from operators.endpointattachment.api import ATTACHMENTS
from operators.gpuclass.api import GPUCLASSES
from shared.kube import Kube, Obj
from shared.resources import CRDS, DEPLOYMENTS, LEASES, NAMESPACES, SERVICE_ACCOUNTS, Resource

OPERATORS = ("gpuclass", "endpointattachment")
# The namespace each operator's config/ installs into (config/default/<operator>/namespace.yaml).
CONFIG_NAMESPACES = {"gpuclass": "cozy-gpuclass", "endpointattachment": "cozy-endpointattachment"}
MONITORING_CRDS = "tests/fixtures/monitoring-crds.yaml"
# Flux's HelmRelease CRD: the EndpointAttachment operator needs it served to start.
HELMRELEASE_CRD = "tests/fixtures/helmrelease-crd.yaml"
ALL_MONITORING = (
    "--set",
    "monitoring.serviceMonitor.enabled=true,monitoring.prometheusRule.enabled=true,"
    "monitoring.dashboards.enabled=true",
)
MONITORING_KINDS = frozenset({"ServiceMonitor", "PrometheusRule"})
DASHBOARD_LABEL = "grafana_dashboard"
TOOL_TIMEOUT = 180.0
# `helm template` renders for this Kubernetes version (without a cluster it assumes 1.20, below the
# charts' floor): the floor itself, so nothing newer is relied on.
KUBE_VERSION = "1.30.0"
# The Pod name the Downward API would give the installed Deployment's replica.
EXAMPLE_POD_SUFFIX = "5c7d9f8b6-chart"
ENV_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


# --- running the tools ---------------------------------------------------------------------------


async def run(
    *argv: str, stdin: str | None = None, env: Mapping[str, str] | None = None
) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE if stdin is not None else None,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )
    try:
        out, err = await asyncio.wait_for(
            process.communicate(stdin.encode() if stdin is not None else None), timeout=TOOL_TIMEOUT
        )
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError(f"{' '.join(argv)} took over {TOOL_TIMEOUT}s") from None
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@dataclass(frozen=True)
class Helm:
    binary: str
    home: Path  # Helm's cache, config and data: the test's own, never the user's

    async def __call__(self, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
        env = {
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        return await run(self.binary, *args, stdin=stdin, env=env)

    async def template(self, operator: str, namespace: str, *args: str) -> list[Obj]:
        return [
            doc for doc in yaml.safe_load_all(await self.template_text(operator, namespace, *args)) if doc
        ]

    async def template_text(self, operator: str, namespace: str, *args: str) -> str:
        code, out, err = await self(
            "template",
            operator,
            f"charts/{operator}",
            "--namespace",
            namespace,
            "--include-crds",
            "--kube-version",
            KUBE_VERSION,
            *args,
        )
        assert code == 0, f"helm template charts/{operator} {' '.join(args)} failed:\n{err}"
        return out


@pytest.fixture(scope="module")
async def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    code, out, err = await run(str(ROOT / "hack" / "build-tool.sh"), "helm")
    assert code == 0, err
    return Helm(out.strip().splitlines()[-1], tmp_path_factory.mktemp("helm"))


async def kustomize(cluster: ClusterInfo, path: str) -> list[Obj]:
    code, out, err = await run(cluster.kubectl, "kustomize", path)
    assert code == 0, f"kubectl kustomize {path} failed:\n{err}"
    return [doc for doc in yaml.safe_load_all(out) if doc]


async def as_kustomize_reads(cluster: ClusterInfo, text: str, directory: Path) -> list[Obj]:
    """``text``'s objects as kustomize parses them. Its YAML library reads a folded scalar's line
    break before a more-indented line as two (the CEL rules of the CRDs and policies have such lines;
    CEL ignores the blank), where Helm, PyYAML and the YAML spec read one: the chart's output goes
    through the same reading as config/'s before the two are compared."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "rendered.yaml").write_text(text)
    (directory / "kustomization.yaml").write_text("resources:\n- rendered.yaml\n")
    return await kustomize(cluster, str(directory))


async def chart_objects(
    helm: Helm, cluster: ClusterInfo, directory: Path, operator: str, namespace: str, *args: str
) -> dict[Key, Obj]:
    text = await helm.template_text(operator, namespace, *args)
    return by_key(await as_kustomize_reads(cluster, text, directory))


Key = tuple[str, str, str]  # kind, namespace ("" when cluster-scoped), name


def key(obj: Mapping[str, Any]) -> Key:
    metadata = obj["metadata"]
    return obj["kind"], metadata.get("namespace") or "", metadata["name"]


def by_key(objects: Sequence[Obj]) -> dict[Key, Obj]:
    keyed = {key(obj): obj for obj in objects}
    assert len(keyed) == len(objects), "two objects of the same kind, namespace and name"
    return keyed


async def config_objects(cluster: ClusterInfo, operator: str) -> dict[Key, Obj]:
    """What config/ installs for the operator: config/default/<operator> but its Namespace, the
    policies of config/admission/<operator> (when there), and its part of config/monitoring."""
    namespace = CONFIG_NAMESPACES[operator]
    objects = [o for o in await kustomize(cluster, f"config/default/{operator}") if o["kind"] != "Namespace"]
    if (ROOT / "config" / "admission" / operator / "kustomization.yaml").exists():
        listed = {key(o) for o in objects}
        objects += [
            o for o in await kustomize(cluster, f"config/admission/{operator}") if key(o) not in listed
        ]
    for obj in await kustomize(cluster, "config/monitoring"):
        labels = obj["metadata"].get("labels") or {}
        if obj["metadata"].get("namespace") == namespace or (
            DASHBOARD_LABEL in labels and labels.get("app.kubernetes.io/name") == f"{operator}-operator"
        ):
            objects.append(obj)
    return by_key(objects)


def diff(got: Mapping[Key, Obj], want: Mapping[Key, Obj]) -> str:
    lines = [f"only in the chart: {k}" for k in sorted(got.keys() - want.keys())]
    lines += [f"only in config/: {k}" for k in sorted(want.keys() - got.keys())]
    for k in sorted(got.keys() & want.keys()):
        if got[k] != want[k]:
            lines.append(
                f"differs: {k}\n chart:  {json.dumps(got[k], sort_keys=True)}\n config: "
                f"{json.dumps(want[k], sort_keys=True)}"
            )
    return "\n".join(lines)


# --- lint and template ---------------------------------------------------------------------------


@pytest.mark.parametrize("operator", OPERATORS)
@pytest.mark.parametrize("values", [(), ALL_MONITORING], ids=["defaults", "monitoring"])
async def test_lint(helm: Helm, operator: str, values: tuple[str, ...]) -> None:
    code, out, err = await helm("lint", "--strict", f"charts/{operator}", *values)
    assert code == 0, f"helm lint charts/{operator} failed:\n{out}\n{err}"


@pytest.mark.parametrize("operator", OPERATORS)
async def test_defaults_render_exactly_config(
    helm: Helm, cluster: ClusterInfo, operator: str, tmp_path: Path
) -> None:
    """In config/'s namespace, the default values give config/'s objects, field for field; the
    monitoring objects only when their values say so."""
    namespace = CONFIG_NAMESPACES[operator]
    want = await config_objects(cluster, operator)
    with_monitoring = await chart_objects(
        helm, cluster, tmp_path / "all", operator, namespace, *ALL_MONITORING
    )
    assert not diff(with_monitoring, want), diff(with_monitoring, want)
    defaults = await chart_objects(helm, cluster, tmp_path / "defaults", operator, namespace)
    without = {
        k: o
        for k, o in want.items()
        if k[0] not in MONITORING_KINDS and DASHBOARD_LABEL not in o["metadata"].get("labels", {})
    }
    assert not diff(defaults, without), diff(defaults, without)


Edit = Callable[[dict[Key, Obj], str], object]


def deployment(objects: dict[Key, Obj], operator: str) -> Obj:
    return objects[("Deployment", CONFIG_NAMESPACES[operator], f"{operator}-operator")]


def container(objects: dict[Key, Obj], operator: str) -> Obj:
    [only] = deployment(objects, operator)["spec"]["template"]["spec"]["containers"]
    assert isinstance(only, dict)
    return only


def pod(objects: dict[Key, Obj], operator: str) -> Obj:
    spec: Obj = deployment(objects, operator)["spec"]["template"]["spec"]
    return spec


def set_env(objects: dict[Key, Obj], operator: str, suffix: str, value: str) -> Obj:
    [variable] = [e for e in container(objects, operator)["env"] if e["name"].endswith(suffix)]
    variable["value"] = value
    assert isinstance(variable, dict)
    return variable


def of_kind(objects: dict[Key, Obj], kind: str) -> Obj:
    [found] = [o for k, o in objects.items() if k[0] == kind]
    return found


def set_labels(kind: str, extra: Mapping[str, str]) -> Edit:
    return lambda objects, _: of_kind(objects, kind)["metadata"]["labels"].update(extra)


# One row per value: the --set arguments, and what they change in config/'s objects (nothing else).
VALUE_ROWS: dict[str, tuple[tuple[str, ...], Edit]] = {
    "image": (
        ("--set", "image.repository=registry.example/cozy/ops,image.tag=v1.2.3"),
        lambda o, op: container(o, op).update(image="registry.example/cozy/ops:v1.2.3"),
    ),
    "image digest": (
        ("--set", "image.digest=sha256:" + "a" * 64),
        lambda o, op: container(o, op).update(
            image="ghcr.io/cozystack/cozystack-operators@sha256:" + "a" * 64
        ),
    ),
    "pull policy and secrets": (
        ("--set", "image.pullPolicy=Always", "--set-json", 'imagePullSecrets=[{"name":"registry"}]'),
        lambda o, op: [
            container(o, op).update(imagePullPolicy="Always"),
            pod(o, op).update(imagePullSecrets=[{"name": "registry"}]),
        ],
    ),
    "replicas": (("--set", "replicas=3"), lambda o, op: deployment(o, op)["spec"].update(replicas=3)),
    "one replica without leader election": (
        ("--set", "replicas=1,leaderElection.enabled=false,podDisruptionBudget.enabled=false"),
        lambda o, op: [
            deployment(o, op)["spec"].update(replicas=1),
            set_env(o, op, "_LEADER_ELECT", "false"),
            o.pop(("PodDisruptionBudget", CONFIG_NAMESPACES[op], f"{op}-operator")),
        ],
    ),
    "lease name": (
        ("--set", "leaderElection.id=another-lease"),
        lambda o, op: set_env(o, op, "_LEADER_ELECTION_ID", "another-lease"),
    ),
    "otel endpoint": (
        ("--set", "otel.endpoint=http://collector.cozy-monitoring:4318"),
        lambda o, op: set_env(o, op, "OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector.cozy-monitoring:4318"),
    ),
    "extra env": (
        ("--set-json", 'extraEnv=[{"name":"OTEL_TRACES_SAMPLER","value":"always_on"}]'),
        lambda o, op: container(o, op)["env"].append({"name": "OTEL_TRACES_SAMPLER", "value": "always_on"}),
    ),
    "resources": (
        # Helm merges a map into its default: what is not given keeps config/'s figure.
        ("--set-json", 'resources={"requests":{"cpu":"1"},"limits":{"memory":"2Gi"}}'),
        lambda o, op: [
            container(o, op)["resources"]["requests"].update(cpu="1"),
            container(o, op)["resources"]["limits"].update(memory="2Gi"),
        ],
    ),
    "scheduling": (
        (
            "--set-json",
            'nodeSelector={"node-role.kubernetes.io/control-plane":""}',
            "--set-json",
            'tolerations=[{"key":"node-role.kubernetes.io/control-plane","operator":"Exists"}]',
            "--set",
            "priorityClassName=system-cluster-critical",
        ),
        lambda o, op: pod(o, op).update(
            nodeSelector={"node-role.kubernetes.io/control-plane": ""},
            tolerations=[{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}],
            priorityClassName="system-cluster-critical",
        ),
    ),
    "disruption budget": (
        ("--set", "podDisruptionBudget.minAvailable=50%"),
        lambda o, op: of_kind(o, "PodDisruptionBudget")["spec"].update(minAvailable="50%"),
    ),
    "service monitor": (
        (
            "--set",
            "monitoring.serviceMonitor.interval=1m,monitoring.serviceMonitor.scrapeTimeout=20s",
            "--set",
            "monitoring.serviceMonitor.labels.release=prometheus",
        ),
        lambda o, op: (
            of_kind(o, "ServiceMonitor")["spec"]["endpoints"][0].update(interval="1m", scrapeTimeout="20s"),
            set_labels("ServiceMonitor", {"release": "prometheus"})(o, op),
        ),
    ),
    "rule labels": (
        ("--set", "monitoring.prometheusRule.labels.release=prometheus"),
        set_labels("PrometheusRule", {"release": "prometheus"}),
    ),
    "dashboard namespace": (
        ("--set", "monitoring.dashboards.namespace=grafana"),
        lambda o, op: of_kind(o, "ConfigMap")["metadata"].update(namespace="grafana"),
    ),
}


@pytest.mark.parametrize("operator", OPERATORS)
@pytest.mark.parametrize("row", sorted(VALUE_ROWS))
async def test_each_value_changes_only_its_fields(
    helm: Helm, cluster: ClusterInfo, operator: str, row: str, tmp_path: Path
) -> None:
    args, edit = VALUE_ROWS[row]
    want = copy.deepcopy(await config_objects(cluster, operator))
    edit(want, operator)
    want = by_key(list(want.values()))  # an edit may move an object (another namespace)
    got = await chart_objects(
        helm, cluster, tmp_path, operator, CONFIG_NAMESPACES[operator], *ALL_MONITORING, *args
    )
    assert not diff(got, want), diff(got, want)


@pytest.mark.parametrize("operator", OPERATORS)
async def test_release_namespace_replaces_config_namespace(
    helm: Helm, cluster: ClusterInfo, operator: str, tmp_path: Path
) -> None:
    """Installed elsewhere, every object and reference that config/ puts in the operator's namespace
    (metadata, binding subjects, the operator's user name in admission policies) follows the release."""
    namespace = CONFIG_NAMESPACES[operator]
    elsewhere = "platform-operators"
    want = json.loads(
        re.sub(
            rf"(?<![\w.-]){re.escape(namespace)}(?![\w.-])",
            elsewhere,
            json.dumps(list((await config_objects(cluster, operator)).values())),
        )
    )
    got = await chart_objects(helm, cluster, tmp_path, operator, elsewhere, *ALL_MONITORING)
    assert not diff(got, by_key(want)), diff(got, by_key(want))
    assert namespace not in json.dumps(list(got.values())), f"{namespace} left in the chart's objects"


# Values the chart refuses, and a word of why (from its own message or the schema's).
REFUSED: dict[str, tuple[tuple[str, ...], str]] = {
    "two replicas without a leader": (("--set", "leaderElection.enabled=false"), "leaderElection.enabled"),
    "a budget no drain can meet": (("--set", "podDisruptionBudget.minAvailable=2"), "minAvailable"),
    "an unknown value": (("--set", "replica=3"), "replica"),
    "a wrong type": (("--set", "replicas=two"), "replicas"),
    "no replica": (("--set", "replicas=0"), "replicas"),
}


@pytest.mark.parametrize("operator", OPERATORS)
@pytest.mark.parametrize("row", sorted(REFUSED))
async def test_values_that_would_break_the_operator_are_refused(helm: Helm, operator: str, row: str) -> None:
    args, word = REFUSED[row]
    code, out, err = await helm(
        "template", operator, f"charts/{operator}", "--kube-version", KUBE_VERSION, *args
    )
    assert code != 0, f"helm template accepted {args}:\n{out[:2000]}"
    assert word in err, err


async def test_the_substrate_drivers_identity_is_a_value(
    helm: Helm, cluster: ClusterInfo, tmp_path: Path
) -> None:
    """The one identity the rendered-Services policy lets pin a rendered Service: config/'s by
    default (the default-values test), the value's when set, and nothing else changes; a user name
    that would end the policy's CEL string is refused."""
    operator, username = "endpointattachment", "system:serviceaccount:lb-system:lb-driver"
    want = copy.deepcopy(await config_objects(cluster, operator))
    [driver] = [
        v for v in of_kind(want, "ValidatingAdmissionPolicy")["spec"]["variables"] if v["name"] == "driver"
    ]
    default = driver["expression"]
    driver["expression"] = default.replace(DRIVER_USERNAME, username)
    assert driver["expression"] != default
    got = await chart_objects(
        helm,
        cluster,
        tmp_path,
        operator,
        CONFIG_NAMESPACES[operator],
        *ALL_MONITORING,
        "--set",
        f"admission.substrateDriverUsername={username}",
    )
    assert not diff(got, want), diff(got, want)
    code, _, err = await helm(
        "template",
        operator,
        f"charts/{operator}",
        "--kube-version",
        KUBE_VERSION,
        "--set",
        "admission.substrateDriverUsername=x' || true || '",
    )
    assert code != 0, "a quote in the user name would rewrite the policy"
    assert "substrateDriverUsername" in err, err


# --- against the API server ----------------------------------------------------------------------


@pytest.fixture(scope="module")
async def monitoring_crds(kube: Kube) -> AsyncIterator[None]:
    """The Prometheus Operator's two kinds (fixture CRDs) and Flux's HelmRelease (the
    EndpointAttachment operator needs it to start), served; removed after when added here."""
    crds = [*load(MONITORING_CRDS), *load(HELMRELEASE_CRD)]
    added = [
        c["metadata"]["name"] for c in crds if await kube.get(CRDS.path(name=c["metadata"]["name"])) is None
    ]
    await apply_all(kube, crds)
    yield
    for name in added:
        await kube.delete(CRDS.path(name=name))

        async def gone(name: str = name) -> bool:
            return await kube.get(CRDS.path(name=name)) is None

        await eventually(gone, timeout=60, what=f"CRD {name} deleted")


async def label_restricted(kube: Kube, namespace: str) -> None:
    patch = {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
    await kube.patch(NAMESPACES.path(name=namespace), patch, "merge")


@pytest.mark.parametrize("operator", OPERATORS)
async def test_server_side_dry_run_accepts_everything_rendered(
    helm: Helm,
    cluster: ClusterInfo,
    kube: Kube,
    monitoring_crds: None,
    namespace: str,
    operator: str,
    tmp_path: Path,
) -> None:
    """Every object the chart renders with every toggle on (CRDs included) passes the API server's
    validation and admission, the Deployment under Pod Security "restricted"; nothing is stored."""
    await label_restricted(kube, namespace)
    rendered = await helm.template(
        operator, namespace, *ALL_MONITORING, "--set", f"monitoring.dashboards.namespace={namespace}"
    )
    code, out, err = await run(
        cluster.kubectl,
        "--kubeconfig",
        cluster.kubeconfig,
        "--cache-dir",
        str(tmp_path / "kubectl-cache"),
        "apply",
        "--dry-run=server",
        "-f",
        "-",
        stdin=yaml.safe_dump_all(rendered),
    )
    assert code == 0, f"server-side dry run of charts/{operator} failed:\n{out}\n{err}"
    assert "PodSecurity" not in err, err
    assert len([line for line in out.splitlines() if "(server dry run)" in line]) == len(rendered), out
    assert await kube.get(DEPLOYMENTS.path(namespace, f"{operator}-operator")) is None


# --- helm install, and the operator under the chart's ServiceAccount --------------------------------


def sample(operator: str, namespace: str) -> tuple[Resource, Obj, str | None]:
    """A sample object the operator reconciles (from config/samples, renamed for this test), and the
    namespace it goes in (None: cluster-scoped). The attachment names no application here: the
    operator answers it with a status (Resolved False) all the same."""
    if operator == "gpuclass":
        [obj] = load("config/samples/gpu_v1alpha1_gpuclass.yaml")
        resource, where = GPUCLASSES, None
    else:
        [obj] = load("config/samples/local.sdn_v1alpha1_endpointattachment_standard.yaml")
        resource, where = ATTACHMENTS, namespace
    obj["metadata"]["name"] = f"chart-{obj['metadata']['name']}"
    return resource, obj, where


def reconciled(obj: Obj | None) -> bool:
    """The operator wrote a status for this generation of the object."""
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    generation = (obj or {}).get("metadata", {}).get("generation")
    return bool(conditions) and all(c.get("observedGeneration") == generation for c in conditions)


def container_environment(container: Obj, pod_name: str, namespace: str) -> dict[str, str]:
    """The container's environment as the kubelet would give it: Downward API fields resolved,
    ``$(VAR)`` references expanded from the variables before."""
    downward = {"metadata.name": pod_name, "metadata.namespace": namespace}
    env: dict[str, str] = {}
    for variable in container.get("env") or []:
        if "valueFrom" in variable:
            env[variable["name"]] = downward[variable["valueFrom"]["fieldRef"]["fieldPath"]]
        else:  # the API server drops an empty value
            value = variable.get("value", "")
            env[variable["name"]] = ENV_REFERENCE.sub(lambda m: env.get(m[1], m[0]), value)
    return env


@pytest.mark.parametrize("operator", OPERATORS)
async def test_helm_install_and_the_operator_runs_under_the_charts_service_account(
    helm: Helm,
    cluster: ClusterInfo,
    kube: Kube,
    monitoring_crds: None,
    namespace: str,
    operator: str,
    tmp_path: Path,
) -> None:
    release = f"{operator}-chart-test"
    await label_restricted(kube, namespace)
    code, out, err = await helm(
        "install",
        release,
        f"charts/{operator}",
        "--kubeconfig",
        cluster.kubeconfig,
        "--namespace",
        namespace,
        # Objects an earlier test applied from config/ (the same cluster-scoped RBAC) become the
        # release's, as a hoster moving from `kubectl apply -k` to the chart would want.
        "--take-ownership",
        *ALL_MONITORING,
        "--set",
        f"monitoring.dashboards.namespace={namespace}",
    )
    assert code == 0, f"helm install charts/{operator} failed:\n{out}\n{err}"
    resource, obj, where = sample(operator, namespace)
    try:
        code, out, err = await helm(
            "status", release, "--kubeconfig", cluster.kubeconfig, "-n", namespace, "-o", "json"
        )
        assert code == 0, err
        assert json.loads(out)["info"]["status"] == "deployed"
        installed = await kube.get(DEPLOYMENTS.path(namespace, f"{operator}-operator"))
        assert installed is not None, "the chart's Deployment is not there"
        pod_spec = installed["spec"]["template"]["spec"]
        account = pod_spec["serviceAccountName"]
        assert await kube.get(SERVICE_ACCOUNTS.path(namespace, account)) is not None
        [spec] = pod_spec["containers"]
        kubeconfig = await serviceaccount_kubeconfig(
            kube, cluster.kubeconfig, namespace, account, tmp_path / "operator.kubeconfig"
        )
        pod_name = f"{operator}-operator-{EXAMPLE_POD_SUFFIX}"
        env = container_environment(spec, pod_name, namespace)
        module, *args = spec["args"]
        async with operator_process(module, kubeconfig, args, tmp_path / "operator.log", env) as running:
            await kube.create(resource.path(where), obj)

            async def status_written() -> bool:
                return reconciled(await kube.get(resource.path(where, obj["metadata"]["name"])))

            await eventually(
                status_written, timeout=120, what=f"{operator} reconciles {obj['metadata']['name']}"
            )
            lease = await kube.get(LEASES.path(namespace, env[leader_election_id_variable(env)]))
            assert lease is not None, "no Lease in the release namespace"
            assert lease["spec"]["holderIdentity"].startswith(pod_name), lease["spec"]
            assert_healthy(running)
            # Deleted while the operator runs: an attachment's finalizer is the operator's to remove.
            await kube.delete(resource.path(where, obj["metadata"]["name"]))

            async def gone() -> bool | None:
                return True if await kube.get(resource.path(where, obj["metadata"]["name"])) is None else None

            await eventually(gone, timeout=60, what=f"{obj['metadata']['name']} deleted")
    finally:
        await kube.delete(resource.path(where, obj["metadata"]["name"]))
        code, out, err = await helm(
            "uninstall", release, "--kubeconfig", cluster.kubeconfig, "-n", namespace, "--wait"
        )
        assert code == 0, f"helm uninstall {release} failed:\n{out}\n{err}"


def leader_election_id_variable(env: Mapping[str, str]) -> str:
    [name] = [n for n in env if n.endswith("_LEADER_ELECTION_ID")]
    return name


def assert_healthy(running: RunningOperator) -> None:
    assert running.process.returncode is None, f"operator died:\n{running.log_tail()}"
    assert "Traceback" not in running.log_path.read_text(), running.log_tail(200)
