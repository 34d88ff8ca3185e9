"""The EndpointAttachment operator when things go wrong, on the local control plane: every failure is
a named condition a person can act on, never a silent wait, an endless retry or a traceback.

One test per case (issue 10, failure half):

* a load balancer that never answers (a ``loadBalancerClass`` nobody serves): ``AddressNotAnnounced``
  after the bounded wait, the ``not_ready_since`` gauge, and ``Published`` once the hoster drops that
  ``loadBalancerClass`` from the class and the load balancer answers;
* the API refusing the rendered Service: 422 (an IPv6 Service in this IPv4-only cluster), 403 from an
  admission policy (sent again once what it is rendered from changes) and 403 from an exhausted
  ResourceQuota (tried again once the quota frees);
* deletion order: the address is released only after the rendered Service is gone from the API;
* owner references under the OwnerReferencesPermissionEnforcement admission plugin (the local control
  plane runs it): the operator's own writes pass, a writer without the grants is refused;
* IPAddressClass conditions (``Available``, ``PoolExhausted``, ``PoolEmpty``);
* ``AddressMismatch`` on a claim whose ``spec.address`` was set after it bound another address;
* the sample ResourceQuota of ``config/samples`` limits a tenant's claims and attachments.

The load balancer is MetalLB's real controller (``tests.support.loadbalancer``, the ``lb`` fixture),
with a pool mirrored from each IPAddressClass it serves; no test here writes a Service's
``status.loadBalancer``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Final

import pytest

from hack.devcluster import ClusterInfo
from hack.metallb import MetalLB
from operators.endpointattachment.constants import METALLB_IPS_ANNOTATION
from shared.kube import ApiError, Kube, Obj
from shared.resources import RESOURCE_QUOTAS, ROLE_BINDINGS, ROLES, SERVICE_ACCOUNTS, SERVICES, Resource
from tests.support.ea_cluster import (
    ALLOCATIONS,
    ATTACHMENT_CONTROLLER,
    ATTACHMENTS,
    CLAIMS,
    CLASSES,
    Tenant,
    condition,
    ea_crds_and_node,
    ea_operator,
    reconciles,
)
from tests.support.identity import serviceaccount_kubeconfig
from tests.support.loadbalancer import SILENT_LOAD_BALANCER_CLASS
from tests.support.manifests import load
from tests.support.operators import RunningOperator
from tests.support.waiting import eventually, quota_in_force, wait_for_object

# The tenant-facing Service of application "db", every attachment's endpoint here.
ENDPOINT: Final = "postgres-db-rw"
POLICIES: Final = Resource("admissionregistration.k8s.io/v1", "validatingadmissionpolicies", namespaced=False)
POLICY_BINDINGS: Final = Resource(
    "admissionregistration.k8s.io/v1", "validatingadmissionpolicybindings", namespaced=False
)
# What a hoster's policy says when it refuses a Service (the attachment must carry these words).
POLICY_MESSAGE: Final = "this platform publishes no database port 5432"
NAMESPACE_NAME_LABEL: Final = "kubernetes.io/metadata.name"
CRDS: Final = Resource("apiextensions.k8s.io/v1", "customresourcedefinitions", namespaced=False)
CLAIMS_CRD_FILE: Final = "config/crd/endpointattachment/local.sdn.cozystack.io_ipaddressclaims.yaml"
SAMPLE_QUOTA: Final = "config/samples/resourcequota.yaml"
SAMPLES: Final = "config/samples/kustomization.yaml"
# Short waits, so the tests see the bounded waits end (the defaults are a minute each).
ANNOUNCE_TIMEOUT: Final = 3
QUOTA_RETRY: Final = 2
ARGS: Final = (f"--announce-timeout-seconds={ANNOUNCE_TIMEOUT}", f"--quota-retry-seconds={QUOTA_RETRY}")
NOT_READY_SINCE: Final = "cozystack_endpointattachment_not_ready_since_timestamp_seconds"
# What a cloud load balancer's controller puts on a LoadBalancer Service: its deletion waits for it.
LB_CLEANUP_FINALIZER: Final = "example.com/load-balancer-cleanup"


@pytest.fixture(scope="module")
async def ea_crds(kube: Kube) -> AsyncIterator[None]:
    async with ea_crds_and_node(kube):
        yield


@pytest.fixture
async def operator(
    kube: Kube, cluster: ClusterInfo, ea_crds: None, tmp_path: Path
) -> AsyncIterator[RunningOperator]:
    async with ea_operator(kube, cluster, tmp_path, extra_args=ARGS) as running:
        yield running


@pytest.fixture
async def tenant(kube: Kube, namespace: str, ea_crds: None) -> AsyncIterator[Tenant]:
    await wait_for_object(kube, SERVICE_ACCOUNTS, "default", lambda o: o is not None, namespace=namespace)
    world = Tenant(kube, namespace)
    yield world
    await world.cleanup()


async def wait_condition(
    kube: Kube,
    resource: Resource,
    namespace: str | None,
    name: str,
    expected: tuple[str, str],
    operator: RunningOperator,
    type_: str = "Ready",
    timeout: float = 40,
) -> Obj:
    try:
        found = await wait_for_object(
            kube,
            resource,
            name,
            lambda o: condition(o, type_) == expected,
            namespace=namespace,
            timeout=timeout,
        )
    except AssertionError as error:
        raise AssertionError(f"{error}\noperator log:\n{operator.log_tail()}") from None
    assert found is not None
    return found


def message(obj: Obj, type_: str = "Ready") -> str:
    found = next(c for c in obj["status"]["conditions"] if c["type"] == type_)
    return str(found.get("message") or "")


async def errors(operator: RunningOperator) -> float:
    """Passes over attachments that ended in an error (each retried with backoff)."""
    samples = await operator.scrape()
    return sum(
        v
        for (name, labels), v in samples.items()
        if name == "controller_runtime_reconcile_errors_total"
        and ("controller", ATTACHMENT_CONTROLLER) in labels
    )


# --- 1. a load balancer that never answers ---------------------------------------------------------


async def test_an_unanswered_service_is_reported_after_the_bounded_wait_and_recovers(
    kube: Kube, tenant: Tenant, operator: RunningOperator, lb: MetalLB
) -> None:
    ns = tenant.namespace
    await tenant.address_class(
        "if-unserved", cidrs=["198.51.100.0/29"], load_balancer_class=SILENT_LOAD_BALANCER_CLASS
    )
    await tenant.app_with_endpoint()
    await tenant.attachment("quiet", ENDPOINT, class_name="if-unserved")
    pending = await wait_condition(kube, ATTACHMENTS, ns, "quiet", ("False", "AddressPending"), operator)
    address = pending["status"]["address"]

    silent = await wait_condition(kube, ATTACHMENTS, ns, "quiet", ("False", "AddressNotAnnounced"), operator)
    said = message(silent)
    assert address in said, said
    assert SILENT_LOAD_BALANCER_CLASS in said, said
    assert f"within {ANNOUNCE_TIMEOUT}s" in said, said
    service = await kube.get(SERVICES.path(ns, "ea-quiet"))
    assert service is not None
    # From here on nothing is retried. (Before: right after the CRDs are installed, the admission
    # plugin's REST mapping may not know EndpointAttachment yet; its 403 is retried, as transient.)
    retried = await errors(operator)
    # Reported no earlier than the bounded wait after the Service was written.
    ready = next(c for c in silent["status"]["conditions"] if c["type"] == "Ready")
    assert service["metadata"]["creationTimestamp"] in said
    assert ready["status"] == "False"

    # The gauge the EndpointAttachmentNotReady alert reads.
    samples = await operator.scrape()
    since = samples.get((NOT_READY_SINCE, (("reason", "AddressNotAnnounced"),)))
    assert since is not None
    assert since > 0

    assert service["metadata"]["annotations"][METALLB_IPS_ANNOTATION] == address
    assert not ((service.get("status") or {}).get("loadBalancer") or {}).get("ingress")

    # The hoster drops the loadBalancerClass nobody serves: the Service is rendered anew, MetalLB
    # answers at last, and the status change of the Service wakes the attachment.
    await kube.patch(CLASSES.path(name="if-unserved"), {"spec": {"loadBalancerClass": None}}, "merge")
    published = await wait_condition(kube, ATTACHMENTS, ns, "quiet", ("True", "Published"), operator)
    assert published["status"]["address"] == address
    answered = await kube.get(SERVICES.path(ns, "ea-quiet"))
    assert answered is not None
    assert "loadBalancerClass" not in answered["spec"]
    assert [i["ip"] for i in answered["status"]["loadBalancer"]["ingress"]] == [address]

    async def gauge_gone() -> bool:
        scraped = await operator.scrape()
        return (NOT_READY_SINCE, (("reason", "AddressNotAnnounced"),)) not in scraped

    await eventually(gauge_gone, what="the AddressNotAnnounced series to go")
    assert await errors(operator) == retried


# --- 3. the API refuses the rendered Service -------------------------------------------------------


async def test_a_service_the_api_refuses_is_a_condition_not_a_retry_loop(
    kube: Kube, tenant: Tenant, operator: RunningOperator
) -> None:
    """An IPv6 class in this IPv4-only cluster: the API answers 422 to the rendered Service."""
    ns = tenant.namespace
    await tenant.address_class("if-v6", cidrs=["2001:db8:10::/124"])
    await tenant.app_with_endpoint()
    await tenant.attachment("six", ENDPOINT, class_name="if-v6")
    refused = await wait_condition(kube, ATTACHMENTS, ns, "six", ("False", "ServiceRefused"), operator)
    said = message(refused)
    assert said.startswith("the API refused to create the Service:"), said
    assert "IPv6" in said, said  # the API's own words
    assert condition(refused, "AddressBound") == ("True", "Minted")
    assert await kube.get(SERVICES.path(ns, "ea-six")) is None
    assert await errors(operator) == 0, "a refusal is an outcome, not an error to retry"

    # A quiet operator: another wake-up of the attachment sends nothing and changes nothing.
    before = await reconciles(operator)
    version = refused["metadata"]["resourceVersion"]
    await kube.patch(ATTACHMENTS.path(ns, "six"), {"metadata": {"annotations": {"touch": "1"}}}, "merge")
    await eventually(lambda: _more(operator, before), what="a pass over the refused attachment")
    again = await kube.get(ATTACHMENTS.path(ns, "six"))
    assert again is not None
    assert condition(again, "Ready") == ("False", "ServiceRefused")
    assert again["metadata"]["resourceVersion"] != version  # the touch itself
    assert again["status"] == refused["status"]
    assert await errors(operator) == 0


async def test_a_policy_refusal_carries_its_message_and_a_changed_input_is_sent_again(
    kube: Kube, tenant: Tenant, operator: RunningOperator, lb: MetalLB
) -> None:
    """A ValidatingAdmissionPolicy (as a hoster's webhook or policy would) refuses the rendered
    Service with 403: the attachment says so in the policy's words; the same Service is not sent
    again, but once what it is rendered from changes (the endpoint's port), the new one is."""
    ns = tenant.namespace
    name = f"if-{ns}"[:63]
    await kube.create(
        POLICIES.path(),
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE", "UPDATE"],
                            "resources": ["services"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": "object.spec.type != 'LoadBalancer' || "
                        "object.spec.ports.all(p, p.port != 5432)",
                        "message": POLICY_MESSAGE,
                        "reason": "Forbidden",
                    }
                ],
            },
        },
    )
    tenant.cluster_objects.append(POLICIES.path(name=name))
    await kube.create(
        POLICY_BINDINGS.path(),
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: ns}}},
            },
        },
    )
    tenant.cluster_objects.append(POLICY_BINDINGS.path(name=name))
    await eventually(lambda: _policy_refuses(kube, ns), what="the policy in force")

    await tenant.address_class("if-policy", cidrs=["198.51.100.48/29"])
    await tenant.app_with_endpoint()
    await tenant.attachment("denied", ENDPOINT, class_name="if-policy")
    refused = await wait_condition(kube, ATTACHMENTS, ns, "denied", ("False", "ServiceRefused"), operator)
    assert POLICY_MESSAGE in message(refused), message(refused)
    assert await errors(operator) == 0

    # The endpoint moves to another port: another Service, which the policy lets through.
    await kube.patch(
        SERVICES.path(ns, "postgres-db-rw"),
        {"spec": {"ports": [{"name": "pg", "protocol": "TCP", "port": 6432, "targetPort": 6432}]}},
        "merge",
    )
    service = await wait_for_object(kube, SERVICES, "ea-denied", lambda s: s is not None, namespace=ns)
    assert service is not None
    assert [p["port"] for p in service["spec"]["ports"]] == [6432]
    # Accepted this time: MetalLB answers it like any other.
    await wait_condition(kube, ATTACHMENTS, ns, "denied", ("True", "Published"), operator)


async def _policy_refuses(kube: Kube, namespace: str) -> bool:
    """Whether the policy refuses a LoadBalancer Service on port 5432 yet (one let through goes)."""
    probe = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "policy-probe"},
        "spec": {"type": "LoadBalancer", "selector": {"app": "none"}, "ports": [{"port": 5432}]},
    }
    try:
        await kube.create(SERVICES.path(namespace), probe)
    except ApiError as error:
        return error.status == 403 and POLICY_MESSAGE in error.message
    await kube.delete(SERVICES.path(namespace, "policy-probe"))
    return False


async def test_a_quota_refusal_is_reported_and_tried_again_once_the_quota_frees(
    kube: Kube, tenant: Tenant, operator: RunningOperator, lb: MetalLB
) -> None:
    ns = tenant.namespace
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-load-balancers"},
        "spec": {"hard": {"services.loadbalancers": "0"}},
    }
    await quota_in_force(kube, ns, quota)
    await tenant.address_class("if-quota", cidrs=["198.51.100.8/29"])
    await tenant.app_with_endpoint()
    await tenant.attachment("capped", ENDPOINT, class_name="if-quota")
    refused = await wait_condition(
        kube, ATTACHMENTS, ns, "capped", ("False", "ServiceQuotaExceeded"), operator
    )
    assert "exceeded quota" in message(refused), message(refused)
    assert await errors(operator) == 0

    # No event of ours tells that quota freed: the slow retry finds out.
    await kube.patch(
        RESOURCE_QUOTAS.path(ns, "no-load-balancers"),
        {"spec": {"hard": {"services.loadbalancers": "1"}}},
        "merge",
    )
    service = await wait_for_object(kube, SERVICES, "ea-capped", lambda s: s is not None, namespace=ns)
    assert service is not None
    # MetalLB (the class's pool mirrored) answers the Service the retry created.
    published = await wait_condition(kube, ATTACHMENTS, ns, "capped", ("True", "Published"), operator)
    answered = await kube.get(SERVICES.path(ns, "ea-capped"))
    assert answered is not None
    ingress = answered["status"]["loadBalancer"]["ingress"]
    assert [i["ip"] for i in ingress] == [published["status"]["address"]]
    assert await errors(operator) == 0


# --- 4. deletion order -----------------------------------------------------------------------------


async def test_the_address_is_released_only_after_the_service_is_gone(
    kube: Kube, tenant: Tenant, operator: RunningOperator
) -> None:
    ns = tenant.namespace
    await tenant.address_class("if-order", cidrs=["198.51.100.16/29"])
    await tenant.app_with_endpoint()
    await tenant.attachment("ordered", ENDPOINT, class_name="if-order")
    bound = await wait_condition(
        kube, ATTACHMENTS, ns, "ordered", ("True", "Minted"), operator, "AddressBound"
    )
    address = bound["status"]["address"]
    service = await wait_for_object(kube, SERVICES, "ea-ordered", lambda s: s is not None, namespace=ns)
    assert service is not None
    # As a cloud load balancer's controller does: the Service's deletion waits for its clean-up.
    await kube.patch(
        SERVICES.path(ns, "ea-ordered"), {"metadata": {"finalizers": [LB_CLEANUP_FINALIZER]}}, "merge"
    )

    async with _deletions(kube, ns) as seen:
        await kube.delete(ATTACHMENTS.path(ns, "ordered"))
        await wait_for_object(
            kube,
            SERVICES,
            "ea-ordered",
            lambda s: s is not None and bool(s["metadata"].get("deletionTimestamp")),
            namespace=ns,
        )
        # A pass that sees the Service terminating: woken by a change of it.
        before = await reconciles(operator)
        await kube.patch(
            SERVICES.path(ns, "ea-ordered"), {"metadata": {"annotations": {"touch": "1"}}}, "merge"
        )
        await eventually(lambda: _more(operator, before), what="a pass over the terminating Service")
        assert await kube.get(ALLOCATIONS.path(name=address)) is not None, "released before the Service went"
        held = await kube.get(ATTACHMENTS.path(ns, "ordered"))
        assert held is not None, "the attachment's finalizer went before the Service"

        # The load balancer lets go; then, and only then, the address.
        await kube.patch(SERVICES.path(ns, "ea-ordered"), {"metadata": {"finalizers": None}}, "merge")
        await wait_for_object(kube, ALLOCATIONS, address, lambda a: a is None)
        await wait_for_object(kube, ATTACHMENTS, "ordered", lambda a: a is None, namespace=ns)
        await eventually(lambda: _both_deleted(seen, address), what="both DELETED events")
    service_gone, address_gone = seen[("services", "ea-ordered")], seen[("ipaddressallocations", address)]
    # One etcd: resourceVersions are its global revisions, so they order the two deletions.
    assert service_gone < address_gone, (service_gone, address_gone)


@contextlib.asynccontextmanager
async def _deletions(kube: Kube, namespace: str) -> AsyncIterator[dict[tuple[str, str], int]]:
    """Watch the namespace's Services and every allocation; collect (plural, name) -> the
    resourceVersion of its DELETED event."""
    seen: dict[tuple[str, str], int] = {}
    started: list[asyncio.Event] = []

    async def watch(resource: Resource, path: str) -> None:
        ready = asyncio.Event()
        started.append(ready)
        version = (await kube.list(path))["metadata"]["resourceVersion"]
        ready.set()
        async for kind, obj in kube.watch(path, resource_version=version):
            if kind == "DELETED":
                seen[(resource.plural, obj["metadata"]["name"])] = int(obj["metadata"]["resourceVersion"])

    tasks = [
        asyncio.create_task(watch(SERVICES, SERVICES.path(namespace))),
        asyncio.create_task(watch(ALLOCATIONS, ALLOCATIONS.path())),
    ]
    await eventually(lambda: _all_started(started, 2), what="the watches to start")
    try:
        yield seen
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _all_started(started: list[asyncio.Event], count: int) -> bool:
    return len(started) == count and all(event.is_set() for event in started)


async def _both_deleted(seen: Mapping[tuple[str, str], int], address: str) -> bool:
    return ("services", "ea-ordered") in seen and ("ipaddressallocations", address) in seen


async def _more(operator: RunningOperator, before: float) -> bool:
    return await reconciles(operator) > before


# --- 5. owner references under OwnerReferencesPermissionEnforcement --------------------------------


async def test_owner_references_pass_the_admission_plugin_and_others_are_refused(
    kube: Kube, cluster: ClusterInfo, tenant: Tenant, operator: RunningOperator, tmp_path: Path
) -> None:
    ns = tenant.namespace
    await tenant.address_class("if-owners", cidrs=["198.51.100.24/29"])
    await tenant.app_with_endpoint()
    await tenant.attachment("owned", ENDPOINT, class_name="if-owners")
    service = await wait_for_object(kube, SERVICES, "ea-owned", lambda s: s is not None, namespace=ns)
    assert service is not None
    attachment = await kube.get(ATTACHMENTS.path(ns, "owned"))
    assert attachment is not None
    # The operator's writes both passed the plugin: the attachment's reference to its application
    # (a change of its owners: delete on attachments), the Service's blocking one to the attachment
    # (update on endpointattachments/finalizers).
    assert [r["kind"] for r in attachment["metadata"]["ownerReferences"]] == ["HelmRelease"]
    reference = service["metadata"]["ownerReferences"][0]
    assert (reference["uid"], reference["blockOwnerDeletion"]) == (attachment["metadata"]["uid"], True)
    assert await errors(operator) == 0

    # The plugin is on: a writer allowed to create Services, but not to finalize attachments, may
    # not create one that blocks an attachment's deletion.
    await kube.create(
        SERVICE_ACCOUNTS.path(ns),
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "writer"}},
    )
    await kube.create(
        ROLES.path(ns),
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "service-writer"},
            "rules": [{"apiGroups": [""], "resources": ["services"], "verbs": ["create"]}],
        },
    )
    await kube.create(
        ROLE_BINDINGS.path(ns),
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "service-writer"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "service-writer"},
            "subjects": [{"kind": "ServiceAccount", "name": "writer", "namespace": ns}],
        },
    )
    path = await serviceaccount_kubeconfig(
        kube, cluster.kubeconfig, ns, "writer", tmp_path / "writer.kubeconfig"
    )
    writer = await Kube.connect(path)
    blocking = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "blocker", "ownerReferences": [dict(reference)]},
        "spec": {"selector": {"app": "db"}, "ports": [{"port": 1}]},
    }

    async def refused() -> ApiError | None:
        try:
            await writer.create(SERVICES.path(ns), blocking)
        except ApiError as error:
            return error if error.status == 403 else None
        raise AssertionError("a blocking owner reference was accepted without the grant")

    error = await eventually(refused, what="the RoleBinding to take effect and the plugin to refuse")
    assert "blockOwnerDeletion" in error.message, error.message


# --- 6. IPAddressClass conditions ------------------------------------------------------------------


async def test_classes_say_whether_they_can_hand_out_an_address(
    kube: Kube, tenant: Tenant, operator: RunningOperator
) -> None:
    await tenant.address_class("if-pool", cidrs=["198.51.100.32/30"])  # two usable addresses
    await tenant.address_class(
        "if-empty", cidrs=["198.51.100.36/31"], exclude=["198.51.100.36", "198.51.100.37"]
    )
    available = await wait_condition(kube, CLASSES, None, "if-pool", ("True", "Available"), operator)
    assert available["status"]["capacity"] == 2
    assert message(available) == "2 of 2 addresses free"
    empty = await wait_condition(kube, CLASSES, None, "if-empty", ("False", "PoolEmpty"), operator)
    assert empty["status"]["capacity"] == 0

    await tenant.claim("one", "if-pool")
    await tenant.claim("two", "if-pool")
    exhausted = await wait_condition(kube, CLASSES, None, "if-pool", ("False", "PoolExhausted"), operator)
    assert exhausted["status"]["allocated"] == 2
    await kube.delete(CLAIMS.path(tenant.namespace, "two"))
    await wait_condition(kube, CLASSES, None, "if-pool", ("True", "Available"), operator)


# --- 7. a claim's spec.address set after it bound another address ----------------------------------


async def test_a_claim_whose_spec_address_moved_after_binding_says_so(
    kube: Kube, tenant: Tenant, operator: RunningOperator
) -> None:
    """Under an older CRD (without the rule that now refuses it), ``spec.address`` could be added
    after the claim had bound an address of the pool's choosing: the claim keeps its address, and
    says so."""
    ns = tenant.namespace
    await tenant.address_class("if-mismatch", cidrs=["198.51.100.40/29"])
    await tenant.claim("mine", "if-mismatch")
    bound = await wait_condition(kube, CLAIMS, ns, "mine", ("True", "Reserved"), operator)
    held = bound["status"]["address"]
    other = next(f"198.51.100.{n}" for n in range(41, 47) if f"198.51.100.{n}" != held)

    async with _older_claims_crd(kube):

        async def moved() -> bool:
            # The API server swaps in a changed CRD's rules a moment after the write: until then
            # the current rule refuses the change.
            try:
                await kube.patch(CLAIMS.path(ns, "mine"), {"spec": {"address": other}}, "merge")
            except ApiError as error:
                if error.status == 422 and "can only be set to the address" in error.message:
                    return False
                raise
            return True

        await eventually(moved, what="the older CRD's rules in force")
        mismatch = await wait_condition(kube, CLAIMS, ns, "mine", ("False", "AddressMismatch"), operator)
    said = message(mismatch)
    assert other in said, said
    assert held in said, said
    assert (mismatch["status"]["phase"], mismatch["status"]["address"]) == ("Bound", held)
    assert await kube.get(ALLOCATIONS.path(name=held)) is not None
    assert await kube.get(ALLOCATIONS.path(name=other)) is None


@contextlib.asynccontextmanager
async def _older_claims_crd(kube: Kube) -> AsyncIterator[None]:
    """The claims CRD without its rules over ``oldSelf.status`` (an older CRD), restored after."""
    current = load(CLAIMS_CRD_FILE)[0]
    older = copy.deepcopy(current)
    for version in older["spec"]["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        rules = schema.get("x-kubernetes-validations") or []
        schema["x-kubernetes-validations"] = [r for r in rules if "oldSelf.status" not in r["rule"]]
    await _replace_crd(kube, older)
    try:
        yield
    finally:
        await _replace_crd(kube, current)


async def _replace_crd(kube: Kube, crd: Obj) -> None:
    name = crd["metadata"]["name"]
    stored = await kube.get(CRDS.path(name=name))
    assert stored is not None
    body = {**crd, "metadata": {**crd["metadata"], "resourceVersion": stored["metadata"]["resourceVersion"]}}
    await kube.replace(CRDS.path(name=name), body)


# --- 8. the sample quota ---------------------------------------------------------------------------


async def test_the_sample_quota_keeps_one_tenant_from_draining_a_shared_pool(
    kube: Kube, tenant: Tenant, operator: RunningOperator
) -> None:
    ns = tenant.namespace
    assert SAMPLE_QUOTA.rsplit("/", 1)[1] in load(SAMPLES)[0]["resources"], "shipped with the samples"
    quota = load(SAMPLE_QUOTA)[0]
    hard = quota["spec"]["hard"]
    claims_allowed = int(hard["count/ipaddressclaims.local.sdn.cozystack.io"])
    attachments_allowed = int(hard["count/endpointattachments.local.sdn.cozystack.io"])
    await quota_in_force(kube, ns, quota)

    # A pool with room for more than the quota allows one tenant.
    await tenant.address_class("if-shared", cidrs=["198.51.100.64/26"])
    for index in range(claims_allowed):
        await tenant.claim(f"c{index}", "if-shared")
    with pytest.raises(ApiError) as refused:
        await tenant.claim("one-too-many", "if-shared")
    assert refused.value.status == 403
    assert "exceeded quota" in refused.value.message

    async def allocated() -> int | None:
        found = await kube.get(CLASSES.path(name="if-shared"))
        count = ((found or {}).get("status") or {}).get("allocated")
        return count if count == claims_allowed else None

    await eventually(allocated, what=f"{claims_allowed} addresses allocated")
    assert (await kube.get(CLASSES.path(name="if-shared")) or {})["status"]["capacity"] > claims_allowed

    await tenant.app_with_endpoint()
    for index in range(attachments_allowed):
        await tenant.attachment(f"a{index}", ENDPOINT, class_name="if-shared")
    with pytest.raises(ApiError) as refused:
        await tenant.attachment("one-too-many", ENDPOINT, class_name="if-shared")
    assert refused.value.status == 403
    assert "exceeded quota" in refused.value.message
