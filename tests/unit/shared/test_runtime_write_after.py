"""No indexer, handler or map function runs inside a write: the answer enters the cache of its kind
just after the write returns (on the loop, in the writer's context), before the next decision."""

from __future__ import annotations

import asyncio

from harness.memapi import MemApi
from shared.resources import SERVICES
from shared.runtime.cache import Informer, Obj, Store
from shared.runtime.controller import Result, decide
from shared.runtime.writes import Writer

SERVICE: Obj = {"metadata": {"namespace": "ns", "name": "a"}, "spec": {"ports": [{"port": 80}]}}


class Told:
    """The informer's handler and an indexer, noting whether the write was still running."""

    def __init__(self) -> None:
        self.writing = False
        self.during: list[str] = []
        self.after: list[str] = []

    def note(self, what: str) -> None:
        (self.during if self.writing else self.after).append(what)


async def test_the_answer_enters_the_cache_after_the_write_and_before_the_next_decision() -> None:
    told = Told()

    def by_name(obj: Obj) -> list[str]:
        told.note("indexed")
        return [obj["metadata"]["name"]]

    store = Store({"by-name": by_name})
    informer = Informer(MemApi(), SERVICES, store=store)
    informer.add_handler(lambda old, new: told.note("handled"))
    writer = Writer(informer.kube, lambda _: informer)
    told.writing = True
    await writer.create(SERVICES, SERVICE)
    told.writing = False
    assert told.during == []
    assert store.get(("ns", "a")) is None, "not yet: the loop has not turned"
    await asyncio.sleep(0)
    assert told.after == ["indexed", "handled"]
    assert store.get(("ns", "a")) is not None


class MintsThenReads:
    """A reconciler that writes, asks to decide again, and then must see its write in the cache."""

    def __init__(self, writer: Writer, store: Store) -> None:
        self.writer, self.store = writer, store
        self.seen: list[bool] = []

    async def reconcile(self, key: tuple[str, str]) -> Result:
        self.seen.append(self.store.get(key) is not None)
        if self.store.get(key) is None:
            await self.writer.create(SERVICES, SERVICE)
            return Result(again=True)
        return Result()


async def test_the_next_decision_of_the_pass_sees_its_own_write() -> None:
    store = Store()
    informer = Informer(MemApi(), SERVICES, store=store)
    reconciler = MintsThenReads(Writer(informer.kube, lambda _: informer), store)
    assert await decide(reconciler, ("ns", "a")) == Result()
    assert reconciler.seen == [False, True]
