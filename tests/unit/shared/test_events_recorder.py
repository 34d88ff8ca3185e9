"""shared.events.Recorder: events.k8s.io/v1 Events, a repeat within the window patching the first
one's series, a bounded budget of writes per object, and a failed post never raised."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from harness.memapi import MemApi
from shared.events import Recorder, event_v1_body, micro_time
from shared.kube import ApiError
from shared.resources import EVENTS_V1
from shared.runtime.writes import Writer

NOW = datetime(2026, 12, 5, 10, 0, 0, 123456, tzinfo=UTC)
ATTACHMENT: dict[str, Any] = {
    "apiVersion": "local.sdn.cozystack.io/v1alpha1",
    "kind": "EndpointAttachment",
    "metadata": {"name": "db-public", "namespace": "tenant-a", "uid": "u-1", "resourceVersion": "7"},
}


EVENTS_PATH = EVENTS_V1.path("tenant-a")


def writes(api: MemApi) -> list[tuple[str, str, Any]]:
    """The writes the recorder sent: (verb, path, body)."""
    return [(r.verb, r.path, r.body) for r in api.requests if r.verb in ("create", "patch")]


def kinds(api: MemApi) -> list[str]:
    return [verb for verb, _, _ in writes(api)]


class Clock:
    """The recorder's monotonic clock; the wall clock moves with it from NOW."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def wall(self) -> datetime:
        return NOW + timedelta(seconds=self.now - 1000.0)


def recorder(api: MemApi, clock: Clock, **kwargs: Any) -> Recorder:
    writer = Writer(api, lambda _: None)  # Events are not cached
    return Recorder(writer, "cozystack.io/test", "pod-0", clock=clock, wall_clock=clock.wall, **kwargs)


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
    api, clock = MemApi(), Clock()
    assert record(recorder(api, clock)) == "created"
    [(verb, path, body)] = writes(api)
    assert (verb, path) == ("create", EVENTS_PATH)
    assert body["reason"] == "Rendered"
    assert body["note"] == "rendered Service db-public-x7ktq"


def test_a_repeat_within_the_window_patches_the_series_instead_of_a_new_event() -> None:
    api, clock = MemApi(), Clock()
    rec = recorder(api, clock)
    record(rec)
    clock.now += 30
    assert record(rec) == "series"
    clock.now += 30
    assert record(rec) == "series"
    assert kinds(api) == ["create", "patch", "patch"]
    first, last = api.requests[0], api.requests[-1]
    name, patch, kind = last.target.name, last.body, last.patch_kind
    assert name == first.body["metadata"]["name"]
    assert kind == "json"
    assert patch == [
        {"op": "add", "path": "/series", "value": {"count": 3, "lastObservedTime": micro_time(clock.wall())}}
    ]
    stored = api.stored(EVENTS_V1.path("tenant-a", name)) or {}
    assert stored["series"]["count"] == 3, "the API's Event carries the series"


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda clock: setattr(clock, "now", clock.now + 601), "after the window"),
        (None, "another note"),
    ],
)
def test_a_repeat_after_the_window_or_with_another_note_is_a_new_event(change: Any, why: str) -> None:
    api, clock = MemApi(), Clock()
    rec = recorder(api, clock)
    record(rec)
    if change is not None:
        change(clock)
        assert record(rec) == "created", why
    else:
        clock.now += 1  # a moment later: the new Event's name is its own
        assert record(rec, note="rendered Service db-public-abcde") == "created", why
    assert kinds(api) == ["create", "create"]


def test_another_reason_is_its_own_event() -> None:
    api, clock = MemApi(), Clock()
    rec = recorder(api, clock)
    record(rec)
    clock.now += 1
    assert record(rec, reason="Withdrawn", note="withdrew Service db-public-x7ktq") == "created"
    assert record(rec) == "series", "the Rendered series is still the last of its reason"


def test_a_flapping_object_spends_a_bounded_budget_and_the_count_lands_later() -> None:
    api, clock = MemApi(), Clock()
    rec = recorder(api, clock, burst=4, refill_seconds=60.0)
    outcomes = [record(rec) for _ in range(50)]
    assert outcomes[:4] == ["created", "series", "series", "series"]
    assert set(outcomes[4:]) == {"suppressed"}
    assert len(writes(api)) == 4, "50 occurrences, 4 writes"
    clock.now += 60  # one token back
    assert record(rec) == "series"
    assert writes(api)[-1][2][0]["value"]["count"] == 51, "the suppressed repeats are counted"
    assert record(rec) == "suppressed"


def test_the_budget_is_per_object_and_forgotten_with_it() -> None:
    api, clock = MemApi(), Clock()
    rec = recorder(api, clock, burst=1)
    record(rec)
    assert record(rec, note="other") == "suppressed"
    other = {**ATTACHMENT, "metadata": {**ATTACHMENT["metadata"], "name": "other", "uid": "u-2"}}
    assert (
        asyncio.run(rec.record(other, type_="Normal", reason="Rendered", action="Render", note="n"))
        == "created"
    )
    rec.forget("tenant-a", "db-public")
    clock.now += 1
    assert record(rec, note="other") == "created", "a recreated attachment starts afresh"


def test_an_expired_event_is_created_again() -> None:
    api, clock = MemApi(), Clock()
    rec = recorder(api, clock)
    record(rec)
    event = api.requests[0].body["metadata"]["name"]
    assert api.remove(EVENTS_V1.path("tenant-a", event)) is not None  # its TTL ran out
    assert record(rec) == "created"
    assert kinds(api) == ["create", "patch", "create"]


def test_a_refused_post_is_logged_not_raised() -> None:
    api, clock = MemApi(), Clock()
    api.refuse(ApiError(403, "Forbidden", "events.events.k8s.io is forbidden"), verb="create")
    assert record(recorder(api, clock)) == "failed"
