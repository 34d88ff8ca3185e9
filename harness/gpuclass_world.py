"""The harness's GPUClass world at scale, for the benchmarks: Nodes, Pods, GPUClasses and a KubeVirt CR
(and, with ``with_dra``, DeviceClasses, a ResourceSlice per node and a ResourceClaim per GPU VM),
shaped as the API returns them in watch events, generated from a seed (the same spec gives the same
world). The tests' hand-written objects are ``tests/gpuclass_builders.py``'s; this module builds many.

Decides the shape of a large Cozystack cluster as the benchmark sees it:

* nodes named ``worker-NNNN``; every fifth one carries GPUs of one of the resource names (half of the
  names are whole-GPU passthrough with 4 or 8 units a node, half vGPU profiles with 32 to 64); every
  node advertises KubeVirt's ``devices.kubevirt.io/*`` as virt-handler makes it do; a few GPU nodes
  are tainted, cordoned or not ready;
* GPU pods are virt-launcher pods (``compute`` asking for the GPU and the KubeVirt devices, a
  container-disk and a console-log container, two init containers), placed like a scheduler would:
  on a node of their resource that has room, else left Pending and unbound; a few have finished;
* the other pods ask for cpu and memory only: virt-launcher pods of VMs without GPU, application
  pods with sidecars, and three daemonset pods on every node;
* classes: several per resource name (the oldest owns it, the rest conflict), with and without
  tolerations of the GPU taints.

Containers, volumes, managed fields and statuses of one shape are shared between pods (they are
read, never written); metadata and spec are built per pod, so every pod holds its own UID, node name
and (when it asks for any) extended resource names, as a decoded watch event does.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from operators.gpuclass.scheduling import bound_node, extended_requests

Obj = dict[str, Any]

DAY1 = "2025-03-01T10:00:00Z"
GPU_TAINT_KEY = "nvidia.com/gpu"
KUBEVIRT_DEVICES: Mapping[str, str] = {
    "devices.kubevirt.io/kvm": "1",
    "devices.kubevirt.io/tun": "1",
    "devices.kubevirt.io/vhost-net": "1",
}
_KUBEVIRT_DEVICE_CAPACITY = {name: "1k" for name in KUBEVIRT_DEVICES}
_PASSTHROUGH = (
    "GH100_H200_SXM_141GB",
    "GH100_H100_SXM5_80GB",
    "GA100_A100_SXM4_80GB",
    "AD102GL_L40S",
    "AD102GL_L40",
    "TU104GL_TESLA_T4",
    "GA102GL_A10",
    "AD104GL_L4",
    "GB100_B200_SXM_180GB",
    "GA100_A30_PCIE_24GB",
)
_VGPU = (
    "NVIDIA_A10-24Q",
    "NVIDIA_A10-4Q",
    "NVIDIA_L40S-8Q",
    "NVIDIA_L40S-4Q",
    "NVIDIA_L4-2Q",
    "GRID_A100-10C",
    "GRID_A100-5C",
    "GRID_T4-2Q",
    "GRID_T4-1Q",
    "NVIDIA_A16-2Q",
)


@dataclass(frozen=True)
class GpuResource:
    name: str
    vgpu: bool

    @property
    def amounts(self) -> tuple[tuple[int, int], ...]:
        """(units a VM asks for, weight): passthrough VMs take whole GPUs, vGPU VMs mostly one profile."""
        return ((1, 90), (2, 10)) if self.vgpu else ((1, 55), (2, 25), (4, 15), (8, 5))

    @property
    def mean_amount(self) -> float:
        total = sum(w for _, w in self.amounts)
        return sum(a * w for a, w in self.amounts) / total


def gpu_resources(count: int) -> list[GpuResource]:
    """``count`` resource names, alternating passthrough and vGPU (20 at most)."""
    pairs = [r for pair in zip(_PASSTHROUGH, _VGPU, strict=True) for r in pair]
    if count > len(pairs):
        raise ValueError(f"at most {len(pairs)} resource names")
    return [GpuResource(f"nvidia.com/{name}", vgpu=name in _VGPU) for name in pairs[:count]]


@dataclass(frozen=True)
class WorldSpec:
    nodes: int = 5_000
    gpu_nodes: int = 1_000
    resources: int = 20
    pods: int = 150_000
    gpu_pods: int = 20_000
    classes: int = 100
    seed: int = 7
    # Real virt-launcher pods of VMs without GPU also ask for devices.kubevirt.io/*; the benchmark's
    # main world keeps them at cpu and memory only, and can measure the other case too.
    kubevirt_devices_on_plain_vms: bool = False


@dataclass
class NodeInfo:
    """What the generator remembers of a node to place pods on it (VMs placed before a node went
    bad stay there: cordoned and not-ready nodes hold pods too)."""

    index: int
    resource: GpuResource | None
    allocatable: int
    room: int


@dataclass
class World:
    spec: WorldSpec
    resources: list[GpuResource]
    nodes: list[Obj]
    node_infos: list[NodeInfo]
    classes: list[Obj]
    kubevirt_cr: Obj

    def pods(self) -> Iterator[Obj]:
        """Every pod, generated afresh on each call (the same pods each time)."""
        return _PodGenerator(self).pods()


def node_name(index: int) -> str:
    return f"worker-{index:04d}"


def build_world(spec: WorldSpec) -> World:
    rng = random.Random(spec.seed)
    resources = gpu_resources(spec.resources)
    nodes: list[Obj] = []
    infos: list[NodeInfo] = []
    step = max(1, spec.nodes // max(1, spec.gpu_nodes))
    gpu_index = 0
    for i in range(spec.nodes):
        name = node_name(i)
        resource: GpuResource | None = None
        units = 0
        if i % step == 0 and gpu_index < spec.gpu_nodes:
            resource = resources[gpu_index % len(resources)]
            gpu_index += 1
            units = rng.choice((32, 48, 64)) if resource.vgpu else rng.choice((4, 8, 8, 8))
            if rng.random() < 0.01:
                units = 0  # a device plugin that lost its devices still lists the name
        nodes.append(node_object(rng, name, resource, units))
        infos.append(NodeInfo(i, resource, units, units))
    classes = class_objects(rng, resources, spec.classes)
    permitted = [r for i, r in enumerate(resources) if i % 4 != 3]  # a quarter not permitted
    cr = kubevirt_cr([r.name for r in permitted if not r.vgpu], [r.name for r in permitted if r.vgpu])
    return World(spec, resources, nodes, infos, classes, cr)


def node_object(rng: random.Random, name: str, resource: GpuResource | None, units: int) -> Obj:
    roll = rng.random()
    ready = "True"
    taints: list[Obj] = []
    unschedulable = False
    if resource is not None:
        taints.append({"key": GPU_TAINT_KEY, "value": "present", "effect": "NoSchedule"})
        if roll < 0.03:
            ready = "Unknown"
            taints += [
                {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": DAY1},
            ]
        elif roll < 0.06:
            unschedulable = True
            taints.append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"})
        elif roll < 0.12:
            taints.append(
                {"key": "dedicated", "value": "ml-training", "effect": "NoExecute", "timeAdded": DAY1}
            )
        elif roll < 0.30:
            taints = []  # GPU nodes the hoster did not taint
        elif roll < 0.35:
            taints.append({"key": "gpu-maintenance", "value": "soon", "effect": "PreferNoSchedule"})
    allocatable: Obj = {
        "cpu": "127500m",
        "memory": "1031927Mi",
        "pods": "250",
        "ephemeral-storage": "1800Gi",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        **_KUBEVIRT_DEVICE_CAPACITY,
    }
    if resource is not None:
        allocatable[resource.name] = str(units)
    labels = {
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": "gpu" if resource else "general",
        "topology.kubernetes.io/zone": f"zone-{int(name[-4:]) % 3}",
        "kubevirt.io/schedulable": "true",
        "cpumanager": "false",
    }
    if resource is not None:
        labels["nvidia.com/gpu.workload.config"] = "vm-vgpu" if resource.vgpu else "vm-passthrough"
    spec: Obj = {"podCIDR": "10.244.0.0/24", "podCIDRs": ["10.244.0.0/24"], "providerID": f"talos://{name}"}
    if unschedulable:
        spec["unschedulable"] = True
    if taints:
        spec["taints"] = taints
    conditions = [
        {
            "type": t,
            "status": "False",
            "reason": r,
            "message": "",
            "lastHeartbeatTime": DAY1,
            "lastTransitionTime": DAY1,
        }
        for t, r in (
            ("MemoryPressure", "KubeletHasSufficientMemory"),
            ("DiskPressure", "KubeletHasNoDiskPressure"),
            ("PIDPressure", "KubeletHasSufficientPID"),
        )
    ]
    conditions.append(
        {
            "type": "Ready",
            "status": ready,
            "reason": "KubeletReady" if ready == "True" else "NodeStatusUnknown",
            "message": "kubelet is posting ready status" if ready == "True" else "Kubelet stopped posting",
            "lastHeartbeatTime": DAY1,
            "lastTransitionTime": DAY1,
        }
    )
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
            "resourceVersion": str(rng.randrange(10**6, 10**7)),
            "creationTimestamp": DAY1,
            "labels": labels,
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "kubevirt.io/heartbeat": DAY1,
            },
        },
        "spec": spec,
        "status": {
            "capacity": dict(allocatable),
            "allocatable": allocatable,
            "conditions": conditions,
            "addresses": [
                {"type": "InternalIP", "address": "10.0.0.1"},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "architecture": "amd64",
                "containerRuntimeVersion": "containerd://2.0.5",
                "kernelVersion": "6.12.25-talos",
                "kubeProxyVersion": "",
                "kubeletVersion": "v1.33.4",
                "operatingSystem": "linux",
                "osImage": "Talos (v1.10.3)",
            },
        },
    }
    return node


def class_objects(rng: random.Random, resources: Sequence[GpuResource], count: int) -> list[Obj]:
    """``count`` classes spread over the names; per name the first is the oldest (the owner)."""
    tolerate_gpu = {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
    tolerate_ml = {"key": "dedicated", "operator": "Equal", "value": "ml-training", "effect": "NoExecute"}
    choices: tuple[list[Obj], ...] = (
        [tolerate_gpu],
        [tolerate_gpu, tolerate_ml],
        [],
        [{"operator": "Exists"}],
    )
    classes: list[Obj] = []
    for i in range(count):
        resource = resources[i % len(resources)]
        rank = i // len(resources)  # 0 for the first class of a name: the owner
        short = resource.name.split("/")[1].lower().replace("_", "-")
        day = 1 + rank if rank != 2 else 2  # ranks 1 and 2 share a day: the name breaks the tie
        classes.append(
            {
                "apiVersion": "gpu.cozystack.io/v1alpha1",
                "kind": "GPUClass",
                "metadata": {
                    "name": f"{short}-{rank}",
                    "uid": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                    "resourceVersion": str(1000 + i),
                    "generation": 1,
                    "creationTimestamp": f"2025-03-{day:02d}T10:00:00Z",
                },
                "spec": {
                    "resourceName": resource.name,
                    "tolerations": [dict(t) for t in choices[(i * 7 + rank) % len(choices)]],
                    "displayName": resource.name.split("/")[1].replace("_", " "),
                },
            }
        )
    return classes


def kubevirt_cr(pci: Sequence[str], mediated: Sequence[str]) -> Obj:
    """The KubeVirt CR permitting ``pci`` passthrough and ``mediated`` vGPU resource names."""
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "KubeVirt",
        "metadata": {"name": "kubevirt", "namespace": "cozy-kubevirt", "generation": 1},
        "spec": {
            "configuration": {
                "developerConfiguration": {"featureGates": ["GPU", "HostDevices", "LiveMigration"]},
                "permittedHostDevices": {
                    "pciHostDevices": [
                        {
                            "pciVendorSelector": "10DE:0000",
                            "resourceName": r,
                            "externalResourceProvider": True,
                        }
                        for r in pci
                    ],
                    "mediatedDevices": [
                        {
                            "mdevNameSelector": r.split("/")[1],
                            "resourceName": r,
                            "externalResourceProvider": True,
                        }
                        for r in mediated
                    ],
                },
            }
        },
    }


# --- pods ----------------------------------------------------------------------------------------


def _resources(cpu: str, memory: str, extra: Mapping[str, str] | None = None, limits: bool = False) -> Obj:
    requests = {"cpu": cpu, "memory": memory, **(extra or {})}
    out: Obj = {"requests": requests}
    if limits:
        out["limits"] = {"cpu": cpu, "memory": memory, **(extra or {})}
    elif extra:
        out["limits"] = dict(extra)  # devices are asked for in limits as well, as virt-controller does
    return out


def _container(name: str, image: str, resources: Obj, **more: Any) -> Obj:
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "resources": resources,
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        **more,
    }


_LAUNCHER_IMAGE = "ghcr.io/cozystack/cozystack/virt-launcher:v1.5.2@sha256:" + "0" * 64
_DISK_IMAGE = "ghcr.io/cozystack/cozystack/ubuntu-container-disk:v1.33@sha256:" + "1" * 64
_SECURITY = {
    "capabilities": {"add": ["NET_BIND_SERVICE", "SYS_NICE"], "drop": ["NET_RAW"]},
    "privileged": False,
}
_POD_SECURITY = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
_MOUNTS = [
    {"mountPath": "/var/run/kubevirt-private", "name": "private"},
    {"mountPath": "/var/run/kubevirt", "name": "public"},
    {"mountPath": "/var/run/kubevirt-ephemeral-disks", "name": "ephemeral-disks"},
    {
        "mountPath": "/var/run/kubevirt/container-disks",
        "mountPropagation": "HostToContainer",
        "name": "container-disks",
    },
    {"mountPath": "/var/run/libvirt", "name": "libvirt-runtime"},
    {"mountPath": "/var/run/kubevirt/sockets", "name": "sockets"},
    {
        "mountPath": "/var/run/kubevirt/hotplug-disks",
        "mountPropagation": "HostToContainer",
        "name": "hotplug-disks",
    },
]
_VOLUMES = [
    {"emptyDir": {}, "name": "private"},
    {"emptyDir": {}, "name": "public"},
    {"emptyDir": {}, "name": "sockets"},
    {"emptyDir": {}, "name": "virt-bin-share-dir"},
    {"emptyDir": {}, "name": "libvirt-runtime"},
    {"emptyDir": {}, "name": "ephemeral-disks"},
    {"emptyDir": {}, "name": "container-disks"},
    {"emptyDir": {}, "name": "hotplug-disks"},
]
_LAUNCHER_TOLERATIONS: list[Obj] = [
    {
        "effect": "NoExecute",
        "key": "node.kubernetes.io/not-ready",
        "operator": "Exists",
        "tolerationSeconds": 300,
    },
    {
        "effect": "NoExecute",
        "key": "node.kubernetes.io/unreachable",
        "operator": "Exists",
        "tolerationSeconds": 300,
    },
]
_GPU_TOLERATIONS: list[Obj] = [
    {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"},
    *_LAUNCHER_TOLERATIONS,
]


def _fields(*keys: str) -> Obj:
    """A managedFields ``fieldsV1`` set of the given field paths, as deep as the real ones are wide."""
    out: Obj = {}
    for key in keys:
        node = out
        for part in key.split("."):
            node = node.setdefault(f"f:{part}", {})
    return out


_LAUNCHER_MANAGED = [
    {
        "apiVersion": "v1",
        "fieldsType": "FieldsV1",
        "fieldsV1": _fields(
            "metadata.annotations.kubevirt.io/domain",
            "metadata.annotations.kubectl.kubernetes.io/default-container",
            "metadata.annotations.post.hook.backup.velero.io/command",
            "metadata.labels.kubevirt.io",
            "metadata.labels.kubevirt.io/created-by",
            "metadata.labels.vm.kubevirt.io/name",
            "metadata.ownerReferences",
            "spec.automountServiceAccountToken",
            "spec.containers.compute.image",
            "spec.containers.compute.resources.limits",
            "spec.containers.compute.resources.requests",
            "spec.containers.compute.securityContext",
            "spec.containers.compute.volumeMounts",
            "spec.containers.guest-console-log.image",
            "spec.containers.volumecontainerdisk.image",
            "spec.initContainers.container-disk-binary.image",
            "spec.initContainers.volumecontainerdisk-init.image",
            "spec.volumes",
            "spec.tolerations",
            "spec.readinessGates",
        ),
        "manager": "virt-controller",
        "operation": "Update",
        "time": DAY1,
    },
    {
        "apiVersion": "v1",
        "fieldsType": "FieldsV1",
        "fieldsV1": _fields(
            "status.conditions.ContainersReady",
            "status.conditions.Initialized",
            "status.conditions.PodReadyToStartContainers",
            "status.conditions.Ready",
            "status.containerStatuses",
            "status.hostIP",
            "status.hostIPs",
            "status.initContainerStatuses",
            "status.phase",
            "status.podIP",
            "status.podIPs",
            "status.startTime",
        ),
        "manager": "kubelet",
        "operation": "Update",
        "subresource": "status",
        "time": DAY1,
    },
]
_LAUNCHER_INIT = [
    _container(
        "container-disk-binary",
        _LAUNCHER_IMAGE,
        _resources("10m", "40M", limits=True),
        command=["/usr/bin/cp"],
    ),
    _container(
        "volumecontainerdisk-init", _DISK_IMAGE, _resources("10m", "40M", limits=True), args=["--no-op"]
    ),
]
_LAUNCHER_SIDECARS = [
    _container("volumecontainerdisk", _DISK_IMAGE, _resources("10m", "40M", limits=True)),
    _container(
        "guest-console-log",
        _LAUNCHER_IMAGE,
        _resources("5m", "35M", limits=True),
        command=["/usr/bin/virt-tail"],
    ),
]
_VM_SIZES = (("1", "2Gi"), ("2", "4Gi"), ("4", "8Gi"), ("8", "32Gi"), ("16", "64Gi"), ("32", "128Gi"))


def _launcher_containers(cpu: str, memory: str, extended: Mapping[str, str]) -> list[Obj]:
    compute = _container(
        "compute",
        _LAUNCHER_IMAGE,
        _resources(f"{int(cpu) * 100}m", memory, extended),
        command=["/usr/bin/virt-launcher-monitor", "--qemu-timeout", "301s", "--name", "vm"],
        env=[{"name": "XDG_CACHE_HOME", "value": "/var/run/kubevirt-private"}],
        securityContext=_SECURITY,
        volumeMounts=_MOUNTS,
    )
    return [compute, *_LAUNCHER_SIDECARS]


_APP_CONTAINERS = [
    _container("postgres", "ghcr.io/cloudnative-pg/postgresql:17.4", _resources("500m", "1Gi", limits=True)),
    _container(
        "metrics-exporter", "quay.io/prometheuscommunity/postgres-exporter:v0.17", _resources("50m", "64Mi")
    ),
    _container("backup-agent", "ghcr.io/cozystack/backup-agent:v0.3", _resources("20m", "32Mi")),
]
_APP_INIT = [
    _container(
        "bootstrap-controller", "ghcr.io/cloudnative-pg/cloudnative-pg:1.25", _resources("10m", "32Mi")
    )
]
_SMALL_CONTAINERS = [_container("manager", "ghcr.io/cozystack/controller:v0.30", _resources("100m", "128Mi"))]
_DAEMONSETS: tuple[tuple[str, list[Obj], list[Obj]], ...] = (
    (
        "cilium",
        [_container("cilium-agent", "quay.io/cilium/cilium:v1.17.4", _resources("100m", "512Mi"))],
        [
            _container(step, "quay.io/cilium/cilium:v1.17.4", _resources("10m", "16Mi"))
            for step in (
                "config",
                "mount-cgroup",
                "apply-sysctl-overwrites",
                "mount-bpf-fs",
                "clean-cilium-state",
            )
        ],
    ),
    (
        "virt-handler",
        [
            _container("virt-handler", "quay.io/kubevirt/virt-handler:v1.5.2", _resources("10m", "357Mi")),
            _container("node-labeller", "quay.io/kubevirt/virt-handler:v1.5.2", _resources("10m", "32Mi")),
        ],
        [_container("virt-launcher", _LAUNCHER_IMAGE, _resources("100m", "20Mi", limits=True))],
    ),
    (
        "node-exporter",
        [
            _container(
                "node-exporter", "quay.io/prometheus/node-exporter:v1.9.1", _resources("100m", "180Mi")
            ),
            _container("kube-rbac-proxy", "quay.io/brancz/kube-rbac-proxy:v0.19", _resources("10m", "20Mi")),
        ],
        [],
    ),
)


def _container_statuses(containers: Sequence[Mapping[str, Any]], running: bool) -> list[Obj]:
    state: Obj = (
        {"running": {"startedAt": DAY1}}
        if running
        else {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": DAY1, "finishedAt": DAY1}}
    )
    return [
        {
            "name": c["name"],
            "image": c["image"],
            "imageID": c["image"],
            "containerID": "containerd://" + "f" * 64,
            "ready": running,
            "restartCount": 0,
            "started": running,
            "state": state,
        }
        for c in containers
    ]


def pod_status(phase: str, containers: Sequence[Mapping[str, Any]], node_ip: str | None, pod_ip: str) -> Obj:
    """The status a kubelet reports for a pod in ``phase`` (``node_ip`` None: not scheduled yet)."""
    if node_ip is None:
        return {
            "phase": "Pending",
            "qosClass": "Burstable",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/5000 nodes are available: insufficient GPU.",
                    "lastProbeTime": None,
                    "lastTransitionTime": DAY1,
                }
            ],
        }
    running = phase == "Running"
    truth = "True" if running else "False"
    return {
        "phase": phase,
        "qosClass": "Burstable",
        "hostIP": node_ip,
        "hostIPs": [{"ip": node_ip}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": DAY1,
        "conditions": [
            {"type": t, "status": s, "lastProbeTime": None, "lastTransitionTime": DAY1}
            for t, s in (
                ("PodReadyToStartContainers", truth),
                ("Initialized", "True"),
                ("Ready", truth),
                ("ContainersReady", truth),
                ("PodScheduled", "True"),
            )
        ],
        "containerStatuses": _container_statuses(containers, running),
    }


class _PodGenerator:
    """Every pod of a world, in a fixed order: daemonset pods, GPU VMs, then the other pods."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.rng = random.Random(world.spec.seed + 1)
        self.infos = world.node_infos
        self.by_resource: dict[str, list[NodeInfo]] = {}
        for info in self.infos:
            if info.resource is not None:
                self.by_resource.setdefault(info.resource.name, []).append(info)
        self.launcher_shapes: dict[tuple[str, str], list[Obj]] = {}
        # Statuses are shared by pods of one phase and shape: the inventory reads only the phase.
        self.statuses: dict[tuple[str, bool, tuple[str, ...]], Obj] = {}

    def pods(self) -> Iterator[Obj]:
        for info in self.infos:
            info.room = info.allocatable  # what a previous call used up
        spec = self.world.spec
        count = 0
        for info in self.infos:
            for name, containers, init in _DAEMONSETS:
                if count >= spec.pods - spec.gpu_pods:
                    break
                yield self._pod(
                    f"kube-system/{name}-{info.index:04d}x", info.index, containers, init, "Running"
                )
                count += 1
        weights = [
            sum(i.allocatable for i in self.by_resource.get(r.name, ())) / r.mean_amount
            for r in self.world.resources
        ]
        for j in range(spec.gpu_pods):
            resource = self.rng.choices(self.world.resources, weights)[0]
            yield self._gpu_pod(j, resource)
        plain = spec.pods - spec.gpu_pods - count
        for j in range(plain):
            yield self._plain_pod(j)

    def _gpu_pod(self, j: int, resource: GpuResource) -> Obj:
        rng = self.rng
        amounts = resource.amounts
        amount = rng.choices([a for a, _ in amounts], [w for _, w in amounts])[0]
        node: int | None = None
        candidates = self.by_resource.get(resource.name, [])
        for _ in range(8):  # a scheduler's few tries; if none fits, the VM waits
            info = rng.choice(candidates) if candidates else None
            if info is not None and info.room >= amount:
                info.room -= amount
                node = info.index
                break
        roll = rng.random()
        phase = "Running" if roll < 0.93 else ("Succeeded" if roll < 0.97 else "Failed")
        if node is None:
            phase = "Pending"
        cpu, memory = rng.choice(_VM_SIZES)
        extended = {**KUBEVIRT_DEVICES, resource.name: str(amount)}
        containers = self._launcher(cpu, memory, extended)
        return self._launcher_pod(
            f"tenant-{j % 400}", f"gpu-vm-{j}", node, containers, phase, _GPU_TOLERATIONS
        )

    def _plain_pod(self, j: int) -> Obj:
        rng = self.rng
        node: int | None = rng.randrange(len(self.infos))
        roll = rng.random()
        phase = "Running" if roll < 0.96 else ("Succeeded" if roll < 0.98 else "Pending")
        if phase == "Pending" and rng.random() < 0.5:
            node = None  # not scheduled yet
        kind = j % 10
        if kind < 4:
            cpu, memory = rng.choice(_VM_SIZES)
            extended = KUBEVIRT_DEVICES if self.world.spec.kubevirt_devices_on_plain_vms else {}
            containers = self._launcher(cpu, memory, extended)
            return self._launcher_pod(
                f"tenant-{j % 400}", f"vm-{j}", node, containers, phase, _LAUNCHER_TOLERATIONS
            )
        if kind < 7:
            return self._pod(f"tenant-{j % 400}/postgres-{j}-1", node, _APP_CONTAINERS, _APP_INIT, phase)
        return self._pod(f"tenant-{j % 400}/controller-{j}-7d9c5b", node, _SMALL_CONTAINERS, [], phase)

    def _launcher(self, cpu: str, memory: str, extended: Mapping[str, str]) -> list[Obj]:
        """The containers of a virt-launcher pod. Those asking for extended resources are built
        afresh, with resource names of their own, as the inventory keeps them from a decoded event."""
        if extended:
            return _launcher_containers(cpu, memory, {_fresh(k): v for k, v in extended.items()})
        key = (cpu, memory)
        shape = self.launcher_shapes.get(key)
        if shape is None:
            shape = self.launcher_shapes[key] = _launcher_containers(cpu, memory, {})
        return shape

    def _launcher_pod(
        self,
        namespace: str,
        vm: str,
        node: int | None,
        containers: list[Obj],
        phase: str,
        tolerations: list[Obj],
    ) -> Obj:
        rng = self.rng
        suffix = "".join(rng.choices("bcdfghjklmnpqrstvwxz2456789", k=5))
        vmi_uid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        pod = self._base(namespace, f"virt-launcher-{vm}-{suffix}", node, containers, _LAUNCHER_INIT, phase)
        metadata = pod["metadata"]
        metadata["labels"] = {
            "kubevirt.io": "virt-launcher",
            "kubevirt.io/created-by": vmi_uid,
            "kubevirt.io/nodeName": node_name(node) if node is not None else "",
            "vm.kubevirt.io/name": vm,
            "apps.cozystack.io/application.kind": "VirtualMachine",
            "apps.cozystack.io/application.name": vm,
        }
        metadata["annotations"] = {
            "kubectl.kubernetes.io/default-container": "compute",
            "kubevirt.io/domain": vm,
            "kubevirt.io/migrationTransportUnix": "true",
            "post.hook.backup.velero.io/command": '["/usr/bin/virt-freezer", "--unfreeze", "--name", "'
            + vm
            + '"]',
            "descheduler.alpha.kubernetes.io/request-evict-only": "",
        }
        metadata["ownerReferences"] = [
            {
                "apiVersion": "kubevirt.io/v1",
                "kind": "VirtualMachineInstance",
                "name": vm,
                "uid": vmi_uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        metadata["managedFields"] = _LAUNCHER_MANAGED
        spec = pod["spec"]
        spec["restartPolicy"] = "Never"
        spec["volumes"] = _VOLUMES
        spec["tolerations"] = tolerations
        spec["readinessGates"] = [{"conditionType": "kubevirt.io/virtual-machine-unpaused"}]
        spec["automountServiceAccountToken"] = False
        spec["hostname"] = vm
        spec["nodeSelector"] = {"kubevirt.io/schedulable": "true"}
        return pod

    def _pod(
        self, namespaced_name: str, node: int | None, containers: list[Obj], init: list[Obj], phase: str
    ) -> Obj:
        namespace, name = namespaced_name.split("/")
        pod = self._base(namespace, name, node, containers, init, phase)
        pod["metadata"]["labels"] = {
            "app.kubernetes.io/name": name.rsplit("-", 1)[0],
            "pod-template-hash": "7d9c5b",
        }
        return pod

    def _base(
        self, namespace: str, name: str, node: int | None, containers: list[Obj], init: list[Obj], phase: str
    ) -> Obj:
        rng = self.rng
        if node is None:
            phase = "Pending"
        spec: Obj = {
            "containers": containers,
            "dnsPolicy": "ClusterFirst",
            "enableServiceLinks": False,
            "preemptionPolicy": "PreemptLowerPriority",
            "priority": 0,
            "restartPolicy": "Always",
            "schedulerName": "default-scheduler",
            "securityContext": _POD_SECURITY,
            "serviceAccount": "default",
            "serviceAccountName": "default",
            "terminationGracePeriodSeconds": 30,
        }
        if init:
            spec["initContainers"] = init
        if node is not None:
            spec["nodeName"] = node_name(node)  # a string of its own, as a decoded event has
        bound = node is not None
        status_key = (phase, bound, tuple(c["name"] for c in containers))
        status = self.statuses.get(status_key)
        if status is None:
            status = self.statuses[status_key] = pod_status(
                phase, containers, "10.0.0.1" if bound else None, "10.244.0.10"
            )
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                "resourceVersion": str(rng.randrange(10**6, 10**8)),
                "creationTimestamp": DAY1,
            },
            "spec": spec,
            "status": status,
        }


def launcher_manifest(vm: str, resource: str, amount: int, node: str | None) -> Obj:
    """A virt-launcher Pod to create through the API (no status, no server-set metadata): bound to
    ``node`` when given, asking for ``amount`` of ``resource`` beside the KubeVirt devices."""
    spec: Obj = {
        "containers": _launcher_containers("2", "4Gi", {**KUBEVIRT_DEVICES, resource: str(amount)}),
        "initContainers": _LAUNCHER_INIT,
        "restartPolicy": "Never",  # as virt-controller makes them: a stopped VM's pod stays finished
        "schedulerName": "default-scheduler",
        "securityContext": _POD_SECURITY,
        "terminationGracePeriodSeconds": 30,
        "automountServiceAccountToken": False,
        "volumes": _VOLUMES,
        "tolerations": _GPU_TOLERATIONS,
        "readinessGates": [{"conditionType": "kubevirt.io/virtual-machine-unpaused"}],
        "hostname": vm,
        "nodeSelector": {"kubevirt.io/schedulable": "true"},
    }
    if node is not None:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"virt-launcher-{vm}-",
            "labels": {"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": vm},
            "annotations": {"kubectl.kubernetes.io/default-container": "compute", "kubevirt.io/domain": vm},
        },
        "spec": spec,
    }


def _fresh(text: str) -> str:
    """An equal string that is a new object (a JSON decoder makes one per occurrence)."""
    return text.encode().decode()


def is_gpu_pod(pod: Mapping[str, Any], gpu_names: frozenset[str]) -> bool:
    """Whether any container of ``pod`` names one of the GPU resources (for sampling events)."""
    for c in pod["spec"]["containers"]:
        if gpu_names.intersection(c.get("resources", {}).get("requests", {})):
            return True
    return False


# --- the DRA world (resource.k8s.io/v1) ---------------------------------------------------------

GPU_DRIVER = "gpu.nvidia.com"
NIC_DRIVER = "nic.example.com"
# Two shapes per class: a small and a large instance type.
SHAPES: tuple[Obj, ...] = (
    {"name": "small", "units": 1, "cpu": "8", "memory": "32Gi"},
    {"name": "large", "units": 2, "cpu": "32", "memory": "256Gi"},
)


@dataclass(frozen=True)
class DraWorld:
    device_classes: list[Obj]
    slices: list[Obj]
    claims: list[Obj]
    classes: list[Obj]  # half count DRA devices, every one lists SHAPES


def with_dra(world: World, pods: Sequence[Obj]) -> DraWorld:
    """One slice per node, one claim per GPU VM, a DeviceClass per GPU model; the classes with an
    odd index count DRA devices, and every class lists ``SHAPES``."""
    models = {r.name: r.name.split("/")[1] for r in world.resources}
    device_classes = [_device_class(model) for model in models.values()]
    slices = []
    allocatable: dict[str, tuple[str, int]] = {}
    for node in world.nodes:
        name = node["metadata"]["name"]
        found = [(r, int(v)) for r, v in node["status"]["allocatable"].items() if r in models]
        if found:
            resource, units = found[0]
            allocatable[name] = (models[resource], units)
            if len(allocatable) % MIG_NODE_EVERY == 0:  # dynamic MIG: counters, full GPUs and placements
                slices.extend(_mig_slices(name, models[resource], units))
            else:
                slices.append(_slice(name, GPU_DRIVER, [_gpu(i, models[resource]) for i in range(units)]))
        else:
            slices.append(_slice(name, NIC_DRIVER, [_nic(i) for i in range(2)]))
    names = frozenset(models)
    taken: dict[str, int] = {}
    claims = []
    for pod in pods:
        if not is_gpu_pod(pod, names):
            continue
        resource, amount = next((r, a) for r, a in extended_requests(pod).amounts.items() if r in names)
        bound = bound_node(pod)
        results = []
        if bound is not None and bound in allocatable:
            first = taken.get(bound, 0)
            taken[bound] = first + amount
            results = [
                {"request": "gpu", "driver": GPU_DRIVER, "pool": bound, "device": f"gpu-{i}"}
                for i in range(first, first + amount)
            ]
        claims.append(_claim(pod, f"dra-{models[resource].lower().replace('_', '-')}", amount, results))
    classes = []
    for index, cls in enumerate(world.classes):
        spec = {**cls["spec"], "vmShapes": [dict(s) for s in SHAPES]}
        if index % 2:
            model = models[spec.pop("resourceName")]
            spec["deviceClassName"] = f"dra-{model.lower().replace('_', '-')}"
        classes.append({**cls, "spec": spec})
    return DraWorld(device_classes, slices, claims, classes)


def _device_class(model: str) -> Obj:
    """Full GPUs of one model (a MIG placement is of the model too, but of type ``mig``)."""
    expression = (
        f'device.driver == "{GPU_DRIVER}" && device.attributes["{GPU_DRIVER}"].type == "gpu" && '
        f'device.attributes["{GPU_DRIVER}"].productName == "{model}"'
    )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": f"dra-{model.lower().replace('_', '-')}", "generation": 1},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def _gpu(index: int, model: str) -> Obj:
    return {
        "name": f"gpu-{index}",
        "attributes": {
            "type": {"string": "gpu"},
            "productName": {"string": model},
            "index": {"int": index},
            "uuid": {"string": f"GPU-{random.Random(index).getrandbits(64):016x}"},
            "driverVersion": {"version": "580.65.6"},
        },
        "capacity": {"memory": {"value": "80Gi"}},
    }


# Every this many GPU nodes publishes its GPUs as NVIDIA's driver does with dynamic MIG: one counter
# set per GPU (eight memory slices, the SMs), the full GPU taking all of it and every placement of
# the 1g, 2g, 3g and 7g profiles its share (tests/fixtures/nvidia-dra/ has the driver's real layout).
MIG_NODE_EVERY = 4
MIG_PLACEMENTS: tuple[tuple[str, int, int, tuple[int, ...]], ...] = (
    ("1g.10gb", 1, 16, (0, 1, 2, 3, 4, 5, 6)),  # (profile, memory slices, SMs, starts)
    ("2g.20gb", 2, 32, (0, 2, 4)),
    ("3g.40gb", 4, 60, (0, 4)),
    ("7g.80gb", 8, 132, (0,)),
)


def _mig_slices(node: str, model: str, gpus: int) -> list[Obj]:
    """A counter slice (one set per GPU) and a slice per GPU: the full GPU, then every placement."""
    sets = [
        {
            "name": f"gpu-{i}-counter-set",
            "counters": {"multiprocessors": {"value": "132"}}
            | {f"memory-slice-{m}": {"value": "1"} for m in range(8)},
        }
        for i in range(gpus)
    ]
    counters = _slice(node, GPU_DRIVER, [], suffix="counters", count=gpus + 1)
    del counters["spec"]["devices"]
    counters["spec"]["sharedCounters"] = sets
    out = [counters]
    for i in range(gpus):
        whole = {**_gpu(i, model), "consumesCounters": [_consumes(i, range(8), 132)]}
        placements = [
            {
                "name": f"gpu-{i}-mig-{profile.replace('.', '')}-{start}",
                "attributes": {
                    "type": {"string": "mig"},
                    "productName": {"string": model},
                    "profile": {"string": profile},
                },
                "consumesCounters": [_consumes(i, range(start, start + size), sms)],
            }
            for profile, size, sms, starts in MIG_PLACEMENTS
            for start in starts
        ]
        out.append(_slice(node, GPU_DRIVER, [whole, *placements], suffix=f"gpu-{i}", count=gpus + 1))
    return out


def _consumes(gpu: int, slices: range, sms: int) -> Obj:
    counters = {f"memory-slice-{m}": {"value": "1"} for m in slices} | {
        "multiprocessors": {"value": str(sms)}
    }
    return {"counterSet": f"gpu-{gpu}-counter-set", "counters": counters}


def _nic(index: int) -> Obj:
    return {"name": f"nic-{index}", "attributes": {"speed": {"int": 100}}}


def _slice(node: str, driver: str, devices: list[Obj], suffix: str = "", count: int = 1) -> Obj:
    name = f"{node}-{driver}" + (f"-{suffix}" if suffix else "")
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": name,
            "uid": f"slice-{name}",
            "resourceVersion": "100",
            "generation": 1,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": f"node-{node}"}],
        },
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": count},
            "devices": devices,
        },
    }


def _claim(pod: Obj, device_class: str, count: int, results: list[Obj]) -> Obj:
    metadata = pod["metadata"]
    claim: Obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": f"{metadata['name']}-gpu",
            "namespace": metadata["namespace"],
            "uid": f"claim-{metadata['uid']}",
            "resourceVersion": "200",
        },
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class, "count": count}}]
            }
        },
    }
    if results:
        claim["status"] = {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": metadata["name"], "uid": metadata["uid"]}],
        }
    return claim
