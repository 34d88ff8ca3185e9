"""Cozystack's real address substrate beside the operators, when its binaries are handed to us.

The substrate (its core ``address-controller`` and its MetalLB driver ``metallb-iad``) cannot be
fetched or built from the registries here; a user's clone does not have it. When the environment
variable ``COZY_SUBSTRATE_BIN`` names a directory holding both binaries (``.ci/run`` sets it when it
finds them), the tests, the demo and the benchmarks run them — the **real lane**; otherwise the
documented model of ``harness/substrate.py`` plays them — the **model lane**.

Decides:
- the lane (``lane()``): the variable unset is the model; set, it must name both binaries (a typo is
  an error, never a silent fall-back to the model);
- how the real one runs here, as its README says: over the real MetalLB controller, both with
  ``--leader-elect=false``, metrics off, a free health port each, ready when ``/readyz`` answers, their
  logs in files, killed with their parent; the driver's placeholders in ``PLACEHOLDER_NAMESPACE``;
- the driver's identity: its own ServiceAccount (``DRIVER_USERNAME``, kubebuilder's default names,
  which the shipped rendered-Services admission policy exempts for its pin: a unit test holds the
  two to the same name), bound to
  ``cluster-admin`` here (the test world has no use for the driver's own narrower role).

Does not: install the substrate's CRDs (a hoster does; the caller applies them), create classes,
or decide anything the substrate decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

import httpx

from hack.identity import serviceaccount_kubeconfig
from hack.metallb import NAMESPACE as METALLB_NAMESPACE
from hack.metallb import die_with_parent, free_port
from shared.kube import Kube
from shared.resources import CLUSTER_ROLE_BINDINGS, NAMESPACES, SERVICE_ACCOUNTS

# Names a directory holding both binaries: the real lane.
SUBSTRATE_BIN_ENV: Final = "COZY_SUBSTRATE_BIN"
CORE: Final = "address-controller"
DRIVER: Final = "metallb-iad"
# Where the driver keeps its placeholder Services (its default), and its own ServiceAccount.
PLACEHOLDER_NAMESPACE: Final = "metallb-iad-system"
DRIVER_SERVICE_ACCOUNT: Final = "metallb-iad-controller-manager"
DRIVER_USERNAME: Final = f"system:serviceaccount:{PLACEHOLDER_NAMESPACE}:{DRIVER_SERVICE_ACCOUNT}"
# The driver renders one MetalLB IPAddressPool per class, named with this prefix.
POOL_PREFIX: Final = "iad-"
FIELD_MANAGER: Final = "cozystack-hoster"
READY_TIMEOUT_SECONDS: Final = 60.0
POLL_SECONDS: Final = 0.1
# The driver's token outlives any run here (a soak is 20 minutes).
TOKEN_SECONDS: Final = 6 * 3600

Lane = Literal["model", "real"]


def bin_dir() -> Path | None:
    """The directory of the real binaries, None on the model lane; an error when the variable names
    a directory that lacks one."""
    named = os.environ.get(SUBSTRATE_BIN_ENV, "")
    if not named:
        return None
    directory = Path(named)
    missing = [b for b in (CORE, DRIVER) if not os.access(directory / b, os.X_OK)]
    if missing:
        raise RuntimeError(f"{SUBSTRATE_BIN_ENV}={named} has no executable {', '.join(missing)}")
    return directory


def lane() -> Lane:
    return "real" if bin_dir() is not None else "model"


def pool_name(class_name: str) -> str:
    """The MetalLB pool the driver renders for a class."""
    return POOL_PREFIX + class_name


@dataclass
class RealSubstrate:
    """The two running controllers."""

    processes: dict[str, asyncio.subprocess.Process]
    log_dir: Path

    def running(self) -> bool:
        return all(p.returncode is None for p in self.processes.values())

    def log_tail(self, lines: int = 20) -> str:
        tails = []
        for name in self.processes:
            text = (self.log_dir / f"{name}.log").read_text(errors="replace").splitlines()[-lines:]
            tails.append(f"--- {name}\n" + "\n".join(text))
        return "\n".join(tails)


async def driver_kubeconfig(kube: Kube, admin_kubeconfig: str, path: Path) -> str:
    """The driver's namespace and ServiceAccount (bound to cluster-admin) and a kubeconfig as it."""
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": PLACEHOLDER_NAMESPACE}}
    await kube.apply(NAMESPACES.path(name=PLACEHOLDER_NAMESPACE), namespace, FIELD_MANAGER)
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": DRIVER_SERVICE_ACCOUNT, "namespace": PLACEHOLDER_NAMESPACE},
    }
    path_of_account = SERVICE_ACCOUNTS.path(PLACEHOLDER_NAMESPACE, DRIVER_SERVICE_ACCOUNT)
    await kube.apply(path_of_account, account, FIELD_MANAGER)
    binding = {
        "apiVersion": CLUSTER_ROLE_BINDINGS.api_version,
        "kind": "ClusterRoleBinding",
        "metadata": {"name": f"{DRIVER}-test-world"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [
            {"kind": "ServiceAccount", "name": DRIVER_SERVICE_ACCOUNT, "namespace": PLACEHOLDER_NAMESPACE}
        ],
    }
    await kube.apply(CLUSTER_ROLE_BINDINGS.path(name=f"{DRIVER}-test-world"), binding, FIELD_MANAGER)
    return await serviceaccount_kubeconfig(
        kube, admin_kubeconfig, PLACEHOLDER_NAMESPACE, DRIVER_SERVICE_ACCOUNT, path, TOKEN_SECONDS
    )


async def _start(executable: Path, args: list[str], log_path: Path) -> tuple[asyncio.subprocess.Process, int]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    with log_path.open("ab") as log:
        process = await asyncio.create_subprocess_exec(
            str(executable),
            *args,
            "--leader-elect=false",
            "--metrics-bind-address=0",
            f"--health-probe-bind-address=127.0.0.1:{port}",
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            preexec_fn=die_with_parent,  # only prctl: takes no lock
        )
    return process, port


async def _ready(process: asyncio.subprocess.Process, port: int, log_path: Path) -> None:
    deadline = asyncio.get_running_loop().time() + READY_TIMEOUT_SECONDS
    async with httpx.AsyncClient() as client:
        while True:
            if process.returncode is not None:
                raise RuntimeError(f"{log_path.stem} exited ({process.returncode}); log: {log_path}")
            with contextlib.suppress(httpx.HTTPError):
                answer = await client.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
                if answer.status_code == 200:
                    return
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(
                    f"{log_path.stem} not ready after {READY_TIMEOUT_SECONDS}s; log: {log_path}"
                )
            await asyncio.sleep(POLL_SECONDS)  # the interval of a poll bounded by the deadline above


@contextlib.asynccontextmanager
async def real_substrate(
    kube: Kube, admin_kubeconfig: str, log_dir: Path, *, metallb_namespace: str = METALLB_NAMESPACE
) -> AsyncIterator[RealSubstrate]:
    """The real core and driver against the cluster (its CRDs and MetalLB already there), ready."""
    directory = bin_dir()
    if directory is None:
        raise RuntimeError(f"the real substrate needs {SUBSTRATE_BIN_ENV}")
    log_dir.mkdir(parents=True, exist_ok=True)
    driver_config = await driver_kubeconfig(kube, admin_kubeconfig, log_dir / "driver.kubeconfig")
    processes: dict[str, asyncio.subprocess.Process] = {}
    try:
        core, core_port = await _start(
            directory / CORE, [f"--kubeconfig={admin_kubeconfig}"], log_dir / f"{CORE}.log"
        )
        processes[CORE] = core
        driver_args = [
            f"--kubeconfig={driver_config}",
            f"--metallb-namespace={metallb_namespace}",
            f"--placeholder-namespace={PLACEHOLDER_NAMESPACE}",
        ]
        driver, driver_port = await _start(directory / DRIVER, driver_args, log_dir / f"{DRIVER}.log")
        processes[DRIVER] = driver
        await asyncio.gather(
            _ready(core, core_port, log_dir / f"{CORE}.log"),
            _ready(driver, driver_port, log_dir / f"{DRIVER}.log"),
        )
        yield RealSubstrate(processes, log_dir)
    finally:
        for process in processes.values():
            if process.returncode is None:
                process.terminate()
        for process in processes.values():
            try:
                await asyncio.wait_for(process.wait(), timeout=10)
            except TimeoutError:
                process.kill()
                await process.wait()
