"""The LoadBalancer Service an attachment publishes, and the smallest change that brings one up to date.

Decides:
- the rendered Service's name: ``ea-<attachment name>`` when that is a valid DNS-1035 label of at most
  63 characters; otherwise the name with every character outside ``[a-z0-9-]`` turned into ``-``, cut,
  and suffixed with ``-`` plus 8 hex digits of the SHA-256 of the attachment name (so two attachments
  whose names differ only past the cut, or only in a ``.``, never share a Service name). The same rule
  makes the value of our listing label (label values are at most 63 characters too).
- its labels (only ours, plus the proxy-name label with the declared name in the VM modes), its
  annotations (per provider and mode), a controller owner reference to the attachment (with
  ``blockOwnerDeletion`` so a foreground deletion of the attachment waits for the Service), and its spec
  exactly as the design fixes it, mirroring the endpoint's selector and ports (name, protocol, port,
  targetPort, appProtocol; never nodePort). The API server defaults protocol to TCP and targetPort to
  port, so we render those defaults explicitly and a second pass compares equal.
- for an existing Service that is ours, whether it needs a write, and the JSON merge patch
  (``application/merge-patch+json``: lists are replaced whole, ``null`` removes a key) touching only the
  fields we own: our label and annotation keys (another writer's keys survive), and the spec fields we
  set. Fields the API server will not change in place (``loadBalancerClass`` once set, the primary IP
  family) are reported by ``needs_recreate`` instead.

Does not: decide whether to render at all, or whether an existing Service is ours (``reconcile`` does,
by controller owner reference); copy any label or annotation from the endpoint or the attachment
(copying lineage, ``tenantresource`` or a proxy label would change what the platform believes about
the Service).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from operators.endpointattachment.addresses import IPAddress, family_of
from operators.endpointattachment.constants import (
    ALLOW_ICMP_ANNOTATION,
    ANNOTATION_FALSE,
    ANNOTATION_TRUE,
    ATTACHMENT_LABEL,
    CILIUM_IPS_ANNOTATION,
    DEFAULT_PROVIDER,
    EXTERNAL_TRAFFIC_POLICY_LOCAL,
    IP_FAMILY_POLICY_SINGLE_STACK,
    MAX_NAME_LENGTH,
    METALLB_IPS_ANNOTATION,
    METALLB_POOL_ANNOTATION,
    MODE_PORT_LIST,
    MODE_WHOLE_IP,
    OWNED_ANNOTATIONS,
    OWNED_LABELS,
    PROTOCOL_TCP,
    PROVIDER_CILIUM,
    PROVIDER_METALLB,
    PROVIDERS,
    SERVICE_API_VERSION,
    SERVICE_KIND,
    SERVICE_NAME_PREFIX,
    SERVICE_PROXY_NAME_LABEL,
    SERVICE_TYPE_LOAD_BALANCER,
    VM_MODES,
    WHOLE_IP_ANNOTATION,
)
from shared.ownership import owner_reference

# Hex digits of the name hash appended when a name must be cut or sanitised: 32 bits is plenty
# against accidental collisions among one namespace's attachments.
_HASH_DIGITS: Final = 8
_DNS_1035_LABEL: Final = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_NOT_DNS_1035: Final = re.compile(r"[^-a-z0-9]")
# The port fields we mirror; anything else on the endpoint's ports (nodePort above all) stays behind.
_PORT_FIELDS: Final = ("name", "protocol", "port", "targetPort", "appProtocol")
# The spec fields we set; only these are compared and patched on an existing Service.
_OWNED_SPEC_FIELDS: Final = (
    "type",
    "externalTrafficPolicy",
    "allocateLoadBalancerNodePorts",
    "ipFamilyPolicy",
    "ipFamilies",
    "ports",
)


class InvalidClassSettings(ValueError):
    """The class names a provider we do not know how to address."""


@dataclass(frozen=True)
class ClassSettings:
    """What the rendered Service takes from the IPAddressClass."""

    provider: str = DEFAULT_PROVIDER
    metallb_pool: str = ""
    load_balancer_class: str = ""


def class_settings(address_class: Mapping[str, Any]) -> ClassSettings:
    """The render settings of an IPAddressClass (raises InvalidClassSettings on an unknown provider)."""
    spec = address_class.get("spec") or {}
    provider = spec.get("provider") or DEFAULT_PROVIDER
    if provider not in PROVIDERS:
        raise InvalidClassSettings(f"unknown provider {provider!r}; expected one of {sorted(PROVIDERS)}")
    return ClassSettings(
        provider=str(provider),
        metallb_pool=str(spec.get("metallbAddressPool") or ""),
        load_balancer_class=str(spec.get("loadBalancerClass") or ""),
    )


def service_name(attachment_name: str) -> str:
    """The rendered Service's name: deterministic, a DNS-1035 label, at most 63 characters."""
    base = SERVICE_NAME_PREFIX + attachment_name
    if len(base) <= MAX_NAME_LENGTH and _DNS_1035_LABEL.match(base):
        return base
    suffix = hashlib.sha256(attachment_name.encode()).hexdigest()[:_HASH_DIGITS]
    # The "ea-" prefix makes the head start with a letter; the hex suffix ends the name alphanumerically.
    head = _NOT_DNS_1035.sub("-", base.lower())[: MAX_NAME_LENGTH - _HASH_DIGITS - 1].rstrip("-")
    return f"{head}-{suffix}"


def attachment_label_value(attachment_name: str) -> str:
    """The value of our listing label: the attachment name, hash-cut when longer than a label allows."""
    if len(attachment_name) <= MAX_NAME_LENGTH:
        return attachment_name
    suffix = hashlib.sha256(attachment_name.encode()).hexdigest()[:_HASH_DIGITS]
    head = attachment_name[: MAX_NAME_LENGTH - _HASH_DIGITS - 1].rstrip("-.")
    return f"{head}-{suffix}"


def mirrored_ports(ports: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The endpoint's ports as we render them, with the API server's defaults spelled out."""
    rendered = []
    for port in ports:
        item = {key: port[key] for key in _PORT_FIELDS if port.get(key) not in (None, "")}
        item.setdefault("protocol", PROTOCOL_TCP)
        if "port" in item:
            item.setdefault("targetPort", item["port"])
        rendered.append(item)
    return rendered


def provider_annotations(settings: ClassSettings, address: IPAddress) -> dict[str, str]:
    """The annotations that tell the class's load balancer which address to announce."""
    if settings.provider == PROVIDER_CILIUM:
        return {CILIUM_IPS_ANNOTATION: str(address)}
    if settings.provider == PROVIDER_METALLB:
        annotations = {METALLB_IPS_ANNOTATION: str(address)}
        if settings.metallb_pool:
            annotations[METALLB_POOL_ANNOTATION] = settings.metallb_pool
        return annotations
    raise InvalidClassSettings(f"unknown provider {settings.provider!r}")


def mode_annotations(mode: str, allow_icmp: bool) -> dict[str, str]:
    """cozy-proxy's annotations: WholeIP "true"; PortList "false" plus allowICMP; Standard none."""
    if mode == MODE_WHOLE_IP:
        return {WHOLE_IP_ANNOTATION: ANNOTATION_TRUE}
    if mode == MODE_PORT_LIST:
        return {
            WHOLE_IP_ANNOTATION: ANNOTATION_FALSE,
            ALLOW_ICMP_ANNOTATION: ANNOTATION_TRUE if allow_icmp else ANNOTATION_FALSE,
        }
    return {}


def render_service(
    attachment: Mapping[str, Any],
    *,
    selector: Mapping[str, str],
    ports: Sequence[Mapping[str, Any]],
    address: IPAddress,
    settings: ClassSettings,
    mode: str,
    allow_icmp: bool,
    proxy_name: str | None,
) -> dict[str, Any]:
    """The Service that publishes ``address`` for the attachment's endpoint.

    ``proxy_name`` is the name the ServiceProxy declares; it is required in the VM modes and ignored
    in Standard. Raises ValueError when a VM mode comes without one (a caller bug: ``datapath`` gates
    the VM modes on a declaration first).
    """
    metadata = attachment.get("metadata") or {}
    name = str(metadata.get("name", ""))
    labels = {ATTACHMENT_LABEL: attachment_label_value(name)}
    if mode in VM_MODES:
        if not proxy_name:
            raise ValueError(f"mode {mode} needs the declared proxy name")
        labels[SERVICE_PROXY_NAME_LABEL] = proxy_name
    spec: dict[str, Any] = {
        "type": SERVICE_TYPE_LOAD_BALANCER,
        "externalTrafficPolicy": EXTERNAL_TRAFFIC_POLICY_LOCAL,
        "allocateLoadBalancerNodePorts": False,
        "ipFamilyPolicy": IP_FAMILY_POLICY_SINGLE_STACK,
        "ipFamilies": [family_of(address)],
        "selector": dict(selector),
        "ports": mirrored_ports(ports),
    }
    if settings.load_balancer_class:
        spec["loadBalancerClass"] = settings.load_balancer_class
    return {
        "apiVersion": SERVICE_API_VERSION,
        "kind": SERVICE_KIND,
        "metadata": {
            "name": service_name(name),
            "namespace": str(metadata.get("namespace", "")),
            "labels": labels,
            "annotations": {**provider_annotations(settings, address), **mode_annotations(mode, allow_icmp)},
            "ownerReferences": [owner_reference(attachment, controller=True, block_owner_deletion=True)],
        },
        "spec": spec,
    }


def needs_recreate(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether an owned field differs that the API server will not change in place."""
    old, new = existing.get("spec") or {}, desired.get("spec") or {}
    if (old.get("loadBalancerClass") or None) != (new.get("loadBalancerClass") or None):
        return True
    old_families, new_families = old.get("ipFamilies") or [], new.get("ipFamilies") or []
    return bool(old_families) and bool(new_families) and old_families[0] != new_families[0]


def service_patch(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any] | None:
    """The JSON merge patch that brings our fields of ``existing`` to ``desired``; None when equal.

    Immutable fields are not patched (see ``needs_recreate``).
    """
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


def service_needs_update(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether a pass must write to an existing Service of ours."""
    return needs_recreate(existing, desired) or service_patch(existing, desired) is not None


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
    """An existing Service's ports reduced to the fields we mirror (dropping nodePort and the like)."""
    return [{key: port[key] for key in _PORT_FIELDS if port.get(key) not in (None, "")} for port in ports]
