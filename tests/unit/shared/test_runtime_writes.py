"""The writer's write-through: what an answer does to the cache of its kind."""

from __future__ import annotations

from typing import Any

import pytest

from shared.resources import SERVICES
from shared.runtime.cache import Key, Obj
from shared.runtime.writes import Writer


class RecordingInformer:
    def __init__(self) -> None:
        self.remembered: list[Obj] = []
        self.forgotten: list[Key] = []

    def remember(self, obj: Obj) -> None:
        self.remembered.append(obj)

    def forget(self, key: Key) -> None:
        self.forgotten.append(key)


def answer(**metadata: Any) -> Obj:
    return {"metadata": {"namespace": "ns", "name": "a", "resourceVersion": "7", **metadata}}


@pytest.mark.parametrize(
    ("obj", "remembered", "forgotten"),
    [
        pytest.param(answer(), 1, 0, id="a-live-object-is-remembered"),
        pytest.param(answer(finalizers=["x"]), 1, 0, id="finalizers-left-is-remembered"),
        pytest.param(
            answer(deletionTimestamp="2026-01-01T00:00:00Z", finalizers=["other"]),
            1,
            0,
            id="deleting-with-another-finalizer-is-remembered",
        ),
        pytest.param(
            answer(deletionTimestamp="2026-01-01T00:00:00Z"),
            0,
            1,
            id="the-last-finalizer-removed-is-forgotten-never-a-ghost",
        ),
    ],
)
def test_an_answer_goes_to_the_cache_unless_the_write_removed_the_object(
    obj: Obj, remembered: int, forgotten: int
) -> None:
    informer = RecordingInformer()
    writer = Writer(None, lambda _: informer)  # type: ignore[arg-type, return-value]
    assert writer.remember(SERVICES, obj) is obj
    assert (len(informer.remembered), len(informer.forgotten)) == (remembered, forgotten)
    if forgotten:
        assert informer.forgotten == [("ns", "a")]


def test_an_unwatched_kind_is_left_alone() -> None:
    writer = Writer(None, lambda _: None)  # type: ignore[arg-type]
    assert writer.remember(SERVICES, answer()) == answer()
