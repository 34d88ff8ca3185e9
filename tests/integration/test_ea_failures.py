"""The EndpointAttachment operator when things go wrong, on the local control plane: every failure is
a named condition a person can act on, never a silent wait, an endless retry or a traceback.

One test per case:

* a load balancer that never answers (MetalLB refusing every Service of the class's pool, by the
  pool's ``serviceAllocation``): ``WaitingForAddress``, then ``AddressNotAnnounced`` after the
  bounded wait, the ``not_provisioned_since`` gauge, and ``Provisioned`` once MetalLB answers;
* the API refusing the rendered Service, ``RenderFailed`` with the API's own words: 422 (an IPv6
  Service refused by a hoster's policy answering Invalid), 403 from an admission policy (sent again
  once what it is rendered from changes) and 403 from an exhausted ResourceQuota (tried again once
  the quota frees);
* deletion order: the attachment goes only after its rendered Service is gone from the API, and its
  minted claim after it (garbage collection);
* owner references under the OwnerReferencesPermissionEnforcement admission plugin (the local control
  plane runs it): the operator's own writes pass, a writer without the grants is refused;
* the sample ResourceQuota of ``config/samples`` limits a tenant's claims and attachments.

The address substrate is its model (``harness/substrate.py``) over MetalLB's real controller
(``harness.loadbalancer``); no test here writes a Service's ``status.loadBalancer``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Final

import pytest

from hack.devcluster import ClusterInfo
from harness.ea_cluster import (
    ATTACHMENT_CONTROLLER,
    ATTACHMENTS,
    CLAIM_ANNOTATION,
    CLAIMS,
    CONDITION_PROVISIONED,
    Tenant,
    World,
    addresses,
    attached,
    condition,
    ea_operator,
    ea_world,
    ingress,
    message,
    provisioned_false,
    reconciles,
    wait_attachment,
)
from harness.identity import serviceaccount_kubeconfig
from harness.manifests import load
from harness.operators import RunningOperator
from harness.substrate import METALLB_IPS_ANNOTATION
from harness.waiting import eventually, quota_in_force, wait_for_object
from shared.kube import ApiError, Kube
from shared.resources import RESOURCE_QUOTAS, ROLE_BINDINGS, ROLES, SERVICE_ACCOUNTS, SERVICES, Resource

# The tenant-facing Service of application "db", every attachment's endpoint here.
ENDPOINT: Final = "postgres-db-rw"
# What a hoster's policy says when it refuses a Service (the attachment must carry these words).
POLICY_MESSAGE: Final = "this platform publishes no database port 5432"
NO_IPV6_MESSAGE: Final = "this platform offers no IPv6 load balancer"
UNPROCESSABLE: Final = 422
SAMPLE_QUOTA: Final = "config/samples/resourcequota.yaml"
SAMPLES: Final = "config/samples/kustomization.yaml"
# Short waits, so the tests see the bounded waits end (the defaults are a minute each).
ANNOUNCE_TIMEOUT: Final = 3
QUOTA_RETRY: Final = 2
ARGS: Final = (f"--announce-timeout-seconds={ANNOUNCE_TIMEOUT}", f"--quota-retry-seconds={QUOTA_RETRY}")
NOT_PROVISIONED_SINCE: Final = "cozystack_endpointattachment_not_provisioned_since_timestamp_seconds"
# What a cloud load balancer's controller puts on a LoadBalancer Service: its deletion waits for it.
LB_CLEANUP_FINALIZER: Final = "example.com/load-balancer-cleanup"


@pytest.fixture(scope="module")
async def world(kube: Kube) -> AsyncIterator[World]:
    async with ea_world(kube) as running:
        yield running


@pytest.fixture
async def operator(
    kube: Kube, cluster: ClusterInfo, world: World, tmp_path: Path
) -> AsyncIterator[RunningOperator]:
    """The operator; named before ``tenant`` in a test, it still runs while the tenant is cleaned up."""
    async with ea_operator(kube, cluster, tmp_path, extra_args=ARGS) as running:
        yield running


@pytest.fixture
async def tenant(kube: Kube, namespace: str, world: World) -> AsyncIterator[Tenant]:
    await wait_for_object(kube, SERVICE_ACCOUNTS, "default", lambda o: o is not None, namespace=namespace)
    built = Tenant(kube, namespace, world)
    yield built
    await built.cleanup()


async def errors(operator: RunningOperator) -> float:
    """Passes over attachments that ended in an error (each retried with backoff)."""
    samples = await operator.scrape()
    return sum(
        v
        for (name, labels), v in samples.items()
        if name == "controller_runtime_reconcile_errors_total"
        and ("controller", ATTACHMENT_CONTROLLER) in labels
    )


async def _more(operator: RunningOperator, before: float) -> bool:
    return await reconciles(operator) > before


# --- 1. a load balancer that never answers ---------------------------------------------------------


async def test_an_unanswered_service_is_reported_after_the_bounded_wait_and_recovers(
    kube: Kube, operator: RunningOperator, tenant: Tenant
) -> None:
    ns = tenant.namespace
    await tenant.address_class("if-unserved", "198.51.100.144/29", silent=True)
    await tenant.app_with_endpoint()
    await tenant.attachment("quiet", ENDPOINT, class_name="if-unserved")
    waiting = await wait_attachment(kube, ns, "quiet", provisioned_false("WaitingForAddress"), operator)
    [address] = addresses(waiting)

    silent = await wait_attachment(kube, ns, "quiet", provisioned_false("AddressNotAnnounced"), operator)
    said = message(silent, CONDITION_PROVISIONED)
    assert address in said, said
    assert f"within {ANNOUNCE_TIMEOUT}s" in said, said
    service = await tenant.service_of(silent)
    assert service is not None
    assert service["metadata"]["name"] in said, said
    # From here on nothing is retried.
    retried = await errors(operator)

    # The gauge the not-provisioned alert reads.
    samples = await operator.scrape()
    since = samples.get((NOT_PROVISIONED_SINCE, (("reason", "AddressNotAnnounced"),)))
    assert since is not None
    assert since > 0

    # The substrate pinned the address; MetalLB refused it (the pool serves no Service here).
    assert service["metadata"]["annotations"][CLAIM_ANNOTATION] == silent["status"]["claimName"]
    assert service["metadata"]["annotations"][METALLB_IPS_ANNOTATION] == address
    assert ingress(service) == []

    # The load balancer answers at last: the status change of the Service wakes the attachment.
    await tenant.answer("if-unserved")
    provisioned = await wait_attachment(kube, ns, "quiet", attached, operator)
    assert provisioned["status"]["addresses"] == [address]
    assert ingress(await tenant.service_of(provisioned)) == [address]

    async def gauge_gone() -> bool:
        scraped = await operator.scrape()
        return (NOT_PROVISIONED_SINCE, (("reason", "AddressNotAnnounced"),)) not in scraped

    await eventually(gauge_gone, what="the AddressNotAnnounced series to go")
    assert await errors(operator) == retried


# --- 2. the API refuses the rendered Service -------------------------------------------------------


async def test_a_service_the_api_refuses_is_a_condition_not_a_retry_loop(
    kube: Kube, operator: RunningOperator, tenant: Tenant
) -> None:
    """The API answers 422 (Invalid) to the rendered Service: here a hoster's policy that offers no
    IPv6 load balancers (a cluster without an IPv6 Service CIDR answers the same way, in its own
    words; this control plane is dual-stack)."""
    ns = tenant.namespace
    await tenant.policy(
        "if-no-ipv6",
        [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["services"]}],
        "object.spec.type != 'LoadBalancer' || !has(object.spec.ipFamilies)"
        " || !('IPv6' in object.spec.ipFamilies)",
        NO_IPV6_MESSAGE,
        reason="Invalid",
    )
    await eventually(lambda: _refuses_ipv6(kube, ns), what="the policy in force")
    await tenant.address_class("if-v6", "2001:db8:10::10/124")
    await tenant.app_with_endpoint()
    await tenant.attachment("six", ENDPOINT, class_name="if-v6", family="IPv6")
    refused = await wait_attachment(kube, ns, "six", provisioned_false("RenderFailed"), operator)
    said = message(refused, CONDITION_PROVISIONED)
    assert said.startswith("the API refused to create the Service:"), said
    assert NO_IPV6_MESSAGE in said, said  # the API's own words
    [address] = addresses(refused)
    assert address.startswith("2001:db8:10::")
    assert await tenant.service_of(refused) is None
    assert await errors(operator) == 0, "a refusal is an outcome, not an error to retry"

    # A quiet operator: another wake-up of the attachment sends nothing and changes nothing.
    before = await reconciles(operator)
    version = refused["metadata"]["resourceVersion"]
    await kube.patch(ATTACHMENTS.path(ns, "six"), {"metadata": {"annotations": {"touch": "1"}}}, "merge")
    await eventually(lambda: _more(operator, before), what="a pass over the refused attachment")
    again = await kube.get(ATTACHMENTS.path(ns, "six"))
    assert again is not None
    assert again["metadata"]["resourceVersion"] != version  # the touch itself
    assert again["status"] == refused["status"]
    assert await errors(operator) == 0


async def test_a_policy_refusal_carries_its_message_and_a_changed_input_is_sent_again(
    kube: Kube, operator: RunningOperator, tenant: Tenant
) -> None:
    """A ValidatingAdmissionPolicy (as a hoster's webhook or policy would) refuses the rendered
    Service with 403: the attachment says so in the policy's words; the same Service is not sent
    again, but once what it is rendered from changes (the endpoint's port), the new one is."""
    ns = tenant.namespace
    await tenant.policy(
        "if-no-5432",
        [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["services"],
            }
        ],
        "object.spec.type != 'LoadBalancer' || object.spec.ports.all(p, p.port != 5432)",
        POLICY_MESSAGE,
    )
    await eventually(lambda: _policy_refuses(kube, ns), what="the policy in force")

    await tenant.address_class("if-policy", "198.51.100.168/29")
    await tenant.app_with_endpoint()
    await tenant.attachment("denied", ENDPOINT, class_name="if-policy")
    refused = await wait_attachment(kube, ns, "denied", provisioned_false("RenderFailed"), operator)
    assert POLICY_MESSAGE in message(refused, CONDITION_PROVISIONED), message(refused, CONDITION_PROVISIONED)
    assert await tenant.service_of(refused) is None
    assert await errors(operator) == 0

    # The endpoint moves to another port: another Service, which the policy lets through.
    await kube.patch(
        SERVICES.path(ns, "postgres-db-rw"),
        {"spec": {"ports": [{"name": "pg", "protocol": "TCP", "port": 6432, "targetPort": 6432}]}},
        "merge",
    )
    # Accepted this time: MetalLB answers it like any other.
    accepted = await wait_attachment(kube, ns, "denied", attached, operator)
    service = await tenant.service_of(accepted)
    assert service is not None
    assert [p["port"] for p in service["spec"]["ports"]] == [6432]


async def _refuses_ipv6(kube: Kube, namespace: str) -> bool:
    """Whether the no-IPv6 policy refuses an IPv6 LoadBalancer Service yet, as Invalid (422)."""
    probe = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "policy-probe"},
        "spec": {"type": "LoadBalancer", "ipFamilies": ["IPv6"], "ports": [{"port": 5432}]},
    }
    try:
        await kube.request("POST", SERVICES.path(namespace), body=probe, params={"dryRun": "All"})
    except ApiError as error:
        return error.status == UNPROCESSABLE and NO_IPV6_MESSAGE in error.message
    return False


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
    kube: Kube, operator: RunningOperator, tenant: Tenant
) -> None:
    ns = tenant.namespace
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-load-balancers"},
        "spec": {"hard": {"services.loadbalancers": "0"}},
    }
    await quota_in_force(kube, ns, quota)
    await tenant.address_class("if-quota", "198.51.100.152/29")
    await tenant.app_with_endpoint()
    await tenant.attachment("capped", ENDPOINT, class_name="if-quota")
    refused = await wait_attachment(kube, ns, "capped", provisioned_false("RenderFailed"), operator)
    assert "exceeded quota" in message(refused, CONDITION_PROVISIONED), message(
        refused, CONDITION_PROVISIONED
    )
    assert await errors(operator) == 0

    # No event of ours tells that quota freed: the slow retry finds out, and MetalLB answers.
    await kube.patch(
        RESOURCE_QUOTAS.path(ns, "no-load-balancers"),
        {"spec": {"hard": {"services.loadbalancers": "1"}}},
        "merge",
    )
    provisioned = await wait_attachment(kube, ns, "capped", attached, operator)
    assert ingress(await tenant.service_of(provisioned)) == provisioned["status"]["addresses"]
    assert await errors(operator) == 0


async def test_a_claim_the_quota_refuses_is_reported_not_retried_as_an_error(
    kube: Kube, operator: RunningOperator, tenant: Tenant
) -> None:
    """The tenant's claims quota is spent (the sample quota caps claims): the claim the attachment
    would mint is refused with 403. That is a condition in the API's words, with nothing drawn and
    nothing rendered, not an error retried with backoff; once the quota frees, it mints."""
    ns = tenant.namespace
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-claims"},
        "spec": {"hard": {"count/ipaddressclaims.local.sdn.cozystack.io": "0"}},
    }
    await quota_in_force(kube, ns, quota)
    await tenant.address_class("if-claims-quota", "198.51.100.184/29")
    await tenant.app_with_endpoint()
    await tenant.attachment("unminted", ENDPOINT, class_name="if-claims-quota")
    refused = await wait_attachment(
        kube,
        ns,
        "unminted",
        lambda o: "exceeded quota" in message(o, CONDITION_PROVISIONED),
        operator,
        what="the claim's refusal reported",
    )
    assert condition(refused, CONDITION_PROVISIONED)[0] == "False"
    assert await tenant.minted_claims(refused) == []
    assert await tenant.service_of(refused) is None
    assert await errors(operator) == 0, "a refusal is an outcome, not an error to retry"

    await kube.patch(
        RESOURCE_QUOTAS.path(ns, "no-claims"),
        {"spec": {"hard": {"count/ipaddressclaims.local.sdn.cozystack.io": "1"}}},
        "merge",
    )
    await wait_attachment(kube, ns, "unminted", attached, operator)


# --- 4. deletion order -----------------------------------------------------------------------------


async def test_the_attachment_goes_only_after_its_service_and_its_claim_after_it(
    kube: Kube, operator: RunningOperator, tenant: Tenant
) -> None:
    ns = tenant.namespace
    await tenant.address_class("if-order", "198.51.100.160/29")
    await tenant.app_with_endpoint()
    await tenant.attachment("ordered", ENDPOINT, class_name="if-order")
    ready = await wait_attachment(kube, ns, "ordered", attached, operator)
    service = await tenant.service_of(ready)
    assert service is not None
    [claim] = await tenant.minted_claims(ready)
    service_name, claim_name = service["metadata"]["name"], claim["metadata"]["name"]
    # As a cloud load balancer's controller does: the Service's deletion waits for its clean-up.
    await kube.patch(
        SERVICES.path(ns, service_name), {"metadata": {"finalizers": [LB_CLEANUP_FINALIZER]}}, "merge"
    )

    async with _deletions(kube, ns) as seen:
        await kube.delete(ATTACHMENTS.path(ns, "ordered"))
        await wait_for_object(
            kube,
            SERVICES,
            service_name,
            lambda s: s is not None and bool(s["metadata"].get("deletionTimestamp")),
            namespace=ns,
        )
        # A pass that sees the Service terminating: woken by a change of it.
        before = await reconciles(operator)
        await kube.patch(
            SERVICES.path(ns, service_name), {"metadata": {"annotations": {"touch": "1"}}}, "merge"
        )
        await eventually(lambda: _more(operator, before), what="a pass over the terminating Service")
        assert await kube.get(ATTACHMENTS.path(ns, "ordered")) is not None, "its finalizer went first"
        assert await kube.get(CLAIMS.path(ns, claim_name)) is not None, "the claim went before the Service"

        # The load balancer lets go; then, and only then, the attachment, and its claim after it.
        await kube.patch(SERVICES.path(ns, service_name), {"metadata": {"finalizers": None}}, "merge")
        await wait_for_object(kube, ATTACHMENTS, "ordered", lambda a: a is None, namespace=ns)
        await wait_for_object(kube, CLAIMS, claim_name, lambda c: c is None, namespace=ns, timeout=60)
        wanted = {
            ("services", service_name),
            ("endpointattachments", "ordered"),
            ("ipaddressclaims", claim_name),
        }
        await eventually(lambda: _all_deleted(seen, wanted), what="the three DELETED events")
    # One etcd: resourceVersions are its global revisions, so they order the deletions.
    order = [seen[key] for key in (("services", service_name), ("endpointattachments", "ordered"))]
    assert order == sorted(order), order
    assert seen[("ipaddressclaims", claim_name)] > order[-1]


@contextlib.asynccontextmanager
async def _deletions(kube: Kube, namespace: str) -> AsyncIterator[dict[tuple[str, str], int]]:
    """Watch the namespace's Services, attachments and claims; collect (plural, name) -> the
    resourceVersion of its DELETED event."""
    seen: dict[tuple[str, str], int] = {}
    started: list[asyncio.Event] = []

    async def watch(resource: Resource) -> None:
        ready = asyncio.Event()
        started.append(ready)
        path = resource.path(namespace)
        version = (await kube.list(path))["metadata"]["resourceVersion"]
        ready.set()
        async for kind, obj in kube.watch(path, resource_version=version):
            if kind == "DELETED":
                seen[(resource.plural, obj["metadata"]["name"])] = int(obj["metadata"]["resourceVersion"])

    kinds = (SERVICES, ATTACHMENTS, CLAIMS)
    tasks = [asyncio.create_task(watch(resource)) for resource in kinds]
    await eventually(lambda: _all_started(started, len(kinds)), what="the watches to start")
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


async def _all_deleted(seen: Mapping[tuple[str, str], int], wanted: set[tuple[str, str]]) -> bool:
    return wanted <= set(seen)


# --- 5. owner references under OwnerReferencesPermissionEnforcement --------------------------------


async def test_owner_references_pass_the_admission_plugin_and_others_are_refused(
    kube: Kube, cluster: ClusterInfo, operator: RunningOperator, tenant: Tenant, tmp_path: Path
) -> None:
    ns = tenant.namespace
    await tenant.address_class("if-owners", "198.51.100.176/29")
    await tenant.app_with_endpoint()
    await tenant.attachment("owned", ENDPOINT, class_name="if-owners")
    attachment = await wait_attachment(kube, ns, "owned", attached, operator)
    service = await tenant.service_of(attachment)
    assert service is not None
    [claim] = await tenant.minted_claims(attachment)
    # The operator's writes all passed the plugin: the attachment's reference to its application
    # (a change of its owners: delete on attachments), the Service's and the minted claim's blocking
    # one to the attachment (update on endpointattachments/finalizers).
    assert [r["kind"] for r in attachment["metadata"]["ownerReferences"]] == ["HelmRelease"]
    for owned in (service, claim):
        [reference] = owned["metadata"]["ownerReferences"]
        assert (reference["uid"], reference["controller"], reference["blockOwnerDeletion"]) == (
            attachment["metadata"]["uid"],
            True,
            True,
        )
    reference = service["metadata"]["ownerReferences"][0]
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


# --- 6. the sample quota ---------------------------------------------------------------------------


async def test_the_sample_quota_keeps_one_tenant_from_draining_a_shared_class(
    kube: Kube, operator: RunningOperator, tenant: Tenant
) -> None:
    ns = tenant.namespace
    assert SAMPLE_QUOTA.rsplit("/", 1)[1] in load(SAMPLES)[0]["resources"], "shipped with the samples"
    quota = load(SAMPLE_QUOTA)[0]
    hard = quota["spec"]["hard"]
    claims_allowed = int(hard["count/ipaddressclaims.local.sdn.cozystack.io"])
    attachments_allowed = int(hard["count/endpointattachments.local.sdn.cozystack.io"])
    await quota_in_force(kube, ns, quota)

    # A class with room for more than the quota allows one tenant.
    await tenant.address_class("if-shared", "198.51.100.192/27")
    for index in range(claims_allowed):
        await tenant.claim(f"c{index}", "if-shared")
    with pytest.raises(ApiError) as refused:
        await tenant.claim("one-too-many", "if-shared")
    assert refused.value.status == 403
    assert "exceeded quota" in refused.value.message

    # Attachments are counted too (these reference a claim each: none mints).
    await tenant.app_with_endpoint()
    for index in range(attachments_allowed):
        await tenant.attachment(f"a{index}", ENDPOINT, claim_name=f"c{index % claims_allowed}")
    with pytest.raises(ApiError) as refused:
        await tenant.attachment("one-too-many", ENDPOINT, claim_name="c0")
    assert refused.value.status == 403
    assert "exceeded quota" in refused.value.message
