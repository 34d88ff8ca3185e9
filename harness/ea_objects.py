"""The pieces of Cozystack's objects that the EndpointAttachment unit builders (``tests/ea_builders.py``)
and the integration world (``harness.ea_cluster``) both write: an application's lineage labels, a
HelmRelease's chart, ``spec.loadBalancer``, and a copy of an object ready to create.

Plain dicts, no client: the unit tests import them through ``tests.ea_builders``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from operators.endpointattachment.api import HELMRELEASE_GROUP
from shared.lineage import (
    APPLICATION_GROUP_LABEL,
    APPLICATION_KIND_LABEL,
    APPLICATION_NAME_LABEL,
    LABEL_TRUE,
    MANAGED_BY_COZYSTACK_LABEL,
    TENANT_RESOURCE_LABEL,
)

Obj = dict[str, Any]

APP_GROUP = "apps.cozystack.io"
APP_KIND = "Postgres"
APP_NAME = "db"
HELMRELEASE_API_VERSION = f"{HELMRELEASE_GROUP}/v2"


def lineage_labels(
    group: str = APP_GROUP, kind: str = APP_KIND, name: str = APP_NAME, *, tenant_facing: bool = True
) -> dict[str, str]:
    """The labels Cozystack's webhook stamps on an application's object (the tenant-facing marker
    only on the Services its application lists as endpoints)."""
    labels = {
        APPLICATION_GROUP_LABEL: group,
        APPLICATION_KIND_LABEL: kind,
        APPLICATION_NAME_LABEL: name,
        MANAGED_BY_COZYSTACK_LABEL: LABEL_TRUE,
    }
    if tenant_facing:
        labels[TENANT_RESOURCE_LABEL] = LABEL_TRUE
    return labels


def helmrelease_spec() -> Obj:
    """A HelmRelease's spec: Flux's CRD requires a chart source; Cozystack's applications come from its
    own repository."""
    return {
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
    }


def attachment_spec(
    app_kind: str, app_name: str, app_group: str | None, endpoint: str, load_balancer: Obj
) -> Obj:
    """An attachment's ``spec``: the application (its group only when given), the endpoint Service
    and ``spec.loadBalancer`` (``load_balancer_spec``)."""
    application: Obj = {"kind": app_kind, "name": app_name}
    if app_group is not None:
        application["group"] = app_group
    return {
        "applicationRef": application,
        "endpoint": {"serviceName": endpoint},
        "loadBalancer": load_balancer,
    }


def load_balancer_spec(
    *,
    class_name: str | None = None,
    claim_name: str | None = None,
    family: str | None = None,
    ports: Sequence[int] | None = None,
    method: str | None = None,
    allow_icmp: bool | None = None,
) -> Obj:
    """``spec.loadBalancer`` with the fields given (none: mint from the default class)."""
    spec: Obj = {}
    for key, value in (
        ("className", class_name),
        ("claimName", claim_name),
        ("family", family),
        ("ports", list(ports) if ports is not None else None),
        ("method", method),
        ("allowICMP", allow_icmp),
    ):
        if value is not None:
            spec[key] = value
    return spec


def for_create(obj: Mapping[str, Any]) -> Obj:
    """A copy without ``status`` and what the API server sets (metadata, a Service's cluster IP),
    ready to POST."""
    server_set = {"uid", "creationTimestamp", "resourceVersion", "generation", "deletionTimestamp"}
    metadata = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in server_set}
    body: Obj = {**{k: v for k, v in obj.items() if k not in ("status", "metadata")}, "metadata": metadata}
    if obj.get("kind") == "Service":
        body["spec"] = {k: v for k, v in (obj.get("spec") or {}).items() if k != "clusterIP"}
    return body
