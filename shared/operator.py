"""How both operators run: kopf owns the process, the runtime's manager owns the work.

Decides what the two operators must not differ in:

* the flags every operator has (kubeconfig, metrics and health ports, leader election, the API
  timeout and the bound of a stuck reconcile), each with an environment variable as its default,
  under the operator's own prefix;
* kopf runs the process (signals, login, start-up and clean-up) with no resource handler at all:
  every kind is watched by the runtime's informers, so kopf writes nothing to any object. Still,
  each operator has its own kopf finalizer name and annotation prefix (never kopf's defaults,
  never each other's), kopf's log-to-Event posting is off and cluster scanning is off (no CRD or
  namespace watch, so no permission for it);
* who the process is to kopf: the Pod name (Downward API ``POD_NAME``) or the host name, given to
  kopf explicitly, never kopf's default, which asks the user database (``getpass.getuser()``) and
  crashes when the uid has no passwd entry (the image's 65532, or any uid a hoster's policy picks);
* where kopf logs in from inside a Pod: the API server the kubelet names in
  ``KUBERNETES_SERVICE_HOST``/``_PORT`` (as kr8s does), never kopf's fixed
  ``https://kubernetes.default.svc``, which a Pod without cluster DNS (hostNetwork, a bare node)
  cannot resolve;
* the event loop: uvloop's, as kopf's own CLI picks when it is installed: its
  transports and TLS are what every watch event and request goes through, and they cut the GPUClass
  operator's whole CPU per Pod watch event under churn by about a quarter (721 to 555 us in the live
  benchmark); nothing here depends on the loop's implementation, and the one error uvloop logs
  where asyncio's loop does not (TLS data for a connection we closed) is logged at debug level
  (``quiet_closed_transport``);
* start-up order: metrics and health servers, then the manager (caches, sync barrier, leader
  election, controllers); on SIGTERM the lease is handed over before the process ends; when the
  manager fails (the lease lost) the process exits non-zero, so the kubelet restarts it as a
  standby.

Does not declare any cache or controller (each operator's ``controller.build`` does).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import ipaddress
import logging
import os
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import kopf
import uvloop
from kopf._core.engines.peering import Identity as KopfIdentity  # kopf does not re-export the type
from prometheus_client import CollectorRegistry

from shared.kube import Kube, Timeout
from shared.runtime.manager import DEFAULT_STUCK_SECONDS, LeaderElection, Manager
from shared.telemetry.health import Health
from shared.telemetry.metrics import serve
from shared.telemetry.tracing import Tracing, provider_from_env

log = logging.getLogger(__name__)

# Where a Pod finds its own namespace when the Downward API did not set POD_NAMESPACE.
SERVICEACCOUNT_NAMESPACE_FILE: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# Every API call but a watch gets this long to answer; a watch gets bookmarks at least this often.
DEFAULT_API_TIMEOUT_SECONDS: Final = 30.0
CONNECT_TIMEOUT_SECONDS: Final = 5.0


@dataclass(frozen=True)
class RuntimeSettings:
    kubeconfig: str | None = None
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 8080  # 0 turns the metrics server off
    health_port: int = 8081  # /healthz and /readyz; 0 turns it off
    leader_elect: bool = True
    leader_election_namespace: str = ""  # "": $POD_NAMESPACE, else the ServiceAccount's namespace
    leader_election_id: str = ""
    api_timeout_seconds: float = DEFAULT_API_TIMEOUT_SECONDS
    stuck_seconds: float = DEFAULT_STUCK_SECONDS


def flag_bool(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "yes", "on")


def add_env_flag(
    parser: argparse.ArgumentParser,
    prefix: str,
    flag: str,
    default: object,
    type_: Callable[[str], object] = str,
    help: str | None = None,
) -> None:
    """``--flag``, defaulting to ``<PREFIX>_<FLAG>`` from the environment, else to ``default``: one
    rule for every flag of both operators, so a flag and its variable never drift apart."""
    variable = f"{prefix}_{flag.upper().replace('-', '_')}"
    parser.add_argument(
        f"--{flag}", type=type_, default=type_(os.environ.get(variable, str(default))), help=help
    )


def add_runtime_flags(parser: argparse.ArgumentParser, prefix: str, leader_election_id: str) -> None:
    """The common flags; each defaults to ``<prefix>_<FLAG>`` from the environment."""
    d = RuntimeSettings()
    parser.add_argument(
        "--kubeconfig", default=os.environ.get("KUBECONFIG"), help="default: in-cluster, or $KUBECONFIG"
    )
    add_env_flag(parser, prefix, "metrics-address", d.metrics_address)
    add_env_flag(parser, prefix, "metrics-port", d.metrics_port, int)
    add_env_flag(parser, prefix, "health-port", d.health_port, int)
    add_env_flag(
        parser,
        prefix,
        "leader-elect",
        d.leader_elect,
        flag_bool,
        help="elect a leader through a Lease (default true); false: this replica always leads",
    )
    add_env_flag(parser, prefix, "leader-election-namespace", d.leader_election_namespace)
    add_env_flag(parser, prefix, "leader-election-id", leader_election_id)
    add_env_flag(parser, prefix, "api-timeout-seconds", d.api_timeout_seconds, float)
    add_env_flag(
        parser,
        prefix,
        "stuck-seconds",
        d.stuck_seconds,
        float,
        help="liveness fails when one reconcile has run this long",
    )


def runtime_settings(args: argparse.Namespace) -> RuntimeSettings:
    return RuntimeSettings(
        kubeconfig=args.kubeconfig or None,
        metrics_address=args.metrics_address,
        metrics_port=args.metrics_port,
        health_port=args.health_port,
        leader_elect=args.leader_elect,
        leader_election_namespace=args.leader_election_namespace,
        leader_election_id=args.leader_election_id,
        api_timeout_seconds=args.api_timeout_seconds,
        stuck_seconds=args.stuck_seconds,
    )


def own_namespace(environ: Mapping[str, str] = os.environ) -> str:
    if environ.get("POD_NAMESPACE"):
        return environ["POD_NAMESPACE"]
    try:
        return SERVICEACCOUNT_NAMESPACE_FILE.read_text().strip() or "default"
    except OSError:
        return "default"


def in_cluster_server(environ: Mapping[str, str] = os.environ) -> str | None:
    """The API server a Pod is told about (``https://host:port``, an IPv6 host bracketed), or
    None outside a Pod."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return f"https://{host}:{port}"
    return f"https://[{host}]:{port}"


def kopf_identity(environ: Mapping[str, str] = os.environ) -> KopfIdentity:
    """Who this process is to kopf: the Pod name, else the host name; never a user name."""
    return KopfIdentity(environ.get("POD_NAME") or socket.gethostname())


def kopf_settings(kopf_finalizer: str, storage_prefix: str) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.persistence.finalizer = kopf_finalizer
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=storage_prefix)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=storage_prefix)
    settings.posting.enabled = False
    settings.scanning.disabled = True
    return settings


def quiet_closed_transport(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The event loop's exception handler: uvloop reports TLS data that arrives on a connection we
    have just closed (a retired pool, a watch cut at its idle bound) as a "Fatal error on SSL
    protocol" with a traceback (``RuntimeError``: the handler is closed; uvloop issues 506 and 685),
    where asyncio's own loop says nothing. The connection was closed on purpose, so that one case is
    logged at debug level; everything else goes to the loop's default handler."""
    transport = context.get("transport")
    if (
        isinstance(context.get("exception"), RuntimeError)
        and transport is not None
        and transport.is_closing()
        and "handler is closed" in str(context["exception"])
    ):
        log.debug("TLS data for a connection already closed: %s", context["exception"])
        return
    loop.default_exception_handler(context)


@dataclass(frozen=True)
class Identity:
    """What names one operator: its metrics/trace name and kopf's markers (ours, never shared)."""

    name: str  # "gpuclass" | "endpointattachment"
    kopf_finalizer: str
    storage_prefix: str


def run(
    identity: Identity,
    settings: RuntimeSettings,
    build: Callable[[Manager, CollectorRegistry], None],
) -> int:
    """Serve metrics and health, then run kopf (and in it the manager) until stopped."""
    if settings.kubeconfig:
        os.environ["KUBECONFIG"] = settings.kubeconfig  # kopf's login and kr8s both read it there
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # kr8s's client, as kr8s loads credentials
    registry = CollectorRegistry(auto_describe=True)
    tracing = Tracing(provider_from_env(f"cozystack-{identity.name}-operator"), f"cozystack.{identity.name}")
    holder: dict[str, Any] = {}
    health = Health(
        live=[lambda: holder["manager"].liveness_problem() if "manager" in holder else None],
        ready=[lambda: holder["manager"].readiness_problem() if "manager" in holder else "starting"],
    )
    serve(registry, settings.metrics_address, settings.metrics_port)
    health.serve(settings.metrics_address, settings.health_port)
    stop = asyncio.Event()
    exit_code = 0
    kopf_registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=kopf_registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        in_cluster = kopf.login_with_service_account(**kwargs)
        server = in_cluster_server()
        if in_cluster is not None and server is not None:
            return dataclasses.replace(in_cluster, server=server)
        return in_cluster or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=kopf_registry)
    async def startup(**_: Any) -> None:
        timeout = Timeout(settings.api_timeout_seconds, connect=CONNECT_TIMEOUT_SECONDS)
        kube = await Kube.connect(settings.kubeconfig, timeout=timeout)
        kube.tracer = tracing.tracer
        election = LeaderElection(
            enabled=settings.leader_elect,
            namespace=settings.leader_election_namespace or own_namespace(),
            name=settings.leader_election_id or f"cozystack-{identity.name}-operator",
        )
        manager = Manager(
            kube, registry, tracing, leader_election=election, stuck_seconds=settings.stuck_seconds
        )
        build(manager, registry)
        holder["manager"] = manager

        def finished(task: asyncio.Task[None]) -> None:
            nonlocal exit_code
            if not task.cancelled() and task.exception() is not None:
                log.error("stopping: %s", task.exception())
                exit_code = 1
                stop.set()

        holder["tasks"] = [
            asyncio.create_task(manager.run(), name="manager"),
            asyncio.create_task(health.heartbeat(), name="heartbeat"),
        ]
        holder["tasks"][0].add_done_callback(finished)

    @kopf.on.cleanup(registry=kopf_registry)
    async def cleanup(**_: Any) -> None:
        for task in holder.get("tasks", []):
            task.cancel()  # no pass starts a write after this...
        if "manager" in holder:
            await holder["manager"].release()  # ...so the lease is handed over with nothing in flight
        stop.set()  # kopf's own stop-flag waiter ends now, not after its grace period

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.get_loop().set_exception_handler(quiet_closed_transport)
            kopf.run(
                loop=runner.get_loop(),
                registry=kopf_registry,
                settings=kopf_settings(identity.kopf_finalizer, identity.storage_prefix),
                clusterwide=True,
                standalone=True,
                identity=kopf_identity(),
                stop_flag=stop,
            )
    finally:
        shutdown = getattr(tracing.provider, "shutdown", None)
        if callable(shutdown):
            shutdown()  # flush the last spans
    return exit_code


def main(
    identity: Identity, settings: RuntimeSettings, build: Callable[[Manager, CollectorRegistry], None]
) -> None:
    sys.exit(run(identity, settings, build))
