"""The hand-over hold (``reconcile`` module docstring): a freshly Bound claim's Service waits while a burst of
other claims of its class is being provisioned, and is woken when the burst has passed. One table per
invariant: which claims are being provisioned and since when a claim is Bound (pure), the hold in a pass
and each reason it does not hold, the count a pass observes (``World``), who the end of a burst wakes
(the map function, its predicate and the declared wiring), the glue's pass, and the setting."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from operators.endpointattachment import controller
from operators.endpointattachment.api import ATTACHMENTS, CLAIMS, PHASE_PENDING
from operators.endpointattachment.controller import ATTACHMENT_CONTROLLER
from operators.endpointattachment.reasons import (
    CONDITION_PROVISIONED,
    REASON_CLAIM_PENDING,
    REASON_PROVISIONED,
    REASON_WAITING_FOR_ADDRESS,
)
from operators.endpointattachment.reconcile import (
    HANDOVER_HOLD_MIN_PROVISIONING,
    HANDOVER_HOLD_SECONDS,
    Observed,
    PassContext,
    Plan,
    ServiceAction,
    bound_since,
    provisioning_class,
    reconcile,
)
from operators.endpointattachment.settings import parse
from operators.endpointattachment.world import World
from shared.conditions import FALSE, TRUE
from shared.resources import SERVICES
from shared.runtime.cache import Key, Obj, key_of
from shared.runtime.controller import StaticCaches, decide
from tests.ea_builders import (
    CLAIM,
    CLASS,
    CREATED,
    NAMESPACE,
    controlled_by,
    make_attachment,
    make_claim,
    make_class,
    make_helmrelease,
    make_service,
)
from tests.ea_caches import RecordingWriter, Step, caches_of, drop, enqueued, put, world_of
from tests.unit.endpointattachment.test_ea_reconcile import assert_quiet, attached, observe, settle

NS, OTHER_NS = NAMESPACE, "tenant-b"
T0 = datetime.fromisoformat(CREATED)  # when the fresh claims below turned Bound


def bound_condition(at: Any = CREATED, status: str = "True") -> dict[str, Any]:
    """The substrate's ``Bound`` condition (``at=None``: without a lastTransitionTime)."""
    condition = {"type": "Bound", "status": status, "reason": "Bound", "message": "bound"}
    if at is not None:
        condition["lastTransitionTime"] = at
    return condition


def fresh(name: str = CLAIM, namespace: str = NS, **changes: Any) -> Obj:
    """A claim Bound at T0 (its Bound condition says so)."""
    changes.setdefault("conditions", [bound_condition()])
    return make_claim(name, namespace, **changes)


def provisioning(name: str, namespace: str = NS, class_name: str = CLASS, **changes: Any) -> Obj:
    """A claim of ``class_name`` the substrate is provisioning (Pending, its class resolved)."""
    changes.setdefault("phase", "Pending")
    return make_claim(
        name, namespace, class_name=class_name, status_class=class_name, addresses=(), **changes
    )


def condition(plan: Plan) -> tuple[str, str]:
    assert plan.provisioned is not None
    return plan.provisioned.status, plan.provisioned.reason


# --- provisioning_class and bound_since: pure --------------------------------------------------------


@pytest.mark.parametrize(
    ("claim", "expected"),
    [
        pytest.param(make_claim(phase="Pending"), CLASS, id="Pending, class resolved"),
        pytest.param(
            make_claim(phase="Pending", class_name="asked", status_class="resolved"),
            "resolved",
            id="the resolved class before the one asked for",
        ),
        pytest.param(make_claim(phase=None), CLASS, id="not yet reconciled: the class asked for"),
        pytest.param(make_claim(phase="Pending", class_name=None), CLASS, id="the default class, resolved"),
        pytest.param(make_claim(phase=None, class_name=None), None, id="the default class, not resolved"),
        pytest.param(make_claim(), None, id="Bound"),
        pytest.param(make_claim(phase="Lost"), None, id="Lost"),
        pytest.param(make_claim(phase="Pending", deleting=True), None, id="being deleted"),
        pytest.param(make_claim(phase=None, deleting=True), None, id="being deleted, not reconciled"),
        pytest.param({"metadata": {"name": "x"}}, None, id="no spec, no status"),
    ],
)
def test_provisioning_class(claim: Obj, expected: str | None) -> None:
    assert provisioning_class(claim) == expected


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        pytest.param([bound_condition()], T0, id="Bound True: its lastTransitionTime"),
        pytest.param(
            [bound_condition("2024-01-01T02:00:05+02:00")],
            datetime(2024, 1, 1, 0, 0, 5, tzinfo=UTC),
            id="an offset",
        ),
        pytest.param(
            [bound_condition("2024-01-01T00:00:05.250000Z")],
            T0 + timedelta(seconds=5.25),
            id="fractional seconds",
        ),
        pytest.param(
            [
                {"type": "Ready", "status": "True", "lastTransitionTime": "2023-01-01T00:00:00Z"},
                bound_condition(),
            ],
            T0,
            id="the Bound condition among others",
        ),
        pytest.param(["x", None, bound_condition()], T0, id="malformed entries are skipped"),
        pytest.param([], None, id="no condition"),
        pytest.param([bound_condition(status="False")], None, id="Bound False"),
        pytest.param([bound_condition(status="Unknown")], None, id="Bound Unknown"),
        pytest.param([{**bound_condition(), "type": "Ready"}], None, id="another type"),
        pytest.param([bound_condition(None)], None, id="no lastTransitionTime"),
        pytest.param([bound_condition("yesterday")], None, id="not a time"),
        pytest.param([bound_condition(1704067200)], None, id="a number"),
        pytest.param([bound_condition("2024-01-01T00:00:00")], None, id="no timezone"),
    ],
)
def test_bound_since(conditions: list[Any], expected: datetime | None) -> None:
    claim = make_claim()
    claim["status"]["conditions"] = conditions  # as stored, malformed entries too
    since = bound_since(claim)
    assert since == expected
    if since is not None:
        assert since.tzinfo is not None


def test_bound_since_of_a_claim_without_status() -> None:
    assert bound_since({"metadata": {"name": "x"}}) is None
    assert bound_since({"metadata": {"name": "x"}, "status": None}) is None


# --- the hold in a pass ------------------------------------------------------------------------------


def burst(provisioning: int = 2, claim: Obj | None = None) -> Observed:
    """The default world whose minted claim was Bound at T0, with ``provisioning`` other claims of
    its class being provisioned; no Service yet."""
    attachment = make_attachment()
    return observe(
        attachment=attachment,
        claim=claim if claim is not None else fresh(owner=attachment),
        provisioning=provisioning,
    )


def at(seconds: float, hold: float = HANDOVER_HOLD_SECONDS) -> PassContext:
    """A pass ``seconds`` after the claim turned Bound, with a hold of ``hold`` seconds."""
    return PassContext(now=T0 + timedelta(seconds=seconds), handover_hold_seconds=hold)


def test_the_minimum_is_a_burst() -> None:
    assert HANDOVER_HOLD_MIN_PROVISIONING == 2, "one other claim is a trickle (module docstring)"


def test_a_fresh_claim_s_service_waits_for_the_burst() -> None:
    observed = burst(3)
    plan = reconcile(observed, at(3))
    assert condition(plan) == (FALSE, REASON_WAITING_FOR_ADDRESS)
    assert (plan.service_action, plan.service, plan.service_patch) == (ServiceAction.NONE, None, None)
    assert (plan.mint, plan.delete_claims) == (None, ())
    assert plan.status["phase"] == PHASE_PENDING
    assert plan.status["serviceName"] is None
    assert plan.status["claimName"] == CLAIM
    said = plan.provisioned.message if plan.provisioned is not None else ""
    for words in (f"claim {CLAIM}", "3 other claim(s)", f"class {CLASS}", "at most 8s"):
        assert words in said


def test_a_held_pass_over_an_unchanged_world_plans_nothing() -> None:
    observed = burst()
    plan = reconcile(observed, at(1))
    settled = settle(observed, plan)
    assert_quiet(reconcile(settled, at(2)), settled)


@pytest.mark.parametrize(
    ("seconds", "hold", "left"),
    [
        pytest.param(0, HANDOVER_HOLD_SECONDS, 8.0, id="just Bound: the whole hold"),
        pytest.param(3, HANDOVER_HOLD_SECONDS, 5.0, id="3 s in"),
        pytest.param(7.75, HANDOVER_HOLD_SECONDS, 0.25, id="a quarter second left"),
        pytest.param(3, 20.0, 17.0, id="a longer hold"),
    ],
)
def test_the_hold_is_rechecked_when_it_runs_out(seconds: float, hold: float, left: float) -> None:
    plan = reconcile(burst(), at(seconds, hold))
    assert condition(plan) == (FALSE, REASON_WAITING_FOR_ADDRESS)
    assert plan.recheck_after == pytest.approx(left)


def test_the_message_names_the_hold_set() -> None:
    plan = reconcile(burst(), at(0, hold=2.5))
    assert plan.provisioned is not None
    assert "at most 2.5s" in plan.provisioned.message


@pytest.mark.parametrize(
    ("build", "context"),
    [
        pytest.param(lambda: burst(1), at(1), id="one other claim: a trickle"),
        pytest.param(lambda: burst(0), at(1), id="no other claim"),
        pytest.param(lambda: burst(), at(HANDOVER_HOLD_SECONDS), id="the hold ran out"),
        pytest.param(lambda: burst(), at(600), id="Bound long ago (a reserved claim moving)"),
        pytest.param(lambda: burst(), at(1, hold=0.0), id="the hold set to 0"),
        pytest.param(lambda: burst(), None, id="no context"),
        pytest.param(
            lambda: burst(claim=make_claim(owner=make_attachment())), at(1), id="no Bound condition"
        ),
        pytest.param(
            lambda: burst(claim=make_claim(owner=make_attachment(), conditions=[bound_condition(None)])),
            at(1),
            id="no Bound condition time",
        ),
        pytest.param(
            lambda: burst(
                claim=make_claim(owner=make_attachment(), conditions=[bound_condition(status="False")])
            ),
            at(1),
            id="the Bound condition not True",
        ),
    ],
)
def test_no_hold_creates_the_service(build: Any, context: PassContext | None) -> None:
    plan = reconcile(build(), context)
    assert plan.service_action is ServiceAction.CREATE
    assert plan.service is not None
    assert condition(plan) == (FALSE, REASON_WAITING_FOR_ADDRESS)  # the load balancer's answer, now
    assert plan.provisioned is not None
    assert "being provisioned" not in plan.provisioned.message


def test_a_service_of_ours_is_never_held() -> None:
    live = attached(burst())
    plan = reconcile(live, at(1))
    assert condition(plan) == (TRUE, REASON_PROVISIONED)
    assert plan.service_action is ServiceAction.NONE
    assert plan.status["serviceName"] == live.services[0]["metadata"]["name"]
    unannounced = reconcile(attached(burst(), ingress=()), at(1))
    assert unannounced.provisioned is not None
    assert "being provisioned" not in unannounced.provisioned.message
    assert unannounced.recheck_after == pytest.approx(59.0), "the announce deadline, not the hold"


def test_a_claim_not_bound_is_claim_pending_not_held() -> None:
    pending = make_claim(owner=make_attachment(), phase="Pending", addresses=())
    plan = reconcile(burst(5, claim=pending), at(1))
    assert condition(plan) == (FALSE, REASON_CLAIM_PENDING)


# --- World: the claims being provisioned, and the count a pass observes ------------------------------

A = make_attachment(uid="ea-a")
KA = (NS, "db-public")
MINTED = fresh(owner=A)
P1 = provisioning("p1")
P2 = make_claim("p2", OTHER_NS, phase=None)  # not yet reconciled: its class asked for
P3 = provisioning("p3", class_name="private")
LOST = provisioning("lost", phase="Lost")
DELETING = provisioning("deleting", deleting=True)
BOUND = fresh("bound")
CLAIMS_OF_PUBLIC = [put("claim", c) for c in (MINTED, P1, P2, P3, LOST, DELETING, BOUND)]
P1_BOUND = fresh("p1")


@pytest.mark.parametrize(
    ("steps", "probe", "expected"),
    [
        (CLAIMS_OF_PUBLIC, lambda w: w.provisioning(CLASS), {key_of(P1), key_of(P2)}),
        (CLAIMS_OF_PUBLIC, lambda w: w.provisioning("private"), {key_of(P3)}),
        (CLAIMS_OF_PUBLIC, lambda w: w.provisioning("unused"), set()),
        ([*CLAIMS_OF_PUBLIC, put("claim", P1_BOUND)], lambda w: w.provisioning(CLASS), {key_of(P2)}),
        ([*CLAIMS_OF_PUBLIC, drop("claim", P2)], lambda w: w.provisioning(CLASS), {key_of(P1)}),
        # beside a Bound claim: the others of its class, in every namespace
        (CLAIMS_OF_PUBLIC, lambda w: w.provisioning_beside(MINTED), 2),
        (CLAIMS_OF_PUBLIC, lambda w: w.provisioning_beside(BOUND), 2),
        (
            CLAIMS_OF_PUBLIC,
            lambda w: w.provisioning_beside(fresh("x", class_name="private", status_class="private")),
            1,
        ),
        ([*CLAIMS_OF_PUBLIC, put("claim", P1_BOUND)], lambda w: w.provisioning_beside(MINTED), 1),
        # 0 for any claim but a Bound one with its class resolved
        (CLAIMS_OF_PUBLIC, lambda w: w.provisioning_beside(P1), 0),
        (CLAIMS_OF_PUBLIC, lambda w: w.provisioning_beside(LOST), 0),
        (CLAIMS_OF_PUBLIC, lambda w: w.provisioning_beside(fresh("x", status_class=None)), 0),
        (CLAIMS_OF_PUBLIC, lambda w: w.provisioning_beside(None), 0),
        ([], lambda w: w.provisioning_beside(MINTED), 0),
    ],
)
def test_provisioning_follows_upserts_and_deletes(steps: list[Step], probe: Any, expected: object) -> None:
    assert probe(world_of(*steps)) == expected


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param([put("claim", MINTED), put("claim", P1), put("claim", P2)], 2, id="two others"),
        pytest.param([put("claim", MINTED), put("claim", P1), put("claim", P3)], 1, id="one of its class"),
        pytest.param([put("claim", MINTED)], 0, id="none"),
        pytest.param(
            [
                put("claim", make_claim(owner=A, phase="Pending", addresses=())),
                put("claim", P1),
                put("claim", P2),
            ],
            0,
            id="its own claim not Bound",
        ),
    ],
)
def test_observed_provisioning(steps: list[Step], expected: int) -> None:
    observed = world_of(put("attachment", A), *steps).observe(KA)
    assert observed is not None
    assert observed.provisioning == expected


# --- who the end of a burst wakes ----------------------------------------------------------------------


def waiting_status(reason: str = REASON_WAITING_FOR_ADDRESS) -> dict[str, Any]:
    """A stored status whose Provisioned is False with ``reason``."""
    return {
        "phase": PHASE_PENDING,
        "conditions": [
            {"type": CONDITION_PROVISIONED, "status": FALSE, "reason": reason, "message": "m"},
        ],
    }


def held(name: str, namespace: str = NS, **changes: Any) -> Obj:
    """An attachment whose stored Provisioned is WaitingForAddress (a hold, or no Service yet)."""
    changes.setdefault("status", waiting_status())
    return make_attachment(name, namespace, uid=f"ea-{namespace}-{name}", **changes)


# HM minted its claim, HR references a reserved one, HT is HM's twin in another namespace: all three
# Bound in class public, held, no Service: woken. The others are not: WS has a Service of its own,
# CP's status is ClaimPending, PV is of class private, HP's claim is still being provisioned.
HM, HR, HT = held("hm"), held("hr", claim_name="reserved"), held("hm", OTHER_NS)
WS, CP = held("ws"), held("cp", status=waiting_status(REASON_CLAIM_PENDING))
PV, HP = held("pv", class_name="private"), held("hp")
KHM, KHR, KHT, KPV = key_of(HM), key_of(HR), key_of(HT), key_of(PV)
HM_CLAIM, HT_CLAIM = fresh("hm-abcde", owner=HM), fresh("hm-abcde", OTHER_NS, owner=HT)
RESERVED = fresh("reserved")
WS_CLAIM, CP_CLAIM = fresh("ws-abcde", owner=WS), fresh("cp-abcde", owner=CP)
PV_CLAIM = fresh("pv-abcde", owner=PV, class_name="private", status_class="private")
HP_CLAIM = provisioning("hp-abcde", owner=HP)
WS_SERVICE = make_service("ws-x7ktq", labels={}, owner_references=controlled_by(WS))
HELD_WORLD: list[Step] = [
    *[put("attachment", a) for a in (HM, HR, HT, WS, CP, PV, HP)],
    *[put("claim", c) for c in (HM_CLAIM, HT_CLAIM, RESERVED, WS_CLAIM, CP_CLAIM, PV_CLAIM, HP_CLAIM)],
    put("service", WS_SERVICE),
]
# The claim whose provisioning ended, as stored after the change, and the one more claim of the class
# still provisioning that makes it a burst (with HP's).
ENDED = fresh("ended")
STILL = provisioning("still", OTHER_NS)
PUBLIC_HELD = {KHM, KHR, KHT}


@pytest.mark.parametrize(
    ("steps", "claim", "expected"),
    [
        pytest.param([put("claim", ENDED)], ENDED, PUBLIC_HELD, id="one other still provisioning"),
        pytest.param(
            [put("claim", ENDED), put("claim", STILL)], ENDED, set(), id="two others: the burst goes on"
        ),
        pytest.param(
            [put("claim", ENDED), put("claim", HP_CLAIM | {"status": ENDED["status"]})],
            ENDED,
            {*PUBLIC_HELD, key_of(HP)},
            id="none left: HP's claim Bound too",
        ),
        pytest.param([], provisioning("ended"), PUBLIC_HELD, id="a deleted claim (its last version)"),
        pytest.param(
            [put("claim", make_claim("ended", phase="Lost", status_class=None))],
            make_claim("ended", phase="Lost", status_class=None),
            PUBLIC_HELD,
            id="the class asked for when none was resolved",
        ),
        pytest.param([], fresh("x", class_name="private", status_class="private"), {KPV}, id="class private"),
        pytest.param([], fresh("x", class_name="unused", status_class="unused"), set(), id="a class unused"),
        pytest.param([], make_claim("x", class_name=None, phase=None), set(), id="no class at all"),
    ],
)
def test_attachments_held_for_class(steps: list[Step], claim: Obj, expected: set[Key]) -> None:
    caches = caches_of(*HELD_WORLD, *steps)
    assert controller.attachments_held_for_class(World(caches), claim) == expected


def test_a_held_attachment_whose_claim_is_controlled_and_referenced_is_woken_once() -> None:
    both = held("both", claim_name="both-claim")
    caches = caches_of(put("attachment", both), put("claim", fresh("both-claim", owner=both)))
    assert controller.attachments_held_for_class(World(caches), fresh("ended")) == {key_of(both)}


PENDING = provisioning(CLAIM)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        pytest.param(PENDING, fresh(), True, id="Bound"),
        pytest.param(PENDING, provisioning(CLAIM, phase="Lost"), True, id="Lost"),
        pytest.param(PENDING, provisioning(CLAIM, deleting=True), True, id="being deleted"),
        pytest.param(PENDING, None, True, id="deleted while provisioned"),
        pytest.param(make_claim(phase=None), fresh(), True, id="Bound at its first reconcile"),
        pytest.param(
            PENDING,
            make_claim(phase="Pending", class_name=None, status_class=None),
            True,
            id="lost its class",
        ),
        pytest.param(None, PENDING, False, id="created"),
        pytest.param(None, fresh(), False, id="created Bound"),
        pytest.param(fresh(), None, False, id="a Bound claim deleted"),
        pytest.param(
            fresh(), fresh(conditions=[bound_condition("2024-01-01T00:00:09Z")]), False, id="Bound still"
        ),
        pytest.param(
            PENDING,
            provisioning(CLAIM, conditions=[bound_condition(status="False")]),
            False,
            id="still provisioning",
        ),
        pytest.param(
            PENDING, provisioning(CLAIM, class_name="private"), False, id="provisioning, another class"
        ),
        pytest.param(make_claim(phase=None, class_name=None), PENDING, False, id="starts provisioning"),
        pytest.param(fresh(), PENDING, False, id="Bound, then provisioned again"),
        pytest.param(provisioning(CLAIM, phase="Lost"), fresh(), False, id="Lost, then Bound"),
    ],
)
def test_provisioning_ended(old: Obj | None, new: Obj | None, expected: bool) -> None:
    assert controller.provisioning_ended(old, new) is expected


# --- through the wiring, as declared ------------------------------------------------------------------


def woken(steps: list[Step], old: Obj | None, new: Obj | None, monkeypatch: pytest.MonkeyPatch) -> set[Key]:
    """What the controller enqueues when a claim changes from ``old`` to ``new`` (stored first)."""
    caches = caches_of(*steps, *([put("claim", old)] if old is not None else []))
    return enqueued(caches, CLAIMS, old, new, monkeypatch)


def later(claim: Obj) -> Obj:
    return {**claim, "metadata": {**claim["metadata"], "resourceVersion": "2"}}


# The claim whose provisioning ends is HP's: HP is woken through owns, the held ones by the new watch.
@pytest.mark.parametrize(
    ("steps", "old", "new", "expected"),
    [
        pytest.param(
            HELD_WORLD,
            HP_CLAIM,
            later(fresh("hp-abcde", owner=HP)),
            {key_of(HP), *PUBLIC_HELD},
            id="the last one binds",
        ),
        pytest.param(
            [*HELD_WORLD, put("claim", STILL), put("claim", provisioning("third"))],
            HP_CLAIM,
            later(fresh("hp-abcde", owner=HP)),
            {key_of(HP)},
            id="a burst goes on: its own only",
        ),
        pytest.param(HELD_WORLD, HP_CLAIM, None, {key_of(HP), *PUBLIC_HELD}, id="deleted while provisioned"),
        pytest.param(HELD_WORLD, HM_CLAIM, later(HM_CLAIM), set(), id="a Bound claim's bookkeeping"),
        pytest.param(HELD_WORLD, None, provisioning("new"), set(), id="a claim created"),
    ],
)
def test_woken_through_the_wiring(
    steps: list[Step], old: Obj | None, new: Obj | None, expected: set[Key], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert woken(steps, old, new, monkeypatch) == expected


def test_the_hold_s_watch_is_declared() -> None:
    watches = [(w.resource, w.map, w.predicates) for w in ATTACHMENT_CONTROLLER.watches]
    assert (CLAIMS, controller.attachments_held_for_class, (controller.provisioning_ended,)) in watches


# --- the glue: a held pass, then the burst ends -------------------------------------------------------


def glue(
    hold: float = HANDOVER_HOLD_SECONDS,
) -> tuple[controller.AttachmentReconciler, RecordingWriter, StaticCaches]:
    """A's minted claim Bound 2 s ago while P1 and P2 are being provisioned; the glue's hold ``hold``."""
    caches = caches_of(
        put("service", make_service()),
        put("helmrelease", make_helmrelease()),
        put("class", make_class()),
        put("attachment", A),
        put("claim", MINTED),
        put("claim", P1),
        put("claim", P2),
    )
    writer = RecordingWriter(caches)
    running = controller.AttachmentReconciler(
        World(caches),
        writer,
        lambda: 100.0,
        wall_clock=lambda: T0 + timedelta(seconds=2),
        handover_hold=hold,
    )
    return running, writer, caches


async def test_a_held_pass_writes_its_status_then_the_end_of_the_burst_renders() -> None:
    running, writer, caches = glue()
    result = await decide(running, KA)
    assert result.requeue_after == pytest.approx(6.0), "the hold's re-check"
    assert not [c for c in writer.calls if c[1] == "services"], "no Service while the burst lasts"
    assert writer.calls[-1] == ("status", "endpointattachments", "db-public")
    stored = caches.store(ATTACHMENTS).get(KA) or {}
    found = next(c for c in stored["status"]["conditions"] if c["type"] == CONDITION_PROVISIONED)
    assert (found["status"], found["reason"]) == (FALSE, REASON_WAITING_FOR_ADDRESS)
    writer.calls.clear()
    assert (await decide(running, KA)).requeue_after == pytest.approx(6.0)
    assert writer.calls == [], "a second held pass writes nothing"
    # P1 binds: one other left, a trickle; the map function wakes A, and its pass renders.
    bound = later(fresh("p1"))
    caches.store(CLAIMS).upsert(bound)
    assert controller.provisioning_ended(P1, bound)
    assert controller.attachments_held_for_class(World(caches), bound) == {KA}
    await decide(running, KA)
    assert ("create", "services", "db-public-x7ktq") in writer.calls
    assert caches.store(SERVICES).get((NS, "db-public-x7ktq")) is not None


@pytest.mark.parametrize(
    ("hold", "created", "recheck"),
    [
        pytest.param(4.0, False, 2.0, id="a shorter hold: its rest"),
        pytest.param(2.0, True, None, id="the hold has run out"),
        pytest.param(0.0, True, None, id="0: never waits"),
    ],
)
async def test_the_glue_passes_its_hold_setting(hold: float, created: bool, recheck: float | None) -> None:
    running, writer, _ = glue(hold)
    result = await decide(running, KA)
    assert (("create", "services", "db-public-x7ktq") in writer.calls) is created
    if recheck is not None:
        assert result.requeue_after == pytest.approx(recheck)


# --- the setting ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        ([], {}, HANDOVER_HOLD_SECONDS),
        (["--handover-hold-seconds", "2.5"], {}, 2.5),
        ([], {"EA_HANDOVER_HOLD_SECONDS": "0"}, 0.0),
        (["--handover-hold-seconds", "3"], {"EA_HANDOVER_HOLD_SECONDS": "0"}, 3.0),  # the flag wins
    ],
)
def test_the_handover_hold_setting(
    argv: list[str], env: dict[str, str], expected: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert parse(argv).handover_hold_seconds == expected


def test_the_default_hold_is_the_pass_context_s() -> None:
    assert PassContext(now=T0).handover_hold_seconds == HANDOVER_HOLD_SECONDS == 8.0
