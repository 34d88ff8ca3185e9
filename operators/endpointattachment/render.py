"""The objects an attachment renders — its IPAddressClaim (when it mints) and its LoadBalancer
Service — and the smallest change that brings a live Service of ours up to date.

Decides:
- the minted claim: ``generateName: <attachment>-``, ``spec.className`` and ``spec.family`` only
  when the attachment gives them (neither: the substrate's default class and family), our
  diagnostic label, and a controller owner reference to the attachment, so garbage collection
  removes it with the attachment (its address then follows the class's reclaim policy).
- which ports the Service publishes (``publish_ports``), as Cozystack's controller does: on a
  vm-instance endpoint whose one port is the sentinel (65535), the ``ports`` as plain TCP ``port ==
  targetPort`` (sorted), or with none the sentinel itself in WholeIP only (cozy-proxy forwards every
  port whatever the Service lists, and a LoadBalancer Service needs one); on any other endpoint, its
  ports that ``ports`` names (all of them without ``ports``), mirrored. None left: nothing to publish.
- the Service: ``generateName`` from the attachment's name made a DNS-1035 label (at most 57
  characters, so the API's 5-character suffix fits), ``type: LoadBalancer``, the claim annotation
  (the substrate's driver then pins the claim's addresses with the load balancer's own annotation),
  the endpoint's selector, the published ports (name, protocol, port, targetPort, appProtocol;
  never nodePort), ``loadBalancerClass`` from the class when it names one,
  ``allocateLoadBalancerNodePorts`` per the platform setting, ``ipFamilyPolicy``/``ipFamilies``
  from the claim's family (Dual: RequireDualStack, IPv4 then IPv6), ``externalTrafficPolicy:
  Local``; in a VM mode cozy-proxy's label and annotations; a controller owner reference to the
  attachment (``blockOwnerDeletion``: a foreground deletion waits for the Service). The API server
  defaults protocol to TCP and targetPort to port, so those are rendered explicitly and a second
  pass compares equal.
- for a live Service of ours, the JSON merge patch touching only what we own (our label and
  annotation keys: another writer's, such as the driver's pin, survive; the spec fields we set),
  and whether an immutable field (``loadBalancerClass``, the primary family) no longer matches
  (``immutable_mismatch``: the caller reports it, recreating would drop the address).

Does not: decide whether to render (``reconcile``), or copy any label or annotation from the
endpoint or the attachment (lineage, ``tenantresource`` or a proxy label copied would change what
the platform believes about the Service).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from operators.endpointattachment.api import (
    ALLOW_ICMP_ANNOTATION,
    ANNOTATION_FALSE,
    ANNOTATION_TRUE,
    API_VERSION,
    ATTACHMENT_LABEL,
    CLAIM_ANNOTATION,
    CLAIM_KIND,
    EXTERNAL_TRAFFIC_POLICY_LOCAL,
    FAMILY_DUAL,
    FAMILY_IPV4,
    FAMILY_IPV6,
    IP_FAMILY_POLICY_REQUIRE_DUAL_STACK,
    IP_FAMILY_POLICY_SINGLE_STACK,
    MAX_NAME_LENGTH,
    METHOD_PORT_LIST,
    METHOD_WHOLE_IP,
    OWNED_ANNOTATIONS,
    OWNED_LABELS,
    PROTOCOL_TCP,
    SENTINEL_PORT,
    SERVICE_PROXY_NAME_LABEL,
    SERVICE_TYPE_LOAD_BALANCER,
    WHOLE_IP_ANNOTATION,
    AttachmentSpec,
)
from shared.ownership import owner_reference

# The API server appends 5 random characters to a generateName prefix; a Service name is at most 63.
_GENERATED_SUFFIX: Final = 5
_NOT_DNS_1035: Final = re.compile(r"[^-a-z0-9]")
# A generateName prefix for a name that does not start with a letter (DNS-1035 labels must).
_FALLBACK_PREFIX: Final = "ea-"
# The port fields we mirror; anything else on the endpoint's ports (nodePort above all) stays behind.
_PORT_FIELDS: Final = ("name", "protocol", "port", "targetPort", "appProtocol")
# The spec fields we set; only these are compared and patched on a live Service.
_OWNED_SPEC_FIELDS: Final = (
    "type",
    "externalTrafficPolicy",
    "allocateLoadBalancerNodePorts",
    "ipFamilyPolicy",
    "ipFamilies",
    "ports",
)


@dataclass(frozen=True)
class RenderSettings:
    """The platform's settings the Service takes: whether nodePorts are allocated, and the name of
    the cozy-proxy contract implementor when the platform declares one (None: VM modes off)."""

    allocate_node_ports: bool = False
    proxy_name: str | None = None


def label_value(name: str) -> str:
    """Our diagnostic label's value: the attachment's name, cut to what a label value holds."""
    return name[:MAX_NAME_LENGTH].rstrip("-._")


def service_prefix(attachment_name: str) -> str:
    """The rendered Service's generateName: the attachment's name as a DNS-1035 label, then ``-``."""
    base = _NOT_DNS_1035.sub("-", attachment_name.lower())
    if not base[:1].isalpha():
        base = _FALLBACK_PREFIX + base
    return base[: MAX_NAME_LENGTH - _GENERATED_SUFFIX - 1].rstrip("-") + "-"


def ip_families(family: str) -> list[str]:
    """The Service's ipFamilies for a claim's family (IPv4 first for Dual)."""
    if family == FAMILY_DUAL:
        return [FAMILY_IPV4, FAMILY_IPV6]
    return [FAMILY_IPV6 if family == FAMILY_IPV6 else FAMILY_IPV4]


def render_claim(attachment: Mapping[str, Any], spec: AttachmentSpec) -> dict[str, Any]:
    """The claim an attachment mints (className, or neither field: the default class)."""
    metadata = attachment.get("metadata") or {}
    name = str(metadata.get("name", ""))
    claim_spec: dict[str, Any] = {}
    if spec.class_name:
        claim_spec["className"] = spec.class_name
    if spec.family:
        claim_spec["family"] = spec.family
    return {
        "apiVersion": API_VERSION,
        "kind": CLAIM_KIND,
        "metadata": {
            "generateName": f"{name}-",
            "namespace": str(metadata.get("namespace", "")),
            "labels": {ATTACHMENT_LABEL: label_value(name)},
            "ownerReferences": [owner_reference(attachment, controller=True, block_owner_deletion=True)],
        },
        "spec": claim_spec,
    }


def mirrored_port(port: Mapping[str, Any]) -> dict[str, Any]:
    """One endpoint port as we render it, with the API server's defaults spelled out."""
    item = {key: port[key] for key in _PORT_FIELDS if port.get(key) not in (None, "")}
    item.setdefault("protocol", PROTOCOL_TCP)
    if "port" in item:
        item.setdefault("targetPort", item["port"])
    return item


def sentinel_only(endpoint_ports: Sequence[Mapping[str, Any]]) -> bool:
    """A vm-instance endpoint before the chart exposes the VM: its one port is the sentinel."""
    numbers = [p.get("port") for p in endpoint_ports]
    return bool(numbers) and all(n == SENTINEL_PORT for n in numbers)


def publish_ports(endpoint_ports: Sequence[Mapping[str, Any]], spec: AttachmentSpec) -> list[dict[str, Any]]:
    """The ports the Service publishes (empty: nothing to publish). See the module docstring."""
    if spec.ports:
        wanted = sorted(spec.ports)
        if sentinel_only(endpoint_ports):
            return [
                {"name": f"port-{n}", "protocol": PROTOCOL_TCP, "port": n, "targetPort": n} for n in wanted
            ]
        return [mirrored_port(p) for p in endpoint_ports if p.get("port") in wanted]
    if sentinel_only(endpoint_ports):
        return [mirrored_port(p) for p in endpoint_ports] if spec.method == METHOD_WHOLE_IP else []
    return [mirrored_port(p) for p in endpoint_ports if p.get("port") is not None]


def _port_text(port: Mapping[str, Any]) -> str:
    return f"{port.get('port')}/{port.get('protocol') or PROTOCOL_TCP}"


def no_port_message(service: str, endpoint_ports: Sequence[Mapping[str, Any]], spec: AttachmentSpec) -> str:
    """Why ``publish_ports`` left nothing, in the tenant's terms: the asked ports the endpoint lacks
    (and the ports it does publish), a VM's sentinel port alone, or no port at all."""
    published = [p for p in endpoint_ports if p.get("port") is not None]
    if not published:
        return f"Service {service} publishes no port: nothing to publish"
    if spec.ports and not sentinel_only(published):
        lacking = ", ".join(str(n) for n in sorted(spec.ports))
        offered = ", ".join(_port_text(p) for p in published)
        asked = "port" if len(spec.ports) == 1 else "ports"
        return (
            f"Service {service} does not publish the asked {asked} {lacking} (it publishes {offered}): "
            "name ports it publishes in spec.loadBalancer.ports, or leave ports out to publish all of them"
        )
    return (
        f"Service {service} publishes only a VM's sentinel port {SENTINEL_PORT} (the VM is not exposed "
        "yet): name the ports to publish in spec.loadBalancer.ports, or a method"
    )


def method_annotations(spec: AttachmentSpec) -> dict[str, str]:
    """cozy-proxy's annotations: WholeIP "true"; PortList "false" plus allowICMP; none otherwise."""
    if spec.method == METHOD_WHOLE_IP:
        return {WHOLE_IP_ANNOTATION: ANNOTATION_TRUE}
    if spec.method == METHOD_PORT_LIST:
        return {
            WHOLE_IP_ANNOTATION: ANNOTATION_FALSE,
            ALLOW_ICMP_ANNOTATION: ANNOTATION_TRUE if spec.allow_icmp else ANNOTATION_FALSE,
        }
    return {}


def render_service(
    attachment: Mapping[str, Any],
    spec: AttachmentSpec,
    *,
    claim_name: str,
    family: str,
    selector: Mapping[str, str],
    ports: Sequence[Mapping[str, Any]],
    load_balancer_class: str,
    settings: RenderSettings,
) -> dict[str, Any]:
    """The Service that consumes the claim for the attachment's endpoint."""
    metadata = attachment.get("metadata") or {}
    name = str(metadata.get("name", ""))
    labels = {ATTACHMENT_LABEL: label_value(name)}
    if spec.vm_mode and settings.proxy_name:
        labels[SERVICE_PROXY_NAME_LABEL] = settings.proxy_name
    families = ip_families(family)
    service_spec: dict[str, Any] = {
        "type": SERVICE_TYPE_LOAD_BALANCER,
        "externalTrafficPolicy": EXTERNAL_TRAFFIC_POLICY_LOCAL,
        "allocateLoadBalancerNodePorts": settings.allocate_node_ports,
        "ipFamilyPolicy": IP_FAMILY_POLICY_REQUIRE_DUAL_STACK
        if len(families) > 1
        else IP_FAMILY_POLICY_SINGLE_STACK,
        "ipFamilies": families,
        "selector": dict(selector),
        "ports": list(ports),
    }
    if load_balancer_class:
        service_spec["loadBalancerClass"] = load_balancer_class
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "generateName": service_prefix(name),
            "namespace": str(metadata.get("namespace", "")),
            "labels": labels,
            "annotations": {CLAIM_ANNOTATION: claim_name, **method_annotations(spec)},
            "ownerReferences": [owner_reference(attachment, controller=True, block_owner_deletion=True)],
        },
        "spec": service_spec,
    }


def immutable_mismatch(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> str | None:
    """Which field the API server will not change in place differs (None: none)."""
    old, new = existing.get("spec") or {}, desired.get("spec") or {}
    if (old.get("loadBalancerClass") or None) != (new.get("loadBalancerClass") or None):
        return (
            f"loadBalancerClass is {old.get('loadBalancerClass') or 'the default'}, the class asks for "
            f"{new.get('loadBalancerClass') or 'the default'}"
        )
    old_families, new_families = old.get("ipFamilies") or [], new.get("ipFamilies") or []
    if old_families and new_families and old_families[0] != new_families[0]:
        return f"the primary IP family is {old_families[0]}, the claim's is {new_families[0]}"
    return None


def service_patch(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any] | None:
    """The JSON merge patch that brings our fields of ``existing`` to ``desired``; None when equal.
    Immutable fields are never patched (``immutable_mismatch``)."""
    patch: dict[str, Any] = {}
    metadata: dict[str, Any] = {}
    for key, owned in (("labels", OWNED_LABELS), ("annotations", OWNED_ANNOTATIONS)):
        changes = _owned_map_changes(_map(existing, "metadata", key), _map(desired, "metadata", key), owned)
        if changes:
            metadata[key] = changes
    if metadata:
        patch["metadata"] = metadata
    old, new = existing.get("spec") or {}, desired.get("spec") or {}
    spec: dict[str, Any] = {}
    for key in _OWNED_SPEC_FIELDS:
        current = _project_ports(old.get("ports") or []) if key == "ports" else old.get(key)
        if current != new.get(key):
            spec[key] = new.get(key)
    selector_changes = _map_changes(old.get("selector") or {}, new.get("selector") or {})
    if selector_changes:
        spec["selector"] = selector_changes
    if spec:
        patch["spec"] = spec
    return patch or None


def _map(obj: Mapping[str, Any], section: str, key: str) -> Mapping[str, Any]:
    value = (obj.get(section) or {}).get(key) or {}
    return value if isinstance(value, Mapping) else {}


def _owned_map_changes(
    current: Mapping[str, Any], wanted: Mapping[str, Any], owned: frozenset[str]
) -> dict[str, Any]:
    """Merge-patch entries for our keys only: set what differs, null what we no longer want."""
    changes: dict[str, Any] = {}
    for key in sorted(owned):
        if key in wanted and current.get(key) != wanted[key]:
            changes[key] = wanted[key]
        elif key not in wanted and key in current:
            changes[key] = None
    return changes


def _map_changes(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    """Merge-patch entries that make a whole map equal to ``wanted`` (the selector is all ours)."""
    changes: dict[str, Any] = {key: value for key, value in wanted.items() if current.get(key) != value}
    changes.update({key: None for key in current if key not in wanted})
    return changes


def _project_ports(ports: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A live Service's ports reduced to the fields we mirror (dropping nodePort and the like)."""
    return [{key: port[key] for key in _PORT_FIELDS if port.get(key) not in (None, "")} for port in ports]
