"""Both operators' traces in a real Jaeger (v2, in-memory storage, ``hack/jaeger.py``), read back
through Jaeger's query API, as a hoster would read them.

The operators run as subprocesses under their own ServiceAccounts and ClusterRoles and export over
OTLP/HTTP to Jaeger, keeping half of the passes that change nothing (so some passes are never
exported, and no link may point at one of them). The load balancer is MetalLB
(``harness.loadbalancer``). The test drives a claim, an attachment bound to it, an attachment
minted from a class (addresses from the address substrate's model, ``harness.substrate``),
and GPU classes through a few passes each, then asserts on what Jaeger holds:

* one trace per pass: every trace has exactly one root, and it is a ``reconcile <Kind>`` span;
* no orphan: every span's parent is in its own trace;
* consecutive passes over one object are linked (``previous_pass``), each to the one before it;
* no link points at a span Jaeger never received;
* the waterfall drawn from Jaeger tells the attachment's story, up to ``Provisioned``.

The claims are the substrate's (no controller of ours passes over them), so no pass links to a
claim's pass any more.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

import pytest

from hack.devcluster import ClusterInfo
from hack.jaeger import Jaeger, running_jaeger
from hack.waterfall import LINK_PREVIOUS, Span, passes_of, render_waterfall
from harness.ea_cluster import (
    ATTACHMENTS,
    CONDITION_PROVISIONED,
    Tenant,
    World,
    attached,
    ea_operator,
    ea_world,
)
from harness.identity import serviceaccount_kubeconfig
from harness.manifests import apply_all, load
from harness.operators import RunningOperator, operator_process
from harness.waiting import eventually, wait_for_object
from operators.gpuclass.api import GPUCLASSES
from shared.kube import Kube, Obj
from shared.resources import NODES, PODS, SERVICE_ACCOUNTS

EA_SERVICE: Final = "cozystack-endpointattachment-operator"
GPU_SERVICE: Final = "cozystack-gpuclass-operator"
GPU_OPERATOR_NAMESPACE: Final = "cozy-gpuclass"
GPU_OPERATOR_SERVICE_ACCOUNT: Final = "gpuclass-operator"
GPU_RBAC_DIR: Final = "config/rbac/gpuclass"
NAMESPACED_RBAC_KINDS: Final = frozenset({"ServiceAccount", "Role", "RoleBinding"})
KUBEVIRT_NAMESPACE: Final = "cozy-kubevirt"
H200: Final = "nvidia.com/GH100_H200_SXM_141GB"
GPU_NODE: Final = "trace-it-gpu-node"
GPU_CLASSES: Final = ("trace-it-h200", "trace-it-h200-second")
ADDRESS_CLASS: Final = "it-jaeger"
# Half of the passes that change nothing are exported: the rest must never be a link's target.
TRACING_ENV: Final = {"OTEL_BSP_SCHEDULE_DELAY": "100", "COZY_TRACE_UNCHANGED_RATIO": "0.5"}
PASS_PREFIX: Final = "reconcile "


@pytest.fixture(scope="module")
def jaeger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jaeger]:
    with running_jaeger(tmp_path_factory.mktemp("jaeger")) as running:
        yield running


@pytest.fixture(scope="module")
async def world(kube: Kube) -> AsyncIterator[World]:
    """The CRDs, MetalLB and the address substrate's model, for the module."""
    async with ea_world(kube) as running:
        yield running


@contextlib.asynccontextmanager
async def gpu_operator(
    kube: Kube, cluster: ClusterInfo, tmp_path: Path, env: Mapping[str, str]
) -> AsyncIterator[RunningOperator]:
    """The GPUClass operator under its own ServiceAccount and config/rbac/gpuclass, with its CRD
    and KubeVirt's (and a CR that permits H200)."""
    listed = load(f"{GPU_RBAC_DIR}/kustomization.yaml")[0]["resources"]
    rbac = [doc for name in listed for doc in load(f"{GPU_RBAC_DIR}/{name}")]
    for doc in rbac:
        if doc["kind"] in NAMESPACED_RBAC_KINDS:
            doc["metadata"].setdefault("namespace", GPU_OPERATOR_NAMESPACE)
    namespaces = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        for name in (GPU_OPERATOR_NAMESPACE, KUBEVIRT_NAMESPACE)
    ]
    await apply_all(
        kube,
        [
            *load("config/crd/gpuclass/gpu.cozystack.io_gpuclasses.yaml"),
            *load("tests/fixtures/kubevirt-crd.yaml"),
            *namespaces,
            *rbac,
        ],
    )
    await apply_all(kube, load("tests/fixtures/kubevirt-cr-passthrough.yaml"))
    kubeconfig = await serviceaccount_kubeconfig(
        kube,
        cluster.kubeconfig,
        GPU_OPERATOR_NAMESPACE,
        GPU_OPERATOR_SERVICE_ACCOUNT,
        tmp_path / "gpu-operator.kubeconfig",
    )
    args = [
        "--debounce-seconds=0.2",
        f"--kubevirt-namespace={KUBEVIRT_NAMESPACE}",
        f"--leader-election-namespace={GPU_OPERATOR_NAMESPACE}",
    ]
    async with operator_process(
        "operators.gpuclass", kubeconfig, args, tmp_path / "gpu-operator.log", env
    ) as running:
        yield running
        assert running.process.returncode is None, f"operator died:\n{running.log_tail()}"
        assert "Traceback" not in running.log_path.read_text(), running.log_tail(200)


async def gpu_world(kube: Kube) -> None:
    """A GPU node (Ready, 8 units, tolerated taint) and two classes on its resource name."""
    await kube.create(NODES.path(), {"apiVersion": "v1", "kind": "Node", "metadata": {"name": GPU_NODE}})
    allocatable = {"cpu": "64", "memory": "512Gi", "pods": "110", H200: "8"}
    status = {
        "conditions": [{"type": "Ready", "status": "True"}],
        "capacity": allocatable,
        "allocatable": allocatable,
    }
    await kube.patch(NODES.path(name=GPU_NODE) + "/status", {"status": status}, kind="merge")
    # The node lifecycle controller's part: lift the not-ready taint admission put on the new Node.
    await kube.patch(NODES.path(name=GPU_NODE), {"spec": {"taints": None}}, kind="merge")
    for name in GPU_CLASSES:  # the second one conflicts with the first (same resource name)
        body = {"apiVersion": GPUCLASSES.api_version, "kind": "GPUClass", "metadata": {"name": name}}
        await kube.create(GPUCLASSES.path(), {**body, "spec": {"resourceName": H200}})


async def gpu_pod(kube: Kube, namespace: str, name: str, units: int) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"vm": name}},
        "spec": {
            "nodeName": GPU_NODE,
            "containers": [
                {
                    "name": "compute",
                    "image": "example.invalid/vm:1",
                    "resources": {"limits": {H200: str(units)}},
                }
            ],
        },
    }
    await kube.create(PODS.path(namespace), pod)
    await kube.patch(PODS.path(namespace, name) + "/status", {"status": {"phase": "Running"}}, kind="merge")


async def tenant_app(tenant: Tenant, app: str) -> None:
    """A Cozystack application (HelmRelease and its tenant-facing Service ``<app>-rw``, lineage
    labels) and its pod, Ready with an IP, as the kubelet would leave it."""
    await tenant.app(app)
    await tenant.endpoint(f"{app}-rw", app, selector={"app": app})
    await tenant.pod(f"{app}-0", {"app": app})


# --- what Jaeger must hold ---------------------------------------------------------------------------


def by_trace(spans: Sequence[Span]) -> dict[str, list[Span]]:
    traces: dict[str, list[Span]] = {}
    for span in spans:
        traces.setdefault(span.trace_id, []).append(span)
    return traces


def one_pass_per_trace(spans: Sequence[Span]) -> list[str]:
    """Problems: a trace whose roots are not exactly one pass span, or a pass span that is not a root."""
    problems = [
        f"{s.name} in trace {s.trace_id} has a parent"
        for s in spans
        if s.name.startswith(PASS_PREFIX) and s.parent_span_id
    ]
    for trace_id, members in by_trace(spans).items():
        roots = [s for s in members if not s.parent_span_id]
        if len(roots) != 1 or not roots[0].name.startswith(PASS_PREFIX):
            problems.append(f"trace {trace_id}: roots {[r.name for r in roots]}")
    return problems


def orphans(spans: Sequence[Span]) -> list[str]:
    """Problems: a span whose parent is not in its trace."""
    ids = {(s.trace_id, s.span_id) for s in spans}
    return [
        f"{s.name} in trace {s.trace_id}: parent {s.parent_span_id} missing"
        for s in spans
        if s.parent_span_id and (s.trace_id, s.parent_span_id) not in ids
    ]


def dangling_links(spans: Sequence[Span]) -> list[str]:
    """Problems: a link to a span Jaeger does not hold (a pass that was dropped, or never sent)."""
    ids = {(s.trace_id, s.span_id) for s in spans}
    return [
        f"{s.name} ({s.attributes.get('k8s.object.name')}) -> {link.kind} {link.trace_id}/{link.span_id}"
        for s in spans
        for link in s.links
        if (link.trace_id, link.span_id) not in ids
    ]


def unchained(chain: Sequence[Span]) -> list[str]:
    """Problems: a pass (after the first) not linked to the pass right before it."""
    return [
        f"pass at {later.start_ns} does not follow {earlier.span_id}"
        for earlier, later in itertools.pairwise(chain)
        if not any(
            (link.trace_id, link.span_id, link.kind) == (earlier.trace_id, earlier.span_id, LINK_PREVIOUS)
            for link in later.links
        )
    ]


def reasons(span: Span) -> list[str]:
    value = span.attributes.get("condition.reasons")
    return [str(r) for r in value] if isinstance(value, list) else []


# --- the test --------------------------------------------------------------------------------------


async def test_each_pass_is_one_trace_and_passes_link_in_jaeger(
    kube: Kube, cluster: ClusterInfo, namespace: str, world: World, jaeger: Jaeger, tmp_path: Path
) -> None:
    since = datetime.now(UTC) - timedelta(seconds=5)
    env = {**TRACING_ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_endpoint}
    await wait_for_object(kube, SERVICE_ACCOUNTS, "default", lambda o: o is not None, namespace=namespace)
    tenant = Tenant(kube, namespace, world)
    async with (
        ea_operator(kube, cluster, tmp_path, env) as ea,
        gpu_operator(kube, cluster, tmp_path, env) as gpu,
    ):
        try:
            await drive(tenant, ea, gpu)
            await check_jaeger(kube, namespace, jaeger, since)
        finally:
            await cleanup(kube, tenant)


async def drive(tenant: Tenant, ea: RunningOperator, gpu: RunningOperator) -> None:
    """A claim, an attachment bound to it, one minted from the class; GPU classes and a VM pod."""
    kube, namespace = tenant.kube, tenant.namespace
    await tenant.address_class(ADDRESS_CLASS, "198.51.100.112/29", reclaim="Delete")
    await tenant_app(tenant, "db")
    await tenant.bound_claim("reserved", ADDRESS_CLASS)
    await tenant.attachment("bound", "db-rw", claim_name="reserved")
    await tenant.attachment("minted", "db-rw", class_name=ADDRESS_CLASS)
    for name in ("bound", "minted"):
        try:
            await wait_for_object(kube, ATTACHMENTS, name, attached, namespace=namespace, timeout=60)
        except AssertionError as error:
            raise AssertionError(f"{error}\noperator log:\n{ea.log_tail()}") from None
    await gpu_world(kube)
    # Two VMs one after the other: the class's free units move twice, so two passes change it.
    for vm, units, free in (("vm-a", 2, 6), ("vm-b", 4, 2)):
        await gpu_pod(kube, namespace, vm, units)
        await wait_for_object(
            kube,
            GPUCLASSES,
            GPU_CLASSES[0],
            free_units_are(free),
            timeout=60,
            what=f"freeUnits {free} on {GPU_CLASSES[0]} (gpu operator log:\n{gpu.log_tail()})",
        )


def free_units_are(free: int) -> Callable[[Obj | None], bool]:
    return lambda c: ((c or {}).get("status") or {}).get("freeUnits") == free


async def check_jaeger(kube: Kube, namespace: str, jaeger: Jaeger, since: datetime) -> None:
    bound = await kube.get(ATTACHMENTS.path(namespace, "bound"))
    minted = await kube.get(ATTACHMENTS.path(namespace, "minted"))
    assert bound is not None
    assert minted is not None
    uids = {name: str(obj["metadata"]["uid"]) for name, obj in (("bound", bound), ("minted", minted))}

    async def settled() -> tuple[list[Span], list[Span]] | None:
        """Both services' spans, once the attachments' provisioning passes are in and every link and
        parent resolves (spans come in batches, so a link may briefly point ahead of them)."""
        ea_spans = jaeger.find_spans(EA_SERVICE, since)
        gpu_spans = jaeger.find_spans(GPU_SERVICE, since)
        everything = ea_spans + gpu_spans
        published = all(
            any(CONDITION_PROVISIONED in reasons(p) for p in passes_of(ea_spans, uids[name]))
            for name in ("bound", "minted")
        )
        gpu_passes = [s for s in gpu_spans if s.is_pass]
        if not published or len(gpu_passes) < 2 or dangling_links(everything) or orphans(everything):
            return None
        return ea_spans, gpu_spans

    try:
        ea_spans, gpu_spans = await eventually(settled, timeout=60, interval=0.5, what="every pass in Jaeger")
    except AssertionError:
        ea_spans = jaeger.find_spans(EA_SERVICE, since)
        gpu_spans = jaeger.find_spans(GPU_SERVICE, since)
        everything = ea_spans + gpu_spans
        seen = {name: [reasons(p) for p in passes_of(ea_spans, uid)] for name, uid in uids.items()}
        raise AssertionError(
            f"services {jaeger.services()}; {len(ea_spans)} + {len(gpu_spans)} spans; "
            f"passes' reasons {seen}; "
            f"GPUClass passes {sum(s.is_pass for s in gpu_spans)}\n"
            f"dangling links: {dangling_links(everything)[:10]}\norphans: {orphans(everything)[:10]}"
        ) from None
    everything = ea_spans + gpu_spans
    assert {EA_SERVICE, GPU_SERVICE} <= set(jaeger.services())

    # One trace per pass, no orphan, no link to a span Jaeger never got.
    assert not one_pass_per_trace(everything), one_pass_per_trace(everything)
    assert not orphans(everything)
    assert not dangling_links(everything)

    # Consecutive passes over one object are chained, for each kind of pass.
    for name in ("bound", "minted"):
        chain = passes_of(ea_spans, uids[name])
        # Each attachment was decided at least twice with a change (rendered, then provisioned).
        assert len(chain) >= 2, f"{name}: {len(chain)} passes in Jaeger"
        assert not unchained(chain), (name, unchained(chain))
        assert not [s for s in chain for link in s.links if link.span_id == s.span_id], f"{name}: a self-link"
    gpu_chain = sorted((s for s in gpu_spans if s.is_pass), key=lambda s: s.start_ns)
    assert not unchained(gpu_chain), unchained(gpu_chain)
    assert {"changed"} <= {str(s.attributes.get("outcome")) for s in gpu_chain}

    # The waterfall drawn from Jaeger tells the bound attachment's story, up to Provisioned.
    drawn = render_waterfall(ea_spans, uids["bound"])
    assert "bound" in drawn, drawn
    assert CONDITION_PROVISIONED in drawn, drawn


async def cleanup(kube: Kube, tenant: Tenant) -> None:
    """The GPU classes and node, and the tenant's world (while the operator still runs, so its
    finalizer lets the attachments go)."""
    for name in GPU_CLASSES:
        await kube.delete(GPUCLASSES.path(name=name))
    await kube.delete(NODES.path(name=GPU_NODE))
    await tenant.cleanup()
