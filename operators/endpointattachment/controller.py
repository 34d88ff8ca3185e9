"""The EndpointAttachment operator on the controller runtime: its caches, three controllers and a
repair loop, declared.

Decides: the glue, and only the glue.

* **what wakes which pass**: one wiring block per controller. Each watched kind maps a change to the
  keys it concerns through a named map function of one version (the runtime maps both: a Service
  leaving the proxy frees the pods it held for others), behind predicates: a status-only
  change of a class or a ServiceProxy wakes no one (status is ours, and no pass reads it), nor does
  one of a HelmRelease (only its labels and UID are read) or a Namespace that kept its labels. A
  change wakes only the passes that read what changed, so no kind wakes every attachment per event:
  a mint wakes its minter alone (only a freed address concerns the class's address-less), a slice
  wakes VM-mode attachments alone and only when its ready backends change (all of them only for a
  proxied Service's slice), and a proxied Service wakes them all only when it joins or leaves its
  proxy or changes controller. The runtime drops the echo of our own writes by resourceVersion and
  never wakes the pass that wrote.
* **attachments**: a pass builds ``Observed`` from the caches (``world``), asks the pure
  ``reconcile`` for a plan, and applies it. A mint or a claim binding changes what the plan is made
  of, so the pass decides again at once from the caches (the write's answer is already in them) for
  a few rounds (``MAX_ROUNDS_PER_PASS``), instead of queueing behind every other attachment. The
  pass that creates the rendered Service holds its status back (``STATUS_HOLD_SECONDS``) while it
  only waits for the load balancer: the answer usually comes first and the pass it wakes writes the
  status once, Ready; otherwise a re-check writes AddressPending when the hold runs out.
* **claims**: ``claims.reconcile_claim`` / ``finalize_claim``, with the same re-deciding after a
  mint or a release; a user recorded on a claim whose attachment is gone (deleted without its
  finalizer running) is cleared once the API, not only the cache, confirms it is gone.
* **classes**: ``status.capacity``, ``status.allocated`` and the Ready condition
  (``repair.class_status``) from the class's allocations (debounced: a burst of mints is one status
  write).
* our finalizer on attachments and claims orders deletion: the rendered Service first, then, once
  the cache sees it gone (its deletion wakes the pass through ``owns``), the address (allocation
  deleted, claim use cleared), then the finalizer.
* the API's refusal of the rendered Service (400, 403, 422: validation, a webhook or policy, a quota,
  a terminating namespace) is remembered per attachment (``reconcile.ServiceRefusal``) and handed to
  the next decision, which reports it and does not send the same request again; no traceback, no
  backoff loop. A create that finds the name taken (409) reads the squatter into the cache and decides
  again at once (``ServiceNameConflict``). When the pass last changed the rendered Service, and the
  time, go to the decision too (``reconcile.PassContext``), which asks to look again at the announce
  deadline or the quota retry (``Result(requeue_after=...)``). What is remembered is lost on a
  restart: the first pass then sends the request once more.
* **exclusivity and cozy-proxy**: Pods are cached (unfinished ones, only their labels and phase:
  ``world.slim_pod``), so exclusivity is decided over the pods an endpoint selects before any of
  them has an endpoint; a Pod appearing, going or changing labels wakes the VM-mode attachments of
  its namespace. Whenever a pass deletes or patches a proxied Service of ours, the other proxied
  Services that selected its pods (``World.survivors_of``) get ``REPROGRAM_ANNOTATION``, so
  cozy-proxy, whose deletes are keyed on the pod, programs them again.
* the repair loop (leader only) deletes orphaned allocations (``repair.orphans``) after a grace.

Does not: decide any condition, name, address or Service field (the pure modules do), adopt or delete
a Service without our controller reference, write labels or annotations to objects it does not own
(but for ``REPROGRAM_ANNOTATION``, our own key, on a proxied survivor), or write anything but through
the runtime's ``Writer`` (leader gate, write-through).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from prometheus_client import CollectorRegistry

from operators.endpointattachment import allocator, claims, repair
from operators.endpointattachment.constants import (
    ENDPOINT_ATTACHMENT_KIND,
    ENDPOINTSLICE_SERVICE_NAME_LABEL,
    IP_ADDRESS_CLAIM_KIND,
    IP_ADDRESS_CLASS_KIND,
    PROGRAMMED_ANNOTATION,
    REPROGRAM_ANNOTATION,
    SERVICE_PROXY_NAME_LABEL,
)
from operators.endpointattachment.datapath import programmed_backends, ready_backends, reprogram_token
from operators.endpointattachment.metrics import WorldCollector
from operators.endpointattachment.reconcile import (
    PassContext,
    Plan,
    ServiceAction,
    ServiceRefusal,
    reconcile,
    refusal_of,
)
from operators.endpointattachment.settings import Settings
from operators.endpointattachment.world import (
    ALLOCATIONS,
    ATTACHMENTS,
    BY_CLAIM,
    BY_CLASS,
    BY_ENDPOINT,
    BY_NAMESPACE,
    BY_RENDERED_SERVICE,
    BY_USER,
    CACHES,
    CLAIMS,
    CLASSES,
    HELMRELEASES,
    PROXIES,
    World,
    holder_of,
    labels,
)
from shared.conditions import rfc3339, status_patch
from shared.kube import ApiError
from shared.lineage import application_of, belongs_to
from shared.ownership import sole_controller
from shared.resources import ENDPOINT_SLICES, ENDPOINTS, NAMESPACES, PODS, SERVICES
from shared.runtime.cache import Key, Obj, key_of
from shared.runtime.controller import (
    Caches,
    Result,
    Watch,
    Wiring,
    Write,
    generation_changed,
    labels_changed,
    until_settled,
)
from shared.runtime.manager import Manager
from shared.runtime.writes import Writer, blocks_deletion_of, sets_owner_references
from shared.telemetry.metrics import on_loop
from shared.telemetry.tracing import current_pass

log = logging.getLogger("endpointattachment")

# Our finalizer holds an attachment (and a claim) until its Service and address are released. It is
# written by this operator, never by kopf: kopf only runs the process and has no resource handler,
# so kopf's own finalizer must merely be another name (KOPF_FINALIZER, which it then never adds).
FINALIZER: Final = "endpointattachment.local.sdn.cozystack.io/finalizer"
KOPF_FINALIZER: Final = "endpointattachment.operator.cozystack.io/kopf"
# kopf's annotation prefix: ours alone, never shared with the GPUClass operator or kopf's default.
STORAGE_PREFIX: Final = "endpointattachment.operator.cozystack.io"

# Rounds of decide-and-apply in one pass before it yields its worker (a mint racing other minters
# for a nearly full pool can take several); a pass that has not settled by then runs again.
MAX_ROUNDS_PER_PASS: Final = 4
# A pass that has just created the rendered Service writes no status: the load balancer's answer
# usually comes first, and the pass it wakes writes the status once (Ready). When it does not come
# within this hold, a re-check writes AddressPending. One status write per attachment, not two.
STATUS_HOLD_SECONDS: Final = 1.0
# status.capacity is an int64 in the CRD: larger pools report it saturated.
INT64_MAX: Final = 2**63 - 1
# The shortest timed re-check a pass asks for (an announce deadline just past is not a busy loop).
MIN_RECHECK_SECONDS: Final = 0.05
# A class's counts are for people and alerts, read by no pass: a burst of mints and releases is
# one status write, a moment after the burst (and never more than a few seconds late).
CLASS_STATUS_DEBOUNCE_SECONDS: Final = 0.25
CLASS_STATUS_MAX_DELAY_SECONDS: Final = 2.0


def _now() -> str:
    return rfc3339(datetime.now(UTC))


def is_deletion(old: Obj | None, new: Obj | None) -> bool:
    """Only the object's disappearance from the cache."""
    return new is None


# --- map functions: one version of one object -> the keys it concerns -----------------------------
# The runtime maps both versions of a change (whom the old one concerned, too); what depends on the
# change itself (an address freed, a Service joining a proxy) is a predicate of its own watch.


def attachments_of_claim(caches: Caches, claim: Obj) -> frozenset[Key]:
    """The attachments naming the claim (its phase, address and recorded user decide AddressBound)."""
    return caches.store(ATTACHMENTS).index_keys(BY_CLAIM, key_of(claim))


def attachments_of_class(caches: Caches, ip_class: Obj) -> set[Key]:
    """The attachments minting from the class, and those whose claim is of that class."""
    return set(World(caches).of_class(key_of(ip_class)[1]))


def holder_of_allocation(caches: Caches, allocation: Obj) -> set[Key]:
    """The attachment holding the allocation (a burst of mints wakes no one but the minters)."""
    holder = holder_of(allocation)
    if holder.get("kind") != ENDPOINT_ATTACHMENT_KIND:
        return set()
    return {(str(holder.get("namespace") or ""), str(holder.get("name") or ""))}


def address_freed(old: Obj | None, new: Obj | None) -> bool:
    """An allocation deleted, or no longer for the same address of the same class: an address freed."""
    return old is not None and (new is None or _address_of(old) != _address_of(new))


def address_less_of_class(caches: Caches, allocation: Obj) -> set[Key]:
    """Every attachment minting from the allocation's class that holds no address (behind
    ``address_freed``: a freed address may end its PoolExhausted or AddressInUse)."""
    return World(caches).address_less(str((allocation.get("spec") or {}).get("className")))


def _address_of(allocation: Obj) -> tuple[Any, Any]:
    spec = allocation.get("spec") or {}
    return spec.get("className"), spec.get("address")


def attachments_in_vm_mode(caches: Caches, obj: Obj) -> frozenset[Key]:
    """Every attachment in a VM mode (a ServiceProxy's declaration, or a proxied Service's
    exclusivity reading, concerns them all)."""
    return World(caches).in_vm_mode()


def attachments_of_service(caches: Caches, service: Obj) -> set[Key]:
    """The attachments using the Service as their endpoint; the attachment whose rendered name a
    Service not controlled by an attachment squats, labelled or not (to report the conflict, and to
    render once the squatter is gone). The attachment controlling a rendered Service is woken
    through ``owns``; every VM-mode attachment, by ``attachments_in_vm_mode`` behind
    ``proxy_reading_changed``."""
    world = World(caches)
    key = key_of(service)
    keys = set(world.attachments.index_keys(BY_ENDPOINT, key))
    if (sole_controller(service) or {}).get("kind") != ENDPOINT_ATTACHMENT_KIND:
        keys |= world.attachments.index_keys(BY_RENDERED_SERVICE, key)
    return keys


def proxy_reading_changed(old: Obj | None, new: Obj | None) -> bool:
    """The Service joined or left a proxy, or its proxy, controller or selector changed: what the
    exclusivity check reads of it (its backends come with its slices)."""
    return _as_proxied(old) != _as_proxied(new)


def _as_proxied(service: Obj | None) -> tuple[str, Any, Any, Any, Any] | None:
    """What the exclusivity check reads of a Service itself: its proxy, its controller and its
    selector (None when it is not, or no longer, delegated to a proxy)."""
    proxy = labels(service).get(SERVICE_PROXY_NAME_LABEL) if service is not None else None
    if proxy is None or service is None:
        return None
    owner = sole_controller(service) or {}
    selector = sorted(((service.get("spec") or {}).get("selector") or {}).items())
    return proxy, owner.get("kind"), owner.get("name"), owner.get("uid"), selector


def slice_reading_changed(old: Obj | None, new: Obj | None) -> bool:
    """A slice added or deleted, or its Service or ready backends changed (what a pass reads)."""
    return old is None or new is None or _slice_reading(old) != _slice_reading(new)


def attachments_of_slice(caches: Caches, endpoint_slice: Obj) -> set[Key]:
    """VM-mode attachments only (no other mode reads a slice): those whose endpoint the slice
    serves, and all of them when the slice is of a proxied Service (its backends decide
    exclusivity). A slice whose Service is not cached yet wakes no one for exclusivity: the
    Service's own arrival does."""
    world = World(caches)
    in_vm_mode = world.in_vm_mode()
    if not in_vm_mode:
        return set()
    service = (key_of(endpoint_slice)[0], labels(endpoint_slice).get(ENDPOINTSLICE_SERVICE_NAME_LABEL, ""))
    if world.is_proxied(service):
        return set(in_vm_mode)
    return set(world.attachments.index_keys(BY_ENDPOINT, service) & in_vm_mode)


def programmed_reading_changed(old: Obj | None, new: Obj | None) -> bool:
    """v1 Endpoints added or deleted, or the ready backends cozy-proxy would program changed."""
    return old is None or new is None or programmed_backends(old) != programmed_backends(new)


def attachment_of_rendered_endpoints(caches: Caches, endpoints: Obj) -> frozenset[Key]:
    """The VM-mode attachment whose rendered Service these v1 Endpoints are of (named alike): what
    cozy-proxy reads decides its Ready and the one touch of ``PROGRAMMED_ANNOTATION``."""
    world = World(caches)
    return world.attachments.index_keys(BY_RENDERED_SERVICE, key_of(endpoints)) & world.in_vm_mode()


def _slice_reading(endpoint_slice: Obj) -> tuple[str | None, frozenset[str]]:
    """What a pass reads of a slice: its Service and its ready backends."""
    return labels(endpoint_slice).get(ENDPOINTSLICE_SERVICE_NAME_LABEL), ready_backends((endpoint_slice,))


def attachments_of_pod(caches: Caches, pod: Obj) -> frozenset[Key]:
    """The VM-mode attachments of the pod's namespace, when a pod appears, goes (or finishes: the
    cache's field selector drops it) or changes its labels: which Services select it decides
    exclusivity, before the pod has an endpoint (the wiring's ``labels_changed`` predicate)."""
    world = World(caches)
    # Pod events are many: intersect with the namespace's index, never scan every VM-mode key.
    return world.attachments.index_keys(BY_NAMESPACE, key_of(pod)[0]) & world.in_vm_mode()


def attachments_of_helmrelease(caches: Caches, release: Obj) -> set[Key]:
    """The attachments of its namespace whose endpoint belongs to the release's application (all of
    them when the release names none, and those whose endpoint is not cached: it may)."""
    world = World(caches)
    app = application_of(release)
    keys: set[Key] = set()
    for attachment in world.attachments.index(BY_NAMESPACE, key_of(release)[0]):
        endpoint = world.endpoint_of(attachment)
        if app is None or endpoint is None or belongs_to(endpoint, app):
            keys.add(key_of(attachment))
    return keys


def attachments_in_namespace(caches: Caches, namespace: Obj) -> frozenset[Key]:
    """The attachments of the namespace (its labels decide a class's allowedNamespaces)."""
    return caches.store(ATTACHMENTS).index_keys(BY_NAMESPACE, key_of(namespace)[1])


# --- map functions: claims -------------------------------------------------------------------------


def claims_of_allocation(caches: Caches, allocation: Obj) -> set[Key]:
    """The claim holding the allocation."""
    holder = holder_of(allocation)
    if holder.get("kind") != IP_ADDRESS_CLAIM_KIND or not holder.get("name"):
        return set()
    return {(str(holder.get("namespace") or ""), str(holder["name"]))}


def claims_of_class(caches: Caches, ip_class: Obj) -> frozenset[Key]:
    """The claims of the class."""
    return caches.store(CLAIMS).index_keys(BY_CLASS, key_of(ip_class)[1])


def claims_in_namespace(caches: Caches, namespace: Obj) -> frozenset[Key]:
    """The claims of the namespace (its labels decide a class's allowedNamespaces)."""
    return caches.store(CLAIMS).index_keys(BY_NAMESPACE, key_of(namespace)[1])


def claims_used_by_attachment(caches: Caches, attachment: Obj) -> set[Key]:
    """The claims recording the attachment as their user: once it is gone (deleted without its
    finalizer running, the wiring's ``is_deletion``), its claims are freed."""
    uid = (attachment.get("metadata") or {}).get("uid")
    if not uid:
        return set()
    namespace = key_of(attachment)[0]
    return {k for k in caches.store(CLAIMS).index_keys(BY_USER, str(uid)) if k[0] == namespace}


# --- map functions: classes ------------------------------------------------------------------------


def class_of_allocation(caches: Caches, allocation: Obj) -> set[Key]:
    """The class the allocation counts in."""
    name = (allocation.get("spec") or {}).get("className")
    return {("", str(name))} if name else set()


# --- the three controllers -------------------------------------------------------------------------

ATTACHMENT_CONTROLLER: Final = Wiring(
    name="endpointattachment",
    primary=ATTACHMENTS,
    primary_kind=ENDPOINT_ATTACHMENT_KIND,
    owns=(SERVICES,),  # the rendered ea-* Service: its controller reference names the attachment
    watches=(
        Watch(CLAIMS, attachments_of_claim),
        Watch(CLASSES, attachments_of_class, (generation_changed,)),
        Watch(ALLOCATIONS, holder_of_allocation),
        Watch(ALLOCATIONS, address_less_of_class, (address_freed,)),
        Watch(PROXIES, attachments_in_vm_mode, (generation_changed,)),
        Watch(SERVICES, attachments_of_service),
        Watch(SERVICES, attachments_in_vm_mode, (proxy_reading_changed,)),
        Watch(ENDPOINT_SLICES, attachments_of_slice, (slice_reading_changed,)),
        Watch(ENDPOINTS, attachment_of_rendered_endpoints, (programmed_reading_changed,)),
        Watch(PODS, attachments_of_pod, (labels_changed,)),
        Watch(HELMRELEASES, attachments_of_helmrelease, (labels_changed,)),
        Watch(NAMESPACES, attachments_in_namespace, (labels_changed,)),
    ),
    writes=(
        Write(ATTACHMENTS, ("patch",)),  # our finalizer, the owner reference to the application
        sets_owner_references(ATTACHMENTS),  # that owner reference, where admission enforces it
        blocks_deletion_of(ATTACHMENTS),  # the rendered Service's blockOwnerDeletion reference
        Write(ATTACHMENTS, ("patch",), "status"),
        Write(SERVICES, ("create", "patch", "delete")),
        Write(ALLOCATIONS, ("create", "delete")),  # mint, release
        Write(CLAIMS, ("patch",), "status"),  # the claim's user
    ),
    caches=CACHES,
    workers=Settings.workers,  # the default: ``build`` applies --workers
)

CLAIM_CONTROLLER: Final = Wiring(
    name="ipaddressclaim",
    primary=CLAIMS,
    primary_kind=IP_ADDRESS_CLAIM_KIND,
    watches=(
        Watch(ALLOCATIONS, claims_of_allocation),
        Watch(CLASSES, claims_of_class, (generation_changed,)),
        Watch(NAMESPACES, claims_in_namespace, (labels_changed,)),
        Watch(ATTACHMENTS, claims_used_by_attachment, (is_deletion,)),
    ),
    writes=(
        Write(CLAIMS, ("patch",)),  # our finalizer
        Write(CLAIMS, ("patch",), "status"),
        Write(ALLOCATIONS, ("create", "delete")),
    ),
    caches=CACHES,
    workers=Settings.workers,
)

CLASS_CONTROLLER: Final = Wiring(
    name="ipaddressclass",
    primary=CLASSES,
    primary_kind=IP_ADDRESS_CLASS_KIND,
    predicates=(generation_changed,),  # its own status (ours) wakes no one
    watches=(Watch(ALLOCATIONS, class_of_allocation),),
    writes=(Write(CLASSES, ("patch",), "status"),),
    caches=CACHES,
    debounce=CLASS_STATUS_DEBOUNCE_SECONDS,
    max_delay=CLASS_STATUS_MAX_DELAY_SECONDS,
)


# --- reconcilers -----------------------------------------------------------------------------------


def _read(*objects: Mapping[str, Any] | None) -> None:
    """Link the current pass to the passes that wrote what it reads."""
    report = current_pass()
    if report is not None:
        report.read(*objects)


def _finalizers(obj: Mapping[str, Any]) -> list[str]:
    return list((obj.get("metadata") or {}).get("finalizers") or [])


class AttachmentReconciler:
    def __init__(
        self,
        world: World,
        writer: Writer,
        clock: Callable[[], float] = time.monotonic,
        *,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        announce_timeout: float = Settings.announce_timeout_seconds,
        quota_retry: float = Settings.quota_retry_seconds,
    ) -> None:
        self.world, self.writer, self.clock, self.wall_clock = world, writer, clock, wall_clock
        self.announce_timeout, self.quota_retry = announce_timeout, quota_retry
        # Keys whose Service a pass created, until when their AddressPending status is held back.
        self._holding: dict[Key, float] = {}
        # The API's last refusal of each attachment's rendered Service, and when a pass last changed
        # it (its creation is on the Service itself): what the next decision needs to know.
        self._refusals: dict[Key, ServiceRefusal] = {}
        self._written: dict[Key, datetime] = {}

    def _forget(self, key: Key) -> None:
        for memory in (self._holding, self._refusals, self._written):
            memory.pop(key, None)

    async def reconcile(self, key: Key) -> Result:
        for _ in range(MAX_ROUNDS_PER_PASS):
            outcome = await self._round(key)
            if outcome is None:
                return Result()
            if outcome > 0:
                return Result(requeue_after=outcome)
        return Result(requeue=True)

    async def _round(self, key: Key) -> float | None:
        """Decide and apply once. None: settled; 0: decide again now (a mint or a claim binding
        changed what the plan is made of); more: the status is held back, look again this much later."""
        attachment = self.world.attachments.get(key)
        if attachment is None:
            self._forget(key)
            return None
        observed = self.world.observed(attachment)
        # What it reads that an earlier pass wrote: its Service, its address, and a claim's address.
        claim_address = self.world.held_allocation(observed.claim) if observed.claim is not None else None
        _read(observed.service, self.world.held_allocation(attachment), claim_address)
        context = PassContext(
            now=self.wall_clock(),
            written_at=self._written.get(key),
            refusal=self._refusals.get(key),
            announce_timeout_seconds=self.announce_timeout,
            quota_retry_seconds=self.quota_retry,
        )
        plan = reconcile(observed, context)
        if plan.finalizing:
            self._forget(key)
            await self._finalize(attachment, plan, observed.service)
            return None
        attachment = await self.writer.ensure_metadata(
            ATTACHMENTS, attachment, finalizer=FINALIZER, owner_reference=plan.owner_reference
        )
        if plan.mint is not None:
            await allocator.mint(self.writer, plan.mint.allocation)
            return 0.0
        if plan.bind_claim is not None and observed.claim is not None:
            await allocator.bind_claim(self.writer, observed.claim, plan.bind_claim.attachment)
            return 0.0
        now = self.clock()
        applied = await self._apply_service(key, plan, observed.service)
        if applied is _Applied.AGAIN:
            return 0.0  # refused, or the name was taken: the next round reports it
        if applied is _Applied.CREATED:
            self._holding[key] = now + STATUS_HOLD_SECONDS
        if plan.programmed is not None and observed.service is not None:
            await self._touch_programmed(observed.service, plan.programmed)
        held = self._held_for(key, plan, now)
        if held is None:
            await self.writer.patch_status(
                ATTACHMENTS, attachment, plan.status_patch(attachment.get("status"), _now())
            )
        for surplus in self.world.surplus_allocations(attachment):
            log.info("releasing %s: a second allocation of %s/%s", key_of(surplus)[1], *key)
            await allocator.release(self.writer, surplus)
        waits = [w for w in (held, plan.recheck_after) if w is not None]
        return max(min(waits), MIN_RECHECK_SECONDS) if waits else None

    async def _touch_programmed(self, service: Mapping[str, Any], token: str) -> None:
        """Our VM-mode Service has its address and a backend in its v1 Endpoints: update it once
        (``PROGRAMMED_ANNOTATION``), so a cozy-proxy that saw the address before the Endpoints
        programs it now instead of at its next resync."""
        current = self.world.services.get(key_of(service)) or service  # after this pass's own patch
        await self.writer.patch(
            SERVICES, current, {"metadata": {"annotations": {PROGRAMMED_ANNOTATION: token}}}, "merge"
        )

    def _held_for(self, key: Key, plan: Plan, now: float) -> float | None:
        """How much longer the status of a Service just created is held back: only while it waits
        for the load balancer and the hold has not run out (then the status is written)."""
        until = self._holding.get(key)
        if until is None:
            return None
        remaining = until - now
        if remaining > 0 and plan.waits_for_load_balancer:
            return remaining
        del self._holding[key]
        return None

    async def _finalize(self, attachment: Obj, plan: Plan, service: Mapping[str, Any] | None) -> None:
        """Service first; once it is gone, the address, then our finalizer: nothing is left holding
        anything, and no address is free while a Service still asks for it."""
        if FINALIZER not in _finalizers(attachment):
            return
        namespace, _ = key_of(attachment)
        await self._apply_service(key_of(attachment), plan, service)
        if plan.waits_for_service:
            return  # the Service's deletion (a watch event, through ``owns``) wakes the next pass
        if plan.release_claim:
            claim = self.world.claims.get((namespace, plan.release_claim))
            if claim is not None:
                await allocator.unbind_claim(self.writer, claim, attachment["metadata"]["uid"])
        allocation = self.world.held_allocation(attachment)
        if allocation is not None:
            await allocator.release(self.writer, allocation)
        await self.writer.remove_finalizer(ATTACHMENTS, attachment, FINALIZER)

    async def _apply_service(
        self, key: Key, plan: Plan, existing: Mapping[str, Any] | None
    ) -> _Applied | None:
        """Apply the plan's Service action: CREATED, AGAIN (refused, or the name taken: decide again
        with what the API said), or None."""
        action = plan.service_action
        if action is ServiceAction.CREATE and plan.service is not None:
            try:
                await self.writer.create(SERVICES, plan.service)
            except ApiError as error:
                if error.status == 409:
                    await self._read_squatter(plan.service)
                    return _Applied.AGAIN
                return self._refused(key, action, plan.service, error)
            self._refusals.pop(key, None)
            return _Applied.CREATED
        if action is ServiceAction.PATCH and existing is not None and plan.service_patch is not None:
            survivors = self.world.survivors_of(existing)
            try:
                updated = await self.writer.patch(SERVICES, existing, plan.service_patch, "merge")
            except ApiError as error:
                return self._refused(key, action, plan.service_patch, error)
            await self._reprogram(survivors, existing, updated)
            self._refusals.pop(key, None)
            self._written[key] = self.wall_clock()
        elif action in (ServiceAction.DELETE, ServiceAction.RECREATE) and existing is not None:
            # The UID precondition: only the very Service we judged ours is ever deleted.
            survivors = self.world.survivors_of(existing)
            await self.writer.delete(SERVICES, existing)
            await self._reprogram(survivors, existing, existing)
        return None

    def _refused(self, key: Key, action: ServiceAction, body: Mapping[str, Any], error: ApiError) -> _Applied:
        """Remember a refusal for the next decision; an error that is not one is raised (retried)."""
        refusal = refusal_of(action, body, error.status, error.message, self.wall_clock())
        if refusal is None:
            raise error
        log.info("%s/%s: the API refused the rendered Service (%s): %s", *key, refusal.reason, error)
        self._refusals[key] = refusal
        return _Applied.AGAIN

    async def _reprogram(
        self, survivors: list[Obj], before: Mapping[str, Any], after: Mapping[str, Any]
    ) -> None:
        """cozy-proxy keys its entries on the pod, and its delete (or re-programming) of our Service
        cleared the entries of pods the survivors hold: an update of a Service makes cozy-proxy program
        it again, so each survivor gets our annotation naming the change (``before`` as it was, at
        ``after``'s resourceVersion; once: a repeated pass finds it written)."""
        changed = self.world.as_proxied(before)
        if changed is None or not survivors:
            return
        version = str((after.get("metadata") or {}).get("resourceVersion") or "")
        value = reprogram_token(dataclasses.replace(changed, resource_version=version))
        for survivor in survivors:
            metadata = survivor.get("metadata") or {}
            if (
                metadata.get("deletionTimestamp")
                or (metadata.get("annotations") or {}).get(REPROGRAM_ANNOTATION) == value
            ):
                continue
            log.info("Service %s/%s: asking cozy-proxy to program it again (%s)", *key_of(survivor), value)
            try:
                await self.writer.patch(
                    SERVICES, survivor, {"metadata": {"annotations": {REPROGRAM_ANNOTATION: value}}}, "merge"
                )
            except ApiError as error:
                if error.status != 404:  # gone meanwhile: nothing left to program
                    raise

    async def _read_squatter(self, service: Mapping[str, Any]) -> None:
        """The name is taken by a Service our cache has not seen yet: read it into the cache, so the
        next round sees it (and reports ``ServiceNameConflict`` unless it turns out to be ours)."""
        namespace, name = key_of(service)
        log.info("Service %s/%s appeared before ours; deciding again", namespace, name)
        self.writer.remember(SERVICES, await self.writer.kube.get(SERVICES.path(namespace, name)))


class _Applied(enum.Enum):
    """What applying a plan's Service action did, for the rest of the round."""

    CREATED = "created"  # the status waits a moment for the load balancer's answer
    AGAIN = "again"  # the API's answer changes the decision: decide again now


class ClaimReconciler:
    def __init__(self, world: World, writer: Writer) -> None:
        self.world, self.writer = world, writer

    async def reconcile(self, key: Key) -> Result:
        return await until_settled(lambda: self._round(key), MAX_ROUNDS_PER_PASS)

    async def _round(self, key: Key) -> bool:
        """Decide and apply once; True when a mint or a release asks to decide again."""
        claim = self.world.claims.get(key)
        if claim is None:
            return False
        _read(self.world.held_allocation(claim))
        claim = await self._clear_stale_user(claim)
        if claim["metadata"].get("deletionTimestamp"):
            if FINALIZER not in _finalizers(claim):
                return False
            held = self.world.held_allocation(claim)
            final = claims.finalize_claim(claim, key_of(held)[1] if held else None)
            updated = await self.writer.patch_status(
                CLAIMS, claim, final.status_patch(claim.get("status"), _now())
            )
            if final.release_allocation and held is not None:
                await allocator.release(self.writer, held)
                return True  # the finalizer comes off in the round that sees the address free
            if final.remove_finalizer:
                await self.writer.remove_finalizer(CLAIMS, updated or claim, FINALIZER)
            return False
        claim = await self.writer.ensure_metadata(CLAIMS, claim, finalizer=FINALIZER)
        held_address = self.world.held_address(claim)
        class_name = str((claim.get("spec") or {}).get("className"))
        plan = claims.reconcile_claim(
            claim,
            self.world.address_class(class_name),
            held_address,
            self.world.taken_addresses() if held_address is None else frozenset(),
            self.world.namespace_labels(key[0]),
        )
        if plan.mint is not None:
            await allocator.mint(self.writer, plan.mint.allocation)
            return True
        await self.writer.patch_status(CLAIMS, claim, plan.status_patch(claim.get("status"), _now()))
        for surplus in self.world.surplus_allocations(claim):
            log.info("releasing %s: a second allocation of claim %s/%s", key_of(surplus)[1], *key)
            await allocator.release(self.writer, surplus)
        return False

    async def _clear_stale_user(self, claim: Obj) -> Obj:
        """A claim whose recorded user is gone (deleted without its finalizer running) is freed,
        once the API, not only the cache, confirms that attachment is gone."""
        user = (claim.get("status") or {}).get("attachment") or {}
        uid, namespace = user.get("uid"), key_of(claim)[0]
        if not uid or self.world.attachment_with_uid(namespace, str(uid)) is not None:
            return claim
        current = await self.writer.kube.get(ATTACHMENTS.path(namespace, str(user.get("name") or "")))
        if current is not None and current["metadata"]["uid"] == uid:
            return claim
        log.info("claim %s/%s: user %s is gone; freeing the claim", *key_of(claim), user)
        freed = await allocator.unbind_claim(self.writer, claim, str(uid))
        return freed or claim


class ClassReconciler:
    def __init__(self, world: World, writer: Writer) -> None:
        self.world, self.writer = world, writer

    async def reconcile(self, key: Key) -> Result:
        address_class = self.world.classes.get(key)
        if address_class is None:
            return Result()
        # An IPv6 /64 holds more than the int64 status field: its capacity is reported saturated.
        fields, conditions = repair.class_status(
            address_class, self.world.allocations_of_class(key[1]), INT64_MAX
        )
        generation = int((address_class.get("metadata") or {}).get("generation") or 0)
        ops = status_patch(address_class.get("status"), fields, conditions, generation, _now())
        await self.writer.patch_status(CLASSES, address_class, ops)
        return Result()


# --- repair ----------------------------------------------------------------------------------------


class Repairer:
    """Deletes orphaned allocations, every ``interval``, on the leader only."""

    def __init__(
        self,
        world: World,
        writer: Writer,
        interval: float,
        grace: float,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.world, self.writer = world, writer
        self.interval, self.grace, self.clock = interval, timedelta(seconds=grace), clock

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)  # the repair period, not a wait for an effect
            try:
                await self.once()
            except Exception:
                log.exception("repair pass failed; the next one retries")

    async def once(self) -> int:
        removed = 0
        allocations = list(self.world.allocations.values())  # before the holders: see repair.orphans
        holders = self.world.live_holders()
        for orphan in repair.orphans(allocations, holders, self.clock(), self.grace):
            allocation = self.world.allocations.get(("", orphan.name))
            if allocation is None or (allocation.get("metadata") or {}).get("uid") != orphan.uid:
                continue
            if not await allocator.holder_is_gone(self.writer, allocation):
                continue
            log.info("releasing orphaned allocation %s: %s", orphan.name, orphan.reason)
            await allocator.release(self.writer, allocation)
            removed += 1
        return removed


# --- the operator, declared ------------------------------------------------------------------------


def build(manager: Manager, registry: CollectorRegistry, settings: Settings) -> None:
    """The three controllers (each wiring declares the caches of what it touches), the repair loop,
    the metrics."""
    workers = max(1, settings.workers)
    attachment_wiring = dataclasses.replace(ATTACHMENT_CONTROLLER, workers=workers)
    claim_wiring = dataclasses.replace(CLAIM_CONTROLLER, workers=workers)
    for declared in (attachment_wiring, claim_wiring, CLASS_CONTROLLER):
        manager.declare_caches(declared)  # the World below reads the stores
    world = World(manager)
    writer = manager.writer
    attachments = AttachmentReconciler(
        world,
        writer,
        announce_timeout=settings.announce_timeout_seconds,
        quota_retry=settings.quota_retry_seconds,
    )
    manager.add(attachment_wiring, attachments)
    manager.add(claim_wiring, ClaimReconciler(world, writer))
    manager.add(CLASS_CONTROLLER, ClassReconciler(world, writer))
    repairer = Repairer(world, writer, settings.repair_interval_seconds, settings.repair_grace_seconds)
    manager.add_leader_runnable(repairer.run)
    # Reads that must not trust a cache: who holds an address after a 409 on a mint, and whether a
    # holder (attachment or claim) is really gone before its allocation or claim use is released.
    manager.uses(ALLOCATIONS, "get")
    manager.uses(ATTACHMENTS, "get")
    manager.uses(CLAIMS, "get")
    # Who took a rendered Service's name, when a create finds it taken (409) before the cache does.
    manager.uses(SERVICES, "get")
    # The repair loop's deletes of orphaned allocations (the wirings declare the controllers' own).
    manager.uses(ALLOCATIONS, "delete")
    registry.register(on_loop(WorldCollector(world)))
