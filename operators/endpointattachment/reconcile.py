"""One attachment, everything observed about it -> a plan: the status to store and the actions to take.
The decision runs in named stages (``stages``: resolve, publish, datapath, claim, service,
provisioned), the first exit ending it; its vocabulary and readings are ``plan``'s.

Decides, on every pass:
- ``Resolved`` (``endpoint.resolve``): the application incarnation, then the endpoint. On first
  resolution the plan stamps an owner reference to the HelmRelease on the attachment (not a
  controller: Flux's controller does not manage attachments; ``blockOwnerDeletion`` false, so
  deleting an application is never held up by its attachments) and the application's three
  lineage labels.
- what is published and, in the VM modes, whether the datapath admits it (below), before any claim
  is minted: an attachment that could never render never takes an address.
- the claim, only once ``Resolved`` is True (a typo or a leftover of a deleted application never
  mints, and never holds a reserved claim): a referenced claim (``claimName``) must exist and not be
  being deleted (``ClaimNotFound``) and be of the family asked for (``FamilyConflict``); it is never
  written. Otherwise the claim this attachment controls is used (the oldest, if a lost create
  answer left two: the others are deleted) or, with none, one is minted (``render.render_claim``)
  and the pass decides again. The substrate's kinds not served: ``ClaimPending`` saying so. A claim
  not ``Bound``: ``ClaimPending`` with its own words (its ``Bound`` condition's message).
- ``ClaimInUse``: one of the claim's addresses has ``status.associatedTo`` naming a live Service of
  the namespace that is not ours, or, while we have no Service, another live Service names the
  claim: the driver serves one Service per claim, so ours is not rendered (or is withdrawn).
- what is published: the endpoint's selector and ``render.publish_ports``; no selector, an
  ExternalName endpoint, or no port: ``NothingToPublish``.
- the VM modes (``datapath.admit``), before anything renders: the platform's declaration
  (``DatapathContractUnavailable``), PortList ports without translation (``RenderFailed``), one
  ready backend by the endpoint's EndpointSlices (``MultipleBackends``), exclusivity per selected
  pod (``BackendAlreadyDelegated`` naming the winner). ``MultipleBackends`` alone (every other rule
  admits the attachment with no backend counted) keeps a live Service of ours, its selector
  withdrawn (``datapath.withdrawn_selector``: it selects no pod, so its Endpoints empty and
  cozy-proxy programs nothing) and its pinned address held; one ready backend again is one patch of
  the selector (``Plan.restoring``), not a new Service to be pinned and assigned.
- the rendered Service (only with the claim ``Bound`` and its class observed: the claim's binding and
  the class arrive on separate watches, and a Service created before its class was read would keep
  the wrong ``loadBalancerClass`` for good, so a Bound claim whose class is not seen is
  ``ClaimPending`` until it is; a class gone after rendering leaves the live Service as it is):
  created when there is none of ours, patched on our fields, left alone with ``RenderFailed`` when
  an immutable field no longer matches the class or the claim ("recreate the attachment":
  recreating it here would drop the address);
  withdrawn (deleted) when it may not be rendered. Ours means a controller owner reference to this
  attachment's UID; a labelled Service without one is never looked at.
- the hand-over hold: a Service not yet created for a claim Bound less than
  ``handover_hold_seconds`` ago waits (``WaitingForAddress``, saying so) while a burst of other
  claims of its class (``HANDOVER_HOLD_MIN_PROVISIONING`` or more) is being provisioned. The driver
  hands a Bound address to its Service by deleting the placeholder that held it in MetalLB, and
  MetalLB gives a freed address to the first Service asking its pool for any (a claim being
  provisioned): the hand-over then fails and MetalLB backs off for tens of seconds. A burst of claims
  binds first and hands over after, the way that is fast; a trickle (one claim at a time) is not
  held, since it would always wait the whole hold.
- ``Provisioned``: the first failure above, else ``WaitingForAddress`` until the Service's
  ``status.loadBalancer.ingress`` holds every address of the claim, ``AddressNotAnnounced`` (ours)
  once that wait passes ``announce_timeout_seconds`` since the Service was written; in a VM mode
  also exactly one ready backend in the Service's **v1 Endpoints** (what cozy-proxy reads:
  ``NoReadyBackend``, ``MultipleBackends``), and the message names the pod. While ``Resolved`` is
  not True: ``EndpointDetached`` when the endpoint is gone after an address was held (the claim is
  Bound and this attachment rendered a Service or reported the claim; the Service is withdrawn, the
  claim kept: it reattaches with the same address), else ``Unresolved``
  (ours: Cozystack's list has no word for "nothing is provisioned before resolution").
- ``status``: ``phase`` (Attached when both conditions are True, Detached on
  ``EndpointDetached``, else Pending), ``serviceName`` (only while a Service of ours lives),
  ``claimName`` (the referenced claim, or the minted one once it exists), ``addresses`` (the
  claim's, IPv4 first, while it is Bound), ``observedGeneration``, conditions.
- what the API and time tell (``PassContext``): a Service write or a claim create the API refused
  (400, 403, 422: validation, a webhook or policy, a quota, a terminating namespace) is
  ``RenderFailed`` with the API's message, and the very same request is not sent again (anything
  it is rendered from changing makes another body); a quota refusal is tried again after
  ``quota_retry_seconds`` (a quota frees without an event we watch).
- deletion: a finalize plan that deletes our Services and waits until they are gone (cozy-proxy's
  survivors are re-programmed by the glue); the minted claim is left to garbage collection.

Does not: perform any of it, read the clock (``now`` is passed in), or list anything.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TypeAlias

from operators.endpointattachment.api import PHASE_ATTACHED, PHASE_PENDING
from operators.endpointattachment.plan import (
    ANNOUNCE_TIMEOUT_SECONDS,
    HANDOVER_HOLD_SECONDS,
    QUOTA_MESSAGE,
    QUOTA_RETRY_SECONDS,
    REFUSED_STATUSES,
    STALE_MAPPING_MESSAGE,
    Observed,
    PassContext,
    Plan,
    ServiceAction,
    ServiceRefusal,
    address_reading,
    bound_since,
    claim_addresses,
    claim_family,
    claim_reading,
    generation_of,
    ingress_addresses,
    is_deleting,
    meta_of,
    provisioning_class,
    refusal_of,
)
from operators.endpointattachment.reasons import CONDITION_PROVISIONED
from operators.endpointattachment.stages import (
    HANDOVER_HOLD_MIN_PROVISIONING,
    Basis,
    Dark,
    Rendered,
    Untouched,
    claim_stage,
    datapath_stage,
    provisioned_stage,
    publish_stage,
    resolve_stage,
    service_stage,
    unresolved_exit,
)
from shared.conditions import FALSE, TRUE, Condition

__all__ = [
    "ANNOUNCE_TIMEOUT_SECONDS",
    "HANDOVER_HOLD_MIN_PROVISIONING",
    "HANDOVER_HOLD_SECONDS",
    "QUOTA_MESSAGE",
    "QUOTA_RETRY_SECONDS",
    "REFUSED_STATUSES",
    "STALE_MAPPING_MESSAGE",
    "Observed",
    "PassContext",
    "Plan",
    "ServiceAction",
    "ServiceRefusal",
    "address_reading",
    "bound_since",
    "claim_addresses",
    "claim_family",
    "claim_reading",
    "finalize",
    "ingress_addresses",
    "provisioning_class",
    "reconcile",
    "refusal_of",
]

# What the stages decide: the first exit, or, when none exits, the rendering.
Outcome: TypeAlias = Dark | Untouched | Rendered


def reconcile(observed: Observed, context: PassContext | None = None) -> Plan:
    """The plan for one pass over one attachment (``context``: see ``PassContext``)."""
    if is_deleting(observed.attachment):
        return finalize(observed)
    basis = resolve_stage(observed)
    return _plan_of(basis, _decide(observed, basis, context))


def _decide(observed: Observed, basis: Basis, context: PassContext | None) -> Outcome:
    """The stages in order (resolve, publish, datapath, claim, service, provisioned); an exit ends
    the decision there."""
    if not basis.resolution.ok:
        return unresolved_exit(observed, basis)
    published = publish_stage(observed, basis.spec)
    if isinstance(published, Dark):
        return published
    datapath = datapath_stage(observed, basis, published)
    if isinstance(datapath, Dark):
        return datapath
    claimed = claim_stage(observed, basis, context)
    if isinstance(claimed, Dark):
        return claimed
    rendering = service_stage(observed, basis, datapath, claimed, context)
    if isinstance(rendering, Dark | Untouched):
        return rendering
    return provisioned_stage(observed, basis, datapath, rendering, context)


def _plan_of(basis: Basis, outcome: Outcome) -> Plan:
    """The plan an outcome makes; every plan carries ``Resolved``, the stamps and the surplus deletes."""
    if isinstance(outcome, Dark):
        return _dark_plan(basis, outcome)
    existing = basis.existing
    name = str(meta_of(existing).get("name")) if existing is not None else None
    status = {**basis.status, "serviceName": name}
    if isinstance(outcome, Untouched):
        provisioned = Condition(CONDITION_PROVISIONED, FALSE, outcome.reason, outcome.message)
        return replace(
            basis.common,
            conditions=(basis.resolved, provisioned),
            status={**status, "phase": PHASE_PENDING},
            recheck_after=outcome.recheck_after,
        )
    phase = PHASE_ATTACHED if outcome.provisioned.status == TRUE else PHASE_PENDING
    return replace(
        basis.common,
        conditions=(basis.resolved, outcome.provisioned),
        status={**status, "phase": phase},
        service_action=outcome.action,
        service=outcome.service,
        service_patch=outcome.patch,
        programmed=outcome.programmed,
        recheck_after=outcome.recheck_after,
        restoring=outcome.restoring,
    )


def _dark_plan(basis: Basis, dark: Dark) -> Plan:
    """Nothing rendered: our Service (if any) is withdrawn, the claim to mint (if any) created."""
    provisioned = Condition(CONDITION_PROVISIONED, FALSE, dark.reason, dark.message)
    return replace(
        basis.common,
        conditions=(basis.resolved, provisioned),
        status={**basis.status, "phase": dark.phase, "serviceName": None, **dark.status},
        service_action=ServiceAction.DELETE if basis.existing is not None else ServiceAction.NONE,
        service=basis.existing,
        mint=dark.mint,
        recheck_after=dark.recheck_after,
    )


def finalize(observed: Observed) -> Plan:
    """An attachment being deleted: our Services go first; the finalizer waits until they are gone."""
    generation = generation_of(observed.attachment)
    live = [s for s in observed.services if not is_deleting(s)]
    if live:
        return Plan(
            generation,
            service_action=ServiceAction.DELETE,
            service=live[0],
            surplus_services=tuple(live[1:]),
            finalizing=True,
            waits_for_service=True,
        )
    return Plan(generation, finalizing=True, waits_for_service=bool(observed.services))
