"""The EndpointAttachment's conditions and reasons: Cozystack's vocabulary, and the few of ours.

Decides: the literal value of each condition type and reason, and of each Event reason (Cozystack's
controller's for what it did; the condition's reason for a transition). Every reason is documented for
tenants and hosters in ``docs/hosters/conditions.md`` with what to do (a unit test holds the page to
this module). Does not: decide when any of them applies (``reconcile`` does).
"""

from __future__ import annotations

from typing import Final

# The two conditions; status.phase is a projection of them.
CONDITION_RESOLVED: Final = "Resolved"
CONDITION_PROVISIONED: Final = "Provisioned"

# --- Resolved --------------------------------------------------------------------------------------
# The application and the endpoint are found and belong together.
REASON_RESOLVED: Final = "Resolved"
# No HelmRelease in the namespace carries applicationRef's lineage labels.
REASON_APPLICATION_NOT_FOUND: Final = "ApplicationNotFound"
# The application was recreated (same name, another UID): this attachment belonged to the old one.
REASON_APPLICATION_INCARNATION_CHANGED: Final = "ApplicationIncarnationChanged"
# No Service spec.endpoint.serviceName in the namespace.
REASON_ENDPOINT_NOT_FOUND: Final = "EndpointNotFound"
# The Service's lineage labels name another application (or none).
REASON_ENDPOINT_LINEAGE_MISMATCH: Final = "EndpointLineageMismatch"
# The Service is not listed by its application as tenant-facing (or is itself rendered by an
# attachment).
REASON_ENDPOINT_NOT_TENANT_FACING: Final = "EndpointNotTenantFacing"

# --- Provisioned -----------------------------------------------------------------------------------
# The claim is Bound and the rendered Service's ingress holds its addresses (VM modes: and exactly
# one ready backend receives the traffic, named in the message).
REASON_PROVISIONED: Final = "Provisioned"
# The substrate is not installed, the claim's class does not resolve, or the claim is not Bound.
REASON_CLAIM_PENDING: Final = "ClaimPending"
# The referenced claim does not exist (or is being deleted).
REASON_CLAIM_NOT_FOUND: Final = "ClaimNotFound"
# The claim's address is associated to a live Service other than ours (or another attachment uses
# the claim).
REASON_CLAIM_IN_USE: Final = "ClaimInUse"
# The referenced claim's family is not the one the attachment asks for.
REASON_FAMILY_CONFLICT: Final = "FamilyConflict"
# Nothing to mirror: no selector, no ports (a vm-instance's sentinel port alone), ExternalName.
REASON_NOTHING_TO_PUBLISH: Final = "NothingToPublish"
# A VM method is asked for and the platform declares no cozy-proxy contract implementor (or the
# contract cannot serve the claim's family).
REASON_DATAPATH_CONTRACT_UNAVAILABLE: Final = "DatapathContractUnavailable"
# More than one ready backend: the address stays dark until there is one.
REASON_MULTIPLE_BACKENDS: Final = "MultipleBackends"
# A backend pod is already published by another cozy-proxy Service (the message names the winner).
REASON_BACKEND_ALREADY_DELEGATED: Final = "BackendAlreadyDelegated"
# The rendered Service waits for the load balancer to put the claim's addresses in its ingress.
REASON_WAITING_FOR_ADDRESS: Final = "WaitingForAddress"
# The endpoint went away after an address was held: the Service is withdrawn, the claim kept.
REASON_ENDPOINT_DETACHED: Final = "EndpointDetached"
# The Service cannot be rendered as asked: the API refused it (quota, webhook, policy, validation,
# a terminating namespace; the API's message follows), a PortList port needs translation, or a live
# Service's immutable field no longer matches (recreate the attachment).
REASON_RENDER_FAILED: Final = "RenderFailed"

# --- ours: truths Cozystack's list has no word for -------------------------------------------------
# Provisioned while Resolved is not True (and no address was held): nothing is claimed or rendered
# for an attachment whose application or endpoint does not resolve.
REASON_UNRESOLVED: Final = "Unresolved"
# A VM mode with no ready backend in the v1 Endpoints cozy-proxy reads: the address is announced but
# reaches no pod yet.
REASON_NO_READY_BACKEND: Final = "NoReadyBackend"
# The load balancer has not put the address in the ingress within the announce timeout.
REASON_ADDRESS_NOT_ANNOUNCED: Final = "AddressNotAnnounced"

RESOLVED_REASONS: Final = frozenset(
    {
        REASON_RESOLVED,
        REASON_APPLICATION_NOT_FOUND,
        REASON_APPLICATION_INCARNATION_CHANGED,
        REASON_ENDPOINT_NOT_FOUND,
        REASON_ENDPOINT_LINEAGE_MISMATCH,
        REASON_ENDPOINT_NOT_TENANT_FACING,
    }
)
PROVISIONED_REASONS: Final = frozenset(
    {
        REASON_PROVISIONED,
        REASON_CLAIM_PENDING,
        REASON_CLAIM_NOT_FOUND,
        REASON_CLAIM_IN_USE,
        REASON_FAMILY_CONFLICT,
        REASON_NOTHING_TO_PUBLISH,
        REASON_DATAPATH_CONTRACT_UNAVAILABLE,
        REASON_MULTIPLE_BACKENDS,
        REASON_BACKEND_ALREADY_DELEGATED,
        REASON_WAITING_FOR_ADDRESS,
        REASON_ENDPOINT_DETACHED,
        REASON_RENDER_FAILED,
        REASON_UNRESOLVED,
        REASON_NO_READY_BACKEND,
        REASON_ADDRESS_NOT_ANNOUNCED,
    }
)

# --- Events (events.k8s.io/v1), posted on transitions only -----------------------------------------
EVENT_NORMAL: Final = "Normal"
EVENT_WARNING: Final = "Warning"
# What the operator did, with Cozystack's controller's reasons: a claim minted, the Service rendered
# (created), the Service withdrawn (deleted while the attachment stays).
EVENT_CLAIM_MINTED: Final = "ClaimMinted"
EVENT_RENDERED: Final = "Rendered"
EVENT_WITHDRAWN: Final = "Withdrawn"
# Provisioned became True, or became False for one of these reasons (named as the condition's).
EVENT_PROVISIONED: Final = REASON_PROVISIONED
EVENT_CLAIM_IN_USE: Final = REASON_CLAIM_IN_USE
EVENT_FAMILY_CONFLICT: Final = REASON_FAMILY_CONFLICT
EVENT_DATAPATH_CONTRACT_UNAVAILABLE: Final = REASON_DATAPATH_CONTRACT_UNAVAILABLE
EVENT_BACKEND_ALREADY_DELEGATED: Final = REASON_BACKEND_ALREADY_DELEGATED
EVENT_MULTIPLE_BACKENDS: Final = REASON_MULTIPLE_BACKENDS
EVENT_RENDER_FAILED: Final = REASON_RENDER_FAILED
EVENT_ADDRESS_NOT_ANNOUNCED: Final = REASON_ADDRESS_NOT_ANNOUNCED
