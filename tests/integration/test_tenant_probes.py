"""What a hostile tenant tries, on the local control plane: each attempt is refused by the API (RBAC,
a CRD rule, an admission policy, a quota). The table of docs/tenants/boundaries.md lists these tests.

The tenant is a ServiceAccount of its namespace, bound to the project's tenant roles, and (the second
run of most probes) also allowed to write Services there as Kubernetes' edit role allows. The
world is the one of ``test_admission_policy.py``: the admission policies of config/admission (the
optional one included), the address substrate's CRDs, and another tenant (the victim) with an
attachment and the Service rendered for it. What only the EndpointAttachment operator can answer
(another namespace's Service or claim, an internal Service: Resolved or Provisioned False) is in the
bad-input catalogue's operator rows (tests/catalogue/operated.py), not here.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import pytest

from hack.devcluster import ClusterInfo
from harness.identity import serviceaccount_kubeconfig
from harness.manifests import ROOT, apply_all, load
from harness.operators import operator_process
from harness.quota import quota_in_force
from harness.substrate import ADDRESSES, CLAIMS, CLASSES, METALLB_PROVISIONER
from harness.waiting import eventually, wait_for_object
from operators.gpuclass.api import GPUCLASSES
from shared.kube import ApiError, Kube, Obj
from shared.resources import NODES, PODS, SERVICES
from tests.ea_builders import for_create, lineage_labels
from tests.integration.test_admission_policy import (
    ATTACHMENT_LABEL,
    ATTACHMENTS,
    EA_API_VERSION,
    ENDPOINT,
    IDENTITIES,
    OWN_ATTACHMENT,
    OWN_CLAIM,
    POLICY_REFUSAL,
    TENANT_ROLES_ONLY,
    WITH_EDIT,
    World,
    admission_world,
    owner_reference,
    refusal,
    service_body,
)

GPU_OPERATOR_NAMESPACE: Final = "cozy-gpuclass"
GPU_RESOURCE: Final = "nvidia.com/GH100_H200_SXM_141GB"
GPU_NODE: Final = "probe-gpu-node-secret-rack-7"
# The substrate class the probes aim at (the hoster's), and an address it could hold.
SHARED_CLASS: Final = "adm-shared"
SHARED_ADDRESS: Final = "100.64.40.9"
# How long the GPUClass operator and the quota controller may take: a deadline on a loaded machine,
# not the expected time.
PASS_SECONDS: Final = 60.0


@pytest.fixture(scope="module")
async def world(
    kube: Kube, cluster: ClusterInfo, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[World]:
    async with admission_world(kube, cluster, tmp_path_factory.mktemp("probes")) as built:
        await kube.apply(
            CLASSES.path(name=SHARED_CLASS),
            {
                "apiVersion": EA_API_VERSION,
                "kind": "IPAddressClass",
                "metadata": {"name": SHARED_CLASS},
                "spec": {"provisioner": METALLB_PROVISIONER, "parameters": {"addresses": ["100.64.40.0/28"]}},
            },
            "tenant-probe",
        )
        try:
            yield built
        finally:
            await kube.delete(CLASSES.path(name=SHARED_CLASS))


async def victim_state(w: World) -> list[Any]:
    """What no probe may change: the victim's attachment, claim and rendered Service."""
    victim = w.victim_namespace
    found = [
        await w.kube.get(path)
        for path in (
            ATTACHMENTS.path(victim, OWN_ATTACHMENT),
            CLAIMS.path(victim, OWN_CLAIM),
            SERVICES.path(victim, w.victim_rendered),
        )
    ]
    assert all(obj is not None for obj in found), found
    return [obj["metadata"]["resourceVersion"] for obj in found if obj is not None]


def attachment_body(name: str, **load_balancer: Any) -> Obj:
    return {
        "apiVersion": EA_API_VERSION,
        "kind": "EndpointAttachment",
        "metadata": {"name": name},
        "spec": {
            "applicationRef": {"kind": "Postgres", "name": "db"},
            "endpoint": {"serviceName": ENDPOINT},
            "loadBalancer": dict(load_balancer),
        },
    }


# --- name another namespace's Service or claim -----------------------------------------------------


@pytest.mark.parametrize("identity", IDENTITIES)
@pytest.mark.parametrize(
    ("where", "field"),
    [("endpoint", "namespace"), ("loadBalancer", "namespace"), ("applicationRef", "namespace")],
)
async def test_name_something_in_another_namespace(
    world: World, identity: str, where: str, field: str
) -> None:
    """Every reference of an attachment is a name in its own namespace: a namespace field is refused
    under strict field validation (kubectl's default) and pruned otherwise."""
    t = world.tenants[identity]
    body = attachment_body("steal", claimName=OWN_CLAIM)
    body["spec"][where][field] = world.victim_namespace
    strict = await refusal(
        t.client.request(
            "POST", ATTACHMENTS.path(t.namespace), body=body, params={"fieldValidation": "Strict"}
        )
    )
    assert strict is not None
    assert f'unknown field "spec.{where}.{field}"' in str(strict), strict
    created = await t.client.create(ATTACHMENTS.path(t.namespace), body)
    try:
        assert field not in created["spec"][where]
    finally:
        await t.client.delete(ATTACHMENTS.path(t.namespace, "steal"))


@pytest.mark.parametrize("identity", IDENTITIES)
async def test_write_classes_addresses_or_gpu_classes(world: World, identity: str) -> None:
    """Cluster-wide objects are the hoster's or the substrate's: a tenant creates, changes and deletes
    none (the tenant roles give a class to read, nothing to write)."""
    t = world.tenants[identity]
    attempts = [
        t.client.create(
            CLASSES.path(),
            {
                "apiVersion": EA_API_VERSION,
                "kind": "IPAddressClass",
                "metadata": {"name": "mine"},
                "spec": {"provisioner": METALLB_PROVISIONER},
            },
        ),
        t.client.patch(CLASSES.path(name=SHARED_CLASS), {"spec": {"reclaimPolicy": "Delete"}}, "merge"),
        t.client.delete(CLASSES.path(name=SHARED_CLASS)),
        t.client.create(
            ADDRESSES.path(),
            {
                "apiVersion": EA_API_VERSION,
                "kind": "IPAddress",
                "metadata": {"name": SHARED_ADDRESS},
                "spec": {
                    "address": SHARED_ADDRESS,
                    "className": SHARED_CLASS,
                    "claimRef": {"namespace": t.namespace, "name": OWN_CLAIM},
                    "source": {"fromClass": {}},
                },
            },
        ),
        t.client.create(
            GPUCLASSES.path(),
            {
                "apiVersion": "gpu.cozystack.io/v1alpha1",
                "kind": "GPUClass",
                "metadata": {"name": "mine"},
                "spec": {"resourceName": GPU_RESOURCE},
            },
        ),
    ]
    for attempt in attempts:
        refused = await refusal(attempt)
        assert refused is not None
        assert refused.status == 403, refused


# --- write any status -----------------------------------------------------------------------------


def status_targets(w: World, namespace: str, rendered: str) -> list[tuple[str, Any]]:
    """(path, merge patch) of every status a tenant might want to write."""
    attached = {"status": {"phase": "Attached", "addresses": [SHARED_ADDRESS]}}
    return [
        (ATTACHMENTS.path(namespace, OWN_ATTACHMENT) + "/status", attached),
        (ATTACHMENTS.path(w.victim_namespace, OWN_ATTACHMENT) + "/status", attached),
        (CLAIMS.path(namespace, OWN_CLAIM) + "/status", {"status": {"phase": "Bound"}}),
        (CLAIMS.path(w.victim_namespace, OWN_CLAIM) + "/status", {"status": {"phase": "Bound"}}),
        (
            SERVICES.path(namespace, rendered) + "/status",
            {"status": {"loadBalancer": {"ingress": [{"ip": SHARED_ADDRESS}]}}},
        ),
        (GPUCLASSES.path(name="h200") + "/status", {"status": {"freeUnits": 99}}),
    ]


@pytest.mark.parametrize("identity", IDENTITIES)
async def test_write_any_status(world: World, identity: str) -> None:
    """No tenant role grants a status subresource (edit does not grant services/status either)."""
    t = world.tenants[identity]
    before = await victim_state(world)
    for path, patch in status_targets(world, t.namespace, t.rendered):
        refused = await refusal(t.client.patch(path, patch, "merge"))
        assert refused is not None, f"{identity} wrote {path}"
        assert refused.status == 403, (path, refused)
        assert "cannot patch resource" in str(refused), refused
    assert await victim_state(world) == before


# --- forge an owner reference; change or strip a rendered Service ---------------------------------


@pytest.mark.parametrize("identity", IDENTITIES)
async def test_forge_an_owner_reference(world: World, identity: str) -> None:
    """On a new Service or one of its own: refused (RBAC without edit; the rendered-Services policy
    with it). The diagnostic label alone marks nothing, and may be written with edit."""
    t = world.tenants[identity]
    owner = owner_reference(t.attachment, controller=False)
    attempts = [
        t.client.create(SERVICES.path(t.namespace), service_body("forged", owner_references=[owner])),
        t.client.patch(
            SERVICES.path(t.namespace, ENDPOINT), {"metadata": {"ownerReferences": [owner]}}, "merge"
        ),
    ]
    for attempt in attempts:
        refused = await refusal(attempt)
        assert refused is not None
        assert refused.status == 403, refused
        assert (POLICY_REFUSAL in str(refused)) == (identity == WITH_EDIT), refused
    labelled = refusal(
        t.client.create(SERVICES.path(t.namespace), service_body("labelled", labels={ATTACHMENT_LABEL: "x"}))
    )
    if identity == WITH_EDIT:
        assert await labelled is None
        await t.client.delete(SERVICES.path(t.namespace, "labelled"))
    else:
        assert await labelled is not None


@pytest.mark.parametrize("identity", IDENTITIES)
async def test_external_ips_or_stripped_owner_on_own_rendered_service(world: World, identity: str) -> None:
    t = world.tenants[identity]
    path = SERVICES.path(t.namespace, t.rendered)
    for change, kind in (
        ({"spec": {"externalIPs": [SHARED_ADDRESS]}}, "merge"),
        ([{"op": "remove", "path": "/metadata/ownerReferences"}], "json"),
    ):
        refused = await refusal(t.client.patch(path, change, kind))  # type: ignore[arg-type]
        assert refused is not None
        assert refused.status == 403
        assert (POLICY_REFUSAL in str(refused)) == (identity == WITH_EDIT), refused


@pytest.mark.parametrize("identity", IDENTITIES)
async def test_forge_lineage_labels_on_a_service_selecting_internal_pods(world: World, identity: str) -> None:
    """The optional policy refuses the forged labels, so there is nothing to attach; without edit the
    Service cannot be made at all."""
    t = world.tenants[identity]
    forged = service_body(
        "replication-public",
        type_="ClusterIP",
        labels=lineage_labels(name="db", tenant_facing=True),
        spec={"selector": {"app": "db", "role": "replica"}},
    )
    refused = await refusal(t.client.create(SERVICES.path(t.namespace), forged))
    assert refused is not None
    assert refused.status == 403
    if identity == WITH_EDIT:
        assert "is written by the Cozystack platform only" in str(refused), refused


# --- GPU inventory ---------------------------------------------------------------------------------


async def test_no_node_names_or_per_node_inventory_through_gpu_classes_or_metrics(
    world: World, kube: Kube, cluster: ClusterInfo, tmp_path: Path
) -> None:
    """With the GPUClass operator running over a GPU node, a tenant reads every GPU class (all it may
    read of GPUs): no node name appears, no field is per node; Nodes and other namespaces' Pods are
    refused; the operator's metrics (reachable only over the pod network, not through the API) carry
    no node label or node name either."""
    await apply_all(kube, load("config/crd/gpuclass/gpu.cozystack.io_gpuclasses.yaml"))
    rbac_dir = "config/rbac/gpuclass"
    rbac = [
        doc
        for name in load(f"{rbac_dir}/kustomization.yaml")[0]["resources"]
        for doc in load(f"{rbac_dir}/{name}")
    ]
    namespace_doc = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": GPU_OPERATOR_NAMESPACE}}
    await apply_all(kube, [namespace_doc, *rbac])
    await kube.create(NODES.path(), {"apiVersion": "v1", "kind": "Node", "metadata": {"name": GPU_NODE}})
    try:
        allocatable = {GPU_RESOURCE: "4", "cpu": "32", "memory": "256Gi", "pods": "110"}
        await kube.patch(
            NODES.path(name=GPU_NODE) + "/status",
            {
                "status": {
                    "conditions": [{"type": "Ready", "status": "True"}],
                    "capacity": allocatable,
                    "allocatable": allocatable,
                }
            },
            kind="merge",
        )
        await kube.patch(NODES.path(name=GPU_NODE), {"spec": {"taints": None}}, kind="merge")
        sample = load("config/samples/gpu_v1alpha1_gpuclass.yaml")[0]
        await kube.create(GPUCLASSES.path(), for_create(sample))
        kubeconfig = await serviceaccount_kubeconfig(
            kube, cluster.kubeconfig, GPU_OPERATOR_NAMESPACE, "gpuclass-operator", tmp_path / "gpu.kubeconfig"
        )
        args = ["--debounce-seconds=0.2", f"--leader-election-namespace={GPU_OPERATOR_NAMESPACE}"]
        async with operator_process("operators.gpuclass", kubeconfig, args, tmp_path / "gpu.log") as gpu:
            name = sample["metadata"]["name"]
            await wait_for_object(
                kube,
                GPUCLASSES,
                name,
                lambda c: ((c or {}).get("status") or {}).get("freeUnits") == 4,
                timeout=PASS_SECONDS,
                what=f"GPU class {name} counted (log: {gpu.log_path})",
            )
            samples = await eventually(gpu.scrape, what="the GPUClass operator's metrics")
            for identity in IDENTITIES:
                t = world.tenants[identity]
                seen = await eventually(
                    functools.partial(readable_gpu_classes, t.client),
                    what="the tenant reading GPU classes",
                )
                assert seen["items"], "the tenant reads no GPU class"
                text = repr(seen)
                assert GPU_NODE not in text
                for item in seen["items"]:
                    status = item.get("status") or {}
                    assert set(status) <= {
                        "observedGeneration",
                        "freeUnits",
                        "maxFreeUnitsPerNode",
                        "fits",  # VMs per size: counts, never a node or a per-node figure
                        "fitsSummary",
                        "conditions",
                    }, status
                for forbidden in (
                    NODES.path(),
                    NODES.path(name=GPU_NODE),
                    PODS.path(world.victim_namespace),
                    PODS.path(),
                ):
                    refused = await refusal(t.client.get(forbidden))
                    assert refused is not None, forbidden
                    assert refused.status == 403, forbidden
            for (metric, labels), _value in samples.items():
                if not metric.startswith("cozystack_gpuclass"):
                    continue
                assert all(key not in ("node", "instance_node", "hostname") for key, _ in labels), (
                    metric,
                    labels,
                )
                assert all(GPU_NODE not in value for _, value in labels), (metric, labels)
    finally:
        for path in (GPUCLASSES.path(name="h200"), NODES.path(name=GPU_NODE)):
            await kube.delete(path)


async def readable_gpu_classes(client: Kube) -> Obj | None:
    """The GPU classes as the tenant reads them; None while RBAC does not know the reader role yet."""
    try:
        return await client.list(GPUCLASSES.path())
    except ApiError:
        return None


# --- drain a shared pool ---------------------------------------------------------------------------


def sample_quota() -> Obj | None:
    """The sample ResourceQuota of config/samples, if one is shipped."""
    for path in sorted((ROOT / "config" / "samples").glob("*.yaml")):
        for doc in load(path):
            if doc.get("kind") == "ResourceQuota":
                return doc
    return None


def claim_limit(quota: Obj) -> tuple[str, int]:
    for key, value in (quota.get("spec") or {}).get("hard", {}).items():
        if "ipaddressclaims" in key:
            return key, int(value)
    raise AssertionError(f"the sample quota limits no claims: {quota}")


async def test_drain_a_shared_pool(world: World) -> None:
    """A tenant reserving address after address with claims (the substrate's, a shared class's): the
    sample quota refuses the claim past its limit, and the attachment past its own."""
    quota = sample_quota()
    if quota is None:
        pytest.xfail("config/samples ships no ResourceQuota")
    t = world.tenants[TENANT_ROLES_ONLY]
    body = for_create(quota)
    body["metadata"]["namespace"] = t.namespace
    key, limit = claim_limit(quota)
    await quota_in_force(world.kube, t.namespace, body, key)
    made = minted = 0
    try:
        refused = None
        # The world's claim counts already.
        for index in range(limit + 1):
            claim = {
                "apiVersion": EA_API_VERSION,
                "kind": "IPAddressClaim",
                "metadata": {"name": f"hoard-{index}"},
                "spec": {"className": SHARED_CLASS},
            }
            refused = await refusal(t.client.create(CLAIMS.path(t.namespace), claim))
            if refused is not None:
                break
            made += 1
        assert refused is not None, f"{made} claims made, the quota allows {limit}"
        assert refused.status == 403
        assert "exceeded quota" in str(refused), refused
        assert made < limit
        attachments_key = next(k for k in quota["spec"]["hard"] if "endpointattachments" in k)
        attachment_limit = int(quota["spec"]["hard"][attachments_key])
        for index in range(attachment_limit + 1):
            refused = await refusal(
                t.client.create(
                    ATTACHMENTS.path(t.namespace), attachment_body(f"hoard-{index}", className=SHARED_CLASS)
                )
            )
            if refused is not None:
                break
            minted += 1
        assert refused is not None, f"{minted} more attachments made, the quota allows {attachment_limit}"
        assert "exceeded quota" in str(refused), refused
    finally:
        for index in range(made):
            await t.client.delete(CLAIMS.path(t.namespace, f"hoard-{index}"))
        for index in range(minted):
            await t.client.delete(ATTACHMENTS.path(t.namespace, f"hoard-{index}"))
