"""shared.events.Recorder: events.k8s.io/v1 Events, a repeat within the window patching the first
one's series, a bounded budget of writes per object, and a failed post never raised."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from shared.events import Recorder, event_v1_body, micro_time
from shared.kube import ApiError
from shared.resources import EVENTS_V1, Resource
from shared.runtime.writes import Writer

NOW = datetime(2026, 12, 5, 10, 0, 0, 123456, tzinfo=UTC)
ATTACHMENT: dict[str, Any] = {
    "apiVersion": "local.sdn.cozystack.io/v1alpha1",
    "kind": "EndpointAttachment",
    "metadata": {"name": "db-public", "namespace": "tenant-a", "uid": "u-1", "resourceVersion": "7"},
}


class FakeWriter:
    """Answers creates with a named Event and patches with the patched object; records both."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Resource, Any]] = []
        self.fail_create: Exception | None = None
        self.fail_patch: Exception | None = None
        self.named = 0

    async def create(self, resource: Resource, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("create", resource, body))
        if self.fail_create is not None:
            raise self.fail_create
        self.named += 1
        return {**body, "metadata": {**body["metadata"], "name": f"db-public.{self.named}"}}

    async def patch(self, resource: Resource, obj: dict[str, Any], patch: Any, kind: str) -> dict[str, Any]:
        self.calls.append(("patch", resource, (obj["metadata"]["name"], patch, kind)))
        if self.fail_patch is not None:
            raise self.fail_patch
        return obj

    def kinds(self) -> list[str]:
        return [call[0] for call in self.calls]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def recorder(writer: FakeWriter, clock: Clock, **kwargs: Any) -> Recorder:
    return Recorder(
        cast(Writer, writer), "cozystack.io/test", "pod-0", clock=clock, wall_clock=lambda: NOW, **kwargs
    )


def record(rec: Recorder, reason: str = "Rendered", note: str = "rendered Service db-public-x7ktq") -> str:
    return asyncio.run(rec.record(ATTACHMENT, type_="Normal", reason=reason, action="Render", note=note))


def test_the_event_is_events_k8s_io_v1_about_the_object_in_its_namespace() -> None:
    body = event_v1_body(
        ATTACHMENT,
        type_="Warning",
        reason="ClaimInUse",
        action="Claim",
        note="x" * 2000,
        controller="cozystack.io/test",
        instance="p" * 200,
        now=NOW,
    )
    assert body["apiVersion"] == "events.k8s.io/v1"
    assert body["metadata"] == {"name": f"db-public.{int(NOW.timestamp() * 1e9):x}", "namespace": "tenant-a"}
    assert body["regarding"] == {
        "apiVersion": "local.sdn.cozystack.io/v1alpha1",
        "kind": "EndpointAttachment",
        "name": "db-public",
        "namespace": "tenant-a",
        "uid": "u-1",
        "resourceVersion": "7",
    }
    assert body["eventTime"] == "2026-12-05T10:00:00.123456Z" == micro_time(NOW)
    assert (body["type"], body["reason"], body["action"]) == ("Warning", "ClaimInUse", "Claim")
    assert body["reportingController"] == "cozystack.io/test"
    assert (len(body["note"]), len(body["reportingInstance"])) == (1024, 128), "the API's bounds"
    assert not {"count", "firstTimestamp", "lastTimestamp", "source", "series"} & body.keys()


def test_a_first_occurrence_creates_an_event() -> None:
    writer, clock = FakeWriter(), Clock()
    assert record(recorder(writer, clock)) == "created"
    [(verb, resource, body)] = writer.calls
    assert (verb, resource) == ("create", EVENTS_V1)
    assert body["reason"] == "Rendered"
    assert body["note"] == "rendered Service db-public-x7ktq"


def test_a_repeat_within_the_window_patches_the_series_instead_of_a_new_event() -> None:
    writer, clock = FakeWriter(), Clock()
    rec = recorder(writer, clock)
    record(rec)
    clock.now += 30
    assert record(rec) == "series"
    clock.now += 30
    assert record(rec) == "series"
    assert writer.kinds() == ["create", "patch", "patch"]
    name, patch, kind = writer.calls[-1][2]
    assert name == "db-public.1"
    assert kind == "json"
    assert patch == [
        {"op": "add", "path": "/series", "value": {"count": 3, "lastObservedTime": micro_time(NOW)}}
    ]


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda clock: setattr(clock, "now", clock.now + 601), "after the window"),
        (None, "another note"),
    ],
)
def test_a_repeat_after_the_window_or_with_another_note_is_a_new_event(change: Any, why: str) -> None:
    writer, clock = FakeWriter(), Clock()
    rec = recorder(writer, clock)
    record(rec)
    if change is not None:
        change(clock)
        assert record(rec) == "created", why
    else:
        assert record(rec, note="rendered Service db-public-abcde") == "created", why
    assert writer.kinds() == ["create", "create"]


def test_another_reason_is_its_own_event() -> None:
    writer, clock = FakeWriter(), Clock()
    rec = recorder(writer, clock)
    record(rec)
    assert record(rec, reason="Withdrawn", note="withdrew Service db-public-x7ktq") == "created"
    assert record(rec) == "series", "the Rendered series is still the last of its reason"


def test_a_flapping_object_spends_a_bounded_budget_and_the_count_lands_later() -> None:
    writer, clock = FakeWriter(), Clock()
    rec = recorder(writer, clock, burst=4, refill_seconds=60.0)
    outcomes = [record(rec) for _ in range(50)]
    assert outcomes[:4] == ["created", "series", "series", "series"]
    assert set(outcomes[4:]) == {"suppressed"}
    assert len(writer.calls) == 4, "50 occurrences, 4 writes"
    clock.now += 60  # one token back
    assert record(rec) == "series"
    assert writer.calls[-1][2][1][0]["value"]["count"] == 51, "the suppressed repeats are counted"
    assert record(rec) == "suppressed"


def test_the_budget_is_per_object_and_forgotten_with_it() -> None:
    writer, clock = FakeWriter(), Clock()
    rec = recorder(writer, clock, burst=1)
    record(rec)
    assert record(rec, note="other") == "suppressed"
    other = {**ATTACHMENT, "metadata": {**ATTACHMENT["metadata"], "name": "other", "uid": "u-2"}}
    assert (
        asyncio.run(rec.record(other, type_="Normal", reason="Rendered", action="Render", note="n"))
        == "created"
    )
    rec.forget("tenant-a", "db-public")
    assert record(rec, note="other") == "created", "a recreated attachment starts afresh"


def test_an_expired_event_is_created_again() -> None:
    writer, clock = FakeWriter(), Clock()
    rec = recorder(writer, clock)
    record(rec)
    writer.fail_patch = ApiError(404, "NotFound", 'events.events.k8s.io "db-public.1" not found')
    assert record(rec) == "created"
    assert writer.kinds() == ["create", "patch", "create"]


def test_a_refused_post_is_logged_not_raised() -> None:
    writer, clock = FakeWriter(), Clock()
    writer.fail_create = ApiError(403, "Forbidden", "events.events.k8s.io is forbidden")
    assert record(recorder(writer, clock)) == "failed"
