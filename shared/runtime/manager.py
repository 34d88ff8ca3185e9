"""The manager: one operator process's caches, leadership, controllers, metrics and health.

Decides the order every controller of both operators starts in, as controller-runtime's manager:

1. every informer the wirings need starts (LIST, then WATCH), on every replica: a standby keeps
   its caches warm so a takeover does not start cold;
2. **the sync barrier**: no controller runs a reconcile before every cache it reads has synced;
   changes delivered meanwhile are queued, so the first passes see the whole world at once;
3. **leader election** (a ``coordination.k8s.io/v1`` Lease, controller-runtime's defaults), once
   the caches have synced: only the leader starts its controllers and leader-only runnables, and
   its ``Writer`` refuses every write once the lease is not fresh; a leader that loses the lease
   stops and ``run`` raises ``LostLeadership`` (the process exits and restarts as a standby);
4. health: liveness fails when the event loop stalls, a reconcile has run past its bound, or an
   informer's open watch has heard nothing past its blind bound (``Informer.blind_for``);
   readiness is the sync barrier.

Does not: know any kind, reconcile anything, or run the process (``shared.operator`` starts the
manager and releases it on the way out).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import socket
import uuid
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from prometheus_client import CollectorRegistry

from shared.kube import Kube
from shared.resources import Resource
from shared.runtime.cache import Informer, Key, Store, strip_managed_fields
from shared.runtime.controller import Cache, Controller, Reconciler, Wiring, Write
from shared.runtime.leader import LeaderElector
from shared.runtime.metrics import ControllerMetrics, LeaderMetrics, QueueMetrics
from shared.runtime.rbac import Rules, required_rules
from shared.runtime.reads import Reads
from shared.runtime.served import CRDS, RecheckGate, Served, ServedGate, crd_name, slim_crd
from shared.runtime.writes import Writer
from shared.telemetry.tracing import Tracing

log = logging.getLogger(__name__)

# A reconcile running longer than this makes liveness fail: every API call has a timeout well
# below it, so a pass this old is stuck on something no timeout covers.
DEFAULT_STUCK_SECONDS: Final = 300.0


class LostLeadership(Exception):
    """The lease was lost: this replica must stop at once (it restarts as a standby)."""


@dataclass(frozen=True)
class LeaderElection:
    """Whether and where to elect a leader (controller-runtime's defaults for the timings)."""

    enabled: bool
    namespace: str
    name: str
    identity: str = ""
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


def default_identity() -> str:
    """The Pod name (Downward API) or host name, plus a random suffix: two processes on one host
    (the tests) must never share an identity."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


Runnable = Callable[[], Coroutine[None, None, None]]


class Manager:
    def __init__(
        self,
        kube: Kube,
        registry: CollectorRegistry,
        tracing: Tracing,
        *,
        leader_election: LeaderElection | None = None,
        stuck_seconds: float = DEFAULT_STUCK_SECONDS,
        freeze_heap: bool = True,
    ) -> None:
        self.kube, self.registry, self.tracing = kube, registry, tracing
        # An operator's process freezes its heap once synced; a manager run inside another program
        # (a test model) leaves that program's collector alone.
        self.freeze_heap = freeze_heap
        self.leader_election = leader_election
        self.stuck_seconds = stuck_seconds
        self.informers: dict[Resource, Informer] = {}
        self.controllers: list[Controller] = []
        self.leader_runnables: list[Runnable] = []
        self.accesses: list[Write] = []
        self._served = Served()  # the gates of optional kinds, kept by the CRD cache
        self._specs: dict[Resource, Cache] = {}  # how each kind is cached, as declared
        self.controller_metrics = ControllerMetrics(registry)
        self.queue_metrics = QueueMetrics(registry)
        self.leader_metrics = LeaderMetrics(registry)
        self.elector: LeaderElector | None = None
        self._clients = [kube]  # closed by ``release``
        if leader_election is not None and leader_election.enabled:
            # Connections of its own (same credentials), as controller-runtime gives leader
            # election a client of its own: a renewal never queues behind the reconcilers'
            # writes for a place in the request pool, which a start over hundreds of objects fills.
            lease_kube = kube.with_own_connections()
            self._clients.append(lease_kube)
            self.elector = LeaderElector(
                lease_kube,
                leader_election.namespace,
                leader_election.name,
                leader_election.identity or default_identity(),
                lease_duration=leader_election.lease_duration,
                renew_deadline=leader_election.renew_deadline,
                retry_period=leader_election.retry_period,
                metrics=self.leader_metrics,
            )
        self.writer = Writer(kube, self.informers.get, self.is_leader)
        self.synced = asyncio.Event()

    # --- declaration -----------------------------------------------------------------------------

    def informer(self, spec: Cache) -> Informer:
        """Declare the cache of one kind outside any wiring (a wiring declares its own)."""
        if spec.resource in self.informers:
            raise ValueError(f"{spec.resource.plural} is already cached")
        return self._cache(spec)

    def _cache(self, spec: Cache) -> Informer:
        """The informer of one declared cache. An ``optional`` kind's informer is gated on its
        CRD: the CRD cache (every CRD, slimmed) is declared with the first optional kind; a
        ``built_in`` one has no CRD and rechecks by listing (``RecheckGate``)."""
        gate: ServedGate | None = None
        if spec.optional and spec.built_in:
            gate = RecheckGate(crd_name(spec.resource))
        elif spec.optional:
            if CRDS not in self.informers:
                self._cache(Cache(CRDS, transform=slim_crd)).add_handler(self._served)
            gate = self._served.gate(spec.resource)
        informer = Informer(
            self.kube,
            spec.resource,
            store=None if spec.fold is not None else Store(spec.indexers, spec.view),
            fold=spec.fold,
            # A fold keeps nothing of an object: the default slimming would only copy it for naught.
            transform=None
            if spec.fold is not None and spec.transform is strip_managed_fields
            else spec.transform,
            label_selector=spec.label_selector,
            field_selector=spec.field_selector,
            page_size=spec.page_size,
            gate=gate,
        )
        self.informers[spec.resource] = informer
        self._specs[spec.resource] = spec
        return informer

    def served(self, resource: Resource) -> bool:
        """Whether the API serves ``resource`` (always, but for an optional kind whose CRD is not
        established): a reconciler tells "not installed" from "none there" by it."""
        return self.informers[resource].served

    def store(self, resource: Resource) -> Store:
        informer = self.informers.get(resource)
        if informer is None or informer.store is None:
            raise KeyError(f"{resource.plural} has no store (not declared, or a fold)")
        return informer.store

    def declare_caches(self, wiring: Wiring) -> None:
        """Every kind the wiring touches gets the cache the wiring declares (or a plain store),
        once: two declarations of one kind's cache must agree. (An operator's wirings may share one
        table of caches: a kind the wiring does not touch is not cached for it.) ``add`` does this;
        call it first where a reconciler needs the stores before its controller is added."""
        declared = {spec.resource: spec for spec in wiring.caches}
        for resource in wiring.resources():
            spec = declared.get(resource, Cache(resource))
            if resource not in self.informers:
                self._cache(spec)
            elif resource in declared and self._specs.get(resource) != spec:
                raise ValueError(f"{resource.plural} is cached twice, differently ({wiring.name})")

    def add(
        self,
        wiring: Wiring,
        reconciler: Reconciler,
        *,
        span_kind: str = "",
        forget: Sequence[Callable[[Key], None]] = (),
    ) -> Controller:
        self.declare_caches(wiring)
        controller = Controller(
            wiring,
            reconciler,
            self,
            metrics=self.controller_metrics,
            queue_metrics=self.queue_metrics,
            tracing=self.tracing,
            span_kind=span_kind,
            forget=forget,
        )
        for resource, handler in controller.handlers():
            self.informers[resource].add_handler(handler)
        self.controllers.append(controller)
        return controller

    def reads(self, resource: Resource, *verbs: str) -> Reads:
        """Live reads of ``resource`` (``get``, ``list``) outside the caches, declared for RBAC."""
        self.accesses.append(Write(resource, tuple(verbs)))
        return Reads(self.kube, resource, frozenset(verbs))

    def uses(self, resource: Resource, *verbs: str, subresource: str = "") -> None:
        """Declare an API access outside the caches, the live reads and the wirings' writes (a write
        of a leader-only runnable), so RBAC can be checked against it."""
        self.accesses.append(Write(resource, tuple(verbs), subresource))

    def required_rules(self) -> Rules:
        """What the operator's ClusterRole must grant: exactly this (a test compares)."""
        return required_rules(self.informers, (c.wiring for c in self.controllers), self.accesses)

    def add_leader_runnable(self, runnable: Runnable) -> None:
        """Something that writes, besides the controllers (a periodic repair): leader only."""
        self.leader_runnables.append(runnable)

    # --- state -----------------------------------------------------------------------------------

    def is_leader(self) -> bool:
        return self.elector is None or self.elector.is_leader()

    def has_synced(self, resources: Iterable[Resource] | None = None) -> bool:
        chosen = self.informers if resources is None else resources
        return all(self.informers[r].has_synced() for r in chosen)

    def liveness_problem(self) -> str | None:
        """Why the process should be restarted, if it should."""
        for controller in self.controllers:
            stuck = controller.stuck_for()
            if stuck > self.stuck_seconds:
                return f"controller {controller.wiring.name}: a reconcile has run for {stuck:.0f}s"
        for resource, informer in self.informers.items():
            blind = informer.blind_for()
            if blind:
                return f"informer {resource.plural}: its watch has heard nothing for {blind:.0f}s"
        return None

    def readiness_problem(self) -> str | None:
        waiting = sorted(r.plural for r, i in self.informers.items() if not i.has_synced())
        return f"caches not synced: {', '.join(waiting)}" if waiting else None

    # --- running ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """Until cancelled; raises ``LostLeadership`` when the lease is lost (or never won)."""
        tasks = [asyncio.create_task(i.run(), name=f"informer-{r.plural}") for r, i in self.informers.items()]
        elector_task: asyncio.Task[None] | None = None
        try:
            await asyncio.gather(*(i.synced.wait() for i in self.informers.values()))
            self.synced.set()
            # What the caches hold now lives as long as the process: keep the collector from
            # scanning it on every collection (a large Store otherwise costs more per event).
            if self.freeze_heap:
                gc.freeze()
            log.info("caches synced: %s", ", ".join(sorted(r.plural for r in self.informers)))
            if self.elector is not None:
                # Only a warm replica runs for the lease (as controller-runtime: election after the
                # caches), so a replica still listing never takes a lease from a warm standby.
                elector_task = asyncio.create_task(self.elector.run(), name="leader-election")
                leading = asyncio.create_task(self.elector.leading.wait())
                await asyncio.wait({leading, elector_task}, return_when=asyncio.FIRST_COMPLETED)
                leading.cancel()
                if not self.elector.leading.is_set():
                    raise LostLeadership("leader election ended before this replica led")
                log.info("leading: starting controllers")
            tasks += [
                asyncio.create_task(c.run(), name=f"controller-{c.wiring.name}") for c in self.controllers
            ]
            tasks += [asyncio.create_task(r(), name="leader-runnable") for r in self.leader_runnables]
            waiting = set(tasks) | ({elector_task} if elector_task else set())
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if elector_task in done:
                raise LostLeadership("lost the leader lease")
            for task in done:
                task.result()  # a runnable that ended by itself: its error is ours
            raise RuntimeError("a runnable of the manager ended by itself")
        finally:
            everything = [*tasks, *([elector_task] if elector_task else [])]
            for task in everything:
                task.cancel()
            await asyncio.gather(*everything, return_exceptions=True)

    async def release(self) -> None:
        """On a graceful stop: hand the lease over at once instead of letting it expire, then close
        every connection (the lease's own too), so none is left for the interpreter to warn about."""
        if self.elector is not None:  # it gives the lease up only if the lease still names us
            with contextlib.suppress(Exception):
                await self.elector.release()
        await asyncio.gather(*(kube.close() for kube in self._clients), return_exceptions=True)
