"""The integration tests' load balancer: MetalLB's real controller (``hack/metallb.py``), with an
``IPAddressPool`` declared for each ``IPAddressClass`` as a hoster would (``autoAssign: false``, so it
hands out only the address a rendered Service asks for in ``metallb.io/loadBalancerIPs``).

Decides: that a test session runs at most one MetalLB. ``load_balancer(kube)`` starts it on first use
inside ``load_balancer_session()`` (which the session's ``kube`` fixture holds open, so MetalLB stops
before the control plane does) and hands the same one to every later caller; outside such a session
it runs one of its own for the ``async with``. ``SILENT_LOAD_BALANCER_CLASS`` is the
``loadBalancerClass`` no load balancer here serves: a class that names it plays a load balancer that
never answers.

Does not: write any Service's status (only MetalLB does), or decide which address a Service gets.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from hack.metallb import MetalLB, metallb
from shared.kube import Kube

# MetalLB here runs without --lb-class, so it answers only Services without a loadBalancerClass; a
# class naming this one renders Services nothing will ever answer (AddressPending for good).
SILENT_LOAD_BALANCER_CLASS: Final = "example.com/silent-load-balancer"


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


def _kubeconfig_of(kube: Kube) -> str:
    """The kubeconfig file ``kube`` was connected with (MetalLB reads the same credentials)."""
    return str(kube.api.auth.kubeconfig.path)


@contextlib.asynccontextmanager
async def load_balancer(kube: Kube, kubeconfig: str | None = None) -> AsyncIterator[MetalLB]:
    """MetalLB answering the rendered Services of ``kube``'s cluster, its pools mirroring the classes
    there are now (and following them while the ``async with`` lasts)."""
    session = _session
    if session is None:
        log = Path(tempfile.mkdtemp(prefix="metallb-")) / "metallb.log"
        async with metallb(kube, kubeconfig or _kubeconfig_of(kube), log) as running:
            yield running
        return
    async with session.lock:
        if session.running is None or not session.running.running():
            session.running = await session.stack.enter_async_context(
                # The session's control plane may stop first: its pools go with it.
                metallb(
                    kube,
                    kubeconfig or _kubeconfig_of(kube),
                    session.log_dir / "metallb.log",
                    remove_pools=False,
                )
            )
        running = session.running
    await running.wait_for_pools()
    yield running
