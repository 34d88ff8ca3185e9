"""The GPUClass operator on the local control plane, running as a subprocess under its own
ServiceAccount and least-privilege roles (config/rbac/gpuclass: the ClusterRole, and the Role for
its leader-election Lease in its own namespace), against real Nodes, Pods, the real KubeVirt CRD and
CR (tests/fixtures), and the GPUClass CRD from config/crd/gpuclass.

The tests play the kubelet: Nodes get their Ready condition and allocatable through the status
subresource, Pods their phase. What ``kubectl get gpuclasses`` prints is read as kubectl reads it: the
API server's Table rendering of the CRD's printer columns.
"""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack.devcluster import ClusterInfo
from harness.identity import serviceaccount_kubeconfig
from harness.manifests import ROOT, apply_all, delete_crd, load
from harness.operators import RunningOperator, operator_process
from harness.tables import printed_row
from harness.waiting import eventually, wait_for_object
from operators.gpuclass.api import GPUCLASSES
from shared.kube import ApiError, Kube, Obj
from shared.resources import NAMESPACES, NODES, PODS, SERVICE_ACCOUNTS, Resource
from tests.gpuclass_builders import (
    H200,
    gpu_pod,
    make_class,
    make_node,
    reference_classes,
    reference_nodes,
    reference_pods,
)

KUBEVIRT_CRD = "kubevirts.kubevirt.io"
KUBEVIRT_NAMESPACE = "cozy-kubevirt"
OPERATOR_NAMESPACE = "cozy-gpuclass"
NODE_PREFIX = "gpu-it-"  # every node here is named so; the status must never mention one
RECHECK_SECONDS = 2.0
LEASE = "cozystack-gpuclass-operator"  # the leader-election Lease, in OPERATOR_NAMESPACE
RBAC_DIR = "config/rbac/gpuclass"
NAMESPACED_RBAC_KINDS = frozenset({"ServiceAccount", "Role", "RoleBinding"})
# What kubectl asks for: the server renders the printer columns into a meta.k8s.io Table.
# The fit column of the reference table: the default sizes, 0 for every class that cannot serve.
NO_FITS = "1:0 2:0 4:0 8:0"
REFERENCE_FITS = {
    "h200": "1:4 2:2 4:0 8:0",  # n1 and n5, 2 free each
    "h200-premium": NO_FITS,  # conflict
    "l40s": "1:1 2:0 4:0 8:0",
    "a10-24q": NO_FITS,  # not permitted
    "rtx4090": NO_FITS,  # not permitted
}

# The design's reference table: class -> (freeUnits, maxFreeUnitsPerNode, {type: (status, reason)}).
OWNED, IN_USE = ("False", "ResourceNameOwned"), ("True", "ResourceNameInUse")
PERMITTED, NOT_PERMITTED = ("True", "Permitted"), ("False", "NotPermitted")
REFERENCE_TABLE: dict[str, tuple[int, int, dict[str, tuple[str, str]]]] = {
    "h200": (
        4,
        2,
        {"ResourceNameConflict": OWNED, "KubeVirtPermitted": PERMITTED, "Ready": ("True", "Ready")},
    ),
    "h200-premium": (
        0,
        0,
        {
            "ResourceNameConflict": IN_USE,
            "KubeVirtPermitted": PERMITTED,
            "Ready": ("False", "ResourceNameConflict"),
        },
    ),
    "l40s": (
        1,
        1,
        {"ResourceNameConflict": OWNED, "KubeVirtPermitted": PERMITTED, "Ready": ("True", "Ready")},
    ),
    "a10-24q": (
        0,
        0,
        {
            "ResourceNameConflict": OWNED,
            "KubeVirtPermitted": NOT_PERMITTED,
            "Ready": ("False", "NotPermitted"),
        },
    ),
    "rtx4090": (
        0,
        0,
        {
            "ResourceNameConflict": OWNED,
            "KubeVirtPermitted": NOT_PERMITTED,
            "Ready": ("False", "NotPermitted"),
        },
    ),
}


def node_name(name: str) -> str:
    return f"{NODE_PREFIX}{name}"


class GPUWorld:
    """Creates Nodes, Pods and classes as the API would hold them, and removes what it made."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube, self.namespace = kube, namespace
        self.nodes: list[str] = []
        self.classes: list[str] = []

    async def node(self, built: Mapping[str, Any]) -> None:
        name = node_name(built["metadata"]["name"])
        await self.kube.create(
            NODES.path(),
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": built.get("spec", {})},
        )
        self.nodes.append(name)
        status = built["status"]
        # Play the kubelet: Ready condition, capacity and allocatable.
        await self.kube.patch(
            NODES.path(name=name) + "/status",
            {
                "status": {
                    "conditions": status.get("conditions", []),
                    "capacity": status["allocatable"],
                    "allocatable": status["allocatable"],
                }
            },
            kind="merge",
        )
        # Play the node lifecycle controller: admission tainted the new Node not-ready; a real
        # controller lifts that taint once the kubelet reports Ready. Keep only the built taints.
        await self.kube.patch(
            NODES.path(name=name), {"spec": {"taints": built.get("spec", {}).get("taints")}}, kind="merge"
        )

    async def pod(self, built: Mapping[str, Any]) -> None:
        spec = copy.deepcopy(dict(built["spec"]))
        if "nodeName" in spec:
            spec["nodeName"] = node_name(spec["nodeName"])
        phase = built["status"]["phase"]
        if phase in ("Succeeded", "Failed"):
            spec["restartPolicy"] = "Never"  # a terminal phase is only valid for pods that do not restart
        name = built["metadata"]["name"]
        await self.kube.create(
            PODS.path(self.namespace),
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec},
        )
        await self.kube.patch(
            PODS.path(self.namespace, name) + "/status", {"status": {"phase": phase}}, kind="merge"
        )

    async def gpu_class(self, built: Mapping[str, Any]) -> None:
        name = built["metadata"]["name"]
        await self.kube.create(
            GPUCLASSES.path(),
            {
                "apiVersion": built["apiVersion"],
                "kind": "GPUClass",
                "metadata": {"name": name},
                "spec": built["spec"],
            },
        )
        self.classes.append(name)

    async def cleanup(self) -> None:
        for name in self.classes:
            await self.kube.delete(GPUCLASSES.path(name=name))
        for pod in (await self.kube.list(PODS.path(self.namespace)))["items"]:
            await self.kube.delete(PODS.path(self.namespace, pod["metadata"]["name"]), grace_period_seconds=0)
        for name in self.nodes:
            await self.kube.delete(NODES.path(name=name))


@pytest.fixture(scope="module")
async def gpuclass_crd(kube: Kube) -> None:
    await apply_all(kube, load("config/crd/gpuclass/gpu.cozystack.io_gpuclasses.yaml"))


@pytest.fixture
async def world(kube: Kube, namespace: str, gpuclass_crd: None) -> AsyncIterator[GPUWorld]:
    await wait_for_object(kube, SERVICE_ACCOUNTS, "default", lambda o: o is not None, namespace=namespace)
    gpu_world = GPUWorld(kube, namespace)
    yield gpu_world
    await gpu_world.cleanup()


def operator_rbac() -> list[Obj]:
    """Every document config/rbac/gpuclass deploys (its kustomization's resources: the ServiceAccount,
    the ClusterRole and its binding, the leader-election Role and its binding, the reader role), with
    the operator's namespace where kustomize would set it."""
    listed = yaml.safe_load((ROOT / RBAC_DIR / "kustomization.yaml").read_text())["resources"]
    docs = [doc for name in listed for doc in load(f"{RBAC_DIR}/{name}")]
    for doc in docs:
        if doc["kind"] in NAMESPACED_RBAC_KINDS:
            doc["metadata"].setdefault("namespace", OPERATOR_NAMESPACE)
    return docs


@pytest.fixture
async def operator(
    kube: Kube, cluster: ClusterInfo, gpuclass_crd: None, tmp_path: Path
) -> AsyncIterator[RunningOperator]:
    """The operator, authenticated as its own ServiceAccount, authorised by config/rbac/gpuclass only."""
    namespace_doc = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NAMESPACE}}
    await apply_all(kube, [namespace_doc, *operator_rbac()])
    kubeconfig = await serviceaccount_kubeconfig(
        kube, cluster.kubeconfig, OPERATOR_NAMESPACE, "gpuclass-operator", tmp_path / "operator.kubeconfig"
    )
    args = [
        "--debounce-seconds=0.2",
        f"--kubevirt-recheck-seconds={RECHECK_SECONDS}",
        f"--kubevirt-namespace={KUBEVIRT_NAMESPACE}",
        f"--leader-election-namespace={OPERATOR_NAMESPACE}",
    ]
    async with operator_process("operators.gpuclass", kubeconfig, args, tmp_path / "operator.log") as running:
        yield running
        assert running.process.returncode is None, f"operator died:\n{running.log_tail()}"
        assert "Traceback" not in running.log_path.read_text(), running.log_tail(200)


async def install_kubevirt(kube: Kube, cr_file: str = "tests/fixtures/kubevirt-cr-passthrough.yaml") -> None:
    await apply_all(
        kube,
        [
            *load("tests/fixtures/kubevirt-crd.yaml"),
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUBEVIRT_NAMESPACE}},
        ],
    )
    await apply_all(kube, load(cr_file))


async def uninstall_kubevirt(kube: Kube) -> None:
    if await kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{KUBEVIRT_CRD}"):
        await delete_crd(kube, KUBEVIRT_CRD)


def summary(obj: Obj) -> tuple[int, int, dict[str, tuple[str, str]]]:
    status = obj.get("status", {})
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status.get("conditions", [])}
    return status.get("freeUnits", -1), status.get("maxFreeUnitsPerNode", -1), conditions


async def classes_by_name(kube: Kube) -> dict[str, Obj]:
    return {c["metadata"]["name"]: c for c in (await kube.list(GPUCLASSES.path()))["items"]}


async def wait_for_table(
    kube: Kube, expected: Mapping[str, tuple[int, int, dict[str, tuple[str, str]]]], operator: RunningOperator
) -> dict[str, Obj]:
    async def matches() -> dict[str, Obj] | None:
        current = await classes_by_name(kube)
        seen = {name: summary(current[name]) for name in expected if name in current}
        return current if seen == dict(expected) else None

    try:
        return await eventually(matches, timeout=45, what="the expected class table")
    except AssertionError as error:
        current = {n: summary(o) for n, o in (await classes_by_name(kube)).items()}
        raise AssertionError(f"{error}\nnow: {current}\noperator log:\n{operator.log_tail()}") from None


async def wait_for_another_pass(operator: RunningOperator) -> None:
    key = ("cozystack_gpuclass_last_pass_timestamp_seconds", ())
    before = (await operator.scrape()).get(key, 0.0)

    async def advanced() -> bool:
        return (await operator.scrape()).get(key, 0.0) > before

    await eventually(advanced, timeout=RECHECK_SECONDS * 5, what="one more pass")


async def build_reference(world: GPUWorld) -> None:
    for node in reference_nodes():
        await world.node(node)
    for pod in reference_pods():
        await world.pod(pod)
    for gpu_class in reference_classes():  # oldest first: h200 before h200-premium
        await world.gpu_class(gpu_class)


async def test_reference_fixture_gives_the_design_table(
    kube: Kube, world: GPUWorld, operator: RunningOperator
) -> None:
    await install_kubevirt(kube)
    await build_reference(world)
    current = await wait_for_table(kube, REFERENCE_TABLE, operator)

    # The conflict names its owner, and every condition carries the generation it describes.
    premium = current["h200-premium"]["status"]
    conflict = next(c for c in premium["conditions"] if c["type"] == "ResourceNameConflict")
    assert "h200" in conflict["message"]
    for obj in current.values():
        assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
        assert {c["observedGeneration"] for c in obj["status"]["conditions"]} == {
            obj["metadata"]["generation"]
        }

    # The status is world-readable: it never names a node, anywhere.
    for obj in current.values():
        assert NODE_PREFIX not in json.dumps(obj["status"])
    assert {name: obj["status"]["fitsSummary"] for name, obj in current.items()} == REFERENCE_FITS
    assert current["h200"]["spec"]["vmSizes"] == [1, 2, 4, 8]  # the CRD's default, filled in on create

    # A pass with nothing changed writes nothing.
    versions = {name: obj["metadata"]["resourceVersion"] for name, obj in current.items()}
    await wait_for_another_pass(operator)
    await wait_for_another_pass(operator)
    after = await classes_by_name(kube)
    assert {name: obj["metadata"]["resourceVersion"] for name, obj in after.items()} == versions

    # The inventory is in the metrics, counted once per resource (the owner's series only).
    samples = await operator.scrape()
    assert samples[("cozystack_gpuclass_free", (("gpuclass", "h200"), ("resource", H200)))] == 4
    assert samples[("cozystack_gpuclass_allocatable", (("gpuclass", "h200"), ("resource", H200)))] == 32
    assert (
        "cozystack_gpuclass_allocatable",
        (("gpuclass", "h200-premium"), ("resource", H200)),
    ) not in samples
    eligible = (("gpuclass", "h200"), ("resource", H200), ("state", "eligible"))
    assert samples[("cozystack_gpuclass_nodes", eligible)] == 2

    passes = (("controller", "gpuclass"), ("result", "success"))
    assert samples[("controller_runtime_reconcile_total", passes)] >= 1
    assert samples[("leader_election_master_status", (("name", LEASE),))] == 1
    assert await operator.healthz() == 200

    # Informers only: nothing (no annotation, no finalizer) was written to Nodes or Pods.
    for resource, namespace in ((NODES, None), (PODS, world.namespace)):
        for item in (await kube.list(resource.path(namespace)))["items"]:
            assert not item["metadata"].get("annotations"), item["metadata"]
            assert not item["metadata"].get("finalizers"), item["metadata"]

    # Deleting the owner hands the name over in the next pass; premium tolerates nothing: only n5.
    await kube.delete(GPUCLASSES.path(name="h200"))
    handed_over = {
        "h200-premium": (
            2,
            2,
            {"ResourceNameConflict": OWNED, "KubeVirtPermitted": PERMITTED, "Ready": ("True", "Ready")},
        )
    }
    await wait_for_table(kube, handed_over, operator)
    samples = await operator.scrape()
    assert not [key for key in samples if ("gpuclass", "h200") in key[1]], "a deleted class's series remain"


async def printed_columns(kube: Kube, name: str) -> dict[str, Any]:
    """The class's row as ``kubectl get gpuclass NAME`` prints it: column name -> cell."""
    return await printed_row(kube, GPUCLASSES.path(name=name))


async def test_fits_count_vms_per_size_and_kubectl_shows_them(
    kube: Kube, world: GPUWorld, operator: RunningOperator
) -> None:
    """The issue's example: two eligible nodes with 3 and 5 free units, sizes [1, 2, 4] give 8, 3, 1;
    a cordoned node and a full one add nothing."""
    await install_kubevirt(kube)
    await world.node(make_node("fit-a", allocatable={H200: "4"}))
    await world.pod(gpu_pod("fit-a-vm", H200, 1, node="fit-a"))  # 3 free
    await world.node(make_node("fit-b", allocatable={H200: "8"}))
    await world.pod(gpu_pod("fit-b-vm", H200, 3, node="fit-b"))  # 5 free
    await world.node(make_node("fit-cordoned", unschedulable=True, allocatable={H200: "8"}))
    await world.node(make_node("fit-full", allocatable={H200: "2"}))
    await world.pod(gpu_pod("fit-full-vm", H200, 2, node="fit-full"))
    await world.gpu_class(make_class("fits", H200, vm_sizes=[4, 1, 2]))  # any order: listed ascending

    async def fits_are(summary: str) -> Obj | None:
        obj = await kube.get(GPUCLASSES.path(name="fits"))
        return obj if obj is not None and (obj.get("status") or {}).get("fitsSummary") == summary else None

    try:
        current = await eventually(lambda: fits_are("1:8 2:3 4:1"), timeout=45, what="fits 1:8 2:3 4:1")
    except AssertionError as error:
        raise AssertionError(f"{error}\noperator log:\n{operator.log_tail()}") from None
    status = current["status"]
    assert status["fits"] == [{"units": 1, "vms": 8}, {"units": 2, "vms": 3}, {"units": 4, "vms": 1}]
    assert (status["freeUnits"], status["maxFreeUnitsPerNode"]) == (8, 5)
    assert NODE_PREFIX not in json.dumps(status)

    columns = await printed_columns(kube, "fits")
    assert columns["Fits"] == "1:8 2:3 4:1"
    assert (columns["Name"], columns["Free"], columns["Ready"]) == ("fits", 8, "True")

    # Per size for the hoster's dashboards.
    samples = await operator.scrape()
    for units, vms in (("1", 8), ("2", 3), ("4", 1)):
        labels = (("gpuclass", "fits"), ("resource", H200), ("units", units))
        assert samples[("cozystack_gpuclass_fits", labels)] == vms

    # Two more passes with nothing changed write nothing.
    version = current["metadata"]["resourceVersion"]
    await wait_for_another_pass(operator)
    await wait_for_another_pass(operator)
    after = await kube.get(GPUCLASSES.path(name="fits"))
    assert after is not None
    assert after["metadata"]["resourceVersion"] == version

    # New sizes are a new spec: the next pass counts them.
    await kube.patch(GPUCLASSES.path(name="fits"), {"spec": {"vmSizes": [2, 6]}}, "merge")
    await eventually(lambda: fits_are("2:3 6:0"), timeout=30, what="fits 2:3 6:0")
    assert (await printed_columns(kube, "fits"))["Fits"] == "2:3 6:0"


async def test_kubevirt_absent_then_installed(kube: Kube, world: GPUWorld, operator: RunningOperator) -> None:
    await uninstall_kubevirt(kube)
    await world.node(make_node("solo", allocatable={H200: "4"}))
    await world.pod(gpu_pod("one", H200, 1, node="solo"))
    await world.gpu_class(make_class("solo-h200", H200))
    not_installed = ("False", "KubeVirtNotInstalled")
    await wait_for_table(
        kube,
        {
            "solo-h200": (
                3,
                3,
                {"ResourceNameConflict": OWNED, "KubeVirtPermitted": not_installed, "Ready": not_installed},
            )
        },
        operator,
    )
    # Installed later, never watched: the one-minute recheck (here two seconds) picks it up.
    await install_kubevirt(kube)
    await wait_for_table(
        kube,
        {
            "solo-h200": (
                3,
                3,
                {"ResourceNameConflict": OWNED, "KubeVirtPermitted": PERMITTED, "Ready": ("True", "Ready")},
            )
        },
        operator,
    )


async def test_a_tenant_reads_classes_and_nothing_else(
    kube: Kube, cluster: ClusterInfo, namespace: str, gpuclass_crd: None, tmp_path: Path
) -> None:
    await apply_all(kube, load("config/rbac/gpuclass/gpuclass_reader.yaml"))
    await kube.create(
        SERVICE_ACCOUNTS.path(namespace),
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "tenant"}},
    )
    tenant = await Kube.connect(
        await serviceaccount_kubeconfig(kube, cluster.kubeconfig, namespace, "tenant", tmp_path / "tenant")
    )
    assert (await tenant.list(GPUCLASSES.path()))["kind"] == "GPUClassList"
    for forbidden in (
        NODES.path(),
        PODS.path(namespace),
        NAMESPACES.path(),
        Resource("v1", "secrets").path(namespace),
    ):
        with pytest.raises(ApiError) as refused:
            await tenant.list(forbidden)
        assert refused.value.status == 403, forbidden
    with pytest.raises(ApiError) as refused_write:
        await tenant.create(
            GPUCLASSES.path(),
            {
                "apiVersion": "gpu.cozystack.io/v1alpha1",
                "kind": "GPUClass",
                "metadata": {"name": "mine"},
                "spec": {"resourceName": H200},
            },
        )
    assert refused_write.value.status == 403
