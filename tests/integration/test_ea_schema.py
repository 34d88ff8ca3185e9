"""Cozystack's EndpointAttachment schema (config/crd/endpointattachment/) on the local control plane,
with no operator running: what the API server alone refuses and accepts.

One row per rule: refused manifests (and refused updates, every immutability rule through an update
of a stored attachment) with the message a person reads; accepted manifests as Cozystack documents
them, and the render knobs changed after create; the group default; the status the operator writes;
the printer columns as ``kubectl get`` prints them (the server's Table); and a stock object-count
ResourceQuota on attachments. Only this CRD is installed: the address substrate's kinds are not ours.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from harness.manifests import ROOT, apply_all, load
from harness.quota import quota_in_force
from harness.tables import printed_row
from harness.waiting import wait_for_object
from shared.kube import ApiError, Kube, Obj
from shared.resources import RESOURCE_QUOTAS, Resource
from tests.catalogue.admission import (
    APPLICATION_FIXED,
    CLAIM_FIXED,
    CLASS_FIXED,
    EXACTLY_ONE,
    EXCLUSIVE,
    FAMILY_FIXED,
    MECHANISM_FIXED,
    PORT_LIST_PORTS,
)
from tests.catalogue.admission import ICMP as ICMP_PORT_LIST_ONLY

GROUP: Final = "local.sdn.cozystack.io"
API_VERSION: Final = f"{GROUP}/v1alpha1"
KIND: Final = "EndpointAttachment"
PLURAL: Final = "endpointattachments"
CRD_DIR: Final = "config/crd/endpointattachment"
CRD_FILE: Final = f"{CRD_DIR}/{GROUP}_{PLURAL}.yaml"
ATTACHMENTS: Final = Resource(API_VERSION, PLURAL)
QUOTA_KEY: Final = f"count/{PLURAL}.{GROUP}"
# The substrate's kinds: a prerequisite like Flux's HelmRelease, never a CRD of ours.
SUBSTRATE_PLURALS: Final = ("ipaddressclasses", "ipaddressclaims", "ipaddresses")
# applicationRef.group when the tenant leaves it out.
DEFAULT_GROUP: Final = "apps.cozystack.io"

# The rules' messages (config/crd/endpointattachment) are the catalogue's (tests/catalogue/admission).
# Kubernetes' own schema checks.
REQUIRED: Final = "Required value"
UNSUPPORTED: Final = "Unsupported value"
TOO_SHORT: Final = "should be at least 1 chars long"
TOO_LONG: Final = "Too long"
TOO_MANY: Final = "must have at most 256 items"
DUPLICATE: Final = "Duplicate value"
BELOW_ONE: Final = "should be greater than or equal to 1"
ABOVE_PORTS: Final = "should be less than or equal to 65535"


# --- Objects ---------------------------------------------------------------------------------------


def attachment(name: str = "db-public", **load_balancer: Any) -> Obj:
    """An attachment as Cozystack documents it: Postgres ``db``'s postgres-db-rw, minted from the
    class public (``load_balancer`` fields replace or, as None, remove those of spec.loadBalancer)."""
    lb: Obj = {"className": "public"}
    for key, value in load_balancer.items():
        if value is None:
            lb.pop(key, None)
        else:
            lb[key] = value
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {
            "applicationRef": {"kind": "Postgres", "name": "db"},
            "endpoint": {"serviceName": "postgres-db-rw"},
            "loadBalancer": lb,
        },
    }


def with_spec(obj: Mapping[str, Any], **fields: Any) -> Obj:
    """A copy of ``obj`` with top-level spec fields set (None removes one)."""
    copied = copy.deepcopy(dict(obj))
    for key, value in fields.items():
        if value is None:
            copied["spec"].pop(key, None)
        else:
            copied["spec"][key] = value
    return copied


CLAIMED: Final = attachment("held", className=None, claimName="held-ip")
DEFAULT_CLASS: Final = attachment("default-class", className=None)
FAMILY: Final = attachment("dual", family="Dual")
PORT_LIST: Final = attachment("vm-web", ports=[80, 443], method="PortList", allowICMP=True)


@pytest.fixture(scope="module")
async def ea_crd(kube: Kube) -> None:
    await apply_all(kube, load(CRD_FILE))


async def create(kube: Kube, namespace: str, obj: Mapping[str, Any]) -> Obj:
    return await kube.create(ATTACHMENTS.path(namespace), obj)


def path_of(namespace: str, obj: Mapping[str, Any]) -> str:
    return ATTACHMENTS.path(namespace, obj["metadata"]["name"])


# --- Refusals --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Refused:
    """``obj`` is refused on create; or, with ``change``, created and then the merge patch is refused.
    The refusal holds every one of ``says``."""

    obj: Obj
    says: tuple[str, ...]
    change: Obj | None = None


def refused(obj: Obj, *says: str, change: Obj | None = None, id: str) -> Any:
    return pytest.param(Refused(obj, says, change), id=id)


def lb_change(**fields: Any) -> Obj:
    return {"spec": {"loadBalancer": fields}}


REFUSED = [
    # The mechanism union: exactly one member, and whether it is set is fixed.
    refused(with_spec(attachment(), loadBalancer=None), EXACTLY_ONE, id="no-mechanism"),
    refused(
        attachment(),
        EXACTLY_ONE,
        MECHANISM_FIXED,
        change={"spec": {"loadBalancer": None}},
        id="mechanism-removed",
    ),
    # applicationRef: kind and name required and non-empty, the whole immutable.
    refused(with_spec(attachment(), applicationRef=None), REQUIRED, id="no-application"),
    refused(with_spec(attachment(), applicationRef={"name": "db"}), REQUIRED, id="application-no-kind"),
    refused(with_spec(attachment(), applicationRef={"kind": "Postgres"}), REQUIRED, id="application-no-name"),
    refused(
        with_spec(attachment(), applicationRef={"kind": "", "name": "db"}),
        TOO_SHORT,
        id="application-empty-kind",
    ),
    refused(
        with_spec(attachment(), applicationRef={"kind": "Postgres", "name": ""}),
        TOO_SHORT,
        id="application-empty-name",
    ),
    refused(
        attachment(),
        APPLICATION_FIXED,
        change={"spec": {"applicationRef": {"name": "db-2"}}},
        id="application-name-changed",
    ),
    refused(
        attachment(),
        APPLICATION_FIXED,
        change={"spec": {"applicationRef": {"kind": "MariaDB"}}},
        id="application-kind-changed",
    ),
    refused(
        attachment(),
        APPLICATION_FIXED,
        change={"spec": {"applicationRef": {"group": "apps.example.com"}}},
        id="application-group-changed",
    ),
    # endpoint.serviceName: required and non-empty.
    refused(with_spec(attachment(), endpoint=None), REQUIRED, id="no-endpoint"),
    refused(with_spec(attachment(), endpoint={}), REQUIRED, id="endpoint-no-service-name"),
    refused(with_spec(attachment(), endpoint={"serviceName": ""}), TOO_SHORT, id="endpoint-empty"),
    refused(with_spec(attachment(), endpoint={"serviceName": "a" * 64}), TOO_LONG, id="endpoint-64-chars"),
    # className and claimName: one or neither, each fixed once created (added, removed or changed).
    refused(attachment(claimName="held-ip"), EXCLUSIVE, id="class-and-claim"),
    refused(attachment(), CLASS_FIXED, change=lb_change(className="other"), id="class-changed"),
    refused(attachment(), CLASS_FIXED, change=lb_change(className=None), id="class-removed"),
    refused(DEFAULT_CLASS, CLASS_FIXED, change=lb_change(className="public"), id="class-added"),
    refused(CLAIMED, CLAIM_FIXED, change=lb_change(claimName="other-ip"), id="claim-changed"),
    refused(CLAIMED, CLAIM_FIXED, change=lb_change(claimName=None), id="claim-removed"),
    refused(DEFAULT_CLASS, CLAIM_FIXED, change=lb_change(claimName="held-ip"), id="claim-added"),
    refused(
        attachment(),
        CLASS_FIXED,
        CLAIM_FIXED,
        change=lb_change(className=None, claimName="held-ip"),
        id="class-to-claim",
    ),
    # family: one of three, fixed once created.
    refused(attachment(family="IPv5"), UNSUPPORTED, id="family-unknown"),
    refused(attachment(family="ipv4"), UNSUPPORTED, id="family-lowercase"),
    refused(FAMILY, FAMILY_FIXED, change=lb_change(family="IPv4"), id="family-changed"),
    refused(FAMILY, FAMILY_FIXED, change=lb_change(family=None), id="family-removed"),
    refused(attachment(), FAMILY_FIXED, change=lb_change(family="IPv4"), id="family-added"),
    # ports: a set of 1..65535, at most 256.
    refused(attachment(ports=[0]), BELOW_ONE, id="port-zero"),
    refused(attachment(ports=[65536]), ABOVE_PORTS, id="port-too-high"),
    refused(attachment(ports=[5432, 5432]), DUPLICATE, id="port-twice"),
    refused(attachment(ports=list(range(1, 258))), TOO_MANY, id="ports-257"),
    refused(attachment(ports=["5432"]), "must be of type integer", id="port-string"),
    # method and allowICMP.
    refused(attachment(method="Standard"), UNSUPPORTED, id="method-unknown"),
    refused(attachment(method="PortList"), PORT_LIST_PORTS, id="port-list-without-ports"),
    refused(attachment(method="PortList", ports=[]), PORT_LIST_PORTS, id="port-list-empty-ports"),
    refused(attachment(allowICMP=True), ICMP_PORT_LIST_ONLY, id="icmp-without-method"),
    refused(attachment(allowICMP=False), ICMP_PORT_LIST_ONLY, id="icmp-false-without-method"),
    refused(attachment(method="WholeIP", allowICMP=True), ICMP_PORT_LIST_ONLY, id="icmp-whole-ip"),
    refused(
        PORT_LIST,
        ICMP_PORT_LIST_ONLY,
        change=lb_change(method="WholeIP"),
        id="icmp-kept-leaving-port-list",
    ),
    refused(PORT_LIST, PORT_LIST_PORTS, change=lb_change(ports=None), id="port-list-ports-removed"),
]


@pytest.mark.parametrize("case", REFUSED)
async def test_the_schema_refuses_with_a_message_a_person_understands(
    kube: Kube, namespace: str, ea_crd: None, case: Refused
) -> None:
    if case.change is None:
        with pytest.raises(ApiError) as refusal:
            await create(kube, namespace, case.obj)
    else:
        stored = await create(kube, namespace, case.obj)
        with pytest.raises(ApiError) as refusal:
            await kube.patch(path_of(namespace, stored), case.change, kind="merge")
        after = await kube.get(path_of(namespace, stored))
        assert after is not None
        assert after["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
    assert refusal.value.status == 422, refusal.value
    for says in case.says:
        assert says in refusal.value.message, refusal.value.message


# --- Acceptances -----------------------------------------------------------------------------------

ACCEPTED = [
    pytest.param(attachment(), id="minted-from-a-class"),
    pytest.param(CLAIMED, id="reserved-claim"),
    pytest.param(DEFAULT_CLASS, id="minted-from-the-default-class"),
    pytest.param(FAMILY, id="dual-stack"),
    pytest.param(attachment(family="IPv6", ports=[5432]), id="ipv6-one-port"),
    pytest.param(PORT_LIST, id="vm-port-list-icmp"),
    pytest.param(attachment("vm-port-list", ports=[22], method="PortList"), id="vm-port-list"),
    pytest.param(attachment("vm-whole", className=None, method="WholeIP"), id="vm-whole-ip"),
    pytest.param(attachment("vm-sentinel", ports=[65535, 1]), id="port-bounds"),
    pytest.param(attachment("many-ports", ports=list(range(1, 257))), id="ports-256"),
    # Cozystack's Go types omit an empty string: "" is as good as absent, and is accepted as there.
    pytest.param(attachment("empty-class", className=""), id="empty-class-name"),
    pytest.param(
        with_spec(
            attachment("explicit-group"),
            applicationRef={"group": "apps.cozystack.io", "kind": "VMInstance", "name": "vm"},
        ),
        id="explicit-group",
    ),
    pytest.param(attachment("db.public-v4"), id="dotted-name"),
]


@pytest.mark.parametrize("obj", ACCEPTED)
async def test_the_schema_accepts_attachments_as_cozystack_documents_them(
    kube: Kube, namespace: str, ea_crd: None, obj: Obj
) -> None:
    created = await create(kube, namespace, obj)
    assert created["spec"]["loadBalancer"] == obj["spec"]["loadBalancer"]
    assert created["spec"]["endpoint"] == obj["spec"]["endpoint"]


# Render knobs: (the attachment, a merge patch the API must accept).
MUTABLE = [
    pytest.param(attachment(), {"spec": {"endpoint": {"serviceName": "postgres-db-ro"}}}, id="endpoint"),
    pytest.param(attachment(), lb_change(ports=[5432]), id="ports-added"),
    pytest.param(PORT_LIST, lb_change(ports=[8080]), id="ports-changed"),
    pytest.param(attachment(ports=[5432]), lb_change(ports=None), id="ports-removed"),
    pytest.param(attachment(), lb_change(method="WholeIP"), id="method-added"),
    pytest.param(PORT_LIST, lb_change(method="WholeIP", allowICMP=None), id="method-changed"),
    pytest.param(PORT_LIST, lb_change(allowICMP=False), id="icmp-changed"),
    pytest.param(PORT_LIST, lb_change(allowICMP=None), id="icmp-removed"),
    # Removing the group puts the default back: the reference is unchanged.
    pytest.param(attachment(), {"spec": {"applicationRef": {"group": None}}}, id="group-default-again"),
    # The same class written again is no change.
    pytest.param(attachment(), lb_change(className="public"), id="class-unchanged"),
]


@pytest.mark.parametrize(("obj", "change"), MUTABLE)
async def test_the_render_knobs_stay_mutable(
    kube: Kube, namespace: str, ea_crd: None, obj: Obj, change: Obj
) -> None:
    stored = await create(kube, namespace, obj)
    changed = await kube.patch(path_of(namespace, stored), change, kind="merge")
    for key, value in change["spec"].items():
        for field, wanted in value.items():
            if wanted is not None:
                assert changed["spec"][key][field] == wanted
            elif key == "applicationRef":
                assert changed["spec"][key][field] == DEFAULT_GROUP
            else:
                assert field not in changed["spec"][key]


async def test_the_application_group_defaults_to_apps_cozystack_io(
    kube: Kube, namespace: str, ea_crd: None
) -> None:
    created = await create(kube, namespace, attachment())
    assert created["spec"]["applicationRef"] == {"group": DEFAULT_GROUP, "kind": "Postgres", "name": "db"}
    # Nothing else is defaulted: an absent family is the claim's own, an absent method is no VM mode.
    assert created["spec"]["loadBalancer"] == {"className": "public"}


# --- Status ----------------------------------------------------------------------------------------

NOW: Final = "2026-12-01T00:00:00Z"


def condition(type_: str, status: str, reason: str, message: str) -> Obj:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": NOW,
        "observedGeneration": 1,
    }


ATTACHED: Final = {
    "observedGeneration": 1,
    "phase": "Attached",
    "serviceName": "db-public-x7ktq",
    "claimName": "db-public-k2m9p",
    "addresses": ["203.0.113.7", "2001:db8::7"],
    "conditions": [
        condition("Resolved", "True", "Resolved", "postgres-db-rw of Postgres db"),
        condition("Provisioned", "True", "Provisioned", "203.0.113.7, 2001:db8::7 on db-public-x7ktq"),
    ],
}


async def test_the_status_the_operator_writes_is_accepted_and_printed(
    kube: Kube, namespace: str, ea_crd: None
) -> None:
    created = await create(kube, namespace, attachment())
    path = path_of(namespace, created)
    stored = await kube.patch(path + "/status", {"status": ATTACHED}, kind="merge")
    assert stored["status"] == ATTACHED
    # The spec is not written through /status, nor the status through the object.
    spec_write = await kube.patch(path, {"status": {"phase": "Pending"}}, kind="merge")
    assert spec_write["status"]["phase"] == "Attached"

    row = await printed_row(kube, path)
    assert row["Name"] == "db-public"
    assert row["Application"] == "db"
    assert row["Endpoint"] == "postgres-db-rw"
    assert row["Phase"] == "Attached"
    assert "203.0.113.7" in row["Addresses"], row
    assert "2001:db8::7" in row["Addresses"], row
    assert list(row) == ["Name", "Application", "Endpoint", "Phase", "Addresses", "Age"]


STATUS_REFUSED = [
    pytest.param({"phase": "Ready"}, UNSUPPORTED, id="phase-unknown"),
    pytest.param({"addresses": "203.0.113.7"}, "must be of type array", id="addresses-not-a-list"),
    pytest.param(
        {"conditions": [condition("Resolved", "Maybe", "Resolved", "")]}, UNSUPPORTED, id="condition-status"
    ),
    pytest.param(
        {
            "conditions": [
                condition("Resolved", "True", "Resolved", ""),
                condition("Resolved", "True", "R", ""),
            ]
        },
        DUPLICATE,
        id="condition-twice",
    ),
    pytest.param(
        {"conditions": [{"type": "Resolved", "status": "True"}]}, REQUIRED, id="condition-without-reason"
    ),
]


@pytest.mark.parametrize(("status", "says"), STATUS_REFUSED)
async def test_a_malformed_status_is_refused(
    kube: Kube, namespace: str, ea_crd: None, status: Obj, says: str
) -> None:
    created = await create(kube, namespace, attachment())
    with pytest.raises(ApiError) as refusal:
        await kube.patch(path_of(namespace, created) + "/status", {"status": status}, kind="merge")
    assert refusal.value.status == 422, refusal.value
    assert says in refusal.value.message, refusal.value.message


# --- The CRD as served -----------------------------------------------------------------------------


async def test_one_version_is_served_and_no_substrate_kind_is_ours(kube: Kube, ea_crd: None) -> None:
    [crd] = load(CRD_FILE)
    assert [(v["name"], v["served"], v["storage"]) for v in crd["spec"]["versions"]] == [
        ("v1alpha1", True, True)
    ]
    assert crd["spec"]["names"]["shortNames"] == ["ea"]
    ours = [
        doc["spec"]["names"]["plural"]
        for path in sorted((ROOT / CRD_DIR).glob("*.yaml"))
        for doc in yaml.safe_load_all(Path(path).read_text())
        if doc and doc.get("kind") == "CustomResourceDefinition"
    ]
    assert ours == [PLURAL]
    assert not set(ours) & set(SUBSTRATE_PLURALS)
    # The kustomization installs exactly that file.
    assert load(f"{CRD_DIR}/kustomization.yaml")[0]["resources"] == [Path(CRD_FILE).name]


# --- Quota -----------------------------------------------------------------------------------------


async def test_an_object_count_quota_refuses_the_second_attachment(
    kube: Kube, namespace: str, ea_crd: None
) -> None:
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "attachments"},
        "spec": {"hard": {QUOTA_KEY: "1"}},
    }
    await quota_in_force(kube, namespace, quota, QUOTA_KEY)
    await create(kube, namespace, attachment("first"))
    with pytest.raises(ApiError) as refusal:
        await create(kube, namespace, attachment("second"))
    assert refusal.value.status == 403
    assert "exceeded quota" in refusal.value.message
    assert QUOTA_KEY in refusal.value.message
    used = await wait_for_object(
        kube,
        RESOURCE_QUOTAS,
        "attachments",
        lambda q: q is not None and q["status"]["used"].get(QUOTA_KEY) == "1",
        namespace=namespace,
        what="the first attachment counted",
        timeout=60,
    )
    assert used is not None
