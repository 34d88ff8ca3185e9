"""The image built here (make image) runs as a kubelet runs it, against the local control plane.

Run as uid 65532 with no passwd entry for it (``podman run --passwd=false``, as a kubelet: podman's
default would make one up), a read-only root and no capabilities, in-cluster credentials only (the
ServiceAccount directory and ``KUBERNETES_SERVICE_HOST``/``_PORT``, no kubeconfig, no cluster DNS):
the GPUClass operator becomes ready, takes its Lease under its Pod name, and reconciles a class.
Nothing in it may ask the user database (``getpass.getuser()``), which has no answer for a uid
without a passwd entry. The image carries no pip, setuptools or pkg_resources.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from hack.devcluster import ClusterInfo
from harness.identity import cluster_ca
from harness.image import ULIMITS, build_image, image_container, serviceaccount_dir
from harness.manifests import ROOT, apply_all, load
from harness.operators import free_port
from harness.waiting import eventually, wait_for_object
from operators.gpuclass.api import GPUCLASSES
from shared.kube import Kube
from shared.resources import LEASES, SERVICE_ACCOUNTS

OPERATOR_NAMESPACE = "cozy-gpuclass"
SERVICE_ACCOUNT = "gpuclass-operator"
LEASE = "cozystack-gpuclass-operator"
POD_NAME = "gpuclass-operator-image-test"
RBAC_DIR = "config/rbac/gpuclass"
NAMESPACED_RBAC_KINDS = frozenset({"ServiceAccount", "Role", "RoleBinding"})
CLASS = "image-test"
READY_TIMEOUT_SECONDS = 90.0


@pytest.fixture(scope="module")
def image() -> str:
    try:
        return build_image()
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.fail(f"make image failed ({error}): it needs podman, buildah, runc and debootstrap, as root")


def in_cluster_env(cluster: ClusterInfo) -> dict[str, str]:
    """What a kubelet puts in every container's environment for the API server, plus the Downward
    API variables of the shipped Deployment."""
    server = urlsplit(cluster.server)
    return {
        "KUBERNETES_SERVICE_HOST": server.hostname or "",
        "KUBERNETES_SERVICE_PORT": str(server.port),
        "POD_NAME": POD_NAME,
        "POD_NAMESPACE": OPERATOR_NAMESPACE,
    }


@pytest.fixture
async def serviceaccount(kube: Kube, cluster: ClusterInfo, tmp_path: Path) -> AsyncIterator[Path]:
    """The operator's namespace, CRD and config/rbac/gpuclass, and its ServiceAccount's credentials as
    a Pod would have them mounted."""
    listed = yaml.safe_load((ROOT / RBAC_DIR / "kustomization.yaml").read_text())["resources"]
    rbac = [doc for name in listed for doc in load(f"{RBAC_DIR}/{name}")]
    for doc in rbac:
        if doc["kind"] in NAMESPACED_RBAC_KINDS:
            doc["metadata"].setdefault("namespace", OPERATOR_NAMESPACE)
    namespace_doc = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NAMESPACE}}
    await apply_all(
        kube, [namespace_doc, *rbac, *load("config/crd/gpuclass/gpu.cozystack.io_gpuclasses.yaml")]
    )
    answer = await kube.create(
        SERVICE_ACCOUNTS.path(OPERATOR_NAMESPACE, SERVICE_ACCOUNT) + "/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600},
        },
    )
    yield serviceaccount_dir(
        tmp_path / "serviceaccount",
        answer["status"]["token"],
        cluster_ca(cluster.kubeconfig),
        OPERATOR_NAMESPACE,
    )
    await kube.delete(GPUCLASSES.path(name=CLASS))
    await kube.delete(LEASES.path(OPERATOR_NAMESPACE, LEASE))


async def test_the_image_runs_in_cluster_as_65532_without_a_passwd_entry(
    kube: Kube, cluster: ClusterInfo, image: str, serviceaccount: Path, tmp_path: Path
) -> None:
    health = free_port()
    args = [
        "operators.gpuclass",
        "--metrics-address=127.0.0.1",
        f"--metrics-port={free_port()}",
        f"--health-port={health}",
        "--debounce-seconds=0.2",
    ]
    log = tmp_path / "container.log"
    async with image_container(image, args, serviceaccount, in_cluster_env(cluster), log) as container:

        async def ready() -> bool:
            assert container.returncode is None, f"the container exited:\n{log.read_text()[-3000:]}"
            try:
                async with httpx.AsyncClient() as client:
                    response = await client.get(f"http://127.0.0.1:{health}/readyz", timeout=2)
            except httpx.TransportError:
                return False
            return response.status_code == 200

        try:
            await eventually(
                ready, timeout=READY_TIMEOUT_SECONDS, interval=0.5, what="/readyz of the container"
            )
        except AssertionError as error:
            raise AssertionError(f"{error}\n{log.read_text()[-3000:]}") from None
        lease = await wait_for_object(
            kube,
            LEASES,
            LEASE,
            lambda o: o is not None and str(o["spec"].get("holderIdentity", "")).startswith(POD_NAME),
            namespace=OPERATOR_NAMESPACE,
            what="the Lease held under the Pod name",
        )
        assert lease is not None
        await kube.create(
            GPUCLASSES.path(),
            {
                "apiVersion": "gpu.cozystack.io/v1alpha1",
                "kind": "GPUClass",
                "metadata": {"name": CLASS},
                "spec": {"resourceName": "nvidia.com/IMAGE_TEST"},
            },
        )
        reconciled = await wait_for_object(
            kube,
            GPUCLASSES,
            CLASS,
            lambda o: o is not None and bool((o.get("status") or {}).get("conditions")),
            what="the class's status from the container",
            timeout=45,
        )
        assert reconciled is not None
        assert container.returncode is None, log.read_text()[-3000:]
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


async def test_the_image_carries_no_pip_setuptools_or_pkg_resources(image: str) -> None:
    """Neither importable nor lying anywhere on the filesystem (a base's wheels, a dist-info)."""
    probe = "\n".join(
        [
            "import os",
            "tools = ('pip', 'setuptools', 'pkg_resources', '_distutils_hack')",
            "skip = ('/proc', '/sys', '/dev')",
            "print(sorted(os.path.join(d, n) for d, ds, fs in os.walk('/') if not d.startswith(skip)",
            "             for n in ds + fs if n.split('-')[0].split('.')[0] in tools))",
        ]
    )
    process = await asyncio.create_subprocess_exec(
        "podman",
        "run",
        "--rm",
        "--passwd=false",
        "--network=none",
        *ULIMITS,
        "--entrypoint=python",
        image,
        "-c",
        probe,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await process.communicate()
    assert process.returncode == 0, output.decode()
    assert output.decode().strip() == "[]"
