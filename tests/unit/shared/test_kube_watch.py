"""The client's own watch reader and its error mapping, without an API server.

* ``ChunkedLines``: HTTP/1.1 chunked bodies cut into reads every way that matters (a line across
  chunks, a chunk-size line across reads, the CRLF after a chunk's data across reads, a byte per
  read), the zero-size chunk ending the body, and bodies that are not chunked HTTP.
* ``Kube.watch`` over a scripted HTTP/1.1 server on 127.0.0.1 (plain HTTP: the server URL's scheme
  says so; TLS is the integration tests'): the request it sends, events (an ERROR event included),
  non-200 answers, one re-read of the credentials after a 401 (none after a 403), a stream cut short,
  the idle timeout, and cancellation closing the connection.
* ``_IdleWatchdog`` on a fake loop: one timer, re-armed only when it fires.
* ``Kube.request`` over a fake ``call_api``: non-2xx answers become ``ApiError`` here, kr8s's checking
  (re-authenticating) path is taken once after a 401 and never after a 403.

No test sleeps: each waits on an event the scripted server or the fake sets, under ``DEADLINE``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import kr8s
import pytest

from shared.kube import (
    NO_ANSWER,
    ApiError,
    ChunkedLines,
    Kube,
    Lines,
    Obj,
    Resource,
    WatchStreamError,
    _IdleWatchdog,
)

CONFIGMAPS = Resource("v1", "configmaps")
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


def feed_all(decoder: Lines, reads: Sequence[bytes]) -> list[bytes]:
    lines = [line for read in reads for line in decoder.feed(read)]
    rest = decoder.rest()
    return [line for line in [*lines, rest] if line]


# --- ChunkedLines ----------------------------------------------------------------------------------

LINES = [event_line("ADDED", "a"), event_line("MODIFIED", "b" * 300), gone_line()]
BODY = b"".join(LINES)


def _reads_splitting_a_size_line() -> list[bytes]:
    wire = chunked(BODY, sizes=(len(LINES[0]), 0x123))
    second_size_line = wire.index(b"123\r\n")
    return cut(wire, [second_size_line + 1, second_size_line + 4])  # "1" | "23\r" | "\n..."


def _reads_splitting_a_crlf() -> list[bytes]:
    wire = chunked(BODY, sizes=(len(LINES[0]),))
    after_first_data = wire.index(b"\r\n") + 2 + len(LINES[0])
    return cut(wire, [after_first_data + 1])  # the chunk's CRLF: "\r" | "\n..."


@pytest.mark.parametrize(
    "reads",
    [
        pytest.param([chunked(BODY)], id="one-read"),
        pytest.param([chunked(BODY, sizes=[len(line) for line in LINES])], id="chunk-per-line"),
        pytest.param(cut(chunked(BODY, sizes=(7,)), [100, 101, 555]), id="chunks-split-lines"),
        pytest.param(_reads_splitting_a_size_line(), id="size-line-across-reads"),
        pytest.param(_reads_splitting_a_crlf(), id="crlf-across-reads"),
        pytest.param([bytes([b]) for b in chunked(BODY, sizes=(50, 3, 1000))], id="a-byte-per-read"),
        pytest.param([chunked(BODY, sizes=(len(BODY),)).replace(b"\r\n", b";ext=1\r\n", 1)], id="extension"),
    ],
)
def test_chunked_lines_come_out_whole_however_the_body_is_cut(reads: list[bytes]) -> None:
    decoder = ChunkedLines()
    assert feed_all(decoder, reads) == [line.rstrip(b"\n") for line in LINES]
    assert decoder.done


def test_the_zero_chunk_ends_the_body() -> None:
    decoder = ChunkedLines()
    wire = chunked(LINES[0] + b'{"type":"ADDED"', sizes=(10,))
    assert decoder.feed(wire + b"trailer: ignored\r\n\r\n5\r\nafter\r\n") == [LINES[0].rstrip(b"\n")]
    assert decoder.done
    assert decoder.feed(b"3\r\nmore\r\n") == []  # nothing after the end is read
    assert decoder.rest() == b'{"type":"ADDED"'  # a last line the body did not end


def test_a_line_waits_for_its_end_across_reads_without_joining_each_time() -> None:
    decoder = ChunkedLines()
    pieces = [b"%x\r\n%s\r\n" % (len(p), p) for p in (b'{"a":', b' "b"', b"}\n")]
    assert decoder.feed(pieces[0]) == []
    assert decoder.feed(pieces[1]) == []
    assert decoder.feed(pieces[2]) == [b'{"a": "b"}']
    assert not decoder.done


def test_lines_split_on_the_newline_byte_only() -> None:
    text = event_line("ADDED", "with\u0085nel\u2028ls")  # unescaped in JSON, line breaks to str.splitlines
    assert feed_all(ChunkedLines(), [chunked(text, sizes=(5,))]) == [text.rstrip(b"\n")]


@pytest.mark.parametrize(
    ("wire", "complaint"),
    [
        pytest.param(b"zz\r\nabc\r\n", "not a chunk size", id="size-not-hex"),
        pytest.param(b"-3\r\nabc\r\n", "not a chunk size", id="negative-size"),
        pytest.param(b"3\r\nabcXY", "no CRLF", id="data-longer-than-its-size"),
        pytest.param(b"1" * 2000, "no end", id="endless-size-line"),
    ],
)
def test_a_body_that_is_not_chunked_http_is_a_broken_stream(wire: bytes, complaint: str) -> None:
    with pytest.raises(WatchStreamError, match=complaint):
        ChunkedLines().feed(wire)


# --- a scripted HTTP/1.1 server ----------------------------------------------------------------------


@dataclass
class Answer:
    """What the server writes to one connection; ``hold``: then keep it open until the client ends it."""

    data: bytes
    hold: bool = False


@dataclass
class Request:
    target: str
    headers: dict[str, str]

    @property
    def query(self) -> dict[str, str]:
        return {k: v[0] for k, v in parse_qs(urlsplit(self.target).query).items()}


@dataclass
class Server:
    answers: deque[Answer]
    requests: list[Request] = field(default_factory=list)
    closed_by_client: asyncio.Event = field(default_factory=asyncio.Event)
    port: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        request_line, *header_lines = head.decode().split("\r\n")[:-2]
        method, target, _ = request_line.split(" ")
        assert method == "GET"
        headers = {}
        for header in header_lines:
            name, _, value = header.partition(":")
            headers[name.strip().lower()] = value.strip()
        self.requests.append(Request(target, headers))
        answer = self.answers.popleft()
        writer.write(answer.data)
        await writer.drain()
        if answer.hold:
            with contextlib.suppress(ConnectionError):
                while await reader.read(65536):
                    pass
            self.closed_by_client.set()
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


def status_answer(code: int, reason: str, message: str) -> Answer:
    body = json.dumps(
        {"kind": "Status", "apiVersion": "v1", "code": code, "reason": reason, "message": message}
    )
    head = (
        f"HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return Answer((head + body).encode())


@dataclass
class FakeAuth:
    """What the watch reader uses of kr8s's ``KubeAuth``; ``reauthenticate`` hands out the next token."""

    server: str
    token: str | None = "first"
    next_tokens: list[str] = field(default_factory=lambda: ["second", "third"])
    proxy: str | None = None
    tls_server_name: str | None = None
    server_ca_file: str | None = None
    client_cert_file: str | None = None
    client_key_file: str | None = None
    reauthentications: int = 0

    async def reauthenticate(self) -> None:
        self.reauthentications += 1
        self.token = self.next_tokens.pop(0)


@dataclass
class DialingApi:
    auth: FakeAuth


def dialing_kube(server: Server) -> tuple[Kube, FakeAuth]:
    auth = FakeAuth(f"http://127.0.0.1:{server.port}")
    return Kube(DialingApi(auth)), auth  # type: ignore[arg-type]  # what Kube uses of kr8s's Api


async def collect(events: Any) -> list[tuple[str, Obj]]:
    async with asyncio.timeout(DEADLINE), contextlib.aclosing(events):
        return [event async for event in events]


async def kinds_until_failure(events: Any, seen: list[str]) -> None:
    """Record each event's type in ``seen`` until the stream fails (the failure propagates)."""
    async with asyncio.timeout(DEADLINE), contextlib.aclosing(events):
        async for kind, _ in events:
            seen.append(kind)


# --- Kube.watch over its own connection ---------------------------------------------------------------


async def test_the_watch_request_and_its_events() -> None:
    wire = chunked(b"".join(LINES), sizes=(9, 100))
    async with serving(Answer(ok_head() + wire)) as server:
        kube, _ = dialing_kube(server)
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
    assert request.headers["connection"] == "close"
    assert request.headers["host"] == f"127.0.0.1:{server.port}"


async def test_a_body_without_chunking_ends_with_the_connection() -> None:
    async with serving(Answer(ok_head(chunked_body=False) + BODY.rstrip(b"\n"))) as server:
        kube, _ = dialing_kube(server)
        events = await collect(kube.watch(CONFIGMAPS.path("ns")))
    assert [kind for kind, _ in events] == ["ADDED", "MODIFIED", "ERROR"]  # the last line unended


async def test_a_stream_cut_before_its_last_chunk_is_a_broken_connection() -> None:
    wire = chunked(BODY, sizes=(len(LINES[0]),))
    async with serving(Answer(ok_head() + wire[: wire.index(b"\r\n0\r\n") - 20])) as server:
        kube, _ = dialing_kube(server)
        seen: list[str] = []
        with pytest.raises(WatchStreamError, match="before the last chunk") as broken:
            await kinds_until_failure(kube.watch(CONFIGMAPS.path("ns")), seen)
    assert seen == ["ADDED", "MODIFIED"]
    assert isinstance(broken.value, NO_ANSWER)  # the informer lists again, as after any lost connection


@pytest.mark.parametrize(
    ("answer", "status", "reason", "message"),
    [
        pytest.param(status_answer(410, "Expired", "too old"), 410, "Expired", "too old", id="gone"),
        pytest.param(status_answer(403, "Forbidden", "no"), 403, "Forbidden", "no", id="forbidden"),
        pytest.param(
            Answer(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 9\r\n\r\n<html/>\r\n"),
            502,
            "",
            "<html/>",
            id="not-a-status",
        ),
        pytest.param(
            Answer(
                b"HTTP/1.1 500 Internal Server Error\r\nTransfer-Encoding: chunked\r\n\r\n"
                + chunked(b'{"kind":"Status","reason":"InternalError","message":"etcd"}', sizes=(10,))
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
        kube, auth = dialing_kube(server)
        with pytest.raises(ApiError) as refused:
            await collect(kube.watch(CONFIGMAPS.path("ns")))
    assert (refused.value.status, refused.value.reason, refused.value.message) == (status, reason, message)
    assert auth.reauthentications == 0  # a 403 included: a refusal, not stale credentials
    assert len(server.requests) == 1


async def test_a_401_has_kr8s_reread_the_credentials_once_and_dials_again() -> None:
    unauthorized = status_answer(401, "Unauthorized", "Unauthorized")
    async with serving(unauthorized, Answer(ok_head() + chunked(LINES[0]))) as server:
        kube, auth = dialing_kube(server)
        events = await collect(kube.watch(CONFIGMAPS.path("ns")))
    assert [kind for kind, _ in events] == ["ADDED"]
    assert auth.reauthentications == 1
    assert [r.headers["authorization"] for r in server.requests] == ["Bearer first", "Bearer second"]


async def test_a_second_401_is_the_answer() -> None:
    unauthorized = status_answer(401, "Unauthorized", "Unauthorized")
    async with serving(unauthorized, unauthorized) as server:
        kube, auth = dialing_kube(server)
        with pytest.raises(ApiError) as refused:
            await collect(kube.watch(CONFIGMAPS.path("ns")))
    assert refused.value.status == 401
    assert auth.reauthentications == 1
    assert len(server.requests) == 2


async def test_a_silent_watch_times_out_and_its_connection_is_closed() -> None:
    async with serving(Answer(ok_head() + chunked(LINES[0])[:-5], hold=True)) as server:
        kube, _ = dialing_kube(server)
        seen: list[str] = []
        with pytest.raises(kr8s.APITimeoutError):
            await kinds_until_failure(kube.watch(CONFIGMAPS.path("ns"), idle_timeout=IDLE), seen)
        async with asyncio.timeout(DEADLINE):
            await server.closed_by_client.wait()
    assert seen == ["ADDED"]


async def test_cancelling_a_watch_closes_its_connection_at_once() -> None:
    async with serving(Answer(ok_head() + chunked(LINES[0])[:-5], hold=True)) as server:
        kube, _ = dialing_kube(server)
        first = asyncio.Event()

        async def consume() -> None:
            async for _ in kube.watch(CONFIGMAPS.path("ns")):  # idle timeout: 310s
                first.set()

        task = asyncio.create_task(consume())
        async with asyncio.timeout(DEADLINE):
            await first.wait()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await server.closed_by_client.wait()
    assert task.cancelled()


async def test_a_kubeconfig_with_a_proxy_streams_through_kr8s_session() -> None:
    calls: list[dict[str, Any]] = []

    @dataclass
    class ProxiedApi:
        auth: FakeAuth

        @contextlib.asynccontextmanager
        async def call_api(self, method: str, **kwargs: Any) -> AsyncIterator[httpx.Response]:
            calls.append(kwargs)
            yield httpx.Response(200, content=BODY)

    api = ProxiedApi(FakeAuth("https://kube.example:6443", proxy="http://proxy.example:3128"))
    events = await collect(Kube(api).watch(CONFIGMAPS.path("ns")))  # type: ignore[arg-type]
    assert [kind for kind, _ in events] == ["ADDED", "MODIFIED", "ERROR"]
    assert calls[0]["stream"] is True
    assert calls[0]["raise_for_status"] is False


# --- the watchdog --------------------------------------------------------------------------------------


@dataclass
class FakeHandle:
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """``time`` and ``call_later``, with time moved only by firing the next timer."""

    def __init__(self) -> None:
        self.now = 100.0
        self.timers: list[tuple[float, Callable[[], None], FakeHandle]] = []

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[[], None]) -> FakeHandle:
        handle = FakeHandle()
        self.timers.append((self.now + delay, callback, handle))
        return handle

    def armed(self) -> list[float]:
        return [when for when, _, handle in self.timers if not handle.cancelled]

    def fire_next(self) -> None:
        when, callback, _ = self.timers.pop(0)
        self.now = when
        callback()


class FakeTransport:
    aborted = False

    def abort(self) -> None:
        self.aborted = True


def test_the_watchdog_aborts_only_a_read_that_waited_the_whole_idle_time() -> None:
    loop, transport = FakeLoop(), FakeTransport()
    dog = _IdleWatchdog(loop, transport, 10.0)  # type: ignore[arg-type]
    assert loop.armed() == [110.0]  # one timer, armed once

    loop.fire_next()  # no read pending (the consumer is busy): that is no silence
    assert not transport.aborted
    assert loop.armed() == [120.0]

    dog.reading_since = 117.0  # reads came and went meanwhile (no timer touched); one waits since 117
    loop.fire_next()
    assert not transport.aborted
    assert loop.armed() == [127.0]  # when that read will have waited 10s

    loop.fire_next()
    assert transport.aborted
    assert dog.expired
    assert loop.armed() == []


def test_a_stopped_watchdog_never_fires() -> None:
    loop, transport = FakeLoop(), FakeTransport()
    dog = _IdleWatchdog(loop, transport, 10.0)  # type: ignore[arg-type]
    dog.stop()
    dog.stop()
    assert loop.armed() == []
    assert not transport.aborted


# --- Kube.request: non-2xx answers and re-authentication -------------------------------------------------


@dataclass
class RequestApi:
    """``call_api`` answering from a script: a response, or an exception kr8s's checking path raises."""

    answers: deque[httpx.Response | BaseException]
    calls: list[dict[str, Any]] = field(default_factory=list)

    @contextlib.asynccontextmanager
    async def call_api(self, method: str, **kwargs: Any) -> AsyncIterator[httpx.Response]:
        self.calls.append({"method": method, **kwargs})
        answer = self.answers.popleft()
        if isinstance(answer, BaseException):
            raise answer
        yield answer


def status_response(code: int, reason: str, message: str = "") -> httpx.Response:
    return httpx.Response(code, json={"kind": "Status", "code": code, "reason": reason, "message": message})


def request_kube(*answers: httpx.Response | BaseException) -> tuple[Kube, RequestApi]:
    api = RequestApi(deque(answers))
    return Kube(api), api  # type: ignore[arg-type]  # the one method Kube calls


async def test_a_403_is_an_api_error_and_nothing_is_re_authenticated() -> None:
    kube, api = request_kube(status_response(403, "Forbidden", "kubevirts is forbidden"))
    with pytest.raises(ApiError) as refused:
        await kube.get("/apis/kubevirt.io/v1/namespaces/kv/kubevirts/kv")
    assert (refused.value.status, refused.value.reason) == (403, "Forbidden")
    assert refused.value.message == "kubevirts is forbidden"
    assert not refused.value.transient
    assert [call["raise_for_status"] for call in api.calls] == [False]  # kr8s left its session alone


async def test_a_401_takes_kr8s_checking_path_once() -> None:
    kube, api = request_kube(status_response(401, "Unauthorized"), httpx.Response(200, json={"kind": "Pod"}))
    assert await kube.get("/api/v1/namespaces/ns/pods/p") == {"kind": "Pod"}
    # The second call is kr8s's default (raise_for_status=True): it re-reads the credentials on a 401.
    assert ["raise_for_status" in call for call in api.calls] == [True, False]
    assert api.calls[0]["raise_for_status"] is False


async def test_a_401_kr8s_cannot_cure_is_an_api_error() -> None:
    still = httpx.Response(401, json={"kind": "Status", "reason": "Unauthorized", "message": "Unauthorized"})
    failure = kr8s.ServerError("Unauthorized", status=still.json(), response=still)
    kube, api = request_kube(status_response(401, "Unauthorized"), failure)
    with pytest.raises(ApiError) as refused:
        await kube.create("/api/v1/namespaces/ns/configmaps", {"kind": "ConfigMap"})
    assert (refused.value.status, refused.value.reason) == (401, "Unauthorized")
    assert len(api.calls) == 2


async def test_404_is_absence_for_get_and_delete() -> None:
    kube, api = request_kube(status_response(404, "NotFound"), status_response(404, "NotFound"))
    assert await kube.get("/api/v1/namespaces/ns/pods/p") is None
    assert await kube.delete("/api/v1/namespaces/ns/pods/p") is False
    assert [call["raise_for_status"] for call in api.calls] == [False, False]


@pytest.mark.parametrize(
    ("response", "status", "reason", "message", "transient"),
    [
        pytest.param(
            status_response(409, "Conflict", "changed"), 409, "Conflict", "changed", False, id="409"
        ),
        pytest.param(
            status_response(429, "TooManyRequests", "slow"), 429, "TooManyRequests", "slow", True, id="429"
        ),
        pytest.param(
            httpx.Response(503, text="upstream down"), 503, "", "upstream down", True, id="503-text"
        ),
        pytest.param(httpx.Response(500), 500, "", "Internal Server Error", True, id="500-empty"),
    ],
)
async def test_error_answers_become_api_errors(
    response: httpx.Response, status: int, reason: str, message: str, transient: bool
) -> None:
    kube, _ = request_kube(response)
    with pytest.raises(ApiError) as failed:
        await kube.patch("/api/v1/namespaces/ns/pods/p", [], "json")
    error = failed.value
    assert (error.status, error.reason, error.message, error.transient) == (
        status,
        reason,
        message,
        transient,
    )
