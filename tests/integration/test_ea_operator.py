"""The EndpointAttachment operator on the local control plane, as a subprocess under its own
ServiceAccount and ClusterRole (config/rbac/endpointattachment), serving Cozystack's own
``EndpointAttachment`` and consuming Cozystack's address substrate: the substrate's real CRDs
(``tests/fixtures/address-substrate/``), the substrate's controllers played by their documented model
(``harness/substrate.py``), MetalLB's real controller assigning the pinned addresses, Flux's
real HelmRelease CRD. The tests play the other missing parts through the API: Cozystack's lineage
webhook (labels on the apps' Services) and the kubelet (Pods marked Ready with an IP).

Each test carries one of the contract's proofs: minting (from a class, from the default class),
referencing a reserved claim (never written by us), hold and move, a claim in use, a missing claim,
a pending claim, a family conflict, identity (a labelled Service without our reference, a recreated
application, a recreated attachment, garbage collection with the application), detach and reattach,
lineage stamped, the ``ports`` subset, nothing drawn while nothing can be published, Dual on the
claim's side, the substrate installed after the operator started (on a control plane of its own),
a second pass that writes nothing, and the Events ``kubectl describe`` shows (events.k8s.io/v1; a
flapping endpoint posts a bounded number).

Dual: this control plane serves IPv4 Services only, so a ``Dual`` attachment's claim binds two
addresses and the API refuses the dual-stack Service (422): the attachment reports
``RenderFailed`` with the API's own words, Pending, its claim and both addresses in its status.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Final

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from hack.devcluster import ClusterInfo, LocalControlPlane
from hack.metallb import metallb
from harness.ea_cluster import (
    ADDRESSES,
    ATTACHED,
    ATTACHMENT_CONTROLLER,
    ATTACHMENT_LABEL,
    ATTACHMENTS,
    CLAIM_ANNOTATION,
    CLAIMS,
    CONDITION_PROVISIONED,
    CONDITION_RESOLVED,
    DETACHED,
    EA_CRD_FILE,
    HELMRELEASE_CRD_FILE,
    OPERATOR_NAMESPACE,
    PENDING,
    SUBSTRATE_CRD_FILES,
    Tenant,
    World,
    addresses,
    attached,
    condition,
    ea_crds_and_node,
    ea_operator,
    ea_world,
    ingress,
    message,
    phase,
    provisioned_false,
    reconciles,
    resolved_false,
    service_body,
    wait_attachment,
)
from harness.lane import address_substrate
from harness.manifests import apply_all, kubectl, load, policies_installed
from harness.operators import RunningOperator
from harness.otlp import attributes, otlp_receiver
from harness.substrate import METALLB_IPS_ANNOTATION
from harness.waiting import eventually, wait_for_object
from shared.events import BURST
from shared.kube import ApiError, Kube, Obj
from shared.lineage import APPLICATION_GROUP_LABEL, APPLICATION_KIND_LABEL, APPLICATION_NAME_LABEL
from shared.resources import CONFIGMAPS, EVENTS_V1, HELMRELEASES, NAMESPACES, SERVICE_ACCOUNTS, SERVICES
from shared.telemetry.tracing import TRACEPARENT_ANNOTATION

# The garbage collector acts as its own ServiceAccount (the control plane runs kube-controller-manager
# with --use-service-account-credentials).
GC_USER: Final = "system:serviceaccount:kube-system:generic-garbage-collector"
GC_FENCE_PROBE: Final = "gc-fence-probe"
# A test's own finalizer: holds an object the test wants to outlive its owner a while.
HOLD_FINALIZER: Final = "example.com/hold"
# The admission policy config/default/endpointattachment installs.
ADMISSION_DIR: Final = "config/admission/endpointattachment"
FORBIDDEN: Final = 403
# The sentinel port of a vm-instance endpoint before the chart exposes the VM (nothing to publish).
VM_SENTINEL_PORT: Final = 65535


@pytest.fixture(scope="module")
async def world(kube: Kube) -> AsyncIterator[World]:
    async with ea_world(kube) as running:
        yield running


@pytest.fixture
async def operator(
    kube: Kube, cluster: ClusterInfo, world: World, tmp_path: Path
) -> AsyncIterator[RunningOperator]:
    """The operator; a test names it before ``tenant``, so it still runs while the tenant's world is
    cleaned up (its finalizer takes each attachment's Service away)."""
    async with ea_operator(kube, cluster, tmp_path) as running:
        yield running


@pytest.fixture
async def tenant(kube: Kube, namespace: str, world: World) -> AsyncIterator[Tenant]:
    await wait_for_object(kube, SERVICE_ACCOUNTS, "default", lambda o: o is not None, namespace=namespace)
    built = Tenant(kube, namespace, world)
    yield built
    await built.cleanup()


async def attachment_attached(tenant: Tenant, name: str, operator: RunningOperator) -> Obj:
    return await wait_attachment(
        tenant.kube, tenant.namespace, name, attached, operator, what=f"{name} Attached"
    )


async def only_claim(tenant: Tenant, attachment: Obj) -> Obj:
    claims = await tenant.minted_claims(attachment)
    assert len(claims) == 1, [c["metadata"]["name"] for c in claims]
    return claims[0]


async def settled(world: World) -> None:
    """Until the substrate has nothing left to write."""
    await world.substrate.settled()


async def _minted(
    tenant: Tenant, operator: RunningOperator, class_name: str, cidr: str
) -> tuple[str, Obj, Obj, Obj]:
    """A new class, application ``db`` with its endpoint, and attachment ``db-public`` minted from
    the class, Attached: (the endpoint's name, the attachment, its claim, its Service)."""
    await tenant.address_class(class_name, cidr)
    endpoint = await tenant.app_with_endpoint()
    await tenant.attachment("db-public", endpoint, class_name=class_name)
    ready = await attachment_attached(tenant, "db-public", operator)
    service = await tenant.service_of(ready)
    assert service is not None
    return endpoint, ready, await only_claim(tenant, ready), service


async def _attached_app(
    tenant: Tenant, operator: RunningOperator, class_name: str, cidr: str
) -> tuple[Obj, Obj, Obj]:
    """Application ``db`` (its HelmRelease), its endpoint, and attachment ``db-public`` minted from a
    new class, Attached; with its Service."""
    await tenant.address_class(class_name, cidr)
    release = await tenant.app("db")
    await tenant.endpoint("postgres-db-rw", "db", selector={"app": "db"})
    await tenant.attachment("db-public", "postgres-db-rw", class_name=class_name)
    ready = await attachment_attached(tenant, "db-public", operator)
    service = await tenant.service_of(ready)
    assert service is not None
    return release, ready, service


async def withdrawn(kube: Kube, service: Obj) -> None:
    """Until the Service is gone from the API."""
    name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
    await wait_for_object(
        kube, SERVICES, name, lambda s: s is None, namespace=namespace, what=f"{name} withdrawn"
    )


async def _versions(tenant: Tenant, attachment: Obj, claim: Obj) -> list[str]:
    """The resourceVersions of the attachment, its Service and its claim, as they are now."""
    found = (
        await tenant.get(attachment["metadata"]["name"]),
        await tenant.service_of(attachment),
        await tenant.kube.get(CLAIMS.path(tenant.namespace, claim["metadata"]["name"])),
    )
    return [str((o or {}).get("metadata", {}).get("resourceVersion")) for o in found]


async def _more(operator: RunningOperator, before: float) -> bool:
    return await reconciles(operator) > before


# --- minting --------------------------------------------------------------------------------------


async def test_a_minted_attachment_is_provisioned_with_its_claims_address(
    kube: Kube, operator: RunningOperator, tenant: Tenant, world: World
) -> None:
    ns = tenant.namespace
    await tenant.address_class("it-mint", "198.51.100.0/29")
    release = await tenant.app("db")
    endpoint = await tenant.endpoint("postgres-db-rw", "db", selector={"app": "db"})
    await tenant.attachment("db-public", "postgres-db-rw", class_name="it-mint")
    ready = await attachment_attached(tenant, "db-public", operator)

    # The claim: minted once, owned by the attachment, labelled with its name, from the class.
    claim = await only_claim(tenant, ready)
    assert claim["metadata"]["name"].startswith("db-public-")
    assert claim["metadata"]["labels"][ATTACHMENT_LABEL] == "db-public"
    assert claim["spec"]["className"] == "it-mint"
    assert phase(claim) == "Bound"
    [ip] = addresses(claim)
    assert ip.startswith("198.51.100.")
    assert ready["status"]["claimName"] == claim["metadata"]["name"]
    assert ready["status"]["addresses"] == [ip]
    assert ready["status"]["observedGeneration"] == ready["metadata"]["generation"]

    # The rendered Service: ours by owner reference, annotated with the claim, answered by MetalLB.
    service = await tenant.service_of(ready)
    assert service is not None
    assert ready["status"]["serviceName"] == service["metadata"]["name"]
    assert service["metadata"]["name"].startswith("db-public-")
    assert service["metadata"]["annotations"][CLAIM_ANNOTATION] == claim["metadata"]["name"]
    assert ingress(service) == [ip]
    assert service["spec"]["type"] == "LoadBalancer"
    assert service["spec"]["selector"] == {"app": "db"}
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(5432, 5432)]
    assert service["spec"].get("allocateLoadBalancerNodePorts") is False
    assert not any(p.get("nodePort") for p in service["spec"]["ports"])
    assert (service["spec"]["ipFamilyPolicy"], service["spec"]["ipFamilies"]) == ("SingleStack", ["IPv4"])
    assert "loadBalancerClass" not in service["spec"]
    # Nothing of the app's labels is copied: the platform must not take it for the app's own Service.
    assert set(service["metadata"]["labels"]) == {ATTACHMENT_LABEL}
    address = await kube.get(ADDRESSES.path(name=claim["status"]["addresses"][0]["name"]))
    assert (address or {})["status"]["associatedTo"] == {
        "kind": "Service",
        "namespace": ns,
        "name": service["metadata"]["name"],
    }

    # Lineage: the application's three labels and an owner reference to its HelmRelease (by UID).
    labels = ready["metadata"]["labels"]
    assert (
        labels[APPLICATION_GROUP_LABEL],
        labels[APPLICATION_KIND_LABEL],
        labels[APPLICATION_NAME_LABEL],
    ) == (
        "apps.cozystack.io",
        "Postgres",
        "db",
    )
    assert ready["metadata"]["ownerReferences"] == [
        {
            "apiVersion": HELMRELEASES.api_version,
            "kind": "HelmRelease",
            "name": release["metadata"]["name"],
            "uid": release["metadata"]["uid"],
            "controller": False,
            "blockOwnerDeletion": False,
        }
    ]

    # A second pass with nothing to change writes nothing: wake the attachment through its endpoint.
    await settled(world)
    versions = await _versions(tenant, ready, claim)
    before = await reconciles(operator)
    await kube.patch(
        SERVICES.path(ns, endpoint["metadata"]["name"]),
        {"metadata": {"annotations": {"touch": "1"}}},
        "merge",
    )
    await eventually(lambda: _more(operator, before), what="a pass over the attachment")
    assert await _versions(tenant, ready, claim) == versions

    # It follows the endpoint: a new port is mirrored.
    await kube.patch(
        SERVICES.path(ns, "postgres-db-rw"),
        {
            "spec": {
                "ports": [
                    {"name": "postgres", "port": 5432, "targetPort": 5432},
                    {"name": "metrics", "port": 9187},
                ]
            }
        },
        "merge",
    )
    await wait_for_object(
        kube,
        SERVICES,
        service["metadata"]["name"],
        lambda s: s is not None and len(s["spec"]["ports"]) == 2,
        namespace=ns,
        what="the new port mirrored",
    )

    # Deleting the attachment removes the Service, and garbage collection the minted claim; the
    # class's reclaim policy (Retain) keeps the address, Released.
    await kube.delete(ATTACHMENTS.path(ns, "db-public"))
    await wait_for_object(kube, ATTACHMENTS, "db-public", lambda o: o is None, namespace=ns)
    assert await kube.get(SERVICES.path(ns, service["metadata"]["name"])) is None
    await wait_for_object(
        kube, CLAIMS, claim["metadata"]["name"], lambda c: c is None, namespace=ns, timeout=60
    )
    await wait_for_object(
        kube, ADDRESSES, claim["status"]["addresses"][0]["name"], lambda a: phase(a) == "Released", timeout=30
    )


async def test_the_default_class_serves_an_attachment_that_names_none(
    kube: Kube, operator: RunningOperator, tenant: Tenant
) -> None:
    await tenant.address_class("it-default", "198.51.100.8/29", default=True)
    endpoint = await tenant.app_with_endpoint()
    await tenant.attachment("plain", endpoint)
    ready = await attachment_attached(tenant, "plain", operator)
    claim = await only_claim(tenant, ready)
    assert "className" not in claim["spec"]  # the substrate resolves the default, not us
    assert claim["status"]["className"] == "it-default"
    service = await tenant.service_of(ready)
    assert ingress(service) == addresses(claim) == ready["status"]["addresses"]


async def test_a_pending_claim_renders_no_service_and_no_address_is_drawn_twice(
    kube: Kube, operator: RunningOperator, tenant: Tenant
) -> None:
    """Six attachments on a class of four addresses (a /30: MetalLB hands out every address of the
    CIDR, the network's own and the broadcast included): four Attached, two ClaimPending with no
    Service rendered; one claim per attachment (no double mint), four distinct addresses. Freeing one
    (the class reclaims with Delete) lets a pending attachment have it."""
    ns = tenant.namespace
    await tenant.address_class("it-small", "198.51.100.16/30", reclaim="Delete")  # 4 addresses
    endpoint = await tenant.app_with_endpoint()
    names = [f"a{i}" for i in range(6)]
    await asyncio.gather(*(tenant.attachment(n, endpoint, class_name="it-small") for n in names))

    async def split() -> list[Obj] | None:
        items = (await kube.list(ATTACHMENTS.path(ns)))["items"]
        done = [a for a in items if attached(a)]
        pending = [a for a in items if provisioned_false("ClaimPending")(a)]
        return items if len(done) == 4 and len(pending) == 2 else None

    items = await eventually(split, timeout=90, what="4 Attached, 2 ClaimPending")
    drawn = [ip for a in items for ip in addresses(a)]
    assert len(drawn) == len(set(drawn)) == 4
    claims = (await kube.list(CLAIMS.path(ns)))["items"]
    assert len(claims) == 6, "one claim per attachment"
    for item in items:
        if not attached(item):
            assert phase(item) == PENDING
            assert await tenant.service_of(item) is None, "a Service rendered for a Pending claim"
            assert await tenant.labelled_services(item["metadata"]["name"]) == []

    winner = next(a for a in items if attached(a))
    await kube.delete(ATTACHMENTS.path(ns, winner["metadata"]["name"]))

    async def four_again() -> list[Obj] | None:
        now = [a for a in (await kube.list(ATTACHMENTS.path(ns)))["items"] if attached(a)]
        return now if len(now) == 4 else None

    now = await eventually(four_again, timeout=60, what="a pending attachment takes the freed address")
    assert len({ip for a in now for ip in addresses(a)}) == 4


async def test_nothing_is_drawn_while_nothing_can_be_published(
    kube: Kube, operator: RunningOperator, tenant: Tenant
) -> None:
    """A VM mode without the platform's datapath declaration (the default): DatapathContractUnavailable;
    a vm-instance endpoint with only its sentinel port and no ports or method: NothingToPublish.
    Neither mints a claim."""
    await tenant.address_class("it-nothing", "198.51.100.24/29")
    await tenant.app("vm1", kind="VMInstance")
    await tenant.endpoint(
        "vm1",
        "vm1",
        kind="VMInstance",
        selector={"vm": "vm1"},
        ports=[
            {"name": "sentinel", "protocol": "TCP", "port": VM_SENTINEL_PORT, "targetPort": VM_SENTINEL_PORT}
        ],
    )
    await tenant.attachment(
        "whole", "vm1", app="vm1", kind="VMInstance", class_name="it-nothing", method="WholeIP"
    )
    await tenant.attachment("bare", "vm1", app="vm1", kind="VMInstance", class_name="it-nothing")
    ns = tenant.namespace
    whole = await wait_attachment(
        kube, ns, "whole", provisioned_false("DatapathContractUnavailable"), operator
    )
    bare = await wait_attachment(kube, ns, "bare", provisioned_false("NothingToPublish"), operator)
    for item in (whole, bare):
        assert await tenant.minted_claims(item) == []
        assert await tenant.service_of(item) is None
        assert not item["status"].get("claimName")


# --- referencing a reserved claim -----------------------------------------------------------------


async def test_hold_and_move_a_reserved_claim_never_written(
    kube: Kube, operator: RunningOperator, tenant: Tenant, world: World
) -> None:
    ns = tenant.namespace
    await tenant.address_class("it-claims", "198.51.100.32/29")
    await tenant.bound_claim("held-ip", "it-claims")
    await settled(world)
    reserved = await kube.get(CLAIMS.path(ns, "held-ip"))
    assert reserved is not None
    [ip] = addresses(reserved)

    await tenant.app("one")
    await tenant.endpoint("postgres-one-rw", "one", selector={"app": "one"})
    await tenant.attachment("first", "postgres-one-rw", app="one", claim_name="held-ip")
    first = await attachment_attached(tenant, "first", operator)
    assert (first["status"]["claimName"], first["status"]["addresses"]) == ("held-ip", [ip])
    assert ingress(await tenant.service_of(first)) == [ip]
    assert await tenant.minted_claims(first) == []

    # Another application's attachment of the same claim while the first holds it: ClaimInUse,
    # nothing rendered (no address is ever Provisioned on two Services).
    await tenant.app("two", kind="MySQL")
    await tenant.endpoint("mysql-two", "two", kind="MySQL", selector={"app": "two"})
    await tenant.attachment("second", "mysql-two", app="two", kind="MySQL", claim_name="held-ip")
    waiting = await wait_attachment(kube, ns, "second", provisioned_false("ClaimInUse"), operator)
    assert await tenant.service_of(waiting) is None

    # Hold: the claim's address survives the attachment that used it.
    await kube.delete(ATTACHMENTS.path(ns, "first"))
    gone_at = time.monotonic()
    await wait_for_object(kube, ATTACHMENTS, "first", lambda o: o is None, namespace=ns)

    # Move: the other application's attachment gets the same address, without a requeue.
    second = await attachment_attached(tenant, "second", operator)
    moved_after = time.monotonic() - gone_at
    assert second["status"]["addresses"] == [ip]
    assert ingress(await tenant.service_of(second)) == [ip]
    print(f"move: the second attachment Attached {moved_after:.2f}s after the first was deleted")

    # The referenced claim was never written by us: the same object, version and all.
    await settled(world)
    claim = await kube.get(CLAIMS.path(ns, "held-ip"))
    assert claim is not None
    assert claim["metadata"] == reserved["metadata"]
    assert claim["status"]["addresses"] == reserved["status"]["addresses"]


async def test_a_lost_claim_is_no_longer_provisioned(
    kube: Kube, operator: RunningOperator, tenant: Tenant
) -> None:
    """The address behind a reserved claim goes (a hoster deletes the IPAddress): the substrate marks
    the claim Lost, and the attachment stops saying Provisioned: ClaimPending, naming the phase, its
    Service withdrawn (the address reaches nobody through it any more)."""
    await tenant.address_class("it-lost", "198.51.100.136/29")
    claim = await tenant.bound_claim("fragile", "it-lost")
    endpoint = await tenant.app_with_endpoint()
    await tenant.attachment("db-public", endpoint, claim_name="fragile")
    ready = await attachment_attached(tenant, "db-public", operator)
    service = await tenant.service_of(ready)
    assert service is not None

    await kube.delete(ADDRESSES.path(name=claim["status"]["addresses"][0]["name"]))
    await wait_for_object(
        kube, CLAIMS, "fragile", lambda c: phase(c) == "Lost", namespace=tenant.namespace, what="claim Lost"
    )
    lost = await wait_attachment(
        kube, tenant.namespace, "db-public", provisioned_false("ClaimPending"), operator
    )
    assert "Lost" in message(lost, CONDITION_PROVISIONED), message(lost, CONDITION_PROVISIONED)
    assert phase(lost) == PENDING
    assert not lost["status"].get("addresses")
    await withdrawn(kube, service)


async def test_a_claim_associated_to_another_live_service_is_in_use(
    kube: Kube, operator: RunningOperator, tenant: Tenant
) -> None:
    ns = tenant.namespace
    await tenant.address_class("it-inuse", "198.51.100.40/29")
    claim = await tenant.bound_claim("theirs", "it-inuse")
    [ip] = addresses(claim)
    foreign = service_body(
        "hand-made", selector={"app": "other"}, type_="LoadBalancer", annotations={CLAIM_ANNOTATION: "theirs"}
    )
    await kube.create(SERVICES.path(ns), foreign)
    await wait_for_object(kube, SERVICES, "hand-made", lambda s: ingress(s) == [ip], namespace=ns)

    endpoint = await tenant.app_with_endpoint()
    await tenant.attachment("late", endpoint, claim_name="theirs")
    in_use = await wait_attachment(kube, ns, "late", provisioned_false("ClaimInUse"), operator)
    assert "hand-made" in message(in_use, CONDITION_PROVISIONED), message(in_use, CONDITION_PROVISIONED)
    assert await tenant.service_of(in_use) is None

    # The foreign holder goes: picked up from the watch (the contract's bar: within a second).
    await kube.delete(SERVICES.path(ns, "hand-made"))
    gone_at = time.monotonic()
    late = await attachment_attached(tenant, "late", operator)
    print(f"claim in use: Attached {time.monotonic() - gone_at:.2f}s after the foreign holder went")
    assert late["status"]["addresses"] == [ip]


async def test_a_missing_claim_is_not_found_until_it_exists(
    kube: Kube, operator: RunningOperator, tenant: Tenant, namespace: str
) -> None:
    """Not found: a claim of that name nowhere, or only in another namespace; created later, the
    attachment picks it up from the watch."""
    other = f"{namespace}-other"[:63]
    await kube.create(
        NAMESPACES.path(), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": other}}
    )
    try:
        await tenant.address_class("it-missing", "198.51.100.48/29")
        elsewhere = Tenant(kube, other, tenant.world)
        await elsewhere.bound_claim("wanted", "it-missing")
        endpoint = await tenant.app_with_endpoint()
        await tenant.attachment("wants", endpoint, claim_name="wanted")
        missing = await wait_attachment(
            kube, namespace, "wants", provisioned_false("ClaimNotFound"), operator
        )
        assert await tenant.service_of(missing) is None
        assert phase(missing) == PENDING

        await tenant.bound_claim("wanted", "it-missing")
        found = await attachment_attached(tenant, "wants", operator)
        mine = await kube.get(CLAIMS.path(namespace, "wanted"))
        assert found["status"]["addresses"] == addresses(mine)
        assert addresses(mine) != addresses(await kube.get(CLAIMS.path(other, "wanted")))
    finally:
        for claim in (await kube.list(CLAIMS.path(other)))["items"]:
            await kube.delete(CLAIMS.path(other, claim["metadata"]["name"]))
        await wait_for_object(kube, CLAIMS, "wanted", lambda c: c is None, namespace=other)
        await kube.delete(NAMESPACES.path(name=other))


async def test_a_referenced_claim_of_another_family_is_a_family_conflict(
    kube: Kube, operator: RunningOperator, tenant: Tenant
) -> None:
    await tenant.address_class("it-family", "198.51.100.56/29")
    await tenant.bound_claim("v4-only", "it-family", family="IPv4")
    endpoint = await tenant.app_with_endpoint()
    await tenant.attachment("six", endpoint, claim_name="v4-only", family="IPv6")
    conflict = await wait_attachment(
        kube, tenant.namespace, "six", provisioned_false("FamilyConflict"), operator
    )
    said = message(conflict, CONDITION_PROVISIONED)
    assert "IPv4" in said, said
    assert "IPv6" in said, said
    assert await tenant.service_of(conflict) is None


async def test_the_ports_subset_is_mirrored(kube: Kube, operator: RunningOperator, tenant: Tenant) -> None:
    ns = tenant.namespace
    await tenant.address_class("it-ports", "198.51.100.64/29")
    await tenant.app("db")
    await tenant.endpoint(
        "postgres-db-rw",
        "db",
        selector={"app": "db"},
        ports=[
            {"name": "postgres", "protocol": "TCP", "port": 5432, "targetPort": 5432},
            {"name": "metrics", "protocol": "TCP", "port": 9187, "targetPort": 9187},
        ],
    )
    await tenant.attachment("metrics", "postgres-db-rw", class_name="it-ports", ports=[9187])
    ready = await attachment_attached(tenant, "metrics", operator)
    service = await tenant.service_of(ready)
    assert service is not None
    assert [(p["name"], p["port"]) for p in service["spec"]["ports"]] == [("metrics", 9187)]

    # ports is a render knob: widened, the same Service mirrors both.
    await kube.patch(
        ATTACHMENTS.path(ns, "metrics"), {"spec": {"loadBalancer": {"ports": [5432, 9187]}}}, "merge"
    )
    await wait_for_object(
        kube,
        SERVICES,
        service["metadata"]["name"],
        lambda s: s is not None and sorted(p["port"] for p in s["spec"]["ports"]) == [5432, 9187],
        namespace=ns,
        what="both ports mirrored",
    )


# --- identity --------------------------------------------------------------------------------------


async def test_identity_a_labelled_service_without_our_reference_is_never_touched(
    kube: Kube, operator: RunningOperator, tenant: Tenant
) -> None:
    ns = tenant.namespace
    await tenant.address_class("it-squat", "198.51.100.72/29")
    endpoint = await tenant.app_with_endpoint()
    squatter = await kube.create(
        SERVICES.path(ns),
        service_body("squatter", labels={ATTACHMENT_LABEL: "db-public"}, selector={"app": "elsewhere"}),
    )
    await tenant.attachment("db-public", endpoint, class_name="it-squat")
    ready = await attachment_attached(tenant, "db-public", operator)
    service = await tenant.service_of(ready)
    assert service is not None
    assert service["metadata"]["name"] != "squatter"
    assert ready["status"]["serviceName"] == service["metadata"]["name"]

    await kube.delete(ATTACHMENTS.path(ns, "db-public"))
    await wait_for_object(kube, ATTACHMENTS, "db-public", lambda o: o is None, namespace=ns)
    still = await kube.get(SERVICES.path(ns, "squatter"))
    assert still is not None
    assert still["metadata"]["resourceVersion"] == squatter["metadata"]["resourceVersion"]


async def test_identity_a_recreated_application_withdraws_and_inherits_nothing(
    kube: Kube, operator: RunningOperator, tenant: Tenant
) -> None:
    """The HelmRelease deleted and recreated under the same name (a new UID): the attachment reports
    ApplicationIncarnationChanged and its Service is withdrawn; nothing of it passes to the new
    incarnation. The garbage collector would collect the attachment at once (its owner's UID is
    gone), so a policy holds the collector's delete back for the observation (the GC retries)."""
    ns = tenant.namespace
    release, _, service = await _attached_app(tenant, operator, "it-reborn", "198.51.100.80/29")

    await _fence_the_garbage_collector(kube, tenant)
    await kube.delete(HELMRELEASES.path(ns, release["metadata"]["name"]))
    await wait_for_object(kube, HELMRELEASES, release["metadata"]["name"], lambda o: o is None, namespace=ns)
    reborn = await tenant.app("db")
    assert reborn["metadata"]["uid"] != release["metadata"]["uid"]

    changed = await wait_attachment(
        kube, ns, "db-public", resolved_false("ApplicationIncarnationChanged"), operator
    )
    await withdrawn(kube, service)
    assert phase(changed) != ATTACHED
    assert condition(changed, CONDITION_PROVISIONED)[0] == "False"
    owners = [r["uid"] for r in changed["metadata"].get("ownerReferences") or []]
    assert reborn["metadata"]["uid"] not in owners, "the new incarnation was adopted"
    assert await tenant.service_of(changed) is None


async def _fence_the_garbage_collector(kube: Kube, tenant: Tenant) -> None:
    """A policy refusing the garbage collector's deletes of attachments in the tenant's namespace
    (and everyone's delete of one probe ConfigMap, by which the test sees the policy in force)."""
    ns = tenant.namespace
    await tenant.policy(
        "gc-fence",
        [
            {
                "apiGroups": [ATTACHMENTS.api_version.split("/")[0]],
                "apiVersions": ["v1alpha1"],
                "operations": ["DELETE"],
                "resources": ["endpointattachments"],
            },
            {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["DELETE"], "resources": ["configmaps"]},
        ],
        f"request.userInfo.username != '{GC_USER}' && "
        f"!(request.kind.kind == 'ConfigMap' && oldObject.metadata.name == '{GC_FENCE_PROBE}')",
        "the garbage collector waits (test fence)",
    )
    await kube.create(
        CONFIGMAPS.path(ns), {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": GC_FENCE_PROBE}}
    )

    async def in_force() -> bool:
        try:
            await kube.delete(CONFIGMAPS.path(ns, GC_FENCE_PROBE))
        except ApiError as error:
            return error.status == 403
        await kube.create(
            CONFIGMAPS.path(ns),
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": GC_FENCE_PROBE}},
        )
        return False

    await eventually(in_force, what="the garbage collector's fence in force")


async def test_identity_deleting_the_application_collects_its_attachment(
    kube: Kube, operator: RunningOperator, tenant: Tenant
) -> None:
    ns = tenant.namespace
    release, ready, service = await _attached_app(tenant, operator, "it-gc", "198.51.100.88/29")
    claim = await only_claim(tenant, ready)

    # Real garbage collection: the owner reference to the HelmRelease takes the attachment along,
    # our finalizer takes its Service first, and the minted claim follows the attachment.
    await kube.delete(HELMRELEASES.path(ns, release["metadata"]["name"]))
    await wait_for_object(kube, ATTACHMENTS, "db-public", lambda o: o is None, namespace=ns, timeout=60)
    assert await kube.get(SERVICES.path(ns, service["metadata"]["name"])) is None
    await wait_for_object(
        kube, CLAIMS, claim["metadata"]["name"], lambda c: c is None, namespace=ns, timeout=60
    )

    # The application recreated under the same name inherits nothing.
    await tenant.app("db")
    assert (await kube.list(ATTACHMENTS.path(ns)))["items"] == []


async def test_identity_a_recreated_attachment_adopts_nothing(
    kube: Kube, operator: RunningOperator, tenant: Tenant
) -> None:
    """An attachment deleted and created again under the same name: it mints a claim of its own and
    renders a Service of its own, though the old claim (held here by a finalizer of the test's) is
    still there with the same diagnostic label."""
    ns = tenant.namespace
    endpoint, old, old_claim, old_service = await _minted(tenant, operator, "it-again", "198.51.100.96/29")
    claim_path = CLAIMS.path(ns, old_claim["metadata"]["name"])
    finalizers = [*old_claim["metadata"].get("finalizers", []), HOLD_FINALIZER]
    await kube.patch(claim_path, {"metadata": {"finalizers": finalizers}}, "merge")
    try:
        await kube.delete(ATTACHMENTS.path(ns, "db-public"))
        await wait_for_object(kube, ATTACHMENTS, "db-public", lambda o: o is None, namespace=ns)
        assert await kube.get(claim_path) is not None

        await tenant.attachment("db-public", endpoint, class_name="it-again")
        new = await attachment_attached(tenant, "db-public", operator)
        new_claim = await only_claim(tenant, new)
        new_service = await tenant.service_of(new)
        assert new_service is not None
        assert new_claim["metadata"]["name"] != old_claim["metadata"]["name"]
        assert new["status"]["claimName"] == new_claim["metadata"]["name"]
        assert new_service["metadata"]["uid"] != old_service["metadata"]["uid"]
        left = await kube.get(claim_path)
        assert left is not None
        assert [r["uid"] for r in left["metadata"]["ownerReferences"]] == [old["metadata"]["uid"]]
    finally:
        held = await kube.get(claim_path)
        if held is not None:
            kept = [f for f in held["metadata"].get("finalizers", []) if f != HOLD_FINALIZER]
            await kube.patch(claim_path, {"metadata": {"finalizers": kept}}, "merge")


# --- detach and reattach ---------------------------------------------------------------------------


async def test_detach_and_reattach_with_the_same_address(
    kube: Kube, operator: RunningOperator, tenant: Tenant
) -> None:
    ns = tenant.namespace
    endpoint, ready, claim, service = await _minted(tenant, operator, "it-detach", "198.51.100.104/29")
    held = ready["status"]["addresses"]

    await kube.delete(SERVICES.path(ns, endpoint))
    detached = await wait_attachment(
        kube,
        ns,
        "db-public",
        lambda o: phase(o) == DETACHED and provisioned_false("EndpointDetached")(o),
        operator,
    )
    await withdrawn(kube, service)
    assert detached["status"]["claimName"] == claim["metadata"]["name"]
    assert not detached["status"].get("serviceName")
    kept = await kube.get(CLAIMS.path(ns, claim["metadata"]["name"]))
    assert (phase(kept), addresses(kept)) == ("Bound", held)

    await tenant.endpoint(endpoint, "db", selector={"app": "db", "role": "primary"})
    back = await attachment_attached(tenant, "db-public", operator)
    assert back["status"]["addresses"] == held
    assert back["status"]["claimName"] == claim["metadata"]["name"]
    assert ingress(await tenant.service_of(back)) == held


# --- Dual, on the claim's side ---------------------------------------------------------------------


async def test_the_shipped_admission_policy_lets_the_drivers_pin_through(
    kube: Kube, cluster: ClusterInfo, operator: RunningOperator, tenant: Tenant
) -> None:
    """config/default/endpointattachment's admission policy in force (``kubectl apply -k`` of
    config/admission/endpointattachment, the one part of it that judges the driver's writes): the
    substrate's driver pins the rendered Service (its address annotation and its marker, one Update,
    as its own ServiceAccount) and the attachment is Attached; the policy still refuses anyone else's
    pin. Before the policy exempted the driver's marker, no attachment ever got its address here."""
    async with policies_installed(cluster, ADMISSION_DIR):
        await tenant.address_class("it-policy", "198.51.100.136/29")
        endpoint = await tenant.app_with_endpoint()
        probe = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "generateName": "probe-",
                "ownerReferences": [
                    {
                        "apiVersion": ATTACHMENTS.api_version,
                        "kind": "EndpointAttachment",
                        "name": "x",
                        "uid": "0",
                    }
                ],
            },
            "spec": {"ports": [{"port": 80}]},
        }

        async def in_force() -> bool:
            try:
                await kube.request(
                    "POST", SERVICES.path(tenant.namespace), body=probe, params={"dryRun": "All"}
                )
            except ApiError as error:
                return error.status == FORBIDDEN
            return False

        await eventually(in_force, timeout=60, interval=0.5, what="the rendered-Services policy in force")
        await tenant.attachment("db-public", endpoint, class_name="it-policy")
        ready = await attachment_attached(tenant, "db-public", operator)
        service = await tenant.service_of(ready)
        assert service is not None
        assert ingress(service) == addresses(ready)
        pin = {"metadata": {"annotations": {METALLB_IPS_ANNOTATION: "198.51.100.140"}}}
        with pytest.raises(ApiError) as refused:
            await kube.patch(SERVICES.path(tenant.namespace, service["metadata"]["name"]), pin, "merge")
        assert refused.value.status == FORBIDDEN


async def test_ipv6_and_dual_attachments_are_attached_with_every_family(
    kube: Kube, operator: RunningOperator, tenant: Tenant
) -> None:
    """On the dual-stack control plane (IPv4 primary): a Dual attachment is Attached with an IPv4 and
    an IPv6 address, both in its Service's ingress (IPv4 first); an IPv6 one with its IPv6 address;
    an attachment naming no family is IPv4 and its Service single-stack. (The IPv6 range does not
    start at a ``::`` address: the real driver names that one ``ip-...--``, which no label may be,
    and the claim stays Pending.)"""
    await tenant.address_class("it-dual", "2001:db8:200::100/120", "198.51.100.112/29")
    endpoint = await tenant.app_with_endpoint()
    await tenant.attachment("both", endpoint, class_name="it-dual", family="Dual")
    await tenant.attachment("six", endpoint, class_name="it-dual", family="IPv6")
    await tenant.attachment("four", endpoint, class_name="it-dual")
    both = await attachment_attached(tenant, "both", operator)
    v4, v6 = addresses(both)
    assert (v4.startswith("198.51.100."), v6.startswith("2001:db8:200:")) == (True, True)
    service = await tenant.service_of(both)
    assert service is not None
    assert service["spec"]["ipFamilies"] == ["IPv4", "IPv6"]
    assert ingress(service) == [v4, v6]
    assert (await only_claim(tenant, both))["spec"]["family"] == "Dual"

    six = await attachment_attached(tenant, "six", operator)
    [ip6] = addresses(six)
    assert (ip6.startswith("2001:db8:200:"), ip6 == v6) == (True, False)
    service = await tenant.service_of(six)
    assert service is not None
    assert (service["spec"]["ipFamilies"], ingress(service)) == (["IPv6"], [ip6])

    four = await attachment_attached(tenant, "four", operator)
    service = await tenant.service_of(four)
    assert service is not None
    assert (service["spec"]["ipFamilies"], service["spec"].get("ipFamilyPolicy")) == (["IPv4"], "SingleStack")


# --- the substrate installed after the operator started --------------------------------------------


@pytest.fixture
def own_cluster() -> Iterator[ClusterInfo]:
    with LocalControlPlane() as info:
        yield info


async def test_the_substrate_installed_after_the_operator_started(
    own_cluster: ClusterInfo, tmp_path: Path
) -> None:
    """On a control plane of its own (the substrate's CRDs are absent there at first): the
    attachment reports ClaimPending saying the substrate is not installed; once a hoster installs it
    (CRDs, controllers, a class) the same operator process provisions it, without a restart."""
    kube = await Kube.connect(own_cluster.kubeconfig)
    ns = "tenant-late"
    async with (
        ea_crds_and_node(kube, [HELMRELEASE_CRD_FILE, EA_CRD_FILE]),
        metallb(kube, own_cluster.kubeconfig, tmp_path / "metallb.log"),
        ea_operator(kube, own_cluster, tmp_path) as running,
    ):
        await kube.create(
            NAMESPACES.path(), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
        )
        await wait_for_object(kube, SERVICE_ACCOUNTS, "default", lambda o: o is not None, namespace=ns)
        tenant = Tenant(kube, ns)
        endpoint = await tenant.app_with_endpoint()
        await tenant.attachment("early", endpoint, class_name="late")
        absent = await wait_attachment(kube, ns, "early", provisioned_false("ClaimPending"), running)
        said = message(absent, CONDITION_PROVISIONED)
        assert "substrate" in said.lower() or "not installed" in said.lower(), said
        assert await tenant.service_of(absent) is None

        await apply_all(kube, [doc for path in SUBSTRATE_CRD_FILES for doc in load(path)])
        async with address_substrate(kube):
            await tenant.address_class("late", "198.51.100.120/29")
            ready = await attachment_attached(tenant, "early", running)
            assert running.process.returncode is None
            assert len(addresses(ready)) == 1
    # The control plane stops with the fixture: nothing to clean up in it.


# --- traces and metrics ----------------------------------------------------------------------------


async def test_traces_chain_an_attachments_life_and_metrics_describe_it(
    kube: Kube, cluster: ClusterInfo, world: World, tenant: Tenant, tmp_path: Path
) -> None:
    ns = tenant.namespace
    with otlp_receiver() as receiver:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "COZY_TRACE_UNCHANGED_RATIO": "1",
            "OTEL_RESOURCE_ATTRIBUTES": f"k8s.pod.name=ea-under-test,k8s.namespace.name={OPERATOR_NAMESPACE}",
        }
        async with ea_operator(kube, cluster, tmp_path, env) as operator:
            await tenant.address_class("it-trace", "198.51.100.128/29")
            endpoint = await tenant.app_with_endpoint()
            await tenant.attachment("traced", endpoint, class_name="it-trace")
            ready = await attachment_attached(tenant, "traced", operator)
            uid = ready["metadata"]["uid"]

            # The rendered Service carries the traceparent of the pass that wrote it.
            service = await tenant.service_of(ready)
            assert service is not None
            traceparent = service["metadata"]["annotations"][TRACEPARENT_ANNOTATION]
            version, trace_id, _, _ = traceparent.split("-")
            assert (version, len(trace_id)) == ("00", 32)

            def passes() -> list[Span]:
                return sorted(
                    (
                        s
                        for s in receiver.snapshot()
                        if s.name == "reconcile EndpointAttachment"
                        and attributes(s).get("k8s.object.uid") == uid
                    ),
                    key=lambda s: s.start_time_unix_nano,
                )

            async def provisioned() -> list[Span] | None:
                chain = passes()
                reasons = [attributes(s).get("condition.reasons") for s in chain]
                return (
                    chain
                    if any(isinstance(r, list) and CONDITION_PROVISIONED in r for r in reasons)
                    else None
                )

            chain = await eventually(provisioned, what="the pass that provisioned, exported")
            # At least: minted (the claim not Bound yet), rendered once Bound, then Provisioned.
            assert len(chain) >= 2
            for earlier, later in itertools.pairwise(chain):
                assert any(link.span_id == earlier.span_id for link in later.links), "passes are not chained"
            assert "changed" in {attributes(s)["outcome"] for s in chain}
            writes = [s for s in receiver.snapshot() if s.name == "POST services"]
            assert any(s.trace_id.hex() == trace_id for s in writes), (
                "no Service write in the annotated trace"
            )
            assert any(r.get("k8s.pod.name") == "ea-under-test" for r in receiver.resources)
            assert any(
                r.get("service.name") == "cozystack-endpointattachment-operator" for r in receiver.resources
            )

            # Metrics, parsed as Prometheus would: one controller now (the claim and class ones are gone).
            samples = await operator.scrape()
            names = {name for name, _ in samples}
            assert {
                "controller_runtime_reconcile_total",
                "controller_runtime_reconcile_time_seconds_bucket",
                "workqueue_depth",
                "leader_election_master_status",
            } <= names
            assert {labels for name, labels in samples if name == "controller_runtime_active_workers"} == {
                (("controller", ATTACHMENT_CONTROLLER),)
            }
            success = (
                "controller_runtime_reconcile_total",
                (("controller", ATTACHMENT_CONTROLLER), ("result", "success")),
            )
            assert samples[success] >= 1
            provisioned_true = (
                "cozystack_endpointattachment_attachments",
                (("reason", CONDITION_PROVISIONED), ("status", "True"), ("type", CONDITION_PROVISIONED)),
            )
            assert samples[provisioned_true] >= 1
            assert condition(ready, CONDITION_RESOLVED) == ("True", CONDITION_RESOLVED)
            assert await operator.healthz() == 200

            # Gone while this operator still runs (its finalizer takes the Service first).
            await kube.delete(ATTACHMENTS.path(ns, "traced"))
            await wait_for_object(kube, ATTACHMENTS, "traced", lambda o: o is None, namespace=ns)


# --- Events: what kubectl describe shows ------------------------------------------------------------

# Our Events' reportingController (controller.REPORTING_CONTROLLER), as kubectl describe's "From".
REPORTING_CONTROLLER: Final = "cozystack.io/endpointattachment-operator"
# Detach-and-reattach cycles of the flapping test: each would be three Events (Withdrawn, Rendered,
# Provisioned), more than the attachment's budget allows at once.
FLAPS: Final = 6


async def events_about(kube: Kube, attachment: Obj) -> list[Obj]:
    """The events.k8s.io/v1 Events regarding the attachment (this incarnation), oldest first."""
    metadata = attachment["metadata"]
    found = (await kube.list(EVENTS_V1.path(metadata["namespace"])))["items"]
    mine = [e for e in found if (e.get("regarding") or {}).get("uid") == metadata["uid"]]
    return sorted(mine, key=lambda e: str(e.get("eventTime")))


async def test_kubectl_describe_shows_what_the_operator_did(
    kube: Kube, cluster: ClusterInfo, operator: RunningOperator, tenant: Tenant
) -> None:
    endpoint, ready, _, _ = await _minted(tenant, operator, "it-events", "198.51.100.200/29")
    status = ready["status"]

    async def described() -> str | None:
        code, out, err = await kubectl(
            cluster, "-n", tenant.namespace, "describe", "endpointattachment", "db-public"
        )
        assert code == 0, err
        wanted = ("ClaimMinted", "Rendered", "Provisioned")
        return out if all(reason in out for reason in wanted) else None

    try:
        out = await eventually(described, what="the Events in kubectl describe", timeout=30)
    except AssertionError as error:
        raise AssertionError(f"{error}\noperator log:\n{operator.log_tail()}") from None
    events_section = out[out.index("Events:") :]
    print(events_section)  # the tenant docs show this output
    assert f"minted IPAddressClaim {status['claimName']} of class it-events" in events_section
    assert f"rendered Service {status['serviceName']} for endpoint {endpoint}" in events_section
    assert REPORTING_CONTROLLER in events_section, "From: the reporting controller"

    events = await events_about(kube, ready)
    assert [e["reason"] for e in events] == ["ClaimMinted", "Rendered", "Provisioned"], "one each, in order"
    for event in events:
        assert event["reportingController"] == REPORTING_CONTROLLER
        assert event["reportingInstance"], "the replica that posted it"
        assert event["type"] == "Normal"
        assert event["regarding"]["kind"] == "EndpointAttachment"
    assert [e["action"] for e in events] == ["Mint", "Render", "Provision"]


async def test_a_flapping_endpoint_posts_a_bounded_number_of_events(
    kube: Kube, operator: RunningOperator, tenant: Tenant
) -> None:
    ns = tenant.namespace
    endpoint, ready, _, _ = await _minted(tenant, operator, "it-events-flap", "198.51.100.208/29")
    for _ in range(FLAPS):
        await kube.delete(SERVICES.path(ns, endpoint))
        await wait_attachment(kube, ns, "db-public", lambda o: phase(o) == DETACHED, operator)
        await tenant.endpoint(endpoint, "db", selector={"app": "db", "role": "primary"})
        await wait_attachment(kube, ns, "db-public", attached, operator)

    events = await events_about(kube, ready)
    occurrences = sum(int((e.get("series") or {}).get("count") or 1) for e in events)
    reasons = sorted({e["reason"] for e in events})
    print(
        f"{FLAPS} detach/reattach cycles: {len(events)} Event objects, {occurrences} occurrences: {reasons}"
    )
    assert len(events) <= BURST, "at most the budget of writes, whatever the attachment does"
    assert len(events) == BURST, "unbounded, the cycles would have made 3 + 3 per cycle"
    assert {"ClaimMinted", "Rendered", "Provisioned", "Withdrawn"} <= set(reasons)
