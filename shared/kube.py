"""A thin async Kubernetes client speaking plain JSON over aiohttp, for both operators and their tests.

Decides: how a resource maps to its URL path, which HTTP status means what (404 is "absent", not an
error; 409 is a conflict the caller decides about; every non-2xx becomes an ``ApiError`` here), and
the content type of each kind of patch.

Decides how a call is sent: through aiohttp (its C parser reads every answer; no HTTP is parsed
here), with the credentials ``shared.credentials`` loaded (server URL, TLS context, bearer token,
``tls-server-name``, a kubeconfig's ``proxy-url``, which aiohttp speaks as an HTTP proxy).
Requests share one pool of kept-alive connections (at most ``REQUEST_POOL_SIZE`` open; a request
beyond it waits for one, under its timeout); watches have a pool of their own, so a long watch
never holds a request's connection. No compression is asked for
(the answers come from a server one hop away, and decompressing costs more CPU than it saves).
Environment proxy variables are not read (kubectl's kubeconfig is the one source). A request on a
kept connection the server closed before answering is sent once more on a new one by aiohttp when
its method is idempotent (RFC 9112: GET, PUT, DELETE; a PUT carries its resourceVersion and a
DELETE its preconditions, so a second one that arrives is refused, not applied twice); never a POST
or PATCH: whether the server acted on it is unknown, the caller decides.

Decides how long a call may take: every request has a total timeout (the instance's ``Timeout``:
``read`` for the whole call, waiting for a pooled connection included, ``connect`` for a dial); a
watch has a connect timeout and an idle bound (the longest the stream may stay silent) apart from
the server-side ``timeoutSeconds``. A call that gets no answer raises one of ``NO_ANSWER``:
``ApiTimeoutError`` for any timeout, aiohttp's ``ClientError`` (or an ``OSError``) for a refused or
broken connection.

Decides how dead connections are found: every socket has TCP keepalive probes after
``TCP_KEEPALIVE_IDLE_SECONDS`` of silence and a ``TCP_USER_TIMEOUT`` (Linux), so a peer that vanished
without a RST is noticed by the kernel in seconds, not hours; and because a peer that is there but
forwards nothing (a proxy or load balancer that lost its flows: the fault proxy's model) answers
keepalive probes, every call has its own application-level bound too. Whenever a call times out
(or is cancelled waiting for its answer: a caller's deadline), the pools are retired: new calls
dial afresh, and calls in flight on the old ones finish or time out before those connections close.
A connection that carried nothing for that long makes every connection of its time suspect, and
the next call (a lease renewal, the re-list after a dead watch) must not wait out its timeout on
one of them. A watch silent past its idle bound retires them at once: the server ends every watch
on time, so that watch's connection died without a word, and calls in flight on connections of
its time fail now (as after a reset) instead of at their timeouts.

Decides who re-authenticates, and when: a **401** (the credentials are not, or no longer, valid: an
expired token, an exec plugin's new one) has them loaded again (once for calls that failed
together) and the call is sent once more; the pools are retired, since the TLS
client certificate may have changed. A write answered 401 is safe to send again: authentication
precedes everything else the server does with it. A **403** is a refusal (RBAC) with valid
credentials: raised at once, it resets nothing (no pool, no watch). A **429** (API priority and
fairness, or "storage is (re)initializing" right after a CRD is installed) is sent again after the
``Retry-After`` the server names (capped at ``RETRY_AFTER_MAX_SECONDS``), up to
``THROTTLED_RETRIES`` times; any verb, since a 429 means the server did not act on the call. The
last 429 is raised with its ``retry_after``, for the caller's own backoff.

Decides how JSON is read: by ``orjson`` (``decode``), 2-3x faster than ``json.loads`` on the objects
an operator reads most (a Pod, 1.5 KB: 7-11 us against 22-24 us; decoding was 27-30 % of the GPUClass
operator's CPU under churn), with ``json.loads`` as the fallback for the JSON orjson refuses (a lone
surrogate escape in a string, a number beyond a double's range), so every document ``json.loads``
reads is read. One difference is left, on purpose: orjson reads an integer beyond 64 bits as a
float, which the API server never sends (it keeps the numbers of free-form fields as int64 or
float64). Bodies are written by ``json.dumps``.

Does not: cache, retry (but the one 401 retry, the 429 retries and aiohttp's one resend on a kept
connection found closed), or interpret objects; load credentials (``shared.credentials`` does);
follow redirects, or speak HTTP/2 (aiohttp has none; the API server answers HTTP/1.1).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import ssl
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal
from urllib.parse import urlencode

import aiohttp
import orjson
from opentelemetry import trace
from yarl import URL

from shared.credentials import Credentials, CredentialSource
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


@dataclass(frozen=True, slots=True)
class Timeout:
    """How long a call may take: ``read`` for a whole request (a watch has its idle bound instead),
    ``connect`` for a dial (TCP and TLS)."""

    read: float = DEFAULT_READ_TIMEOUT_SECONDS
    connect: float = DEFAULT_CONNECT_TIMEOUT_SECONDS


DEFAULT_TIMEOUT: Final = Timeout()
# A watch may stay silent for its whole timeoutSeconds: the server closes it then, so this much more
# is a dead connection, not a quiet one (the informers' idle bound too).
WATCH_IDLE_GRACE_SECONDS: Final = 3.0
# How much aiohttp buffers of one answer before it stops reading the socket: a burst of watch events
# (or a LIST page's next few hundred kilobytes) costs one read, not one per event.
READ_BUFFER_BYTES: Final = 262_144
# Requests in flight (and connections kept) at once: the operators' workers and informers LIST and
# write a few at a time, and the API server's per-client fairness gains nothing from more; a burst
# beyond this waits for a connection rather than opening more.
REQUEST_POOL_SIZE: Final = 16
# An error answer to a watch is one Status object (a few hundred bytes); more is not read.
WATCH_ERROR_BODY_BYTES: Final = 65_536
# How often a call is sent after a 401: once more, after the credentials were loaded again (a second
# 401 is an answer: the new credentials are not valid either).
UNAUTHORIZED: Final = 401
# A 429 is sent again this many times (client-go: up to 10) before it is the caller's.
THROTTLED: Final = 429
THROTTLED_RETRIES: Final = 3
# The pause before sending a 429'd call again when the answer names none (or names no seconds).
RETRY_AFTER_DEFAULT_SECONDS: Final = 1.0
# The longest pause a Retry-After gets here: a server asking for more is down for longer than one
# call should wait; the caller's backoff takes it from there.
RETRY_AFTER_MAX_SECONDS: Final = 10.0
# Sent on each request, so the API server's audit log tells this client's calls from others'.
USER_AGENT: Final = "cozystack-operators/shared.kube"
# An error answer that is not a Status object (a proxy's HTML page, say) is quoted up to this much.
ERROR_TEXT_CHARS: Final = 500
# TCP keepalive on every connection: the first probe after this much silence, then one every
# interval, and the connection is dropped after that many unanswered (5 + 2 x 3 = 11 s).
TCP_KEEPALIVE_IDLE_SECONDS: Final = 5
TCP_KEEPALIVE_INTERVAL_SECONDS: Final = 2
TCP_KEEPALIVE_PROBES: Final = 3
# Linux: data sent and not acknowledged for this long drops the connection (a request written into
# a dead network fails in seconds, not after the kernel's ~15 minutes of retransmissions).
TCP_USER_TIMEOUT_MS: Final = 10_000
# A retired pool is closed this much after its retirement: calls in flight on it finish meanwhile
# (or time out: no request outlives its read timeout, which this must exceed).
RETIRED_POOL_GRACE_SECONDS: Final = DEFAULT_READ_TIMEOUT_SECONDS * 2


class ApiTimeoutError(Exception):
    """No answer (or no data on a watch) within the call's bound."""


class ApiError(Exception):
    """A non-2xx answer from the API server, with its HTTP status and the Status object's reason;
    ``retry_after``: the seconds its Retry-After header named (a 429's, a 503's), if any."""

    def __init__(self, status: int, reason: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after

    @property
    def transient(self) -> bool:
        """Worth retrying: throttled, timed out or a server-side failure; never a refusal."""
        return self.status in (429, 504) or self.status >= 500


# What a call that got no answer raises (see the module docstring). ``OSError`` covers a refused or
# reset connection aiohttp did not wrap, and ``TimeoutError``, a caller's own deadline around a call.
NO_ANSWER: Final = (aiohttp.ClientError, ApiTimeoutError, OSError)


def decode(data: bytes) -> Any:
    """A JSON document as Python values: orjson's, or ``json.loads``'s for what orjson refuses (see
    the module docstring); invalid JSON raises ``ValueError`` either way."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


class Lines:
    """Bytes of a stream in, complete lines out, split on the newline byte only.

    Not with a text decoder's line splitting: that splits on every Unicode line boundary, U+0085
    included, which a JSON string may carry unescaped; and bytes go to ``decode`` as they are.
    A line may come in any number of pieces; its start is kept (unjoined) until its end comes."""

    __slots__ = ("_start",)

    def __init__(self) -> None:
        self._start: list[bytes] = []  # the pieces of a line not yet ended

    def feed(self, payload: bytes) -> list[bytes]:
        """The lines ``payload`` ends (empty ones included; the caller skips them)."""
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

    def rest(self) -> bytes:
        """What came after the last newline: a last line the stream did not end."""
        rest = b"".join(self._start)
        self._start.clear()
        return rest


def retry_after_seconds(header: str | None) -> float | None:
    """A Retry-After header's delay in seconds, capped (None: no header, or not a number of seconds,
    as the API server always sends it)."""
    if header is None:
        return None
    try:
        seconds = float(header.strip())
    except ValueError:
        return None
    if seconds != seconds or seconds < 0:  # NaN, or negative: not a delay
        return None
    return min(seconds, RETRY_AFTER_MAX_SECONDS)


def keepalive_socket(addr_info: tuple[Any, ...]) -> socket.socket:
    """A socket for aiohttp to connect (its ``socket_factory``): TCP keepalive probes and a user
    timeout, so the kernel drops a connection to a vanished peer in seconds."""
    family, kind, proto = addr_info[0], addr_info[1], addr_info[2]
    sock = socket.socket(family=family, type=kind, proto=proto)
    if family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in (
            ("TCP_KEEPIDLE", TCP_KEEPALIVE_IDLE_SECONDS),
            ("TCP_KEEPINTVL", TCP_KEEPALIVE_INTERVAL_SECONDS),
            ("TCP_KEEPCNT", TCP_KEEPALIVE_PROBES),
            ("TCP_USER_TIMEOUT", TCP_USER_TIMEOUT_MS),
        ):
            if hasattr(socket, option):  # Linux has them all; other systems keep their defaults
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
    return sock


class _Pools:
    """The two aiohttp sessions of one event loop and one set of credentials: requests' (bounded)
    and watches' (one connection per open watch, kept between watches)."""

    __slots__ = ("loop", "requests", "streams", "watches")

    def __init__(self, loop: asyncio.AbstractEventLoop, tls: ssl.SSLContext | bool) -> None:
        self.loop = loop  # sessions belong to one event loop: another loop gets pools of its own
        self.requests = self._session(tls, REQUEST_POOL_SIZE)
        self.watches = self._session(tls, 0)
        # The watches streaming now: closing a session does not wake a reader of a streamed body
        # (aiohttp detaches the body before the connection's end reaches it), so ``close`` does.
        self.streams: set[aiohttp.ClientResponse] = set()

    @staticmethod
    def _session(tls: ssl.SSLContext | bool, limit: int) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            ssl=tls, limit=limit, socket_factory=keepalive_socket, enable_cleanup_closed=True
        )
        return aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("Accept-Encoding",),
            read_bufsize=READ_BUFFER_BYTES,
            trust_env=False,
        )

    async def close(self) -> None:
        for stream in list(self.streams):
            stream.content.set_exception(aiohttp.ClientConnectionError("the client's pools were closed"))
        await asyncio.gather(self.requests.close(), self.watches.close(), return_exceptions=True)


def watch_params(
    resource_version: str, label_selector: str, field_selector: str, timeout_seconds: int
) -> dict[str, str]:
    """The query of one watch request: bookmarks on, the server's timeout, and what is given."""
    params = {"watch": "true", "timeoutSeconds": str(timeout_seconds), "allowWatchBookmarks": "true"}
    for name, value in (
        ("resourceVersion", resource_version),
        ("labelSelector", label_selector),
        ("fieldSelector", field_selector),
    ):
        if value:
            params[name] = value
    return params


class Kube:
    """Plain-JSON verbs with in-memory credentials, over aiohttp (see the module docstring)."""

    def __init__(
        self,
        credentials: Credentials,
        tracer: trace.Tracer | None = None,
        *,
        reload: Callable[[], Awaitable[Credentials]] | None = None,
        timeout: Timeout | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.credentials = credentials
        self.kubeconfig: str | None = None  # the file it was connected from, if one was named
        self.reload = reload or CredentialSource().load  # after a 401: the credentials loaded again
        # Every write becomes a child span of the current pass and marks that pass "changed".
        self.tracer = tracer
        self.timeout = timeout or DEFAULT_TIMEOUT
        self._sleep = sleep  # the pause a 429's Retry-After asks for
        self._pools: _Pools | None = None  # made on the first call
        self._retired: dict[asyncio.Task[None], _Pools] = {}  # pools closing after their grace
        # Which credentials are in use: a 401 re-reads them once for every call that had them.
        self._generation = 0
        self._reauthenticating: asyncio.Lock | None = None

    @classmethod
    async def connect(
        cls,
        kubeconfig: str | None = None,
        *,
        timeout: Timeout | None = None,  # noqa: ASYNC109 - every request's, not this call's
    ) -> Kube:
        """From a kubeconfig path, or (None) the usual chain: $KUBECONFIG, ~/.kube/config, in-cluster."""
        source = CredentialSource(kubeconfig)
        kube = cls(await source.load(), reload=source.load, timeout=timeout)
        kube.kubeconfig = kubeconfig or os.environ.get("KUBECONFIG")
        return kube

    def with_own_connections(self) -> Kube:
        """A client with the same credentials and timeouts but pools of its own (and no tracer):
        for traffic that must never queue behind the rest for a connection (lease renewals)."""
        return Kube(self.credentials, reload=self.reload, timeout=self.timeout, sleep=self._sleep)

    async def close(self) -> None:
        """Close every connection (a process that ends need not: its sockets go with it)."""
        pools, self._pools = self._pools, None
        if pools is not None:
            await pools.close()
        retired = dict(self._retired)
        for task in retired:
            task.cancel()  # their grace is over: closed now
        await asyncio.gather(*retired, return_exceptions=True)
        await asyncio.gather(*(old.close() for old in retired.values()), return_exceptions=True)

    # --- the verbs -------------------------------------------------------------------------------

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
        resource_version_match: str = "",
    ) -> Obj:
        """One LIST (page): ``limit`` and ``continue_`` page it (the answer's ``metadata.continue``
        names the next page); ``resource_version`` and ``resource_version_match`` as the API
        defines them ("" = a consistent read; "NotOlderThan" with a version: any state at least
        that new, which the API server serves from its watch cache)."""
        params = {
            k: v
            for k, v in (
                ("labelSelector", label_selector),
                ("fieldSelector", field_selector),
                ("continue", continue_),
                ("resourceVersion", resource_version),
                ("resourceVersionMatch", resource_version_match),
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
        ours: the longest the stream may stay silent (default: the server's timeout plus a grace),
        after which ``ApiTimeoutError`` is raised. A non-200 answer raises ``ApiError`` (410
        Gone included); an ERROR event is yielded like any other."""
        params = watch_params(resource_version, label_selector, field_selector, timeout_seconds)
        idle = idle_timeout if idle_timeout is not None else timeout_seconds + WATCH_IDLE_GRACE_SECONDS
        timeout = aiohttp.ClientTimeout(sock_connect=self.timeout.connect, sock_read=idle)
        response = await self._answer("GET", path, params, None, "", timeout, watch=True)
        streams = self._pools.streams if self._pools is not None else set()
        streams.add(response)
        clean = False
        try:
            if response.status != 200:
                body = await self._timed(response.content.read(WATCH_ERROR_BODY_BYTES), path)
                raise error_of(response.status, response.reason or "", body, _retry_after(response))
            lines, loads, read = Lines(), decode, response.content.readany
            while True:
                data = await self._timed(read(), path, idle)
                if not data:
                    break
                for line in lines.feed(data):
                    if line:
                        event = loads(line)
                        yield event["type"], event["object"]
            clean = True
            last = lines.rest()
            if last.strip():
                event = loads(last)
                yield event["type"], event["object"]
        finally:
            streams.discard(response)
            if clean:
                response.release()  # read to its end: the connection carries the next watch
            else:
                response.close()  # at once: a cancelled watch must not wait on the peer

    # --- the machinery ---------------------------------------------------------------------------

    async def _send(
        self, method: str, path: str, body: Any, params: Mapping[str, str] | None, content_type: str
    ) -> Obj:
        payload = None if body is None else json.dumps(body).encode()
        timeout = aiohttp.ClientTimeout(total=self.timeout.read, sock_connect=self.timeout.connect)
        response = await self._answer(method, path, params, payload, content_type, timeout)
        try:
            content = await self._timed(response.read(), path)
        finally:
            response.release()
        if not 200 <= response.status < 300:
            raise error_of(response.status, response.reason or "", content, _retry_after(response))
        return decode(content) if content else {}

    async def _answer(
        self,
        method: str,
        path: str,
        params: Mapping[str, str] | None,
        payload: bytes | None,
        content_type: str,
        timing: aiohttp.ClientTimeout,
        *,
        watch: bool = False,
    ) -> aiohttp.ClientResponse:
        """The answer's head: after one re-read of the credentials on a 401 and up to
        ``THROTTLED_RETRIES`` pauses on a 429 (see the module docstring). Its body is the caller's."""
        reauthenticated, throttled = False, 0
        target = f"{path}?{urlencode(params)}" if params else path
        while True:
            generation = self._generation
            response = await self._dial(method, target, payload, content_type, timing, watch)
            status = response.status
            if status == UNAUTHORIZED and not reauthenticated:
                reauthenticated = True
            elif status == THROTTLED and throttled < THROTTLED_RETRIES:
                throttled += 1
            else:
                return response
            delay = _retry_after(response) if status == THROTTLED else None
            with contextlib.suppress(*NO_ANSWER):
                await self._timed(response.read(), path)  # a Status object: the connection is kept
            response.release()
            if status == UNAUTHORIZED:
                await self._reauthenticate(generation)
            else:
                await self._sleep(RETRY_AFTER_DEFAULT_SECONDS if delay is None else delay)

    async def _dial(
        self,
        method: str,
        target: str,
        payload: bytes | None,
        content_type: str,
        timing: aiohttp.ClientTimeout,
        watch: bool,
    ) -> aiohttp.ClientResponse:
        auth = self.credentials
        pools = self._pools_now(auth)
        session = pools.watches if watch else pools.requests
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if auth.token:
            headers["Authorization"] = f"Bearer {auth.token}"
        if payload is not None:
            headers["Content-Type"] = content_type
        url = URL(f"{str(auth.server).rstrip('/')}{target}", encoded=True)
        if not url.host:  # the credentials name no server
            raise aiohttp.InvalidURL(f"no API server address in {auth.server!r}")
        try:
            return await session.request(
                method,
                url,
                data=payload,
                headers=headers,
                timeout=timing,
                allow_redirects=False,
                proxy=auth.proxy or None,
                server_hostname=auth.tls_server_name or None,
            )
        except TimeoutError:
            self._retire()
            raise ApiTimeoutError(f"no answer to {method} {_path_of(target)} in time") from None
        except asyncio.CancelledError:
            self._retire()  # a caller's deadline, most likely: what it waited on is suspect too
            raise
        except aiohttp.ClientConnectorCertificateError:
            self._retire()  # built from credentials since replaced, perhaps: rebuild
            raise

    async def _timed(self, reading: Awaitable[bytes], path: str, idle: float | None = None) -> bytes:
        """One read of an answer's body, its timeout as ``ApiTimeoutError``."""
        try:
            return await reading
        except TimeoutError:
            if idle is not None:
                # The server ends every watch in time: this one's connection died without a word,
                # and so, most likely, did every connection of its time; calls waiting on them fail
                # now instead of at their timeouts.
                self._retire(at_once=True)
                raise ApiTimeoutError(f"no data on the watch of {path} for {idle:g}s") from None
            self._retire()
            raise ApiTimeoutError(f"no answer from {path} in time") from None

    def _pools_now(self, auth: Credentials) -> _Pools:
        loop = asyncio.get_running_loop()
        pools = self._pools
        if pools is None or pools.loop is not loop:
            tls: ssl.SSLContext | bool = auth.tls or False
            if self._pools is not None and self._pools.loop is not loop:
                self._pools = None  # another loop's (a test's, a script's): left to it
            if self._pools is None:
                self._pools = _Pools(loop, tls)
            pools = self._pools
        return pools

    def _retire(self, *, at_once: bool = False) -> None:
        """New calls dial afresh; the retired pools close once calls in flight on them are done (or
        ``at_once``: those calls fail now, as after a broken connection)."""
        pools, self._pools = self._pools, None
        if pools is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if pools.loop is not loop:
            return

        async def close_later() -> None:
            if not at_once:
                await asyncio.sleep(max(RETIRED_POOL_GRACE_SECONDS, self.timeout.read * 2))
            await pools.close()

        task = loop.create_task(close_later())
        self._retired[task] = pools
        task.add_done_callback(self._retired.pop)

    async def _reauthenticate(self, generation: int) -> None:
        """The credentials loaded again, once for every call that was answered 401 with them."""
        if self._reauthenticating is None:
            self._reauthenticating = asyncio.Lock()
        async with self._reauthenticating:
            if self._generation != generation:
                return  # another call re-read them meanwhile
            self.credentials = await self.reload()
            self._generation += 1
            self._retire()  # the TLS client certificate may be another one now


def _retry_after(response: aiohttp.ClientResponse) -> float | None:
    return retry_after_seconds(response.headers.get("Retry-After"))


def _path_of(target: str) -> str:
    return target.partition("?")[0]


def _resource_of(path: str) -> str:
    """The resource (and subresource) a path names, for a span name without object names in it."""
    parts = path.strip("/").split("/")
    parts = parts[2:] if parts[0] == "api" else parts[3:]  # drop /api/v1 or /apis/<group>/<version>
    if len(parts) >= 2 and parts[0] == "namespaces" and len(parts) > 2:
        parts = parts[2:]
    return "/".join(parts[:1] + parts[2:3])


def error_of(status: int, phrase: str, body: bytes, retry_after: float | None = None) -> ApiError:
    """A non-2xx answer as an ``ApiError``: from its Status object, or (a proxy's page, say) its text."""
    try:
        parsed = decode(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and parsed.get("kind") == "Status":
        reason, message = str(parsed.get("reason") or ""), str(parsed.get("message") or phrase)
        return ApiError(status, reason, message, retry_after)
    text = body.decode("utf-8", "replace").strip()[:ERROR_TEXT_CHARS]
    return ApiError(status, "", text or phrase, retry_after)
