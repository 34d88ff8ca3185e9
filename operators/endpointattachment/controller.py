"""The EndpointAttachment operator on the controller runtime: its caches and its controller, declared.

Decides: the glue, and only the glue.

* **what wakes a pass**: one wiring block. Each watched kind maps a change to the attachments it
  concerns through a named map function of one version (the runtime maps both), behind predicates
  where only part of a change matters: a claim wakes the attachments referencing it and the one
  that minted it (``owns``), only when what a pass reads of it changed (``claim_reading_changed``:
  not the substrate's stamp or finalizer); an IPAddress wakes the attachments of its claim only when
  its ``associatedTo`` came, went or moved, and never the attachment whose Service it names; a class
  wakes those of its claims; a Service wakes the attachments whose endpoint it is and those whose
  claim it names (a rival user of the claim), and our rendered one its attachment (``owns``), unless
  only the driver's pin (the address annotation and its marker) or a write's bookkeeping changed
  (``service_reading_changed``); the substrate's CRDs becoming
  served (or not) wake every attachment; Pods, EndpointSlices and proxied Services wake only the
  VM-mode attachments, and v1 Endpoints only the attachment whose rendered Service they are of; a
  HelmRelease wakes the attachments naming its application. The runtime drops the echo of our own
  writes by resourceVersion and never wakes the pass that wrote.
* **a pass**: builds ``Observed`` from the caches (``world``), asks the pure ``reconcile`` for a plan,
  and applies it: the attachment's metadata (our finalizer, the owner reference to the application and
  its lineage labels) in one patch, a minted claim (then ``Result(again=True)``: the runtime decides
  again once the write's answer is in the cache), surplus claims and Services of ours deleted, the
  Service created, patched or deleted, the one ``PROGRAMMED_ANNOTATION`` touch, and the status. The
  pass that mints the claim, creates the Service or puts back its withdrawn backends
  (``Plan.restoring``) holds the status back (``STATUS_HOLD_SECONDS``) while it only waits for the
  substrate's, the load balancer's or the endpoints controllers' answer: the answer usually comes
  first and the pass it wakes writes the status once, Provisioned. A pass never decides while a
  substrate CRD is established but its informer has not listed yet (it looks again in
  ``CATCH_UP_SECONDS``).
* the API's refusal of the Service or of a minted claim (400, 403, 422) is remembered per attachment
  (``reconcile.ServiceRefusal``, in a runtime ``Memory`` dropped with the attachment) and handed to
  the next decision, which reports it and does not send the same request again; no traceback, no
  backoff loop. What is remembered is lost on a restart: the first pass then sends the request once
  more.
* **deletion**: our finalizer holds the attachment until its Services are gone (one without a
  finalizer is gone when its DELETE is answered, and the same pass releases ours); each deletion of a
  proxied Service of ours (or a change of it) gets the other proxied Services that selected its pods
  (``World.survivors_of``) ``REPROGRAM_ANNOTATION``, so cozy-proxy, whose deletes are keyed on the
  pod, programs them again. The minted claim is left to garbage collection (owner reference).

Does not: decide any condition, name or Service field (the pure modules do), adopt or delete a
Service or claim without our controller reference, write a referenced claim, write labels or
annotations to objects it does not own (but for ``REPROGRAM_ANNOTATION``, our own key, on a
proxied survivor), or write anything but through the runtime's ``Writer`` (leader gate,
write-through).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from prometheus_client import CollectorRegistry

from operators.endpointattachment.api import (
    ADDRESSES,
    ATTACHMENTS,
    CLAIM_ANNOTATION,
    CLAIMS,
    CLASSES,
    ENDPOINTSLICE_SERVICE_NAME_LABEL,
    METALLB_IPS_ANNOTATION,
    PINNED_ANNOTATION,
    PROGRAMMED_ANNOTATION,
    REPROGRAM_ANNOTATION,
    SERVICE_PROXY_NAME_LABEL,
)
from operators.endpointattachment.datapath import (
    ProxiedService,
    programmed_backends,
    ready_backends,
    reprogram_token,
)
from operators.endpointattachment.events import EventNote, minted, rendered, transitions, withdrawn
from operators.endpointattachment.metrics import WorldCollector
from operators.endpointattachment.reconcile import (
    HANDOVER_HOLD_MIN_PROVISIONING,
    Observed,
    PassContext,
    Plan,
    ServiceAction,
    ServiceRefusal,
    address_reading,
    claim_reading,
    provisioning_class,
    reconcile,
    refusal_of,
)
from operators.endpointattachment.settings import Settings
from operators.endpointattachment.world import (
    BY_APPLICATION,
    BY_CLASS,
    BY_ENDPOINT,
    BY_NAMESPACE,
    CACHES,
    HELD_BACK,
    SUBSTRATE,
    World,
    claim_class_name,
    controller_attachment_uid,
    labels,
)
from shared.conditions import rfc3339
from shared.events import Recorder
from shared.kube import ApiError
from shared.lineage import application_of
from shared.ownership import sole_controller
from shared.resources import ENDPOINT_SLICES, ENDPOINTS, EVENTS_V1, HELMRELEASES, PODS, SERVICES
from shared.runtime.cache import Key, Obj, key_of
from shared.runtime.controller import (
    Memory,
    Owns,
    Result,
    Watch,
    Wiring,
    Write,
    generation_changed,
    labels_changed,
)
from shared.runtime.manager import Manager
from shared.runtime.served import CRDS, crd_name, established
from shared.runtime.writes import Finalizer, Writer, blocks_deletion_of, sets_owner_references
from shared.telemetry.metrics import on_loop
from shared.telemetry.tracing import current_pass

log = logging.getLogger("endpointattachment")

# Our finalizer holds an attachment until its Services are gone.
FINALIZER: Final = "endpointattachment.local.sdn.cozystack.io/finalizer"
HOLD: Final = Finalizer(FINALIZER, ATTACHMENTS)

# A pass that has just minted the claim or created the rendered Service writes no status: the
# substrate's binding and the load balancer's answer usually come first, and the pass they wake
# writes the status once (Provisioned). When they do not come within this hold, a re-check writes
# ClaimPending or WaitingForAddress. One status write, not three.
STATUS_HOLD_SECONDS: Final = 1.0
# The shortest timed re-check a pass asks for (a deadline just past is not a busy loop).
MIN_RECHECK_SECONDS: Final = 0.05
# A substrate CRD just became established and its informer is listing: look again this soon.
CATCH_UP_SECONDS: Final = 0.2
# The names of the substrate's CRDs (a change of one wakes every attachment).
SUBSTRATE_CRDS: Final = frozenset(crd_name(resource) for resource in SUBSTRATE)
# Our Events' reportingController (the reportingInstance is the Pod's name).
REPORTING_CONTROLLER: Final = "cozystack.io/endpointattachment-operator"


def _now() -> str:
    return rfc3339(datetime.now(UTC))


# --- map functions: one version of one object -> the keys it concerns -----------------------------


def attachments_of_claim(world: World, claim: Obj) -> set[Key]:
    """The attachments referencing the claim (the one that minted it is woken through ``owns``)."""
    return world.attachments_using(key_of(claim))


def attachments_of_address(world: World, address: Obj) -> set[Key]:
    """The attachments of the claim the address names whose ``ClaimInUse`` its association can
    decide: none while it is associated with no Service (``reconcile.address_reading``), and never
    the attachment controlling the Service it is associated with (its own Service is no rival; when
    that Service is not cached, every user of the claim)."""
    reading = address_reading(address)
    if reading is None or not reading[1]:
        return set()
    claim_namespace, claim_name, namespace, name = reading
    keys = world.attachments_using((claim_namespace, claim_name))
    service = world.services.get((namespace, name))
    owner = world.attachment_controlling(service) if service is not None else None
    if owner is not None:
        keys.discard(owner)
    return keys


def attachments_held_for_class(world: World, claim: Obj) -> set[Key]:
    """Once the burst of claims of the claim's class being provisioned has passed: the attachments whose
    Service the hand-over hold keeps back (waiting for an address with no Service named, their claim
    a Bound one of that class), so that they render now instead of when their hold runs out."""
    class_name = claim_class_name(claim)
    if class_name is None or len(world.provisioning(class_name)) >= HANDOVER_HOLD_MIN_PROVISIONING:
        return set()
    held: set[Key] = set()
    for key in world.attachments.index_keys(HELD_BACK, True):
        attachment = world.attachments.get(key)
        if attachment is None or world.services_of(attachment):
            continue
        mine = world.claim_for(attachment)[0]
        if mine is not None and provisioning_class(mine) is None and claim_class_name(mine) == class_name:
            held.add(key)
    return held


def provisioning_ended(old: Obj | None, new: Obj | None) -> bool:
    """A claim stopped being provisioned (Bound, Lost, deleted): its class's held Services may go."""
    return (
        old is not None
        and provisioning_class(old) is not None
        and (new is None or provisioning_class(new) is None)
    )


def claim_reading_changed(old: Obj | None, new: Obj | None) -> bool:
    """A claim added or deleted, or changed in what a pass reads of it: ``reconcile.claim_reading``
    and who controls it (``World.claims_of``, ``World.attachments_using``). Not the substrate's
    stamp or finalizer, nor a condition's timestamps, nor our own traceparent."""
    return old is None or new is None or _claim_reading(old) != _claim_reading(new)


def _claim_reading(claim: Obj) -> tuple[Any, ...]:
    owner = sole_controller(claim) or {}
    return claim_reading(claim), controller_attachment_uid(claim), owner.get("name")


def address_reading_changed(old: Obj | None, new: Obj | None) -> bool:
    """An IPAddress's association with a Service (under its claim) came, went or moved: all a pass
    reads of an address (``reconcile.address_reading``); its creation, its binding and its phase
    alone decide nothing (the claim's status says Bound)."""
    return address_reading(old) != address_reading(new)


# What no pass reads of a Service: the driver's pin and its marker (the address MetalLB is to
# assign; what it did assign, the ingress, is read) and the bookkeeping every write changes.
_UNREAD_SERVICE_METADATA: Final = ("resourceVersion", "managedFields", "generation")
_UNREAD_SERVICE_ANNOTATIONS: Final = frozenset({METALLB_IPS_ANNOTATION, PINNED_ANNOTATION})


def service_reading_changed(old: Obj | None, new: Obj | None) -> bool:
    """A Service added or deleted, or changed beyond the substrate driver's pin
    (``METALLB_IPS_ANNOTATION`` and ``PINNED_ANNOTATION``, added by one Update) and the bookkeeping
    of a write: the driver pins our Service once after we create it, and that pass would decide
    exactly as the one before."""
    return old is None or new is None or _service_reading(old) != _service_reading(new)


def _service_reading(service: Obj) -> Obj:
    metadata = {k: v for k, v in (service.get("metadata") or {}).items() if k not in _UNREAD_SERVICE_METADATA}
    annotations = metadata.get("annotations") or {}
    if unread := _UNREAD_SERVICE_ANNOTATIONS.intersection(annotations):
        metadata["annotations"] = {k: v for k, v in annotations.items() if k not in unread}
    return {**service, "metadata": metadata}


def attachments_of_class(world: World, ip_class: Obj) -> set[Key]:
    """The attachments whose claim is of the class (its loadBalancerClass is rendered)."""
    keys: set[Key] = set()
    for claim in world.claims.index(BY_CLASS, key_of(ip_class)[1]):
        keys |= world.attachments_using(key_of(claim))
    return keys


def is_substrate_crd(old: Obj | None, new: Obj | None) -> bool:
    """A substrate CRD added, deleted, or established / no longer established."""
    crd = new if new is not None else old
    name = str(((crd or {}).get("metadata") or {}).get("name") or "")
    if name not in SUBSTRATE_CRDS:
        return False
    return old is None or new is None or established(old) != established(new)


def every_attachment(world: World, crd: Obj) -> set[Key]:
    """Every attachment (the substrate arriving or going concerns them all; a rare event)."""
    return set(world.attachments.keys())


def attachments_of_service(world: World, service: Obj) -> set[Key]:
    """The attachments whose endpoint the Service is, and, when it names a claim and is not that
    attachment's own, those using the claim (a rival user: ClaimInUse). The attachment controlling a
    rendered Service is woken through ``owns``; every VM-mode attachment, by
    ``attachments_in_vm_mode`` behind ``proxy_reading_changed``."""
    namespace, name = key_of(service)
    keys = set(world.attachments.index_keys(BY_ENDPOINT, (namespace, name)))
    claim = ((service.get("metadata") or {}).get("annotations") or {}).get(CLAIM_ANNOTATION)
    if claim:
        keys |= world.attachments_using((namespace, str(claim)))
    return keys


def attachments_in_vm_mode(world: World, obj: Obj) -> frozenset[Key]:
    """Every attachment with a VM method (a proxied Service's exclusivity reading concerns them all)."""
    return world.in_vm_mode()


def proxy_reading_changed(old: Obj | None, new: Obj | None) -> bool:
    """The Service joined or left a proxy, or its proxy, controller or selector changed: what the
    exclusivity check reads of it (its backends come with its slices)."""
    return _as_proxied(old) != _as_proxied(new)


def _as_proxied(service: Obj | None) -> tuple[str, Any, Any, Any, Any] | None:
    proxy = labels(service).get(SERVICE_PROXY_NAME_LABEL) if service is not None else None
    if proxy is None or service is None:
        return None
    owner = sole_controller(service) or {}
    selector = sorted(((service.get("spec") or {}).get("selector") or {}).items())
    return proxy, owner.get("kind"), owner.get("name"), owner.get("uid"), selector


def slice_reading_changed(old: Obj | None, new: Obj | None) -> bool:
    """A slice added or deleted, or its Service or ready backends changed (what a pass reads)."""
    return old is None or new is None or _slice_reading(old) != _slice_reading(new)


def _slice_reading(endpoint_slice: Obj) -> tuple[str | None, frozenset[str]]:
    return labels(endpoint_slice).get(ENDPOINTSLICE_SERVICE_NAME_LABEL), ready_backends((endpoint_slice,))


def attachments_of_slice(world: World, endpoint_slice: Obj) -> set[Key]:
    """VM-mode attachments only (no other mode reads a slice): those whose endpoint the slice
    serves, and all of them when the slice is of a proxied Service (its backends decide exclusivity)."""
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


def attachment_of_rendered_endpoints(world: World, endpoints: Obj) -> set[Key]:
    """The VM-mode attachment whose rendered Service these v1 Endpoints are of (named alike): what
    cozy-proxy reads decides its Provisioned and the one touch of ``PROGRAMMED_ANNOTATION``."""
    service = world.services.get(key_of(endpoints))
    owner = world.attachment_controlling(service) if service is not None else None
    return {owner} if owner is not None and owner in world.in_vm_mode() else set()


def attachments_of_pod(world: World, pod: Obj) -> frozenset[Key]:
    """The VM-mode attachments of the pod's namespace, when a pod appears, goes or changes labels:
    which Services select it decides exclusivity, before the pod has an endpoint."""
    return world.attachments.index_keys(BY_NAMESPACE, key_of(pod)[0]) & world.in_vm_mode()


def attachments_of_helmrelease(world: World, release: Obj) -> frozenset[Key]:
    """The attachments whose applicationRef names the release's application (by its lineage labels)."""
    app = application_of(release)
    if app is None:
        return frozenset()
    index = (key_of(release)[0], app.group, app.kind, app.name)
    return world.attachments.index_keys(BY_APPLICATION, index)


# --- the controller --------------------------------------------------------------------------------

ATTACHMENT_CONTROLLER: Final = Wiring(
    name="endpointattachment",
    primary=ATTACHMENTS,
    # The rendered Service and the minted claim: their controller reference names the attachment.
    owns=(Owns(SERVICES, (service_reading_changed,)), Owns(CLAIMS, (claim_reading_changed,))),
    watches=(
        Watch(CLAIMS, attachments_of_claim, (claim_reading_changed,)),
        Watch(CLAIMS, attachments_held_for_class, (provisioning_ended,)),
        Watch(ADDRESSES, attachments_of_address, (address_reading_changed,)),
        Watch(CLASSES, attachments_of_class, (generation_changed,)),
        Watch(CRDS, every_attachment, (is_substrate_crd,)),
        Watch(SERVICES, attachments_of_service, (service_reading_changed,)),
        Watch(SERVICES, attachments_in_vm_mode, (proxy_reading_changed,)),
        Watch(ENDPOINT_SLICES, attachments_of_slice, (slice_reading_changed,)),
        Watch(ENDPOINTS, attachment_of_rendered_endpoints, (programmed_reading_changed,)),
        Watch(PODS, attachments_of_pod, (labels_changed,)),
        Watch(HELMRELEASES, attachments_of_helmrelease, (labels_changed,)),
    ),
    writes=(
        HOLD.writes,  # our finalizer, with the owner reference and lineage labels
        Write(ATTACHMENTS, ("patch",)),  # the owner reference and lineage labels
        sets_owner_references(ATTACHMENTS),  # that owner reference, where admission enforces it
        blocks_deletion_of(ATTACHMENTS),  # the Service's and the claim's blockOwnerDeletion reference
        Write(ATTACHMENTS, ("patch",), "status"),
        Write(SERVICES, ("create", "patch", "delete")),
        Write(CLAIMS, ("create", "delete")),  # a mint; a surplus mint (a lost create answer)
        Write(EVENTS_V1, ("create", "patch")),  # Events of transitions; a repeat patches its series
    ),
    caches=CACHES,
    model=World,  # the read model every map function is given, built once
    workers=Settings.workers,  # the default: ``build`` applies --workers
)


def _read(*objects: Mapping[str, Any] | None) -> None:
    """Link the current pass to the passes that wrote what it reads."""
    report = current_pass()
    if report is not None:
        report.read(*objects)


class _Applied(enum.Enum):
    """What applying a plan's Service action did, for the rest of the round."""

    CREATED = "created"  # the status waits a moment for the load balancer's answer
    AGAIN = "again"  # the API's answer changes the decision: decide again now


@dataclasses.dataclass
class Remembered:
    """What the glue keeps of one attachment between passes (the runtime's ``Memory``, dropped with
    the attachment): until when its status is held back, the API's last refusal of its Service or
    claim, and when a pass last changed its Service."""

    holding_until: float | None = None
    refusal: ServiceRefusal | None = None
    written_at: datetime | None = None


# The namespace's proxied Services as a pass read them (None: not read; a change of ours reads them).
Rivals = Sequence[ProxiedService] | None

# A decision's answer to the runtime: nothing more, or a look again this much later.
SETTLED: Final = Result()
AGAIN: Final = Result(again=True)


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
        handover_hold: float = Settings.handover_hold_seconds,
        recorder: Recorder | None = None,
        memory: Memory[Remembered] | None = None,
    ) -> None:
        self.world, self.writer, self.clock, self.wall_clock = world, writer, clock, wall_clock
        self.recorder = recorder  # None: no Events
        self.announce_timeout, self.quota_retry, self.handover_hold = (
            announce_timeout,
            quota_retry,
            handover_hold,
        )
        self.memory: Memory[Remembered] = memory if memory is not None else Memory()

    def _remembered(self, key: Key) -> Remembered:
        remembered = self.memory.get(key)
        if remembered is None:
            remembered = Remembered()
            self.memory.set(key, remembered)
        return remembered

    def forget(self, key: Key) -> None:
        """The attachment is gone (the runtime calls this when its deletion is delivered)."""
        self.memory.forget(key)
        if self.recorder is not None:
            self.recorder.forget(*key)

    async def _record(self, key: Key, *notes: EventNote) -> None:
        """Record Events about the attachment (best effort: the recorder logs what it cannot post)."""
        attachment = self.world.attachments.get(key)
        if self.recorder is None or attachment is None:
            return
        for note in notes:
            await self.recorder.record(
                attachment, type_=note.type, reason=note.reason, action=note.action, note=note.note
            )

    async def reconcile(self, key: Key) -> Result:
        """One decision, applied: SETTLED, AGAIN (a mint, a refusal: the runtime decides again at
        once) or a look again later (the status held back, a deadline, the substrate catching up)."""
        attachment = self.world.attachments.get(key)
        if attachment is None:
            return SETTLED
        if self.world.substrate_catching_up():
            return Result(requeue_after=CATCH_UP_SECONDS)
        observed, plan = self._decide(key, attachment)
        # The namespace's proxied Services as this pass read them: whom a change of ours concerns.
        rivals = observed.rivals if observed.spec is not None and observed.spec.vm_mode else None
        if plan.finalizing:
            self.memory.forget(key)
            return AGAIN if await self._finalize(attachment, plan, rivals) else SETTLED
        attachment = await HOLD.hold(
            self.writer, attachment, owner_reference=plan.owner_reference, labels=plan.labels
        )
        if (minted_or_refused := await self._apply_claims(key, plan, rivals)) is not None:
            return minted_or_refused
        now = self.clock()
        applied = await self._apply_service(key, plan, rivals)
        if applied is _Applied.AGAIN:
            return AGAIN  # refused: the next decision reports it
        if applied is _Applied.CREATED or plan.restoring:
            # A new Service, or withdrawn backends put back: the answer (the load balancer's, the
            # Endpoints') usually comes first, and the pass it wakes writes the status once.
            self._remembered(key).holding_until = now + STATUS_HOLD_SECONDS
        if plan.programmed is not None and plan.service is not None:
            await self._touch_programmed(plan.service, plan.programmed)
        held = self._held_for(key, plan, now)
        if held is None:
            await self._write_status(key, attachment, plan)
        waits = [w for w in (held, plan.recheck_after) if w is not None]
        return Result(requeue_after=max(min(waits), MIN_RECHECK_SECONDS)) if waits else SETTLED

    def _decide(self, key: Key, attachment: Obj) -> tuple[Observed, Plan]:
        """The pure decision over what the caches hold and what the glue remembers."""
        observed = self.world.observed(attachment)
        _read(observed.claim, *observed.services)
        remembered = self.memory.get(key) or Remembered()
        context = PassContext(
            now=self.wall_clock(),
            written_at=remembered.written_at,
            refusal=remembered.refusal,
            announce_timeout_seconds=self.announce_timeout,
            quota_retry_seconds=self.quota_retry,
            handover_hold_seconds=self.handover_hold,
        )
        return observed, reconcile(observed, context)

    async def _apply_claims(self, key: Key, plan: Plan, rivals: Rivals) -> Result | None:
        """Surplus claims and Services of ours deleted, then the mint: AGAIN once it is answered
        (or refused: the next decision reports it); None when there is no mint."""
        for surplus in plan.delete_claims:
            log.info("%s/%s: deleting claim %s, a second mint", *key, key_of(surplus)[1])
            await self.writer.delete(CLAIMS, surplus)
        for surplus in plan.surplus_services:
            log.info("%s/%s: deleting Service %s, a second render", *key, key_of(surplus)[1])
            await self._delete_service(surplus, rivals)
        if plan.mint is None:
            return None
        try:
            claim = await self.writer.create(CLAIMS, plan.mint)
        except ApiError as error:
            self._refused(key, ServiceAction.MINT, plan.mint, error)
            return AGAIN
        self._remembered(key).refusal = None
        await self._record(key, minted(claim))
        self._remembered(key).holding_until = self.clock() + STATUS_HOLD_SECONDS
        return AGAIN

    async def _write_status(self, key: Key, attachment: Obj, plan: Plan) -> None:
        stored = attachment.get("status")
        written = await self.writer.patch_status(ATTACHMENTS, attachment, plan.status_patch(stored, _now()))
        if written is not None:  # a status written (not an unchanged one): its transition's Event
            await self._record(key, *transitions(stored, plan.provisioned))

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
        remembered = self.memory.get(key)
        if remembered is None or remembered.holding_until is None:
            return None
        remaining = remembered.holding_until - now
        if remaining > 0 and plan.waits_for_answer:
            return remaining
        remembered.holding_until = None
        return None

    async def _finalize(self, attachment: Obj, plan: Plan, rivals: Rivals) -> bool:
        """Our Services first; once they are gone, our finalizer. True: every Service this deleted is
        gone already (it held no finalizer), so decide again now and release in the same pass; else
        their deletion wakes the pass through ``owns``. The minted claim goes with the attachment, by
        garbage collection."""
        if not HOLD.releasing(attachment):
            return False
        deleted = [s for s in (plan.service, *plan.surplus_services) if s is not None]
        gone = [await self._delete_service(service, rivals) for service in deleted]
        if deleted:
            return all(gone)
        if not plan.waits_for_service:
            await HOLD.release(self.writer, attachment)
        return False

    async def _delete_service(self, service: Mapping[str, Any], rivals: Rivals = None) -> bool:
        """Delete a Service of ours (the UID precondition: only the very Service we judged ours), then
        have cozy-proxy program its survivors again. True when it is gone at once: it held no
        finalizer, so the API removed it on the spot and the cache forgets it now (its DELETED event
        then wakes no one)."""
        survivors = self.world.survivors_of(service, rivals)
        gone = not (service.get("metadata") or {}).get("finalizers")
        await self.writer.delete(SERVICES, service, forget=gone)
        await self._reprogram(survivors, service, service)
        return gone

    async def _apply_service(self, key: Key, plan: Plan, rivals: Rivals) -> _Applied | None:
        """Apply the plan's Service action: CREATED, AGAIN (refused: decide again with what the API
        said), or None."""
        action, service = plan.service_action, plan.service
        if service is None:
            return None
        if action is ServiceAction.CREATE:
            try:
                created = await self.writer.create(SERVICES, service)
            except ApiError as error:
                return self._refused(key, action, service, error)
            self._remembered(key).refusal = None
            await self._record(key, rendered(created, self.world.attachments.get(key) or {}))
            return _Applied.CREATED
        if action is ServiceAction.PATCH and plan.service_patch is not None:
            survivors = self.world.survivors_of(service, rivals)
            try:
                updated = await self.writer.patch(SERVICES, service, plan.service_patch, "merge")
            except ApiError as error:
                return self._refused(key, action, plan.service_patch, error)
            await self._reprogram(survivors, service, updated)
            remembered = self._remembered(key)
            remembered.refusal, remembered.written_at = None, self.wall_clock()
        elif action is ServiceAction.DELETE:
            await self._delete_service(service, rivals)
            await self._record(key, withdrawn(service, plan.provisioned))
        return None

    def _refused(self, key: Key, action: ServiceAction, body: Mapping[str, Any], error: ApiError) -> _Applied:
        """Remember a refusal for the next decision; an error that is not one is raised (retried)."""
        refusal = refusal_of(action, body, error.status, error.message, self.wall_clock())
        if refusal is None:
            raise error
        log.info("%s/%s: the API refused the rendered Service: %s", *key, error)
        self._remembered(key).refusal = refusal
        return _Applied.AGAIN

    async def _reprogram(
        self, survivors: list[Obj], before: Mapping[str, Any], after: Mapping[str, Any] | None
    ) -> None:
        """cozy-proxy keys its entries on the pod, and its delete (or re-programming) of our Service
        cleared the entries of pods the survivors hold: an update of a Service makes cozy-proxy program
        it again, so each survivor gets our annotation naming the change (``before`` as it was, at
        ``after``'s resourceVersion; once: a repeated pass finds it written)."""
        changed = self.world.as_proxied(before)
        if changed is None or not survivors:
            return
        version = str(((after or before).get("metadata") or {}).get("resourceVersion") or "")
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


# --- the operator, declared ------------------------------------------------------------------------


def build(manager: Manager, registry: CollectorRegistry, settings: Settings) -> None:
    """The controller (its wiring declares the caches of what it touches) and the metrics."""
    wiring = dataclasses.replace(ATTACHMENT_CONTROLLER, workers=max(1, settings.workers))
    manager.declare_caches(wiring)  # the World below reads the stores
    world = World(manager, settings.render)
    attachments = AttachmentReconciler(
        world,
        manager.writer,
        announce_timeout=settings.announce_timeout_seconds,
        quota_retry=settings.quota_retry_seconds,
        handover_hold=settings.handover_hold_seconds,
        recorder=Recorder(manager.writer, REPORTING_CONTROLLER),
    )
    manager.add(wiring, attachments, forget=(attachments.forget,))
    registry.register(on_loop(WorldCollector(world)))


__all__ = ["ATTACHMENT_CONTROLLER", "FINALIZER", "build", "controller_attachment_uid"]
