"""One controller: its wiring (what wakes which key), its queue, its workers and its reconcile calls.

Decides, as controller-runtime's builder and controller do:

* **wiring** is data (``Wiring``): the primary kind (each change wakes its own key, or the key its
  ``key`` function names), owned kinds (a change wakes the primary named by the object's controller
  reference; ``Owns`` adds predicates), watched kinds with a named map function (given the wiring's
  read model, built once over the caches, or the caches themselves, and one version of the object;
  the runtime maps both versions of a change) and predicates;
  ``reads`` lists the other caches ``reconcile`` reads, so the manager can hold the workers until
  every one of them has synced; ``writes`` lists the verbs ``reconcile`` uses, so a test can hold
  the ClusterRole to exactly what the wiring declares;
* a change made by a reconcile's own write (write-through, see ``writes``) never wakes the key that
  made it: that pass already decided with what it wrote. That holds too when the write's watch event
  comes before its answer: a change that would wake a key whose pass is running is held until the
  pass ends, and dropped if it carries the resourceVersion of one of the pass's own answers (the
  same object, as written); otherwise the key is queued then, its queue time counted from the
  change (not with ``debounce``: that queue's hold already folds a burst, and would start later);
* an owned object's change wakes its owner only while the owner is cached: one not seen yet is woken
  by its own add, and one gone has nothing left to decide (its deletion woke its last pass), so the
  garbage collector removing what it owned wakes no one;
* ``reconcile(key)`` returns a ``Result`` (``requeue_after`` for a timed re-check, ``again`` to
  decide again at once, bounded and counted, then with backoff) or raises: ``TerminalError`` is
  counted and not retried, ``Conflict`` is retried with backoff without a traceback, anything else
  is logged and retried with backoff;
* every reconcile is one traced pass (linked to the previous pass over the same key and to the pass
  that wrote the primary object; a pass finding its object gone forgets the key's link) and is
  measured by controller-runtime's metrics;
* ``resync`` re-queues every primary key periodically (GPUClass's KubeVirt recheck).

Does not: start caches or decide leadership (the manager does both before ``run``), or know
anything about a kind beyond its ``Resource`` (whose ``kind`` owner references name).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Final, Generic, Protocol, TypeVar

from shared.kube import NO_ANSWER, ApiError
from shared.ownership import names_kind, sole_controller
from shared.resources import Resource
from shared.runtime.cache import Fold, Indexer, Key, Obj, Store, View, key_of, strip_managed_fields
from shared.runtime.metrics import ControllerMetrics, QueueMetrics
from shared.runtime.queue import QueueShutDown, RateLimiter, WorkQueue
from shared.telemetry.tracing import OUTCOME_ERROR, PassSpan, Tracing, trace_id_hex

log = logging.getLogger(__name__)
T = TypeVar("T")

# controller-runtime's result label values.
RESULT_SUCCESS: Final = "success"
RESULT_ERROR: Final = "error"
RESULT_REQUEUE: Final = "requeue"
RESULT_REQUEUE_AFTER: Final = "requeue_after"


@dataclass(frozen=True)
class Result:
    """What a reconcile asks for next: nothing (level-based: the next change wakes it), a re-check
    after ``requeue_after`` seconds, or (``again``) a new decision at once: the pass's own write
    changed what it decides from (a mint answered, a refusal remembered; the answer is already in
    the caches). The runtime decides again up to ``MAX_DECISIONS_PER_PASS`` times in the pass, each
    counted; a key still unsettled then runs again with its backoff, behind other keys."""

    requeue_after: float | None = None
    again: bool = False


# Decisions in one pass before a key that keeps asking ``again`` yields its worker (with backoff).
MAX_DECISIONS_PER_PASS: Final = 4


class TerminalError(Exception):
    """An outcome no retry can change (the object itself is wrong): counted, never retried. The
    reconciler reports it to people as a condition before raising, if it can."""


class Conflict(Exception):
    """What the pass decided from is stale (a 409, a failed ``test`` of a guarded patch): run the
    key again with backoff, quietly; the caches will have caught up by then."""


class Memory(Generic[T]):
    """What a reconciler remembers of a key between passes (a refusal, a hold), owned by the
    runtime: the controller it is given to forgets a key when the primary's deletion is delivered,
    so nothing outlives its object. Lost on a restart, by design: it only saves a request."""

    def __init__(self) -> None:
        self._entries: dict[Key, T] = {}

    def get(self, key: Key) -> T | None:
        return self._entries.get(key)

    def set(self, key: Key, value: T) -> None:
        self._entries[key] = value

    def forget(self, key: Key) -> None:
        self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)


async def decide(reconciler: Reconciler, key: Key, on_again: Callable[[], None] = lambda: None) -> Result:
    """The decisions of one pass: ``reconcile`` again while it asks ``again``, at most
    ``MAX_DECISIONS_PER_PASS`` times (``on_again`` counts each); the answers of each decision's
    writes enter the caches before the next decision and before the pass ends."""
    outcome = Result()
    for _ in range(MAX_DECISIONS_PER_PASS):
        outcome = await reconciler.reconcile(key) or Result()
        await asyncio.sleep(0)  # the answers of its writes enter the caches (``Writer.remember``)
        if not outcome.again:
            return outcome
        on_again()
    return outcome


def condition_reasons(obj: Obj | None) -> list[str]:
    """The reasons of an object's status conditions, for its pass's span."""
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return [str(c.get("reason")) for c in conditions if isinstance(c, Mapping)]


class NotLeader(Exception):
    """This replica does not (or no longer) hold the lease: it must not write. The pass ends
    quietly and is not retried here: the manager stops the controllers (a standby picks the key up
    from its own caches)."""


class Caches(Protocol):
    """What map functions and reconcilers read: one synced store per watched kind."""

    def store(self, resource: Resource) -> Store: ...

    def served(self, resource: Resource) -> bool: ...


# A map function is given one version of one object (never None): the runtime calls it with both
# versions of a change, so a change also wakes whom the old version concerned. What depends on the
# change itself (a field that moved) is a predicate of the watch, as in controller-runtime.
MapFunc = Callable[[Any, Obj], Iterable[Key]]  # (the wiring's read model, or the caches; one version)
Predicate = Callable[[Obj | None, Obj | None], bool]
KeyFunc = Callable[[Obj], Key]


class Reconciler(Protocol):
    async def reconcile(self, key: Key) -> Result | None: ...


# --- predicates: named, pure, (old, new) -> wake or not -------------------------------------------


def _metadata(obj: Obj | None) -> Mapping[str, Any]:
    return (obj or {}).get("metadata") or {}


def _generation(obj: Obj) -> object:
    return _metadata(obj).get("generation")


def any_change(old: Obj | None, new: Obj | None) -> bool:
    """Every add, change and delete."""
    return True


def generation_changed(old: Obj | None, new: Obj | None) -> bool:
    """Adds, deletes, and changes of what ``generation`` covers (spec), or of the deletion mark:
    a status-only write (ours, usually) wakes no one."""
    if old is None or new is None:
        return True
    before, after = _metadata(old), _metadata(new)
    return before.get("generation") != after.get("generation") or before.get(
        "deletionTimestamp"
    ) != after.get("deletionTimestamp")


def labels_changed(old: Obj | None, new: Obj | None) -> bool:
    """Adds, deletes, and label changes."""
    if old is None or new is None:
        return True
    return _metadata(old).get("labels") != _metadata(new).get("labels")


def spec_or_metadata_changed(old: Obj | None, new: Obj | None) -> bool:
    """``generation_changed`` or labels, owner references or finalizers changed."""
    if generation_changed(old, new):
        return True
    before, after = _metadata(old), _metadata(new)
    return any(before.get(k) != after.get(k) for k in ("labels", "ownerReferences", "finalizers"))


# --- wiring ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cache:
    """How one kind is cached: a ``Store`` with named indexes or, with ``fold``, an aggregate that
    keeps nothing of the objects; ``transform`` slims each object on arrival (by default, of its
    ``managedFields``) and ``view`` types it once per version, kept beside it; selectors narrow the
    LIST and WATCH; ``optional``: a kind of another component, whose CRD may come later (``served``),
    or with ``built_in`` a Kubernetes API group the API server may not serve (listed again every few
    minutes while it is not). A wiring declares the caches of the kinds it touches; a kind it does
    not declare is cached in a plain store, without its ``managedFields``."""

    resource: Resource
    indexers: Mapping[str, Indexer] = field(default_factory=dict, hash=False)
    fold: Fold | None = field(default=None, hash=False)
    transform: Callable[[Obj], Obj] | None = field(default=strip_managed_fields, hash=False)
    view: View | None = field(default=None, hash=False)  # kept per stored version (``Store.view_of``)
    label_selector: str = ""
    field_selector: str = ""
    page_size: int = 500
    optional: bool = False
    built_in: bool = False  # an optional kind of Kubernetes' own (no CRD): see ``RecheckGate``


@dataclass(frozen=True)
class Watch:
    """Watches(): changes of ``resource`` wake the keys ``map`` names, when every predicate agrees."""

    resource: Resource
    map: MapFunc
    predicates: tuple[Predicate, ...] = ()


@dataclass(frozen=True)
class Owns:
    """Owns() with predicates: changes of ``resource`` wake the primary its controller reference
    names, when every predicate agrees (a bare ``Resource`` in ``Wiring.owns``: every change)."""

    resource: Resource
    predicates: tuple[Predicate, ...] = ()


@dataclass(frozen=True)
class Write:
    """A verb ``reconcile`` uses on a resource (``subresource`` e.g. "status"): declared for RBAC."""

    resource: Resource
    verbs: tuple[str, ...]
    subresource: str = ""


@dataclass(frozen=True)
class Wiring:
    """One controller, declared: what it reconciles, what wakes it, what it reads and writes, and
    how each of those kinds is cached (``caches``; the manager starts an informer per kind)."""

    name: str
    primary: Resource
    key: KeyFunc = key_of  # a primary change wakes this key (GPUClass: one key for every class)
    predicates: tuple[Predicate, ...] = ()  # for primary changes
    owns: tuple[Resource | Owns, ...] = ()
    watches: tuple[Watch, ...] = ()
    reads: tuple[Resource, ...] = ()
    writes: tuple[Write, ...] = ()
    caches: tuple[Cache, ...] = ()
    workers: int = 1
    debounce: float = 0.0  # hold a woken key until quiet this long...
    max_delay: float = 0.0  # ...but no longer than this after the first wake of a burst
    resync: float = 0.0  # re-queue every primary key this often (0: never)
    # The read model map functions are given, built once over the caches (None: the caches).
    model: Callable[[Caches], Any] | None = None

    def owned(self) -> tuple[Owns, ...]:
        """``owns``, each entry as an ``Owns`` (a bare ``Resource``: no predicate)."""
        return tuple(o if isinstance(o, Owns) else Owns(o) for o in self.owns)

    def resources(self) -> tuple[Resource, ...]:
        """Every kind whose cache must have synced before a reconcile runs."""
        seen: dict[Resource, None] = {self.primary: None}
        owned = (o.resource for o in self.owned())
        for resource in (*owned, *(w.resource for w in self.watches), *self.reads):
            seen[resource] = None
        return tuple(seen)


# The (controller, key) the current task is reconciling: its own writes do not wake it again.
_RECONCILING: ContextVar[tuple[str, Key] | None] = ContextVar("reconciling", default=None)
# What the current pass's writes were answered with: (kind, object key, resourceVersion).
_WRITTEN: ContextVar[set[tuple[Resource, Key, str]] | None] = ContextVar("written", default=None)
Wrote = tuple[Resource, Key, str]


def wrote(resource: Resource, obj: Mapping[str, Any]) -> None:
    """The current pass's write of ``resource`` was answered with ``obj`` (the ``Writer`` tells each)."""
    written = _WRITTEN.get()
    version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    if written is not None and version:
        written.add((resource, key_of(obj), version))


def owner_key(primary: Resource, obj: Obj | None) -> Key | None:
    """The primary an owned object's controller reference names (same namespace), if of its kind
    and group (at any version)."""
    owner = sole_controller(obj or {})
    if not owner or not names_kind(owner, primary):
        return None
    namespace = str(_metadata(obj).get("namespace") or "") if primary.namespaced else ""
    return namespace, str(owner.get("name") or "")


class Controller:
    def __init__(
        self,
        wiring: Wiring,
        reconciler: Reconciler,
        caches: Caches,
        *,
        metrics: ControllerMetrics,
        queue_metrics: QueueMetrics,
        tracing: Tracing,
        span_kind: str = "",
        rate_limiter: RateLimiter | None = None,
        forget: Sequence[Callable[[Key], None]] = (),
    ) -> None:
        self.wiring, self.reconciler, self.caches = wiring, reconciler, caches
        self.forget = tuple(forget)  # per-key memories (``Memory.forget``): dropped with the primary
        self.model = wiring.model(caches) if wiring.model is not None else caches  # for map functions
        self.metrics, self.tracing = metrics, tracing
        self.span_kind = span_kind or wiring.primary.kind
        self.queue: WorkQueue[Key] = WorkQueue(
            wiring.name,
            metrics=queue_metrics,
            rate_limiter=rate_limiter,
            debounce=wiring.debounce,
            max_delay=wiring.max_delay,
        )
        self._started: dict[Key, float] = {}  # keys in a reconcile, since when (liveness)
        self._read_generation: dict[Key, object] = {}  # the primary's generation each pass read
        # Changes that came while their key's pass ran: (what changed, when), judged when it ends.
        self._during: dict[Key, list[tuple[Wrote, float]]] = {}
        metrics.set_max_concurrent(wiring.name, wiring.workers)

    # --- event side: handlers the manager attaches to the informers -------------------------------

    def handlers(self) -> Iterator[tuple[Resource, Callable[[Obj | None, Obj | None], None]]]:
        """(resource, handler) for every kind the wiring watches."""
        wiring = self.wiring

        def on_primary(old: Obj | None, new: Obj | None) -> None:
            if new is None and old is not None:
                for forget in self.forget:
                    forget(wiring.key(old))
            if all(p(old, new) for p in wiring.predicates):
                for version in (new, old):
                    if version is not None:
                        key = wiring.key(version)
                        if new is not None and self._read_generation.get(
                            key, _generation(new)
                        ) != _generation(new):
                            # The answer of our own write carries someone else's spec change that
                            # landed between the pass's read and its write: that pass did not
                            # decide on it, so it must run again (its later watch event is older
                            # than what we stored, and dropped).
                            self.queue.add(key)
                        else:
                            self.enqueue(key, wiring.primary, new)
                        break

        yield wiring.primary, on_primary
        for owned in wiring.owned():

            def on_owned(old: Obj | None, new: Obj | None, _owned: Owns = owned) -> None:
                if all(p(old, new) for p in _owned.predicates):
                    primaries = self.caches.store(wiring.primary)
                    for version in (old, new):
                        key = owner_key(wiring.primary, version)
                        if key is not None and primaries.get(key) is not None:
                            self.enqueue(key, _owned.resource, new)

            yield owned.resource, on_owned
        for watch in wiring.watches:

            def on_watched(old: Obj | None, new: Obj | None, _watch: Watch = watch) -> None:
                if all(p(old, new) for p in _watch.predicates):
                    keys: set[Key] = set()
                    for version in (old, new):
                        if version is not None:
                            keys.update(_watch.map(self.model, version))
                    for key in keys:
                        self.enqueue(key, _watch.resource, new)

            yield watch.resource, on_watched

    def enqueue(self, key: Key, resource: Resource | None = None, new: Obj | None = None) -> None:
        """Wake ``key``, unless the change comes from that very key's pass writing: in its task
        (write-through), or as ``new`` of ``resource`` while the pass runs (held until it ends)."""
        if _RECONCILING.get() == (self.wiring.name, key):
            return
        version = str(_metadata(new).get("resourceVersion") or "") if new is not None else ""
        held = self.wiring.debounce <= 0  # a debounced queue holds its own bursts: not delayed more
        if held and resource is not None and new is not None and version and key in self._started:
            self._during.setdefault(key, []).append(((resource, key_of(new), version), time.monotonic()))
            return
        self.queue.add(key)

    def _woken_during(self, key: Key, written: set[Wrote]) -> None:
        """The pass over ``key`` ends: queue it for the changes that came meanwhile but its own
        writes' echoes (counted in the queue from the first of them)."""
        woken = [at for change, at in self._during.pop(key, ()) if change not in written]
        if woken:
            self.queue.add(key, since=min(woken))

    # --- work side -------------------------------------------------------------------------------

    async def run(self) -> None:
        """Workers until cancelled (the manager starts this after the sync barrier and leadership)."""
        async with asyncio.TaskGroup() as group:
            for index in range(self.wiring.workers):
                group.create_task(self._worker(), name=f"{self.wiring.name}-worker-{index}")
            if self.wiring.resync > 0:
                group.create_task(self._resync(), name=f"{self.wiring.name}-resync")

    async def _resync(self) -> None:
        store = self.caches.store(self.wiring.primary)
        while True:
            await asyncio.sleep(self.wiring.resync)  # the resync period itself, not a wait for an effect
            for key in {self.wiring.key(obj) for obj in list(store.values())}:
                self.queue.add(key)

    async def _worker(self) -> None:
        while True:
            try:
                key = await self.queue.get()
            except QueueShutDown:
                return
            try:
                await self.reconcile_once(key)
            finally:
                self.queue.done(key)
            # ``decide`` yields after each decision, but a pass that raised before it did not, and
            # neither does ``get`` with keys ready: a cold start's 5,000 settled attachments once held
            # the loop for over 10 s, long enough for the lease renewal to miss its deadline.
            await asyncio.sleep(0)

    def stuck_for(self) -> float:
        """How long the oldest running reconcile has been running (0 when none runs)."""
        if not self._started:
            return 0.0
        return time.monotonic() - min(self._started.values())

    async def reconcile_once(self, key: Key) -> str:
        """One traced, measured pass; returns the result label."""
        name = self.wiring.name
        obj = self.caches.store(self.wiring.primary).get(key)
        started = time.monotonic()
        self._started[key] = started
        self._read_generation[key] = _generation(obj) if obj is not None else None
        token = _RECONCILING.set((name, key))
        written: set[Wrote] = set()
        written_token = _WRITTEN.set(written)
        link_key = f"{name}/{key[0]}/{key[1]}"
        result = RESULT_ERROR
        trace_id: str | None = None
        try:
            with (
                self.metrics.active(name),
                self.tracing.start_pass(self.span_kind, obj, link_key=link_key) as report,
            ):
                report.span.set_attribute("controller", name)
                trace_id = trace_id_hex(report.span)
                result = await self._pass(key, report)
                return result
        finally:
            _RECONCILING.reset(token)
            _WRITTEN.reset(written_token)
            self._woken_during(key, written)
            self._started.pop(key, None)
            self._read_generation.pop(key, None)
            if self.wiring.key is key_of and self.caches.store(self.wiring.primary).get(key) is None:
                # The object is gone: its pass links go with it (kept, every attachment ever made
                # would stay remembered until the bound clears them all).
                self.tracing.forget(link_key)
            self.metrics.observe(name, result, time.monotonic() - started, trace_id)

    async def _pass(self, key: Key, report: PassSpan) -> str:
        """The pass's decisions, and what its answer (or its error) asks of the queue."""
        name = self.wiring.name
        try:
            outcome = await decide(self.reconciler, key, lambda: self.metrics.decided_again(name))
        except TerminalError as error:
            report.outcome = OUTCOME_ERROR
            self.metrics.terminal_error(name)
            self.queue.forget(key)
            log.warning("%s %s/%s: terminal error, not retried: %s", name, *key, error)
            return RESULT_ERROR
        except NotLeader:
            log.info("%s %s/%s: not the leader any more; the pass stops", name, *key)
            return RESULT_ERROR
        except Conflict as error:
            self.queue.add_rate_limited(key)
            log.info("%s %s/%s: stale read (%s); again shortly", name, *key, error)
            return RESULT_REQUEUE
        except (ApiError, *NO_ANSWER) as error:  # refused, or no answer in time: transient
            report.outcome = OUTCOME_ERROR
            delay = self.queue.add_rate_limited(key)
            log.warning("%s %s/%s: %s: %s; retrying in %.2fs", name, *key, type(error).__name__, error, delay)
            return RESULT_ERROR
        except Exception:
            report.outcome = OUTCOME_ERROR
            delay = self.queue.add_rate_limited(key)
            log.exception("%s %s/%s failed; retrying in %.2fs", name, *key, delay)
            return RESULT_ERROR
        if not report.reasons:  # what the pass left the object saying
            report.reasons = condition_reasons(self.caches.store(self.wiring.primary).get(key))
        if outcome.requeue_after is not None:
            self.queue.forget(key)
            self.queue.add_after(key, outcome.requeue_after)
            return RESULT_REQUEUE_AFTER
        if outcome.again:  # still unsettled after every decision the pass may make
            self.queue.add_rate_limited(key)
            return RESULT_REQUEUE
        self.queue.forget(key)
        return RESULT_SUCCESS


@contextmanager
def reconciling(controller: str, key: Key) -> Iterator[None]:
    """Mark the current task as reconciling ``key`` of ``controller`` (tests of write-through)."""
    token = _RECONCILING.set((controller, key))
    try:
        yield
    finally:
        _RECONCILING.reset(token)


@dataclass
class StaticCaches:
    """Caches over plain stores: for map-function and reconciler unit tests, and for the manager."""

    stores: dict[Resource, Store] = field(default_factory=dict)
    unserved: set[Resource] = field(default_factory=set)  # optional kinds the API does not serve

    def store(self, resource: Resource) -> Store:
        return self.stores[resource]

    def served(self, resource: Resource) -> bool:
        return resource not in self.unserved
