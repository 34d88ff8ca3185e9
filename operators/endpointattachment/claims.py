"""One IPAddressClaim, what is observed about it -> a plan: its status, and the allocation to mint or release.

A claim is a tenant's reserved address. This module decides the lifecycle of that reservation on its
own, whoever uses it:

- Bound: an IPAddressAllocation whose holder UID is the claim's (``held_address``, found by the glue)
  holds the address. ``status.address`` is that address; it is written only once held, so a recorded
  address always means "this claim held it once".
- Pending, never held: the plan asks the glue to mint (create the allocation for) ``spec.address`` when
  given, or else the first free candidate walking from the claim's offset (``addresses.start_offset``:
  concurrent minters start apart; the allocation name is the real lock). A requested address must parse
  strictly (``AddressInvalid``), be a candidate of the class: in its cidrs or ranges and not excluded
  (``AddressNotInClass``, added), and be free (``AddressInUse``). No free candidate: ``PoolExhausted``.
  On a 409 the glue reads the existing allocation: held by this UID it is ours, else it reconciles again
  with that address counted as taken (the same protocol as attachments).
- The class must exist (``ClassNotFound``), be well formed (``ClassInvalid``: a pool or provider an
  attachment could not use either) and admit the claim's namespace through ``allowedNamespaces``
  (``NamespaceNotAllowed``; ``reconcile.selector_matches``, failing closed).
- Lost: the claim held an address, its allocation has vanished, and another holder has it now. The claim
  never silently moves to a different address. Lost is not final: if that address becomes free again,
  the claim takes it back (what a tenant who reserved it wants), and is Bound again.
- Re-lock: the claim held an address, its allocation has vanished, and the address is free: the plan
  mints the same address again, without re-checking it against the class's pool (a hoster's edit to the
  ranges never takes a tenant's address away, as for attachments). While the lock is being re-taken,
  or cannot be because the class is now gone or refuses the namespace, ``phase`` and ``address`` are
  left as stored: a lost lock does not make the claim's phase flap and its users go dark for one pass.
- A held address stays held whatever the class says later. Ready is then False with the class's reason
  (an attachment binding the claim would stay dark for the same reason), and AddressBound stays True.
- A held address stays held whatever ``spec.address`` says later, too: a ``spec.address`` added or
  changed after the claim bound another address (the CRD refuses that now; objects admitted before,
  or under an older CRD, may carry it) is Ready False ``AddressMismatch``, naming both addresses. The
  claim stays Bound and its users keep the address: a reservation never moves under them. A
  ``spec.address`` that does not parse counts as a mismatch too.
- Conditions: ``AddressBound`` and ``Ready`` (False copies the first failing reason; True is
  ``Reserved``). Status fields: ``phase`` and ``address`` only. ``status.attachment``, the claim's user,
  is never written here: reconcile.py's glue records and clears it.
- Deletion (``finalize_claim``): while ``status.attachment`` records a user, nothing happens and Ready
  says ``InUse`` (the design: a claim cannot be deleted while an attachment uses it). Once free, the
  claim's allocation is released, and only when no allocation is observed any more may the finalizer go,
  so a failed delete can never leave an address locked for a claim that no longer exists.

Does not: perform any of it, read the clock (``now`` is passed to ``status_patch``), list anything, or
decide whether the recorded user still exists: a user record left behind by an attachment deleted
without its finalizer holds the claim until the glue (which sees the attachments) clears it.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from typing import Any, Final

from operators.endpointattachment.addresses import (
    AddressPool,
    Holder,
    InvalidAddress,
    InvalidPool,
    IPAddress,
    allocation_manifest,
    allocation_name,
    first_free,
    parse_address,
    pool_of,
    start_offset,
)
from operators.endpointattachment.constants import (
    CLAIM_PHASE_BOUND,
    CLAIM_PHASE_LOST,
    CLAIM_PHASE_PENDING,
    COND_ADDRESS_BOUND,
    COND_READY,
    IP_ADDRESS_CLAIM_KIND,
    REASON_ADDRESS_IN_USE,
    REASON_ADDRESS_MISMATCH,
    REASON_CLASS_INVALID,
    REASON_CLASS_NOT_FOUND,
    REASON_MINTED,
    REASON_MINTING,
    REASON_NAMESPACE_NOT_ALLOWED,
    REASON_POOL_EXHAUSTED,
)
from operators.endpointattachment.reconcile import MintRequest, selector_matches
from operators.endpointattachment.render import InvalidClassSettings, class_settings
from shared.conditions import FALSE, TRUE, UNKNOWN, Condition, JsonPatch, status_patch

# --- Claim-only reasons (the ones shared with attachments live in constants.py) ---------------------

# AddressBound False: spec.address is not an address we accept (the strict rules of addresses.py).
REASON_ADDRESS_INVALID: Final = "AddressInvalid"
# AddressBound False: spec.address is outside the class's cidrs and ranges, of the other family, or
# excluded (explicitly, or as a network/broadcast address): it can never be minted from this class.
REASON_ADDRESS_NOT_IN_CLASS: Final = "AddressNotInClass"
# Ready True: the address is held and its class admits the namespace, so an attachment may bind it.
REASON_RESERVED: Final = "Reserved"
# Ready False while being deleted: an attachment still uses the claim, so its finalizer holds it.
REASON_IN_USE: Final = "InUse"
# Ready False while being deleted: no attachment uses it any more; its allocation is being released.
REASON_RELEASING: Final = "Releasing"


@dataclass(frozen=True)
class ClaimPlan:
    """What should be for one claim; an empty status patch and no actions means a quiet pass."""

    generation: int
    conditions: tuple[Condition, ...] = ()
    # Top-level status keys to set (None removes the key; keys absent here are left as stored).
    status: Mapping[str, Any] = field(default_factory=dict)
    # Create this allocation; the glue reconciles again afterwards (or after a 409).
    mint: MintRequest | None = None
    # Deletion only: the allocation (by name) to delete, and whether the finalizer may go now.
    release_allocation: str | None = None
    remove_finalizer: bool = False

    @property
    def ready(self) -> bool:
        return any(c.type == COND_READY and c.status == TRUE for c in self.conditions)

    def status_patch(self, stored_status: Mapping[str, Any] | None, now: str) -> JsonPatch:
        """The JSON patch that stores this plan's status; empty when nothing changes.

        Also empty when the finalizer goes (the object is about to vanish) and for a plan that says
        nothing at all.
        """
        if self.remove_finalizer or not (self.conditions or self.status):
            return []
        return status_patch(stored_status, self.status, self.conditions, self.generation, now)


def reconcile_claim(
    claim: Mapping[str, Any],
    address_class: Mapping[str, Any] | None,
    held_address: str | None,
    taken_addresses: Set[str],
    namespace_labels: Mapping[str, str],
) -> ClaimPlan:
    """The plan for one pass over one claim (a claim being deleted gets ``finalize_claim``'s plan).

    - ``address_class``: the IPAddressClass named by ``spec.className`` (None when it does not exist).
    - ``held_address``: the address of the IPAddressAllocation whose holder UID is this claim's.
    - ``taken_addresses``: canonical text of every allocated address (any class, any holder).
    - ``namespace_labels``: the labels of the claim's namespace.
    """
    metadata = claim.get("metadata") or {}
    held = _parse(held_address)
    if metadata.get("deletionTimestamp"):
        return finalize_claim(claim, allocation_name(held) if held is not None else None)
    generation = int(metadata.get("generation") or 0)
    class_name = str((claim.get("spec") or {}).get("className") or "")
    found = _class(address_class, class_name, str(metadata.get("namespace") or ""), namespace_labels)

    if held is not None:
        return _bound(generation, held, class_name, found, (claim.get("spec") or {}).get("address"))
    recorded = _parse((claim.get("status") or {}).get("address"))
    if recorded is not None and str(recorded) in taken_addresses:
        lost = _false(REASON_ADDRESS_IN_USE, f"{recorded}, reserved by this claim, is now held by another")
        return _plan(generation, lost, {"phase": CLAIM_PHASE_LOST})
    # A claim that held an address keeps its stored phase and address until it holds one again.
    status: Mapping[str, Any] = (
        {} if recorded is not None else {"phase": CLAIM_PHASE_PENDING, "address": None}
    )
    if isinstance(found, Condition):
        return _plan(generation, found, status)
    choice = recorded if recorded is not None else _choose(claim, found, class_name, taken_addresses)
    if isinstance(choice, Condition):
        return _plan(generation, choice, status)
    holder = Holder(
        kind=IP_ADDRESS_CLAIM_KIND,
        namespace=str(metadata.get("namespace") or ""),
        name=str(metadata.get("name") or ""),
        uid=str(metadata.get("uid") or ""),
    )
    minting = Condition(COND_ADDRESS_BOUND, UNKNOWN, REASON_MINTING, f"allocating {choice} from {class_name}")
    mint = MintRequest(address=str(choice), allocation=allocation_manifest(choice, class_name, holder))
    return _plan(generation, minting, status, mint=mint)


def finalize_claim(claim: Mapping[str, Any], held_allocation_name: str | None) -> ClaimPlan:
    """The plan for a claim being deleted: hold while used, then release the allocation, then let go.

    ``held_allocation_name``: the name of the IPAddressAllocation whose holder UID is this claim's.
    """
    generation = int((claim.get("metadata") or {}).get("generation") or 0)
    user = _user(claim)
    if user is not None:
        message = f"attachment {user} uses this claim; deletion waits until it no longer does"
        return ClaimPlan(generation, (Condition(COND_READY, FALSE, REASON_IN_USE, message),))
    if held_allocation_name:
        message = f"deleting: releasing IPAddressAllocation {held_allocation_name}"
        return ClaimPlan(
            generation,
            (Condition(COND_READY, FALSE, REASON_RELEASING, message),),
            release_allocation=held_allocation_name,
        )
    return ClaimPlan(generation, remove_finalizer=True)


def _class(
    address_class: Mapping[str, Any] | None,
    class_name: str,
    namespace: str,
    namespace_labels: Mapping[str, str],
) -> AddressPool | Condition:
    """The class's pool, or the AddressBound failure that keeps the claim from minting from it."""
    if not class_name:
        return _false(REASON_CLASS_NOT_FOUND, "spec.className is empty")
    if address_class is None or (address_class.get("metadata") or {}).get("name") != class_name:
        return _false(REASON_CLASS_NOT_FOUND, f"IPAddressClass {class_name} not found")
    spec = address_class.get("spec") or {}
    try:
        pool = pool_of(spec)
        # Only attachments render, but a provider they cannot use makes the class unusable for claims too.
        class_settings(address_class)
    except (InvalidPool, InvalidClassSettings) as error:
        return _false(REASON_CLASS_INVALID, f"IPAddressClass {class_name}: {error}")
    selector = spec.get("allowedNamespaces")
    if selector is not None and not selector_matches(selector, namespace_labels):
        return _false(
            REASON_NAMESPACE_NOT_ALLOWED, f"IPAddressClass {class_name} does not admit namespace {namespace}"
        )
    return pool


def _choose(
    claim: Mapping[str, Any], pool: AddressPool, class_name: str, taken: Set[str]
) -> IPAddress | Condition:
    """The address to mint for a claim that never held one, or why there is none."""
    requested = (claim.get("spec") or {}).get("address")
    if requested is not None:
        return _requested(requested, pool, class_name, taken)
    uid = str((claim.get("metadata") or {}).get("uid") or "")
    choice = first_free(pool.candidates(start_offset(pool, uid)), taken)
    if choice is None:
        return _false(REASON_POOL_EXHAUSTED, f"all {pool.capacity} addresses of {class_name} are allocated")
    return choice


def _requested(
    requested: object, pool: AddressPool, class_name: str, taken: Set[str]
) -> IPAddress | Condition:
    """``spec.address``, if it can be minted from the class now."""
    try:
        address = parse_address(requested)
    except InvalidAddress as error:
        return _false(REASON_ADDRESS_INVALID, f"spec.address: {error}")
    if not pool.contains(address):
        excluded = address.version == pool.version and int(address) in pool.excluded
        where = "is excluded from" if excluded else "is not in the pool of"
        return _false(REASON_ADDRESS_NOT_IN_CLASS, f"{address} {where} IPAddressClass {class_name}")
    if str(address) in taken:
        return _false(REASON_ADDRESS_IN_USE, f"{address} is held by another")
    return address


def _bound(
    generation: int, held: IPAddress, class_name: str, found: AddressPool | Condition, requested: object
) -> ClaimPlan:
    """A claim that holds its address: Bound, and Ready unless the class now refuses it or its
    ``spec.address`` names another address."""
    bound = Condition(COND_ADDRESS_BOUND, TRUE, REASON_MINTED, f"{held} is held for this claim")
    if requested is not None and _parse(requested) != held:
        message = (
            f"spec.address {requested} is not {held}, the address this claim holds; the claim keeps "
            f"{held} (to reserve {requested}, create another claim)"
        )
        ready = Condition(COND_READY, FALSE, REASON_ADDRESS_MISMATCH, message)
    elif isinstance(found, Condition):
        ready = Condition(COND_READY, FALSE, found.reason, f"{held} is held, but {found.message}")
    else:
        ready = Condition(COND_READY, TRUE, REASON_RESERVED, f"{held} is reserved in {class_name}")
    return ClaimPlan(generation, (bound, ready), status={"phase": CLAIM_PHASE_BOUND, "address": str(held)})


def _plan(
    generation: int, address_bound: Condition, status: Mapping[str, Any], mint: MintRequest | None = None
) -> ClaimPlan:
    """A plan for a claim that does not hold its address: Ready is False for AddressBound's reason."""
    ready = Condition(COND_READY, FALSE, address_bound.reason, address_bound.message)
    return ClaimPlan(generation, (address_bound, ready), status=status, mint=mint)


def _false(reason: str, message: str) -> Condition:
    return Condition(COND_ADDRESS_BOUND, FALSE, reason, message)


def _parse(text: object) -> IPAddress | None:
    try:
        return parse_address(text)
    except InvalidAddress:
        return None


def _user(claim: Mapping[str, Any]) -> str | None:
    """Who ``status.attachment`` records as the claim's user (its name, else its UID), if anyone.

    A record with a name but no UID still counts: holding a claim too long is safer than deleting it
    from under an attachment.
    """
    user = (claim.get("status") or {}).get("attachment")
    if not isinstance(user, Mapping):
        return None
    label = user.get("name") or user.get("uid")
    return str(label) if label else None
