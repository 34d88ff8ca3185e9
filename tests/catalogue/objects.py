"""The well-formed objects the catalogue's rows break, one builder per kind, as a person writes them.

Decides: the catalogue's names (every object the rows make starts with ``cat-``, every namespaced one
lives in the group's tenant namespace unless a row says otherwise) and the values the rows take as
"huge" and "unicode".

Does not: say what is wrong with anything (the table modules do).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from operators.endpointattachment.constants import (
    API_VERSION,
    ENDPOINT_ATTACHMENT_KIND,
    IP_ADDRESS_ALLOCATION_KIND,
    IP_ADDRESS_CLAIM_KIND,
    IP_ADDRESS_CLASS_KIND,
    SERVICE_PROXY_KIND,
)
from tests.catalogue.model import TENANT, Obj
from tests.support.ea_cluster import NODE

GPU_API_VERSION: Final = "gpu.cozystack.io/v1alpha1"
GPU_CLASS_KIND: Final = "GPUClass"
HELMRELEASE_API_VERSION: Final = "helm.toolkit.fluxcd.io/v2"

# Far longer than any field allows (100,000 characters), well under the API server's request limit.
HUGE: Final = "a" * 100_000
# A name in a script no DNS name allows; and a lookalike of an ASCII name.
UNICODE: Final = "ünïcødé"
CYRILLIC_A: Final = "\u0430"  # looks like "a"

# The address class every attachment row mints from unless it says otherwise (a /28: 14 addresses).
CLASS: Final = "cat-v4"
CLASS_CIDR: Final = "198.51.100.0/28"
# The tenant's application and its tenant-facing Service.
APP: Final = "db"
ENDPOINT: Final = "postgres-db-rw"
APP_SELECTOR: Final = {"app": "cat-db"}


def meta(name: str, namespace: str | None = None, **extra: Any) -> Obj:
    metadata: Obj = {"name": name, **extra}
    if namespace is not None:
        metadata["namespace"] = namespace
    return metadata


def gpu_class(name: str = "cat-gpu", resource: str = "nvidia.com/GH100_H200_SXM_141GB", **spec: Any) -> Obj:
    return {
        "apiVersion": GPU_API_VERSION,
        "kind": GPU_CLASS_KIND,
        "metadata": meta(name),
        "spec": {"resourceName": resource, **spec},
    }


def attachment(
    name: str = "cat-ea",
    *,
    endpoint: str = ENDPOINT,
    class_name: str | None = CLASS,
    claim: str | None = None,
    namespace: str = TENANT,
    **spec: Any,
) -> Obj:
    address: Obj = {"claimName": claim} if claim else {"className": class_name}
    return {
        "apiVersion": API_VERSION,
        "kind": ENDPOINT_ATTACHMENT_KIND,
        "metadata": meta(name, namespace),
        "spec": {"endpoint": {"name": endpoint}, "address": address, **spec},
    }


def claim(
    name: str = "cat-claim", *, class_name: str = CLASS, address: str | None = None, namespace: str = TENANT
) -> Obj:
    spec: Obj = {"className": class_name}
    if address is not None:
        spec["address"] = address
    return {
        "apiVersion": API_VERSION,
        "kind": IP_ADDRESS_CLAIM_KIND,
        "metadata": meta(name, namespace),
        "spec": spec,
    }


def address_class(name: str = "cat-class", cidrs: Sequence[str] | None = (CLASS_CIDR,), **spec: Any) -> Obj:
    body: Obj = dict(spec)
    if cidrs is not None:
        body["cidrs"] = list(cidrs)
    return {"apiVersion": API_VERSION, "kind": IP_ADDRESS_CLASS_KIND, "metadata": meta(name), "spec": body}


def allocation(address: str = "198.51.100.200", name: str | None = None, **holder: Any) -> Obj:
    held_by = {
        "kind": ENDPOINT_ATTACHMENT_KIND,
        "namespace": "tenant-a",
        "name": "db",
        "uid": "u-1",
        **holder,
    }
    return {
        "apiVersion": API_VERSION,
        "kind": IP_ADDRESS_ALLOCATION_KIND,
        "metadata": meta(name or address),
        "spec": {"address": address, "className": CLASS, "holder": held_by},
    }


def service_proxy(name: str = "cat-proxy", proxy_name: str = "cozy-proxy", **spec: Any) -> Obj:
    body: Obj = {"serviceProxyName": proxy_name, "modes": ["PortList", "WholeIP"], **spec}
    return {"apiVersion": API_VERSION, "kind": SERVICE_PROXY_KIND, "metadata": meta(name), "spec": body}


def service(
    name: str,
    *,
    labels: Mapping[str, str] | None,
    selector: Mapping[str, str] | None = APP_SELECTOR,
    ports: Sequence[Mapping[str, Any]] | None = None,
    namespace: str = TENANT,
    **spec: Any,
) -> Obj:
    body: Obj = {
        "ports": list(ports)
        if ports is not None
        else [{"name": "postgres", "protocol": "TCP", "port": 5432, "targetPort": 5432}],
        **spec,
    }
    if selector is not None:
        body["selector"] = dict(selector)
    metadata = meta(name, namespace)
    if labels:
        metadata["labels"] = dict(labels)
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": body}


def pod(name: str, labels: Mapping[str, str] = APP_SELECTOR, namespace: str = TENANT) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta(name, namespace, labels=dict(labels)),
        "spec": {"nodeName": NODE, "containers": [{"name": "vm", "image": "example.invalid/vm:1"}]},
    }


def helmrelease(name: str, labels: Mapping[str, str], namespace: str = TENANT) -> Obj:
    return {
        "apiVersion": HELMRELEASE_API_VERSION,
        "kind": "HelmRelease",
        "metadata": meta(name, namespace, labels=dict(labels)),
        "spec": {
            "interval": "5m",
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
        },
    }
