"""Failures as conditions: the pure decisions (refusals, the announce deadline, class status, a claim's
moved ``spec.address``, the not-ready gauge) as tables, one row per invariant, and the glue's handling
of the API's refusals with a writer that answers as the API would."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from opentelemetry.trace import NoOpTracerProvider
from prometheus_client import CollectorRegistry

from operators.endpointattachment import controller
from operators.endpointattachment.claims import reconcile_claim
from operators.endpointattachment.constants import (
    COND_READY,
    REASON_ADDRESS_MISMATCH,
    REASON_ADDRESS_NOT_ANNOUNCED,
    REASON_ADDRESS_PENDING,
    REASON_AVAILABLE,
    REASON_CLASS_INVALID,
    REASON_NAMESPACE_TERMINATING,
    REASON_POOL_EMPTY,
    REASON_POOL_EXHAUSTED,
    REASON_PUBLISHED,
    REASON_SERVICE_NAME_CONFLICT,
    REASON_SERVICE_QUOTA_EXCEEDED,
    REASON_SERVICE_REFUSED,
)
from operators.endpointattachment.controller import ATTACHMENT_CONTROLLER
from operators.endpointattachment.metrics import NOT_READY_SINCE_METRIC, WorldCollector, not_ready_since
from operators.endpointattachment.reconcile import (
    Observed,
    PassContext,
    Plan,
    ServiceAction,
    ServiceRefusal,
    reconcile,
    refusal_of,
)
from operators.endpointattachment.render import service_name
from operators.endpointattachment.repair import class_status
from operators.endpointattachment.world import World
from shared.conditions import FALSE, TRUE, Condition
from shared.kube import ApiError
from shared.ownership import owner_reference
from shared.resources import SERVICES, Resource
from shared.runtime.cache import Key, Obj, key_of
from shared.runtime.controller import Controller, Result, StaticCaches
from shared.runtime.metrics import ControllerMetrics, QueueMetrics
from shared.telemetry.tracing import Tracing
from tests.ea_builders import (
    NAMESPACE,
    make_allocation,
    make_attachment,
    make_claim,
    make_class,
    make_endpointslice,
    make_helmrelease,
    make_namespace_labels,
    make_service,
    make_serviceproxy,
)
from tests.ea_caches import KINDS, caches_of, put

ADDRESS = "203.0.113.10"
T0 = datetime(2024, 2, 1, tzinfo=UTC)
CREATED = "2024-02-01T00:00:00Z"  # the rendered Service's creation, T0
NOW = "2024-02-01T00:10:00Z"
KA: Key = (NAMESPACE, "db-public")
UNSERVED = "example.com/nobody"


def observe(**changes: Any) -> Observed:
    """Everything resolved and minted, no Service yet."""
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


def ready(plan: Plan) -> Condition:
    return next(c for c in plan.conditions if c.type == COND_READY)


def stored(plan: Plan, *, ingress: str | None = None, created: str = CREATED, **metadata: Any) -> Obj:
    """The plan's Service as the API stores it: created at ``created``, with ``ingress`` announced."""
    assert plan.service is not None
    service = copy.deepcopy(dict(plan.service))
    service["metadata"].update(uid="svc-uid", creationTimestamp=created, **metadata)
    service["status"] = {"loadBalancer": {"ingress": [{"ip": ingress}] if ingress else []}}
    return service


def at(seconds: float, **changes: Any) -> PassContext:
    return PassContext(now=T0 + timedelta(seconds=seconds), **changes)


FIRST = reconcile(observe())
UNSERVED_FIRST = reconcile(observe(address_class=make_class(load_balancer_class=UNSERVED)))


# --- the API's answers: which are business outcomes ------------------------------------------------


@pytest.mark.parametrize(
    ("status", "message", "reason"),
    [
        pytest.param(
            422,
            'Service "ea-x" is invalid: spec.ipFamilies[0]: IPv6 not configured',
            REASON_SERVICE_REFUSED,
            id="422 validation",
        ),
        pytest.param(400, "bad request", REASON_SERVICE_REFUSED, id="400"),
        pytest.param(
            403, 'admission webhook "x" denied the request: no', REASON_SERVICE_REFUSED, id="403 webhook"
        ),
        pytest.param(
            403,
            "exceeded quota: lb, requested: services.loadbalancers=1",
            REASON_SERVICE_QUOTA_EXCEEDED,
            id="403 quota",
        ),
        pytest.param(
            403,
            "unable to create new content in namespace t because it is being terminated",
            REASON_NAMESPACE_TERMINATING,
            id="403 terminating",
        ),
        pytest.param(
            403,
            "cannot set blockOwnerDeletion in this case because cannot find RESTMapping for APIVersion"
            " local.sdn.cozystack.io/v1alpha1 Kind EndpointAttachment",
            None,
            id="403 owner kind not mapped yet: transient",
        ),
        pytest.param(409, "already exists", None, id="409: a conflict, not a refusal"),
        pytest.param(404, "namespaces t not found", None, id="404: transient"),
        pytest.param(429, "too many requests", None, id="429: throttled"),
        pytest.param(500, "etcd", None, id="500: server failure"),
    ],
)
def test_which_answers_are_refusals(status: int, message: str, reason: str | None) -> None:
    refusal = refusal_of(ServiceAction.CREATE, {}, status, message, T0)
    assert (refusal.reason if refusal else None) == reason
    if refusal is not None:
        assert refusal.message == message


# --- a refused Service is a condition, and the same request is not sent again ----------------------


def refused_create(status: int = 422, message: str = "IPv6 not configured") -> ServiceRefusal:
    refusal = refusal_of(ServiceAction.CREATE, FIRST.service or {}, status, message, T0)
    assert refusal is not None
    return refusal


@pytest.mark.parametrize(
    ("observed", "context", "action", "reason", "recheck"),
    [
        pytest.param(
            observe(),
            at(1, refusal=refused_create()),
            ServiceAction.NONE,
            REASON_SERVICE_REFUSED,
            None,
            id="refused: not sent again, no retry",
        ),
        pytest.param(
            observe(),
            at(10**6, refusal=refused_create()),
            ServiceAction.NONE,
            REASON_SERVICE_REFUSED,
            None,
            id="refused: not even much later",
        ),
        pytest.param(
            observe(
                endpoint=make_service(
                    ports=[{"name": "pg", "port": 6432, "targetPort": 6432, "protocol": "TCP"}]
                )
            ),
            at(1, refusal=refused_create()),
            ServiceAction.CREATE,
            REASON_ADDRESS_PENDING,
            None,
            id="its endpoint changed: a new request",
        ),
        pytest.param(
            observe(attachment=make_attachment(uid="another-incarnation")),
            at(1, refusal=refused_create()),
            ServiceAction.CREATE,
            REASON_ADDRESS_PENDING,
            None,
            id="another incarnation: a new request",
        ),
        pytest.param(
            observe(),
            at(1, refusal=refused_create(403, "because it is being terminated")),
            ServiceAction.NONE,
            REASON_NAMESPACE_TERMINATING,
            None,
            id="terminating namespace: never again",
        ),
        pytest.param(
            observe(),
            at(20, refusal=refused_create(403, "exceeded quota: q")),
            ServiceAction.NONE,
            REASON_SERVICE_QUOTA_EXCEEDED,
            40.0,
            id="quota: again at the retry",
        ),
        pytest.param(
            observe(),
            at(60, refusal=refused_create(403, "exceeded quota: q")),
            ServiceAction.CREATE,
            REASON_ADDRESS_PENDING,
            None,
            id="quota: the retry is due",
        ),
        pytest.param(
            observe(), None, ServiceAction.CREATE, REASON_ADDRESS_PENDING, None, id="no context: as before"
        ),
    ],
)
def test_a_refused_create(
    observed: Observed, context: PassContext | None, action: ServiceAction, reason: str, recheck: float | None
) -> None:
    plan = reconcile(observed, context)
    assert plan.service_action is action
    assert (ready(plan).status, ready(plan).reason) == (FALSE, reason)
    assert plan.recheck_after == recheck
    if action is ServiceAction.NONE:
        assert context is not None
        assert context.refusal is not None
        assert ready(plan).message == f"the API refused to create the Service: {context.refusal.message}"
        assert plan.status["serviceName"] is None, "never point the tenant at a Service that is not there"


def test_a_refused_change_keeps_the_service_and_says_why() -> None:
    service = stored(FIRST, ingress=ADDRESS)
    moved = observe(
        service=service,
        endpoint=make_service(ports=[{"name": "pg", "port": 6432, "targetPort": 6432, "protocol": "TCP"}]),
    )
    plan = reconcile(moved, at(1))
    assert plan.service_action is ServiceAction.PATCH
    assert plan.service_patch is not None
    refusal = refusal_of(ServiceAction.PATCH, plan.service_patch, 403, "denied by policy", T0)
    again = reconcile(moved, at(2, refusal=refusal))
    assert again.service_action is ServiceAction.NONE
    assert (ready(again).status, ready(again).reason) == (FALSE, REASON_SERVICE_REFUSED)
    assert ready(again).message == "the API refused to change the Service: denied by policy"
    assert again.status["serviceName"] == service_name("db-public")


def test_a_refusal_of_another_request_does_not_count() -> None:
    """A create refused before says nothing about a patch of the Service that exists now."""
    service = stored(FIRST, ingress=ADDRESS)
    plan = reconcile(observe(service=service), at(1, refusal=refused_create()))
    assert (ready(plan).status, ready(plan).reason) == (TRUE, REASON_PUBLISHED)


# --- the load balancer's silence, bounded ----------------------------------------------------------


@pytest.mark.parametrize(
    ("service", "context", "reason", "recheck"),
    [
        pytest.param(
            stored(UNSERVED_FIRST),
            at(10),
            REASON_ADDRESS_PENDING,
            50.0,
            id="within the wait: pending, look again at its end",
        ),
        pytest.param(
            stored(UNSERVED_FIRST), at(60), REASON_ADDRESS_NOT_ANNOUNCED, None, id="at the deadline: said"
        ),
        pytest.param(
            stored(UNSERVED_FIRST),
            at(3600),
            REASON_ADDRESS_NOT_ANNOUNCED,
            None,
            id="long after: the same words",
        ),
        pytest.param(
            stored(UNSERVED_FIRST),
            at(65, written_at=T0 + timedelta(seconds=30)),
            REASON_ADDRESS_PENDING,
            25.0,
            id="changed since: the wait starts again",
        ),
        pytest.param(
            stored(UNSERVED_FIRST),
            at(65, announce_timeout_seconds=5),
            REASON_ADDRESS_NOT_ANNOUNCED,
            None,
            id="the timeout is a setting",
        ),
        pytest.param(
            stored(UNSERVED_FIRST, ingress=ADDRESS),
            at(3600),
            REASON_PUBLISHED,
            None,
            id="answered late: published",
        ),
        pytest.param(
            stored(UNSERVED_FIRST, ingress="203.0.113.99"),
            at(3600),
            REASON_ADDRESS_NOT_ANNOUNCED,
            None,
            id="another address announced: not ours",
        ),
        pytest.param(
            stored(UNSERVED_FIRST, created="not a time"),
            at(3600),
            REASON_ADDRESS_PENDING,
            None,
            id="undatable: no deadline",
        ),
        pytest.param(
            stored(UNSERVED_FIRST, deletionTimestamp=NOW),
            at(3600),
            REASON_ADDRESS_PENDING,
            None,
            id="being deleted: pending",
        ),
        pytest.param(
            stored(UNSERVED_FIRST), None, REASON_ADDRESS_PENDING, None, id="no context: no clock, no deadline"
        ),
    ],
)
def test_the_announce_deadline(
    service: Obj, context: PassContext | None, reason: str, recheck: float | None
) -> None:
    plan = reconcile(
        observe(address_class=make_class(load_balancer_class=UNSERVED), service=service), context
    )
    assert ready(plan).reason == reason
    assert plan.recheck_after == recheck


def test_a_change_of_the_service_starts_the_wait_again() -> None:
    """The pass that patches the Service does not judge the load balancer on the old Service: it
    looks again a whole wait later (its own write wakes no one)."""
    old = stored(UNSERVED_FIRST)
    old["metadata"]["annotations"] = {}  # the address annotation lost: the pass patches it back
    plan = reconcile(observe(address_class=make_class(load_balancer_class=UNSERVED), service=old), at(3600))
    assert plan.service_action is ServiceAction.PATCH
    assert ready(plan).reason == REASON_ADDRESS_PENDING
    assert plan.recheck_after == 60.0


def test_not_announced_says_how_long_since_when_and_what_was_asked() -> None:
    plan = reconcile(
        observe(address_class=make_class(load_balancer_class=UNSERVED), service=stored(UNSERVED_FIRST)),
        at(61),
    )
    said = ready(plan).message
    assert "within 60s" in said
    assert CREATED in said
    assert ADDRESS in said
    assert UNSERVED in said
    default = reconcile(observe(service=stored(FIRST)), at(61))
    assert "the default load balancer (no class)" in ready(default).message


def test_a_foreign_service_is_a_name_conflict_whatever_the_time() -> None:
    squatter = make_service(service_name("db-public"), labels={}, uid="squatter")
    plan = reconcile(observe(service=squatter), at(3600))
    assert ready(plan).reason == REASON_SERVICE_NAME_CONFLICT
    assert plan.service_action is ServiceAction.NONE


# --- IPAddressClass status -------------------------------------------------------------------------


def allocations(count: int) -> list[Obj]:
    return [make_allocation(f"203.0.113.{n}", holder=None) for n in range(1, count + 1)]


@pytest.mark.parametrize(
    ("address_class", "allocated", "capacity", "status", "reason"),
    [
        pytest.param(make_class(cidrs=["203.0.113.0/30"]), 0, 2, TRUE, REASON_AVAILABLE, id="free"),
        pytest.param(make_class(cidrs=["203.0.113.0/30"]), 1, 2, TRUE, REASON_AVAILABLE, id="one left"),
        pytest.param(
            make_class(cidrs=["203.0.113.0/30"]), 2, 2, FALSE, REASON_POOL_EXHAUSTED, id="exhausted"
        ),
        pytest.param(
            make_class(cidrs=["203.0.113.0/31"], exclude=["203.0.113.0", "203.0.113.1"]),
            0,
            0,
            FALSE,
            REASON_POOL_EMPTY,
            id="everything excluded",
        ),
        pytest.param(make_class(cidrs=None), 0, 0, FALSE, REASON_POOL_EMPTY, id="no pool at all"),
        pytest.param(
            make_class(cidrs=["203.0.113.0/33"]), 0, None, FALSE, REASON_CLASS_INVALID, id="unreadable pool"
        ),
        pytest.param(make_class(provider="F5"), 0, None, FALSE, REASON_CLASS_INVALID, id="unknown provider"),
        pytest.param(
            make_class(cidrs=["2001:db8::/32"]), 0, 100, TRUE, REASON_AVAILABLE, id="huge: saturated"
        ),
    ],
)
def test_class_status(
    address_class: Obj, allocated: int, capacity: int | None, status: str, reason: str
) -> None:
    fields, conditions = class_status(address_class, allocations(allocated), 100)
    assert fields == {"capacity": capacity, "allocated": allocated}
    (condition,) = conditions
    assert (condition.type, condition.status, condition.reason) == (COND_READY, status, reason)
    assert condition.message


def test_an_invalid_class_says_why() -> None:
    _, (condition,) = class_status(make_class(provider="F5"), [], 100)
    assert "F5" in condition.message
    _, (condition,) = class_status(make_class(cidrs=None), [], 100)
    assert condition.message == "no address to hand out: it names no cidrs and no ranges"


# --- a claim whose spec.address moved after it bound -----------------------------------------------


@pytest.mark.parametrize(
    ("requested", "held", "reason"),
    [
        pytest.param(None, "203.0.113.20", "Reserved", id="no spec.address: the pool's choice"),
        pytest.param("203.0.113.20", "203.0.113.20", "Reserved", id="as asked"),
        pytest.param("203.0.113.21", "203.0.113.20", REASON_ADDRESS_MISMATCH, id="set after binding another"),
        pytest.param("2001:DB8::1", "2001:db8::1", "Reserved", id="another spelling of the same address"),
        pytest.param("not-an-ip", "203.0.113.20", REASON_ADDRESS_MISMATCH, id="unreadable"),
    ],
)
def test_a_claims_spec_address_against_the_held_one(requested: str | None, held: str, reason: str) -> None:
    claim = make_claim(address=None)
    if requested is not None:
        claim["spec"]["address"] = requested
    class_ = make_class(cidrs=["2001:db8::/120"]) if ":" in held else make_class()
    plan = reconcile_claim(claim, class_, held, frozenset({held}), make_namespace_labels())
    assert ready_of_claim(plan.conditions) == reason
    assert plan.status == {"phase": "Bound", "address": held}, "the claim keeps what it holds"
    assert plan.mint is None


def ready_of_claim(conditions: tuple[Condition, ...]) -> str:
    return next(c.reason for c in conditions if c.type == COND_READY)


# --- the not-ready gauge ---------------------------------------------------------------------------


def attachment_with(*conditions: Mapping[str, Any]) -> Obj:
    return {"metadata": {"name": "x"}, "status": {"conditions": list(conditions)}}


def ready_cond(status: str, reason: str, since: object) -> dict[str, Any]:
    return {"type": "Ready", "status": status, "reason": reason, "lastTransitionTime": since}


@pytest.mark.parametrize(
    ("attachments", "expected"),
    [
        pytest.param([], {}, id="none: no series"),
        pytest.param(
            [attachment_with(ready_cond("True", "Published", CREATED))], {}, id="ready: not counted"
        ),
        pytest.param(
            [
                attachment_with(ready_cond("False", "AddressNotAnnounced", "2024-02-01T00:10:00Z")),
                attachment_with(ready_cond("False", "AddressNotAnnounced", "2024-02-01T00:05:00Z")),
                attachment_with(ready_cond("False", "PoolExhausted", CREATED)),
            ],
            {"AddressNotAnnounced": (T0 + timedelta(minutes=5)).timestamp(), "PoolExhausted": T0.timestamp()},
            id="earliest per reason",
        ),
        pytest.param(
            [
                attachment_with(
                    {
                        "type": "AddressBound",
                        "status": "False",
                        "reason": "PoolExhausted",
                        "lastTransitionTime": CREATED,
                    }
                )
            ],
            {},
            id="only Ready counts",
        ),
        pytest.param([attachment_with(ready_cond("False", "X", "yesterday"))], {}, id="undatable: skipped"),
        pytest.param(
            [attachment_with(ready_cond("False", "X", "2024-02-01T00:00:00"))], {}, id="no zone: skipped"
        ),
    ],
)
def test_not_ready_since(attachments: list[Obj], expected: dict[str, float]) -> None:
    assert not_ready_since(attachments) == expected


def test_the_gauge_is_exported() -> None:
    world = World.empty()
    world.attachments.upsert(
        {**make_attachment(), "status": {"conditions": [ready_cond("False", "AddressNotAnnounced", CREATED)]}}
    )
    registry = CollectorRegistry()
    registry.register(WorldCollector(world))
    value = registry.get_sample_value(NOT_READY_SINCE_METRIC, {"reason": "AddressNotAnnounced"})
    assert value == T0.timestamp()


# --- the glue: the API's answers, applied ----------------------------------------------------------


class Api:
    """The writer's surface the attachment reconciler uses, answering as the API server would: each
    write goes into the caches (write-through); ``refuse`` makes the next Service create fail."""

    def __init__(self, caches: StaticCaches) -> None:
        self.caches = caches
        self.calls: list[tuple[str, str]] = []
        self.refuse: ApiError | None = None
        self.squatter: Obj | None = None
        self.kube = self

    def _store(self, resource: Resource, obj: Mapping[str, Any]) -> Obj:
        answer = copy.deepcopy(dict(obj))
        metadata = answer.setdefault("metadata", {})
        metadata.setdefault("uid", f"uid-{metadata.get('name')}")
        metadata.setdefault("creationTimestamp", CREATED)
        self.caches.store(resource).upsert(answer)
        return answer

    def remember(self, resource: Resource, obj: Obj | None) -> Obj | None:
        if obj:
            self.caches.store(resource).upsert(obj)
        return obj

    async def get(self, path: str) -> Obj | None:
        self.calls.append(("get", path))
        return self.squatter

    async def create(self, resource: Resource, body: Mapping[str, Any]) -> Obj:
        self.calls.append(("create", resource.plural))
        if resource == SERVICES and self.refuse is not None:
            raise self.refuse
        return self._store(resource, body)

    async def patch(self, resource: Resource, obj: Mapping[str, Any], patch: Any, kind: str = "merge") -> Obj:
        self.calls.append(("patch", resource.plural))
        return self._store(resource, obj)

    async def delete(self, resource: Resource, obj: Mapping[str, Any], *, forget: bool = False) -> bool:
        self.calls.append(("delete", resource.plural))
        if forget:
            self.caches.store(resource).delete(key_of(obj))
        return True

    async def patch_status(self, resource: Resource, obj: Mapping[str, Any], ops: list[Any]) -> Obj | None:
        if not ops:
            return None
        self.calls.append(("status", resource.plural))
        import jsonpatch

        patched = jsonpatch.apply_patch(copy.deepcopy(dict(obj)), ops)
        return self._store(resource, patched)

    async def ensure_metadata(self, resource: Resource, obj: Obj, **_: Any) -> Obj:
        return obj

    async def remove_finalizer(self, resource: Resource, obj: Obj, finalizer: str) -> Obj | None:
        self.calls.append(("unfinalize", resource.plural))
        return obj


def glue(refuse: ApiError | None = None) -> tuple[controller.AttachmentReconciler, Api, StaticCaches]:
    caches = caches_of(
        put("service", make_service()),
        put("helmrelease", make_helmrelease()),
        put("class", make_class()),
        put("namespace", {"metadata": {"name": NAMESPACE, "labels": make_namespace_labels()}}),
        put("attachment", make_attachment()),
        put(
            "allocation",
            make_allocation(
                ADDRESS,
                holder=("EndpointAttachment", NAMESPACE, "db-public", make_attachment()["metadata"]["uid"]),
            ),
        ),
    )
    api = Api(caches)
    api.refuse = refuse
    reconciler = controller.AttachmentReconciler(
        World(caches),
        api,  # type: ignore[arg-type]
        wall_clock=lambda: T0,
    )
    return reconciler, api, caches


def ready_stored(caches: StaticCaches) -> tuple[str, str, str]:
    attachment = caches.store(KINDS["attachment"]).get(KA) or {}
    found = next(c for c in attachment["status"]["conditions"] if c["type"] == COND_READY)
    return found["status"], found["reason"], found["message"]


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        pytest.param(
            ApiError(422, "Invalid", "spec.ipFamilies: IPv6 not configured"), REASON_SERVICE_REFUSED, id="422"
        ),
        pytest.param(
            ApiError(403, "Forbidden", "exceeded quota: q"), REASON_SERVICE_QUOTA_EXCEEDED, id="403 quota"
        ),
        pytest.param(
            ApiError(403, "Forbidden", "ns t because it is being terminated"),
            REASON_NAMESPACE_TERMINATING,
            id="403 terminating",
        ),
    ],
)
async def test_a_refused_create_is_reported_in_the_same_pass_and_not_sent_again(
    error: ApiError, reason: str
) -> None:
    reconciler, api, caches = glue(refuse=error)
    result = await reconciler.reconcile(KA)
    assert api.calls == [("create", "services"), ("status", "endpointattachments")]
    status, stored_reason, message = ready_stored(caches)
    assert (status, stored_reason) == (FALSE, reason)
    assert error.message in message
    quota = reason == REASON_SERVICE_QUOTA_EXCEEDED
    assert result == (Result(requeue_after=reconciler.quota_retry) if quota else Result())

    api.calls.clear()
    assert await reconciler.reconcile(KA) == result
    assert api.calls == [], "the same request is not sent again, and nothing changed"


async def test_a_transient_error_is_raised_for_the_runtime_to_retry() -> None:
    reconciler, _, _ = glue(refuse=ApiError(503, "ServiceUnavailable", "etcd"))
    with pytest.raises(ApiError):
        await reconciler.reconcile(KA)


async def test_a_squatter_that_wins_the_race_is_read_and_reported_in_the_same_pass() -> None:
    reconciler, api, caches = glue(refuse=ApiError(409, "AlreadyExists", "exists"))
    api.squatter = make_service(service_name("db-public"), labels={}, uid="squatter")
    assert await reconciler.reconcile(KA) == Result()
    read = ("get", SERVICES.path(NAMESPACE, service_name("db-public")))
    assert api.calls[:2] == [("create", "services"), read]
    assert ready_stored(caches)[1] == REASON_SERVICE_NAME_CONFLICT
    assert caches.store(SERVICES).get((NAMESPACE, service_name("db-public"))) == api.squatter


# --- what wakes an attachment: its Service's status ------------------------------------------------


class Idle:
    async def reconcile(self, key: Key) -> Result:
        raise AssertionError("not called")


def test_a_status_change_of_the_rendered_service_wakes_its_attachment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    attachment = make_attachment()
    service = make_service(
        service_name("db-public"),
        labels={},
        owner_references=[owner_reference(attachment, controller=True, block_owner_deletion=True)],
    )
    answered = {**service, "status": {"loadBalancer": {"ingress": [{"ip": ADDRESS}]}}}
    caches = caches_of(put("attachment", attachment), put("service", answered))
    registry = CollectorRegistry()
    running = Controller(
        ATTACHMENT_CONTROLLER,
        Idle(),
        caches,
        metrics=ControllerMetrics(registry),
        queue_metrics=QueueMetrics(registry),
        tracing=Tracing(NoOpTracerProvider(), "test"),
    )
    keys: set[Key] = set()
    monkeypatch.setattr(running, "enqueue", keys.add)
    for resource, handler in running.handlers():
        if resource == SERVICES:
            handler(service, answered)
    assert KA in keys
