"""The client's own request path (kept HTTP/1.1 connections), without an API server.

* ``_PooledConnection.exchange`` on a fed stream: Content-Length, chunked (cut every way, trailers),
  connection-delimited and empty bodies, and when the connection may be kept.
* ``Kube.request`` over a scripted keep-alive HTTP/1.1 server on 127.0.0.1 (plain HTTP; TLS is the
  integration tests'): the request it sends, one connection reused, a kept connection found closed
  (a GET is sent once more on a new one, a write never), the pool's bound with waiters, the timeout,
  non-2xx answers, and a 401 taking kr8s's checking path once (a 403 never).

No test sleeps (but to let other tasks run): each waits on an event the scripted server sets,
under ``DEADLINE``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import kr8s
import pytest

from shared.kube import (
    NO_ANSWER,
    REQUEST_POOL_SIZE,
    ApiError,
    Kube,
    Resource,
    WatchStreamError,
    _PooledConnection,
    _Server,
)
from tests.unit.shared.test_kube_watch import FakeAuth, chunked, cut

CONFIGMAPS = Resource("v1", "configmaps")
DEADLINE = 5.0  # seconds any wait here may take; each is over in milliseconds
SHORT = 0.2  # a request's read timeout where a test lets it expire: real time, but short
SERVER = _Server("127.0.0.1", 1, None, None, "127.0.0.1:1", "")


def ok(body: bytes = b'{"kind":"ConfigMap"}', extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        len(body),
        extra,
        body,
    )


def status(code: int, reason: str, message: str = "") -> bytes:
    body = json.dumps({"kind": "Status", "code": code, "reason": reason, "message": message}).encode()
    return b"HTTP/1.1 %d %s\r\nContent-Length: %d\r\n\r\n%s" % (code, reason.encode(), len(body), body)


# --- the response parser ---------------------------------------------------------------------------


class FakeTransport:
    aborted = False

    def is_closing(self) -> bool:
        return self.aborted

    def abort(self) -> None:
        self.aborted = True


@dataclass
class FakeWriter:
    transport: FakeTransport = field(default_factory=FakeTransport)
    written: list[bytes] = field(default_factory=list)

    def write(self, data: bytes) -> None:
        self.written.append(data)


async def exchange(reads: list[bytes], eof: bool = False, method: str = "GET") -> tuple[Any, bool]:
    """The answer parsed from ``reads`` fed one by one while the parser waits, and whether the
    stream holds nothing after it."""
    reader = asyncio.StreamReader()
    connection = _PooledConnection(reader, FakeWriter(), SERVER, 0)  # type: ignore[arg-type]
    task = asyncio.create_task(connection.exchange(b"GET / HTTP/1.1\r\n\r\n", method))
    for data in reads:
        await asyncio.sleep(0)
        reader.feed_data(data)
    if eof:
        reader.feed_eof()
    async with asyncio.timeout(DEADLINE):
        answer = await task
    if not eof:
        reader.feed_eof()
    return answer, not await reader.read()


BODY = json.dumps({"kind": "ConfigMapList", "items": [{"data": {"k": "v" * 300}}] * 5}).encode()


@pytest.mark.parametrize(
    "reads",
    [
        pytest.param([chunked(BODY)], id="one-read"),
        pytest.param(cut(chunked(BODY, sizes=(7,)), [3, 100, 101, 555]), id="cut-anywhere"),
        pytest.param([bytes([b]) for b in chunked(BODY, sizes=(50, 3, 1000))], id="a-byte-per-read"),
        pytest.param([chunked(BODY)[:-2], b"\r", b"\n"], id="last-crlf-across-reads"),
        pytest.param([chunked(BODY)[:-2] + b"X-Trailer: 1\r\n\r\n"], id="trailer"),
        pytest.param([chunked(BODY)[:-2], b"X-Trai", b"ler: 1\r\n", b"\r\n"], id="trailer-across-reads"),
    ],
)
async def test_a_chunked_body_comes_out_whole_and_the_connection_is_kept(reads: list[bytes]) -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    answer, drained = await exchange([head, *reads])
    assert (answer.status, answer.phrase, answer.content, answer.keep) == (200, "OK", BODY, True)
    assert drained  # the next answer starts on a clean stream


@pytest.mark.parametrize("pieces", [1, 3, 40])
async def test_a_content_length_body_comes_out_whole(pieces: int) -> None:
    wire = ok(BODY)
    step = len(wire) // pieces + 1
    answer, drained = await exchange([wire[i : i + step] for i in range(0, len(wire), step)])
    assert (answer.status, answer.content, answer.keep) == (200, BODY, True)
    assert drained


@pytest.mark.parametrize(
    ("wire", "eof", "content", "keep"),
    [
        pytest.param(ok(extra=b"Connection: close\r\n"), False, b'{"kind":"ConfigMap"}', False, id="close"),
        pytest.param(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}", False, b"{}", False, id="http-1.0"),
        pytest.param(b"HTTP/1.1 200 OK\r\n\r\n{}", True, b"{}", False, id="delimited-by-the-end"),
        pytest.param(b"HTTP/1.1 204 No Content\r\n\r\n", False, b"", True, id="204"),
        pytest.param(b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"{}"), False, b"{}", True, id="interim-answer"),
    ],
)
async def test_when_the_connection_is_kept(wire: bytes, eof: bool, content: bytes, keep: bool) -> None:
    answer, _ = await exchange([wire], eof=eof)
    assert (answer.content, answer.keep) == (content, keep)


@pytest.mark.parametrize(
    ("wire", "complaint"),
    [
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}", "within a response body", id="short"
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{}",
            "before the last chunk",
            id="chunk",
        ),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Le", "within a response head", id="head"),
        pytest.param(b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1.1 status line", id="not-http"),
    ],
)
async def test_an_answer_cut_short_is_a_broken_connection(wire: bytes, complaint: str) -> None:
    with pytest.raises(WatchStreamError, match=complaint) as broken:  # httpx's, out of Kube.request
        await exchange([wire], eof=True)
    assert isinstance(broken.value, NO_ANSWER)


# --- a scripted keep-alive HTTP/1.1 server ----------------------------------------------------------

HANG = b""  # an answer never written: the server reads the request and waits until the client ends it
DROP = None  # the server reads the request and closes the connection without a byte of answer


@dataclass
class Seen:
    connection: int
    method: str
    target: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Server:
    """Each accepted connection takes the next script: the answers to its requests, in order; after
    the last, the connection is closed by the server (``close``) or kept until the client ends it."""

    scripts: deque[list[bytes | None]]
    close: bool = False
    release: asyncio.Event | None = None  # when set: answers wait for it
    seen: list[Seen] = field(default_factory=list)
    open_now: int = 0
    open_most: int = 0
    client_closed: asyncio.Event = field(default_factory=asyncio.Event)
    request_came: asyncio.Event = field(default_factory=asyncio.Event)
    connections: int = 0
    port: int = 0

    async def until_seen(self, count: int) -> None:
        while len(self.seen) < count:
            self.request_came.clear()
            await self.request_came.wait()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = self.connections
        self.connections += 1
        self.open_now += 1
        self.open_most = max(self.open_most, self.open_now)
        script = self.scripts.popleft() if self.scripts else []
        try:
            for answer in script:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, *lines = head.decode().split("\r\n")[:-2]
                method, target, _ = request_line.split(" ")
                headers = {}
                for line in lines:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.seen.append(Seen(index, method, target, headers, body))
                self.request_came.set()
                if answer is DROP:
                    break
                if answer == HANG:
                    await reader.read()  # until the client ends it
                    self.client_closed.set()
                    break
                if self.release is not None:
                    await self.release.wait()
                writer.write(answer)
                await writer.drain()
            else:
                if not self.close:
                    with contextlib.suppress(ConnectionError):
                        await reader.read()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open_now -= 1
            writer.close()


@contextlib.asynccontextmanager
async def serving(*scripts: list[bytes | None], close: bool = False) -> AsyncIterator[Server]:
    server = Server(deque(scripts), close=close)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    server.port = listener.sockets[0].getsockname()[1]
    async with listener:
        yield server


@dataclass
class CheckingApi:
    """kr8s's ``auth`` and a ``call_api`` answering from a script (the checking path after a 401)."""

    auth: FakeAuth
    answers: deque[httpx.Response] = field(default_factory=deque)
    calls: list[dict[str, Any]] = field(default_factory=list)

    @contextlib.asynccontextmanager
    async def call_api(self, method: str, **kwargs: Any) -> AsyncIterator[httpx.Response]:
        self.calls.append({"method": method, **kwargs})
        yield self.answers.popleft()


def kube_for(server: Server, timeout: httpx.Timeout | None = None) -> tuple[Kube, CheckingApi]:
    api = CheckingApi(FakeAuth(f"http://127.0.0.1:{server.port}"))
    return Kube(api, timeout=timeout), api  # type: ignore[arg-type]  # what Kube uses of kr8s's Api


# --- Kube.request over kept connections -------------------------------------------------------------


async def test_requests_share_one_kept_connection() -> None:
    async with serving([ok(b'{"n":1}'), ok(b'{"n":2}'), ok(b"{}")]) as server:
        kube, api = kube_for(server)
        async with asyncio.timeout(DEADLINE):
            assert await kube.get(CONFIGMAPS.path("ns", "a")) == {"n": 1}
            assert await kube.list(CONFIGMAPS.path("ns"), label_selector="app=x,tier!=db") == {"n": 2}
            await kube.patch(CONFIGMAPS.path("ns", "a"), {"data": {"k": "v"}}, "merge")
    assert server.connections == 1
    first, second, third = server.seen
    assert (first.method, first.target) == ("GET", "/api/v1/namespaces/ns/configmaps/a")
    assert second.target == "/api/v1/namespaces/ns/configmaps?labelSelector=app%3Dx%2Ctier%21%3Ddb"
    assert first.headers["connection"] == "keep-alive"
    assert first.headers["authorization"] == "Bearer first"
    assert "accept-encoding" not in first.headers  # no gzip
    assert "content-length" not in first.headers
    assert (third.method, third.headers["content-type"]) == ("PATCH", "application/merge-patch+json")
    assert json.loads(third.body) == {"data": {"k": "v"}}
    assert api.calls == []  # nothing went through kr8s's session


async def test_a_connection_the_server_closed_while_idle_is_not_used() -> None:
    async with serving([ok()], [ok()], close=True) as server:
        kube, _ = kube_for(server)
        async with asyncio.timeout(DEADLINE):
            await kube.get(CONFIGMAPS.path("ns", "a"))
            assert kube._pool is not None
            (kept,) = kube._pool.idle
            assert await kept.reader.read() == b""  # the server's close has reached the client
            await kube.create(CONFIGMAPS.path("ns"), {"kind": "ConfigMap"})
    assert [(s.connection, s.method) for s in server.seen] == [(0, "GET"), (1, "POST")]


async def test_a_get_on_a_kept_connection_found_dead_is_sent_once_more() -> None:
    async with serving([ok(), DROP], [ok(b'{"again":true}')]) as server:
        kube, _ = kube_for(server)
        async with asyncio.timeout(DEADLINE):
            await kube.get(CONFIGMAPS.path("ns", "a"))
            assert await kube.get(CONFIGMAPS.path("ns", "a")) == {"again": True}
    assert [(s.connection, s.method) for s in server.seen] == [(0, "GET"), (0, "GET"), (1, "GET")]


@pytest.mark.parametrize("method", ["POST", "PATCH", "DELETE"])
async def test_a_write_on_a_kept_connection_found_dead_is_never_sent_again(method: str) -> None:
    async with serving([ok(), DROP], [ok()]) as server:
        kube, _ = kube_for(server)
        async with asyncio.timeout(DEADLINE):
            await kube.get(CONFIGMAPS.path("ns", "a"))
            with pytest.raises(httpx.TransportError) as broken:
                await kube.request(method, CONFIGMAPS.path("ns", "a"), body={"kind": "ConfigMap"})
    assert isinstance(broken.value, NO_ANSWER)  # the caller decides, as after any lost connection
    assert [s.method for s in server.seen] == ["GET", method]
    assert server.connections == 1


async def test_a_get_on_a_new_connection_that_dies_is_not_sent_again() -> None:
    async with serving([DROP], [ok()]) as server:
        kube, _ = kube_for(server)
        with pytest.raises(httpx.TransportError):
            async with asyncio.timeout(DEADLINE):
                await kube.get(CONFIGMAPS.path("ns", "a"))
    assert len(server.seen) == 1


async def test_a_refused_connection_is_httpx_transport_error_as_through_kr8s() -> None:
    async with serving() as server:
        port = server.port
    kube, _ = kube_for(server)
    server.port = port
    with pytest.raises(httpx.ConnectError):
        async with asyncio.timeout(DEADLINE):
            await kube.get(CONFIGMAPS.path("ns", "a"))


async def test_the_pool_bounds_connections_and_the_rest_wait() -> None:
    many = REQUEST_POOL_SIZE + 8
    scripts: list[list[bytes | None]] = [[ok(b'{"i":%d}' % i)] * many for i in range(many)]
    async with serving(*scripts) as server:
        server.release = asyncio.Event()
        kube, _ = kube_for(server)
        async with asyncio.timeout(DEADLINE):
            gets = [asyncio.create_task(kube.get(CONFIGMAPS.path("ns", f"c{i}"))) for i in range(many)]
            await server.until_seen(REQUEST_POOL_SIZE)
            for _ in range(5):
                await asyncio.sleep(0)
            assert len(server.seen) == REQUEST_POOL_SIZE  # the rest wait for a connection
            server.release.set()
            answers = await asyncio.gather(*gets)
    assert len(answers) == many
    assert server.connections == REQUEST_POOL_SIZE
    assert server.open_most == REQUEST_POOL_SIZE


async def test_a_request_unanswered_in_time_times_out_and_its_connection_is_closed() -> None:
    async with serving([HANG], [ok(b'{"after":true}')]) as server:
        kube, _ = kube_for(server, timeout=httpx.Timeout(SHORT, connect=DEADLINE))
        async with asyncio.timeout(DEADLINE):
            with pytest.raises(kr8s.APITimeoutError):
                await kube.get(CONFIGMAPS.path("ns", "a"))
            await server.client_closed.wait()
            assert await kube.get(CONFIGMAPS.path("ns", "a")) == {"after": True}  # its slot came back


async def test_cancelling_a_request_closes_its_connection() -> None:
    async with serving([HANG]) as server:
        kube, _ = kube_for(server)
        async with asyncio.timeout(DEADLINE):
            task = asyncio.create_task(kube.get(CONFIGMAPS.path("ns", "a")))
            await server.until_seen(1)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await server.client_closed.wait()


@pytest.mark.parametrize(
    ("wire", "code", "reason", "message"),
    [
        pytest.param(status(409, "Conflict", "changed"), 409, "Conflict", "changed", id="409"),
        pytest.param(status(404, "NotFound", "gone"), 404, "NotFound", "gone", id="404"),
        pytest.param(
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 13\r\n\r\nupstream down",
            503,
            "",
            "upstream down",
            id="503-text",
        ),
    ],
)
async def test_error_answers_become_api_errors(wire: bytes, code: int, reason: str, message: str) -> None:
    async with serving([wire, ok()]) as server:
        kube, _ = kube_for(server)
        async with asyncio.timeout(DEADLINE):
            with pytest.raises(ApiError) as failed:
                await kube.patch(CONFIGMAPS.path("ns", "a"), [], "json")
            await kube.get(CONFIGMAPS.path("ns", "a"))  # the connection stays usable after an error
    assert (failed.value.status, failed.value.reason, failed.value.message) == (code, reason, message)
    assert server.connections == 1


async def test_a_401_takes_kr8s_checking_path_once_and_a_403_never() -> None:
    unauthorized, forbidden = status(401, "Unauthorized"), status(403, "Forbidden", "no")
    async with serving([unauthorized], [forbidden]) as server:
        kube, api = kube_for(server)
        api.answers.append(httpx.Response(200, json={"kind": "ConfigMap", "via": "kr8s"}))
        async with asyncio.timeout(DEADLINE):
            assert await kube.get(CONFIGMAPS.path("ns", "a")) == {"kind": "ConfigMap", "via": "kr8s"}
            with pytest.raises(ApiError) as refused:
                await kube.get(CONFIGMAPS.path("ns", "b"))
    assert refused.value.status == 403
    assert len(api.calls) == 1
    assert "raise_for_status" not in api.calls[0]  # kr8s's default: it re-reads the credentials
    assert server.connections == 2  # the re-read made the kept connection stale
