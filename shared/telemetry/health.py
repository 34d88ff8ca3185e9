"""A liveness endpoint that fails when the operator is wedged, not merely when it has exited.

Decides "wedged": the event loop has not run a heartbeat for ``stall_seconds`` (something blocks
it), or, when ``silence_seconds`` is set, no watch event has arrived for that long (the watches are
stuck). The HTTP server runs in its own thread, so a stalled event loop cannot also stall the
answer that reports it. Does not restart anything: the kubelet does, on a failing probe.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Liveness:
    def __init__(
        self, last_event_age: Callable[[], float], stall_seconds: float = 30.0, silence_seconds: float = 0.0
    ) -> None:
        self.last_event_age = last_event_age
        self.stall_seconds, self.silence_seconds = stall_seconds, silence_seconds
        self._beat = time.monotonic()

    async def heartbeat(self, interval: float = 1.0) -> None:
        while True:
            self._beat = time.monotonic()
            await asyncio.sleep(interval)  # the heartbeat's period

    def problem(self) -> str | None:
        stalled = time.monotonic() - self._beat
        if stalled > self.stall_seconds:
            return f"event loop stalled for {stalled:.0f}s"
        silent = self.last_event_age()
        if self.silence_seconds and silent > self.silence_seconds:
            return f"no watch event for {silent:.0f}s"
        return None

    def serve(self, address: str, port: int) -> ThreadingHTTPServer | None:
        if not port:
            return None
        liveness = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                problem = liveness.problem() if self.path.startswith("/healthz") else "not found"
                code = 404 if problem == "not found" else (500 if problem else 200)
                body = (problem or "ok").encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # probes every few seconds would drown the operator's own log

        server = ThreadingHTTPServer((address, port), Handler)
        threading.Thread(target=server.serve_forever, name="liveness", daemon=True).start()
        return server
