"""kopf glue for the GPUClass operator: observe, run one pass, apply the difference.

Decides only the plumbing:

* Node, Pod and GPUClass events (kopf *event* handlers: no annotations or finalizers are ever written
  to Nodes, Pods or classes) update the in-memory inventory and class table, then wake the pass loop.
* The pass loop coalesces a burst into one pass (quiet for ``debounce_seconds``, or at most
  ``max_delay_seconds`` after the burst began) and also runs every ``kubevirt_recheck_seconds``,
  because the KubeVirt CR is read on every pass but never watched: the operator starts and works
  with no kubevirt.io kinds served, and notices a CRD and CR installed later within the recheck.
* A pass reads the KubeVirt CR, calls the pure ``decide`` for every class, and writes status only
  where the stored status differs (ignoring timestamps), by a JSON patch guarded by the class UID.
  Events go out on condition transitions only. A pass with nothing to change writes nothing.

Does not decide any figure or condition (``decide`` does) and never writes anything but class status
and Events. Failures are counted by stage and the next pass retries; no object can crash the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kopf

from operators.gpuclass.decide import ClassDecision, decide, transition_events
from operators.gpuclass.inventory import Inventory, pod_key
from operators.gpuclass.kubevirt import Definitive, KubeVirtRead, remember, view
from operators.gpuclass.kubevirt_read import read_kubevirt
from operators.gpuclass.metrics import Metrics
from operators.gpuclass.settings import Settings
from shared.conditions import rfc3339, status_patch
from shared.events import post_event
from shared.kube import NODES, PODS, ApiError, Kube, Obj, Resource
from shared.operator import Telemetry, add_login, kopf_settings

log = logging.getLogger("gpuclass")

GROUP, VERSION, PLURAL = "gpu.cozystack.io", "v1alpha1", "gpuclasses"
GPUCLASSES = Resource(f"{GROUP}/{VERSION}", PLURAL, namespaced=False)
# Reported as the source of Events and the field manager of status writes.
COMPONENT = "cozystack-gpuclass-operator"
# kopf's own markers, should kopf ever need them: ours, never kopf's defaults, never shared with the
# EndpointAttachment operator (the handlers here are event handlers, which write none of them).
KOPF_FINALIZER = "gpuclass.operator.cozystack.io/kopf"
STORAGE_PREFIX = "gpuclass.operator.cozystack.io"
STATUS_WRITE_CONCURRENCY = 8
# Consecutive passes cover every class at once, so they are linked under one key, not per object.
PASS_LINK_KEY = "gpuclass/all-classes"


@dataclass
class State:
    """What the operator has observed, kept current by watch events."""

    settings: Settings
    metrics: Metrics
    telemetry: Telemetry
    inventory: Inventory = field(default_factory=Inventory)
    classes: dict[str, Obj] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    kubevirt_read: KubeVirtRead | None = None
    kubevirt_known: Definitive | None = None
    kube: Kube | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    # The initial listing: how many Nodes, Pods and classes existed at start-up, and how many of each
    # kopf has delivered since (events of type None). None until counted.
    expected: dict[str, int] | None = None
    listed: Counter[str] = field(default_factory=Counter)

    def listing_done(self) -> bool:
        return self.expected is not None and all(self.listed[k] >= n for k, n in self.expected.items())


def operator_settings() -> kopf.OperatorSettings:
    return kopf_settings(KOPF_FINALIZER, STORAGE_PREFIX)


def build_registry(state: State) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    add_login(registry)

    @kopf.on.startup(registry=registry)
    async def startup(**_: Any) -> None:
        state.kube = await Kube.connect(state.settings.kubeconfig)
        state.kube.tracer = state.telemetry.tracing.tracer
        # Counted before kopf starts listing, so the first pass can wait for the whole inventory.
        state.expected = {
            "nodes": await state.kube.count(NODES.path()),
            "pods": await state.kube.count(PODS.path()),
            "classes": await state.kube.count(GPUCLASSES.path()),
        }
        state.tasks = [
            asyncio.create_task(pass_loop(state), name="gpuclass-passes"),
            asyncio.create_task(state.telemetry.liveness.heartbeat(), name="gpuclass-heartbeat"),
        ]

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        for task in state.tasks:
            task.cancel()

    @kopf.on.event("", "v1", "nodes", registry=registry)
    async def node_event(event: kopf.RawEvent, **_: Any) -> None:
        state.telemetry.reconciles.event_seen()
        state.listed["nodes"] += event["type"] is None
        node = event["object"]
        if event["type"] == "DELETED":
            changed = state.inventory.delete_node(node["metadata"]["name"])
        else:
            changed = state.inventory.upsert_node(node)
        if changed:
            state.wake.set()

    @kopf.on.event("", "v1", "pods", registry=registry)
    async def pod_event(event: kopf.RawEvent, **_: Any) -> None:
        state.telemetry.reconciles.event_seen()
        state.listed["pods"] += event["type"] is None
        pod = event["object"]
        if event["type"] == "DELETED":
            changed = state.inventory.delete_pod(pod_key(pod))
        else:
            changed = state.inventory.upsert_pod(pod)
        if changed:
            state.wake.set()

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def class_event(event: kopf.RawEvent, **_: Any) -> None:
        state.telemetry.reconciles.event_seen()
        state.listed["classes"] += event["type"] is None
        obj = event["object"]
        name = obj["metadata"]["name"]
        if event["type"] == "DELETED":
            state.classes.pop(name, None)
        else:
            state.classes[name] = dict(obj)
        state.wake.set()

    return registry


async def initial_listing(state: State) -> None:
    """Wait until kopf has delivered every object that existed at start-up (bounded): a first pass
    over half an inventory would publish wrong free units, and Events for transitions that never were.
    Objects deleted meanwhile are never delivered, hence the bound."""
    deadline = asyncio.get_running_loop().time() + state.settings.initial_listing_timeout_seconds
    while not state.listing_done() and asyncio.get_running_loop().time() < deadline:
        state.wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(state.wake.wait(), timeout=1.0)
    if not state.listing_done():
        log.warning(
            "initial listing incomplete (%s of %s); passing anyway", dict(state.listed), state.expected
        )
    state.wake.set()


async def pass_loop(state: State) -> None:
    """Coalesce wake-ups into passes; never exits on an error."""
    settings = state.settings
    loop = asyncio.get_running_loop()
    await initial_listing(state)
    while True:
        with contextlib.suppress(TimeoutError):  # a timeout is the periodic KubeVirt recheck
            await asyncio.wait_for(state.wake.wait(), timeout=settings.kubevirt_recheck_seconds)
        burst_began = loop.time()
        while state.wake.is_set() and loop.time() - burst_began < settings.max_delay_seconds:
            state.wake.clear()
            try:
                await asyncio.wait_for(state.wake.wait(), timeout=settings.debounce_seconds)
            except TimeoutError:
                break  # quiet: the burst is over
        state.wake.clear()  # events from here on wake the next pass
        try:
            await run_pass(state)
        except Exception:
            log.exception("pass failed; the next pass retries")
            state.metrics.pass_errors.labels(stage="pass").inc()


async def run_pass(state: State) -> dict[str, ClassDecision]:
    """One pass over every class: read KubeVirt, decide, write what differs, emit transitions.

    Traced as one span (linked to the previous pass), with child spans for the KubeVirt read and
    for each status write; counted in the common reconcile metrics.
    """
    assert state.kube is not None
    started = time.perf_counter()
    tracing = state.telemetry.tracing
    result = "error"
    with tracing.start_pass("GPUClass", None, link_key=PASS_LINK_KEY) as report:
        try:
            now = datetime.now(UTC)
            with tracing.child("read KubeVirt CR", namespace=state.settings.kubevirt_namespace):
                read = await read_kubevirt(
                    state.kube,
                    state.settings.kubevirt_namespace,
                    state.settings.kubevirt_name,
                    state.kubevirt_read,
                    now,
                )
            kubevirt_view = view(read, state.kubevirt_known, now)
            state.kubevirt_read, state.kubevirt_known = read, remember(read, state.kubevirt_known)
            classes = list(state.classes.values())
            decisions = decide(classes, state.inventory, kubevirt_view)
            report.span.set_attribute("gpuclass.classes", len(decisions))
            report.reasons = sorted({c.reason for d in decisions.values() for c in d.status.conditions})
            # Writes go out concurrently (bounded): during churn a pass is as slow as its writes.
            writes = asyncio.Semaphore(STATUS_WRITE_CONCURRENCY)

            async def store(obj: Obj, decision: ClassDecision) -> None:
                async with writes:
                    await _store(state, obj, decision, rfc3339(now))

            await asyncio.gather(
                *(
                    store(obj, decisions[obj["metadata"]["name"]])
                    for obj in classes
                    if obj["metadata"]["name"] in decisions
                )
            )
            state.metrics.classes.decisions = decisions
            result = report.outcome
            return decisions
        finally:
            elapsed = time.perf_counter() - started
            state.telemetry.reconciles.observe(result, elapsed)
            state.metrics.pass_duration.observe(elapsed)
            state.metrics.last_pass.set(time.time())


async def _store(state: State, obj: Obj, decision: ClassDecision, now: str) -> None:
    """Write the class's status if it differs, then the Events of its transitions."""
    assert state.kube is not None
    stored = obj.get("status")
    status = decision.status
    ops = status_patch(stored, status.fields(), status.conditions, decision.generation, now)
    if not ops:
        return
    metadata = obj["metadata"]
    # The test pins the incarnation: a class deleted and recreated under this name since we saw it
    # refuses the patch, and the next pass (woken by its events) decides for the new one.
    guarded = [{"op": "test", "path": "/metadata/uid", "value": metadata["uid"]}, *ops]
    try:
        updated = await state.kube.patch(GPUCLASSES.path(name=metadata["name"]) + "/status", guarded)
    except ApiError as error:
        if error.status in (404, 409, 422):
            log.info("class %s changed under the pass (%s); the next pass decides", metadata["name"], error)
            state.wake.set()
            return
        state.metrics.pass_errors.labels(stage="status_write").inc()
        raise
    if state.classes.get(metadata["name"], {}).get("metadata", {}).get("uid") == metadata["uid"]:
        state.classes[metadata["name"]] = updated  # so a pass before the watch event compares right
    for event in transition_events(stored, status):
        await post_event(
            state.kube,
            updated,
            type_=event.type,
            reason=event.reason,
            message=event.message,
            component=COMPONENT,
            now=now,
            namespace=state.settings.events_namespace,
        )
