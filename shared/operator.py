"""How both operators run: a plain asyncio process, the runtime's manager owns the work.

Decides what the two operators must not differ in:

* the flags every operator has (kubeconfig, metrics and health ports, leader election, the API
  timeout and the bound of a stuck reconcile), each with an environment variable as its default,
  under the operator's own prefix;
* the process: metrics and health servers, then one client (credentials loaded once, in memory:
  ``shared.credentials``), then the manager (caches, sync barrier, leader election,
  controllers); SIGTERM or SIGINT hands the lease over before the process ends; when the manager
  fails (the lease lost) the process exits non-zero, so the kubelet restarts it as a standby;
* the event loop: uvloop's: its transports and TLS are what every watch event and request goes
  through, and they cut the GPUClass operator's whole CPU per Pod watch event under churn by about
  a quarter (721 to 555 us in the live benchmark); nothing here depends on the loop's
  implementation, and the one error uvloop logs where asyncio's loop does not (TLS data for a
  connection we closed) is logged at debug level (``quiet_closed_transport``).

No framework runs the process: the operators have no resource handler a framework would serve
(every kind is watched by the runtime's informers), and what one gave (signals, a login, start-up
and clean-up hooks) is the few lines of ``serve_manager``; a second credentials loader with its
own key files on disk was its cost.

Does not declare any cache or controller (each operator's ``controller.build`` does).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

import uvloop
from prometheus_client import CollectorRegistry

from shared.kube import Kube, Timeout
from shared.runtime.manager import DEFAULT_STUCK_SECONDS, LeaderElection, Manager
from shared.telemetry.health import Health
from shared.telemetry.metrics import serve
from shared.telemetry.tracing import Tracing, provider_from_env

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

log = logging.getLogger(__name__)
T = TypeVar("T")
S = TypeVar("S", bound="DataclassInstance")

# Where a Pod finds its own namespace when the Downward API did not set POD_NAMESPACE.
SERVICEACCOUNT_NAMESPACE_FILE: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# Every API call but a watch gets this long to answer; a watch gets bookmarks at least this often.
DEFAULT_API_TIMEOUT_SECONDS: Final = 30.0
CONNECT_TIMEOUT_SECONDS: Final = 5.0
# Logged once the interpreter, the imports and the credentials are ready (a cold start's first step).
STARTED_LOG: Final = "started: credentials loaded for"


def flag_bool(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "yes", "on")


def one_of(*choices: str) -> Callable[[str], str]:
    """A flag's parser that takes only one of ``choices``."""

    def parse(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(choices)}, got {text!r}")
        return text

    return parse


def _str_or_none(text: str) -> str | None:
    return text or None


@dataclass(frozen=True)
class Flag:
    """How a settings field is read from the command line and the environment (``setting``)."""

    parse: Callable[[str], object]
    help: str
    # The environment variable read instead of ``<PREFIX>_<FIELD>`` (a name other programs share).
    variable: str | None = None


# The key of a settings field's ``Flag`` in its metadata.
_FLAG: Final = "cozystack.flag"


def setting(default: T, parse: Callable[[str], T], help: str, variable: str | None = None) -> T:
    """A settings dataclass field that is also a flag, the one place a setting is written:
    ``--<field-name>`` (``_`` as ``-``), parsed by ``parse``, defaulting to the environment variable
    ``<PREFIX>_<FIELD_NAME>`` (or ``variable``), else to ``default``."""
    return field(default=default, metadata={_FLAG: Flag(parse, help, variable)})


@dataclass(frozen=True)
class RuntimeSettings:
    kubeconfig: str | None = setting(
        None, _str_or_none, "the kubeconfig of the cluster to talk to; none: in-cluster", "KUBECONFIG"
    )
    metrics_address: str = setting("0.0.0.0", str, "address of the metrics and health servers")
    metrics_port: int = setting(8080, int, "Prometheus metrics (0 turns the server off)")
    health_port: int = setting(8081, int, "/healthz and /readyz (0 turns it off)")
    leader_elect: bool = setting(
        True,
        flag_bool,
        "elect a leader through a Lease; false: this replica always leads (one replica only!)",
    )
    leader_election_namespace: str = setting(
        "", str, "where the Lease lives; empty: $POD_NAMESPACE, else the ServiceAccount's namespace"
    )
    # Each operator's own Lease name is its default (``parse_settings``).
    leader_election_id: str = setting(
        "", str, "the Lease's name; by default the operator's own (cozystack-<operator>-operator)"
    )
    api_timeout_seconds: float = setting(
        DEFAULT_API_TIMEOUT_SECONDS, float, "how long any API call but a watch may take"
    )
    stuck_seconds: float = setting(
        DEFAULT_STUCK_SECONDS, float, "/healthz fails when one reconcile has run this long"
    )


def setting_fields(cls: type[DataclassInstance]) -> Iterator[tuple[Field[Any], Flag]]:
    """Each ``setting`` field of ``cls`` with its flag (for ``add_setting_flags`` and the docs)."""
    for each in fields(cls):
        flag = each.metadata.get(_FLAG)
        if isinstance(flag, Flag):
            yield each, flag


def add_setting_flags(
    parser: argparse.ArgumentParser,
    cls: type[DataclassInstance],
    prefix: str,
    defaults: Mapping[str, object] | None = None,
) -> None:
    """A flag for each ``setting`` field of ``cls``, its default read from the environment when the
    variable is set, else from ``defaults``, else the field's own: one rule for every flag of both
    operators, so a field, its flag and its variable never drift apart."""
    for each, flag in setting_fields(cls):
        variable = flag.variable or f"{prefix}_{each.name.upper()}"
        text = os.environ.get(variable)
        default = (defaults or {}).get(each.name, each.default)
        parser.add_argument(
            f"--{each.name.replace('_', '-')}",
            type=flag.parse,
            default=default if text is None else flag.parse(text),
            help=f"{flag.help} (${variable})",
        )


def settings_from(cls: type[S], args: argparse.Namespace, **given: object) -> S:
    """``cls`` from the parsed flags of its ``setting`` fields, and ``given`` for its others."""
    return cls(**{each.name: getattr(args, each.name) for each, _ in setting_fields(cls)}, **given)


def runtime_settings(args: argparse.Namespace) -> RuntimeSettings:
    return settings_from(RuntimeSettings, args)


def parse_settings(
    cls: type[S],
    argv: Sequence[str] | None,
    *,
    prog: str,
    description: str | None,
    prefix: str,
    leader_election_id: str,
) -> S:
    """An operator's settings: the common flags (``RuntimeSettings``, as ``cls``'s ``runtime``
    field) and ``cls``'s own, every one under ``prefix``."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_setting_flags(parser, RuntimeSettings, prefix, {"leader_election_id": leader_election_id})
    add_setting_flags(parser, cls, prefix)
    args = parser.parse_args(argv)
    return settings_from(cls, args, runtime=runtime_settings(args))


def own_namespace(environ: Mapping[str, str] = os.environ) -> str:
    if environ.get("POD_NAMESPACE"):
        return environ["POD_NAMESPACE"]
    try:
        return SERVICEACCOUNT_NAMESPACE_FILE.read_text().strip() or "default"
    except OSError:
        return "default"


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


def run(name: str, settings: RuntimeSettings, build: Callable[[Manager, CollectorRegistry], None]) -> int:
    """Serve metrics and health, then run the manager until stopped; the process's exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    registry = CollectorRegistry(auto_describe=True)
    tracing = Tracing(provider_from_env(f"cozystack-{name}-operator"), f"cozystack.{name}")
    holder: dict[str, Manager] = {}
    health = Health(
        live=[lambda: holder["manager"].liveness_problem() if "manager" in holder else None],
        ready=[lambda: holder["manager"].readiness_problem() if "manager" in holder else "starting"],
    )
    serve(registry, settings.metrics_address, settings.metrics_port)
    health.serve(settings.metrics_address, settings.health_port)
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.get_loop().set_exception_handler(quiet_closed_transport)
            return runner.run(serve_manager(name, settings, build, registry, tracing, health, holder))
    finally:
        shutdown = getattr(tracing.provider, "shutdown", None)
        if callable(shutdown):
            shutdown()  # flush the last spans


async def serve_manager(
    name: str,
    settings: RuntimeSettings,
    build: Callable[[Manager, CollectorRegistry], None],
    registry: CollectorRegistry,
    tracing: Tracing,
    health: Health,
    holder: dict[str, Manager],
) -> int:
    """Run the manager until a signal or its failure; on the way out, hand the lease over."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    timeout = Timeout(settings.api_timeout_seconds, connect=CONNECT_TIMEOUT_SECONDS)
    kube = await Kube.connect(settings.kubeconfig, timeout=timeout)
    log.info("%s %s", STARTED_LOG, kube.credentials.server)
    kube.tracer = tracing.tracer
    election = LeaderElection(
        enabled=settings.leader_elect,
        namespace=settings.leader_election_namespace or own_namespace(),
        name=settings.leader_election_id or f"cozystack-{name}-operator",
    )
    manager = Manager(kube, registry, tracing, leader_election=election, stuck_seconds=settings.stuck_seconds)
    build(manager, registry)
    holder["manager"] = manager
    work = asyncio.create_task(manager.run(), name="manager")
    heartbeat = asyncio.create_task(health.heartbeat(), name="heartbeat")
    stopped = asyncio.create_task(stop.wait(), name="signal")
    await asyncio.wait((work, stopped), return_when=asyncio.FIRST_COMPLETED)
    failure = None if work.cancelled() or not work.done() else work.exception()
    for task in (work, heartbeat, stopped):
        task.cancel()  # no pass starts a write after this...
    await asyncio.gather(work, heartbeat, stopped, return_exceptions=True)
    await manager.release()  # ...so the lease is handed over with nothing in flight
    await kube.close()
    if failure is not None:
        log.error("stopping: %s", failure)
        return 1
    return 0


def main(name: str, settings: RuntimeSettings, build: Callable[[Manager, CollectorRegistry], None]) -> None:
    sys.exit(run(name, settings, build))
