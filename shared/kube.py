"""A thin async Kubernetes client speaking plain JSON, for both operators and their tests.

Decides: how a resource maps to its URL path, which HTTP status means what (404 is "absent", not an
error; 409 is a conflict the caller decides about), and the content type of each kind of patch.

Also decides how long a call may take: every request has a connect and a read timeout (the
instance's, by default ``DEFAULT_TIMEOUT``); a watch has its own idle timeout (the longest a read of
its stream may wait) apart from the server-side ``timeoutSeconds``. A call that gets no answer raises
one of ``NO_ANSWER``: kr8s's ``APITimeoutError`` for any timeout (a request's, a watch's connect or
idle timeout), httpx's ``TransportError`` for a refused or broken connection of a request, an
``OSError`` for one of a watch (``WatchStreamError`` when the stream ends before its last chunk or is
not HTTP/1.1 as read here).

Decides who re-authenticates, and when: every request goes to kr8s with ``raise_for_status=False``
and its status becomes an ``ApiError`` here. kr8s's own handling of an error status (on a 401 *or* a
403, re-read the credentials and replace its HTTP session, which cuts every stream open on it) is
used for a **401 only**, and once per call: the call is sent again through kr8s's checking path,
which re-reads the credentials (an expired token, an exec plugin's new one), replaces the session
and retries. A 403 is a refusal (RBAC) with valid credentials, so it is raised at once and resets
nothing: a read that may be forbidden (the KubeVirt CR) costs one request. A write answered 401 is
safe to send again: authentication precedes everything else the server does with it.

Decides how a watch is read: not through kr8s's HTTP session (httpx streams a watch at several
reads and per-read timeout scopes per event) but over a connection of its own: one HTTP/1.1 request
dialled with the credentials kr8s loaded (``api.auth``: server URL, CA, client certificate, bearer
token, TLS server name), the chunked body taken in large reads (``WATCH_READ_BYTES``) and split on
the newline byte, and the idle timeout kept by one watchdog timer per watch (``_IdleWatchdog``), not a
timeout scope per read. A watch answered 401 has kr8s re-read the credentials
(``auth.reauthenticate``) and dials once more. A kubeconfig naming a ``proxy-url`` (and an Api that
is not kr8s's, as in tests) streams through kr8s's session instead, with the same line splitting.

Does not: cache, retry (but the one 401 retry), or interpret objects; load credentials (kubeconfig,
exec plugins, in-cluster ServiceAccount tokens are kr8s's: everything here is a few lines over
``kr8s.asyncio.Api.call_api`` and ``api.auth``, so that objects stay plain dicts the pure cores can
read); follow redirects or speak HTTP/2 on a watch (the API server answers a watch itself, over
HTTP/1.1 when asked to).
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
# The watch connection's buffer limit: asyncio pauses the socket at twice this unread, and it bounds
# the response head (status line and headers, well under a kilobyte from the API server).
WATCH_BUFFER_LIMIT: Final = WATCH_READ_BYTES
# An error answer to a watch is one Status object (a few hundred bytes); more is not read.
WATCH_ERROR_BODY_BYTES: Final = 65_536
# A chunk-size line is a few hex digits; one this long without its CRLF is not HTTP.
CHUNK_SIZE_LINE_BYTES: Final = 1_024
# How often a watch is dialled for one call: once, and once more after a 401 made kr8s re-read the
# credentials (a second 401 is an answer: the new credentials are not valid either).
WATCH_DIAL_ATTEMPTS: Final = 2
# Sent on each watch request, so the API server's audit log tells these connections from kr8s's.
WATCH_USER_AGENT: Final = "cozystack-operators/shared.kube"
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


class ChunkedLines(Lines):
    """An HTTP/1.1 chunked body in (as read from the connection), its complete lines out.

    Each chunk is a hex size line, CRLF, that many bytes, CRLF; a zero-size chunk ends the body
    (``done``; what follows it, trailers, is not read). A size line, a chunk, or the CRLF after it may
    be split across reads anywhere. Chunk extensions (``;name=value`` after the size) are ignored."""

    __slots__ = ("_head", "_left", "done")

    def __init__(self) -> None:
        super().__init__()
        self._head = b""  # the start of a size line whose CRLF has not come yet
        self._left = 0  # bytes still to come of the current chunk: its data, then its 2-byte CRLF
        self.done = False  # the zero-size chunk came

    def feed(self, data: bytes) -> list[bytes]:
        if self.done:
            return []
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
                break
            left = size + 2
        self._left = left
        if not payload:
            return []
        return self._split(payload[0] if len(payload) == 1 else b"".join(payload))


def _chunk_size(line: bytes) -> int:
    digits = line.split(b";", 1)[0].strip()
    if not digits or digits.strip(b"0123456789abcdefABCDEF"):
        raise WatchStreamError(f"chunked body: {line[:40]!r} is not a chunk size")
    return int(digits, 16)


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
        status_line, *header_lines = head[:-4].split(b"\r\n")
        version, _, rest = status_line.partition(b" ")
        code, _, phrase = rest.partition(b" ")
        if not version.startswith(b"HTTP/1.") or not code.isdigit():
            raise WatchStreamError(f"watch: {status_line[:80]!r} is not an HTTP/1.1 status line")
        self.status, self.reason_phrase = int(code), phrase.decode("latin-1")
        for header in header_lines:
            name, _, value = header.partition(b":")
            self.headers[name.strip().lower()] = value.strip()

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
    """Plain-JSON verbs over one authenticated kr8s session (watches over connections of their own)."""

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
        # The watches' TLS context, for the credential files it was built from (kr8s writes new
        # files when it re-reads inline credentials); dropped whenever credentials are re-read.
        self._tls: tuple[tuple[str, str, str], ssl.SSLContext] | None = None

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
        if self.tracer is None:
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
        base, _, rest = path.lstrip("/").partition("/")
        kwargs: dict[str, Any] = {"params": dict(params or {}), "timeout": self.timeout}
        if body is not None:
            kwargs["content"] = json.dumps(body)
            kwargs["headers"] = {"Content-Type": content_type}
        call = self.api.call_api
        async with call(
            method, version="", base=f"/{base}", url=rest, raise_for_status=False, **kwargs
        ) as answer:
            status, phrase, content = answer.status_code, answer.reason_phrase, answer.content
        if status == UNAUTHORIZED:
            # kr8s's checking path: it re-reads the credentials, replaces its session and retries.
            self._tls = None
            try:
                async with call(method, version="", base=f"/{base}", url=rest, **kwargs) as answer:
                    status, phrase, content = answer.status_code, answer.reason_phrase, answer.content
            except kr8s.ServerError as error:
                raise _api_error(error) from None
        if not 200 <= status < 300:
            raise error_of(status, phrase, content)
        return json.loads(content) if content else {}

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

    async def count(self, path: str) -> int:
        """How many objects a LIST would return, read from one item and ``remainingItemCount``."""
        page = await self.list(path, limit=1)
        return len(page.get("items") or []) + int(page["metadata"].get("remainingItemCount") or 0)

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
            self._tls = None
            await auth.reauthenticate()
        try:
            async with contextlib.aclosing(connection.batches()) as batches:
                async for lines in batches:
                    yield lines
        finally:
            connection.close()

    async def _dial(self, auth: Any, path: str, params: Mapping[str, str], idle: float) -> _WatchConnection:
        """Connect (TCP, TLS with ALPN http/1.1) and send the watch request."""
        server = urlsplit(auth.server)
        tls = await self._tls_context(auth) if server.scheme == "https" else None
        host = server.hostname
        if not host:  # kr8s is re-reading the credentials this moment, or they name no server
            raise WatchStreamError(f"watch: no API server address in {auth.server!r}")
        port = server.port or (443 if tls is not None else 80)
        sni = (auth.tls_server_name or host) if tls is not None else None
        target = f"{server.path.rstrip('/')}{path}?{urlencode(params)}"
        head = [f"GET {target} HTTP/1.1", f"Host: {server.netloc.rpartition('@')[2]}"]
        head += ["Accept: application/json", f"User-Agent: {WATCH_USER_AGENT}", "Connection: close"]
        if auth.token:
            head.append(f"Authorization: Bearer {auth.token}")
        request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
        try:
            async with asyncio.timeout(self.timeout.connect):
                reader, writer = await asyncio.open_connection(
                    host, port, ssl=tls, server_hostname=sni, limit=WATCH_BUFFER_LIMIT
                )
        except TimeoutError:
            raise kr8s.APITimeoutError(f"watch: no connection to {auth.server} in time") from None
        except ssl.SSLCertVerificationError:
            self._tls = None  # built from credentials since replaced, perhaps: the next dial rebuilds
            raise
        connection = _WatchConnection(reader, writer, idle)
        writer.write(request)
        return connection

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
                        self._tls = None
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
