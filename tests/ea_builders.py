"""Builders for the objects the EndpointAttachment operator observes, shaped as the API returns them.

Every builder returns a fresh plain dict with sensible defaults (one Postgres application ``db`` in
namespace ``tenant-a``, a MetalLB IPv4 class ``public-v4``), so a test states only what it varies.
Unit tests pass the dicts to the pure core; integration tests can create them (drop ``status`` and the
server-set metadata first with ``for_create``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from operators.endpointattachment.addresses import allocation_name
from operators.endpointattachment.constants import (
    API_VERSION,
    ENDPOINT_ATTACHMENT_KIND,
    ENDPOINTSLICE_SERVICE_NAME_LABEL,
    HELMRELEASE_API_VERSION,
    HELMRELEASE_KIND,
    IP_ADDRESS_ALLOCATION_KIND,
    IP_ADDRESS_CLAIM_KIND,
    IP_ADDRESS_CLASS_KIND,
    POD_KIND,
    SERVICE_PROXY_KIND,
)
from shared.lineage import (
    APPLICATION_GROUP_LABEL,
    APPLICATION_KIND_LABEL,
    APPLICATION_NAME_LABEL,
    LABEL_TRUE,
    MANAGED_BY_COZYSTACK_LABEL,
    TENANT_RESOURCE_LABEL,
)

NAMESPACE = "tenant-a"
APP_GROUP = "apps.cozystack.io"
APP_KIND = "Postgres"
APP_NAME = "db"
HELMRELEASE_NAME = "postgres-db"
HELMRELEASE_UID = "hr-uid-1"
ATTACHMENT_UID = "ea-uid-1"
CREATED = "2024-01-01T00:00:00Z"

Obj = dict[str, Any]
# A backend in an EndpointSlice: (pod UID or None, address, ready: True / False / None for "not said").
Backend = tuple[str | None, str, bool | None]


def lineage_labels(
    group: str = APP_GROUP, kind: str = APP_KIND, name: str = APP_NAME, *, tenant_facing: bool = True
) -> dict[str, str]:
    """The labels Cozystack's webhook stamps on an application's object."""
    labels = {
        APPLICATION_GROUP_LABEL: group,
        APPLICATION_KIND_LABEL: kind,
        APPLICATION_NAME_LABEL: name,
        MANAGED_BY_COZYSTACK_LABEL: LABEL_TRUE,
    }
    if tenant_facing:
        labels[TENANT_RESOURCE_LABEL] = LABEL_TRUE
    return labels


def _metadata(
    name: str, namespace: str | None, uid: str, labels: Mapping[str, str] | None, created: str = CREATED
) -> Obj:
    metadata: Obj = {"name": name, "uid": uid, "creationTimestamp": created, "resourceVersion": "1"}
    if namespace is not None:
        metadata["namespace"] = namespace
    if labels:
        metadata["labels"] = dict(labels)
    return metadata


def make_service(
    name: str = "postgres-db-rw",
    namespace: str = NAMESPACE,
    *,
    uid: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    selector: Mapping[str, str] | None = None,
    ports: Sequence[Mapping[str, Any]] | None = None,
    type_: str = "ClusterIP",
    owner_references: Sequence[Mapping[str, Any]] = (),
    ingress: Sequence[str] = (),
    deleting: bool = False,
) -> Obj:
    """A Service; by default the tenant-facing endpoint of application ``db``."""
    metadata = _metadata(
        name, namespace, uid or f"svc-uid-{name}", lineage_labels() if labels is None else labels
    )
    if annotations:
        metadata["annotations"] = dict(annotations)
    if owner_references:
        metadata["ownerReferences"] = [dict(ref) for ref in owner_references]
    if deleting:
        metadata["deletionTimestamp"] = "2024-01-02T00:00:00Z"
    spec: Obj = {
        "type": type_,
        "selector": dict({"app": "db", "role": "primary"} if selector is None else selector),
        "ports": [dict(p) for p in ports]
        if ports is not None
        else [{"name": "postgres", "protocol": "TCP", "port": 5432, "targetPort": 5432}],
        "clusterIP": "10.96.0.10",
    }
    status: Obj = {
        "loadBalancer": {"ingress": [{"ip": ip, "ipMode": "VIP"} for ip in ingress]} if ingress else {}
    }
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": spec, "status": status}


def make_helmrelease(
    name: str = HELMRELEASE_NAME,
    namespace: str = NAMESPACE,
    *,
    uid: str = HELMRELEASE_UID,
    labels: Mapping[str, str] | None = None,
) -> Obj:
    """The Flux HelmRelease behind application ``db``."""
    return {
        "apiVersion": HELMRELEASE_API_VERSION,
        "kind": HELMRELEASE_KIND,
        "metadata": _metadata(
            name, namespace, uid, lineage_labels(tenant_facing=False) if labels is None else labels
        ),
        # Flux's CRD requires a chart source; Cozystack's applications come from its own repository.
        "spec": {
            "chart": {
                "spec": {
                    "chart": "postgres",
                    "sourceRef": {
                        "kind": "HelmRepository",
                        "name": "cozystack-apps",
                        "namespace": "cozy-public",
                    },
                }
            },
            "interval": "5m",
        },
    }


def helmrelease_owner(name: str = HELMRELEASE_NAME, uid: str = HELMRELEASE_UID) -> Obj:
    """The owner reference an attachment carries once stamped."""
    return {
        "apiVersion": HELMRELEASE_API_VERSION,
        "kind": HELMRELEASE_KIND,
        "name": name,
        "uid": uid,
        "controller": False,
        "blockOwnerDeletion": False,
    }


def make_attachment(
    name: str = "db-public",
    namespace: str = NAMESPACE,
    *,
    uid: str = ATTACHMENT_UID,
    endpoint: str = "postgres-db-rw",
    class_name: str | None = "public-v4",
    claim_name: str | None = None,
    mode: str | None = None,
    allow_icmp: bool | None = None,
    owner_uid: str | None = HELMRELEASE_UID,
    created: str = CREATED,
    generation: int = 1,
    status: Mapping[str, Any] | None = None,
    deleting: bool = False,
) -> Obj:
    """An EndpointAttachment; by default already stamped with the owner reference to ``db``."""
    metadata = _metadata(name, namespace, uid, None, created)
    metadata["generation"] = generation
    if owner_uid is not None:
        metadata["ownerReferences"] = [helmrelease_owner(uid=owner_uid)]
    if deleting:
        metadata["deletionTimestamp"] = "2024-01-02T00:00:00Z"
    address: Obj = {"claimName": claim_name} if claim_name else {"className": class_name}
    spec: Obj = {"endpoint": {"name": endpoint}, "address": address}
    if mode is not None:
        spec["mode"] = mode
    if allow_icmp is not None:
        spec["allowICMP"] = allow_icmp
    obj: Obj = {
        "apiVersion": API_VERSION,
        "kind": ENDPOINT_ATTACHMENT_KIND,
        "metadata": metadata,
        "spec": spec,
    }
    if status is not None:
        obj["status"] = dict(status)
    return obj


def make_class(
    name: str = "public-v4",
    *,
    cidrs: Sequence[str] | None = ("203.0.113.0/26",),
    ranges: Sequence[Mapping[str, str]] | None = None,
    exclude: Sequence[str] | None = None,
    provider: str | None = "MetalLB",
    metallb_pool: str | None = None,
    load_balancer_class: str | None = None,
    allowed_namespaces: Mapping[str, Any] | None = None,
) -> Obj:
    """An IPAddressClass (cluster-scoped)."""
    spec: Obj = {}
    if cidrs is not None:
        spec["cidrs"] = list(cidrs)
    if ranges is not None:
        spec["ranges"] = [dict(r) for r in ranges]
    if exclude is not None:
        spec["excludeAddresses"] = list(exclude)
    if provider is not None:
        spec["provider"] = provider
    if metallb_pool is not None:
        spec["metallbAddressPool"] = metallb_pool
    if load_balancer_class is not None:
        spec["loadBalancerClass"] = load_balancer_class
    if allowed_namespaces is not None:
        spec["allowedNamespaces"] = dict(allowed_namespaces)
    return {
        "apiVersion": API_VERSION,
        "kind": IP_ADDRESS_CLASS_KIND,
        "metadata": _metadata(name, None, f"class-uid-{name}", None),
        "spec": spec,
    }


def make_claim(
    name: str = "my-ip",
    namespace: str = NAMESPACE,
    *,
    class_name: str = "public-v4",
    address: str | None = "203.0.113.20",
    phase: str | None = "Bound",
    user: tuple[str, str] | None = None,
    deleting: bool = False,
) -> Obj:
    """An IPAddressClaim; ``user`` is the (name, uid) of the attachment recorded as using it."""
    metadata = _metadata(name, namespace, f"claim-uid-{name}", None)
    if deleting:
        metadata["deletionTimestamp"] = "2024-01-02T00:00:00Z"
    spec: Obj = {"className": class_name}
    if address is not None:
        spec["address"] = address
    status: Obj = {}
    if phase is not None:
        status["phase"] = phase
    if address is not None and phase == "Bound":
        status["address"] = address
    if user is not None:
        status["attachment"] = {"name": user[0], "uid": user[1]}
    return {
        "apiVersion": API_VERSION,
        "kind": IP_ADDRESS_CLAIM_KIND,
        "metadata": metadata,
        "spec": spec,
        "status": status,
    }


# The default allocation's holder: (kind, namespace, name, uid) of the default attachment.
ATTACHMENT_HOLDER = (ENDPOINT_ATTACHMENT_KIND, NAMESPACE, "db-public", ATTACHMENT_UID)


def make_allocation(
    address: str = "203.0.113.10",
    *,
    class_name: str = "public-v4",
    holder: tuple[str, str, str, str] | None = ATTACHMENT_HOLDER,
    uid: str | None = None,
    created: str | None = CREATED,
) -> Obj:
    """An IPAddressAllocation (cluster-scoped, named by its address); ``holder`` is (kind, namespace,
    name, uid) or None for none; ``created`` None leaves out the creationTimestamp."""
    name = allocation_name(address)
    metadata = _metadata(name, None, uid or f"alloc-uid-{name}", None, created or "")
    if created is None:
        del metadata["creationTimestamp"]
    spec: Obj = {"address": address, "className": class_name}
    if holder is not None:
        kind, namespace, holder_name, holder_uid = holder
        spec["holder"] = {"kind": kind, "namespace": namespace, "name": holder_name, "uid": holder_uid}
    return {"apiVersion": API_VERSION, "kind": IP_ADDRESS_ALLOCATION_KIND, "metadata": metadata, "spec": spec}


def _pod_ref(pod_uid: str, namespace: str) -> Obj:
    """An endpoint's targetRef to the backend pod ``pod-<uid>``."""
    return {"kind": POD_KIND, "namespace": namespace, "name": f"pod-{pod_uid}", "uid": pod_uid}


def make_endpointslice(
    service: str = "postgres-db-rw",
    namespace: str = NAMESPACE,
    *,
    backends: Sequence[Backend] = (("pod-uid-1", "10.244.0.10", True),),
    name: str | None = None,
    address_type: str = "IPv4",
) -> Obj:
    """An EndpointSlice of ``service`` with one endpoint per backend."""
    endpoints = []
    for pod_uid, address, ready in backends:
        endpoint: Obj = {"addresses": [address], "conditions": {}}
        if ready is not None:
            endpoint["conditions"]["ready"] = ready
        if pod_uid is not None:
            endpoint["targetRef"] = _pod_ref(pod_uid, namespace)
        endpoints.append(endpoint)
    slice_name = name or f"{service}-abcde"
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": _metadata(
            slice_name, namespace, f"slice-uid-{slice_name}", {ENDPOINTSLICE_SERVICE_NAME_LABEL: service}
        ),
        "addressType": address_type,
        "endpoints": endpoints,
        "ports": [{"name": "postgres", "protocol": "TCP", "port": 5432}],
    }


def make_endpoints(
    service: str = "ea-db-vm",
    namespace: str = NAMESPACE,
    *,
    backends: Sequence[Backend] = (("pod-uid-1", "10.244.0.10", True),),
) -> Obj:
    """The v1 Endpoints of ``service`` (what cozy-proxy reads): one subset, ready backends in
    ``addresses`` and the others (ready False) in ``notReadyAddresses``, in the order given."""
    ready: list[Obj] = []
    not_ready: list[Obj] = []
    for pod_uid, address, is_ready in backends:
        entry: Obj = {"ip": address}
        if pod_uid is not None:
            entry["targetRef"] = _pod_ref(pod_uid, namespace)
        (not_ready if is_ready is False else ready).append(entry)
    subset: Obj = {"ports": [{"port": 5432, "protocol": "TCP"}]}
    if ready:
        subset["addresses"] = ready
    if not_ready:
        subset["notReadyAddresses"] = not_ready
    return {
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": _metadata(service, namespace, f"endpoints-uid-{service}", {}),
        "subsets": [subset] if ready or not_ready else [],
    }


def make_serviceproxy(
    name: str = "cozy-proxy",
    *,
    proxy_name: str = "cozy-proxy",
    modes: Sequence[str] = ("PortList", "WholeIP"),
    families: Sequence[str] | None = ("IPv4",),
    deleting: bool = False,
) -> Obj:
    """A ServiceProxy declaration (cluster-scoped)."""
    metadata = _metadata(name, None, f"proxy-uid-{name}", None)
    if deleting:
        metadata["deletionTimestamp"] = "2024-01-02T00:00:00Z"
    spec: Obj = {"serviceProxyName": proxy_name, "modes": list(modes)}
    if families is not None:
        spec["ipFamilies"] = list(families)
    return {"apiVersion": API_VERSION, "kind": SERVICE_PROXY_KIND, "metadata": metadata, "spec": spec}


def make_namespace_labels(name: str = NAMESPACE, **extra: str) -> dict[str, str]:
    """A namespace's labels as the API server sets them, plus ``extra``."""
    return {"kubernetes.io/metadata.name": name, **extra}


def for_create(obj: Mapping[str, Any]) -> Obj:
    """A copy without ``status`` and what the API server sets (metadata, a Service's cluster IP),
    ready to POST."""
    server_set = {"uid", "creationTimestamp", "resourceVersion", "generation", "deletionTimestamp"}
    metadata = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in server_set}
    body: Obj = {**{k: v for k, v in obj.items() if k not in ("status", "metadata")}, "metadata": metadata}
    if obj.get("kind") == "Service":
        body["spec"] = {k: v for k, v in (obj.get("spec") or {}).items() if k != "clusterIP"}
    return body
