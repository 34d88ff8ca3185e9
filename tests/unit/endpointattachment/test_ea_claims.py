"""claims: one IPAddressClaim's reservation -> the plan. Tables per invariant, a tiny simulated glue that
applies plans until a pass is quiet, and a property over random pools."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest
from hypothesis import given
from hypothesis import strategies as st

from operators.endpointattachment.addresses import pool_of, start_offset
from operators.endpointattachment.claims import (
    REASON_ADDRESS_INVALID,
    REASON_ADDRESS_NOT_IN_CLASS,
    REASON_IN_USE,
    REASON_RELEASING,
    REASON_RESERVED,
    ClaimPlan,
    finalize_claim,
    reconcile_claim,
)
from operators.endpointattachment.constants import (
    CLAIM_PHASE_BOUND,
    CLAIM_PHASE_LOST,
    CLAIM_PHASE_PENDING,
    COND_ADDRESS_BOUND,
    COND_READY,
    IP_ADDRESS_CLAIM_KIND,
    REASON_ADDRESS_IN_USE,
    REASON_CLASS_INVALID,
    REASON_CLASS_NOT_FOUND,
    REASON_MINTED,
    REASON_MINTING,
    REASON_NAMESPACE_NOT_ALLOWED,
    REASON_POOL_EXHAUSTED,
)
from shared.conditions import FALSE, TRUE, UNKNOWN
from tests.ea_builders import NAMESPACE, make_claim, make_class, make_namespace_labels

NOW = "2024-02-01T00:00:00Z"
CLAIM_UID = "claim-uid-my-ip"
REQUESTED = "203.0.113.20"
GOLD = {"matchLabels": {"tier": "gold"}}

Obj = dict[str, Any]


def fresh_claim(address: str | None = None, **changes: Any) -> Obj:
    """A claim as the tenant creates it: no status yet."""
    return make_claim(address=address, phase=None, **changes)


def bound_claim(address: str = REQUESTED, *, requested: bool = False) -> Obj:
    """A claim whose stored status says Bound to ``address`` (from spec.address or from the pool)."""
    claim = make_claim(address=address)
    if not requested:
        del claim["spec"]["address"]
    return claim


DEFAULT_CLASS = make_class()


def run(
    claim: Obj,
    *,
    address_class: Obj | None = DEFAULT_CLASS,
    held: str | None = None,
    taken: frozenset[str] = frozenset(),
    labels: dict[str, str] | None = None,
) -> ClaimPlan:
    return reconcile_claim(
        claim,
        address_class,
        held,
        taken | ({held} if held else set()),
        make_namespace_labels() if labels is None else labels,
    )


def condition(plan: ClaimPlan, type_: str) -> tuple[str, str]:
    found = next(c for c in plan.conditions if c.type == type_)
    return found.status, found.reason


def message(plan: ClaimPlan, type_: str) -> str:
    return next(c.message for c in plan.conditions if c.type == type_)


def stored(claim: Obj, plan: ClaimPlan) -> Obj:
    """The claim after the glue stores the plan's status."""
    updated = copy.deepcopy(claim)
    status = updated.get("status") or None
    patched = jsonpatch.apply_patch(
        {"status": status} if status is not None else {}, plan.status_patch(status, NOW)
    )
    updated["status"] = patched["status"]
    return updated


def first_candidate(uid: str = CLAIM_UID) -> str:
    pool = pool_of(make_class()["spec"])
    return str(next(pool.candidates(start_offset(pool, uid))))


# --- minting: which address, or why none ----------------------------------------------------------


@pytest.mark.parametrize(
    ("claim", "kwargs", "reason", "minted"),
    [
        pytest.param(fresh_claim(REQUESTED), {}, REASON_MINTING, REQUESTED, id="requested address minted"),
        pytest.param(
            fresh_claim("198.51.100.7"), {}, REASON_ADDRESS_NOT_IN_CLASS, None, id="requested outside pool"
        ),
        pytest.param(
            fresh_claim("2001:db8::7"), {}, REASON_ADDRESS_NOT_IN_CLASS, None, id="requested other family"
        ),
        pytest.param(
            fresh_claim("203.0.113.0"), {}, REASON_ADDRESS_NOT_IN_CLASS, None, id="requested network address"
        ),
        pytest.param(
            fresh_claim(REQUESTED),
            {"address_class": make_class(exclude=[REQUESTED])},
            REASON_ADDRESS_NOT_IN_CLASS,
            None,
            id="requested excluded",
        ),
        pytest.param(
            fresh_claim("203.0.113.020"), {}, REASON_ADDRESS_INVALID, None, id="requested not canonical"
        ),
        pytest.param(
            fresh_claim(REQUESTED),
            {"taken": frozenset({REQUESTED})},
            REASON_ADDRESS_IN_USE,
            None,
            id="requested taken",
        ),
        pytest.param(fresh_claim(), {}, REASON_MINTING, first_candidate(), id="first candidate from offset"),
        pytest.param(
            fresh_claim(),
            {
                "address_class": make_class(cidrs=["203.0.113.0/30"]),
                "taken": frozenset({"203.0.113.1", "203.0.113.2"}),
            },
            REASON_POOL_EXHAUSTED,
            None,
            id="exhausted",
        ),
        pytest.param(fresh_claim(), {"address_class": None}, REASON_CLASS_NOT_FOUND, None, id="no class"),
        pytest.param(
            fresh_claim(),
            {"address_class": make_class("private-v4")},
            REASON_CLASS_NOT_FOUND,
            None,
            id="other class",
        ),
        pytest.param(
            fresh_claim(),
            {"address_class": make_class(cidrs=["203.0.113.1/26"])},
            REASON_CLASS_INVALID,
            None,
            id="bad cidr",
        ),
        pytest.param(
            fresh_claim(),
            {"address_class": make_class(provider="F5")},
            REASON_CLASS_INVALID,
            None,
            id="unknown provider",
        ),
        pytest.param(
            fresh_claim(),
            {"address_class": make_class(allowed_namespaces=GOLD)},
            REASON_NAMESPACE_NOT_ALLOWED,
            None,
            id="namespace not allowed",
        ),
        pytest.param(
            fresh_claim(),
            {
                "address_class": make_class(allowed_namespaces=GOLD),
                "labels": make_namespace_labels(tier="gold"),
            },
            REASON_MINTING,
            first_candidate(),
            id="namespace allowed",
        ),
    ],
)
def test_never_held_claim(claim: Obj, kwargs: dict[str, Any], reason: str, minted: str | None) -> None:
    plan = run(claim, **kwargs)
    status = UNKNOWN if reason == REASON_MINTING else FALSE
    assert condition(plan, COND_ADDRESS_BOUND) == (status, reason)
    assert condition(plan, COND_READY) == (FALSE, reason)
    assert plan.status == {"phase": CLAIM_PHASE_PENDING, "address": None}
    assert (plan.mint is not None) is (reason == REASON_MINTING)
    if minted is not None:
        assert plan.mint is not None
        assert plan.mint.address == minted
    assert plan.release_allocation is None
    assert not plan.remove_finalizer


def test_first_free_skips_the_taken_offset_candidate() -> None:
    pool = pool_of(make_class()["spec"])
    walk = [str(a) for a in pool.candidates(start_offset(pool, CLAIM_UID))]
    plan = run(fresh_claim(), taken=frozenset({walk[0]}))
    assert plan.mint is not None
    assert plan.mint.address == walk[1]


def test_mint_is_an_allocation_held_by_the_claim() -> None:
    plan = run(fresh_claim(REQUESTED))
    assert plan.mint is not None
    assert plan.mint.allocation["metadata"]["name"] == REQUESTED
    assert plan.mint.allocation["spec"] == {
        "address": REQUESTED,
        "className": "public-v4",
        "holder": {"kind": IP_ADDRESS_CLAIM_KIND, "namespace": NAMESPACE, "name": "my-ip", "uid": CLAIM_UID},
    }


@pytest.mark.parametrize(
    ("claim", "wording"),
    [
        pytest.param(fresh_claim("198.51.100.7"), "is not in the pool of", id="outside"),
        pytest.param(fresh_claim("203.0.113.63"), "is excluded from", id="broadcast"),
    ],
)
def test_refusal_says_why(claim: Obj, wording: str) -> None:
    assert wording in message(run(claim), COND_ADDRESS_BOUND)


# --- held, lost, re-locked -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("claim", "kwargs", "phase", "bound", "ready", "mint"),
    [
        pytest.param(
            fresh_claim(REQUESTED),
            {"held": REQUESTED},
            CLAIM_PHASE_BOUND,
            (TRUE, REASON_MINTED),
            (TRUE, REASON_RESERVED),
            None,
            id="held: bound",
        ),
        pytest.param(
            fresh_claim(),
            {"held": "203.0.113.30"},
            CLAIM_PHASE_BOUND,
            (TRUE, REASON_MINTED),
            (TRUE, REASON_RESERVED),
            None,
            id="held from the pool: bound",
        ),
        pytest.param(
            bound_claim(),
            {"address_class": None, "held": REQUESTED},
            CLAIM_PHASE_BOUND,
            (TRUE, REASON_MINTED),
            (FALSE, REASON_CLASS_NOT_FOUND),
            None,
            id="held, class gone: still held",
        ),
        pytest.param(
            bound_claim(),
            {"address_class": make_class(allowed_namespaces=GOLD), "held": REQUESTED},
            CLAIM_PHASE_BOUND,
            (TRUE, REASON_MINTED),
            (FALSE, REASON_NAMESPACE_NOT_ALLOWED),
            None,
            id="held, namespace refused now: still held",
        ),
        pytest.param(
            bound_claim(),
            {"address_class": make_class(cidrs=["198.51.100.0/24"]), "held": REQUESTED},
            CLAIM_PHASE_BOUND,
            (TRUE, REASON_MINTED),
            (TRUE, REASON_RESERVED),
            None,
            id="held, pool shrank: still held",
        ),
        pytest.param(
            bound_claim(),
            {"taken": frozenset({REQUESTED})},
            CLAIM_PHASE_LOST,
            (FALSE, REASON_ADDRESS_IN_USE),
            (FALSE, REASON_ADDRESS_IN_USE),
            None,
            id="vanished, taken: lost",
        ),
        pytest.param(
            bound_claim(),
            {},
            None,
            (UNKNOWN, REASON_MINTING),
            (FALSE, REASON_MINTING),
            REQUESTED,
            id="vanished, free: same address again",
        ),
        pytest.param(
            bound_claim(),
            {"address_class": make_class(cidrs=["198.51.100.0/24"])},
            None,
            (UNKNOWN, REASON_MINTING),
            (FALSE, REASON_MINTING),
            REQUESTED,
            id="vanished, free, pool shrank: same address again",
        ),
        pytest.param(
            bound_claim(),
            {"address_class": None},
            None,
            (FALSE, REASON_CLASS_NOT_FOUND),
            (FALSE, REASON_CLASS_NOT_FOUND),
            None,
            id="vanished, class gone: phase left",
        ),
        pytest.param(
            make_claim(phase=CLAIM_PHASE_LOST)
            | {"status": {"phase": CLAIM_PHASE_LOST, "address": REQUESTED}},
            {},
            None,
            (UNKNOWN, REASON_MINTING),
            (FALSE, REASON_MINTING),
            REQUESTED,
            id="lost, freed again: taken back",
        ),
    ],
)
def test_claim_that_held_an_address(
    claim: Obj,
    kwargs: dict[str, Any],
    phase: str | None,
    bound: tuple[str, str],
    ready: tuple[str, str],
    mint: str | None,
) -> None:
    plan = run(claim, **kwargs)
    assert condition(plan, COND_ADDRESS_BOUND) == bound
    assert condition(plan, COND_READY) == ready
    assert plan.status.get("phase") == phase
    if phase == CLAIM_PHASE_BOUND:
        assert plan.status["address"] == kwargs["held"]
    else:
        assert "address" not in plan.status  # the recorded address is kept, never replaced
    assert (plan.mint.address if plan.mint else None) == mint
    if phase != CLAIM_PHASE_BOUND and claim["status"].get("address"):
        assert stored(claim, plan)["status"]["address"] == claim["status"]["address"]


def test_vanished_free_claim_never_moves_to_the_offset_candidate() -> None:
    assert first_candidate() != REQUESTED  # otherwise this test would prove nothing
    plan = run(bound_claim())
    assert plan.mint is not None
    assert plan.mint.address == REQUESTED
    assert stored(bound_claim(), plan)["status"]["phase"] == CLAIM_PHASE_BOUND


def test_bound_stays_bound_and_the_second_pass_is_quiet() -> None:
    claim = fresh_claim(REQUESTED)
    first = run(claim)
    assert first.mint is not None
    claim = stored(claim, first)
    second = run(claim, held=first.mint.address)
    assert second.mint is None
    claim = stored(claim, second)
    assert claim["status"]["phase"] == CLAIM_PHASE_BOUND
    assert claim["status"]["address"] == REQUESTED
    third = run(claim, held=REQUESTED)
    assert third.mint is None
    assert third.status_patch(claim["status"], NOW) == []
    assert third.ready


def test_status_attachment_is_never_written() -> None:
    claim = make_claim(user=("db-public", "ea-uid-1"))
    for plan in (run(claim, held=REQUESTED), run(claim), run(claim, taken=frozenset({REQUESTED}))):
        assert "attachment" not in plan.status
        assert all("/status/attachment" not in op["path"] for op in plan.status_patch(claim["status"], NOW))
        assert stored(claim, plan)["status"]["attachment"] == claim["status"]["attachment"]


def test_generation_is_observed() -> None:
    claim = fresh_claim(REQUESTED)
    claim["metadata"]["generation"] = 3
    plan = run(claim, held=REQUESTED)
    assert plan.generation == 3
    assert stored(claim, plan)["status"]["observedGeneration"] == 3


# --- a simulated glue: mint (with 409s), store status, until a pass is quiet ----------------------


def settle(claim: Obj, allocations: dict[str, str], uid: str = CLAIM_UID) -> Obj:
    """Apply plans like the glue: ``allocations`` maps address -> holder UID and is updated in place."""
    for _ in range(20):
        held = next((address for address, holder in allocations.items() if holder == uid), None)
        plan = run(claim, held=held, taken=frozenset(allocations))
        patch = plan.status_patch(claim.get("status") or None, NOW)
        claim = stored(claim, plan)
        if plan.mint is not None:
            allocations.setdefault(plan.mint.address, uid)  # a 409 leaves the other holder's lock
        elif not patch:
            return claim
    raise AssertionError("the claim never settled")


def test_fresh_claim_settles_bound() -> None:
    allocations: dict[str, str] = {}
    claim = settle(fresh_claim(), allocations)
    assert claim["status"]["phase"] == CLAIM_PHASE_BOUND
    assert allocations == {claim["status"]["address"]: CLAIM_UID}


def test_lost_then_recovered() -> None:
    allocations = {REQUESTED: "someone-else"}
    claim = settle(bound_claim(), allocations)
    assert claim["status"] == {
        "phase": CLAIM_PHASE_LOST,
        "address": REQUESTED,
        "observedGeneration": 0,
        "conditions": claim["status"]["conditions"],
    }
    del allocations[REQUESTED]
    claim = settle(claim, allocations)
    assert claim["status"]["phase"] == CLAIM_PHASE_BOUND
    assert allocations == {REQUESTED: CLAIM_UID}


# --- deletion ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("claim", "held_allocation", "reason", "release", "remove"),
    [
        pytest.param(
            make_claim(user=("db-public", "ea-uid-1"), deleting=True),
            REQUESTED,
            REASON_IN_USE,
            None,
            False,
            id="used: held",
        ),
        pytest.param(
            make_claim(deleting=True) | {"status": {"attachment": {"uid": "ea-uid-1"}}},
            REQUESTED,
            REASON_IN_USE,
            None,
            False,
            id="used, uid only: held",
        ),
        pytest.param(
            make_claim(deleting=True),
            REQUESTED,
            REASON_RELEASING,
            REQUESTED,
            False,
            id="free: release first",
        ),
        pytest.param(make_claim(deleting=True), None, None, None, True, id="released: finalizer goes"),
    ],
)
def test_finalize(
    claim: Obj, held_allocation: str | None, reason: str | None, release: str | None, remove: bool
) -> None:
    plan = finalize_claim(claim, held_allocation)
    assert plan.release_allocation == release
    assert plan.remove_finalizer is remove
    assert plan.mint is None
    if reason is None:
        assert plan.conditions == ()
        assert plan.status_patch(claim["status"], NOW) == []
    else:
        assert [(c.type, c.status, c.reason) for c in plan.conditions] == [(COND_READY, FALSE, reason)]
        assert plan.status == {}


def test_finalize_in_use_names_the_attachment() -> None:
    plan = finalize_claim(make_claim(user=("db-public", "ea-uid-1"), deleting=True), REQUESTED)
    assert "db-public" in message(plan, COND_READY)


def test_reconcile_of_a_deleting_claim_finalizes() -> None:
    used = make_claim(user=("db-public", "ea-uid-1"), deleting=True)
    assert run(used, held=REQUESTED) == finalize_claim(used, REQUESTED)
    free = make_claim(deleting=True)
    assert run(free, held=REQUESTED).release_allocation == REQUESTED
    assert run(free).remove_finalizer


def test_finalize_sequence_hold_release_remove() -> None:
    claim = make_claim(user=("db-public", "ea-uid-1"), deleting=True)
    allocations = {REQUESTED: CLAIM_UID}
    steps: list[str] = []
    for _ in range(5):
        held = next((a for a, holder in allocations.items() if holder == CLAIM_UID), None)
        plan = run(claim, held=held)
        if plan.remove_finalizer:
            steps.append("remove")
            break
        if plan.release_allocation:
            steps.append("release")
            del allocations[plan.release_allocation]
        else:
            steps.append("hold")
            claim["status"].pop("attachment")  # the attachment's finalizer releases its use
    assert steps == ["hold", "release", "remove"]
    assert allocations == {}


# --- properties -------------------------------------------------------------------------------------

SMALL_POOL = [f"203.0.113.{i}" for i in range(1, 7)]  # 203.0.113.0/29 minus network and broadcast


@given(
    taken=st.frozensets(st.sampled_from(SMALL_POOL)),
    requested=st.none() | st.sampled_from([*SMALL_POOL, "203.0.113.0", "198.51.100.1"]),
    uid=st.text(min_size=1, max_size=12),
)
def test_a_mint_is_always_a_free_candidate_of_the_class(
    taken: frozenset[str], requested: str | None, uid: str
) -> None:
    claim = fresh_claim(requested)
    claim["metadata"]["uid"] = uid
    plan = run(claim, address_class=make_class(cidrs=["203.0.113.0/29"]), taken=taken)
    mintable = requested in SMALL_POOL and requested not in taken
    if requested is None:
        mintable = not set(SMALL_POOL) <= taken
    assert (plan.mint is not None) is mintable
    if plan.mint is None:
        assert condition(plan, COND_ADDRESS_BOUND)[0] == FALSE
        return
    assert plan.mint.address in SMALL_POOL
    assert plan.mint.address not in taken
    assert requested is None or plan.mint.address == requested
