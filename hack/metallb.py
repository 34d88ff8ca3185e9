"""MetalLB's real controller beside the operators: for the integration tests, the benchmarks and the demo.

Decides:
- how MetalLB runs here: its controller only (it assigns ``status.loadBalancer.ingress``; no speaker
  announces anything, there is no network to announce on), built by ``hack/build-tool.sh metallb``,
  with its CRDs from the pinned module's ``config/crd/bases/`` applied server-side first, webhooks
  and certificate rotation off, a free metrics port, its log in a file; killed when we leave (and
  when we die: it gets SIGKILL with its parent).
- when it counts as up: its own metric ``metallb_k8s_client_config_loaded_bool`` reads 1 (it read
  its configuration, pools included, from the API).
- which ``IPAddressPool`` objects a hoster declares for the ``IPAddressClass`` objects there are
  (``pools_for_classes``, pure): one pool per class MetalLB must serve (provider MetalLB, the
  ``loadBalancerClass`` this MetalLB serves), named by the class's ``metallbAddressPool`` or else
  after the class, holding the class's ``cidrs`` and ``ranges``, with ``autoAssign: false`` so
  MetalLB hands out only an address a Service asks for by annotation. A class whose addresses
  overlap a pool declared for an older class is left without a pool: MetalLB rejects its whole
  configuration when two pools overlap, and a hoster would not declare that either.
- ``PoolMirror`` keeps those pools declared while classes come and go (list, then watch; the pools
  it made carry its label, and only those are ever changed or deleted).

Does not: play MetalLB's part (nothing here writes a Service's status), decide which address a
Service gets (the operator asks for it by annotation), or exclude a class's ``excludeAddresses``
from its pool (the operator never asks for those; MetalLB never auto-assigns from these pools).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ipaddress
import json
import os
import signal
import socket
import subprocess
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx
import yaml

from shared.kube import NO_ANSWER, ApiError, Kube, Obj
from shared.resources import CRDS, NAMESPACES, Resource

API_VERSION: Final = "local.sdn.cozystack.io/v1alpha1"  # temporary: the pool mirror goes (ea-tests)
IP_ADDRESS_CLASS_PLURAL: Final = "ipaddressclasses"
PROVIDER_METALLB: Final = "MetalLB"

ROOT: Final = Path(__file__).resolve().parents[1]
TOOL_DIR: Final = ROOT / "hack" / "tools" / "metallb"
MODULE: Final = "go.universe.tf/metallb"
# The namespace MetalLB reads its configuration (pools) from, as in its own manifests.
NAMESPACE: Final = "metallb-system"
FIELD_MANAGER: Final = "cozystack-hoster"
POOLS: Final = Resource("metallb.io/v1beta1", "ipaddresspools")
CLASSES: Final = Resource(API_VERSION, IP_ADDRESS_CLASS_PLURAL, namespaced=False)
# The pools PoolMirror declared carry this label; it never touches a pool without it.
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "cozystack-ipaddressclass-mirror"
# Which classes a mirrored pool serves (comma-separated), for whoever reads the pool.
CLASSES_ANNOTATION: Final = "local.sdn.cozystack.io/ipaddressclasses"
CONFIG_LOADED_METRIC: Final = "metallb_k8s_client_config_loaded_bool"
CONFIG_STALE_METRIC: Final = "metallb_k8s_client_config_stale_bool"
READY_TIMEOUT_SECONDS: Final = 120.0
POOLS_TIMEOUT_SECONDS: Final = 60.0
# How often a bounded wait re-reads what it waits on.
POLL_SECONDS: Final = 0.2
# The mirror's retry interval after an API error (e.g. the IPAddressClass CRD not installed yet).
RETRY_SECONDS: Final = 1.0
# MetalLB counts a CIDR with this many host bits or more as never running out (its poolCount).
HUGE_HOST_BITS: Final = 62
CONFLICT: Final = 409
# prctl(2): deliver a signal to the child when its parent dies.
_PR_SET_PDEATHSIG: Final = 1


# --- Building and installing ----------------------------------------------------------------------


def binary() -> Path:
    """MetalLB's controller, built once and cached (``hack/build-tool.sh metallb``)."""
    result = subprocess.run(
        [str(ROOT / "hack" / "build-tool.sh"), "metallb"], check=True, stdout=subprocess.PIPE, text=True
    )
    return Path(result.stdout.strip().splitlines()[-1])


def module_version() -> str:
    """The MetalLB version hack/tools/metallb/go.mod pins."""
    for line in (TOOL_DIR / "go.mod").read_text().splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == MODULE:
            return words[1]
    raise RuntimeError(f"{TOOL_DIR}/go.mod does not require {MODULE}")


def crd_dir() -> Path:
    """``config/crd/bases`` of the pinned MetalLB module in Go's module cache (downloaded if missing)."""
    version = module_version()
    result = subprocess.run(
        ["go", "mod", "download", "-json", f"{MODULE}@{version}"],
        cwd=TOOL_DIR,
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    directory = Path(json.loads(result.stdout)["Dir"]) / "config" / "crd" / "bases"
    if not directory.is_dir():
        raise RuntimeError(f"no CRDs in {directory}")
    return directory


async def install_crds(kube: Kube, directory: Path) -> None:
    """Apply every MetalLB CRD server-side (idempotent) and wait until each is served."""
    names = []
    for path in sorted(directory.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                await kube.apply(CRDS.path(name=doc["metadata"]["name"]), doc, FIELD_MANAGER)
                names.append(doc["metadata"]["name"])
    for name in names:
        await _until(lambda name=name: _established(kube, name), READY_TIMEOUT_SECONDS, f"CRD {name}")


async def _established(kube: Kube, name: str) -> bool:
    crd = await kube.get(CRDS.path(name=name))
    conditions = ((crd or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


async def _until(probe: Any, seconds: float, what: str) -> None:
    """Poll ``probe`` (an async callable returning a truth value) until true, or fail at the deadline.

    A transient API error (429 while a CRD's storage initialises, 5xx) counts as "not yet"."""
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        try:
            if await probe():
                return
        except ApiError as error:
            if not error.transient:
                raise
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"timed out after {seconds}s waiting for {what}")
        await asyncio.sleep(POLL_SECONDS)  # the interval of a poll bounded by the deadline above


# --- Pools for classes (pure) ---------------------------------------------------------------------


@dataclass(frozen=True)
class PoolDecl:
    """One IPAddressPool: its addresses in MetalLB's syntax, and the classes it serves."""

    addresses: tuple[str, ...]
    classes: tuple[str, ...]
    ipv4: int  # addresses MetalLB will count, per family (HUGE for a CIDR it deems endless)
    ipv6: int


HUGE: Final = 2**62
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _entry_networks(entry: str) -> list[Network]:
    """One address entry of a MetalLB pool (a CIDR, or ``start-end``) as networks."""
    if "-" in entry:
        start, end = (ipaddress.ip_address(part.strip()) for part in entry.split("-", 1))
        # Raises ValueError on mixed families or start above end.
        return list(ipaddress.summarize_address_range(start, end))
    return [ipaddress.ip_network(entry.strip(), strict=False)]


def _class_entries(spec: Mapping[str, Any]) -> list[str]:
    """A class's addresses as MetalLB pool entries (canonical CIDRs, ``start-end`` ranges).

    Raises ValueError on text the CRD's validation let through but Python cannot parse."""
    entries = [str(ipaddress.ip_network(cidr, strict=True)) for cidr in spec.get("cidrs") or []]
    for item in spec.get("ranges") or []:
        start, end = ipaddress.ip_address(item["start"]), ipaddress.ip_address(item["end"])
        entries.append(f"{start}-{end}")
    return entries


def pool_decl(addresses: Iterable[str], classes: Iterable[str] = ()) -> PoolDecl:
    """The declaration of a pool holding ``addresses`` (MetalLB's syntax), with its sizes."""
    entries = tuple(addresses)
    networks = [n for entry in entries for n in _entry_networks(entry)]
    return PoolDecl(entries, tuple(classes), _count(networks, 4), _count(networks, 6))


def _overlaps(
    ours: Iterable[Network],
    taken: Iterable[Network],
) -> bool:
    taken = list(taken)
    return any(a.version == b.version and a.overlaps(b) for a in ours for b in taken)


def _count(networks: Iterable[Network], version: int) -> int:
    total = 0
    for network in networks:
        if network.version != version:
            continue
        host_bits = network.max_prefixlen - network.prefixlen
        if host_bits >= HUGE_HOST_BITS:
            return HUGE
        total += network.num_addresses
    return min(total, HUGE)


def serves(address_class: Mapping[str, Any], lb_class: str) -> bool:
    """Whether a MetalLB running with ``--lb-class=lb_class`` ("": none) answers the class's Services."""
    spec = address_class.get("spec") or {}
    return (spec.get("provider") or PROVIDER_METALLB) == PROVIDER_METALLB and (
        spec.get("loadBalancerClass") or ""
    ) == lb_class


def pools_for_classes(
    classes: Iterable[Mapping[str, Any]], lb_class: str = "", taken: Iterable[str] = ()
) -> dict[str, PoolDecl]:
    """The IPAddressPools a hoster declares for these classes (see the module docstring).

    ``taken``: the address entries of pools declared otherwise (not for a class). Older classes first
    (creation time, then name): a class overlapping an earlier pool, or a taken entry, is skipped, so
    a newcomer never takes a pool away from a class that already had one."""
    ordered = sorted(
        (
            c
            for c in classes
            if serves(c, lb_class) and not (c.get("metadata") or {}).get("deletionTimestamp")
        ),
        key=lambda c: (c["metadata"].get("creationTimestamp") or "", c["metadata"]["name"]),
    )
    foreign: list[Network] = []
    for entry in taken:
        with contextlib.suppress(ValueError):
            foreign.extend(_entry_networks(entry))
    entries: dict[str, list[str]] = {}
    members: dict[str, list[str]] = {}
    networks: dict[str, list[Network]] = {}
    for address_class in ordered:
        name = address_class["metadata"]["name"]
        spec = address_class.get("spec") or {}
        try:
            mine = _class_entries(spec)
            nets = [n for entry in mine for n in _entry_networks(entry)]
        except (ValueError, KeyError, TypeError):
            continue  # the operator reports ClassInvalid; no pool for it
        if not mine:
            continue
        pool = str(spec.get("metallbAddressPool") or name)
        declared = [n for ns in networks.values() for n in ns]
        if _overlaps(nets, declared) or _overlaps(nets, foreign):
            continue
        entries.setdefault(pool, []).extend(mine)
        members.setdefault(pool, []).append(name)
        networks.setdefault(pool, []).extend(nets)
    return {pool: pool_decl(entries[pool], members[pool]) for pool in entries}


def pool_object(name: str, decl: PoolDecl, namespace: str = NAMESPACE, *, mirrored: bool = True) -> Obj:
    """The IPAddressPool manifest for one declaration (``mirrored``: the mirror's, for classes)."""
    metadata: Obj = {"name": name, "namespace": namespace}
    if mirrored:
        metadata["labels"] = {MANAGED_BY_LABEL: MANAGED_BY}
        metadata["annotations"] = {CLASSES_ANNOTATION: ",".join(decl.classes)}
    return {
        "apiVersion": POOLS.api_version,
        "kind": "IPAddressPool",
        "metadata": metadata,
        "spec": {"addresses": list(decl.addresses), "autoAssign": False, "avoidBuggyIPs": False},
    }


def pool_loaded(pool: Obj | None, decl: PoolDecl) -> bool:
    """Whether MetalLB reports the pool at its declared size (its status counts what it loaded)."""
    status = (pool or {}).get("status") or {}
    counts = []
    for family, expected in (("IPv4", decl.ipv4), ("IPv6", decl.ipv6)):
        seen = int(status.get(f"assigned{family}") or 0) + int(status.get(f"available{family}") or 0)
        counts.append(seen > 0 if expected >= HUGE else seen == expected)
    return all(counts)


# --- The mirror -----------------------------------------------------------------------------------


def _mirrored(pool: Obj) -> bool:
    return ((pool.get("metadata") or {}).get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY


@dataclass
class PoolMirror:
    """Declares ``pools_for_classes`` of the classes in the cluster, as they change."""

    kube: Kube
    namespace: str = NAMESPACE
    lb_class: str = ""
    classes: dict[str, Obj] = field(default_factory=dict)
    declared: dict[str, PoolDecl] = field(default_factory=dict)
    last_error: str = ""  # the latest failure it retried after, for whoever wonders why

    async def run(self) -> None:
        """List and watch classes until cancelled; every failure (the class CRD not installed yet,
        an API server restarting or gone) is retried after a pause, never fatal."""
        while True:
            try:
                await self._list_and_watch()
            except Exception as error:  # a background loop: report, and retry
                self.last_error = f"{type(error).__name__}: {error}"
                await asyncio.sleep(RETRY_SECONDS)  # the pause between retries

    async def _list_and_watch(self) -> None:
        listing = await self.kube.list(CLASSES.path())
        self.classes = {c["metadata"]["name"]: c for c in listing["items"]}
        await self.sync()
        version = listing["metadata"]["resourceVersion"]
        events = self.kube.watch(CLASSES.path(), resource_version=version)
        async with contextlib.aclosing(events):
            async for kind, obj in events:
                if kind == "ERROR":
                    return  # 410 Gone and the like: list again
                if kind == "BOOKMARK":
                    continue
                name = obj["metadata"]["name"]
                if kind == "DELETED":
                    self.classes.pop(name, None)
                else:
                    self.classes[name] = obj
                await self.sync()

    def desired(self, classes: Iterable[Obj], pools: Iterable[Obj]) -> dict[str, PoolDecl]:
        """The mirrored pools for ``classes``, beside the pools in the namespace it did not make."""
        foreign = [p for p in pools if not _mirrored(p)]
        taken = [a for p in foreign for a in (p.get("spec") or {}).get("addresses") or []]
        names = {p["metadata"]["name"] for p in foreign}
        wanted = pools_for_classes(classes, self.lb_class, taken)
        return {name: decl for name, decl in wanted.items() if name not in names}

    async def sync(self) -> None:
        """Make the declared pools equal to what the known classes need."""
        every = (await self.kube.list(POOLS.path(self.namespace)))["items"]
        existing = {p["metadata"]["name"]: p for p in every if _mirrored(p)}
        desired = self.desired(self.classes.values(), every)
        for name, decl in desired.items():
            wanted = pool_object(name, decl, self.namespace)
            have = existing.get(name)
            if (
                have is None
                or have.get("spec", {}).get("addresses") != wanted["spec"]["addresses"]
                or (
                    (have["metadata"].get("annotations") or {}).get(CLASSES_ANNOTATION)
                    != wanted["metadata"]["annotations"][CLASSES_ANNOTATION]
                )
            ):
                await self.kube.apply(POOLS.path(self.namespace, name), wanted, FIELD_MANAGER)
        for name in existing.keys() - desired.keys():
            await self.kube.delete(POOLS.path(self.namespace, name))
        self.declared = desired

    async def remove_all(self) -> None:
        """Delete every pool this mirror declared (the classes' pools go with the classes' world)."""
        current = await self.kube.list(
            POOLS.path(self.namespace), label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY}"
        )
        for pool in current["items"]:
            await self.kube.delete(POOLS.path(self.namespace, pool["metadata"]["name"]))


# --- The process ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the parent dies, so no MetalLB outlives its session."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class MetalLB:
    """A running MetalLB controller (and, usually, the mirror declaring its pools)."""

    kube: Kube
    process: asyncio.subprocess.Process
    log_path: Path
    metrics_port: int
    namespace: str
    lb_class: str
    mirror: PoolMirror | None = None

    def running(self) -> bool:
        return self.process.returncode is None

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    async def metric(self, name: str) -> float | None:
        """One unlabelled sample of MetalLB's metrics, or None when not (yet) served."""
        try:
            async with httpx.AsyncClient() as client:
                response = await client.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5)
        except httpx.HTTPError:
            return None
        for line in response.text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None

    async def _config_loaded(self) -> bool:
        if not self.running():
            raise RuntimeError(f"MetalLB exited ({self.process.returncode}):\n{self.log_tail()}")
        return await self.metric(CONFIG_LOADED_METRIC) == 1

    async def wait_ready(self, seconds: float = READY_TIMEOUT_SECONDS) -> None:
        """Until MetalLB has read its configuration from the API (its own metric says so)."""
        await _until(self._config_loaded, seconds, f"MetalLB's configuration loaded (log: {self.log_path})")

    async def wait_for_pools(self, seconds: float = POOLS_TIMEOUT_SECONDS) -> dict[str, PoolDecl]:
        """Until the mirror declared the pools the classes need (as they are when we look) and
        MetalLB loaded every one."""
        mirror = self.mirror
        if mirror is None:
            return {}
        desired: dict[str, PoolDecl] = {}

        async def settled() -> bool:
            nonlocal desired
            if not self.running():
                raise RuntimeError(f"MetalLB exited ({self.process.returncode}):\n{self.log_tail()}")
            classes = (await self.kube.list(CLASSES.path()))["items"]
            pools = (await self.kube.list(POOLS.path(self.namespace)))["items"]
            desired = mirror.desired(classes, pools)
            if mirror.declared != desired:
                return False
            by_name = {p["metadata"]["name"]: p for p in pools}
            return all(pool_loaded(by_name.get(name), decl) for name, decl in desired.items())

        try:
            await _until(settled, seconds, "MetalLB to load the classes' pools")
        except TimeoutError as error:
            raise TimeoutError(
                f"{error}: wanted {desired}, declared {mirror.declared}; the mirror's last error: "
                f"{mirror.last_error or 'none'}; MetalLB's log: {self.log_path}"
            ) from None
        return desired

    async def wait_for_pool(
        self, name: str, seconds: float = POOLS_TIMEOUT_SECONDS, *, assigned: int | None = None
    ) -> None:
        """Until MetalLB loaded the pool ``name`` (declared by whoever) at its declared size, and,
        given ``assigned``, reports that many of its addresses assigned."""

        async def loaded() -> bool:
            pool = await self.kube.get(POOLS.path(self.namespace, name))
            addresses = ((pool or {}).get("spec") or {}).get("addresses") or []
            if not addresses or not pool_loaded(pool, pool_decl(addresses)):
                return False
            status = (pool or {}).get("status") or {}
            in_use = int(status.get("assignedIPv4") or 0) + int(status.get("assignedIPv6") or 0)
            return assigned is None or in_use == assigned

        await _until(loaded, seconds, f"MetalLB's pool {name} (log: {self.log_path})")


async def declare_pool(kube: Kube, name: str, addresses: Iterable[str], namespace: str = NAMESPACE) -> Obj:
    """An IPAddressPool a hoster declares for itself (not for a class; the mirror leaves it alone)."""
    pool = pool_object(name, pool_decl(addresses), namespace, mirrored=False)
    return await kube.apply(POOLS.path(namespace, name), pool, FIELD_MANAGER)


@contextlib.asynccontextmanager
async def metallb(
    kube: Kube,
    kubeconfig: str,
    log_path: Path,
    *,
    namespace: str = NAMESPACE,
    lb_class: str = "",
    mirror_classes: bool = True,
    remove_pools: bool = True,
) -> AsyncIterator[MetalLB]:
    """MetalLB's controller against ``kubeconfig``, ready; with ``mirror_classes`` an IPAddressPool per
    IPAddressClass kept declared meanwhile (and, with ``remove_pools``, removed at the end: pass False
    when the control plane may already be gone then)."""
    executable, crds = await asyncio.gather(asyncio.to_thread(binary), asyncio.to_thread(crd_dir))
    await install_crds(kube, crds)
    try:
        await kube.create(
            NAMESPACES.path(), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        )
    except ApiError as error:
        if error.status != CONFLICT:  # 409: already there
            raise
    port = free_port()
    args = [
        f"--kubeconfig={kubeconfig}",
        f"--namespace={namespace}",
        f"--port={port}",
        "--webhook-mode=disabled",
        "--disable-cert-rotation",
        "--log-level=info",
    ]
    if lb_class:
        args.append(f"--lb-class={lb_class}")
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        process = await asyncio.create_subprocess_exec(
            str(executable),
            *args,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            preexec_fn=_die_with_parent,  # only prctl: takes no lock
        )
    running = MetalLB(kube, process, log_path, port, namespace, lb_class)
    task: asyncio.Task[None] | None = None
    try:
        await running.wait_ready()
        if mirror_classes:
            running.mirror = PoolMirror(kube, namespace, lb_class)
            task = asyncio.create_task(running.mirror.run(), name="metallb-pool-mirror")
            await running.wait_for_pools()
        yield running
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            if remove_pools and running.mirror is not None:
                with contextlib.suppress(ApiError, *NO_ANSWER, httpx.HTTPError):
                    async with asyncio.timeout(10):
                        await running.mirror.remove_all()
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), timeout=10)
            except TimeoutError:
                process.kill()
                await process.wait()
