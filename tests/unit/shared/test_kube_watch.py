"""The client's watch over aiohttp, and its error mapping, against a scripted server (no API server).

* ``Lines``: a stream's bytes cut every way that matters, split on the newline byte only.
* ``Kube.watch`` over a scripted HTTP/1.1 server on 127.0.0.1 (plain HTTP: the server URL's scheme
  says so; TLS is the integration tests'): the request it sends, events (an ERROR event included)
  however the chunked body is cut, non-200 answers, one re-read of the credentials after a 401 (none
  after a 403), a 429's Retry-After, a stream cut short, the idle bound (which retires the pools),
  cancellation closing the connection, a watch read to its end leaving its connection for the next,
  and a kubeconfig's proxy-url.

No test sleeps: each waits on an event the scripted server sets, under ``DEADLINE``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from shared.credentials import Credentials
from shared.kube import NO_ANSWER, THROTTLED_RETRIES, ApiError, ApiTimeoutError, Kube, Lines, Obj, decode
from shared.resources import CONFIGMAPS

DEADLINE = 5.0  # seconds any wait here may take; each is over in milliseconds
IDLE = 0.2  # a watch's idle timeout where a test lets it expire: real time, but short


def event_line(kind: str, name: str, **extra: Any) -> bytes:
    obj: Obj = {"kind": "ConfigMap", "metadata": {"name": name, "resourceVersion": "1"}, **extra}
    return json.dumps({"type": kind, "object": obj}, ensure_ascii=False).encode() + b"\n"


def gone_line() -> bytes:
    status = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version"}
    return json.dumps({"type": "ERROR", "object": status}).encode() + b"\n"


def chunked(body: bytes, sizes: Sequence[int] = (4096,)) -> bytes:
    """``body`` as chunks of the given sizes (the last size repeats), then the zero-size chunk."""
    out, pos, i = [], 0, 0
    while pos < len(body):
        size = sizes[min(i, len(sizes) - 1)]
        out.append(b"%x\r\n%s\r\n" % (len(body[pos : pos + size]), body[pos : pos + size]))
        pos, i = pos + size, i + 1
    return b"".join(out) + b"0\r\n\r\n"


def cut(data: bytes, at: Sequence[int]) -> list[bytes]:
    bounds = [0, *at, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


LINES = [event_line("ADDED", "a"), event_line("MODIFIED", "b" * 300), gone_line()]
BODY = b"".join(LINES)


# --- Lines -------------------------------------------------------------------------------------------


def feed_all(reads: Sequence[bytes]) -> list[bytes]:
    lines = Lines()
    out = [line for read in reads for line in lines.feed(read)]
    return [line for line in [*out, lines.rest()] if line]


@pytest.mark.parametrize(
    ("reads", "expected"),
    [
        pytest.param([b"a\nb\n"], [b"a", b"b"], id="lines-in-one-read"),
        pytest.param([b'{"a":', b' "b"', b"}\n"], [b'{"a": "b"}'], id="a-line-in-three-reads"),
        pytest.param([b"", b"a\n", b""], [b"a"], id="empty-reads"),
        pytest.param([b"a\n\nb"], [b"a", b"b"], id="blank-line-and-unended-last"),
        pytest.param(
            ["with\u0085nel\u2028ls\n".encode()], ["with\u0085nel\u2028ls".encode()], id="unicode-breaks"
        ),
    ],
)
def test_lines_split_on_the_newline_byte_only(reads: list[bytes], expected: list[bytes]) -> None:
    assert feed_all(reads) == expected


# --- decode ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "document",
    [
        pytest.param(b'{"kind": "Pod", "metadata": {"name": "p"}, "spec": {}}', id="an-object"),
        pytest.param(b'{"n": 9223372036854775807, "m": -9223372036854775808}', id="int64-bounds"),
        pytest.param(b'{"f": 0.1, "e": 1e-7, "z": -0.0}', id="floats"),
        pytest.param(b'{"s": "with\\u0085nel \\u00e9 \\ud83d\\ude00 \xc3\xa9"}', id="unicode-escapes"),
        pytest.param(b'{"s": "lone \\ud800 surrogate"}', id="lone-surrogate-escape-via-fallback"),
        pytest.param(b'{"big": 1e400}', id="beyond-a-double-via-fallback"),
        pytest.param(b'{"k": 1, "k": 2}', id="a-repeated-key-keeps-the-last"),
    ],
)
def test_decode_reads_what_json_loads_reads(document: bytes) -> None:
    assert repr(decode(document)) == repr(json.loads(document))


@pytest.mark.parametrize("document", [b"", b"{", b'{"a": }', b"[1,]", b"nul"])
def test_decode_refuses_what_is_not_json_with_a_value_error(document: bytes) -> None:
    with pytest.raises(json.JSONDecodeError):  # a ValueError, as json.loads raises
        decode(document)


# --- a scripted HTTP/1.1 server ----------------------------------------------------------------------


@dataclass
class Answer:
    """What the server writes to one request, piece by piece (each piece its own write, drained);
    ``hold``: then keep the connection open until the client ends it; ``keep``: then read the next
    request on the same connection."""

    pieces: Sequence[bytes]
    hold: bool = False
    keep: bool = False


@dataclass
class Request:
    method: str
    target: str
    headers: dict[str, str]
    connection: int

    @property
    def query(self) -> dict[str, str]:
        return {k: v[0] for k, v in parse_qs(urlsplit(self.target).query).items()}


async def read_request_head(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str]]:
    """One request's method, target and headers (names lower-cased), read through its blank line."""
    head = await reader.readuntil(b"\r\n\r\n")
    request_line, *header_lines = head.decode().split("\r\n")[:-2]
    method, target, _ = request_line.split(" ")
    headers = {}
    for header in header_lines:
        name, _, value = header.partition(":")
        headers[name.strip().lower()] = value.strip()
    return method, target, headers


@dataclass
class Server:
    answers: deque[Answer]
    requests: list[Request] = field(default_factory=list)
    closed_by_client: asyncio.Event = field(default_factory=asyncio.Event)
    connections: int = 0
    port: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = self.connections
        self.connections += 1
        try:
            while self.answers:
                method, target, headers = await read_request_head(reader)
                self.requests.append(Request(method, target, headers, index))
                answer = self.answers.popleft()
                for piece in answer.pieces:
                    writer.write(piece)
                    await writer.drain()
                if answer.hold:
                    with contextlib.suppress(ConnectionError):
                        while await reader.read(65536):
                            pass
                    self.closed_by_client.set()
                    return
                if not answer.keep:
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def serving(*answers: Answer) -> AsyncIterator[Server]:
    server = Server(deque(answers))
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    server.port = listener.sockets[0].getsockname()[1]
    async with listener:
        yield server


def ok_head(chunked_body: bool = True) -> bytes:
    encoding = b"Transfer-Encoding: chunked\r\n" if chunked_body else b"Connection: close\r\n"
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + encoding + b"\r\n"


def status_wire(code: int, reason: str, message: str = "", extra: str = "") -> bytes:
    body = json.dumps(
        {"kind": "Status", "apiVersion": "v1", "code": code, "reason": reason, "message": message}
    )
    head = (
        f"HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"{extra}\r\n"
    )
    return (head + body).encode()


def status_answer(code: int, reason: str, message: str = "", extra: str = "", keep: bool = False) -> Answer:
    return Answer([status_wire(code, reason, message, extra)], keep=keep)


@dataclass
class FakeAuth:
    """The client's credentials and their source: each load hands out the next token."""

    server: str
    token: str | None = "first"
    next_tokens: list[str] = field(default_factory=lambda: ["second", "third"])
    proxy: str | None = None
    tls_server_name: str | None = None
    reauthentications: int = 0

    def credentials(self) -> Credentials:
        return Credentials(self.server, None, self.token, self.tls_server_name, self.proxy)

    async def reload(self) -> Credentials:
        self.reauthentications += 1
        await asyncio.sleep(0)  # as a real load, it awaits (an exec plugin): others run meanwhile
        self.token = self.next_tokens.pop(0)
        return self.credentials()

    def kube(self, **options: Any) -> Kube:
        """A client with these credentials (plain HTTP: no TLS context)."""
        return Kube(self.credentials(), reload=self.reload, **options)


@dataclass
class Sleeps:
    """A recorder for the client's pauses (a 429's Retry-After): no real time passes."""

    delays: list[float] = field(default_factory=list)

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


def kube_for(server: Server, sleeps: Sleeps | None = None, **auth: Any) -> tuple[Kube, FakeAuth]:
    fake = FakeAuth(f"http://127.0.0.1:{server.port}", **auth)
    kube = fake.kube(sleep=sleeps or Sleeps())
    return kube, fake


async def collect(events: Any) -> list[tuple[str, Obj]]:
    async with asyncio.timeout(DEADLINE), contextlib.aclosing(events):
        return [event async for event in events]


async def kinds_until_failure(events: Any, seen: list[str]) -> None:
    """Record each event's type in ``seen`` until the stream fails (the failure propagates)."""
    async with asyncio.timeout(DEADLINE), contextlib.aclosing(events):
        async for kind, _ in events:
            seen.append(kind)


# --- Kube.watch --------------------------------------------------------------------------------------


async def test_the_watch_request_and_its_events() -> None:
    wire = chunked(BODY, sizes=(9, 100))
    async with serving(Answer([ok_head() + wire])) as server:
        kube, _ = kube_for(server)
        events = await collect(
            kube.watch(
                CONFIGMAPS.path("ns"),
                resource_version="7",
                label_selector="app=x,tier!=db",
                timeout_seconds=60,
            )
        )
    assert [(kind, obj.get("metadata", {}).get("name")) for kind, obj in events] == [
        ("ADDED", "a"),
        ("MODIFIED", "b" * 300),
        ("ERROR", None),
    ]
    assert events[2][1]["code"] == 410  # an ERROR event is yielded like any other: the informer decides
    (request,) = server.requests
    assert urlsplit(request.target).path == "/api/v1/namespaces/ns/configmaps"
    assert request.query == {
        "watch": "true",
        "allowWatchBookmarks": "true",
        "timeoutSeconds": "60",
        "resourceVersion": "7",
        "labelSelector": "app=x,tier!=db",
    }
    assert request.headers["authorization"] == "Bearer first"
    assert request.headers["host"] == f"127.0.0.1:{server.port}"
    assert "accept-encoding" not in request.headers  # no compression asked for


def _reads_splitting_a_size_line() -> list[bytes]:
    wire = chunked(BODY, sizes=(len(LINES[0]), 0x123))
    second_size_line = wire.index(b"123\r\n")
    return cut(wire, [second_size_line + 1, second_size_line + 4])  # "1" | "23\r" | "\n..."


@pytest.mark.parametrize(
    "pieces",
    [
        pytest.param([chunked(BODY)], id="one-write"),
        pytest.param([chunked(BODY, sizes=[len(line) for line in LINES])], id="chunk-per-line"),
        pytest.param(cut(chunked(BODY, sizes=(7,)), [100, 101, 555]), id="chunks-split-lines"),
        pytest.param(_reads_splitting_a_size_line(), id="size-line-across-writes"),
        pytest.param([bytes([b]) for b in chunked(BODY, sizes=(50, 3, 1000))], id="a-byte-per-write"),
    ],
)
async def test_events_come_out_whole_however_the_body_is_cut(pieces: list[bytes]) -> None:
    async with serving(Answer([ok_head(), *pieces])) as server:
        kube, _ = kube_for(server)
        events = await collect(kube.watch(CONFIGMAPS.path("ns")))
    assert [kind for kind, _ in events] == ["ADDED", "MODIFIED", "ERROR"]
    assert events[1][1]["metadata"]["name"] == "b" * 300


async def test_a_body_without_chunking_ends_with_the_connection() -> None:
    async with serving(Answer([ok_head(chunked_body=False) + BODY.rstrip(b"\n")])) as server:
        kube, _ = kube_for(server)
        events = await collect(kube.watch(CONFIGMAPS.path("ns")))
    assert [kind for kind, _ in events] == ["ADDED", "MODIFIED", "ERROR"]  # the last line unended


async def test_a_stream_cut_before_its_last_chunk_is_a_broken_connection() -> None:
    wire = chunked(BODY, sizes=(len(LINES[0]),))
    async with serving(Answer([ok_head() + wire[: wire.index(b"\r\n0\r\n") - 20]])) as server:
        kube, _ = kube_for(server)
        seen: list[str] = []
        with pytest.raises(NO_ANSWER):  # the informer lists again, as after any lost connection
            await kinds_until_failure(kube.watch(CONFIGMAPS.path("ns")), seen)
    assert seen == ["ADDED", "MODIFIED"]


@pytest.mark.parametrize(
    ("answer", "status", "reason", "message"),
    [
        pytest.param(status_answer(410, "Expired", "too old"), 410, "Expired", "too old", id="gone"),
        pytest.param(status_answer(403, "Forbidden", "no"), 403, "Forbidden", "no", id="forbidden"),
        pytest.param(
            Answer([b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 9\r\n\r\n<html/>\r\n"]),
            502,
            "",
            "<html/>",
            id="not-a-status",
        ),
        pytest.param(
            Answer(
                [
                    b"HTTP/1.1 500 Internal Server Error\r\nTransfer-Encoding: chunked\r\n\r\n"
                    + chunked(b'{"kind":"Status","reason":"InternalError","message":"etcd"}', sizes=(10,))
                ]
            ),
            500,
            "InternalError",
            "etcd",
            id="chunked-status",
        ),
    ],
)
async def test_a_non_200_answer_is_an_api_error(
    answer: Answer, status: int, reason: str, message: str
) -> None:
    async with serving(answer) as server:
        kube, auth = kube_for(server)
        with pytest.raises(ApiError) as refused:
            await collect(kube.watch(CONFIGMAPS.path("ns")))
    assert (refused.value.status, refused.value.reason, refused.value.message) == (status, reason, message)
    assert auth.reauthentications == 0  # a 403 included: a refusal, not stale credentials
    assert len(server.requests) == 1


async def test_a_401_has_the_credentials_loaded_again_once_and_dials_again() -> None:
    unauthorized = status_answer(401, "Unauthorized", "Unauthorized", keep=True)
    async with serving(unauthorized, Answer([ok_head() + chunked(LINES[0])])) as server:
        kube, auth = kube_for(server)
        events = await collect(kube.watch(CONFIGMAPS.path("ns")))
    assert [kind for kind, _ in events] == ["ADDED"]
    assert auth.reauthentications == 1
    assert [r.headers["authorization"] for r in server.requests] == ["Bearer first", "Bearer second"]


async def test_a_second_401_is_the_answer() -> None:
    unauthorized = status_answer(401, "Unauthorized", "Unauthorized", keep=True)
    async with serving(unauthorized, unauthorized) as server:
        kube, auth = kube_for(server)
        with pytest.raises(ApiError) as refused:
            await collect(kube.watch(CONFIGMAPS.path("ns")))
    assert refused.value.status == 401
    assert auth.reauthentications == 1
    assert len(server.requests) == 2


async def test_a_429_is_dialled_again_after_its_retry_after() -> None:
    throttled = status_answer(429, "TooManyRequests", "storage is (re)initializing", "Retry-After: 2\r\n")
    async with serving(throttled, Answer([ok_head() + chunked(LINES[0])])) as server:
        sleeps = Sleeps()
        kube, _ = kube_for(server, sleeps)
        events = await collect(kube.watch(CONFIGMAPS.path("ns")))
    assert [kind for kind, _ in events] == ["ADDED"]
    assert sleeps.delays == [2.0]


async def test_a_429_that_lasts_is_an_api_error_with_its_retry_after() -> None:
    throttled = status_answer(429, "TooManyRequests", "slow down", "Retry-After: 3\r\n", keep=True)
    async with serving(*[throttled] * (THROTTLED_RETRIES + 1)) as server:
        sleeps = Sleeps()
        kube, _ = kube_for(server, sleeps)
        with pytest.raises(ApiError) as throttled_error:
            await collect(kube.watch(CONFIGMAPS.path("ns")))
    assert (throttled_error.value.status, throttled_error.value.retry_after) == (429, 3.0)
    assert throttled_error.value.transient
    assert sleeps.delays == [3.0] * THROTTLED_RETRIES
    assert server.connections == 1  # each 429 was read whole: the connection carried the next dial


async def test_a_silent_watch_times_out_closes_its_connection_and_retires_the_pools() -> None:
    async with serving(Answer([ok_head() + chunked(LINES[0])[:-5]], hold=True)) as server:
        kube, _ = kube_for(server)
        seen: list[str] = []
        with pytest.raises(ApiTimeoutError):
            await kinds_until_failure(kube.watch(CONFIGMAPS.path("ns"), idle_timeout=IDLE), seen)
        async with asyncio.timeout(DEADLINE):
            await server.closed_by_client.wait()
        assert kube._pools is None  # the next call (the re-list) dials afresh
        await kube.close()
    assert seen == ["ADDED"]


async def test_cancelling_a_watch_closes_its_connection_at_once() -> None:
    async with serving(Answer([ok_head() + chunked(LINES[0])[:-5]], hold=True)) as server:
        kube, _ = kube_for(server)
        first = asyncio.Event()

        async def consume() -> None:
            async for _ in kube.watch(CONFIGMAPS.path("ns")):  # idle timeout: 303s
                first.set()

        task = asyncio.create_task(consume())
        async with asyncio.timeout(DEADLINE):
            await first.wait()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await server.closed_by_client.wait()
    assert task.cancelled()


async def test_a_watch_read_to_its_end_leaves_its_connection_for_the_next() -> None:
    ended = Answer([ok_head() + chunked(LINES[0])], keep=True)
    async with serving(ended, ended) as server:
        kube, _ = kube_for(server)
        for _ in range(2):
            assert [kind for kind, _ in await collect(kube.watch(CONFIGMAPS.path("ns")))] == ["ADDED"]
        await kube.close()
    assert [r.connection for r in server.requests] == [0, 0]


async def test_a_kubeconfig_proxy_url_is_where_the_watch_goes() -> None:
    async with serving(Answer([ok_head() + chunked(LINES[0])])) as proxy:
        kube, _ = kube_for(proxy, proxy=f"http://127.0.0.1:{proxy.port}")
        kube.credentials = dataclasses.replace(kube.credentials, server="http://kube.example:6443")
        events = await collect(kube.watch(CONFIGMAPS.path("ns")))
    assert [kind for kind, _ in events] == ["ADDED"]
    (request,) = proxy.requests
    # The proxy is asked for the API server's URL (absolute form), as an HTTP proxy is.
    assert request.target.startswith("http://kube.example:6443/api/v1/namespaces/ns/configmaps?")
    assert request.headers["authorization"] == "Bearer first"


async def test_a_silent_watch_fails_the_calls_waiting_on_connections_of_its_time_at_once() -> None:
    silent_watch = Answer([ok_head() + chunked(LINES[0])[:-5]], hold=True)
    unanswered = Answer([], hold=True)
    async with serving(unanswered, silent_watch) as server:
        kube, _ = kube_for(server)
        waiting = asyncio.create_task(kube.get(CONFIGMAPS.path("ns", "a")))  # timeout: 30s
        while not server.requests:  # noqa: ASYNC110 - the scripted server has no event for it
            await asyncio.sleep(0)
        with pytest.raises(ApiTimeoutError):
            await kinds_until_failure(kube.watch(CONFIGMAPS.path("ns"), idle_timeout=IDLE), [])
        async with asyncio.timeout(DEADLINE):
            with pytest.raises(NO_ANSWER):
                await waiting
        await kube.close()


async def test_a_call_cancelled_while_waiting_retires_the_pools() -> None:
    async with serving(Answer([], hold=True)) as server:
        kube, _ = kube_for(server)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(IDLE):  # a caller's own deadline (a lease renewal's, say)
                await kube.get(CONFIGMAPS.path("ns", "a"))
        assert kube._pools is None  # the next call dials afresh
        await kube.close()


async def test_a_silent_watch_fails_the_other_watches_of_its_time_at_once() -> None:
    # aiohttp detaches a streamed body before a closed connection's end reaches it: the client
    # wakes its open watches itself, or they would wait forever (their idle timers are dropped too).
    silent = Answer([ok_head() + chunked(LINES[0])[:-5]], hold=True)
    async with serving(silent, silent) as server:
        kube, _ = kube_for(server)
        seen: list[str] = []
        patient = asyncio.create_task(
            kinds_until_failure(kube.watch(CONFIGMAPS.path("ns"), idle_timeout=DEADLINE * 10), seen)
        )
        while not seen:  # noqa: ASYNC110 - the first event is the patient watch's only sign
            await asyncio.sleep(0)
        with pytest.raises(ApiTimeoutError):
            await kinds_until_failure(kube.watch(CONFIGMAPS.path("ns"), idle_timeout=IDLE), [])
        async with asyncio.timeout(DEADLINE):
            with pytest.raises(NO_ANSWER):
                await patient
        await kube.close()
