"""The well-formed objects the catalogue's rows break, one builder per kind, as a person writes them.

Decides: the catalogue's names (every object the rows make starts with ``cat-``, every namespaced one
lives in the group's tenant namespace unless a row says otherwise) and the values the rows take as
"huge" and "unicode".

Does not: say what is wrong with anything (the table modules do).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from harness.ea_cluster import NODE
from harness.ea_objects import helmrelease_spec
from harness.substrate import API_VERSION as SUBSTRATE_API_VERSION
from harness.substrate import DEFAULT_CLASS_ANNOTATION, METALLB_PROVISIONER
from shared.lineage import LABEL_TRUE
from tests.catalogue.model import TENANT, Obj

EA_API_VERSION: Final = "local.sdn.cozystack.io/v1alpha1"
ENDPOINT_ATTACHMENT_KIND: Final = "EndpointAttachment"
# The address substrate's kinds (its CRDs, tests/fixtures/address-substrate/), same group and version.
IP_ADDRESS_CLASS_KIND: Final = "IPAddressClass"
IP_ADDRESS_CLAIM_KIND: Final = "IPAddressClaim"
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
APP_KIND: Final = "Postgres"
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
    kind: str = APP_KIND,
    app: str = APP,
    **load_balancer: Any,
) -> Obj:
    """An attachment as Cozystack documents it: ``app``'s ``endpoint``, minted from ``class_name``
    (None: the default class) or using the reserved ``claim``; ``load_balancer`` adds the rest of
    spec.loadBalancer (family, ports, method, allowICMP)."""
    lb: Obj = {"claimName": claim} if claim else ({"className": class_name} if class_name else {})
    return {
        "apiVersion": EA_API_VERSION,
        "kind": ENDPOINT_ATTACHMENT_KIND,
        "metadata": meta(name, namespace),
        "spec": {
            "applicationRef": {"kind": kind, "name": app},
            "endpoint": {"serviceName": endpoint},
            "loadBalancer": {**lb, **load_balancer},
        },
    }


def claim(
    name: str = "cat-claim",
    *,
    class_name: str | None = CLASS,
    family: str | None = None,
    namespace: str = TENANT,
) -> Obj:
    """A substrate IPAddressClaim (its CRD's shape): of ``class_name`` (None: the default class)."""
    spec: Obj = {}
    if class_name is not None:
        spec["className"] = class_name
    if family is not None:
        spec["family"] = family
    return {
        "apiVersion": SUBSTRATE_API_VERSION,
        "kind": IP_ADDRESS_CLAIM_KIND,
        "metadata": meta(name, namespace),
        "spec": spec,
    }


def address_class(
    name: str = "cat-class",
    cidrs: Sequence[str] = (CLASS_CIDR,),
    *,
    default: bool = False,
    provisioner: str = METALLB_PROVISIONER,
) -> Obj:
    """A substrate IPAddressClass served by ``provisioner`` from ``cidrs``; reclaim Delete, so an
    address a row minted goes with its claim (the runner checks nothing is left); the default class
    for claims naming none with ``default``."""
    metadata = meta(name)
    if default:
        metadata["annotations"] = {DEFAULT_CLASS_ANNOTATION: LABEL_TRUE}
    return {
        "apiVersion": SUBSTRATE_API_VERSION,
        "kind": IP_ADDRESS_CLASS_KIND,
        "metadata": metadata,
        "spec": {
            "provisioner": provisioner,
            "reclaimPolicy": "Delete",
            "parameters": {"addresses": list(cidrs)},
        },
    }


def service(
    name: str,
    *,
    labels: Mapping[str, str] | None,
    selector: Mapping[str, str] | None = APP_SELECTOR,
    ports: Sequence[Mapping[str, Any]] | None = None,
    namespace: str = TENANT,
    annotations: Mapping[str, str] | None = None,
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
    if annotations:
        metadata["annotations"] = dict(annotations)
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
        "spec": helmrelease_spec(),
    }
