"""Events of attachments through the glue: a transition records its Event once, a steady state
none, and a repeat within the window patches the first Event's series (the shared recorder over the
pass's own writer, into the in-memory API)."""

from __future__ import annotations

import copy
import itertools
from datetime import datetime, timedelta

from harness.memapi import MemApi
from operators.endpointattachment import controller
from operators.endpointattachment.api import ADDRESSES, CLAIM_ANNOTATION, CLAIMS
from operators.endpointattachment.reasons import REASON_CLAIM_IN_USE
from operators.endpointattachment.world import World
from shared.events import Recorder
from shared.resources import SERVICES
from shared.runtime.cache import Obj, key_of
from shared.runtime.controller import StaticCaches, decide
from tests.ea_builders import (
    ADDRESS,
    CREATED,
    ENDPOINT,
    NAMESPACE,
    make_attachment,
    make_claim,
    make_class,
    make_helmrelease,
    make_ip_address,
    make_service,
)
from tests.ea_caches import RecordingWriter, caches_of, put

KEY = (NAMESPACE, "db-public")


# --- through the glue ----------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class EventLog:
    """The Event writes the API was sent (the recorder writes through the pass's own writer), as
    (create | patch, reason), since the last look."""

    def __init__(self, api: MemApi) -> None:
        self.api, self.looked = api, 0

    def taken(self) -> list[tuple[str, str]]:
        """The Event writes since the last look."""
        sent = [r for r in self.api.requests if r.target.plural == "events" and r.verb in ("create", "patch")]
        reasons = {r.name: r.body["reason"] for r in sent if r.verb == "create"}
        found = [(r.verb, reasons[r.name] if r.verb == "patch" else r.body["reason"]) for r in sent]
        found, self.looked = found[self.looked :], len(found)
        return found


def running() -> tuple[controller.AttachmentReconciler, EventLog, StaticCaches, Clock]:
    caches = caches_of(
        put("service", make_service()),
        put("helmrelease", make_helmrelease()),
        put("class", make_class()),
        put("attachment", make_attachment()),
    )
    writer, clock = RecordingWriter(caches), Clock()
    ticks = itertools.count()

    def wall_clock() -> datetime:  # a millisecond further at each reading: each Event its own name
        return datetime.fromisoformat(CREATED) + timedelta(milliseconds=next(ticks))

    reconciler = controller.AttachmentReconciler(
        World(caches),
        writer,
        clock,
        wall_clock=lambda: datetime.fromisoformat(CREATED),
        recorder=Recorder(writer, "cozystack.io/test", "pod-0", clock=clock, wall_clock=wall_clock),
    )
    return reconciler, EventLog(writer.api), caches, clock


def bind(caches: StaticCaches) -> None:
    claims = caches.store(CLAIMS)
    mine = next(c for c in claims.values() if c["metadata"]["namespace"] == NAMESPACE)
    bound = copy.deepcopy(mine)
    bound["status"] = make_claim(addresses=(ADDRESS,))["status"]
    claims.upsert(bound)


def ours(caches: StaticCaches) -> Obj | None:
    return next(
        (s for s in caches.store(SERVICES).values() if s["metadata"]["name"].startswith("db-public-")), None
    )


def announce(caches: StaticCaches) -> None:
    service = copy.deepcopy(ours(caches) or {})
    service["status"] = {"loadBalancer": {"ingress": [{"ip": ADDRESS}]}}
    caches.store(SERVICES).upsert(service)


async def settle(reconciler: controller.AttachmentReconciler, caches: StaticCaches, clock: Clock) -> None:
    """Passes until the attachment is Provisioned again (the load balancer answering each Service)."""
    for _ in range(4):
        await decide(reconciler, KEY)
        if ours(caches) is not None:
            announce(caches)
        clock.now += 1.5


async def test_a_transition_records_its_event_once_and_a_steady_state_none() -> None:
    reconciler, sink, caches, clock = running()
    await decide(reconciler, KEY)
    assert sink.taken() == [("create", "ClaimMinted")]
    bind(caches)
    await decide(reconciler, KEY)
    assert sink.taken() == [("create", "Rendered")]
    announce(caches)
    clock.now += 0.1
    await decide(reconciler, KEY)
    assert sink.taken() == [("create", "Provisioned")]
    for _ in range(3):
        clock.now += 1
        await decide(reconciler, KEY)
    assert sink.taken() == [], "a steady state records nothing"


async def test_a_withdrawn_service_records_withdrawn_once() -> None:
    reconciler, sink, caches, clock = running()
    await decide(reconciler, KEY)
    bind(caches)
    await settle(reconciler, caches, clock)
    sink.taken()
    caches.store(SERVICES).delete((NAMESPACE, ENDPOINT))  # the endpoint goes away
    await decide(reconciler, KEY)
    assert sink.taken() == [("create", "Withdrawn")], "EndpointDetached itself is no Event"
    await decide(reconciler, KEY)
    assert sink.taken() == []


async def test_a_repeat_within_the_window_patches_the_series() -> None:
    """A rival Service wearing the claim comes and goes three times: ClaimInUse, with the same note,
    is one Event whose series counts 3."""
    reconciler, sink, caches, clock = running()
    await decide(reconciler, KEY)
    claim = next(iter(caches.store(CLAIMS).values()))["metadata"]["name"]
    bind(caches)
    await settle(reconciler, caches, clock)
    sink.taken()
    rival = make_service("rival", annotations={CLAIM_ANNOTATION: claim})
    taken = make_ip_address(claim=(NAMESPACE, claim), associated_to=(NAMESPACE, "rival"))
    for _ in range(3):
        caches.store(SERVICES).upsert(rival)
        caches.store(ADDRESSES).upsert(taken)
        await settle(reconciler, caches, clock)
        caches.store(SERVICES).delete((NAMESPACE, "rival"))
        caches.store(ADDRESSES).delete(key_of(taken))
        await settle(reconciler, caches, clock)
    in_use = [verb for verb, reason in sink.taken() if reason == REASON_CLAIM_IN_USE]
    assert in_use == ["create", "patch", "patch"]
