"""Run code as a ServiceAccount: a kubeconfig holding a token from the TokenRequest API.

The token is bound to the ServiceAccount (not a long-lived Secret), exactly what a Pod would mount,
so a client built from this kubeconfig is authorised by RBAC as that Pod would be. Used by the tests
(the operators under their own roles) and by the real address substrate's driver (its identity is
what the rendered-Services admission policy exempts).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from shared.kube import Kube
from shared.resources import SERVICE_ACCOUNTS


async def serviceaccount_kubeconfig(
    kube: Kube, admin_kubeconfig: str, namespace: str, name: str, path: Path, expiration_seconds: int = 3600
) -> str:
    """Write a kubeconfig for ``namespace/name`` at ``path`` and return the path."""
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": expiration_seconds},
    }
    answer = await kube.create(SERVICE_ACCOUNTS.path(namespace, name) + "/token", request)
    admin = yaml.safe_load(Path(admin_kubeconfig).read_text())
    cluster = admin["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": f"{namespace}-{name}", "user": {"token": answer["status"]["token"]}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": f"{namespace}-{name}"}}],
        "current-context": "c",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return str(path)
