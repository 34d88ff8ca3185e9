"""kopf glue for the EndpointAttachment operator: watch caches in, plans out, differences applied.

Decides only the plumbing:

* every watched kind (attachments, claims, classes, allocations, ServiceProxies, Services,
  EndpointSlices, HelmReleases, Namespaces) arrives through kopf *event* handlers into the ``World``
  caches: nothing is ever written to a Service, Pod or Namespace by kopf itself;
* each change wakes exactly the attachments, claims and classes it concerns, through one keyed work
  queue, so a burst of events is one pass per object and no object is passed over twice at once;
* a pass builds ``Observed`` from the caches, asks the pure ``reconcile``/``claims`` for a plan, and
  applies it step by step, re-passing right after any step whose outcome the plan depends on (a
  mint, a claim binding): each write's answer is put back into the caches at once;
* our finalizer on attachments and claims orders deletion: the rendered Service first, then the
  address (allocation deleted, claim use cleared), then the finalizer;
* a repair loop deletes orphaned allocations (``repair.orphans``) after a grace period.

Does not decide any condition, name, address or Service field, never adopts or deletes a Service
without our controller reference, and never writes labels or annotations to objects it does not own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf

from operators.endpointattachment import allocator, claims, repair
from operators.endpointattachment.constants import (
    API_VERSION,
    ENDPOINT_ATTACHMENT_PLURAL,
    GROUP,
    HELMRELEASE_GROUP,
    HELMRELEASE_PLURAL,
    HELMRELEASE_VERSION,
    IP_ADDRESS_ALLOCATION_PLURAL,
    IP_ADDRESS_CLAIM_PLURAL,
    IP_ADDRESS_CLASS_PLURAL,
    SERVICE_PROXY_PLURAL,
    VERSION,
)
from operators.endpointattachment.reconcile import Plan, ServiceAction, reconcile
from operators.endpointattachment.render import service_name
from operators.endpointattachment.settings import Settings
from operators.endpointattachment.world import Key, Obj, World, key_of
from shared.conditions import JsonPatch, rfc3339
from shared.kube import SERVICES, ApiError, Kube, Resource
from shared.operator import Telemetry, add_login, kopf_settings
from shared.telemetry.tracing import OUTCOME_ERROR, stamp
from shared.workqueue import WorkQueue

log = logging.getLogger("endpointattachment")

# Our finalizer holds an attachment (and a claim) until its Service and address are released. It is
# written by this module, never by kopf: kopf removes *its* finalizer from objects that have no
# handler needing one, so kopf's must be another name (KOPF_FINALIZER, which it then never adds).
FINALIZER = "endpointattachment.local.sdn.cozystack.io/finalizer"
KOPF_FINALIZER = "endpointattachment.operator.cozystack.io/kopf"
# kopf's annotation prefix: ours alone, never shared with the GPUClass operator or kopf's default.
STORAGE_PREFIX = "endpointattachment.operator.cozystack.io"

ATTACHMENTS = Resource(API_VERSION, ENDPOINT_ATTACHMENT_PLURAL)
CLAIMS = Resource(API_VERSION, IP_ADDRESS_CLAIM_PLURAL)
CLASSES = Resource(API_VERSION, IP_ADDRESS_CLASS_PLURAL, namespaced=False)

# (world kind, API group, version, plural) of every watched kind.
WATCHED: tuple[tuple[str, str, str, str], ...] = (
    ("attachment", GROUP, VERSION, ENDPOINT_ATTACHMENT_PLURAL),
    ("claim", GROUP, VERSION, IP_ADDRESS_CLAIM_PLURAL),
    ("class", GROUP, VERSION, IP_ADDRESS_CLASS_PLURAL),
    ("allocation", GROUP, VERSION, IP_ADDRESS_ALLOCATION_PLURAL),
    ("proxy", GROUP, VERSION, SERVICE_PROXY_PLURAL),
    ("service", "", "v1", "services"),
    ("slice", "discovery.k8s.io", "v1", "endpointslices"),
    ("helmrelease", HELMRELEASE_GROUP, HELMRELEASE_VERSION, HELMRELEASE_PLURAL),
    ("namespace", "", "v1", "namespaces"),
)

# status.capacity is an int64 in the CRD: larger pools report it saturated.
INT64_MAX = 2**63 - 1
WorkKey = tuple[str, str, str]  # (attachment | claim | class, namespace, name)
SPAN_KINDS = {"attachment": "EndpointAttachment", "claim": "IPAddressClaim", "class": "IPAddressClass"}


@dataclass
class Operator:
    settings: Settings
    telemetry: Telemetry
    world: World = field(default_factory=World)
    queue: WorkQueue[WorkKey] = field(default_factory=WorkQueue)
    kube: Kube | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    # --- observation -----------------------------------------------------------------------------

    def observe(self, kind: str, event: kopf.RawEvent) -> None:
        self.telemetry.reconciles.event_seen()
        obj = event["object"]
        if event["type"] == "DELETED":
            self.world.drop(kind, obj)
            self.wake_for(kind, obj)
            return
        old = self.world.get(kind, obj)
        if old is not None and _version(old) == _version(obj):
            return  # the echo of our own write, already in the caches and acted on
        self.world.put(kind, obj)
        self.wake_for(kind, obj, spec_changed=_spec_changed(old, obj), old=old)

    def wake_for(
        self,
        kind: str,
        obj: Obj,
        *,
        own_write: bool = False,
        spec_changed: bool = True,
        old: Obj | None = None,
    ) -> None:
        """Wake the passes ``obj``'s change concerns. After our own write, the pass that wrote is not
        woken again (it already decided with what it wrote); a class's status (written here) is read
        by no one, so only a change to what its generation covers wakes its dependents. Those the old
        version concerned are woken too (a Service leaving the proxy frees the pods it held)."""
        writer = _PASSING.get() if own_write else None
        wake: list[WorkKey] = []
        if spec_changed or kind not in _SPEC_READERS_ONLY:
            for version in (obj, old) if old is not None else (obj,):
                wake += [("attachment", *key) for key in self.world.attachments_affected_by(kind, version)]
                wake += [("claim", *key) for key in self.world.claims_affected_by(kind, version)]
        if kind == "class" and spec_changed:
            wake.append(("class", "", key_of(obj)[1]))
        elif kind == "allocation":
            wake.append(("class", "", str((obj.get("spec") or {}).get("className"))))
        for key in wake:
            if key != writer:
                self.queue.add(key)

    def remember(self, kind: str, obj: Obj) -> None:
        """Put the answer of our own write into the caches, ahead of its watch event (which is then
        recognised by its resourceVersion and ignored), and wake whoever else it concerns."""
        if obj:
            old = self.world.get(kind, obj)
            self.world.put(kind, obj)
            self.wake_for(kind, obj, own_write=True, spec_changed=_spec_changed(old, obj), old=old)

    # --- passes ----------------------------------------------------------------------------------

    async def work(self, key: WorkKey) -> None:
        """One traced pass over one object; its outcome feeds the reconcile metrics."""
        kind, namespace, name = key
        started = time.perf_counter()
        _PASSING.set(key)  # this worker task's current pass (each task has its own context)
        obj, related = self.subject(kind, namespace, name)
        result = OUTCOME_ERROR
        try:
            with self.telemetry.tracing.start_pass(SPAN_KINDS[kind], obj, related=related) as report:
                if kind == "attachment":
                    await self.pass_attachment((namespace, name))
                elif kind == "claim":
                    await self.pass_claim((namespace, name))
                else:
                    await self.pass_class(name)
                report.reasons = _reasons(self.subject(kind, namespace, name)[0])
                result = report.outcome
            self.queue.forget(key)
        finally:
            self.telemetry.reconciles.observe(result, time.perf_counter() - started)

    def subject(self, kind: str, namespace: str, name: str) -> tuple[Obj | None, list[Obj | None]]:
        """The object a pass is about, and the objects it reads whose writers its span links to."""
        if kind == "attachment":
            attachment = self.world.attachments.get((namespace, name))
            service = self.world.services.get((namespace, service_name(name)))
            held = self.world.held_allocation(attachment) if attachment else None
            return attachment, [service, held]
        if kind == "claim":
            claim = self.world.claims.get((namespace, name))
            return claim, [self.world.held_allocation(claim) if claim else None]
        return self.world.classes.get(name), []

    async def pass_attachment(self, key: Key) -> None:
        """Decide and apply. A mint or a claim binding changes what the plan is made of, so the pass
        decides again at once from the updated caches (a few rounds at most) instead of queueing
        behind every other attachment; if it still has not settled, it is queued again."""
        assert self.kube is not None
        for _ in range(MAX_ROUNDS_PER_PASS):
            observed = self.world.observe(key)
            if observed is None:
                return
            attachment = observed.attachment
            plan = reconcile(observed)
            if plan.finalizing:
                await self.finalize_attachment(attachment, plan, observed.service)
                return
            attachment = await self.ensure_metadata(
                ATTACHMENTS, "attachment", attachment, plan.owner_reference
            )
            if plan.mint is not None:
                _, allocation = await allocator.mint(self.kube, stamp(plan.mint.allocation))
                self.remember("allocation", allocation)
                continue
            if plan.bind_claim is not None and observed.claim is not None:
                bound = await allocator.bind_claim(self.kube, observed.claim, plan.bind_claim.attachment)
                self.remember("claim", bound or {})
                continue
            await self.apply_service(plan, observed.service)
            await self.write_status(
                ATTACHMENTS, "attachment", attachment, plan.status_patch(attachment.get("status"), _now())
            )
            for surplus in self.world.surplus_allocations(attachment):
                log.info("releasing %s: a second allocation of %s", key_of(surplus)[1], key)
                await allocator.release(self.kube, surplus)
                self.world.drop("allocation", surplus)
            return
        self.queue.add(("attachment", *key))

    async def finalize_attachment(self, attachment: Obj, plan: Plan, service: Obj | None) -> None:
        """Service first, then the address, then our finalizer: nothing is left holding anything."""
        assert self.kube is not None
        if FINALIZER not in (attachment["metadata"].get("finalizers") or []):
            return
        namespace, _ = key_of(attachment)
        await self.apply_service(plan, service)
        if plan.release_claim:
            claim = self.world.claims.get((namespace, plan.release_claim))
            if claim is not None:
                self.remember(
                    "claim",
                    await allocator.unbind_claim(self.kube, claim, attachment["metadata"]["uid"]) or {},
                )
        allocation = self.world.held_allocation(attachment)
        if allocation is not None:
            await allocator.release(self.kube, allocation)
        await self.remove_finalizer(ATTACHMENTS, "attachment", attachment)

    async def apply_service(self, plan: Plan, existing: Obj | None) -> None:
        assert self.kube is not None
        action = plan.service_action
        if action is ServiceAction.CREATE and plan.service is not None:
            namespace = plan.service["metadata"]["namespace"]
            try:
                body = stamp(plan.service)
                self.remember("service", await self.kube.create(SERVICES.path(namespace), body))
            except ApiError as error:
                if error.status != 409:
                    raise
                log.info(
                    "Service %s/%s appeared before ours; next pass decides",
                    namespace,
                    plan.service["metadata"]["name"],
                )
        elif action is ServiceAction.PATCH and existing is not None and plan.service_patch is not None:
            namespace, name = key_of(existing)
            self.remember(
                "service",
                await self.kube.patch(SERVICES.path(namespace, name), plan.service_patch, kind="merge"),
            )
        elif action in (ServiceAction.DELETE, ServiceAction.RECREATE) and existing is not None:
            namespace, name = key_of(existing)
            # The UID precondition: only the very Service we judged ours is ever deleted.
            await self.kube.delete(SERVICES.path(namespace, name), uid=existing["metadata"]["uid"])

    async def pass_claim(self, key: Key) -> None:
        assert self.kube is not None
        claim = self.world.claims.get(key)
        if claim is None:
            return
        class_name = str((claim.get("spec") or {}).get("className"))
        claim = await self.clear_stale_user(claim)
        if claim["metadata"].get("deletionTimestamp"):
            if FINALIZER not in (claim["metadata"].get("finalizers") or []):
                return
            held = self.world.held_allocation(claim)
            plan = claims.finalize_claim(claim, key_of(held)[1] if held else None)
            await self.write_status(CLAIMS, "claim", claim, plan.status_patch(claim.get("status"), _now()))
            if plan.release_allocation and held is not None:
                await allocator.release(self.kube, held)
                self.world.drop("allocation", held)
                self.queue.add(("claim", *key))  # the finalizer comes off on the pass that sees it free
            if plan.remove_finalizer:
                await self.remove_finalizer(CLAIMS, "claim", claim)
            return
        claim = await self.ensure_metadata(CLAIMS, "claim", claim, None)
        held_address = self.world.held_address(claim)
        plan = claims.reconcile_claim(
            claim,
            self.world.classes.get(class_name),
            held_address,
            self.world.taken_addresses() if held_address is None else frozenset(),
            self.world.namespace_labels.get(key[0], {}),
        )
        if plan.mint is not None:
            _, allocation = await allocator.mint(self.kube, stamp(plan.mint.allocation))
            self.remember("allocation", allocation)
            self.queue.add(("claim", *key))
            return
        await self.write_status(CLAIMS, "claim", claim, plan.status_patch(claim.get("status"), _now()))
        for surplus in self.world.surplus_allocations(claim):
            log.info("releasing %s: a second allocation of claim %s", key_of(surplus)[1], key)
            await allocator.release(self.kube, surplus)
            self.world.drop("allocation", surplus)

    async def clear_stale_user(self, claim: Obj) -> Obj:
        """A claim whose recorded user is gone (deleted without its finalizer running) is freed,
        once the API, not only the cache, confirms that attachment is gone."""
        assert self.kube is not None
        user = (claim.get("status") or {}).get("attachment") or {}
        uid, namespace = user.get("uid"), claim["metadata"]["namespace"]
        if not uid or any(
            (a.get("metadata") or {}).get("uid") == uid
            for k, a in self.world.attachments.items()
            if k[0] == namespace
        ):
            return claim
        current = await self.kube.get(ATTACHMENTS.path(namespace, str(user.get("name") or "")))
        if current is not None and current["metadata"]["uid"] == uid:
            return claim
        log.info(
            "claim %s/%s: user %s is gone; freeing the claim", namespace, claim["metadata"]["name"], user
        )
        freed = await allocator.unbind_claim(self.kube, claim, str(uid))
        self.remember("claim", freed or {})
        return freed or claim

    async def pass_class(self, name: str) -> None:
        address_class = self.world.classes.get(name)
        if address_class is None:
            return
        capacity, allocated = repair.class_usage(address_class, list(self.world.allocations.values()))
        if capacity is not None:
            capacity = min(capacity, INT64_MAX)  # an IPv6 /64 holds more than the int64 status field
        stored = address_class.get("status") or {}
        fields = {"capacity": capacity, "allocated": allocated}
        ops: JsonPatch = [] if stored else [{"op": "add", "path": "/status", "value": {}}]
        for field_name, value in fields.items():
            if value is None and field_name in stored:
                ops.append({"op": "remove", "path": f"/status/{field_name}"})
            elif value is not None and stored.get(field_name) != value:
                ops.append({"op": "add", "path": f"/status/{field_name}", "value": value})
        if len(ops) > (0 if stored else 1):
            await self.write_status(CLASSES, "class", address_class, ops)

    # --- metadata and status writes -------------------------------------------------------------

    async def ensure_metadata(self, resource: Resource, kind: str, obj: Obj, owner_reference: Any) -> Obj:
        """Our finalizer, and the owner reference to the application, added by one JSON patch."""
        assert self.kube is not None
        metadata = obj["metadata"]
        ops: JsonPatch = [{"op": "test", "path": "/metadata/uid", "value": metadata["uid"]}]
        finalizers = metadata.get("finalizers")
        if FINALIZER not in (finalizers or []):
            ops.append(
                {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}
                if finalizers
                else {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}
            )
        if owner_reference is not None:
            references = metadata.get("ownerReferences")
            ops.append(
                {"op": "add", "path": "/metadata/ownerReferences/-", "value": dict(owner_reference)}
                if references
                else {"op": "add", "path": "/metadata/ownerReferences", "value": [dict(owner_reference)]}
            )
        if len(ops) == 1:
            return obj
        namespace, name = key_of(obj)
        updated = await self.kube.patch(resource.path(namespace, name), ops)
        self.remember(kind, updated)
        return updated

    async def remove_finalizer(self, resource: Resource, kind: str, obj: Obj) -> None:
        assert self.kube is not None
        finalizers = list(obj["metadata"].get("finalizers") or [])
        index = finalizers.index(FINALIZER)
        namespace, name = key_of(obj)
        ops = [
            {"op": "test", "path": f"/metadata/finalizers/{index}", "value": FINALIZER},
            {"op": "remove", "path": f"/metadata/finalizers/{index}"},
        ]
        try:
            self.remember(kind, await self.kube.patch(resource.path(namespace, name), ops))
        except ApiError as error:
            if error.status != 404:
                raise

    async def write_status(self, resource: Resource, kind: str, obj: Obj, ops: JsonPatch) -> None:
        """Apply a status patch, pinned to the object's UID; nothing when there is nothing to say."""
        assert self.kube is not None
        if not ops:
            return
        namespace, name = key_of(obj)
        guarded = [{"op": "test", "path": "/metadata/uid", "value": obj["metadata"]["uid"]}, *ops]
        try:
            self.remember(kind, await self.kube.patch(resource.path(namespace, name) + "/status", guarded))
        except ApiError as error:
            if error.status in (404, 409, 422):
                log.info("%s %s/%s changed under the pass (%s); passing again", kind, namespace, name, error)
                self.queue.add((kind, namespace, name))
                return
            raise

    # --- repair ----------------------------------------------------------------------------------

    async def repair_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.repair_interval_seconds)  # a period, not a wait for an effect
            try:
                await self.repair_once()
            except Exception:
                log.exception("repair pass failed; the next one retries")

    async def repair_once(self) -> int:
        assert self.kube is not None
        removed = 0
        grace = timedelta(seconds=self.settings.repair_grace_seconds)
        for orphan in repair.orphans(
            list(self.world.allocations.values()), self.world.live_holders(), datetime.now(UTC), grace
        ):
            allocation = self.world.allocations.get(orphan.name)
            if allocation is None or not await allocator.holder_is_gone(self.kube, allocation):
                continue
            log.info("releasing orphaned allocation %s: %s", orphan.name, orphan.reason)
            await self.kube.delete(allocator.ALLOCATIONS.path(name=orphan.name), uid=orphan.uid)
            removed += 1
        return removed


def _version(obj: Obj) -> str | None:
    return (obj.get("metadata") or {}).get("resourceVersion")


def _spec_changed(old: Obj | None, new: Obj) -> bool:
    """Whether anything but status changed: CRDs with a status subresource bump ``generation`` only
    for spec changes, and labels or deletion are looked at on their own."""
    if old is None:
        return True
    before, after = old.get("metadata") or {}, new.get("metadata") or {}
    return any(before.get(k) != after.get(k) for k in ("generation", "labels", "deletionTimestamp"))


# Rounds of decide-and-apply in one pass before it yields its worker (a mint racing other minters
# for a nearly full pool can take several).
MAX_ROUNDS_PER_PASS = 4
# The key the current worker task is passing over, so its own writes do not wake it again.
_PASSING: ContextVar[WorkKey | None] = ContextVar("passing", default=None)
# Kinds whose dependents read only spec and metadata: a status-only change to one wakes no one.
_SPEC_READERS_ONLY = frozenset({"class", "proxy"})


def _now() -> str:
    return rfc3339(datetime.now(UTC))


def _reasons(obj: Obj | None) -> list[str]:
    return [str(c.get("reason")) for c in ((obj or {}).get("status") or {}).get("conditions") or []]


def operator_settings() -> kopf.OperatorSettings:
    return kopf_settings(KOPF_FINALIZER, STORAGE_PREFIX)


def build_registry(operator: Operator) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    add_login(registry)

    @kopf.on.startup(registry=registry)
    async def startup(**_: Any) -> None:
        operator.kube = await Kube.connect(operator.settings.kubeconfig)
        operator.kube.tracer = operator.telemetry.tracing.tracer
        operator.tasks = [
            asyncio.create_task(
                operator.queue.run(operator.work, operator.settings.workers), name="ea-workers"
            ),
            asyncio.create_task(operator.repair_loop(), name="ea-repair"),
            asyncio.create_task(operator.telemetry.liveness.heartbeat(), name="ea-heartbeat"),
        ]

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        for task in operator.tasks:
            task.cancel()

    for kind, group, version, plural in WATCHED:
        # async: runs on the event loop, in order, with no thread hand-off.
        async def observe(event: kopf.RawEvent, _kind: str = kind, **_: Any) -> None:
            operator.observe(_kind, event)

        kopf.on.event(group, version, plural, registry=registry, id=f"observe-{kind}")(observe)

    return registry
