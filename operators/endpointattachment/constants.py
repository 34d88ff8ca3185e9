"""Every name the EndpointAttachment operator reads or writes: API group, kinds, labels, annotations,
modes, providers, condition types and reasons.

Decides: the literal value of each name, defined once, with why it has that value.

Does not: decide when any of them applies (that is the other pure modules' job). Cozystack's lineage
labels live in ``shared.lineage``, because the GPUClass operator reads them too.
"""

from __future__ import annotations

from typing import Final

# --- API -------------------------------------------------------------------------------------------

# The CRD-served half of the sdn family: CRDs (not the aggregated API) so stock ResourceQuota object
# counts work and garbage collection sees our kinds.
GROUP: Final = "local.sdn.cozystack.io"
# Alpha until the address substrate has run in a real hoster's cluster.
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

# Tenant-written: attaches one address to one tenant-facing Service.
ENDPOINT_ATTACHMENT_KIND: Final = "EndpointAttachment"
ENDPOINT_ATTACHMENT_PLURAL: Final = "endpointattachments"
# Tenant-written: a reserved address that outlives any attachment.
IP_ADDRESS_CLAIM_KIND: Final = "IPAddressClaim"
IP_ADDRESS_CLAIM_PLURAL: Final = "ipaddressclaims"
# Hoster-written: a pool of addresses and how the load balancer learns one.
IP_ADDRESS_CLASS_KIND: Final = "IPAddressClass"
IP_ADDRESS_CLASS_PLURAL: Final = "ipaddressclasses"
# Operator-written: named by its address, so creating one is the lock that makes minting race-free.
IP_ADDRESS_ALLOCATION_KIND: Final = "IPAddressAllocation"
IP_ADDRESS_ALLOCATION_PLURAL: Final = "ipaddressallocations"
# Platform-written: declares that a datapath proxy runs, which modes and families it serves.
SERVICE_PROXY_KIND: Final = "ServiceProxy"
SERVICE_PROXY_PLURAL: Final = "serviceproxies"

# Cozystack's application object: its UID is the application's UID, owner references point at it.
HELMRELEASE_GROUP: Final = "helm.toolkit.fluxcd.io"
HELMRELEASE_VERSION: Final = "v2"
HELMRELEASE_API_VERSION: Final = f"{HELMRELEASE_GROUP}/{HELMRELEASE_VERSION}"
HELMRELEASE_KIND: Final = "HelmRelease"
HELMRELEASE_PLURAL: Final = "helmreleases"

# The core objects we render and read.
SERVICE_API_VERSION: Final = "v1"
SERVICE_KIND: Final = "Service"
# Services of type ExternalName have no selector and no endpoints: nothing to mirror.
SERVICE_TYPE_EXTERNAL_NAME: Final = "ExternalName"
# The only type that makes the load balancer announce an address.
SERVICE_TYPE_LOAD_BALANCER: Final = "LoadBalancer"
# Local keeps the client source address and lets cozy-proxy see the real peer.
EXTERNAL_TRAFFIC_POLICY_LOCAL: Final = "Local"
# One address, one family: the rendered Service never becomes dual-stack behind the tenant's back.
IP_FAMILY_POLICY_SINGLE_STACK: Final = "SingleStack"
IP_FAMILY_V4: Final = "IPv4"
IP_FAMILY_V6: Final = "IPv6"
# The API server defaults a port's protocol to TCP; we spell it out so comparisons match.
PROTOCOL_TCP: Final = "TCP"
PROTOCOL_UDP: Final = "UDP"
# EndpointSlices name their Service with this standard label; the glue lists an endpoint's slices by it.
ENDPOINTSLICE_SERVICE_NAME_LABEL: Final = "kubernetes.io/service-name"
# An EndpointSlice targetRef of this kind carries the backend pod's UID.
POD_KIND: Final = "Pod"
# Pods in these phases are done: never selected as a backend again (the Pod cache leaves them out).
POD_PHASE_SUCCEEDED: Final = "Succeeded"
POD_PHASE_FAILED: Final = "Failed"

# --- Labels and annotations on the rendered Service ------------------------------------------------

# Names the attachment that rendered a Service, for listing only; anyone can write a label, so it is
# never proof of ownership (the controller owner reference is).
ATTACHMENT_LABEL: Final = "local.sdn.cozystack.io/endpoint-attachment"
# cozy-proxy handles only Services with this label set to its name, and kube-proxy skips every Service
# that carries it, whatever the value: set only in the VM modes, with the declared proxy name.
SERVICE_PROXY_NAME_LABEL: Final = "service.kubernetes.io/service-proxy-name"
# cozy-proxy: "true" forwards every port to the backend (WholeIP); "false" only spec.ports (PortList).
WHOLE_IP_ANNOTATION: Final = "networking.cozystack.io/wholeIP"
# cozy-proxy: "true" also accepts ICMP in port-list mode.
ALLOW_ICMP_ANNOTATION: Final = "networking.cozystack.io/allowICMP"
# MetalLB reads the address to announce from this annotation (spec.loadBalancerIP is deprecated).
METALLB_IPS_ANNOTATION: Final = "metallb.io/loadBalancerIPs"
# MetalLB: which of its pools the address comes from, when the class names one.
METALLB_POOL_ANNOTATION: Final = "metallb.io/address-pool"
# Cilium LB-IPAM reads the requested address from this annotation.
CILIUM_IPS_ANNOTATION: Final = "lbipam.cilium.io/ips"
# Ours, written on a proxied Service that shares pods with one of ours we just deleted or changed
# (the survivor: an attachment's Service or a chart's own): cozy-proxy re-programs a Service on every
# update of it, and its deletes clear the pod's entries whoever owns them, so the survivor must be
# programmed again. The value names the change (namespace/name/uid/resourceVersion of our Service),
# so a repeated pass writes nothing. Never among OWNED_ANNOTATIONS: no pass compares or removes it.
REPROGRAM_ANNOTATION: Final = "local.sdn.cozystack.io/reprogrammed-after"
# Annotation values are strings; cozy-proxy compares to these literals.
# Ours, on our own VM-mode Service: set (once per address and backend) when the Service has both its
# address and a ready backend in its v1 Endpoints. cozy-proxy programs a Service whose address came a
# few milliseconds before its Endpoints with no backend and does not come back to it; an update of
# the Service makes it program again. Not in OWNED_ANNOTATIONS: the render never removes it.
PROGRAMMED_ANNOTATION: Final = "local.sdn.cozystack.io/programmed-backend"
ANNOTATION_TRUE: Final = "true"
ANNOTATION_FALSE: Final = "false"

# Every label and annotation key we write on a rendered Service: the only keys we ever compare,
# patch or remove there, so other writers' keys survive our passes.
OWNED_LABELS: Final = frozenset({ATTACHMENT_LABEL, SERVICE_PROXY_NAME_LABEL})
OWNED_ANNOTATIONS: Final = frozenset(
    {
        WHOLE_IP_ANNOTATION,
        ALLOW_ICMP_ANNOTATION,
        METALLB_IPS_ANNOTATION,
        METALLB_POOL_ANNOTATION,
        CILIUM_IPS_ANNOTATION,
    }
)

# Rendered Services are named this prefix plus the attachment name: recognisable in `kubectl get svc`.
SERVICE_NAME_PREFIX: Final = "ea-"
# DNS-1035 label length limit for Service names (and label values share it).
MAX_NAME_LENGTH: Final = 63

# --- Modes and providers ---------------------------------------------------------------------------

# The load balancer plus kube-proxy carry the traffic; no proxy declaration needed.
MODE_STANDARD: Final = "Standard"
# cozy-proxy forwards only the listed ports, without port translation (vm-instance's name for it).
MODE_PORT_LIST: Final = "PortList"
# cozy-proxy forwards every port and SNATs the backend's egress to the address.
MODE_WHOLE_IP: Final = "WholeIP"
DEFAULT_MODE: Final = MODE_STANDARD
# The modes that hand the Service to a declared datapath proxy instead of kube-proxy.
VM_MODES: Final = frozenset({MODE_PORT_LIST, MODE_WHOLE_IP})
MODES: Final = frozenset({MODE_STANDARD, *VM_MODES})
# PortList accepts ICMP unless the tenant says otherwise (the design's default).
DEFAULT_ALLOW_ICMP: Final = True

# MetalLB announces the address named in its annotation.
PROVIDER_METALLB: Final = "MetalLB"
# Cilium LB-IPAM assigns the address named in its annotation.
PROVIDER_CILIUM: Final = "CiliumLBIPAM"
# A class that names no provider is MetalLB's, Cozystack's default load balancer.
DEFAULT_PROVIDER: Final = PROVIDER_METALLB
PROVIDERS: Final = frozenset({PROVIDER_METALLB, PROVIDER_CILIUM})

# A ServiceProxy that lists no families serves IPv4: cozy-proxy is IPv4 only.
DEFAULT_PROXY_FAMILIES: Final = frozenset({IP_FAMILY_V4})

# Claim phases (written by the claim reconciler, read here).
CLAIM_PHASE_PENDING: Final = "Pending"
CLAIM_PHASE_BOUND: Final = "Bound"
CLAIM_PHASE_LOST: Final = "Lost"

# --- Condition types -------------------------------------------------------------------------------

# The endpoint is a tenant-facing Service of a live application, and that application is ours.
COND_ENDPOINT_RESOLVED: Final = "EndpointResolved"
# The attachment holds an address (minted from its class or bound from its claim).
COND_ADDRESS_BOUND: Final = "AddressBound"
# The datapath accepts this Service (always in Standard; the declared proxy's rules in VM modes).
COND_DATAPATH_ADMITTED: Final = "DatapathAdmitted"
# The load balancer reports the bound address on the rendered Service.
COND_READY: Final = "Ready"
CONDITION_TYPES: Final = (COND_ENDPOINT_RESOLVED, COND_ADDRESS_BOUND, COND_DATAPATH_ADMITTED, COND_READY)

# --- EndpointResolved reasons ----------------------------------------------------------------------

# True: the endpoint passed every check and its application is the one we are bound to.
REASON_RESOLVED: Final = "Resolved"
# No Service of that name in the attachment's namespace.
REASON_ENDPOINT_NOT_FOUND: Final = "EndpointNotFound"
# The Service lacks lineage or the tenant-facing marker, or was itself rendered by an attachment.
REASON_ENDPOINT_NOT_TENANT_FACING: Final = "EndpointNotTenantFacing"
# The Service has no selector to mirror (empty selector, or type ExternalName).
REASON_ENDPOINT_HAS_NO_SELECTOR: Final = "EndpointHasNoSelector"
# The Service lists no ports: a LoadBalancer Service needs at least one (design silent; added).
REASON_ENDPOINT_HAS_NO_PORTS: Final = "EndpointHasNoPorts"
# No HelmRelease carries the endpoint's lineage labels (or the one we were bound to is gone).
REASON_APPLICATION_NOT_FOUND: Final = "ApplicationNotFound"
# The HelmRelease found has another UID: the app was recreated, this attachment belongs to the old one.
REASON_APPLICATION_MISMATCH: Final = "ApplicationMismatch"

# --- AddressBound reasons --------------------------------------------------------------------------

# True: the address was minted from the class and is held by this attachment's allocation.
REASON_MINTED: Final = "Minted"
# True: the address is the claim's, and the claim records this attachment as its user.
REASON_CLAIM_BOUND: Final = "ClaimBound"
# Unknown: an allocation is being created for the chosen address (the glue reconciles again after).
REASON_MINTING: Final = "Minting"
# Unknown: this attachment is being recorded as the claim's user (the glue reconciles again after).
REASON_BINDING: Final = "Binding"
# Unknown: no address is acquired until the endpoint resolves to its application, so typos and
# leftovers of a deleted application never drain a pool or block a claim.
REASON_ENDPOINT_UNRESOLVED: Final = "EndpointUnresolved"
# The class the address comes from does not exist.
REASON_CLASS_NOT_FOUND: Final = "ClassNotFound"
# The class is malformed (bad CIDR or range, mixed families, unknown provider): design silent; added
# so a hoster's typo is not reported as an exhausted pool.
REASON_CLASS_INVALID: Final = "ClassInvalid"
# The claim does not exist in the attachment's namespace (or is being deleted).
REASON_CLAIM_NOT_FOUND: Final = "ClaimNotFound"
# The claim is not Bound (Pending or Lost): it has no address to lend (design silent; added).
REASON_CLAIM_NOT_BOUND: Final = "ClaimNotBound"
# The claim's address is used by another attachment (at most one user at a time).
REASON_CLAIM_IN_USE: Final = "ClaimInUse"
# Every candidate address of the class is allocated.
REASON_POOL_EXHAUSTED: Final = "PoolExhausted"
# The address this attachment had was lost and is now held by someone else.
REASON_ADDRESS_IN_USE: Final = "AddressInUse"
# The class's allowedNamespaces selector does not match the attachment's namespace.
REASON_NAMESPACE_NOT_ALLOWED: Final = "NamespaceNotAllowed"

# --- DatapathAdmitted reasons ----------------------------------------------------------------------

# True: Standard mode, or the declared proxy accepts the mode, family, ports and backends.
REASON_ADMITTED: Final = "Admitted"
# Unknown: a VM mode needs the address's family, and no address or class tells it yet.
REASON_ADDRESS_UNBOUND: Final = "AddressUnbound"
# No ServiceProxy declares the mode (or the mode is unknown): rendering would be a black hole.
REASON_PROXY_NOT_DECLARED: Final = "ProxyNotDeclared"
# A proxy declares the mode, but none for the address's family.
REASON_ADDRESS_FAMILY_UNSUPPORTED: Final = "AddressFamilyUnsupported"
# PortList: a port needs translation (targetPort differs or is named) or is neither TCP nor UDP.
REASON_PORT_TRANSLATION_UNSUPPORTED: Final = "PortTranslationUnsupported"
# A backend pod is already a backend of a Service that wins it; cozy-proxy holds one address per pod.
REASON_EXCLUSIVITY_CONFLICT: Final = "ExclusivityConflict"
# Either VM mode with several ready backends: cozy-proxy would forward to the first Endpoints
# address only and leave the others' egress unmapped, so stay dark.
REASON_MULTIPLE_BACKENDS: Final = "MultipleBackends"
# ServiceProxies name different proxies for one mode and family: no name is guessed; a live Service is
# left exactly as it is (not relabelled, not deleted) and none is rendered until one remains.
REASON_PROXY_DECLARATION_CONFLICT: Final = "ProxyDeclarationConflict"

# --- Ready reasons ---------------------------------------------------------------------------------

# True: the load balancer reports the bound address on the rendered Service.
REASON_PUBLISHED: Final = "Published"
# A Service with the rendered name exists without our controller reference: never adopted or touched.
REASON_SERVICE_NAME_CONFLICT: Final = "ServiceNameConflict"
# The rendered Service exists (or is being written), but its ingress does not hold the address yet.
REASON_ADDRESS_PENDING: Final = "AddressPending"
# A VM mode: the address is announced, but no backend pod is ready, so the proxy has nothing to
# program it onto (the Service stays rendered: it is programmed the moment the pod is ready).
REASON_NO_READY_BACKEND: Final = "NoReadyBackend"
# The rendered Service has waited longer than the announce timeout without the load balancer
# announcing the address: a loadBalancerClass it does not serve, an address outside its pools. Not
# final: the attachment is Published as soon as the address shows up in the Service's ingress.
REASON_ADDRESS_NOT_ANNOUNCED: Final = "AddressNotAnnounced"
# The API refused to create (or change) the rendered Service: validation (an IPv6 Service in an
# IPv4-only cluster), an admission webhook or policy. The message is the API's; the same Service is
# not sent again until what it is rendered from changes.
REASON_SERVICE_REFUSED: Final = "ServiceRefused"
# The API refused the rendered Service because a ResourceQuota of the namespace is used up (403
# "exceeded quota"): asked again slowly, since quota frees without an event we watch.
REASON_SERVICE_QUOTA_EXCEEDED: Final = "ServiceQuotaExceeded"
# The API refused the rendered Service because the namespace is being deleted: never asked again.
REASON_NAMESPACE_TERMINATING: Final = "NamespaceTerminating"

# --- IPAddressClass and IPAddressClaim reasons -------------------------------------------------------

# Class Ready True: the pool is well formed and has free addresses.
REASON_AVAILABLE: Final = "Available"
# Class Ready False: the pool is well formed but holds no address at all (everything excluded).
REASON_POOL_EMPTY: Final = "PoolEmpty"
# Claim Ready False: spec.address names another address than the one the claim holds (set or
# changed after the claim was bound; the CRD refuses that today, older objects may carry it). The
# claim keeps the address it holds: a reserved address never moves under its users.
REASON_ADDRESS_MISMATCH: Final = "AddressMismatch"
