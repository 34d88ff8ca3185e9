"""Bad inputs the schema cannot refuse: the operators' answers, one row each, in groups that share one
running pair of operators.

Every group starts from the same world (the runner builds it): a tenant namespace (``{tenant}``) with
the Postgres application ``db`` (its HelmRelease), its tenant-facing Service ``postgres-db-rw``
selecting one ready VM pod, the address class ``cat-v4`` (198.51.100.0/28), and the sentinels whose
objects must never change: a Published attachment and a Bound claim of class ``cat-sentinel``, and a
GPU class. A second namespace (``{other}``) holds what "another tenant's" means.

Decides: each row's objects and steps, and the answer: the condition (type, status, reason) on the
object the row is about, or (handled) what the operator did instead of failing.

Does not: build the world or check what did not change (the runner does, after every row).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from operators.endpointattachment import claims
from operators.endpointattachment import constants as ea
from operators.gpuclass import reasons as gpu
from shared.lineage import TENANT_RESOURCE_LABEL
from tests.catalogue.model import (
    OTHER,
    TENANT,
    Expect,
    Obj,
    Operated,
    Step,
    conditioned,
    handled,
)
from tests.catalogue.objects import (
    APP_SELECTOR,
    address_class,
    attachment,
    claim,
    gpu_class,
    pod,
    service,
    service_proxy,
)
from tests.ea_builders import lineage_labels

SERVICE_REFUSED: Final = ea.REASON_SERVICE_REFUSED
PROXY_CONFLICT: Final = ea.REASON_PROXY_DECLARATION_CONFLICT
POOL_EMPTY: Final = ea.REASON_POOL_EMPTY
# The claim reconciler's own reasons.
NOT_IN_CLASS: Final = claims.REASON_ADDRESS_NOT_IN_CLASS
RESERVED: Final = claims.REASON_RESERVED
IN_USE: Final = claims.REASON_IN_USE

EA: Final = ea.ENDPOINT_ATTACHMENT_KIND
CLAIM: Final = ea.IP_ADDRESS_CLAIM_KIND
IPCLASS: Final = ea.IP_ADDRESS_CLASS_KIND
GPU: Final = "GPUClass"
RESOLVED: Final = ea.COND_ENDPOINT_RESOLVED
BOUND: Final = ea.COND_ADDRESS_BOUND
DATAPATH: Final = ea.COND_DATAPATH_ADMITTED
READY: Final = ea.COND_READY

ROWS: list[Operated] = []


def create(obj: Obj) -> Step:
    return Step("create", obj)


def delete(obj: Obj) -> Step:
    return Step("delete", obj)


def wait(expect: Expect) -> Step:
    return Step("await", expect=expect)


def ready_pod(name: str, ip: str, labels: Mapping[str, str] = APP_SELECTOR) -> list[Step]:
    """A VM pod, bound and marked Ready with ``ip`` as the kubelet would."""
    status = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": TENANT},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    return [create(pod(name, labels)), Step("patch", status, "status")]


def endpoint(name: str, app: str = "db", tenant_facing: bool = True, **kw: Any) -> Obj:
    return service(name, labels=lineage_labels(kind="Postgres", name=app, tenant_facing=tenant_facing), **kw)


def row(answer: str, id: str, group: str, steps: list[Step], expect: Expect, **kw: Any) -> None:
    make = conditioned if answer == "conditioned" else handled
    ROWS.append(make(id, group, steps, expect, **kw))


def about(obj: Obj, reason: str = "", type: str | None = READY, status: str = "False", **kw: Any) -> Expect:
    metadata = obj["metadata"]
    return Expect(obj["kind"], metadata["name"], reason, status, type, metadata.get("namespace", ""), **kw)


def service_of(ctx: Mapping[str, Any], obj: Obj) -> Obj | None:
    name = (obj.get("status") or {}).get("serviceName")
    return ctx["services"].get(name) if name else None


def capacity_is(count: int) -> Any:
    return lambda obj, ctx: (obj.get("status") or {}).get("capacity") == count


# --- Endpoint and application ----------------------------------------------------------------------

G = "endpoint"
a = attachment("cat-missing-endpoint", endpoint="no-such-service")
row("conditioned", "ea-endpoint-missing", G, [create(a)], about(a, ea.REASON_ENDPOINT_NOT_FOUND, RESOLVED))
a = attachment("cat-other-ns-endpoint", endpoint="other-db-rw")
row(
    "conditioned",
    "ea-endpoint-in-other-namespace",
    G,
    [create(endpoint("other-db-rw", namespace=OTHER)), create(a)],
    about(a, ea.REASON_ENDPOINT_NOT_FOUND, RESOLVED),
)
a = attachment("cat-internal", endpoint="postgres-db-repl")
row(
    "conditioned",
    "ea-endpoint-not-tenant-facing",
    G,
    [create(endpoint("postgres-db-repl", tenant_facing=False)), create(a)],
    about(a, ea.REASON_ENDPOINT_NOT_TENANT_FACING, RESOLVED),
)
a = attachment("cat-unlabelled", endpoint="plain-svc")
row(
    "conditioned",
    "ea-endpoint-without-lineage",
    G,
    [create(service("plain-svc", labels={TENANT_RESOURCE_LABEL: "true"})), create(a)],
    about(a, ea.REASON_ENDPOINT_NOT_TENANT_FACING, RESOLVED),
)
a = attachment("cat-of-ours", endpoint="ea-cat-sentinel")
row(
    "conditioned",
    "ea-endpoint-is-an-attachments-service",
    G,
    [create(a)],
    about(a, ea.REASON_ENDPOINT_NOT_TENANT_FACING, RESOLVED),
)
a = attachment("cat-no-selector", endpoint="postgres-db-noselector")
row(
    "conditioned",
    "ea-endpoint-selects-nothing",
    G,
    [create(endpoint("postgres-db-noselector", selector=None)), create(a)],
    about(a, ea.REASON_ENDPOINT_HAS_NO_SELECTOR, RESOLVED),
)
a = attachment("cat-external-name", endpoint="postgres-db-ext")
row(
    "conditioned",
    "ea-endpoint-external-name",
    G,
    [
        create(
            endpoint(
                "postgres-db-ext", selector=None, ports=[], type="ExternalName", externalName="db.example.com"
            )
        ),
        create(a),
    ],
    about(a, ea.REASON_ENDPOINT_HAS_NO_SELECTOR, RESOLVED),
)
a = attachment("cat-no-ports", endpoint="postgres-db-headless")
row(
    "conditioned",
    "ea-endpoint-headless-without-ports",
    G,
    [create(endpoint("postgres-db-headless", ports=[], clusterIP="None")), create(a)],
    about(a, ea.REASON_ENDPOINT_HAS_NO_PORTS, RESOLVED),
)
a = attachment("cat-ghost-app", endpoint="postgres-ghost-rw")
row(
    "conditioned",
    "ea-application-missing",
    G,
    [create(endpoint("postgres-ghost-rw", app="ghost")), create(a)],
    about(a, ea.REASON_APPLICATION_NOT_FOUND, RESOLVED),
)
a = attachment("cat-selects-everything", endpoint="postgres-db-all")
row(
    "conditioned",
    "ea-endpoint-empty-selector",
    G,
    [create(endpoint("postgres-db-all", selector={})), create(a)],
    about(a, ea.REASON_ENDPOINT_HAS_NO_SELECTOR, RESOLVED),
)
long_name = ".".join(["x" * 63, "y" * 63, "z" * 63, "w" * 61])  # 253 characters
a = attachment(long_name)
row(
    "handled",
    "ea-name-253-chars-hashed-service-name",
    G,
    [create(a)],
    about(
        a,
        ea.REASON_PUBLISHED,
        status="True",
        check=lambda obj, ctx: len(obj["status"]["serviceName"]) <= 63 and service_of(ctx, obj) is not None,
        check_says="the Service name is cut and hashed to 63 characters, and the Service exists",
    ),
)
a = attachment("n" * 61)  # ea- + 61 = 64
row(
    "handled",
    "ea-name-61-chars-service-name-64",
    G,
    [create(a)],
    about(
        a,
        ea.REASON_PUBLISHED,
        status="True",
        check=lambda obj, ctx: len(obj["status"]["serviceName"]) <= 63 and service_of(ctx, obj) is not None,
        check_says="the Service name is cut and hashed to 63 characters",
    ),
)
a = attachment("cat.dotted.name")
row(
    "handled",
    "ea-dotted-name-service-name",
    G,
    [create(a)],
    about(
        a,
        ea.REASON_PUBLISHED,
        status="True",
        check=lambda obj, ctx: "." not in obj["status"]["serviceName"] and service_of(ctx, obj) is not None,
        check_says="the dots are replaced: a Service name is a DNS-1035 label",
    ),
)
a = attachment("cat-squatted")
row(
    "conditioned",
    "ea-service-name-squatted",
    G,
    [create(service("ea-cat-squatted", labels=None)), create(a)],
    about(a, ea.REASON_SERVICE_NAME_CONFLICT),
)
a = attachment("cat-unknown-app", endpoint="postgres-uni-rw")
row(
    "conditioned",
    "ea-endpoint-lineage-names-unknown-app",
    G,
    [create(endpoint("postgres-uni-rw", app="db-2")), create(a)],
    about(a, ea.REASON_APPLICATION_NOT_FOUND, RESOLVED),
)

# --- Addresses: classes, pools, claims -------------------------------------------------------------

G = "address"
a = attachment("cat-no-class", class_name="no-such-class")
row("conditioned", "ea-class-missing", G, [create(a)], about(a, ea.REASON_CLASS_NOT_FOUND, BOUND))
a = attachment("cat-no-claim", claim="no-such-claim")
row("conditioned", "ea-claim-missing", G, [create(a)], about(a, ea.REASON_CLAIM_NOT_FOUND, BOUND))
c = claim("cat-elsewhere", namespace=OTHER)
a = attachment("cat-other-claim", claim="cat-elsewhere")
row(
    "conditioned",
    "ea-claim-in-other-namespace",
    G,
    [create(c), create(a)],
    about(a, ea.REASON_CLAIM_NOT_FOUND, BOUND),
)
c = claim("cat-pending", class_name="no-such-class")
a = attachment("cat-pending-claim", claim="cat-pending")
row(
    "conditioned",
    "ea-claim-not-bound",
    G,
    [create(c), create(a)],
    about(a, ea.REASON_CLAIM_NOT_BOUND, BOUND),
)
c = claim("cat-shared")
first, second = (
    attachment("cat-first-user", claim="cat-shared"),
    attachment("cat-second-user", claim="cat-shared"),
)
row(
    "conditioned",
    "ea-claim-used-twice",
    G,
    [create(c), create(first), wait(about(first, ea.REASON_PUBLISHED, status="True")), create(second)],
    about(second, ea.REASON_CLAIM_IN_USE, BOUND),
)
c = claim("cat-no-class", class_name="no-such-class")
row("conditioned", "claim-class-missing", G, [create(c)], about(c, ea.REASON_CLASS_NOT_FOUND, BOUND))
c = claim("cat-outside", address="192.0.2.1")
row("conditioned", "claim-address-outside-class", G, [create(c)], about(c, NOT_IN_CLASS, BOUND))
c = claim("cat-network-address", address="198.51.100.0")
row("conditioned", "claim-network-address-of-cidr", G, [create(c)], about(c, NOT_IN_CLASS, BOUND))
c = claim("cat-broadcast", address="198.51.100.15")
row("conditioned", "claim-broadcast-address-of-cidr", G, [create(c)], about(c, NOT_IN_CLASS, BOUND))
c = claim("cat-v6-in-v4", address="2001:db8::1")
row("conditioned", "claim-v6-address-in-v4-class", G, [create(c)], about(c, NOT_IN_CLASS, BOUND))
c = claim("cat-taken", address="198.51.100.65")  # the sentinel claim's or attachment's class: not ours
row("conditioned", "claim-address-of-another-class", G, [create(c)], about(c, NOT_IN_CLASS, BOUND))
holder, thief = claim("cat-holder", address="198.51.100.9"), claim("cat-thief", address="198.51.100.9")
row(
    "conditioned",
    "claim-address-held-by-another-claim",
    G,
    [create(holder), wait(about(holder, RESERVED, status="True")), create(thief)],
    about(thief, ea.REASON_ADDRESS_IN_USE, BOUND),
)
pin = address_class("cat-pin", cidrs=["198.51.100.72/32"])
c = claim("cat-late-pin", class_name="cat-pin")
row(
    "handled",
    "claim-address-set-after-bound-only-to-the-held-address",
    G,
    [
        create(pin),
        create(c),
        wait(about(c, RESERVED, status="True")),
        Step("refuse", {**c, "spec": {"address": "198.51.100.73"}}, says="can only be set to the address"),
        Step("patch", {**c, "spec": {"address": "198.51.100.72"}}),
    ],
    about(
        c,
        RESERVED,
        status="True",
        check=lambda obj, ctx: (
            obj["status"]["phase"] == ea.CLAIM_PHASE_BOUND
            and obj["status"]["address"] == obj["spec"]["address"] == "198.51.100.72"
        ),
        check_says="still Bound to the address it held, now pinned",
    ),
)
ns_class = address_class(
    "cat-only-gold", cidrs=["198.51.100.32/30"], allowedNamespaces={"matchLabels": {"tier": "gold"}}
)
a = attachment("cat-not-allowed", class_name="cat-only-gold")
row(
    "conditioned",
    "ea-class-selector-matches-nothing",
    G,
    [create(ns_class), create(a)],
    about(a, ea.REASON_NAMESPACE_NOT_ALLOWED, BOUND),
)
expr_class = address_class(
    "cat-not-tenants",
    cidrs=["198.51.100.36/30"],
    allowedNamespaces={"matchExpressions": [{"key": "cat-tenant", "operator": "DoesNotExist"}]},
)
a = attachment("cat-excluded-ns", class_name="cat-not-tenants")
row(
    "conditioned",
    "ea-class-selector-excludes-tenant",
    G,
    [create(expr_class), create(a)],
    about(a, ea.REASON_NAMESPACE_NOT_ALLOWED, BOUND),
)
c = claim("cat-claim-not-allowed", class_name="cat-only-gold")
row(
    "conditioned",
    "claim-class-selector-matches-nothing",
    G,
    [create(ns_class), create(c)],
    about(c, ea.REASON_NAMESPACE_NOT_ALLOWED, BOUND),
)
all_class = address_class("cat-everyone", cidrs=["198.51.100.40/30"], allowedNamespaces={})
a = attachment("cat-everyone-ea", class_name="cat-everyone")
row(
    "handled",
    "ea-class-selector-empty-matches-every-namespace",
    G,
    [create(all_class), create(a)],
    about(a, ea.REASON_PUBLISHED, status="True"),
)
empty = address_class(
    "cat-empty", cidrs=["198.51.100.44/30"], excludeAddresses=["198.51.100.45", "198.51.100.46"]
)
a = attachment("cat-from-empty", class_name="cat-empty")
row(
    "conditioned",
    "ea-pool-empty-everything-excluded",
    G,
    [create(empty), create(a)],
    about(a, ea.REASON_POOL_EXHAUSTED, BOUND),
)
row(
    "conditioned",
    "class-pool-empty-everything-excluded",
    G,
    [create(empty)],
    about(empty, POOL_EMPTY, READY),
)
single = address_class("cat-single", cidrs=["198.51.100.48/32"])
one, two = (
    attachment("cat-single-1", class_name="cat-single"),
    attachment("cat-single-2", class_name="cat-single"),
)
row(
    "conditioned",
    "ea-pool-exhausted",
    G,
    [create(single), create(one), wait(about(one, ea.REASON_MINTED, BOUND, "True")), create(two)],
    about(two, ea.REASON_POOL_EXHAUSTED, BOUND),
)
c = claim("cat-single-claim", class_name="cat-single")
row(
    "conditioned",
    "claim-pool-exhausted",
    G,
    [create(single), create(one), wait(about(one, ea.REASON_MINTED, BOUND, "True")), create(c)],
    about(c, ea.REASON_POOL_EXHAUSTED, BOUND),
)
overlap_a = address_class("cat-overlap-a", cidrs=["198.51.100.52/31"])
overlap_b = address_class(
    "cat-overlap-b", ranges=[{"start": "198.51.100.52", "end": "198.51.100.53"}], cidrs=None
)
oa, ob = (
    attachment("cat-overlap-1", class_name="cat-overlap-a"),
    attachment("cat-overlap-2", class_name="cat-overlap-b"),
)
row(
    "handled",
    "ea-overlapping-classes-never-double-an-address",
    G,
    [
        create(overlap_a),
        create(overlap_b),
        create(oa),
        wait(about(oa, ea.REASON_MINTED, BOUND, "True")),
        create(ob),
    ],
    about(
        ob,
        ea.REASON_MINTED,
        BOUND,
        "True",
        check=lambda obj, ctx: (
            obj["status"]["address"] != ctx["attachments"]["cat-overlap-1"]["status"]["address"]
        ),
        check_says="the second class mints the other address of the shared pair",
    ),
)
oc = attachment("cat-overlap-3", class_name="cat-overlap-b")
row(
    "conditioned",
    "ea-overlapping-classes-exhaust-together",
    G,
    [
        create(overlap_a),
        create(overlap_b),
        create(oa),
        create(ob),
        wait(about(oa, ea.REASON_MINTED, BOUND, "True")),
        wait(about(ob, ea.REASON_MINTED, BOUND, "True")),
        create(oc),
    ],
    about(oc, ea.REASON_POOL_EXHAUSTED, BOUND),
)
for cidr, count, id in (
    ("10.0.0.0/8", 2**24 - 2, "class-huge-v4-pool-slash-8"),
    ("0.0.0.0/0", 2**32 - 2, "class-whole-v4-space"),
):
    huge_class = address_class(f"cat-{id}", cidrs=[cidr])
    row(
        "handled",
        id,
        G,
        [create(huge_class)],
        about(huge_class, check=capacity_is(count), check_says=f"capacity {count}"),
    )
v6_all = address_class("cat-whole-v6-space", cidrs=["::/0"])
row(
    "handled",
    "class-whole-v6-space-capacity-saturates",
    G,
    [create(v6_all)],
    about(v6_all, check=capacity_is(2**63 - 1), check_says="capacity saturated at the largest int64"),
)
huge_v4 = address_class("cat-slash-8", cidrs=["10.0.0.0/8"])
a = attachment("cat-from-slash-8", class_name="cat-slash-8")
row(
    "handled",
    "ea-mint-from-slash-8",
    G,
    [create(huge_v4), create(a)],
    about(
        a,
        ea.REASON_MINTED,
        BOUND,
        "True",
        check=lambda obj, ctx: obj["status"]["address"].startswith("10."),
        check_says="an address of 10.0.0.0/8 is minted without walking the pool",
    ),
)
v6 = address_class("cat-v6", cidrs=["2001:db8:cat::/120".replace("cat", "ca7")])
a = attachment("cat-v6-in-v4-cluster", class_name="cat-v6")
row(
    "conditioned",
    "ea-v6-class-in-v4-only-cluster",
    G,
    [create(v6), create(a)],
    about(a, SERVICE_REFUSED),
)
unserved = address_class("cat-unserved", cidrs=["198.51.100.56/30"], loadBalancerClass="example.com/nobody")
a = attachment("cat-unserved-lb", class_name="cat-unserved")
row(
    "conditioned",
    "ea-load-balancer-class-nobody-serves",
    G,
    [create(unserved), create(a)],
    about(a, ea.REASON_ADDRESS_PENDING),
)
doomed = address_class("cat-doomed", cidrs=["198.51.100.60/30"])
a = attachment("cat-orphaned", class_name="cat-doomed")
row(
    "conditioned",
    "ea-class-deleted-under-a-live-attachment",
    G,
    [create(doomed), create(a), wait(about(a, ea.REASON_PUBLISHED, status="True")), delete(doomed)],
    about(a, ea.REASON_CLASS_NOT_FOUND),
)
c = claim("cat-doomed-claim", class_name="cat-doomed")
row(
    "conditioned",
    "claim-class-deleted-under-a-bound-claim",
    G,
    [create(doomed), create(c), wait(about(c, RESERVED, status="True")), delete(doomed)],
    about(c, ea.REASON_CLASS_NOT_FOUND),
)
c = claim("cat-in-use")
a = attachment("cat-claim-user", claim="cat-in-use")
row(
    "conditioned",
    "claim-deleted-while-used",
    G,
    [create(c), create(a), wait(about(a, ea.REASON_PUBLISHED, status="True")), Step("request-delete", c)],
    about(c, IN_USE),
)
cilium = address_class("cat-cilium", cidrs=["198.51.100.68/30"], provider="CiliumLBIPAM")
a = attachment("cat-cilium-ea", class_name="cat-cilium")
row(
    "handled",
    "ea-cilium-provider-annotation",
    G,
    [create(cilium), create(a)],
    about(
        a,
        ea.REASON_MINTED,
        BOUND,
        "True",
        check=lambda obj, ctx: (
            ea.CILIUM_IPS_ANNOTATION
            in (service_of(ctx, obj) or {}).get("metadata", {}).get("annotations", {})
        ),
        check_says="the Service asks Cilium LB-IPAM, not MetalLB",
    ),
)

# --- Datapath: proxies and VM modes ----------------------------------------------------------------

G = "datapath"
proxy = service_proxy("cat-proxy")
a = attachment("cat-no-proxy", mode="PortList")
row(
    "conditioned",
    "ea-portlist-without-proxy",
    G,
    [create(a)],
    about(a, ea.REASON_PROXY_NOT_DECLARED, DATAPATH),
)
a = attachment("cat-wholeip-only", mode="PortList")
row(
    "conditioned",
    "ea-portlist-proxy-declares-only-wholeip",
    G,
    [create(service_proxy("cat-proxy-wholeip", modes=["WholeIP"])), create(a)],
    about(a, ea.REASON_PROXY_NOT_DECLARED, DATAPATH),
)
a = attachment("cat-proxy-v6-only", mode="WholeIP")
row(
    "conditioned",
    "ea-proxy-serves-only-ipv6",
    G,
    [create(service_proxy("cat-proxy-v6", ipFamilies=["IPv6"])), create(a)],
    about(a, ea.REASON_ADDRESS_FAMILY_UNSUPPORTED, DATAPATH),
)
a = attachment("cat-proxy-no-modes", mode="WholeIP")
row(
    "conditioned",
    "ea-proxy-declares-no-modes",
    G,
    [create(service_proxy("cat-proxy-empty", modes=[])), create(a)],
    about(a, ea.REASON_PROXY_NOT_DECLARED, DATAPATH),
)
a = attachment("cat-translated", endpoint="postgres-db-translated", mode="PortList")
row(
    "conditioned",
    "ea-portlist-port-translation",
    G,
    [
        create(proxy),
        create(
            endpoint(
                "postgres-db-translated",
                ports=[{"name": "pg", "protocol": "TCP", "port": 5432, "targetPort": 6432}],
            )
        ),
        create(a),
    ],
    about(a, ea.REASON_PORT_TRANSLATION_UNSUPPORTED, DATAPATH),
)
a = attachment("cat-named-port", endpoint="postgres-db-named", mode="PortList")
row(
    "conditioned",
    "ea-portlist-named-target-port",
    G,
    [
        create(proxy),
        create(
            endpoint(
                "postgres-db-named",
                ports=[{"name": "pg", "protocol": "TCP", "port": 5432, "targetPort": "pg"}],
            )
        ),
        create(a),
    ],
    about(a, ea.REASON_PORT_TRANSLATION_UNSUPPORTED, DATAPATH),
)
a = attachment("cat-sctp", endpoint="postgres-db-sctp", mode="PortList")
row(
    "conditioned",
    "ea-portlist-sctp-port",
    G,
    [
        create(proxy),
        create(
            endpoint(
                "postgres-db-sctp",
                ports=[{"name": "pg", "protocol": "SCTP", "port": 5432, "targetPort": 5432}],
            )
        ),
        create(a),
    ],
    about(a, ea.REASON_PORT_TRANSLATION_UNSUPPORTED, DATAPATH),
)
TWO = {"app": "cat-two"}
for mode in ("PortList", "WholeIP"):
    a = attachment(f"cat-two-backends-{mode.lower()}", endpoint="postgres-db-two", mode=mode)
    row(
        "conditioned",
        f"ea-{mode.lower()}-two-ready-backends",
        G,
        [
            create(proxy),
            *ready_pod("cat-two-0", "10.244.9.10", TWO),
            *ready_pod("cat-two-1", "10.244.9.11", TWO),
            create(endpoint("postgres-db-two", selector=TWO)),
            create(a),
        ],
        about(a, ea.REASON_MULTIPLE_BACKENDS, DATAPATH),
    )
older, younger = attachment("cat-vm-older", mode="WholeIP"), attachment("cat-vm-younger", mode="WholeIP")
row(
    "conditioned",
    "ea-two-vm-attachments-one-pod",
    G,
    [create(proxy), create(older), wait(about(older, ea.REASON_ADMITTED, DATAPATH, "True")), create(younger)],
    about(younger, ea.REASON_EXCLUSIVITY_CONFLICT, DATAPATH),
)
a = attachment("cat-two-proxies", mode="PortList")
row(
    "conditioned",
    "ea-two-serviceproxy-declarations-disagree",
    G,
    [
        create(proxy),
        create(a),
        wait(about(a, ea.REASON_ADMITTED, DATAPATH, "True")),
        create(service_proxy("aaa-cat-rogue", proxy_name="rogue-proxy")),
    ],
    about(
        a,
        PROXY_CONFLICT,
        DATAPATH,
        check=lambda obj, ctx: (
            (service_of(ctx, obj) or {"metadata": {"labels": {}}})["metadata"]["labels"].get(
                ea.SERVICE_PROXY_NAME_LABEL
            )
            != "rogue-proxy"
        ),
        check_says="the live Service is not relabelled for a proxy nobody runs",
    ),
)
a = attachment("cat-icmp-off", mode="PortList", allowICMP=False)
row(
    "handled",
    "ea-portlist-icmp-off",
    G,
    [create(proxy), create(a)],
    about(
        a,
        ea.REASON_ADMITTED,
        DATAPATH,
        "True",
        check=lambda obj, ctx: (
            (service_of(ctx, obj) or {})
            .get("metadata", {})
            .get("annotations", {})
            .get(ea.ALLOW_ICMP_ANNOTATION)
            == ea.ANNOTATION_FALSE
        ),
        check_says="the Service tells cozy-proxy not to accept ICMP",
    ),
)

# --- GPU classes -----------------------------------------------------------------------------------

G = "gpu"
H200 = "nvidia.com/GH100_H200_SXM_141GB"
older_gpu, younger_gpu = gpu_class("cat-gpu-older", H200), gpu_class("cat-gpu-younger", H200)
row(
    "conditioned",
    "gpu-two-classes-one-resource",
    G,
    [
        create(older_gpu),
        wait(about(older_gpu, gpu.REASON_RESOURCE_NAME_OWNED, gpu.CONDITION_RESOURCE_NAME_CONFLICT)),
        create(younger_gpu),
    ],
    about(younger_gpu, gpu.REASON_READY_RESOURCE_NAME_CONFLICT, gpu.CONDITION_READY),
)
g = gpu_class("cat-gpu-unlisted", "example.com/FPGA")
row(
    "conditioned",
    "gpu-resource-not-permitted-by-kubevirt",
    G,
    [create(g)],
    about(g, gpu.REASON_READY_NOT_PERMITTED),
)
g = gpu_class("cat-gpu-nowhere", "nvidia.com/GH100_H100_PCIE")
row("conditioned", "gpu-resource-on-no-node", G, [create(g)], about(g, gpu.REASON_NO_ELIGIBLE_NODES))
renamed_a, renamed_b = gpu_class("cat-gpu-renamed", H200), gpu_class("cat-gpu-renamed", "example.com/OTHER")
row(
    "conditioned",
    "gpu-class-recreated-with-another-resource",
    G,
    [
        create(renamed_a),
        wait(about(renamed_a, gpu.REASON_RESOURCE_NAME_OWNED, gpu.CONDITION_RESOURCE_NAME_CONFLICT)),
        delete(renamed_a),
        create(renamed_b),
    ],
    about(renamed_b, gpu.REASON_NOT_PERMITTED, gpu.CONDITION_KUBEVIRT_PERMITTED),
)
g = gpu_class("cat-gpu-tolerates-all", "nvidia.com/GH100_H100L_94GB", tolerations=[{"operator": "Exists"}])
row(
    "conditioned", "gpu-tolerates-every-taint-no-node", G, [create(g)], about(g, gpu.REASON_NO_ELIGIBLE_NODES)
)
g = gpu_class(
    "cat-gpu-unicode",
    "nvidia.com/AD102GL_L40S",
    displayName="GPU « ünïcødé » 🚀" * 6,
    description="д" * 1024,
)
row(
    "conditioned",
    "gpu-unicode-display-fields-at-limit",
    G,
    [create(g)],
    about(g, gpu.REASON_NO_ELIGIBLE_NODES),
)
