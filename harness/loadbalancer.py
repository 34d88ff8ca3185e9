"""The integration tests' load balancer: MetalLB's real controller (``hack/metallb.py``). Its
``IPAddressPool`` objects are the address substrate's (its MetalLB driver renders one per class, in
the tests the model ``harness/substrate.py``) or a test's own; it hands out only the address
a Service asks for in ``metallb.io/loadBalancerIPs`` (every pool here is ``autoAssign: false``).

Decides: that a test session runs at most one MetalLB. ``load_balancer(kube)`` starts it on first use
inside ``load_balancer_session()`` (which the session's ``kube`` fixture holds open, so MetalLB stops
before the control plane does) and hands the same one to every later caller; outside such a session
it runs one of its own for the ``async with``.

Does not: write any Service's status (only MetalLB does), declare a pool, or decide which address a
Service gets.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from hack.metallb import MetalLB, metallb
from shared.kube import Kube


@dataclass
class _Session:
    stack: contextlib.AsyncExitStack
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    running: MetalLB | None = None
    log_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="metallb-")))


_session: _Session | None = None


@contextlib.asynccontextmanager
async def load_balancer_session() -> AsyncIterator[None]:
    """While open, every ``load_balancer(kube)`` shares one MetalLB, stopped when this closes."""
    global _session
    async with contextlib.AsyncExitStack() as stack:
        _session = _Session(stack)
        try:
            yield
        finally:
            _session = None


def kubeconfig_of(kube: Kube) -> str:
    """The kubeconfig file ``kube`` was connected with (MetalLB reads the same credentials)."""
    assert kube.kubeconfig, "a client connected from a kubeconfig file"
    return kube.kubeconfig


@contextlib.asynccontextmanager
async def load_balancer(kube: Kube, kubeconfig: str | None = None) -> AsyncIterator[MetalLB]:
    """MetalLB answering the Services of ``kube``'s cluster from the pools declared there."""
    session = _session
    if session is None:
        log = Path(tempfile.mkdtemp(prefix="metallb-")) / "metallb.log"
        async with metallb(kube, kubeconfig or kubeconfig_of(kube), log) as running:
            yield running
        return
    async with session.lock:
        if session.running is None or not session.running.running():
            session.running = await session.stack.enter_async_context(
                metallb(kube, kubeconfig or kubeconfig_of(kube), session.log_dir / "metallb.log")
            )
        running = session.running
    yield running
