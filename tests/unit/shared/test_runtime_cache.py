"""The runtime's cache: Store indexes, and the Informer's LIST/WATCH loop against a scripted fake API.

``ScriptedKube`` answers each LIST call with the next scripted page (or raises the scripted error)
and each WATCH call with the next scripted stream of events (an error in a stream is raised at that
point; the end of a stream is the server closing it normally). Once a script is used up, the call
blocks and ``quiet`` is set: the informer has done everything the test asked of it, and the test
stops it (cancellation) and looks at what was delivered. No real time passes: the informer's
backoff sleep is a recorder.

The last tests cover where each LIST reads from, the watches' jittered timeouts and idle bounds,
a 429's Retry-After in the backoff, and when an informer is blind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import AsyncGenerator, Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from opentelemetry import trace
from prometheus_client import CollectorRegistry

from shared.kube import ApiError, ApiTimeoutError, Kube, Obj
from shared.resources import CONFIGMAPS
from shared.runtime.cache import (
    BACKOFF_INITIAL_SECONDS,
    BACKOFF_MAX_SECONDS,
    BLIND_BOUND_FACTOR,
    HEALTHY_WATCH_SECONDS,
    NOT_OLDER_THAN,
    WATCH_IDLE_GRACE_SECONDS,
    WATCH_TIMEOUT_MAX_SECONDS,
    WATCH_TIMEOUT_MIN_SECONDS,
    ChangeHandler,
    Fold,
    Informer,
    Key,
    Store,
    backoff_delay,
    key_of,
    watch_timeout,
)
from shared.runtime.controller import Cache
from shared.runtime.manager import Manager
from shared.telemetry.tracing import Tracing

DEADLINE = 5.0  # seconds a test waits for the informer to use up its script; it takes milliseconds

Event = tuple[str, Obj]
Answer = Obj | BaseException


def cm(name: str, rv: str, ns: str = "ns", **labels: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"namespace": ns, "name": name, "resourceVersion": rv, "labels": labels},
    }


def page(items: Sequence[Obj], rv: str, token: str = "") -> Obj:
    """A LIST answer: items come without apiVersion and kind, as the API sends them."""
    bare = [{k: v for k, v in item.items() if k not in ("apiVersion", "kind")} for item in items]
    metadata = {"resourceVersion": rv, **({"continue": token} if token else {})}
    return {"apiVersion": "v1", "kind": "ConfigMapList", "metadata": metadata, "items": bare}


def bookmark(rv: str) -> Event:
    return "BOOKMARK", {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"resourceVersion": rv}}


def gone_event() -> Event:
    return "ERROR", {
        "kind": "Status",
        "code": 410,
        "reason": "Expired",
        "message": "too old resource version",
    }


def connection_error() -> aiohttp.ClientConnectionError:
    return aiohttp.ClientConnectionError("connection refused")


def server_error() -> ApiError:
    """An answered failure of a watch: it re-lists (a connection failure resumes the watch)."""
    return ApiError(500, "InternalError", "etcd leader changed")


class ScriptedKube(Kube):
    """Just the two verbs an informer calls, answered from a script."""

    def __init__(self, lists: Sequence[Answer], watches: Sequence[Sequence[Event | BaseException]]) -> None:
        self._lists: deque[Answer] = deque(lists)
        self._watches: deque[Sequence[Event | BaseException]] = deque(watches)
        self.list_calls: list[dict[str, Any]] = []
        self.watch_calls: list[dict[str, Any]] = []
        self.watches_closed = 0
        self.quiet = asyncio.Event()

    async def _hang(self) -> None:
        self.quiet.set()
        await asyncio.Event().wait()

    async def list(
        self,
        path: str,
        *,
        label_selector: str = "",
        field_selector: str = "",
        limit: int = 0,
        continue_: str = "",
        resource_version: str = "",
        resource_version_match: str = "",
    ) -> Obj:
        self.list_calls.append(
            {
                "path": path,
                "label_selector": label_selector,
                "limit": limit,
                "continue_": continue_,
                "resource_version": resource_version,
                "resource_version_match": resource_version_match,
            }
        )
        if not self._lists:
            await self._hang()
        answer = self._lists.popleft()
        if isinstance(answer, BaseException):
            raise answer
        fresh: Obj = json.loads(json.dumps(answer))  # a fresh parse per call, as from the wire
        return fresh

    async def watch(
        self,
        path: str,
        *,
        resource_version: str = "",
        label_selector: str = "",
        field_selector: str = "",
        timeout_seconds: int = 300,
        idle_timeout: float | None = None,
    ) -> AsyncGenerator[tuple[str, Obj]]:
        self.watch_calls.append(
            {
                "path": path,
                "resource_version": resource_version,
                "timeout_seconds": timeout_seconds,
                "idle_timeout": idle_timeout,
            }
        )
        try:
            if not self._watches:
                await self._hang()
            for step in self._watches.popleft():
                if isinstance(step, BaseException):
                    raise step
                kind, obj = step
                yield kind, json.loads(json.dumps(obj))
        finally:
            self.watches_closed += 1


class GatedKube(ScriptedKube):
    """Holds every watch until ``gate`` is set: a write is answered before its watch event comes."""

    def __init__(self, lists: Sequence[Answer], watches: Sequence[Sequence[Event | BaseException]]) -> None:
        super().__init__(lists, watches)
        self.gate = asyncio.Event()

    async def watch(self, path: str, **kwargs: Any) -> AsyncGenerator[tuple[str, Obj]]:
        await self.gate.wait()
        async for event in super().watch(path, **kwargs):
            yield event


async def run_gated(informer: Informer, kube: GatedKube, meanwhile: Callable[[], None]) -> None:
    """Run until synced, call ``meanwhile`` (the watch is held), open the gate, run until quiet."""
    task = asyncio.create_task(informer.run())
    async with asyncio.timeout(DEADLINE):
        await informer.synced.wait()
    meanwhile()
    kube.gate.set()
    async with asyncio.timeout(DEADLINE):
        await kube.quiet.wait()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert task.cancelled()


@dataclass
class Recorder:
    """Every change delivered, as (what, name, resourceVersion), plus has_synced at that moment."""

    informer: Informer | None = None
    changes: list[tuple[str, str, str]] = field(default_factory=list)
    synced_at_change: list[bool] = field(default_factory=list)

    def __call__(self, old: Obj | None, new: Obj | None) -> None:
        what = "added" if old is None else "deleted" if new is None else "modified"
        obj = new if new is not None else old
        assert obj is not None
        self.changes.append((what, obj["metadata"]["name"], obj["metadata"].get("resourceVersion", "")))
        if self.informer is not None:
            self.synced_at_change.append(self.informer.has_synced())


@dataclass
class Sleeps:
    """The informer's backoff sleep: records, never waits; notes has_synced at each failure, and
    what ``note`` says then."""

    informer: Informer | None = None
    note: Callable[[], object] | None = None
    delays: list[float] = field(default_factory=list)
    synced: list[bool] = field(default_factory=list)
    notes: list[object] = field(default_factory=list)

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        if self.informer is not None:
            self.synced.append(self.informer.has_synced())
        if self.note is not None:
            self.notes.append(self.note())
        await asyncio.sleep(0)


class RvFold:
    """A fold keeping each key's resourceVersion: changed when a key's version is new to it."""

    def __init__(self) -> None:
        self.versions: dict[Key, str] = {}

    def upsert(self, key: Key, obj: Obj) -> bool:
        version: str = obj["metadata"]["resourceVersion"]
        changed = self.versions.get(key) != version
        self.versions[key] = version
        return changed

    def delete(self, key: Key) -> bool:
        return self.versions.pop(key, None) is not None

    def keys(self) -> Iterable[Key]:
        return self.versions.keys()


def informer_for(
    kube: ScriptedKube,
    *,
    fold: Fold | None = None,
    store: Store | None = None,
    handlers: Sequence[ChangeHandler] = (),
    **kwargs: Any,
) -> tuple[Informer, Recorder, Sleeps]:
    """An informer over the fake, its backoff recorded; ``handlers`` come before the recorder."""
    sleeps = Sleeps()
    informer = Informer(
        kube,
        CONFIGMAPS,
        store=store if store is not None or fold is not None else Store(),
        fold=fold,
        sleep=sleeps,
        **kwargs,
    )
    recorder = Recorder(informer)
    sleeps.informer = informer
    for handler in handlers:
        informer.add_handler(handler)
    informer.add_handler(recorder)
    return informer, recorder, sleeps


async def run_until_quiet(informer: Informer, kube: ScriptedKube) -> None:
    """Run the informer until the script is used up, then cancel it: it must end cancelled."""
    kube.quiet.clear()
    task = asyncio.create_task(informer.run())
    async with asyncio.timeout(DEADLINE):
        await kube.quiet.wait()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert task.cancelled()


# --- Store ------------------------------------------------------------------------------------------


def by_label(label: str) -> Any:
    def indexer(obj: Obj) -> Iterable[Hashable]:
        value = obj["metadata"].get("labels", {}).get(label)
        return [value] if value else []

    return indexer


def by_every_label_value(obj: Obj) -> Iterable[Hashable]:
    return set(obj["metadata"].get("labels", {}).values())


Op = tuple[str, Obj | Key]


@pytest.mark.parametrize(
    ("ops", "index", "expected"),
    [
        pytest.param(
            [("upsert", cm("a", "1", node="n1")), ("upsert", cm("b", "1", node="n1"))],
            "node",
            {"n1": {"a", "b"}},
            id="two-under-one-value",
        ),
        pytest.param(
            [("upsert", cm("a", "1", node="n1")), ("upsert", cm("a", "2", node="n2"))],
            "node",
            {"n1": set(), "n2": {"a"}},
            id="upsert-moves-between-values",
        ),
        pytest.param(
            [("upsert", cm("a", "1", node="n1")), ("upsert", cm("a", "2"))],
            "node",
            {"n1": set()},
            id="upsert-out-of-every-value",
        ),
        pytest.param(
            [
                ("upsert", cm("a", "1", node="n1")),
                ("upsert", cm("b", "1", node="n1")),
                ("delete", ("ns", "a")),
            ],
            "node",
            {"n1": {"b"}},
            id="delete-unfiles",
        ),
        pytest.param(
            [("delete", ("ns", "missing"))],
            "node",
            {"n1": set()},
            id="delete-of-absent-key",
        ),
        pytest.param(
            [("upsert", cm("a", "1", x="v1", y="v2")), ("upsert", cm("a", "2", x="v2", y="v3"))],
            "values",
            {"v1": set(), "v2": {"a"}, "v3": {"a"}},
            id="several-values-per-object",
        ),
    ],
)
def test_store_indexes(ops: list[Op], index: str, expected: dict[str, set[str]]) -> None:
    store = Store({"node": by_label("node"), "values": by_every_label_value})
    for op, arg in ops:
        if op == "upsert":
            assert isinstance(arg, dict)
            store.upsert(arg)
        else:
            assert isinstance(arg, tuple)
            store.delete(arg)
    for value, names in expected.items():
        assert {o["metadata"]["name"] for o in store.index(index, value)} == names
        assert store.index_keys(index, value) == frozenset(("ns", n) for n in names)
    # No empty value is left behind in the index after an object leaves it.
    assert all(store._indices[index].values())


def test_store_returns_previous_and_removed_versions() -> None:
    store = Store()
    first, second = cm("a", "1"), cm("a", "2")
    assert store.upsert(first) is None
    assert store.upsert(second) is first
    assert store.get(("ns", "a")) is second  # stored as given, not copied
    assert ("ns", "a") in store
    assert len(store) == 1
    assert list(store.keys()) == [("ns", "a")]
    assert list(store.values()) == [second]
    assert list(store.items()) == [(("ns", "a"), second)]
    assert store.delete(("ns", "a")) is second
    assert store.delete(("ns", "a")) is None
    assert len(store) == 0


def test_store_index_lists_in_key_order() -> None:
    store = Store({"node": by_label("node")})
    for name in ("c", "a", "b"):
        store.upsert(cm(name, "1", node="n1"))
    assert [o["metadata"]["name"] for o in store.index("node", "n1")] == ["a", "b", "c"]


def test_store_unknown_index_is_a_key_error() -> None:
    with pytest.raises(KeyError, match="no index named 'nodes'"):
        Store({"node": by_label("node")}).index("nodes", "n1")


def test_store_indexer_that_raises_leaves_the_store_unchanged() -> None:
    def broken(obj: Obj) -> Iterable[Hashable]:
        if obj["metadata"]["resourceVersion"] == "2":
            raise ValueError("broken indexer")
        return ["v"]

    store = Store({"i": broken})
    first = cm("a", "1")
    store.upsert(first)
    with pytest.raises(ValueError, match="broken indexer"):
        store.upsert(cm("a", "2"))
    assert store.get(("ns", "a")) is first
    assert store.index_keys("i", "v") == {("ns", "a")}


@pytest.mark.parametrize(
    ("obj", "key"),
    [
        ({"metadata": {"namespace": "ns", "name": "a"}}, ("ns", "a")),
        ({"metadata": {"name": "node-1"}}, ("", "node-1")),
    ],
)
def test_key_of(obj: Obj, key: Key) -> None:
    assert key_of(obj) == key


# --- Informer: construction and backoff ---------------------------------------------------------------


@pytest.mark.parametrize(("store", "fold"), [(None, None), (Store(), RvFold())])
def test_informer_keeps_exactly_one_of_store_or_fold(store: Store | None, fold: Fold | None) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        Informer(ScriptedKube([], []), CONFIGMAPS, store=store, fold=fold)


@pytest.mark.parametrize(
    ("failures", "draw", "delay"),
    [
        (1, 0.0, BACKOFF_INITIAL_SECONDS),
        (1, 1.0, BACKOFF_INITIAL_SECONDS / 2),
        (2, 0.0, 2 * BACKOFF_INITIAL_SECONDS),
        (3, 0.0, 4 * BACKOFF_INITIAL_SECONDS),
        (10, 0.0, BACKOFF_MAX_SECONDS),
        (10, 1.0, BACKOFF_MAX_SECONDS / 2),
        (100_000, 0.5, BACKOFF_MAX_SECONDS * 0.75),
    ],
)
def test_backoff_doubles_with_jitter_up_to_the_cap(failures: int, draw: float, delay: float) -> None:
    assert backoff_delay(failures, lambda: draw) == pytest.approx(delay)


# --- Informer: LIST with replace semantics ------------------------------------------------------------


async def test_first_list_pages_fills_the_store_and_syncs() -> None:
    kube = ScriptedKube(
        lists=[page([cm("a", "1")], "10", token="t1"), page([cm("b", "2")], "10")],
        watches=[],
    )
    informer, recorder, _ = informer_for(kube, page_size=1, label_selector="app=x", namespace="ns")
    await run_until_quiet(informer, kube)
    assert [(c["continue_"], c["limit"], c["label_selector"]) for c in kube.list_calls] == [
        ("", 1, "app=x"),
        ("t1", 1, "app=x"),
    ]
    assert kube.list_calls[0]["path"] == "/api/v1/namespaces/ns/configmaps"
    assert recorder.changes == [("added", "a", "1"), ("added", "b", "2")]
    assert recorder.synced_at_change == [False, False]  # handlers of the first list run before sync
    assert informer.has_synced()
    assert informer.relists == 0
    ((call),) = kube.watch_calls
    assert (call["path"], call["resource_version"]) == ("/api/v1/namespaces/ns/configmaps", "10")
    assert call["idle_timeout"] == call["timeout_seconds"] + WATCH_IDLE_GRACE_SECONDS
    # Listed items get the list's apiVersion and kind, as watched ones carry them.
    assert informer.store is not None
    stored = informer.store.get(("ns", "a"))
    assert stored is not None
    assert (stored["apiVersion"], stored["kind"]) == ("v1", "ConfigMap")


@pytest.mark.parametrize(
    ("first", "second", "changes"),
    [
        pytest.param(
            [cm("a", "1"), cm("b", "1"), cm("c", "1")],
            [cm("a", "1"), cm("b", "2"), cm("d", "3")],
            [("modified", "b", "2"), ("added", "d", "3"), ("deleted", "c", "1")],
            id="added-modified-unchanged-missing",
        ),
        pytest.param(
            [cm("a", "1")],
            [],
            [("deleted", "a", "1")],
            id="everything-gone",
        ),
        pytest.param(
            [cm("a", "1"), cm("b", "1")],
            [cm("a", "1"), cm("b", "1")],
            [],
            id="nothing-changed-nothing-delivered",
        ),
        pytest.param(
            [cm("a", "5")],
            [cm("a", "4")],
            [],
            id="older-than-stored-not-delivered",
        ),
    ],
)
async def test_relist_replaces(
    first: list[Obj], second: list[Obj], changes: list[tuple[str, str, str]]
) -> None:
    kube = ScriptedKube(lists=[page(first, "10"), page(second, "20")], watches=[[server_error()]])
    informer, recorder, _ = informer_for(kube)
    await run_until_quiet(informer, kube)
    initial = [("added", o["metadata"]["name"], o["metadata"]["resourceVersion"]) for o in first]
    assert recorder.changes == initial + changes
    assert informer.relists == 1
    assert informer.store is not None
    assert sorted(informer.store.keys()) == sorted(("ns", o["metadata"]["name"]) for o in second)
    assert kube.watch_calls[-1]["resource_version"] == "20"


@pytest.mark.parametrize(
    ("first", "second", "changes", "held"),
    [
        pytest.param(
            [cm("a", "1"), cm("b", "1"), cm("c", "1")],
            [cm("a", "1"), cm("b", "2"), cm("d", "3")],
            [("modified", "b", "2"), ("added", "d", "3"), ("deleted", "c", "")],
            {"a", "b", "d"},
            id="fold-upserts-when-changed-deletes-unseen",
        ),
        pytest.param([cm("a", "1")], [cm("a", "1")], [], {"a"}, id="fold-unchanged"),
    ],
)
async def test_relist_replaces_through_a_fold(
    first: list[Obj], second: list[Obj], changes: list[tuple[str, str, str]], held: set[str]
) -> None:
    kube = ScriptedKube(lists=[page(first, "10"), page(second, "20")], watches=[[server_error()]])
    fold = RvFold()
    informer, recorder, _ = informer_for(kube, fold=fold)
    await run_until_quiet(informer, kube)
    # A fold's changes are all "added" (nothing is stored to be the old version) but for deletions.
    initial = [("added", o["metadata"]["name"], o["metadata"]["resourceVersion"]) for o in first]
    assert recorder.changes == initial + [("added" if w == "modified" else w, n, v) for w, n, v in changes]
    assert informer.store is None
    assert {name for _, name in fold.versions} == held


async def test_a_fold_relist_deletes_what_it_held_and_was_not_listed_only() -> None:
    """A fold's deletions after a LIST are the keys it held when the LIST began and did not get
    (it keeps no set of every listed key); a key it took in by ``remember`` meanwhile stays."""
    first = page([cm("a", "1"), cm("b", "1")], "10")
    second = [page([cm("a", "1")], "20", token="t"), page([cm("c", "21")], "20")]
    kube = ScriptedKube(lists=[first, *second], watches=[[server_error()]])
    fold = RvFold()
    informer, recorder, _ = informer_for(kube, fold=fold)
    listed = kube.list

    async def list_and_remember(path: str, **params: Any) -> Obj:
        answer = await listed(path, **params)
        if params.get("continue_") == "t":  # between the second LIST's pages: our own write's answer
            informer.remember(cm("z", "22"))
        return answer

    kube.list = list_and_remember  # type: ignore[method-assign]
    await run_until_quiet(informer, kube)
    assert {name for _, name in fold.versions} == {"a", "c", "z"}
    assert ("deleted", "b", "") in recorder.changes
    assert not any(change[0] == "deleted" and change[1] != "b" for change in recorder.changes)


async def test_fold_deletion_is_delivered_as_a_stub() -> None:
    kube = ScriptedKube(lists=[page([cm("a", "1")], "10")], watches=[[("DELETED", cm("a", "2"))]])
    delivered: list[tuple[Obj | None, Obj | None]] = []
    informer, _, _ = informer_for(kube, fold=RvFold())
    informer.add_handler(lambda old, new: delivered.append((old, new)))
    await run_until_quiet(informer, kube)
    assert delivered[-1] == ({"metadata": {"namespace": "ns", "name": "a"}}, None)


async def test_a_list_failing_mid_paging_deletes_nothing_and_does_not_sync() -> None:
    kube = ScriptedKube(
        lists=[
            page([cm("a", "1")], "10", token="t1"),
            ApiError(410, "Expired", "continue token expired"),
            page([cm("a", "1")], "12", token="t2"),
            page([cm("b", "2")], "12"),
        ],
        watches=[],
    )
    informer, recorder, sleeps = informer_for(kube, page_size=1)
    await run_until_quiet(informer, kube)
    assert sleeps.synced == [False]  # the failed list did not sync
    assert [c["continue_"] for c in kube.list_calls] == ["", "t1", "", "t2"]  # restarted from scratch
    assert recorder.changes == [("added", "a", "1"), ("added", "b", "2")]
    assert informer.has_synced()
    assert informer.relists == 1


async def test_a_relist_failing_mid_paging_deletes_nothing() -> None:
    kube = ScriptedKube(
        lists=[
            page([cm("a", "1"), cm("b", "1"), cm("c", "1")], "10"),
            page([cm("a", "1")], "20", token="t1"),
            connection_error(),
            page([cm("a", "1")], "30"),
        ],
        watches=[[server_error()]],
    )
    informer, recorder, sleeps = informer_for(kube)
    sleeps.note = lambda: sum(1 for what, _, _ in recorder.changes if what == "deleted")
    await run_until_quiet(informer, kube)
    assert sleeps.notes == [0, 0]  # deletions at each failure
    assert recorder.changes[3:] == [("deleted", "b", "1"), ("deleted", "c", "1")]
    assert informer.relists == 2


async def test_relist_keeps_what_we_wrote_after_the_list_snapshot() -> None:
    kube = ScriptedKube(lists=[page([], "10"), page([], "20")], watches=[[server_error()]])
    informer, recorder, _ = informer_for(kube)
    # Remembered before the relist (our create answered at RV 25, newer than the relist's 20).
    informer.remember(cm("mine", "25"))
    await run_until_quiet(informer, kube)
    assert informer.store is not None
    assert ("ns", "mine") in informer.store
    assert recorder.changes == [("added", "mine", "25")]


# --- Informer: WATCH ----------------------------------------------------------------------------------


async def test_watch_delivers_added_modified_deleted() -> None:
    kube = ScriptedKube(
        lists=[page([], "10")],
        watches=[[("ADDED", cm("a", "11")), ("MODIFIED", cm("a", "12")), ("DELETED", cm("a", "13"))]],
    )
    informer, recorder, _ = informer_for(kube)
    await run_until_quiet(informer, kube)
    assert recorder.changes == [("added", "a", "11"), ("modified", "a", "12"), ("deleted", "a", "13")]
    assert informer.store is not None
    assert len(informer.store) == 0


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param([ApiError(410, "Gone", "too old resource version")], id="status-410"),
        pytest.param([gone_event()], id="error-event-410"),
        pytest.param([("ADDED", cm("a", "11")), server_error()], id="answered-error"),
        pytest.param([ValueError("truncated line")], id="anything-else"),
        pytest.param([("ERROR", {"kind": "Status", "code": 500, "message": "boom"})], id="error-event-500"),
    ],
)
async def test_a_failed_watch_lists_again_and_delivers_what_vanished(
    failure: list[Event | BaseException],
) -> None:
    kube = ScriptedKube(
        lists=[page([cm("x", "1"), cm("y", "1")], "10"), page([cm("x", "1")], "20")],
        watches=[failure],
    )
    informer, recorder, sleeps = informer_for(kube)
    await run_until_quiet(informer, kube)
    assert informer.relists == 1
    assert len(sleeps.delays) == 1
    assert BACKOFF_INITIAL_SECONDS / 2 <= sleeps.delays[0] <= BACKOFF_INITIAL_SECONDS
    assert ("deleted", "y", "1") in recorder.changes
    assert ("ns", "y") not in (informer.store or {})
    assert [c["resource_version"] for c in kube.watch_calls] == ["10", "20"]


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(connection_error(), id="connection-error"),
        pytest.param(ApiTimeoutError("no data on the watch for 10s"), id="silent-watch"),
        pytest.param(ConnectionResetError("reset by peer"), id="reset"),
    ],
)
async def test_a_watch_whose_connection_failed_resumes_from_its_last_version_without_listing(
    failure: BaseException,
) -> None:
    kube = ScriptedKube(
        lists=[page([cm("x", "1")], "10")],
        watches=[[("ADDED", cm("y", "11")), failure], [("DELETED", cm("x", "12"))]],
    )
    informer, recorder, sleeps = informer_for(kube)
    await run_until_quiet(informer, kube)
    assert (informer.relists, informer.resumes) == (0, 1)
    assert len(kube.list_calls) == 1
    assert [c["resource_version"] for c in kube.watch_calls][:2] == ["10", "11"]
    assert len(sleeps.delays) == 1  # the same backoff as before a LIST
    assert recorder.changes == [("added", "x", "1"), ("added", "y", "11"), ("deleted", "x", "12")]


async def test_a_resumed_watch_answered_410_lists_consistently() -> None:
    kube = ScriptedKube(
        lists=[page([cm("x", "1")], "10"), page([], "30")],
        watches=[[bookmark("15"), connection_error()], [gone_event()]],
    )
    informer, recorder, _ = informer_for(kube)
    await run_until_quiet(informer, kube)
    assert [c["resource_version"] for c in kube.watch_calls][:3] == ["10", "15", "30"]
    assert list_reads(kube) == [("", "", ""), ("", "", "")]  # after a 410: a consistent read
    assert (informer.relists, informer.resumes) == (1, 1)
    assert ("deleted", "x", "1") in recorder.changes


async def test_a_normal_close_watches_again_from_the_last_version_without_listing() -> None:
    kube = ScriptedKube(
        lists=[page([], "10")],
        watches=[[("ADDED", cm("a", "11")), bookmark("15")], [bookmark("18")], []],
    )
    informer, _, sleeps = informer_for(kube)
    await run_until_quiet(informer, kube)
    assert [c["resource_version"] for c in kube.watch_calls] == ["10", "15", "18", "18"]
    assert informer.relists == 0
    assert sleeps.delays == []
    assert kube.watches_closed == len(kube.watch_calls)  # the last one by cancellation


async def test_backoff_grows_while_failures_repeat_and_resets_after_a_normal_close() -> None:
    kube = ScriptedKube(
        lists=[page([], "10")] * 5,
        watches=[[connection_error()], [connection_error()], [], [connection_error()]],
    )
    informer, _, sleeps = informer_for(kube)
    await run_until_quiet(informer, kube)
    ceilings = [BACKOFF_INITIAL_SECONDS, 2 * BACKOFF_INITIAL_SECONDS, BACKOFF_INITIAL_SECONDS]
    assert len(sleeps.delays) == len(ceilings)
    for delay, ceiling in zip(sleeps.delays, ceilings, strict=True):
        assert ceiling / 2 <= delay <= ceiling


async def test_a_watch_that_was_healthy_for_long_resets_the_backoff() -> None:
    now = [0.0]

    class Aging(ScriptedKube):
        async def watch(self, path: str, **kwargs: Any) -> AsyncGenerator[tuple[str, Obj]]:
            now[0] += HEALTHY_WATCH_SECONDS  # every watch lives that long before it fails
            async for event in super().watch(path, **kwargs):
                yield event

    kube = Aging(lists=[page([], "10")] * 4, watches=[[connection_error()]] * 3)
    sleeps = Sleeps()
    informer = Informer(kube, CONFIGMAPS, store=Store(), sleep=sleeps, clock=lambda: now[0])
    await run_until_quiet(informer, kube)
    assert len(sleeps.delays) == 3
    assert all(delay <= BACKOFF_INITIAL_SECONDS for delay in sleeps.delays)


async def test_a_raising_handler_is_logged_and_skipped(caplog: pytest.LogCaptureFixture) -> None:
    kube = ScriptedKube(
        lists=[page([cm("a", "1")], "10")],
        watches=[[("MODIFIED", cm("a", "2")), ("ADDED", cm("b", "3"))]],
    )
    calls: list[str] = []

    def broken(old: Obj | None, new: Obj | None) -> None:
        raise RuntimeError("handler bug")

    informer, _, sleeps = informer_for(kube, handlers=[broken])
    informer.add_handler(lambda old, new: calls.append((new or old or {})["metadata"]["name"]))
    with caplog.at_level(logging.ERROR, logger="shared.runtime.cache"):
        await run_until_quiet(informer, kube)
    assert calls == ["a", "a", "b"]  # the later handler still ran, for every change
    assert sleeps.delays == []  # and the informer never failed
    assert informer.relists == 0
    assert sum("change handler failed" in r.getMessage() for r in caplog.records) == 3
    assert all(r.exc_info for r in caplog.records)


async def test_a_raising_fold_is_logged_and_skipped(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(RvFold):
        def upsert(self, key: Key, obj: Obj) -> bool:
            if key[1] == "bad":
                raise RuntimeError("fold bug")
            return super().upsert(key, obj)

    kube = ScriptedKube(
        lists=[page([], "10")], watches=[[("ADDED", cm("bad", "11")), ("ADDED", cm("ok", "12"))]]
    )
    informer, recorder, sleeps = informer_for(kube, fold=Broken())
    with caplog.at_level(logging.ERROR, logger="shared.runtime.cache"):
        await run_until_quiet(informer, kube)
    assert recorder.changes == [("added", "ok", "12")]
    assert sleeps.delays == []
    assert any("fold failed" in r.getMessage() for r in caplog.records)


async def test_transform_applies_before_storing_and_delivering() -> None:
    def slim(obj: Obj) -> Obj:
        return {"metadata": {k: obj["metadata"][k] for k in ("namespace", "name", "resourceVersion")}}

    kube = ScriptedKube(
        lists=[page([cm("a", "1", big="x")], "10")],
        watches=[[("MODIFIED", cm("a", "2", big="y")), ("DELETED", cm("a", "3", big="y"))]],
    )
    delivered: list[tuple[Obj | None, Obj | None]] = []
    informer, _, _ = informer_for(kube, transform=slim)
    informer.add_handler(lambda old, new: delivered.append((old, new)))
    await run_until_quiet(informer, kube)
    objects = [obj for pair in delivered for obj in pair if obj is not None]
    assert objects
    assert all("labels" not in obj["metadata"] for obj in objects)


# --- Informer: write-through --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("remembered", "events", "changes"),
    [
        pytest.param(
            "6",
            [("MODIFIED", cm("a", "6"))],
            [("modified", "a", "6")],
            id="echo-of-our-write-dropped",
        ),
        pytest.param(
            "6",
            [("MODIFIED", cm("a", "4"))],
            [("modified", "a", "6")],
            id="older-event-dropped",
        ),
        pytest.param(
            "6",
            [("MODIFIED", cm("a", "6")), ("MODIFIED", cm("a", "7"))],
            [("modified", "a", "6"), ("modified", "a", "7")],
            id="newer-event-delivered",
        ),
        pytest.param(
            "5",
            [],
            [],
            id="remembering-the-stored-version-changes-nothing",
        ),
        pytest.param(
            "3",
            [],
            [],
            id="remembering-an-older-version-changes-nothing",
        ),
    ],
)
async def test_remember_and_its_echo(
    remembered: str, events: list[Event], changes: list[tuple[str, str, str]]
) -> None:
    kube = GatedKube(lists=[page([cm("a", "5")], "10")], watches=[events])
    informer, recorder, _ = informer_for(kube)
    await run_gated(informer, kube, lambda: informer.remember(cm("a", remembered)))
    assert recorder.changes == [("added", "a", "5"), *changes]


async def test_forget_delivers_the_deletion_once() -> None:
    kube = GatedKube(lists=[page([cm("a", "5")], "10")], watches=[[("DELETED", cm("a", "6"))]])
    informer, recorder, _ = informer_for(kube)

    def forget_twice() -> None:
        informer.forget(("ns", "a"))
        informer.forget(("ns", "a"))

    await run_gated(informer, kube, forget_twice)
    # Once by forget; the DELETED event that follows our DELETE finds nothing to delete.
    assert recorder.changes == [("added", "a", "5"), ("deleted", "a", "5")]


async def test_deletion_of_an_older_incarnation_keeps_the_remembered_one() -> None:
    kube = GatedKube(lists=[page([cm("a", "5")], "10")], watches=[[("DELETED", cm("a", "7"))]])
    informer, recorder, _ = informer_for(kube)

    def delete_and_create_again() -> None:
        informer.forget(("ns", "a"))  # we deleted it (its DELETED event carries RV 7)...
        informer.remember(cm("a", "9"))  # ...and created it again (RV 9) before that event came

    await run_gated(informer, kube, delete_and_create_again)
    assert informer.store is not None
    assert informer.store.get(("ns", "a")) == cm("a", "9")
    assert recorder.changes == [("added", "a", "5"), ("deleted", "a", "5"), ("added", "a", "9")]


def test_remember_through_a_fold() -> None:
    kube = ScriptedKube(lists=[page([], "10")], watches=[])
    fold = RvFold()
    informer, recorder, _ = informer_for(kube, fold=fold)
    informer.remember(cm("a", "3"))
    informer.remember(cm("a", "3"))
    informer.forget(("ns", "a"))
    informer.forget(("ns", "a"))
    assert recorder.changes == [("added", "a", "3"), ("deleted", "a", "")]


async def test_a_second_run_relists_against_what_was_kept() -> None:
    kube = ScriptedKube(lists=[page([cm("a", "1"), cm("b", "1")], "10")], watches=[])
    informer, recorder, _ = informer_for(kube)
    await run_until_quiet(informer, kube)
    assert kube.watches_closed == 1  # cancellation closed the watch stream
    kube._lists.append(page([cm("a", "1")], "20"))
    await run_until_quiet(informer, kube)
    assert recorder.changes == [("added", "a", "1"), ("added", "b", "1"), ("deleted", "b", "1")]
    assert informer.relists == 1


# --- where a LIST reads from; watch timeouts; Retry-After; blindness ----------------------------------


def list_reads(kube: ScriptedKube) -> list[tuple[str, str, str]]:
    return [(c["continue_"], c["resource_version"], c["resource_version_match"]) for c in kube.list_calls]


@pytest.mark.parametrize(
    ("failure", "relist"),
    [
        pytest.param(server_error(), ("", "15", NOT_OLDER_THAN), id="answered-error-any-newer-state"),
        pytest.param(ApiError(410, "Gone", "too old"), ("", "", ""), id="410-consistent"),
        pytest.param(
            ("ERROR", {"kind": "Status", "code": 410, "reason": "Expired"}), ("", "", ""), id="410-event"
        ),
    ],
)
async def test_a_relist_after_a_watch_failure_reads_from_the_cache_unless_gone(
    failure: Event | BaseException, relist: tuple[str, str, str]
) -> None:
    kube = ScriptedKube(
        lists=[page([cm("a", "1")], "10"), page([cm("a", "1")], "20")],
        watches=[[bookmark("15"), failure]],
    )
    informer, _, _ = informer_for(kube)
    await run_until_quiet(informer, kube)
    assert list_reads(kube) == [("", "", ""), relist]  # the first LIST: a consistent read


async def test_only_the_first_page_names_a_version_and_a_failed_list_reads_consistently() -> None:
    kube = ScriptedKube(
        lists=[page([], "10"), page([cm("a", "1")], "20", token="t1"), connection_error(), page([], "30")],
        watches=[[bookmark("15"), server_error()]],
    )
    informer, _, _ = informer_for(kube)
    await run_until_quiet(informer, kube)
    assert list_reads(kube) == [
        ("", "", ""),
        ("", "15", NOT_OLDER_THAN),
        ("t1", "", ""),  # a continue page follows its token's snapshot
        ("", "", ""),  # that LIST failed: the next one is a consistent read
    ]


@pytest.mark.parametrize(
    ("draw", "seconds"),
    [
        pytest.param(0.0, WATCH_TIMEOUT_MIN_SECONDS, id="lowest"),
        pytest.param(0.5, (WATCH_TIMEOUT_MIN_SECONDS + WATCH_TIMEOUT_MAX_SECONDS) // 2, id="middle"),
        pytest.param(0.9999, WATCH_TIMEOUT_MAX_SECONDS, id="highest"),
    ],
)
def test_watch_timeouts_are_drawn_from_their_range(draw: float, seconds: int) -> None:
    assert watch_timeout(lambda: draw) == seconds


async def test_each_watch_draws_its_timeout_and_its_idle_bound_follows() -> None:
    kube = ScriptedKube(lists=[page([], "10")], watches=[[bookmark("11")]] * 20)
    informer, _, _ = informer_for(kube)
    await run_until_quiet(informer, kube)
    timeouts = [c["timeout_seconds"] for c in kube.watch_calls]
    assert all(WATCH_TIMEOUT_MIN_SECONDS <= t <= WATCH_TIMEOUT_MAX_SECONDS for t in timeouts)
    assert len(set(timeouts)) > 1  # jittered: informers do not re-watch in lockstep
    assert all(c["idle_timeout"] == c["timeout_seconds"] + WATCH_IDLE_GRACE_SECONDS for c in kube.watch_calls)


async def test_a_retry_after_longer_than_the_backoff_is_waited_out() -> None:
    throttled = ApiError(429, "TooManyRequests", "storage is (re)initializing", retry_after=4.0)
    kube = ScriptedKube(lists=[throttled, page([], "10")], watches=[])
    informer, _, sleeps = informer_for(kube)
    await run_until_quiet(informer, kube)
    assert sleeps.delays == [4.0]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_an_open_watch_that_hears_nothing_past_its_bound_is_blind() -> None:
    kube = ScriptedKube(lists=[page([], "10")], watches=[])  # the watch hangs: hears nothing, ever
    clock = Clock()
    informer, _, _ = informer_for(kube, clock=clock)
    bound = BLIND_BOUND_FACTOR * (WATCH_TIMEOUT_MAX_SECONDS + WATCH_IDLE_GRACE_SECONDS)
    assert informer.blind_bound == bound
    assert informer.blind_for() == 0.0  # not watching yet
    task = asyncio.create_task(informer.run())
    try:
        async with asyncio.timeout(DEADLINE):
            await kube.quiet.wait()
        clock.now += bound
        assert informer.blind_for() == 0.0  # silent, but within its bound
        clock.now += 1
        assert informer.blind_for() == bound + 1
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert informer.blind_for() == 0.0  # stopped: no watch is open


async def test_a_blind_informer_fails_the_managers_liveness() -> None:
    kube = ScriptedKube(lists=[page([], "10")], watches=[])
    manager = Manager(kube, CollectorRegistry(), Tracing(trace.NoOpTracerProvider(), "test"))
    informer = manager.informer(Cache(CONFIGMAPS))
    clock = Clock()
    informer._clock = clock  # the manager builds its informers on the real clock
    task = asyncio.create_task(informer.run())
    try:
        async with asyncio.timeout(DEADLINE):
            await kube.quiet.wait()
        assert manager.liveness_problem() is None
        clock.now += informer.blind_bound + 1
        assert manager.liveness_problem() == (
            f"informer configmaps: its watch has heard nothing for {informer.blind_bound + 1:.0f}s"
        )
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
