"""Failures as conditions: which API answers are refusals (``refusal_of``), the not-provisioned gauge,
and the glue's handling of the API's refusals of the rendered Service with a writer that answers as
the API would. One row per invariant; the pure decision of each reason is ``test_ea_reconcile``'s."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from operators.endpointattachment import controller
from operators.endpointattachment.api import ATTACHMENTS
from operators.endpointattachment.metrics import (
    ATTACHMENTS_METRIC,
    NOT_PROVISIONED_SINCE_METRIC,
    WorldCollector,
    not_provisioned_since,
)
from operators.endpointattachment.reasons import REASON_RENDER_FAILED
from operators.endpointattachment.reconcile import ServiceAction, refusal_of
from operators.endpointattachment.world import World
from shared.kube import ApiError
from shared.resources import SERVICES
from shared.runtime.cache import Key, Obj
from shared.runtime.controller import Result, StaticCaches, decide
from tests.ea_builders import (
    CREATED,
    NAMESPACE,
    make_attachment,
    make_claim,
    make_class,
    make_helmrelease,
    make_service,
)
from tests.ea_caches import RecordingWriter, caches_of, put

T0 = datetime.fromisoformat(CREATED)
KA: Key = (NAMESPACE, "db-public")


# --- the API's answers: which are business outcomes ------------------------------------------------


@pytest.mark.parametrize(
    ("status", "message", "refused", "quota"),
    [
        pytest.param(
            422,
            'Service "x" is invalid: spec.ipFamilies[0]: IPv6 not configured',
            True,
            False,
            id="422 validation",
        ),
        pytest.param(400, "bad request", True, False, id="400"),
        pytest.param(403, 'admission webhook "x" denied the request', True, False, id="403 webhook"),
        pytest.param(
            403, "exceeded quota: lb, requested: services.loadbalancers=1", True, True, id="403 quota"
        ),
        pytest.param(422, "exceeded quota: lb", True, False, id="quota words in a 422: no retry"),
        pytest.param(
            403,
            "unable to create new content in namespace t because it is being terminated",
            True,
            False,
            id="403 terminating",
        ),
        pytest.param(
            403,
            "cannot set blockOwnerDeletion in this case because cannot find RESTMapping for APIVersion"
            " local.sdn.cozystack.io/v1alpha1 Kind EndpointAttachment",
            False,
            False,
            id="403 owner kind not mapped yet: transient",
        ),
        pytest.param(409, "already exists", False, False, id="409: a conflict, not a refusal"),
        pytest.param(404, "namespaces t not found", False, False, id="404: transient"),
        pytest.param(429, "too many requests", False, False, id="429: throttled"),
        pytest.param(500, "etcd", False, False, id="500: server failure"),
    ],
)
def test_which_answers_are_refusals(status: int, message: str, refused: bool, quota: bool) -> None:
    body = {"spec": {"type": "LoadBalancer"}}
    refusal = refusal_of(ServiceAction.CREATE, body, status, message, T0)
    assert (refusal is not None) is refused
    if refusal is not None:
        assert (refusal.quota, refusal.message, refusal.at) == (quota, message, T0)
        assert (refusal.action, dict(refusal.body)) == (ServiceAction.CREATE, body)


# --- the gauge: since when an attachment is not Provisioned ---------------------------------------


def provisioned(status: str, reason: str, since: str) -> dict[str, Any]:
    return {"type": "Provisioned", "status": status, "reason": reason, "lastTransitionTime": since}


def attachment_with(*conditions: dict[str, Any]) -> Obj:
    return {**make_attachment(), "status": {"conditions": list(conditions)}}


LATER = "2024-01-01T00:10:00Z"
SOONER = "2024-01-01T00:05:00Z"


@pytest.mark.parametrize(
    ("attachments", "expected"),
    [
        pytest.param([], {}, id="none: no series"),
        pytest.param(
            [attachment_with(provisioned("True", "Provisioned", CREATED))], {}, id="provisioned: not counted"
        ),
        pytest.param(
            [
                attachment_with(provisioned("False", "AddressNotAnnounced", LATER)),
                attachment_with(provisioned("False", "AddressNotAnnounced", SOONER)),
                attachment_with(provisioned("False", "ClaimPending", CREATED)),
            ],
            {"AddressNotAnnounced": (T0 + timedelta(minutes=5)).timestamp(), "ClaimPending": T0.timestamp()},
            id="earliest per reason",
        ),
        pytest.param(
            [
                attachment_with(
                    {
                        "type": "Resolved",
                        "status": "False",
                        "reason": "EndpointNotFound",
                        "lastTransitionTime": CREATED,
                    }
                )
            ],
            {},
            id="only Provisioned counts",
        ),
        pytest.param([attachment_with(provisioned("False", "X", "yesterday"))], {}, id="undatable: skipped"),
        pytest.param(
            [attachment_with(provisioned("False", "X", "2024-01-01T00:00:00"))], {}, id="no zone: skipped"
        ),
        pytest.param([attachment_with("not a condition")], {}, id="malformed: skipped"),  # type: ignore[arg-type]
    ],
)
def test_not_provisioned_since(attachments: list[Obj], expected: dict[str, float]) -> None:
    assert not_provisioned_since(attachments) == expected


def test_the_gauge_is_exported() -> None:
    world = World.empty()
    world.attachments.upsert(attachment_with(provisioned("False", "AddressNotAnnounced", CREATED)))
    registry = CollectorRegistry()
    registry.register(WorldCollector(world))
    assert (
        registry.get_sample_value(NOT_PROVISIONED_SINCE_METRIC, {"reason": "AddressNotAnnounced"})
        == T0.timestamp()
    )


def test_attachments_are_counted_by_condition_without_their_names() -> None:
    world = World.empty()
    for name, reason in (("a", "ClaimPending"), ("b", "ClaimPending"), ("c", "Provisioned")):
        status = "True" if reason == "Provisioned" else "False"
        world.attachments.upsert(
            {
                **attachment_with(provisioned(status, reason, CREATED)),
                "metadata": {"name": name, "namespace": NAMESPACE},
            }
        )
    registry = CollectorRegistry()
    registry.register(WorldCollector(world))
    count = registry.get_sample_value
    assert (
        count(ATTACHMENTS_METRIC, {"type": "Provisioned", "status": "False", "reason": "ClaimPending"}) == 2
    )
    assert count(ATTACHMENTS_METRIC, {"type": "Provisioned", "status": "True", "reason": "Provisioned"}) == 1


# --- the glue: the API's refusals, applied ---------------------------------------------------------


def glue(refuse: ApiError) -> tuple[controller.AttachmentReconciler, RecordingWriter, StaticCaches]:
    """The default attachment with its claim Bound: the next pass creates the Service, refused."""
    attachment = make_attachment()
    caches = caches_of(
        put("service", make_service()),
        put("helmrelease", make_helmrelease()),
        put("class", make_class()),
        put("attachment", attachment),
        put("claim", make_claim(owner=attachment)),
    )
    writer = RecordingWriter(caches, refuse=refuse)
    running = controller.AttachmentReconciler(
        World(caches),
        writer,
        wall_clock=lambda: T0,
    )
    return running, writer, caches


def stored_provisioned(caches: StaticCaches) -> tuple[str, str, str]:
    attachment = caches.store(ATTACHMENTS).get(KA) or {}
    found = next(c for c in attachment["status"]["conditions"] if c["type"] == "Provisioned")
    return found["status"], found["reason"], found["message"]


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(ApiError(422, "Invalid", "spec.ipFamilies: IPv6 not configured"), id="422"),
        pytest.param(ApiError(403, "Forbidden", "exceeded quota: q"), id="403 quota"),
        pytest.param(ApiError(403, "Forbidden", "ns t because it is being terminated"), id="403 terminating"),
        pytest.param(
            ApiError(400, "BadRequest", 'admission webhook "fence" denied the request'), id="400 webhook"
        ),
    ],
)
async def test_a_refused_create_is_reported_in_the_same_pass_and_not_sent_again(error: ApiError) -> None:
    running, writer, caches = glue(error)
    result = await decide(running, KA)
    assert [c[:2] for c in writer.calls] == [
        ("metadata", "endpointattachments"),  # the finalizer
        ("create", "services"),
        ("status", "endpointattachments"),
    ]
    status, reason, message = stored_provisioned(caches)
    assert (status, reason) == ("False", REASON_RENDER_FAILED)
    assert error.message in message
    quota = "quota" in error.message
    assert result == (Result(requeue_after=running.quota_retry) if quota else Result())

    writer.calls.clear()
    assert await decide(running, KA) == result
    assert writer.calls == [], "the same request is not sent again, and nothing changed"


async def test_a_quota_refusal_is_sent_again_after_quota_retry() -> None:
    running, writer, caches = glue(ApiError(403, "Forbidden", "exceeded quota: q"))
    await decide(running, KA)
    writer.refuse = None
    running.wall_clock = lambda: T0 + timedelta(seconds=running.quota_retry + 1)
    writer.calls.clear()
    assert await decide(running, KA) == Result(requeue_after=controller.STATUS_HOLD_SECONDS)
    assert writer.calls == [("create", "services", "db-public-x7ktr")], "sent again, its status held"
    assert caches.store(SERVICES).get((NAMESPACE, "db-public-x7ktr")) is not None


async def test_a_transient_error_is_raised_for_the_runtime_to_retry() -> None:
    running, _, _ = glue(ApiError(503, "ServiceUnavailable", "etcd"))
    with pytest.raises(ApiError):
        await decide(running, KA)
