"""Optional kinds: the CRD gate (``served``) and an informer of a kind that is not served yet.

The informer runs against a scripted API (``Script``): each LIST takes the next answer (a page or
an error); a WATCH, and a LIST past the script, blocks and sets ``quiet``, so the test knows the
informer has done all it was asked. Its backoff sleep is a recorder: no real time passes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any, cast

import pytest
from opentelemetry.trace import NoOpTracerProvider
from prometheus_client import CollectorRegistry

from shared.kube import ApiError, Kube, Obj
from shared.resources import CRDS, Resource
from shared.runtime.cache import Informer, Store
from shared.runtime.controller import Cache
from shared.runtime.manager import Manager
from shared.runtime.served import (
    BUILT_IN_RECHECK_SECONDS,
    RecheckGate,
    Served,
    crd_name,
    established,
    slim_crd,
)
from shared.telemetry.tracing import Tracing

WIDGETS = Resource("example.com/v1", "widgets")
DEADLINE = 5.0


def widget(name: str, rv: str) -> Obj:
    return {"metadata": {"namespace": "ns", "name": name, "resourceVersion": rv}}


def page(*items: Obj, rv: str = "10") -> Obj:
    return {
        "apiVersion": "example.com/v1",
        "kind": "WidgetList",
        "metadata": {"resourceVersion": rv},
        "items": list(items),
    }


def not_found() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource")


def crd(name: str, *, established_: bool, rv: str = "1") -> Obj:
    status = "True" if established_ else "False"
    return {
        "apiVersion": CRDS.api_version,
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name, "resourceVersion": rv, "uid": "u-1", "annotations": {"big": "x" * 100}},
        "spec": {"versions": [{"schema": {"openAPIV3Schema": {"type": "object"}}}]},
        "status": {
            "conditions": [
                {"type": "NamesAccepted", "status": "True"},
                {"type": "Established", "status": status, "reason": "InitialNamesAccepted"},
            ],
            "acceptedNames": {"kind": "Widget"},
        },
    }


class Script(Kube):
    """LIST answers from a script; a LIST past the script blocks; a WATCH blocks until
    ``break_watch`` makes it fail (as a deleted CRD's watch does)."""

    def __init__(self, lists: Sequence[Obj | BaseException]) -> None:
        self._lists: deque[Obj | BaseException] = deque(lists)
        self.list_calls = 0
        self.quiet = asyncio.Event()
        self._watch_failure: asyncio.Future[None] | None = None

    def more(self, *answers: Obj | BaseException) -> None:
        self.quiet.clear()
        self._lists.extend(answers)

    async def list(self, path: str, **kwargs: Any) -> Obj:
        self.list_calls += 1
        if not self._lists:
            self.quiet.set()
            await asyncio.Event().wait()
        answer = self._lists.popleft()
        if isinstance(answer, BaseException):
            raise answer
        return {**answer, "items": [dict(item) for item in answer.get("items") or ()]}

    def break_watch(self, error: BaseException) -> None:
        assert self._watch_failure is not None, "no watch is open"
        self.quiet.clear()
        self._watch_failure.set_exception(error)

    async def watch(self, path: str, **kwargs: Any) -> AsyncGenerator[tuple[str, Obj]]:
        self._watch_failure = asyncio.get_running_loop().create_future()
        self.quiet.set()
        await self._watch_failure  # raises what break_watch set
        yield "BOOKMARK", {}  # never reached


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


@contextlib.asynccontextmanager
async def running(informer: Informer, kube: Script) -> AsyncIterator[None]:
    task = asyncio.create_task(informer.run())
    try:
        async with asyncio.timeout(DEADLINE):
            await kube.quiet.wait()
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def settle(kube: Script) -> None:
    async with asyncio.timeout(DEADLINE):
        await kube.quiet.wait()


class Seen(list[tuple[str, str]]):
    """The informer's deliveries as (upserted | deleted, name); ``until`` waits for a count."""

    def __init__(self, informer: Informer) -> None:
        super().__init__()
        self._changed = asyncio.Event()
        informer.add_handler(self.record)

    def record(self, old: Obj | None, new: Obj | None) -> None:
        obj = new if new is not None else old
        assert obj is not None
        self.append(("deleted" if new is None else "upserted", obj["metadata"]["name"]))
        self._changed.set()

    async def until(self, count: int) -> None:
        async with asyncio.timeout(DEADLINE):
            while len(self) < count:
                self._changed.clear()
                await self._changed.wait()


# --- the gate --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("resource", "name"),
    [
        (
            Resource("local.sdn.cozystack.io/v1alpha1", "ipaddressclaims"),
            "ipaddressclaims.local.sdn.cozystack.io",
        ),
        (Resource("example.com/v1", "widgets", namespaced=False), "widgets.example.com"),
    ],
)
def test_crd_name_is_plural_dot_group(resource: Resource, name: str) -> None:
    assert crd_name(resource) == name


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (crd("widgets.example.com", established_=True), True),
        (crd("widgets.example.com", established_=False), False),
        ({"status": {}}, False),
        (None, False),
    ],
)
def test_established_reads_the_condition(obj: Obj | None, expected: bool) -> None:
    assert established(obj) is expected


def test_slim_crd_keeps_the_name_and_established_only() -> None:
    slim = slim_crd(crd("widgets.example.com", established_=True))
    assert slim["metadata"] == {"name": "widgets.example.com", "uid": "u-1", "resourceVersion": "1"}
    assert slim["status"] == {"conditions": [{"type": "Established", "status": "True"}]}
    assert "spec" not in slim
    assert established(slim)


def test_served_follows_the_crd_of_its_kind_only() -> None:
    served = Served()
    gate = served.gate(WIDGETS)
    assert served.gate(WIDGETS) is gate  # one gate per kind
    assert not gate.served()
    served(None, crd("gadgets.example.com", established_=True))  # another kind's CRD
    assert not gate.served()
    served(None, crd("widgets.example.com", established_=False))  # created, not yet established
    assert not gate.served()
    served(crd("widgets.example.com", established_=False), crd("widgets.example.com", established_=True))
    assert gate.served()
    served(crd("widgets.example.com", established_=True), None)  # deleted
    assert not gate.served()
    # A gate asked for after its CRD was seen knows it.
    assert served.gate(Resource("example.com/v1", "gadgets")).served()


# --- the informer of an optional kind --------------------------------------------------------------


async def test_not_served_is_synced_and_empty_then_lists_when_the_crd_is_established() -> None:
    served = Served()
    kube = Script([not_found()])
    informer = Informer(kube, WIDGETS, store=Store(), gate=served.gate(WIDGETS), sleep=Sleeps())
    seen = Seen(informer)
    task = asyncio.create_task(informer.run())
    try:
        async with asyncio.timeout(DEADLINE):
            await informer.synced.wait()
        assert not informer.served
        assert seen == []
        assert kube.list_calls == 1
        kube.more(page(widget("a", "11")))
        served(None, crd("widgets.example.com", established_=True))
        await settle(kube)  # it listed again, and now watches
        assert informer.served
        assert seen == [("upserted", "a")]
        assert kube.list_calls == 2
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_kind_that_stops_being_served_delivers_what_it_held_as_deleted() -> None:
    served = Served()
    served(None, crd("widgets.example.com", established_=True))
    kube = Script([page(widget("a", "11"), widget("b", "12"))])
    sleeps = Sleeps()
    informer = Informer(kube, WIDGETS, store=Store(), gate=served.gate(WIDGETS), sleep=sleeps)
    seen = Seen(informer)
    async with running(informer, kube):
        assert informer.served
        assert sorted(seen) == [("upserted", "a"), ("upserted", "b")]
        # The CRD goes: the CRD cache hears it, the watch fails, the re-list is answered 404.
        served(crd("widgets.example.com", established_=True), None)
        kube.more(not_found())
        kube.break_watch(not_found())
        await seen.until(4)  # what it held, delivered as deleted; then it waits for the CRD
        assert not informer.served
        assert len(informer.store or ()) == 0
        assert sorted(seen[2:]) == [("deleted", "a"), ("deleted", "b")]
        assert informer.synced.is_set()
        assert len(sleeps.delays) == 1  # the broken watch's backoff; none while not served


async def test_not_found_while_the_crd_is_established_is_an_ordinary_failure() -> None:
    served = Served()
    served(None, crd("widgets.example.com", established_=True))
    kube = Script([not_found(), page(widget("a", "11"))])
    sleeps = Sleeps()
    informer = Informer(kube, WIDGETS, store=Store(), gate=served.gate(WIDGETS), sleep=sleeps)
    seen = Seen(informer)
    async with running(informer, kube):
        assert len(sleeps.delays) == 1  # backed off once, then listed again
        assert informer.served
        assert seen == [("upserted", "a")]


async def test_a_kind_without_a_gate_treats_not_found_as_a_failure() -> None:
    kube = Script([not_found(), page(widget("a", "11"))])
    sleeps = Sleeps()
    informer = Informer(kube, WIDGETS, store=Store(), sleep=sleeps)
    async with running(informer, kube):
        assert len(sleeps.delays) == 1
        assert informer.served


async def test_a_built_in_kind_not_served_is_synced_and_empty_and_listed_again_after_the_recheck() -> None:
    sleeps = Sleeps()
    gate = RecheckGate(crd_name(WIDGETS), every=BUILT_IN_RECHECK_SECONDS, sleep=sleeps)
    kube = Script([not_found(), not_found(), page(widget("a", "11"))])
    informer = Informer(kube, WIDGETS, store=Store(), gate=gate, sleep=Sleeps())
    seen = Seen(informer)
    async with running(informer, kube):
        # Two LISTs answered 404 (each waited one recheck), then the group is served: listed, watched.
        assert sleeps.delays == [BUILT_IN_RECHECK_SECONDS, BUILT_IN_RECHECK_SECONDS]
        assert informer.served
        assert informer.synced.is_set()
        assert seen == [("upserted", "a")]
        assert kube.list_calls == 3


def test_a_built_in_optional_kind_declares_no_crd_cache() -> None:
    manager = Manager(cast(Kube, None), CollectorRegistry(), Tracing(NoOpTracerProvider(), "test"))
    informer = manager.informer(Cache(WIDGETS, optional=True, built_in=True))
    assert isinstance(informer.gate, RecheckGate)
    assert CRDS not in manager.informers  # nothing to list and watch (nor to be granted) for it
