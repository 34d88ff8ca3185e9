"""The EndpointAttachment cold start's baseline, run by ``coldstart`` in a process of its own (``main``).

One plain paged LIST of every kind the operator's informers list, read from its wiring
(``informer_lists``: the kinds ``Wiring.resources`` names, each with the selectors its ``Cache``
declares), all kinds at once as the informers list them, at the informers' page size, each page
parsed by the operator's own client (``shared.kube``) and dropped. It runs in a fresh process, as the
operator does, so neither pays for the other's heap. Prints one JSON line: the LIST's wall and CPU
seconds (connecting is not counted), when it finished (Unix time: the parent measures spawn to
listed, interpreter and client start included, as it measures the operator) and how many objects of
each kind it read.

Decides: the baseline's shape (what is listed, how it is paged and parsed). Does not: fold, index,
keep or decide anything (the GPUClass baseline's ``pages`` and ``count`` do the paging).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from bench.gpuclass.plainlist import PAGE_SIZE, count
from operators.endpointattachment.controller import ATTACHMENT_CONTROLLER
from shared.kube import Kube
from shared.runtime.controller import Cache, Wiring


@dataclass(frozen=True)
class InformerList:
    """What one informer lists: a kind's cluster-wide path and its field selector."""

    plural: str
    path: str
    field_selector: str = ""


def informer_lists(wiring: Wiring) -> list[InformerList]:
    """The LIST of each kind the manager starts an informer for (``Manager.declare_caches``: every kind
    the wiring touches, cached as its ``caches`` declare, else whole). A cache the baseline cannot list
    the same way (a label selector, another page size) is refused, not listed differently."""
    declared = {spec.resource: spec for spec in wiring.caches}
    lists = []
    for resource in wiring.resources():
        spec = declared.get(resource, Cache(resource))
        if spec.label_selector or spec.page_size != PAGE_SIZE:
            raise ValueError(f"{resource.plural}: the baseline pages by {PAGE_SIZE} with no label selector")
        lists.append(InformerList(resource.plural, resource.path(), spec.field_selector))
    return lists


# What the operator's informers list (the baseline and the benchmark's checks read the same).
LISTS: Final = informer_lists(ATTACHMENT_CONTROLLER)


async def measure(kubeconfig: str, lists: Sequence[InformerList] = LISTS) -> dict[str, object]:
    kube = await Kube.connect(kubeconfig)
    wall, cpu = time.perf_counter(), time.process_time()
    counted = await asyncio.gather(*(count(kube, spec.path, spec.field_selector) for spec in lists))
    seconds, cpu_seconds = time.perf_counter() - wall, time.process_time() - cpu
    await kube.close()
    return {
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "objects": {spec.plural: n for spec, n in zip(lists, counted, strict=True)},
        "finished_at": time.time(),  # the parent times spawn -> listed with it
    }


def main(argv: list[str]) -> None:
    """``main([KUBECONFIG])``: measure, and print the figures as one JSON line."""
    print(json.dumps(asyncio.run(measure(argv[0]))), flush=True)


# How ``coldstart`` runs it (``python -c``, as the GPUClass baseline: no second import of the module).
COMMAND: Final = "import sys; from bench.endpointattachment.listing import main; main(sys.argv[1:])"
