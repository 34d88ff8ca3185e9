"""The planner's vocabulary: what a pass observed (``Observed``), what it knows beyond the caches
(``PassContext``), what it plans (``Plan``), and the readings of the objects every stage shares.

Decides: whether an API answer is a refusal (``refusal_of``), and what of a claim, an address or a
Service a decision reads (``claim_reading``, ``address_reading``, ``provisioning_class``...).
Does not: decide a plan (``stages``, in the order ``reconcile`` runs them), read the clock or list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Final

from operators.endpointattachment.api import (
    CLAIM_PHASE_BOUND,
    CLAIM_PHASE_LOST,
    DEFAULT_CLAIM_FAMILY,
    AttachmentSpec,
)
from operators.endpointattachment.datapath import ProxiedService
from operators.endpointattachment.reasons import (
    CONDITION_PROVISIONED,
    REASON_CLAIM_PENDING,
    REASON_NO_READY_BACKEND,
    REASON_WAITING_FOR_ADDRESS,
)
from operators.endpointattachment.render import RenderSettings
from shared.conditions import TRUE, Condition, JsonPatch, status_patch

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
    spec: AttachmentSpec | None = None  # the attachment's typed spec (None: read from it)
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


def meta_of(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return (obj or {}).get("metadata") or {}


def is_deleting(obj: Mapping[str, Any] | None) -> bool:
    return bool(meta_of(obj).get("deletionTimestamp"))


def generation_of(attachment: Mapping[str, Any]) -> int:
    value = meta_of(attachment).get("generation")
    return value if isinstance(value, int) else 0


def claim_addresses(claim: Mapping[str, Any] | None) -> list[str]:
    """The claim's bound addresses, IPv4 first (as the substrate lists them)."""
    entries = ((claim or {}).get("status") or {}).get("addresses") or []
    found = [str(e.get("address")) for e in entries if isinstance(e, Mapping) and e.get("address")]
    return sorted(found, key=lambda a: (":" in a, a))


def claim_family(claim: Mapping[str, Any]) -> str:
    family = (claim.get("spec") or {}).get("family")
    return family if isinstance(family, str) and family else DEFAULT_CLAIM_FAMILY


def claim_bound(claim: Mapping[str, Any]) -> bool:
    return (claim.get("status") or {}).get("phase") == CLAIM_PHASE_BOUND and bool(claim_addresses(claim))


def ingress_addresses(service: Mapping[str, Any]) -> set[str]:
    ingress = ((service.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
    return {str(i.get("ip")) for i in ingress if isinstance(i, Mapping) and i.get("ip")}


def pending_message(name: str, claim: Mapping[str, Any]) -> str:
    """``ClaimPending``'s words for a claim not Bound: its phase and its own words (a condition's)."""
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


def claim_reading(claim: Mapping[str, Any]) -> tuple[Any, ...]:
    """Everything of a claim a decision reads: whether it is being deleted, its family, its class
    (asked for and resolved), its phase and addresses, and, while it is not Bound, the words of its
    conditions (``ClaimPending`` repeats them). Two versions with the same reading make the same plan
    (the controller's claim predicate compares them; the substrate's stamp, its finalizer and a
    condition's timestamps are not in it)."""
    status, spec = claim.get("status") or {}, claim.get("spec") or {}
    bound = claim_bound(claim)
    return (
        is_deleting(claim),
        claim_family(claim),
        spec.get("className"),
        status.get("className"),
        status.get("phase"),
        tuple(claim_addresses(claim)),
        None if bound else pending_message("", claim),
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
    if is_deleting(claim) or status.get("phase") in (CLAIM_PHASE_BOUND, CLAIM_PHASE_LOST):
        return None
    name = status.get("className") or (claim.get("spec") or {}).get("className")
    return str(name) if name else None
