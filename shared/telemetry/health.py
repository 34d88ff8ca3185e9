"""Liveness and readiness endpoints that tell a wedged operator from a merely busy one.

Decides: ``/healthz`` fails when the event loop has not run a heartbeat for ``stall_seconds``
(something blocks it) or when any liveness check names a problem (the manager's: a reconcile
running past its bound, an informer blind past its bound); ``/readyz`` fails while any readiness
check names one (caches not synced). The HTTP server runs in its own thread, so a stalled event
loop cannot also stall the answer that reports it. Does not restart anything: the kubelet does, on
a failing probe.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Check = Callable[[], str | None]


class Health:
    def __init__(
        self,
        live: Sequence[Check] = (),
        ready: Sequence[Check] = (),
        stall_seconds: float = 30.0,
    ) -> None:
        self.live, self.ready = list(live), list(ready)
        self.stall_seconds = stall_seconds
        self._beat = time.monotonic()

    async def heartbeat(self, interval: float = 1.0) -> None:
        while True:
            self._beat = time.monotonic()
            await asyncio.sleep(interval)  # the heartbeat's period

    def problem(self) -> str | None:
        """Why the process should be restarted, if it should."""
        stalled = time.monotonic() - self._beat
        if stalled > self.stall_seconds:
            return f"event loop stalled for {stalled:.0f}s"
        return next((p for p in (check() for check in self.live) if p), None)

    def not_ready(self) -> str | None:
        return next((p for p in (check() for check in self.ready) if p), None)

    def serve(self, address: str, port: int) -> ThreadingHTTPServer | None:
        if not port:
            return None
        health = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.startswith("/healthz"):
                    code, problem = 200, health.problem()
                elif self.path.startswith("/readyz"):
                    code, problem = 200, health.not_ready()
                else:
                    code, problem = 404, "not found"
                body = (problem or "ok").encode()
                self.send_response(500 if problem and code == 200 else code)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # probes every few seconds would drown the operator's own log

        server = ThreadingHTTPServer((address, port), Handler)
        threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
        return server
