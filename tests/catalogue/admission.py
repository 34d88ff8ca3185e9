"""Bad inputs the API server refuses at admission, one row each, kind by kind and field by field.

Decides: for every field of the six CRDs, the bad values tried (wrong type, out of range, malformed,
non-canonical, huge, unicode, empty) and the phrase the refusal must contain; for every immutable
field, its change in each of the four update forms.

Does not: need an operator. Rows here only ask the API; they run first and fast.
"""

from __future__ import annotations

from typing import Any, Final

from tests.catalogue.model import (
    DELETE,
    UPDATE_FORMS,
    Obj,
    Refused,
    Update,
    with_path,
)
from tests.catalogue.objects import (
    CYRILLIC_A,
    HUGE,
    UNICODE,
    address_class,
    allocation,
    attachment,
    claim,
    gpu_class,
    service_proxy,
)

# Phrases of Kubernetes' own schema checks (types, lengths, counts, required fields).
TOO_LONG: Final = "Too long: may not be more than"
TOO_SHORT: Final = "should be at least 1 chars long"
TOO_MANY: Final = "must have at most"
REQUIRED: Final = "Required value"
DUPLICATE: Final = "Duplicate value"
STRING: Final = "must be of type string"
INTEGER: Final = "must be of type integer"
BOOLEAN: Final = "must be of type boolean"
ARRAY: Final = "must be of type array"
OBJECT: Final = "must be of type object"
# Kubernetes' own object-name rules.
NAME_RULE: Final = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters"
NAME_TOO_LONG: Final = "must be no more than 253 characters"

# Ours (the CRDs' CEL messages).
SERVICE_NAME: Final = "spec.endpoint.name must be a Service name"
CLASS_NAME: Final = "spec.address.className must be an IPAddressClass name"
CLAIM_NAME: Final = "spec.address.claimName must be an IPAddressClaim name"
EXACTLY_ONE: Final = "spec.address must name exactly one of className (mint a new address) or claimName"
MODE: Final = "spec.mode must be Standard, PortList or WholeIP"
ICMP: Final = "spec.allowICMP is only allowed with mode PortList"
ENDPOINT_FIXED: Final = "spec.endpoint is immutable: create another attachment"
ADDRESS_FIXED: Final = "spec.address is immutable: create another attachment"
CLAIM_CLASS: Final = "spec.className must be an IPAddressClass name"
CLAIM_CLASS_FIXED: Final = "spec.className is immutable"
NOT_AN_IP: Final = "spec.address must be an IP address (no leading zeros, no zone, no IPv4-mapped IPv6)"
NOT_CANONICAL: Final = "spec.address must be written canonically"
CLAIM_ADDRESS_FIXED: Final = "spec.address cannot be changed or removed once set"
CLAIM_ADDRESS_HELD: Final = (
    "spec.address can only be set to the address this claim already holds, 198.51.100.5"
)
NOT_A_CIDR: Final = "each of spec.cidrs must be a CIDR such as 203.0.113.0/26"
CIDR_HOST_BITS: Final = "each of spec.cidrs must be written as its network address with the host bits zero"
ONE_FAMILY: Final = "an IPAddressClass holds one address family"
NEEDS_ADDRESSES: Final = "an IPAddressClass needs at least one of spec.cidrs or spec.ranges"
RANGE_START: Final = "a range's start must be an IP address"
RANGE_END: Final = "a range's end must be an IP address"
RANGE_ORDER: Final = "a range's start must not be above its end"
RANGE_FAMILY: Final = "a range's start and end must be of the same address family"
RANGE_DOTTED: Final = "must not embed an IPv4 dotted quad in IPv6 text"
EXCLUDE: Final = "each of spec.excludeAddresses must be an IP address"
PROVIDER: Final = "spec.provider must be MetalLB or CiliumLBIPAM"
POOL_NAME: Final = "spec.metallbAddressPool must be a MetalLB IPAddressPool name"
POOL_WITH_CILIUM: Final = "spec.metallbAddressPool is only allowed with provider MetalLB"
LB_CLASS: Final = "spec.loadBalancerClass must be a label-style name"
SELECTOR_VALUES: Final = "a matchExpressions entry with In or NotIn needs values"
SELECTOR_OPERATOR: Final = "a matchExpressions operator must be In, NotIn, Exists or DoesNotExist"
NAME_IS_ADDRESS: Final = "metadata.name must name the address"
ALLOCATION_FIXED: Final = "an IPAddressAllocation's spec is immutable"
HOLDER_KIND: Final = "spec.holder.kind must be EndpointAttachment or IPAddressClaim"
PROXY_NAME: Final = "spec.serviceProxyName must be a label value"
PROXY_MODES: Final = "each of spec.modes must be PortList or WholeIP"
PROXY_FAMILIES: Final = "each of spec.ipFamilies must be IPv4 or IPv6"
RESOURCE_SHAPE: Final = "resourceName must look like vendor.com/NAME"
RESOURCE_FIXED: Final = "resourceName is immutable"
RESOURCE_K8S: Final = "resourceName must be an extended resource, not in the kubernetes.io domain"
RESOURCE_REQUESTS: Final = "resourceName must not start with 'requests.'"
RESOURCE_DOMAIN: Final = "the domain of resourceName (before '/') must be at most 253 characters"
TOLERATION_KEY: Final = "a toleration's key must be a taint key"
TOLERATION_OPERATOR: Final = "a toleration's operator must be Equal or Exists"
TOLERATION_VALUE: Final = "a toleration's value must be a label value"
TOLERATION_EFFECT: Final = "a toleration's effect must be empty (every effect)"
TOLERATION_EXISTS: Final = "a toleration with operator Exists must not have a value"
TOLERATION_EMPTY_KEY: Final = "a toleration with an empty key must use operator Exists"
TOLERATION_SECONDS: Final = "tolerationSeconds only applies with effect NoExecute"
VM_SIZE_MIN: Final = "each of vmSizes must be at least 1"
VM_SIZES_EMPTY: Final = "vmSizes needs at least one size"
VM_SIZES_TWICE: Final = "vmSizes must not list a size twice"

# 198.51.100.5 in Arabic-Indic digits: digits to a person, not to an address parser.
ARABIC_ADDRESS: Final = "\u0661\u0669\u0668.\u0665\u0661.\u0661\u0660\u0660.\u0665"

ROWS: list[Refused] = []
# (kind, field path) of every field some row breaks, and of every field some row tries to change
# after create in all four update forms: a test holds them to every field of the CRDs.
FIELDS_TRIED: set[tuple[str, str]] = set()
CHANGES_TRIED: set[tuple[str, str]] = set()


def bad(id: str, obj: Obj, says: str, **kw: Any) -> None:
    ROWS.append(Refused(id, obj, says, **kw))


def field(
    prefix: str, base: Obj, path: str, cases: list[tuple[str, Any, str]], covers: str = "", **kw: Any
) -> None:
    """One row per (id suffix, value at ``path``, phrase); ``covers`` names the field tried when
    ``path`` is a parent of it."""
    FIELDS_TRIED.add((base["kind"], covers or path))
    for suffix, value, says in cases:
        bad(f"{prefix}-{suffix}", with_path(base, path, value), says, **kw)


def every_form(prefix: str, base: Obj, change: Obj, says: str, status: Obj | None = None) -> None:
    """One row per update form: the same forbidden change by merge, JSON patch, apply and replace."""
    CHANGES_TRIED.update((base["kind"], path) for path in _leaves(change))
    for form in UPDATE_FORMS:
        bad(f"{prefix}-by-{form}", base, says, update=Update(form, change), status=status)


def _leaves(change: Obj, prefix: str = "") -> list[str]:
    paths: list[str] = []
    for key, value in change.items():
        path = f"{prefix}.{key}" if prefix else key
        paths.extend(_leaves(value, path) if isinstance(value, dict) else [path])
    return paths


def names(prefix: str, base: Obj) -> None:
    """Kubernetes' own object-name rules (its message quotes its regex; bounded by the 253 limit)."""
    FIELDS_TRIED.add((base["kind"], "metadata.name"))
    kube = {"kubernetes_message": True}
    bad(f"{prefix}-metadata-name-unicode", with_path(base, "metadata.name", UNICODE), NAME_RULE, **kube)
    bad(f"{prefix}-metadata-name-uppercase", with_path(base, "metadata.name", "Cat-Upper"), NAME_RULE, **kube)
    bad(f"{prefix}-metadata-name-254", with_path(base, "metadata.name", "a" * 254), NAME_TOO_LONG, **kube)


# --- EndpointAttachment ----------------------------------------------------------------------------

EA = attachment()
names("ea", EA)
field(
    "ea-endpoint-name",
    EA,
    "spec.endpoint.name",
    [
        ("integer", 5432, STRING),
        ("huge", HUGE, TOO_LONG),
        ("64-chars", "a" * 64, TOO_LONG),
        ("empty", "", SERVICE_NAME),
        ("underscore", "postgres_rw", SERVICE_NAME),
        ("uppercase", "Postgres-RW", SERVICE_NAME),
        ("leading-digit", "1postgres", SERVICE_NAME),
        ("leading-dash", "-postgres", SERVICE_NAME),
        ("trailing-dash", "postgres-", SERVICE_NAME),
        ("dotted", "postgres.rw", SERVICE_NAME),
        ("unicode", UNICODE, SERVICE_NAME),
        ("cyrillic-lookalike", f"postgres-{CYRILLIC_A}", SERVICE_NAME),
        ("space", "postgres rw", SERVICE_NAME),
        ("slash-other-namespace", "other/postgres-db-rw", SERVICE_NAME),
    ],
)
field(
    "ea-endpoint",
    EA,
    "spec.endpoint",
    [("string", "postgres-db-rw", OBJECT), ("empty", {}, REQUIRED), ("absent", DELETE, REQUIRED)],
)
for which, phrase in (("className", CLASS_NAME), ("claimName", CLAIM_NAME)):
    base = attachment(claim="cat-claim") if which == "claimName" else EA
    field(
        f"ea-{which}",
        base,
        f"spec.address.{which}",
        [
            ("integer", 7, STRING),
            ("empty", "", TOO_SHORT),
            ("huge", HUGE, TOO_LONG),
            ("254-chars", "a" * 254, TOO_LONG),
            ("uppercase", "Public-V4", phrase),
            ("underscore", "public_v4", phrase),
            ("double-dot", "public..v4", phrase),
            ("unicode", UNICODE, phrase),
            ("slash-other-namespace", "other/cat-claim", phrase),
        ],
    )
field(
    "ea-address",
    EA,
    "spec.address",
    [
        ("both-sources", {"className": "cat-v4", "claimName": "cat-claim"}, EXACTLY_ONE),
        ("no-source", {}, EXACTLY_ONE),
        ("string", "198.51.100.1", OBJECT),
        ("absent", DELETE, REQUIRED),
        ("unknown-key-only", {"address": "198.51.100.1"}, EXACTLY_ONE),  # pruned: nothing left
    ],
)
field(
    "ea-mode",
    EA,
    "spec.mode",
    [
        ("integer", 1, STRING),
        ("empty", "", MODE),
        ("lowercase", "portlist", MODE),
        ("unknown", "Turbo", MODE),
        ("huge", HUGE, TOO_LONG),
        ("unicode", "PortLïst", MODE),
    ],
)
field(
    "ea-allowicmp",
    EA,
    "spec",
    [
        ("string", {**EA["spec"], "mode": "PortList", "allowICMP": "yes"}, BOOLEAN),
        ("integer", {**EA["spec"], "mode": "PortList", "allowICMP": 1}, BOOLEAN),
        ("standard", {**EA["spec"], "mode": "Standard", "allowICMP": True}, ICMP),
        ("default-mode", {**EA["spec"], "allowICMP": False}, ICMP),
        ("wholeip", {**EA["spec"], "mode": "WholeIP", "allowICMP": True}, ICMP),
    ],
    covers="spec.allowICMP",
)
field("ea-spec", EA, "spec", [("absent", DELETE, REQUIRED), ("list", [], OBJECT)], covers="spec")
every_form("ea-endpoint-change", EA, {"spec": {"endpoint": {"name": "postgres-db-ro"}}}, ENDPOINT_FIXED)
every_form("ea-class-change", EA, {"spec": {"address": {"className": "cat-v4-b"}}}, ADDRESS_FIXED)
every_form(
    "ea-class-to-claim",
    EA,
    {"spec": {"address": {"className": None, "claimName": "cat-claim"}}},
    ADDRESS_FIXED,
)
bad(
    "ea-icmp-kept-leaving-portlist",
    attachment(mode="PortList", allowICMP=True),
    ICMP,
    update=Update("merge", {"spec": {"mode": "WholeIP"}}),
)

# --- IPAddressClaim --------------------------------------------------------------------------------

CLAIM = claim(address="198.51.100.5")
names("claim", CLAIM)
field(
    "claim-class",
    CLAIM,
    "spec.className",
    [
        ("integer", 4, STRING),
        ("empty", "", TOO_SHORT),
        ("huge", HUGE, TOO_LONG),
        ("uppercase", "Public", CLAIM_CLASS),
        ("unicode", UNICODE, CLAIM_CLASS),
        ("absent", DELETE, REQUIRED),
    ],
)
field(
    "claim-address",
    CLAIM,
    "spec.address",
    [
        ("leading-zero", "010.0.0.1", NOT_AN_IP),
        ("v4-mapped-v6", "::ffff:10.0.0.1", NOT_AN_IP),
        ("uppercase-v6", "2001:DB8::1", NOT_CANONICAL),
        ("uncompressed-v6", "2001:db8:0:0:0:0:0:1", NOT_CANONICAL),
        ("zero-padded-v6-group", "2001:0db8::1", NOT_CANONICAL),
        ("single-zero-group-compressed", "2001:db8:0:1:1:1:1::", NOT_CANONICAL),
        ("dotted-quad-in-v6", "64:ff9b::198.51.100.5", NOT_CANONICAL),
        ("zone", "fe80::1%eth0", NOT_AN_IP),
        ("cidr", "198.51.100.0/28", NOT_AN_IP),
        ("three-octets", "198.51.100", NOT_AN_IP),
        ("five-octets", "198.51.100.5.1", NOT_AN_IP),
        ("octet-over-255", "198.51.100.256", NOT_AN_IP),
        ("hex-octet", "0xc6.51.100.5", NOT_AN_IP),
        ("leading-space", " 198.51.100.5", NOT_AN_IP),
        ("hostname", "localhost", NOT_AN_IP),
        ("double-double-colon", "2001:db8::1::2", NOT_AN_IP),
        ("arabic-digits", ARABIC_ADDRESS, NOT_AN_IP),
        ("empty", "", NOT_AN_IP),
        ("huge", HUGE, TOO_LONG),
        ("integer", 3325256709, STRING),
        ("list", ["198.51.100.5"], STRING),
    ],
)
every_form("claim-class-change", CLAIM, {"spec": {"className": "cat-v4-b"}}, CLAIM_CLASS_FIXED)
every_form("claim-address-change", CLAIM, {"spec": {"address": "198.51.100.6"}}, CLAIM_ADDRESS_FIXED)
every_form("claim-address-removal", CLAIM, {"spec": {"address": None}}, CLAIM_ADDRESS_FIXED)
# Set after create: a claim without spec.address that already holds .5 may not name another address.
every_form(
    "claim-address-set-after-bound",
    claim(),
    {"spec": {"address": "198.51.100.6"}},
    CLAIM_ADDRESS_HELD,
    status={"phase": "Bound", "address": "198.51.100.5"},
)
every_form(
    "claim-address-set-after-lost",
    claim(),
    {"spec": {"address": "198.51.100.6"}},
    CLAIM_ADDRESS_HELD,
    status={"phase": "Lost", "address": "198.51.100.5"},
)

# --- IPAddressClass --------------------------------------------------------------------------------

CLS = address_class()
names("class", CLS)
field(
    "class-cidr",
    CLS,
    "spec.cidrs",
    [
        ("prefix-33", ["198.51.100.0/33"], NOT_A_CIDR),
        ("no-prefix", ["198.51.100.0"], NOT_A_CIDR),
        ("host-bits", ["198.51.100.1/28"], CIDR_HOST_BITS),
        ("uppercase-v6", ["2001:DB8::/64"], CIDR_HOST_BITS),
        ("leading-zero", ["010.0.0.0/8"], NOT_A_CIDR),
        ("v4-mapped-v6", ["::ffff:10.0.0.0/104"], NOT_A_CIDR),
        ("trailing-space", ["198.51.100.0/28 "], NOT_A_CIDR),
        ("netmask-notation", ["198.51.100.0/255.255.255.240"], NOT_A_CIDR),
        ("empty-string", [""], NOT_A_CIDR),
        ("huge", [HUGE], TOO_LONG),
        ("unicode", [UNICODE], NOT_A_CIDR),
        ("integer-item", [24], STRING),
        ("string-not-list", "198.51.100.0/28", ARRAY),
        ("33-items", [f"10.{i}.0.0/16" for i in range(33)], TOO_MANY),
        ("duplicate", ["198.51.100.0/28", "198.51.100.0/28"], DUPLICATE),
        ("mixed-families", ["198.51.100.0/28", "2001:db8::/64"], ONE_FAMILY),
    ],
)
field(
    "class-no-addresses",
    CLS,
    "spec.cidrs",
    [("absent", DELETE, NEEDS_ADDRESSES), ("empty", [], NEEDS_ADDRESSES)],
)
RANGES = address_class(cidrs=None, ranges=[{"start": "198.51.100.10", "end": "198.51.100.20"}])
field(
    "class-range",
    RANGES,
    "spec.ranges",
    [
        ("reversed-v4", [{"start": "198.51.100.20", "end": "198.51.100.10"}], RANGE_ORDER),
        ("reversed-across-octets", [{"start": "10.0.1.0", "end": "10.0.0.255"}], RANGE_ORDER),
        ("reversed-v6", [{"start": "2001:db8::10", "end": "2001:db8::f"}], RANGE_ORDER),
        ("mixed-families", [{"start": "198.51.100.10", "end": "2001:db8::1"}], RANGE_FAMILY),
        ("start-not-an-ip", [{"start": "198.51.100.300", "end": "198.51.100.310"}], RANGE_START),
        ("end-not-an-ip", [{"start": "198.51.100.1", "end": "end"}], RANGE_END),
        ("start-leading-zero", [{"start": "198.051.100.1", "end": "198.51.100.9"}], RANGE_START),
        ("start-v4-mapped", [{"start": "::ffff:198.51.100.1", "end": "::ffff:198.51.100.9"}], RANGE_START),
        ("dotted-quad-in-v6", [{"start": "64:ff9b::1.2.3.4", "end": "64:ff9b::ffff"}], RANGE_DOTTED),
        ("no-end", [{"start": "198.51.100.1"}], REQUIRED),
        ("huge-start", [{"start": HUGE, "end": "198.51.100.9"}], TOO_LONG),
        ("object-not-list", {"start": "198.51.100.1", "end": "198.51.100.9"}, ARRAY),
        ("17-ranges", [{"start": f"10.0.{i}.1", "end": f"10.0.{i}.2"} for i in range(17)], TOO_MANY),
        (
            "v4-and-v6-ranges",
            [
                {"start": "198.51.100.1", "end": "198.51.100.9"},
                {"start": "2001:db8::1", "end": "2001:db8::9"},
            ],
            ONE_FAMILY,
        ),
    ],
)
field(
    "class-range-and-cidr",
    CLS,
    "spec.ranges",
    [("v6-range-v4-cidr", [{"start": "2001:db8::1", "end": "2001:db8::2"}], ONE_FAMILY)],
)
field(
    "class-exclude",
    CLS,
    "spec.excludeAddresses",
    [
        ("cidr", ["198.51.100.5/32"], EXCLUDE),
        ("v6-in-v4-class", ["2001:db8::1"], ONE_FAMILY),
        ("leading-zero", ["198.51.100.05"], EXCLUDE),
        ("huge", [HUGE], TOO_LONG),
        ("257-items", [f"198.51.{i // 256}.{i % 256}" for i in range(257)], TOO_MANY),
        ("duplicate", ["198.51.100.5", "198.51.100.5"], DUPLICATE),
        ("string-not-list", "198.51.100.5", ARRAY),
    ],
)
field(
    "class-provider",
    CLS,
    "spec.provider",
    [
        ("unknown", "F5", PROVIDER),
        ("lowercase", "metallb", PROVIDER),
        ("huge", HUGE, TOO_LONG),
        ("integer", 1, STRING),
        ("empty", "", PROVIDER),
    ],
)
field(
    "class-metallb-pool",
    CLS,
    "spec.metallbAddressPool",
    [
        ("space", "public pool", POOL_NAME),
        ("empty", "", TOO_SHORT),
        ("huge", HUGE, TOO_LONG),
        ("unicode", UNICODE, POOL_NAME),
    ],
)
bad(
    "class-metallb-pool-with-cilium",
    address_class(provider="CiliumLBIPAM", metallbAddressPool="public"),
    POOL_WITH_CILIUM,
)
field(
    "class-lb-class",
    CLS,
    "spec.loadBalancerClass",
    [
        ("spaces", "not a class!", LB_CLASS),
        ("two-slashes", "example.com/a/b", LB_CLASS),
        ("leading-dash", "-internal", LB_CLASS),
        ("huge", HUGE, TOO_LONG),
        ("unicode", f"example.com/{UNICODE}", LB_CLASS),
    ],
)
field(
    "class-selector",
    CLS,
    "spec.allowedNamespaces",
    [
        ("string", "tenant-a", OBJECT),
        ("label-value-64", {"matchLabels": {"tier": "a" * 64}}, TOO_LONG),
        ("label-value-huge", {"matchLabels": {"tier": HUGE}}, TOO_LONG),
        ("label-value-integer", {"matchLabels": {"tier": 1}}, STRING),
        ("65-labels", {"matchLabels": {f"k{i}": "v" for i in range(65)}}, TOO_MANY),
        (
            "operator-unknown",
            {"matchExpressions": [{"key": "tier", "operator": "Equals"}]},
            SELECTOR_OPERATOR,
        ),
        ("operator-huge", {"matchExpressions": [{"key": "tier", "operator": HUGE}]}, TOO_LONG),
        ("in-without-values", {"matchExpressions": [{"key": "tier", "operator": "In"}]}, SELECTOR_VALUES),
        (
            "notin-empty-values",
            {"matchExpressions": [{"key": "t", "operator": "NotIn", "values": []}]},
            SELECTOR_VALUES,
        ),
        (
            "exists-with-values",
            {"matchExpressions": [{"key": "t", "operator": "Exists", "values": ["x"]}]},
            SELECTOR_VALUES,
        ),
        ("no-key", {"matchExpressions": [{"operator": "Exists"}]}, REQUIRED),
        ("empty-key", {"matchExpressions": [{"key": "", "operator": "Exists"}]}, TOO_SHORT),
        ("huge-key", {"matchExpressions": [{"key": HUGE, "operator": "Exists"}]}, TOO_LONG),
        (
            "33-expressions",
            {"matchExpressions": [{"key": f"k{i}", "operator": "Exists"} for i in range(33)]},
            TOO_MANY,
        ),
        (
            "65-values",
            {"matchExpressions": [{"key": "t", "operator": "In", "values": [str(i) for i in range(65)]}]},
            TOO_MANY,
        ),
        ("value-huge", {"matchExpressions": [{"key": "t", "operator": "In", "values": [HUGE]}]}, TOO_LONG),
    ],
)

# --- IPAddressAllocation (the operator's own; an admin's typo) --------------------------------------

ALLOC = allocation()
field(
    "allocation-name",
    ALLOC,
    "metadata.name",
    [
        ("other-v4", "198.51.100.201", NAME_IS_ADDRESS),
        ("v6-short", "v6-2001db8", NAME_IS_ADDRESS),
        ("v4-as-v6", "v6-00000000000000000000ffffc63364c8", NAME_IS_ADDRESS),
    ],
)
bad(
    "allocation-v6-name-mismatch",
    allocation("2001:db8::1", name="v6-20010db8000000000000000000000002"),
    NAME_IS_ADDRESS,
)
field(
    "allocation-address",
    ALLOC,
    "spec.address",
    [
        ("not-an-ip", "host", NOT_AN_IP),
        ("huge", HUGE, TOO_LONG),
        ("v4-mapped", "::ffff:198.51.100.200", NOT_AN_IP),
    ],
)
bad(
    "allocation-uppercase-v6",
    allocation("2001:DB8::1", name="v6-20010db8000000000000000000000001"),
    NOT_CANONICAL,
)
field(
    "allocation-holder",
    ALLOC,
    "spec.holder",
    [
        ("absent", DELETE, REQUIRED),
        ("kind-pod", {"kind": "Pod", "namespace": "t", "name": "n", "uid": "u"}, HOLDER_KIND),
        ("kind-huge", {"kind": HUGE, "namespace": "t", "name": "n", "uid": "u"}, TOO_LONG),
        ("empty-uid", {"kind": "IPAddressClaim", "namespace": "t", "name": "n", "uid": ""}, TOO_SHORT),
        ("no-namespace", {"kind": "IPAddressClaim", "name": "n", "uid": "u"}, REQUIRED),
        (
            "namespace-64",
            {"kind": "IPAddressClaim", "namespace": "a" * 64, "name": "n", "uid": "u"},
            TOO_LONG,
        ),
    ],
)
field("allocation-class", ALLOC, "spec.className", [("empty", "", TOO_SHORT), ("huge", HUGE, TOO_LONG)])
every_form("allocation-holder-change", ALLOC, {"spec": {"holder": {"uid": "u-2"}}}, ALLOCATION_FIXED)
every_form("allocation-class-change", ALLOC, {"spec": {"className": "cat-v4-b"}}, ALLOCATION_FIXED)

# --- ServiceProxy ----------------------------------------------------------------------------------

PROXY = service_proxy()
names("proxy", PROXY)
field(
    "proxy-name",
    PROXY,
    "spec.serviceProxyName",
    [
        ("absent", DELETE, REQUIRED),
        ("space", "cozy proxy", PROXY_NAME),
        ("empty", "", TOO_SHORT),
        ("huge", HUGE, TOO_LONG),
        ("leading-dash", "-cozy", PROXY_NAME),
        ("unicode", UNICODE, PROXY_NAME),
        ("slash", "cozystack.io/proxy", PROXY_NAME),
    ],
)
field(
    "proxy-modes",
    PROXY,
    "spec.modes",
    [
        ("standard", ["Standard"], PROXY_MODES),
        ("lowercase", ["portlist"], PROXY_MODES),
        ("duplicate", ["PortList", "PortList"], DUPLICATE),
        ("three", ["PortList", "WholeIP", "Standard"], TOO_MANY),
        ("string-not-list", "PortList", ARRAY),
        ("huge", [HUGE], TOO_LONG),
    ],
)
field(
    "proxy-families",
    PROXY,
    "spec.ipFamilies",
    [
        ("ipv5", ["IPv5"], PROXY_FAMILIES),
        ("lowercase", ["ipv4"], PROXY_FAMILIES),
        ("duplicate", ["IPv4", "IPv4"], DUPLICATE),
        ("huge", [HUGE], TOO_LONG),
    ],
)

# --- GPUClass --------------------------------------------------------------------------------------

GPU = gpu_class()
names("gpu", GPU)
field(
    "gpu-resource",
    GPU,
    "spec.resourceName",
    [
        ("absent", DELETE, REQUIRED),
        ("no-domain", "gpu", RESOURCE_SHAPE),
        ("kubernetes-io", "kubernetes.io/gpu", RESOURCE_K8S),
        ("sub-kubernetes-io", "example.kubernetes.io/gpu", RESOURCE_K8S),
        ("requests-prefix", "requests.example.com/gpu", RESOURCE_REQUESTS),
        ("uppercase-domain", "NVIDIA.com/GH100", RESOURCE_SHAPE),
        ("name-64", "nvidia.com/" + "A" * 64, RESOURCE_SHAPE),
        ("name-leading-dash", "nvidia.com/-bad", RESOURCE_SHAPE),
        ("no-name", "nvidia.com/", RESOURCE_SHAPE),
        ("no-domain-slash", "/gpu", RESOURCE_SHAPE),
        ("two-slashes", "nvidia.com/gpu/extra", RESOURCE_SHAPE),
        ("unicode", "nvidia.com/gpü", RESOURCE_SHAPE),
        ("space", "nvidia.com/ gpu", RESOURCE_SHAPE),
        ("domain-254", ".".join(["a" * 63] * 4)[:254].rstrip(".") + "x/gpu", RESOURCE_DOMAIN),
        ("huge", HUGE, TOO_LONG),
        ("integer", 42, STRING),
        ("empty", "", RESOURCE_SHAPE),
    ],
)
every_form("gpu-resource-rename", GPU, {"spec": {"resourceName": "nvidia.com/A100"}}, RESOURCE_FIXED)
TOL = "spec.tolerations"
field(
    "gpu-toleration",
    GPU,
    TOL,
    [
        ("operator-gt", [{"key": "k", "operator": "Gt", "value": "1"}], TOLERATION_OPERATOR),
        ("operator-huge", [{"key": "k", "operator": HUGE}], TOO_LONG),
        ("exists-with-value", [{"key": "k", "operator": "Exists", "value": "v"}], TOLERATION_EXISTS),
        ("empty-key-equal", [{"operator": "Equal", "value": "v"}], TOLERATION_EMPTY_KEY),
        ("key-space", [{"key": "a b", "operator": "Exists"}], TOLERATION_KEY),
        ("key-unicode", [{"key": UNICODE, "operator": "Exists"}], TOLERATION_KEY),
        ("key-huge", [{"key": HUGE, "operator": "Exists"}], TOO_LONG),
        ("value-space", [{"key": "k", "operator": "Equal", "value": "a b"}], TOLERATION_VALUE),
        ("value-64", [{"key": "k", "operator": "Equal", "value": "a" * 64}], TOO_LONG),
        ("effect-unknown", [{"key": "k", "operator": "Exists", "effect": "Sometimes"}], TOLERATION_EFFECT),
        (
            "seconds-without-noexecute",
            [{"key": "k", "operator": "Exists", "tolerationSeconds": 5}],
            TOLERATION_SECONDS,
        ),
        (
            "seconds-string",
            [{"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": "5"}],
            INTEGER,
        ),
        ("33-items", [{"key": f"k{i}", "operator": "Exists"} for i in range(33)], TOO_MANY),
        ("object-not-list", {"key": "k", "operator": "Exists"}, ARRAY),
    ],
)
field(
    "gpu-vm-sizes",
    GPU,
    "spec.vmSizes",
    [
        ("zero", [0], VM_SIZE_MIN),
        ("negative", [1, -2], VM_SIZE_MIN),
        ("empty", [], VM_SIZES_EMPTY),
        ("duplicate", [2, 4, 2], VM_SIZES_TWICE),
        ("9-items", list(range(1, 10)), TOO_MANY),
        ("string-item", ["2"], INTEGER),
        ("fraction", [1.5], INTEGER),
        ("integer-not-list", 4, ARRAY),
    ],
)
field(
    "gpu-display",
    GPU,
    "spec.displayName",
    [("129-chars", "é" * 129, TOO_LONG), ("huge", HUGE, TOO_LONG), ("integer", 7, STRING)],
)
field(
    "gpu-description",
    GPU,
    "spec.description",
    [("1025-chars", "d" * 1025, TOO_LONG), ("huge", HUGE, TOO_LONG)],
)
