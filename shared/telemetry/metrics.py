"""Serving an operator's metrics registry.

Decides only that the server starts when the operator starts (``serve``), never at import, on the
operator's own registry, and that a collector computed from the caches runs on the event loop that
owns them (``on_loop``): the server answers scrapes on a thread of its own, and a cache read there
would race the loop's writes (a dictionary changing size, an index naming a key just removed). The
metric families themselves live in ``shared.runtime.metrics`` (controller-runtime's names, common to
both operators) and beside each operator (its domain).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterable
from typing import Final

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

# How long a scrape waits for the loop to compute a collector's families; a loop stalled longer than
# this is /healthz's business, and the scrape answers without those families.
LOOP_COLLECT_TIMEOUT_SECONDS: Final = 5.0


def serve(registry: CollectorRegistry, address: str, port: int) -> None:
    """Serve ``registry`` on ``address:port`` (0: do not serve)."""
    if port:
        start_http_server(port, address, registry=registry)


class OnLoop(Collector):
    """``inner.collect()`` run on ``loop``'s thread, whichever thread scrapes."""

    def __init__(self, inner: Collector, loop: asyncio.AbstractEventLoop) -> None:
        self.inner = inner
        self.loop = loop
        self.thread = threading.get_ident()

    def _families(self) -> list[Metric]:
        return list(self.inner.collect())

    def collect(self) -> Iterable[Metric]:
        if threading.get_ident() == self.thread or not self.loop.is_running():
            return self._families()
        future: concurrent.futures.Future[list[Metric]] = concurrent.futures.Future()

        def compute() -> None:
            if not future.set_running_or_notify_cancel():
                return  # the scrape gave up waiting
            try:
                future.set_result(self._families())
            except Exception as error:  # handed to the scraping thread
                future.set_exception(error)

        self.loop.call_soon_threadsafe(compute)
        try:
            return future.result(LOOP_COLLECT_TIMEOUT_SECONDS)
        except TimeoutError:
            future.cancel()
            return []


def on_loop(inner: Collector) -> Collector:
    """Wrap ``inner`` for the running loop (the operator builds on it); without one, ``inner``."""
    try:
        return OnLoop(inner, asyncio.get_running_loop())
    except RuntimeError:  # built outside a loop (a declaration check): nothing scrapes it
        return inner
