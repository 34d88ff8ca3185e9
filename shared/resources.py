"""Every kind's REST coordinates, defined once: ``Resource`` and the kinds both operators, the tests
and the tools name (Kubernetes' own, and the platform's that no operator here owns).

Pure: no client, no I/O, so decision modules and typed views may name kinds too. Each operator's
own kinds are in its ``api.py``; ``shared.kube`` re-exports these for the code that talks to the API.

Decides: the path of a kind (``Resource.path``). Does not: talk to the API, or know a schema.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Final


def group_of(api_version: str) -> str:
    """The group of an apiVersion: "" for the core group ("v1"), else the part before the slash."""
    return api_version.rpartition("/")[0]


@dataclass(frozen=True)
class Resource:
    """One kind's REST coordinates and its kind: ``Resource("apps/v1", "deployments", kind="Deployment")``.
    ``kind`` names it in owner references (matched with the group); it is not part of its identity."""

    api_version: str
    plural: str
    namespaced: bool = True
    kind: str = field(default="", compare=False)

    @cached_property
    def group(self) -> str:
        """The API group ("" for the core group)."""
        return group_of(self.api_version)

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        parts = [base]
        if self.namespaced and namespace:
            parts += ["namespaces", namespace]
        parts.append(self.plural)
        if name:
            parts.append(name)
        return "/".join(parts)


NAMESPACES: Final = Resource("v1", "namespaces", namespaced=False, kind="Namespace")
NODES: Final = Resource("v1", "nodes", namespaced=False, kind="Node")
PODS: Final = Resource("v1", "pods", kind="Pod")
SERVICES: Final = Resource("v1", "services", kind="Service")
ENDPOINTS: Final = Resource("v1", "endpoints", kind="Endpoints")
SERVICE_ACCOUNTS: Final = Resource("v1", "serviceaccounts", kind="ServiceAccount")
CONFIGMAPS: Final = Resource("v1", "configmaps", kind="ConfigMap")
EVENTS: Final = Resource("v1", "events", kind="Event")
# The same Events in the API that has ``regarding``, ``action``, ``reportingController`` and ``series``.
EVENTS_V1: Final = Resource("events.k8s.io/v1", "events", kind="Event")
RESOURCE_QUOTAS: Final = Resource("v1", "resourcequotas", kind="ResourceQuota")
ENDPOINT_SLICES: Final = Resource("discovery.k8s.io/v1", "endpointslices", kind="EndpointSlice")
DEPLOYMENTS: Final = Resource("apps/v1", "deployments", kind="Deployment")
LEASES: Final = Resource("coordination.k8s.io/v1", "leases", kind="Lease")
PDBS: Final = Resource("policy/v1", "poddisruptionbudgets", kind="PodDisruptionBudget")
CRDS: Final = Resource(
    "apiextensions.k8s.io/v1", "customresourcedefinitions", namespaced=False, kind="CustomResourceDefinition"
)
ROLES: Final = Resource("rbac.authorization.k8s.io/v1", "roles", kind="Role")
ROLE_BINDINGS: Final = Resource("rbac.authorization.k8s.io/v1", "rolebindings", kind="RoleBinding")
CLUSTER_ROLES: Final = Resource(
    "rbac.authorization.k8s.io/v1", "clusterroles", namespaced=False, kind="ClusterRole"
)
CLUSTER_ROLE_BINDINGS: Final = Resource(
    "rbac.authorization.k8s.io/v1", "clusterrolebindings", namespaced=False, kind="ClusterRoleBinding"
)
SUBJECT_ACCESS_REVIEWS: Final = Resource(
    "authorization.k8s.io/v1", "subjectaccessreviews", namespaced=False, kind="SubjectAccessReview"
)
# The platform's kinds, consumed, never defined here: a Cozystack application is a Flux HelmRelease;
# KubeVirt's CR says which host devices a VM may ask for.
HELMRELEASES: Final = Resource("helm.toolkit.fluxcd.io/v2", "helmreleases", kind="HelmRelease")
KUBEVIRTS: Final = Resource("kubevirt.io/v1", "kubevirts", kind="KubeVirt")
