"""The planner's stages (``stages``), each on its own: a table per invariant, over observations made
from the caches (``world_of``) of a world in which everything resolves (application ``db``, its
tenant-facing endpoint, a minted claim Bound to ``203.0.113.7``, its class). How the stages make one
plan together is ``test_ea_reconcile``'s."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import pytest

from operators.endpointattachment.api import CLAIM_ANNOTATION, PHASE_DETACHED, PHASE_PENDING
from operators.endpointattachment.datapath import is_withdrawn, programmed_token, withdrawn_selector
from operators.endpointattachment.plan import Observed, PassContext, ServiceAction, refusal_of
from operators.endpointattachment.reasons import (
    CONDITION_RESOLVED,
    REASON_ADDRESS_NOT_ANNOUNCED,
    REASON_APPLICATION_INCARNATION_CHANGED,
    REASON_APPLICATION_NOT_FOUND,
    REASON_CLAIM_IN_USE,
    REASON_CLAIM_NOT_FOUND,
    REASON_CLAIM_PENDING,
    REASON_DATAPATH_CONTRACT_UNAVAILABLE,
    REASON_ENDPOINT_DETACHED,
    REASON_ENDPOINT_NOT_FOUND,
    REASON_FAMILY_CONFLICT,
    REASON_MULTIPLE_BACKENDS,
    REASON_NO_READY_BACKEND,
    REASON_NOTHING_TO_PUBLISH,
    REASON_PROVISIONED,
    REASON_RENDER_FAILED,
    REASON_RESOLVED,
    REASON_UNRESOLVED,
    REASON_WAITING_FOR_ADDRESS,
)
from operators.endpointattachment.reconcile import reconcile
from operators.endpointattachment.render import RenderSettings, render_claim
from operators.endpointattachment.stages import (
    Claimed,
    Dark,
    Datapath,
    Published,
    Rendered,
    Rendering,
    Untouched,
    claim_stage,
    datapath_stage,
    provisioned_stage,
    publish_stage,
    resolve_stage,
    service_stage,
    unresolved_exit,
)
from operators.endpointattachment.world import SUBSTRATE
from shared.conditions import FALSE, TRUE
from tests.ea_builders import (
    ADDRESS,
    CLAIM,
    CREATED,
    NAMESPACE,
    application_labels,
    as_stored,
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
from tests.ea_caches import Step, drop, put, world_of

T0 = datetime.fromisoformat(CREATED)
COZY = RenderSettings(proxy_name="cozy-proxy")
A = make_attachment()
WORLD: tuple[Step, ...] = (
    put("attachment", A),
    put("helmrelease", make_helmrelease()),
    put("service", make_service()),
    put("claim", make_claim(owner=A)),
    put("class", make_class()),
    put("address", make_ip_address()),
)
# A WholeIP attachment to a VM's endpoint, one running pod its one ready backend.
VM_A = make_attachment(
    "vm1-public", uid="uid-vm1", app_kind="VMInstance", app_name="vm1", endpoint="vm-vm1", method="WholeIP"
)
VM_CLAIM = "vm1-public-k2m9p"
VM_WORLD: tuple[Step, ...] = (
    put("attachment", VM_A),
    put(
        "helmrelease",
        make_helmrelease("vm-vm1", labels=lineage_labels(kind="VMInstance", name="vm1", tenant_facing=False)),
    ),
    put("service", vm_endpoint()),
    put("claim", make_claim(VM_CLAIM, owner=VM_A)),
    put("class", make_class()),
    put("address", make_ip_address(claim=(NAMESPACE, VM_CLAIM))),
    put("pod", make_pod("virt-launcher-vm1", labels={"vm.kubevirt.io/name": "vm1"})),
    put("slice", make_endpointslice("vm-vm1")),
)
ONE = ("pod-uid-1", "10.244.0.10", True)
TWO = ("pod-uid-2", "10.244.0.11", True)
TWO_READY = put("slice", make_endpointslice("vm-vm1", backends=[ONE, TWO]))


def observed(
    *steps: Step, vm: bool = False, settings: RenderSettings | None = None, **world: Any
) -> Observed:
    """The attachment (``vm``: the VM one) as the glue observes it after the base world and ``steps``."""
    base, name = (VM_WORLD, VM_A) if vm else (WORLD, A)
    found = world_of(*base, *steps, settings=COZY if vm and settings is None else settings, **world).observe(
        (NAMESPACE, name["metadata"]["name"])
    )
    assert found is not None
    return found


def ours(*steps: Step, vm: bool = False, ingress: tuple[str, ...] = (ADDRESS,)) -> Step:
    """Our Service, rendered from that world, as the API server stores it with ``ingress`` announced."""
    plan = reconcile(observed(*steps, vm=vm))
    assert plan.service_action is ServiceAction.CREATE, plan.provisioned
    assert plan.service is not None
    return put("service", as_stored(plan.service, ingress=ingress))


def _published(observation: Observed) -> Published:
    published = publish_stage(observation, resolve_stage(observation).spec)
    assert isinstance(published, Published), published
    return published


def _datapath(observation: Observed) -> Datapath:
    datapath = datapath_stage(observation, resolve_stage(observation), _published(observation))
    assert isinstance(datapath, Datapath), datapath
    return datapath


def _claimed(observation: Observed, context: PassContext | None = None) -> Claimed:
    claimed = claim_stage(observation, resolve_stage(observation), context)
    assert isinstance(claimed, Claimed), claimed
    return claimed


def serve(observation: Observed, context: PassContext | None = None) -> Rendering | Dark | Untouched:
    """The service stage after the stages before it handed on."""
    return service_stage(
        observation,
        resolve_stage(observation),
        _datapath(observation),
        _claimed(observation, context),
        context,
    )


def provision(observation: Observed, context: PassContext | None = None) -> Rendered:
    """The provisioned stage after the stages before it handed on."""
    rendering = serve(observation, context)
    assert isinstance(rendering, Rendering), rendering
    basis = resolve_stage(observation)
    return provisioned_stage(observation, basis, _datapath(observation), rendering, context)


def at(seconds: float, **changes: Any) -> PassContext:
    return PassContext(now=T0 + timedelta(seconds=seconds), **changes)


# --- resolve ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param((), (TRUE, REASON_RESOLVED), id="everything resolves"),
        pytest.param((drop("helmrelease", make_helmrelease()),), (FALSE, REASON_APPLICATION_NOT_FOUND)),
        pytest.param(
            (put("helmrelease", make_helmrelease(uid="hr-uid-2")),),
            (FALSE, REASON_APPLICATION_INCARNATION_CHANGED),
            id="application recreated",
        ),
        pytest.param((drop("service", make_service()),), (FALSE, REASON_ENDPOINT_NOT_FOUND)),
    ],
)
def test_resolve_states_the_resolution_as_the_resolved_condition(
    steps: tuple[Step, ...], expected: tuple[str, str]
) -> None:
    resolved = resolve_stage(observed(*steps)).resolved
    assert resolved.type == CONDITION_RESOLVED
    assert (resolved.status, resolved.reason) == expected


@pytest.mark.parametrize(
    ("steps", "owner", "labels"),
    [
        pytest.param((), None, {}, id="stamped already: nothing"),
        pytest.param(
            (put("attachment", make_attachment(owner_uid=None)),),
            helmrelease_owner(),
            application_labels(),
            id="first resolution: the owner reference and the lineage labels",
        ),
        pytest.param(
            (put("attachment", make_attachment(owner_uid=None)), drop("helmrelease", make_helmrelease())),
            None,
            {},
            id="unresolved: nothing",
        ),
    ],
)
def test_resolve_stamps_only_a_first_resolution(
    steps: tuple[Step, ...], owner: Mapping[str, Any] | None, labels: dict[str, str]
) -> None:
    common = resolve_stage(observed(*steps)).common
    assert (common.owner_reference, dict(common.labels)) == (owner, labels)


def _ours_named(name: str, *, deleting: bool = False) -> dict[str, Any]:
    service = as_stored(reconcile(observed()).service or {}, name)
    if deleting:
        service["metadata"]["deletionTimestamp"] = CREATED
    return service


@pytest.mark.parametrize(
    ("services", "kept", "surplus"),
    [
        pytest.param([], None, [], id="none"),
        pytest.param([_ours_named("s1")], "s1", [], id="one"),
        pytest.param([_ours_named("s1"), _ours_named("s2")], "s1", ["s2"], id="a lost create answer"),
        pytest.param([_ours_named("s1", deleting=True), _ours_named("s2")], "s2", [], id="oldest going"),
        pytest.param([_ours_named("s1", deleting=True)], None, [], id="only one going"),
    ],
)
def test_resolve_keeps_the_oldest_live_service_and_deletes_the_other_live_ones(
    services: list[dict[str, Any]], kept: str | None, surplus: list[str]
) -> None:
    basis = resolve_stage(dataclasses.replace(observed(), services=services))
    assert (basis.existing or {"metadata": {}})["metadata"].get("name") == kept
    assert [s["metadata"]["name"] for s in basis.common.surplus_services] == surplus


@pytest.mark.parametrize(
    ("steps", "unserved", "expected"),
    [
        pytest.param((), (), (CLAIM, (ADDRESS,), 0), id="minted and Bound"),
        pytest.param(
            (put("claim", make_claim("db-public-zzzzz", owner=A, created="2024-01-01T00:00:01Z")),),
            (),
            (CLAIM, (ADDRESS,), 1),
            id="a second minted claim: surplus",
        ),
        pytest.param(
            (put("claim", make_claim(owner=A, phase="Pending")),),
            (),
            (CLAIM, (), 0),
            id="not Bound: no address",
        ),
        pytest.param((), SUBSTRATE, (None, (), 0), id="substrate not served: no claim"),
        pytest.param(
            (put("attachment", make_attachment(claim_name="my-ip")),),
            (),
            ("my-ip", (), 1),
            id="a reserved claim not found: its name; the minted one surplus",
        ),
    ],
)
def test_resolve_sees_the_claim_and_its_addresses_only_while_served_and_bound(
    steps: tuple[Step, ...], unserved: tuple[Any, ...], expected: tuple[str | None, tuple[str, ...], int]
) -> None:
    basis = resolve_stage(observed(*steps, unserved=unserved))
    assert (basis.status["claimName"], basis.addresses, len(basis.common.delete_claims)) == expected
    assert basis.status["addresses"] == (list(basis.addresses) or None)
    assert (basis.claim is None) == (expected[0] in (None, "my-ip"))


STORED = {"claimName": "kept-claim", "addresses": ["198.51.100.9"]}
NO_ENDPOINT = drop("service", make_service())


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param(
            (NO_ENDPOINT, ours()),
            (REASON_ENDPOINT_DETACHED, PHASE_DETACHED, {}),
            id="endpoint gone, Service held",
        ),
        pytest.param(
            (NO_ENDPOINT, put("attachment", make_attachment(status={"claimName": CLAIM}))),
            (REASON_ENDPOINT_DETACHED, PHASE_DETACHED, {}),
            id="endpoint gone, the claim reported",
        ),
        pytest.param(
            (NO_ENDPOINT, put("attachment", make_attachment(status=STORED))),
            (REASON_UNRESOLVED, PHASE_PENDING, STORED),
            id="endpoint gone, nothing held: the stored claim kept",
        ),
        pytest.param(
            (NO_ENDPOINT, ours(), put("claim", make_claim(owner=A, phase="Pending"))),
            (REASON_UNRESOLVED, PHASE_PENDING, {"claimName": None, "addresses": None}),
            id="endpoint gone, claim not Bound: nothing held",
        ),
        pytest.param(
            (drop("helmrelease", make_helmrelease()), ours()),
            (REASON_UNRESOLVED, PHASE_PENDING, {}),
            id="application gone, Service held",
        ),
    ],
)
def test_unresolved_exit_detaches_only_what_held_an_address(
    steps: tuple[Step, ...], expected: tuple[str, str, dict[str, Any]]
) -> None:
    observation = observed(*steps)
    exit_ = unresolved_exit(observation, resolve_stage(observation))
    assert (exit_.reason, exit_.phase, dict(exit_.status)) == expected
    assert exit_.mint is None


# --- publish ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("steps", "words"),
    [
        pytest.param(
            (put("service", make_service(type_="ExternalName")),), "selects no pods", id="ExternalName"
        ),
        pytest.param((put("service", make_service(selector={})),), "selects no pods", id="no selector"),
        pytest.param((put("service", make_service(ports=[])),), "publishes no port", id="no port"),
        pytest.param(
            (put("attachment", make_attachment(ports=[80])),),
            "does not publish the asked port 80",
            id="a port it does not publish",
        ),
    ],
)
def test_publish_exits_dark_with_nothing_to_publish(steps: tuple[Step, ...], words: str) -> None:
    observation = observed(*steps)
    exit_ = publish_stage(observation, resolve_stage(observation).spec)
    assert isinstance(exit_, Dark)
    assert exit_.reason == REASON_NOTHING_TO_PUBLISH
    assert words in exit_.message


TWO_PORTS = [
    {"name": "postgres", "protocol": "TCP", "port": 5432, "targetPort": 5432},
    {"name": "metrics", "protocol": "TCP", "port": 9187, "targetPort": 9187},
]


@pytest.mark.parametrize(
    ("steps", "ports"),
    [
        pytest.param((), [5432], id="every port"),
        pytest.param((put("service", make_service(ports=TWO_PORTS)),), [5432, 9187], id="both ports"),
        pytest.param(
            (put("service", make_service(ports=TWO_PORTS)), put("attachment", make_attachment(ports=[9187]))),
            [9187],
            id="the asked port only",
        ),
    ],
)
def test_publish_hands_on_the_endpoints_selector_and_the_ports_asked(
    steps: tuple[Step, ...], ports: list[int]
) -> None:
    published = _published(observed(*steps))
    assert published.selector == {"app": "db", "role": "primary"}
    assert [p["port"] for p in published.ports] == ports


# --- datapath --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "observation",
    [
        pytest.param(observed(), id="no VM method"),
        pytest.param(
            observed(put("slice", make_endpointslice(backends=[ONE, TWO])), settings=COZY),
            id="no VM method: backends not counted",
        ),
    ],
)
def test_datapath_outside_the_vm_modes_renders_what_is_published(observation: Observed) -> None:
    published = _published(observation)
    assert _datapath(observation) == Datapath(published.selector, published.ports)


@pytest.mark.parametrize(
    ("steps", "settings", "expected"),
    [
        pytest.param((), COZY, None, id="one ready backend: admitted"),
        pytest.param(
            (),
            RenderSettings(),
            REASON_DATAPATH_CONTRACT_UNAVAILABLE,
            id="cozy-proxy not declared",
        ),
        pytest.param((TWO_READY,), COZY, REASON_MULTIPLE_BACKENDS, id="two ready backends, nothing of ours"),
    ],
)
def test_datapath_admits_or_exits_dark_before_anything_renders(
    steps: tuple[Step, ...], settings: RenderSettings, expected: str | None
) -> None:
    observation = observed(*steps, vm=True, settings=settings)
    result = datapath_stage(observation, resolve_stage(observation), _published(observation))
    if expected is None:
        assert isinstance(result, Datapath)
        assert result.withdrawn is None
        assert not is_withdrawn(result.selector)
    else:
        assert isinstance(result, Dark)
        assert result.reason == expected


def test_datapath_keeps_our_service_withdrawn_while_multiple_backends() -> None:
    observation = observed(ours(vm=True), TWO_READY, vm=True)
    datapath = _datapath(observation)
    assert datapath.withdrawn is not None
    assert (datapath.withdrawn.status, datapath.withdrawn.reason) == (FALSE, REASON_MULTIPLE_BACKENDS)
    assert "kept with its backends withdrawn" in datapath.withdrawn.message
    assert is_withdrawn(datapath.selector)
    assert datapath.ports == _published(observation).ports


# --- claim -----------------------------------------------------------------------------------------

MY_IP = "my-ip"
RESERVED = (put("attachment", make_attachment(claim_name=MY_IP)), drop("claim", make_claim(owner=A)))


@pytest.mark.parametrize(
    ("steps", "unserved", "expected", "words"),
    [
        pytest.param(
            (), SUBSTRATE, REASON_CLAIM_PENDING, "substrate is not installed", id="substrate unserved"
        ),
        pytest.param(RESERVED, (), REASON_CLAIM_NOT_FOUND, "no IPAddressClaim my-ip", id="reserved: absent"),
        pytest.param(
            (*RESERVED, put("claim", make_claim(MY_IP, deleting=True))),
            (),
            REASON_CLAIM_NOT_FOUND,
            "no IPAddressClaim my-ip",
            id="reserved: being deleted",
        ),
        pytest.param(
            (
                put("attachment", make_attachment(claim_name=MY_IP, family="IPv4")),
                put("claim", make_claim(MY_IP, family="IPv6")),
            ),
            (),
            REASON_FAMILY_CONFLICT,
            "claim my-ip is IPv6, the attachment asks for IPv4",
            id="reserved: another family",
        ),
        pytest.param(
            (put("claim", make_claim(owner=A, phase="Pending")),),
            (),
            REASON_CLAIM_PENDING,
            f"claim {CLAIM} is Pending",
            id="not Bound",
        ),
        pytest.param(
            (put("service", make_service("other", labels={}, annotations={CLAIM_ANNOTATION: CLAIM})),),
            (),
            REASON_CLAIM_IN_USE,
            f"in use by Service {NAMESPACE}/other",
            id="another Service names it",
        ),
    ],
)
def test_claim_exits_dark_until_a_bound_claim_serves_this_attachment_alone(
    steps: tuple[Step, ...], unserved: tuple[Any, ...], expected: str, words: str
) -> None:
    observation = observed(*steps, unserved=unserved)
    exit_ = claim_stage(observation, resolve_stage(observation), None)
    assert isinstance(exit_, Dark)
    assert (exit_.reason, exit_.mint) == (expected, None)
    assert words in exit_.message


MINT = render_claim(A, resolve_stage(observed()).spec)
NO_CLAIM = drop("claim", make_claim(owner=A))


@pytest.mark.parametrize(
    ("refusal", "expected"),
    [
        pytest.param(None, (REASON_CLAIM_PENDING, True, None), id="none yet: minted"),
        pytest.param(
            refusal_of(ServiceAction.MINT, MINT, 422, "denied by policy", T0),
            (REASON_RENDER_FAILED, False, None),
            id="refused: not sent again",
        ),
        pytest.param(
            refusal_of(ServiceAction.MINT, MINT, 403, "exceeded quota: claims", T0),
            (REASON_RENDER_FAILED, False, 50.0),
            id="quota: tried again later",
        ),
        pytest.param(
            refusal_of(ServiceAction.MINT, MINT, 403, "exceeded quota: claims", T0 - timedelta(seconds=60)),
            (REASON_CLAIM_PENDING, True, None),
            id="quota: its retry due",
        ),
        pytest.param(
            refusal_of(
                ServiceAction.MINT, {**MINT, "spec": {"className": "another"}}, 422, "denied by policy", T0
            ),
            (REASON_CLAIM_PENDING, True, None),
            id="another body refused: this one is sent",
        ),
    ],
)
def test_claim_mints_one_unless_the_api_refused_that_very_claim(
    refusal: Any, expected: tuple[str, bool, float | None]
) -> None:
    observation = observed(NO_CLAIM)
    exit_ = claim_stage(observation, resolve_stage(observation), at(10, refusal=refusal))
    assert isinstance(exit_, Dark)
    assert (exit_.reason, exit_.mint is not None, exit_.recheck_after) == expected
    assert exit_.mint in (None, MINT)


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param((), (CLAIM, "IPv4"), id="minted"),
        pytest.param(
            (
                *RESERVED,
                put("claim", make_claim(MY_IP)),
                put("address", make_ip_address(claim=(NAMESPACE, MY_IP))),
            ),
            (MY_IP, "IPv4"),
            id="reserved",
        ),
        pytest.param(
            (ours(), put("service", make_service("other", labels={}, annotations={CLAIM_ANNOTATION: CLAIM}))),
            (CLAIM, "IPv4"),
            id="another Service names it, but the address is ours",
        ),
    ],
)
def test_claim_hands_on_a_bound_claim_with_its_name_and_family(
    steps: tuple[Step, ...], expected: tuple[str, str]
) -> None:
    claimed = _claimed(observed(*steps))
    assert (claimed.name, claimed.family) == expected


# --- service ---------------------------------------------------------------------------------------

OTHER_PORT = put("service", make_service(ports=TWO_PORTS))


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param((), ServiceAction.CREATE, id="none of ours: create"),
        pytest.param((ours(),), ServiceAction.NONE, id="ours as rendered: nothing"),
        pytest.param((ours(), OTHER_PORT), ServiceAction.PATCH, id="the endpoint changed: patch"),
        pytest.param(
            (ours(), drop("class", make_class())), ServiceAction.NONE, id="class gone after rendering: kept"
        ),
    ],
)
def test_service_renders_and_creates_or_patches_ours(
    steps: tuple[Step, ...], expected: ServiceAction
) -> None:
    rendering = serve(observed(*steps))
    assert isinstance(rendering, Rendering)
    assert rendering.action is expected
    assert (rendering.patch is not None) == (expected is ServiceAction.PATCH)


def test_service_is_not_rendered_before_its_class_is_observed() -> None:
    exit_ = serve(observed(drop("class", make_class())))
    assert isinstance(exit_, Dark)
    assert exit_.reason == REASON_CLAIM_PENDING
    assert "IPAddressClass public is not found" in exit_.message


BOUND_AT_T0 = put(
    "claim",
    make_claim(owner=A, conditions=[{"type": "Bound", "status": "True", "lastTransitionTime": CREATED}]),
)
PROVISIONING = tuple(put("claim", make_claim(f"other-{i}", phase="Pending")) for i in range(2))


def _refused(action: ServiceAction, steps: tuple[Step, ...], *, changed: bool = False) -> PassContext:
    """A context whose refusal is of the write this world makes (``changed``: of another body)."""
    rendering = serve(observed(*steps))
    assert isinstance(rendering, Rendering)
    body = rendering.patch if action is ServiceAction.PATCH else rendering.desired
    assert body is not None
    return at(1, refusal=refusal_of(action, {**body, "changed": True} if changed else body, 422, "no", T0))


@pytest.mark.parametrize(
    ("steps", "context", "expected"),
    [
        pytest.param(
            (BOUND_AT_T0, *PROVISIONING),
            at(2),
            (REASON_WAITING_FOR_ADDRESS, 6.0),
            id="hand-over hold: a burst provisioning",
        ),
        pytest.param((BOUND_AT_T0, PROVISIONING[0]), at(2), None, id="a trickle: not held"),
        pytest.param((BOUND_AT_T0, *PROVISIONING), at(9), None, id="hold passed"),
        pytest.param(
            (ours(), put("class", make_class(load_balancer_class="other-lb"))),
            None,
            (REASON_RENDER_FAILED, None),
            id="an immutable field differs",
        ),
        pytest.param(
            (), _refused(ServiceAction.CREATE, ()), (REASON_RENDER_FAILED, None), id="create refused"
        ),
        pytest.param(
            (ours(), OTHER_PORT),
            _refused(ServiceAction.PATCH, (ours(), OTHER_PORT)),
            (REASON_RENDER_FAILED, None),
            id="patch refused",
        ),
        pytest.param((), _refused(ServiceAction.CREATE, (), changed=True), None, id="another body refused"),
    ],
)
def test_service_leaves_ours_untouched_while_held_mismatched_or_refused(
    steps: tuple[Step, ...], context: PassContext | None, expected: tuple[str, float | None] | None
) -> None:
    result = serve(observed(*steps), context)
    if expected is None:
        assert isinstance(result, Rendering)
    else:
        assert isinstance(result, Untouched)
        assert (result.reason, result.recheck_after) == expected


# --- provisioned -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("steps", "context", "expected"),
    [
        pytest.param((), at(0), (FALSE, REASON_WAITING_FOR_ADDRESS, None), id="being created"),
        pytest.param((ours(),), at(0), (TRUE, REASON_PROVISIONED, None), id="announced"),
        pytest.param(
            (ours(ingress=()),), at(10), (FALSE, REASON_WAITING_FOR_ADDRESS, 50.0), id="not yet announced"
        ),
        pytest.param(
            (ours(ingress=()),),
            at(61),
            (FALSE, REASON_ADDRESS_NOT_ANNOUNCED, None),
            id="announce deadline passed",
        ),
        pytest.param(
            (ours(ingress=()),),
            at(61, written_at=T0 + timedelta(seconds=30)),
            (FALSE, REASON_WAITING_FOR_ADDRESS, 29.0),
            id="written again since",
        ),
        pytest.param((ours(ingress=()),), None, (FALSE, REASON_WAITING_FOR_ADDRESS, None), id="no clock"),
        pytest.param(
            (ours(ingress=()), OTHER_PORT),
            at(61),
            (FALSE, REASON_WAITING_FOR_ADDRESS, 60.0),
            id="patched: the deadline starts again",
        ),
    ],
)
def test_provisioned_waits_for_the_ingress_until_the_announce_deadline(
    steps: tuple[Step, ...], context: PassContext | None, expected: tuple[str, str, float | None]
) -> None:
    rendered = provision(observed(*steps), context)
    found = (rendered.provisioned.status, rendered.provisioned.reason, rendered.recheck_after)
    assert found == expected
    assert (rendered.programmed, rendered.restoring) == (None, False)


def _endpoints_of_ours(*backends: tuple[str, str, bool]) -> Step:
    service = ours(vm=True)[2]
    return put("endpoints", make_endpoints(service["metadata"]["name"], backends=backends))


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param(
            (_endpoints_of_ours(ONE),), (TRUE, REASON_PROVISIONED, True), id="one backend: programmed"
        ),
        pytest.param(
            (_endpoints_of_ours(),), (FALSE, REASON_NO_READY_BACKEND, False), id="no backend listed"
        ),
        pytest.param(
            (_endpoints_of_ours(ONE, TWO),), (FALSE, REASON_MULTIPLE_BACKENDS, False), id="two listed yet"
        ),
        pytest.param(
            (_endpoints_of_ours(ONE, TWO), TWO_READY),
            (FALSE, REASON_MULTIPLE_BACKENDS, False),
            id="two ready: withdrawn",
        ),
    ],
)
def test_provisioned_in_a_vm_mode_names_the_one_backend_of_our_endpoints(
    steps: tuple[Step, ...], expected: tuple[str, str, bool]
) -> None:
    rendered = provision(observed(ours(vm=True), *steps, vm=True), at(0))
    provisioned = rendered.provisioned
    assert (provisioned.status, provisioned.reason, rendered.programmed is not None) == expected
    if rendered.programmed is not None:
        assert rendered.programmed == programmed_token(ADDRESS, "pod-uid-1")
        assert "traffic goes to" in rendered.provisioned.message


def test_provisioned_restores_the_withdrawn_backends_with_one_patch() -> None:
    withdrawing = provision(observed(ours(vm=True), TWO_READY, vm=True), at(0))
    assert (withdrawing.action, withdrawing.restoring) == (ServiceAction.PATCH, False)
    service = ours(vm=True)[2]
    service["spec"]["selector"] = withdrawn_selector(service["spec"]["selector"], VM_A["metadata"]["uid"])
    restored = provision(observed(put("service", service), vm=True), at(0))
    assert (restored.action, restored.restoring) == (ServiceAction.PATCH, True)
    assert restored.patch is not None
    merged = {**service["spec"]["selector"], **restored.patch["spec"]["selector"]}
    assert {k: v for k, v in merged.items() if v is not None} == {"vm.kubevirt.io/name": "vm1"}
