"""Cozystack's lineage labels: which application an object belongs to, and whether it faces the tenant.

Decides: the application (group, kind, name) an object's lineage labels name, whether a Service is
tenant-facing, and the label selector that finds the application object (the Flux HelmRelease that
carries the same three labels).

Does not: write any of these labels (Cozystack's lineage webhook is their only writer, and an operator
that stamped them would change what the platform believes about an object), look anything up, or
decide what an operator does with the answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

# The API group of the application, as Cozystack's lineage webhook records it on every owned object.
APPLICATION_GROUP_LABEL: Final = "apps.cozystack.io/application.group"
# The application's kind (e.g. Postgres, VMInstance): with group and name, it names one application.
APPLICATION_KIND_LABEL: Final = "apps.cozystack.io/application.kind"
# The application's name in the namespace; the HelmRelease behind it carries the same value.
APPLICATION_NAME_LABEL: Final = "apps.cozystack.io/application.name"
# Set by the webhook on everything it labelled; an operator never sets it, or platform tooling
# would treat the operator's own objects as the application's.
MANAGED_BY_COZYSTACK_LABEL: Final = "internal.cozystack.io/managed-by-cozystack"
# Set by the webhook only on Services the application definition lists as tenant-facing. Lineage
# alone also covers operator-internal Services (a CNPG replication Service), so this marker, not
# lineage, is what makes a Service an endpoint a tenant may publish.
TENANT_RESOURCE_LABEL: Final = "internal.cozystack.io/tenantresource"
# Kubernetes label values are strings; the webhook writes the literal "true".
LABEL_TRUE: Final = "true"

# Order matters only for a stable selector text (stable logs, stable cache keys).
_APPLICATION_LABELS: Final = (APPLICATION_GROUP_LABEL, APPLICATION_KIND_LABEL, APPLICATION_NAME_LABEL)


@dataclass(frozen=True)
class ApplicationRef:
    """One application, as the lineage labels name it (no UID: labels cannot carry identity)."""

    group: str
    kind: str
    name: str

    def labels(self) -> dict[str, str]:
        """The three lineage labels that name this application."""
        return {
            APPLICATION_GROUP_LABEL: self.group,
            APPLICATION_KIND_LABEL: self.kind,
            APPLICATION_NAME_LABEL: self.name,
        }


def labels_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    """The object's labels, empty when it has none."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return labels if isinstance(labels, Mapping) else {}


def application_of(obj: Mapping[str, Any]) -> ApplicationRef | None:
    """The application the lineage labels name, or None unless all three are present and non-empty."""
    labels = labels_of(obj)
    group, kind, name = map(labels.get, _APPLICATION_LABELS)
    if not (
        isinstance(group, str) and group and isinstance(kind, str) and kind and isinstance(name, str) and name
    ):
        return None
    return ApplicationRef(group=group, kind=kind, name=name)


def is_managed_by_cozystack(obj: Mapping[str, Any]) -> bool:
    """Whether the lineage webhook has labelled the object."""
    return labels_of(obj).get(MANAGED_BY_COZYSTACK_LABEL) == LABEL_TRUE


def is_tenant_facing(obj: Mapping[str, Any]) -> bool:
    """Whether the webhook marked the object tenant-facing (the exact value "true", nothing looser)."""
    return labels_of(obj).get(TENANT_RESOURCE_LABEL) == LABEL_TRUE


def application_selector(application: ApplicationRef) -> str:
    """The label selector text that lists the objects (e.g. the HelmRelease) of one application."""
    return ",".join(f"{key}={value}" for key, value in application.labels().items())


def belongs_to(obj: Mapping[str, Any], application: ApplicationRef) -> bool:
    """Whether the object's lineage labels name exactly this application."""
    return application_of(obj) == application
