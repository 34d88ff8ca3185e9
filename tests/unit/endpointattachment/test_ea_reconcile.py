"""reconcile: one attachment's observations -> the plan. Tables per invariant, plus a tiny simulated glue
that applies plans until a pass is quiet, to carry the design's proofs at the pure level."""

from __future__ import annotations

import copy
import dataclasses
import random
from typing import Any

import jsonpatch
import pytest

from operators.endpointattachment.addresses import parse_address, pool_of
from operators.endpointattachment.constants import (
    COND_ADDRESS_BOUND,
    COND_DATAPATH_ADMITTED,
    COND_ENDPOINT_RESOLVED,
    COND_READY,
    CONDITION_TYPES,
    REASON_ADDRESS_FAMILY_UNSUPPORTED,
    REASON_ADDRESS_IN_USE,
    REASON_ADDRESS_PENDING,
    REASON_ADDRESS_UNBOUND,
    REASON_ADMITTED,
    REASON_APPLICATION_MISMATCH,
    REASON_APPLICATION_NOT_FOUND,
    REASON_BINDING,
    REASON_CLAIM_BOUND,
    REASON_CLAIM_IN_USE,
    REASON_CLAIM_NOT_BOUND,
    REASON_CLAIM_NOT_FOUND,
    REASON_CLASS_INVALID,
    REASON_CLASS_NOT_FOUND,
    REASON_ENDPOINT_NOT_FOUND,
    REASON_ENDPOINT_NOT_TENANT_FACING,
    REASON_ENDPOINT_UNRESOLVED,
    REASON_EXCLUSIVITY_CONFLICT,
    REASON_MINTED,
    REASON_MINTING,
    REASON_MULTIPLE_BACKENDS,
    REASON_NAMESPACE_NOT_ALLOWED,
    REASON_POOL_EXHAUSTED,
    REASON_PORT_TRANSLATION_UNSUPPORTED,
    REASON_PROXY_NOT_DECLARED,
    REASON_PUBLISHED,
    REASON_RESOLVED,
    REASON_SERVICE_NAME_CONFLICT,
    SERVICE_PROXY_NAME_LABEL,
)
from operators.endpointattachment.datapath import AttachmentRank, ProxiedService
from operators.endpointattachment.reconcile import Observed, Plan, ServiceAction, reconcile, selector_matches
from shared.conditions import FALSE, TRUE, UNKNOWN
from tests.ea_builders import (
    ATTACHMENT_UID,
    HELMRELEASE_UID,
    make_attachment,
    make_claim,
    make_class,
    make_endpointslice,
    make_helmrelease,
    make_namespace_labels,
    make_service,
    make_serviceproxy,
)

NOW = "2024-02-01T00:00:00Z"
ADDRESS = "203.0.113.10"


def observe(**changes: Any) -> Observed:
    """A fully published-ready observation (held address, no Service yet), with ``changes`` applied."""
    base = Observed(
        attachment=make_attachment(),
        endpoint=make_service(),
        helmrelease=make_helmrelease(),
        address_class=make_class(),
        held_address=ADDRESS,
        taken_addresses=frozenset({ADDRESS}),
        endpoint_slices=[make_endpointslice()],
        service_proxies=[make_serviceproxy()],
        namespace_labels=make_namespace_labels(),
    )
    return dataclasses.replace(base, **changes)


def condition(plan: Plan, type_: str) -> tuple[str, str]:
    found = next(c for c in plan.conditions if c.type == type_)
    return found.status, found.reason


def published(plan: Plan, ingress: str | None = ADDRESS) -> dict[str, Any]:
    """The plan's Service as the API server would store it, with ``ingress`` announced."""
    assert plan.service is not None
    stored = copy.deepcopy(dict(plan.service))
    stored["metadata"]["uid"] = "svc-uid"
    stored["spec"]["clusterIP"] = "10.96.1.1"
    stored["status"] = {"loadBalancer": {"ingress": [{"ip": ingress}] if ingress else []}}
    return stored


# --- every pass sets all four conditions -----------------------------------------------------------

SCENARIOS = {
    "published": observe(),
    "no endpoint": observe(endpoint=None, held_address=None),
    "no class": observe(address_class=None),
    "claim in use": observe(
        attachment=make_attachment(claim_name="my-ip"),
        claim=make_claim(user=("x", "other")),
        held_address=None,
    ),
    "vm mode undeclared": observe(attachment=make_attachment(mode="WholeIP"), service_proxies=[]),
    "deleted app": observe(helmrelease=None),
}


@pytest.mark.parametrize("observed", SCENARIOS.values(), ids=SCENARIOS.keys())
def test_every_pass_sets_all_four_conditions(observed: Observed) -> None:
    plan = reconcile(observed)
    assert tuple(c.type for c in plan.conditions) == CONDITION_TYPES
    assert all(c.status in (TRUE, FALSE, UNKNOWN) and c.reason for c in plan.conditions)


# --- endpoint and application ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        pytest.param({"endpoint": None}, REASON_ENDPOINT_NOT_FOUND, id="no endpoint"),
        pytest.param(
            {"endpoint": make_service(labels={})}, REASON_ENDPOINT_NOT_TENANT_FACING, id="not tenant-facing"
        ),
        pytest.param({"helmrelease": None}, REASON_APPLICATION_NOT_FOUND, id="application gone"),
        pytest.param(
            {"helmrelease": make_helmrelease(uid="hr-2")},
            REASON_APPLICATION_MISMATCH,
            id="recreated application",
        ),
    ],
)
def test_unresolved_endpoint_is_dark_and_deletes_our_service(changes: dict[str, Any], reason: str) -> None:
    ours = published(reconcile(observe()))
    plan = reconcile(observe(service=ours, **changes))
    assert condition(plan, COND_ENDPOINT_RESOLVED) == (FALSE, reason)
    assert condition(plan, COND_READY) == (FALSE, reason)
    assert plan.service is None
    assert plan.service_action is ServiceAction.DELETE
    assert plan.status["serviceName"] is None
    assert condition(plan, COND_ADDRESS_BOUND) == (TRUE, REASON_MINTED), "a held address stays held"


def test_first_reconcile_stamps_the_owner_reference() -> None:
    plan = reconcile(observe(attachment=make_attachment(owner_uid=None)))
    assert plan.owner_reference == {
        "apiVersion": "helm.toolkit.fluxcd.io/v2",
        "kind": "HelmRelease",
        "name": "postgres-db",
        "uid": HELMRELEASE_UID,
        "controller": False,
        "blockOwnerDeletion": False,
    }
    assert reconcile(observe()).owner_reference is None
    listed = make_helmrelease()  # list items may come without apiVersion and kind
    del listed["apiVersion"], listed["kind"]
    stamped = reconcile(
        observe(attachment=make_attachment(owner_uid=None), helmrelease=listed)
    ).owner_reference
    assert stamped is not None
    assert (stamped["apiVersion"], stamped["kind"]) == ("helm.toolkit.fluxcd.io/v2", "HelmRelease")


def test_status_application_names_the_incarnation() -> None:
    plan = reconcile(observe())
    assert plan.status["application"] == {"kind": "Postgres", "name": "db", "uid": HELMRELEASE_UID}
    assert reconcile(observe(helmrelease=None)).status["application"] is None


# --- minting ---------------------------------------------------------------------------------------


def test_mint_requests_a_free_candidate_of_the_class() -> None:
    plan = reconcile(observe(held_address=None, taken_addresses=frozenset()))
    assert condition(plan, COND_ADDRESS_BOUND) == (UNKNOWN, REASON_MINTING)
    assert plan.mint is not None
    assert pool_of(make_class()["spec"]).contains(parse_address(plan.mint.address))
    assert plan.mint.allocation["metadata"]["name"] == plan.mint.address
    assert plan.mint.allocation["spec"]["holder"] == {
        "kind": "EndpointAttachment",
        "namespace": "tenant-a",
        "name": "db-public",
        "uid": ATTACHMENT_UID,
    }
    assert plan.service is None
    assert "address" not in plan.status, "status.address is written only once held"


def test_mint_skips_taken_addresses() -> None:
    pool = pool_of(make_class()["spec"])
    everything = {str(a) for a in pool.candidates()}
    last = sorted(everything)[0]
    plan = reconcile(observe(held_address=None, taken_addresses=frozenset(everything - {last})))
    assert plan.mint is not None
    assert plan.mint.address == last


def test_pool_exhausted() -> None:
    everything = frozenset(str(a) for a in pool_of(make_class()["spec"]).candidates())
    plan = reconcile(observe(held_address=None, taken_addresses=everything))
    assert condition(plan, COND_ADDRESS_BOUND) == (FALSE, REASON_POOL_EXHAUSTED)
    assert plan.mint is None


def test_lost_allocation_is_reminted_at_the_same_address() -> None:
    attachment = make_attachment(status={"address": "203.0.113.33"})
    plan = reconcile(observe(attachment=attachment, held_address=None, taken_addresses=frozenset()))
    assert plan.mint is not None
    assert plan.mint.address == "203.0.113.33"


def test_lost_address_held_by_someone_else_is_address_in_use() -> None:
    attachment = make_attachment(status={"address": "203.0.113.33"})
    plan = reconcile(
        observe(attachment=attachment, held_address=None, taken_addresses=frozenset({"203.0.113.33"}))
    )
    assert condition(plan, COND_ADDRESS_BOUND) == (FALSE, REASON_ADDRESS_IN_USE)
    assert plan.mint is None
    assert "address" not in plan.status, "the lost address stays visible"


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"endpoint": None}, id="endpoint missing"),
        pytest.param({"helmrelease": make_helmrelease(uid="hr-2")}, id="leftover of a recreated app"),
    ],
)
def test_nothing_is_minted_before_the_endpoint_resolves(changes: dict[str, Any]) -> None:
    plan = reconcile(observe(held_address=None, **changes))
    assert condition(plan, COND_ADDRESS_BOUND) == (UNKNOWN, REASON_ENDPOINT_UNRESOLVED)
    assert plan.mint is None


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        pytest.param({"address_class": None}, REASON_CLASS_NOT_FOUND, id="no class"),
        pytest.param({"address_class": make_class("other")}, REASON_CLASS_NOT_FOUND, id="another class"),
        pytest.param(
            {"address_class": make_class(cidrs=["203.0.113.1/24"])}, REASON_CLASS_INVALID, id="bad cidr"
        ),
        pytest.param(
            {"address_class": make_class(cidrs=["203.0.113.0/24", "2001:db8::/64"])},
            REASON_CLASS_INVALID,
            id="mixed",
        ),
        pytest.param(
            {"address_class": make_class(provider="F5")}, REASON_CLASS_INVALID, id="unknown provider"
        ),
        pytest.param(
            {"address_class": make_class(allowed_namespaces={"matchLabels": {"tier": "gold"}})},
            REASON_NAMESPACE_NOT_ALLOWED,
            id="namespace not allowed",
        ),
        pytest.param(
            {"attachment": make_attachment(class_name=None)},
            REASON_CLASS_NOT_FOUND,
            id="neither class nor claim",
        ),
    ],
)
def test_address_failures_are_dark(changes: dict[str, Any], reason: str) -> None:
    ours = published(reconcile(observe()))
    plan = reconcile(observe(service=ours, **changes))
    assert condition(plan, COND_ADDRESS_BOUND) == (FALSE, reason)
    assert condition(plan, COND_READY) == (FALSE, reason)
    assert plan.service_action is ServiceAction.DELETE
    assert plan.mint is None


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        pytest.param({}, {}, True, id="empty matches all"),
        pytest.param({"matchLabels": {}}, {"a": "b"}, True, id="empty matchLabels"),
        pytest.param({"matchLabels": {"tier": "gold"}}, {"tier": "gold"}, True, id="matchLabels"),
        pytest.param({"matchLabels": {"tier": "gold"}}, {"tier": "silver"}, False, id="matchLabels miss"),
        pytest.param(
            {"matchExpressions": [{"key": "t", "operator": "In", "values": ["a", "b"]}]},
            {"t": "b"},
            True,
            id="In",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "t", "operator": "In", "values": ["a"]}]}, {}, False, id="In absent"
        ),
        pytest.param(
            {"matchExpressions": [{"key": "t", "operator": "NotIn", "values": ["a"]}]},
            {},
            True,
            id="NotIn absent",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "t", "operator": "NotIn", "values": ["a"]}]},
            {"t": "a"},
            False,
            id="NotIn",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "t", "operator": "Exists"}]}, {"t": ""}, True, id="Exists"
        ),
        pytest.param(
            {"matchExpressions": [{"key": "t", "operator": "DoesNotExist"}]},
            {"t": ""},
            False,
            id="DoesNotExist",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "t", "operator": "Gt", "values": ["1"]}]},
            {"t": "2"},
            False,
            id="unknown op",
        ),
    ],
)
def test_selector_matches(selector: dict[str, Any], labels: dict[str, str], expected: bool) -> None:
    assert selector_matches(selector, labels) is expected


def test_allowed_namespace_admits() -> None:
    address_class = make_class(allowed_namespaces={"matchLabels": {"tier": "gold"}})
    plan = reconcile(
        observe(address_class=address_class, namespace_labels=make_namespace_labels(tier="gold"))
    )
    assert condition(plan, COND_ADDRESS_BOUND) == (TRUE, REASON_MINTED)


# --- claims ----------------------------------------------------------------------------------------


def claim_observe(claim: dict[str, Any] | None, **changes: Any) -> Observed:
    return observe(attachment=make_attachment(claim_name="my-ip"), claim=claim, held_address=None, **changes)


@pytest.mark.parametrize(
    ("claim", "status", "reason"),
    [
        pytest.param(None, FALSE, REASON_CLAIM_NOT_FOUND, id="missing"),
        pytest.param(make_claim(namespace="tenant-b"), FALSE, REASON_CLAIM_NOT_FOUND, id="other namespace"),
        pytest.param(make_claim(deleting=True), FALSE, REASON_CLAIM_NOT_FOUND, id="being deleted"),
        pytest.param(
            make_claim(user=("other", "uid-other")), FALSE, REASON_CLAIM_IN_USE, id="used by another"
        ),
        pytest.param(make_claim(phase="Pending"), FALSE, REASON_CLAIM_NOT_BOUND, id="pending"),
        pytest.param(make_claim(phase="Lost"), FALSE, REASON_CLAIM_NOT_BOUND, id="lost"),
        pytest.param(
            make_claim(class_name="gone"), FALSE, REASON_CLASS_NOT_FOUND, id="claim's class missing"
        ),
        pytest.param(make_claim(), UNKNOWN, REASON_BINDING, id="free: bind first"),
        pytest.param(make_claim(user=("db-public", ATTACHMENT_UID)), TRUE, REASON_CLAIM_BOUND, id="ours"),
        pytest.param(
            make_claim(user=("db-public", ATTACHMENT_UID), deleting=True),
            TRUE,
            REASON_CLAIM_BOUND,
            id="ours while deleting",
        ),
    ],
)
def test_claim(claim: dict[str, Any] | None, status: str, reason: str) -> None:
    plan = reconcile(claim_observe(claim))
    assert condition(plan, COND_ADDRESS_BOUND) == (status, reason)
    assert plan.mint is None
    assert (plan.bind_claim is not None) is (reason == REASON_BINDING)
    assert (plan.service is not None) is (status == TRUE)
    if status != TRUE:
        assert plan.status["address"] is None


def test_claim_use_record() -> None:
    plan = reconcile(claim_observe(make_claim()))
    assert plan.bind_claim is not None
    assert plan.bind_claim.claim_name == "my-ip"
    assert plan.bind_claim.attachment == {"name": "db-public", "uid": ATTACHMENT_UID}


def test_claim_is_not_bound_before_the_endpoint_resolves() -> None:
    plan = reconcile(claim_observe(make_claim(), endpoint=None))
    assert condition(plan, COND_ADDRESS_BOUND) == (UNKNOWN, REASON_ENDPOINT_UNRESOLVED)
    assert plan.bind_claim is None


def test_claim_address_uses_the_claims_class_provider() -> None:
    cilium = make_class("cilium-v4", provider="CiliumLBIPAM")
    plan = reconcile(
        claim_observe(
            make_claim(class_name="cilium-v4", user=("db-public", ATTACHMENT_UID)), address_class=cilium
        )
    )
    assert plan.service is not None
    assert plan.service["metadata"]["annotations"] == {"lbipam.cilium.io/ips": "203.0.113.20"}
    assert plan.status["address"] == "203.0.113.20"


# --- the rendered Service and identity -------------------------------------------------------------


def test_create_then_pending_then_published() -> None:
    first = reconcile(observe())
    assert first.service_action is ServiceAction.CREATE
    assert condition(first, COND_READY) == (FALSE, REASON_ADDRESS_PENDING)
    assert first.status["serviceName"] == "ea-db-public"
    assert first.status["address"] == ADDRESS

    pending = reconcile(observe(service=published(first, ingress=None)))
    assert pending.service_action is ServiceAction.NONE
    assert condition(pending, COND_READY) == (FALSE, REASON_ADDRESS_PENDING)

    other_ip = reconcile(observe(service=published(first, ingress="198.51.100.1")))
    assert condition(other_ip, COND_READY) == (FALSE, REASON_ADDRESS_PENDING)

    done = reconcile(observe(service=published(first)))
    assert done.service_action is ServiceAction.NONE
    assert condition(done, COND_READY) == (TRUE, REASON_PUBLISHED)
    assert done.ready


def test_second_pass_writes_nothing() -> None:
    first = reconcile(observe())
    service = published(first)
    attachment = make_attachment()
    attachment["status"] = jsonpatch.apply_patch({}, first.status_patch(None, NOW))["status"]
    second = reconcile(observe(attachment=attachment, service=service))
    attachment = jsonpatch.apply_patch(attachment, second.status_patch(attachment["status"], NOW))
    third = reconcile(observe(attachment=attachment, service=service))
    assert third.status_patch(attachment["status"], "2030-01-01T00:00:00Z") == []
    assert third.service_action is ServiceAction.NONE
    assert (third.mint, third.bind_claim, third.owner_reference) == (None, None, None)


def test_endpoint_changes_are_mirrored() -> None:
    service = published(reconcile(observe()))
    endpoint = make_service(selector={"app": "db", "role": "replica"}, ports=[{"name": "pg", "port": 6432}])
    plan = reconcile(observe(endpoint=endpoint, service=service))
    assert plan.service_action is ServiceAction.PATCH
    assert plan.service_patch == {
        "spec": {
            "ports": [{"name": "pg", "protocol": "TCP", "port": 6432, "targetPort": 6432}],
            "selector": {"role": "replica"},
        }
    }


def test_load_balancer_class_change_recreates() -> None:
    service = published(reconcile(observe()))
    plan = reconcile(observe(service=service, address_class=make_class(load_balancer_class="lb")))
    assert plan.service_action is ServiceAction.RECREATE
    assert condition(plan, COND_READY) == (FALSE, REASON_ADDRESS_PENDING)


@pytest.mark.parametrize(
    "service",
    [
        pytest.param(
            make_service("ea-db-public", labels={"local.sdn.cozystack.io/endpoint-attachment": "db-public"}),
            id="our label without reference",
        ),
        pytest.param(
            make_service(
                "ea-db-public",
                labels={},
                owner_references=[
                    {
                        "apiVersion": "local.sdn.cozystack.io/v1alpha1",
                        "kind": "EndpointAttachment",
                        "name": "db-public",
                        "uid": "previous-incarnation",
                        "controller": True,
                    }
                ],
            ),
            id="a recreated attachment does not adopt the old Service",
        ),
        pytest.param(make_service("ea-db-public", labels={}), id="our name only"),
    ],
)
def test_service_not_ours_is_never_touched(service: dict[str, Any]) -> None:
    plan = reconcile(observe(service=service))
    assert plan.service_action is ServiceAction.NONE
    assert plan.service_patch is None
    assert condition(plan, COND_READY) == (FALSE, REASON_SERVICE_NAME_CONFLICT)
    assert plan.status["serviceName"] is None
    dark = reconcile(observe(service=service, endpoint=None))
    assert dark.service_action is ServiceAction.NONE, "not deleted either"


def test_our_service_being_deleted_is_waited_for() -> None:
    service = published(reconcile(observe()))
    service["metadata"]["deletionTimestamp"] = NOW
    plan = reconcile(observe(service=service))
    assert plan.service_action is ServiceAction.NONE
    assert condition(plan, COND_READY) == (FALSE, REASON_ADDRESS_PENDING)


def test_a_service_of_another_name_is_ignored() -> None:
    plan = reconcile(observe(service=make_service("something-else", labels={})))
    assert plan.service_action is ServiceAction.CREATE


# --- VM modes --------------------------------------------------------------------------------------


def vm(mode: str = "WholeIP", **changes: Any) -> Observed:
    """A VM-mode observation: the endpoint lists one SSH port, one ready backend pod."""
    defaults: dict[str, Any] = {
        "attachment": make_attachment(mode=mode),
        "endpoint": make_service(ports=[{"port": 22}]),
    }
    return observe(**{**defaults, **changes})


@pytest.mark.parametrize(
    ("observed", "status", "reason"),
    [
        pytest.param(vm(), TRUE, REASON_ADMITTED, id="WholeIP admitted"),
        pytest.param(vm("PortList"), TRUE, REASON_ADMITTED, id="PortList admitted"),
        pytest.param(vm(service_proxies=[]), FALSE, REASON_PROXY_NOT_DECLARED, id="undeclared"),
        pytest.param(
            vm(address_class=make_class(cidrs=["2001:db8::/120"]), held_address="2001:db8::5"),
            FALSE,
            REASON_ADDRESS_FAMILY_UNSUPPORTED,
            id="IPv6",
        ),
        pytest.param(
            vm("PortList", endpoint=make_service(ports=[{"port": 22, "targetPort": 2222}])),
            FALSE,
            REASON_PORT_TRANSLATION_UNSUPPORTED,
            id="translation",
        ),
        pytest.param(
            vm(
                endpoint_slices=[
                    make_endpointslice(backends=[("p1", "10.0.0.1", True), ("p2", "10.0.0.2", True)])
                ]
            ),
            FALSE,
            REASON_MULTIPLE_BACKENDS,
            id="WholeIP two backends",
        ),
        pytest.param(
            vm(
                endpoint_slices=[
                    make_endpointslice(backends=[("p1", "10.0.0.1", True), ("p2", "10.0.0.2", False)])
                ]
            ),
            TRUE,
            REASON_ADMITTED,
            id="WholeIP one ready of two",
        ),
        pytest.param(
            vm(
                endpoint_slices=[
                    make_endpointslice(
                        "someone-else", backends=[("p1", "1.1.1.1", True), ("p2", "2.2.2.2", True)]
                    )
                ]
            ),
            TRUE,
            REASON_ADMITTED,
            id="slices of other Services ignored",
        ),
        pytest.param(
            vm(
                proxied_services=[
                    ProxiedService("tenant-a", "vm-proxy", "cozy-proxy", frozenset({"pod-uid-1"}))
                ]
            ),
            FALSE,
            REASON_EXCLUSIVITY_CONFLICT,
            id="chart Service wins",
        ),
        pytest.param(
            vm(
                proxied_services=[
                    ProxiedService(
                        "tenant-a",
                        "ea-old",
                        "cozy-proxy",
                        frozenset({"pod-uid-1"}),
                        AttachmentRank("2023-01-01T00:00:00Z", "old", "tenant-a", "uid-old"),
                    )
                ]
            ),
            FALSE,
            REASON_EXCLUSIVITY_CONFLICT,
            id="older attachment wins",
        ),
        pytest.param(
            vm(held_address=None, address_class=None), UNKNOWN, REASON_ADDRESS_UNBOUND, id="family unknown"
        ),
        pytest.param(vm(endpoint=None), UNKNOWN, REASON_ENDPOINT_UNRESOLVED, id="endpoint unknown"),
        pytest.param(
            observe(attachment=make_attachment(mode="Bogus")),
            FALSE,
            REASON_PROXY_NOT_DECLARED,
            id="unknown mode",
        ),
    ],
)
def test_datapath(observed: Observed, status: str, reason: str) -> None:
    ours = published(reconcile(vm()))
    plan = reconcile(dataclasses.replace(observed, service=ours))
    assert condition(plan, COND_DATAPATH_ADMITTED) == (status, reason)
    if status == TRUE:
        assert plan.service is not None
    else:
        assert plan.service is None
        assert plan.service_action is ServiceAction.DELETE, "dark means the Service is deleted"
        assert condition(plan, COND_ADDRESS_BOUND)[0] != FALSE or reason == REASON_ADDRESS_UNBOUND


def test_vm_service_carries_declared_proxy_name() -> None:
    plan = reconcile(
        vm(
            "PortList",
            service_proxies=[make_serviceproxy(proxy_name="cozy-proxy-east")],
            attachment=make_attachment(mode="PortList", allow_icmp=False),
        )
    )
    assert plan.service is not None
    assert plan.service["metadata"]["labels"][SERVICE_PROXY_NAME_LABEL] == "cozy-proxy-east"
    assert plan.service["metadata"]["annotations"]["networking.cozystack.io/allowICMP"] == "false"


def test_whole_ip_goes_dark_with_two_backends_and_publishes_again_with_one() -> None:
    two = [make_endpointslice(backends=[("p1", "10.0.0.1", True), ("p2", "10.0.0.2", True)])]
    one = [make_endpointslice(backends=[("p1", "10.0.0.1", True), ("p2", "10.0.0.2", False)])]
    ours = published(reconcile(vm()))
    dark = reconcile(vm(service=ours, endpoint_slices=two))
    assert dark.service_action is ServiceAction.DELETE
    assert condition(dark, COND_ADDRESS_BOUND) == (TRUE, REASON_MINTED), "the address stays held"
    back = reconcile(vm(service=None, endpoint_slices=one))
    assert back.service_action is ServiceAction.CREATE


def test_two_vm_attachments_on_one_pod_exactly_one_publishes() -> None:
    older = make_attachment("a-old", uid="uid-a", created="2024-01-01T00:00:00Z", mode="WholeIP")
    newer = make_attachment("b-new", uid="uid-b", created="2024-01-02T00:00:00Z", mode="WholeIP")
    rank = {
        "uid-a": AttachmentRank("2024-01-01T00:00:00Z", "a-old", "tenant-a", "uid-a"),
        "uid-b": AttachmentRank("2024-01-02T00:00:00Z", "b-new", "tenant-a", "uid-b"),
    }
    both_rendered = [
        ProxiedService("tenant-a", "ea-a-old", "cozy-proxy", frozenset({"pod-uid-1"}), rank["uid-a"]),
        ProxiedService("tenant-a", "ea-b-new", "cozy-proxy", frozenset({"pod-uid-1"}), rank["uid-b"]),
    ]
    plans = [reconcile(vm(attachment=a, proxied_services=both_rendered)) for a in (older, newer)]
    assert [p.service is not None for p in plans] == [True, False]
    assert "tenant-a/ea-a-old" in next(
        c.message for c in plans[1].conditions if c.type == COND_DATAPATH_ADMITTED
    )


# --- deletion: hold and move -----------------------------------------------------------------------


def test_finalize_deletes_our_service_and_releases_the_minted_address_once_it_is_gone() -> None:
    service = published(reconcile(observe()))
    plan = reconcile(observe(attachment=make_attachment(deleting=True), service=service))
    assert plan.finalizing
    assert plan.service_action is ServiceAction.DELETE
    assert plan.waits_for_service, "the address stays held while the Service still asks for it"
    assert plan.release_allocation is None
    assert plan.status_patch({}, NOW) == []

    # Held by a load balancer's finalizer: not deleted again, still waited for.
    deleting = {**service, "metadata": {**service["metadata"], "deletionTimestamp": NOW}}
    plan = reconcile(observe(attachment=make_attachment(deleting=True), service=deleting))
    assert (plan.service_action, plan.waits_for_service) == (ServiceAction.NONE, True)
    assert plan.release_allocation is None

    # Gone: now the address goes.
    plan = reconcile(observe(attachment=make_attachment(deleting=True), service=None))
    assert (plan.service_action, plan.waits_for_service) == (ServiceAction.NONE, False)
    assert plan.release_allocation == ADDRESS
    assert plan.release_claim is None


def test_finalize_leaves_a_foreign_service_alone() -> None:
    plan = reconcile(
        observe(attachment=make_attachment(deleting=True), service=make_service("ea-db-public", labels={}))
    )
    assert plan.service_action is ServiceAction.NONE


def test_hold_and_move_of_a_claimed_address() -> None:
    claim = make_claim(user=("db-public", ATTACHMENT_UID))
    a = make_attachment(claim_name="my-ip")
    gone = reconcile(
        observe(
            attachment={**a, "metadata": {**a["metadata"], "deletionTimestamp": NOW}},
            claim=claim,
            held_address=None,
        )
    )
    assert gone.release_claim == "my-ip", "the use is released"
    assert gone.release_allocation is None, "the address is not: the claim holds it"

    # the glue clears the use; attachment B of another application binds the same address
    released = make_claim()
    other_app = make_helmrelease("vm-web", uid="hr-web", labels=None)
    other_app["metadata"]["labels"]["apps.cozystack.io/application.name"] = "web"
    endpoint = make_service("vm-web", labels=None)
    endpoint["metadata"]["labels"]["apps.cozystack.io/application.name"] = "web"
    b = make_attachment(
        "web-public", uid="uid-web", endpoint="vm-web", claim_name="my-ip", owner_uid="hr-web"
    )
    observed = observe(
        attachment=b, endpoint=endpoint, helmrelease=other_app, claim=released, held_address=None
    )
    binding = reconcile(observed)
    assert binding.bind_claim is not None
    bound = reconcile(dataclasses.replace(observed, claim=make_claim(user=("web-public", "uid-web"))))
    assert bound.service is not None
    assert bound.status["address"] == "203.0.113.20"
    assert bound.service["metadata"]["annotations"]["metallb.io/loadBalancerIPs"] == "203.0.113.20"


# --- no double mint, with a simulated glue ---------------------------------------------------------


def test_concurrent_minting_never_yields_a_duplicate() -> None:
    """Twelve attachments mint from a /28 (14 addresses) on stale snapshots; the name lock settles it."""
    small = make_class(cidrs=["203.0.113.0/28"])
    attachments = [make_attachment(f"ea-{i}", uid=f"uid-{i}") for i in range(20)]
    locks: dict[str, str] = {}  # allocation name -> holder uid: the API server's name uniqueness
    rng = random.Random(7)
    pending = list(attachments)
    exhausted: list[str] = []
    for _ in range(1000):
        if not pending:
            break
        snapshot = frozenset(locks)  # every worker in this round sees the same, possibly stale, list
        rng.shuffle(pending)
        still = []
        for attachment in pending:
            uid = attachment["metadata"]["uid"]
            held = next((name for name, holder in locks.items() if holder == uid), None)
            plan = reconcile(
                observe(
                    attachment=attachment, address_class=small, held_address=held, taken_addresses=snapshot
                )
            )
            if plan.mint is None:
                status, reason = condition(plan, COND_ADDRESS_BOUND)
                if reason == REASON_POOL_EXHAUSTED:
                    exhausted.append(uid)
                else:
                    assert (status, reason) == (TRUE, REASON_MINTED)
                continue
            name = plan.mint.allocation["metadata"]["name"]
            if name not in locks:  # create succeeded; a 409 leaves the attachment for the next round
                locks[name] = uid
            still.append(attachment)
        pending = still
    assert not pending
    assert len(locks) == 14
    assert len(set(locks.values())) == 14, "one address per holder"
    assert len(exhausted) == 6
    assert all(pool_of(small["spec"]).contains(parse_address(a)) for a in locks)


def test_resolved_reason_on_success() -> None:
    assert condition(reconcile(observe()), COND_ENDPOINT_RESOLVED) == (TRUE, REASON_RESOLVED)
