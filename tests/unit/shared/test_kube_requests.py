"""The client's requests over aiohttp, against a scripted keep-alive HTTP/1.1 server on 127.0.0.1.

* The request it sends and one connection reused; a connection found closed before any answer (a
  GET is sent once more on a new one, once at most; a POST or PATCH never); the pool's bound with
  waiters; the timeout (which retires the pools) and cancellation closing the connection.
* Non-2xx answers: ``ApiError`` from the Status object or the text, 404 as absence, a 401 re-reading
  the credentials once (once for calls that failed together; a 403 never), a 429 sent again after
  its Retry-After (``retry_after_seconds``, table), the last one raised with it.
* ``keepalive_socket``: the TCP options every connection gets.

No test sleeps (but to let other tasks run): each waits on an event the scripted server sets,
under ``DEADLINE``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from shared.kube import (
    NO_ANSWER,
    REQUEST_POOL_SIZE,
    RETRY_AFTER_MAX_SECONDS,
    TCP_KEEPALIVE_IDLE_SECONDS,
    TCP_USER_TIMEOUT_MS,
    THROTTLED_RETRIES,
    ApiError,
    ApiTimeoutError,
    Kube,
    Timeout,
    keepalive_socket,
    retry_after_seconds,
)
from shared.resources import CONFIGMAPS
from tests.unit.shared.test_kube_watch import (
    FakeAuth,
    Sleeps,
    chunked,
    read_request_head,
    status_wire,
)

DEADLINE = 5.0  # seconds any wait here may take; each is over in milliseconds
SHORT = 0.2  # a request's read timeout where a test lets it expire: real time, but short


def ok(body: bytes = b'{"kind":"ConfigMap"}', extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        len(body),
        extra,
        body,
    )


def status(code: int, reason: str, message: str = "", extra: str = "") -> bytes:
    return status_wire(code, reason, message, extra)


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
                method, target, headers = await read_request_head(reader)
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


@contextlib.asynccontextmanager
async def client(
    server: Server, timeout: Timeout | None = None, sleeps: Sleeps | None = None
) -> AsyncIterator[tuple[Kube, FakeAuth]]:
    auth = FakeAuth(f"http://127.0.0.1:{server.port}")
    kube = auth.kube(timeout=timeout, sleep=sleeps or Sleeps())
    try:
        async with asyncio.timeout(DEADLINE):
            yield kube, auth
    finally:
        await kube.close()


# --- requests over kept connections -----------------------------------------------------------------


async def test_requests_share_one_kept_connection() -> None:
    async with serving([ok(b'{"n":1}'), ok(b'{"n":2}'), ok(b"{}")]) as server:  # noqa: SIM117 - the server outlives the client
        async with client(server) as (kube, _):
            assert await kube.get(CONFIGMAPS.path("ns", "a")) == {"n": 1}
            assert await kube.list(CONFIGMAPS.path("ns"), label_selector="app=x,tier!=db") == {"n": 2}
            await kube.patch(CONFIGMAPS.path("ns", "a"), {"data": {"k": "v"}}, "merge")
    assert server.connections == 1
    first, second, third = server.seen
    assert (first.method, first.target) == ("GET", "/api/v1/namespaces/ns/configmaps/a")
    assert second.target == "/api/v1/namespaces/ns/configmaps?labelSelector=app%3Dx%2Ctier%21%3Ddb"
    assert first.headers["authorization"] == "Bearer first"
    assert first.headers["accept"] == "application/json"
    assert "accept-encoding" not in first.headers  # no gzip
    assert (third.method, third.headers["content-type"]) == ("PATCH", "application/merge-patch+json")
    assert json.loads(third.body) == {"data": {"k": "v"}}


async def test_list_asks_for_what_it_is_given() -> None:
    async with serving([ok(b"{}")]) as server, client(server) as (kube, _):
        await kube.list(
            "/api/v1/pods",
            limit=2,
            continue_="t",
            resource_version="7",
            resource_version_match="NotOlderThan",
        )
    assert server.seen[0].target == (
        "/api/v1/pods?continue=t&resourceVersion=7&resourceVersionMatch=NotOlderThan&limit=2"
    )


def kept_connected(kube: Kube) -> bool:
    """Whether a kept connection of the requests' pool is still connected (aiohttp's own view)."""
    assert kube._pools is not None
    kept = kube._pools.requests.connector._conns.values()  # type: ignore[union-attr]
    return any(protocol.is_connected() for conns in kept for protocol, _ in conns)


async def test_a_connection_the_server_closed_while_idle_is_not_used() -> None:
    async with serving([ok()], [ok()], close=True) as server, client(server) as (kube, _):
        await kube.get(CONFIGMAPS.path("ns", "a"))
        while kept_connected(kube):  # the server's close has reached the client...  # noqa: ASYNC110
            await asyncio.sleep(0)  # (aiohttp's view of it has no event to wait on)
        await kube.create(CONFIGMAPS.path("ns"), {"kind": "ConfigMap"})  # ...and a POST is not lost
    assert [(s.connection, s.method) for s in server.seen] == [(0, "GET"), (1, "POST")]


async def test_a_get_on_a_kept_connection_found_dead_is_sent_once_more() -> None:
    async with serving([ok(), DROP], [ok(b'{"again":true}')]) as server, client(server) as (kube, _):
        await kube.get(CONFIGMAPS.path("ns", "a"))
        assert await kube.get(CONFIGMAPS.path("ns", "a")) == {"again": True}
    assert [(s.connection, s.method) for s in server.seen] == [(0, "GET"), (0, "GET"), (1, "GET")]


@pytest.mark.parametrize("method", ["POST", "PATCH"])
async def test_a_write_on_a_kept_connection_found_dead_is_never_sent_again(method: str) -> None:
    async with serving([ok(), DROP], [ok()]) as server, client(server) as (kube, _):
        await kube.get(CONFIGMAPS.path("ns", "a"))
        with pytest.raises(NO_ANSWER):  # the caller decides, as after any lost connection
            await kube.request(method, CONFIGMAPS.path("ns", "a"), body={"kind": "ConfigMap"})
    assert [s.method for s in server.seen] == ["GET", method]
    assert server.connections == 1


async def test_a_get_is_sent_once_more_at_most() -> None:
    async with serving([DROP], [DROP], [ok()]) as server, client(server) as (kube, _):
        with pytest.raises(NO_ANSWER):
            await kube.get(CONFIGMAPS.path("ns", "a"))
    assert len(server.seen) == 2


async def test_a_refused_connection_is_no_answer_at_once() -> None:
    async with serving() as server:
        port = server.port
    server.port = port
    async with client(server) as (kube, _):
        with pytest.raises(aiohttp.ClientConnectorError) as refused:
            await kube.get(CONFIGMAPS.path("ns", "a"))
    assert isinstance(refused.value, NO_ANSWER)


async def test_the_pool_bounds_connections_and_the_rest_wait() -> None:
    many = REQUEST_POOL_SIZE + 8
    scripts: list[list[bytes | None]] = [[ok(b'{"i":%d}' % i)] * many for i in range(many)]
    async with serving(*scripts) as server:
        server.release = asyncio.Event()
        async with client(server) as (kube, _):
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


async def test_a_request_unanswered_in_time_times_out_and_the_next_dials_afresh() -> None:
    async with serving([HANG], [ok(b'{"after":true}')]) as server:  # noqa: SIM117 - the server outlives the client
        async with client(server, timeout=Timeout(SHORT, connect=DEADLINE)) as (kube, _):
            with pytest.raises(ApiTimeoutError):
                await kube.get(CONFIGMAPS.path("ns", "a"))
            await server.client_closed.wait()
            assert kube._pools is None  # retired: nothing of that time is used again
            assert await kube.get(CONFIGMAPS.path("ns", "a")) == {"after": True}
    assert [s.connection for s in server.seen] == [0, 1]


async def test_cancelling_a_request_closes_its_connection() -> None:
    async with serving([HANG]) as server, client(server) as (kube, _):
        task = asyncio.create_task(kube.get(CONFIGMAPS.path("ns", "a")))
        await server.until_seen(1)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await server.client_closed.wait()


# --- answers that are not 2xx -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wire", "code", "reason", "message", "transient"),
    [
        pytest.param(status(409, "Conflict", "changed"), 409, "Conflict", "changed", False, id="409"),
        pytest.param(status(403, "Forbidden", "no"), 403, "Forbidden", "no", False, id="403"),
        pytest.param(status(422, "Invalid", "bad"), 422, "Invalid", "bad", False, id="422"),
        pytest.param(status(410, "Gone", "old"), 410, "Gone", "old", False, id="410"),
        pytest.param(
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 13\r\n\r\nupstream down",
            503,
            "",
            "upstream down",
            True,
            id="503-text",
        ),
        pytest.param(
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n",
            500,
            "",
            "Internal Server Error",
            True,
            id="500-empty",
        ),
    ],
)
async def test_error_answers_become_api_errors(
    wire: bytes, code: int, reason: str, message: str, transient: bool
) -> None:
    async with serving([wire, ok()]) as server, client(server) as (kube, auth):
        with pytest.raises(ApiError) as failed:
            await kube.patch(CONFIGMAPS.path("ns", "a"), [], "json")
        await kube.get(CONFIGMAPS.path("ns", "a"))  # the connection stays usable after an error
    error = failed.value
    assert (error.status, error.reason, error.message, error.transient) == (code, reason, message, transient)
    assert server.connections == 1
    assert auth.reauthentications == 0  # a 403 included: nothing is re-read, no pool is dropped


async def test_404_is_absence_for_get_and_delete() -> None:
    async with serving([status(404, "NotFound"), status(404, "NotFound")]) as server:  # noqa: SIM117 - the server outlives the client
        async with client(server) as (kube, _):
            assert await kube.get("/api/v1/namespaces/ns/pods/p") is None
            assert await kube.delete("/api/v1/namespaces/ns/pods/p") is False
    assert [s.method for s in server.seen] == ["GET", "DELETE"]


async def test_a_401_re_reads_the_credentials_once_and_a_403_never() -> None:
    unauthorized, forbidden = status(401, "Unauthorized"), status(403, "Forbidden", "no")
    async with serving([unauthorized], [ok(b'{"kind":"ConfigMap"}'), forbidden]) as server:  # noqa: SIM117 - the server outlives the client
        async with client(server) as (kube, auth):
            assert await kube.get(CONFIGMAPS.path("ns", "a")) == {"kind": "ConfigMap"}
            with pytest.raises(ApiError) as refused:
                await kube.get(CONFIGMAPS.path("ns", "b"))
    assert refused.value.status == 403
    assert auth.reauthentications == 1
    assert [s.headers["authorization"] for s in server.seen] == ["Bearer first", *["Bearer second"] * 2]
    assert [s.connection for s in server.seen] == [0, 1, 1]  # the re-read retired the kept connection


async def test_a_write_answered_401_is_sent_again_and_a_second_401_is_the_answer() -> None:
    unauthorized = status(401, "Unauthorized", "Unauthorized")
    async with serving([unauthorized], [unauthorized]) as server, client(server) as (kube, auth):
        with pytest.raises(ApiError) as refused:
            await kube.create(CONFIGMAPS.path("ns"), {"kind": "ConfigMap"})
    assert (refused.value.status, refused.value.reason) == (401, "Unauthorized")
    assert [s.method for s in server.seen] == ["POST", "POST"]
    assert auth.reauthentications == 1


async def test_calls_answered_401_together_re_read_the_credentials_once() -> None:
    calls = 4
    first: list[bytes | None] = [status(401, "Unauthorized")]
    scripts = [first] * calls + [[ok(b"{}")]] * calls
    async with serving(*scripts) as server:
        server.release = asyncio.Event()
        async with client(server) as (kube, auth):
            gets = [asyncio.create_task(kube.get(CONFIGMAPS.path("ns", f"c{i}"))) for i in range(calls)]
            await server.until_seen(calls)
            server.release.set()
            assert await asyncio.gather(*gets) == [{}] * calls
    assert auth.reauthentications == 1


async def test_a_429_is_sent_again_after_its_retry_after_and_the_last_is_raised() -> None:
    slow = status(429, "TooManyRequests", "slow down", "Retry-After: 4\r\n")
    bare = status(429, "TooManyRequests", "slow down")
    async with serving([slow, bare, ok(b'{"at":"last"}'), *[slow] * (THROTTLED_RETRIES + 1)]) as server:
        sleeps = Sleeps()
        async with client(server, sleeps=sleeps) as (kube, _):
            assert await kube.create(CONFIGMAPS.path("ns"), {"kind": "ConfigMap"}) == {"at": "last"}
            assert sleeps.delays == [4.0, 1.0]  # as asked; a second when the answer names nothing
            with pytest.raises(ApiError) as throttled:
                await kube.get(CONFIGMAPS.path("ns", "a"))
    assert (throttled.value.status, throttled.value.retry_after) == (429, 4.0)
    assert sleeps.delays[2:] == [4.0] * THROTTLED_RETRIES
    assert server.connections == 1


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        pytest.param(None, None, id="absent"),
        pytest.param("1", 1.0, id="seconds"),
        pytest.param(" 0 ", 0.0, id="zero"),
        pytest.param("2.5", 2.5, id="fraction"),
        pytest.param("3600", RETRY_AFTER_MAX_SECONDS, id="capped"),
        pytest.param("Wed, 21 Oct 2015 07:28:00 GMT", None, id="http-date"),
        pytest.param("-1", None, id="negative"),
        pytest.param("nan", None, id="nan"),
    ],
)
def test_retry_after_seconds(header: str | None, seconds: float | None) -> None:
    assert retry_after_seconds(header) == seconds


# --- TCP keepalive ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("level", "option", "value"),
    [
        pytest.param(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1, id="keepalive"),
        pytest.param(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, TCP_KEEPALIVE_IDLE_SECONDS, id="idle"),
        pytest.param(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, TCP_USER_TIMEOUT_MS, id="user-timeout"),
    ],
)
def test_every_connection_gets_keepalive_probes_and_a_user_timeout(
    level: int, option: int, value: int
) -> None:
    info: tuple[Any, ...] = (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", 0))
    with keepalive_socket(info) as sock:
        assert sock.getsockopt(level, option) == value


def test_chunked_answers_are_read_whole() -> None:
    # The framing is aiohttp's; this only pins the helper the watch tests share.
    assert chunked(b"abc", sizes=(2,)) == b"2\r\nab\r\n1\r\nc\r\n0\r\n\r\n"
