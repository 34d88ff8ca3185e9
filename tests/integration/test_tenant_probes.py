"""What a hostile tenant tries, on the local control plane: each attempt is refused by the API (RBAC,
a CRD rule, an admission policy, a quota) or neutralised by the operator within a pass. The table of
docs/tenants/boundaries.md lists these tests, one row each.

The tenant is a ServiceAccount of its namespace, bound to the project's tenant roles, and (the second
run of most probes) also allowed to write Services there as Kubernetes' edit role allows. The
world is the one of ``test_admission_policy.py``: the EndpointAttachment operator under its own
ServiceAccount, MetalLB's real controller, the admission policies of config/admission (the optional
one included), another tenant (the victim) with a published attachment.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import pytest

from hack.devcluster import ClusterInfo
from operators.endpointattachment.constants import ATTACHMENT_LABEL, METALLB_IPS_ANNOTATION
from operators.gpuclass.api import GPUCLASSES
from shared.kube import ApiError, Kube, Obj
from shared.resources import NAMESPACES, NODES, PODS, RESOURCE_QUOTAS, SERVICES
from tests.ea_builders import (
    for_create,
    lineage_labels,
    make_attachment,
    make_claim,
    make_class,
    make_service,
)
from tests.integration.test_admission_policy import (
    CLASS_V4,
    ENDPOINT,
    IDENTITIES,
    INTERNAL_SERVICE,
    OWN_ATTACHMENT,
    OWN_SERVICE,
    POLICY_REFUSAL,
    PUBLISH_SECONDS,
    TENANT_ROLES_ONLY,
    WITH_EDIT,
    World,
    admission_world,
    attach,
    attachment_condition,
    published,
    refusal,
    service_body,
)
from tests.support.ea_cluster import ALLOCATIONS, ATTACHMENTS, CLAIMS, CLASSES, PROXIES, condition
from tests.support.identity import serviceaccount_kubeconfig
from tests.support.manifests import ROOT, apply_all, load
from tests.support.operators import operator_process
from tests.support.waiting import eventually, wait_for_object

GPU_OPERATOR_NAMESPACE: Final = "cozy-gpuclass"
GPU_RESOURCE: Final = "nvidia.com/GH100_H200_SXM_141GB"
GPU_NODE: Final = "probe-gpu-node-secret-rack-7"
# A Service of the victim's namespace that exists nowhere else: what the tenant tries to attach.
VICTIM_ONLY_SERVICE: Final = "victim-only-rw"
VICTIM_CLAIM: Final = "victim-ip"
# A class offered only to namespaces labelled so (none of the tenants' is).
PRIVATE_CLASS: Final = "adm-private"
PRIVATE_CLASS_CIDR: Final = "100.64.42.0/29"
PRIVATE_LABEL: Final = "example.com/private-addresses"
# How long the operator may take to answer a probe: its passes take well under a second; this is
# the deadline on a loaded machine, not the expected time.
PASS_SECONDS: Final = 30.0


@pytest.fixture(scope="module")
async def world(
    kube: Kube, cluster: ClusterInfo, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[World]:
    async with admission_world(kube, cluster, tmp_path_factory.mktemp("probes")) as built:
        victim = built.victim_namespace
        service = for_create(make_service(VICTIM_ONLY_SERVICE, victim, selector={"app": "db"}))
        await kube.create(SERVICES.path(victim), service)
        claim = make_claim(VICTIM_CLAIM, victim, class_name=CLASS_V4, address=None, phase=None)
        await kube.create(CLAIMS.path(victim), for_create(claim))
        await wait_for_object(
            kube,
            CLAIMS,
            VICTIM_CLAIM,
            lambda c: ((c or {}).get("status") or {}).get("phase") == "Bound",
            namespace=victim,
            timeout=PUBLISH_SECONDS,
        )
        yield built


async def victim_state(w: World) -> list[Any]:
    """What no probe may change: the victim's attachment, claim and rendered Service."""
    victim = w.victim_namespace
    attachment = await w.kube.get(ATTACHMENTS.path(victim, "site"))
    claim = await w.kube.get(CLAIMS.path(victim, VICTIM_CLAIM))
    service = await w.kube.get(SERVICES.path(victim, "ea-site"))
    assert attachment is not None
    assert claim is not None
    assert service is not None
    return [
        attachment["metadata"]["resourceVersion"],
        claim["metadata"]["resourceVersion"],
        service["metadata"]["resourceVersion"],
    ]


def attachment_body(namespace: str, name: str, **address: str) -> Obj:
    built = make_attachment(name, namespace, endpoint=ENDPOINT, class_name=None, owner_uid=None)
    built["spec"]["address"] = dict(address) or {"className": CLASS_V4}
    return for_create(built)


async def condition_becomes(w: World, namespace: str, name: str, type_: str, wanted: tuple[str, str]) -> Obj:
    return await attachment_condition(
        w.kube, namespace, name, type_, wanted, timeout=PASS_SECONDS, operator=w.operator
    )


# --- attach another namespace's Service; use another namespace's claim -----------------------------


@pytest.mark.parametrize("identity", IDENTITIES)
async def test_attach_another_namespaces_service(world: World, identity: str) -> None:
    """The endpoint is a name in the attachment's own namespace: a namespace field is refused under
    strict field validation (kubectl's default) and dropped otherwise; a qualified name is refused by
    the CRD. What is left names nothing in the tenant's namespace: EndpointNotFound, nothing rendered,
    no address taken."""
    t = world.tenants[identity]
    before = await victim_state(world)
    body = attachment_body(t.namespace, "steal")
    body["spec"]["endpoint"] = {"name": VICTIM_ONLY_SERVICE, "namespace": world.victim_namespace}
    strict = await refusal(
        t.client.request(
            "POST", ATTACHMENTS.path(t.namespace), body=body, params={"fieldValidation": "Strict"}
        )
    )
    assert strict is not None
    assert 'unknown field "spec.endpoint.namespace"' in str(strict), strict
    qualified = attachment_body(t.namespace, "steal")
    qualified["spec"]["endpoint"] = {"name": f"{world.victim_namespace}/{VICTIM_ONLY_SERVICE}"}
    refused = await refusal(t.client.create(ATTACHMENTS.path(t.namespace), qualified))
    assert refused is not None
    assert "spec.endpoint.name must be a Service name" in str(refused), refused

    created = await t.client.create(ATTACHMENTS.path(t.namespace), body)  # the namespace field is dropped
    assert "namespace" not in created["spec"]["endpoint"]
    try:
        found = await condition_becomes(
            world, t.namespace, "steal", "EndpointResolved", ("False", "EndpointNotFound")
        )
        assert condition(found, "Ready")[0] == "False"
        assert not (found.get("status") or {}).get("address")
        assert await world.kube.get(SERVICES.path(t.namespace, "ea-steal")) is None
    finally:
        await t.client.delete(ATTACHMENTS.path(t.namespace, "steal"))
    assert await victim_state(world) == before


@pytest.mark.parametrize("identity", IDENTITIES)
async def test_use_another_namespaces_claim(world: World, identity: str) -> None:
    """A claim is looked up in the attachment's namespace only (ClaimNotFound), and a claim of one's
    own asking for an address another tenant holds is never bound (AddressInUse)."""
    t = world.tenants[identity]
    before = await victim_state(world)
    victim_claim = await world.kube.get(CLAIMS.path(world.victim_namespace, VICTIM_CLAIM))
    assert victim_claim is not None
    taken = victim_claim["status"]["address"]
    await t.client.create(
        ATTACHMENTS.path(t.namespace), attachment_body(t.namespace, "borrow", claimName=VICTIM_CLAIM)
    )
    own_claim = make_claim("copycat", t.namespace, class_name=CLASS_V4, address=taken, phase=None)
    await t.client.create(CLAIMS.path(t.namespace), for_create(own_claim))
    try:
        found = await condition_becomes(
            world, t.namespace, "borrow", "AddressBound", ("False", "ClaimNotFound")
        )
        assert not (found.get("status") or {}).get("address")
        claim = await wait_for_object(
            world.kube,
            CLAIMS,
            "copycat",
            lambda c: condition(c, "AddressBound") == ("False", "AddressInUse"),
            namespace=t.namespace,
            timeout=PASS_SECONDS,
        )
        assert ((claim or {}).get("status") or {}).get("phase") != "Bound"
    finally:
        await t.client.delete(ATTACHMENTS.path(t.namespace, "borrow"))
        await t.client.delete(CLAIMS.path(t.namespace, "copycat"))
    assert await victim_state(world) == before
    allocation = await world.kube.get(ALLOCATIONS.path(name=taken))
    assert allocation is not None
    assert allocation["spec"]["holder"]["namespace"] == world.victim_namespace


@pytest.mark.parametrize("identity", IDENTITIES)
async def test_use_a_class_not_offered_to_the_namespace(world: World, identity: str) -> None:
    """A class whose allowedNamespaces does not select the tenant's namespace mints nothing for it."""
    t = world.tenants[identity]
    private = make_class(
        PRIVATE_CLASS, cidrs=[PRIVATE_CLASS_CIDR], allowed_namespaces={"matchLabels": {PRIVATE_LABEL: "true"}}
    )
    await world.kube.create(CLASSES.path(), for_create(private))
    body = attachment_body(t.namespace, "private", className=PRIVATE_CLASS)
    await t.client.create(ATTACHMENTS.path(t.namespace), body)
    try:
        found = await condition_becomes(
            world, t.namespace, "private", "AddressBound", ("False", "NamespaceNotAllowed")
        )
        assert not (found.get("status") or {}).get("address")
        assert await world.kube.get(SERVICES.path(t.namespace, "ea-private")) is None
        # Nor may the tenant offer the class to itself: namespaces and classes are not its to write.
        relabel = {"metadata": {"labels": {PRIVATE_LABEL: "true"}}}
        refused = await refusal(t.client.patch(NAMESPACES.path(name=t.namespace), relabel, "merge"))
        assert refused is not None
        assert refused.status == 403
        widen = {"spec": {"allowedNamespaces": None}}
        refused = await refusal(t.client.patch(CLASSES.path(name=PRIVATE_CLASS), widen, "merge"))
        assert refused is not None
        assert refused.status == 403
    finally:
        await t.client.delete(ATTACHMENTS.path(t.namespace, "private"))
        await wait_for_object(
            world.kube,
            ATTACHMENTS,
            "private",
            lambda o: o is None,
            namespace=t.namespace,
            timeout=PASS_SECONDS,
        )
        await world.kube.delete(CLASSES.path(name=PRIVATE_CLASS))
        await wait_for_object(world.kube, CLASSES, PRIVATE_CLASS, lambda o: o is None, timeout=PASS_SECONDS)


@pytest.mark.parametrize("identity", IDENTITIES)
async def test_write_classes_proxies_or_gpu_classes(world: World, identity: str) -> None:
    """Cluster-wide declarations are the hoster's: a tenant creates, changes and deletes none."""
    t = world.tenants[identity]
    attempts = [
        t.client.create(CLASSES.path(), for_create(make_class("mine", cidrs=["100.64.99.0/30"]))),
        t.client.patch(
            CLASSES.path(name=CLASS_V4), {"spec": {"excludeAddresses": [world.victim_address]}}, "merge"
        ),
        t.client.delete(CLASSES.path(name=CLASS_V4)),
        t.client.create(
            PROXIES.path(),
            {
                "apiVersion": "local.sdn.cozystack.io/v1alpha1",
                "kind": "ServiceProxy",
                "metadata": {"name": "mine"},
                "spec": {"serviceProxyName": "mine", "modes": ["WholeIP"]},
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


# --- write any status; create an allocation --------------------------------------------------------


def status_targets(w: World, namespace: str) -> list[tuple[str, Any]]:
    """(path, merge patch) of every status a tenant might want to write."""
    address = {"status": {"address": w.victim_address}}
    return [
        (ATTACHMENTS.path(namespace, OWN_ATTACHMENT) + "/status", address),
        (ATTACHMENTS.path(w.victim_namespace, "site") + "/status", address),
        (CLAIMS.path(w.victim_namespace, VICTIM_CLAIM) + "/status", address),
        (CLASSES.path(name=CLASS_V4) + "/status", {"status": {"allocated": 0}}),
        (
            SERVICES.path(namespace, OWN_SERVICE) + "/status",
            {"status": {"loadBalancer": {"ingress": [{"ip": "1.1.1.1"}]}}},
        ),
        (GPUCLASSES.path(name="h200") + "/status", {"status": {"freeUnits": 99}}),
        (PROXIES.path(name="cozy-proxy") + "/status", {"status": {}}),
    ]


@pytest.mark.parametrize("identity", IDENTITIES)
async def test_write_any_status(world: World, identity: str) -> None:
    """No tenant role grants a status subresource (edit does not grant services/status either)."""
    t = world.tenants[identity]
    before = await victim_state(world)
    for path, patch in status_targets(world, t.namespace):
        refused = await refusal(t.client.patch(path, patch, "merge"))
        assert refused is not None, f"{identity} wrote {path}"
        assert refused.status == 403, (path, refused)
        assert "cannot patch resource" in str(refused), refused
    assert await victim_state(world) == before


@pytest.mark.parametrize("identity", IDENTITIES)
async def test_create_an_allocation(world: World, identity: str) -> None:
    """Allocations (the minting lock) are the operator's: a tenant can neither create nor delete one."""
    t = world.tenants[identity]
    free = world.free_pool_address()
    allocation = {
        "apiVersion": "local.sdn.cozystack.io/v1alpha1",
        "kind": "IPAddressAllocation",
        "metadata": {"name": free.replace(".", "-")},
        "spec": {"className": CLASS_V4, "address": free},
    }
    refused = await refusal(t.client.create(ALLOCATIONS.path(), allocation))
    assert refused is not None
    assert refused.status == 403, refused
    gone = await refusal(t.client.delete(ALLOCATIONS.path(name=world.victim_address)))
    assert gone is not None
    assert gone.status == 403, gone


# --- forge the attachment label or an owner reference; squat the rendered name ---------------------


@pytest.mark.parametrize("identity", IDENTITIES)
async def test_forge_attachment_label_or_owner_reference(world: World, identity: str) -> None:
    """On a new Service or one of its own: refused (RBAC without edit; the rendered-Services policy
    with it)."""
    t = world.tenants[identity]
    owner = {
        "apiVersion": "local.sdn.cozystack.io/v1alpha1",
        "kind": "EndpointAttachment",
        "name": OWN_ATTACHMENT,
        "uid": t.attachment["metadata"]["uid"],
    }
    attempts = [
        t.client.create(
            SERVICES.path(t.namespace), service_body("forged", labels={ATTACHMENT_LABEL: "site"})
        ),
        t.client.create(SERVICES.path(t.namespace), service_body("forged", owner_references=[owner])),
        t.client.patch(
            SERVICES.path(t.namespace, ENDPOINT), {"metadata": {"ownerReferences": [owner]}}, "merge"
        ),
        t.client.patch(
            SERVICES.path(t.namespace, ENDPOINT),
            {"metadata": {"labels": {ATTACHMENT_LABEL: OWN_ATTACHMENT}}},
            "merge",
        ),
    ]
    for attempt in attempts:
        refused = await refusal(attempt)
        assert refused is not None
        assert refused.status == 403, refused
        assert (POLICY_REFUSAL in str(refused)) == (identity == WITH_EDIT), refused


async def test_squat_the_rendered_name_before_the_attachment(world: World) -> None:
    """With edit, a tenant may create a Service named ea-<name> before the attachment: the operator
    never adopts or touches it (ServiceNameConflict), and the squatter asks for no address (the
    address policy would refuse it). Without edit the Service cannot be made at all."""
    t = world.tenants[WITH_EDIT]
    squat = await t.client.create(SERVICES.path(t.namespace), service_body("ea-squat"))
    await attach(world.kube, t.namespace, "squat")
    try:
        await condition_becomes(world, t.namespace, "squat", "Ready", ("False", "ServiceNameConflict"))
        after = await world.kube.get(SERVICES.path(t.namespace, "ea-squat"))
        assert after is not None
        assert after["metadata"]["uid"] == squat["metadata"]["uid"]
        assert ATTACHMENT_LABEL not in (after["metadata"].get("labels") or {})
        assert not after["metadata"].get("ownerReferences")
        assert METALLB_IPS_ANNOTATION not in (after["metadata"].get("annotations") or {})
    finally:
        await t.client.delete(SERVICES.path(t.namespace, "ea-squat"))
        await world.kube.delete(ATTACHMENTS.path(t.namespace, "squat"))
    without_edit = world.tenants[TENANT_ROLES_ONLY]
    refused = await refusal(
        without_edit.client.create(SERVICES.path(without_edit.namespace), service_body("ea-x"))
    )
    assert refused is not None
    assert refused.status == 403


async def test_attachment_publishes_once_the_squatter_goes(world: World) -> None:
    t = world.tenants[WITH_EDIT]
    await t.client.create(SERVICES.path(t.namespace), service_body("ea-late"))
    await attach(world.kube, t.namespace, "late")
    try:
        await condition_becomes(world, t.namespace, "late", "Ready", ("False", "ServiceNameConflict"))
        await t.client.delete(SERVICES.path(t.namespace, "ea-late"))
        await attachment_condition(
            world.kube, t.namespace, "late", "Ready", ("True", "Published"), timeout=PASS_SECONDS
        )
    finally:
        await world.kube.delete(ATTACHMENTS.path(t.namespace, "late"))


# --- the probes that used to get through ---------------------------------------------------


@pytest.mark.parametrize("identity", IDENTITIES)
async def test_own_load_balancer_asking_for_another_tenants_or_a_pool_address(
    world: World, identity: str
) -> None:
    t = world.tenants[identity]
    for asks in (
        service_body("grab", annotations={METALLB_IPS_ANNOTATION: world.victim_address}),
        service_body("grab", spec={"loadBalancerIP": world.victim_address}),
        service_body("grab", annotations={METALLB_IPS_ANNOTATION: world.free_pool_address()}),
    ):
        refused = await refusal(t.client.create(SERVICES.path(t.namespace), asks))
        assert refused is not None, asks
        assert refused.status == 403
        if identity == WITH_EDIT:
            assert f"an address of IPAddressClass {CLASS_V4}" in str(refused), refused


@pytest.mark.parametrize("identity", IDENTITIES)
async def test_external_ips_on_own_rendered_service(world: World, identity: str) -> None:
    t = world.tenants[identity]
    patch = {"spec": {"externalIPs": [world.victim_address]}}
    refused = await refusal(t.client.patch(SERVICES.path(t.namespace, OWN_SERVICE), patch, "merge"))
    assert refused is not None
    assert refused.status == 403
    assert (POLICY_REFUSAL in str(refused)) == (identity == WITH_EDIT), refused


async def test_strip_owner_reference_then_delete_the_attachment(world: World) -> None:
    """The strip is refused; deleting the attachment then takes its Service first and releases the
    address after, and another tenant is then given that address with no Service left asking for it."""
    t = world.tenants[WITH_EDIT]
    await attach(world.kube, t.namespace, "leaving")
    leaving = await published(world.kube, t.namespace, "leaving", world.operator)
    address = leaving["status"]["address"]
    strip = [{"op": "remove", "path": "/metadata/ownerReferences"}]
    refused = await refusal(t.client.patch(SERVICES.path(t.namespace, "ea-leaving"), strip, "json"))
    assert refused is not None
    assert "removes its owner reference" in str(refused), refused
    await t.client.delete(ATTACHMENTS.path(t.namespace, "leaving"))
    await wait_for_object(
        world.kube, ATTACHMENTS, "leaving", lambda o: o is None, namespace=t.namespace, timeout=PASS_SECONDS
    )
    assert await world.kube.get(SERVICES.path(t.namespace, "ea-leaving")) is None
    # Another tenant reserves exactly that address: it is bound, and only its Service asks for it.
    victim = world.victim_namespace
    claim = make_claim("inherit", victim, class_name=CLASS_V4, address=address, phase=None)
    await world.kube.create(CLAIMS.path(victim), for_create(claim))
    try:
        await wait_for_object(
            world.kube,
            CLAIMS,
            "inherit",
            lambda c: ((c or {}).get("status") or {}).get("phase") == "Bound",
            namespace=victim,
            timeout=PASS_SECONDS,
        )
        everywhere = (await world.kube.list(SERVICES.path()))["items"]
        asking = [
            f"{s['metadata']['namespace']}/{s['metadata']['name']}"
            for s in everywhere
            if address in (s["metadata"].get("annotations") or {}).get(METALLB_IPS_ANNOTATION, "").split(",")
        ]
        assert not asking, f"Services still asking for {address}: {asking}"
    finally:
        await world.kube.delete(CLAIMS.path(victim, "inherit"))


@pytest.mark.parametrize("identity", IDENTITIES)
async def test_forge_lineage_labels_on_a_service_selecting_internal_pods(world: World, identity: str) -> None:
    """The optional policy refuses the forged labels, so there is nothing to attach; without edit the
    Service cannot be made at all. An attachment naming the internal Service is not tenant-facing."""
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
    internal = attachment_body(t.namespace, "internal")
    internal["spec"]["endpoint"] = {"name": INTERNAL_SERVICE}
    await t.client.create(ATTACHMENTS.path(t.namespace), internal)
    try:
        await condition_becomes(
            world, t.namespace, "internal", "EndpointResolved", ("False", "EndpointNotTenantFacing")
        )
    finally:
        await t.client.delete(ATTACHMENTS.path(t.namespace, "internal"))


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
                timeout=PUBLISH_SECONDS,
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
    """A tenant reserving every address of a shared class with claims: the sample quota refuses the
    claim past its limit, long before the pool runs dry."""
    quota = sample_quota()
    if quota is None:
        pytest.xfail("config/samples ships no ResourceQuota yet (another change adds one)")
    t = world.tenants[TENANT_ROLES_ONLY]
    body = for_create(quota)
    body["metadata"]["namespace"] = t.namespace
    await world.kube.create(RESOURCE_QUOTAS.path(t.namespace), body)
    key, limit = claim_limit(quota)
    address_class = await world.kube.get(CLASSES.path(name=CLASS_V4))
    capacity = int(((address_class or {}).get("status") or {}).get("capacity") or 0)
    assert limit < capacity, f"the quota ({limit} claims) would let one namespace take the whole class"

    async def counted() -> bool:
        found = await world.kube.get(RESOURCE_QUOTAS.path(t.namespace, body["metadata"]["name"]))
        return key in (((found or {}).get("status") or {}).get("hard") or {})

    await eventually(counted, timeout=PASS_SECONDS, what="the quota counted by the resource-quota controller")
    made = minted = 0
    try:
        refused = None
        for index in range(limit + 1):
            claim = make_claim(f"hoard-{index}", t.namespace, class_name=CLASS_V4, address=None, phase=None)
            refused = await refusal(t.client.create(CLAIMS.path(t.namespace), for_create(claim)))
            if refused is not None:
                break
            made += 1
        assert refused is not None, f"{made} claims made, the quota allows {limit}"
        assert refused.status == 403
        assert "exceeded quota" in str(refused), refused
        assert made <= limit
        # Attachments mint too: capped the same way.
        attachments_key = next(k for k in quota["spec"]["hard"] if "endpointattachments" in k)
        attachment_limit = int(quota["spec"]["hard"][attachments_key])
        for index in range(attachment_limit + 1):
            refused = await refusal(
                t.client.create(ATTACHMENTS.path(t.namespace), attachment_body(t.namespace, f"hoard-{index}"))
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
