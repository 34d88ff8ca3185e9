"""Worlds for the real kube-scheduler (``harness.scheduler``): Nodes it binds onto, VM pods each with
a ResourceClaim of their own, and how many it bound once every pod is bound or unschedulable.

No kubelet runs: a Node is Ready because its status says so (and keeps exactly the taints asked
for), and a pod is "started" when it is bound. Shared by the GPUClass scheduler tests.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from harness.waiting import eventually
from operators.gpuclass.api import DEVICE_CLASSES, RESOURCE_CLAIMS
from shared.kube import ApiError, Kube, Obj
from shared.resources import NODES, PODS

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
SETTLE_SECONDS = 60.0


async def add_node(
    kube: Kube,
    name: str,
    labels: Mapping[str, str],
    allocatable: Mapping[str, str],
    *,
    taints: Sequence[Mapping[str, Any]] = (),
    ready: bool = True,
    cordoned: bool = False,
) -> None:
    """A Node with this allocatable, Ready (or Unknown), cordoned or not, with exactly ``taints``."""
    spec: dict[str, Any] = {"unschedulable": True} if cordoned else {}
    metadata = {"name": name, "labels": dict(labels)}
    await kube.create(NODES.path(), {"apiVersion": "v1", "kind": "Node", "metadata": metadata, "spec": spec})
    status = {
        "conditions": [{"type": "Ready", "status": "True" if ready else "Unknown"}],
        "capacity": dict(allocatable),
        "allocatable": dict(allocatable),
    }
    await kube.patch(NODES.path(name=name) + "/status", {"status": status}, kind="merge")
    # Admission tainted the new Node not-ready; keep exactly the taints asked for.
    await kube.patch(
        NODES.path(name=name), {"spec": {"taints": [dict(t) for t in taints] or None}}, kind="merge"
    )


def pod_body(
    name: str,
    labels: Mapping[str, str],
    spec: Mapping[str, Any],
    containers: Sequence[Mapping[str, Any]],
    claim: str | None = None,
) -> Obj:
    """A pod of ``containers`` (name and resources each); with ``claim``, the first container uses
    that ResourceClaim."""
    rendered = [{"image": PAUSE_IMAGE, **c} for c in containers]
    body_spec = dict(spec)
    if claim is not None:
        first = rendered[0]
        rendered[0] = {**first, "resources": {**first.get("resources", {}), "claims": [{"name": "gpu"}]}}
        body_spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {**body_spec, "containers": rendered},
    }


def unschedulable(pod: Obj) -> bool:
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in (pod.get("status") or {}).get("conditions") or ()
    )


async def bound_when_settled(kube: Kube, namespace: str, selector: str, count: int) -> int:
    """How many of the ``count`` pods ``selector`` names the scheduler bound, once each is bound or
    found unschedulable."""

    async def probe() -> tuple[int] | None:
        pods = (await kube.list(PODS.path(namespace), label_selector=selector))["items"]
        bound = sum(1 for p in pods if p["spec"].get("nodeName"))
        stuck = sum(1 for p in pods if not p["spec"].get("nodeName") and unschedulable(p))
        return (bound,) if len(pods) == count and bound + stuck == count else None

    try:
        (bound,) = await eventually(probe, timeout=SETTLE_SECONDS, what=f"{selector}'s pods settled")
    except AssertionError as timeout:
        pods = (await kube.list(PODS.path(namespace), label_selector=selector))["items"]
        states = {
            p["metadata"]["name"]: [
                (c.get("reason"), c.get("message")) for c in (p.get("status") or {}).get("conditions") or ()
            ]
            for p in pods
            if not p["spec"].get("nodeName")
        }
        raise AssertionError(f"{timeout}; {len(pods)} pods, unbound: {states}") from None
    return bound


async def clear(
    kube: Kube, namespace: str, selector: str, nodes: Sequence[str], cluster_scoped: Sequence[str]
) -> None:
    """Remove a world: its pods at once (no kubelet), every claim of theirs or labelled (the
    scheduler's finalizer taken off), the cluster-scoped objects (paths) and the nodes."""
    pods = (await kube.list(PODS.path(namespace), label_selector=selector))["items"]
    for pod in pods:
        await kube.delete(PODS.path(namespace, pod["metadata"]["name"]), grace_period_seconds=0)
    uids = {pod["metadata"]["uid"] for pod in pods}
    key, _, value = selector.partition("=")
    for claim in (await kube.list(RESOURCE_CLAIMS.path(namespace)))["items"]:
        owners = {o.get("uid") for o in claim["metadata"].get("ownerReferences") or ()}
        if (claim["metadata"].get("labels") or {}).get(key) != value and not owners & uids:
            continue
        path = RESOURCE_CLAIMS.path(namespace, claim["metadata"]["name"])
        with contextlib.suppress(ApiError):
            await kube.patch(path, {"metadata": {"finalizers": None}}, kind="merge")
            await kube.delete(path)
    for path in cluster_scoped:
        with contextlib.suppress(ApiError):
            await kube.delete(path)
    for node in nodes:
        with contextlib.suppress(ApiError):
            await kube.delete(NODES.path(name=node))


def claim_body(
    name: str, k: int, device_class: str, labels: Mapping[str, str] | None = None, admin: bool = False
) -> Obj:
    """A ResourceClaim of exactly ``k`` devices of ``device_class`` (with admin access: a monitoring
    agent's)."""
    exactly: dict[str, Any] = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": k}
    if admin:
        exactly["adminAccess"] = True
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


@contextlib.asynccontextmanager
async def installed(kube: Kube, device_classes: Sequence[Obj]) -> AsyncIterator[None]:
    """The DeviceClasses, made anew for the block (a run before may have left them)."""
    for body in device_classes:
        with contextlib.suppress(ApiError):
            await kube.delete(DEVICE_CLASSES.path(name=body["metadata"]["name"]))
        await kube.create(DEVICE_CLASSES.path(), body)
    try:
        yield
    finally:
        for body in device_classes:
            await kube.delete(DEVICE_CLASSES.path(name=body["metadata"]["name"]))
