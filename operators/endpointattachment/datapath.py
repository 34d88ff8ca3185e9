"""The VM datapath modes (PortList, WholeIP): the proxy declaration, ports, backends and exclusivity.

Decides, in this order (the first failure is the verdict):
1. the declared proxy: a ServiceProxy (not being deleted) whose ``modes`` holds the mode and whose
   ``ipFamilies`` (IPv4 when empty: cozy-proxy is IPv4 only) holds the address's family. None declares
   the mode: ``ProxyNotDeclared``; some declare the mode, none for the family:
   ``AddressFamilyUnsupported``. A declaration that lists no modes declares none. Several matching:
   the one whose object name sorts first, so every pass picks the same proxy name.
2. PortList ports: each needs a numeric ``targetPort`` equal to ``port`` (absent means equal) and
   protocol TCP or UDP (absent means TCP): cozy-proxy does no port translation.
3. WholeIP backends: more than one ready backend is ``MultipleBackends`` (dark rather than picking one);
   exactly one publishes, and so does none (nothing to forward to, nothing stale to keep forwarding).
4. exclusivity, keyed on the backend pod: none of this attachment's ready backends may be a backend of
   another Service delegated to the same declared proxy, unless this attachment wins. A Service not
   rendered by an attachment (a chart's own cozy-proxy Service) always wins; among attachments the
   smaller ``(creationTimestamp, name)`` wins, then namespace and UID to make the order total.
   Timestamps are compared as the API's RFC 3339 ``Z`` text, which sorts chronologically.

Backends come from EndpointSlices: endpoints whose ``conditions.ready`` is not false (the API says nil
means ready), keyed by the pod UID of their ``targetRef`` and so deduplicated across the IPv4 and IPv6
slices of one pod. An endpoint with no pod targetRef is keyed by its first address.

Does not: decide Standard mode (no proxy is involved there), list anything (the caller passes the
proxied Services with their backends), or render the Service.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from operators.endpointattachment.constants import (
    DEFAULT_PROXY_FAMILIES,
    MODE_PORT_LIST,
    MODE_WHOLE_IP,
    POD_KIND,
    PROTOCOL_TCP,
    PROTOCOL_UDP,
    REASON_ADDRESS_FAMILY_UNSUPPORTED,
    REASON_ADMITTED,
    REASON_EXCLUSIVITY_CONFLICT,
    REASON_MULTIPLE_BACKENDS,
    REASON_PORT_TRANSLATION_UNSUPPORTED,
    REASON_PROXY_NOT_DECLARED,
    VM_MODES,
)

# cozy-proxy forwards these protocols only.
_PROXIED_PROTOCOLS: Final = frozenset({PROTOCOL_TCP, PROTOCOL_UDP})
# Backend keys for endpoints without a pod targetRef are prefixed so they never equal a pod UID.
_ADDRESS_KEY_PREFIX: Final = "address:"


@dataclass(frozen=True)
class Verdict:
    """A datapath decision; ``proxy_name`` is the declared name to render when admitted."""

    ok: bool
    reason: str
    message: str
    proxy_name: str | None = None


@dataclass(frozen=True)
class ProxyDeclaration:
    """One ServiceProxy: a proxy that runs, under a name, for some modes and families."""

    name: str
    service_proxy_name: str
    modes: frozenset[str]
    ip_families: frozenset[str]


@dataclass(frozen=True, order=True)
class AttachmentRank:
    """Who wins a backend among attachments: the smaller rank (older, then by name)."""

    creation_timestamp: str
    name: str
    namespace: str = ""
    uid: str = ""


@dataclass(frozen=True)
class ProxiedService:
    """A Service delegated to a proxy, as the exclusivity check sees it.

    ``attachment`` is the rank of the attachment that rendered it (its controller), None for a Service
    no attachment rendered.
    """

    namespace: str
    name: str
    proxy_name: str
    backends: frozenset[str]
    attachment: AttachmentRank | None = None


def rank_of(attachment: Mapping[str, Any]) -> AttachmentRank:
    """An attachment's rank, from its metadata."""
    metadata = attachment.get("metadata") or {}
    return AttachmentRank(
        creation_timestamp=str(metadata.get("creationTimestamp") or ""),
        name=str(metadata.get("name") or ""),
        namespace=str(metadata.get("namespace") or ""),
        uid=str(metadata.get("uid") or ""),
    )


def proxy_declarations(service_proxies: Iterable[Mapping[str, Any]]) -> tuple[ProxyDeclaration, ...]:
    """The live declarations, sorted by object name; malformed or deleting ones are skipped."""
    declarations = []
    for proxy in service_proxies:
        metadata = proxy.get("metadata") or {}
        spec = proxy.get("spec") or {}
        proxy_name = spec.get("serviceProxyName")
        if metadata.get("deletionTimestamp") or not isinstance(proxy_name, str) or not proxy_name:
            continue
        families = frozenset(str(f) for f in spec.get("ipFamilies") or ()) or DEFAULT_PROXY_FAMILIES
        declarations.append(
            ProxyDeclaration(
                name=str(metadata.get("name") or ""),
                service_proxy_name=proxy_name,
                modes=frozenset(str(m) for m in spec.get("modes") or ()),
                ip_families=families,
            )
        )
    return tuple(sorted(declarations, key=lambda declaration: declaration.name))


def find_proxy(service_proxies: Iterable[Mapping[str, Any]], mode: str, family: str) -> Verdict:
    """The declared proxy for a VM mode and address family, or why there is none."""
    if mode not in VM_MODES:
        return Verdict(False, REASON_PROXY_NOT_DECLARED, f"mode {mode!r} is not a proxied mode")
    for_mode = [d for d in proxy_declarations(service_proxies) if mode in d.modes]
    if not for_mode:
        return Verdict(False, REASON_PROXY_NOT_DECLARED, f"no ServiceProxy declares mode {mode}")
    for declaration in for_mode:
        if family in declaration.ip_families:
            return Verdict(
                True,
                REASON_ADMITTED,
                f"ServiceProxy {declaration.name} serves {mode} for {family}",
                proxy_name=declaration.service_proxy_name,
            )
    return Verdict(False, REASON_ADDRESS_FAMILY_UNSUPPORTED, f"no ServiceProxy serves {mode} for {family}")


def check_port_list(ports: Sequence[Mapping[str, Any]]) -> Verdict:
    """Whether every port can go through cozy-proxy's port list without translation."""
    for port in ports:
        label = port.get("name") or port.get("port")
        protocol = port.get("protocol") or PROTOCOL_TCP
        if protocol not in _PROXIED_PROTOCOLS:
            return Verdict(False, REASON_PORT_TRANSLATION_UNSUPPORTED, f"port {label}: protocol {protocol}")
        target = port.get("targetPort")
        if target is None:  # the API server defaults an absent targetPort to port
            target = port.get("port")
        if isinstance(target, bool) or not isinstance(target, int) or target != port.get("port"):
            return Verdict(
                False,
                REASON_PORT_TRANSLATION_UNSUPPORTED,
                f"port {label}: targetPort {target!r} differs from port {port.get('port')}",
            )
    return Verdict(True, REASON_ADMITTED, "every port is forwarded as is")


def ready_backends(endpoint_slices: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """Keys (pod UIDs) of the ready backends in some EndpointSlices, deduplicated."""
    keys: set[str] = set()
    for endpoint_slice in endpoint_slices:
        for endpoint in endpoint_slice.get("endpoints") or ():
            if (endpoint.get("conditions") or {}).get("ready") is False:
                continue
            key = backend_key(endpoint)
            if key:
                keys.add(key)
    return frozenset(keys)


def backend_key(endpoint: Mapping[str, Any]) -> str | None:
    """An endpoint's backend key: its pod's UID, else its first address; None if it has neither."""
    target = endpoint.get("targetRef") or {}
    if target.get("kind") == POD_KIND and target.get("uid"):
        return str(target["uid"])
    addresses = endpoint.get("addresses") or ()
    return f"{_ADDRESS_KEY_PREFIX}{addresses[0]}" if addresses else None


def check_backends(mode: str, backends: frozenset[str]) -> Verdict:
    """WholeIP publishes only with at most one ready backend; PortList has no such limit."""
    if mode == MODE_WHOLE_IP and len(backends) > 1:
        return Verdict(
            False, REASON_MULTIPLE_BACKENDS, f"{len(backends)} ready backends; WholeIP publishes with one"
        )
    return Verdict(True, REASON_ADMITTED, f"{len(backends)} ready backend(s)")


def check_exclusivity(
    me: AttachmentRank,
    my_service: tuple[str, str],
    proxy_name: str,
    backends: frozenset[str],
    others: Iterable[ProxiedService],
) -> Verdict:
    """Whether this attachment may hold its backends on ``proxy_name``; the loser's message names the winner.

    ``my_service`` is (namespace, name) of this attachment's rendered Service, which is never a rival.
    """
    rivals = [
        other
        for other in others
        if other.proxy_name == proxy_name
        and (other.namespace, other.name) != my_service
        and not (other.attachment is not None and me.uid and other.attachment.uid == me.uid)
        and other.backends & backends
    ]
    charts = sorted((o for o in rivals if o.attachment is None), key=lambda o: (o.namespace, o.name))
    if charts:
        return _lost_to(charts[0], "a Service not rendered by an attachment")
    older = sorted(
        (o for o in rivals if o.attachment is not None and o.attachment < me),
        key=lambda o: (o.attachment, o.namespace, o.name),
    )
    if older:
        return _lost_to(older[0], "an older attachment")
    return Verdict(True, REASON_ADMITTED, "no other proxied Service holds these backends")


def _lost_to(winner: ProxiedService, what: str) -> Verdict:
    return Verdict(
        False,
        REASON_EXCLUSIVITY_CONFLICT,
        f"a backend pod is already published by Service {winner.namespace}/{winner.name} ({what})",
    )


def admit(
    *,
    mode: str,
    family: str,
    ports: Sequence[Mapping[str, Any]],
    backends: frozenset[str],
    service_proxies: Iterable[Mapping[str, Any]],
    me: AttachmentRank,
    my_service: tuple[str, str],
    others: Iterable[ProxiedService],
) -> Verdict:
    """The whole VM-mode decision, in the order of the module docstring."""
    proxy = find_proxy(service_proxies, mode, family)
    if not proxy.ok or proxy.proxy_name is None:
        return proxy
    checks = [check_backends(mode, backends)]
    if mode == MODE_PORT_LIST:
        checks.insert(0, check_port_list(ports))
    for verdict in checks:
        if not verdict.ok:
            return verdict
    exclusive = check_exclusivity(me, my_service, proxy.proxy_name, backends, others)
    if not exclusive.ok:
        return exclusive
    return Verdict(True, REASON_ADMITTED, proxy.message, proxy_name=proxy.proxy_name)
