"""shared.conditions: timestamps move only on flips, equal statuses write nothing, patches are surgical."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from shared.conditions import (
    FALSE,
    TRUE,
    UNKNOWN,
    Condition,
    find,
    is_true,
    render,
    rfc3339,
    same_condition,
    status_patch,
)

T0 = "2024-01-01T00:00:00Z"
T1 = "2024-01-01T01:00:00Z"


def stored(
    type_: str, status: str, reason: str, message: str = "", generation: int = 1, at: str = T0
) -> dict[str, Any]:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": at,
    }


def apply(status: dict[str, Any] | None, patch: list[dict[str, Any]]) -> dict[str, Any]:
    """The status after applying ``patch`` to an object holding ``status``, with the jsonpatch library."""
    obj: dict[str, Any] = {"metadata": {"name": "x"}}
    if status is not None:
        obj["status"] = copy.deepcopy(status)
    result: dict[str, Any] = jsonpatch.apply_patch(obj, patch)
    return dict(result["status"])


@pytest.mark.parametrize(
    ("stored_status", "desired_status", "expected_time"),
    [
        pytest.param(TRUE, TRUE, T0, id="same status keeps the time"),
        pytest.param(FALSE, FALSE, T0, id="same false status keeps the time even if the reason changes"),
        pytest.param(TRUE, FALSE, T1, id="flip moves the time"),
        pytest.param(UNKNOWN, TRUE, T1, id="unknown to true moves the time"),
        pytest.param(None, TRUE, T1, id="first write takes now"),
    ],
)
def test_render_moves_last_transition_time_only_on_flip(
    stored_status: str | None, desired_status: str, expected_time: str
) -> None:
    current = None if stored_status is None else stored("Ready", stored_status, "Old")
    rendered = render(Condition("Ready", desired_status, "New", "msg"), current, 2, T1)
    assert rendered["lastTransitionTime"] == expected_time
    assert rendered["observedGeneration"] == 2
    assert (rendered["reason"], rendered["message"]) == ("New", "msg")


def test_rfc3339_is_utc_whole_seconds_with_z() -> None:
    from datetime import UTC, datetime, timedelta, timezone

    moment = datetime(2024, 1, 1, 3, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    assert rfc3339(moment) == "2024-01-01T01:00:00Z"
    assert rfc3339(datetime(2024, 1, 1, tzinfo=UTC)) == "2024-01-01T00:00:00Z"


@pytest.mark.parametrize(
    ("other", "same"),
    [
        pytest.param({"lastTransitionTime": T1}, True, id="timestamps ignored"),
        pytest.param({"reason": "Other"}, False, id="reason compared"),
        pytest.param({"message": "other"}, False, id="message compared"),
        pytest.param({"observedGeneration": 9}, False, id="generation compared"),
        pytest.param({"status": FALSE}, False, id="status compared"),
    ],
)
def test_same_condition_ignores_only_timestamps(other: dict[str, Any], same: bool) -> None:
    base = stored("Ready", TRUE, "Published")
    assert same_condition(base, {**base, **other}) is same


def test_find_and_is_true() -> None:
    conditions = [stored("A", TRUE, "R"), stored("B", FALSE, "R")]
    assert find(conditions, "B") == conditions[1]
    assert find(conditions, "C") is None
    assert find(None, "A") is None
    assert is_true(conditions, "A")
    assert not is_true(conditions, "B")
    assert not is_true(conditions, "C")


def test_no_status_yet_adds_everything() -> None:
    patch = status_patch(
        None, {"address": "203.0.113.10"}, [Condition("Ready", FALSE, "AddressPending")], 3, T1
    )
    assert patch[0] == {"op": "add", "path": "/status", "value": {}}
    status = apply(None, patch)
    assert status["address"] == "203.0.113.10"
    assert status["observedGeneration"] == 3
    assert status["conditions"] == [stored("Ready", FALSE, "AddressPending", generation=3, at=T1)]


def test_equal_status_gives_an_empty_patch() -> None:
    current = {
        "observedGeneration": 1,
        "address": "203.0.113.10",
        "conditions": [stored("Ready", TRUE, "Published", "ok")],
    }
    assert (
        status_patch(
            current, {"address": "203.0.113.10"}, [Condition("Ready", TRUE, "Published", "ok")], 1, T1
        )
        == []
    )


def test_second_pass_after_applying_writes_nothing() -> None:
    conditions = [Condition("A", TRUE, "Yes"), Condition("B", FALSE, "No", "why")]
    first = apply(None, status_patch(None, {"x": 1}, conditions, 1, T0))
    assert status_patch(first, {"x": 1}, conditions, 1, T1) == []


def test_changed_condition_is_tested_and_replaced_at_its_index() -> None:
    current = {
        "observedGeneration": 1,
        "conditions": [stored("Foreign", TRUE, "TheirOwn"), stored("Ready", FALSE, "AddressPending")],
    }
    patch = status_patch(current, {}, [Condition("Ready", TRUE, "Published")], 1, T1)
    assert patch == [
        {"op": "test", "path": "/status/conditions/1/type", "value": "Ready"},
        {"op": "replace", "path": "/status/conditions/1", "value": stored("Ready", TRUE, "Published", at=T1)},
    ]
    status = apply(current, patch)
    assert status["conditions"][0] == stored("Foreign", TRUE, "TheirOwn")


def test_reason_change_without_flip_keeps_the_time() -> None:
    current = {"observedGeneration": 1, "conditions": [stored("Ready", FALSE, "AddressPending")]}
    status = apply(current, status_patch(current, {}, [Condition("Ready", FALSE, "PoolExhausted")], 1, T1))
    assert status["conditions"] == [stored("Ready", FALSE, "PoolExhausted", at=T0)]


def test_new_condition_type_is_appended_and_others_untouched() -> None:
    current = {"observedGeneration": 1, "conditions": [stored("Foreign", FALSE, "X")]}
    patch = status_patch(current, {}, [Condition("Ready", TRUE, "Published")], 1, T1)
    assert patch == [
        {"op": "add", "path": "/status/conditions/-", "value": stored("Ready", TRUE, "Published", at=T1)}
    ]
    assert apply(current, patch)["conditions"][0] == stored("Foreign", FALSE, "X")


def test_generation_bump_rewrites_conditions_and_observed_generation() -> None:
    current = {"observedGeneration": 1, "conditions": [stored("Ready", TRUE, "Published")]}
    status = apply(current, status_patch(current, {}, [Condition("Ready", TRUE, "Published")], 2, T1))
    assert status["observedGeneration"] == 2
    assert status["conditions"] == [stored("Ready", TRUE, "Published", generation=2, at=T0)]


def test_test_operation_guards_against_a_reordered_list() -> None:
    current: dict[str, Any] = {
        "observedGeneration": 1,
        "conditions": [stored("A", TRUE, "R"), stored("Ready", FALSE, "P")],
    }
    patch = status_patch(current, {}, [Condition("Ready", TRUE, "Published")], 1, T1)
    reordered = {**current, "conditions": list(reversed(current["conditions"]))}
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        apply(reordered, patch)


@pytest.mark.parametrize(
    ("current", "fields", "expected_ops"),
    [
        pytest.param(
            {"observedGeneration": 1, "a": 1},
            {"a": None},
            [{"op": "remove", "path": "/status/a"}],
            id="None removes",
        ),
        pytest.param({"observedGeneration": 1}, {"a": None}, [], id="None on an absent key writes nothing"),
        pytest.param(
            {"observedGeneration": 1, "a": 1},
            {"a": 2},
            [{"op": "replace", "path": "/status/a", "value": 2}],
            id="replace",
        ),
        pytest.param(
            {"observedGeneration": 1},
            {"a/b~c": 1},
            [{"op": "add", "path": "/status/a~1b~0c", "value": 1}],
            id="pointer escaping",
        ),
        pytest.param({"observedGeneration": 1, "keep": "me"}, {}, [], id="keys not named are untouched"),
    ],
)
def test_fields(current: dict[str, Any], fields: dict[str, Any], expected_ops: list[dict[str, Any]]) -> None:
    patch = status_patch(current, fields, [], 1, T1)
    assert patch == expected_ops
    status = apply(current, patch)
    for key, value in fields.items():
        assert status.get(key) == value
    for key in set(current) - set(fields):
        assert status[key] == current[key]


def test_status_without_conditions_gets_the_whole_list() -> None:
    current = {"observedGeneration": 1}
    patch = status_patch(current, {}, [Condition("A", TRUE, "R"), Condition("B", UNKNOWN, "S")], 1, T1)
    assert patch == [
        {
            "op": "add",
            "path": "/status/conditions",
            "value": [stored("A", TRUE, "R", at=T1), stored("B", UNKNOWN, "S", at=T1)],
        }
    ]
