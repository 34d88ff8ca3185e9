"""The planner's stages, in the order ``reconcile`` runs them. Each reads what the ones before it
found and hands on its result, or ends the decision with a named exit: ``Dark`` (nothing rendered,
our Service withdrawn) or ``Untouched`` (our Service, if any, left as it is this pass).

Decides: resolve (``Resolved``, the stamps, our Service, the claim in view), publish (selector and
ports: ``NothingToPublish``), datapath (the VM modes' admission; ``MultipleBackends`` keeping a
Service of ours, withdrawn), claim (referenced or minted: ``ClaimPending``, ``ClaimNotFound``,
``FamilyConflict``, ``ClaimInUse``), service (render; create, patch or refuse; the hand-over hold),
provisioned (the ingress, the announce deadline, the backend in the VM modes).
Does not: make the plan from an exit or a rendering (``reconcile`` does), read the clock, or list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from operators.endpointattachment.api import (
    CLAIM_ANNOTATION,
    DEFAULT_CLAIM_FAMILY,
    HELMRELEASE_GROUP,
    HELMRELEASE_KIND,
    PHASE_DETACHED,
    PHASE_PENDING,
    PROGRAMMED_ANNOTATION,
    SERVICE_TYPE_EXTERNAL_NAME,
    AttachmentSpec,
    spec_of,
)
from operators.endpointattachment.datapath import (
    Verdict,
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
from operators.endpointattachment.plan import (
    Observed,
    PassContext,
    Plan,
    ServiceAction,
    ServiceRefusal,
    address_reading,
    bound_since,
    claim_addresses,
    claim_bound,
    claim_family,
    generation_of,
    ingress_addresses,
    is_deleting,
    meta_of,
    pending_message,
)
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
    immutable_mismatch,
    no_port_message,
    publish_ports,
    render_claim,
    render_service,
    service_patch,
)
from shared.conditions import FALSE, TRUE, Condition, rfc3339
from shared.lineage import labels_of
from shared.ownership import owner_reference

# The hand-over hold holds a new Service only while at least this many other claims of its class are
# being provisioned: a burst (a trickle hands over at once; see ``reconcile``'s docstring).
HANDOVER_HOLD_MIN_PROVISIONING: Final = 2
# ``ClaimPending`` while the substrate's kinds are not served.
NO_SUBSTRATE_MESSAGE: Final = (
    "the address substrate is not installed (the IPAddressClaim, IPAddressClass and IPAddress "
    "kinds are not served): ask the hoster to install it"
)


@dataclass(frozen=True)
class Dark:
    """Exit: nothing is rendered, our Service (if any) is withdrawn; ``Provisioned`` False, saying why.
    ``mint``: the claim to create first; ``status``: status keys replacing the pass's own."""

    reason: str
    message: str
    phase: str = PHASE_PENDING
    mint: Mapping[str, Any] | None = None
    recheck_after: float | None = None
    status: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Untouched:
    """Exit: our Service (if any) is left as it is this pass (its immutable fields no longer match,
    the hand-over hold, the API refused exactly this write); ``Provisioned`` False, saying why."""

    reason: str
    message: str
    recheck_after: float | None = None


@dataclass(frozen=True)
class Basis:
    """resolve's result, which every later stage reads and every plan carries: the ``Resolved``
    condition, our live Service (the oldest), the claim in view (none while the substrate is not
    served) and its addresses while Bound, the status they make, and the plan's common part (the
    generation, the stamps, the surplus claims and Services to delete)."""

    spec: AttachmentSpec
    resolution: Resolution
    resolved: Condition
    existing: Mapping[str, Any] | None
    claim: Mapping[str, Any] | None
    addresses: tuple[str, ...]
    status: Mapping[str, Any]
    common: Plan


@dataclass(frozen=True)
class Published:
    """publish's result: the endpoint's selector and the ports to publish."""

    selector: Mapping[str, str]
    ports: Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class Datapath:
    """datapath's result: what the Service renders from (``selector`` withdrawn while
    ``MultipleBackends`` keeps our Service, ``withdrawn`` then its ``Provisioned`` condition)."""

    selector: Mapping[str, str]
    ports: Sequence[Mapping[str, Any]]
    withdrawn: Condition | None = None


@dataclass(frozen=True)
class Claimed:
    """claim's result: a Bound claim no other Service uses, its name and family."""

    claim: Mapping[str, Any]
    name: str
    family: str


@dataclass(frozen=True)
class Rendering:
    """service's result: the Service rendered and what to do to ours (create, patch or nothing)."""

    desired: Mapping[str, Any]
    action: ServiceAction
    patch: Mapping[str, Any] | None


@dataclass(frozen=True)
class Rendered:
    """provisioned's result, the decision's end when no stage exits: ``Provisioned`` and the writes."""

    provisioned: Condition
    action: ServiceAction
    service: Mapping[str, Any] | None
    patch: Mapping[str, Any] | None
    programmed: str | None
    recheck_after: float | None
    restoring: bool


# --- resolve -------------------------------------------------------------------------------------


def resolve_stage(observed: Observed) -> Basis:
    """The application incarnation and the endpoint (``endpoint.resolve``), and what every plan
    carries whatever the verdict."""
    attachment = observed.attachment
    spec = observed.spec or spec_of(attachment)
    resolution = resolve(attachment, spec, observed.helmrelease, observed.endpoint)
    owner, labels = _stamps(observed, spec, resolution)
    existing = next((s for s in observed.services if not is_deleting(s)), None)
    surplus = tuple(s for s in observed.services if s is not existing and not is_deleting(s))
    claim = observed.claim if observed.substrate else None
    addresses = tuple(claim_addresses(claim)) if claim is not None and claim_bound(claim) else ()
    claim_name = spec.claim_name or (str(meta_of(claim).get("name")) if claim is not None else None)
    return Basis(
        spec=spec,
        resolution=resolution,
        resolved=Condition(
            CONDITION_RESOLVED, TRUE if resolution.ok else FALSE, resolution.reason, resolution.message
        ),
        existing=existing,
        claim=claim,
        addresses=addresses,
        status={"claimName": claim_name, "addresses": list(addresses) or None},
        common=Plan(
            generation_of(attachment),
            owner_reference=owner,
            labels=labels,
            delete_claims=tuple(observed.surplus_claims) if observed.substrate else (),
            surplus_services=surplus,
        ),
    )


def unresolved_exit(observed: Observed, basis: Basis) -> Dark:
    """resolve's exit while ``Resolved`` is not True: ``EndpointDetached`` when the endpoint is gone
    after an address was held, else ``Unresolved`` (keeping the stored claim unless one was held)."""
    # An address was held: the claim is Bound and this attachment used it (rendered a Service, or
    # reported the claim in a resolved pass). A reserved claim named by an attachment that never
    # resolved was never its.
    raw = observed.attachment.get("status")
    stored: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    claim_name = basis.status["claimName"]
    held = bool(basis.addresses) and (bool(observed.services) or stored.get("claimName") == claim_name)
    if basis.resolution.reason == REASON_ENDPOINT_NOT_FOUND and held:
        message = f"{basis.resolution.message}: the Service is withdrawn, claim {claim_name} is kept"
        return Dark(REASON_ENDPOINT_DETACHED, message, PHASE_DETACHED)
    message = f"nothing is claimed or rendered until resolved: {basis.resolution.message}"
    if held:
        return Dark(REASON_UNRESOLVED, message)
    kept = {"claimName": stored.get("claimName"), "addresses": stored.get("addresses")}
    return Dark(REASON_UNRESOLVED, message, status=kept)


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


# --- publish -------------------------------------------------------------------------------------


def publish_stage(observed: Observed, spec: AttachmentSpec) -> Published | Dark:
    """What the endpoint publishes: its selector and ``render.publish_ports``; no selector, an
    ExternalName endpoint, or no port: ``NothingToPublish``."""
    endpoint_spec = (observed.endpoint or {}).get("spec") or {}
    selector = endpoint_spec.get("selector")
    endpoint_ports = [p for p in endpoint_spec.get("ports") or [] if isinstance(p, Mapping)]
    ports = publish_ports(endpoint_ports, spec)
    if (
        endpoint_spec.get("type") == SERVICE_TYPE_EXTERNAL_NAME
        or not isinstance(selector, Mapping)
        or not selector
    ):
        return Dark(REASON_NOTHING_TO_PUBLISH, f"Service {spec.endpoint} selects no pods: nothing to publish")
    if not ports:
        return Dark(REASON_NOTHING_TO_PUBLISH, no_port_message(spec.endpoint, endpoint_ports, spec))
    return Published({str(k): str(v) for k, v in selector.items()}, ports)


# --- datapath ------------------------------------------------------------------------------------


def datapath_stage(observed: Observed, basis: Basis, published: Published) -> Datapath | Dark:
    """The VM modes (``datapath.admit``), before any claim is minted. Only the count of ready
    backends stops a live Service of ours (every other rule admits it with none counted, its pods,
    ready ones included, still its own): it is kept, its selector withdrawn."""
    if not basis.spec.vm_mode:
        return Datapath(published.selector, published.ports)
    verdict = _admit(observed, basis, published, ready_backends(observed.endpoint_slices))
    if verdict.ok:
        return Datapath(published.selector, published.ports)
    keep = (
        verdict.reason == REASON_MULTIPLE_BACKENDS
        and basis.existing is not None
        and _admit(observed, basis, published, frozenset()).ok
    )
    if not keep:
        return Dark(verdict.reason, verdict.message)
    message = (
        f"{verdict.message}: the address stays dark, Service {meta_of(basis.existing).get('name')} and "
        "its address are kept with its backends withdrawn until one remains"
    )
    uid = str(meta_of(observed.attachment).get("uid") or "")
    return Datapath(
        withdrawn_selector(published.selector, uid),
        published.ports,
        Condition(CONDITION_PROVISIONED, FALSE, verdict.reason, message),
    )


def _admit(observed: Observed, basis: Basis, published: Published, backends: frozenset[str]) -> Verdict:
    """``datapath.admit`` for these ready ``backends``, judged for the claim's family (or the one a
    mint will ask for)."""
    attachment, slices, claim = observed.attachment, observed.endpoint_slices, basis.claim
    family = claim_family(claim) if claim is not None else (basis.spec.family or DEFAULT_CLAIM_FAMILY)
    selector = published.selector
    namespace = str(meta_of(attachment).get("namespace"))
    return admit(
        mode=basis.spec.method,
        family=family,
        ports=published.ports,
        backends=backends,
        proxy_name=observed.settings.proxy_name,
        me=rank_of(attachment),
        my_service=(namespace, str(meta_of(basis.existing).get("name") or "")),
        others=observed.rivals,
        selected=selected_pods(selector, observed.pods) | slice_pods(slices) | ready_backends(slices),
        selector=selector,
    )


# --- claim ---------------------------------------------------------------------------------------


def claim_stage(observed: Observed, basis: Basis, context: PassContext | None) -> Claimed | Dark:
    """The referenced claim, or ours, or a mint: Bound and used by no other Service, or why not."""
    spec, claim = basis.spec, basis.claim
    if not observed.substrate:
        return Dark(REASON_CLAIM_PENDING, NO_SUBSTRATE_MESSAGE)
    if spec.claim_name and (claim is None or is_deleting(claim)):
        return Dark(REASON_CLAIM_NOT_FOUND, f"no IPAddressClaim {spec.claim_name} in this namespace")
    if claim is None:
        return _mint(observed.attachment, spec, context)
    if spec.claim_name and spec.family and claim_family(claim) != spec.family:
        return Dark(
            REASON_FAMILY_CONFLICT,
            f"claim {spec.claim_name} is {claim_family(claim)}, the attachment asks for {spec.family}",
        )
    name = str(meta_of(claim).get("name"))
    if not basis.addresses:
        return Dark(REASON_CLAIM_PENDING, pending_message(name, claim))
    holder = _in_use_by(observed, basis.existing)
    if holder is not None:
        return Dark(
            REASON_CLAIM_IN_USE,
            f"claim {name}'s address is in use by Service {holder}: the claim serves one Service at a time",
        )
    return Claimed(claim, name, claim_family(claim))


def _mint(attachment: Mapping[str, Any], spec: AttachmentSpec, context: PassContext | None) -> Dark:
    """No claim yet: mint one (then decide again), unless the API refused exactly this create."""
    mint = render_claim(attachment, spec)
    refused, retry = _still_refused(context, ServiceAction.MINT, mint, None)
    if refused is not None:
        message = f"the API refused to create the claim: {refused.message}"
        return Dark(REASON_RENDER_FAILED, message, recheck_after=retry)
    what = f"class {spec.class_name}" if spec.class_name else "the default class"
    return Dark(REASON_CLAIM_PENDING, f"minting a claim from {what}", mint=mint)


def _in_use_by(observed: Observed, existing: Mapping[str, Any] | None) -> str | None:
    """The other live Service the claim serves (see ``reconcile``'s docstring), None when none."""
    namespace = str(meta_of(observed.attachment).get("namespace"))
    users = {str(meta_of(s).get("name")): s for s in observed.claim_users if not is_deleting(s)}
    for address in observed.addresses:
        reading = address_reading(address)
        if reading is None or reading[2] != namespace:
            continue
        name = reading[3]
        if name in users and name != meta_of(existing).get("name"):
            return f"{namespace}/{name}"
    if existing is None and users:
        return f"{namespace}/{sorted(users)[0]}"
    return None


# --- service -------------------------------------------------------------------------------------


def service_stage(
    observed: Observed, basis: Basis, datapath: Datapath, claimed: Claimed, context: PassContext | None
) -> Rendering | Dark | Untouched:
    """The Service rendered, and whether ours is created, patched or left (see ``Untouched``)."""
    existing = basis.existing
    load_balancer_class = _load_balancer_class(observed.claim_class, existing)
    if load_balancer_class is None:
        return Dark(REASON_CLAIM_PENDING, _classless_message(claimed.name, claimed.claim))
    desired = render_service(
        observed.attachment,
        basis.spec,
        claim_name=claimed.name,
        family=claimed.family,
        selector=datapath.selector,
        ports=datapath.ports,
        load_balancer_class=load_balancer_class,
        settings=observed.settings,
    )
    if existing is None:
        hold = _handover_hold(observed, claimed.claim, context)
        if hold is not None:
            return Untouched(REASON_WAITING_FOR_ADDRESS, hold[0], hold[1])
        action, patch = ServiceAction.CREATE, None
    else:
        mismatch = immutable_mismatch(existing, desired)
        if mismatch is not None:
            name = meta_of(existing).get("name")
            message = f"Service {name}: {mismatch}; recreate the attachment to render it again"
            return Untouched(REASON_RENDER_FAILED, message)
        patch = service_patch(existing, desired)
        action = ServiceAction.NONE if patch is None else ServiceAction.PATCH
    refused, recheck_after = _still_refused(context, action, desired, patch)
    if refused is not None:
        verb = "create" if refused.action is ServiceAction.CREATE else "change"
        message = f"the API refused to {verb} the Service: {refused.message}"
        return Untouched(REASON_RENDER_FAILED, message, recheck_after)
    return Rendering(desired, action, patch)


def _load_balancer_class(
    claim_class: Mapping[str, Any] | None, existing: Mapping[str, Any] | None
) -> str | None:
    """The class's ``loadBalancerClass``; the class gone after rendering: the live Service's (it cannot
    change); None: not rendered before the class is observed."""
    if claim_class is not None:
        return str((claim_class.get("spec") or {}).get("loadBalancerClass") or "")
    if existing is None:
        return None
    return str((existing.get("spec") or {}).get("loadBalancerClass") or "")


def _classless_message(name: str, claim: Mapping[str, Any]) -> str:
    status, spec = claim.get("status") or {}, claim.get("spec") or {}
    class_name = status.get("className") or spec.get("className") or "(none named)"
    return (
        f"claim {name} is Bound, but its IPAddressClass {class_name} is not found: the Service's "
        "loadBalancerClass, which cannot change once it exists, is read from the class first"
    )


def _handover_hold(
    observed: Observed, claim: Mapping[str, Any], context: PassContext | None
) -> tuple[str, float] | None:
    """(why, seconds left) while the new Service waits for the class's provisioning (see
    ``reconcile``'s docstring); None: create it now."""
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
        f"claim {meta_of(claim).get('name')} is Bound; its Service waits (at most "
        f"{context.handover_hold_seconds:g}s) while {observed.provisioning} other claim(s) of class "
        f"{class_name} are being provisioned, so that MetalLB does not give the address to one of them",
        left,
    )


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


# --- provisioned ---------------------------------------------------------------------------------


def provisioned_stage(
    observed: Observed, basis: Basis, datapath: Datapath, rendering: Rendering, context: PassContext | None
) -> Rendered:
    """``Provisioned`` once our Service is written: the ingress, the announce deadline, the backend
    (VM modes); a withdrawn Service stays dark, and a patch putting its backends back is restoring."""
    existing, action = basis.existing, rendering.action
    provisioned, programmed, recheck_after = _provisioned(
        basis.spec, existing, action, basis.addresses, observed.rendered_endpoints, context
    )
    if datapath.withdrawn is not None:
        provisioned, programmed = datapath.withdrawn, None
    # The patch puts the withdrawn backends back: their Endpoints answer within moments.
    restoring = (
        action is ServiceAction.PATCH
        and datapath.withdrawn is None
        and existing is not None
        and is_withdrawn((existing.get("spec") or {}).get("selector"))
    )
    return Rendered(
        provisioned=provisioned,
        action=action,
        service=rendering.desired if action is ServiceAction.CREATE else existing,
        patch=rendering.patch,
        programmed=programmed,
        recheck_after=recheck_after,
        restoring=restoring,
    )


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
    if existing is None or action is ServiceAction.CREATE:
        return (
            Condition(
                CONDITION_PROVISIONED, FALSE, REASON_WAITING_FOR_ADDRESS, "the Service is being written"
            ),
            None,
            None,
        )
    name = meta_of(existing).get("name")
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
    listed = ", ".join(addresses)
    if not spec.vm_mode:
        message = f"{listed} announced for Service {name}"
        return Condition(CONDITION_PROVISIONED, TRUE, REASON_PROVISIONED, message), None, None
    condition, programmed = _programmed(spec, existing, listed, rendered_endpoints)
    return condition, programmed, None


def _programmed(
    spec: AttachmentSpec,
    existing: Mapping[str, Any],
    listed: str,
    rendered_endpoints: Mapping[str, Any] | None,
) -> tuple[Condition, str | None]:
    """VM modes, the address announced: exactly one ready backend in the Service's v1 Endpoints (what
    cozy-proxy reads), and the PROGRAMMED token naming it when ours differs."""
    name = meta_of(existing).get("name")
    backends = programmed_backends(rendered_endpoints)
    if not backends:
        message = (
            f"{listed} is announced, but Service {name}'s Endpoints name no ready backend pod: "
            "cozy-proxy has nothing to send its traffic to yet"
        )
        return Condition(CONDITION_PROVISIONED, FALSE, REASON_NO_READY_BACKEND, message), None
    if len(backends) > 1:
        names = ", ".join(label for _, label in backends)
        message = (
            f"Service {name}'s Endpoints name {len(backends)} ready backends ({names}); "
            f"{spec.method} serves one"
        )
        return Condition(CONDITION_PROVISIONED, FALSE, REASON_MULTIPLE_BACKENDS, message), None
    key, label = backends[0]
    token = programmed_token(listed, key)
    annotations = meta_of(existing).get("annotations") or {}
    programmed = token if annotations.get(PROGRAMMED_ANNOTATION) != token else None
    message = f"{listed} announced for Service {name}; {spec.method} traffic goes to {label}"
    return Condition(CONDITION_PROVISIONED, TRUE, REASON_PROVISIONED, message), programmed


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
