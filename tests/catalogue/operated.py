"""Bad inputs the schema cannot refuse: the operators' answers, one row each, in groups that share one
running pair of operators.

Every group starts from the same world (the runner builds it): a tenant namespace (``{tenant}``) with
the Postgres application ``db`` (its HelmRelease), its tenant-facing Service ``postgres-db-rw``
selecting one ready VM pod, the address substrate (its CRDs and the model of its controllers) with
the default class ``cat-v4`` (198.51.100.0/28), and the sentinels whose objects must never change: an
Attached attachment, a Bound claim of class ``cat-sentinel``, and a GPU class. A second namespace
(``{other}``) holds what "another tenant's" means. The group ``datapath`` runs the EndpointAttachment
operator with the platform's cozy-proxy contract declared; every other group without.

The answers are Cozystack's vocabulary (conditions ``Resolved`` and ``Provisioned``; the design
reference's reasons), plus the operator's own three where Cozystack has no word: ``Unresolved``
(Provisioned while Resolved is not True), ``NoReadyBackend`` and ``AddressNotAnnounced``. They are
written here, not imported: the rows say what a tenant must read, whatever the operator's modules
are called.

Decides: each row's objects and steps, and the answer: the condition (type, status, reason) on the
object the row is about, or (handled) what the operator did instead of failing.

Does not: build the world or check what did not change (the runner does, after every row); try the
substrate's own kinds (a claim's or class's bad input is the substrate's to answer).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from harness.substrate import CLAIM_ANNOTATION
from operators.gpuclass import reasons as gpu
from shared.lineage import TENANT_RESOURCE_LABEL
from tests.catalogue.model import (
    OTHER,
    SENTINEL_SERVICE,
    TENANT,
    Expect,
    Obj,
    Operated,
    Step,
    conditioned,
    handled,
)
from tests.catalogue.objects import (
    APP_KIND,
    APP_SELECTOR,
    address_class,
    attachment,
    claim,
    gpu_class,
    helmrelease,
    pod,
    service,
)
from tests.ea_builders import lineage_labels

# Condition types (Cozystack's).
CONDITION_RESOLVED: Final = "Resolved"
CONDITION_PROVISIONED: Final = "Provisioned"
# Resolved=False: the application or its endpoint.
APPLICATION_NOT_FOUND: Final = "ApplicationNotFound"
ENDPOINT_NOT_FOUND: Final = "EndpointNotFound"
ENDPOINT_LINEAGE_MISMATCH: Final = "EndpointLineageMismatch"
ENDPOINT_NOT_TENANT_FACING: Final = "EndpointNotTenantFacing"
# Provisioned=False: the claim, the datapath, the rendered Service.
CLAIM_PENDING: Final = "ClaimPending"
CLAIM_NOT_FOUND: Final = "ClaimNotFound"
CLAIM_IN_USE: Final = "ClaimInUse"
FAMILY_CONFLICT: Final = "FamilyConflict"
NOTHING_TO_PUBLISH: Final = "NothingToPublish"
DATAPATH_UNAVAILABLE: Final = "DatapathContractUnavailable"
MULTIPLE_BACKENDS: Final = "MultipleBackends"
BACKEND_ALREADY_DELEGATED: Final = "BackendAlreadyDelegated"
ENDPOINT_DETACHED: Final = "EndpointDetached"
RENDER_FAILED: Final = "RenderFailed"
# The operator's own, where Cozystack's list has no word.
UNRESOLVED: Final = "Unresolved"
NO_READY_BACKEND: Final = "NoReadyBackend"
# True.
REASON_RESOLVED: Final = "Resolved"
REASON_PROVISIONED: Final = "Provisioned"
# The phase Provisioned=True and Resolved=True project to, and the one after the endpoint went.
ATTACHED: Final = "Attached"
DETACHED: Final = "Detached"
# cozy-proxy's contract on a Service (the design reference): its proxy-name label, and the ICMP switch.
PROXY_NAME_LABEL: Final = "service.kubernetes.io/service-proxy-name"
COZY_PROXY: Final = "cozy-proxy"
WHOLE_IP_ANNOTATION: Final = "networking.cozystack.io/wholeIP"
ALLOW_ICMP_ANNOTATION: Final = "networking.cozystack.io/allowICMP"
# The diagnostic label on a rendered Service (never what makes it the attachment's).
ATTACHMENT_LABEL: Final = "cozystack.io/endpoint-attachment"

EA: Final = "EndpointAttachment"
GPU: Final = "GPUClass"

ROWS: list[Operated] = []


def create(obj: Obj) -> Step:
    return Step("create", obj)


def delete(obj: Obj) -> Step:
    return Step("delete", obj)


def wait(expect: Expect) -> Step:
    return Step("await", expect=expect)


def ready_pod(
    name: str, ip: str, labels: Mapping[str, str] = APP_SELECTOR, *, ready: bool = True
) -> list[Step]:
    """A VM pod, bound and marked Ready (or not) with ``ip`` as the kubelet would."""
    status = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": TENANT},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }
    return [create(pod(name, labels)), Step("patch", status, "status")]


def endpoint(name: str, app: str = "db", tenant_facing: bool = True, **kw: Any) -> Obj:
    return service(name, labels=lineage_labels(kind=APP_KIND, name=app, tenant_facing=tenant_facing), **kw)


def row(answer: str, id: str, group: str, steps: list[Step], expect: Expect, **kw: Any) -> None:
    make = conditioned if answer == "conditioned" else handled
    ROWS.append(make(id, group, steps, expect, **kw))


def about(
    obj: Obj, reason: str = "", type: str | None = CONDITION_PROVISIONED, status: str = "False", **kw: Any
) -> Expect:
    metadata = obj["metadata"]
    return Expect(obj["kind"], metadata["name"], reason, status, type, metadata.get("namespace", ""), **kw)


def attached(obj: Obj, **kw: Any) -> Expect:
    return about(obj, REASON_PROVISIONED, CONDITION_PROVISIONED, "True", **kw)


def service_of(ctx: Mapping[str, Any], obj: Obj) -> Obj | None:
    name = (obj.get("status") or {}).get("serviceName")
    return ctx["services"].get(name) if name else None


def annotations_of(obj: Obj | None) -> Mapping[str, str]:
    return ((obj or {}).get("metadata") or {}).get("annotations") or {}


def owned_by(item: Obj, obj: Obj) -> bool:
    uid = obj["metadata"]["uid"]
    return any(r.get("uid") == uid for r in item["metadata"].get("ownerReferences") or [])


def draws_nothing(obj: Obj, ctx: Mapping[str, Any]) -> bool:
    """Nothing rendered and no claim minted for ``obj``: no address drawn while nothing can be
    published."""
    return service_of(ctx, obj) is None and not any(owned_by(c, obj) for c in ctx["claims"].values())


def resolved_false(*reasons: str) -> Any:
    def check(obj: Obj, ctx: Mapping[str, Any]) -> bool:
        found = {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}
        got = found.get(CONDITION_RESOLVED) or {}
        return got.get("status") == "False" and got.get("reason") in reasons

    return check


# --- Endpoint and application ----------------------------------------------------------------------

G = "endpoint"
a = attachment("cat-missing-endpoint", endpoint="no-such-service")
row("conditioned", "ea-endpoint-missing", G, [create(a)], about(a, ENDPOINT_NOT_FOUND, CONDITION_RESOLVED))
a = attachment("cat-missing-endpoint-2", endpoint="no-such-service")
row(
    "conditioned",
    "ea-endpoint-missing-draws-no-address",
    G,
    [create(a)],
    about(a, UNRESOLVED, check=draws_nothing, check_says="no Service rendered, no claim minted"),
)
a = attachment("cat-other-ns-endpoint", endpoint="other-db-rw")
row(
    "conditioned",
    "ea-endpoint-in-other-namespace",
    G,
    [create(endpoint("other-db-rw", namespace=OTHER)), create(a)],
    about(a, ENDPOINT_NOT_FOUND, CONDITION_RESOLVED),
)
a = attachment("cat-internal", endpoint="postgres-db-repl")
row(
    "conditioned",
    "ea-endpoint-not-tenant-facing",
    G,
    [create(endpoint("postgres-db-repl", tenant_facing=False)), create(a)],
    about(a, ENDPOINT_NOT_TENANT_FACING, CONDITION_RESOLVED),
)
a = attachment("cat-unlabelled", endpoint="plain-svc")
row(
    "conditioned",
    "ea-endpoint-without-lineage",
    G,
    [create(service("plain-svc", labels={TENANT_RESOURCE_LABEL: "true"})), create(a)],
    about(a, ENDPOINT_LINEAGE_MISMATCH, CONDITION_RESOLVED),
)
a = attachment("cat-unknown-app", endpoint="postgres-uni-rw")
row(
    "conditioned",
    "ea-endpoint-of-another-application",
    G,
    [create(endpoint("postgres-uni-rw", app="db-2")), create(a)],
    about(a, ENDPOINT_LINEAGE_MISMATCH, CONDITION_RESOLVED),
)
a = attachment("cat-of-ours", endpoint=SENTINEL_SERVICE)
row(
    "conditioned",
    "ea-endpoint-is-an-attachments-service",
    G,
    [create(a)],
    about(
        a,
        type=None,
        check=resolved_false(ENDPOINT_LINEAGE_MISMATCH, ENDPOINT_NOT_TENANT_FACING),
        check_says="Resolved=False: a rendered Service is no endpoint of the application",
    ),
)
a = attachment("cat-ghost-app", endpoint="postgres-ghost-rw", app="ghost")
row(
    "conditioned",
    "ea-application-missing",
    G,
    [create(endpoint("postgres-ghost-rw", app="ghost")), create(a)],
    about(a, APPLICATION_NOT_FOUND, CONDITION_RESOLVED),
)
a = attachment("cat-wrong-kind", kind="MariaDB")
row(
    "conditioned",
    "ea-application-of-another-kind",
    G,
    [create(a)],
    about(a, APPLICATION_NOT_FOUND, CONDITION_RESOLVED),
)
a = attachment("cat-wrong-group")
a["spec"]["applicationRef"]["group"] = "apps.example.com"
row(
    "conditioned",
    "ea-application-of-another-group",
    G,
    [create(a)],
    about(a, APPLICATION_NOT_FOUND, CONDITION_RESOLVED),
)
hr = helmrelease("postgres-unlabelled", {})
a = attachment("cat-unlabelled-app", endpoint="postgres-unl-rw", app="unlabelled")
row(
    "conditioned",
    "ea-application-helmrelease-without-lineage",
    G,
    [create(hr), create(endpoint("postgres-unl-rw", app="unlabelled")), create(a)],
    about(a, APPLICATION_NOT_FOUND, CONDITION_RESOLVED),
)
for id, name, body in (
    ("ea-endpoint-selects-nothing", "postgres-db-noselector", {"selector": None}),
    ("ea-endpoint-empty-selector", "postgres-db-all", {"selector": {}}),
    ("ea-endpoint-headless-without-ports", "postgres-db-headless", {"ports": [], "clusterIP": "None"}),
    (
        "ea-endpoint-external-name",
        "postgres-db-ext",
        {"selector": None, "ports": [], "type": "ExternalName", "externalName": "db.example.com"},
    ),
    (
        "ea-vm-sentinel-port-only",
        "vm-instance-cat",
        {"clusterIP": "None", "ports": [{"name": "sentinel", "protocol": "TCP", "port": 65535}]},
    ),
):
    a = attachment(f"cat-{id.removeprefix('ea-')}", endpoint=name)
    row(
        "conditioned",
        id,
        G,
        [create(endpoint(name, **body)), create(a)],
        about(a, NOTHING_TO_PUBLISH, check=draws_nothing, check_says="no address drawn"),
    )
a = attachment("cat-port-not-on-endpoint", ports=[6543])
row("conditioned", "ea-ports-not-on-the-endpoint", G, [create(a)], about(a, NOTHING_TO_PUBLISH))
gone = endpoint("postgres-db-ro")
a = attachment("cat-detached", endpoint="postgres-db-ro")
row(
    "conditioned",
    "ea-endpoint-deleted-after-attach",
    G,
    [create(gone), create(a), wait(attached(a)), delete(gone)],
    about(
        a,
        ENDPOINT_DETACHED,
        check=lambda obj, ctx: (
            obj["status"].get("phase") == DETACHED
            and service_of(ctx, obj) is None
            and bool(obj["status"].get("claimName"))
        ),
        check_says="phase Detached, the Service withdrawn, the claim kept",
    ),
)
long_name = ".".join(["x" * 63, "y" * 63, "z" * 63, "w" * 61])  # 253 characters
for id, a, says in (
    ("ea-name-253-chars", attachment(long_name), "cut to a Service name"),
    ("ea-name-63-chars", attachment("n" * 63), "cut to leave room for the random suffix"),
    ("ea-dotted-name", attachment("cat.dotted.name"), "the dots replaced: a Service name is a DNS label"),
):
    row(
        "handled",
        id,
        G,
        [create(a)],
        attached(
            a,
            check=lambda obj, ctx: (
                len(obj["status"]["serviceName"]) <= 63
                and "." not in obj["status"]["serviceName"]
                and service_of(ctx, obj) is not None
            ),
            check_says=f"the rendered Service exists, its generated name {says}",
        ),
    )
squatter = service("cat-squatted-x7ktq", labels={ATTACHMENT_LABEL: "cat-squatted"}, selector={"app": "other"})
a = attachment("cat-squatted")
row(
    "handled",
    "ea-labelled-service-without-owner-reference-is-not-adopted",
    G,
    [create(squatter), create(a)],
    attached(
        a,
        check=lambda obj, ctx: (
            obj["status"]["serviceName"] != "cat-squatted-x7ktq"
            and ctx["services"]["cat-squatted-x7ktq"]["spec"]["selector"] == {"app": "other"}
            and CLAIM_ANNOTATION not in annotations_of(ctx["services"]["cat-squatted-x7ktq"])
        ),
        check_says="a Service of its own rendered; the labelled one untouched",
    ),
)

# --- Addresses: classes and claims of the substrate ------------------------------------------------

G = "address"
a = attachment("cat-no-class", class_name="no-such-class")
row(
    "conditioned",
    "ea-class-missing",
    G,
    [create(a)],
    about(
        a, CLAIM_PENDING, check=lambda obj, ctx: service_of(ctx, obj) is None, check_says="nothing rendered"
    ),
)
a = attachment("cat-no-claim", claim="no-such-claim")
row("conditioned", "ea-claim-missing", G, [create(a)], about(a, CLAIM_NOT_FOUND))
c = claim("cat-elsewhere", namespace=OTHER)
a = attachment("cat-other-claim", claim="cat-elsewhere")
row("conditioned", "ea-claim-in-other-namespace", G, [create(c), create(a)], about(a, CLAIM_NOT_FOUND))
c = claim("cat-pending", class_name="no-such-class")
a = attachment("cat-pending-claim", claim="cat-pending")
row("conditioned", "ea-claim-not-bound", G, [create(c), create(a)], about(a, CLAIM_PENDING))
nobody = address_class("cat-nobody", ["198.51.100.56/30"], provisioner="example.com/nobody")
a = attachment("cat-unprovisioned", class_name="cat-nobody")
row(
    "conditioned",
    "ea-class-no-driver-serves",
    G,
    [create(nobody), create(a)],
    about(
        a, CLAIM_PENDING, check=lambda obj, ctx: service_of(ctx, obj) is None, check_says="nothing rendered"
    ),
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
    [create(c), create(first), wait(attached(first)), create(second)],
    about(second, CLAIM_IN_USE),
)
c = claim("cat-worn")
worn = service("cat-own-lb", labels=None, type="LoadBalancer", annotations={CLAIM_ANNOTATION: "cat-worn"})
a = attachment("cat-worn-claim", claim="cat-worn")
row(
    "conditioned",
    "ea-claim-worn-by-a-tenants-own-service",
    G,
    [create(c), create(worn), create(a)],
    about(a, CLAIM_IN_USE),
)
for id, claimed, asked in (
    ("ea-family-v6-of-a-v4-claim", "IPv4", "IPv6"),
    ("ea-family-v4-of-a-dual-claim", "Dual", "IPv4"),
):
    c = claim(f"cat-{claimed.lower()}-claim", family=claimed)
    a = attachment(f"cat-{id.removeprefix('ea-')}", claim=c["metadata"]["name"], family=asked)
    row("conditioned", id, G, [create(c), create(a)], about(a, FAMILY_CONFLICT))
single = address_class("cat-single", ["198.51.100.48/32"])
one, two = (
    attachment("cat-single-1", class_name="cat-single"),
    attachment("cat-single-2", class_name="cat-single"),
)
row(
    "conditioned",
    "ea-class-exhausted",
    G,
    [create(single), create(one), wait(attached(one)), create(two)],
    about(
        two, CLAIM_PENDING, check=lambda obj, ctx: service_of(ctx, obj) is None, check_says="nothing rendered"
    ),
)

# --- The VM modes where the platform declares no cozy-proxy contract (the address group's operator) --

for method in ("PortList", "WholeIP"):
    a = attachment(f"cat-no-contract-{method.lower()}", ports=[5432], method=method)
    row(
        "conditioned",
        f"ea-{method.lower()}-without-the-contract",
        G,
        [create(a)],
        about(a, DATAPATH_UNAVAILABLE, check=draws_nothing, check_says="no address drawn"),
    )

# --- Datapath: the VM modes, with the cozy-proxy contract declared ---------------------------------

G = "datapath"
TWO = {"app": "cat-two"}
for method in ("PortList", "WholeIP"):
    a = attachment(
        f"cat-two-backends-{method.lower()}", endpoint="postgres-db-two", ports=[5432], method=method
    )
    row(
        "conditioned",
        f"ea-{method.lower()}-two-ready-backends",
        G,
        [
            *ready_pod("cat-two-0", "10.244.9.10", TWO),
            *ready_pod("cat-two-1", "10.244.9.11", TWO),
            create(endpoint("postgres-db-two", selector=TWO)),
            create(a),
        ],
        about(a, MULTIPLE_BACKENDS),
    )
NONE_READY = {"app": "cat-starting"}
a = attachment("cat-vm-starting", endpoint="postgres-db-starting", method="WholeIP")
row(
    "conditioned",
    "ea-wholeip-no-ready-backend",
    G,
    [
        *ready_pod("cat-starting-0", "10.244.9.20", NONE_READY, ready=False),
        create(endpoint("postgres-db-starting", selector=NONE_READY)),
        create(a),
    ],
    about(a, NO_READY_BACKEND),
)
older, younger = attachment("cat-vm-older", method="WholeIP"), attachment("cat-vm-younger", method="WholeIP")
row(
    "conditioned",
    "ea-two-vm-attachments-one-pod",
    G,
    [create(older), wait(attached(older)), create(younger)],
    about(
        younger,
        BACKEND_ALREADY_DELEGATED,
        check=lambda obj, ctx: service_of(ctx, obj) is None,
        check_says="the loser renders nothing",
    ),
)
chart = service(
    "cat-chart-external",
    labels={PROXY_NAME_LABEL: COZY_PROXY},
    type="LoadBalancer",
    annotations={WHOLE_IP_ANNOTATION: "true"},
)
a = attachment("cat-vs-chart", method="WholeIP")
row(
    "conditioned",
    "ea-chart-cozy-proxy-service-wins",
    G,
    [create(chart), create(a)],
    about(a, BACKEND_ALREADY_DELEGATED),
)
a = attachment("cat-icmp-off", ports=[5432], method="PortList", allowICMP=False)
row(
    "handled",
    "ea-portlist-icmp-off",
    G,
    [create(a)],
    attached(
        a,
        check=lambda obj, ctx: annotations_of(service_of(ctx, obj)).get(ALLOW_ICMP_ANNOTATION) != "true",
        check_says="the Service does not tell cozy-proxy to accept ICMP",
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
    about(g, gpu.REASON_READY_NOT_PERMITTED, gpu.CONDITION_READY),
)
g = gpu_class("cat-gpu-nowhere", "nvidia.com/GH100_H100_PCIE")
row(
    "conditioned",
    "gpu-resource-on-no-node",
    G,
    [create(g)],
    about(g, gpu.REASON_NO_ELIGIBLE_NODES, gpu.CONDITION_READY),
)
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
    "conditioned",
    "gpu-tolerates-every-taint-no-node",
    G,
    [create(g)],
    about(g, gpu.REASON_NO_ELIGIBLE_NODES, gpu.CONDITION_READY),
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
    about(g, gpu.REASON_NO_ELIGIBLE_NODES, gpu.CONDITION_READY),
)
