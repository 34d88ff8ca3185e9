"""Apply YAML manifests (config/, tests/fixtures/) to a cluster by server-side apply, as kubectl would."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import yaml

from hack.devcluster import ClusterInfo
from harness.waiting import wait_for_object
from operators.gpuclass.api import GPUCLASSES
from shared.kube import Kube, Obj
from shared.resources import (
    CLUSTER_ROLE_BINDINGS,
    CLUSTER_ROLES,
    CRDS,
    NAMESPACES,
    ROLE_BINDINGS,
    ROLES,
    SERVICE_ACCOUNTS,
    Resource,
)

ROOT = Path(__file__).resolve().parents[1]
FIELD_MANAGER = "cozystack-tests"
KUBECTL_TIMEOUT: Final = 120.0

RESOURCES_BY_KIND: dict[str, Resource] = {
    "CustomResourceDefinition": CRDS,
    "Namespace": NAMESPACES,
    "ServiceAccount": SERVICE_ACCOUNTS,
    "ClusterRole": CLUSTER_ROLES,
    "ClusterRoleBinding": CLUSTER_ROLE_BINDINGS,
    "Role": ROLES,
    "RoleBinding": ROLE_BINDINGS,
    "KubeVirt": Resource("kubevirt.io/v1", "kubevirts"),
    "GPUClass": GPUCLASSES,
}


def load(path: Path | str) -> list[Obj]:
    """Every document of a YAML file (relative paths are from the repository root)."""
    text = (ROOT / path).read_text()
    return [doc for doc in yaml.safe_load_all(text) if doc]


def path_of(obj: Mapping[str, Any]) -> str:
    resource = RESOURCES_BY_KIND[obj["kind"]]
    metadata = obj["metadata"]
    return resource.path(metadata.get("namespace"), metadata["name"])


async def apply_all(kube: Kube, objects: Iterable[Mapping[str, Any]]) -> list[Obj]:
    applied = [await kube.apply(path_of(obj), obj, FIELD_MANAGER) for obj in objects]
    for obj in applied:
        if obj["kind"] == "CustomResourceDefinition":
            await wait_for_established(kube, obj["metadata"]["name"])
    return applied


async def wait_for_established(kube: Kube, name: str) -> None:
    def established(crd: Obj | None) -> bool:
        conditions = ((crd or {}).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    await wait_for_object(kube, CRDS, name, established, what=f"CRD {name} established")


async def delete_crd(kube: Kube, name: str) -> None:
    """Delete a CRD and wait until the API no longer serves it."""
    await kube.delete(CRDS.path(name=name))
    await wait_for_object(kube, CRDS, name, lambda crd: crd is None, what=f"CRD {name} gone", timeout=60)


async def kubectl(cluster: ClusterInfo, *args: str) -> tuple[int, str, str]:
    """``kubectl`` against the cluster, from the repository's root: (exit code, stdout, stderr)."""
    process = await asyncio.create_subprocess_exec(
        cluster.kubectl,
        "--kubeconfig",
        cluster.kubeconfig,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout=KUBECTL_TIMEOUT)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError(f"kubectl {' '.join(args)} took over {KUBECTL_TIMEOUT}s") from None
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@contextlib.asynccontextmanager
async def policies_installed(cluster: ClusterInfo, *directories: str) -> AsyncIterator[None]:
    """``kubectl apply -k`` each directory (as a hoster would); deleted again on the way out, so the
    rest of the suite runs without them."""
    try:
        for directory in directories:
            code, out, err = await kubectl(cluster, "apply", "-k", directory)
            assert code == 0, f"kubectl apply -k {directory}:\n{out}\n{err}"
        yield
    finally:
        for directory in reversed(directories):
            await kubectl(cluster, "delete", "--ignore-not-found", "-k", directory)
