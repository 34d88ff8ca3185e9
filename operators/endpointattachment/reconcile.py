"""One attachment, everything observed about it -> a plan: the status to store and the actions to take.

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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from functools import partial
from typing import Any, Final

from operators.endpointattachment.api import (
    CLAIM_ANNOTATION,
    CLAIM_PHASE_BOUND,
    CLAIM_PHASE_LOST,
    DEFAULT_CLAIM_FAMILY,
    HELMRELEASE_GROUP,
    HELMRELEASE_KIND,
    PHASE_ATTACHED,
    PHASE_DETACHED,
    PHASE_PENDING,
    PROGRAMMED_ANNOTATION,
    SERVICE_TYPE_EXTERNAL_NAME,
    AttachmentSpec,
    spec_of,
)
from operators.endpointattachment.datapath import (
    ProxiedService,
    admit,
    is_withdrawn,
    programmed_backends,
    programmed_token,
    rank_of,
    ready_backends,
    selected_pods,
    slice_pods,
    withdrawn_selector,
)
from operators.endpointattachment.endpoint import Resolution, application_ref, resolve
from operators.endpointattachment.reasons import (
    CONDITION_PROVISIONED,
    CONDITION_RESOLVED,
    REASON_ADDRESS_NOT_ANNOUNCED,
    REASON_CLAIM_IN_USE,
    REASON_CLAIM_NOT_FOUND,
    REASON_CLAIM_PENDING,
    REASON_ENDPOINT_DETACHED,
    REASON_ENDPOINT_NOT_FOUND,
    REASON_FAMILY_CONFLICT,
    REASON_MULTIPLE_BACKENDS,
    REASON_NO_READY_BACKEND,
    REASON_NOTHING_TO_PUBLISH,
    REASON_PROVISIONED,
    REASON_RENDER_FAILED,
    REASON_UNRESOLVED,
    REASON_WAITING_FOR_ADDRESS,
)
from operators.endpointattachment.render import (
    RenderSettings,
    immutable_mismatch,
    no_port_message,
    publish_ports,
    render_claim,
    render_service,
    service_patch,
)
from shared.conditions import FALSE, TRUE, Condition, JsonPatch, rfc3339, status_patch
from shared.lineage import labels_of
from shared.ownership import owner_reference

# HTTP statuses of a refusal (not an error to retry): the request itself is wrong for this cluster.
REFUSED_STATUSES: Final = frozenset({400, 403, 422})
# How the API words a quota refusal (a 403): it frees without an event we watch, so it is retried.
QUOTA_MESSAGE: Final = "exceeded quota"
# OwnerReferencesPermissionEnforcement's answer while the API server's REST mapping does not know the
# owner's kind yet (a CRD installed moments ago): the server's state, not the request, so transient.
STALE_MAPPING_MESSAGE: Final = "cannot find RESTMapping"
# Defaults of the glue's settings (``--announce-timeout-seconds``, ``--quota-retry-seconds``).
ANNOUNCE_TIMEOUT_SECONDS: Final = 60.0
QUOTA_RETRY_SECONDS: Final = 60.0
# How long a freshly Bound claim's Service may wait for its class's other claims to be provisioned.
HANDOVER_HOLD_SECONDS: Final = 8.0
# ...while at least this many others are: a burst (a trickle hands over at once; see the docstring).
HANDOVER_HOLD_MIN_PROVISIONING: Final = 2


@dataclass(frozen=True)
class Observed:
    """Everything the glue observed about one attachment, from the caches.

    - ``helmrelease``: the HelmRelease of the namespace carrying applicationRef's lineage labels.
    - ``endpoint``: the Service ``spec.endpoint.serviceName`` of the namespace.
    - ``substrate``: whether the substrate's kinds are served (their CRDs established).
    - ``claim``: the referenced claim, or the oldest claim this attachment controls.
    - ``surplus_claims``: the other claims this attachment controls.
    - ``claim_class``: the IPAddressClass the claim resolved to (``status.className``).
    - ``addresses``: the IPAddress objects bound to the claim.
    - ``services``: the Services this attachment controls, oldest first.
    - ``claim_users``: the other live Services of the namespace naming the claim.
    - ``provisioning``: how many other claims of the claim's class the substrate is provisioning.
    - ``endpoint_slices``, ``rendered_endpoints``, ``rivals``, ``pods``: VM modes only (the
      endpoint's slices, our Service's v1 Endpoints, every other cozy-proxy Service or VM-mode
      attachment of the namespace with the pods it selects, the namespace's unfinished pods).
    """

    attachment: Mapping[str, Any]
    settings: RenderSettings = field(default_factory=RenderSettings)
    helmrelease: Mapping[str, Any] | None = None
    endpoint: Mapping[str, Any] | None = None
    substrate: bool = True
    claim: Mapping[str, Any] | None = None
    surplus_claims: Sequence[Mapping[str, Any]] = ()
    claim_class: Mapping[str, Any] | None = None
    addresses: Sequence[Mapping[str, Any]] = ()
    services: Sequence[Mapping[str, Any]] = ()
    claim_users: Sequence[Mapping[str, Any]] = ()
    provisioning: int = 0
    endpoint_slices: Sequence[Mapping[str, Any]] = ()
    rendered_endpoints: Mapping[str, Any] | None = None
    rivals: Sequence[ProxiedService] = ()
    pods: Sequence[Mapping[str, Any]] = ()


class ServiceAction(StrEnum):
    """What the glue does to the rendered Service this pass."""

    NONE = "None"
    MINT = "Mint"  # create the claim (``Plan.mint``): refused like a Service write, remembered alike
    CREATE = "Create"
    PATCH = "Patch"  # JSON merge patch ``Plan.service_patch``
    DELETE = "Delete"


@dataclass(frozen=True)
class ServiceRefusal:
    """The API's refusal of a write of the rendered Service: what was sent (``body``: the Service
    for a create, the merge patch for a patch), when, and the API's answer."""

    action: ServiceAction
    body: Mapping[str, Any]
    quota: bool
    message: str
    at: datetime


def refusal_of(
    action: ServiceAction, body: Mapping[str, Any], status: int, message: str, at: datetime
) -> ServiceRefusal | None:
    """The refusal an API answer is, or None when it is no business outcome (a conflict, a missing
    namespace, a throttled or failing server: transient, retried with backoff)."""
    if status not in REFUSED_STATUSES or STALE_MAPPING_MESSAGE in message:
        return None
    return ServiceRefusal(action, body, status == 403 and QUOTA_MESSAGE in message, message, at)


@dataclass(frozen=True)
class PassContext:
    """What the glue knows beyond the caches: the time, when it last wrote the rendered Service, the
    API's last refusal of it, and the three waits (seconds)."""

    now: datetime
    written_at: datetime | None = None
    refusal: ServiceRefusal | None = None
    announce_timeout_seconds: float = ANNOUNCE_TIMEOUT_SECONDS
    quota_retry_seconds: float = QUOTA_RETRY_SECONDS
    handover_hold_seconds: float = HANDOVER_HOLD_SECONDS


@dataclass(frozen=True)
class Plan:
    """What should be, for the glue to apply; an empty status patch and no actions: a quiet pass."""

    generation: int
    conditions: tuple[Condition, ...] = ()
    # Top-level status keys to set (None removes the key).
    status: Mapping[str, Any] = field(default_factory=dict)
    # Metadata to add to the attachment: the owner reference to the application, its lineage labels.
    owner_reference: Mapping[str, Any] | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    # The claim to create (then decide again), and surplus claims of ours to delete.
    mint: Mapping[str, Any] | None = None
    delete_claims: tuple[Mapping[str, Any], ...] = ()
    service_action: ServiceAction = ServiceAction.NONE
    service: Mapping[str, Any] | None = None  # the Service to create, or the live one acted on
    service_patch: Mapping[str, Any] | None = None
    # Our Services beyond the one kept (a lost create answer), to delete.
    surplus_services: tuple[Mapping[str, Any], ...] = ()
    # VM modes: the PROGRAMMED_ANNOTATION value to set on our Service (None: nothing to touch).
    programmed: str | None = None
    # Seconds after which time alone changes this decision (an announce deadline, a quota retry).
    recheck_after: float | None = None
    finalizing: bool = False
    # Deletion only: our Service is still observed; the finalizer stays until it is gone.
    waits_for_service: bool = False
    # VM modes: ``service_patch`` puts back the backends withdrawn while MultipleBackends (the glue
    # holds the status until their Endpoints answer, as after a create).
    restoring: bool = False

    @property
    def provisioned(self) -> Condition | None:
        return next((c for c in self.conditions if c.type == CONDITION_PROVISIONED), None)

    @property
    def waits_for_answer(self) -> bool:
        """Everything is in place but another component's answer: the substrate binding the claim
        just minted, the load balancer announcing the address, or (VM modes) the endpoints
        controllers listing the backend in the Service's Endpoints."""
        found = self.provisioned
        return found is not None and found.reason in (
            REASON_WAITING_FOR_ADDRESS,
            REASON_CLAIM_PENDING,
            REASON_NO_READY_BACKEND,
        )

    def status_patch(self, stored_status: Mapping[str, Any] | None, now: str) -> JsonPatch:
        """The JSON patch that stores this plan's status; empty when nothing changes (or finalizing)."""
        if self.finalizing:
            return []
        return status_patch(stored_status, self.status, self.conditions, self.generation, now)


def _meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return (obj or {}).get("metadata") or {}


def _deleting(obj: Mapping[str, Any] | None) -> bool:
    return bool(_meta(obj).get("deletionTimestamp"))


def _generation(attachment: Mapping[str, Any]) -> int:
    value = _meta(attachment).get("generation")
    return value if isinstance(value, int) else 0


def claim_addresses(claim: Mapping[str, Any] | None) -> list[str]:
    """The claim's bound addresses, IPv4 first (as the substrate lists them)."""
    entries = ((claim or {}).get("status") or {}).get("addresses") or []
    found = [str(e.get("address")) for e in entries if isinstance(e, Mapping) and e.get("address")]
    return sorted(found, key=lambda a: (":" in a, a))


def claim_family(claim: Mapping[str, Any]) -> str:
    family = (claim.get("spec") or {}).get("family")
    return family if isinstance(family, str) and family else DEFAULT_CLAIM_FAMILY


def ingress_addresses(service: Mapping[str, Any]) -> set[str]:
    ingress = ((service.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
    return {str(i.get("ip")) for i in ingress if isinstance(i, Mapping) and i.get("ip")}


def finalize(observed: Observed) -> Plan:
    """An attachment being deleted: our Services go first; the finalizer waits until they are gone."""
    generation = _generation(observed.attachment)
    live = [s for s in observed.services if not _deleting(s)]
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


def reconcile(observed: Observed, context: PassContext | None = None) -> Plan:
    """The plan for one pass over one attachment (``context``: see ``PassContext``)."""
    attachment = observed.attachment
    if _deleting(attachment):
        return finalize(observed)
    spec = spec_of(attachment)
    resolution = resolve(attachment, spec, observed.helmrelease, observed.endpoint)
    resolved = Condition(
        CONDITION_RESOLVED, TRUE if resolution.ok else FALSE, resolution.reason, resolution.message
    )
    owner, labels = _stamps(observed, spec, resolution)
    existing = next((s for s in observed.services if not _deleting(s)), None)
    surplus = tuple(s for s in observed.services if s is not existing and not _deleting(s))
    claim = observed.claim if observed.substrate else None
    delete_claims = tuple(observed.surplus_claims) if observed.substrate else ()
    bound = claim is not None and _claim_bound(claim)
    addresses = claim_addresses(claim) if bound else []
    base: dict[str, Any] = {
        "claimName": spec.claim_name or (str(_meta(claim).get("name")) if claim is not None else None),
        "addresses": addresses or None,
    }
    common = Plan(
        _generation(attachment),
        owner_reference=owner,
        labels=labels,
        delete_claims=delete_claims,
        surplus_services=surplus,
    )

    def dark(
        reason: str, message: str, phase: str = PHASE_PENDING, mint: Mapping[str, Any] | None = None
    ) -> Plan:
        """Nothing rendered: our Service (if any) is withdrawn."""
        provisioned = Condition(CONDITION_PROVISIONED, FALSE, reason, message)
        return replace(
            common,
            conditions=(resolved, provisioned),
            status={**base, "phase": phase, "serviceName": None},
            service_action=ServiceAction.DELETE if existing is not None else ServiceAction.NONE,
            service=existing,
            mint=mint,
        )

    if not resolution.ok:
        # An address was held: the claim is Bound and this attachment used it (rendered a Service,
        # or reported the claim in a resolved pass). A reserved claim named by an attachment that
        # never resolved was never its.
        raw = attachment.get("status")
        stored: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        held = bound and (bool(observed.services) or stored.get("claimName") == base["claimName"])
        if resolution.reason == REASON_ENDPOINT_NOT_FOUND and held:
            message = f"{resolution.message}: the Service is withdrawn, claim {base['claimName']} is kept"
            return dark(REASON_ENDPOINT_DETACHED, message, PHASE_DETACHED)
        unresolved = dark(
            REASON_UNRESOLVED, f"nothing is claimed or rendered until resolved: {resolution.message}"
        )
        if held:
            return unresolved
        kept = {"claimName": stored.get("claimName"), "addresses": stored.get("addresses")}
        return replace(unresolved, status={**unresolved.status, **kept})

    # --- what is published -----------------------------------------------------------------------
    endpoint = observed.endpoint or {}
    endpoint_spec = endpoint.get("spec") or {}
    selector = endpoint_spec.get("selector")
    endpoint_ports = [p for p in endpoint_spec.get("ports") or [] if isinstance(p, Mapping)]
    ports = publish_ports(endpoint_ports, spec)
    if (
        endpoint_spec.get("type") == SERVICE_TYPE_EXTERNAL_NAME
        or not isinstance(selector, Mapping)
        or not selector
    ):
        return dark(REASON_NOTHING_TO_PUBLISH, f"Service {spec.endpoint} selects no pods: nothing to publish")
    if not ports:
        return dark(REASON_NOTHING_TO_PUBLISH, no_port_message(spec.endpoint, endpoint_ports, spec))
    selector = {str(k): str(v) for k, v in selector.items()}
    # The family the VM datapath is judged for: the claim's, or the one a mint will ask for.
    family = claim_family(claim) if claim is not None else (spec.family or DEFAULT_CLAIM_FAMILY)
    # MultipleBackends with a Service of ours that may otherwise stay: kept, its backends withdrawn.
    withdrawn: Condition | None = None
    if spec.vm_mode:
        slices = observed.endpoint_slices
        ready = ready_backends(slices)
        judge = partial(
            admit,
            mode=spec.method,
            family=family,
            ports=ports,
            proxy_name=observed.settings.proxy_name,
            me=rank_of(attachment),
            my_service=(str(_meta(attachment).get("namespace")), str(_meta(existing).get("name") or "")),
            others=observed.rivals,
            selected=selected_pods(selector, observed.pods) | slice_pods(slices) | ready,
            selector=selector,
        )
        verdict = judge(backends=ready)
        # Only the count of ready backends stops a live Service of ours (every other rule admits it
        # with none counted, its pods, ready ones included, still its own): it is kept, withdrawn.
        keep = (
            verdict.reason == REASON_MULTIPLE_BACKENDS
            and existing is not None
            and judge(backends=frozenset()).ok
        )
        if not verdict.ok and not keep:
            return dark(verdict.reason, verdict.message)
        if not verdict.ok:
            message = (
                f"{verdict.message}: the address stays dark, Service {_meta(existing).get('name')} and "
                "its address are kept with its backends withdrawn until one remains"
            )
            withdrawn = Condition(CONDITION_PROVISIONED, FALSE, verdict.reason, message)
            selector = withdrawn_selector(selector, str(_meta(attachment).get("uid") or ""))

    # --- the claim -------------------------------------------------------------------------------
    if not observed.substrate:
        return dark(
            REASON_CLAIM_PENDING,
            "the address substrate is not installed (the IPAddressClaim, IPAddressClass and IPAddress "
            "kinds are not served): ask the hoster to install it",
        )
    if spec.claim_name:
        if claim is None or _deleting(claim):
            return dark(REASON_CLAIM_NOT_FOUND, f"no IPAddressClaim {spec.claim_name} in this namespace")
        if spec.family and claim_family(claim) != spec.family:
            return dark(
                REASON_FAMILY_CONFLICT,
                f"claim {spec.claim_name} is {claim_family(claim)}, the attachment asks for {spec.family}",
            )
    elif claim is None:
        mint = render_claim(attachment, spec)
        refused, retry = _still_refused(context, ServiceAction.MINT, mint, None)
        if refused is not None:
            failed = dark(REASON_RENDER_FAILED, f"the API refused to create the claim: {refused.message}")
            return replace(failed, recheck_after=retry)
        what = f"class {spec.class_name}" if spec.class_name else "the default class"
        return dark(REASON_CLAIM_PENDING, f"minting a claim from {what}", mint=mint)
    claim_name = str(_meta(claim).get("name"))
    if not bound:
        return dark(REASON_CLAIM_PENDING, _pending_message(claim_name, claim))
    holder = _in_use_by(observed, existing)
    if holder is not None:
        return dark(
            REASON_CLAIM_IN_USE,
            f"claim {claim_name}'s address is in use by Service {holder}: "
            "the claim serves one Service at a time",
        )

    family = claim_family(claim)

    # --- the Service -----------------------------------------------------------------------------
    if observed.claim_class is None:
        if existing is None:
            return dark(REASON_CLAIM_PENDING, _classless_message(claim_name, claim))
        # The class went after rendering: the live Service keeps the loadBalancerClass it has.
        load_balancer_class = str((existing.get("spec") or {}).get("loadBalancerClass") or "")
    else:
        load_balancer_class = str((observed.claim_class.get("spec") or {}).get("loadBalancerClass") or "")
    desired = render_service(
        attachment,
        spec,
        claim_name=claim_name,
        family=family,
        selector=selector,
        ports=ports,
        load_balancer_class=load_balancer_class,
        settings=observed.settings,
    )
    status = {**base, "serviceName": str(_meta(existing).get("name")) if existing is not None else None}
    if existing is not None:
        mismatch = immutable_mismatch(existing, desired)
        if mismatch is not None:
            provisioned = Condition(
                CONDITION_PROVISIONED,
                FALSE,
                REASON_RENDER_FAILED,
                f"Service {_meta(existing).get('name')}: {mismatch}; recreate the attachment to render "
                "it again",
            )
            return replace(
                common, conditions=(resolved, provisioned), status={**status, "phase": PHASE_PENDING}
            )
    hold = _handover_hold(observed, claim, context) if existing is None else None
    if hold is not None:
        held = Condition(CONDITION_PROVISIONED, FALSE, REASON_WAITING_FOR_ADDRESS, hold[0])
        return replace(
            common,
            conditions=(resolved, held),
            status={**status, "phase": PHASE_PENDING},
            recheck_after=hold[1],
        )
    action = ServiceAction.CREATE if existing is None else ServiceAction.NONE
    patch = service_patch(existing, desired) if existing is not None else None
    if patch is not None:
        action = ServiceAction.PATCH
    refused, recheck_after = _still_refused(context, action, desired, patch)
    if refused is not None:
        verb = "create" if refused.action is ServiceAction.CREATE else "change"
        provisioned = Condition(
            CONDITION_PROVISIONED,
            FALSE,
            REASON_RENDER_FAILED,
            f"the API refused to {verb} the Service: {refused.message}",
        )
        return replace(
            common,
            conditions=(resolved, provisioned),
            status={**status, "phase": PHASE_PENDING},
            recheck_after=recheck_after,
        )
    provisioned, programmed, announce_recheck = _provisioned(
        spec, existing, action, addresses, observed.rendered_endpoints, context
    )
    if withdrawn is not None:
        provisioned, programmed = withdrawn, None
    phase = PHASE_ATTACHED if provisioned.status == TRUE else PHASE_PENDING
    # The patch puts the withdrawn backends back: their Endpoints answer within moments.
    restoring = (
        action is ServiceAction.PATCH
        and withdrawn is None
        and existing is not None
        and is_withdrawn((existing.get("spec") or {}).get("selector"))
    )
    return replace(
        common,
        conditions=(resolved, provisioned),
        status={**status, "phase": phase},
        service_action=action,
        service=desired if action is ServiceAction.CREATE else existing,
        service_patch=patch,
        programmed=programmed,
        recheck_after=announce_recheck,
        restoring=restoring,
    )


def _stamps(
    observed: Observed, spec: AttachmentSpec, resolution: Resolution
) -> tuple[Mapping[str, Any] | None, dict[str, str]]:
    """The owner reference to the application and its lineage labels, to add to the attachment."""
    if not resolution.ok or observed.helmrelease is None:
        return None, {}
    owner = None
    if resolution.stamp:
        # List items may come without apiVersion/kind; the HelmRelease's are known.
        release = {"apiVersion": f"{HELMRELEASE_GROUP}/v2", "kind": HELMRELEASE_KIND, **observed.helmrelease}
        owner = owner_reference(release, controller=False, block_owner_deletion=False)
    have = labels_of(observed.attachment)
    wanted = application_ref(spec).labels()
    return owner, {k: v for k, v in wanted.items() if have.get(k) != v}


def claim_reading(claim: Mapping[str, Any]) -> tuple[Any, ...]:
    """Everything of a claim a decision reads: whether it is being deleted, its family, its class
    (asked for and resolved), its phase and addresses, and, while it is not Bound, the words of its
    conditions (``ClaimPending`` repeats them). Two versions with the same reading make the same plan
    (the controller's claim predicate compares them; the substrate's stamp, its finalizer and a
    condition's timestamps are not in it)."""
    status, spec = claim.get("status") or {}, claim.get("spec") or {}
    bound = _claim_bound(claim)
    return (
        _deleting(claim),
        claim_family(claim),
        spec.get("className"),
        status.get("className"),
        status.get("phase"),
        tuple(claim_addresses(claim)),
        None if bound else _pending_message("", claim),
    )


def address_reading(address: Mapping[str, Any] | None) -> tuple[str, str, str, str] | None:
    """Everything of an IPAddress a decision reads (``ClaimInUse``): the Service it is associated
    with (``status.associatedTo``, namespace and name) under the claim it names (``spec.claimRef``);
    None when it is associated with none, which no decision tells apart from its absence (its binding
    is read from the claim's status, never from the address)."""
    associated = ((address or {}).get("status") or {}).get("associatedTo") or {}
    if not isinstance(associated, Mapping) or not associated.get("name"):
        return None
    ref = ((address or {}).get("spec") or {}).get("claimRef") or {}
    if not isinstance(ref, Mapping):
        ref = {}
    return (
        str(ref.get("namespace") or ""),
        str(ref.get("name") or ""),
        str(associated.get("namespace") or ""),
        str(associated.get("name")),
    )


def _handover_hold(
    observed: Observed, claim: Mapping[str, Any], context: PassContext | None
) -> tuple[str, float] | None:
    """(why, seconds left) while the new Service waits for the class's provisioning (see the module
    docstring); None: create it now."""
    if observed.provisioning < HANDOVER_HOLD_MIN_PROVISIONING or context is None:
        return None
    since = bound_since(claim)
    if since is None:
        return None
    # Never past the hold, whatever the substrate's clock said of ``since``.
    left = min(
        context.handover_hold_seconds - (context.now - since).total_seconds(), context.handover_hold_seconds
    )
    if left <= 0:
        return None
    class_name = (claim.get("status") or {}).get("className")
    return (
        f"claim {_meta(claim).get('name')} is Bound; its Service waits (at most "
        f"{context.handover_hold_seconds:g}s) while {observed.provisioning} other claim(s) of class "
        f"{class_name} are being provisioned, so that MetalLB does not give the address to one of them",
        left,
    )


def bound_since(claim: Mapping[str, Any]) -> datetime | None:
    """When the claim's ``Bound`` condition last turned True (None: unknown)."""
    for c in (claim.get("status") or {}).get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == CLAIM_PHASE_BOUND and c.get("status") == TRUE:
            try:
                moment = datetime.fromisoformat(str(c.get("lastTransitionTime")))
            except ValueError:
                return None
            return moment if moment.tzinfo is not None else None
    return None


def provisioning_class(claim: Mapping[str, Any]) -> str | None:
    """The class a claim is being provisioned from: one resolved, neither Bound nor Lost, not being
    deleted (None otherwise)."""
    status = claim.get("status") or {}
    if _deleting(claim) or status.get("phase") in (CLAIM_PHASE_BOUND, CLAIM_PHASE_LOST):
        return None
    name = status.get("className") or (claim.get("spec") or {}).get("className")
    return str(name) if name else None


def _claim_bound(claim: Mapping[str, Any]) -> bool:
    return (claim.get("status") or {}).get("phase") == CLAIM_PHASE_BOUND and bool(claim_addresses(claim))


def _pending_message(name: str, claim: Mapping[str, Any]) -> str:
    status = claim.get("status") or {}
    phase = status.get("phase") or "not yet reconciled by the substrate"
    said = next(
        (
            f": {c.get('reason')}: {c.get('message')}"
            for c in status.get("conditions") or []
            if isinstance(c, Mapping) and c.get("status") != TRUE and c.get("message")
        ),
        "",
    )
    return f"claim {name} is {phase}{said}"


def _classless_message(name: str, claim: Mapping[str, Any]) -> str:
    status, spec = claim.get("status") or {}, claim.get("spec") or {}
    class_name = status.get("className") or spec.get("className") or "(none named)"
    return (
        f"claim {name} is Bound, but its IPAddressClass {class_name} is not found: the Service's "
        "loadBalancerClass, which cannot change once it exists, is read from the class first"
    )


def _in_use_by(observed: Observed, existing: Mapping[str, Any] | None) -> str | None:
    """The other live Service the claim serves (see the module docstring), None when none."""
    namespace = str(_meta(observed.attachment).get("namespace"))
    users = {str(_meta(s).get("name")): s for s in observed.claim_users if not _deleting(s)}
    for address in observed.addresses:
        reading = address_reading(address)
        if reading is None or reading[2] != namespace:
            continue
        name = reading[3]
        if name in users and name != _meta(existing).get("name"):
            return f"{namespace}/{name}"
    if existing is None and users:
        return f"{namespace}/{sorted(users)[0]}"
    return None


def _still_refused(
    context: PassContext | None,
    action: ServiceAction,
    desired: Mapping[str, Any],
    patch: Mapping[str, Any] | None,
) -> tuple[ServiceRefusal | None, float | None]:
    """The API's refusal of exactly the write this pass would make (None: make it), and when a quota
    refusal is tried again."""
    refusal = context.refusal if context is not None else None
    if context is None or refusal is None or refusal.action is not action:
        return None, None
    body = patch if action is ServiceAction.PATCH else desired
    if body is None or dict(body) != dict(refusal.body):
        return None, None  # something it is rendered from changed: a new request deserves an answer
    if not refusal.quota:
        return refusal, None
    remaining = context.quota_retry_seconds - (context.now - refusal.at).total_seconds()
    return (refusal, remaining) if remaining > 0 else (None, None)


def _provisioned(
    spec: AttachmentSpec,
    existing: Mapping[str, Any] | None,
    action: ServiceAction,
    addresses: Sequence[str],
    rendered_endpoints: Mapping[str, Any] | None,
    context: PassContext | None,
) -> tuple[Condition, str | None, float | None]:
    """Provisioned once a Service of ours exists: its ingress, its backend (VM modes), the announce
    deadline; the PROGRAMMED token to write, and the seconds until the deadline."""
    listed = ", ".join(addresses)
    if existing is None or action is ServiceAction.CREATE:
        return (
            Condition(
                CONDITION_PROVISIONED, FALSE, REASON_WAITING_FOR_ADDRESS, "the Service is being written"
            ),
            None,
            None,
        )
    name = _meta(existing).get("name")
    missing = [a for a in addresses if a not in ingress_addresses(existing)]
    if missing:
        waiting = Condition(
            CONDITION_PROVISIONED,
            FALSE,
            REASON_WAITING_FOR_ADDRESS,
            f"waiting for the load balancer to put {', '.join(missing)} in Service {name}'s ingress",
        )
        if action is ServiceAction.PATCH:
            return waiting, None, context.announce_timeout_seconds if context is not None else None
        return _unannounced(waiting, existing, missing, context)
    if not spec.vm_mode:
        return (
            Condition(
                CONDITION_PROVISIONED, TRUE, REASON_PROVISIONED, f"{listed} announced for Service {name}"
            ),
            None,
            None,
        )
    backends = programmed_backends(rendered_endpoints)
    if not backends:
        message = (
            f"{listed} is announced, but Service {name}'s Endpoints name no ready backend pod: "
            "cozy-proxy has nothing to send its traffic to yet"
        )
        return Condition(CONDITION_PROVISIONED, FALSE, REASON_NO_READY_BACKEND, message), None, None
    if len(backends) > 1:
        names = ", ".join(label for _, label in backends)
        message = (
            f"Service {name}'s Endpoints name {len(backends)} ready backends ({names}); "
            f"{spec.method} serves one"
        )
        return Condition(CONDITION_PROVISIONED, FALSE, REASON_MULTIPLE_BACKENDS, message), None, None
    key, label = backends[0]
    token = programmed_token(listed, key)
    annotations = _meta(existing).get("annotations") or {}
    programmed = token if annotations.get(PROGRAMMED_ANNOTATION) != token else None
    message = f"{listed} announced for Service {name}; {spec.method} traffic goes to {label}"
    return Condition(CONDITION_PROVISIONED, TRUE, REASON_PROVISIONED, message), programmed, None


def _unannounced(
    waiting: Condition, existing: Mapping[str, Any], missing: Sequence[str], context: PassContext | None
) -> tuple[Condition, None, float | None]:
    """``WaitingForAddress`` until the deadline, then ``AddressNotAnnounced`` saying what was asked."""
    if context is None:
        return waiting, None, None
    metadata = existing.get("metadata") or {}
    since = _written_at(metadata.get("creationTimestamp"), context.written_at)
    if since is None:
        return waiting, None, None
    timeout = context.announce_timeout_seconds
    waited = (context.now - since).total_seconds()
    if waited < timeout:
        return waiting, None, timeout - waited
    lb_class = (existing.get("spec") or {}).get("loadBalancerClass")
    served_by = f"loadBalancerClass {lb_class}" if lb_class else "the default load balancer (no class)"
    claim = (metadata.get("annotations") or {}).get(CLAIM_ANNOTATION)
    message = (
        f"the load balancer has not announced {', '.join(missing)} (claim {claim}) within {timeout:g}s of "
        f"Service {metadata.get('name')} being written at {rfc3339(since)}, from {served_by}: does it "
        "serve that class, and does the class's driver configure it?"
    )
    return Condition(CONDITION_PROVISIONED, FALSE, REASON_ADDRESS_NOT_ANNOUNCED, message), None, None


def _written_at(created: object, written_at: datetime | None) -> datetime | None:
    """When the Service was last written: its creation, or our later change of it."""
    try:
        creation = datetime.fromisoformat(created) if isinstance(created, str) else None
    except ValueError:
        creation = None
    if creation is not None and creation.tzinfo is None:
        creation = None
    moments = [m for m in (creation, written_at) if m is not None]
    return max(moments) if moments else None
