"""reconcile: one attachment's observations -> the plan. Tables per invariant, over a default world in
which everything resolves (application ``db``, its tenant-facing endpoint, a minted claim Bound to
``203.0.113.7``), plus a tiny simulated glue (``settle``) that applies a plan, to show that a second
pass over an unchanged world plans nothing."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import jsonpatch
import pytest
from hypothesis import given
from hypothesis import strategies as st

from operators.endpointattachment.api import (
    ATTACHMENT_LABEL,
    CLAIM_ANNOTATION,
    METALLB_IPS_ANNOTATION,
    PHASE_ATTACHED,
    PHASE_DETACHED,
    PHASE_PENDING,
    PROGRAMMED_ANNOTATION,
    spec_of,
)
from operators.endpointattachment.datapath import AttachmentRank, ProxiedService, programmed_token
from operators.endpointattachment.reasons import (
    CONDITION_PROVISIONED,
    CONDITION_RESOLVED,
    PROVISIONED_REASONS,
    REASON_ADDRESS_NOT_ANNOUNCED,
    REASON_APPLICATION_INCARNATION_CHANGED,
    REASON_APPLICATION_NOT_FOUND,
    REASON_BACKEND_ALREADY_DELEGATED,
    REASON_CLAIM_IN_USE,
    REASON_CLAIM_NOT_FOUND,
    REASON_CLAIM_PENDING,
    REASON_DATAPATH_CONTRACT_UNAVAILABLE,
    REASON_ENDPOINT_DETACHED,
    REASON_ENDPOINT_LINEAGE_MISMATCH,
    REASON_ENDPOINT_NOT_FOUND,
    REASON_ENDPOINT_NOT_TENANT_FACING,
    REASON_FAMILY_CONFLICT,
    REASON_MULTIPLE_BACKENDS,
    REASON_NO_READY_BACKEND,
    REASON_NOTHING_TO_PUBLISH,
    REASON_PROVISIONED,
    REASON_RENDER_FAILED,
    REASON_RESOLVED,
    REASON_UNRESOLVED,
    REASON_WAITING_FOR_ADDRESS,
    RESOLVED_REASONS,
)
from operators.endpointattachment.reconcile import (
    Observed,
    PassContext,
    Plan,
    ServiceAction,
    claim_addresses,
    reconcile,
    refusal_of,
)
from operators.endpointattachment.render import RenderSettings, render_claim
from shared.conditions import FALSE, TRUE
from tests.ea_builders import (
    ADDRESS,
    ADDRESS_V6,
    CLAIM,
    CREATED,
    NAMESPACE,
    application_labels,
    as_stored,
    controlled_by,
    helmrelease_owner,
    lineage_labels,
    make_attachment,
    make_claim,
    make_class,
    make_endpoints,
    make_endpointslice,
    make_helmrelease,
    make_ip_address,
    make_pod,
    make_service,
    vm_endpoint,
)

COZY = RenderSettings(proxy_name="cozy-proxy")
T0 = datetime.fromisoformat(CREATED)
VM_POD = {"vm.kubevirt.io/name": "vm1"}


def observe(**changes: Any) -> Observed:
    """Everything resolves and the minted claim is Bound; no Service yet; ``changes`` applied."""
    attachment = changes.pop("attachment", None) or make_attachment()
    base = Observed(
        attachment=attachment,
        helmrelease=make_helmrelease(),
        endpoint=make_service(),
        claim=make_claim(owner=attachment),
        claim_class=make_class(),
        addresses=[make_ip_address()],
    )
    return dataclasses.replace(base, **changes)


def vm_observe(method: str = "WholeIP", **changes: Any) -> Observed:
    """A VM-mode attachment to a vm-instance endpoint with one running, ready pod; cozy-proxy declared."""
    attachment = changes.pop("attachment", None) or make_attachment(
        "vm1-public", app_kind="VMInstance", app_name="vm1", endpoint="vm-vm1", method=method
    )
    base = observe(
        attachment=attachment,
        settings=COZY,
        helmrelease=make_helmrelease(
            "vm-vm1", labels=lineage_labels(kind="VMInstance", name="vm1", tenant_facing=False)
        ),
        endpoint=vm_endpoint(),
        endpoint_slices=[make_endpointslice("vm-vm1")],
        pods=[make_pod("virt-launcher-vm1", labels=VM_POD)],
    )
    return dataclasses.replace(base, **changes)


def rendered(observed: Observed, ingress: tuple[str, ...] = (ADDRESS,), **stored: Any) -> dict[str, Any]:
    """The Service this observation renders, as the API server stores it, with ``ingress`` announced
    (and the driver's pin, which is never ours)."""
    plan = reconcile(observed)
    assert plan.service_action is ServiceAction.CREATE, plan.provisioned
    assert plan.service is not None
    return as_stored(
        plan.service, ingress=ingress, annotations={METALLB_IPS_ANNOTATION: ",".join(ingress)}, **stored
    )


def attached(observed: Observed | None = None, ingress: tuple[str, ...] = (ADDRESS,)) -> Observed:
    """``observed`` (default: ``observe()``) with its Service rendered, announced and associated."""
    observed = observed or observe()
    service = rendered(observed, ingress)
    name = service["metadata"]["name"]
    endpoints = make_endpoints(name) if spec_of(observed.attachment).vm_mode else None
    addresses = [make_ip_address(a, associated_to=(NAMESPACE, name)) for a in ingress]
    return dataclasses.replace(
        observed, services=[service], addresses=addresses, rendered_endpoints=endpoints
    )


def condition(plan: Plan, type_: str) -> tuple[str, str]:
    found = next(c for c in plan.conditions if c.type == type_)
    return found.status, found.reason


def message(plan: Plan) -> str:
    assert plan.provisioned is not None
    return plan.provisioned.message


def settle(observed: Observed, plan: Plan) -> Observed:
    """The world after the glue applied ``plan`` (status, metadata stamps, the PROGRAMMED touch)."""
    attachment = copy.deepcopy(dict(observed.attachment))
    patch = plan.status_patch(attachment.get("status"), CREATED)
    attachment = jsonpatch.apply_patch(attachment, patch)
    metadata = attachment["metadata"]
    if plan.owner_reference is not None:
        metadata["ownerReferences"] = [*metadata.get("ownerReferences", []), dict(plan.owner_reference)]
    if plan.labels:
        metadata["labels"] = {**metadata.get("labels", {}), **plan.labels}
    services: list[dict[str, Any]] = [copy.deepcopy(dict(s)) for s in observed.services]
    if plan.programmed is not None:
        services[0]["metadata"]["annotations"][PROGRAMMED_ANNOTATION] = plan.programmed
    return dataclasses.replace(observed, attachment=attachment, services=services)


def assert_quiet(plan: Plan, observed: Observed) -> None:
    assert plan.status_patch(observed.attachment.get("status"), CREATED) == []
    assert plan.service_action is ServiceAction.NONE
    assert (plan.mint, plan.delete_claims, plan.surplus_services) == (None, (), ())
    assert (plan.owner_reference, dict(plan.labels), plan.programmed) == (None, {}, None)


# --- every reason is reachable ----------------------------------------------------------------------

OTHER_APP = lineage_labels(kind="Postgres", name="other")
CHART_PROXY = ProxiedService(NAMESPACE, "vm1-chart", "cozy-proxy", frozenset({"pod-uid-1"}), uid="chart-uid")
NOW_LATE = T0 + timedelta(seconds=61)

Build = Callable[[], tuple[Observed, PassContext | None]]
SCENARIOS: dict[str, tuple[Build, str, str]] = {}


def scenario(name: str, resolved: str, provisioned: str) -> Callable[[Build], Build]:
    def register(build: Build) -> Build:
        SCENARIOS[name] = (build, resolved, provisioned)
        return build

    return register


@scenario("attached", REASON_RESOLVED, REASON_PROVISIONED)
def _attached() -> tuple[Observed, PassContext | None]:
    return attached(), None


@scenario("no application", REASON_APPLICATION_NOT_FOUND, REASON_UNRESOLVED)
def _no_application() -> tuple[Observed, PassContext | None]:
    return observe(helmrelease=None), None


@scenario("application recreated", REASON_APPLICATION_INCARNATION_CHANGED, REASON_UNRESOLVED)
def _recreated() -> tuple[Observed, PassContext | None]:
    return dataclasses.replace(attached(), helmrelease=make_helmrelease(uid="hr-uid-2")), None


@scenario("endpoint never seen", REASON_ENDPOINT_NOT_FOUND, REASON_UNRESOLVED)
def _endpoint_missing() -> tuple[Observed, PassContext | None]:
    return observe(endpoint=None, claim=None, addresses=[]), None


@scenario("endpoint of another application", REASON_ENDPOINT_LINEAGE_MISMATCH, REASON_UNRESOLVED)
def _lineage() -> tuple[Observed, PassContext | None]:
    return observe(endpoint=make_service(labels=OTHER_APP)), None


@scenario("endpoint not tenant-facing", REASON_ENDPOINT_NOT_TENANT_FACING, REASON_UNRESOLVED)
def _internal() -> tuple[Observed, PassContext | None]:
    return observe(endpoint=make_service(labels=lineage_labels(tenant_facing=False))), None


@scenario("substrate absent", REASON_RESOLVED, REASON_CLAIM_PENDING)
def _no_substrate() -> tuple[Observed, PassContext | None]:
    return observe(substrate=False), None


@scenario("reserved claim missing", REASON_RESOLVED, REASON_CLAIM_NOT_FOUND)
def _claim_missing() -> tuple[Observed, PassContext | None]:
    return observe(attachment=make_attachment(claim_name="held-ip"), claim=None), None


@scenario("claim's address announced for another Service", REASON_RESOLVED, REASON_CLAIM_IN_USE)
def _in_use() -> tuple[Observed, PassContext | None]:
    other = make_service("legacy-lb", annotations={CLAIM_ANNOTATION: "held-ip"}, type_="LoadBalancer")
    return observe(
        attachment=make_attachment(claim_name="held-ip"),
        claim=make_claim("held-ip"),
        addresses=[make_ip_address(claim=(NAMESPACE, "held-ip"), associated_to=(NAMESPACE, "legacy-lb"))],
        claim_users=[other],
    ), None


@scenario("reserved claim of another family", REASON_RESOLVED, REASON_FAMILY_CONFLICT)
def _family() -> tuple[Observed, PassContext | None]:
    return observe(
        attachment=make_attachment(claim_name="held-ip", family="IPv6"), claim=make_claim("held-ip")
    ), None


@scenario("endpoint selects nothing", REASON_RESOLVED, REASON_NOTHING_TO_PUBLISH)
def _nothing() -> tuple[Observed, PassContext | None]:
    return observe(endpoint=make_service(selector={})), None


@scenario("VM method, no datapath declared", REASON_RESOLVED, REASON_DATAPATH_CONTRACT_UNAVAILABLE)
def _undeclared() -> tuple[Observed, PassContext | None]:
    return vm_observe(settings=RenderSettings()), None


@scenario("VM with two ready backends", REASON_RESOLVED, REASON_MULTIPLE_BACKENDS)
def _two_backends() -> tuple[Observed, PassContext | None]:
    backends = (("pod-uid-1", "10.244.0.10", True), ("pod-uid-2", "10.244.0.11", True))
    return vm_observe(endpoint_slices=[make_endpointslice("vm-vm1", backends=backends)]), None


@scenario("VM pod published by the chart", REASON_RESOLVED, REASON_BACKEND_ALREADY_DELEGATED)
def _delegated() -> tuple[Observed, PassContext | None]:
    return vm_observe(rivals=[CHART_PROXY]), None


@scenario("Service written, no address yet", REASON_RESOLVED, REASON_WAITING_FOR_ADDRESS)
def _waiting() -> tuple[Observed, PassContext | None]:
    return attached(ingress=()), None


@scenario("endpoint gone after rendering", REASON_ENDPOINT_NOT_FOUND, REASON_ENDPOINT_DETACHED)
def _detached() -> tuple[Observed, PassContext | None]:
    return dataclasses.replace(attached(), endpoint=None), None


@scenario("Service refused by a webhook", REASON_RESOLVED, REASON_RENDER_FAILED)
def _refused() -> tuple[Observed, PassContext | None]:
    observed = observe()
    desired = reconcile(observed).service
    assert desired is not None
    refusal = refusal_of(ServiceAction.CREATE, desired, 400, "admission webhook denied the request", T0)
    return observed, PassContext(now=T0, refusal=refusal)


@scenario("VM Service with no ready backend in its Endpoints", REASON_RESOLVED, REASON_NO_READY_BACKEND)
def _no_ready() -> tuple[Observed, PassContext | None]:
    observed = attached(vm_observe())
    name = observed.services[0]["metadata"]["name"]
    return dataclasses.replace(observed, rendered_endpoints=make_endpoints(name, backends=())), None


@scenario("address not announced in time", REASON_RESOLVED, REASON_ADDRESS_NOT_ANNOUNCED)
def _unannounced() -> tuple[Observed, PassContext | None]:
    return attached(ingress=()), PassContext(now=NOW_LATE)


@pytest.mark.parametrize(("build", "resolved", "provisioned"), SCENARIOS.values(), ids=SCENARIOS.keys())
def test_each_scenario_reports_its_reasons(build: Any, resolved: str, provisioned: str) -> None:
    observed, context = build()
    plan = reconcile(observed, context)
    assert [c.type for c in plan.conditions] == [CONDITION_RESOLVED, CONDITION_PROVISIONED]
    assert condition(plan, CONDITION_RESOLVED) == (TRUE if resolved == REASON_RESOLVED else FALSE, resolved)
    assert condition(plan, CONDITION_PROVISIONED) == (
        TRUE if provisioned == REASON_PROVISIONED else FALSE,
        provisioned,
    )
    assert all(c.message for c in plan.conditions)


def test_every_reason_of_reasons_py_is_reached_by_a_scenario() -> None:
    reached = {reason for _, *reasons in SCENARIOS.values() for reason in reasons}
    assert (RESOLVED_REASONS | PROVISIONED_REASONS) - reached == set()


# --- the claim: minted only once Resolved, referenced never written --------------------------------


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"helmrelease": None}, id="no application"),
        pytest.param({"helmrelease": make_helmrelease(uid="hr-uid-2")}, id="leftover of a recreated app"),
        pytest.param({"endpoint": None}, id="endpoint missing"),
        pytest.param({"endpoint": make_service(labels=OTHER_APP)}, id="endpoint of another app"),
    ],
)
def test_nothing_is_minted_before_resolved(changes: dict[str, Any]) -> None:
    plan = reconcile(observe(claim=None, addresses=[], **changes))
    assert condition(plan, CONDITION_RESOLVED)[0] == FALSE
    assert condition(plan, CONDITION_PROVISIONED) == (FALSE, REASON_UNRESOLVED)
    assert (plan.mint, plan.service_action) == (None, ServiceAction.NONE)


@pytest.mark.parametrize(
    ("attachment", "claim_spec"),
    [
        pytest.param(make_attachment(class_name="public"), {"className": "public"}, id="className"),
        pytest.param(make_attachment(), {}, id="default class"),
        pytest.param(
            make_attachment(class_name="public", family="Dual"),
            {"className": "public", "family": "Dual"},
            id="Dual",
        ),
    ],
)
def test_resolved_with_no_claim_mints_one_and_renders_nothing(
    attachment: dict[str, Any], claim_spec: dict[str, Any]
) -> None:
    plan = reconcile(observe(attachment=attachment, claim=None, addresses=[]))
    assert condition(plan, CONDITION_PROVISIONED) == (FALSE, REASON_CLAIM_PENDING)
    assert plan.mint == render_claim(attachment, spec_of(attachment))
    assert plan.mint is not None
    assert plan.mint["spec"] == claim_spec
    assert plan.mint["metadata"]["ownerReferences"] == controlled_by(attachment)
    assert (plan.service_action, plan.service) == (ServiceAction.NONE, None)
    assert plan.status["claimName"] is None, "no claim name before the claim exists"


@pytest.mark.parametrize(
    ("build", "reason"),
    [
        pytest.param(
            lambda: observe(endpoint=make_service(selector={})), REASON_NOTHING_TO_PUBLISH, id="no selector"
        ),
        pytest.param(
            lambda: observe(endpoint=make_service(type_="ExternalName")),
            REASON_NOTHING_TO_PUBLISH,
            id="ExternalName",
        ),
        pytest.param(
            lambda: observe(endpoint=make_service(ports=[])), REASON_NOTHING_TO_PUBLISH, id="no port"
        ),
        pytest.param(
            lambda: vm_observe(settings=RenderSettings()),
            REASON_DATAPATH_CONTRACT_UNAVAILABLE,
            id="datapath off",
        ),
        pytest.param(
            lambda: vm_observe(
                attachment=make_attachment(
                    "vm1-public",
                    app_kind="VMInstance",
                    app_name="vm1",
                    endpoint="vm-vm1",
                    method="WholeIP",
                    family="Dual",
                )
            ),
            REASON_DATAPATH_CONTRACT_UNAVAILABLE,
            id="a VM mode asking for Dual",
        ),
        pytest.param(
            lambda: vm_observe(
                "PortList",
                attachment=make_attachment(
                    "vm1-public",
                    app_kind="VMInstance",
                    app_name="vm1",
                    endpoint="vm-vm1",
                    method="PortList",
                    ports=[22],
                ),
                endpoint=vm_endpoint(
                    ports=[{"name": "ssh", "protocol": "TCP", "port": 22, "targetPort": 2222}]
                ),
            ),
            REASON_RENDER_FAILED,
            id="PortList needing translation",
        ),
        pytest.param(
            lambda: vm_observe(
                attachment=make_attachment(
                    "vm1-public", app_kind="VMInstance", app_name="vm1", endpoint="vm-vm1"
                ),
                substrate=False,
            ),
            REASON_NOTHING_TO_PUBLISH,
            id="a VM's sentinel alone, said before the substrate's absence",
        ),
    ],
)
def test_no_address_is_drawn_for_what_cannot_be_published(build: Callable[[], Observed], reason: str) -> None:
    plan = reconcile(dataclasses.replace(build(), claim=None, addresses=[]))
    assert condition(plan, CONDITION_PROVISIONED) == (FALSE, reason)
    assert plan.mint is None


def test_a_minted_claim_is_not_minted_again() -> None:
    assert reconcile(observe()).mint is None


@pytest.mark.parametrize(
    "claim",
    [
        pytest.param(make_claim(phase="Pending", addresses=()), id="Pending"),
        pytest.param(make_claim(phase=None, addresses=()), id="not yet reconciled"),
        pytest.param(make_claim(phase="Lost", addresses=()), id="Lost"),
        pytest.param(make_claim(phase="Bound", addresses=()), id="Bound without addresses"),
    ],
)
def test_no_service_before_the_claim_is_bound(claim: dict[str, Any]) -> None:
    plan = reconcile(observe(claim=claim))
    assert condition(plan, CONDITION_PROVISIONED) == (FALSE, REASON_CLAIM_PENDING)
    assert (plan.service_action, plan.service, plan.mint) == (ServiceAction.NONE, None, None)
    assert plan.status["addresses"] is None


def test_a_pending_claim_says_the_substrate_s_words() -> None:
    said = {
        "type": "Bound",
        "status": "False",
        "reason": "WaitingForProvisioning",
        "message": "class public is exhausted",
    }
    plan = reconcile(observe(claim=make_claim(phase="Pending", addresses=(), conditions=[said])))
    assert "class public is exhausted" in message(plan)
    assert CLAIM in message(plan)


def test_a_claim_that_stops_being_bound_withdraws_the_service() -> None:
    live = attached()
    plan = reconcile(dataclasses.replace(live, claim=make_claim(phase="Lost", addresses=())))
    assert plan.service_action is ServiceAction.DELETE
    assert plan.service is live.services[0]


@pytest.mark.parametrize("build", [b for b, *_ in SCENARIOS.values()], ids=list(SCENARIOS))
def test_a_referenced_claim_is_never_minted_nor_deleted(build: Any) -> None:
    observed, context = build()
    referenced = make_attachment(claim_name="held-ip")
    observed = dataclasses.replace(
        observed, attachment=referenced, claim=observed.claim and make_claim("held-ip"), surplus_claims=()
    )
    plan = reconcile(observed, context)
    assert (plan.mint, plan.delete_claims) == (None, ())
    # Named in status once the attachment resolved (as Cozystack's controller does), never before.
    resolved = plan.conditions[0].status == "True"
    assert plan.status["claimName"] in (("held-ip",) if resolved else ("held-ip", None))


def test_a_reserved_claim_of_an_attachment_that_never_resolved_is_not_detached() -> None:
    """EndpointNotFound with a Bound reserved claim, on an attachment that never used it: Pending
    and Unresolved, not Detached (nothing was ever attached)."""
    observed = observe(attachment=make_attachment(claim_name="held-ip"), claim=make_claim("held-ip"))
    plan = reconcile(dataclasses.replace(observed, endpoint=None))
    assert plan.status["phase"] == "Pending"
    assert plan.provisioned is not None
    assert plan.provisioned.reason == "Unresolved"
    used = dataclasses.replace(
        observed,
        attachment={**observed.attachment, "status": {"claimName": "held-ip"}},
        endpoint=None,
    )
    detached = reconcile(used)
    assert detached.status["phase"] == "Detached"


def test_the_service_names_the_referenced_claim() -> None:
    plan = reconcile(observe(attachment=make_attachment(claim_name="held-ip"), claim=make_claim("held-ip")))
    assert plan.service is not None
    assert plan.service["metadata"]["annotations"][CLAIM_ANNOTATION] == "held-ip"


@pytest.mark.parametrize(
    "claim",
    [
        pytest.param(None, id="missing"),
        pytest.param(make_claim("held-ip", deleting=True), id="being deleted"),
    ],
)
def test_claim_not_found(claim: dict[str, Any] | None) -> None:
    plan = reconcile(observe(attachment=make_attachment(claim_name="held-ip"), claim=claim))
    assert condition(plan, CONDITION_PROVISIONED) == (FALSE, REASON_CLAIM_NOT_FOUND)
    assert "held-ip" in message(plan)
    assert (plan.mint, plan.service_action) == (None, ServiceAction.NONE)


@pytest.mark.parametrize(
    ("asked", "claim_family", "conflict"),
    [
        ("IPv6", None, True),  # the claim's family defaults to IPv4
        ("IPv4", None, False),
        ("Dual", "IPv4", True),
        ("Dual", "Dual", False),
        (None, "IPv6", False),  # not asked: whatever the claim is
    ],
)
def test_family_conflict_with_a_referenced_claim(
    asked: str | None, claim_family: str | None, conflict: bool
) -> None:
    addresses = (
        (ADDRESS, ADDRESS_V6)
        if claim_family == "Dual"
        else (ADDRESS_V6,)
        if claim_family == "IPv6"
        else (ADDRESS,)
    )
    plan = reconcile(
        observe(
            attachment=make_attachment(claim_name="held-ip", family=asked),
            claim=make_claim("held-ip", family=claim_family, addresses=addresses),
        )
    )
    assert (condition(plan, CONDITION_PROVISIONED) == (FALSE, REASON_FAMILY_CONFLICT)) is conflict


def test_substrate_absent_is_claim_pending_saying_so_and_mints_nothing() -> None:
    plan = reconcile(observe(substrate=False, claim=None, surplus_claims=[make_claim("extra")]))
    assert condition(plan, CONDITION_PROVISIONED) == (FALSE, REASON_CLAIM_PENDING)
    assert "not installed" in message(plan)
    assert (plan.mint, plan.delete_claims) == (None, ())


# --- ClaimInUse -------------------------------------------------------------------------------------

LEGACY = make_service("legacy-lb", annotations={CLAIM_ANNOTATION: CLAIM}, type_="LoadBalancer")


@pytest.mark.parametrize(
    ("addresses", "users", "ours", "in_use"),
    [
        pytest.param(
            [make_ip_address(associated_to=(NAMESPACE, "legacy-lb"))],
            [LEGACY],
            False,
            True,
            id="associatedTo another",
        ),
        pytest.param(
            [make_ip_address(associated_to=(NAMESPACE, "legacy-lb"))],
            [LEGACY],
            True,
            True,
            id="associatedTo another, ours live",
        ),
        pytest.param([make_ip_address()], [LEGACY], False, True, id="another Service names the claim"),
        pytest.param([make_ip_address()], [LEGACY], True, False, id="another names it, ours holds it"),
        pytest.param(
            [make_ip_address(associated_to=(NAMESPACE, "legacy-lb"))],
            [],
            False,
            False,
            id="associatedTo a Service gone",
        ),
        pytest.param(
            [make_ip_address(associated_to=(NAMESPACE, "legacy-lb"))],
            [make_service("legacy-lb", annotations={CLAIM_ANNOTATION: CLAIM}, deleting=True)],
            False,
            False,
            id="associatedTo a Service being deleted",
        ),
        pytest.param(
            [make_ip_address(associated_to=("tenant-b", "legacy-lb"))],
            [],
            False,
            False,
            id="another namespace",
        ),
    ],
)
def test_claim_in_use(
    addresses: list[dict[str, Any]], users: list[dict[str, Any]], ours: bool, in_use: bool
) -> None:
    base = attached() if ours else observe()
    plan = reconcile(dataclasses.replace(base, addresses=addresses, claim_users=users))
    assert (condition(plan, CONDITION_PROVISIONED) == (FALSE, REASON_CLAIM_IN_USE)) is in_use
    if in_use:
        assert f"{NAMESPACE}/legacy-lb" in message(plan)
        assert plan.service_action is (ServiceAction.DELETE if ours else ServiceAction.NONE)
        assert plan.mint is None


# --- what is published ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "attachment"),
    [
        pytest.param(make_service(selector={}), make_attachment(), id="no selector"),
        pytest.param(make_service(type_="ExternalName"), make_attachment(), id="ExternalName"),
        pytest.param(
            vm_endpoint(),
            make_attachment(endpoint="vm-vm1", app_kind="VMInstance", app_name="vm1"),
            id="sentinel port only",
        ),
        pytest.param(make_service(ports=[]), make_attachment(), id="no port"),
    ],
)
def test_nothing_to_publish_renders_nothing(endpoint: dict[str, Any], attachment: dict[str, Any]) -> None:
    release = make_helmrelease(
        labels=lineage_labels(
            kind=spec_of(attachment).app_kind, name=spec_of(attachment).app_name, tenant_facing=False
        )
    )
    plan = reconcile(observe(attachment=attachment, endpoint=endpoint, helmrelease=release))
    assert condition(plan, CONDITION_PROVISIONED) == (FALSE, REASON_NOTHING_TO_PUBLISH)
    assert (plan.service_action, plan.service) == (ServiceAction.NONE, None)


def test_nothing_to_publish_withdraws_a_live_service() -> None:
    plan = reconcile(dataclasses.replace(attached(), endpoint=make_service(selector={})))
    assert condition(plan, CONDITION_PROVISIONED) == (FALSE, REASON_NOTHING_TO_PUBLISH)
    assert plan.service_action is ServiceAction.DELETE


TWO_PORTS = [
    {"name": "postgres", "protocol": "TCP", "port": 5432, "targetPort": 5432},
    {"name": "metrics", "protocol": "TCP", "port": 9187, "targetPort": 9187},
]


def test_a_port_the_endpoint_lacks_is_nothing_to_publish() -> None:
    """On an endpoint with ports of its own, ``ports`` selects among them (Cozystack's rule); only a
    vm-instance's sentinel-only endpoint publishes ports it does not list."""
    plan = reconcile(
        observe(attachment=make_attachment(ports=[8080]), endpoint=make_service(ports=TWO_PORTS))
    )
    assert plan.service is None
    assert plan.provisioned is not None
    assert plan.provisioned.reason == "NothingToPublish"


@pytest.mark.parametrize(
    ("ports", "published"),
    [
        pytest.param(None, [5432, 9187], id="every port"),
        pytest.param([9187], [9187], id="a subset"),
    ],
)
def test_the_ports_subset(ports: list[int] | None, published: list[int]) -> None:
    plan = reconcile(observe(attachment=make_attachment(ports=ports), endpoint=make_service(ports=TWO_PORTS)))
    assert plan.service is not None
    assert [p["port"] for p in plan.service["spec"]["ports"]] == published


def test_wholeip_publishes_the_sentinel_port() -> None:
    plan = reconcile(vm_observe())
    assert condition(plan, CONDITION_PROVISIONED) == (FALSE, REASON_WAITING_FOR_ADDRESS)
    assert plan.service is not None
    assert [p["port"] for p in plan.service["spec"]["ports"]] == [65535]
    assert plan.service["metadata"]["labels"][ATTACHMENT_LABEL] == "vm1-public"


# --- the VM datapath ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "claim", "said"),
    [
        pytest.param(RenderSettings(), make_claim(), "vm-datapath setting is off", id="setting off"),
        pytest.param(COZY, make_claim(family="IPv6", addresses=(ADDRESS_V6,)), "IPv4 only", id="IPv6"),
        pytest.param(
            COZY, make_claim(family="Dual", addresses=(ADDRESS, ADDRESS_V6)), "IPv4 only", id="Dual"
        ),
    ],
)
def test_datapath_contract_unavailable(settings: RenderSettings, claim: dict[str, Any], said: str) -> None:
    plan = reconcile(vm_observe(settings=settings, claim=claim))
    assert condition(plan, CONDITION_PROVISIONED) == (FALSE, REASON_DATAPATH_CONTRACT_UNAVAILABLE)
    assert said in message(plan)
    assert (plan.service_action, plan.service) == (ServiceAction.NONE, None)


@pytest.mark.parametrize(
    ("rival", "winner"),
    [
        pytest.param(CHART_PROXY, f"Service {NAMESPACE}/vm1-chart", id="the chart's own Service"),
        pytest.param(
            ProxiedService(
                NAMESPACE,
                "",
                "cozy-proxy",
                frozenset({"pod-uid-1"}),
                attachment=AttachmentRank("2023-01-01T00:00:00Z", "older", NAMESPACE, "ea-older"),
            ),
            f"EndpointAttachment {NAMESPACE}/older",
            id="an older attachment not rendered",
        ),
        pytest.param(
            ProxiedService(
                NAMESPACE,
                "older-abcde",
                "cozy-proxy",
                frozenset({"pod-uid-1"}),
                attachment=AttachmentRank("2023-01-01T00:00:00Z", "older", NAMESPACE, "ea-older"),
                uid="s-uid",
            ),
            f"Service {NAMESPACE}/older-abcde",
            id="an older attachment's Service",
        ),
    ],
)
def test_backend_already_delegated_names_the_winner_and_renders_nothing(
    rival: ProxiedService, winner: str
) -> None:
    plan = reconcile(vm_observe(rivals=[rival]))
    assert condition(plan, CONDITION_PROVISIONED) == (FALSE, REASON_BACKEND_ALREADY_DELEGATED)
    assert winner in message(plan)
    assert (plan.service_action, plan.service) == (ServiceAction.NONE, None)


def test_a_younger_rival_loses_to_us() -> None:
    younger = ProxiedService(
        NAMESPACE,
        "",
        "cozy-proxy",
        frozenset({"pod-uid-1"}),
        attachment=AttachmentRank("2025-01-01T00:00:00Z", "younger", NAMESPACE, "ea-younger"),
    )
    assert reconcile(vm_observe(rivals=[younger])).service_action is ServiceAction.CREATE


def test_exclusivity_counts_selected_pods_that_are_not_ready() -> None:
    rival = dataclasses.replace(CHART_PROXY, backends=frozenset({"pod-uid-9"}))
    starting = make_pod("virt-launcher-vm1-x", uid="pod-uid-9", labels=VM_POD, phase="Pending")
    plan = reconcile(vm_observe(rivals=[rival], endpoint_slices=[], pods=[starting]))
    assert condition(plan, CONDITION_PROVISIONED) == (FALSE, REASON_BACKEND_ALREADY_DELEGATED)


def test_a_loser_withdraws_its_live_service() -> None:
    live = attached(vm_observe())
    plan = reconcile(dataclasses.replace(live, rivals=[CHART_PROXY]))
    assert plan.service_action is ServiceAction.DELETE


def test_multiple_ready_backends_keep_the_address_dark() -> None:
    live = attached(vm_observe())
    backends = (("pod-uid-1", "10.244.0.10", True), ("pod-uid-2", "10.244.0.11", True))
    plan = reconcile(
        dataclasses.replace(live, endpoint_slices=[make_endpointslice("vm-vm1", backends=backends)])
    )
    assert condition(plan, CONDITION_PROVISIONED) == (FALSE, REASON_MULTIPLE_BACKENDS)
    # Kept, its backends withdrawn (test_ea_withdrawn): the address stays pinned to it.
    assert plan.service_action is ServiceAction.PATCH
    assert (plan.mint, plan.delete_claims) == (None, ())
    assert (plan.status["claimName"], plan.status["addresses"]) == (CLAIM, [ADDRESS]), "the claim is kept"


def test_multiple_backends_in_the_v1_endpoints_are_not_provisioned() -> None:
    live = attached(vm_observe())
    name = live.services[0]["metadata"]["name"]
    two = make_endpoints(
        name, backends=(("pod-uid-1", "10.244.0.10", True), ("pod-uid-2", "10.244.0.11", True))
    )
    plan = reconcile(dataclasses.replace(live, rendered_endpoints=two))
    assert condition(plan, CONDITION_PROVISIONED) == (FALSE, REASON_MULTIPLE_BACKENDS)
    assert plan.programmed is None


def test_a_vm_with_no_ready_backend_still_renders() -> None:
    not_ready = make_endpointslice("vm-vm1", backends=(("pod-uid-1", "10.244.0.10", False),))
    plan = reconcile(vm_observe(endpoint_slices=[not_ready]))
    assert plan.service_action is ServiceAction.CREATE, "rendered, so cozy-proxy programs the pod once ready"


def test_provisioned_names_the_pod_and_touches_programmed_once() -> None:
    live = attached(vm_observe())
    plan = reconcile(live)
    assert condition(plan, CONDITION_PROVISIONED) == (TRUE, REASON_PROVISIONED)
    assert "pod pod-pod-uid-1 (10.244.0.10)" in message(plan)
    assert plan.programmed == programmed_token(ADDRESS, "pod-uid-1")
    again = reconcile(settle(live, plan))
    assert again.programmed is None
    assert condition(again, CONDITION_PROVISIONED) == (TRUE, REASON_PROVISIONED)


def test_programmed_is_touched_again_for_another_backend() -> None:
    live = settle(attached(vm_observe()), reconcile(attached(vm_observe())))
    name = live.services[0]["metadata"]["name"]
    moved = dataclasses.replace(
        live, rendered_endpoints=make_endpoints(name, backends=(("pod-uid-2", "10.244.0.11", True),))
    )
    assert reconcile(moved).programmed == programmed_token(ADDRESS, "pod-uid-2")


def test_standard_mode_never_touches_programmed() -> None:
    assert reconcile(attached()).programmed is None


# --- waiting for the load balancer ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "reason", "recheck"),
    [
        (0, REASON_WAITING_FOR_ADDRESS, 60.0),
        (59, REASON_WAITING_FOR_ADDRESS, 1.0),
        (60, REASON_ADDRESS_NOT_ANNOUNCED, None),
        (600, REASON_ADDRESS_NOT_ANNOUNCED, None),
    ],
)
def test_waiting_for_address_then_address_not_announced(
    seconds: int, reason: str, recheck: float | None
) -> None:
    plan = reconcile(attached(ingress=()), PassContext(now=T0 + timedelta(seconds=seconds)))
    assert condition(plan, CONDITION_PROVISIONED) == (FALSE, reason)
    assert plan.recheck_after == recheck
    assert plan.service_action is ServiceAction.NONE
    if reason == REASON_ADDRESS_NOT_ANNOUNCED:
        assert ADDRESS in message(plan)
        assert CLAIM in message(plan)


def test_the_announce_wait_restarts_when_we_change_the_service() -> None:
    plan = reconcile(
        attached(ingress=()), PassContext(now=NOW_LATE, written_at=NOW_LATE - timedelta(seconds=5))
    )
    assert condition(plan, CONDITION_PROVISIONED) == (FALSE, REASON_WAITING_FOR_ADDRESS)
    assert plan.recheck_after == 55.0


def test_a_dual_claim_waits_for_both_addresses() -> None:
    claim = make_claim(family="Dual", addresses=(ADDRESS_V6, ADDRESS))
    dual = observe(attachment=make_attachment(family="Dual"), claim=claim)
    half = attached(dual, ingress=(ADDRESS,))
    assert condition(reconcile(half), CONDITION_PROVISIONED) == (FALSE, REASON_WAITING_FOR_ADDRESS)
    both = attached(dual, ingress=(ADDRESS, ADDRESS_V6))
    plan = reconcile(both)
    assert condition(plan, CONDITION_PROVISIONED) == (TRUE, REASON_PROVISIONED)
    assert plan.status["addresses"] == [ADDRESS, ADDRESS_V6], "IPv4 first"


# --- the API's refusals -----------------------------------------------------------------------------


def _create_refused(status: int, said: str) -> tuple[Observed, Any]:
    observed = observe()
    desired = reconcile(observed).service
    assert desired is not None
    return observed, refusal_of(ServiceAction.CREATE, desired, status, said, T0)


def test_a_refused_create_is_render_failed_and_not_sent_again() -> None:
    observed, refusal = _create_refused(422, 'Service "db-public-" is invalid: spec.ports: Required value')
    plan = reconcile(observed, PassContext(now=T0 + timedelta(hours=1), refusal=refusal))
    assert condition(plan, CONDITION_PROVISIONED) == (FALSE, REASON_RENDER_FAILED)
    assert "spec.ports: Required value" in message(plan)
    assert (plan.service_action, plan.recheck_after) == (ServiceAction.NONE, None)


def test_a_refusal_of_another_body_does_not_hold_back_the_new_one() -> None:
    observed, refusal = _create_refused(400, "denied")
    changed = dataclasses.replace(observed, endpoint=make_service(ports=TWO_PORTS))
    plan = reconcile(changed, PassContext(now=T0, refusal=refusal))
    assert plan.service_action is ServiceAction.CREATE


@pytest.mark.parametrize(("after", "retried"), [(10, False), (59, False), (61, True)])
def test_a_quota_refusal_is_tried_again_after_quota_retry(after: int, retried: bool) -> None:
    observed, refusal = _create_refused(403, 'services "db-public-x" is forbidden: exceeded quota: q')
    assert refusal is not None
    assert refusal.quota
    plan = reconcile(observed, PassContext(now=T0 + timedelta(seconds=after), refusal=refusal))
    if retried:
        assert plan.service_action is ServiceAction.CREATE
    else:
        assert condition(plan, CONDITION_PROVISIONED) == (FALSE, REASON_RENDER_FAILED)
        assert plan.recheck_after == 60 - after


def test_a_refused_patch_is_render_failed() -> None:
    live = attached()
    changed = dataclasses.replace(live, endpoint=make_service(ports=TWO_PORTS))
    plan = reconcile(changed)
    assert plan.service_action is ServiceAction.PATCH
    assert plan.service_patch is not None
    refusal = refusal_of(ServiceAction.PATCH, plan.service_patch, 403, "denied by policy", T0)
    again = reconcile(changed, PassContext(now=T0, refusal=refusal))
    assert condition(again, CONDITION_PROVISIONED) == (FALSE, REASON_RENDER_FAILED)
    assert again.service_action is ServiceAction.NONE
    assert again.status["serviceName"] == live.services[0]["metadata"]["name"]


def test_a_load_balancer_class_mismatch_on_a_live_service_is_render_failed() -> None:
    live = attached()
    plan = reconcile(dataclasses.replace(live, claim_class=make_class(load_balancer_class="metallb")))
    assert condition(plan, CONDITION_PROVISIONED) == (FALSE, REASON_RENDER_FAILED)
    assert "recreate the attachment" in message(plan)
    assert plan.service_action is ServiceAction.NONE, "recreating it here would drop the address"
    assert plan.status["serviceName"] == live.services[0]["metadata"]["name"]


def test_the_class_s_load_balancer_class_is_rendered_before_the_service_exists() -> None:
    plan = reconcile(observe(claim_class=make_class(load_balancer_class="metallb")))
    assert plan.service is not None
    assert plan.service["spec"]["loadBalancerClass"] == "metallb"


def test_no_service_before_the_claim_s_class_is_seen() -> None:
    """The claim's binding and its class come on separate watches: a Service created before the
    class is read would keep the wrong loadBalancerClass for good."""
    plan = reconcile(observe(claim_class=None))
    assert condition(plan, CONDITION_PROVISIONED) == (FALSE, REASON_CLAIM_PENDING)
    assert "IPAddressClass public is not found" in message(plan)
    assert (plan.service_action, plan.service, plan.mint) == (ServiceAction.NONE, None, None)


@pytest.mark.parametrize("load_balancer_class", [None, "metallb"])
def test_a_class_gone_after_rendering_leaves_the_live_service_as_it_is(
    load_balancer_class: str | None,
) -> None:
    live = attached(observe(claim_class=make_class(load_balancer_class=load_balancer_class)))
    plan = reconcile(dataclasses.replace(live, claim_class=None))
    assert condition(plan, CONDITION_PROVISIONED) == (TRUE, REASON_PROVISIONED)
    assert (plan.service_action, plan.service_patch) == (ServiceAction.NONE, None)


# --- detach, incarnation, stamps ---------------------------------------------------------------------


def test_endpoint_detached_withdraws_the_service_and_keeps_the_claim() -> None:
    live = attached()
    plan = reconcile(dataclasses.replace(live, endpoint=None))
    assert condition(plan, CONDITION_PROVISIONED) == (FALSE, REASON_ENDPOINT_DETACHED)
    assert plan.status["phase"] == PHASE_DETACHED
    assert plan.service_action is ServiceAction.DELETE
    assert plan.service is live.services[0]
    assert (plan.mint, plan.delete_claims) == (None, ())
    assert (plan.status["claimName"], plan.status["addresses"], plan.status["serviceName"]) == (
        CLAIM,
        [ADDRESS],
        None,
    )


def test_reattach_renders_again_with_the_same_claim() -> None:
    plan = reconcile(observe())  # the endpoint is back; the Service was withdrawn, the claim kept
    assert plan.service_action is ServiceAction.CREATE
    assert plan.service is not None
    assert plan.service["metadata"]["annotations"][CLAIM_ANNOTATION] == CLAIM


def test_application_incarnation_changed_withdraws() -> None:
    live = attached()
    plan = reconcile(dataclasses.replace(live, helmrelease=make_helmrelease(uid="hr-uid-2")))
    assert condition(plan, CONDITION_RESOLVED) == (FALSE, REASON_APPLICATION_INCARNATION_CHANGED)
    assert plan.service_action is ServiceAction.DELETE
    assert (plan.owner_reference, dict(plan.labels)) == (None, {}), "the new incarnation is never stamped"
    assert plan.status["phase"] == PHASE_PENDING


def test_owner_reference_and_lineage_labels_are_stamped_once() -> None:
    fresh = observe(attachment=make_attachment(owner_uid=None))
    plan = reconcile(fresh)
    assert plan.owner_reference == helmrelease_owner()
    assert dict(plan.labels) == application_labels()
    again = reconcile(settle(fresh, plan))
    assert (again.owner_reference, dict(again.labels)) == (None, {})


def test_a_listed_helmrelease_without_apiversion_is_stamped_with_its_kind() -> None:
    listed = make_helmrelease()
    del listed["apiVersion"], listed["kind"]
    plan = reconcile(observe(attachment=make_attachment(owner_uid=None), helmrelease=listed))
    assert plan.owner_reference == helmrelease_owner()


def test_lost_lineage_labels_are_stamped_again_without_a_second_reference() -> None:
    plan = reconcile(observe(attachment=make_attachment(stamped=False)))
    assert plan.owner_reference is None
    assert dict(plan.labels) == application_labels()


# --- status -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "phase", "service_name", "claim_name", "addresses"),
    [
        pytest.param(lambda: attached(), PHASE_ATTACHED, True, CLAIM, [ADDRESS], id="attached"),
        pytest.param(lambda: attached(ingress=()), PHASE_PENDING, True, CLAIM, [ADDRESS], id="waiting"),
        pytest.param(lambda: observe(), PHASE_PENDING, False, CLAIM, [ADDRESS], id="creating"),
        pytest.param(lambda: observe(claim=None), PHASE_PENDING, False, None, None, id="minting"),
        pytest.param(
            lambda: observe(claim=make_claim(phase="Pending", addresses=())),
            PHASE_PENDING,
            False,
            CLAIM,
            None,
            id="pending",
        ),
        pytest.param(
            lambda: dataclasses.replace(attached(), endpoint=None),
            PHASE_DETACHED,
            False,
            CLAIM,
            [ADDRESS],
            id="detached",
        ),
        pytest.param(
            lambda: observe(endpoint=None, claim=None), PHASE_PENDING, False, None, None, id="never resolved"
        ),
    ],
)
def test_status_fields(
    build: Any, phase: str, service_name: bool, claim_name: str | None, addresses: list[str] | None
) -> None:
    observed = build()
    plan = reconcile(observed)
    expected_name = observed.services[0]["metadata"]["name"] if service_name else None
    assert plan.status == {
        "phase": phase,
        "serviceName": expected_name,
        "claimName": claim_name,
        "addresses": addresses,
    }
    assert plan.generation == 1


def test_status_observed_generation_follows_the_attachment() -> None:
    plan = reconcile(observe(attachment=make_attachment(generation=7)))
    assert plan.generation == 7
    patch = plan.status_patch(None, CREATED)
    assert {"op": "add", "path": "/status/observedGeneration", "value": 7} in patch


# --- a second pass over an unchanged world plans nothing -------------------------------------------

QUIET = {
    "attached": lambda: (attached(), None),
    "attached, VM": lambda: (attached(vm_observe()), None),
    "attached, Dual": lambda: (
        attached(
            observe(
                attachment=make_attachment(family="Dual"),
                claim=make_claim(family="Dual", addresses=(ADDRESS, ADDRESS_V6)),
            ),
            ingress=(ADDRESS, ADDRESS_V6),
        ),
        None,
    ),
    "waiting": lambda: (attached(ingress=()), PassContext(now=T0)),
    "not announced": lambda: (attached(ingress=()), PassContext(now=NOW_LATE)),
    "nothing to publish": lambda: (observe(endpoint=make_service(selector={})), None),
    "claim in use": _in_use,
    "delegated": _delegated,
    "detached": lambda: (dataclasses.replace(observe(), endpoint=None), None),
    "refused": _refused,
    "unresolved": lambda: (observe(helmrelease=None), None),
}


@pytest.mark.parametrize("build", QUIET.values(), ids=QUIET.keys())
def test_a_second_pass_over_an_unchanged_world_plans_nothing(build: Any) -> None:
    observed, context = build()
    settled = settle(observed, reconcile(observed, context))
    assert_quiet(reconcile(settled, context), settled)


def test_the_driver_s_pin_never_makes_a_patch() -> None:
    live = attached()
    assert METALLB_IPS_ANNOTATION in live.services[0]["metadata"]["annotations"]
    assert reconcile(live).service_patch is None


def test_an_endpoint_change_is_mirrored_by_a_patch() -> None:
    live = attached()
    plan = reconcile(
        dataclasses.replace(live, endpoint=make_service(selector={"app": "db", "role": "replica"}))
    )
    assert plan.service_action is ServiceAction.PATCH
    assert plan.service_patch == {"spec": {"selector": {"role": "replica"}}}
    assert condition(plan, CONDITION_PROVISIONED) == (TRUE, REASON_PROVISIONED)


# --- surplus and finalize ---------------------------------------------------------------------------


def test_surplus_claims_and_services_of_ours_are_deleted() -> None:
    live = attached()
    second = as_stored(live.services[0], "db-public-zzzzz", created="2024-01-01T00:00:05Z")
    extra = make_claim("db-public-zzzzz", owner=live.attachment)
    plan = reconcile(dataclasses.replace(live, services=[*live.services, second], surplus_claims=[extra]))
    assert plan.surplus_services == (second,)
    assert plan.delete_claims == (extra,)
    assert condition(plan, CONDITION_PROVISIONED) == (TRUE, REASON_PROVISIONED), "the oldest is kept"


@pytest.mark.parametrize(
    ("services", "action", "waits"),
    [
        pytest.param("live", ServiceAction.DELETE, True, id="our Service lives"),
        pytest.param("deleting", ServiceAction.NONE, True, id="our Service is going"),
        pytest.param("none", ServiceAction.NONE, False, id="gone"),
    ],
)
def test_finalize_waits_for_our_services_and_never_touches_the_claim(
    services: str, action: ServiceAction, waits: bool
) -> None:
    live = attached()
    service = live.services[0]
    if services == "deleting":
        service = {**service, "metadata": {**service["metadata"], "deletionTimestamp": CREATED}}
    deleting = dataclasses.replace(
        live,
        attachment=make_attachment(deleting=True),
        services=[] if services == "none" else [service],
        surplus_claims=[make_claim("extra")],
    )
    plan = reconcile(deleting)
    assert plan.finalizing
    assert (plan.service_action, plan.waits_for_service) == (action, waits)
    assert (plan.mint, plan.delete_claims) == (None, ())
    assert plan.status_patch(None, CREATED) == []


# --- bad input never raises -------------------------------------------------------------------------

MALFORMED_SPECS: list[Any] = [
    None,
    "a string",
    {},
    {"applicationRef": "db", "endpoint": ["x"], "loadBalancer": 5},
    {"applicationRef": {"kind": 3, "name": None}, "endpoint": {"serviceName": 7}},
    {
        "applicationRef": {"kind": "Postgres", "name": "db"},
        "endpoint": {"serviceName": "postgres-db-rw"},
        "loadBalancer": {"ports": "5432"},
    },
    {
        "applicationRef": {"kind": "Postgres", "name": "db"},
        "endpoint": {"serviceName": "postgres-db-rw"},
        "loadBalancer": {"ports": [0, -1, 70000, "x", True, 5432, 5432]},
    },
    {
        "applicationRef": {"kind": "Postgres", "name": "db"},
        "endpoint": {"serviceName": "postgres-db-rw"},
        "loadBalancer": {"method": "Bogus", "family": "IPv5", "allowICMP": "yes"},
    },
    {
        "applicationRef": {"kind": "Postgres", "name": "db"},
        "endpoint": {"serviceName": "postgres-db-rw"},
        "loadBalancer": {"className": "a", "claimName": "b"},
    },
]


@pytest.mark.parametrize("spec", MALFORMED_SPECS)
@pytest.mark.parametrize("world", ["resolving", "attached", "nothing"])
def test_a_malformed_spec_never_raises(spec: Any, world: str) -> None:
    attachment = make_attachment()
    attachment["spec"] = spec
    base = {"resolving": observe(), "attached": attached(), "nothing": Observed(attachment=attachment)}[world]
    plan = reconcile(dataclasses.replace(base, attachment=attachment), PassContext(now=T0))
    assert [c.type for c in plan.conditions] == [CONDITION_RESOLVED, CONDITION_PROVISIONED]


def test_malformed_objects_around_never_raise() -> None:
    weird_claim = {
        "metadata": {"name": "x"},
        "status": {"phase": "Bound", "addresses": ["203.0.113.1", {"address": None}]},
    }
    weird_endpoint = {
        "metadata": {"name": "postgres-db-rw", "labels": lineage_labels()},
        "spec": {"selector": "x", "ports": ["y"]},
    }
    for observed in (
        observe(claim=weird_claim),
        observe(endpoint=weird_endpoint),
        observe(addresses=[{"status": {"associatedTo": "x"}}, {}]),
        dataclasses.replace(attached(), rendered_endpoints={"subsets": [{"addresses": [{}]}]}),
    ):
        reconcile(observed, PassContext(now=T0))


# --- over any world: the status is a projection of the conditions, and a settled pass is quiet ------

ANY_HELMRELEASE = st.sampled_from([make_helmrelease(), make_helmrelease(uid="hr-uid-2"), None])
ANY_ENDPOINT = st.sampled_from(
    [
        make_service(),
        make_service(selector={}),
        make_service(labels=OTHER_APP),
        make_service(ports=TWO_PORTS),
        None,
    ]
)
ANY_CLAIM = st.sampled_from(
    [
        make_claim(),
        make_claim(phase="Pending", addresses=()),
        make_claim(family="Dual", addresses=(ADDRESS, ADDRESS_V6)),
        None,
    ]
)
ANY_ATTACHMENT = st.sampled_from(
    [
        make_attachment(),
        make_attachment(owner_uid=None),
        make_attachment(ports=[9187]),
        make_attachment(family="Dual"),
    ]
)


@given(
    attachment=ANY_ATTACHMENT,
    helmrelease=ANY_HELMRELEASE,
    endpoint=ANY_ENDPOINT,
    claim=ANY_CLAIM,
    substrate=st.booleans(),
    rendered=st.booleans(),
    announced=st.booleans(),
    in_use=st.booleans(),
    seconds=st.integers(min_value=0, max_value=120),
)
def test_any_world(
    attachment: dict[str, Any],
    helmrelease: dict[str, Any] | None,
    endpoint: dict[str, Any] | None,
    claim: dict[str, Any] | None,
    substrate: bool,
    rendered: bool,
    announced: bool,
    in_use: bool,
    seconds: int,
) -> None:
    observed = observe(
        attachment=attachment, helmrelease=helmrelease, endpoint=endpoint, claim=claim, substrate=substrate
    )
    if rendered:
        ingress = tuple(claim_addresses(claim)) if announced and claim is not None else ()
        service = as_stored(previously_rendered(), ingress=ingress)
        observed = dataclasses.replace(observed, services=[service])
    if in_use:
        observed = dataclasses.replace(
            observed,
            addresses=[make_ip_address(associated_to=(NAMESPACE, "legacy-lb"))],
            claim_users=[LEGACY],
        )
    context = PassContext(now=T0 + timedelta(seconds=seconds))
    plan = reconcile(observed, context)
    resolved, provisioned = (c for c in plan.conditions)
    phase = plan.status["phase"]
    assert (phase == PHASE_ATTACHED) is (resolved.status == TRUE and provisioned.status == TRUE)
    assert (phase == PHASE_DETACHED) is (provisioned.reason == REASON_ENDPOINT_DETACHED)
    assert provisioned.reason in PROVISIONED_REASONS
    assert resolved.reason in RESOLVED_REASONS
    if resolved.status != TRUE:
        assert plan.mint is None, "nothing is minted before Resolved"
        assert plan.service_action in (ServiceAction.NONE, ServiceAction.DELETE)
    if plan.service_action is ServiceAction.CREATE:
        assert claim is not None
        assert claim_addresses(claim), "no Service before the claim is Bound"
    if plan.status["serviceName"] is not None:
        assert plan.service_action is not ServiceAction.DELETE
    if plan.service_action in (ServiceAction.NONE, ServiceAction.PATCH) and plan.mint is None:
        settled = settle(observed, plan)
        if plan.service_action is ServiceAction.PATCH:
            return  # the Service changes: the next pass reads the API's answer
        assert_quiet(reconcile(settled, context), settled)


def previously_rendered() -> dict[str, Any]:
    """The Service a previous pass created (in the default world)."""
    service = reconcile(observe()).service
    assert service is not None
    return dict(service)
