"""The GPUClass controller on the runtime: what wakes a pass, what one pass does, which caches it reads.

Decides only the plumbing around the pure core:

* **wiring** (``wiring``, one declarative block): every class is decided together (the oldest owns a
  resource name, so deleting it hands the name to the next one in the same pass), so every change
  wakes the one key ``ALL_CLASSES``: a class created, deleted or with a new spec (not a status
  write: ours must not wake a pass, and no one else writes it), and any Node or Pod change that
  moved the inventory. A burst coalesces into one pass (``debounce``, at most ``max_delay``); the
  KubeVirt CR is read on every pass and never watched, so passes also run every
  ``kubevirt_recheck_seconds`` (``resync``): the operator works with no kubevirt.io kinds served and
  notices a CRD and CR installed later within the recheck;
* **caches**: Nodes and Pods are *folded* into the ``Inventory`` (``NodeFold``, ``PodFold``; nothing
  of a Pod is stored but its contribution, and a Pod missing from a re-list is released), Pods
  listed as the scheduler lists them (bound, not finished: the API server filters the rest);
  DRA's DeviceClasses, ResourceSlices and ResourceClaims are folded into the ``DraInventory``
  (``DeviceClassFold``, ``SliceFold``, ``ClaimFold``): optional built-in kinds, so a cluster that
  serves no ``resource.k8s.io/v1`` is an empty, synced DRA world, listed again every few minutes
  (the runtime's ``RecheckGate``: an API server serving DRA later is seen without a restart);
  GPUClasses are a plain store;
* **one pass** (``Reconciler.reconcile``): read the KubeVirt CR (a timeout or 5xx keeps the last
  definitive read for the grace period), call ``decide`` for every class, publish the figures to
  the metrics, write each class's status only where it differs (a JSON patch pinned to the class's
  UID, through the runtime's ``Writer``: refused when this replica does not lead) and post the
  Events of its transitions. A pass with nothing to change writes nothing.

Does not decide any figure or condition (``decide`` does) and never writes anything but class
status and Events. Retries, backoff, tracing per pass and the reconcile metrics are the runtime's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Final, cast

from prometheus_client import CollectorRegistry

from operators.gpuclass.api import (
    CLUSTER_INSTANCETYPES,
    DEVICE_CLASSES,
    DEVICE_TAINT_RULES,
    GPUCLASSES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
)
from operators.gpuclass.dra import DraInventory
from operators.gpuclass.inventory import Inventory
from operators.gpuclass.kubevirt import Definitive, KubeVirtRead, remember, view
from operators.gpuclass.kubevirt_read import KUBEVIRT_VERBS, read_kubevirt
from operators.gpuclass.metrics import STAGE_PASS, STAGE_STATUS_WRITE, Metrics
from operators.gpuclass.reconcile import ClassDecision, decide, named_instancetypes, transition_events
from operators.gpuclass.settings import Settings
from shared.conditions import rfc3339, status_patch
from shared.events import Recorder
from shared.kube import NO_ANSWER, ApiError
from shared.resources import EVENTS_V1, KUBEVIRTS, NODES, PODS
from shared.runtime.cache import Key, Obj
from shared.runtime.controller import (
    Cache,
    Caches,
    Conflict,
    NotLeader,
    Result,
    Watch,
    Wiring,
    Write,
    generation_changed,
)
from shared.runtime.manager import Manager
from shared.runtime.reads import LIST, Reads
from shared.runtime.writes import Writer
from shared.telemetry.tracing import Tracing, current_pass

log = logging.getLogger("gpuclass")

# The controller's name: the metrics' ``controller`` label, the queue's name, the span's attribute.
CONTROLLER_NAME: Final = "gpuclass"
# Reported as the source of Events.
COMPONENT: Final = "cozystack-gpuclass-operator"
# An Event's action (events.k8s.io/v1): what the operator did when it saw the transition.
TRANSITION_ACTION: Final = "Count"
# The one key every change wakes: a pass decides every class at once.
ALL_CLASSES: Final[Key] = ("", "all-gpuclasses")
# The scheduler's own selector for the pods that hold resources (kube-scheduler's assigned-pod
# informer): bound and not finished. A pod leaving it (finished) arrives as a deletion, so the
# inventory releases it; unbound and finished pods never reach the process at all.
POD_FIELD_SELECTOR: Final = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
# Status writes of one pass go out concurrently (bounded): during churn a pass is as slow as them.
STATUS_WRITE_CONCURRENCY: Final = 8


# --- wiring ---------------------------------------------------------------------------------------


def all_classes_key(obj: Obj) -> Key:
    """Which key a GPUClass change wakes: the one pass over every class."""
    return ALL_CLASSES


def all_classes(caches: Caches, obj: Obj) -> Iterable[Key]:
    """Which keys a Node or Pod change wakes (the fold already said the inventory moved): every
    class may take its units from any node, so the one pass over every class."""
    return (ALL_CLASSES,)


def wiring(settings: Settings, inventory: Inventory, dra: DraInventory | None = None) -> Wiring:
    """The one controller over every class; Nodes and Pods fold into ``inventory`` (nothing of
    them is stored), and only bound, unfinished Pods are listed; DRA's kinds fold into ``dra``."""
    dra = dra if dra is not None else DraInventory()
    return Wiring(
        name=CONTROLLER_NAME,
        primary=GPUCLASSES,
        key=all_classes_key,
        predicates=(generation_changed,),  # created, deleted, spec changed; never a status write
        watches=(
            Watch(NODES, map=all_classes),
            Watch(PODS, map=all_classes),
            Watch(DEVICE_CLASSES, map=all_classes),
            Watch(RESOURCE_SLICES, map=all_classes),
            Watch(RESOURCE_CLAIMS, map=all_classes),
            Watch(DEVICE_TAINT_RULES, map=all_classes),
        ),
        # Events of transitions (events.k8s.io/v1); a repeat within the recorder's window patches its series.
        writes=(Write(GPUCLASSES, ("patch",), "status"), Write(EVENTS_V1, ("create", "patch"))),
        caches=(
            Cache(NODES, fold=NodeFold(inventory)),
            Cache(PODS, fold=PodFold(inventory), field_selector=POD_FIELD_SELECTOR),
            Cache(DEVICE_CLASSES, fold=DeviceClassFold(dra), optional=True, built_in=True),
            Cache(RESOURCE_SLICES, fold=SliceFold(dra), optional=True, built_in=True),
            Cache(RESOURCE_CLAIMS, fold=ClaimFold(dra), optional=True, built_in=True),
            Cache(DEVICE_TAINT_RULES, fold=TaintRuleFold(dra), optional=True, built_in=True),
        ),
        debounce=settings.debounce_seconds,
        max_delay=settings.max_delay_seconds,
        resync=settings.kubevirt_recheck_seconds,
    )


# --- caches: Nodes and Pods folded into the inventory ----------------------------------------------


class NodeFold:
    """Nodes folded into the inventory (the runtime's ``Fold``): keyed ``("", name)``."""

    __slots__ = ("inventory",)

    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory

    def upsert(self, key: Key, obj: Obj) -> bool:
        return self.inventory.upsert_node(obj)

    def delete(self, key: Key) -> bool:
        return self.inventory.delete_node(key[1])

    def keys(self) -> Iterable[Key]:
        return [("", node.name) for node in self.inventory.nodes()]


class PodFold:
    """Pods folded into the inventory (the runtime's ``Fold``): the inventory keeps each pod's
    contribution under the informer's ``(namespace, name)`` key, and nothing else. Only pods that
    contribute are held, so only they can be released by a re-list."""

    __slots__ = ("inventory",)

    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory

    def upsert(self, key: Key, obj: Obj) -> bool:
        return self.inventory.upsert_pod(obj, key)

    def delete(self, key: Key) -> bool:
        return self.inventory.delete_pod(key)

    def keys(self) -> Iterable[Key]:
        # A copy: the informer releases pods while it walks these. Every key here came from upsert.
        return cast(list[Key], list(self.inventory.pod_keys()))


class DeviceClassFold:
    """DeviceClasses folded into the DRA inventory: keyed ``("", name)``; their selectors compiled."""

    __slots__ = ("dra",)

    def __init__(self, dra: DraInventory) -> None:
        self.dra = dra

    def upsert(self, key: Key, obj: Obj) -> bool:
        return self.dra.upsert_class(obj)

    def delete(self, key: Key) -> bool:
        return self.dra.delete_class(key[1])

    def keys(self) -> Iterable[Key]:
        return [("", name) for name in self.dra.class_names()]


class SliceFold:
    """ResourceSlices folded into the DRA inventory: each node's devices, newest pool generation."""

    __slots__ = ("dra",)

    def __init__(self, dra: DraInventory) -> None:
        self.dra = dra

    def upsert(self, key: Key, obj: Obj) -> bool:
        return self.dra.upsert_slice(key, obj)

    def delete(self, key: Key) -> bool:
        return self.dra.delete_slice(key)

    def keys(self) -> Iterable[Key]:
        return cast(list[Key], list(self.dra.slice_keys()))


class ClaimFold:
    """ResourceClaims folded into the DRA inventory: only the devices an allocation holds."""

    __slots__ = ("dra",)

    def __init__(self, dra: DraInventory) -> None:
        self.dra = dra

    def upsert(self, key: Key, obj: Obj) -> bool:
        return self.dra.upsert_claim(key, obj)

    def delete(self, key: Key) -> bool:
        return self.dra.delete_claim(key)

    def keys(self) -> Iterable[Key]:
        return cast(list[Key], list(self.dra.claim_keys()))


class TaintRuleFold:
    """DeviceTaintRules folded into the DRA inventory: keyed ``("", name)``; only blocking rules kept."""

    __slots__ = ("dra",)

    def __init__(self, dra: DraInventory) -> None:
        self.dra = dra

    def upsert(self, key: Key, obj: Obj) -> bool:
        return self.dra.upsert_taint_rule(obj)

    def delete(self, key: Key) -> bool:
        return self.dra.delete_taint_rule(key[1])

    def keys(self) -> Iterable[Key]:
        return [("", name) for name in self.dra.taint_rule_names()]


# --- one pass ---------------------------------------------------------------------------------------


class Reconciler:
    """One pass over every class; remembers the last KubeVirt reads between passes."""

    def __init__(
        self,
        caches: Caches,
        writer: Writer,
        kubevirts: Reads,
        tracing: Tracing,
        inventory: Inventory,
        metrics: Metrics,
        settings: Settings,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        dra: DraInventory | None = None,
        instancetypes: Reads | None = None,
    ) -> None:
        self.caches, self.writer, self.kubevirts, self.tracing = caches, writer, kubevirts, tracing
        self.inventory, self.metrics, self.settings, self.clock = inventory, metrics, settings, clock
        self.dra = dra if dra is not None else DraInventory()
        self.instancetypes = instancetypes
        # The cluster instance types of the last read that answered, by name.
        self.known_instancetypes: dict[str, Obj] = {}
        self.kubevirt_read: KubeVirtRead | None = None
        self.kubevirt_known: Definitive | None = None
        # Classes are cluster-scoped: their Events go to ``default``, the one the API allows them.
        self.recorder = Recorder(writer, COMPONENT)

    async def reconcile(self, key: Key) -> Result:
        started = time.perf_counter()
        try:
            now = self.clock()
            try:
                classes, decisions = await self._decide(now)
            except Exception:
                self.metrics.pass_errors.labels(stage=STAGE_PASS).inc()
                raise
            self.metrics.classes.decisions = decisions
            await self._write(classes, decisions, rfc3339(now))
            return Result()
        finally:
            self.metrics.pass_duration.observe(time.perf_counter() - started)
            self.metrics.last_pass.set(time.time())

    async def _decide(self, now: datetime) -> tuple[list[Obj], dict[str, ClassDecision]]:
        settings = self.settings
        with self.tracing.child("read KubeVirt CR", namespace=settings.kubevirt_namespace):
            read = await read_kubevirt(
                self.kubevirts, settings.kubevirt_namespace, settings.kubevirt_name, self.kubevirt_read, now
            )
        kubevirt_view = view(read, self.kubevirt_known, now)
        self.kubevirt_read, self.kubevirt_known = read, remember(read, self.kubevirt_known)
        classes = list(self.caches.store(GPUCLASSES).values())
        instancetypes = await self._read_instancetypes(classes)
        decisions = decide(
            classes, self.inventory, kubevirt_view, self.dra, settings.kubevirt_version, instancetypes
        )
        report = current_pass()
        if report is not None:
            report.read(*classes)
            report.span.set_attribute("gpuclass.classes", len(decisions))
            report.reasons = sorted({c.reason for d in decisions.values() for c in d.status.conditions})
        return classes, decisions

    async def _read_instancetypes(self, classes: list[Obj]) -> Mapping[str, Obj]:
        """KubeVirt's cluster instance types, read (one LIST) only when a shape names one, as the
        KubeVirt CR is: never required to be served. Not served, or not readable: none (the shapes
        naming one fit 0, and the log says why); no answer: the last read's."""
        if self.instancetypes is None or not named_instancetypes(classes):
            return {}
        try:
            items = (await self.instancetypes.list()).get("items") or []
        except ApiError as error:
            if error.status not in (401, 403, 404):
                log.warning("cluster instance types not read (%s); using the last read", error)
                return self.known_instancetypes
            log.warning("cluster instance types not readable (%s): shapes naming one fit 0", error)
            items = []
        except NO_ANSWER as error:
            log.warning("cluster instance types not read (%s); using the last read", error)
            return self.known_instancetypes
        self.known_instancetypes = {str(item["metadata"]["name"]): item for item in items}
        return self.known_instancetypes

    async def _write(self, classes: list[Obj], decisions: Mapping[str, ClassDecision], now: str) -> None:
        """Every status that differs, concurrently; then the first failure, if any, is the pass's."""
        limit = asyncio.Semaphore(STATUS_WRITE_CONCURRENCY)

        async def store(obj: Obj, decision: ClassDecision) -> None:
            async with limit:
                await self._store(obj, decision, now)

        results = await asyncio.gather(
            *(
                store(obj, decisions[obj["metadata"]["name"]])
                for obj in classes
                if obj["metadata"]["name"] in decisions
            ),
            return_exceptions=True,
        )
        failures = [r for r in results if isinstance(r, BaseException)]
        for failure in failures:
            if not isinstance(failure, Conflict | NotLeader):
                self.metrics.pass_errors.labels(stage=STAGE_STATUS_WRITE).inc()
        # A refusal or an API error says more than a stale read; either way the key runs again.
        failures.sort(key=lambda failure: isinstance(failure, Conflict))
        if failures:
            for other in failures[1:]:
                log.warning("status write failed too: %s", other)
            raise failures[0]

    async def _store(self, obj: Obj, decision: ClassDecision, now: str) -> None:
        """Write the class's status if it differs, then the Events of its transitions."""
        stored = obj.get("status")
        status = decision.status
        ops = status_patch(stored, status.fields(), status.conditions, decision.generation, now)
        if not ops:
            return
        # Pinned to this incarnation: a class recreated under the name refuses the patch (Conflict),
        # and a class gone (None) is decided no more once its deletion reaches the cache.
        updated = await self.writer.patch_status(GPUCLASSES, obj, ops)
        if updated is None:
            return
        for event in transition_events(stored, status):
            await self.recorder.record(
                updated,
                type_=event.type,
                reason=event.reason,
                action=TRANSITION_ACTION,
                note=event.message,
            )


# --- declaring it all on the manager ---------------------------------------------------------------


def build(manager: Manager, registry: CollectorRegistry, settings: Settings) -> Reconciler:
    """Declare the controller (its wiring declares its caches) on ``manager``; the domain metrics
    on ``registry``."""
    inventory, dra = Inventory(compute=True), DraInventory()
    reconciler = Reconciler(
        manager,
        manager.writer,
        manager.reads(KUBEVIRTS, *KUBEVIRT_VERBS),
        manager.tracing,
        inventory,
        Metrics(registry),
        settings,
        dra=dra,
        instancetypes=manager.reads(CLUSTER_INSTANCETYPES, LIST),
    )
    manager.add(wiring(settings, inventory, dra), reconciler)
    return reconciler
