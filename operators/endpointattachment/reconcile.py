"""One attachment, everything observed about it -> a plan: the status to store and the actions to take.

Decides, on every pass, all four conditions and what the glue must do:
- EndpointResolved: the endpoint check, then the application match (``endpoint``). With no owner
  reference to the application yet, the plan carries one to stamp on the attachment (not a
  controller: the HelmRelease's controller does not manage attachments; ``blockOwnerDeletion`` false,
  so deleting an application is never held up by its attachments).
- AddressBound: the address, minted from the class or bound from the claim.
  * No address is acquired (no mint, no claim use recorded) until EndpointResolved is True, so a typo
    or a leftover of a deleted application never drains a pool or blocks a claim's move. An address
    already held stays held (``EndpointUnresolved`` is Unknown, not False, only before acquisition).
  * Mint: the address held by an IPAddressAllocation with this attachment's UID (``held_address``, found
    by the glue) is bound. Otherwise the plan asks to create the allocation for one candidate, the first
    free one walking from the holder's offset (``addresses.start_offset``); the glue creates it and
    reconciles again; on a 409 it reads the existing allocation: held by this UID, it is ours; else it
    reconciles again with the address counted as taken. ``status.address`` is written only once an
    address is held, and if that allocation later disappears the same address is minted again, or,
    when someone else holds it now, ``AddressInUse`` (never a silent change of address).
  * Claim: the claim (same namespace, not being deleted unless we use it) must be Bound with an address
    and record no other attachment as its user (``ClaimInUse``). A claim that is Pending or Lost is
    ``ClaimNotBound`` (design silent; added). Before rendering, the plan asks the glue to record this
    attachment as the claim's user (``bind_claim``, written with the claim's resourceVersion so two
    attachments cannot both win), then reconciles again.
  * The class (the attachment's ``className``, or the claim's) must exist (``ClassNotFound``), be well
    formed (``ClassInvalid``, added) and admit the namespace through ``allowedNamespaces``, a standard
    label selector (absent or empty: every namespace; an unknown operator matches nothing). The
    namespace check also applies to a held address: it stays held but dark.
- DatapathAdmitted: Standard is always admitted; the VM modes go through ``datapath.admit`` with the
  endpoint's ports, the ready backends of the endpoint's EndpointSlices (the rendered Service mirrors
  its selector, so its pods are the same), every pod the endpoint's selector selects in the namespace
  (ready or not: exclusivity is decided before anything renders), and the address's family (the
  class's family until an address is bound). ``ProxyDeclarationConflict`` (two ServiceProxies name
  different proxies) freezes a live Service of ours: neither patched (no relabelling) nor deleted.
- the rendered Service: desired only when the first three conditions are True. A Service with the
  rendered name that is not controlled by this attachment's UID is never created over, patched or
  deleted (``ServiceNameConflict``); ours is created, patched (merge patch of our fields), recreated
  (an immutable field changed) or deleted when dark.
- Ready: the first non-True of the three conditions (its reason and message), then
  ``ServiceNameConflict``, then ``AddressPending`` until the rendered Service's
  ``status.loadBalancer.ingress`` holds the bound address, then ``Published``. In a VM mode the
  proxy must also have a pod to program the address onto: with no ready backend Ready is
  ``NoReadyBackend``; ``Published`` names the pod that receives the traffic.
- what the API and time tell (``PassContext``, passed in by the glue; without one, neither applies):
  * a rendered Service the API refused (``ServiceRefusal``: 400, 403 or 422, from validation, a
    webhook or an admission policy, a quota, a terminating namespace) is a business outcome, not an
    error: Ready is False with the API's message (``ServiceRefused``, ``ServiceQuotaExceeded``,
    ``NamespaceTerminating``), and the very same create or patch is not planned again. Anything the
    Service is rendered from changing (the attachment, its endpoint, class, claim or address) makes
    another body and so another attempt. A quota frees without an event we watch, so a quota refusal
    is tried again ``quota_retry_seconds`` after it (``Plan.recheck_after``); a namespace being
    deleted never comes back, and other refusals answer the same request the same way.
  * ``AddressNotAnnounced``: our Service has waited ``announce_timeout_seconds`` since it was written
    (its creation, or our last change of it, whichever is later) and the load balancer has not put the
    address in its ingress; the message says how long, since when, and what was asked (the address
    and the loadBalancerClass). Until then ``AddressPending``, with a ``recheck_after`` at the
    deadline. Not final: the address showing up in the ingress makes it ``Published``.
- status fields: ``address`` (canonical), ``serviceName`` (only while we render a Service of ours),
  ``application`` (only while resolved); ``observedGeneration`` and conditions via
  ``shared.conditions.status_patch``.
- deletion (``deletionTimestamp`` set): a finalize plan that deletes our Service and, only once that
  Service is observed gone (``waits_for_service`` until then: a Service held by a load balancer's
  finalizer still asks for the address), releases the allocation this attachment holds and its use of
  the claim (never the claim's address); it writes no status.

Does not: perform any of it, read the clock (``now`` is passed in), or list anything: the caller passes
the objects, already narrowed as documented on ``Observed``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any, Final

from operators.endpointattachment.addresses import (
    AddressPool,
    Holder,
    InvalidAddress,
    InvalidPool,
    IPAddress,
    allocation_manifest,
    allocation_name,
    family_of,
    first_free,
    parse_address,
    pool_of,
    start_offset,
)
from operators.endpointattachment.constants import (
    CILIUM_IPS_ANNOTATION,
    CLAIM_PHASE_BOUND,
    CLAIM_PHASE_PENDING,
    COND_ADDRESS_BOUND,
    COND_DATAPATH_ADMITTED,
    COND_ENDPOINT_RESOLVED,
    COND_READY,
    DEFAULT_ALLOW_ICMP,
    DEFAULT_MODE,
    ENDPOINT_ATTACHMENT_KIND,
    ENDPOINTSLICE_SERVICE_NAME_LABEL,
    HELMRELEASE_API_VERSION,
    HELMRELEASE_KIND,
    METALLB_IPS_ANNOTATION,
    MODE_STANDARD,
    MODES,
    PROGRAMMED_ANNOTATION,
    REASON_ADDRESS_IN_USE,
    REASON_ADDRESS_NOT_ANNOUNCED,
    REASON_ADDRESS_PENDING,
    REASON_ADDRESS_UNBOUND,
    REASON_ADMITTED,
    REASON_BINDING,
    REASON_CLAIM_BOUND,
    REASON_CLAIM_IN_USE,
    REASON_CLAIM_NOT_BOUND,
    REASON_CLAIM_NOT_FOUND,
    REASON_CLASS_INVALID,
    REASON_CLASS_NOT_FOUND,
    REASON_ENDPOINT_UNRESOLVED,
    REASON_MINTED,
    REASON_MINTING,
    REASON_MULTIPLE_BACKENDS,
    REASON_NAMESPACE_NOT_ALLOWED,
    REASON_NAMESPACE_TERMINATING,
    REASON_NO_READY_BACKEND,
    REASON_POOL_EXHAUSTED,
    REASON_PROXY_DECLARATION_CONFLICT,
    REASON_PROXY_NOT_DECLARED,
    REASON_PUBLISHED,
    REASON_SERVICE_NAME_CONFLICT,
    REASON_SERVICE_QUOTA_EXCEEDED,
    REASON_SERVICE_REFUSED,
    VM_MODES,
)
from operators.endpointattachment.datapath import (
    ProxiedService,
    admit,
    programmed_backends,
    programmed_token,
    rank_of,
    ready_backends,
    selected_pods,
    slice_pods,
)
from operators.endpointattachment.endpoint import (
    EndpointCheck,
    bound_application_uid,
    check_endpoint,
    match_application,
)
from operators.endpointattachment.render import (
    ClassSettings,
    InvalidClassSettings,
    class_settings,
    needs_recreate,
    render_service,
    service_name,
    service_patch,
)
from shared.conditions import FALSE, TRUE, UNKNOWN, Condition, JsonPatch, rfc3339, status_patch
from shared.lineage import labels_of
from shared.ownership import is_controlled_by, owner_reference


@dataclass(frozen=True)
class Observed:
    """Everything the glue observed about one attachment.

    - ``endpoint``: the Service named by ``spec.endpoint.name`` in the attachment's namespace.
    - ``helmrelease``: the HelmRelease in that namespace with the endpoint's three lineage labels.
    - ``address_class``: the IPAddressClass the address comes from (``spec.address.className``, or the
      claim's ``spec.className`` when binding a claim).
    - ``claim``: the IPAddressClaim named by ``spec.address.claimName`` in the attachment's namespace.
    - ``held_address``: the address of the IPAddressAllocation whose holder UID is this attachment's.
    - ``taken_addresses``: canonical text of every allocated address (any class, any holder); only
      membership is asked, so the glue may pass a view over its index instead of a copy.
    - ``service``: the Service with the rendered name (``render.service_name``), whoever owns it.
    - ``endpoint_slices``: the EndpointSlices of the endpoint Service.
    - ``rendered_endpoints``: the v1 Endpoints named like the rendered Service (what cozy-proxy reads).
    - ``proxied_services``: every rival for our pods: each Service delegated to a proxy and each
      other VM-mode attachment of the namespace, with the pods it selects.
    - ``pods``: the (not finished) pods of the attachment's namespace, for what the endpoint selects.
    - ``namespace_labels``: the labels of the attachment's namespace.
    """

    attachment: Mapping[str, Any]
    endpoint: Mapping[str, Any] | None = None
    helmrelease: Mapping[str, Any] | None = None
    address_class: Mapping[str, Any] | None = None
    claim: Mapping[str, Any] | None = None
    service_proxies: Sequence[Mapping[str, Any]] = ()
    held_address: str | None = None
    taken_addresses: AbstractSet[str] = frozenset()
    service: Mapping[str, Any] | None = None
    endpoint_slices: Sequence[Mapping[str, Any]] = ()
    rendered_endpoints: Mapping[str, Any] | None = None
    proxied_services: Sequence[ProxiedService] = ()
    namespace_labels: Mapping[str, str] = field(default_factory=dict)
    pods: Sequence[Mapping[str, Any]] = ()


class ServiceAction(StrEnum):
    """What the glue does to the rendered Service this pass."""

    NONE = "None"
    CREATE = "Create"
    PATCH = "Patch"  # JSON merge patch ``Plan.service_patch``
    RECREATE = "Recreate"  # delete, then create ``Plan.service`` on a later pass
    DELETE = "Delete"


# Where a rendered Service asks the load balancer for its address (one per provider).
_ADDRESS_ANNOTATIONS: Final = (METALLB_IPS_ANNOTATION, CILIUM_IPS_ANNOTATION)
# HTTP statuses of a refusal (not an error to retry): the request itself is wrong for this cluster.
REFUSED_STATUSES: Final = frozenset({400, 403, 422})
# How the API words the two refusals that are not about the Service itself (a 403 for each).
QUOTA_MESSAGE: Final = "exceeded quota"
NAMESPACE_TERMINATING_MESSAGE: Final = "because it is being terminated"
# OwnerReferencesPermissionEnforcement's answer while the API server's REST mapping does not know the
# owner's kind yet (a CRD installed moments ago): the server's state, not the request, so transient.
STALE_MAPPING_MESSAGE: Final = "cannot find RESTMapping"
# Defaults of the glue's settings (``--announce-timeout-seconds``, ``--quota-retry-seconds``).
ANNOUNCE_TIMEOUT_SECONDS: Final = 60.0
QUOTA_RETRY_SECONDS: Final = 60.0


@dataclass(frozen=True)
class ServiceRefusal:
    """The API's refusal of a write of the rendered Service: what was sent (``body``: the Service
    for a create, the merge patch for a patch), when, and the API's answer, already named."""

    action: ServiceAction
    body: Mapping[str, Any]
    reason: str
    message: str
    at: datetime


def refusal_of(
    action: ServiceAction, body: Mapping[str, Any], status: int, message: str, at: datetime
) -> ServiceRefusal | None:
    """The refusal an API answer is, or None when it is no business outcome (a conflict, a missing
    namespace, a throttled or failing server: transient, retried with backoff)."""
    if status not in REFUSED_STATUSES or STALE_MAPPING_MESSAGE in message:
        return None
    if status == 403 and QUOTA_MESSAGE in message:
        reason = REASON_SERVICE_QUOTA_EXCEEDED
    elif status == 403 and NAMESPACE_TERMINATING_MESSAGE in message:
        reason = REASON_NAMESPACE_TERMINATING
    else:
        reason = REASON_SERVICE_REFUSED
    return ServiceRefusal(action=action, body=body, reason=reason, message=message, at=at)


@dataclass(frozen=True)
class PassContext:
    """What the glue knows beyond the caches: the time, when it last wrote the rendered Service, the
    API's last refusal of it, and the two waits (seconds)."""

    now: datetime
    written_at: datetime | None = None
    refusal: ServiceRefusal | None = None
    announce_timeout_seconds: float = ANNOUNCE_TIMEOUT_SECONDS
    quota_retry_seconds: float = QUOTA_RETRY_SECONDS


@dataclass(frozen=True)
class MintRequest:
    """Create this IPAddressAllocation: its name is the lock on ``address``."""

    address: str
    allocation: Mapping[str, Any]


@dataclass(frozen=True)
class ClaimUse:
    """Record ``attachment`` (name and UID) as the user in the claim's ``status.attachment``."""

    claim_name: str
    attachment: Mapping[str, str]


@dataclass(frozen=True)
class Plan:
    """What should be, for the glue to apply; an empty status patch and no actions means a quiet pass."""

    generation: int
    conditions: tuple[Condition, ...] = ()
    # Top-level status keys to set (None removes the key; keys absent here are left as stored).
    status: Mapping[str, Any] = field(default_factory=dict)
    service: Mapping[str, Any] | None = None
    service_action: ServiceAction = ServiceAction.NONE
    service_patch: Mapping[str, Any] | None = None
    mint: MintRequest | None = None
    bind_claim: ClaimUse | None = None
    # An owner reference to the application's HelmRelease to add to the attachment.
    owner_reference: Mapping[str, Any] | None = None
    # Deletion only: the allocation to delete and the claim whose use to clear.
    finalizing: bool = False
    release_allocation: str | None = None
    release_claim: str | None = None
    # Deletion only: our Service is still observed, so nothing is released yet (its deletion wakes us).
    waits_for_service: bool = False
    # Seconds after which time alone changes this decision (an announce deadline, a quota retry).
    recheck_after: float | None = None
    # VM modes: the PROGRAMMED_ANNOTATION value to set on our Service (None: nothing to touch).
    programmed: str | None = None

    @property
    def ready(self) -> bool:
        return any(c.type == COND_READY and c.status == TRUE for c in self.conditions)

    @property
    def waits_for_load_balancer(self) -> bool:
        """Everything is in place but the announcement of the address (Ready: ``AddressPending``)."""
        return any(
            c.type == COND_READY and c.status != TRUE and c.reason == REASON_ADDRESS_PENDING
            for c in self.conditions
        )

    def status_patch(self, stored_status: Mapping[str, Any] | None, now: str) -> JsonPatch:
        """The JSON patch that stores this plan's status; empty when nothing changes (and when finalizing)."""
        if self.finalizing:
            return []
        return status_patch(stored_status, self.status, self.conditions, self.generation, now)


@dataclass(frozen=True)
class _Address:
    """The AddressBound outcome, and what it lets us render with."""

    condition: Condition
    address: IPAddress | None = None
    family: str | None = None
    settings: ClassSettings | None = None
    mint: MintRequest | None = None
    bind_claim: ClaimUse | None = None
    # Status fields for the address (absent: leave the stored value alone).
    status: Mapping[str, Any] = field(default_factory=dict)


def reconcile(observed: Observed, context: PassContext | None = None) -> Plan:
    """The plan for one pass over one attachment (``context``: see ``PassContext``)."""
    attachment = observed.attachment
    metadata = attachment.get("metadata") or {}
    if metadata.get("deletionTimestamp"):
        return finalize(observed)
    name = str(metadata.get("name") or "")
    spec = attachment.get("spec") or {}

    endpoint, endpoint_condition, application, stamp = _resolve(observed)
    resolved = endpoint_condition.status == TRUE
    address = _address(observed, resolved)
    mode = str(spec.get("mode") or DEFAULT_MODE)
    allow_icmp = spec.get("allowICMP")
    datapath_condition, proxy_name = _datapath(observed, endpoint, resolved, mode, address.family)

    rendered_name = service_name(name)
    existing = observed.service
    if existing is not None and (existing.get("metadata") or {}).get("name") != rendered_name:
        existing = None  # not the Service this attachment would render: nothing to compare or touch
    ours = existing is not None and is_controlled_by(existing, str(metadata.get("uid") or ""))
    desired: dict[str, Any] | None = None
    prerequisites = (endpoint_condition, address.condition, datapath_condition)
    if all(c.status == TRUE for c in prerequisites) and address.address and address.settings:
        desired = render_service(
            attachment,
            selector=endpoint.selector,
            ports=endpoint.ports,
            address=address.address,
            settings=address.settings,
            mode=mode,
            allow_icmp=allow_icmp if isinstance(allow_icmp, bool) else DEFAULT_ALLOW_ICMP,
            proxy_name=proxy_name,
        )
    action, patch = _service_action(existing, ours, desired)
    if datapath_condition.reason == REASON_PROXY_DECLARATION_CONFLICT and action is ServiceAction.DELETE:
        action = ServiceAction.NONE  # frozen: never relabelled, never deleted on an ambiguity
    refused, recheck_after = _still_refused(context, action, desired, patch)
    if refused is not None:
        action, patch = ServiceAction.NONE, None  # the same request would get the same answer
    ready = _ready(prerequisites, existing, ours, action, address.address)
    ready, backend = _vm_ready(ready, mode, observed.rendered_endpoints if ours else None)
    programmed = None
    if backend is not None and address.address is not None and existing is not None:
        token = programmed_token(str(address.address), backend)
        if ((existing.get("metadata") or {}).get("annotations") or {}).get(PROGRAMMED_ANNOTATION) != token:
            programmed = token
    ready, announce_recheck = _refused_or_unannounced(ready, refused, existing, ours, action, context)
    recheck_after = announce_recheck if recheck_after is None else recheck_after

    status: dict[str, Any] = {
        **address.status,
        # Named only while we render it: never point the tenant at someone else's Service.
        "serviceName": rendered_name
        if desired is not None and (ours or (existing is None and refused is None))
        else None,
        "application": application,
    }
    return Plan(
        generation=int(metadata.get("generation") or 0),
        conditions=(*prerequisites, ready),
        status=status,
        service=desired,
        service_action=action,
        service_patch=patch,
        mint=address.mint,
        bind_claim=address.bind_claim,
        owner_reference=stamp,
        finalizing=False,
        release_allocation=None,
        release_claim=None,
        recheck_after=recheck_after,
        programmed=programmed,
    )


def finalize(observed: Observed) -> Plan:
    """The plan for an attachment being deleted: our Service goes, the address use is released."""
    metadata = observed.attachment.get("metadata") or {}
    uid = str(metadata.get("uid") or "")
    service = observed.service
    ours = service is not None and is_controlled_by(service, uid)
    deleting = ours and bool(((service or {}).get("metadata") or {}).get("deletionTimestamp"))
    if ours:
        # The address is released only once our Service is gone from the API: until then it still
        # asks the load balancer for it (a cloud load balancer's finalizer can hold it a while).
        return Plan(
            generation=int(metadata.get("generation") or 0),
            service_action=ServiceAction.NONE if deleting else ServiceAction.DELETE,
            finalizing=True,
            waits_for_service=True,
        )
    claim_name = ((observed.attachment.get("spec") or {}).get("address") or {}).get("claimName")
    release_claim = None
    if observed.claim is not None and claim_name and _claim_user_uid(observed.claim) == uid:
        release_claim = str(claim_name)
    release_allocation = None
    if observed.held_address:
        try:
            release_allocation = allocation_name(observed.held_address)
        except InvalidAddress:
            release_allocation = None
    return Plan(
        generation=int(metadata.get("generation") or 0),
        service_action=ServiceAction.NONE,
        finalizing=True,
        release_allocation=release_allocation,
        release_claim=release_claim,
    )


def _resolve(
    observed: Observed,
) -> tuple[EndpointCheck, Condition, Mapping[str, str] | None, Mapping[str, Any] | None]:
    """EndpointResolved, the ``status.application`` value, and the owner reference to stamp."""
    attachment = observed.attachment
    namespace = str((attachment.get("metadata") or {}).get("namespace") or "")
    endpoint_name = str(((attachment.get("spec") or {}).get("endpoint") or {}).get("name") or "")
    check = check_endpoint(observed.endpoint, namespace, endpoint_name)
    if not check.ok or check.application is None:
        return check, Condition(COND_ENDPOINT_RESOLVED, FALSE, check.reason, check.message), None, None
    match = match_application(bound_application_uid(attachment), observed.helmrelease, check.application)
    if not match.ok or match.uid is None or observed.helmrelease is None:
        return check, Condition(COND_ENDPOINT_RESOLVED, FALSE, match.reason, match.message), None, None
    stamp = None
    if match.stamp_owner:
        # List items may come without apiVersion/kind; the HelmRelease's are known.
        owner = {"apiVersion": HELMRELEASE_API_VERSION, "kind": HELMRELEASE_KIND, **observed.helmrelease}
        stamp = owner_reference(owner, controller=False, block_owner_deletion=False)
    application = {"kind": check.application.kind, "name": check.application.name, "uid": match.uid}
    condition = Condition(COND_ENDPOINT_RESOLVED, TRUE, match.reason, f"{check.message}, {match.message}")
    return check, condition, application, stamp


def _address(observed: Observed, resolved: bool) -> _Address:
    """AddressBound: which address, from which class, and whether to mint or bind first."""
    spec = (observed.attachment.get("spec") or {}).get("address") or {}
    class_name, claim_name = spec.get("className"), spec.get("claimName")
    if bool(class_name) == bool(claim_name):
        return _address_false(
            REASON_CLASS_NOT_FOUND, "spec.address must name exactly one of className, claimName"
        )
    if claim_name:
        return _claim_address(observed, str(claim_name), resolved)
    return _minted_address(observed, str(class_name), resolved)


def _class(observed: Observed, class_name: str) -> tuple[AddressPool, ClassSettings] | _Address:
    """The class's pool and render settings, or the AddressBound failure."""
    address_class = observed.address_class
    if address_class is None or (address_class.get("metadata") or {}).get("name") != class_name:
        return _address_false(REASON_CLASS_NOT_FOUND, f"IPAddressClass {class_name} not found")
    try:
        pool = pool_of(address_class.get("spec") or {})
        settings = class_settings(address_class)
    except (InvalidPool, InvalidClassSettings) as error:
        return _address_false(REASON_CLASS_INVALID, f"IPAddressClass {class_name}: {error}")
    selector = (address_class.get("spec") or {}).get("allowedNamespaces")
    if selector is not None and not selector_matches(selector, observed.namespace_labels):
        namespace = (observed.attachment.get("metadata") or {}).get("namespace")
        return _address_false(
            REASON_NAMESPACE_NOT_ALLOWED,
            f"IPAddressClass {class_name} does not admit namespace {namespace}",
            family=pool.family,
        )
    return pool, settings


def _minted_address(observed: Observed, class_name: str, resolved: bool) -> _Address:
    metadata = observed.attachment.get("metadata") or {}
    uid = str(metadata.get("uid") or "")
    found = _class(observed, class_name)
    if isinstance(found, _Address):
        return found
    pool, settings = found
    if observed.held_address:
        try:
            held = parse_address(observed.held_address)
        except InvalidAddress:
            held = None
        if held is not None:
            return _Address(
                Condition(COND_ADDRESS_BOUND, TRUE, REASON_MINTED, f"{held} minted from {class_name}"),
                address=held,
                family=family_of(held),
                settings=settings,
                status={"address": str(held)},
            )
    if not resolved:
        return _address_unknown(
            REASON_ENDPOINT_UNRESOLVED, "no address is minted before the endpoint resolves", pool.family
        )
    holder = Holder(
        kind=ENDPOINT_ATTACHMENT_KIND,
        namespace=str(metadata.get("namespace") or ""),
        name=str(metadata.get("name") or ""),
        uid=uid,
    )
    recorded = _recorded_address(observed.attachment)
    if recorded is not None:
        if str(recorded) in observed.taken_addresses:
            return _address_false(
                REASON_ADDRESS_IN_USE,
                f"{recorded}, minted for this attachment, is now held by another",
                family=pool.family,
            )
        choice: IPAddress | None = recorded
    else:
        choice = first_free(pool.candidates(start_offset(pool, uid)), observed.taken_addresses)
    if choice is None:
        return _address_false(
            REASON_POOL_EXHAUSTED,
            f"all {pool.capacity} addresses of {class_name} are allocated",
            family=pool.family,
        )
    return _Address(
        Condition(COND_ADDRESS_BOUND, UNKNOWN, REASON_MINTING, f"allocating {choice} from {class_name}"),
        family=pool.family,
        mint=MintRequest(address=str(choice), allocation=allocation_manifest(choice, class_name, holder)),
    )


def _claim_address(observed: Observed, claim_name: str, resolved: bool) -> _Address:
    metadata = observed.attachment.get("metadata") or {}
    uid, namespace = str(metadata.get("uid") or ""), str(metadata.get("namespace") or "")
    claim = observed.claim
    gone = {"address": None}  # a claim address we do not use is not ours to show
    claim_meta = (claim or {}).get("metadata") or {}
    if claim is None or claim_meta.get("name") != claim_name or claim_meta.get("namespace") != namespace:
        return _address_false(REASON_CLAIM_NOT_FOUND, f"IPAddressClaim {claim_name} not found", status=gone)
    user_uid = _claim_user_uid(claim)
    if claim_meta.get("deletionTimestamp") and user_uid != uid:
        return _address_false(
            REASON_CLAIM_NOT_FOUND, f"IPAddressClaim {claim_name} is being deleted", status=gone
        )
    if user_uid and user_uid != uid:
        user = ((claim.get("status") or {}).get("attachment") or {}).get("name", user_uid)
        return _address_false(
            REASON_CLAIM_IN_USE, f"IPAddressClaim {claim_name} is used by attachment {user}", status=gone
        )
    claim_status = claim.get("status") or {}
    try:
        address = parse_address(claim_status.get("address"))
    except InvalidAddress:
        address = None
    if claim_status.get("phase") != CLAIM_PHASE_BOUND or address is None:
        phase = claim_status.get("phase") or CLAIM_PHASE_PENDING
        return _address_false(REASON_CLAIM_NOT_BOUND, f"IPAddressClaim {claim_name} is {phase}", status=gone)
    class_name = str((claim.get("spec") or {}).get("className") or "")
    found = _class(observed, class_name)
    if isinstance(found, _Address):
        return replace(found, status=gone)
    _, settings = found
    if user_uid == uid:
        return _Address(
            Condition(
                COND_ADDRESS_BOUND, TRUE, REASON_CLAIM_BOUND, f"{address} from IPAddressClaim {claim_name}"
            ),
            address=address,
            family=family_of(address),
            settings=settings,
            status={"address": str(address)},
        )
    if not resolved:
        return _address_unknown(
            REASON_ENDPOINT_UNRESOLVED,
            "the claim is not used before the endpoint resolves",
            family_of(address),
        )
    use = ClaimUse(claim_name=claim_name, attachment={"name": str(metadata.get("name") or ""), "uid": uid})
    return _Address(
        Condition(COND_ADDRESS_BOUND, UNKNOWN, REASON_BINDING, f"recording this attachment on {claim_name}"),
        family=family_of(address),
        bind_claim=use,
        status=gone,
    )


def _datapath(
    observed: Observed, endpoint: EndpointCheck, resolved: bool, mode: str, family: str | None
) -> tuple[Condition, str | None]:
    """DatapathAdmitted, and the declared proxy name to render in the VM modes."""
    if mode not in MODES:
        return Condition(
            COND_DATAPATH_ADMITTED, FALSE, REASON_PROXY_NOT_DECLARED, f"unknown mode {mode!r}"
        ), None
    if mode == MODE_STANDARD:
        message = "Standard: the load balancer and kube-proxy carry the traffic"
        return Condition(COND_DATAPATH_ADMITTED, TRUE, REASON_ADMITTED, message), None
    if not resolved:
        message = f"{mode} needs the endpoint's ports and backends"
        return Condition(COND_DATAPATH_ADMITTED, UNKNOWN, REASON_ENDPOINT_UNRESOLVED, message), None
    if family is None:
        message = f"{mode} needs the address family"
        return Condition(COND_DATAPATH_ADMITTED, UNKNOWN, REASON_ADDRESS_UNBOUND, message), None
    attachment = observed.attachment
    metadata = attachment.get("metadata") or {}
    slices = _endpoint_slices(observed)
    verdict = admit(
        mode=mode,
        family=family,
        ports=endpoint.ports,
        backends=ready_backends(slices),
        service_proxies=observed.service_proxies,
        me=rank_of(attachment),
        my_service=(str(metadata.get("namespace") or ""), service_name(str(metadata.get("name") or ""))),
        others=observed.proxied_services,
        selected=selected_pods(endpoint.selector, observed.pods) | slice_pods(slices),
        selector=endpoint.selector,
    )
    status = TRUE if verdict.ok else FALSE
    return Condition(COND_DATAPATH_ADMITTED, status, verdict.reason, verdict.message), verdict.proxy_name


def _endpoint_slices(observed: Observed) -> list[Mapping[str, Any]]:
    """The EndpointSlices of the attachment's endpoint Service."""
    endpoint_name = str(((observed.attachment.get("spec") or {}).get("endpoint") or {}).get("name") or "")
    return [
        s
        for s in observed.endpoint_slices
        if labels_of(s).get(ENDPOINTSLICE_SERVICE_NAME_LABEL) == endpoint_name
    ]


def _vm_ready(
    ready: Condition, mode: str, rendered_endpoints: Mapping[str, Any] | None
) -> tuple[Condition, str | None]:
    """A VM mode is Published only when cozy-proxy has exactly one pod to program the address onto,
    by the rendered Service's v1 Endpoints (what it reads; EndpointSlices may run ahead of them):
    the message names that pod, and its backend key comes back for ``programmed_token``."""
    if mode not in VM_MODES or ready.reason != REASON_PUBLISHED:
        return ready, None
    backends = programmed_backends(rendered_endpoints)
    if not backends:
        message = (
            f"{ready.message}, but the Service's Endpoints name no ready backend pod: "
            "cozy-proxy has nothing to send its traffic to yet"
        )
        return Condition(COND_READY, FALSE, REASON_NO_READY_BACKEND, message), None
    if len(backends) > 1:
        names = ", ".join(name for _, name in backends)
        message = f"the Service's Endpoints name {len(backends)} ready backends ({names}); {mode} serves one"
        return Condition(COND_READY, FALSE, REASON_MULTIPLE_BACKENDS, message), None
    key, name = backends[0]
    message = f"{ready.message}; {mode} traffic goes to {name}"
    return Condition(COND_READY, TRUE, REASON_PUBLISHED, message), key


def _service_action(
    existing: Mapping[str, Any] | None, ours: bool, desired: Mapping[str, Any] | None
) -> tuple[ServiceAction, Mapping[str, Any] | None]:
    if existing is None:
        return (ServiceAction.CREATE if desired is not None else ServiceAction.NONE), None
    if not ours or (existing.get("metadata") or {}).get("deletionTimestamp"):
        return ServiceAction.NONE, None  # someone else's, or ours on its way out: hands off
    if desired is None:
        return ServiceAction.DELETE, None
    if needs_recreate(existing, desired):
        return ServiceAction.RECREATE, None
    patch = service_patch(existing, desired)
    return (ServiceAction.PATCH, patch) if patch else (ServiceAction.NONE, None)


def _ready(
    prerequisites: tuple[Condition, ...],
    existing: Mapping[str, Any] | None,
    ours: bool,
    action: ServiceAction,
    address: IPAddress | None,
) -> Condition:
    for condition in prerequisites:
        if condition.status != TRUE:
            return Condition(COND_READY, FALSE, condition.reason, condition.message)
    if existing is not None and not ours:
        name = (existing.get("metadata") or {}).get("name")
        return Condition(
            COND_READY,
            FALSE,
            REASON_SERVICE_NAME_CONFLICT,
            f"Service {name} exists and is not ours; left alone",
        )
    if existing is None or action in (ServiceAction.CREATE, ServiceAction.RECREATE):
        return Condition(COND_READY, FALSE, REASON_ADDRESS_PENDING, "the Service is being written")
    if (existing.get("metadata") or {}).get("deletionTimestamp"):
        return Condition(COND_READY, FALSE, REASON_ADDRESS_PENDING, "the previous Service is being deleted")
    if address is not None and address in _ingress_addresses(existing):
        return Condition(COND_READY, TRUE, REASON_PUBLISHED, f"{address} is announced")
    return Condition(
        COND_READY, FALSE, REASON_ADDRESS_PENDING, f"waiting for the load balancer to announce {address}"
    )


def _still_refused(
    context: PassContext | None,
    action: ServiceAction,
    desired: Mapping[str, Any] | None,
    patch: Mapping[str, Any] | None,
) -> tuple[ServiceRefusal | None, float | None]:
    """The API's refusal of exactly the write this pass would make (None: make it), and when a quota
    refusal is tried again."""
    refusal = context.refusal if context is not None else None
    if context is None or refusal is None or refusal.action is not action:
        return None, None
    body = desired if action is ServiceAction.CREATE else patch if action is ServiceAction.PATCH else None
    if body is None or dict(body) != dict(refusal.body):
        return None, None  # something it is rendered from changed: a new request deserves an answer
    if refusal.reason != REASON_SERVICE_QUOTA_EXCEEDED:
        return refusal, None
    remaining = context.quota_retry_seconds - (context.now - refusal.at).total_seconds()
    return (refusal, remaining) if remaining > 0 else (None, None)


def _refused_or_unannounced(
    ready: Condition,
    refused: ServiceRefusal | None,
    existing: Mapping[str, Any] | None,
    ours: bool,
    action: ServiceAction,
    context: PassContext | None,
) -> tuple[Condition, float | None]:
    """Ready as the API's refusal or the load balancer's silence past the deadline tell it, and the
    seconds until that deadline (None: no deadline runs)."""
    if refused is not None:
        verb = "create" if refused.action is ServiceAction.CREATE else "change"
        message = f"the API refused to {verb} the Service: {refused.message}"
        return Condition(COND_READY, FALSE, refused.reason, message), None
    if context is None or ready.reason != REASON_ADDRESS_PENDING or existing is None or not ours:
        return ready, None
    metadata = existing.get("metadata") or {}
    if action is ServiceAction.PATCH:
        # Changed by this very pass: the wait starts again now (and our own write wakes no one).
        return ready, context.announce_timeout_seconds
    if action is not ServiceAction.NONE or metadata.get("deletionTimestamp"):
        return ready, None
    since = _written_at(metadata.get("creationTimestamp"), context.written_at)
    if since is None:
        return ready, None
    waited = (context.now - since).total_seconds()
    timeout = context.announce_timeout_seconds
    if waited < timeout:
        return ready, timeout - waited
    annotations = metadata.get("annotations") or {}
    asked = next((str(annotations[key]) for key in _ADDRESS_ANNOTATIONS if annotations.get(key)), "?")
    lb_class = (existing.get("spec") or {}).get("loadBalancerClass")
    served_by = f"loadBalancerClass {lb_class}" if lb_class else "the default load balancer (no class)"
    message = (
        f"the load balancer has not announced {asked} within {timeout:g}s of the Service being written "
        f"at {rfc3339(since)}; asked for {asked} from {served_by}: does it serve that class, and a pool "
        "holding the address?"
    )
    return Condition(COND_READY, FALSE, REASON_ADDRESS_NOT_ANNOUNCED, message), None


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


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Kubernetes label-selector semantics (matchLabels and matchExpressions); an empty selector matches all.

    A malformed selector or unknown operator matches nothing: a hoster's restriction fails closed.
    """
    if not isinstance(selector, Mapping):
        return False
    match_labels = selector.get("matchLabels") or {}
    if not isinstance(match_labels, Mapping) or any(labels.get(k) != v for k, v in match_labels.items()):
        return False
    for expression in selector.get("matchExpressions") or ():
        if not isinstance(expression, Mapping):
            return False
        key, operator = str(expression.get("key") or ""), expression.get("operator")
        values = expression.get("values") or ()
        if operator == "In":
            ok = key in labels and labels[key] in values
        elif operator == "NotIn":
            ok = key not in labels or labels[key] not in values
        elif operator == "Exists":
            ok = key in labels
        elif operator == "DoesNotExist":
            ok = key not in labels
        else:
            return False
        if not ok:
            return False
    return True


def _address_false(
    reason: str, message: str, *, family: str | None = None, status: Mapping[str, Any] | None = None
) -> _Address:
    return _Address(Condition(COND_ADDRESS_BOUND, FALSE, reason, message), family=family, status=status or {})


def _address_unknown(reason: str, message: str, family: str | None) -> _Address:
    return _Address(Condition(COND_ADDRESS_BOUND, UNKNOWN, reason, message), family=family)


def _claim_user_uid(claim: Mapping[str, Any]) -> str | None:
    user = (claim.get("status") or {}).get("attachment") or {}
    uid = user.get("uid") if isinstance(user, Mapping) else None
    return str(uid) if uid else None


def _recorded_address(attachment: Mapping[str, Any]) -> IPAddress | None:
    try:
        return parse_address((attachment.get("status") or {}).get("address"))
    except InvalidAddress:
        return None


def _ingress_addresses(service: Mapping[str, Any]) -> set[IPAddress]:
    addresses: set[IPAddress] = set()
    for ingress in ((service.get("status") or {}).get("loadBalancer") or {}).get("ingress") or ():
        try:
            addresses.add(parse_address((ingress or {}).get("ip")))
        except InvalidAddress:
            continue
    return addresses
