"""The operators' image, built here (hack/build-image.sh) and run by podman the way a kubelet runs it.

A kubelet never invents a passwd entry for the uid it runs a container as; podman does unless told
not to (``--passwd=false``), so a run without that flag would hide a crash on a missing user. The
container gets what a Pod gets: a ServiceAccount directory (token, CA, namespace), the
``KUBERNETES_SERVICE_*`` variables and ``POD_NAME``/``POD_NAMESPACE``, a read-only root with an
empty /tmp, no capabilities, no privilege escalation.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

from harness.operators import ROOT

# The uid and gid of the image's USER and of the shipped Deployments' securityContext.
IMAGE_UID = 65532
# podman asks runc for its own rlimits (a kubelet's containerd asks for none), which this kind of
# host refuses above a low bound without CAP_SYS_RESOURCE; these are ample for one operator.
ULIMITS = ("--ulimit=nofile=4096:4096", "--ulimit=nproc=4096:4096")
# Where a Pod finds its ServiceAccount's credentials (the kubelet's projected volume).
SERVICEACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def build_image() -> str:
    """Build (or find built) the image of this tree; returns its local tag."""
    result = subprocess.run(
        [str(ROOT / "hack" / "build-image.sh")], check=True, stdout=subprocess.PIPE, text=True
    )
    return result.stdout.strip().splitlines()[-1]


def serviceaccount_dir(path: Path, token: str, ca: bytes, namespace: str) -> Path:
    """What the kubelet mounts for a Pod's ServiceAccount, readable by any uid (as its volume is)."""
    path.mkdir(mode=0o755, exist_ok=True)
    path.chmod(0o755)
    for name, content in (("token", token.encode()), ("ca.crt", ca), ("namespace", namespace.encode())):
        (path / name).write_bytes(content)
        (path / name).chmod(0o644)
    return path


@contextlib.asynccontextmanager
async def image_container(
    image: str,
    args: Sequence[str],
    serviceaccount: Path,
    env: Mapping[str, str],
    log_path: Path,
) -> AsyncIterator[asyncio.subprocess.Process]:
    """``podman run`` of ``image`` with ``args``, on the host's network (the API server listens on
    loopback), removed when the block ends."""
    name = f"cozystack-image-test-{uuid.uuid4().hex[:8]}"
    command = [
        "podman",
        "run",
        "--rm",
        f"--name={name}",
        "--passwd=false",  # as a kubelet: no passwd entry is made up for the uid
        f"--user={IMAGE_UID}:{IMAGE_UID}",
        "--read-only",
        "--tmpfs=/tmp",
        "--cap-drop=ALL",
        "--security-opt=no-new-privileges",
        "--network=host",
        *ULIMITS,
        f"--volume={serviceaccount}:{SERVICEACCOUNT_DIR}:ro",
        *(f"--env={key}={value}" for key, value in env.items()),
        image,
        *args,
    ]
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(*command, stdout=log, stderr=asyncio.subprocess.STDOUT)
    try:
        yield process
    finally:
        if process.returncode is None:
            stop = await asyncio.create_subprocess_exec(
                "podman",
                "stop",
                "--time=15",
                name,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            await stop.wait()
            await process.wait()
