"""Node, Pod, GPUClass and KubeVirt objects shaped as the API returns them, for GPUClass tests.

Unit tests feed them to the pure core; integration tests can create them on a control plane (drop
``status`` and server-set metadata first). ``reference_*`` build the design's reference fixture.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hypothesis import strategies as st

# The resource names of the design's reference fixture (what the KubeVirt GPU device plugin publishes).
H200 = "nvidia.com/GH100_H200_SXM_141GB"
L40S = "nvidia.com/AD102GL_L40S"
T4 = "nvidia.com/TU104GL_TESLA_T4"
A10_24Q = "nvidia.com/A10-24Q"
RTX4090 = "nvidia.com/AD102_GEFORCE_RTX_4090"

GPU_TOLERATION: dict[str, Any] = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
DAY1 = "2025-03-01T10:00:00Z"
DAY2 = "2025-03-02T10:00:00Z"

_BASE_ALLOCATABLE = {"cpu": "63500m", "memory": "1031927Mi", "pods": "110", "ephemeral-storage": "1800Gi"}


def _uid(kind: str, name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{kind}/{name}"))


def taint(key: str, effect: str, value: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"key": key, "effect": effect}
    if value is not None:
        out["value"] = value
    if effect == "NoExecute":
        out["timeAdded"] = "2025-03-01T12:00:00Z"  # the API stamps NoExecute taints
    return out


def make_node(
    name: str,
    *,
    ready: str | None = "True",
    unschedulable: bool = False,
    taints: Sequence[Mapping[str, Any]] = (),
    allocatable: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A Node. ``ready`` is the Ready condition's status (``None``: no Ready condition at all).
    Cordoning adds the taint the node controller adds, as on a real cluster."""
    all_taints = [dict(t) for t in taints]
    if unschedulable:
        all_taints.append(taint("node.kubernetes.io/unschedulable", "NoSchedule"))
    spec: dict[str, Any] = {"podCIDR": "10.244.0.0/24"}
    if unschedulable:
        spec["unschedulable"] = True
    if all_taints:
        spec["taints"] = all_taints
    conditions: list[dict[str, Any]] = [
        {"type": t, "status": "False", "reason": f"KubeletHas{r}", "message": "", "lastHeartbeatTime": DAY1}
        for t, r in (("MemoryPressure", "SufficientMemory"), ("DiskPressure", "NoDiskPressure"))
    ]
    if ready is not None:
        conditions.append(
            {
                "type": "Ready",
                "status": ready,
                "reason": "KubeletReady" if ready == "True" else "NodeStatusUnknown",
                "message": "",
                "lastHeartbeatTime": DAY1,
                "lastTransitionTime": DAY1,
            }
        )
    extended = dict(allocatable or {})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": _uid("node", name),
            "resourceVersion": "1000",
            "creationTimestamp": DAY1,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
        },
        "spec": spec,
        "status": {
            "capacity": {**_BASE_ALLOCATABLE, **extended},
            "allocatable": {**_BASE_ALLOCATABLE, **extended},
            "conditions": conditions,
            "nodeInfo": {"kubeletVersion": "v1.33.4", "architecture": "amd64"},
        },
    }


def container(
    name: str = "main",
    *,
    requests: Mapping[str, Any] | None = None,
    limits: Mapping[str, Any] | None = None,
    restart_policy: str | None = None,
) -> dict[str, Any]:
    """A container with cpu/memory beside the given resources, as real pods have."""
    resources: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "64Mi", **(requests or {})}}
    if limits:
        resources["limits"] = dict(limits)
    out: dict[str, Any] = {"name": name, "image": "registry.k8s.io/pause:3.10", "resources": resources}
    if restart_policy is not None:
        out["restartPolicy"] = restart_policy
    return out


def make_pod(
    name: str,
    *,
    node: str | None = None,
    phase: str = "Running",
    containers: Sequence[Mapping[str, Any]] | None = None,
    init_containers: Sequence[Mapping[str, Any]] = (),
    overhead: Mapping[str, Any] | None = None,
    namespace: str = "tenant-root",
    uid: str | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    """A Pod; bound when ``node`` is given. Default: one container requesting cpu and memory only."""
    spec: dict[str, Any] = {
        "containers": [dict(c) for c in containers or [container()]],
        "restartPolicy": "Always",
        "schedulerName": "default-scheduler",
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
        ],
    }
    if init_containers:
        spec["initContainers"] = [dict(c) for c in init_containers]
    if overhead:
        spec["overhead"] = dict(overhead)
    if node is not None:
        spec["nodeName"] = node
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid or _uid("pod", f"{namespace}/{name}"),
        "resourceVersion": "2000",
        "creationTimestamp": DAY1,
    }
    if deleting:
        metadata["deletionTimestamp"] = DAY2
        metadata["deletionGracePeriodSeconds"] = 30
    scheduled = "True" if node is not None else "False"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": spec,
        "status": {"phase": phase, "conditions": [{"type": "PodScheduled", "status": scheduled}]},
    }


def gpu_pod(
    name: str, resource: str, amount: int | str, *, node: str | None, phase: str = "Running"
) -> dict[str, Any]:
    """A pod whose one container requests (and is limited to) ``amount`` of ``resource``."""
    quantity = str(amount)
    return make_pod(
        name,
        node=node,
        phase=phase,
        containers=[container(requests={resource: quantity}, limits={resource: quantity})],
    )


def make_class(
    name: str,
    resource: str,
    *,
    tolerations: Sequence[Mapping[str, Any]] = (),
    created: str | None = DAY1,
    deleting: bool = False,
    generation: int = 1,
    status: Mapping[str, Any] | None = None,
    vm_sizes: Any = None,
    device_class: str | None = None,
    vm_shapes: Any = None,
) -> dict[str, Any]:
    """A GPUClass; ``vm_sizes`` (any value, to feed what the CRD refuses too) is ``spec.vmSizes``,
    absent when None. With ``device_class``, a class of DRA devices (``resource`` is then left out
    when empty)."""
    metadata: dict[str, Any] = {
        "name": name,
        "uid": _uid("gpuclass", name),
        "resourceVersion": "3000",
        "generation": generation,
    }
    if created is not None:
        metadata["creationTimestamp"] = created
    if deleting:
        metadata["deletionTimestamp"] = DAY2
        metadata["finalizers"] = ["example.com/hold"]
    spec: dict[str, Any] = {"resourceName": resource} if resource else {}
    if device_class is not None:
        spec["deviceClassName"] = device_class
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    if vm_sizes is not None:
        spec["vmSizes"] = vm_sizes
    if vm_shapes is not None:
        spec["vmShapes"] = vm_shapes
    out: dict[str, Any] = {
        "apiVersion": "gpu.cozystack.io/v1alpha1",
        "kind": "GPUClass",
        "metadata": metadata,
        "spec": spec,
    }
    if status is not None:
        out["status"] = dict(status)
    return out


def make_kubevirt_cr(
    *,
    pci: Iterable[str] = (),
    mediated: Iterable[str] = (),
    usb: Iterable[str] = (),
    unrestricted: bool = False,
    dra: bool = False,
) -> dict[str, Any]:
    """The KubeVirt CR as Cozystack renders it; ``unrestricted`` leaves out permittedHostDevices;
    ``dra`` enables the GPUsWithDRA feature gate."""
    configuration: dict[str, Any] = {
        "developerConfiguration": {"featureGates": ["GPU", "HostDevices", *(["GPUsWithDRA"] if dra else [])]},
        "evictionStrategy": "LiveMigrate",
    }
    if not unrestricted:
        permitted: dict[str, Any] = {}
        if pci := list(pci):
            permitted["pciHostDevices"] = [
                {"pciVendorSelector": "10DE:0000", "resourceName": r, "externalResourceProvider": True}
                for r in pci
            ]
        if mediated := list(mediated):
            permitted["mediatedDevices"] = [
                {"mdevNameSelector": r.split("/")[-1], "resourceName": r, "externalResourceProvider": True}
                for r in mediated
            ]
        if usb := list(usb):
            permitted["usb"] = [
                {"resourceName": r, "selectors": [{"vendor": "0000", "product": "0000"}]} for r in usb
            ]
        configuration["permittedHostDevices"] = permitted
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "KubeVirt",
        "metadata": {"name": "kubevirt", "namespace": "cozy-kubevirt", "generation": 1},
        "spec": {"configuration": configuration},
    }


# --- the design's reference fixture ------------------------------------------------------------


def reference_nodes() -> list[dict[str, Any]]:
    unreachable = [
        taint("node.kubernetes.io/unreachable", "NoSchedule"),
        taint("node.kubernetes.io/unreachable", "NoExecute"),
    ]
    return [
        make_node("n1", taints=[taint("nvidia.com/gpu", "NoSchedule", "present")], allocatable={H200: "8"}),
        make_node("n2", unschedulable=True, allocatable={H200: "8"}),
        make_node("n3", ready="Unknown", taints=unreachable, allocatable={H200: "8"}),
        make_node("n4", taints=[taint("dedicated", "NoSchedule", "ml")], allocatable={H200: "4"}),
        make_node(
            "n5", taints=[taint("gpu-maintenance", "PreferNoSchedule", "soon")], allocatable={H200: "4"}
        ),
        make_node("n6", allocatable={L40S: "2"}),
        make_node("n7", allocatable={L40S: "0"}),
    ]


def reference_pods() -> list[dict[str, Any]]:
    one_h = {H200: "1"}
    return [
        gpu_pod("n1-running", H200, 2, node="n1"),
        gpu_pod("n1-pending-bound", H200, 1, node="n1", phase="Pending"),
        gpu_pod("n1-succeeded", H200, 4, node="n1", phase="Succeeded"),
        gpu_pod("n1-failed", H200, 1, node="n1", phase="Failed"),
        make_pod(
            "n1-init",
            node="n1",
            init_containers=[container("warmup", requests={H200: "3"}, limits={H200: "3"})],
            containers=[container(requests=one_h, limits=one_h)],
        ),
        make_pod(
            "n5-sidecar",
            node="n5",
            init_containers=[container("agent", requests=one_h, limits=one_h, restart_policy="Always")],
            containers=[container(requests=one_h, limits=one_h)],
        ),
        gpu_pod("n2-running", H200, 2, node="n2"),
        gpu_pod("unscheduled", H200, 1, node=None, phase="Pending"),
        make_pod("n6-limits-only", node="n6", containers=[container(limits={L40S: "1"})]),
        gpu_pod("n7-running", L40S, 1, node="n7"),
        gpu_pod("on-missing-node", H200, 1, node="n-gone"),
    ]


def reference_classes() -> list[dict[str, Any]]:
    return [
        make_class("h200", H200, tolerations=[GPU_TOLERATION], created=DAY1),
        make_class("l40s", L40S, created=DAY1),
        make_class("a10-24q", A10_24Q, created=DAY1),
        make_class("rtx4090", RTX4090, created=DAY1),
        make_class("h200-premium", H200, created=DAY2),
    ]


def reference_kubevirt_cr() -> dict[str, Any]:
    return make_kubevirt_cr(pci=[H200, L40S, T4])


# --- hypothesis strategies: small worlds where collisions (same node, same resource) are likely ----

_RESOURCES = (H200, L40S, "example.com/fpga")
_NODE_NAMES = tuple(f"n{i}" for i in range(5))
_QUANTITIES = ("0", "1", "2", "3", "8", "1500m", "1k", "0.5", "garbage", "-1")
_TAINTS = (
    taint("nvidia.com/gpu", "NoSchedule", "present"),
    taint("dedicated", "NoExecute", "ml"),
    taint("gpu-maintenance", "PreferNoSchedule", "soon"),
)
_TOLERATIONS: tuple[dict[str, Any], ...] = (
    GPU_TOLERATION,
    {"key": "dedicated", "operator": "Equal", "value": "ml"},
    {"operator": "Exists"},
)


@st.composite
def nodes(draw: st.DrawFn, name: str | None = None) -> dict[str, Any]:
    return make_node(
        name or draw(st.sampled_from(_NODE_NAMES)),
        ready=draw(st.sampled_from(["True", "False", "Unknown", None])),
        unschedulable=draw(st.booleans()),
        taints=draw(st.lists(st.sampled_from(_TAINTS), max_size=2, unique_by=lambda t: t["key"])),
        allocatable=draw(
            st.dictionaries(st.sampled_from(_RESOURCES), st.sampled_from(_QUANTITIES), max_size=2)
        ),
    )


@st.composite
def _containers(draw: st.DrawFn, sidecar: bool = False) -> dict[str, Any]:
    amounts = st.dictionaries(st.sampled_from(_RESOURCES), st.sampled_from(_QUANTITIES), max_size=2)
    return container(
        requests=draw(amounts),
        limits=draw(amounts),
        restart_policy="Always" if sidecar and draw(st.booleans()) else None,
    )


@st.composite
def pods(draw: st.DrawFn, name: str | None = None) -> dict[str, Any]:
    """A pod; its UID follows its name, so two draws of one name are versions of one pod."""
    pod_name = name or draw(st.sampled_from([f"p{i}" for i in range(8)]))
    return make_pod(
        pod_name,
        node=draw(st.sampled_from([*_NODE_NAMES, "n-missing", None])),
        phase=draw(st.sampled_from(["Running", "Pending", "Succeeded", "Failed", "Unknown"])),
        containers=draw(st.lists(_containers(), min_size=1, max_size=2)),
        init_containers=draw(st.lists(_containers(sidecar=True), max_size=2)),
        overhead=draw(st.none() | st.dictionaries(st.sampled_from(_RESOURCES), st.sampled_from(["1", "2"]))),
    )


@st.composite
def gpu_classes(draw: st.DrawFn, name: str) -> dict[str, Any]:
    return make_class(
        name,
        draw(st.sampled_from(_RESOURCES)),
        tolerations=draw(st.lists(st.sampled_from(_TOLERATIONS), max_size=2)),
        created=draw(st.sampled_from([DAY1, DAY2, None])),
        deleting=draw(st.booleans()),
        vm_sizes=draw(st.none() | st.lists(st.integers(1, 9), min_size=1, max_size=8, unique=True)),
    )


def class_lists() -> st.SearchStrategy[list[dict[str, Any]]]:
    return st.lists(st.sampled_from([f"c{i}" for i in range(5)]), unique=True, max_size=5).flatmap(
        lambda names: st.tuples(*(gpu_classes(n) for n in names)).map(list)
    )


# --- Dynamic Resource Allocation (resource.k8s.io/v1) ------------------------------------------

GPU_DRIVER = "gpu.nvidia.com"


def make_device_class(
    name: str, *selectors: str, extended_resource_name: str | None = None
) -> dict[str, Any]:
    """A DeviceClass selecting devices by CEL ``selectors`` (all must hold)."""
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": e}} for e in selectors]}
    if extended_resource_name is not None:
        spec["extendedResourceName"] = extended_resource_name
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name, "uid": _uid("deviceclass", name), "generation": 1},
        "spec": spec,
    }


def gpu_device(
    name: str, product: str = "H200", *, memory: str = "141Gi", driver_version: str = "580.65.6"
) -> dict[str, Any]:
    """A device as NVIDIA's DRA driver publishes a whole GPU (attributes in the driver's domain)."""
    return {
        "name": name,
        "attributes": {
            "type": {"string": "gpu"},
            "productName": {"string": product},
            "index": {"int": int(name.rsplit("-", 1)[-1]) if name[-1].isdigit() else 0},
            "driverVersion": {"version": driver_version},
            "gpu.nvidia.com/migCapable": {"bool": False},
        },
        "capacity": {"memory": {"value": memory}},
    }


def make_slice(
    name: str,
    node: str | None,
    devices: Sequence[Mapping[str, Any]],
    *,
    driver: str = GPU_DRIVER,
    pool: str | None = None,
    generation: int = 1,
    slice_count: int = 1,
    spec_generation: int | None = None,
) -> dict[str, Any]:
    """A ResourceSlice of ``node``'s pool (the pool is named after the node unless given);
    ``spec_generation`` is ``metadata.generation`` (left out unless given: the spec is compared)."""
    spec: dict[str, Any] = {
        "driver": driver,
        "pool": {"name": pool or node or name, "generation": generation, "resourceSliceCount": slice_count},
        "devices": [dict(d) for d in devices],
    }
    if node is not None:
        spec["nodeName"] = node
    else:
        spec["allNodes"] = True
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": name,
            "uid": _uid("resourceslice", name),
            **({"generation": spec_generation} if spec_generation is not None else {}),
        },
        "spec": spec,
    }


def make_claim(
    name: str,
    device_class: str,
    count: int = 1,
    *,
    allocated: Sequence[tuple[str, str]] = (),
    driver: str = GPU_DRIVER,
    namespace: str = "tenant-root",
) -> dict[str, Any]:
    """A ResourceClaim for ``count`` devices of ``device_class``; ``allocated`` (pool, device) pairs
    are its allocation's results."""
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": _uid("resourceclaim", f"{namespace}/{name}"),
        },
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class, "count": count}}]
            }
        },
    }
    if allocated:
        claim["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": driver, "pool": pool, "device": device}
                        for pool, device in allocated
                    ]
                }
            }
        }
    return claim
