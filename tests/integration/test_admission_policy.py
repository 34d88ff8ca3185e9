"""The admission policies of config/admission/endpointattachment on the local control plane: a tenant
ServiceAccount cannot reach another tenant's address through a Service, nor touch the Services the
operator renders, while the operator, the platform and Kubernetes' own clean-up keep working.

Each probe runs twice: as a tenant bound to the project's tenant roles only (Service writes are then
refused by RBAC already), and as a tenant that may also write Services in its namespace, as
Kubernetes' ``edit`` role allows (here a Role granting exactly the Service verbs ``edit`` has; the
local control plane does not aggregate the built-in roles). With ``edit``, every probe must be refused
by one of the policies with a message that says why, and nothing the probe aimed at may change.

The operator runs as a subprocess under its own ServiceAccount (exempted by the policies), MetalLB's
real controller answers its Services, and the garbage collector and namespace controller of the
real kube-controller-manager (running with --use-service-account-credentials) do the clean-up.
The helpers here are shared with ``test_tenant_probes.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pytest

from hack.devcluster import ClusterInfo
from operators.endpointattachment.constants import (
    ATTACHMENT_LABEL,
    CILIUM_IPS_ANNOTATION,
    METALLB_IPS_ANNOTATION,
    METALLB_POOL_ANNOTATION,
)
from operators.endpointattachment.render import ClassSettings, render_service
from shared.kube import ApiError, Kube, Obj
from shared.lineage import TENANT_RESOURCE_LABEL
from shared.resources import (
    HELMRELEASES,
    NAMESPACES,
    ROLE_BINDINGS,
    ROLES,
    SERVICE_ACCOUNTS,
    SERVICES,
    Resource,
)
from tests.ea_builders import (
    for_create,
    lineage_labels,
    make_attachment,
    make_class,
    make_helmrelease,
    make_service,
)
from tests.support.ea_cluster import (
    ALLOCATIONS,
    ATTACHMENTS,
    CLASSES,
    OPERATOR_NAMESPACE,
    OPERATOR_SERVICE_ACCOUNT,
    condition,
    ea_crds_and_node,
    ea_operator,
    operator_kubeconfig,
)
from tests.support.identity import serviceaccount_kubeconfig
from tests.support.loadbalancer import load_balancer
from tests.support.manifests import apply_all, load
from tests.support.operators import RunningOperator
from tests.support.waiting import eventually, wait_for_object

POLICY_DIR: Final = "config/admission/endpointattachment"
OPTIONAL_POLICY_DIR: Final = f"{POLICY_DIR}/optional"
TENANT_ROLES_FILE: Final = "config/rbac/endpointattachment/tenant_roles.yaml"
TENANT_EDIT_CLUSTER_ROLE: Final = "cozystack:endpointattachment-edit"
POLICIES: Final = Resource("admissionregistration.k8s.io/v1", "validatingadmissionpolicies", namespaced=False)
# Every policy message comes through the API server with this prefix: the refusal is the policy's.
POLICY_REFUSAL: Final = "ValidatingAdmissionPolicy"
KUBECTL_TIMEOUT: Final = 120.0
# The RBAC authorizer and the policies' informers learn of new objects shortly after they are made.
PROPAGATION_SECONDS: Final = 60.0
PUBLISH_SECONDS: Final = 60.0
CLEANUP_SECONDS: Final = 90.0

# Two classes whose pools the policy must know: IPv4 (MetalLB, a CIDR and a range, a named pool) and
# IPv6 (Cilium's annotation, a CIDR and a range). Addresses nobody else in the suite uses.
CLASS_V4: Final = "adm-v4"
CLASS_V4_CIDR: Final = "100.64.40.0/28"
CLASS_V4_RANGE: Final = {"start": "100.64.41.10", "end": "100.64.41.20"}
CLASS_V4_POOL: Final = "adm-v4-pool"
CLASS_V6: Final = "adm-v6"
CLASS_V6_CIDR: Final = "2001:db8:ad::/124"
CLASS_V6_RANGE: Final = {"start": "2001:db8:ae::10", "end": "2001:db8:ae::20"}
# A class made after a Service already asked for one of its addresses.
LEGACY_CLASS: Final = "adm-legacy"
LEGACY_CLASS_CIDR: Final = "100.64.43.0/29"
# An address in no class: a tenant may ask for it (whether a load balancer gives it is its business).
OUTSIDE_EVERY_CLASS: Final = "100.127.255.1"

# The tenant identities of the two runs.
TENANT_ROLES_ONLY: Final = "tenant-roles"
WITH_EDIT: Final = "edit"
IDENTITIES: Final = (TENANT_ROLES_ONLY, WITH_EDIT)
TENANT_SA: Final = "tenant"
# What Kubernetes' edit role lets a namespace's users do with Services (services/status is not in it).
SERVICE_EDIT_VERBS: Final = ["get", "list", "watch", "create", "update", "patch", "delete"]
# The tenant's published attachment, and its application.
OWN_ATTACHMENT: Final = "own"
OWN_SERVICE: Final = f"ea-{OWN_ATTACHMENT}"
APP: Final = "db"
ENDPOINT: Final = "postgres-db-rw"
INTERNAL_SERVICE: Final = "postgres-db-replication"
INTERNAL_SELECTOR: Final = {"app": "db", "role": "replica"}
# A Service of the tenant's own, without any address (made by the platform, so both runs have it).
PLAIN_SERVICE: Final = "plain"
FIELD_MANAGER: Final = "tenant-probe"


def suffix() -> str:
    return secrets.token_hex(3)


# --- the cluster pieces ---------------------------------------------------------------------------


async def kubectl(cluster: ClusterInfo, *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        cluster.kubectl,
        "--kubeconfig",
        cluster.kubeconfig,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout=KUBECTL_TIMEOUT)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError(f"kubectl {' '.join(args)} took over {KUBECTL_TIMEOUT}s") from None
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@contextlib.asynccontextmanager
async def policies_installed(cluster: ClusterInfo, *directories: str) -> AsyncIterator[None]:
    """``kubectl apply -k`` each directory (as a hoster would); deleted again on the way out, so the
    rest of the suite runs without them."""
    try:
        for directory in directories:
            code, out, err = await kubectl(cluster, "apply", "-k", directory)
            assert code == 0, f"kubectl apply -k {directory}:\n{out}\n{err}"
        yield
    finally:
        for directory in reversed(directories):
            await kubectl(cluster, "delete", "--ignore-not-found", "-k", directory)


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
    release = for_create(
        make_helmrelease(f"postgres-{APP}", namespace, labels=lineage_labels(name=APP, tenant_facing=False))
    )
    await kube.create(HELMRELEASES.path(namespace), release)
    for name, selector, tenant_facing in (
        (ENDPOINT, {"app": "db", "role": "primary"}, True),
        (INTERNAL_SERVICE, INTERNAL_SELECTOR, False),
    ):
        body = for_create(
            make_service(
                name,
                namespace,
                labels=lineage_labels(name=APP, tenant_facing=tenant_facing),
                selector=selector,
            )
        )
        await kube.create(SERVICES.path(namespace), body)


async def attach(kube: Kube, namespace: str, name: str, *, class_name: str = CLASS_V4) -> Obj:
    built = make_attachment(name, namespace, endpoint=ENDPOINT, class_name=class_name, owner_uid=None)
    return await kube.create(ATTACHMENTS.path(namespace), for_create(built))


async def attachment_condition(
    kube: Kube,
    namespace: str,
    name: str,
    type_: str,
    wanted: tuple[str, str],
    *,
    timeout: float = PUBLISH_SECONDS,
    operator: RunningOperator | None = None,
) -> Obj:
    """The attachment once its condition ``type_`` is ``wanted`` (status, reason). Polled, so a
    transient answer (a CRD's storage re-initialising under load answers 429) is only a late one."""
    last: Obj | None = None

    async def reached() -> Obj | None:
        nonlocal last
        try:
            last = await kube.get(ATTACHMENTS.path(namespace, name))
        except ApiError as error:
            if error.transient:
                return None
            raise
        return last if condition(last, type_) == wanted else None

    try:
        return await eventually(reached, timeout=timeout, what=f"{namespace}/{name}: {type_} {wanted}")
    except AssertionError as error:
        tail = f"\noperator log:\n{operator.log_tail()}" if operator else ""
        raise AssertionError(f"{error}\nlast seen: {last}{tail}") from None


async def published(kube: Kube, namespace: str, name: str, operator: RunningOperator) -> Obj:
    return await attachment_condition(
        kube, namespace, name, "Ready", ("True", "Published"), operator=operator
    )


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
    """One tenant: its namespace, client, published attachment and address."""

    identity: str
    namespace: str
    client: Kube
    attachment: Obj
    address: str


@dataclass
class World:
    """Everything a probe may aim at."""

    kube: Kube
    cluster: ClusterInfo
    operator: RunningOperator
    victim_namespace: str
    victim_address: str
    tenants: dict[str, TenantWorld] = field(default_factory=dict)
    namespaces: list[str] = field(default_factory=list)

    def free_pool_address(self) -> str:
        """An address of the IPv4 class's CIDR no attachment here holds: the pool would mint it later."""
        taken = {self.victim_address, *(t.address for t in self.tenants.values())}
        hosts = [str(a) for a in ipaddress.ip_network(CLASS_V4_CIDR).hosts()]
        return next(a for a in reversed(hosts) if a not in taken)


@contextlib.asynccontextmanager
async def admission_world(
    kube: Kube, cluster: ClusterInfo, tmp: Path, *, optional: bool = True
) -> AsyncIterator[World]:
    """The CRDs, the tenant roles, two classes, the policies (and the optional one), MetalLB, the
    operator under its ServiceAccount, a victim tenant with a published attachment, and one tenant
    per identity with a published attachment of its own."""
    directories = (POLICY_DIR, OPTIONAL_POLICY_DIR) if optional else (POLICY_DIR,)
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(ea_crds_and_node(kube))
        await apply_all(kube, load(TENANT_ROLES_FILE))
        classes = (
            make_class(CLASS_V4, cidrs=[CLASS_V4_CIDR], ranges=[CLASS_V4_RANGE], metallb_pool=CLASS_V4_POOL),
            make_class(CLASS_V6, cidrs=[CLASS_V6_CIDR], ranges=[CLASS_V6_RANGE], provider="CiliumLBIPAM"),
        )
        for address_class in classes:
            await kube.create(CLASSES.path(), for_create(address_class))
            stack.push_async_callback(kube.delete, CLASSES.path(name=address_class["metadata"]["name"]))
        await stack.enter_async_context(policies_installed(cluster, *directories))
        await stack.enter_async_context(load_balancer(kube))
        kubeconfig = await operator_kubeconfig(kube, cluster, tmp / "operator.kubeconfig")
        operator = await stack.enter_async_context(ea_operator(kube, cluster, tmp, kubeconfig=kubeconfig))

        tag = suffix()
        victim = f"adm-victim-{tag}"
        namespaces = [victim, *(f"adm-{identity}-{tag}" for identity in IDENTITIES)]
        for namespace in namespaces:
            await make_namespace(kube, namespace)
        # Deleted while the operator still runs, so its finalizers come off.
        stack.push_async_callback(delete_namespaces, kube, namespaces)
        # Every policy is in force (the API server's informers have them, and both classes).
        await until_refused_by_policy(
            dry_run_create(kube, victim, service_body("probe", labels={ATTACHMENT_LABEL: "x"})),
            "the rendered-Services policy in force",
        )
        for address, class_name in ((CLASS_V4_RANGE["end"], CLASS_V4), (CLASS_V6_RANGE["end"], CLASS_V6)):
            body = service_body("probe", annotations={METALLB_IPS_ANNOTATION: address})
            await until_refused_by_policy(
                dry_run_create(kube, victim, body), f"the address policy knowing class {class_name}"
            )

        await app_with_endpoint(kube, victim)
        await attach(kube, victim, "site")
        victim_attachment = await published(kube, victim, "site", operator)
        world = World(
            kube, cluster, operator, victim, victim_attachment["status"]["address"], namespaces=namespaces
        )
        for identity, namespace in zip(IDENTITIES, namespaces[1:], strict=True):
            client = await tenant_identity(kube, cluster, namespace, identity, tmp / f"{identity}.kubeconfig")
            await app_with_endpoint(kube, namespace)
            await kube.create(SERVICES.path(namespace), service_body(PLAIN_SERVICE, type_="ClusterIP"))
            await attach(kube, namespace, OWN_ATTACHMENT)
            own = await published(kube, namespace, OWN_ATTACHMENT, operator)
            world.tenants[identity] = TenantWorld(identity, namespace, client, own, own["status"]["address"])
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
    """One request a tenant makes; with ``edit`` it must be refused by a policy (or, where
    ``by_policy`` is False, by another admission plugin) with a message holding one of ``says``
    (``{victim}`` stands for the other tenant's address)."""

    name: str
    request: Callable[[World, TenantWorld], Awaitable[Any]]
    says: tuple[str, ...]
    by_policy: bool = True


def _create(body: Callable[[World, TenantWorld], Obj]) -> Callable[[World, TenantWorld], Awaitable[Any]]:
    return lambda w, t: t.client.create(SERVICES.path(t.namespace), body(w, t))


def _own(t: TenantWorld) -> str:
    return SERVICES.path(t.namespace, OWN_SERVICE)


def _owner(t: TenantWorld, *, controller: bool) -> dict[str, Any]:
    metadata = t.attachment["metadata"]
    return {
        "apiVersion": "local.sdn.cozystack.io/v1alpha1",
        "kind": "EndpointAttachment",
        "name": metadata["name"],
        "uid": metadata["uid"],
        "controller": controller,
        "blockOwnerDeletion": controller,
    }


async def _replace_without_owner(w: World, t: TenantWorld) -> Obj:
    current = await t.client.get(_own(t))
    assert current is not None
    current["metadata"].pop("ownerReferences", None)
    return await t.client.replace(_own(t), current)


ASKS: Final = "an address of IPAddressClass"
CHANGES: Final = "only the EndpointAttachment operator changes it"
STRIPS: Final = "this change removes its owner reference"
FORGES_LABEL: Final = f"would carry the label {ATTACHMENT_LABEL}"
FORGES_OWNER: Final = "would carry an owner reference to EndpointAttachment"
PLATFORM_LABEL: Final = "is written by the Cozystack platform only"

PROBES: Final = (
    # Another tenant's published address, by MetalLB's annotation (both names) or spec.loadBalancerIP.
    Probe(
        "lb-annotation-other-tenants-address",
        _create(lambda w, t: service_body("grab", annotations={METALLB_IPS_ANNOTATION: w.victim_address})),
        (f"asks for {{victim}} in the annotation {METALLB_IPS_ANNOTATION}, {ASKS} {CLASS_V4}",),
    ),
    Probe(
        "lb-old-annotation-other-tenants-address",
        _create(
            lambda w, t: service_body(
                "grab",
                annotations={
                    "metallb.universe.tf/loadBalancerIPs": f"{OUTSIDE_EVERY_CLASS}, {w.victim_address}"
                },
            )
        ),
        (f"asks for {{victim}} in the annotation metallb.universe.tf/loadBalancerIPs, {ASKS} {CLASS_V4}",),
    ),
    Probe(
        "lb-spec-loadbalancerip-other-tenants-address",
        _create(lambda w, t: service_body("grab", spec={"loadBalancerIP": w.victim_address})),
        (f"asks for {{victim}} in spec.loadBalancerIP, {ASKS} {CLASS_V4}",),
    ),
    # A pool address nobody holds yet (the pool would mint it to someone else), CIDR and range.
    Probe(
        "lb-annotation-free-pool-address",
        _create(
            lambda w, t: service_body("grab", annotations={METALLB_IPS_ANNOTATION: w.free_pool_address()})
        ),
        (f"{ASKS} {CLASS_V4}",),
    ),
    Probe(
        "lb-annotation-range-address",
        _create(lambda w, t: service_body("grab", annotations={METALLB_IPS_ANNOTATION: "100.64.41.15"})),
        (f"asks for 100.64.41.15 in the annotation {METALLB_IPS_ANNOTATION}, {ASKS} {CLASS_V4}",),
    ),
    Probe(
        "lb-cilium-annotation-ipv6-range-address-uppercase",
        _create(lambda w, t: service_body("grab", annotations={CILIUM_IPS_ANNOTATION: "2001:DB8:AE:0::15"})),
        (f"in the annotation {CILIUM_IPS_ANNOTATION}, {ASKS} {CLASS_V6}",),
    ),
    Probe(
        "lb-annotation-ipv4-mapped-ipv6",
        _create(
            lambda w, t: service_body(
                "grab", annotations={METALLB_IPS_ANNOTATION: f"::ffff:{w.victim_address}"}
            )
        ),
        ("which is not a plain IP address",),
    ),
    Probe(
        "lb-annotation-huge-list",
        _create(
            lambda w, t: service_body(
                "grab", annotations={METALLB_IPS_ANNOTATION: ",".join([OUTSIDE_EVERY_CLASS] * 10000)}
            )
        ),
        ("asks for more addresses than any Service needs",),
    ),
    Probe(
        "lb-metallb-pool-annotation",
        _create(lambda w, t: service_body("grab", annotations={METALLB_POOL_ANNOTATION: CLASS_V4_POOL})),
        (f"names the MetalLB pool {CLASS_V4_POOL}",),
    ),
    Probe(
        "external-ips-other-tenants-address",
        _create(
            lambda w, t: service_body("grab", type_="ClusterIP", spec={"externalIPs": [w.victim_address]})
        ),
        (f"asks for {{victim}} in spec.externalIPs, {ASKS} {CLASS_V4}",),
    ),
    Probe(
        "own-service-updated-to-ask-for-other-tenants-address",
        lambda w, t: t.client.patch(
            SERVICES.path(t.namespace, PLAIN_SERVICE), {"spec": {"externalIPs": [w.victim_address]}}, "merge"
        ),
        (f"asks for {{victim}} in spec.externalIPs, {ASKS} {CLASS_V4}",),
    ),
    # The tenant's own rendered Service: any change, in every update form.
    Probe(
        "own-ea-service-external-ips",
        lambda w, t: t.client.patch(_own(t), {"spec": {"externalIPs": [w.victim_address]}}, "merge"),
        # Both policies refuse it; the API server reports whichever it asked first.
        (CHANGES, ASKS),
    ),
    Probe(
        "own-ea-service-repointed-to-other-tenants-address",
        lambda w, t: t.client.patch(
            _own(t), {"metadata": {"annotations": {METALLB_IPS_ANNOTATION: w.victim_address}}}, "merge"
        ),
        (CHANGES, ASKS),
    ),
    Probe(
        "own-ea-service-selector-to-internal-pods",
        lambda w, t: t.client.patch(_own(t), {"spec": {"selector": INTERNAL_SELECTOR}}, "merge"),
        (CHANGES,),
    ),
    Probe(
        "own-ea-service-strip-owner-reference-json-patch",
        lambda w, t: t.client.patch(_own(t), [{"op": "remove", "path": "/metadata/ownerReferences"}], "json"),
        (STRIPS,),
    ),
    Probe(
        "own-ea-service-strip-owner-reference-merge-patch",
        lambda w, t: t.client.patch(_own(t), {"metadata": {"ownerReferences": None}}, "merge"),
        (STRIPS,),
    ),
    Probe("own-ea-service-strip-owner-reference-replace", _replace_without_owner, (STRIPS,)),
    Probe(
        "own-ea-service-server-side-apply",
        lambda w, t: t.client.apply(
            _own(t),
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": OWN_SERVICE, "namespace": t.namespace},
                "spec": {"externalIPs": [w.victim_address]},
            },
            FIELD_MANAGER,
        ),
        (CHANGES, ASKS),
    ),
    Probe(
        "own-ea-service-strip-label",
        lambda w, t: t.client.patch(
            _own(t),
            [{"op": "remove", "path": "/metadata/labels/" + ATTACHMENT_LABEL.replace("/", "~1")}],
            "json",
        ),
        (CHANGES,),
    ),
    Probe(
        "own-ea-service-delete",
        lambda w, t: t.client.delete(_own(t)),
        ("only the EndpointAttachment operator deletes it",),
    ),
    # Dressing up a Service of one's own as a rendered one.
    Probe(
        "forge-attachment-label",
        _create(lambda w, t: service_body("forged", labels={ATTACHMENT_LABEL: OWN_ATTACHMENT})),
        (FORGES_LABEL,),
    ),
    Probe(
        "forge-owner-reference",
        _create(lambda w, t: service_body("forged", owner_references=[_owner(t, controller=False)])),
        (FORGES_OWNER,),
    ),
    Probe(
        "forge-controller-owner-reference",
        _create(lambda w, t: service_body("forged", owner_references=[_owner(t, controller=True)])),
        # OwnerReferencesPermissionEnforcement refuses blockOwnerDeletion before any policy is asked.
        ("cannot set blockOwnerDeletion",),
        by_policy=False,
    ),
    Probe(
        "add-attachment-label-to-own-service",
        lambda w, t: t.client.patch(
            SERVICES.path(t.namespace, PLAIN_SERVICE),
            {"metadata": {"labels": {ATTACHMENT_LABEL: OWN_ATTACHMENT}}},
            "merge",
        ),
        (FORGES_LABEL,),
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


async def snapshot(w: World) -> dict[str, tuple[str, str]]:
    """(resourceVersion, address) of every rendered Service and attachment a probe might aim at."""
    seen: dict[str, tuple[str, str]] = {}
    pairs = [(w.victim_namespace, "site"), *((t.namespace, OWN_ATTACHMENT) for t in w.tenants.values())]
    for namespace, name in pairs:
        service = await w.kube.get(SERVICES.path(namespace, f"ea-{name}"))
        attachment = await w.kube.get(ATTACHMENTS.path(namespace, name))
        assert service is not None, (namespace, name)
        assert attachment is not None, (namespace, name)
        seen[f"{namespace}/ea-{name}"] = (
            service["metadata"]["resourceVersion"],
            service["metadata"]["annotations"].get(METALLB_IPS_ANNOTATION, ""),
        )
        seen[f"{namespace}/{name}"] = (attachment["status"]["address"], str(condition(attachment, "Ready")))
    return seen


async def run_probe(w: World, identity: str, probe: Probe) -> tuple[ApiError, tuple[str, ...]]:
    """Run a probe as the tenant; it must be refused, and nothing it aimed at may change."""
    t = w.tenants[identity]
    before = await snapshot(w)
    error = await refusal(probe.request(w, t))
    assert error is not None, f"{probe.name}: accepted for the {identity} tenant"
    assert error.status == 403, f"{probe.name}: {error}"
    assert await snapshot(w) == before, f"{probe.name} changed what it aimed at"
    return error, tuple(s.replace("{victim}", w.victim_address) for s in probe.says)


@pytest.mark.parametrize("probe", PROBES, ids=[p.name for p in PROBES])
@pytest.mark.parametrize("identity", IDENTITIES)
async def test_probe_is_refused_with_a_reason(world: World, identity: str, probe: Probe) -> None:
    error, says = await run_probe(world, identity, probe)
    text = str(error)
    if identity == TENANT_ROLES_ONLY:
        # The tenant roles grant no Service verb at all: RBAC refuses before any policy is asked.
        assert "cannot" in text, text
        assert "services" in text, text
        return
    assert (POLICY_REFUSAL in text) == probe.by_policy, text
    assert any(fragment in text for fragment in says), f"{probe.name}: expected one of {says}, got:\n{text}"
    # Written for a person: no CEL, no raw expression.
    for cel in ("variables.", "object.", "params."):
        assert cel not in text, text
    assert len(text) < 1500, f"{probe.name}: a message that long echoes the request"


# --- what must keep working ------------------------------------------------------------------------


async def test_the_operator_publishes_and_follows_under_the_policies(world: World) -> None:
    """The operator (exempted by its ServiceAccount) created the rendered Services the policies
    protect, MetalLB answered, and the operator still changes them: a new port on the endpoint is
    mirrored by the operator's patch."""
    t = world.tenants[WITH_EDIT]
    service = await world.kube.get(SERVICES.path(t.namespace, OWN_SERVICE))
    assert service is not None
    assert service["metadata"]["annotations"][METALLB_IPS_ANNOTATION] == t.address
    assert [i["ip"] for i in service["status"]["loadBalancer"]["ingress"]] == [t.address]
    # Touching the endpoint is the platform's write (admin), allowed; the mirror is the operator's.
    await world.kube.patch(
        SERVICES.path(t.namespace, ENDPOINT),
        {"spec": {"ports": [{"name": "postgres", "port": 5432}, {"name": "metrics", "port": 9187}]}},
        "merge",
    )
    await wait_for_object(
        world.kube,
        SERVICES,
        OWN_SERVICE,
        lambda s: s is not None and len(s["spec"]["ports"]) == 2,
        namespace=t.namespace,
        timeout=PUBLISH_SECONDS,
        what="the operator's patch of its rendered Service",
    )
    await world.kube.patch(
        SERVICES.path(t.namespace, ENDPOINT),
        {"spec": {"ports": [{"name": "postgres", "port": 5432}]}},
        "merge",
    )
    await wait_for_object(
        world.kube,
        SERVICES,
        OWN_SERVICE,
        lambda s: s is not None and len(s["spec"]["ports"]) == 1,
        namespace=t.namespace,
        timeout=PUBLISH_SECONDS,
    )
    await published(world.kube, t.namespace, OWN_ATTACHMENT, world.operator)


async def test_tenants_ordinary_services_pass(world: World) -> None:
    """With edit, a tenant still creates, changes and deletes its own Services, load balancers
    included, and may ask for an address outside every class."""
    t = world.tenants[WITH_EDIT]
    path = SERVICES.path(t.namespace)
    await t.client.create(path, service_body("web"))
    await t.client.create(
        path, service_body("own-ip", annotations={METALLB_IPS_ANNOTATION: OUTSIDE_EVERY_CLASS})
    )
    await t.client.create(
        path, service_body("ext", type_="ClusterIP", spec={"externalIPs": [OUTSIDE_EVERY_CLASS]})
    )
    await t.client.patch(
        SERVICES.path(t.namespace, "web"), {"metadata": {"annotations": {"note": "x"}}}, "merge"
    )
    # Annotating a Service the platform labelled is fine: its labels stay as they were.
    await t.client.patch(
        SERVICES.path(t.namespace, ENDPOINT), {"metadata": {"annotations": {"note": "x"}}}, "merge"
    )
    for name in ("web", "own-ip", "ext"):
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


async def rendered_for_gone_attachment(world: World, namespace: str, name: str, tmp: Path) -> Obj:
    """An attachment made and deleted (its finalizer run by the operator), then a Service rendered for
    it exactly as the operator renders, written with the operator's own credentials: what is left when
    a Service outlives its attachment for a moment."""
    attachment = await attach(world.kube, namespace, name)
    await world.kube.delete(ATTACHMENTS.path(namespace, name))
    await wait_for_object(
        world.kube, ATTACHMENTS, name, lambda o: o is None, namespace=namespace, timeout=CLEANUP_SECONDS
    )
    kubeconfig = await serviceaccount_kubeconfig(
        world.kube,
        world.cluster.kubeconfig,
        OPERATOR_NAMESPACE,
        OPERATOR_SERVICE_ACCOUNT,
        tmp / "as-operator",
    )
    as_operator = await Kube.connect(kubeconfig)
    body = render_service(
        attachment,
        selector={"app": "gone"},
        ports=[{"port": 80}],
        address=ipaddress.ip_address(OUTSIDE_EVERY_CLASS),
        settings=ClassSettings(),
        mode="Standard",
        allow_icmp=False,
        proxy_name=None,
    )
    return await as_operator.create(SERVICES.path(namespace), body)


async def test_garbage_collector_still_deletes_a_rendered_service(world: World, tmp_path: Path) -> None:
    """The garbage collector deletes a rendered Service whose attachment is gone (the policy refuses
    that deletion to everyone else)."""
    namespace = world.victim_namespace
    service = await rendered_for_gone_attachment(world, namespace, "gc", tmp_path)
    name = service["metadata"]["name"]
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


@pytest.mark.parametrize("propagation", ["Orphan", "Foreground", "Background"])
async def test_deleting_an_attachment_in_any_cascade_leaves_no_service_asking(
    world: World, propagation: str
) -> None:
    """The tenant deletes its own attachment (the tenant roles allow it) with each propagation policy.
    Orphan (``kubectl delete --cascade=orphan``): the garbage collector may not strip the owner
    reference; foreground: the garbage collector deletes the Service (allowed) while the operator
    finalizes. Every time the attachment goes, the Service goes with it, the address is released, and
    no Service is left asking for it."""
    t = world.tenants[TENANT_ROLES_ONLY]
    name = f"cascade-{propagation.lower()}"
    await attach(world.kube, t.namespace, name)
    attachment = await published(world.kube, t.namespace, name, world.operator)
    address = attachment["status"]["address"]
    await t.client.delete(ATTACHMENTS.path(t.namespace, name), propagation=propagation)
    await wait_for_object(
        world.kube,
        ATTACHMENTS,
        name,
        lambda o: o is None,
        namespace=t.namespace,
        timeout=CLEANUP_SECONDS,
        what=f"the attachment deleted with propagation {propagation} gone",
    )
    assert await world.kube.get(SERVICES.path(t.namespace, f"ea-{name}")) is None, "a Service is left"
    assert await world.kube.get(ALLOCATIONS.path(name=address)) is None
    asking = [
        f"{s['metadata']['namespace']}/{s['metadata']['name']}"
        for s in (await world.kube.list(SERVICES.path()))["items"]
        if address in (s["metadata"].get("annotations") or {}).get(METALLB_IPS_ANNOTATION, "").split(",")
    ]
    assert not asking, f"Services still asking for {address}: {asking}"


async def test_namespace_deletion_still_completes(world: World, tmp_path: Path) -> None:
    """A tenant namespace with a published attachment and a rendered Service left by a gone one is
    deleted whole: the namespace controller's deletions pass, the operator finalizes its attachment."""
    namespace = f"adm-doomed-{suffix()}"
    await make_namespace(world.kube, namespace)
    try:
        await app_with_endpoint(world.kube, namespace)
        await attach(world.kube, namespace, "doomed")
        attachment = await published(world.kube, namespace, "doomed", world.operator)
        await rendered_for_gone_attachment(world, namespace, "left", tmp_path)
    finally:
        await delete_namespace(world.kube, namespace, wait=True)
    assert await world.kube.get(ALLOCATIONS.path(name=attachment["status"]["address"])) is None


async def test_a_service_that_asked_before_its_class_existed_may_change_but_add_nothing(world: World) -> None:
    """The address policy judges what a request adds: a Service that asked for an address before any
    class held it keeps working (a tenant may still annotate it), but may not ask for more of the
    class's addresses. (docs/hosters/admission.md tells the hoster how to find such Services.)"""
    t = world.tenants[WITH_EDIT]
    legacy, more = "100.64.43.5", "100.64.43.6"
    body = service_body("legacy", annotations={METALLB_IPS_ANNOTATION: legacy})
    await t.client.create(SERVICES.path(t.namespace), body)
    await world.kube.create(CLASSES.path(), for_create(make_class(LEGACY_CLASS, cidrs=[LEGACY_CLASS_CIDR])))
    try:
        probe = service_body("probe", annotations={METALLB_IPS_ANNOTATION: more})
        await until_refused_by_policy(
            dry_run_create(world.kube, t.namespace, probe), f"the address policy knowing {LEGACY_CLASS}"
        )
        path = SERVICES.path(t.namespace, "legacy")
        await t.client.patch(path, {"metadata": {"annotations": {"note": "still mine"}}}, "merge")
        refused = await refusal(
            t.client.patch(
                path, {"metadata": {"annotations": {METALLB_IPS_ANNOTATION: f"{legacy},{more}"}}}, "merge"
            )
        )
        assert refused is not None
        assert f"asks for {more} in the annotation {METALLB_IPS_ANNOTATION}, {ASKS} {LEGACY_CLASS}" in str(
            refused
        )
    finally:
        await t.client.delete(SERVICES.path(t.namespace, "legacy"))
        await world.kube.delete(CLASSES.path(name=LEGACY_CLASS))
