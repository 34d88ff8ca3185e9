"""The VM datapath modes (PortList, WholeIP): the proxy declaration, ports, backends and exclusivity.

cozy-proxy (cozystack/cozy-proxy, ``pkg/controllers/services_controller.go``, ``pkg/proxy/nft.go``)
keys its NAT map, egress SNAT map, port filter and ICMP allow on the backend *pod IP*, not on the
Service: programming a second Service onto a pod replaces the first one's entries, and deleting any
of its Services clears the entries of the pods that Service selected, whoever owns them now. It reads
only the first load-balancer ingress address and the first ready address of the v1 Endpoints. So a
pod may be published by one proxied Service only, and that must hold before anything renders.

Decides, in this order (the first failure is the verdict):
1. the platform's declaration: VM modes need the operator's setting naming the cozy-proxy contract
   implementor (``RenderSettings.proxy_name``; default none: ``DatapathContractUnavailable``), and an
   IPv4 claim (cozy-proxy programs IPv4 only: an IPv6 or Dual claim is
   ``DatapathContractUnavailable`` too).
2. PortList ports: each needs a numeric ``targetPort`` equal to ``port`` (absent means equal) and
   protocol TCP or UDP (absent means TCP): cozy-proxy does no port translation (``RenderFailed``).
3. backends, both VM modes: more than one ready backend is ``MultipleBackends`` (dark rather than
   letting cozy-proxy pick the first Endpoints address and leave the others' egress unmapped);
   exactly one publishes; none renders (so the proxy programs the pod the moment it is ready), but is
   not Provisioned (``reconcile`` says ``NoReadyBackend``). Dark keeps a rendered Service, and so
   its pinned address, when nothing but the backends' count stops it (``reconcile``): its selector
   gets ``WITHDRAWN_SELECTOR_KEY`` (``withdrawn_selector``), which no pod carries, so its Endpoints
   empty and cozy-proxy programs nothing; removing the key publishes again in one write, with no new
   pin or assignment to wait for. Whoever reads such a Service as a rival reads the selector without
   the key (``served_selector``): a withdrawn Service still holds its pods.
4. exclusivity, keyed on the backend pod and decided over every pod the endpoint *selects*, ready or
   not (a VM pod that is not scheduled or not ready has no endpoint yet, but will): a rival is every
   other Service delegated to the same proxy and every other VM-mode attachment, rendered or not,
   that could render (``could_render``: its endpoint known, the datapath declared, PortList ports
   that need no translation; one lacking only an address counts), whose pods meet ours, or whose
   selector contains ours or is contained in it (so two attachments to one stopped VM, which has no
   pod at all, still meet). A Service not rendered by an attachment
   (a chart's own cozy-proxy Service) always wins; among attachments the smaller
   ``(creationTimestamp, name)`` wins, then namespace and UID to make the order total. A Service
   rendered by an attachment that is not cached ranks after every cached one (``uncached_rank``):
   it is never taken for the oldest. Timestamps are compared as the API's RFC 3339 ``Z`` text, which
   sorts chronologically.
5. what cozy-proxy itself will program (``programmed_backends``): the ready addresses of the
   rendered Service's **v1 Endpoints**, the only source cozy-proxy reads (EndpointSlices can run
   ahead of them by many seconds); a VM mode is Published only on exactly one, and
   ``programmed_token`` is what the glue writes once on a rendered Service that has both its
   address and that backend, since cozy-proxy programs a Service whose address came before its
   Endpoints with no backend and does not come back to it until the Service is updated;
6. what a change of a proxied Service of ours breaks (``survivors``): the other proxied Services that
   select (or selected) its pods, which cozy-proxy must program again after the change; the glue
   writes ``REPROGRAM_ANNOTATION`` on each with ``reprogram_token`` (deterministic, so a second pass
   writes nothing).

Selection: a Service selects the pods of its namespace whose labels hold every pair of its selector
(``selects``), minus finished ones (Succeeded, Failed), keyed by pod UID; a Service's EndpointSlice
endpoints (ready or not) with a pod targetRef count as selected too (a selector-less Service with
hand-made endpoints). Readiness comes from EndpointSlices: endpoints whose ``conditions.ready`` is
not false (the API says nil means ready), keyed by the pod UID of their ``targetRef`` and so
deduplicated across the IPv4 and IPv6 slices of one pod. An endpoint with no pod targetRef is keyed
by its first address.

Does not: decide Standard mode (no proxy is involved there), list anything (the caller passes the
rivals with their selected pods), write anything, or render the Service.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from operators.endpointattachment.api import (
    FAMILY_IPV4,
    METHOD_PORT_LIST,
    METHODS,
    POD_KIND,
    POD_PHASE_FAILED,
    POD_PHASE_SUCCEEDED,
    PROTOCOL_TCP,
    PROTOCOL_UDP,
    WITHDRAWN_SELECTOR_KEY,
)
from operators.endpointattachment.reasons import (
    REASON_BACKEND_ALREADY_DELEGATED,
    REASON_DATAPATH_CONTRACT_UNAVAILABLE,
    REASON_MULTIPLE_BACKENDS,
    REASON_PROVISIONED,
    REASON_RENDER_FAILED,
)

# cozy-proxy forwards these protocols only.
_PROXIED_PROTOCOLS: Final = frozenset({PROTOCOL_TCP, PROTOCOL_UDP})
# Backend keys for endpoints without a pod targetRef are prefixed so they never equal a pod UID.
_ADDRESS_KEY_PREFIX: Final = "address:"
# The creationTimestamp an attachment that is not cached ranks with: "~" sorts after every RFC 3339
# text, so an attachment we cannot see is never the oldest.
UNCACHED_TIMESTAMP: Final = "~"
# Pods in these phases are done: no endpoint will ever point at them again.
_FINISHED_PHASES: Final = frozenset({POD_PHASE_SUCCEEDED, POD_PHASE_FAILED})


@dataclass(frozen=True)
class Verdict:
    """A datapath decision; ``proxy_name`` is the declared name to render when admitted."""

    ok: bool
    reason: str
    message: str
    proxy_name: str | None = None


@dataclass(frozen=True, order=True)
class AttachmentRank:
    """Who wins a backend among attachments: the smaller rank (older, then by name)."""

    creation_timestamp: str
    name: str
    namespace: str = ""
    uid: str = ""


@dataclass(frozen=True)
class ProxiedService:
    """A rival for the backend pods, as the exclusivity check sees it: a Service delegated to a proxy,
    or a VM-mode attachment (``name`` is then its rendered Service's name, rendered or not).

    ``backends`` are the keys (pod UIDs) of every pod it selects, ready or not; ``selector`` its
    selector (None: none known). ``attachment`` is the rank of the attachment that rendered it (its
    controller) or would render it, None for a Service no attachment rendered. ``uid`` and
    ``resource_version`` are the Service's (empty for an attachment not rendered).
    """

    namespace: str
    name: str
    proxy_name: str
    backends: frozenset[str]
    attachment: AttachmentRank | None = None
    selector: Mapping[str, str] | None = None
    uid: str = ""
    resource_version: str = ""


def rank_of(attachment: Mapping[str, Any]) -> AttachmentRank:
    """An attachment's rank, from its metadata."""
    metadata = attachment.get("metadata") or {}
    return AttachmentRank(
        creation_timestamp=str(metadata.get("creationTimestamp") or ""),
        name=str(metadata.get("name") or ""),
        namespace=str(metadata.get("namespace") or ""),
        uid=str(metadata.get("uid") or ""),
    )


def uncached_rank(name: str, namespace: str, uid: str) -> AttachmentRank:
    """The rank of an attachment known only from an owner reference: after every cached one."""
    return AttachmentRank(UNCACHED_TIMESTAMP, name, namespace, uid)


def find_proxy(proxy_name: str | None, method: str, family: str) -> Verdict:
    """The declared datapath for a VM method and the claim's family, or why there is none."""
    if method not in METHODS:
        return Verdict(False, REASON_DATAPATH_CONTRACT_UNAVAILABLE, f"method {method!r} is not a VM mode")
    if not proxy_name:
        return Verdict(
            False,
            REASON_DATAPATH_CONTRACT_UNAVAILABLE,
            f"method {method} needs a cozy-proxy contract implementor, and the platform declares none "
            "(the operator's vm-datapath setting is off)",
        )
    if family != FAMILY_IPV4:
        return Verdict(
            False,
            REASON_DATAPATH_CONTRACT_UNAVAILABLE,
            f"{proxy_name} programs IPv4 only; the claim is {family}",
        )
    return Verdict(True, REASON_PROVISIONED, f"{proxy_name} serves {method}", proxy_name=proxy_name)


def check_port_list(ports: Sequence[Mapping[str, Any]]) -> Verdict:
    """Whether every port can go through cozy-proxy's port list without translation."""
    for port in ports:
        label = port.get("name") or port.get("port")
        protocol = port.get("protocol") or PROTOCOL_TCP
        if protocol not in _PROXIED_PROTOCOLS:
            return Verdict(False, REASON_RENDER_FAILED, f"port {label}: protocol {protocol}")
        target = port.get("targetPort")
        if target is None:  # the API server defaults an absent targetPort to port
            target = port.get("port")
        if isinstance(target, bool) or not isinstance(target, int) or target != port.get("port"):
            return Verdict(
                False,
                REASON_RENDER_FAILED,
                f"port {label}: targetPort {target!r} differs from port {port.get('port')}",
            )
    return Verdict(True, REASON_PROVISIONED, "every port is forwarded as is")


def selects(selector: Mapping[str, str] | None, labels: Mapping[str, str]) -> bool:
    """Service selector semantics: a non-empty selector whose every pair the labels hold."""
    return bool(selector) and (selector or {}).items() <= labels.items()


def withdrawn_selector(selector: Mapping[str, str], attachment_uid: str) -> dict[str, str]:
    """The selector of a Service kept while its backends are withdrawn (MultipleBackends): the
    endpoint's, plus our key valued with the attachment's UID, so it selects no pod."""
    return {**selector, WITHDRAWN_SELECTOR_KEY: attachment_uid}


def is_withdrawn(selector: Mapping[str, Any] | None) -> bool:
    """Whether a Service's selector is a withdrawn one (``withdrawn_selector``)."""
    return bool(selector) and WITHDRAWN_SELECTOR_KEY in (selector or {})


def served_selector(selector: Mapping[str, str] | None) -> Mapping[str, str] | None:
    """The selector a Service serves when published: a withdrawn one without our key (its pods stay
    its own for exclusivity and for cozy-proxy's survivors); any other as it is."""
    if not is_withdrawn(selector):
        return selector
    return {k: v for k, v in (selector or {}).items() if k != WITHDRAWN_SELECTOR_KEY} or None


def selected_pods(selector: Mapping[str, str] | None, pods: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """UIDs of the pods (of one namespace) the selector selects, ready or not, finished ones aside."""
    keys: set[str] = set()
    if not selector:
        return frozenset()  # selects nothing (``selects``)
    wanted = selector.items()
    for pod in pods:
        metadata = pod.get("metadata") or {}
        if (pod.get("status") or {}).get("phase") in _FINISHED_PHASES or not metadata.get("uid"):
            continue
        if wanted <= (metadata.get("labels") or {}).items():  # ``selects``, inline: one call per pod less
            keys.add(str(metadata["uid"]))
    return frozenset(keys)


def slice_pods(endpoint_slices: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """Keys of every endpoint (ready or not) of some EndpointSlices."""
    keys = {backend_key(e) for s in endpoint_slices for e in s.get("endpoints") or ()}
    return frozenset(filter(None, keys))  # neither None nor ""


def selectors_nested(a: Mapping[str, str] | None, b: Mapping[str, str] | None) -> bool:
    """Whether one non-empty selector contains the other: every pod the larger selects, the smaller
    selects too, so the two meet whenever such a pod exists (even while none does)."""
    if not a or not b:
        return False
    pairs_a, pairs_b = set(a.items()), set(b.items())
    return pairs_a <= pairs_b or pairs_b <= pairs_a


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


def programmed_backends(endpoints: Mapping[str, Any] | None) -> tuple[tuple[str, str], ...]:
    """The ready addresses of a Service's **v1 Endpoints**, what cozy-proxy reads (it maps the
    Service's address to the first of them): ``(backend key, how people name it)`` per backend, in
    the API's order, one per pod UID (else per address). Not-ready addresses never count."""
    found: dict[str, str] = {}
    for subset in (endpoints or {}).get("subsets") or ():
        for address in subset.get("addresses") or ():
            target = address.get("targetRef") or {}
            ip = str(address.get("ip") or "")
            key = str(target["uid"]) if target.get("kind") == POD_KIND and target.get("uid") else None
            key = key or (f"{_ADDRESS_KEY_PREFIX}{ip}" if ip else None)
            if key is None or key in found:
                continue
            pod = target.get("name") if target.get("kind") == POD_KIND else None
            found[key] = f"pod {pod} ({ip})" if pod else f"address {ip}"
    return tuple(found.items())


def programmed_token(address: str, backend_key: str) -> str:
    """The value of ``PROGRAMMED_ANNOTATION`` once a VM-mode Service has its address and a backend
    in its v1 Endpoints: deterministic, so the touch that makes cozy-proxy program it happens once
    per (address, backend)."""
    return f"{address}/{backend_key}"


def backend_key(endpoint: Mapping[str, Any]) -> str | None:
    """An endpoint's backend key: its pod's UID, else its first address; None if it has neither."""
    target = endpoint.get("targetRef") or {}
    if target.get("kind") == POD_KIND and target.get("uid"):
        return str(target["uid"])
    addresses = endpoint.get("addresses") or ()
    return f"{_ADDRESS_KEY_PREFIX}{addresses[0]}" if addresses else None


def check_backends(mode: str, backends: frozenset[str]) -> Verdict:
    """Either VM mode publishes only with at most one ready backend: cozy-proxy serves one pod per
    address (the first address of the Endpoints) and leaves the others' egress unmapped."""
    if mode in METHODS and len(backends) > 1:
        return Verdict(
            False,
            REASON_MULTIPLE_BACKENDS,
            f"{len(backends)} ready backends; {mode} publishes one pod per address",
        )
    return Verdict(True, REASON_PROVISIONED, f"{len(backends)} ready backend(s)")


def could_render(mode: str, ports: Sequence[Mapping[str, Any]] | None, proxy_name: str | None) -> bool:
    """Whether an attachment (as a rival) could ever render with what it has now: its endpoint is
    known (``ports``, the ports it would publish, not None), the datapath is declared, and in
    PortList its ports need no translation. One that cannot never takes a pod from anyone; one that
    lacks only an address still counts (it may get one at any moment)."""
    if ports is None or not proxy_name or mode not in METHODS:
        return False
    return mode != METHOD_PORT_LIST or check_port_list(ports).ok


def check_exclusivity(
    me: AttachmentRank,
    my_service: tuple[str, str],
    proxy_name: str,
    backends: frozenset[str],
    others: Iterable[ProxiedService],
    selector: Mapping[str, str] | None = None,
) -> Verdict:
    """Whether this attachment may hold its pods on ``proxy_name``; the loser's message names the winner.

    ``backends`` are the pods the endpoint selects (ready or not), ``selector`` its selector.
    ``my_service`` is (namespace, name) of this attachment's rendered Service (name empty while it has
    none), which is never a rival; nor is any rival ranked with this attachment's UID.
    """
    rivals = [
        other
        for other in others
        if other.proxy_name == proxy_name
        and not (my_service[1] and (other.namespace, other.name) == my_service)
        and not (other.attachment is not None and me.uid and other.attachment.uid == me.uid)
        and meets(other, backends, selector, me.namespace)
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
    return Verdict(True, REASON_PROVISIONED, "no other proxied Service holds these backends")


def meets(
    other: ProxiedService, pods: frozenset[str], selector: Mapping[str, str] | None, namespace: str = ""
) -> bool:
    """Whether a rival shares a pod with these, or its selector nests with this one (same namespace)."""
    if other.backends & pods:
        return True
    return (not namespace or other.namespace == namespace) and selectors_nested(other.selector, selector)


def _lost_to(winner: ProxiedService, what: str) -> Verdict:
    named = (
        f"Service {winner.namespace}/{winner.name}"
        if winner.uid or winner.attachment is None
        else f"EndpointAttachment {winner.namespace}/{winner.attachment.name}"
    )
    return Verdict(
        False,
        REASON_BACKEND_ALREADY_DELEGATED,
        f"a backend pod is published by {named} ({what}); cozy-proxy serves one Service per pod",
    )


def survivors(changed: ProxiedService, others: Iterable[ProxiedService]) -> list[tuple[str, str]]:
    """(namespace, name) of the existing proxied Services, on the same proxy, that cozy-proxy must
    program again after ``changed`` (a proxied Service of ours) is deleted or changed: those whose pods
    meet the pods ``changed`` selected, or whose selector nests with its selector. Only Services that
    exist (a ``uid``) are returned, sorted."""
    found = {
        (other.namespace, other.name)
        for other in others
        if other.uid
        and other.uid != changed.uid
        and other.proxy_name == changed.proxy_name
        and (other.namespace, other.name) != (changed.namespace, changed.name)
        and meets(other, changed.backends, changed.selector, changed.namespace)
    }
    return sorted(found)


def reprogram_token(changed: ProxiedService) -> str:
    """The value written on survivors: the changed Service's UID and resourceVersion (after the write;
    its last one for a deletion). Deterministic, so a repeated pass writes nothing new."""
    return f"{changed.namespace}/{changed.name}/{changed.uid}/{changed.resource_version}"


def admit(
    *,
    mode: str,
    family: str,
    ports: Sequence[Mapping[str, Any]],
    backends: frozenset[str],
    proxy_name: str | None,
    me: AttachmentRank,
    my_service: tuple[str, str],
    others: Iterable[ProxiedService],
    selected: frozenset[str] | None = None,
    selector: Mapping[str, str] | None = None,
) -> Verdict:
    """The whole VM-mode decision, in the order of the module docstring. ``backends`` are the ready
    backends; ``selected`` every pod the endpoint selects (``backends`` when not given)."""
    proxy = find_proxy(proxy_name, mode, family)
    if not proxy.ok or proxy.proxy_name is None:
        return proxy
    checks = [check_backends(mode, backends)]
    if mode == METHOD_PORT_LIST:
        checks.insert(0, check_port_list(ports))
    for verdict in checks:
        if not verdict.ok:
            return verdict
    pods = backends if selected is None else selected | backends
    exclusive = check_exclusivity(me, my_service, proxy.proxy_name, pods, others, selector)
    if not exclusive.ok:
        return exclusive
    return Verdict(True, REASON_PROVISIONED, proxy.message, proxy_name=proxy.proxy_name)
