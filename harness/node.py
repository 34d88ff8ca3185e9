"""A real node for the local control plane: containerd, runc and the CNI bridge from Debian, kubelet
and kube-scheduler built from the control plane's own release (hack/build-node.sh), the controllers
devcluster leaves out (deployments, replica sets, disruption budgets, node lifecycle, the root CA
ConfigMap), and a pause image built here.

Everything the node touches is named by one id and removed on exit: its directory (and every mount
under it), its network namespace (the link with the node's IP and the ``kubernetes``
Service's ClusterIP, the pods' bridge, every iptables chain the kubelet makes there), its cgroup
root, the pods' network namespaces, the processes it started (containerd's shims found by their
socket), and the kernel tunables the kubelet rewrites (written back). Pods reach the API server
through a relay listening on the ClusterIP inside the node's network namespace and connecting to
the API server on the host's loopback, so no pod packet leaves namespaces the test made.

Root only (namespaces, mounts, cgroups): ``tests/integration/test_node_*.py`` need it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import json
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import yaml

from hack.devcluster import ROOT, ClusterInfo
from harness.identity import cluster_ca
from harness.node_layout import (
    API_SERVICE_IP,
    API_SERVICE_PORT,
    DUMMY_LINK,
    KERNEL_TUNABLES,
    NODE_IP,
    NODE_PREFIX_LENGTH,
    NodeLayout,
    cni_config,
    containerd_config,
    kubelet_config,
    resolv_conf,
)

# One node per host at a time: the kernel tunables the kubelet rewrites are host-wide, so a second
# node saving them while the first runs would "restore" the kubelet's values. Held while a node lives.
HOST_LOCK = Path("/run/cozystack-test-node.lock")
CGROUP_MOUNT = Path("/sys/fs/cgroup")
NETNS_DIR = Path("/run/netns")
CNI_CACHE = Path("/var/lib/cni")
READY_TIMEOUT_SECONDS = 120.0
STOP_TIMEOUT_SECONDS = 20.0
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
# The controllers devcluster leaves out and a node needs: Deployments to ReplicaSets to Pods,
# PodDisruptionBudgets' status (eviction reads it), the node's taints from its heartbeats, and the
# kube-root-ca.crt ConfigMap every Pod's projected ServiceAccount volume mounts.
NODE_CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "disruption-controller",
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "root-ca-certificate-publisher-controller",
)

_libc = ctypes.CDLL(None, use_errno=True)


def build_node() -> Path:
    """Build (or find cached) kubelet, kube-scheduler and pause; returns their directory."""
    result = subprocess.run(
        [str(ROOT / "hack" / "build-node.sh")], check=True, stdout=subprocess.PIPE, text=True
    )
    return Path(result.stdout.strip().splitlines()[-1])


def pause_image(bin_dir: Path) -> str:
    """The pod sandbox image: the pause binary alone, built into podman's store once per build."""
    tag = f"localhost/cozystack-pause:{bin_dir.name.rsplit('-', 1)[-1]}"
    if subprocess.run(["podman", "image", "exists", tag], check=False).returncode == 0:
        return tag
    container = subprocess.run(
        ["buildah", "from", "scratch"], check=True, stdout=subprocess.PIPE, text=True
    ).stdout.strip()
    try:
        subprocess.run(["buildah", "copy", container, str(bin_dir / "pause"), "/pause"], check=True)
        subprocess.run(
            ["buildah", "config", "--entrypoint", '["/pause"]', "--user", "65535:65535", container],
            check=True,
        )
        subprocess.run(
            ["buildah", "commit", "--quiet", container, tag], check=True, stdout=subprocess.DEVNULL
        )
    finally:
        subprocess.run(["buildah", "rm", container], check=False, stdout=subprocess.DEVNULL)
    return tag


def _die_with_parent() -> None:
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _sh(*command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, check=check, capture_output=True, text=True)


def listen_in_netns(netns: str, host: str, port: int) -> socket.socket:
    """A listening TCP socket inside ``netns``: a short-lived thread enters it, makes the socket,
    ends; the socket stays in that namespace, the process in its own."""
    made: dict[str, socket.socket | BaseException] = {}

    def enter_and_listen() -> None:
        try:
            with (NETNS_DIR / netns).open() as target:
                if _libc.setns(target.fileno(), CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns")
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind((host, port))
            server.listen(128)
            server.setblocking(False)
            made["socket"] = server
        except BaseException as error:  # handed to the caller's thread
            made["error"] = error

    thread = threading.Thread(target=enter_and_listen, name=f"listen-in-{netns}")
    thread.start()
    thread.join()
    result = made.get("socket") or made.get("error")
    if not isinstance(result, socket.socket):
        raise result if isinstance(result, BaseException) else RuntimeError("no socket made")
    return result


class Relay:
    """TCP from a socket (in the node's netns) to the API server on the host's loopback, on an event
    loop of its own thread: the pods' and the kubelet's way to the API server."""

    def __init__(self, listener: socket.socket, upstream: tuple[str, int]) -> None:
        self.listener, self.upstream = listener, upstream
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="node-api-relay", daemon=True)
        self.server: asyncio.Server | None = None

    def start(self) -> None:
        self.thread.start()
        started = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._connection, sock=self.listener), self.loop
        )
        self.server = started.result(timeout=10)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def stop(self) -> None:
        async def close() -> None:
            if self.server is not None:
                self.server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        if self.thread.is_alive():
            asyncio.run_coroutine_threadsafe(close(), self.loop).result(timeout=10)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
        self.loop.close()
        self.listener.close()


@dataclass
class NodeInfo:
    name: str
    layout: NodeLayout
    kubeconfig: str  # admin, on the host
    ctr: list[str]  # ctr against the node's containerd, namespace k8s.io
    ready_seconds: float
    logs: Path

    def container_pid(self, container_id: str) -> int:
        """The host pid of a running container's first process (``containerd://<id>`` or ``<id>``)."""
        wanted = container_id.removeprefix("containerd://")
        for line in _sh(*self.ctr, "tasks", "ls").stdout.splitlines()[1:]:
            task, pid, *_ = line.split()
            if task == wanted:
                return int(pid)
        raise LookupError(f"no task {wanted} on {self.name}")

    def load_tag(self, image: str, suffix: str) -> str:
        """``image`` under a new tag (``<tag>-<suffix>``), loaded into the node: a new image as far
        as a Deployment can tell, for a rolling update."""
        tag = f"{image}-{suffix}"
        _sh("podman", "tag", image, tag)
        archive = self.layout.dir / f"{suffix}.tar"
        _sh("podman", "save", "--quiet", "-o", str(archive), tag)
        _sh(*self.ctr, "images", "import", str(archive))
        archive.unlink()
        _sh("podman", "untag", tag, tag)  # only this name; the node holds its own copy now
        return tag


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path


@dataclass
class _Saved:
    tunables: dict[str, str] = field(default_factory=dict)
    netns_before: set[str] = field(default_factory=set)
    cni_cache_existed: bool = True
    cgroups: list[Path] = field(default_factory=list)


class TestNode:
    """A context manager: one node registered to ``cluster``, with ``images`` (podman tags) loaded
    into its containerd; everything removed on exit, whatever state the start reached."""

    __test__ = False  # not a pytest class

    def __init__(self, cluster: ClusterInfo, images: Sequence[str], bin_dir: Path | None = None) -> None:
        assert cluster.bin_dir is not None, "the node runs beside the local control plane only"
        self.cluster = cluster
        self.images = list(images)
        self.bin_dir = bin_dir or build_node()
        node_id = uuid.uuid4().hex[:6]
        self.layout = NodeLayout(
            id=node_id, dir=Path(f"/var/tmp/cozy-node-{node_id}"), pause_image=pause_image(self.bin_dir)
        )
        self.processes: list[_Process] = []
        self.saved = _Saved()
        self.relay: Relay | None = None
        self.lock: int | None = None

    # -- start ---------------------------------------------------------------------------------

    def __enter__(self) -> NodeInfo:
        if os.geteuid() != 0:
            raise PermissionError("the test node needs root (namespaces, mounts, cgroups)")
        self.lock = os.open(HOST_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.lock, fcntl.LOCK_EX)  # waits for another session's node to go
        started = time.monotonic()
        try:
            info = self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        info.ready_seconds = time.monotonic() - started
        return info

    def _start(self) -> NodeInfo:
        layout = self.layout
        logs = layout.dir / "logs"
        for path in (logs, layout.cni_conf_dir, layout.kubelet_dir):
            path.mkdir(parents=True, exist_ok=True)
        self.saved.tunables = {name: _sh("sysctl", "-n", name).stdout.strip() for name in KERNEL_TUNABLES}
        self.saved.netns_before = set(os.listdir(NETNS_DIR)) if NETNS_DIR.exists() else set()
        self.saved.cni_cache_existed = CNI_CACHE.exists()
        self._network()
        self._cgroup_root()
        admin = yaml.safe_load(Path(self.cluster.kubeconfig).read_text())
        server = admin["clusters"][0]["cluster"]["server"]
        host, _, port = server.removeprefix("https://").rpartition(":")
        self.relay = Relay(listen_in_netns(layout.netns, API_SERVICE_IP, API_SERVICE_PORT), (host, int(port)))
        self.relay.start()
        # Files
        (layout.dir / "containerd.toml").write_text(containerd_config(layout))
        (layout.cni_conf_dir / "10-cozy-node.conflist").write_text(json.dumps(cni_config(layout)))
        (layout.dir / "kubelet.yaml").write_text(yaml.safe_dump(kubelet_config(layout)))
        (layout.dir / "resolv.conf").write_text(resolv_conf())
        # The kubelet, in the node's netns, reaches the API server through the relay too.
        cluster_entry = admin["clusters"][0]
        kubelet_kubeconfig = {
            **admin,
            "clusters": [
                {**cluster_entry, "cluster": {**cluster_entry["cluster"], "server": self.api_in_node}}
            ],
        }
        (layout.dir / "kubelet.kubeconfig").write_text(yaml.safe_dump(kubelet_kubeconfig))
        # containerd, then the images, then the kubelet (in the node's netns); the rest on the host.
        nsenter = ["nsenter", f"--net={NETNS_DIR / layout.netns}", "--"]
        self._spawn("containerd", [*nsenter, "containerd", "--config", str(layout.dir / "containerd.toml")])
        ctr = ["ctr", "--address", str(layout.containerd_socket), "--namespace", "k8s.io"]
        self._wait(lambda: _sh(*ctr, "version", check=False).returncode == 0, "containerd answers")
        archive = layout.dir / "images.tar"
        images = [layout.pause_image, *self.images]
        _sh("podman", "save", "--quiet", "--multi-image-archive", "-o", str(archive), *images)
        _sh(*ctr, "images", "import", str(archive))
        archive.unlink()
        ca = layout.dir / "ca.crt"
        ca.write_bytes(cluster_ca(self.cluster.kubeconfig))
        kubeconfig = self.cluster.kubeconfig
        self._spawn(
            "kube-controller-manager",
            [
                str(self.cluster.bin_dir / "kube-controller-manager"),  # type: ignore[operator]
                *_component_flags(kubeconfig),
                f"--controllers={','.join(NODE_CONTROLLERS)}",
                f"--root-ca-file={ca}",
                "--node-monitor-grace-period=20s",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [
                str(self.bin_dir / "kube-scheduler"),
                *_component_flags(kubeconfig),
            ],
        )
        self._spawn(
            "kubelet",
            [
                *nsenter,
                str(self.bin_dir / "kubelet"),
                f"--config={layout.dir / 'kubelet.yaml'}",
                f"--kubeconfig={layout.dir / 'kubelet.kubeconfig'}",
                f"--root-dir={layout.kubelet_dir}",
                f"--cert-dir={layout.kubelet_dir / 'pki'}",
                f"--node-ip={NODE_IP}",
                f"--hostname-override={layout.name}",
                "--v=1",
            ],
        )
        kubectl = [self.cluster.kubectl, f"--kubeconfig={kubeconfig}"]

        def ready() -> bool:
            answer = _sh(*kubectl, "get", "node", layout.name, "-o", "json", check=False)
            if answer.returncode != 0:
                return False
            node = json.loads(answer.stdout)
            conditions = {c["type"]: c["status"] for c in node["status"].get("conditions", [])}
            taints = [t["key"] for t in node["spec"].get("taints", [])]
            return conditions.get("Ready") == "True" and not taints

        self._wait(ready, f"node {layout.name} Ready and untainted", READY_TIMEOUT_SECONDS)
        return NodeInfo(layout.name, layout, kubeconfig, ctr, 0.0, logs)

    @property
    def api_in_node(self) -> str:
        return f"https://{API_SERVICE_IP}:{API_SERVICE_PORT}"

    def _network(self) -> None:
        ns = self.layout.netns
        _sh("ip", "netns", "add", ns)
        inside = ["ip", "-n", ns]
        _sh(*inside, "link", "set", "lo", "up")
        # A veth pair with both ends inside (this kernel has no dummy links): the node's addresses
        # on one end, the default route into it, so whatever has no other route goes nowhere.
        _sh(*inside, "link", "add", DUMMY_LINK, "type", "veth", "peer", "name", f"{DUMMY_LINK}-sink")
        _sh(*inside, "link", "set", f"{DUMMY_LINK}-sink", "up")
        _sh(*inside, "addr", "add", f"{NODE_IP}/{NODE_PREFIX_LENGTH}", "dev", DUMMY_LINK)
        _sh(*inside, "addr", "add", f"{API_SERVICE_IP}/32", "dev", DUMMY_LINK)
        _sh(*inside, "link", "set", DUMMY_LINK, "up")
        _sh(*inside, "route", "add", "default", "dev", DUMMY_LINK)  # a sink: nothing leaves the netns

    def _hierarchies(self) -> list[Path]:
        """One directory per mounted cgroup hierarchy (co-mounted controllers' links resolved)."""
        seen: dict[Path, Path] = {}
        for entry in sorted(CGROUP_MOUNT.iterdir()):
            real = entry.resolve()
            if (real / "cgroup.procs").exists() and real not in seen:
                seen[real] = real
        return list(seen)

    def _cgroup_root(self) -> None:
        for hierarchy in self._hierarchies():
            path = hierarchy / self.layout.cgroup_root.lstrip("/")
            path.mkdir(exist_ok=True)
            self.saved.cgroups.append(path)
            if (hierarchy / "cpuset.cpus").exists():
                for name in ("cpuset.cpus", "cpuset.mems"):
                    (path / name).write_text((hierarchy / name).read_text())

    def _spawn(self, name: str, command: list[str]) -> None:
        log = self.layout.dir / "logs" / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,  # PDEATHSIG: nothing outlives the tests
            )
        self.processes.append(_Process(name, popen, log))

    def _wait(self, condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            for process in self.processes:
                if process.popen.poll() is not None:
                    raise RuntimeError(f"{process.name} exited: {process.log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {timeout}s; logs in {self.layout.dir / 'logs'}")
            time.sleep(0.2)  # polling a condition, bounded by the deadline

    # -- stop ----------------------------------------------------------------------------------

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        layout = self.layout
        ctr = ["ctr", "--address", str(layout.containerd_socket), "--namespace", "k8s.io"]
        kubelet = next((p for p in self.processes if p.name == "kubelet"), None)
        if kubelet is not None and kubelet.popen.poll() is None:
            self._drain(ctr)
        for process in reversed(self.processes):
            if process.name != "containerd":
                _stop(process.popen)
        containerd = next((p for p in self.processes if p.name == "containerd"), None)
        if containerd is not None and containerd.popen.poll() is None:
            # What the kubelet left running: every task killed, then every container removed.
            for task in _sh(*ctr, "tasks", "ls", "-q", check=False).stdout.split():
                _sh(*ctr, "tasks", "kill", "--signal", "SIGKILL", task, check=False)
            self._wait_quietly(lambda: not _sh(*ctr, "tasks", "ls", "-q", check=False).stdout.split())
            for task in _sh(*ctr, "tasks", "ls", "-q", check=False).stdout.split():
                _sh(*ctr, "tasks", "delete", "--force", task, check=False)
            for container in _sh(*ctr, "containers", "ls", "-q", check=False).stdout.split():
                _sh(*ctr, "containers", "delete", container, check=False)
            _stop(containerd.popen)
        for pid in _pids_naming(str(layout.containerd_socket)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # a shim of this node's containerd, by its own pid
        if self.relay is not None:
            self.relay.stop()
        made = set(os.listdir(NETNS_DIR)) - self.saved.netns_before if NETNS_DIR.exists() else set()
        for netns in sorted(made):
            if netns.startswith("cni-"):  # a pod's, made by this node's containerd
                _sh("umount", "--lazy", str(NETNS_DIR / netns), check=False)
                with contextlib.suppress(OSError):
                    (NETNS_DIR / netns).unlink()
        for mount in reversed(_mounts_under(layout.dir)):
            _sh("umount", "--lazy", mount, check=False)
        self._remove_cgroups()
        _sh("ip", "netns", "delete", layout.netns, check=False)
        for name, value in self.saved.tunables.items():
            _sh("sysctl", "-q", "-w", f"{name}={value}", check=False)
        for cached in CNI_CACHE.glob(f"**/*{layout.name}*"):
            with contextlib.suppress(OSError):
                cached.unlink()
        if not self.saved.cni_cache_existed:  # libcni's cache, made by this node's containerd
            for path in [*sorted(CNI_CACHE.rglob("*"), key=lambda p: -len(p.parts)), CNI_CACHE]:
                with contextlib.suppress(OSError):
                    path.rmdir()  # only what is empty: never another's cached result
        # After a failure only the logs stay, for the test report to point at.
        keep = exc_type is not None and (layout.dir / "logs").exists()
        for entry in layout.dir.iterdir() if layout.dir.exists() else ():
            if not (keep and entry.name == "logs"):
                _sh("rm", "-rf", "--one-file-system", str(entry), check=False)
        if not keep:
            with contextlib.suppress(OSError):
                layout.dir.rmdir()
        if self.lock is not None:
            os.close(self.lock)  # releases the host lock
            self.lock = None

    def _drain(self, ctr: list[str]) -> None:
        """Cordon the node and delete its Pods, so the kubelet itself stops every container and
        tears its network down (CNI DEL); then nothing of a Pod is left to kill."""
        kubectl = [self.cluster.kubectl, f"--kubeconfig={self.cluster.kubeconfig}"]
        _sh(*kubectl, "cordon", self.layout.name, check=False)
        _sh(
            *kubectl,
            "delete",
            "pods",
            "--all-namespaces",
            f"--field-selector=spec.nodeName={self.layout.name}",
            "--wait=false",
            check=False,
        )
        self._wait_quietly(
            lambda: not _sh(*ctr, "tasks", "ls", "-q", check=False).stdout.split(), timeout=60.0
        )

    def _remove_cgroups(self) -> None:
        def remove() -> bool:
            left = False
            for root in self.saved.cgroups:
                if not root.exists():
                    continue
                for path in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                    with contextlib.suppress(OSError):
                        path.rmdir()
                try:
                    root.rmdir()
                except OSError:
                    left = True
            return not left

        self._wait_quietly(remove)

    def _wait_quietly(self, condition: Callable[[], bool], timeout: float = STOP_TIMEOUT_SECONDS) -> None:
        deadline = time.monotonic() + timeout
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.2)  # polling a condition, bounded by the deadline

    def leftovers(self) -> list[str]:
        """What of this node is still there (after exit: nothing)."""
        found: list[str] = []
        found += [f"process {pid}" for pid in _pids_naming(str(self.layout.dir))]
        found += [f"mount {m}" for m in _mounts_under(self.layout.dir)]
        found += [f"cgroup {c}" for c in self.saved.cgroups if c.exists()]
        if (NETNS_DIR / self.layout.netns).exists():
            found.append(f"netns {self.layout.netns}")
        if self.layout.dir.exists():
            found.append(f"directory {self.layout.dir}")
        if not self.saved.cni_cache_existed and CNI_CACHE.exists():
            found.append(f"directory {CNI_CACHE}")
        for name, value in self.saved.tunables.items():
            now = _sh("sysctl", "-n", name).stdout.strip()
            if now != value:
                found.append(f"sysctl {name}={now} (was {value})")
        return found


def _stop(popen: subprocess.Popen[bytes]) -> None:
    if popen.poll() is not None:
        return
    popen.terminate()
    try:
        popen.wait(timeout=STOP_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()


def _pids_naming(text: str) -> list[int]:
    """Processes whose command line names ``text`` (this node's socket or directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(int(entry.name))
    return found


def _mounts_under(directory: Path) -> list[str]:
    prefix = str(directory)
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point == prefix or point.startswith(prefix + "/"):
            mounts.append(point)
    return mounts


def _component_flags(kubeconfig: str) -> list[str]:
    """What the scheduler and the controller manager share: the admin's credentials for everything,
    a loopback port of their own, no leader election."""
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={_free_port()}",
        "--leader-elect=false",
        "--profiling=false",
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def running_node(cluster: ClusterInfo, images: Sequence[str]) -> Iterator[NodeInfo]:
    node = TestNode(cluster, images)
    with node as info:
        yield info
    left = node.leftovers()
    assert not left, f"the test node left behind: {left}"
