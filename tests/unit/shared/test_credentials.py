"""shared.credentials: where the API server is and who we are to it, with no key material on disk.

Table tests of the kubeconfig rules kubectl has (the merge of several files, relative paths, the
current context), the in-cluster server, and the one property the loader exists for: a client key
given as data is never written to a file.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import ssl
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from shared.credentials import CredentialsError, CredentialSource, in_cluster_server, memory_file

EXEC_V1 = "client.authentication.k8s.io/v1"


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


def self_signed() -> tuple[bytes, bytes]:
    """A client certificate and its key, PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tester")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return certificate.public_bytes(serialization.Encoding.PEM), key_pem


def kubeconfig(
    path: Path, *, current: str | None, contexts: dict[str, tuple[str, str]], **named: dict[str, Any]
) -> Path:
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": n, "cluster": c} for n, c in named.get("clusters", {}).items()],
        "users": [{"name": n, "user": u} for n, u in named.get("users", {}).items()],
        "contexts": [{"name": n, "context": {"cluster": c, "user": u}} for n, (c, u) in contexts.items()],
    }
    if current:
        document["current-context"] = current
    path.write_text(yaml.safe_dump(document))
    return path


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def test_an_embedded_key_never_reaches_the_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = self_signed()
    config = kubeconfig(
        tmp_path / "config",
        current="c",
        contexts={"c": ("k", "u")},
        clusters={"k": {"server": "https://127.0.0.1:6443", "certificate-authority-data": b64(cert)}},
        users={"u": {"client-certificate-data": b64(cert), "client-key-data": b64(key)}},
    )
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    credentials = await CredentialSource(str(config)).load({})
    assert isinstance(credentials.tls, ssl.SSLContext)
    assert credentials.tls.cert_store_stats()["x509"] == 1  # the kubeconfig's CA alone
    assert list(scratch.iterdir()) == []
    assert not any(
        b"PRIVATE KEY" in p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p != config
    )


@pytest.mark.parametrize(
    ("first_current", "second_current", "server"),
    [
        pytest.param("a", "b", "https://a.example", id="the-first-file-names-the-current-context"),
        pytest.param(None, "b", "https://b-from-second.example", id="else-the-second-does"),
    ],
)
async def test_several_files_merge_the_first_naming_a_thing_wins(
    tmp_path: Path, first_current: str | None, second_current: str, server: str
) -> None:
    first = kubeconfig(
        tmp_path / "first",
        current=first_current,
        contexts={"a": ("ka", "u")},
        clusters={"ka": {"server": "https://a.example"}},
        users={"u": {"token": "from-first"}},
    )
    second = kubeconfig(
        tmp_path / "second",
        current=second_current,
        contexts={"a": ("kb", "u"), "b": ("kb", "u")},
        clusters={
            "ka": {"server": "https://ignored.example"},
            "kb": {"server": "https://b-from-second.example"},
        },
        users={"u": {"token": "from-second"}},
    )
    credentials = await CredentialSource().load({"KUBECONFIG": f"{first}{os.pathsep}{second}"})
    assert (credentials.server, credentials.token) == (server, "from-first")


async def test_relative_paths_start_at_the_file_that_names_them(tmp_path: Path) -> None:
    cert, key = self_signed()
    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / "client.crt").write_bytes(cert)
    (tmp_path / "certs" / "client.key").write_bytes(key)
    (tmp_path / "certs" / "ca.crt").write_bytes(cert)
    (tmp_path / "token").write_text("from-a-file\n")
    config = kubeconfig(
        tmp_path / "config",
        current="c",
        contexts={"c": ("k", "u")},
        clusters={
            "k": {
                "server": "https://k.example",
                "certificate-authority": "certs/ca.crt",
                "proxy-url": "http://p:3128",
                "tls-server-name": "kubernetes",
            }
        },
        users={
            "u": {
                "client-certificate": "certs/client.crt",
                "client-key": "certs/client.key",
                "tokenFile": "token",
            }
        },
    )
    credentials = await CredentialSource(str(config)).load({})
    assert (credentials.token, credentials.proxy, credentials.tls_server_name) == (
        "from-a-file",
        "http://p:3128",
        "kubernetes",
    )
    assert credentials.tls is not None


@pytest.mark.parametrize(
    ("user", "message"),
    [
        pytest.param({"auth-provider": {"name": "oidc"}}, "auth-provider", id="auth-provider"),
        pytest.param({"username": "admin", "password": "x"}, "basic auth", id="basic-auth"),
    ],
)
async def test_removed_ways_to_log_in_are_refused_clearly(tmp_path: Path, user: dict, message: str) -> None:  # type: ignore[type-arg]
    config = kubeconfig(
        tmp_path / "config",
        current="c",
        contexts={"c": ("k", "u")},
        clusters={"k": {"server": "https://k"}},
        users={"u": user},
    )
    with pytest.raises(CredentialsError, match=message):
        await CredentialSource(str(config)).load({})


async def test_an_exec_plugin_gives_the_token(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin"
    answer = {"apiVersion": EXEC_V1, "kind": "ExecCredential", "status": {"token": "from-exec"}}
    plugin.write_text(f"#!/bin/sh\necho '{json.dumps(answer)}'\n")
    plugin.chmod(0o755)
    config = kubeconfig(
        tmp_path / "config",
        current="c",
        contexts={"c": ("k", "u")},
        clusters={"k": {"server": "http://k"}},
        users={"u": {"exec": {"apiVersion": EXEC_V1, "command": str(plugin)}}},
    )
    assert (await CredentialSource(str(config)).load({})).token == "from-exec"


async def test_in_a_pod_the_serviceaccount_token_is_read_at_every_load(tmp_path: Path) -> None:
    cert, _ = self_signed()
    (tmp_path / "ca.crt").write_bytes(cert)
    (tmp_path / "token").write_text("one")
    source = CredentialSource(serviceaccount=tmp_path)
    environ = {
        "KUBECONFIG": str(tmp_path / "absent"),
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
    }
    assert (await source.load(environ)).token == "one"
    (tmp_path / "token").write_text("two")  # the kubelet rotated the projected token
    credentials = await source.load(environ)
    assert (credentials.server, credentials.token) == ("https://10.96.0.1:443", "two")


async def test_no_source_at_all_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CredentialsError, match="no kubeconfig and no in-cluster"):
        await CredentialSource(serviceaccount=tmp_path).load({"KUBECONFIG": str(tmp_path / "absent")})
    with pytest.raises(CredentialsError, match="no kubeconfig at"):
        await CredentialSource(str(tmp_path / "absent")).load({})


def test_the_pair_is_read_from_memory_never_from_a_file() -> None:
    with memory_file(b"secret") as path:
        assert Path(path).read_bytes() == b"secret"
        assert os.readlink(path).startswith("/memfd:")  # no file system holds it
