"""The test node's layout and configuration files, as data: no process, no I/O.

Decides where one node lives (a directory, a network namespace, a cgroup root, all named by one
id), its addresses (the node's own and the ``kubernetes`` Service's ClusterIP, both on a link of its own
inside the node's network namespace, so no pod packet leaves namespaces the test made), and the
configuration of containerd, the CNI bridge and the kubelet, with the traps measured on a
cgroup-v1 host without CAP_SYS_RESOURCE:

* the kubelet refuses cgroup v1 unless ``failCgroupV1: false``, and needs a non-loopback node IP;
* containerd must not try to lower a container's oom_score_adj (``restrict_oom_score_adj``);
* the kubelet rewrites kernel tunables (KERNEL_TUNABLES): the harness saves and restores them.

Does not start anything (harness/node.py does).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

# The kernel tunables the kubelet's container manager sets at start (setupKernelTunables), which
# outlive it: saved before the node starts and written back after it stops.
KERNEL_TUNABLES: Final = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
)
# The node's address on its own link (the kubelet needs a non-loopback node IP) and the pod
# subnet of its bridge; both exist only inside the node's network namespace.
NODE_IP: Final = "10.250.0.2"
NODE_PREFIX_LENGTH: Final = 24
POD_SUBNET: Final = "10.251.0.0/24"
# The `kubernetes` Service's ClusterIP (the first address of devcluster's service CIDR, which the
# API server's certificate names): a second address of that link, where the relay to the API
# server listens, so Pods reach the API server at the address the kubelet gives them.
API_SERVICE_IP: Final = "10.96.0.1"
API_SERVICE_PORT: Final = 443
DUMMY_LINK: Final = "cozy0"
BRIDGE: Final = "cozycni0"
CNI_BIN_DIR: Final = "/usr/lib/cni"  # Debian's containernetworking-plugins
# Unused Debian-built containerd plugins that would look for host facilities at start.
DISABLED_CONTAINERD_PLUGINS: Final = (
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.tracing.processor.v1.otlp",
    "io.containerd.internal.v1.tracing",
)


@dataclass(frozen=True)
class NodeLayout:
    id: str  # short and unique: names the directory's files, the netns, the cgroup root, the node
    dir: Path
    pause_image: str

    @property
    def name(self) -> str:
        return f"cozy-node-{self.id}"

    @property
    def netns(self) -> str:
        return self.name

    @property
    def cgroup_root(self) -> str:
        return f"/{self.name}"

    @property
    def containerd_socket(self) -> Path:
        return self.dir / "containerd.sock"

    @property
    def kubelet_dir(self) -> Path:
        return self.dir / "kubelet"

    @property
    def cni_conf_dir(self) -> Path:
        return self.dir / "cni"


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a TOML basic string is JSON's string syntax for these values


def containerd_config(layout: NodeLayout) -> str:
    """containerd 1.6's config (version 2): every path under the node's directory."""
    d = layout.dir / "containerd"
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    tables: list[tuple[str | None, dict[str, object]]] = [
        (
            None,
            {
                "version": 2,
                "root": str(d / "root"),
                "state": str(d / "state"),
                "disabled_plugins": list(DISABLED_CONTAINERD_PLUGINS),
            },
        ),
        ("grpc", {"address": str(layout.containerd_socket)}),
        ("ttrpc", {"address": str(layout.containerd_socket) + ".ttrpc"}),
        ("debug", {"address": ""}),
        ("metrics", {"address": ""}),
        ('plugins."io.containerd.internal.v1.opt"', {"path": str(d / "opt")}),
        (
            cri,
            {
                "sandbox_image": layout.pause_image,
                "restrict_oom_score_adj": True,  # no CAP_SYS_RESOURCE: never lower oom_score_adj
                "netns_mounts_under_state_dir": True,  # the pods' netns under the node's directory
                "enable_selinux": False,
                "disable_apparmor": True,
            },
        ),
        (f"{cri}.cni", {"bin_dir": CNI_BIN_DIR, "conf_dir": str(layout.cni_conf_dir), "max_conf_num": 1}),
        (f"{cri}.containerd", {"snapshotter": "overlayfs", "default_runtime_name": "runc"}),
        (f"{cri}.containerd.runtimes.runc", {"runtime_type": "io.containerd.runc.v2"}),
        (f"{cri}.containerd.runtimes.runc.options", {"SystemdCgroup": False, "Root": str(d / "runc")}),
    ]
    lines: list[str] = []
    for table, values in tables:
        if table:
            lines.append(f"\n[{table}]")
        lines.extend(f"{key} = {toml_value(value)}" for key, value in values.items())
    return "\n".join(lines) + "\n"


def cni_config(layout: NodeLayout) -> dict[str, Any]:
    """One bridge inside the node's network namespace; no masquerading, no port mapping: a Pod
    reaches the node's addresses and other Pods, nothing beyond."""
    return {
        "cniVersion": "1.0.0",
        "name": layout.name,
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(layout.dir / "cni-ipam"),
                },
            }
        ],
    }


def kubelet_config(layout: NodeLayout) -> dict[str, Any]:
    endpoint = f"unix://{layout.containerd_socket}"
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,  # this host mounts cgroup v1 controllers
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": layout.cgroup_root,
        "containerRuntimeEndpoint": endpoint,
        "imageServiceEndpoint": endpoint,
        # Only the API server could call the kubelet's API, and it cannot reach the node's netns.
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "address": NODE_IP,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "resolvConf": str(layout.dir / "resolv.conf"),
        "podLogsDir": str(layout.dir / "pod-logs"),
        "clusterDomain": "cluster.local",
        "failSwapOn": False,
        "protectKernelDefaults": False,  # the kubelet sets KERNEL_TUNABLES; the harness restores them
        "localStorageCapacityIsolation": False,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "maxPods": 30,
        "nodeStatusUpdateFrequency": "2s",
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "5s",
        "shutdownGracePeriod": "0s",
    }


def resolv_conf() -> str:
    """No resolver is reachable from a Pod: names resolve to nothing, never to the host's DNS."""
    return f"nameserver {NODE_IP}\nsearch svc.cluster.local cluster.local\noptions timeout:1 attempts:1\n"
