"""Run code as a ServiceAccount: a kubeconfig holding a token from the TokenRequest API
(``hack/identity.py``), and the cluster's CA.

The token is bound to the ServiceAccount (not a long-lived Secret), exactly what a Pod would mount,
so a client built from this kubeconfig is authorised by RBAC as that Pod would be.
"""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

from hack.identity import serviceaccount_kubeconfig as serviceaccount_kubeconfig


def cluster_ca(kubeconfig: str) -> bytes:
    """The CA bundle of the kubeconfig's (first) cluster, embedded or named by path."""
    cluster = yaml.safe_load(Path(kubeconfig).read_text())["clusters"][0]["cluster"]
    if "certificate-authority-data" in cluster:
        return base64.b64decode(cluster["certificate-authority-data"])
    return Path(cluster["certificate-authority"]).read_bytes()
