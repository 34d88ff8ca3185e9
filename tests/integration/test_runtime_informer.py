"""The runtime's Informer against the real API server: paged LIST, WATCH, and replace on re-list.

Each test waits on what the informer delivers (an asyncio event set by its handler) with a deadline,
never for a fixed time. To make one running informer re-list, its first watch is held back while
objects change, then hears nothing (a selector no object matches) and fails by its real idle timeout,
as over a dead connection: the changes, a deletion above all, can only reach the informer through
the re-list's replace. (A watch from a long-gone resourceVersion is no sure way to a 410 here: a
fresh control plane's etcd has compacted nothing yet and serves it. The unit tests cover 410.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Hashable, Iterable
from typing import Any

import pytest

from shared.kube import ApiTimeoutError, Kube, Obj
from shared.resources import CONFIGMAPS
from shared.runtime.cache import WATCH_IDLE_GRACE_SECONDS, WATCH_TIMEOUT_MIN_SECONDS, Informer, Store

LABEL = "test.cozystack.io/informer"
DEADLINE = 30.0  # seconds; each wait here is over in well under one on an idle control plane
IDLE_SECONDS = 0.5  # a watch's idle timeout in these tests: no bookmark comes that soon

Change = tuple[str, str]  # (added | modified | deleted, name)


def configmap(name: str, color: str = "red", *, labelled: bool = True) -> Obj:
    labels = {LABEL: "yes"} if labelled else {}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels},
        "data": {"color": color},
    }


def by_color(obj: Obj) -> Iterable[Hashable]:
    return [(obj.get("data") or {}).get("color")]


class Seen:
    """A change handler that records (what, name)."""

    def __init__(self, informer: Informer) -> None:
        self.informer = informer
        self.changes: list[Change] = []
        self._changed = asyncio.Event()
        informer.add_handler(self)

    def __call__(self, old: Obj | None, new: Obj | None) -> None:
        what = "added" if old is None else "deleted" if new is None else "modified"
        obj = new if new is not None else old
        assert obj is not None
        self.changes.append((what, obj["metadata"]["name"]))
        self._changed.set()

    async def until(self, done: Callable[[list[Change]], bool], what: str) -> None:
        try:
            async with asyncio.timeout(DEADLINE):
                while not done(self.changes):
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(f"timed out waiting for {what}; delivered: {self.changes}") from None


@contextlib.asynccontextmanager
async def running(informer: Informer) -> AsyncIterator[None]:
    """The informer's run() as a task, synced on entry, cancelled (and ended) on exit."""
    task = asyncio.create_task(informer.run())
    try:
        async with asyncio.timeout(DEADLINE):
            await informer.synced.wait()
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert task.cancelled()


async def test_informer_lists_in_pages_then_watches(kube: Kube, namespace: str) -> None:
    path = CONFIGMAPS.path(namespace)
    for name in ("old-1", "old-2", "old-3"):
        await kube.create(path, configmap(name))
    store = Store({"color": by_color})
    informer = Informer(
        kube, CONFIGMAPS, store=store, namespace=namespace, label_selector=f"{LABEL}=yes", page_size=2
    )
    seen = Seen(informer)
    async with running(informer):
        # The first LIST (two pages) is in before synced is set, with apiVersion and kind filled in.
        assert sorted(seen.changes) == [("added", "old-1"), ("added", "old-2"), ("added", "old-3")]
        assert {o["kind"] for o in store.values()} == {"ConfigMap"}

        await kube.create(path, configmap("outside", labelled=False))
        await kube.create(path, configmap("a"))
        await kube.patch(CONFIGMAPS.path(namespace, "a"), {"data": {"color": "blue"}}, "merge")
        await kube.delete(CONFIGMAPS.path(namespace, "old-1"))
        await seen.until(lambda c: ("deleted", "old-1") in c, "the deletion of old-1")

        assert seen.changes[3:] == [("added", "a"), ("modified", "a"), ("deleted", "old-1")]
        assert {o["metadata"]["name"] for o in store.index("color", "blue")} == {"a"}
        assert {o["metadata"]["name"] for o in store.index("color", "red")} == {"old-2", "old-3"}
        assert informer.relists == 0


class DeafFirstWatch(Kube):
    """The real client, but the informer's first watch waits for ``gate`` and then hears nothing (a
    selector no object matches), so it fails by its idle timeout like a dead connection."""

    def __init__(self, kube: Kube) -> None:
        super().__init__(kube.credentials, reload=kube.reload, timeout=kube.timeout)
        self.gate = asyncio.Event()
        self.watches = 0

    async def watch(self, path: str, **kwargs: Any) -> AsyncGenerator[tuple[str, Obj]]:
        self.watches += 1
        if self.watches == 1:
            await self.gate.wait()
            kwargs.update(label_selector=f"{LABEL}=nobody", idle_timeout=IDLE_SECONDS)
        async for event in super().watch(path, **kwargs):
            yield event


async def test_a_watch_gone_silent_resumes_from_its_version_and_delivers_what_changed_meanwhile(
    kube: Kube, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = CONFIGMAPS.path(namespace)
    for name in ("kept", "changed", "vanished"):
        await kube.create(path, configmap(name))
    deaf = DeafFirstWatch(kube)
    informer = Informer(deaf, CONFIGMAPS, store=Store(), namespace=namespace, label_selector=f"{LABEL}=yes")
    seen = Seen(informer)
    with caplog.at_level(logging.WARNING, logger="shared.runtime.cache"):
        async with running(informer):
            assert sorted(seen.changes) == [("added", "changed"), ("added", "kept"), ("added", "vanished")]
            # While the informer's first watch is held back, the namespace changes under it; that
            # watch then goes silent past its idle bound, so these changes can only come from the
            # next watch, resumed from the LIST's version (the API server's watch cache replays them).
            await kube.delete(CONFIGMAPS.path(namespace, "vanished"))
            await kube.patch(CONFIGMAPS.path(namespace, "changed"), {"data": {"color": "blue"}}, "merge")
            await kube.create(path, configmap("new"))
            deaf.gate.set()
            await seen.until(
                lambda c: {("deleted", "vanished"), ("modified", "changed"), ("added", "new")} <= set(c),
                "the resumed watch's changes",
            )
    assert sorted(seen.changes[3:]) == [("added", "new"), ("deleted", "vanished"), ("modified", "changed")]
    assert (informer.relists, informer.resumes) == (0, 1)  # no LIST: the watch brought them
    assert informer.store is not None
    assert sorted(o["metadata"]["name"] for o in informer.store.values()) == ["changed", "kept", "new"]
    assert any("ApiTimeoutError" in r.getMessage() for r in caplog.records)  # the idle timeout


async def test_a_second_run_of_the_same_informer_replaces_what_it_kept(kube: Kube, namespace: str) -> None:
    path = CONFIGMAPS.path(namespace)
    for name in ("a", "b"):
        await kube.create(path, configmap(name))
    informer = Informer(kube, CONFIGMAPS, store=Store(), namespace=namespace, label_selector=f"{LABEL}=yes")
    seen = Seen(informer)
    async with running(informer):
        pass
    # Stopped: nothing is watching while b goes.
    await kube.delete(CONFIGMAPS.path(namespace, "b"))
    async with running(informer):
        await seen.until(lambda c: ("deleted", "b") in c, "b's deletion from the re-list")
    assert sorted(seen.changes) == [("added", "a"), ("added", "b"), ("deleted", "b")]
    assert informer.relists == 1


async def test_watch_idle_timeout_is_a_clear_timeout_error(kube: Kube, namespace: str) -> None:
    listing = await kube.list(CONFIGMAPS.path(namespace))
    events = kube.watch(
        CONFIGMAPS.path(namespace),
        resource_version=listing["metadata"]["resourceVersion"],
        idle_timeout=IDLE_SECONDS,
    )
    async with asyncio.timeout(DEADLINE), contextlib.aclosing(events):
        with pytest.raises(ApiTimeoutError):
            async for _ in events:
                pass


async def test_a_quiet_watch_ends_on_time(kube: Kube, namespace: str) -> None:
    """The pulse the informers' idle bound relies on: a watch with nothing to tell, from a recent
    resourceVersion (served by the watch cache), is ended by the server at its short timeoutSeconds,
    within the idle bound; at most a BOOKMARK comes before (the watch cache sends one 2 s before
    the end when its bookmark timer catches the watch, not every time)."""
    listing = await kube.list(CONFIGMAPS.path(namespace))
    started = asyncio.get_running_loop().time()
    events = kube.watch(
        CONFIGMAPS.path(namespace),
        resource_version=listing["metadata"]["resourceVersion"],
        timeout_seconds=WATCH_TIMEOUT_MIN_SECONDS,
        idle_timeout=WATCH_TIMEOUT_MIN_SECONDS + WATCH_IDLE_GRACE_SECONDS,
    )
    async with asyncio.timeout(DEADLINE), contextlib.aclosing(events):
        kinds = [kind async for kind, _ in events]
    took = asyncio.get_running_loop().time() - started
    assert set(kinds) <= {"BOOKMARK"}
    assert WATCH_TIMEOUT_MIN_SECONDS - 1 <= took < WATCH_TIMEOUT_MIN_SECONDS + WATCH_IDLE_GRACE_SECONDS
