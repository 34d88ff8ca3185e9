"""The cold-start benchmark's baseline, run by ``coldstart`` in a process of its own (``main``).

One plain paged LIST of every Node and of the Pods the GPUClass operator lists (its field selector,
its page size), both kinds at once as the operator's informers list them, each page parsed by the
operator's own client (``shared.kube``) and dropped. It runs in a fresh process, as the operator
does, so neither pays for the other's heap. Prints one JSON line: the LIST's wall and CPU seconds
(connecting is not counted) and how many Nodes and Pods it read.

Decides: the baseline's shape (what is listed, how it is paged and parsed). Does not: fold, keep
or decide anything.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Final

from operators.gpuclass.controller import POD_FIELD_SELECTOR
from shared.kube import Kube, Obj
from shared.resources import NODES, PODS
from shared.runtime.controller import Cache

# The operator's informers page every LIST at a cache's default page size (GPUClass sets none).
PAGE_SIZE: Final[int] = Cache.page_size


async def pages(kube: Kube, path: str, field_selector: str = "") -> AsyncIterator[list[Obj]]:
    """The items of a paged LIST, one page at a time."""
    token = ""
    while True:
        page = await kube.list(path, field_selector=field_selector, limit=PAGE_SIZE, continue_=token)
        yield page.get("items") or []
        token = (page.get("metadata") or {}).get("continue") or ""
        if not token:
            return


async def count(kube: Kube, path: str, field_selector: str = "") -> int:
    counted = 0
    async for items in pages(kube, path, field_selector):
        counted += len(items)
    return counted


async def measure(kubeconfig: str) -> dict[str, float]:
    kube = await Kube.connect(kubeconfig)
    wall, cpu = time.perf_counter(), time.process_time()
    nodes, pods = await asyncio.gather(
        count(kube, NODES.path()), count(kube, PODS.path(), POD_FIELD_SELECTOR)
    )
    figures = {
        "seconds": time.perf_counter() - wall,
        "cpu_seconds": time.process_time() - cpu,
        "nodes": nodes,
        "pods": pods,
    }
    await kube.close()  # not timed; closed, so the process ends without aiohttp's warnings
    return figures


def main(argv: list[str]) -> None:
    """``main([KUBECONFIG])``: measure, and print the figures as one JSON line."""
    print(json.dumps(asyncio.run(measure(argv[0]))), flush=True)


# How ``coldstart`` runs it: with ``python -c``, since ``python -m`` of a module the package's
# ``__init__`` already imported would import it twice.
COMMAND = "import sys; from bench.gpuclass.plainlist import main; main(sys.argv[1:])"
