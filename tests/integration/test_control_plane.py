"""The local control plane is real: each test leans on one behaviour a fake API server would lack.

CEL validation, garbage collection, namespace finalization, the endpoint-slice controller, RBAC with
TokenRequest-issued ServiceAccount tokens, and object-count ResourceQuota on a custom resource.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from hack.devcluster import ClusterInfo
from harness.identity import serviceaccount_kubeconfig
from harness.manifests import wait_for_established
from harness.waiting import eventually, quota_in_force, wait_for_object
from shared.kube import ApiError, Kube, Obj
from shared.resources import (
    CONFIGMAPS,
    CRDS,
    ENDPOINT_SLICES,
    NAMESPACES,
    NODES,
    PODS,
    ROLE_BINDINGS,
    ROLES,
    SERVICE_ACCOUNTS,
    SERVICES,
    Resource,
)

WIDGETS = Resource("test.cozystack.io/v1", "widgets")

WIDGET_CRD: Obj = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.test.cozystack.io"},
    "spec": {
        "group": "test.cozystack.io",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {"min": {"type": "integer"}, "max": {"type": "integer"}},
                                "x-kubernetes-validations": [
                                    {"rule": "self.min <= self.max", "message": "min must not exceed max"}
                                ],
                            }
                        },
                    }
                },
            }
        ],
    },
}


def widget(name: str, low: int, high: int) -> Obj:
    return {
        "apiVersion": "test.cozystack.io/v1",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": {"min": low, "max": high},
    }


@pytest.fixture(scope="module")
async def widget_crd(kube: Kube) -> AsyncIterator[None]:
    try:
        await kube.create(CRDS.path(), WIDGET_CRD)
    except ApiError as error:
        if error.status != 409:
            raise
    await wait_for_established(kube, "widgets.test.cozystack.io")
    yield
    await kube.delete(CRDS.path(name="widgets.test.cozystack.io"))


async def test_cel_rule_rejects_a_bad_object(kube: Kube, namespace: str, widget_crd: None) -> None:
    await kube.create(WIDGETS.path(namespace), widget("good", 1, 2))
    with pytest.raises(ApiError) as refused:
        await kube.create(WIDGETS.path(namespace), widget("bad", 3, 2))
    assert refused.value.status == 422
    assert "min must not exceed max" in refused.value.message


async def test_deleting_an_owner_garbage_collects_its_dependent(kube: Kube, namespace: str) -> None:
    owner = await kube.create(
        CONFIGMAPS.path(namespace), {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}}
    )
    reference = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    await kube.create(
        CONFIGMAPS.path(namespace),
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "dependent", "ownerReferences": [reference]},
        },
    )
    await kube.delete(CONFIGMAPS.path(namespace, "owner"))
    await wait_for_object(kube, CONFIGMAPS, "dependent", lambda o: o is None, namespace=namespace, what="GC")


async def test_namespace_deletion_completes(kube: Kube) -> None:
    name = f"doomed-{uuid.uuid4().hex[:8]}"
    await kube.create(
        NAMESPACES.path(), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    await kube.create(
        CONFIGMAPS.path(name), {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}
    )
    await kube.delete(NAMESPACES.path(name=name))
    await wait_for_object(kube, NAMESPACES, name, lambda o: o is None, what="namespace finalization")


def ready_pod(name: str, node: str, labels: dict[str, str]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "example.invalid/app:1"}]},
    }


async def test_a_ready_pod_appears_in_the_endpointslice_of_its_service(kube: Kube, namespace: str) -> None:
    node = f"node-{namespace}"[:63]
    await kube.create(NODES.path(), {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    try:
        await kube.create(
            SERVICES.path(namespace),
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "web"},
                "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
            },
        )
        # The serviceaccount controller creates "default", which Pod admission requires.
        await wait_for_object(kube, SERVICE_ACCOUNTS, "default", lambda o: o is not None, namespace=namespace)
        pod = await kube.create(PODS.path(namespace), ready_pod("web-0", node, {"app": "web"}))
        # Play the kubelet: the Pod runs, has an IP and is Ready.
        await kube.patch(
            PODS.path(namespace, "web-0") + "/status",
            {
                "status": {
                    "phase": "Running",
                    "podIP": "10.244.0.7",
                    "podIPs": [{"ip": "10.244.0.7"}],
                    "conditions": [{"type": "Ready", "status": "True"}],
                }
            },
            kind="merge",
        )

        async def slice_with_pod() -> Obj | None:
            slices = await kube.list(
                ENDPOINT_SLICES.path(namespace), label_selector="kubernetes.io/service-name=web"
            )
            for item in slices["items"]:
                for endpoint in item.get("endpoints") or []:
                    if endpoint.get("targetRef", {}).get("uid") == pod["metadata"]["uid"]:
                        found: Obj = endpoint
                        return found
            return None

        endpoint = await eventually(slice_with_pod, what="the pod in the Service's EndpointSlice")
        assert endpoint["addresses"] == ["10.244.0.7"]
        assert endpoint["conditions"]["ready"] is True
    finally:
        await kube.delete(NODES.path(name=node))


async def test_a_serviceaccount_token_is_allowed_what_its_role_grants_and_nothing_else(
    kube: Kube, namespace: str, cluster: ClusterInfo, tmp_path: Path
) -> None:
    await kube.create(
        SERVICE_ACCOUNTS.path(namespace),
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader"}},
    )
    await kube.create(
        ROLES.path(namespace),
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "configmap-reader"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}],
        },
    )
    await kube.create(
        ROLE_BINDINGS.path(namespace),
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "configmap-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        },
    )
    path = await serviceaccount_kubeconfig(kube, cluster.kubeconfig, namespace, "reader", tmp_path / "reader")
    reader = await Kube.connect(path)
    listing = await reader.list(CONFIGMAPS.path(namespace))
    assert listing["kind"] == "ConfigMapList"
    with pytest.raises(ApiError) as refused:
        await reader.list(Resource("v1", "secrets").path(namespace))
    assert refused.value.status == 403
    with pytest.raises(ApiError) as refused_write:
        await reader.create(
            CONFIGMAPS.path(namespace),
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "nope"}},
        )
    assert refused_write.value.status == 403


async def test_an_object_count_quota_refuses_the_custom_resource_over_quota(
    kube: Kube, namespace: str, widget_crd: None
) -> None:
    quota: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "widgets"},
        "spec": {"hard": {"count/widgets.test.cozystack.io": "1"}},
    }
    await quota_in_force(kube, namespace, quota)
    await kube.create(WIDGETS.path(namespace), widget("first", 1, 2))
    with pytest.raises(ApiError) as refused:
        await kube.create(WIDGETS.path(namespace), widget("second", 1, 2))
    assert refused.value.status == 403
    assert "exceeded quota" in refused.value.message
