"""Issue 33's table on the local control plane: for each DRA world, the real kube-scheduler binds as
many VM pods (a ResourceClaim of ``k`` devices each) as GPUClass says could start, where the
scheduler's pods would start; where GPUClass is deliberately more right (a physical GPU whose
sibling device is held: the pod would bind and then fail to prepare), the world says so.

The worlds are ``tests/gpuclass_dra_worlds.py``, each on a node of its own. GPUClass's figure is the
pure core's, from the objects as the API returns them through the operator's own folds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from hack.devcluster import ClusterInfo
from harness.scheduler import kube_scheduler
from operators.gpuclass.api import DEVICE_CLASSES, DEVICE_TAINT_RULES, RESOURCE_CLAIMS, RESOURCE_SLICES
from operators.gpuclass.dra import DraInventory
from operators.gpuclass.inventory import Inventory
from operators.gpuclass.kubevirt import Found
from operators.gpuclass.reconcile import decide
from shared.kube import Kube
from shared.resources import NAMESPACES, NODES
from tests.gpuclass_builders import make_class, make_kubevirt_cr
from tests.gpuclass_dra_worlds import (
    ADMIN_NAMESPACE_LABEL,
    WORLDS,
    World,
    device_classes,
    held_claims,
    slices,
    taint_rules,
)
from tests.gpuclass_scheduling import add_node, bound_when_settled, claim_body, clear, installed, pod_body

SCHEDULER_NAME = "gpuclass-rows"
WORLD_LABEL = "rows.gpu.cozystack.io/world"
PERMITS = Found(make_kubevirt_cr(pci=[], dra=True))


@pytest.fixture(scope="module")
def scheduler(cluster: ClusterInfo) -> Iterator[None]:
    with kube_scheduler(cluster, SCHEDULER_NAME):
        yield


@pytest.fixture(scope="module")
async def classes(kube: Kube) -> AsyncIterator[None]:
    async with installed(kube, device_classes()):
        yield


async def build(kube: Kube, namespace: str, world: World, node: str) -> list[str]:
    """The world on ``node``; returns the paths of its cluster-scoped objects."""
    await add_node(kube, node, {WORLD_LABEL: node}, {"cpu": "64", "memory": "256Gi", "pods": "110"})
    paths = []
    for body in slices(world, node):
        await kube.create(RESOURCE_SLICES.path(), body)
        paths.append(RESOURCE_SLICES.path(name=body["metadata"]["name"]))
    for body in taint_rules(world, node):
        await kube.create(DEVICE_TAINT_RULES.path(), body)
        paths.append(DEVICE_TAINT_RULES.path(name=body["metadata"]["name"]))
    for body in held_claims(world, node):
        status = body.pop("status")
        body["metadata"]["labels"] = {WORLD_LABEL: node}
        await kube.create(RESOURCE_CLAIMS.path(namespace), body)
        await kube.patch(
            RESOURCE_CLAIMS.path(namespace, body["metadata"]["name"]) + "/status",
            {"status": status},
            kind="merge",
        )
    return paths


async def counted(kube: Kube, namespace: str, world: World, node: str) -> int:
    """GPUClass's figure, from the world as the API returns it."""
    inventory, dra = Inventory(), DraInventory()
    node_obj = await kube.get(NODES.path(name=node))
    assert node_obj is not None
    inventory.upsert_node(node_obj)
    for body in device_classes():
        found = await kube.get(DEVICE_CLASSES.path(name=body["metadata"]["name"]))
        assert found is not None
        dra.upsert_class(found)
    for obj in (await kube.list(RESOURCE_SLICES.path()))["items"]:
        if obj["spec"].get("nodeName") == node:
            dra.upsert_slice(("", obj["metadata"]["name"]), obj)
    for obj in (await kube.list(DEVICE_TAINT_RULES.path()))["items"]:
        dra.upsert_taint_rule(obj)
    for obj in (await kube.list(RESOURCE_CLAIMS.path(namespace)))["items"]:
        dra.upsert_claim((namespace, obj["metadata"]["name"]), obj)
    cls = make_class("rows", "", device_class=world.device_class, vm_sizes=[world.k])
    (fit,) = decide([cls], inventory, PERMITS, dra)["rows"].status.fits
    return fit.vms


async def start_vms(kube: Kube, namespace: str, world: World, node: str) -> None:
    labels = {WORLD_LABEL: node, "rows.gpu.cozystack.io/role": "vm"}
    spec = {"schedulerName": SCHEDULER_NAME, "nodeSelector": {WORLD_LABEL: node}}
    container = {"name": "compute", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}
    for index in range(world.pods):
        name = f"{node}-vm-{index}"
        body = claim_body(name, world.k, world.device_class, {WORLD_LABEL: node})
        await kube.create(RESOURCE_CLAIMS.path(namespace), body)
        await kube.create(
            f"/api/v1/namespaces/{namespace}/pods", pod_body(name, labels, spec, [container], name)
        )


@pytest.mark.parametrize("index", range(len(WORLDS)), ids=[w.name for w in WORLDS])
async def test_the_scheduler_binds_what_gpuclass_counts(
    kube: Kube, namespace: str, scheduler: None, classes: None, index: int
) -> None:
    world, node = WORLDS[index], f"rows-{index}"
    # A monitoring agent's claim with admin access is allowed only in a namespace labelled for it.
    await kube.patch(
        NAMESPACES.path(name=namespace),
        {"metadata": {"labels": {ADMIN_NAMESPACE_LABEL: "true"}}},
        kind="merge",
    )
    paths = await build(kube, namespace, world, node)
    try:
        says = await counted(kube, namespace, world, node)
        await start_vms(kube, namespace, world, node)
        bound = await bound_when_settled(
            kube, namespace, f"{WORLD_LABEL}={node},rows.gpu.cozystack.io/role=vm", world.pods
        )
    finally:
        await clear(kube, namespace, f"{WORLD_LABEL}={node}", [node], paths)
    assert (bound, says) == (world.binds, world.counted), (
        f"{world.name}: the scheduler bound {bound}, GPUClass says {says}"
    )
