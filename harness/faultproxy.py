"""A TCP proxy in front of the API server that a test switches between healthy and broken networks.

Decides: what each mode does to connections, at the TCP level only (TLS passes through untouched,
so clients verify the API server's own certificate and authenticate as usual):

* ``FORWARD`` (the default): bytes flow both ways; a connection accepted in another mode and still
  held is connected upstream now and flows too (a healed network delivers what it held back).
* ``REFUSE``: every open connection is closed, and new ones are refused (the listener stops
  listening but keeps its port, so connecting fails at once with "connection refused"); the API
  server is down.
* ``BLACKHOLE``: open connections stay open but nothing is forwarded in either direction, and new
  connections are accepted and held without being connected upstream: the half-open case (a network
  partition, a dead peer without RST) that only a client's own timeout can detect. Bytes already read
  are kept, not dropped, and flow on when forwarding resumes, as TCP would deliver them.
* ``HANG``: connections open before the switch keep working (a watch keeps streaming); new
  connections are accepted and held, nothing forwarded: an API server that is up for the clients it
  has but answers no new one (a full accept queue, a stuck load balancer). That open connections
  keep working is a choice: it is what separates ``HANG`` from ``BLACKHOLE``.

Apart from the modes, ``strand`` leaves every connection open at that moment half-open for good:
nothing is forwarded on it again in either direction (whatever the mode becomes), and neither end
hears of the other's close, while new connections are served by the mode as usual. That is a
network that lost its flows (a NAT or load balancer restarted, a route moved): the peer of a
connection is not reachable on it any more but is reachable anew; only a client's own bound on a
silent connection notices, since the kernel keeps acknowledging (TCP keepalive is answered here).

``set_mode`` returns once the mode holds: after ``REFUSE``, every connection is closed and the port
refuses. ``wait_until`` waits (with a deadline, never a bare sleep) for a state of the proxy's
connections, e.g. "one new connection is held", so a test can tell "not forwarded" from "not yet".
``proxy_kubeconfig`` writes a copy of a kubeconfig whose server is the proxy; the API server's
certificate names 127.0.0.1 (the local control plane), so the copy verifies as the original does; for
a server named otherwise, the copy sets ``tls-server-name`` to that name.

Does not: look inside the bytes (no HTTP, no TLS termination), delay or drop part of a stream, or
survive its event loop. Refusing keeps the port by shutting the listening socket down and listening
again (Linux does this, the way HAProxy pauses a listener); the port is bound with ``SO_REUSEPORT``
taken from a port-0 bind, so nothing else can take it meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import yaml

# The proxy listens here: the local control plane's certificate is for 127.0.0.1.
LISTEN_HOST: Final = "127.0.0.1"
# Connections waiting in the kernel before accept.
LISTEN_BACKLOG: Final = 128
# How much one read may take from a socket before it is forwarded.
CHUNK_BYTES: Final = 64 * 1024
# The default port of an https server URL without one.
HTTPS_PORT: Final = 443
# Kubeconfig fields naming files, resolved against the kubeconfig's directory when relative.
CLUSTER_FILE_FIELDS: Final = ("certificate-authority",)
USER_FILE_FIELDS: Final = ("client-certificate", "client-key", "tokenFile")


class Mode(enum.Enum):
    FORWARD = "forward"
    REFUSE = "refuse"
    BLACKHOLE = "blackhole"
    HANG = "hang"


@dataclass(eq=False)
class _Link:
    """One client connection, and its upstream connection once it has one."""

    client_reader: asyncio.StreamReader
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    task: asyncio.Task[None] | None = None
    stranded: bool = False  # half-open for good (``FaultProxy.strand``): forwards nothing, ever

    def abort(self) -> None:
        for writer in (self.client, self.upstream):
            if writer is not None:
                writer.transport.abort()


class FaultProxy:
    """Listens on ``LISTEN_HOST`` (a free port) and forwards to ``upstream_host:upstream_port``."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream_host, self.upstream_port = upstream_host, upstream_port
        self.accepted = 0  # connections accepted so far, in any mode
        self._mode = Mode.FORWARD
        self._listener: socket.socket | None = None
        self._acceptor: asyncio.Task[None] | None = None
        self._links: set[_Link] = set()
        # Replaced on every change: waiters wait on the current one, which is set when the next comes.
        self._mode_changed = asyncio.Event()
        self._links_changed = asyncio.Event()

    @property
    def mode(self) -> Mode:
        return self._mode

    @property
    def port(self) -> int:
        assert self._listener is not None, "the proxy is not started"
        return int(self._listener.getsockname()[1])

    @property
    def url(self) -> str:
        return f"https://{LISTEN_HOST}:{self.port}"

    @property
    def connections(self) -> int:
        """Client connections open now, held or forwarded."""
        return len(self._links)

    @property
    def held(self) -> int:
        """Client connections open now that have no upstream connection (accepted, never forwarded).
        A held connection its client gave up on is noticed only once forwarding resumes."""
        return sum(1 for link in self._links if link.upstream is None)

    @property
    def stranded(self) -> int:
        """Connections open now that ``strand`` left half-open."""
        return sum(1 for link in self._links if link.stranded)

    def strand(self) -> int:
        """Leave every connection open now half-open for good (see the module docstring); how many."""
        for link in self._links:
            link.stranded = True
        self._switch(self._mode)  # wakes every pump, so each sees it is stranded
        return sum(1 for link in self._links if link.stranded)

    async def start(self) -> None:
        self._listener = _bind_keeping_port()
        self._listener.listen(LISTEN_BACKLOG)
        self._acceptor = asyncio.create_task(self._accept())

    async def aclose(self) -> None:
        await self._stop_accepting()
        await self._close_links()
        if self._listener is not None:
            self._listener.close()

    async def set_mode(self, mode: Mode) -> None:
        if mode is self._mode:
            return
        if mode is Mode.REFUSE:
            await self._stop_accepting()
            assert self._listener is not None
            # Linux: a listening socket shut down for reading resets its queue and stops listening,
            # but stays bound; connecting now is refused.
            self._listener.shutdown(socket.SHUT_RD)
            self._switch(mode)
            await self._close_links()
            return
        if self._mode is Mode.REFUSE:
            assert self._listener is not None
            self._listener.listen(LISTEN_BACKLOG)
            self._acceptor = asyncio.create_task(self._accept())
        self._switch(mode)

    async def wait_until(self, condition: Callable[[FaultProxy], bool], timeout: float, what: str) -> None:
        """Until ``condition(self)`` holds (checked on every change of the connections), or fail."""
        try:
            async with asyncio.timeout(timeout):
                while not condition(self):
                    await self._links_changed.wait()
        except TimeoutError:
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what} (open {self.connections}, held {self.held}, "
                f"accepted {self.accepted}, mode {self._mode.value})"
            ) from None

    # --- the machinery -------------------------------------------------------------------------

    def _switch(self, mode: Mode) -> None:
        self._mode = mode
        changed, self._mode_changed = self._mode_changed, asyncio.Event()
        changed.set()

    def _note_links(self) -> None:
        changed, self._links_changed = self._links_changed, asyncio.Event()
        changed.set()

    async def _until(self, allowed: Callable[[], bool]) -> None:
        while not allowed():
            await self._mode_changed.wait()

    def _flowing(self) -> bool:
        """Whether connected links forward bytes now."""
        return self._mode in (Mode.FORWARD, Mode.HANG)

    def _connecting(self) -> bool:
        """Whether a held link may connect upstream now."""
        return self._mode is Mode.FORWARD

    async def _stop_accepting(self) -> None:
        if self._acceptor is not None:
            self._acceptor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._acceptor
            self._acceptor = None

    async def _close_links(self) -> None:
        links = list(self._links)
        for link in links:
            link.abort()
            if link.task is not None:
                link.task.cancel()
        await asyncio.gather(*(link.task for link in links if link.task is not None), return_exceptions=True)

    async def _accept(self) -> None:
        assert self._listener is not None
        loop = asyncio.get_running_loop()
        while True:
            connection, _ = await loop.sock_accept(self._listener)
            try:
                reader, writer = await asyncio.open_connection(sock=connection)
            except BaseException:
                connection.close()
                raise
            link = _Link(reader, writer)
            self._links.add(link)
            self.accepted += 1
            link.task = asyncio.create_task(self._serve(link))
            self._note_links()

    async def _serve(self, link: _Link) -> None:
        try:
            await self._until(self._connecting)
            upstream_reader, link.upstream = await asyncio.open_connection(
                self.upstream_host, self.upstream_port
            )
            self._note_links()
            await asyncio.gather(
                self._pump(link.client_reader, link.upstream, link),
                self._pump(upstream_reader, link.client, link),
            )
        except OSError:
            pass  # the upstream refused: the client sees its connection closed
        finally:
            link.abort()
            self._links.discard(link)
            self._note_links()

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, link: _Link) -> None:
        """One direction: read, and write once the mode lets bytes flow; end-of-stream passes on."""

        def flowing() -> bool:
            return self._flowing() and not link.stranded

        try:
            while True:
                await self._until(flowing)
                data = await source.read(CHUNK_BYTES)
                if not data:
                    await self._until(flowing)  # a stranded link passes no end-of-stream on either
                    if sink.can_write_eof() and not sink.is_closing():
                        sink.write_eof()
                    return
                await self._until(flowing)
                sink.write(data)
                await sink.drain()
        except OSError:
            link.abort()  # a reset on either side ends both


def _bind_keeping_port() -> socket.socket:
    """A socket bound to a free port of ``LISTEN_HOST`` *by number*: a port-0 bind would be given up
    by the shutdown of ``REFUSE``. ``SO_REUSEPORT`` lets the explicit bind join the port-0 one before
    that one is closed, so the port is never free in between."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        probe.bind((LISTEN_HOST, 0))
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        listener.bind(probe.getsockname())
    finally:
        probe.close()
    listener.setblocking(False)
    return listener


@contextlib.asynccontextmanager
async def fault_proxy(server: str) -> AsyncIterator[FaultProxy]:
    """A running proxy in front of the API server at ``server`` (an https URL), closed on exit."""
    host, port = upstream_of(server)
    proxy = FaultProxy(host, port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.aclose()


def upstream_of(server: str) -> tuple[str, int]:
    url = urlsplit(server)
    if url.hostname is None:
        raise ValueError(f"no host in the server URL {server!r}")
    return url.hostname, url.port or HTTPS_PORT


def kubeconfig_server(kubeconfig: str | Path) -> str:
    """The server URL of the kubeconfig's current context."""
    config = yaml.safe_load(Path(kubeconfig).read_text())
    return str(_current_cluster(config)["server"])


def proxy_kubeconfig(kubeconfig: str | Path, proxy: FaultProxy, path: Path) -> str:
    """Write at ``path`` a copy of ``kubeconfig`` whose current cluster is reached through ``proxy``
    (the same credentials and CA; relative file references made absolute); return the path."""
    source = Path(kubeconfig)
    config = yaml.safe_load(source.read_text())
    cluster = _current_cluster(config)
    original = urlsplit(str(cluster["server"])).hostname
    cluster["server"] = proxy.url
    if original and original != LISTEN_HOST and "tls-server-name" not in cluster:
        cluster["tls-server-name"] = original
    _absolute(cluster, CLUSTER_FILE_FIELDS, source.parent)
    for user in config.get("users") or []:
        _absolute(user.get("user") or {}, USER_FILE_FIELDS, source.parent)
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return str(path)


def _current_cluster(config: dict[str, Any]) -> dict[str, Any]:
    contexts = {c["name"]: c["context"] for c in config.get("contexts") or []}
    clusters = {c["name"]: c["cluster"] for c in config.get("clusters") or []}
    current = config.get("current-context")
    if current in contexts:
        name = contexts[current]["cluster"]
    elif len(clusters) == 1:
        [name] = clusters
    else:
        raise ValueError(f"the kubeconfig has no current context naming one of its clusters: {current!r}")
    cluster: dict[str, Any] = clusters[name]
    return cluster


def _absolute(section: dict[str, Any], fields: tuple[str, ...], base: Path) -> None:
    for name in fields:
        value = section.get(name)
        if value and not Path(value).is_absolute():
            section[name] = str(base / value)
