"""The writer's write-through: what an answer does to the cache of its kind."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from harness.memapi import MemApi
from shared.resources import SERVICES
from shared.runtime.cache import Informer, Key, Obj, Store, key_of
from shared.runtime.controller import Write
from shared.runtime.writes import Finalizer, Writer


class Cached:
    """A real informer of Services over the in-memory API, holding the version before the write,
    and what its handlers were told: the answers remembered, the keys forgotten."""

    def __init__(self) -> None:
        store = Store()
        store.upsert(answer(resourceVersion="6"))
        self.informer = Informer(MemApi(), SERVICES, store=store)
        self.remembered: list[Obj] = []
        self.forgotten: list[Key] = []
        self.informer.add_handler(self.told)

    def told(self, old: Obj | None, new: Obj | None) -> None:
        if new is not None:
            self.remembered.append(new)
        elif old is not None:
            self.forgotten.append(key_of(old))


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
async def test_an_answer_goes_to_the_cache_unless_the_write_removed_the_object(
    obj: Obj, remembered: int, forgotten: int
) -> None:
    informer = Cached()
    writer = Writer(informer.informer.kube, lambda _: informer.informer)
    assert writer.remember(SERVICES, obj) is obj
    await asyncio.sleep(0)  # once the write has returned
    assert (len(informer.remembered), len(informer.forgotten)) == (remembered, forgotten)
    if forgotten:
        assert informer.forgotten == [("ns", "a")]


def test_an_unwatched_kind_is_left_alone() -> None:
    writer = Writer(MemApi(), lambda _: None)
    assert writer.remember(SERVICES, answer()) == answer()


# --- Finalizer: the protocol of one finalizer of ours ------------------------------------------------

FINALIZER_NAME = "example.cozystack.io/finalizer"


@pytest.mark.parametrize(
    ("metadata", "held", "releasing"),
    [
        pytest.param({}, False, False, id="live-and-not-held"),
        pytest.param({"finalizers": [FINALIZER_NAME]}, True, False, id="live-and-held"),
        pytest.param({"finalizers": ["other"]}, False, False, id="another-writers-finalizer-is-not-ours"),
        pytest.param(
            {"deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": [FINALIZER_NAME, "other"]},
            True,
            True,
            id="deleting-and-held-is-ours-to-release",
        ),
        pytest.param(
            {"deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["other"]},
            False,
            False,
            id="deleting-and-released-is-no-longer-ours",
        ),
    ],
)
def test_a_finalizer_knows_when_an_object_is_its_to_release(
    metadata: dict[str, Any], held: bool, releasing: bool
) -> None:
    finalizer = Finalizer(FINALIZER_NAME, SERVICES)
    obj = answer(**metadata)
    assert (finalizer.held(obj), finalizer.releasing(obj)) == (held, releasing)


def test_a_finalizer_declares_the_patch_it_needs() -> None:
    assert Finalizer(FINALIZER_NAME, SERVICES).writes == Write(SERVICES, ("patch",))
