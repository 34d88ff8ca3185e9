"""A class of DRA devices and a device-plugin class side by side, the operator on the local control plane.

The operator runs as in ``test_gpuclass_operator`` (a subprocess under its own ServiceAccount and
config/rbac/gpuclass only), and here also watches DeviceClasses, ResourceSlices and ResourceClaims
(``resource.k8s.io/v1``, served by the control plane). One node's GPUs are a device plugin's
(allocatable), two nodes' are a DRA driver's (a ResourceSlice each; one node cordoned). Both kinds of
class report their figures; a second class naming the same DeviceClass is in conflict; a claim
allocated later takes a unit from the DRA class within a pass; KubeVirt's ``GPUsWithDRA`` gate
decides the DRA class's permission.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any, Final

import pytest

from harness.manifests import apply_all, load
from harness.operators import RunningOperator
from harness.tables import printed_row
from operators.gpuclass.api import DEVICE_CLASSES, GPUCLASSES, RESOURCE_CLAIMS, RESOURCE_SLICES
from shared.kube import ApiError, Kube, Obj
from tests.gpuclass_builders import (
    DAY1,
    DAY2,
    GPU_DRIVER,
    GPU_TOLERATION,
    H200,
    gpu_device,
    gpu_pod,
    make_claim,
    make_class,
    make_device_class,
    make_node,
    make_slice,
    taint,
)
from tests.integration.test_gpuclass_operator import (  # the same operator, world and CRD fixtures
    GPUWorld,
    gpuclass_crd,  # noqa: F401
    install_kubevirt,
    node_name,
    operator,  # noqa: F401
    wait_for_table,
    world,  # noqa: F401
)

DEVICE_CLASS: Final = "it-h200"
SELECTOR: Final = (
    f'device.driver == "{GPU_DRIVER}" && device.attributes["{GPU_DRIVER}"].productName == "H200"'
)
SLICES: Final = ("dra-a", "dra-cordoned")
READY_TRUE: Final = {
    "ResourceNameConflict": ("False", "ResourceNameOwned"),
    "KubeVirtPermitted": ("True", "Permitted"),
    "Ready": ("True", "Ready"),
}


def kubevirt_cr(gate: bool) -> Obj:
    """The passthrough CR of the fixtures, with or without the GPUsWithDRA feature gate."""
    (cr,) = load("tests/fixtures/kubevirt-cr-passthrough.yaml")
    gates: list[str] = cr["spec"]["configuration"]["developerConfiguration"]["featureGates"]
    if gate:
        gates.append("GPUsWithDRA")
    return dict(cr)


@pytest.fixture
async def dra_world(kube: Kube, world: GPUWorld) -> AsyncIterator[GPUWorld]:  # noqa: F811
    """The device class, the nodes and their slices; everything made is removed afterwards."""
    await _forget(kube)
    await kube.create(DEVICE_CLASSES.path(), make_device_class(DEVICE_CLASS, SELECTOR))
    await world.node(
        make_node("plugin", allocatable={H200: "4"}, taints=[taint("nvidia.com/gpu", "NoSchedule")])
    )
    await world.node(make_node("dra-a"))
    await world.node(make_node("dra-cordoned", unschedulable=True))
    for name, count in zip(SLICES, (4, 8), strict=True):
        devices = [gpu_device(f"gpu-{i}") for i in range(count)] + [gpu_device("other-0", "L40S")]
        await kube.create(RESOURCE_SLICES.path(), _created(make_slice(name, node_name(name), devices)))
    yield world
    await _forget(kube, world.namespace)


async def _forget(kube: Kube, namespace: str | None = None) -> None:
    with contextlib.suppress(ApiError):
        await kube.delete(DEVICE_CLASSES.path(name=DEVICE_CLASS))
    for name in SLICES:
        with contextlib.suppress(ApiError):
            await kube.delete(RESOURCE_SLICES.path(name=name))
    if namespace is not None:
        for claim in (await kube.list(RESOURCE_CLAIMS.path(namespace)))["items"]:
            await kube.delete(RESOURCE_CLAIMS.path(namespace, claim["metadata"]["name"]))


def _created(obj: Obj) -> Obj:
    """What a client sends: no server-set metadata, no status."""
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "metadata": {k: v for k, v in obj["metadata"].items() if k in ("name", "labels")},
        "spec": obj["spec"],
    }


async def allocate(kube: Kube, namespace: str, name: str, devices: list[str]) -> None:
    """A claim of the DeviceClass, allocated as the scheduler would have it (on dra-a's pool)."""
    claim = make_claim(name, DEVICE_CLASS, len(devices), allocated=[(node_name("dra-a"), d) for d in devices])
    await kube.create(RESOURCE_CLAIMS.path(namespace), _created(claim))
    await kube.patch(
        RESOURCE_CLAIMS.path(namespace, name) + "/status", {"status": claim["status"]}, kind="merge"
    )


async def test_a_dra_class_and_a_device_plugin_class_report_side_by_side(
    kube: Kube,
    dra_world: GPUWorld,
    operator: RunningOperator,  # noqa: F811
) -> None:
    world_ = dra_world
    await install_kubevirt(kube)
    await apply_all(kube, [kubevirt_cr(gate=True)])
    shapes: list[dict[str, Any]] = [{"name": "g2", "units": 2, "cpu": "8", "memory": "64Gi"}]
    await world_.pod(gpu_pod("vm-plugin", H200, 1, node="plugin"))
    await allocate(kube, world_.namespace, "vm-dra", ["gpu-0"])
    await world_.gpu_class(make_class("plugin", H200, tolerations=[GPU_TOLERATION], vm_shapes=shapes))
    await world_.gpu_class(make_class("dra", "", device_class=DEVICE_CLASS, created=DAY1, vm_shapes=shapes))
    await world_.gpu_class(make_class("dra-late", "", device_class=DEVICE_CLASS, created=DAY2))
    dra_ready = {**READY_TRUE, "KubeVirtPermitted": ("True", "GPUsWithDRA")}
    conflict = {
        "ResourceNameConflict": ("True", "ResourceNameInUse"),
        "KubeVirtPermitted": ("True", "GPUsWithDRA"),
        "Ready": ("False", "ResourceNameConflict"),
    }
    # plugin: 4 - 1 on its node; dra: dra-a's 4 H200 less the claimed one (the cordoned node's 8
    # and the L40S never count).
    await wait_for_table(
        kube, {"plugin": (3, 3, READY_TRUE), "dra": (3, 3, dra_ready), "dra-late": (0, 0, conflict)}, operator
    )
    row = await printed_row(kube, GPUCLASSES.path(name="dra"))
    assert (row["DeviceClass"], row["Resource"], row["Fits"]) == (DEVICE_CLASS, None, "1:3 2:1 4:0 8:0 g2:1")

    # A claim allocated later takes a unit within a pass; the gate gone makes the class NotPermitted.
    await allocate(kube, world_.namespace, "vm-dra-2", ["gpu-1", "gpu-2"])
    await apply_all(kube, [kubevirt_cr(gate=False)])
    not_permitted = {
        **dra_ready,
        "KubeVirtPermitted": ("False", "NotPermitted"),
        "Ready": ("False", "NotPermitted"),
    }
    await wait_for_table(kube, {"dra": (1, 1, not_permitted), "plugin": (3, 3, READY_TRUE)}, operator)
