"""Builders for the objects the EndpointAttachment operator observes, shaped as the API returns them.

Every builder returns a fresh plain dict with sensible defaults (one Postgres application ``db`` in
namespace ``tenant-a`` behind the HelmRelease ``postgres-db``, its tenant-facing endpoint
``postgres-db-rw``, an attachment ``db-public`` minting from the class ``public``, whose claim is
Bound to ``203.0.113.7``), so a test states only what it varies. Unit tests pass the dicts to the pure
core; integration tests can create them (drop ``status`` and the server-set metadata first with
``for_create``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from harness.ea_objects import APP_GROUP as APP_GROUP
from harness.ea_objects import APP_KIND as APP_KIND
from harness.ea_objects import APP_NAME as APP_NAME
from harness.ea_objects import HELMRELEASE_API_VERSION as HELMRELEASE_API_VERSION
from harness.ea_objects import attachment_spec, helmrelease_spec
from harness.ea_objects import for_create as for_create
from harness.ea_objects import lineage_labels as lineage_labels
from harness.ea_objects import load_balancer_spec as load_balancer_spec
from operators.endpointattachment.api import (
    API_VERSION,
    ATTACHMENT_KIND,
    CLAIM_KIND,
    DEFAULT_CLASS_ANNOTATION,
    ENDPOINTSLICE_SERVICE_NAME_LABEL,
    HELMRELEASE_KIND,
    POD_KIND,
)
from shared.lineage import APPLICATION_GROUP_LABEL, APPLICATION_KIND_LABEL, APPLICATION_NAME_LABEL
from shared.ownership import owner_reference

NAMESPACE = "tenant-a"
HELMRELEASE_NAME = "postgres-db"
HELMRELEASE_UID = "hr-uid-1"
ENDPOINT = "postgres-db-rw"
ATTACHMENT = "db-public"
ATTACHMENT_UID = "ea-uid-1"
CLASS = "public"
# The claim ``db-public`` minted (generateName ``db-public-``), and its address.
CLAIM = "db-public-k2m9p"
ADDRESS = "203.0.113.7"
ADDRESS_V6 = "2001:db8::7"
# The substrate's MetalLB driver (its class's spec.provisioner).
METALLB_PROVISIONER = "metallb.drivers.local.sdn.cozystack.io"
CREATED = "2024-01-01T00:00:00Z"
DELETED = "2024-01-02T00:00:00Z"

Obj = dict[str, Any]
# A backend in an EndpointSlice: (pod UID or None, address, ready: True / False / None for "not said").
Backend = tuple[str | None, str, bool | None]


def application_labels(group: str = APP_GROUP, kind: str = APP_KIND, name: str = APP_NAME) -> dict[str, str]:
    """The three lineage labels alone: what the operator stamps on an attachment."""
    return {APPLICATION_GROUP_LABEL: group, APPLICATION_KIND_LABEL: kind, APPLICATION_NAME_LABEL: name}


def _metadata(
    name: str,
    namespace: str | None,
    uid: str,
    labels: Mapping[str, str] | None,
    created: str = CREATED,
    *,
    annotations: Mapping[str, str] | None = None,
    owner_references: Sequence[Mapping[str, Any]] = (),
    deleting: bool = False,
) -> Obj:
    metadata: Obj = {"name": name, "uid": uid, "creationTimestamp": created, "resourceVersion": "1"}
    if namespace is not None:
        metadata["namespace"] = namespace
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    if owner_references:
        metadata["ownerReferences"] = [dict(ref) for ref in owner_references]
    if deleting:
        metadata["deletionTimestamp"] = DELETED
    return metadata


def controlled_by(owner: Mapping[str, Any]) -> list[Obj]:
    """The controller owner reference our writes put on a rendered Service or a minted claim."""
    return [owner_reference(owner, controller=True, block_owner_deletion=True)]


def make_service(
    name: str = ENDPOINT,
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
    created: str = CREATED,
    deleting: bool = False,
) -> Obj:
    """A Service; by default the tenant-facing endpoint of application ``db`` (lineage and the
    tenant-facing marker; ``selector={}`` for none)."""
    metadata = _metadata(
        name,
        namespace,
        uid or f"svc-uid-{name}",
        lineage_labels() if labels is None else labels,
        created,
        annotations=annotations,
        owner_references=owner_references,
        deleting=deleting,
    )
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


def vm_endpoint(name: str = "vm-vm1", namespace: str = NAMESPACE, **changes: Any) -> Obj:
    """A vm-instance endpoint: headless, its one sentinel port (65535) until the chart exposes it."""
    defaults: dict[str, Any] = {
        "labels": lineage_labels(kind="VMInstance", name="vm1"),
        "selector": {"vm.kubevirt.io/name": "vm1"},
        "ports": [{"name": "sentinel", "protocol": "TCP", "port": 65535, "targetPort": 65535}],
    }
    service = make_service(name, namespace, **{**defaults, **changes})
    service["spec"]["clusterIP"] = "None"
    return service


def make_helmrelease(
    name: str = HELMRELEASE_NAME,
    namespace: str = NAMESPACE,
    *,
    uid: str = HELMRELEASE_UID,
    labels: Mapping[str, str] | None = None,
) -> Obj:
    """The Flux HelmRelease behind application ``db`` (its lineage labels; its UID is the identity)."""
    return {
        "apiVersion": HELMRELEASE_API_VERSION,
        "kind": HELMRELEASE_KIND,
        "metadata": _metadata(
            name, namespace, uid, lineage_labels(tenant_facing=False) if labels is None else labels
        ),
        "spec": helmrelease_spec(),
    }


def helmrelease_owner(name: str = HELMRELEASE_NAME, uid: str = HELMRELEASE_UID) -> Obj:
    """The owner reference an attachment carries once stamped (not a controller, never blocking)."""
    return {
        "apiVersion": HELMRELEASE_API_VERSION,
        "kind": HELMRELEASE_KIND,
        "name": name,
        "uid": uid,
        "controller": False,
        "blockOwnerDeletion": False,
    }


def make_attachment(
    name: str = ATTACHMENT,
    namespace: str = NAMESPACE,
    *,
    uid: str = ATTACHMENT_UID,
    app_kind: str = APP_KIND,
    app_name: str = APP_NAME,
    app_group: str | None = None,
    endpoint: str = ENDPOINT,
    class_name: str | None = None,
    claim_name: str | None = None,
    family: str | None = None,
    ports: Sequence[int] | None = None,
    method: str | None = None,
    allow_icmp: bool | None = None,
    owner_uid: str | None = HELMRELEASE_UID,
    stamped: bool | None = None,
    created: str = CREATED,
    generation: int = 1,
    status: Mapping[str, Any] | None = None,
    finalizers: Sequence[str] = (),
    deleting: bool = False,
) -> Obj:
    """An EndpointAttachment in Cozystack's shape; by default already stamped by the operator (the
    owner reference to ``db``'s HelmRelease and its lineage labels: ``owner_uid=None`` for neither;
    ``stamped`` overrides the labels alone). Neither ``class_name`` nor ``claim_name``: the default
    class."""
    labelled = owner_uid is not None if stamped is None else stamped
    metadata = _metadata(
        name,
        namespace,
        uid,
        application_labels(app_group or APP_GROUP, app_kind, app_name) if labelled else None,
        created,
        owner_references=[helmrelease_owner(uid=owner_uid)] if owner_uid is not None else (),
        deleting=deleting,
    )
    metadata["generation"] = generation
    if finalizers:
        metadata["finalizers"] = list(finalizers)
    load_balancer = load_balancer_spec(
        class_name=class_name,
        claim_name=claim_name,
        family=family,
        ports=ports,
        method=method,
        allow_icmp=allow_icmp,
    )
    obj: Obj = {
        "apiVersion": API_VERSION,
        "kind": ATTACHMENT_KIND,
        "metadata": metadata,
        "spec": attachment_spec(app_kind, app_name, app_group, endpoint, load_balancer),
    }
    if status is not None:
        obj["status"] = dict(status)
    return obj


def make_class(
    name: str = CLASS,
    *,
    provisioner: str = METALLB_PROVISIONER,
    load_balancer_class: str | None = None,
    default: bool = False,
    addresses: Sequence[str] = ("203.0.113.0/26",),
    reclaim_policy: str | None = None,
) -> Obj:
    """An IPAddressClass (cluster-scoped); ``load_balancer_class`` is Cozystack's controller's field,
    absent from the core's CRD at the pinned revision."""
    spec: Obj = {"provisioner": provisioner, "parameters": {"addresses": list(addresses)}}
    if reclaim_policy is not None:
        spec["reclaimPolicy"] = reclaim_policy
    if load_balancer_class is not None:
        spec["loadBalancerClass"] = load_balancer_class
    return {
        "apiVersion": API_VERSION,
        "kind": "IPAddressClass",
        "metadata": _metadata(
            name,
            None,
            f"class-uid-{name}",
            None,
            annotations={DEFAULT_CLASS_ANNOTATION: "true"} if default else None,
        ),
        "spec": spec,
    }


def make_claim(
    name: str = CLAIM,
    namespace: str = NAMESPACE,
    *,
    uid: str | None = None,
    class_name: str | None = CLASS,
    family: str | None = None,
    phase: str | None = "Bound",
    addresses: Sequence[str] = (ADDRESS,),
    status_class: str | None = CLASS,
    owner: Mapping[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
    conditions: Sequence[Mapping[str, Any]] = (),
    created: str = CREATED,
    deleting: bool = False,
) -> Obj:
    """An IPAddressClaim; ``owner`` is the attachment that minted it (a controller reference; None: a
    tenant's reserved claim). ``status.addresses`` is written only while Bound (``phase`` None: not
    yet reconciled by the substrate)."""
    metadata = _metadata(
        name,
        namespace,
        uid or f"claim-uid-{name}",
        labels,
        created,
        owner_references=controlled_by(owner) if owner is not None else (),
        deleting=deleting,
    )
    spec: Obj = {}
    if class_name is not None:
        spec["className"] = class_name
    if family is not None:
        spec["family"] = family
    status: Obj = {}
    if phase is not None:
        status["phase"] = phase
        if status_class is not None:
            status["className"] = status_class
    if phase == "Bound":
        status["addresses"] = [{"name": address_name(a), "address": a} for a in addresses]
    if conditions:
        status["conditions"] = [dict(c) for c in conditions]
    return {
        "apiVersion": API_VERSION,
        "kind": CLAIM_KIND,
        "metadata": metadata,
        "spec": spec,
        "status": status,
    }


def address_name(ip: str) -> str:
    """An IPAddress's name from its IP (the driver's: IPv6 with ``:`` spelt ``-``)."""
    return ip.replace(":", "-")


def make_ip_address(
    address: str = ADDRESS,
    *,
    claim: tuple[str, str] | None = (NAMESPACE, CLAIM),
    associated_to: tuple[str, str] | None = None,
    class_name: str = CLASS,
    phase: str = "Bound",
) -> Obj:
    """An IPAddress (cluster-scoped, named from the IP): ``claim`` is its ``spec.claimRef`` (namespace,
    name), ``associated_to`` the (namespace, name) of the Service the driver announces it for."""
    name = address_name(address)
    spec: Obj = {"address": address, "className": class_name, "source": {"fromClass": {}}}
    if claim is not None:
        spec["claimRef"] = {"namespace": claim[0], "name": claim[1], "uid": f"claim-uid-{claim[1]}"}
    status: Obj = {"phase": phase}
    if associated_to is not None:
        status["associatedTo"] = {"kind": "Service", "namespace": associated_to[0], "name": associated_to[1]}
    return {
        "apiVersion": API_VERSION,
        "kind": "IPAddress",
        "metadata": _metadata(name, None, f"address-uid-{name}", None),
        "spec": spec,
        "status": status,
    }


def as_stored(
    manifest: Mapping[str, Any],
    name: str | None = None,
    *,
    uid: str | None = None,
    ingress: Sequence[str] = (),
    created: str = CREATED,
    annotations: Mapping[str, str] | None = None,
) -> Obj:
    """A rendered manifest (``generateName``) as the API server stores it: named, with a UID, a
    creation time, a cluster IP for a Service, and ``ingress`` announced in its status."""
    stored = copy.deepcopy(dict(manifest))
    metadata = stored["metadata"]
    prefix = str(metadata.pop("generateName", ""))
    metadata["name"] = name or f"{prefix}x7ktq"
    metadata.update(
        {"uid": uid or f"uid-{metadata['name']}", "creationTimestamp": created, "resourceVersion": "2"}
    )
    if annotations:
        metadata["annotations"] = {**(metadata.get("annotations") or {}), **annotations}
    if stored.get("kind") == "Service":
        stored["spec"]["clusterIP"] = "10.96.1.1"
        stored["status"] = {"loadBalancer": {"ingress": [{"ip": ip} for ip in ingress]} if ingress else {}}
    return stored


def make_pod(
    name: str = "db-0",
    namespace: str = NAMESPACE,
    *,
    uid: str = "pod-uid-1",
    labels: Mapping[str, str] | None = None,
    phase: str = "Running",
) -> Obj:
    """A Pod as the operator's cache keeps it; by default selected by the default endpoint."""
    return {
        "apiVersion": "v1",
        "kind": POD_KIND,
        "metadata": _metadata(
            name, namespace, uid, {"app": "db", "role": "primary"} if labels is None else labels
        ),
        "status": {"phase": phase},
    }


def _pod_ref(pod_uid: str, namespace: str) -> Obj:
    """An endpoint's targetRef to the backend pod ``pod-<uid>``."""
    return {"kind": POD_KIND, "namespace": namespace, "name": f"pod-{pod_uid}", "uid": pod_uid}


def make_endpointslice(
    service: str = ENDPOINT,
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
    service: str = "db-public-x7ktq",
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
