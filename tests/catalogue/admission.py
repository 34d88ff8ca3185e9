"""Bad inputs the API server refuses at admission, one row each, kind by kind and field by field.

Decides: for every field of our two CRDs (EndpointAttachment, GPUClass), the bad values tried (wrong
type, out of range, malformed, huge, unicode, empty) and the phrase the refusal must contain; for
every immutable field, its change (added, removed or changed) in each of the four update forms. The
address substrate's kinds are the substrate's: their schemas are not ours to try.

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
from tests.catalogue.objects import HUGE, UNICODE, attachment, gpu_class

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
EXACTLY_ONE: Final = "exactly one mechanism must be set, and loadBalancer is the only one"
# A GPUClass names its GPUs by exactly one of a resource name and a DRA DeviceClass.
GPU_SOURCE: Final = "set exactly one of resourceName"
MECHANISM_FIXED: Final = "the mechanism is immutable: spec.loadBalancer cannot be added or removed"
APPLICATION_FIXED: Final = "applicationRef is immutable: create another attachment"
EXCLUSIVE: Final = "className and claimName are mutually exclusive"
CLASS_FIXED: Final = "className is immutable: create another attachment"
CLAIM_FIXED: Final = "claimName is immutable: create another attachment"
FAMILY_FIXED: Final = "family is immutable: create another attachment"
ICMP: Final = "allowICMP applies to method PortList only"
PORT_LIST_PORTS: Final = "method PortList requires ports"
# Kubernetes' own enum and range checks.
UNSUPPORTED: Final = "Unsupported value"
PORT_MIN: Final = "should be greater than or equal to 1"
PORT_MAX: Final = "should be less than or equal to 65535"
NOT_NULL: Final = "spec.loadBalancer in body must be of type object"
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
DEVICE_CLASS_SHAPE: Final = "deviceClassName must be a DeviceClass's name"
DEVICE_CLASS_FIXED: Final = "deviceClassName is immutable"
SHAPE_UNITS: Final = "a VM shape needs units (its GPUs), or an instancetype"
SHAPE_EITHER: Final = "a VM shape names either an instancetype or its cpu and memory"
SHAPE_NAME: Final = "a VM shape's name must be a DNS label"

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


def every_form(
    prefix: str, base: Obj, change: Obj, says: str, status: Obj | None = None, apply_says: str = ""
) -> None:
    """One row per update form: the same forbidden change by merge, JSON patch, apply and replace
    (``apply_says``: what server-side apply's refusal says instead, when it differs)."""
    CHANGES_TRIED.update((base["kind"], path) for path in _leaves(change))
    for form in UPDATE_FORMS:
        phrase = apply_says if form == "apply" and apply_says else says
        bad(f"{prefix}-by-{form}", base, phrase, update=Update(form, change), status=status)


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
CLAIMED = attachment(claim="cat-claim")
DEFAULT_CLASS = attachment(class_name=None)
DUAL = attachment(family="Dual")
PORT_LIST = attachment(ports=[80], method="PortList", allowICMP=True)
names("ea", EA)
for which in ("kind", "name"):
    field(
        f"ea-application-{which}",
        EA,
        f"spec.applicationRef.{which}",
        [
            ("integer", 5, STRING),
            ("empty", "", TOO_SHORT),
            ("huge", HUGE, TOO_LONG),
            ("absent", DELETE, REQUIRED),
            ("list", ["db"], STRING),
        ],
    )
field(
    "ea-application-group",
    EA,
    "spec.applicationRef.group",
    [("integer", 1, STRING), ("huge", HUGE, TOO_LONG), ("254-chars", "a" * 254, TOO_LONG)],
)
field(
    "ea-application",
    EA,
    "spec.applicationRef",
    [("string", "Postgres/db", OBJECT), ("empty", {}, REQUIRED), ("absent", DELETE, REQUIRED)],
)
field(
    "ea-endpoint-service-name",
    EA,
    "spec.endpoint.serviceName",
    [
        ("integer", 5432, STRING),
        ("empty", "", TOO_SHORT),
        ("huge", HUGE, TOO_LONG),
        ("64-chars", "a" * 64, TOO_LONG),
        ("absent", DELETE, REQUIRED),
    ],
)
field(
    "ea-endpoint",
    EA,
    "spec.endpoint",
    [("string", "postgres-db-rw", OBJECT), ("empty", {}, REQUIRED), ("absent", DELETE, REQUIRED)],
)
for which, base in (("className", EA), ("claimName", CLAIMED)):
    field(
        f"ea-{which}",
        base,
        f"spec.loadBalancer.{which}",
        [("integer", 7, STRING), ("huge", HUGE, TOO_LONG), ("254-chars", "a" * 254, TOO_LONG)],
    )
bad(
    "ea-class-and-claim",
    attachment(class_name="cat-v4", claim=None, claimName="cat-claim"),
    EXCLUSIVE,
)
field(
    "ea-family",
    EA,
    "spec.loadBalancer.family",
    [
        ("unknown", "IPv5", UNSUPPORTED),
        ("lowercase", "ipv4", UNSUPPORTED),
        ("empty", "", UNSUPPORTED),
        ("integer", 4, STRING),
        ("unicode", "IPv4\u200b", UNSUPPORTED),
        # No huge value: family and method are enums, as in Cozystack's schema, and Kubernetes' enum
        # check quotes a refused value whole, however long (a rule could say it shorter, but the
        # schema would no longer be Cozystack's field for field).
    ],
)
field(
    "ea-ports",
    EA,
    "spec.loadBalancer.ports",
    [
        ("zero", [0], PORT_MIN),
        ("negative", [-1], PORT_MIN),
        ("65536", [65536], PORT_MAX),
        ("duplicate", [5432, 5432], DUPLICATE),
        ("257-items", list(range(1, 258)), TOO_MANY),
        ("string-item", ["5432"], INTEGER),
        ("fraction", [54.5], INTEGER),
        ("integer-not-list", 5432, ARRAY),
    ],
)
field(
    "ea-method",
    EA,
    "spec.loadBalancer.method",
    [
        ("integer", 1, STRING),
        ("empty", "", UNSUPPORTED),
        ("lowercase", "portlist", UNSUPPORTED),
        ("standard", "Standard", UNSUPPORTED),
        ("unicode", "PortLïst", UNSUPPORTED),
    ],
)
field(
    "ea-port-list",
    EA,
    "spec.loadBalancer",
    [
        ("without-ports", {"className": "cat-v4", "method": "PortList"}, PORT_LIST_PORTS),
        ("empty-ports", {"className": "cat-v4", "method": "PortList", "ports": []}, PORT_LIST_PORTS),
    ],
    covers="spec.loadBalancer.method",
)
field(
    "ea-allowicmp",
    EA,
    "spec.loadBalancer",
    [
        ("string", {"ports": [80], "method": "PortList", "allowICMP": "yes"}, BOOLEAN),
        ("integer", {"ports": [80], "method": "PortList", "allowICMP": 1}, BOOLEAN),
        ("without-method", {"allowICMP": True}, ICMP),
        ("false-without-method", {"allowICMP": False}, ICMP),
        ("wholeip", {"method": "WholeIP", "allowICMP": True}, ICMP),
    ],
    covers="spec.loadBalancer.allowICMP",
)
field(
    "ea-load-balancer",
    EA,
    "spec.loadBalancer",
    [("absent", DELETE, EXACTLY_ONE), ("string", "public", OBJECT), ("list", [], OBJECT)],
)
field("ea-spec", EA, "spec", [("absent", DELETE, REQUIRED), ("list", [], OBJECT)], covers="spec")
every_form("ea-application-rename", EA, {"spec": {"applicationRef": {"name": "db-2"}}}, APPLICATION_FIXED)
every_form("ea-application-rekind", EA, {"spec": {"applicationRef": {"kind": "MariaDB"}}}, APPLICATION_FIXED)
every_form(
    "ea-application-regroup",
    EA,
    {"spec": {"applicationRef": {"group": "apps.example.com"}}},
    APPLICATION_FIXED,
)
every_form("ea-class-change", EA, {"spec": {"loadBalancer": {"className": "cat-v4-b"}}}, CLASS_FIXED)
# Applying a loadBalancer left empty (its one field removed) stores it as null, not {}: server-side
# apply's refusal is the type check's, before any rule runs.
every_form(
    "ea-class-removed", EA, {"spec": {"loadBalancer": {"className": None}}}, CLASS_FIXED, apply_says=NOT_NULL
)
every_form("ea-class-added", DEFAULT_CLASS, {"spec": {"loadBalancer": {"className": "cat-v4"}}}, CLASS_FIXED)
every_form("ea-claim-change", CLAIMED, {"spec": {"loadBalancer": {"claimName": "cat-claim-b"}}}, CLAIM_FIXED)
every_form(
    "ea-claim-removed",
    CLAIMED,
    {"spec": {"loadBalancer": {"claimName": None}}},
    CLAIM_FIXED,
    apply_says=NOT_NULL,
)
every_form(
    "ea-claim-added", DEFAULT_CLASS, {"spec": {"loadBalancer": {"claimName": "cat-claim"}}}, CLAIM_FIXED
)
every_form(
    "ea-class-to-claim",
    EA,
    {"spec": {"loadBalancer": {"className": None, "claimName": "cat-claim"}}},
    CLAIM_FIXED,
)
every_form("ea-family-change", DUAL, {"spec": {"loadBalancer": {"family": "IPv4"}}}, FAMILY_FIXED)
every_form("ea-family-removed", DUAL, {"spec": {"loadBalancer": {"family": None}}}, FAMILY_FIXED)
every_form("ea-family-added", EA, {"spec": {"loadBalancer": {"family": "IPv6"}}}, FAMILY_FIXED)
every_form("ea-mechanism-removed", EA, {"spec": {"loadBalancer": None}}, MECHANISM_FIXED)
bad(
    "ea-icmp-kept-leaving-portlist",
    PORT_LIST,
    ICMP,
    update=Update("merge", {"spec": {"loadBalancer": {"method": "WholeIP"}}}),
)
bad(
    "ea-portlist-ports-removed",
    PORT_LIST,
    PORT_LIST_PORTS,
    update=Update("merge", {"spec": {"loadBalancer": {"ports": None}}}),
)

# --- GPUClass --------------------------------------------------------------------------------------

GPU = gpu_class()
names("gpu", GPU)
field(
    "gpu-resource",
    GPU,
    "spec.resourceName",
    [
        ("absent", DELETE, GPU_SOURCE),
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
DRA = gpu_class("cat-dra")
DRA["spec"] = {"deviceClassName": "gpu.nvidia.com"}
field(
    "gpu-device-class",
    DRA,
    "spec.deviceClassName",
    [
        ("uppercase", "GPU.nvidia.com", DEVICE_CLASS_SHAPE),
        ("space", "gpu nvidia", DEVICE_CLASS_SHAPE),
        ("huge", HUGE, TOO_LONG),
        ("integer", 42, STRING),
    ],
)
bad(
    "gpu-device-class-beside-resource-name",
    with_path(GPU, "spec.deviceClassName", "gpu.nvidia.com"),
    GPU_SOURCE,
)
every_form(
    "gpu-device-class-rename", DRA, {"spec": {"deviceClassName": "other.nvidia.com"}}, DEVICE_CLASS_FIXED
)
SHAPE: Final = {"name": "g2-large", "units": 2, "cpu": "32", "memory": "256Gi"}
field(
    "gpu-vm-shapes",
    GPU,
    "spec.vmShapes",
    [
        ("no-units", [{"name": "g2"}], SHAPE_UNITS),
        ("instancetype-and-cpu", [{**SHAPE, "instancetype": "u1.h200x2"}], SHAPE_EITHER),
        ("name-uppercase", [{**SHAPE, "name": "G2"}], SHAPE_NAME),
        ("name-twice", [SHAPE, {**SHAPE, "units": 4}], DUPLICATE),
        ("no-name", [{"units": 2}], REQUIRED),
        ("9-items", [{**SHAPE, "name": f"s{i}"} for i in range(9)], TOO_MANY),
        ("object-not-list", SHAPE, ARRAY),
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
