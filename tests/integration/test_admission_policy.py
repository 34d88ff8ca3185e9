"""The admission policy of config/admission/endpointattachment on the local control plane: a tenant
ServiceAccount cannot touch the Services the operator renders for attachments, nor make a Service of
its own look rendered, while the operator, the address substrate's driver, the platform and
Kubernetes' own clean-up keep working. The optional policy (config/admission/endpointattachment/
optional) keeps tenants off Cozystack's lineage labels.

Each probe runs twice: as a tenant bound to the project's tenant roles only (Service writes are then
refused by RBAC already), and as a tenant that may also write Services in its namespace, as
Kubernetes' ``edit`` role allows (here a Role granting exactly the Service verbs ``edit`` has; the
local control plane does not aggregate the built-in roles). With ``edit``, every probe must be refused
by a policy with a message that says why, and nothing the probe aimed at may change.

Everything here is judged by the API server alone, so no operator runs: each rendered Service is
written as the operator writes one (``generateName`` from the attachment, its controller owner
reference, the substrate's claim annotation, the endpoint's selector and ports), with the operator's
ServiceAccount's own credentials (the identity the policy exempts; bound here to a role granting only
what that takes, not to config/rbac). The garbage collector and namespace controller of the real
kube-controller-manager (running with --use-service-account-credentials) do the clean-up. The pin of
a rendered Service (the load balancer's address annotation and the driver's marker) is the address
substrate's MetalLB driver's alone: its ServiceAccount is the only identity that may change it (a
setting: an overlay naming another identity, as the hoster docs show, moves the exemption to it).
Fencing which address a tenant's own Service may ask for is the substrate's, not a policy of ours.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from hack.devcluster import ClusterInfo
from hack.substrate import driver_kubeconfig
from harness.identity import serviceaccount_kubeconfig
from harness.manifests import ROOT, apply_all, kubectl, load, policies_installed
from harness.substrate import CLAIM_ANNOTATION, CLAIMS, METALLB_IPS_ANNOTATION, PINNED_MARKER
from harness.waiting import eventually, wait_for_object
from shared.kube import ApiError, Kube, Obj
from shared.lineage import TENANT_RESOURCE_LABEL
from shared.resources import (
    CLUSTER_ROLE_BINDINGS,
    CLUSTER_ROLES,
    HELMRELEASES,
    NAMESPACES,
    ROLE_BINDINGS,
    ROLES,
    SERVICE_ACCOUNTS,
    SERVICES,
    Resource,
)
from tests.ea_builders import lineage_labels

POLICY_DIR: Final = "config/admission/endpointattachment"
OPTIONAL_POLICY_DIR: Final = f"{POLICY_DIR}/optional"
TENANT_ROLES_FILE: Final = "config/rbac/endpointattachment/tenant_roles.yaml"
TENANT_EDIT_CLUSTER_ROLE: Final = "cozystack:endpointattachment-edit"
CRD_FILES: Final = (
    "tests/fixtures/helmrelease-crd.yaml",
    "config/crd/endpointattachment/local.sdn.cozystack.io_endpointattachments.yaml",
    *(
        f"tests/fixtures/address-substrate/local.sdn.cozystack.io_{plural}.yaml"
        for plural in ("ipaddressclasses", "ipaddresses", "ipaddressclaims")
    ),
)
EA_API_VERSION: Final = "local.sdn.cozystack.io/v1alpha1"
ATTACHMENTS: Final = Resource(EA_API_VERSION, "endpointattachments")
# The identity the policy exempts: the operator's ServiceAccount as config/ installs it.
OPERATOR_NAMESPACE: Final = "cozy-endpointattachment"
OPERATOR_SERVICE_ACCOUNT: Final = "endpointattachment-operator"
# What writing a rendered Service takes: the Service verbs, and (for the controller reference's
# blockOwnerDeletion, under OwnerReferencesPermissionEnforcement) updating attachments' finalizers.
RENDERER_ROLE: Final = "adm-test-endpointattachment-renderer"
RENDERER_RULES: Final = [
    {
        "apiGroups": [""],
        "resources": ["services"],
        "verbs": ["get", "list", "create", "update", "patch", "delete"],
    },
    {
        "apiGroups": ["local.sdn.cozystack.io"],
        "resources": ["endpointattachments/finalizers"],
        "verbs": ["update"],
    },
]
# The diagnostic label on a rendered Service (marks nothing: the owner reference does).
ATTACHMENT_LABEL: Final = "cozystack.io/endpoint-attachment"
# Every policy message comes through the API server with this prefix: the refusal is the policy's.
POLICY_REFUSAL: Final = "ValidatingAdmissionPolicy"
# The RBAC authorizer and the policies' informers learn of new objects shortly after they are made.
PROPAGATION_SECONDS: Final = 60.0
CLEANUP_SECONDS: Final = 90.0

# The tenant identities of the two runs.
TENANT_ROLES_ONLY: Final = "tenant-roles"
WITH_EDIT: Final = "edit"
IDENTITIES: Final = (TENANT_ROLES_ONLY, WITH_EDIT)
TENANT_SA: Final = "tenant"
# What Kubernetes' edit role lets a namespace's users do with Services (services/status is not in it).
SERVICE_EDIT_VERBS: Final = ["get", "list", "watch", "create", "update", "patch", "delete"]
# The tenant's attachment, its claim, and its application.
OWN_ATTACHMENT: Final = "own"
OWN_CLAIM: Final = "own-ip"
APP: Final = "db"
ENDPOINT: Final = "postgres-db-rw"
ENDPOINT_SELECTOR: Final = {"app": "db", "role": "primary"}
INTERNAL_SERVICE: Final = "postgres-db-replication"
INTERNAL_SELECTOR: Final = {"app": "db", "role": "replica"}
# A Service of the tenant's own, without any address (made by the platform, so both runs have it).
PLAIN_SERVICE: Final = "plain"
FIELD_MANAGER: Final = "tenant-probe"
# An address the substrate's driver pins (the policy lets only the driver pin).
PINNED: Final = "198.51.100.77"


def suffix() -> str:
    return secrets.token_hex(3)


# --- the cluster pieces ---------------------------------------------------------------------------


async def refusal(call: Awaitable[Any]) -> ApiError | None:
    """The API's refusal of a request, or None when it was accepted."""
    try:
        await call
    except ApiError as error:
        return error
    return None


async def until_refused_by_policy(probe: Callable[[], Awaitable[Any]], what: str) -> None:
    """Wait until the API server's policy informers have the policies (and parameters) just made:
    ``probe`` (a dry run) is then refused by a policy."""

    async def refused() -> bool:
        error = await refusal(probe())
        return error is not None and POLICY_REFUSAL in str(error)

    await eventually(refused, timeout=PROPAGATION_SECONDS, interval=0.5, what=what)


def dry_run_create(client: Kube, namespace: str, body: Mapping[str, Any]) -> Callable[[], Awaitable[Obj]]:
    return lambda: client.request("POST", SERVICES.path(namespace), body=body, params={"dryRun": "All"})


def service_body(
    name: str,
    *,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    spec: Mapping[str, Any] | None = None,
    owner_references: Sequence[Mapping[str, Any]] = (),
    type_: str = "LoadBalancer",
) -> Obj:
    metadata: Obj = {"name": name}
    if annotations:
        metadata["annotations"] = dict(annotations)
    if labels:
        metadata["labels"] = dict(labels)
    if owner_references:
        metadata["ownerReferences"] = [dict(r) for r in owner_references]
    body_spec: Obj = {"type": type_, "selector": {"app": "db"}, "ports": [{"port": 5432, "protocol": "TCP"}]}
    if type_ == "LoadBalancer":
        body_spec["allocateLoadBalancerNodePorts"] = False
    body_spec.update(spec or {})
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": body_spec}


async def make_namespace(kube: Kube, name: str) -> None:
    await kube.create(
        NAMESPACES.path(), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )


async def delete_namespace(kube: Kube, name: str, *, wait: bool = False) -> None:
    await kube.delete(NAMESPACES.path(name=name))
    if wait:
        await wait_for_object(
            kube,
            NAMESPACES,
            name,
            lambda o: o is None,
            timeout=CLEANUP_SECONDS,
            what=f"namespace {name} gone",
        )


async def delete_namespaces(kube: Kube, names: Sequence[str]) -> None:
    for name in names:
        await kube.delete(NAMESPACES.path(name=name))
    for name in names:
        await wait_for_object(
            kube,
            NAMESPACES,
            name,
            lambda o: o is None,
            timeout=CLEANUP_SECONDS,
            what=f"namespace {name} gone",
        )


async def app_with_endpoint(kube: Kube, namespace: str) -> None:
    """A Cozystack application as the platform makes it: its HelmRelease, its tenant-facing Service
    and an internal (replication) Service, labelled as Cozystack's lineage webhook labels them."""
    release = {
        "apiVersion": "helm.toolkit.fluxcd.io/v2",
        "kind": "HelmRelease",
        "metadata": {"name": f"postgres-{APP}", "labels": lineage_labels(name=APP, tenant_facing=False)},
        "spec": {
            "interval": "5m",
            "chart": {"spec": {"chart": "postgres", "sourceRef": {"kind": "HelmRepository", "name": "apps"}}},
        },
    }
    await kube.create(HELMRELEASES.path(namespace), release)
    for name, selector, tenant_facing in (
        (ENDPOINT, ENDPOINT_SELECTOR, True),
        (INTERNAL_SERVICE, INTERNAL_SELECTOR, False),
    ):
        body = service_body(
            name,
            type_="ClusterIP",
            labels=lineage_labels(name=APP, tenant_facing=tenant_facing),
            spec={"selector": selector},
        )
        await kube.create(SERVICES.path(namespace), body)


async def attach(kube: Kube, namespace: str, name: str) -> Obj:
    """A tenant's attachment of the application's endpoint, using its reserved claim."""
    body = {
        "apiVersion": EA_API_VERSION,
        "kind": "EndpointAttachment",
        "metadata": {"name": name},
        "spec": {
            "applicationRef": {"kind": "Postgres", "name": APP},
            "endpoint": {"serviceName": ENDPOINT},
            "loadBalancer": {"claimName": OWN_CLAIM},
        },
    }
    return await kube.create(ATTACHMENTS.path(namespace), body)


def owner_reference(attachment: Mapping[str, Any], *, controller: bool, block: bool | None = None) -> Obj:
    metadata = attachment["metadata"]
    return {
        "apiVersion": EA_API_VERSION,
        "kind": "EndpointAttachment",
        "name": metadata["name"],
        "uid": metadata["uid"],
        "controller": controller,
        "blockOwnerDeletion": controller if block is None else block,
    }


def rendered_body(attachment: Mapping[str, Any], claim: str = OWN_CLAIM) -> Obj:
    """The Service the operator renders for ``attachment``: named by the API server from the
    attachment's name, its controller reference, the diagnostic label, the substrate's claim
    annotation, the endpoint's selector and port."""
    name = attachment["metadata"]["name"]
    body = service_body(
        "",
        annotations={CLAIM_ANNOTATION: claim},
        labels={ATTACHMENT_LABEL: name},
        owner_references=[owner_reference(attachment, controller=True)],
        spec={"selector": ENDPOINT_SELECTOR},
    )
    del body["metadata"]["name"]
    body["metadata"]["generateName"] = f"{name}-"
    return body


async def driver_identity(kube: Kube, cluster: ClusterInfo, path: Path) -> Kube:
    """A client authenticated as the substrate's MetalLB driver (the identity the policy exempts for
    the pin; bound to cluster-admin, as ``hack/substrate.py`` runs it)."""
    return await Kube.connect(await driver_kubeconfig(kube, cluster.kubeconfig, path))


async def operator_identity(kube: Kube, cluster: ClusterInfo, path: Path) -> Kube:
    """A client authenticated as the operator's ServiceAccount, granted only what rendering takes."""
    await apply_all(
        kube,
        [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NAMESPACE}},
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": OPERATOR_SERVICE_ACCOUNT, "namespace": OPERATOR_NAMESPACE},
            },
        ],
    )
    await kube.apply(
        CLUSTER_ROLES.path(name=RENDERER_ROLE),
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": RENDERER_ROLE},
            "rules": RENDERER_RULES,
        },
        FIELD_MANAGER,
    )
    await kube.apply(
        CLUSTER_ROLE_BINDINGS.path(name=RENDERER_ROLE),
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": RENDERER_ROLE},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": RENDERER_ROLE,
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": OPERATOR_SERVICE_ACCOUNT, "namespace": OPERATOR_NAMESPACE}
            ],
        },
        FIELD_MANAGER,
    )
    return await as_service_account(
        kube, cluster, OPERATOR_SERVICE_ACCOUNT, path, what="the operator identity's RBAC"
    )


async def as_service_account(
    kube: Kube, cluster: ClusterInfo, account: str, path: Path, *, what: str
) -> Kube:
    """A client as ``account`` of the operator's namespace, once RBAC lets it list Services."""
    kubeconfig = await serviceaccount_kubeconfig(kube, cluster.kubeconfig, OPERATOR_NAMESPACE, account, path)
    client = await Kube.connect(kubeconfig)

    async def authorised() -> bool:
        return await refusal(client.list(SERVICES.path("default"))) is None

    await eventually(authorised, timeout=PROPAGATION_SECONDS, what=what)
    return client


async def render(w_operator: Kube, namespace: str, attachment: Mapping[str, Any]) -> str:
    """Render ``attachment``'s Service as the operator does; its generated name."""
    created = await w_operator.create(SERVICES.path(namespace), rendered_body(attachment))
    return str(created["metadata"]["name"])


async def tenant_identity(
    kube: Kube, cluster: ClusterInfo, namespace: str, identity: str, kubeconfig_path: Path
) -> Kube:
    """A ServiceAccount of the tenant's namespace bound to the tenant roles (and, for ``edit``, to a
    Role with edit's Service verbs); a client authenticated by its token."""
    await kube.create(
        SERVICE_ACCOUNTS.path(namespace),
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": TENANT_SA}},
    )
    subject = [{"kind": "ServiceAccount", "name": TENANT_SA, "namespace": namespace}]
    await kube.create(
        ROLE_BINDINGS.path(namespace),
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "tenant-endpointattachments"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": TENANT_EDIT_CLUSTER_ROLE,
            },
            "subjects": subject,
        },
    )
    if identity == WITH_EDIT:
        await kube.create(
            ROLES.path(namespace),
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": "services-edit"},
                "rules": [{"apiGroups": [""], "resources": ["services"], "verbs": SERVICE_EDIT_VERBS}],
            },
        )
        await kube.create(
            ROLE_BINDINGS.path(namespace),
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "services-edit"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "services-edit"},
                "subjects": subject,
            },
        )
    path = await serviceaccount_kubeconfig(kube, cluster.kubeconfig, namespace, TENANT_SA, kubeconfig_path)
    client = await Kube.connect(path)

    async def authorised() -> bool:
        if await refusal(client.list(ATTACHMENTS.path(namespace))) is not None:
            return False
        return identity != WITH_EDIT or await refusal(client.list(SERVICES.path(namespace))) is None

    await eventually(authorised, timeout=PROPAGATION_SECONDS, what=f"{identity} tenant's RBAC")
    return client


@dataclass
class TenantWorld:
    """One tenant: its namespace, client, attachment and the Service rendered for it."""

    identity: str
    namespace: str
    client: Kube
    attachment: Obj
    rendered: str


@dataclass
class World:
    """Everything a probe may aim at."""

    kube: Kube
    cluster: ClusterInfo
    operator: Kube
    victim_namespace: str
    victim_rendered: str
    tenants: dict[str, TenantWorld] = field(default_factory=dict)
    namespaces: list[str] = field(default_factory=list)


async def tenant_with_attachment(w_operator: Kube, kube: Kube, namespace: str) -> tuple[Obj, str]:
    """The application, the tenant's claim, its attachment and the Service rendered for it."""
    await app_with_endpoint(kube, namespace)
    await kube.create(
        CLAIMS.path(namespace),
        {"apiVersion": EA_API_VERSION, "kind": "IPAddressClaim", "metadata": {"name": OWN_CLAIM}, "spec": {}},
    )
    attachment = await attach(kube, namespace, OWN_ATTACHMENT)
    return attachment, await render(w_operator, namespace, attachment)


@contextlib.asynccontextmanager
async def admission_world(
    kube: Kube, cluster: ClusterInfo, tmp: Path, *, optional: bool = True
) -> AsyncIterator[World]:
    """The CRDs, the tenant roles, the policies (and the optional one), the operator's identity, a
    victim tenant with a rendered attachment, and one tenant per identity with one of its own."""
    directories = (POLICY_DIR, OPTIONAL_POLICY_DIR) if optional else (POLICY_DIR,)
    async with contextlib.AsyncExitStack() as stack:
        await apply_all(kube, [doc for path in CRD_FILES for doc in load(path)])
        await apply_all(kube, load(TENANT_ROLES_FILE))
        await stack.enter_async_context(policies_installed(cluster, *directories))
        as_operator = await operator_identity(kube, cluster, tmp / "operator.kubeconfig")

        tag = suffix()
        victim = f"adm-victim-{tag}"
        namespaces = [victim, *(f"adm-{identity}-{tag}" for identity in IDENTITIES)]
        for namespace in namespaces:
            await make_namespace(kube, namespace)
        stack.push_async_callback(delete_namespaces, kube, namespaces)
        # The policy is in force (the API server's informers have it).
        probe_attachment = {"metadata": {"name": "probe", "uid": "00000000-0000-0000-0000-000000000000"}}
        await until_refused_by_policy(
            dry_run_create(kube, victim, rendered_body(probe_attachment)),
            "the rendered-Services policy in force",
        )
        _, victim_rendered = await tenant_with_attachment(as_operator, kube, victim)
        world = World(kube, cluster, as_operator, victim, victim_rendered, namespaces=namespaces)
        for identity, namespace in zip(IDENTITIES, namespaces[1:], strict=True):
            client = await tenant_identity(kube, cluster, namespace, identity, tmp / f"{identity}.kubeconfig")
            await kube.create(SERVICES.path(namespace), service_body(PLAIN_SERVICE, type_="ClusterIP"))
            attachment, rendered = await tenant_with_attachment(as_operator, kube, namespace)
            world.tenants[identity] = TenantWorld(identity, namespace, client, attachment, rendered)
        if optional:
            edit = world.tenants[WITH_EDIT]
            await until_refused_by_policy(
                dry_run_create(
                    edit.client, edit.namespace, service_body("probe", labels={TENANT_RESOURCE_LABEL: "true"})
                ),
                "the optional lineage-labels policy in force",
            )
        yield world


@pytest.fixture(scope="module")
async def world(
    kube: Kube, cluster: ClusterInfo, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[World]:
    async with admission_world(kube, cluster, tmp_path_factory.mktemp("admission")) as built:
        yield built


# --- the probes ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    """One request a tenant makes; with ``edit`` it must be refused by the policy (or, where
    ``by_policy`` is False, by another admission plugin) with a message holding one of ``says``."""

    name: str
    request: Callable[[World, TenantWorld], Awaitable[Any]]
    says: tuple[str, ...]
    by_policy: bool = True


def _create(body: Callable[[World, TenantWorld], Obj]) -> Callable[[World, TenantWorld], Awaitable[Any]]:
    return lambda w, t: t.client.create(SERVICES.path(t.namespace), body(w, t))


def _own(t: TenantWorld) -> str:
    return SERVICES.path(t.namespace, t.rendered)


async def _replace_without_owner(w: World, t: TenantWorld) -> Obj:
    current = await t.client.get(_own(t))
    assert current is not None
    current["metadata"].pop("ownerReferences", None)
    return await t.client.replace(_own(t), current)


CHANGES: Final = "only the EndpointAttachment operator changes it"
STRIPS: Final = "this change removes its owner reference to the attachment"
DELETES: Final = "only the EndpointAttachment operator deletes it"
FORGES: Final = "would carry an owner reference to EndpointAttachment"
PLATFORM_LABEL: Final = "is written by the Cozystack platform only"

PROBES: Final = (
    # The tenant's own rendered Service: any change, in every update form.
    Probe(
        "rendered-external-ips",
        lambda w, t: t.client.patch(_own(t), {"spec": {"externalIPs": ["203.0.113.9"]}}, "merge"),
        (CHANGES,),
    ),
    Probe(
        "rendered-selector-to-internal-pods",
        lambda w, t: t.client.patch(_own(t), {"spec": {"selector": INTERNAL_SELECTOR}}, "merge"),
        (CHANGES,),
    ),
    Probe(
        "rendered-wears-another-claim",
        lambda w, t: t.client.patch(
            _own(t), {"metadata": {"annotations": {CLAIM_ANNOTATION: "someone-elses-ip"}}}, "merge"
        ),
        (CHANGES,),
    ),
    Probe(
        "rendered-pin-and-selector",
        lambda w, t: t.client.patch(
            _own(t),
            {
                "metadata": {"annotations": {METALLB_IPS_ANNOTATION: PINNED}},
                "spec": {"selector": INTERNAL_SELECTOR},
            },
            "merge",
        ),
        (CHANGES,),
    ),
    Probe(
        "rendered-pin-only",
        lambda w, t: t.client.patch(
            _own(t),
            {"metadata": {"annotations": {METALLB_IPS_ANNOTATION: PINNED, PINNED_MARKER: "true"}}},
            "merge",
        ),
        (CHANGES,),
    ),
    Probe(
        "rendered-strip-owner-reference-json-patch",
        lambda w, t: t.client.patch(_own(t), [{"op": "remove", "path": "/metadata/ownerReferences"}], "json"),
        (STRIPS,),
    ),
    Probe(
        "rendered-strip-owner-reference-merge-patch",
        lambda w, t: t.client.patch(_own(t), {"metadata": {"ownerReferences": None}}, "merge"),
        (STRIPS,),
    ),
    Probe("rendered-strip-owner-reference-replace", _replace_without_owner, (STRIPS,)),
    Probe(
        "rendered-server-side-apply",
        lambda w, t: t.client.apply(
            _own(t),
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": t.rendered, "namespace": t.namespace},
                "spec": {"externalIPs": ["203.0.113.9"]},
            },
            FIELD_MANAGER,
        ),
        (CHANGES,),
    ),
    Probe(
        "rendered-strip-diagnostic-label",
        lambda w, t: t.client.patch(
            _own(t),
            [{"op": "remove", "path": "/metadata/labels/" + ATTACHMENT_LABEL.replace("/", "~1")}],
            "json",
        ),
        (CHANGES,),
    ),
    Probe("rendered-delete", lambda w, t: t.client.delete(_own(t)), (DELETES,)),
    # Dressing up a Service of one's own as a rendered one.
    Probe(
        "forge-owner-reference",
        _create(
            lambda w, t: service_body(
                "forged", owner_references=[owner_reference(t.attachment, controller=False)]
            )
        ),
        (FORGES,),
    ),
    Probe(
        "forge-controller-owner-reference",
        _create(
            lambda w, t: service_body(
                "forged", owner_references=[owner_reference(t.attachment, controller=True, block=False)]
            )
        ),
        (FORGES,),
    ),
    Probe(
        "forge-controller-owner-reference-blocking-deletion",
        _create(
            lambda w, t: service_body(
                "forged", owner_references=[owner_reference(t.attachment, controller=True)]
            )
        ),
        # OwnerReferencesPermissionEnforcement refuses blockOwnerDeletion before any policy is asked.
        ("cannot set blockOwnerDeletion",),
        by_policy=False,
    ),
    Probe(
        "add-owner-reference-to-own-service",
        lambda w, t: t.client.patch(
            SERVICES.path(t.namespace, PLAIN_SERVICE),
            {"metadata": {"ownerReferences": [owner_reference(t.attachment, controller=False)]}},
            "merge",
        ),
        (FORGES,),
    ),
    # The platform's labels (the optional policy): a Service selecting the app's internal pods.
    Probe(
        "forge-lineage-labels-on-service-selecting-internal-pods",
        _create(
            lambda w, t: service_body(
                "replication-public",
                type_="ClusterIP",
                labels=lineage_labels(name=APP, tenant_facing=True),
                spec={"selector": INTERNAL_SELECTOR},
            )
        ),
        (PLATFORM_LABEL,),
    ),
    Probe(
        "add-tenantresource-label-to-internal-service",
        lambda w, t: t.client.patch(
            SERVICES.path(t.namespace, INTERNAL_SERVICE),
            {"metadata": {"labels": {TENANT_RESOURCE_LABEL: "true"}}},
            "merge",
        ),
        (PLATFORM_LABEL,),
    ),
)


async def snapshot(w: World) -> dict[str, str]:
    """The resourceVersion of every rendered Service and attachment a probe might aim at."""
    seen: dict[str, str] = {}
    targets = [
        (w.victim_namespace, w.victim_rendered),
        *((t.namespace, t.rendered) for t in w.tenants.values()),
    ]
    for namespace, rendered in targets:
        for path in (SERVICES.path(namespace, rendered), ATTACHMENTS.path(namespace, OWN_ATTACHMENT)):
            obj = await w.kube.get(path)
            assert obj is not None, path
            seen[path] = obj["metadata"]["resourceVersion"]
    return seen


async def run_probe(w: World, identity: str, probe: Probe) -> ApiError:
    """Run a probe as the tenant; it must be refused, and nothing it aimed at may change."""
    t = w.tenants[identity]
    before = await snapshot(w)
    error = await refusal(probe.request(w, t))
    assert error is not None, f"{probe.name}: accepted for the {identity} tenant"
    assert error.status == 403, f"{probe.name}: {error}"
    assert await snapshot(w) == before, f"{probe.name} changed what it aimed at"
    return error


@pytest.mark.parametrize("probe", PROBES, ids=[p.name for p in PROBES])
@pytest.mark.parametrize("identity", IDENTITIES)
async def test_probe_is_refused_with_a_reason(world: World, identity: str, probe: Probe) -> None:
    error = await run_probe(world, identity, probe)
    text = str(error)
    if identity == TENANT_ROLES_ONLY:
        # The tenant roles grant no Service verb at all: RBAC refuses before any policy is asked.
        assert "cannot" in text, text
        assert "services" in text, text
        return
    assert (POLICY_REFUSAL in text) == probe.by_policy, text
    assert any(fragment in text for fragment in probe.says), (
        f"{probe.name}: expected one of {probe.says}:\n{text}"
    )
    # Written for a person: no CEL, no raw expression.
    for cel in ("variables.", "object.", "params."):
        assert cel not in text, text
    assert len(text) < 1500, f"{probe.name}: a message that long echoes the request"


# --- what must keep working ------------------------------------------------------------------------


async def test_the_operator_renders_changes_and_deletes_under_the_policy(world: World) -> None:
    """The operator's identity (exempted) renders a Service, follows the endpoint (selector, ports),
    touches its own annotation, and withdraws it."""
    t = world.tenants[WITH_EDIT]
    name = await render(world.operator, t.namespace, t.attachment)
    path = SERVICES.path(t.namespace, name)
    await world.operator.patch(
        path,
        {
            "metadata": {"annotations": {"local.sdn.cozystack.io/reprogram": "1"}},
            "spec": {
                "ports": [
                    {"name": "postgres", "port": 5432, "protocol": "TCP"},
                    {"name": "metrics", "port": 9187, "protocol": "TCP"},
                ]
            },
        },
        "merge",
    )
    await world.operator.delete(path)
    await wait_for_object(
        world.kube, SERVICES, name, lambda s: s is None, namespace=t.namespace, timeout=CLEANUP_SECONDS
    )


async def test_the_substrates_driver_pins_a_rendered_service(world: World, tmp_path: Path) -> None:
    """The substrate's MetalLB driver pins a claim's address as the real one does: one plain Update
    adding the load balancer's address annotation and its marker; it passes, and so does its unpin.
    Nothing else of the driver's passes, and nobody else may pin: an administrator is refused like
    anyone (a tenant's pin is a probe above)."""
    t = world.tenants[WITH_EDIT]
    path = _own(t)
    driver = await driver_identity(world.kube, world.cluster, tmp_path / "driver.kubeconfig")
    service = await world.kube.get(path)
    assert service is not None
    annotations = {
        **service["metadata"]["annotations"],
        METALLB_IPS_ANNOTATION: PINNED,
        PINNED_MARKER: "true",
    }
    pinned = await driver.replace(
        path, {**service, "metadata": {**service["metadata"], "annotations": annotations}}
    )
    assert pinned["metadata"]["annotations"][METALLB_IPS_ANNOTATION] == PINNED
    unpinned = await driver.patch(
        path, {"metadata": {"annotations": {METALLB_IPS_ANNOTATION: None, PINNED_MARKER: None}}}, "merge"
    )
    assert METALLB_IPS_ANNOTATION not in (unpinned["metadata"].get("annotations") or {})
    for who, client, change in (
        ("the driver", driver, {"spec": {"externalIPs": ["203.0.113.9"]}}),
        ("the driver", driver, {"metadata": {"annotations": {CLAIM_ANNOTATION: "someone-elses-ip"}}}),
        ("an administrator", world.kube, {"metadata": {"annotations": {METALLB_IPS_ANNOTATION: PINNED}}}),
    ):
        refused = await refusal(client.patch(path, change, "merge"))
        assert refused is not None, f"{who}: {change} accepted"
        assert CHANGES in str(refused), refused


# A driver run under another identity, and the policy's name (what a kustomize overlay targets).
OTHER_DRIVER_SERVICE_ACCOUNT: Final = "another-driver"
OTHER_DRIVER_USERNAME: Final = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OTHER_DRIVER_SERVICE_ACCOUNT}"
RENDERED_POLICY: Final = "cozystack-endpointattachment-rendered-services"


async def other_driver_identity(kube: Kube, cluster: ClusterInfo, path: Path) -> Kube:
    """A client as another ServiceAccount that may write Services (a driver installed elsewhere)."""
    await apply_all(
        kube,
        [
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": OTHER_DRIVER_SERVICE_ACCOUNT, "namespace": OPERATOR_NAMESPACE},
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": f"{RENDERER_ROLE}-{OTHER_DRIVER_SERVICE_ACCOUNT}"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": RENDERER_ROLE,
                },
                "subjects": [
                    {
                        "kind": "ServiceAccount",
                        "name": OTHER_DRIVER_SERVICE_ACCOUNT,
                        "namespace": OPERATOR_NAMESPACE,
                    }
                ],
            },
        ],
    )
    return await as_service_account(
        kube, cluster, OTHER_DRIVER_SERVICE_ACCOUNT, path, what="the other driver's RBAC"
    )


async def test_the_drivers_identity_is_a_setting(world: World, tmp_path: Path) -> None:
    """A platform running the substrate's driver under another ServiceAccount names it as
    docs/hosters/admission.md shows: a kustomize overlay replacing the policy's first variable,
    applied with ``kubectl apply -k``. That identity may then pin a rendered Service and the default
    driver's may not; the shipped policy is put back after."""
    t = world.tenants[WITH_EDIT]
    path = _own(t)
    default_driver = await driver_identity(world.kube, world.cluster, tmp_path / "driver.kubeconfig")
    other = await other_driver_identity(world.kube, world.cluster, tmp_path / "other.kubeconfig")
    pin = {"metadata": {"annotations": {METALLB_IPS_ANNOTATION: PINNED, PINNED_MARKER: "true"}}}

    def pins(client: Kube) -> Awaitable[Obj]:
        return client.request(
            "PATCH", path, body=pin, params={"dryRun": "All"}, content_type="application/merge-patch+json"
        )

    overlay = tmp_path / "overlay"
    overlay.mkdir()
    replace = [
        {
            "op": "replace",
            "path": "/spec/variables/0/expression",
            "value": f"request.userInfo.username == '{OTHER_DRIVER_USERNAME}'",
        }
    ]
    kustomization = {
        "resources": [os.path.relpath(ROOT / POLICY_DIR, overlay)],
        "patches": [
            {
                "target": {"kind": "ValidatingAdmissionPolicy", "name": RENDERED_POLICY},
                "patch": yaml.safe_dump(replace),
            }
        ],
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    try:
        code, out, err = await kubectl(world.cluster, "apply", "-k", str(overlay))
        assert code == 0, f"{out}\n{err}"
        await until_refused_by_policy(lambda: pins(default_driver), "the default driver no longer exempted")
        assert await refusal(pins(other)) is None, "the driver named by the setting pins"
        claim = {"metadata": {"annotations": {CLAIM_ANNOTATION: "someone-elses-ip"}}}
        refused = await refusal(other.patch(path, claim, "merge"))
        assert refused is not None, "the setting exempts the pin only"
        assert CHANGES in str(refused), refused
    finally:
        code, out, err = await kubectl(world.cluster, "apply", "-k", POLICY_DIR)
        assert code == 0, f"{out}\n{err}"

        async def restored() -> bool:
            return await refusal(pins(default_driver)) is None

        await eventually(restored, timeout=PROPAGATION_SECONDS, what="the shipped policy back")


async def test_tenants_ordinary_services_pass(world: World) -> None:
    """With edit, a tenant still creates, changes and deletes its own Services, load balancers
    included: wearing its own claim (the substrate's business), or carrying the diagnostic label
    (which marks nothing)."""
    t = world.tenants[WITH_EDIT]
    path = SERVICES.path(t.namespace)
    await t.client.create(path, service_body("web"))
    await t.client.create(path, service_body("own-claim", annotations={CLAIM_ANNOTATION: OWN_CLAIM}))
    await t.client.create(path, service_body("labelled", labels={ATTACHMENT_LABEL: OWN_ATTACHMENT}))
    await t.client.patch(
        SERVICES.path(t.namespace, "web"), {"metadata": {"annotations": {"note": "x"}}}, "merge"
    )
    # Annotating a Service the platform labelled is fine: its labels stay as they were.
    await t.client.patch(
        SERVICES.path(t.namespace, ENDPOINT), {"metadata": {"annotations": {"note": "x"}}}, "merge"
    )
    for name in ("web", "own-claim", "labelled"):
        await t.client.delete(SERVICES.path(t.namespace, name))


async def test_the_platforms_own_services_pass(
    world: World, kube: Kube, cluster: ClusterInfo, tmp_path: Path
) -> None:
    """A chart's Service with lineage labels, as the platform makes it: by an administrator, and by a
    ServiceAccount of a cozy-* namespace (where Cozystack's controllers run), created and relabelled."""
    t = world.tenants[WITH_EDIT]
    chart = service_body(
        "chart-svc", type_="ClusterIP", labels=lineage_labels(name="other", tenant_facing=True)
    )
    created = await kube.create(SERVICES.path(t.namespace), chart)
    assert created["metadata"]["labels"][TENANT_RESOURCE_LABEL] == "true"
    platform_ns = f"cozy-adm-platform-{suffix()}"
    await make_namespace(kube, platform_ns)
    try:
        await kube.create(
            SERVICE_ACCOUNTS.path(platform_ns),
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "helm-controller"}},
        )
        await kube.create(
            ROLES.path(t.namespace),
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": "platform-services"},
                "rules": [{"apiGroups": [""], "resources": ["services"], "verbs": SERVICE_EDIT_VERBS}],
            },
        )
        await kube.create(
            ROLE_BINDINGS.path(t.namespace),
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "platform-services"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "platform-services",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "helm-controller", "namespace": platform_ns}],
            },
        )
        path = await serviceaccount_kubeconfig(
            kube, cluster.kubeconfig, platform_ns, "helm-controller", tmp_path / "platform.kubeconfig"
        )
        platform = await Kube.connect(path)

        async def may_write() -> bool:
            return await refusal(platform.list(SERVICES.path(t.namespace))) is None

        await eventually(may_write, timeout=PROPAGATION_SECONDS, what="the platform identity's RBAC")
        body = service_body(
            "chart-svc-2", type_="ClusterIP", labels=lineage_labels(name="other", tenant_facing=False)
        )
        await platform.create(SERVICES.path(t.namespace), body)
        await platform.patch(
            SERVICES.path(t.namespace, "chart-svc-2"),
            {"metadata": {"labels": {TENANT_RESOURCE_LABEL: "true"}}},
            "merge",
        )
        await platform.delete(SERVICES.path(t.namespace, "chart-svc-2"))
    finally:
        await kube.delete(SERVICES.path(t.namespace, "chart-svc"))
        await delete_namespace(kube, platform_ns)


async def rendered_for_gone_attachment(world: World, namespace: str, name: str) -> str:
    """An attachment made and deleted, then a Service rendered for it exactly as the operator renders
    one, with the operator's own credentials: what is left when a Service outlives its attachment."""
    attachment = await attach(world.kube, namespace, name)
    await world.kube.delete(ATTACHMENTS.path(namespace, name))
    await wait_for_object(
        world.kube, ATTACHMENTS, name, lambda o: o is None, namespace=namespace, timeout=CLEANUP_SECONDS
    )
    return await render(world.operator, namespace, attachment)


async def test_garbage_collector_still_deletes_a_rendered_service(world: World) -> None:
    """The garbage collector deletes a rendered Service whose attachment is gone (the policy refuses
    that deletion to everyone else)."""
    namespace = world.victim_namespace
    name = await rendered_for_gone_attachment(world, namespace, "gc")
    # Not even an administrator may delete it (404: the garbage collector was quicker).
    refused = await refusal(world.kube.delete(SERVICES.path(namespace, name)))
    assert refused is not None
    assert refused.status in (403, 404), refused
    await wait_for_object(
        world.kube,
        SERVICES,
        name,
        lambda s: s is None,
        namespace=namespace,
        timeout=CLEANUP_SECONDS,
        what="the garbage collector's deletion of the rendered Service",
    )


@pytest.mark.parametrize("propagation", ["Foreground", "Background"])
async def test_deleting_an_attachment_takes_its_rendered_service(world: World, propagation: str) -> None:
    """The tenant deletes its own attachment (the tenant roles allow it): the garbage collector's
    deletion of the rendered Service passes the policy, in either cascade. (Orphaning,
    ``--cascade=orphan``, is refused to the garbage collector: the operator withdraws its Service
    itself, which needs the operator running.)"""
    t = world.tenants[TENANT_ROLES_ONLY]
    name = f"cascade-{propagation.lower()}"
    attachment = await attach(world.kube, t.namespace, name)
    rendered = await render(world.operator, t.namespace, attachment)
    await t.client.delete(ATTACHMENTS.path(t.namespace, name), propagation=propagation)
    for resource, gone in ((ATTACHMENTS, name), (SERVICES, rendered)):
        await wait_for_object(
            world.kube,
            resource,
            gone,
            lambda o: o is None,
            namespace=t.namespace,
            timeout=CLEANUP_SECONDS,
            what=f"{gone} gone after deleting the attachment with propagation {propagation}",
        )


async def test_namespace_deletion_still_completes(world: World) -> None:
    """A tenant namespace with an attachment, its rendered Service, and a rendered Service left by a
    gone attachment is deleted whole: the namespace controller's deletions pass."""
    namespace = f"adm-doomed-{suffix()}"
    await make_namespace(world.kube, namespace)
    try:
        await tenant_with_attachment(world.operator, world.kube, namespace)
        await rendered_for_gone_attachment(world, namespace, "left")
    finally:
        await delete_namespace(world.kube, namespace, wait=True)
