"""The EndpointAttachment operator's API: Cozystack's ``EndpointAttachment``, the address substrate's
kinds it consumes, and every label and annotation it reads or writes, each defined once.

Pure (no client, no I/O). ``EndpointAttachment`` (``local.sdn.cozystack.io/v1alpha1``) is Cozystack's
own API, served here field for field; ``IPAddressClass``, ``IPAddress`` and ``IPAddressClaim`` in
the same group belong to Cozystack's address substrate, which the platform installs and this
operator only reads (and, for a minted claim, creates). ``AttachmentSpec`` is the typed view of an
attachment's spec that every other module reads, tolerant of what the schema would refuse;
``AttachmentView`` is what the attachments' cache keeps beside each version (its key, spec, status).

Decides: the literal value of each name, with why it has that value, and how a spec reads
(defaults). Does not: decide when any of them applies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from shared.resources import Resource

# --- kinds -----------------------------------------------------------------------------------------

GROUP: Final = "local.sdn.cozystack.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
# Tenant-written: attaches one address to one tenant-facing Service of an application. Ours to serve.
ATTACHMENT_KIND: Final = "EndpointAttachment"
ATTACHMENTS: Final = Resource(API_VERSION, "endpointattachments", kind=ATTACHMENT_KIND)
# The substrate's (its core controller's CRDs; never shipped here): a namespaced request for
# addresses, a tenant's reserved one or one we mint...
CLAIM_KIND: Final = "IPAddressClaim"
CLAIMS: Final = Resource(API_VERSION, "ipaddressclaims", kind=CLAIM_KIND)
# ...the hoster's class of addresses (read for its loadBalancerClass)...
CLASSES: Final = Resource(API_VERSION, "ipaddressclasses", namespaced=False, kind="IPAddressClass")
# ...and one object per IP, whose status.associatedTo names the Service it is announced for.
ADDRESSES: Final = Resource(API_VERSION, "ipaddresses", namespaced=False, kind="IPAddress")
# A Service references its claim through this annotation; the substrate's driver then pins the
# claim's addresses on it with the load balancer's own annotation.
CLAIM_ANNOTATION: Final = "local.sdn.cozystack.io/ip-address-claim"
# The default class (for claims that name none) carries this annotation "true".
DEFAULT_CLASS_ANNOTATION: Final = "ipaddressclass.local.sdn.cozystack.io/is-default-class"
CLAIM_PHASE_PENDING: Final = "Pending"
CLAIM_PHASE_BOUND: Final = "Bound"
CLAIM_PHASE_LOST: Final = "Lost"
# The claim's default family (the substrate's CRD default).
DEFAULT_CLAIM_FAMILY: Final = "IPv4"

# --- the attachment's fields -----------------------------------------------------------------------

# applicationRef.group when left out: Cozystack's application API group.
DEFAULT_APPLICATION_GROUP: Final = "apps.cozystack.io"
FAMILY_IPV4: Final = "IPv4"
FAMILY_IPV6: Final = "IPv6"
FAMILY_DUAL: Final = "Dual"
FAMILIES: Final = frozenset({FAMILY_IPV4, FAMILY_IPV6, FAMILY_DUAL})
# The VM datapath modes (cozy-proxy's): every port 1:1, or only the listed ports.
METHOD_WHOLE_IP: Final = "WholeIP"
METHOD_PORT_LIST: Final = "PortList"
METHODS: Final = frozenset({METHOD_WHOLE_IP, METHOD_PORT_LIST})
# status.phase: a projection of the two conditions.
PHASE_PENDING: Final = "Pending"
PHASE_ATTACHED: Final = "Attached"
PHASE_DETACHED: Final = "Detached"

# --- labels and annotations ------------------------------------------------------------------------

# Names the attachment on its rendered Service and its minted claim: a diagnostic, for listing;
# anyone can write a label, so it is never proof of ownership (the controller owner reference is).
ATTACHMENT_LABEL: Final = "cozystack.io/endpoint-attachment"
# cozy-proxy handles only Services labelled with its name; kube-proxy skips every Service carrying
# the key. Rendered only in a VM mode, and only when the platform declares cozy-proxy deployed.
SERVICE_PROXY_NAME_LABEL: Final = "service.kubernetes.io/service-proxy-name"
# The only cozy-proxy contract implementor the platform can declare (the label's value).
COZY_PROXY: Final = "cozy-proxy"
# cozy-proxy: "true" forwards every port to the backend (WholeIP); "false" only spec.ports (PortList).
WHOLE_IP_ANNOTATION: Final = "networking.cozystack.io/wholeIP"
# cozy-proxy: "true" also accepts ICMP in port-list mode.
ALLOW_ICMP_ANNOTATION: Final = "networking.cozystack.io/allowICMP"
ANNOTATION_TRUE: Final = "true"
ANNOTATION_FALSE: Final = "false"
# The substrate's MetalLB driver pins the claim's addresses with this (MetalLB's) annotation on the
# Service naming the claim: the driver's field, read (never written, never removed) by us.
METALLB_IPS_ANNOTATION: Final = "metallb.io/loadBalancerIPs"
# The driver's marker, added with its pin in the same Update: never read (nor written) by us.
PINNED_ANNOTATION: Final = "metallb.drivers.local.sdn.cozystack.io/pinned"
# Ours, on a proxied Service that shares pods with one of ours we just deleted or changed (the
# survivor: an attachment's Service or a chart's own): cozy-proxy's deletes clear a pod's entries
# whoever owns them, and it re-programs a Service on every update of it. The value names the change,
# so a repeated pass writes nothing.
REPROGRAM_ANNOTATION: Final = "local.sdn.cozystack.io/reprogrammed-after"
# Ours, on our own VM-mode Service, once it has both its address and a ready backend in its v1
# Endpoints: cozy-proxy programs a Service whose address came a few milliseconds before its
# Endpoints with no backend and does not come back to it; an update makes it program again.
PROGRAMMED_ANNOTATION: Final = "local.sdn.cozystack.io/programmed-backend"
# Ours, a key of our VM-mode Service's selector while the endpoint has more than one ready backend
# (MultipleBackends), valued with the attachment's UID: no pod carries it, so the endpoints
# controllers empty the Service's Endpoints and cozy-proxy programs nothing for the address, while
# the Service, its pin and so its address stay. Removing the key is the one write that publishes again.
WITHDRAWN_SELECTOR_KEY: Final = "local.sdn.cozystack.io/withdrawn-for"

# Every label and annotation key we write on a rendered Service: the only keys we ever compare,
# patch or remove there, so other writers' keys (the driver's pin) survive our passes.
OWNED_LABELS: Final = frozenset({ATTACHMENT_LABEL, SERVICE_PROXY_NAME_LABEL})
OWNED_ANNOTATIONS: Final = frozenset({CLAIM_ANNOTATION, WHOLE_IP_ANNOTATION, ALLOW_ICMP_ANNOTATION})

# --- the core objects ------------------------------------------------------------------------------

SERVICE_TYPE_LOAD_BALANCER: Final = "LoadBalancer"
SERVICE_TYPE_EXTERNAL_NAME: Final = "ExternalName"
# Local keeps the client's source address (cozy-proxy and the application see the real peer).
EXTERNAL_TRAFFIC_POLICY_LOCAL: Final = "Local"
IP_FAMILY_POLICY_SINGLE_STACK: Final = "SingleStack"
IP_FAMILY_POLICY_REQUIRE_DUAL_STACK: Final = "RequireDualStack"
PROTOCOL_TCP: Final = "TCP"
PROTOCOL_UDP: Final = "UDP"
# vm-instance endpoints are headless Services with this one sentinel port until the chart exposes
# the VM: there is nothing to mirror from it.
SENTINEL_PORT: Final = 65535
# EndpointSlices name their Service with this standard label.
ENDPOINTSLICE_SERVICE_NAME_LABEL: Final = "kubernetes.io/service-name"
POD_KIND: Final = "Pod"
POD_PHASE_SUCCEEDED: Final = "Succeeded"
POD_PHASE_FAILED: Final = "Failed"
# The application object: a Flux HelmRelease whose UID is the application's identity.
HELMRELEASE_GROUP: Final = "helm.toolkit.fluxcd.io"
HELMRELEASE_KIND: Final = "HelmRelease"
# DNS-1123 names and label values are at most this long.
MAX_NAME_LENGTH: Final = 63


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


@dataclass(frozen=True)
class AttachmentSpec:
    """An attachment's spec as every module reads it: absent or mistyped fields read as absent (the
    schema refuses them; an object written before a schema change must still never crash a pass)."""

    app_group: str
    app_kind: str
    app_name: str
    endpoint: str
    class_name: str
    claim_name: str
    family: str  # "" when not given
    ports: tuple[int, ...]
    method: str  # "" when not given: no VM datapath
    allow_icmp: bool

    @property
    def vm_mode(self) -> bool:
        return self.method in METHODS

    @property
    def minted(self) -> bool:
        """A claim is minted (className, or neither: the default class) unless one is referenced."""
        return not self.claim_name


def spec_of(attachment: Mapping[str, Any]) -> AttachmentSpec:
    spec = attachment.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}

    def section(name: str) -> Mapping[str, Any]:
        value = spec.get(name)
        return value if isinstance(value, Mapping) else {}

    app, endpoint, lb = section("applicationRef"), section("endpoint"), section("loadBalancer")
    raw_ports = lb.get("ports")
    ports = tuple(
        p
        for p in (raw_ports if isinstance(raw_ports, list) else [])
        if isinstance(p, int) and not isinstance(p, bool) and 0 < p < 65536
    )
    return AttachmentSpec(
        app_group=_text(app.get("group")) or DEFAULT_APPLICATION_GROUP,
        app_kind=_text(app.get("kind")),
        app_name=_text(app.get("name")),
        endpoint=_text(endpoint.get("serviceName")),
        class_name=_text(lb.get("className")),
        claim_name=_text(lb.get("claimName")),
        family=_text(lb.get("family")) if lb.get("family") in FAMILIES else "",
        ports=tuple(dict.fromkeys(ports)),
        method=_text(lb.get("method")) if lb.get("method") in METHODS else "",
        allow_icmp=lb.get("allowICMP") is True,
    )


@dataclass(frozen=True)
class AttachmentView:
    """An attachment as its cache keeps it beside the object, typed once per stored version: what
    the indexes, the map functions, the read model and the planner read (``attachment_view``)."""

    namespace: str
    name: str
    spec: AttachmentSpec
    status: Mapping[str, Any]  # as stored (the held-back index reads its Provisioned condition)


def attachment_view(attachment: Mapping[str, Any]) -> AttachmentView:
    metadata = attachment.get("metadata") or {}
    status = attachment.get("status")
    return AttachmentView(
        namespace=_text(metadata.get("namespace")),
        name=_text(metadata.get("name")),
        spec=spec_of(attachment),
        status=status if isinstance(status, Mapping) else {},
    )
