"""The address substrate a test world stands on: the real one when its binaries are named, else the model.

``hack/substrate.py`` decides the lane (``COZY_SUBSTRATE_BIN``) and runs the real controllers;
``harness/substrate.py`` is the documented model. ``address_substrate(kube)`` starts whichever
the lane says, over the session's MetalLB, and hands back one ``Substrate`` whose few queries mean
the same on both lanes, so an integration test is written once and runs on either.

Does not: decide anything the substrate decides, or hide a difference between the lanes that a test
should see (a test that holds only on one lane says so with ``lane``).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from hack.substrate import Lane, RealSubstrate, driver_kubeconfig, lane, pool_name, real_substrate
from harness.loadbalancer import kubeconfig_of
from harness.substrate import SubstrateModel, substrate
from shared.kube import Kube

# How long the model may take to reach its fixed point after a test's last write.
SETTLE_TIMEOUT: Final = 30.0


@dataclass(frozen=True)
class Substrate:
    """The running substrate: ``model`` on the model lane, ``real`` on the real lane."""

    lane: Lane
    model: SubstrateModel | None = None
    real: RealSubstrate | None = None

    @staticmethod
    def pool(class_name: str) -> str:
        """The MetalLB pool the driver renders for a class (the model names it as the driver does)."""
        return pool_name(class_name)

    async def settled(self) -> None:
        """Until the substrate has nothing left to write: the model's plan is empty; the real
        controllers answer every event in one reconcile, so there is nothing to wait for beyond
        what the test already waited on."""
        if self.model is not None:
            await self.model.wait_for(lambda m: not m.plan(""), SETTLE_TIMEOUT, "the substrate settled")
        elif self.real is not None:
            assert self.real.running(), self.real.log_tail()

    def log_tail(self) -> str:
        if self.real is not None:
            return self.real.log_tail()
        return "\n".join(self.model.log[-20:]) if self.model is not None else ""


@contextlib.asynccontextmanager
async def address_substrate(
    kube: Kube, log_dir: Path | None = None, *, on: Lane | None = None
) -> AsyncIterator[Substrate]:
    """The lane's substrate (``on``: that lane, whatever the environment says) following the cluster
    for the duration (its CRDs and MetalLB's must be installed); on the model lane, its first pass
    done."""
    if (on or lane()) == "real":
        directory = log_dir or Path(tempfile.mkdtemp(prefix="substrate-"))
        async with real_substrate(kube, kubeconfig_of(kube), directory) as real:
            yield Substrate("real", real=real)
        return
    # The model writes as the driver does, under the driver's identity (the admission policy's).
    directory = log_dir or Path(tempfile.mkdtemp(prefix="substrate-"))
    driver = await Kube.connect(
        await driver_kubeconfig(kube, kubeconfig_of(kube), directory / "driver.kubeconfig")
    )
    try:
        async with substrate(driver) as model:
            async with asyncio.timeout(SETTLE_TIMEOUT):
                await model.synced.wait()
            yield Substrate("model", model=model)
    finally:
        await driver.close()
