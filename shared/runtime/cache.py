"""Informer-grade caches: a ``Store`` of one kind with named indexes, kept current by an ``Informer``
(LIST, then WATCH with bookmarks, replace on every re-list), or a ``Fold`` that aggregates a kind
without storing its objects (the GPUClass operator's Pods).

Decides:

* what a change is, for the handlers: ``(None, new)`` added, ``(old, new)`` modified, ``(old, None)``
  deleted; for a fold, ``(None, obj)`` when the aggregate changed and ``(stub, None)`` for a removal
  that changed it (``stub`` carries only the namespace and name);
* **replace** on every LIST (the first and each re-list): an object whose resourceVersion is the
  stored one is not delivered; a key missing from the complete list is delivered as a deletion, and
  only once the whole list (every page) has been read, so a list that fails half-way deletes
  nothing. A stored object newer than the list (our own write, remembered after the list's
  snapshot) is neither replaced nor deleted by it: the watch brings the truth right after. A fold's
  deletions are the keys it held when the LIST began and the LIST did not bring (so it need not
  remember every listed key; a key it took in by ``remember`` meanwhile stays, as a store's does);
* **write-through**: ``remember`` puts the answer of our own write into the store at once; the watch
  event that later carries the same resourceVersion is an echo and is dropped, and so is any event
  or listed object older than the stored version (when both resourceVersions are integers, as the
  API server's are; they are opaque strings otherwise and compared for equality only);
* when to LIST again: after a 410 Gone (an HTTP status or an ERROR event) or any answered error (a
  5xx, a 403, a 404 of a CRD gone), after a jittered backoff (``BACKOFF_INITIAL_SECONDS`` doubling up
  to ``BACKOFF_MAX_SECONDS``; a 429's Retry-After when it asks for longer). A watch the server ends
  normally is started again from the last resourceVersion seen (an event's or a BOOKMARK's), and so,
  after the same backoff, is a watch whose **connection** failed (no answer in time, a reset, a
  stream silent past its idle bound: one of the client's ``NO_ANSWER``): the store is right as of
  that version, and the API server's watch cache replays every change since, or answers 410 when
  that version is older than it keeps (then the LIST follows). As kube-rs's watcher does (client-go's
  reflector re-lists): one silent connection retires every connection of its time (``shared.kube``),
  so every informer's watch breaks with it, and a re-list of every kind at once would cost the API
  server and the process a burst of memory for changes a few watch requests bring (the
  EndpointAttachment soak measured a 5 MiB step of RSS from one such storm);
* **how long a watch lasts, and how long it may be silent**: HTTP/1.1 has no ping, and the only
  traffic the API server sends on a quiet watch is a BOOKMARK about every minute (from its watch
  cache, with ``allowWatchBookmarks``), often one 2 s before the watch's ``timeoutSeconds`` runs
  out, and the watch's end at that time. An idle bound tied to the
  minute's bookmark would leave an informer blind for over a minute behind a connection that died
  silently (a proxy or load balancer that lost its flows answers TCP keepalive for the dead peer).
  So each watch asks for a short ``timeoutSeconds``, drawn anew for every watch from
  [``WATCH_TIMEOUT_MIN_SECONDS``, ``WATCH_TIMEOUT_MAX_SECONDS``] (jittered, so informers do not
  re-watch in lockstep), and its idle bound is that plus ``WATCH_IDLE_GRACE_SECONDS``: a healthy
  watch never stays silent that long (its end comes before, and most often a bookmark before it), so
  a dead one is noticed within ``WATCH_TIMEOUT_MAX_SECONDS + WATCH_IDLE_GRACE_SECONDS`` (10 s) and
  the re-list follows at once. A watch that ends normally is resumed from the last resourceVersion
  it brought (its bookmark's, which keeps it fresh however quiet the kind) on a
  kept connection, from the API server's watch cache: no handshake, no re-list, a few requests a
  minute per informer;
* **where a LIST reads from**: the first LIST, and every LIST after a 410, is a consistent read
  (``resourceVersion`` unset): after a 410 nothing older than the server's present may replace the
  store, and a process's first LIST must not show less than an earlier replica saw (a
  ``resourceVersion=0`` read from a lagging watch cache could). Where the API server has
  ConsistentListFromCache (beta and on by default since Kubernetes 1.31; the pinned control plane
  is 1.37), that read is itself served from the watch cache once it has caught up with etcd. The
  first LIST after a watch failed for any other reason (an answered error but 410) asks for
  ``resourceVersion=<the last one seen>&resourceVersionMatch=NotOlderThan``: any state at least as
  new as what the store holds, served from the watch cache on every supported version, never older
  than the store, so replace stays right; its continue pages carry their own snapshot. Streaming
  lists (``sendInitialEvents``) are not used yet: replace would have to wait for the
  initial-events-end bookmark, which this loop does not read;
* an optional kind (``gate``, see ``served``): a LIST answered 404 while the kind's CRD is not
  established empties the cache (deletions delivered), counts as synced, and waits for the CRD;
* LISTed items carry the list's ``apiVersion`` and ``kind`` like watched ones (the API leaves them
  out of list items), so owner references can be made from any cached object.

The per-event path is lean on purpose (the GPUClass operator folds ~150,000 Pods): the client parses
each line once, objects are stored as given (after ``transform``), never copied, and nothing is
logged or traced per event. A handler (or fold, or indexer) that raises is logged with its traceback
and skipped; it never stops the informer.

Also decides when an informer is **blind**: a watch is open but nothing (an event, a bookmark, the
watch's end) has come for longer than ``blind_bound`` (twice its longest idle bound). The idle bound
should have ended that watch long before, so a blind informer is one whose client is wedged:
``blind_for`` tells the manager, whose liveness check fails on it. An informer that keeps failing to
LIST (the API server is down) is not blind: it knows, and restarting would not help.

Does not: copy objects (handlers and readers must not mutate them), resync periodically, decide what
a change means (predicates and map functions do), or retry a single request (the re-list does).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import (
    Awaitable,
    Callable,
    Hashable,
    ItemsView,
    Iterable,
    KeysView,
    Mapping,
    ValuesView,
)
from typing import Any, Final, NoReturn, Protocol

from shared.kube import NO_ANSWER, WATCH_IDLE_GRACE_SECONDS, ApiError, Kube, Obj
from shared.resources import Resource
from shared.runtime.served import NOT_FOUND, ServedGate

__all__ = [
    "BACKOFF_INITIAL_SECONDS",
    "BACKOFF_MAX_SECONDS",
    "WATCH_IDLE_GRACE_SECONDS",
    "ChangeHandler",
    "Fold",
    "Indexer",
    "Informer",
    "Key",
    "Obj",
    "Store",
    "View",
    "backoff_delay",
    "key_of",
    "strip_managed_fields",
]

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name); "" namespace for cluster-scoped objects
ChangeHandler = Callable[[Obj | None, Obj | None], None]
# The index values an object is filed under, given the object (or, where its cache declares a view,
# its typed view).
Indexer = Callable[[Any], Iterable[Hashable]]
View = Callable[[Obj], Any]  # an object's typed view (an operator's ``api.py`` defines it)

# The first pause before listing again: long enough not to spin on a server that refuses at once,
# short enough that a lost watch costs well under a second of events.
BACKOFF_INITIAL_SECONDS: Final = 0.2
# The longest pause: a re-list of every Pod is expensive, but a cache more than a few seconds
# behind the API is worse (reconciles decide from it).
BACKOFF_MAX_SECONDS: Final = 5.0
# Each pause is drawn from [(1 - jitter) x delay, delay], so replicas that lost the API server at
# the same moment do not come back to it at the same moment.
BACKOFF_JITTER: Final = 0.5
# A watch that lived this long before it failed was healthy: the failure starts a new backoff.
HEALTHY_WATCH_SECONDS: Final = 30.0
# Each watch asks the server to end it after a number of seconds drawn from this range (see the module
# docstring): the server's bookmark (2 s before the end) and the end itself are the watch's pulse.
WATCH_TIMEOUT_MIN_SECONDS: Final = 5
WATCH_TIMEOUT_MAX_SECONDS: Final = 7
# An open watch that heard nothing for this many times its longest idle bound is blind: the idle
# bound did not end it, so the client is wedged (the manager's liveness check fails on it).
BLIND_BOUND_FACTOR: Final = 2.0
# Beyond this many doublings the delay is capped anyway; it keeps 2**n a small number.
_MAX_DOUBLINGS: Final = 16
GONE: Final = 410  # the resourceVersion (or continue token) is older than the server keeps
# A LIST's resourceVersionMatch: any state at least as new as the version named (the watch cache's).
NOT_OLDER_THAN: Final = "NotOlderThan"

_NO_INDEX_VALUES: Final[frozenset[Hashable]] = frozenset()


def key_of(obj: Mapping[str, Any]) -> Key:
    metadata = obj["metadata"]
    return metadata.get("namespace") or "", metadata["name"]


def strip_managed_fields(obj: Obj) -> Obj:
    """What a cache keeps of an object by default: everything but ``managedFields``, which no
    reconcile reads and which is often the largest part of an object (a Service, a slice)."""
    metadata = obj.get("metadata")
    if isinstance(metadata, dict) and "managedFields" in metadata:
        obj = {**obj, "metadata": {k: v for k, v in metadata.items() if k != "managedFields"}}
    return obj


def backoff_delay(failures: int, draw: Callable[[], float] = random.random) -> float:
    """The pause before LIST number ``failures`` in a row (1 = the first failure)."""
    doublings = min(max(failures - 1, 0), _MAX_DOUBLINGS)
    ceiling = min(BACKOFF_MAX_SECONDS, BACKOFF_INITIAL_SECONDS * 2.0**doublings)
    return ceiling * (1.0 - BACKOFF_JITTER * draw())


def watch_timeout(draw: Callable[[], float] = random.random) -> int:
    """The ``timeoutSeconds`` of one watch, drawn from [MIN, MAX] (whole seconds, as the API takes)."""
    span = WATCH_TIMEOUT_MAX_SECONDS - WATCH_TIMEOUT_MIN_SECONDS
    return WATCH_TIMEOUT_MIN_SECONDS + min(int(draw() * (span + 1)), span)


def _older(version: str, than: str) -> bool:
    """``version`` is before ``than``: only when both are integers (else they are opaque)."""
    try:
        return int(version) < int(than)
    except (TypeError, ValueError):
        return False


def _version(obj: Obj) -> str:
    return (obj.get("metadata") or {}).get("resourceVersion") or ""


class Store:
    """Objects of one kind by Key, with named indexes kept on every upsert/delete, and, when ``view``
    is given, each stored version's typed view (computed once, before the indexers, which read it).

    An indexer runs before anything changes, so one that raises leaves the store as it was.
    ``index`` lists objects in key order (so what a reader builds from it is deterministic)."""

    def __init__(self, indexers: Mapping[str, Indexer] | None = None, view: View | None = None) -> None:
        self._objects: dict[Key, Obj] = {}
        # The typed view of each stored version, computed once when it is stored (``view_of``).
        self._view, self._views = view, dict[Key, Any]()
        self._indexers: dict[str, Indexer] = dict(indexers or {})
        # index name -> value -> keys filed under it; and per index, the values each key is under.
        self._indices: dict[str, dict[Hashable, set[Key]]] = {name: {} for name in self._indexers}
        self._filed: dict[str, dict[Key, frozenset[Hashable]]] = {name: {} for name in self._indexers}

    def get(self, key: Key) -> Obj | None:
        return self._objects.get(key)

    def view_of(self, obj: Obj) -> Any:
        """The store's typed view of ``obj``: kept since it was stored when it is the stored version
        (no copy, no second computation), else computed now (a version not stored: an answer, a
        test's object). A store declared without a view answers the object itself."""
        if self._view is None:
            return obj
        metadata = obj["metadata"]
        key = (metadata.get("namespace") or "", metadata["name"])  # ``key_of``, inline: a hot path
        if self._objects.get(key) is obj:
            return self._views[key]
        return self._view(obj)

    def __contains__(self, key: object) -> bool:
        return key in self._objects

    def __len__(self) -> int:
        return len(self._objects)

    def keys(self) -> KeysView[Key]:
        return self._objects.keys()

    def values(self) -> ValuesView[Obj]:
        return self._objects.values()

    def items(self) -> ItemsView[Key, Obj]:
        return self._objects.items()

    def index(self, name: str, value: Hashable) -> list[Obj]:
        """The objects filed under ``value`` in index ``name``, in key order."""
        index = self._indices.get(name)
        keys = index.get(value) if index is not None else self._no_index(name)
        return list(map(self._objects.__getitem__, sorted(keys))) if keys else []

    def index_keys(self, name: str, value: Hashable) -> frozenset[Key]:
        index = self._indices.get(name)
        return frozenset(index.get(value, ()) if index is not None else self._no_index(name))

    def upsert(self, obj: Obj) -> Obj | None:
        """Store ``obj`` under its key; returns the previous version (None: it is new)."""
        key = key_of(obj)
        view = self._view(obj) if self._view is not None else obj
        values = {name: frozenset(indexer(view)) for name, indexer in self._indexers.items()}
        if self._view is not None:
            self._views[key] = view
        previous = self._objects.get(key)
        self._objects[key] = obj
        for name, filed_under in values.items():
            self._refile(name, key, filed_under)
        return previous

    def delete(self, key: Key) -> Obj | None:
        """Remove ``key``; returns what was removed (None: nothing was there)."""
        previous = self._objects.pop(key, None)
        self._views.pop(key, None)
        if previous is not None:
            for name in self._indexers:
                self._refile(name, key, _NO_INDEX_VALUES)
        return previous

    def _no_index(self, name: str) -> NoReturn:
        """An unknown index name is a programming error: said plainly."""
        raise KeyError(f"no index named {name!r} (indexes: {', '.join(self._indices) or 'none'})")

    def _refile(self, name: str, key: Key, values: frozenset[Hashable]) -> None:
        filed = self._filed[name]
        before = filed.get(key, _NO_INDEX_VALUES)
        if before == values:
            return
        index = self._indices[name]
        for value in before - values:
            keys = index[value]
            keys.discard(key)
            if not keys:
                del index[value]
        for value in values - before:
            filed_with = index.get(value)
            if filed_with is None:
                index[value] = {key}
            else:
                filed_with.add(key)
        if values:
            filed[key] = values
        else:
            filed.pop(key, None)


class Fold(Protocol):
    """An aggregate: folds objects without storing them (GPUClass pods)."""

    def upsert(self, key: Key, obj: Obj) -> bool:
        """Fold in the current version of ``key``; True when the aggregate changed."""
        ...

    def delete(self, key: Key) -> bool:
        """Fold ``key`` out; True when the aggregate changed."""
        ...

    def keys(self) -> Iterable[Key]:
        """The keys it currently holds something for."""
        ...


class Informer:
    """LIST then WATCH one kind (optionally one namespace, selectors) into a store or a fold."""

    def __init__(
        self,
        kube: Kube,
        resource: Resource,
        *,
        store: Store | None = None,
        fold: Fold | None = None,
        label_selector: str = "",
        field_selector: str = "",
        transform: Callable[[Obj], Obj] | None = None,
        page_size: int = 500,
        watch_timeout_seconds: int | None = None,
        idle_timeout_seconds: float | None = None,
        name: str = "",
        namespace: str | None = None,
        gate: ServedGate | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if (store is None) == (fold is None):
            raise ValueError("an Informer keeps exactly one of a store or a fold")
        self.kube, self.resource = kube, resource
        self.store, self.fold = store, fold
        self.label_selector, self.field_selector = label_selector, field_selector
        self.transform = transform
        self.page_size = page_size
        # None: drawn per watch (``watch_timeout``), and the idle bound is that plus the grace.
        self.watch_timeout_seconds = watch_timeout_seconds
        self.idle_timeout_seconds = idle_timeout_seconds
        longest = watch_timeout_seconds or WATCH_TIMEOUT_MAX_SECONDS
        self.blind_bound = BLIND_BOUND_FACTOR * (idle_timeout_seconds or longest + WATCH_IDLE_GRACE_SECONDS)
        self.name = name or resource.plural
        self.path = resource.path(namespace)
        self.synced = asyncio.Event()
        self.relists = 0
        self.resumes = 0  # watches resumed after their connection failed, without a LIST
        # An optional kind (``served``): whether the API served it at the last LIST.
        self.gate = gate
        self.served = gate is None or gate.served()
        # Where the next watch starts: the last list's, event's or bookmark's resourceVersion.
        self.resource_version = ""
        self._handlers: list[ChangeHandler] = []
        self._sleep, self._clock = sleep, clock
        self._listed = False  # any LIST started, by this run or an earlier one
        # The next LIST may read any state at least this new (a watch failed, not with a 410).
        self._relist_from = ""
        self._watching = False  # a watch request is open
        self._heard = 0.0  # when the open watch last brought anything (or was opened)

    def add_handler(self, handler: ChangeHandler) -> None:
        self._handlers.append(handler)

    def has_synced(self) -> bool:
        return self.synced.is_set()

    def blind_for(self) -> float:
        """Seconds an open watch has heard nothing, when past ``blind_bound`` (else 0)."""
        if not self._watching:
            return 0.0
        silent = self._clock() - self._heard
        return silent if silent > self.blind_bound else 0.0

    # --- write-through ---------------------------------------------------------------------------

    def remember(self, obj: Obj) -> None:
        """Our own write's answer: into the store now, handlers run with ``(old, obj)``; the watch
        event with the same resourceVersion is dropped later as an echo."""
        if self.transform is not None:
            obj = self.transform(obj)
        if self.fold is not None:
            if self.fold.upsert(key_of(obj), obj):
                self._deliver(None, obj)
            return
        self._upsert(obj)

    def forget(self, key: Key) -> None:
        """Our own DELETE was answered: drop ``key`` and run handlers with ``(old, None)``."""
        if self.fold is not None:
            if self.fold.delete(key):
                self._deliver(_stub(key), None)
            return
        assert self.store is not None
        old = self.store.delete(key)
        if old is not None:
            self._deliver(old, None)

    # --- the loop --------------------------------------------------------------------------------

    async def run(self) -> None:
        """LIST, then WATCH, forever; after a failure, LIST again (replace), or only WATCH again
        when the watch's connection failed (see the module docstring). Ends when cancelled; a later
        ``run`` of the same informer starts with a re-list against what it kept."""
        failures = 0
        resume = False  # the last watch's connection failed: watch again from its last version
        while True:
            watch_started: float | None = None
            try:
                if not resume and not await self._list_and_sync():
                    continue
                resume = False
                while True:
                    watch_started = self._clock()
                    await self._watch()
                    failures = 0  # the server ended it: the connection is healthy
            except Exception as error:
                self._watching = False
                gone = isinstance(error, ApiError) and error.status == GONE
                # A watch that failed otherwise leaves the store right as of its last version.
                self._relist_from = self.resource_version if watch_started is not None and not gone else ""
                # A watch whose connection failed (no answer in time, a reset, a stream gone
                # silent) is resumed from that version: no LIST (see the module docstring).
                resume = isinstance(error, NO_ANSWER) and bool(self._relist_from)
                if resume:
                    self.resumes += 1
                if watch_started is not None and self._clock() - watch_started >= HEALTHY_WATCH_SECONDS:
                    failures = 0
                failures += 1
                delay = backoff_delay(failures)
                if isinstance(error, ApiError) and error.retry_after is not None:
                    delay = max(delay, error.retry_after)  # the server said when to come back
                self._log_failure(error, delay, resume)
                await self._sleep(delay)

    async def _list_and_sync(self) -> bool:
        """One LIST (replace), then synced. False when the kind is not served: the cache was
        emptied and this waited until its CRD is established (list again then)."""
        if self._listed:
            self.relists += 1
        self._listed = True
        try:
            await self._list()
        except ApiError as error:
            if self.gate is None or error.status != NOT_FOUND or self.gate.served():
                raise
            self._not_served()
            await self.gate.wait_served()
            return False
        self.served = True
        self.synced.set()
        return True

    async def _list(self) -> None:
        """One complete LIST, applied with replace semantics; deletions only once it is complete.

        A store remembers every listed key (its deletions are the stored keys not among them). A
        fold remembers only what it held when the LIST began and has not been listed since: those
        are its deletions, so the LIST of 150,000 Pods that fold into a few thousand contributions
        keeps no set of 150,000 keys (a cold start's fold holds nothing: it keeps nothing)."""
        fold = self.fold
        seen: set[Key] = set()
        unlisted: set[Key] | None = set(fold.keys()) if fold is not None else None
        token = ""
        list_version = ""
        # The first page names where to read from (see the module docstring); the rest follow their
        # continue token's snapshot (the API takes no resourceVersion with one).
        since, self._relist_from = self._relist_from, ""
        while True:
            page = await self.kube.list(
                self.path,
                label_selector=self.label_selector,
                field_selector=self.field_selector,
                limit=self.page_size,
                continue_=token,
                resource_version=since if not token else "",
                resource_version_match=NOT_OLDER_THAN if since and not token else "",
            )
            metadata = page.get("metadata") or {}
            list_version = metadata.get("resourceVersion") or list_version
            api_version = page.get("apiVersion") or self.resource.api_version
            kind = (page.get("kind") or "").removesuffix("List")
            for obj in page.get("items") or ():
                if "kind" not in obj and kind:
                    obj["apiVersion"] = api_version
                    obj["kind"] = kind
                if self.transform is not None:
                    obj = self.transform(obj)
                if unlisted is None:
                    seen.add(key_of(obj))
                elif unlisted:
                    unlisted.discard(key_of(obj))
                self._apply_upsert(obj)
            token = metadata.get("continue") or ""
            if not token:
                break
        if unlisted is not None:
            for key in unlisted:
                self._apply_delete(key, None)
        else:
            self._delete_unseen(seen, list_version)
        self.resource_version = list_version

    def _not_served(self) -> None:
        """The kind is not served (its CRD is not established): nothing of it exists. What the
        cache still holds goes as deletions, and the empty world counts as synced."""
        log.info("%s: not served by the API; waiting until it is", self.name)
        self.served = False
        self._delete_unseen(set(), "")
        self.resource_version = self._relist_from = ""  # a new CRD's objects: a consistent LIST
        self.synced.set()

    def _delete_unseen(self, seen: set[Key], list_version: str) -> None:
        if self.fold is not None:
            held = self.fold.keys()
            for key in [key for key in held if key not in seen]:
                self._apply_delete(key, None)
            return
        assert self.store is not None
        for key, obj in [(k, o) for k, o in self.store.items() if k not in seen]:
            if list_version and _older(list_version, _version(obj)):
                continue  # remembered after the list's snapshot: the watch tells what became of it
            self._apply_delete(key, None)

    async def _watch(self) -> None:
        """One watch request from ``resource_version``; returns when the server ends it normally."""
        timeout = self.watch_timeout_seconds or watch_timeout()
        events = self.kube.watch(
            self.path,
            resource_version=self.resource_version,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            timeout_seconds=timeout,
            idle_timeout=self.idle_timeout_seconds or timeout + WATCH_IDLE_GRACE_SECONDS,
        )
        transform = self.transform
        clock = self._clock
        self._heard, self._watching = clock(), True
        try:
            async with contextlib.aclosing(events):
                async for kind, obj in events:
                    self._heard = clock()
                    if kind == "ERROR":
                        raise _status_error(obj)
                    metadata = obj.get("metadata") or {}
                    if kind != "BOOKMARK":
                        try:
                            if kind == "DELETED":
                                self._apply_delete(key_of(obj), obj)
                            else:
                                self._apply_upsert(transform(obj) if transform is not None else obj)
                        except Exception:
                            log.exception(
                                "%s: a %s event of %s not applied", self.name, kind, _describe(metadata)
                            )
                    version = metadata.get("resourceVersion")
                    if version:
                        self.resource_version = version
        finally:
            self._watching = False

    # --- applying one change -----------------------------------------------------------------------

    def _apply_upsert(self, obj: Obj) -> None:
        if self.fold is not None:
            try:
                changed = self.fold.upsert(key_of(obj), obj)
            except Exception:
                log.exception("%s: the fold failed on %s", self.name, _describe(obj.get("metadata") or {}))
                return
            if changed:
                self._deliver(None, obj)
            return
        self._upsert(obj)

    def _upsert(self, obj: Obj) -> None:
        store = self.store
        assert store is not None
        old = store.get(key_of(obj))
        if old is not None:
            version, stored = _version(obj), _version(old)
            if version == stored or _older(version, stored):
                return  # unchanged, an echo of our own write, or stale
        store.upsert(obj)
        self._deliver(old, obj)

    def _apply_delete(self, key: Key, final: Obj | None) -> None:
        """Delete ``key``; ``final`` is the object the DELETED event carried (None: a re-list), as
        received: it is transformed only when a handler gets it."""
        if self.fold is not None:
            try:
                changed = self.fold.delete(key)
            except Exception:
                log.exception("%s: the fold failed to delete %s/%s", self.name, *key)
                return
            if changed:
                self._deliver(_stub(key), None)
            return
        store = self.store
        assert store is not None
        stored = store.get(key)
        if stored is None:
            return  # never seen, or our own DELETE already forgot it
        if final is not None and _older(_version(final), _version(stored)):
            return  # an older incarnation's deletion; the stored one was remembered after it
        store.delete(key)
        if final is None:
            final = stored
        elif self.transform is not None:
            final = self.transform(final)
        self._deliver(final, None)

    def _deliver(self, old: Obj | None, new: Obj | None) -> None:
        for handler in self._handlers:
            try:
                handler(old, new)
            except Exception:
                log.exception("%s: a change handler failed", self.name)

    def _log_failure(self, error: Exception, delay: float, resume: bool) -> None:
        then = "watching again from its last version" if resume else "listing again"
        if isinstance(error, ApiError) and error.status == GONE:
            log.info("%s: %s; %s in %.2fs", self.name, error, then, delay)
        elif isinstance(error, (ApiError, *NO_ANSWER)):
            log.warning("%s: %s: %s; %s in %.2fs", self.name, type(error).__name__, error, then, delay)
        else:
            log.warning("%s: unexpected failure; %s in %.2fs", self.name, then, delay, exc_info=error)


def _stub(key: Key) -> Obj:
    return {"metadata": {"namespace": key[0], "name": key[1]}}


def _status_error(status: Obj) -> ApiError:
    """An ERROR event's Status object as the error a request answered with it would raise."""
    code = status.get("code")
    return ApiError(
        code if isinstance(code, int) else 0,
        str(status.get("reason") or ""),
        str(status.get("message") or "watch ERROR event"),
    )


def _describe(metadata: Mapping[str, Any]) -> str:
    namespace, name = metadata.get("namespace"), metadata.get("name")
    return f"{namespace}/{name}" if namespace else str(name)
