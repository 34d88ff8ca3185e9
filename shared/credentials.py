"""Where the API server is and who this process is to it: loaded from a kubeconfig or a Pod's
ServiceAccount, and kept in memory.

Decides: the source (a kubeconfig named explicitly; else ``$KUBECONFIG``, a colon-separated list
merged as kubectl merges it, the first file to name a thing wins; else ``~/.kube/config``; else the
Pod's ServiceAccount); the TLS context (the CA from a file or the kubeconfig's data; a client
certificate and key given as data are loaded from an anonymous memory file, never from a file on
disk, so no key outlives the process or a SIGKILL); the bearer token (inline, a ``tokenFile``, an
exec plugin's, or the ServiceAccount's projected token, read again at every ``load``).

Does not: cache an exec plugin's answer until its expiry (a 401 runs ``load`` again), speak the
removed ``auth-provider`` plugins or basic auth (refused with a clear error), or read environment
proxy variables (a cluster's ``proxy-url`` is the one source, as for kubectl).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import json
import os
import ssl
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

SERVICEACCOUNT_DIR: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_KUBECONFIG: Final = "~/.kube/config"
EXEC_API_VERSIONS: Final = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")


class CredentialsError(Exception):
    """No usable credentials: the message says what is missing or refused."""


@dataclass(frozen=True)
class Credentials:
    """One loaded set: the server's URL, its TLS context (None for plain HTTP) and a token."""

    server: str
    tls: ssl.SSLContext | None
    token: str | None = None
    tls_server_name: str | None = None
    proxy: str | None = None


@dataclass(frozen=True)
class CredentialSource:
    """Where credentials come from; ``load`` reads them anew (at start, and after a 401)."""

    kubeconfig: str | None = None
    serviceaccount: Path = SERVICEACCOUNT_DIR

    async def load(self, environ: Mapping[str, str] = os.environ) -> Credentials:
        config = self.kubeconfig_of(environ)
        if config is None:
            return self.in_cluster(environ)
        name, cluster, user = config.selected()
        if "exec" in user[0]:
            user = ({**user[0], **await run_exec_plugin(user[0]["exec"])}, user[1])
        return from_kubeconfig(name, cluster, user)

    def kubeconfig_of(self, environ: Mapping[str, str]) -> Kubeconfig | None:
        paths = self.kubeconfig or environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG
        files = [Path(p).expanduser() for p in paths.split(os.pathsep) if p]
        existing = [f for f in files if f.is_file()]
        if not existing and self.kubeconfig:
            raise CredentialsError(f"no kubeconfig at {self.kubeconfig}")
        return merged(existing) if existing else None

    def in_cluster(self, environ: Mapping[str, str]) -> Credentials:
        server = in_cluster_server(environ)
        if server is None or not (self.serviceaccount / "token").is_file():
            raise CredentialsError("no kubeconfig and no in-cluster ServiceAccount")
        return Credentials(
            server=server,
            tls=tls_context(ca_file=self.serviceaccount / "ca.crt"),
            token=(self.serviceaccount / "token").read_text().strip(),
        )


def in_cluster_server(environ: Mapping[str, str] = os.environ) -> str | None:
    """The API server a Pod is told about (``https://host:port``, an IPv6 host bracketed)."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    with contextlib.suppress(ValueError):
        ipaddress.IPv6Address(host)
        return f"https://[{host}]:{port}"
    return f"https://{host}:{port}"


Entry = tuple[dict[str, Any], Path]  # a cluster's or user's fields, and where its paths start


@dataclass(frozen=True)
class Kubeconfig:
    """The merged kubeconfig: named entries (each with the directory its relative paths start from)."""

    current_context: str | None
    clusters: Mapping[str, Entry]
    users: Mapping[str, Entry]
    contexts: Mapping[str, dict[str, Any]]

    def selected(self) -> tuple[str, Entry, Entry]:
        """The current context's name, cluster and user (the first context when none is current)."""
        name = self.current_context or next(iter(self.contexts), None)
        if name is None or name not in self.contexts:
            raise CredentialsError(f"the kubeconfig has no context {name!r}")
        context = self.contexts[name]
        if context.get("cluster") not in self.clusters:
            raise CredentialsError(f"context {name!r} names no known cluster")
        user = self.users.get(context.get("user", ""), ({}, Path.cwd()))
        return name, self.clusters[context["cluster"]], user


def merged(files: list[Path]) -> Kubeconfig:
    """kubectl's merge of several files: the first to name a context, cluster or user wins."""
    current: str | None = None
    clusters: dict[str, Entry] = {}
    users: dict[str, Entry] = {}
    contexts: dict[str, dict[str, Any]] = {}
    for path in files:
        document = yaml.safe_load(path.read_text()) or {}
        current = current or document.get("current-context") or None
        for entry in document.get("clusters") or []:
            clusters.setdefault(entry["name"], (entry.get("cluster") or {}, path.parent))
        for entry in document.get("users") or []:
            users.setdefault(entry["name"], (entry.get("user") or {}, path.parent))
        for entry in document.get("contexts") or []:
            contexts.setdefault(entry["name"], entry.get("context") or {})
    return Kubeconfig(current, clusters, users, contexts)


def from_kubeconfig(name: str, cluster_entry: Entry, user_entry: Entry) -> Credentials:
    (cluster, cluster_dir), (user, user_dir) = cluster_entry, user_entry
    if "auth-provider" in user or "username" in user:
        raise CredentialsError(f"context {name!r}: auth-provider plugins and basic auth are not supported")
    tls = None
    if str(cluster.get("server", "")).startswith("https:"):
        with client_pair(user, user_dir) as pair:
            tls = tls_context(
                ca_file=_path(cluster.get("certificate-authority"), cluster_dir),
                ca_data=_pem(cluster.get("certificate-authority-data")),
                client_pair=pair,
                verify=not cluster.get("insecure-skip-tls-verify", False),
            )
    token = user.get("token")
    token_file = _path(user.get("tokenFile"), user_dir)
    if not token and token_file is not None:
        token = token_file.read_text().strip()
    return Credentials(
        server=str(cluster.get("server", "")),
        tls=tls,
        token=token or None,
        tls_server_name=cluster.get("tls-server-name"),
        proxy=cluster.get("proxy-url"),
    )


async def run_exec_plugin(spec: Mapping[str, Any]) -> dict[str, str]:
    """An exec credential plugin's answer as kubeconfig user fields (a token, or a key pair)."""
    api_version = spec.get("apiVersion", EXEC_API_VERSIONS[0])
    if api_version not in EXEC_API_VERSIONS:
        raise CredentialsError(f"exec plugin apiVersion {api_version} is not supported")
    info = {"apiVersion": api_version, "kind": "ExecCredential", "spec": {"interactive": False}}
    env = {**os.environ, **{e["name"]: e["value"] for e in spec.get("env") or []}}
    env["KUBERNETES_EXEC_INFO"] = json.dumps(info)
    process = await asyncio.create_subprocess_exec(
        spec["command"], *(spec.get("args") or []), env=env, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await process.communicate()
    if process.returncode:
        raise CredentialsError(f"exec plugin {spec['command']} exited {process.returncode}")
    status = json.loads(out).get("status") or {}
    if status.get("token"):
        return {"token": status["token"]}
    if status.get("clientCertificateData") and status.get("clientKeyData"):
        return {
            "client-certificate-pem": status["clientCertificateData"],
            "client-key-pem": status["clientKeyData"],
        }
    raise CredentialsError(f"exec plugin {spec['command']} gave no token and no key pair")


@contextlib.contextmanager
def client_pair(user: Mapping[str, Any], base: Path) -> Iterator[tuple[str, str | None] | None]:
    """The client certificate and key as paths ``load_cert_chain`` reads: the user's own files, or
    (for data) one anonymous memory file holding both, closed as soon as the context has read it."""
    cert = _pem(user.get("client-certificate-data")) or _text(user.get("client-certificate-pem"))
    key = _pem(user.get("client-key-data")) or _text(user.get("client-key-pem"))
    if cert and key:
        with memory_file(cert + b"\n" + key) as path:
            yield path, None
    elif user.get("client-certificate") and user.get("client-key"):
        yield str(_path(user["client-certificate"], base)), str(_path(user["client-key"], base))
    else:
        yield None


@contextlib.contextmanager
def memory_file(data: bytes) -> Iterator[str]:
    """A path to ``data`` that is never on disk (Linux ``memfd``), or, where there is no memfd,
    a file in a private directory removed on leaving."""
    if not hasattr(os, "memfd_create"):
        with tempfile.TemporaryDirectory() as directory:
            path = Path(directory) / "pair.pem"
            path.write_bytes(data)
            path.chmod(0o600)
            yield str(path)
        return
    fd = os.memfd_create("kube-client-pair", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def tls_context(
    *,
    ca_file: Path | None = None,
    ca_data: bytes | None = None,
    client_pair: tuple[str, str | None] | None = None,
    verify: bool = True,
) -> ssl.SSLContext:
    """Verifies the server against the named CA (the system's when none is named), unless told not to."""
    context = ssl.create_default_context(
        cafile=str(ca_file) if ca_file else None, cadata=ca_data.decode() if ca_data else None
    )
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if client_pair is not None:
        context.load_cert_chain(*client_pair)
    return context


def _pem(data: str | None) -> bytes | None:
    """A kubeconfig ``*-data`` field: base64 of PEM (or, as some tools write it, the PEM itself)."""
    if not data:
        return None
    return data.encode() if "-----" in data else base64.b64decode(data)


def _text(data: str | None) -> bytes | None:
    return data.encode() if data else None


def _path(value: str | None, base: Path) -> Path | None:
    if not value:
        return None
    path = Path(value).expanduser()
    return path if path.is_absolute() else base / path
