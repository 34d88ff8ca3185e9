"""The deployment manifests (config/) work with the real kubectl and API server of the local control
plane: every kustomization renders, each ``config/default/<operator>`` applies with
``kubectl apply -k``, installs exactly its own CRDs (``config/crd/<operator>``) and yields a
Deployment that passes Pod Security "restricted" and runs two replicas that elect a leader through a
Lease (a PodDisruptionBudget keeps one, a namespaced Role grants exactly the Lease verbs), the samples
pass the CRDs' validation, every RBAC rule under config/rbac names API groups, resources and verbs the
API server really serves (from discovery), with no wildcard, and the alerts and dashboards of
config/monitoring query only metrics and labels the operators export.

No kubelet runs the Deployments here, and no controller makes ReplicaSets of them; they are deleted
after the check so that a real cluster (``COZY_TEST_KUBECONFIG``) never starts a second operator.
A check whose input files (another engineer's CRDs or RBAC) do not exist yet is skipped, naming them.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import pytest
import yaml

from hack.devcluster import ClusterInfo
from harness.manifests import ROOT, apply_all, kubectl, load
from harness.waiting import eventually
from shared.kube import Kube, Obj
from shared.resources import CRDS, DEPLOYMENTS, NAMESPACES, PDBS, SUBJECT_ACCESS_REVIEWS

# Each Deployment runs this many replicas, one of which leads; the PodDisruptionBudget keeps this many.
REPLICAS = 2
MIN_AVAILABLE = 1
ROLLING_UPDATE = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
# What leader election does with its Lease (shared.runtime.leader: get, create, replace), and nothing
# more: no list or watch (read by name), no patch, no delete.
LEASE_GROUP, LEASE_RESOURCE = "coordination.k8s.io", "leases"
LEASE_VERBS = frozenset({"get", "create", "update"})
NOT_LEASE_VERBS = frozenset({"list", "watch", "patch", "delete", "deletecollection"})
# Verbs whose requests name no object (so a SubjectAccessReview for them carries no name).
UNNAMED_VERBS = frozenset({"create", "list", "watch", "deletecollection"})
# What the Downward API would give a replica of the Deployment as its Pod's name, after its own.
EXAMPLE_POD_SUFFIX = "7d9f8b6c4-x2kqz"
HOSTNAME_TOPOLOGY = "kubernetes.io/hostname"
# The RBAC authorizer learns of a new Role from its informer: applied is not yet effective.
RBAC_PROPAGATION_SECONDS = 30.0
IMAGE = "ghcr.io/cozystack/cozystack-operators:latest"
RESTRICTED_USER = 65532
# CRDs of other projects that the operators' RBAC names (Flux's HelmRelease, KubeVirt).
# Others' CRDs the operators' RBAC and the samples name: Flux's, KubeVirt's, and the address
# substrate's (consumed by the EndpointAttachment operator, never defined by it).
FIXTURE_CRDS = (
    "tests/fixtures/helmrelease-crd.yaml",
    "tests/fixtures/kubevirt-crd.yaml",
    "tests/fixtures/kubevirt-instancetype-crd.yaml",
    *(
        f"tests/fixtures/address-substrate/local.sdn.cozystack.io_{plural}.yaml"
        for plural in ("ipaddressclaims", "ipaddressclasses", "ipaddresses")
    ),
)
# Directories of deployment manifests each of whose YAML files must open with a comment.
OWNED_DIRS = ("config/crd", "config/manager", "config/default", "config/monitoring", "config/samples")
# RBAC verbs that discovery does not list for a resource but the authorizer understands.
SPECIAL_VERBS = frozenset({"bind", "escalate", "impersonate", "use", "approve", "sign", "attest"})
PARAM_KIND_NOT_SYNCED = "not yet synced to use for admission"
# A subresource discovery does not list but the authorizer checks: OwnerReferencesPermissionEnforcement
# asks for update on <owner>/finalizers before a writer may set blockOwnerDeletion on an owner reference.
AUTHORIZATION_SUBRESOURCES = {"finalizers": frozenset({"update"})}


@dataclass(frozen=True)
class Operator:
    name: str
    namespace: str
    service_account: str
    crd_files: tuple[str, ...]
    requests: Mapping[str, str]
    limits: Mapping[str, str]
    env_prefix: str
    leader_election_id: str

    @property
    def default_dir(self) -> str:
        return f"config/default/{self.name}"

    @property
    def crd_dir(self) -> str:
        """The operator's own CRDs, and nothing else: a kustomization of their files."""
        return f"config/crd/{self.name}"

    @property
    def deployment(self) -> str:
        return f"{self.name}-operator"

    @property
    def inputs(self) -> list[str]:
        """Files of others the default needs: its CRDs and its RBAC kustomization."""
        return [
            f"{self.crd_dir}/kustomization.yaml",
            *(f"{self.crd_dir}/{f}" for f in self.crd_files),
            f"config/rbac/{self.name}/kustomization.yaml",
        ]


OPERATORS = {
    op.name: op
    for op in (
        Operator(
            "gpuclass",
            "cozy-gpuclass",
            "gpuclass-operator",
            ("gpu.cozystack.io_gpuclasses.yaml",),
            {"cpu": "100m", "memory": "256Mi"},
            {"cpu": "1", "memory": "1Gi"},
            "GPUCLASS",
            "cozystack-gpuclass-operator",
        ),
        Operator(
            "endpointattachment",
            "cozy-endpointattachment",
            "endpointattachment-operator",
            ("local.sdn.cozystack.io_endpointattachments.yaml",),
            {"cpu": "50m", "memory": "128Mi"},
            {"cpu": "500m", "memory": "512Mi"},
            "EA",
            "cozystack-endpointattachment-operator",
        ),
    )
}
OPERATOR_NAMES = sorted(OPERATORS)


def require(paths: Iterable[str]) -> None:
    missing = [p for p in paths if not (ROOT / p).exists()]
    if missing:
        pytest.skip(f"input files not written yet: {', '.join(missing)}")


async def render(cluster: ClusterInfo, path: str) -> list[Obj]:
    code, out, err = await kubectl(cluster, "kustomize", path)
    assert code == 0, f"kubectl kustomize {path} failed:\n{err}"
    return [doc for doc in yaml.safe_load_all(out) if doc]


def one(docs: Iterable[Obj], kind: str, name: str | None = None) -> Obj:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def crd_names(op: Operator) -> set[str]:
    return {doc["metadata"]["name"] for f in op.crd_files for doc in load(f"{op.crd_dir}/{f}")}


def crd_files() -> list[str]:
    """Every operator's CRD file, from the kustomization of each config/crd/<operator>."""
    return [
        f"{op.crd_dir}/{f}"
        for op in OPERATORS.values()
        for f in load(f"{op.crd_dir}/kustomization.yaml")[0]["resources"]
    ]


def assert_restricted(pod_spec: Mapping[str, Any]) -> None:
    """Pod Security "restricted", plus the read-only root filesystem and fixed user of our image."""
    pod = pod_spec.get("securityContext") or {}
    assert pod.get("runAsNonRoot") is True
    assert pod.get("runAsUser") == RESTRICTED_USER
    assert (pod.get("seccompProfile") or {}).get("type") == "RuntimeDefault"
    assert pod_spec["containers"], "no containers"
    for container in pod_spec["containers"]:
        context = container.get("securityContext") or {}
        assert context.get("runAsNonRoot") is True, container["name"]
        assert context.get("runAsUser") == RESTRICTED_USER, container["name"]
        assert context.get("readOnlyRootFilesystem") is True, container["name"]
        assert context.get("allowPrivilegeEscalation") is False, container["name"]
        assert (context.get("capabilities") or {}).get("drop") == ["ALL"], container["name"]
        assert not (context.get("capabilities") or {}).get("add"), container["name"]
        assert (context.get("seccompProfile") or {}).get("type") == "RuntimeDefault", container["name"]


# --- rendering -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    ["config/default/gpuclass", "config/default/endpointattachment", "config/samples", "config/monitoring"],
)
async def test_kustomization_renders(cluster: ClusterInfo, path: str) -> None:
    for op in OPERATORS.values():
        if path == op.default_dir:
            require(op.inputs)
    docs = await render(cluster, path)
    assert docs, f"{path} renders nothing"
    for doc in docs:
        assert doc.get("apiVersion"), doc
        assert doc.get("kind"), doc
        assert doc["metadata"].get("name"), doc


@pytest.mark.parametrize("name", OPERATOR_NAMES)
async def test_default_installs_exactly_its_crds_and_no_monitoring(cluster: ClusterInfo, name: str) -> None:
    op = OPERATORS[name]
    require(op.inputs)
    docs = await render(cluster, op.default_dir)
    rendered = {d["metadata"]["name"] for d in docs if d["kind"] == "CustomResourceDefinition"}
    assert rendered == crd_names(op), (
        f"{op.default_dir} must install {op.crd_dir} (whose kustomization lists exactly the "
        "operator's CRD files) and no other operator's CRDs"
    )
    crd = load(f"{op.crd_dir}/kustomization.yaml")[0]
    assert sorted(crd["resources"]) == sorted(op.crd_files)
    default = load(f"{op.default_dir}/kustomization.yaml")[0]
    assert f"../../crd/{op.name}" in default["resources"]
    assert not default.get("patches"), "no CRD is installed only to be deleted again by a patch"
    assert not [d for d in docs if d["apiVersion"].startswith("monitoring.coreos.com/")]
    namespace = one(docs, "Namespace", op.namespace)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


@pytest.mark.parametrize("name", OPERATOR_NAMES)
async def test_default_wires_deployment_service_and_rbac(cluster: ClusterInfo, name: str) -> None:
    op = OPERATORS[name]
    require(op.inputs)
    docs = await render(cluster, op.default_dir)
    deployment = one(docs, "Deployment", op.deployment)
    assert deployment["metadata"]["namespace"] == op.namespace
    spec = deployment["spec"]
    assert spec["replicas"] == REPLICAS
    assert spec["strategy"] == ROLLING_UPDATE
    template = spec["template"]
    labels = template["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    pod = template["spec"]
    assert_restricted(pod)

    # Its ServiceAccount is the one the default creates and the operator's ClusterRoleBinding names.
    assert pod["serviceAccountName"] == op.service_account
    account = one(docs, "ServiceAccount", op.service_account)
    assert account["metadata"]["namespace"] == op.namespace
    bound = [
        b
        for b in docs
        if b["kind"] in ("ClusterRoleBinding", "RoleBinding")
        and {"kind": "ServiceAccount", "name": op.service_account, "namespace": op.namespace}
        in b.get("subjects", [])
    ]
    assert bound, "no binding grants the operator's ServiceAccount anything"
    roles = {d["metadata"]["name"] for d in docs if d["kind"] in ("ClusterRole", "Role")}
    assert {b["roleRef"]["name"] for b in bound} <= roles

    [container] = pod["containers"]
    assert container["image"] == IMAGE
    assert container["args"] == [f"operators.{op.name}"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8080, "health": 8081}
    probe = container["livenessProbe"]["httpGet"]
    assert (probe["path"], probe["port"]) == ("/healthz", "health")
    assert container["resources"] == {"requests": dict(op.requests), "limits": dict(op.limits)}
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env["OTEL_SERVICE_NAME"]["value"] == f"cozystack-{op.name}-operator"
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"] == ""
    assert (
        env["OTEL_RESOURCE_ATTRIBUTES"]["value"]
        == "k8s.pod.name=$(POD_NAME),k8s.namespace.name=$(POD_NAMESPACE)"
    )
    names = [e["name"] for e in container["env"]]
    assert names.index("POD_NAME") < names.index("OTEL_RESOURCE_ATTRIBUTES"), "$(POD_NAME) needs it first"
    assert names.index("POD_NAMESPACE") < names.index("OTEL_RESOURCE_ATTRIBUTES")
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert "emptyDir" in volume

    # The metrics Service selects the Pod and targets the named port; the ServiceMonitor selects it.
    service = one(docs, "Service", f"{op.name}-operator-metrics")
    assert service["metadata"]["namespace"] == op.namespace
    assert service["spec"]["selector"].items() <= labels.items()
    assert [(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [
        ("metrics", 8080, "metrics")
    ]
    monitoring = await render(cluster, "config/monitoring")
    monitor = one(monitoring, "ServiceMonitor", f"{op.name}-operator")
    assert monitor["metadata"]["namespace"] == op.namespace
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]


def lease_roles(docs: Iterable[Obj], op: Operator) -> list[Obj]:
    """The Roles that RoleBindings of the operator's namespace grant its ServiceAccount."""
    subject = {"kind": "ServiceAccount", "name": op.service_account, "namespace": op.namespace}
    granted = {
        b["roleRef"]["name"]
        for b in docs
        if b["kind"] == "RoleBinding"
        and b["metadata"].get("namespace") == op.namespace
        and b["roleRef"]["kind"] == "Role"
        and subject in b.get("subjects", [])
    }
    return [
        d
        for d in docs
        if d["kind"] == "Role"
        and d["metadata"]["name"] in granted
        and d["metadata"].get("namespace") == op.namespace
    ]


@pytest.mark.parametrize("name", OPERATOR_NAMES)
async def test_default_runs_two_replicas_that_elect_a_leader(
    cluster: ClusterInfo, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two replicas spread over nodes, rolled one at a time, one kept through disruptions, electing a
    leader through the Lease their settings name, with a Role on exactly that Lease's verbs."""
    op = OPERATORS[name]
    require(op.inputs)
    docs = await render(cluster, op.default_dir)
    deployment = one(docs, "Deployment", op.deployment)
    spec = deployment["spec"]
    assert spec["replicas"] == REPLICAS
    # A rolling update starts the new Pod before stopping an old one: a standby is always there.
    assert spec["strategy"] == ROLLING_UPDATE
    labels = spec["template"]["metadata"]["labels"]
    pod = spec["template"]["spec"]

    # Preferred (a one-node cluster still runs both), by hostname, between the operator's own Pods.
    [term] = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == HOSTNAME_TOPOLOGY
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= labels.items()
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in pod["affinity"]["podAntiAffinity"]

    budget = one(docs, "PodDisruptionBudget", op.deployment)
    assert budget["metadata"]["namespace"] == op.namespace
    assert budget["spec"]["minAvailable"] == MIN_AVAILABLE
    assert "maxUnavailable" not in budget["spec"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert budget["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]

    # Ready means caches synced, so a rolling update removes an old replica only after a warm new one.
    [container] = pod["containers"]
    readiness = container["readinessProbe"]["httpGet"]
    assert (readiness["path"], readiness["port"]) == ("/readyz", "health")

    # The environment as the kubelet would give it, read by the operator's own settings parser: the
    # names are the ones it reads, and the Lease is the one the Role is for.
    env = {e["name"]: e for e in container["env"]}
    for field in ("LEADER_ELECT", "LEADER_ELECTION_NAMESPACE", "LEADER_ELECTION_ID"):
        assert f"{op.env_prefix}_{field}" in env, f"{op.env_prefix}_{field} is not set"
    assert env[f"{op.env_prefix}_LEADER_ELECTION_NAMESPACE"]["valueFrom"]["fieldRef"] == {
        "fieldPath": "metadata.namespace"
    }
    downward = {"metadata.name": f"{op.deployment}-{EXAMPLE_POD_SUFFIX}", "metadata.namespace": op.namespace}
    for variable in container["env"]:
        if "value" in variable:
            monkeypatch.setenv(variable["name"], variable["value"])
        else:
            monkeypatch.setenv(variable["name"], downward[variable["valueFrom"]["fieldRef"]["fieldPath"]])
    settings = importlib.import_module(f"operators.{op.name}.settings")
    assert op.env_prefix == settings.ENV_PREFIX
    runtime = settings.parse(container["args"][1:]).runtime
    assert runtime.leader_elect is True
    assert runtime.leader_election_namespace == op.namespace
    assert runtime.leader_election_id == op.leader_election_id == settings.LEADER_ELECTION_ID

    # Exactly one namespaced Role on the Lease, exactly get, create and update on it, nothing else.
    [role] = lease_roles(docs, op)
    [rule] = role["rules"]
    assert (rule["apiGroups"], rule["resources"]) == ([LEASE_GROUP], [LEASE_RESOURCE])
    assert sorted(rule["verbs"]) == sorted(LEASE_VERBS)
    assert not NOT_LEASE_VERBS & set(rule["verbs"])
    assert not [
        d
        for d in docs
        if d["kind"] == "ClusterRole"
        and any(LEASE_RESOURCE in (rule.get("resources") or []) for rule in d.get("rules") or [])
    ], "Leases are granted in the operator's namespace only, never cluster-wide"


def test_each_crd_file_belongs_to_one_operator() -> None:
    """config/crd holds one directory per operator, and each of its CRD files is listed there."""
    on_disk = {
        str(p.relative_to(ROOT))
        for p in (ROOT / "config" / "crd").rglob("*.yaml")
        if p.name != "kustomization.yaml"
    }
    listed = crd_files()
    assert len(listed) == len(set(listed))
    assert on_disk == set(listed), "a CRD file outside every operator's config/crd/<operator> kustomization"


def test_owned_yaml_files_start_with_a_comment() -> None:
    files = sorted(p for d in OWNED_DIRS for p in (ROOT / d).rglob("*.yaml"))
    assert files
    uncommented = [str(p.relative_to(ROOT)) for p in files if not p.read_text().startswith("#")]
    assert not uncommented, f"YAML files without a leading comment saying what they are for: {uncommented}"


# --- monitoring names what the operators export --------------------------------------------------

METRIC = re.compile(
    r"\b((?:cozystack_gpuclass|gpuclass|cozystack_endpointattachment|endpointattachment"
    r"|controller_runtime|workqueue)_\w+)"
)
SELECTOR = re.compile(r"\b([A-Za-z_:][\w:]*)\s*\{([^}]*)\}")
MATCHER = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")
LABEL_VALUES = re.compile(r"label_values\(\s*(\w+)\s*,\s*(\w+)\s*\)")
# Labels Prometheus adds to every scraped sample.
TARGET_LABELS = frozenset({"job", "instance", "namespace", "pod", "service", "endpoint", "container"})


def exported_metrics() -> dict[str, frozenset[str]]:
    """Every sample name both operators serve, with its label names: their registries built as their
    ``__main__`` builds them (imported here, so an operator being rewritten fails this test only)."""
    from opentelemetry.trace import NoOpTracerProvider
    from prometheus_client import CollectorRegistry

    from operators.endpointattachment.controller import build
    from operators.endpointattachment.settings import Settings
    from operators.gpuclass.controller import build as build_gpuclass
    from operators.gpuclass.settings import Settings as GPUClassSettings
    from shared.kube import Kube
    from shared.runtime.manager import Manager
    from shared.telemetry.tracing import Tracing

    gpuclass, endpointattachment = CollectorRegistry(), CollectorRegistry()
    gpuclass_manager = Manager(cast(Kube, None), gpuclass, Tracing(NoOpTracerProvider(), "test"))
    build_gpuclass(gpuclass_manager, gpuclass, GPUClassSettings())
    # Declared, never run: no request is made, so no client is needed.
    manager = Manager(cast(Kube, None), endpointattachment, Tracing(NoOpTracerProvider(), "test"))
    build(manager, endpointattachment, Settings())
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    exported: dict[str, frozenset[str]] = {}
    for registry in (gpuclass, endpointattachment):
        for family in registry.collect():
            # A custom collector's family carries its label names; a client-library metric's
            # collector knows them (neither is public API: a change there fails here, loudly).
            collector = registry._names_to_collectors.get(family.name)
            labels: tuple[str, ...] = tuple(
                getattr(family, "_labelnames", ()) or getattr(collector, "_labelnames", ())
            )
            for suffix in suffixes.get(family.type, ("",)):
                extra = {"le"} if suffix == "_bucket" else set()
                exported[family.name + suffix] = frozenset(labels) | extra
    return exported


def monitoring_expressions() -> list[tuple[str, str]]:
    """(where, PromQL) of every alert and every dashboard query and variable."""
    found: list[tuple[str, str]] = []
    for rule_file in sorted((ROOT / "config/monitoring").glob("*/prometheusrule.yaml")):
        rule = yaml.safe_load(rule_file.read_text())
        for group in rule["spec"]["groups"]:
            for item in group["rules"]:
                found.append((f"alert {item['alert']}", item["expr"]))
    for path in sorted((ROOT / "config/monitoring/dashboards").glob("*.json")):
        dashboard = json.loads(path.read_text())
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                found.append((f"{path.name} panel {panel['title']!r}", target["expr"]))
        for variable in dashboard["templating"]["list"]:
            query = variable.get("query")
            if isinstance(query, dict):
                found.append((f"{path.name} variable {variable['name']}", query["query"]))
    return found


def test_alerts_and_dashboards_use_exported_metrics_and_labels() -> None:
    exported = exported_metrics()
    problems = []
    for where, expr in monitoring_expressions():
        metrics = set(METRIC.findall(expr))
        for metric in sorted(metrics - exported.keys()):
            problems.append(f"{where}: {metric} is not exported")
        known = {metric for metric in metrics if metric in exported}
        for metric, matchers in SELECTOR.findall(expr):
            if metric in known:
                for label in set(MATCHER.findall(matchers)) - exported[metric] - TARGET_LABELS:
                    problems.append(f"{where}: {metric} has no label {label!r}")
        for metric, label in LABEL_VALUES.findall(expr):
            if metric in known and label not in exported[metric]:
                problems.append(f"{where}: {metric} has no label {label!r}")
        available = set(TARGET_LABELS).union(*(exported[m] for m in known))
        for clause in GROUPING.findall(expr):
            for label in {x.strip() for x in clause.split(",") if x.strip()} - available:
                problems.append(f"{where}: no metric of the expression has label {label!r}")
    assert not problems, "\n".join(problems)


# --- against the API server ----------------------------------------------------------------------


@pytest.mark.parametrize("name", OPERATOR_NAMES)
async def test_apply_default(cluster: ClusterInfo, kube: Kube, name: str) -> None:
    op = OPERATORS[name]
    require(op.inputs)
    path = DEPLOYMENTS.path(op.namespace, op.deployment)
    budget_path = PDBS.path(op.namespace, op.deployment)
    try:

        async def applied() -> tuple[int, str, str] | None:
            answer = await kubectl(cluster, "apply", "-k", op.default_dir)
            # An admission policy whose paramKind's CRD was just (re)installed refuses every write it
            # matches until the API server has synced that kind: wait it out, bounded.
            return None if PARAM_KIND_NOT_SYNCED in answer[2] else answer

        code, out, err = await eventually(applied, what=f"kubectl apply -k {op.default_dir}")
        assert code == 0, f"kubectl apply -k {op.default_dir} failed:\n{out}\n{err}"
        # The namespace enforces Pod Security "restricted": the API server warns about a Deployment
        # whose Pods it would refuse.
        assert "PodSecurity" not in err, err
        deployment = await kube.get(path)
        assert deployment is not None, f"no Deployment {op.namespace}/{op.deployment} after apply"
        assert deployment["spec"]["replicas"] == REPLICAS
        assert deployment["spec"]["strategy"] == ROLLING_UPDATE
        assert_restricted(deployment["spec"]["template"]["spec"])
        budget = await kube.get(budget_path)
        assert budget is not None, f"no PodDisruptionBudget {op.namespace}/{op.deployment} after apply"
        assert budget["spec"]["minAvailable"] == MIN_AVAILABLE
        selector = budget["spec"]["selector"]["matchLabels"]
        assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
        namespace = await kube.get(NAMESPACES.path(name=op.namespace))
        assert namespace is not None
        assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
        for crd in crd_names(op):
            assert await kube.get(CRDS.path(name=crd)) is not None, f"CRD {crd} not installed"
        await assert_lease_access(kube, op)
    finally:
        await kube.delete(path)
        await kube.delete(budget_path)
        # The admission policies the default installs would refuse later tests' own stand-ins for
        # the operator (tests/integration/test_admission_policy.py tests them): removed again.
        admission = f"config/admission/{op.name}"
        for doc in await render(cluster, admission) if (ROOT / admission).exists() else []:
            plural = {"ValidatingAdmissionPolicy": "validatingadmissionpolicies"}.get(
                doc["kind"], doc["kind"].lower() + "s"
            )
            await kube.delete(f"/apis/{doc['apiVersion']}/{plural}/{doc['metadata']['name']}")


async def lease_access(kube: Kube, op: Operator, verb: str, namespace: str) -> bool:
    """The RBAC authorizer's answer: may the operator's ServiceAccount ``verb`` its Lease there?"""
    attributes = {"verb": verb, "group": LEASE_GROUP, "resource": LEASE_RESOURCE, "namespace": namespace}
    if verb not in UNNAMED_VERBS:
        attributes["name"] = op.leader_election_id
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:{op.namespace}:{op.service_account}",
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{op.namespace}",
                "system:authenticated",
            ],
            "resourceAttributes": attributes,
        },
    }
    answer = await kube.create(SUBJECT_ACCESS_REVIEWS.path(), review)
    return bool((answer.get("status") or {}).get("allowed"))


async def assert_lease_access(kube: Kube, op: Operator) -> None:
    """As applied, the operator may get, create and update Leases in its namespace, and nothing else
    on Leases, there or in any other namespace."""
    expected = {
        **{(verb, op.namespace): True for verb in LEASE_VERBS},
        **{(verb, op.namespace): False for verb in NOT_LEASE_VERBS},
        **{(verb, "default"): False for verb in LEASE_VERBS | NOT_LEASE_VERBS},
    }

    answers: dict[tuple[str, str], bool] = {}

    async def as_expected() -> bool:
        answers.update({key: await lease_access(kube, op, *key) for key in expected})
        return answers == expected

    try:
        await eventually(as_expected, timeout=RBAC_PROPAGATION_SECONDS, what=f"{op.name}'s Lease RBAC")
    except AssertionError:
        wrong = {key: allowed for key, allowed in answers.items() if allowed != expected[key]}
        raise AssertionError(f"(verb, namespace): allowed, where the authorizer disagrees: {wrong}") from None


@pytest.fixture(scope="module")
async def served_crds(kube: Kube) -> AsyncIterator[list[Obj]]:
    """Every CRD of config/crd/<operator> and of the fixtures, served; fixture CRDs this module added
    are removed."""
    operator_crds = [
        doc for path in crd_files() for doc in load(path) if doc.get("kind") == "CustomResourceDefinition"
    ]
    fixture_crds = [doc for path in FIXTURE_CRDS for doc in load(path)]
    added = [
        doc["metadata"]["name"]
        for doc in fixture_crds
        if await kube.get(CRDS.path(name=doc["metadata"]["name"])) is None
    ]
    crds = [*operator_crds, *fixture_crds]
    await apply_all(kube, crds)
    yield crds
    for name in added:  # leave the cluster as the other tests expect it (e.g. KubeVirt absent)
        await remove_crd(kube, name)


async def remove_crd(kube: Kube, name: str) -> None:
    """Delete a CRD and poll until it is gone: no watch stream is left for the event loop to close
    after the last test of a session (a module fixture's teardown may be the last thing it runs)."""
    await kube.delete(CRDS.path(name=name))

    async def gone() -> bool:
        return await kube.get(CRDS.path(name=name)) is None

    await eventually(gone, timeout=60, what=f"CRD {name} deleted")


Discovery = dict[str, dict[str, set[str]]]  # API group -> resource (or resource/subresource) -> verbs


async def discover(kube: Kube) -> Discovery:
    """What the API server serves, from its discovery documents, over every served version."""
    served: Discovery = {}

    def add(group: str, listing: Obj | None) -> None:
        resources = served.setdefault(group, {})
        for resource in (listing or {}).get("resources", []):
            resources.setdefault(resource["name"], set()).update(resource.get("verbs") or [])

    for version in (await kube.request("GET", "/api"))["versions"]:
        add("", await kube.get(f"/api/{version}"))
    for group in (await kube.request("GET", "/apis"))["groups"]:
        for version in group["versions"]:
            add(group["name"], await kube.get(f"/apis/{version['groupVersion']}"))
    return served


def rbac_roles() -> list[tuple[str, Obj]]:
    return [
        (str(path.relative_to(ROOT)), doc)
        for path in sorted((ROOT / "config" / "rbac").rglob("*.yaml"))
        for doc in load(path)
        if doc.get("kind") in ("ClusterRole", "Role")
    ]


def rule_problems(where: str, rule: Mapping[str, Any], served: Discovery) -> list[str]:
    problems = []
    for field in ("verbs", "resources", "apiGroups", "resourceNames", "nonResourceURLs"):
        if any("*" in str(value) for value in rule.get(field) or []):
            problems.append(f"{where}: wildcard in {field}: {rule[field]}")
    if rule.get("nonResourceURLs"):
        return problems
    groups, resources, verbs = (
        rule.get("apiGroups") or [],
        rule.get("resources") or [],
        rule.get("verbs") or [],
    )
    if not (groups and resources and verbs):
        problems.append(f"{where}: a resource rule needs apiGroups, resources and verbs: {dict(rule)}")
    for group in groups:
        if group not in served:
            problems.append(f"{where}: API group {group!r} is not served")
            continue
        for resource in resources:
            parent, _, subresource = resource.partition("/")
            if parent in served[group] and set(verbs) <= AUTHORIZATION_SUBRESOURCES.get(subresource, set()):
                continue
            if resource not in served[group]:
                problems.append(f"{where}: {resource!r} is not a resource of API group {group!r}")
                continue
            for verb in verbs:
                if verb not in served[group][resource] and verb not in SPECIAL_VERBS:
                    problems.append(
                        f"{where}: {resource!r} of {group!r} does not serve verb {verb!r} "
                        f"(it serves {sorted(served[group][resource])})"
                    )
    return problems


async def test_rbac_rules_name_served_resources_without_wildcards(kube: Kube, served_crds: list[Obj]) -> None:
    roles = rbac_roles()
    if not roles:
        pytest.skip("no ClusterRole or Role under config/rbac yet")
    # A CRD is Established before discovery is guaranteed to list it: wait until every group and
    # plural of the CRDs applied here is listed, then judge the rules on one discovery snapshot.
    expected = {(crd["spec"]["group"], crd["spec"]["names"]["plural"]) for crd in served_crds}

    async def complete() -> Discovery | None:
        served = await discover(kube)
        return served if all(plural in served.get(group, {}) for group, plural in expected) else None

    served = await eventually(complete, what="discovery of the applied CRDs")
    problems = [
        problem
        for path, role in roles
        for index, rule in enumerate(role.get("rules") or [])
        for problem in rule_problems(
            f"{path} {role['kind']} {role['metadata']['name']} rule {index}", rule, served
        )
    ]
    assert not problems, "\n".join(problems)


async def test_samples_pass_crd_validation(
    cluster: ClusterInfo, served_crds: list[Obj], namespace: str
) -> None:
    """A server-side dry run: the samples satisfy the CRDs' schemas and CEL rules, and nothing stays."""
    require(f"{op.crd_dir}/{f}" for op in OPERATORS.values() for f in op.crd_files)
    code, out, err = await kubectl(
        cluster,
        "apply",
        "--dry-run=server",
        "-n",
        namespace,
        "-k",
        "config/samples",
    )
    assert code == 0, f"the samples fail validation:\n{out}\n{err}"
    kinds = {line.split("/", 1)[0] for line in out.splitlines() if line}
    # The IPAddressClaim sample is the substrate's kind (its CRD served here); the class is a hoster's.
    for kind in ("gpuclass", "ipaddressclaim", "endpointattachment"):
        assert any(k.startswith(f"{kind}.") for k in kinds), f"no {kind} sample applied: {out}"
