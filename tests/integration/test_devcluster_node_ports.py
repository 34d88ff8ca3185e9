"""The local control plane's NodePort range: Kubernetes' default unless a caller asks for another.

Each rendered EndpointAttachment Service takes a health-check NodePort, so the default range (2,768
ports) bounds a cluster's attachments; the cold-start benchmark asks its own control plane for a
wider one (``LocalControlPlane(node_port_range=...)``, the launcher's ``-service-node-port-range``).
"""

from __future__ import annotations

import pytest

from hack.devcluster import LocalControlPlane, external_cluster
from shared.kube import ApiError, Kube, Obj
from shared.resources import NAMESPACES, SERVICES

DEFAULT_RANGE = "30000-32767"  # kube-apiserver's own --service-node-port-range
WIDER_RANGE = "30000-39999"
BEYOND_DEFAULT = 39_999  # in the wider range, past the default's last port


def node_port_service(name: str, node_port: int) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": node_port}]},
    }


async def test_the_session_control_plane_keeps_kubernetes_default_range(kube: Kube, namespace: str) -> None:
    if external_cluster() is not None:
        pytest.skip("another cluster's NodePort range is its own")
    with pytest.raises(ApiError) as refused:
        await kube.create(SERVICES.path(namespace), node_port_service("beyond", BEYOND_DEFAULT))
    assert refused.value.status == 422
    assert DEFAULT_RANGE in refused.value.message


async def test_a_control_plane_asked_for_a_wider_range_allocates_beyond_the_default() -> None:
    if external_cluster() is not None:
        pytest.skip("the launcher's flag is the local control plane's only")
    with LocalControlPlane(node_port_range=WIDER_RANGE) as info:
        wide = await Kube.connect(info.kubeconfig)
        try:
            await wide.create(
                NAMESPACES.path(), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "wide"}}
            )
            created = await wide.create(SERVICES.path("wide"), node_port_service("beyond", BEYOND_DEFAULT))
            assert created["spec"]["ports"][0]["nodePort"] == BEYOND_DEFAULT
        finally:
            await wide.close()
