"""MetalLB's real controller beside the operators: for the integration tests, the benchmarks and the demo.

Decides:
- how MetalLB runs here: its controller only (it assigns ``status.loadBalancer.ingress``; no speaker
  announces anything, there is no network to announce on), built by ``hack/build-tool.sh metallb``,
  with its CRDs from the pinned module's ``config/crd/bases/`` applied server-side first, webhooks
  and certificate rotation off, a free metrics port, its log in a file; killed when we leave (and
  when we die: it gets SIGKILL with its parent).
- when it counts as up: its own metric ``metallb_k8s_client_config_loaded_bool`` reads 1 (it read
  its configuration, pools included, from the API).
- what a pool's declaration means (``pool_decl``: its addresses in MetalLB's syntax and the sizes
  MetalLB will count) and when MetalLB reports it loaded (``pool_loaded``); ``declare_pool`` is a
  hoster's own pool (``autoAssign: false``: MetalLB hands out only an address a Service asks for).

Does not: play MetalLB's part (nothing here writes a Service's status), decide which address a
Service gets, or declare pools for address classes: the address substrate's MetalLB driver renders
those (in the tests, its model, ``harness/substrate.py``).
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
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx
import yaml

from shared.kube import ApiError, Kube, Obj
from shared.resources import CRDS, NAMESPACES, Resource

ROOT: Final = Path(__file__).resolve().parents[1]
TOOL_DIR: Final = ROOT / "hack" / "tools" / "metallb"
MODULE: Final = "go.universe.tf/metallb"
# The namespace MetalLB reads its configuration (pools) from, as in its own manifests.
NAMESPACE: Final = "metallb-system"
FIELD_MANAGER: Final = "cozystack-hoster"
POOLS: Final = Resource("metallb.io/v1beta1", "ipaddresspools")
CONFIG_LOADED_METRIC: Final = "metallb_k8s_client_config_loaded_bool"
CONFIG_STALE_METRIC: Final = "metallb_k8s_client_config_stale_bool"
READY_TIMEOUT_SECONDS: Final = 120.0
POOLS_TIMEOUT_SECONDS: Final = 60.0
# How often a bounded wait re-reads what it waits on.
POLL_SECONDS: Final = 0.2
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


# --- Pools (pure) ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolDecl:
    """One IPAddressPool: its addresses in MetalLB's syntax."""

    addresses: tuple[str, ...]
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


def pool_decl(addresses: Iterable[str]) -> PoolDecl:
    """The declaration of a pool holding ``addresses`` (MetalLB's syntax), with its sizes."""
    entries = tuple(addresses)
    networks = [n for entry in entries for n in _entry_networks(entry)]
    return PoolDecl(entries, _count(networks, 4), _count(networks, 6))


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


def pool_object(name: str, decl: PoolDecl, namespace: str = NAMESPACE) -> Obj:
    """The IPAddressPool manifest for one declaration."""
    return {
        "apiVersion": POOLS.api_version,
        "kind": "IPAddressPool",
        "metadata": {"name": name, "namespace": namespace},
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


# --- The process ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def die_with_parent() -> None:
    """In the child before exec: SIGKILL when the parent dies, so no MetalLB outlives its session."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class MetalLB:
    """A running MetalLB controller."""

    kube: Kube
    process: asyncio.subprocess.Process
    log_path: Path
    metrics_port: int
    namespace: str
    lb_class: str

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
    """An IPAddressPool a hoster declares for itself."""
    pool = pool_object(name, pool_decl(addresses), namespace)
    return await kube.apply(POOLS.path(namespace, name), pool, FIELD_MANAGER)


@contextlib.asynccontextmanager
async def metallb(
    kube: Kube,
    kubeconfig: str,
    log_path: Path,
    *,
    namespace: str = NAMESPACE,
    lb_class: str = "",
) -> AsyncIterator[MetalLB]:
    """MetalLB's controller against ``kubeconfig``, ready (its pools are whoever's declares them)."""
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
            preexec_fn=die_with_parent,  # only prctl: takes no lock
        )
    running = MetalLB(kube, process, log_path, port, namespace, lb_class)
    try:
        await running.wait_ready()
        yield running
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), timeout=10)
            except TimeoutError:
                process.kill()
                await process.wait()
