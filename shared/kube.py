"""A thin async Kubernetes client speaking plain JSON, for both operators and their tests.

Decides: how a resource maps to its URL path, which HTTP status means what (404 is "absent", not an
error; 409 is a conflict the caller decides about), and the content type of each kind of patch.

Also decides how long a call may take: every request has a connect and a read timeout (the
instance's, by default ``DEFAULT_TIMEOUT``); a watch has its own idle timeout (the longest a read of
its stream may wait) apart from the server-side ``timeoutSeconds``. A call that gets no answer raises
one of ``NO_ANSWER``: kr8s's ``APITimeoutError`` for any timeout (a request's, a watch's connect or
idle timeout, a wait for a free pooled connection), httpx's ``TransportError`` for a refused or
broken connection of a request (its own or kr8s's session's), an ``OSError`` for one of a watch
(``WatchStreamError`` when the stream ends before its last chunk or is not HTTP/1.1 as read here).

Decides how a request is sent: not through kr8s's HTTP session (httpx builds, authenticates, pools
and times each request at a cost several times the API server's answer) but on a kept-alive HTTP/1.1
connection of our own, dialled as a watch's is (below): at most ``REQUEST_POOL_SIZE`` of them (and
requests in flight), one request at a time each, the most recently used taken first; a request
beyond the bound waits for one (under the pool timeout). An answer is read whole (Content-Length,
chunked, or delimited by the connection's end); no compression is asked for. A request's read
timeout is one ``asyncio.timeout`` around it, the connect timeout one around a dial. A kept
connection the server closed while idle is not used; one that turns out closed before any byte of
the answer carries a **GET** once more on a new connection, never a write (whether the server acted
on it is unknown: the caller decides). A request carries the Authorization kr8s's session carries
(kr8s replaces it when it re-reads the credentials), so a 401 means what it meant through that
session. Kept connections are dropped whenever credentials are re-read.

Decides who re-authenticates, and when: every answer's status becomes an ``ApiError`` here. kr8s's
own handling of an error status (on a 401 *or* a 403, re-read the credentials and replace its HTTP
session, which cuts every stream open on it) is used for a **401 only**, and once per call: the call
is sent again through kr8s's checking path (httpx: a 401 is rare), which re-reads the credentials
(an expired token, an exec plugin's new one), replaces the session and retries. A 403 is a refusal
(RBAC) with valid credentials, so it is raised at once and resets nothing: a read that may be
forbidden (the KubeVirt CR) costs one request. A write answered 401 is safe to send again:
authentication precedes everything else the server does with it.

Decides how a watch is read: not through kr8s's HTTP session (httpx streams a watch at several
reads and per-read timeout scopes per event) but over a connection of its own: one HTTP/1.1 request
dialled with the credentials kr8s loaded (``api.auth``: server URL, CA, client certificate, bearer
token, TLS server name), the chunked body taken in large reads (``WATCH_READ_BYTES``) and split on
the newline byte, and the idle timeout kept by one watchdog timer per watch (``_IdleWatchdog``), not a
timeout scope per read. A watch answered 401 has kr8s re-read the credentials
(``auth.reauthenticate``) and dials once more. A kubeconfig naming a ``proxy-url`` (and an Api that
is not kr8s's, as in tests) streams through kr8s's session instead, with the same line splitting;
requests then go through that session too.

Does not: cache, retry (but the one 401 retry, and a GET's one resend on a kept connection found
closed), or interpret objects; load credentials (kubeconfig, exec plugins, in-cluster ServiceAccount
tokens are kr8s's: everything here reads ``api.auth`` or goes through ``kr8s.asyncio.Api.call_api``,
so that objects stay plain dicts the pure cores can read); follow redirects, pipeline requests, or
speak HTTP/2 on its own connections (the API server answers itself, over HTTP/1.1 when asked to).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import warnings
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal
from urllib.parse import urlencode, urlsplit

import httpx
import kr8s
import kr8s.asyncio
from opentelemetry import trace

from shared.telemetry.tracing import note_write

Obj = dict[str, Any]
PatchKind = Literal["json", "merge", "strategic", "apply"]

_PATCH_CONTENT_TYPES: dict[PatchKind, str] = {
    "json": "application/json-patch+json",
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "apply": "application/apply-patch+yaml",
}


# The API server answers every call but a watch in well under this; a LIST page of 500 Pods included.
DEFAULT_READ_TIMEOUT_SECONDS: Final = 30.0
# A TCP + TLS handshake to a reachable API server takes milliseconds; longer means it is not there.
DEFAULT_CONNECT_TIMEOUT_SECONDS: Final = 5.0
DEFAULT_TIMEOUT: Final = httpx.Timeout(DEFAULT_READ_TIMEOUT_SECONDS, connect=DEFAULT_CONNECT_TIMEOUT_SECONDS)
# A watch with no idle timeout of its own may stay silent for its whole timeoutSeconds: the server
# closes it then, so this much more is a dead connection, not a quiet one.
WATCH_IDLE_GRACE_SECONDS: Final = 10.0
# One read of a watch stream takes up to this much: what TLS has decrypted by then (asyncio's TLS
# layer hands over up to 256 KiB at a time), so a burst of events costs one read, not one per event.
WATCH_READ_BYTES: Final = 262_144
# A connection's buffer limit (a watch's or a request's): asyncio pauses the socket at twice this
# unread, and it bounds the response head (status line and headers, well under a kilobyte from the
# API server).
CONNECTION_BUFFER_LIMIT: Final = WATCH_READ_BYTES
# One read of a chunked answer to a request takes up to this much, as a watch's: a LIST page of a few
# megabytes comes in a few dozen reads, not one per chunk.
REQUEST_READ_BYTES: Final = WATCH_READ_BYTES
# Requests in flight (and connections kept) at once: the operators' workers and informers LIST and
# write a few at a time, and the API server's per-client fairness gains nothing from more; a burst
# beyond this waits for a connection (httpx's pool timeout) rather than opening more.
REQUEST_POOL_SIZE: Final = 16
# An error answer to a watch is one Status object (a few hundred bytes); more is not read.
WATCH_ERROR_BODY_BYTES: Final = 65_536
# A chunk-size line is a few hex digits; one this long without its CRLF is not HTTP.
CHUNK_SIZE_LINE_BYTES: Final = 1_024
# How often a watch is dialled for one call: once, and once more after a 401 made kr8s re-read the
# credentials (a second 401 is an answer: the new credentials are not valid either).
WATCH_DIAL_ATTEMPTS: Final = 2
# Sent on each request of our own connections, so the API server's audit log tells them from kr8s's.
USER_AGENT: Final = "cozystack-operators/shared.kube"
# An error answer that is not a Status object (a proxy's HTML page, say) is quoted up to this much.
ERROR_TEXT_CHARS: Final = 500
UNAUTHORIZED: Final = 401  # the credentials are not (or no longer) valid: worth re-reading them once


LineBatch = list[bytes]  # the lines one read of a watch stream ended


class WatchStreamError(ConnectionError):
    """A watch stream broke: it ended before its last chunk, or is not HTTP/1.1 as read here."""


# What a call that got no answer raises (see the module docstring). ``OSError`` covers a watch's own
# connection (refused, reset, TLS failures, ``WatchStreamError``) and ``TimeoutError``, a caller's
# own deadline around the call.
NO_ANSWER: Final = (httpx.TransportError, kr8s.APITimeoutError, OSError)


class ApiError(Exception):
    """A non-2xx answer from the API server, with its HTTP status and the Status object's reason."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def transient(self) -> bool:
        """Worth retrying: throttled, timed out or a server-side failure; never a refusal."""
        return self.status in (429, 504) or self.status >= 500


class Lines:
    """Bytes of a stream in, complete lines out, split on the newline byte only.

    Not with a text decoder's line splitting: that splits on every Unicode line boundary, U+0085
    included, which a JSON string may carry unescaped; and bytes go to ``json.loads`` as they are.
    A line may come in any number of pieces; its start is kept (unjoined) until its end comes."""

    __slots__ = ("_start",)

    def __init__(self) -> None:
        self._start: list[bytes] = []  # the pieces of a line not yet ended

    def feed(self, data: bytes) -> list[bytes]:
        """The lines ``data`` ends (empty ones included; the caller skips them)."""
        return self._split(data)

    def rest(self) -> bytes:
        """What came after the last newline: a last line the stream did not end."""
        rest = b"".join(self._start)
        self._start.clear()
        return rest

    def _split(self, payload: bytes) -> list[bytes]:
        start = self._start
        if b"\n" not in payload:
            if payload:
                start.append(payload)
            return []
        if start:
            start.append(payload)
            payload = b"".join(start)
            start.clear()
        lines = payload.split(b"\n")
        unended = lines.pop()
        if unended:
            start.append(unended)
        return lines


class _Chunks:
    """HTTP/1.1 chunked framing in (as read from the connection), the chunks' data out.

    Each chunk is a hex size line, CRLF, that many bytes, CRLF; a zero-size chunk ends the body
    (``done``; what came after its size line in that read is kept as ``trailer``, for a reader that
    must take the trailer section off a connection it keeps). A size line, a chunk, or the CRLF after
    it may be split across reads anywhere. Chunk extensions (``;name=value`` after the size) are
    ignored."""

    __slots__ = ("_head", "_left", "done", "trailer")

    def __init__(self) -> None:
        self._head = b""  # the start of a size line whose CRLF has not come yet
        self._left = 0  # bytes still to come of the current chunk: its data, then its 2-byte CRLF
        self.done = False  # the zero-size chunk came
        self.trailer = b""  # what followed the zero-size chunk's size line, in the read that ended it

    def feed(self, data: bytes) -> bytes:
        """The chunk data ``data`` carries (nothing once ``done``)."""
        if self.done:
            return b""
        if self._head:
            data = self._head + data
            self._head = b""
        payload: list[bytes] = []
        left = self._left
        pos, end = 0, len(data)
        while pos < end:
            if left:
                if left > 2:  # chunk data
                    stop = min(pos + left - 2, end)
                    payload.append(data[pos:stop])
                    left -= stop - pos
                    pos = stop
                    if pos == end:
                        break
                # The CRLF after the data: ``left`` is 2 (both still to come) or 1 (just LF).
                crlf = b"\r\n"[2 - left : 2 - left + min(left, end - pos)]
                if not data.startswith(crlf, pos):
                    raise WatchStreamError("chunked body: no CRLF after a chunk's data")
                pos += len(crlf)
                left -= len(crlf)
                continue
            eol = data.find(b"\r\n", pos)
            if eol < 0:
                self._head = data[pos:]
                if len(self._head) > CHUNK_SIZE_LINE_BYTES:
                    raise WatchStreamError("chunked body: a chunk-size line with no end")
                break
            size = _chunk_size(data[pos:eol])
            pos = eol + 2
            if not size:
                self.done = True
                self.trailer = data[pos:]
                break
            left = size + 2
        self._left = left
        if len(payload) == 1:
            return payload[0]
        return b"".join(payload)


class ChunkedLines(Lines):
    """An HTTP/1.1 chunked body in (as read from the connection), its complete lines out.

    The framing is ``_Chunks``'s; a zero-size chunk ends the body (``done``; what follows it,
    trailers, is not read)."""

    __slots__ = ("_chunks",)

    def __init__(self) -> None:
        super().__init__()
        self._chunks = _Chunks()

    @property
    def done(self) -> bool:
        """The zero-size chunk came."""
        return self._chunks.done

    def feed(self, data: bytes) -> list[bytes]:
        payload = self._chunks.feed(data)
        return self._split(payload) if payload else []


def _chunk_size(line: bytes) -> int:
    digits = line.split(b";", 1)[0].strip()
    if not digits or digits.strip(b"0123456789abcdefABCDEF"):
        raise WatchStreamError(f"chunked body: {line[:40]!r} is not a chunk size")
    return int(digits, 16)


def _parse_head(head: bytes, what: str) -> tuple[bytes, int, str, dict[bytes, bytes]]:
    """A response head (through its blank line) as version, status, reason phrase, headers (names
    lower-cased; a repeated header keeps its last value)."""
    status_line, *header_lines = head[:-4].split(b"\r\n")
    version, _, rest = status_line.partition(b" ")
    code, _, phrase = rest.partition(b" ")
    if not version.startswith(b"HTTP/1.") or not code.isdigit():
        raise WatchStreamError(f"{what}: {status_line[:80]!r} is not an HTTP/1.1 status line")
    headers: dict[bytes, bytes] = {}
    for header in header_lines:
        name, _, value = header.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return version, int(code), phrase.decode("latin-1"), headers


class _IdleWatchdog:
    """Aborts a watch's connection once a read of it has waited ``idle`` seconds.

    One timer per watch, re-armed only when it fires: a read marks when it started waiting
    (``reading_since``) and when it returned (None), which costs two assignments and no timer
    operation; the timer, when it fires, aborts the connection if the read pending has waited long
    enough, or sets itself for when that read would have. The pending read then sees the connection
    end, and ``expired`` tells that end from the server's."""

    __slots__ = ("_handle", "_loop", "_transport", "expired", "idle", "reading_since")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, transport: asyncio.WriteTransport, idle: float
    ) -> None:
        self._loop, self._transport, self.idle = loop, transport, idle
        self.reading_since: float | None = None
        self.expired = False
        self._handle: asyncio.TimerHandle | None = loop.call_later(idle, self._fire)

    def _fire(self) -> None:
        since = self.reading_since
        waited = 0.0 if since is None else self._loop.time() - since
        if waited >= self.idle:
            self.expired = True
            self._handle = None
            self._transport.abort()
            return
        self._handle = self._loop.call_later(self.idle - waited, self._fire)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class _WatchConnection:
    """One watch request on a connection of its own: the head, then the body's lines in batches."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, idle: float) -> None:
        self.reader, self.writer = reader, writer
        self.loop = asyncio.get_running_loop()
        self.watchdog = _IdleWatchdog(self.loop, writer.transport, idle)
        self.status = 0
        self.reason_phrase = ""
        self.headers: dict[bytes, bytes] = {}

    def close(self) -> None:
        """At once: no TLS close_notify is waited for (a cancelled watch must not wait on the peer)."""
        self.watchdog.stop()
        self.writer.transport.abort()

    def _timed_out(self) -> kr8s.APITimeoutError:
        return kr8s.APITimeoutError(f"no data on the watch stream for {self.watchdog.idle:g}s")

    async def _read(self, read: Callable[..., Awaitable[bytes]], *args: Any) -> bytes:
        """One read of the connection under the watchdog. The connection's end reads as what came
        before it (b"" for a plain read); the watchdog's as kr8s's ``APITimeoutError``."""
        dog = self.watchdog
        dog.reading_since = self.loop.time()
        try:
            data = await read(*args)
        except asyncio.IncompleteReadError as error:
            data = error.partial
        except OSError:
            if dog.expired:
                raise self._timed_out() from None
            raise
        finally:
            dog.reading_since = None
        if not data and dog.expired:
            raise self._timed_out()
        return data

    async def read_head(self) -> None:
        try:
            head = await self._read(self.reader.readuntil, b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise WatchStreamError("watch: a response head longer than the buffer") from None
        if not head.endswith(b"\r\n\r\n"):
            raise WatchStreamError("watch: the connection closed before a whole response head came")
        _, self.status, self.reason_phrase, self.headers = _parse_head(head, "watch")

    async def batches(self) -> AsyncGenerator[LineBatch]:
        """The body's lines, a batch per read; the last one the body did not end with a newline."""
        chunked = b"chunked" in self.headers.get(b"transfer-encoding", b"").lower()
        decoder = ChunkedLines() if chunked else None
        lines = decoder or Lines()
        read, size = self.reader.read, WATCH_READ_BYTES
        while True:
            data = await self._read(read, size)
            if not data:
                if decoder is not None:
                    raise WatchStreamError("watch: the connection closed before the last chunk")
                break  # a body delimited by the connection's end (we asked for Connection: close)
            batch = lines.feed(data)
            if batch:
                yield batch
            if decoder is not None and decoder.done:
                break
        last = lines.rest()
        if last.strip():
            yield [last]

    async def error(self) -> ApiError:
        """The non-200 answer as an ``ApiError``, from its Status object when it is one."""
        parts: list[bytes] = []
        length = self.headers.get(b"content-length")
        with contextlib.suppress(OSError, kr8s.APITimeoutError):
            if length is not None and length.isdigit():
                wanted = min(int(length), WATCH_ERROR_BODY_BYTES)
                parts.append(await self._read(self.reader.readexactly, wanted))
            else:
                async with contextlib.aclosing(self.batches()) as batches:
                    async for batch in batches:
                        parts += batch
                        if sum(map(len, parts)) >= WATCH_ERROR_BODY_BYTES:
                            break
        return error_of(self.status, self.reason_phrase, b"\n".join(parts))


@dataclass(frozen=True, slots=True)
class _Server:
    """The API server as kr8s's credentials name it, as dialled here: address, TLS, request prefix."""

    host: str
    port: int
    tls: ssl.SSLContext | None
    sni: str | None
    host_header: str  # the Host header: the URL's host[:port]
    base_path: str  # a path prefix the server URL carries ("" for most)


class _DeadConnection(ConnectionError):
    """A kept connection ended before any byte of the answer to a request sent on it."""


@dataclass(slots=True)
class _Answer:
    status: int
    phrase: str
    content: bytes
    keep: bool  # the connection may carry another request


class _PooledConnection:
    """One kept-alive HTTP/1.1 connection of ``_Pool``: one request on it at a time."""

    __slots__ = ("generation", "reader", "server", "transport", "writer")

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: _Server, generation: int
    ) -> None:
        self.reader, self.writer, self.server, self.generation = reader, writer, server, generation
        self.transport = writer.transport

    def usable(self, generation: int) -> bool:
        """Dialled with today's credentials, and the server has not closed it while it was idle."""
        return self.generation == generation and not self.reader.at_eof() and not self.transport.is_closing()

    def close(self) -> None:
        """At once, as a watch's: no TLS close_notify is waited for."""
        self.transport.abort()

    async def exchange(self, request: bytes, method: str) -> _Answer:
        """Send ``request`` (head and body), read the whole answer. ``_DeadConnection`` when the
        connection ends before any byte of it came; ``WatchStreamError`` when it ends within it."""
        reader = self.reader
        self.writer.write(request)
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as error:
                if not error.partial:
                    raise _DeadConnection("the connection closed before an answer came") from None
                raise WatchStreamError("request: the connection closed within a response head") from None
            except asyncio.LimitOverrunError:
                raise WatchStreamError("request: a response head longer than the buffer") from None
            except (ConnectionResetError, BrokenPipeError) as error:
                raise _DeadConnection(f"the connection broke before an answer came: {error}") from None
            version, status, phrase, headers = _parse_head(head, "request")
            if status >= 200:  # an interim answer (1xx) is followed by the real one
                break
        keep = version == b"HTTP/1.1" and b"close" not in headers.get(b"connection", b"").lower()
        encoding = headers.get(b"transfer-encoding")
        length = headers.get(b"content-length")
        if method == "HEAD" or status in (204, 304):
            content = b""
        elif encoding is not None and b"chunked" in encoding.lower():
            content, clean = await self._chunked()
            keep = keep and clean
        elif length is not None:
            if not length.isdigit():
                raise WatchStreamError(f"request: {length[:40]!r} is not a Content-Length")
            try:
                content = await reader.readexactly(int(length))
            except asyncio.IncompleteReadError:
                raise WatchStreamError("request: the connection closed within a response body") from None
        else:  # a body delimited by the connection's end
            content, keep = await reader.read(), False
        return _Answer(status, phrase, content, keep)

    async def _chunked(self) -> tuple[bytes, bool]:
        """A chunked body, and whether the connection ended cleanly after it (its trailer section
        read through its blank line, nothing after it)."""
        chunks, parts, read = _Chunks(), [], self.reader.read
        while not chunks.done:
            data = await read(REQUEST_READ_BYTES)
            if not data:
                raise WatchStreamError("request: the connection closed before the last chunk")
            payload = chunks.feed(data)
            if payload:
                parts.append(payload)
        rest = chunks.trailer
        while not rest.startswith(b"\r\n") and b"\r\n\r\n" not in rest:
            if len(rest) > WATCH_ERROR_BODY_BYTES:
                raise WatchStreamError("request: a trailer section with no end")
            data = await read(REQUEST_READ_BYTES)
            if not data:
                raise WatchStreamError("request: the connection closed within the trailer section")
            rest += data
        end = 2 if rest.startswith(b"\r\n") else rest.index(b"\r\n\r\n") + 4
        return b"".join(parts), len(rest) == end


class _Pool:
    """Kept-alive connections to the API server for requests: at most ``size`` open (and requests
    in flight); a request finding none idle dials one while under the bound, or waits for one."""

    __slots__ = ("idle", "loop", "slots")

    def __init__(self, loop: asyncio.AbstractEventLoop, size: int) -> None:
        self.loop = loop  # connections belong to one event loop: another loop gets a pool of its own
        self.idle: list[_PooledConnection] = []  # most recently used last: it is taken first
        self.slots = asyncio.Semaphore(size)

    def clear(self) -> None:
        while self.idle:
            self.idle.pop().close()


@dataclass(frozen=True)
class Resource:
    """One kind's REST coordinates: ``Resource("apps/v1", "deployments")``."""

    api_version: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        parts = [base]
        if self.namespaced and namespace:
            parts += ["namespaces", namespace]
        parts.append(self.plural)
        if name:
            parts.append(name)
        return "/".join(parts)


NAMESPACES = Resource("v1", "namespaces", namespaced=False)
NODES = Resource("v1", "nodes", namespaced=False)
PODS = Resource("v1", "pods")
SERVICES = Resource("v1", "services")
SERVICE_ACCOUNTS = Resource("v1", "serviceaccounts")
EVENTS = Resource("v1", "events")
RESOURCE_QUOTAS = Resource("v1", "resourcequotas")
ENDPOINT_SLICES = Resource("discovery.k8s.io/v1", "endpointslices")
CRDS = Resource("apiextensions.k8s.io/v1", "customresourcedefinitions", namespaced=False)
ROLES = Resource("rbac.authorization.k8s.io/v1", "roles")
ROLE_BINDINGS = Resource("rbac.authorization.k8s.io/v1", "rolebindings")
CLUSTER_ROLES = Resource("rbac.authorization.k8s.io/v1", "clusterroles", namespaced=False)
CLUSTER_ROLE_BINDINGS = Resource("rbac.authorization.k8s.io/v1", "clusterrolebindings", namespaced=False)


class Kube:
    """Plain-JSON verbs with kr8s's credentials, over connections of their own (kept ones for requests,
    one per watch), or kr8s's session where those cannot serve (a proxy-url, an Api not kr8s's)."""

    def __init__(
        self,
        api: kr8s.asyncio.Api,
        tracer: trace.Tracer | None = None,
        *,
        timeout: httpx.Timeout | None = None,
    ) -> None:
        self.api = api
        # Every write becomes a child span of the current pass and marks that pass "changed".
        self.tracer = tracer
        # Per request, never on kr8s's session: kr8s shares one Api (and session) between callers.
        self.timeout = timeout or DEFAULT_TIMEOUT
        # The TLS context of our own connections, for the credential files it was built from (kr8s
        # writes new files when it re-reads inline credentials); dropped whenever credentials are re-read.
        self._tls: tuple[tuple[str, str, str], ssl.SSLContext] | None = None
        # Which credentials the kept connections were dialled with: a re-read makes them all stale.
        self._generation = 0
        self._pool: _Pool | None = None  # requests' kept connections (made on the first request)

    @classmethod
    async def connect(
        cls,
        kubeconfig: str | None = None,
        *,
        timeout: httpx.Timeout | None = None,  # noqa: ASYNC109 - every request's, not this call's
    ) -> Kube:
        """From a kubeconfig path, or (None) the usual chain: $KUBECONFIG, ~/.kube/config, in-cluster."""
        with warnings.catch_warnings():
            # kr8s warns about any server newer than the releases it was tested with; the verbs used
            # here are stable v1 REST, so the warning says nothing about this code.
            warnings.filterwarnings("ignore", "Kubernetes version", UserWarning)
            api = await kr8s.asyncio.api(kubeconfig=kubeconfig) if kubeconfig else await kr8s.asyncio.api()
        return cls(api, timeout=timeout)

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        if method == "GET":
            return await self._send(method, path, body, params, content_type)
        note_write()
        if self.tracer is None or not trace.get_current_span().get_span_context().is_valid:
            # Outside a pass (a lease renewal, say) a write is no trace of its own.
            return await self._send(method, path, body, params, content_type)
        attributes = {"http.request.method": method, "k8s.request.path": path}
        with self.tracer.start_as_current_span(
            f"{method} {_resource_of(path)}", kind=trace.SpanKind.CLIENT, attributes=attributes
        ) as span:
            try:
                return await self._send(method, path, body, params, content_type)
            except ApiError as error:
                span.set_attribute("http.response.status_code", error.status)
                raise

    async def _send(
        self, method: str, path: str, body: Any, params: Mapping[str, str] | None, content_type: str
    ) -> Obj:
        auth = getattr(self.api, "auth", None)
        if auth is None or auth.proxy:  # as a watch: kr8s's session speaks the proxy
            status, phrase, content = await self._call(method, path, body, params, content_type, False)
        else:
            payload = None if body is None else json.dumps(body).encode()
            status, phrase, content = await self._request_direct(
                auth, method, path, payload, params, content_type
            )
        if status == UNAUTHORIZED:
            # kr8s's checking path: it re-reads the credentials, replaces its session and retries.
            self._credentials_changed()
            try:
                status, phrase, content = await self._call(method, path, body, params, content_type, True)
            except kr8s.ServerError as error:
                raise _api_error(error) from None
        if not 200 <= status < 300:
            raise error_of(status, phrase, content)
        return json.loads(content) if content else {}

    async def _call(
        self,
        method: str,
        path: str,
        body: Any,
        params: Mapping[str, str] | None,
        content_type: str,
        check: bool,
    ) -> tuple[int, str, bytes]:
        """One request through kr8s's session; ``check``: its checking (re-authenticating) path."""
        base, _, rest = path.lstrip("/").partition("/")
        kwargs: dict[str, Any] = {"params": dict(params or {}), "timeout": self.timeout}
        if body is not None:
            kwargs["content"] = json.dumps(body)
            kwargs["headers"] = {"Content-Type": content_type}
        if not check:
            kwargs["raise_for_status"] = False
        async with self.api.call_api(method, version="", base=f"/{base}", url=rest, **kwargs) as answer:
            return answer.status_code, answer.reason_phrase, answer.content

    async def _request_direct(
        self,
        auth: Any,
        method: str,
        path: str,
        payload: bytes | None,
        params: Mapping[str, str] | None,
        content_type: str,
    ) -> tuple[int, str, bytes]:
        """One request on a kept connection of ``_Pool`` (see the module docstring)."""
        loop = asyncio.get_running_loop()
        pool = self._pool
        if pool is None or pool.loop is not loop:
            pool = self._pool = _Pool(loop, REQUEST_POOL_SIZE)
        slots = pool.slots
        if slots.locked():
            try:
                async with asyncio.timeout(self.timeout.pool):
                    await slots.acquire()
            except TimeoutError:
                raise kr8s.APITimeoutError("no connection to the API server free in time") from None
        else:
            await slots.acquire()  # free: returns at once
        try:
            async with asyncio.timeout(self.timeout.read):
                answer = await self._exchange(auth, pool, method, path, payload, params, content_type)
        except TimeoutError:
            raise kr8s.APITimeoutError(f"no answer to {method} {path} in time") from None
        finally:
            slots.release()
        return answer.status, answer.phrase, answer.content

    async def _exchange(
        self,
        auth: Any,
        pool: _Pool,
        method: str,
        path: str,
        payload: bytes | None,
        params: Mapping[str, str] | None,
        content_type: str,
    ) -> _Answer:
        """Send on an idle connection (or a new one); a GET once more on a new connection when a kept
        one turns out closed before any byte of the answer. A write is never sent twice."""
        target = f"{path}?{urlencode(params)}" if params else path
        # What kr8s's session sends (kr8s replaces it when it re-reads the credentials), so that a
        # request authenticates as it did through that session; without one, kr8s's token.
        session = getattr(self.api, "_session", None)
        authorization = session.headers.get("authorization") if session is not None else None
        if authorization is None and auth.token:
            authorization = f"Bearer {auth.token}"
        idle, generation = pool.idle, self._generation
        may_retry = method == "GET"
        while True:
            connection = None
            while idle:
                candidate = idle.pop()
                if candidate.usable(generation):
                    connection = candidate
                    break
                candidate.close()
            kept = connection is not None
            if connection is None:
                try:
                    server = await self._server(auth)
                    reader, writer = await self._open(auth, server)
                except TimeoutError:
                    raise
                except OSError as error:  # as through kr8s's session: httpx's TransportError
                    raise httpx.ConnectError(f"{method} {path}: {error}") from error
                connection = _PooledConnection(reader, writer, server, generation)
            server = connection.server
            head = _request_head(server, method, target, authorization, "keep-alive")
            if payload is not None:
                head += f"Content-Type: {content_type}\r\nContent-Length: {len(payload)}\r\n"
            request = (head + "\r\n").encode("latin-1")
            if payload is not None:
                request += payload
            try:
                answer = await connection.exchange(request, method)
            except _DeadConnection as error:
                connection.close()
                if kept and may_retry:
                    may_retry = False
                    continue
                raise httpx.RemoteProtocolError(f"{method} {path}: {error}") from None
            except TimeoutError:
                connection.close()
                raise
            except OSError as error:  # broken within an answer, or not HTTP/1.1 as read here
                connection.close()
                raise httpx.RemoteProtocolError(f"{method} {path}: {error}") from error
            except BaseException:
                connection.close()  # cancelled or broken within an answer: not reusable
                raise
            if answer.keep:
                idle.append(connection)
            else:
                connection.close()
            return answer

    def _credentials_changed(self) -> None:
        """kr8s re-reads (or is about to re-read) the credentials: rebuild TLS, dial afresh."""
        self._tls = None
        self._generation += 1
        if self._pool is not None:
            self._pool.clear()

    async def get(self, path: str) -> Obj | None:
        """The object, or None when it (or its whole kind) is not there."""
        try:
            return await self.request("GET", path)
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    async def list(
        self,
        path: str,
        *,
        label_selector: str = "",
        field_selector: str = "",
        limit: int = 0,
        continue_: str = "",
        resource_version: str = "",
    ) -> Obj:
        """One LIST (page): ``limit`` and ``continue_`` page it (the answer's ``metadata.continue``
        names the next page); ``resource_version`` as the API defines it ("" = a consistent read)."""
        params = {
            k: v
            for k, v in (
                ("labelSelector", label_selector),
                ("fieldSelector", field_selector),
                ("continue", continue_),
                ("resourceVersion", resource_version),
            )
            if v
        }
        if limit:
            params["limit"] = str(limit)
        return await self.request("GET", path, params=params)

    async def create(self, path: str, body: Mapping[str, Any]) -> Obj:
        return await self.request("POST", path, body=body)

    async def replace(self, path: str, body: Mapping[str, Any]) -> Obj:
        return await self.request("PUT", path, body=body)

    async def apply(self, path: str, obj: Mapping[str, Any], field_manager: str) -> Obj:
        """Server-side apply of ``obj`` at its own path, taking ownership of every field it sets."""
        return await self.request(
            "PATCH",
            path,
            body=obj,
            params={"fieldManager": field_manager, "force": "true"},
            content_type=_PATCH_CONTENT_TYPES["apply"],
        )

    async def patch(self, path: str, patch: Any, kind: PatchKind = "json") -> Obj:
        """``path`` may end in ``/status`` to patch the status subresource."""
        return await self.request("PATCH", path, body=patch, content_type=_PATCH_CONTENT_TYPES[kind])

    async def delete(
        self,
        path: str,
        *,
        uid: str | None = None,
        propagation: str | None = None,
        grace_period_seconds: int | None = None,
    ) -> bool:
        """Delete; with ``uid`` only that incarnation. False when it was already gone."""
        options: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        if uid:
            options["preconditions"] = {"uid": uid}
        if propagation:
            options["propagationPolicy"] = propagation
        try:
            await self.request("DELETE", path, body=options)
        except ApiError as error:
            if error.status == 404:
                return False
            raise
        return True

    async def watch(
        self,
        path: str,
        *,
        resource_version: str = "",
        label_selector: str = "",
        field_selector: str = "",
        timeout_seconds: int = 300,
        idle_timeout: float | None = None,
    ) -> AsyncGenerator[tuple[str, Obj]]:
        """One watch request (bookmarks on): yields (type, object) until the server closes it.

        ``timeout_seconds`` is the server's: it ends the watch normally then. ``idle_timeout`` is
        ours: the longest a read of the stream may wait (default: the server's timeout plus a grace),
        after which kr8s's ``APITimeoutError`` is raised. A non-200 answer raises ``ApiError`` (410
        Gone included); an ERROR event is yielded like any other."""
        params = {"watch": "true", "timeoutSeconds": str(timeout_seconds), "allowWatchBookmarks": "true"}
        if resource_version:
            params["resourceVersion"] = resource_version
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        idle = idle_timeout if idle_timeout is not None else timeout_seconds + WATCH_IDLE_GRACE_SECONDS
        auth = getattr(self.api, "auth", None)
        if auth is None or auth.proxy:
            batches = self._watch_through_session(path, params, idle)
        else:
            batches = self._watch_direct(auth, path, params, idle)
        loads = json.loads
        async with contextlib.aclosing(batches):
            async for lines in batches:
                for line in lines:
                    if line:
                        event = loads(line)
                        yield event["type"], event["object"]

    async def _watch_direct(
        self, auth: Any, path: str, params: Mapping[str, str], idle: float
    ) -> AsyncGenerator[LineBatch]:
        """The watch over a connection of its own (see the module docstring)."""
        for attempt in range(1, WATCH_DIAL_ATTEMPTS + 1):
            connection = await self._dial(auth, path, params, idle)
            try:
                await connection.read_head()
                if connection.status == 200:
                    break
                error = await connection.error()
            finally:
                if connection.status != 200:
                    connection.close()
            if error.status != UNAUTHORIZED or attempt == WATCH_DIAL_ATTEMPTS:
                raise error
            self._credentials_changed()
            await auth.reauthenticate()
        try:
            async with contextlib.aclosing(connection.batches()) as batches:
                async for lines in batches:
                    yield lines
        finally:
            connection.close()

    async def _dial(self, auth: Any, path: str, params: Mapping[str, str], idle: float) -> _WatchConnection:
        """Connect (TCP, TLS with ALPN http/1.1) and send the watch request."""
        server = await self._server(auth)
        authorization = f"Bearer {auth.token}" if auth.token else None
        head = _request_head(server, "GET", f"{path}?{urlencode(params)}", authorization, "close")
        reader, writer = await self._open(auth, server)
        connection = _WatchConnection(reader, writer, idle)
        writer.write((head + "\r\n").encode("latin-1"))
        return connection

    async def _server(self, auth: Any) -> _Server:
        """Where (and how) to dial the API server kr8s's credentials name."""
        server = urlsplit(auth.server)
        tls = await self._tls_context(auth) if server.scheme == "https" else None
        host = server.hostname
        if not host:  # kr8s is re-reading the credentials this moment, or they name no server
            raise WatchStreamError(f"no API server address in {auth.server!r}")
        port = server.port or (443 if tls is not None else 80)
        sni = (auth.tls_server_name or host) if tls is not None else None
        return _Server(host, port, tls, sni, server.netloc.rpartition("@")[2], server.path.rstrip("/"))

    async def _open(self, auth: Any, server: _Server) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection of our own (a watch's or a request's), under the connect timeout."""
        try:
            async with asyncio.timeout(self.timeout.connect):
                return await asyncio.open_connection(
                    server.host,
                    server.port,
                    ssl=server.tls,
                    server_hostname=server.sni,
                    limit=CONNECTION_BUFFER_LIMIT,
                )
        except TimeoutError:
            raise kr8s.APITimeoutError(f"no connection to {auth.server} in time") from None
        except ssl.SSLCertVerificationError:
            self._credentials_changed()  # built from credentials since replaced, perhaps: rebuild
            raise

    async def _tls_context(self, auth: Any) -> ssl.SSLContext:
        """kr8s's own TLS context for these credentials (CA, client certificate), for HTTP/1.1."""
        files = (str(auth.server_ca_file), str(auth.client_cert_file), str(auth.client_key_file))
        if self._tls is not None and self._tls[0] == files:
            return self._tls[1]
        verify = await auth.ssl_context()
        # kr8s answers True when the kubeconfig names no CA and no client certificate: what it then
        # gives httpx, which verifies against its default CA bundle.
        context = verify if isinstance(verify, ssl.SSLContext) else httpx.create_ssl_context()
        context.set_alpn_protocols(["http/1.1"])
        self._tls = (files, context)
        return context

    async def _watch_through_session(
        self, path: str, params: Mapping[str, str], idle: float
    ) -> AsyncGenerator[LineBatch]:
        """The watch streamed by kr8s's session: for a kubeconfig with a proxy-url, which the direct
        connection does not speak (and an Api that is not kr8s's, as in tests)."""
        base, _, rest = path.lstrip("/").partition("/")
        # httpx's read timeout bounds each read of the socket: "the longest a read may wait".
        timeout = httpx.Timeout(
            idle, connect=self.timeout.connect, write=self.timeout.write, pool=self.timeout.pool
        )
        kwargs: dict[str, Any] = {"params": params, "stream": True, "timeout": timeout}
        call = self.api.call_api
        try:
            for check in (False, True):  # as ``_send``: kr8s's checking path after a 401 only
                async with call(
                    "GET", version="", base=f"/{base}", url=rest, raise_for_status=check, **kwargs
                ) as answer:
                    if answer.status_code == UNAUTHORIZED and not check:
                        self._credentials_changed()
                        continue
                    if not answer.is_success:
                        await answer.aread()
                        raise error_of(answer.status_code, answer.reason_phrase, answer.content)
                    lines = Lines()
                    async for data in answer.aiter_bytes():
                        batch = lines.feed(data)
                        if batch:
                            yield batch
                    last = lines.rest()
                    if last.strip():
                        yield [last]
                    return
        except kr8s.ServerError as error:
            raise _api_error(error) from None


def _request_head(
    server: _Server, method: str, target: str, authorization: str | None, connection: str
) -> str:
    """A request's head lines, each ending in CRLF, without the blank line (body headers follow)."""
    head = (
        f"{method} {server.base_path}{target} HTTP/1.1\r\nHost: {server.host_header}\r\n"
        f"Accept: application/json\r\nUser-Agent: {USER_AGENT}\r\nConnection: {connection}\r\n"
    )
    if authorization:
        head += f"Authorization: {authorization}\r\n"
    return head


def _resource_of(path: str) -> str:
    """The resource (and subresource) a path names, for a span name without object names in it."""
    parts = path.strip("/").split("/")
    parts = parts[2:] if parts[0] == "api" else parts[3:]  # drop /api/v1 or /apis/<group>/<version>
    if len(parts) >= 2 and parts[0] == "namespaces" and len(parts) > 2:
        parts = parts[2:]
    return "/".join(parts[:1] + parts[2:3])


def error_of(status: int, phrase: str, body: bytes) -> ApiError:
    """A non-2xx answer as an ``ApiError``: from its Status object, or (a proxy's page, say) its text."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and parsed.get("kind") == "Status":
        return ApiError(status, str(parsed.get("reason") or ""), str(parsed.get("message") or phrase))
    text = body.decode("utf-8", "replace").strip()[:ERROR_TEXT_CHARS]
    return ApiError(status, "", text or phrase)


def _api_error(error: kr8s.ServerError) -> ApiError:
    """kr8s's error for a status (from its checking path) as an ``ApiError``."""
    response = error.response
    status_code = response.status_code if response is not None else 0
    status: dict[str, Any] = error.status if isinstance(error.status, dict) else {}
    return ApiError(status_code, str(status.get("reason", "")), str(status.get("message", error)))
