"""The EndpointAttachment kinds' schemas and RBAC (config/crd/endpointattachment/,
config/rbac/endpointattachment) on the local control plane.

What the API server itself refuses, with the message a person reads, one row per promise; what the
operator's pure core reads and writes (built by the same builders and core functions the unit tests
use), accepted as is; a stock object-count ResourceQuota on attachments; and the verbs the operator
and tenants hold, asked of the real RBAC authorizer.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from operators.endpointattachment.addresses import Holder, allocation_manifest, parse_address
from operators.endpointattachment.constants import (
    API_VERSION,
    COND_ADDRESS_BOUND,
    CONDITION_TYPES,
    ENDPOINT_ATTACHMENT_KIND,
    ENDPOINT_ATTACHMENT_PLURAL,
    GROUP,
    IP_ADDRESS_ALLOCATION_KIND,
    IP_ADDRESS_ALLOCATION_PLURAL,
    IP_ADDRESS_CLAIM_KIND,
    IP_ADDRESS_CLAIM_PLURAL,
    IP_ADDRESS_CLASS_KIND,
    IP_ADDRESS_CLASS_PLURAL,
    SERVICE_PROXY_KIND,
    SERVICE_PROXY_PLURAL,
)
from operators.endpointattachment.reconcile import Observed, reconcile
from shared.conditions import TRUE, rfc3339
from shared.kube import ApiError, Kube, Obj
from shared.resources import CLUSTER_ROLES, RESOURCE_QUOTAS, ROLE_BINDINGS, SUBJECT_ACCESS_REVIEWS, Resource
from tests.ea_builders import (
    for_create,
    make_attachment,
    make_claim,
    make_class,
    make_helmrelease,
    make_service,
    make_serviceproxy,
)
from tests.support.manifests import apply_all, load
from tests.support.waiting import wait_for_object

CRD_FILES = tuple(
    f"config/crd/endpointattachment/{GROUP}_{plural}.yaml"
    for plural in (
        ENDPOINT_ATTACHMENT_PLURAL,
        IP_ADDRESS_CLAIM_PLURAL,
        IP_ADDRESS_CLASS_PLURAL,
        IP_ADDRESS_ALLOCATION_PLURAL,
        SERVICE_PROXY_PLURAL,
    )
)
RBAC_FILES = tuple(
    f"config/rbac/endpointattachment/{name}.yaml"
    for name in ("service_account", "role", "role_binding", "tenant_roles")
)
OPERATOR_NAMESPACE = "cozy-endpointattachment"
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NAMESPACE}:endpointattachment-operator"

ATTACHMENTS = Resource(API_VERSION, ENDPOINT_ATTACHMENT_PLURAL)
CLAIMS = Resource(API_VERSION, IP_ADDRESS_CLAIM_PLURAL)
CLASSES = Resource(API_VERSION, IP_ADDRESS_CLASS_PLURAL, namespaced=False)
ALLOCATIONS = Resource(API_VERSION, IP_ADDRESS_ALLOCATION_PLURAL, namespaced=False)
PROXIES = Resource(API_VERSION, SERVICE_PROXY_PLURAL, namespaced=False)
RESOURCES = {
    ENDPOINT_ATTACHMENT_KIND: ATTACHMENTS,
    IP_ADDRESS_CLAIM_KIND: CLAIMS,
    IP_ADDRESS_CLASS_KIND: CLASSES,
    IP_ADDRESS_ALLOCATION_KIND: ALLOCATIONS,
    SERVICE_PROXY_KIND: PROXIES,
}
QUOTA_KEY = f"count/{ENDPOINT_ATTACHMENT_PLURAL}.{GROUP}"
AGGREGATE_PREFIX = "rbac.authorization.k8s.io/"


# --- Objects ---------------------------------------------------------------------------------------


def with_spec(obj: Mapping[str, Any], **fields: Any) -> Obj:
    """A copy of ``obj`` with top-level spec fields set (None removes one)."""
    copied = copy.deepcopy(dict(obj))
    spec = copied.setdefault("spec", {})
    for key, value in fields.items():
        if value is None:
            spec.pop(key, None)
        else:
            spec[key] = value
    return copied


def attachment(name: str = "db-public", **spec: Any) -> Obj:
    """An attachment as a tenant writes it: endpoint postgres-db-rw, minted from public-v4."""
    return with_spec(for_create(make_attachment(name, owner_uid=None)), **spec)


def claim(name: str = "my-ip", **spec: Any) -> Obj:
    """A claim of public-v4 for 203.0.113.20."""
    return with_spec(for_create(make_claim(name)), **spec)


def address_class(name: str, **spec: Any) -> Obj:
    """A MetalLB IPv4 class of 203.0.113.0/26, named ``name``."""
    return with_spec(for_create(make_class(name)), **spec)


def allocation(address: str, *, name: str | None = None, holder_kind: str = ENDPOINT_ATTACHMENT_KIND) -> Obj:
    """The allocation the core creates to lock ``address`` (optionally renamed, to break it)."""
    holder = Holder(kind=holder_kind, namespace="tenant-a", name="db-public", uid="0d7c6c1e-uid")
    manifest = allocation_manifest(parse_address(address), "public-v4", holder)
    if name is not None:
        manifest["metadata"]["name"] = name
    return manifest


def service_proxy(name: str = "schema-cozy-proxy", **spec: Any) -> Obj:
    return with_spec(for_create(make_serviceproxy(name)), **spec)


class Scratch:
    """Creates objects for one test: namespaced ones in its namespace, cluster-scoped ones deleted after."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.cluster_paths: list[str] = []

    def path_of(self, obj: Mapping[str, Any]) -> str:
        resource = RESOURCES[obj["kind"]]
        return resource.path(self.namespace, obj["metadata"]["name"])

    async def create(self, obj: Mapping[str, Any]) -> Obj:
        resource = RESOURCES[obj["kind"]]
        body = copy.deepcopy(dict(obj))
        if resource.namespaced:
            body["metadata"]["namespace"] = self.namespace
        created = await self.kube.create(resource.path(self.namespace), body)
        if not resource.namespaced:
            self.cluster_paths.append(resource.path(name=body["metadata"]["name"]))
        return created

    async def cleanup(self) -> None:
        for path in self.cluster_paths:
            await self.kube.delete(path)


@pytest.fixture(scope="module")
async def ea_crds(kube: Kube) -> None:
    await apply_all(kube, [doc for path in CRD_FILES for doc in load(path)])


@pytest.fixture
async def scratch(kube: Kube, namespace: str, ea_crds: None) -> AsyncIterator[Scratch]:
    created = Scratch(kube, namespace)
    yield created
    await created.cleanup()


# --- Refusals --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Refused:
    """``obj`` is refused on create; or, with ``change``, created and then the merge patch is refused."""

    obj: Obj
    message: str
    change: Obj | None = None


EXACTLY_ONE = "spec.address must name exactly one of className (mint a new address) or claimName"
ICMP_PORT_LIST_ONLY = "spec.allowICMP is only allowed with mode PortList"
NOT_AN_IP = "must be an IP address (no leading zeros, no zone, no IPv4-mapped IPv6)"
NOT_CANONICAL = "spec.address must be written canonically"
CLAIM_ADDRESS_FIXED = "spec.address cannot be changed or removed once set"
NOT_A_CIDR = "each of spec.cidrs must be a CIDR such as 203.0.113.0/26"
CIDR_NOT_CANONICAL = "each of spec.cidrs must be written as its network address with the host bits zero"
ONE_FAMILY = "an IPAddressClass holds one address family"
NEEDS_ADDRESSES = "an IPAddressClass needs at least one of spec.cidrs or spec.ranges"
RANGE_REVERSED = "a range's start must not be above its end"
SELECTOR_VALUES = "a matchExpressions entry with In or NotIn needs values"
NAME_IS_ADDRESS = "metadata.name must name the address"
ALLOCATION_FIXED = "an IPAddressAllocation's spec is immutable"

V6_ONE_NAME = "v6-20010db8000000000000000000000001"

REFUSED = [
    # EndpointAttachment
    pytest.param(
        Refused(attachment(address={"className": "public-v4", "claimName": "my-ip"}), EXACTLY_ONE),
        id="attachment-both-sources",
    ),
    pytest.param(Refused(attachment(address={}), EXACTLY_ONE), id="attachment-no-source"),
    pytest.param(
        Refused(attachment(endpoint={"name": "Postgres_RW"}), "spec.endpoint.name must be a Service name"),
        id="attachment-endpoint-not-a-service-name",
    ),
    pytest.param(
        Refused(attachment(endpoint=None), "spec.endpoint: Required value"), id="attachment-no-endpoint"
    ),
    pytest.param(
        Refused(
            attachment(),
            "spec.endpoint is immutable",
            change={"spec": {"endpoint": {"name": "postgres-db-ro"}}},
        ),
        id="attachment-endpoint-change",
    ),
    pytest.param(
        Refused(
            attachment(), "spec.address is immutable", change={"spec": {"address": {"className": "other"}}}
        ),
        id="attachment-class-change",
    ),
    pytest.param(
        Refused(
            attachment(),
            "spec.address is immutable",
            change={"spec": {"address": {"className": None, "claimName": "my-ip"}}},
        ),
        id="attachment-class-to-claim",
    ),
    pytest.param(
        Refused(attachment(mode="Standard", allowICMP=True), ICMP_PORT_LIST_ONLY),
        id="attachment-icmp-standard",
    ),
    pytest.param(
        Refused(attachment(allowICMP=False), ICMP_PORT_LIST_ONLY), id="attachment-icmp-default-mode"
    ),
    pytest.param(
        Refused(attachment(mode="WholeIP", allowICMP=True), ICMP_PORT_LIST_ONLY), id="attachment-icmp-wholeip"
    ),
    pytest.param(
        Refused(
            attachment(mode="PortList", allowICMP=True),
            ICMP_PORT_LIST_ONLY,
            change={"spec": {"mode": "WholeIP"}},
        ),
        id="attachment-icmp-kept-when-leaving-portlist",
    ),
    pytest.param(
        Refused(attachment(mode="Turbo"), "spec.mode must be Standard, PortList or WholeIP"),
        id="attachment-unknown-mode",
    ),
    # IPAddressClaim
    pytest.param(Refused(claim(address="010.0.0.1"), NOT_AN_IP), id="claim-leading-zero"),
    pytest.param(Refused(claim(address="2001:DB8::1"), NOT_CANONICAL), id="claim-uppercase-v6"),
    pytest.param(Refused(claim(address="2001:db8:0:0:0:0:0:1"), NOT_CANONICAL), id="claim-uncompressed-v6"),
    pytest.param(
        Refused(claim(address="64:ff9b::203.0.113.20"), NOT_CANONICAL), id="claim-dotted-quad-in-v6"
    ),
    pytest.param(Refused(claim(address="fe80::1%eth0"), NOT_AN_IP), id="claim-zone"),
    pytest.param(Refused(claim(address="::ffff:203.0.113.20"), NOT_AN_IP), id="claim-v4-mapped-v6"),
    pytest.param(Refused(claim(address="203.0.113.0/26"), NOT_AN_IP), id="claim-cidr"),
    pytest.param(
        Refused(claim(), CLAIM_ADDRESS_FIXED, change={"spec": {"address": "203.0.113.21"}}),
        id="claim-address-change",
    ),
    pytest.param(
        Refused(claim(), CLAIM_ADDRESS_FIXED, change={"spec": {"address": None}}), id="claim-address-removal"
    ),
    pytest.param(
        Refused(claim(), "spec.className is immutable", change={"spec": {"className": "public-v6"}}),
        id="claim-class-change",
    ),
    pytest.param(Refused(claim(className=None), "spec.className: Required value"), id="claim-no-class"),
    # IPAddressClass
    pytest.param(
        Refused(address_class("schema-bad", cidrs=["203.0.113.0/33"]), NOT_A_CIDR), id="class-bad-prefix"
    ),
    pytest.param(
        Refused(address_class("schema-bad", cidrs=["203.0.113.0"]), NOT_A_CIDR),
        id="class-cidr-without-prefix",
    ),
    pytest.param(
        Refused(address_class("schema-bad", cidrs=["10.0.0.1/24"]), CIDR_NOT_CANONICAL),
        id="class-cidr-host-bits",
    ),
    pytest.param(
        Refused(address_class("schema-bad", cidrs=["2001:DB8::/64"]), CIDR_NOT_CANONICAL),
        id="class-cidr-uppercase-v6",
    ),
    pytest.param(
        Refused(address_class("schema-bad", cidrs=["203.0.113.0/26", "2001:db8::/64"]), ONE_FAMILY),
        id="class-mixed-cidrs",
    ),
    pytest.param(
        Refused(
            address_class("schema-bad", ranges=[{"start": "2001:db8::10", "end": "2001:db8::20"}]), ONE_FAMILY
        ),
        id="class-v4-cidr-v6-range",
    ),
    pytest.param(
        Refused(address_class("schema-bad", excludeAddresses=["2001:db8::1"]), ONE_FAMILY),
        id="class-v6-exclusion-in-v4-class",
    ),
    pytest.param(Refused(address_class("schema-bad", cidrs=None), NEEDS_ADDRESSES), id="class-no-addresses"),
    pytest.param(
        Refused(address_class("schema-bad", cidrs=[], ranges=[]), NEEDS_ADDRESSES), id="class-empty-lists"
    ),
    pytest.param(
        Refused(
            address_class(
                "schema-bad", cidrs=None, ranges=[{"start": "203.0.113.20", "end": "203.0.113.10"}]
            ),
            RANGE_REVERSED,
        ),
        id="class-v4-range-reversed",
    ),
    pytest.param(
        Refused(
            address_class("schema-bad", cidrs=None, ranges=[{"start": "10.0.1.0", "end": "10.0.0.255"}]),
            RANGE_REVERSED,
        ),
        id="class-v4-range-reversed-across-octets",
    ),
    pytest.param(
        Refused(
            address_class("schema-bad", cidrs=None, ranges=[{"start": "2001:db8::10", "end": "2001:db8::f"}]),
            RANGE_REVERSED,
        ),
        id="class-v6-range-reversed",
    ),
    pytest.param(
        Refused(
            address_class(
                "schema-bad", cidrs=None, ranges=[{"start": "2001:db8:1::", "end": "2001:DB8:0:FFFF::1"}]
            ),
            RANGE_REVERSED,
        ),
        id="class-v6-range-reversed-noncanonical-text",
    ),
    pytest.param(
        Refused(
            address_class("schema-bad", cidrs=None, ranges=[{"start": "203.0.113.10", "end": "2001:db8::1"}]),
            "a range's start and end must be of the same address family",
        ),
        id="class-range-mixed-families",
    ),
    pytest.param(
        Refused(
            address_class(
                "schema-bad", cidrs=None, ranges=[{"start": "203.0.113.300", "end": "203.0.113.310"}]
            ),
            "a range's start must be an IP address",
        ),
        id="class-range-not-an-address",
    ),
    pytest.param(
        Refused(
            address_class(
                "schema-bad", cidrs=None, ranges=[{"start": "64:ff9b::1.2.3.4", "end": "64:ff9b::ffff"}]
            ),
            "a range's start must not embed an IPv4 dotted quad in IPv6 text",
        ),
        id="class-range-dotted-quad-in-v6",
    ),
    pytest.param(
        Refused(
            address_class("schema-bad", excludeAddresses=["203.0.113.5/32"]),
            "each of spec.excludeAddresses must be an IP address",
        ),
        id="class-exclusion-not-an-address",
    ),
    pytest.param(
        Refused(address_class("schema-bad", provider="F5"), "spec.provider must be MetalLB or CiliumLBIPAM"),
        id="class-unknown-provider",
    ),
    pytest.param(
        Refused(
            address_class("schema-bad", provider="CiliumLBIPAM", metallbAddressPool="public"),
            "spec.metallbAddressPool is only allowed with provider MetalLB",
        ),
        id="class-metallb-pool-with-cilium",
    ),
    pytest.param(
        Refused(
            address_class("schema-bad", loadBalancerClass="not a class!"),
            "spec.loadBalancerClass must be a label-style name",
        ),
        id="class-bad-load-balancer-class",
    ),
    pytest.param(
        Refused(
            address_class(
                "schema-bad", allowedNamespaces={"matchExpressions": [{"key": "tier", "operator": "In"}]}
            ),
            SELECTOR_VALUES,
        ),
        id="class-selector-in-without-values",
    ),
    pytest.param(
        Refused(
            address_class(
                "schema-bad",
                allowedNamespaces={
                    "matchExpressions": [{"key": "tier", "operator": "Exists", "values": ["x"]}]
                },
            ),
            SELECTOR_VALUES,
        ),
        id="class-selector-exists-with-values",
    ),
    pytest.param(
        Refused(
            address_class(
                "schema-bad", allowedNamespaces={"matchExpressions": [{"key": "tier", "operator": "Equals"}]}
            ),
            "a matchExpressions operator must be In, NotIn, Exists or DoesNotExist",
        ),
        id="class-selector-unknown-operator",
    ),
    # IPAddressAllocation
    pytest.param(
        Refused(allocation("198.51.100.10", name="198.51.100.11"), NAME_IS_ADDRESS),
        id="allocation-v4-name-mismatch",
    ),
    pytest.param(
        Refused(allocation("2001:db8::1", name="v6-20010db8000000000000000000000002"), NAME_IS_ADDRESS),
        id="allocation-v6-name-mismatch",
    ),
    pytest.param(
        Refused(allocation("2001:db8::1", name="v6-2001db8"), NAME_IS_ADDRESS),
        id="allocation-v6-name-too-short",
    ),
    pytest.param(
        Refused(allocation("198.51.100.10", name="v6-00000000000000000000ffffc6336410"), NAME_IS_ADDRESS),
        id="allocation-v4-named-as-v6",
    ),
    pytest.param(
        Refused(with_spec(allocation("2001:db8::1"), address="2001:DB8::1"), NOT_CANONICAL),
        id="allocation-noncanonical-address",
    ),
    pytest.param(
        Refused(
            allocation("198.51.100.20"),
            ALLOCATION_FIXED,
            change={"spec": {"holder": {"uid": "another-holder"}}},
        ),
        id="allocation-holder-change",
    ),
    pytest.param(
        Refused(allocation("198.51.100.21"), ALLOCATION_FIXED, change={"spec": {"className": "public-v4-b"}}),
        id="allocation-class-change",
    ),
    pytest.param(
        Refused(with_spec(allocation("198.51.100.22"), holder=None), "spec.holder: Required value"),
        id="allocation-no-holder",
    ),
    pytest.param(
        Refused(
            allocation("198.51.100.23", holder_kind="Pod"),
            "spec.holder.kind must be EndpointAttachment or IPAddressClaim",
        ),
        id="allocation-unknown-holder-kind",
    ),
    # ServiceProxy
    pytest.param(
        Refused(service_proxy(serviceProxyName=None), "spec.serviceProxyName: Required value"),
        id="proxy-no-name",
    ),
    pytest.param(
        Refused(service_proxy(serviceProxyName="cozy proxy"), "spec.serviceProxyName must be a label value"),
        id="proxy-name-not-a-label-value",
    ),
    pytest.param(
        Refused(service_proxy(modes=["Standard"]), "each of spec.modes must be PortList or WholeIP"),
        id="proxy-unknown-mode",
    ),
    pytest.param(
        Refused(service_proxy(modes=["PortList", "PortList"]), "Duplicate value"), id="proxy-duplicate-mode"
    ),
    pytest.param(
        Refused(service_proxy(ipFamilies=["IPv5"]), "each of spec.ipFamilies must be IPv4 or IPv6"),
        id="proxy-unknown-family",
    ),
]


@pytest.mark.parametrize("case", REFUSED)
async def test_the_schema_refuses_with_a_message_a_person_understands(
    kube: Kube, scratch: Scratch, case: Refused
) -> None:
    if case.change is None:
        with pytest.raises(ApiError) as refused:
            await scratch.create(case.obj)
    else:
        created = await scratch.create(case.obj)
        with pytest.raises(ApiError) as refused:
            await kube.patch(scratch.path_of(created), case.change, kind="merge")
    assert refused.value.status == 422, refused.value
    assert case.message in refused.value.message


# --- Acceptances -----------------------------------------------------------------------------------

ACCEPTED = [
    pytest.param(attachment(), id="attachment-minted"),
    pytest.param(
        attachment(address={"claimName": "my-ip"}, mode="PortList", allowICMP=False),
        id="attachment-claim-portlist",
    ),
    pytest.param(attachment(mode="PortList"), id="attachment-portlist-icmp-default"),
    pytest.param(attachment(mode="WholeIP"), id="attachment-wholeip"),
    pytest.param(attachment("db.public-v4"), id="attachment-dotted-name"),
    pytest.param(claim(), id="claim-v4"),
    pytest.param(claim(address="2001:db8::20"), id="claim-v6"),
    pytest.param(claim(address=None), id="claim-any-address"),
    pytest.param(address_class("schema-v4"), id="class-v4"),
    pytest.param(
        address_class(
            "schema-v4-everything",
            cidrs=["203.0.113.0/26", "198.51.100.7/32", "198.51.100.8/31"],
            ranges=[
                {"start": "192.0.2.9", "end": "192.0.2.10"},
                {"start": "192.0.2.40", "end": "192.0.2.40"},
            ],
            excludeAddresses=["203.0.113.1", "192.0.2.9"],
            metallbAddressPool="public-v4",
            loadBalancerClass="metallb.io/metallb",
            allowedNamespaces={
                "matchLabels": {"tenant.cozystack.io/public": "true"},
                "matchExpressions": [
                    {"key": "tier", "operator": "In", "values": ["gold", "silver"]},
                    {"key": "quarantine", "operator": "DoesNotExist"},
                ],
            },
        ),
        id="class-v4-everything",
    ),
    pytest.param(
        address_class(
            "schema-v6",
            cidrs=["2001:db8:1::/64", "2001:db8:3::/127"],
            ranges=[{"start": "2001:db8:2::9", "end": "2001:db8:2::10"}],
            excludeAddresses=["2001:db8:1::1"],
        ),
        id="class-v6",
    ),
    pytest.param(
        address_class(
            "schema-v6-ranges", cidrs=None, ranges=[{"start": "2001:DB8:2::A", "end": "2001:db8:2:0::00ff"}]
        ),
        id="class-v6-range-noncanonical-text",
    ),
    pytest.param(
        address_class(
            "schema-cilium",
            cidrs=None,
            ranges=[{"start": "10.0.0.9", "end": "10.0.0.10"}],
            provider="CiliumLBIPAM",
        ),
        id="class-cilium-range",
    ),
    pytest.param(
        address_class("schema-empty-lb-class", loadBalancerClass=""), id="class-empty-load-balancer-class"
    ),
    pytest.param(allocation("198.51.100.10"), id="allocation-v4"),
    pytest.param(allocation("2001:db8::1"), id="allocation-v6"),
    pytest.param(allocation("2001:db8:0:1::"), id="allocation-v6-trailing-zeros"),
    pytest.param(allocation("::1"), id="allocation-v6-leading-zeros"),
    pytest.param(allocation("2001:db8::1:0:0:1"), id="allocation-v6-two-zero-runs"),
    pytest.param(allocation("2001:db8:3:4:5:6:7:8"), id="allocation-v6-no-zeros"),
    pytest.param(
        allocation("198.51.100.11", holder_kind=IP_ADDRESS_CLAIM_KIND), id="allocation-held-by-claim"
    ),
    pytest.param(service_proxy(), id="proxy"),
    pytest.param(service_proxy(modes=["WholeIP"], ipFamilies=None), id="proxy-one-mode-no-families"),
]


@pytest.mark.parametrize("obj", ACCEPTED)
async def test_the_schema_accepts_what_the_core_reads_and_writes(scratch: Scratch, obj: Obj) -> None:
    created = await scratch.create(obj)
    for key, value in obj["spec"].items():
        assert created["spec"][key] == value


async def test_defaults_standard_mode_and_metallb_and_leave_allow_icmp_unset(scratch: Scratch) -> None:
    created = await scratch.create(attachment())
    assert created["spec"]["mode"] == "Standard"
    assert "allowICMP" not in created["spec"]
    portlist = await scratch.create(attachment("db-portlist", mode="PortList"))
    assert "allowICMP" not in portlist["spec"]  # the core reads absent as true
    created_class = await scratch.create(address_class("schema-defaults"))
    assert created_class["spec"]["provider"] == "MetalLB"


async def test_the_status_the_core_writes_is_accepted(kube: Kube, scratch: Scratch, namespace: str) -> None:
    created = await scratch.create(attachment())
    plan = reconcile(
        Observed(
            attachment=created,
            endpoint=make_service(namespace=namespace),
            helmrelease=make_helmrelease(namespace=namespace),
            address_class=make_class(),
            held_address="203.0.113.10",
        )
    )
    assert any(c.type == COND_ADDRESS_BOUND and c.status == TRUE for c in plan.conditions)
    patch = plan.status_patch(created.get("status"), rfc3339(datetime.now(UTC)))
    stored = await kube.patch(scratch.path_of(created) + "/status", patch)
    assert stored["status"]["address"] == "203.0.113.10"
    assert stored["status"]["application"]["kind"] == "Postgres"
    assert [c["type"] for c in stored["status"]["conditions"]] == list(CONDITION_TYPES)

    created_claim = await scratch.create(claim())
    bound = {"phase": "Bound", "address": "203.0.113.20", "attachment": {"name": "db-public", "uid": "u-1"}}
    stored_claim = await kube.patch(
        scratch.path_of(created_claim) + "/status", {"status": bound}, kind="merge"
    )
    assert stored_claim["status"] == bound
    with pytest.raises(ApiError) as refused:
        await kube.patch(
            scratch.path_of(created_claim) + "/status", {"status": {"phase": "Stolen"}}, kind="merge"
        )
    assert refused.value.status == 422
    assert 'Unsupported value: "Stolen"' in refused.value.message

    created_class = await scratch.create(address_class("schema-status"))
    counts = {"capacity": 62, "allocated": 12}
    stored_class = await kube.patch(
        scratch.path_of(created_class) + "/status", {"status": counts}, kind="merge"
    )
    assert stored_class["status"] == counts


async def test_a_claim_address_set_after_create_can_only_pin_the_address_it_holds(
    kube: Kube, scratch: Scratch
) -> None:
    created = await scratch.create(claim("late-pin", address=None))
    path = scratch.path_of(created)
    # Pending, holding nothing: any address of the class may still be asked for.
    unbound = await scratch.create(claim("late-ask", address=None))
    asked = await kube.patch(scratch.path_of(unbound), {"spec": {"address": "203.0.113.30"}}, kind="merge")
    assert asked["spec"]["address"] == "203.0.113.30"
    # Bound to .20 by the operator: another address is refused, saying which one it holds.
    await kube.patch(
        path + "/status", {"status": {"phase": "Bound", "address": "203.0.113.20"}}, kind="merge"
    )
    with pytest.raises(ApiError) as refused:
        await kube.patch(path, {"spec": {"address": "203.0.113.21"}}, kind="merge")
    assert refused.value.status == 422
    assert "spec.address can only be set to the address this claim already holds, 203.0.113.20" in (
        refused.value.message
    )
    # The address it holds may be pinned; status writes pass whatever the spec says.
    pinned = await kube.patch(path, {"spec": {"address": "203.0.113.20"}}, kind="merge")
    assert pinned["spec"]["address"] == "203.0.113.20"
    lost = await kube.patch(path + "/status", {"status": {"phase": "Lost"}}, kind="merge")
    assert lost["status"]["phase"] == "Lost"


# --- Quota -----------------------------------------------------------------------------------------


async def test_an_object_count_quota_refuses_the_second_attachment(
    kube: Kube, namespace: str, scratch: Scratch
) -> None:
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "attachments"},
        "spec": {"hard": {QUOTA_KEY: "1"}},
    }
    await kube.create(RESOURCE_QUOTAS.path(namespace), quota)
    # Admission enforces a quota only once the resource-quota controller has computed its usage.
    await wait_for_object(
        kube,
        RESOURCE_QUOTAS,
        "attachments",
        lambda q: q is not None and QUOTA_KEY in (q.get("status") or {}).get("used", {}),
        namespace=namespace,
        what="quota usage computed by the resource-quota controller",
        timeout=60,
    )
    await scratch.create(attachment("first"))
    with pytest.raises(ApiError) as refused:
        await scratch.create(attachment("second"))
    assert refused.value.status == 403
    assert "exceeded quota" in refused.value.message
    assert QUOTA_KEY in refused.value.message


# --- RBAC ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def ea_rbac(kube: Kube, ea_crds: None) -> None:
    namespace_doc = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NAMESPACE}}
    await apply_all(kube, [namespace_doc, *(doc for path in RBAC_FILES for doc in load(path))])


async def is_allowed(
    kube: Kube,
    user: str,
    verb: str,
    resource: str,
    *,
    group: str = GROUP,
    namespace: str = "",
    groups: tuple[str, ...] = ("system:authenticated",),
) -> bool:
    """The RBAC authorizer's answer for ``user``; ``resource`` may be ``plural/subresource``."""
    plural, _, subresource = resource.partition("/")
    attributes = {"verb": verb, "group": group, "resource": plural, "subresource": subresource}
    if namespace:
        attributes["namespace"] = namespace
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": list(groups), "resourceAttributes": attributes},
    }
    answer = await kube.create(SUBJECT_ACCESS_REVIEWS.path(), review)
    return bool((answer.get("status") or {}).get("allowed"))


# (verb, group, resource[/subresource], allowed): every grant of role.yaml, and its nearest neighbours.
OPERATOR_VERBS: list[tuple[str, str, str, bool]] = [
    # delete: only for the OwnerReferencesPermissionEnforcement admission plugin (never requested).
    *((verb, GROUP, "endpointattachments", True) for verb in ("get", "list", "watch", "patch", "delete")),
    *((verb, GROUP, "endpointattachments", False) for verb in ("create", "update")),
    ("update", GROUP, "endpointattachments/finalizers", True),  # the Service's blockOwnerDeletion
    ("update", GROUP, "ipaddressclaims/finalizers", False),
    ("patch", GROUP, "endpointattachments/status", True),
    ("update", GROUP, "endpointattachments/status", False),
    *((verb, GROUP, "ipaddressclaims", True) for verb in ("get", "list", "watch", "patch")),
    *((verb, GROUP, "ipaddressclaims", False) for verb in ("create", "update", "delete")),
    ("patch", GROUP, "ipaddressclaims/status", True),
    *((verb, GROUP, "ipaddressclasses", True) for verb in ("list", "watch")),
    *((verb, GROUP, "ipaddressclasses", False) for verb in ("create", "patch", "delete")),
    ("patch", GROUP, "ipaddressclasses/status", True),
    *((verb, GROUP, "ipaddressallocations", True) for verb in ("get", "list", "watch", "create", "delete")),
    *((verb, GROUP, "ipaddressallocations", False) for verb in ("update", "patch", "deletecollection")),
    *((verb, GROUP, "serviceproxies", True) for verb in ("list", "watch")),
    ("create", GROUP, "serviceproxies", False),
    *((verb, "", "services", True) for verb in ("get", "list", "watch", "create", "patch", "delete")),
    ("update", "", "services", False),
    ("patch", "", "services/status", False),
    *((verb, "discovery.k8s.io", "endpointslices", True) for verb in ("list", "watch")),
    ("create", "discovery.k8s.io", "endpointslices", False),
    *((verb, "helm.toolkit.fluxcd.io", "helmreleases", True) for verb in ("list", "watch")),
    ("patch", "helm.toolkit.fluxcd.io", "helmreleases", False),
    *((verb, "", "namespaces", True) for verb in ("list", "watch")),
    ("patch", "", "namespaces", False),
    ("create", "", "events", False),  # it posts no Events (conditions say it all)
    ("get", "", "secrets", False),
    # Pods are watched for exclusivity in the VM modes (decided before a pod has an endpoint).
    *((verb, "", "pods", True) for verb in ("list", "watch")),
    *((verb, "", "pods", False) for verb in ("create", "patch", "delete")),
]


async def test_the_operator_holds_exactly_the_verbs_its_glue_uses(kube: Kube, ea_rbac: None) -> None:
    wrong = [
        (verb, group, resource, expected)
        for verb, group, resource, expected in OPERATOR_VERBS
        if await is_allowed(kube, OPERATOR_USER, verb, resource, group=group, namespace="tenant-a")
        != expected
    ]
    assert wrong == [], "(verb, group, resource, expected) the authorizer answered otherwise"


async def test_tenants_manage_attachments_and_claims_and_read_classes(
    kube: Kube, namespace: str, ea_rbac: None
) -> None:
    # The local control plane runs no clusterrole-aggregation controller, so the users are bound to
    # our roles themselves; that they fold into edit/admin/view is a matter of their labels.
    labels = {
        "cozystack:endpointattachment-edit": {"aggregate-to-edit", "aggregate-to-admin"},
        "cozystack:endpointattachment-view": {"aggregate-to-view"},
    }
    for role, aggregates in labels.items():
        stored = await kube.get(CLUSTER_ROLES.path(name=role))
        assert stored is not None, role
        role_labels = stored["metadata"].get("labels") or {}
        assert {
            key.removeprefix(AGGREGATE_PREFIX) for key, value in role_labels.items() if value == "true"
        } == (aggregates), role
    editor, viewer = f"editor@{namespace}", f"viewer@{namespace}"
    for user, role in (
        (editor, "cozystack:endpointattachment-edit"),
        (viewer, "cozystack:endpointattachment-view"),
    ):
        await kube.create(
            ROLE_BINDINGS.path(namespace),
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": role.partition(":")[2]},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
            },
        )

    for verb in ("get", "list", "watch", "create", "update", "patch", "delete"):
        for plural in ("endpointattachments", "ipaddressclaims"):
            assert await is_allowed(kube, editor, verb, plural, namespace=namespace), (verb, plural)
            assert await is_allowed(kube, viewer, verb, plural, namespace=namespace) == (
                verb in ("get", "list", "watch")
            ), (verb, plural)
    for user in (editor, viewer):
        for verb in ("get", "list", "watch"):
            assert await is_allowed(kube, user, verb, "ipaddressclasses"), (user, verb)
        assert not await is_allowed(kube, user, "create", "ipaddressclasses")
        assert not await is_allowed(kube, user, "create", "ipaddressallocations")
        assert not await is_allowed(kube, user, "list", "ipaddressallocations")
        assert not await is_allowed(kube, user, "create", "serviceproxies")
        assert not await is_allowed(kube, user, "patch", "endpointattachments/status", namespace=namespace)
        assert not await is_allowed(kube, user, "patch", "ipaddressclaims/status", namespace=namespace)
        assert not await is_allowed(kube, user, "create", "endpointattachments", namespace="kube-system")
    # Reading classes comes from being authenticated, not from any namespace role.
    assert not await is_allowed(kube, "anonymous-bystander", "list", "ipaddressclasses", groups=())
