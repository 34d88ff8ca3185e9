"""The EndpointAttachment's conditions and reasons: Cozystack's vocabulary, and the few of ours.

Decides: the literal value of each condition type and reason, and of each Event reason (Cozystack's
controller's for what it did; the condition's reason for a transition), each declared with what it
means and what to do for tenants and hosters (``shared.reasons``): ``docs/hosters/conditions.md`` is
generated from these declarations. Does not: decide when any of them applies (``reconcile`` does).
"""

from __future__ import annotations

from typing import Final

from shared.conditions import FALSE, TRUE
from shared.reasons import NOTHING, TENANT, Guide

GUIDE: Final = Guide("EndpointAttachment")

# The two conditions; status.phase is a projection of them.

CONDITION_RESOLVED: Final = GUIDE.condition(
    "Resolved",
    true_means=(
        "`spec.applicationRef` names a live application (a HelmRelease of the namespace), the "
        "one this attachment first resolved to, and `spec.endpoint.serviceName` is one of its "
        "tenant-facing Services"
    ),
)

CONDITION_PROVISIONED: Final = GUIDE.condition(
    "Provisioned",
    true_means=(
        "the address works for the tenant: the claim is Bound and the load balancer announces "
        "its addresses on the rendered Service (in a VM method, one backend pod receives the "
        "traffic, named in the message)"
    ),
)

# --- Resolved --------------------------------------------------------------------------------------

REASON_RESOLVED: Final = GUIDE.reason(
    "Resolved",
    condition=CONDITION_RESOLVED,
    status=TRUE,
    meaning=(
        "The application is found, the endpoint is one of its tenant-facing Services (the "
        "message names both)."
    ),
    remedy=NOTHING,
    who=TENANT,
)

REASON_APPLICATION_NOT_FOUND: Final = GUIDE.reason(
    "ApplicationNotFound",
    condition=CONDITION_RESOLVED,
    status=FALSE,
    meaning=(
        "No HelmRelease in the namespace carries the lineage labels of `spec.applicationRef` "
        "(group, kind, name), or the one this attachment belonged to is gone."
    ),
    remedy=(
        "Check `spec.applicationRef` against the application (`kubectl get helmreleases -l "
        "apps.cozystack.io/application.name=<name>`). It is immutable: a typo means deleting the "
        "attachment and creating another. An attachment whose application was deleted is removed "
        "with it by garbage collection."
    ),
    who=TENANT,
)

REASON_APPLICATION_INCARNATION_CHANGED: Final = GUIDE.reason(
    "ApplicationIncarnationChanged",
    condition=CONDITION_RESOLVED,
    status=FALSE,
    meaning=(
        "The application was deleted and created again under the same name: the new one has "
        "another UID, and this attachment belonged to the old one. Its Service is withdrawn; "
        "garbage collection removes the attachment with the old application."
    ),
    remedy=("Create a new attachment for the new application (a recreated application inherits nothing)."),
    who=TENANT,
)

REASON_ENDPOINT_NOT_FOUND: Final = GUIDE.reason(
    "EndpointNotFound",
    condition=CONDITION_RESOLVED,
    status=FALSE,
    meaning=(
        "No Service named `spec.endpoint.serviceName` exists in the namespace. If the attachment "
        "held an address, Provisioned says `EndpointDetached`."
    ),
    remedy=(
        "Check the name (`kubectl get svc`), or wait while the application is installed: the "
        "attachment resolves when the Service appears."
    ),
    who=TENANT,
)

REASON_ENDPOINT_LINEAGE_MISMATCH: Final = GUIDE.reason(
    "EndpointLineageMismatch",
    condition=CONDITION_RESOLVED,
    status=FALSE,
    meaning=(
        "The Service exists but its lineage labels name another application (or none): it is not "
        "a Service of `spec.applicationRef`."
    ),
    remedy=(
        "Name a Service of the application the attachment refers to (`kubectl get svc -l "
        "apps.cozystack.io/application.name=<name>`)."
    ),
    who=TENANT,
)

REASON_ENDPOINT_NOT_TENANT_FACING: Final = GUIDE.reason(
    "EndpointNotTenantFacing",
    condition=CONDITION_RESOLVED,
    status=FALSE,
    meaning=(
        "The Service belongs to the application but is not one of its tenant-facing endpoints "
        '(no `internal.cozystack.io/tenantresource: "true"`), or it is itself rendered by an '
        "attachment."
    ),
    remedy=("Attach one of the application's tenant-facing Services; internal Services cannot be published."),
    who=TENANT,
)

# --- Provisioned (in the order an attachment meets them; ours are the reasons Cozystack's list has no
# word for) ----------------------------------------------------------------------------------------

REASON_PROVISIONED: Final = GUIDE.reason(
    "Provisioned",
    condition=CONDITION_PROVISIONED,
    status=TRUE,
    meaning=(
        "The claim is Bound and the load balancer announces its addresses on the rendered "
        "Service (in a VM method, the message names the pod receiving the traffic)."
    ),
    remedy=NOTHING,
    who=TENANT,
)

REASON_UNRESOLVED: Final = GUIDE.reason(
    "Unresolved",
    condition=CONDITION_PROVISIONED,
    status=FALSE,
    meaning=(
        "Nothing is claimed or rendered while Resolved is not True (the message repeats why). "
        "Our reason: Cozystack's list has no word for it."
    ),
    remedy="Act on the Resolved condition.",
    who=TENANT,
)

REASON_CLAIM_PENDING: Final = GUIDE.reason(
    "ClaimPending",
    condition=CONDITION_PROVISIONED,
    status=FALSE,
    meaning=(
        "The address is not there yet: the address substrate is not installed (its "
        "IPAddressClaim, IPAddressClass and IPAddress kinds are not served), or the claim is not "
        "Bound (the message quotes the claim's own condition: no such class, no default class, "
        "the class has no address left)."
    ),
    remedy=(
        "A hoster installs the address substrate, or fixes the class the message names "
        "(addresses, a default class). Once the claim binds, the attachment goes on by itself."
    ),
    who=TENANT,
)

REASON_CLAIM_NOT_FOUND: Final = GUIDE.reason(
    "ClaimNotFound",
    condition=CONDITION_PROVISIONED,
    status=FALSE,
    meaning=(
        "The IPAddressClaim named by `spec.loadBalancer.claimName` does not exist in the "
        "namespace (or is being deleted)."
    ),
    remedy=(
        "Create the claim (a reserved address), or check the name. It is immutable: a typo means "
        "a new attachment."
    ),
    who=TENANT,
)

REASON_CLAIM_IN_USE: Final = GUIDE.reason(
    "ClaimInUse",
    condition=CONDITION_PROVISIONED,
    status=FALSE,
    meaning=(
        "The claim's address is announced for another Service of the namespace (its IPAddress's "
        "`status.associatedTo`), or another attachment already uses the claim: a claim serves "
        "one Service at a time."
    ),
    remedy="Delete the attachment (or Service) that uses the claim now, or reference another claim.",
    who=TENANT,
)

REASON_FAMILY_CONFLICT: Final = GUIDE.reason(
    "FamilyConflict",
    condition=CONDITION_PROVISIONED,
    status=FALSE,
    meaning=("The referenced claim's family is not the `spec.loadBalancer.family` the attachment asks for."),
    remedy="Reference a claim of that family, or leave `family` out.",
    who=TENANT,
)

REASON_NOTHING_TO_PUBLISH: Final = GUIDE.reason(
    "NothingToPublish",
    condition=CONDITION_PROVISIONED,
    status=FALSE,
    meaning=(
        "The endpoint has no selector (or is ExternalName), or no port to publish: it publishes "
        "none of the ports `spec.loadBalancer.ports` asks for (the message names the asked ports "
        "it lacks and those it publishes), or a VM's endpoint has only its placeholder port "
        "65535 until the VM is exposed."
    ),
    remedy=(
        "Name ports the endpoint publishes in `spec.loadBalancer.ports` (or leave `ports` out), "
        "or, for a VM, a `method` (WholeIP forwards every port)."
    ),
    who=TENANT,
)

REASON_DATAPATH_CONTRACT_UNAVAILABLE: Final = GUIDE.reason(
    "DatapathContractUnavailable",
    condition=CONDITION_PROVISIONED,
    status=FALSE,
    meaning=(
        "A VM method (`WholeIP`, `PortList`) is asked for and the platform declares no "
        "cozy-proxy contract implementor (the operator's `--vm-datapath` is `none`), or the "
        "claim is IPv6 or Dual (cozy-proxy programs IPv4 only). Nothing is rendered."
    ),
    remedy=(
        "A hoster running cozy-proxy sets the chart value `vmDatapath: cozy-proxy` "
        "(EA_VM_DATAPATH). Otherwise leave `method` out."
    ),
    who=TENANT,
)

REASON_MULTIPLE_BACKENDS: Final = GUIDE.reason(
    "MultipleBackends",
    condition=CONDITION_PROVISIONED,
    status=FALSE,
    meaning=(
        "More than one ready backend: a VM method publishes one pod per address, so the address "
        "stays dark until one remains (the claim is kept)."
    ),
    remedy="Scale the backend to one pod, or drop the `method`.",
    who=TENANT,
)

REASON_BACKEND_ALREADY_DELEGATED: Final = GUIDE.reason(
    "BackendAlreadyDelegated",
    condition=CONDITION_PROVISIONED,
    status=FALSE,
    meaning=(
        "A pod the endpoint selects is already published by another cozy-proxy Service (the "
        "message names it): a chart's own Service wins, then the older attachment. Nothing is "
        "rendered."
    ),
    remedy="Remove the other Service or attachment, or publish another endpoint.",
    who=TENANT,
)

REASON_WAITING_FOR_ADDRESS: Final = GUIDE.reason(
    "WaitingForAddress",
    condition=CONDITION_PROVISIONED,
    status=FALSE,
    meaning=(
        "The Service is rendered and waits for the load balancer to put the claim's addresses in "
        "its ingress (seconds); or, during a burst of new claims of its class, the Service of a "
        "claim just bound waits (at most --handover-hold-seconds) until they are provisioned, as "
        "the message says."
    ),
    remedy="Wait; after the announce timeout the reason becomes AddressNotAnnounced.",
    who=TENANT,
)

REASON_ADDRESS_NOT_ANNOUNCED: Final = GUIDE.reason(
    "AddressNotAnnounced",
    condition=CONDITION_PROVISIONED,
    status=FALSE,
    meaning=(
        "The load balancer has not announced the address within the announce timeout (the "
        "message says since when and from which loadBalancerClass). Our reason."
    ),
    remedy=(
        "A hoster checks that the load balancer serves that class and that the address "
        "substrate's driver configures it (for MetalLB: its IPAddressPool for the class)."
    ),
    who=TENANT,
)

REASON_NO_READY_BACKEND: Final = GUIDE.reason(
    "NoReadyBackend",
    condition=CONDITION_PROVISIONED,
    status=FALSE,
    meaning=(
        "VM method: the address is announced, but the Service's v1 Endpoints (what cozy-proxy "
        "reads) name no ready pod yet. Our reason."
    ),
    remedy="Start the VM (or wait for it to become ready).",
    who=TENANT,
)

REASON_ENDPOINT_DETACHED: Final = GUIDE.reason(
    "EndpointDetached",
    condition=CONDITION_PROVISIONED,
    status=FALSE,
    meaning=(
        "The endpoint Service went away after the address was held: the rendered Service is "
        "withdrawn, the claim (and its address) kept. Phase Detached."
    ),
    remedy=(
        "Nothing, if the application is being updated: when the Service comes back the "
        "attachment reattaches with the same address. Delete the attachment to let the address "
        "go (a minted claim follows its class's reclaim policy)."
    ),
    who=TENANT,
)

REASON_RENDER_FAILED: Final = GUIDE.reason(
    "RenderFailed",
    condition=CONDITION_PROVISIONED,
    status=FALSE,
    meaning=(
        "The Service cannot be rendered as asked: the API refused it (quota, admission policy or "
        "webhook, validation, a namespace being deleted: the message quotes the API; a quota "
        "refusal is tried again every `--quota-retry-seconds`), a PortList port would need port "
        "translation, or a live Service's immutable field (loadBalancerClass, IP family) no "
        "longer matches its class or claim."
    ),
    remedy=(
        "Act on the message: raise the quota, fix the port's targetPort, or recreate the "
        "attachment (for an immutable field)."
    ),
    who=TENANT,
)

RESOLVED_REASONS: Final = GUIDE.reasons_of(CONDITION_RESOLVED)
PROVISIONED_REASONS: Final = GUIDE.reasons_of(CONDITION_PROVISIONED)

# --- Events (events.k8s.io/v1), posted on transitions only -----------------------------------------
EVENT_NORMAL: Final = "Normal"
EVENT_WARNING: Final = "Warning"

# What the operator did, with Cozystack's controller's reasons: a claim minted, the Service rendered
# (created), the Service withdrawn (deleted while the attachment stays).
EVENT_CLAIM_MINTED: Final = GUIDE.event(
    "ClaimMinted",
    type=EVENT_NORMAL,
    meaning="The operator minted the attachment's IPAddressClaim (the note names it and its class).",
    remedy=NOTHING,
)

EVENT_RENDERED: Final = GUIDE.event(
    "Rendered",
    type=EVENT_NORMAL,
    meaning=(
        "The operator created the LoadBalancer Service for the endpoint (the note names the "
        "Service, the endpoint and the claim)."
    ),
    remedy=NOTHING,
)

EVENT_WITHDRAWN: Final = GUIDE.event(
    "Withdrawn",
    type=EVENT_NORMAL,
    meaning=(
        "The operator deleted the rendered Service while the attachment stays (the note says "
        "why: the endpoint went away, the datapath refused it, ...); the claim is kept."
    ),
    remedy="Act on the reason in the note (see the Provisioned reasons above).",
)

# Provisioned became True, or became False for one of these reasons (named as the condition's).
EVENT_PROVISIONED: Final = GUIDE.event(
    REASON_PROVISIONED,
    type=EVENT_NORMAL,
    meaning="Provisioned became True: the address is announced on the rendered Service.",
    remedy=NOTHING,
)

EVENT_CLAIM_IN_USE: Final = GUIDE.event(
    REASON_CLAIM_IN_USE,
    type=EVENT_WARNING,
    meaning="Provisioned became False, ClaimInUse: the claim's address serves another Service.",
    remedy="See `ClaimInUse`.",
)

EVENT_FAMILY_CONFLICT: Final = GUIDE.event(
    REASON_FAMILY_CONFLICT,
    type=EVENT_WARNING,
    meaning="Provisioned became False, FamilyConflict.",
    remedy="See `FamilyConflict`.",
)

EVENT_DATAPATH_CONTRACT_UNAVAILABLE: Final = GUIDE.event(
    REASON_DATAPATH_CONTRACT_UNAVAILABLE,
    type=EVENT_WARNING,
    meaning="Provisioned became False: the VM datapath is not declared (or cannot serve the family).",
    remedy="See `DatapathContractUnavailable`.",
)

EVENT_BACKEND_ALREADY_DELEGATED: Final = GUIDE.event(
    REASON_BACKEND_ALREADY_DELEGATED,
    type=EVENT_WARNING,
    meaning=(
        "Provisioned became False: another cozy-proxy Service publishes a backend pod (the note names it)."
    ),
    remedy="See `BackendAlreadyDelegated`.",
)

EVENT_MULTIPLE_BACKENDS: Final = GUIDE.event(
    REASON_MULTIPLE_BACKENDS,
    type=EVENT_WARNING,
    meaning="Provisioned became False: more than one ready backend, the address is dark.",
    remedy="See `MultipleBackends`.",
)

EVENT_RENDER_FAILED: Final = GUIDE.event(
    REASON_RENDER_FAILED,
    type=EVENT_WARNING,
    meaning=("Provisioned became False: the Service cannot be rendered (the note quotes the API's refusal)."),
    remedy="See `RenderFailed`.",
)

EVENT_ADDRESS_NOT_ANNOUNCED: Final = GUIDE.event(
    REASON_ADDRESS_NOT_ANNOUNCED,
    type=EVENT_WARNING,
    meaning="Provisioned became False: the load balancer did not announce the address in time.",
    remedy="See `AddressNotAnnounced`.",
)
