"""Every kind's REST coordinates, defined once: ``Resource`` and the kinds both operators, the tests
and the tools name (Kubernetes' own, and the platform's that no operator here owns).

Pure: no client, no I/O, so decision modules and typed views may name kinds too. Each operator's
own kinds are in its ``api.py``; ``shared.kube`` re-exports these for the code that talks to the API.

Decides: the path of a kind (``Resource.path``). Does not: talk to the API, or know a schema.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class Resource:
    """One kind's REST coordinates: ``Resource("apps/v1", "deployments")``."""

    api_version: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        parts = [base]
        if self.namespaced and namespace:
            parts += ["namespaces", namespace]
        parts.append(self.plural)
        if name:
            parts.append(name)
        return "/".join(parts)


NAMESPACES: Final = Resource("v1", "namespaces", namespaced=False)
NODES: Final = Resource("v1", "nodes", namespaced=False)
PODS: Final = Resource("v1", "pods")
SERVICES: Final = Resource("v1", "services")
ENDPOINTS: Final = Resource("v1", "endpoints")
SERVICE_ACCOUNTS: Final = Resource("v1", "serviceaccounts")
CONFIGMAPS: Final = Resource("v1", "configmaps")
EVENTS: Final = Resource("v1", "events")
# The same Events in the API that has ``regarding``, ``action``, ``reportingController`` and ``series``.
EVENTS_V1: Final = Resource("events.k8s.io/v1", "events")
RESOURCE_QUOTAS: Final = Resource("v1", "resourcequotas")
ENDPOINT_SLICES: Final = Resource("discovery.k8s.io/v1", "endpointslices")
DEPLOYMENTS: Final = Resource("apps/v1", "deployments")
LEASES: Final = Resource("coordination.k8s.io/v1", "leases")
PDBS: Final = Resource("policy/v1", "poddisruptionbudgets")
CRDS: Final = Resource("apiextensions.k8s.io/v1", "customresourcedefinitions", namespaced=False)
ROLES: Final = Resource("rbac.authorization.k8s.io/v1", "roles")
ROLE_BINDINGS: Final = Resource("rbac.authorization.k8s.io/v1", "rolebindings")
CLUSTER_ROLES: Final = Resource("rbac.authorization.k8s.io/v1", "clusterroles", namespaced=False)
CLUSTER_ROLE_BINDINGS: Final = Resource(
    "rbac.authorization.k8s.io/v1", "clusterrolebindings", namespaced=False
)
SUBJECT_ACCESS_REVIEWS: Final = Resource("authorization.k8s.io/v1", "subjectaccessreviews", namespaced=False)
# The platform's kinds, consumed, never defined here: a Cozystack application is a Flux HelmRelease;
# KubeVirt's CR says which host devices a VM may ask for.
HELMRELEASES: Final = Resource("helm.toolkit.fluxcd.io/v2", "helmreleases")
KUBEVIRTS: Final = Resource("kubevirt.io/v1", "kubevirts")
