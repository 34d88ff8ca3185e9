"""shared.operator: who the process is to kopf and where kopf logs in from inside a Pod.

Identity never comes from the user database (the image's uid has no passwd entry); the in-cluster
server is the one the kubelet names in the environment, as kr8s reads it.
"""

from __future__ import annotations

import getpass
import socket

import pytest

from shared.operator import in_cluster_server, kopf_identity


@pytest.mark.parametrize(
    ("environ", "server"),
    [
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}, "https://10.96.0.1:443"),
        ({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}, "https://[fd00::1]:6443"),
        (
            {"KUBERNETES_SERVICE_HOST": "api.example", "KUBERNETES_SERVICE_PORT": "8443"},
            "https://api.example:8443",
        ),
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, None),
        ({"KUBERNETES_SERVICE_PORT": "443"}, None),
        ({}, None),
    ],
)
def test_in_cluster_server_is_the_environments(environ: dict[str, str], server: str | None) -> None:
    assert in_cluster_server(environ) == server


def test_identity_is_the_pod_name() -> None:
    assert kopf_identity({"POD_NAME": "gpuclass-operator-7d9f-abcde"}) == "gpuclass-operator-7d9f-abcde"


def test_identity_never_asks_the_user_database(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the image's uid 65532 meets: getpwuid() knows no such user."""

    def no_such_user() -> str:
        raise KeyError("getpwuid(): uid not found: 65532")

    monkeypatch.setattr(getpass, "getuser", no_such_user)
    assert kopf_identity({}) == socket.gethostname()
