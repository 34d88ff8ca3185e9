"""How many Python calls one Pod update takes on its way to its pass's first write, through the runtime.

Run ``python -m tests.callpath`` (``-v [N]``: the N busiest functions). A WholeIP attachment of a VM
is Provisioned on in-memory stores; then its launcher pod's labels change so that a chart's own
cozy-proxy Service selects it too. The Pod handlers (predicates, map functions), the queue and the
pass (read model, planner, glue) run until the first write (the attachment's Service withdrawn).
Every Python call in between is counted with ``sys.setprofile``: those in the project's files (the
figure issue 28 asks for, at most 300), and all of them, libraries included.
"""

from __future__ import annotations

import asyncio
import copy
import sys
from collections import Counter
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any

from opentelemetry.trace import NoOpTracerProvider
from prometheus_client import CollectorRegistry

from operators.endpointattachment.controller import ATTACHMENT_CONTROLLER, AttachmentReconciler
from operators.endpointattachment.render import RenderSettings
from operators.endpointattachment.world import World
from shared.resources import PODS
from shared.runtime.controller import Controller
from shared.runtime.metrics import ControllerMetrics, QueueMetrics
from shared.telemetry.tracing import Tracing
from tests.ea_builders import (
    CREATED,
    lineage_labels,
    make_attachment,
    make_claim,
    make_class,
    make_endpoints,
    make_endpointslice,
    make_helmrelease,
    make_pod,
    make_service,
)
from tests.ea_caches import KINDS, RecordingWriter, caches_of, put

NS = "tenant-a"
SELECTOR = {"vm.kubevirt.io/name": "vm1"}
CHART_SELECTOR = {"app": "vm1-chart"}
PROXY_LABEL = "service.kubernetes.io/service-proxy-name"
V = make_attachment(
    "vm1-public", uid="ea-v", app_kind="VMInstance", app_name="vm1", endpoint="vm-vm1", method="WholeIP"
)
KEY = (NS, "vm1-public")
ADDRESS = "198.51.100.7"
PROJECT = str(Path(__file__).resolve().parent.parent)


class Profile:
    """Counts Python calls until ``stop``; the files they were in."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.functions: Counter[str] = Counter()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            self.calls[code.co_filename] += 1
            self.functions[f"{code.co_filename}:{code.co_name}"] += 1

    def project_calls(self) -> dict[str, int]:
        """The calls in the project's own files (not its virtualenv's libraries), by file."""
        return {f: n for f, n in self.calls.items() if f.startswith(PROJECT) and "/.venv/" not in f}

    def stop(self) -> None:
        sys.setprofile(None)


async def settled() -> tuple[Controller, RecordingWriter, Any]:
    caches = caches_of(
        put("attachment", V),
        put(
            "helmrelease",
            make_helmrelease(
                "vm-vm1", labels=lineage_labels(kind="VMInstance", name="vm1", tenant_facing=False)
            ),
        ),
        put(
            "service",
            make_service(
                "vm-vm1",
                labels=lineage_labels(kind="VMInstance", name="vm1"),
                selector=SELECTOR,
                ports=[{"port": 22}],
            ),
        ),
        put("claim", make_claim("vm1-public-abcde", owner=V)),
        put("class", make_class()),
        put("pod", make_pod("virt-launcher", labels=SELECTOR)),
        put("pod", make_pod("virt-launcher-b", uid="pod-uid-2", labels={})),
        put("slice", make_endpointslice("vm-vm1")),
        put(
            "service", make_service("vm1-chart", labels={PROXY_LABEL: "cozy-proxy"}, selector=CHART_SELECTOR)
        ),
    )
    writer = RecordingWriter(caches)
    world = World(caches, RenderSettings(proxy_name="cozy-proxy"))
    reconciler = AttachmentReconciler(world, writer, wall_clock=lambda: datetime.fromisoformat(CREATED))
    registry = CollectorRegistry()
    controller = Controller(
        ATTACHMENT_CONTROLLER,
        reconciler,
        caches,
        metrics=ControllerMetrics(registry),
        queue_metrics=QueueMetrics(registry),
        tracing=Tracing(NoOpTracerProvider(), "callpath"),
    )
    await controller.reconcile_once(KEY)  # creates the Service
    name = next(c[2] for c in writer.calls if c[:2] == ("create", "services"))
    services = caches.store(KINDS["service"])
    ours = copy.deepcopy(services.get((NS, name)) or {})
    ours["status"] = {"loadBalancer": {"ingress": [{"ip": ADDRESS}]}}
    services.upsert(ours)
    caches.store(KINDS["endpoints"]).upsert(make_endpoints(name))
    for _ in range(3):
        await controller.reconcile_once(KEY)
    writer.calls.clear()
    return controller, writer, caches


async def measure() -> tuple[Profile, list[tuple[str, str, str]]]:
    controller, writer, caches = await settled()
    pods = caches.store(PODS)
    old = pods.get((NS, "virt-launcher"))
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {**SELECTOR, **CHART_SELECTOR}
    new["metadata"]["resourceVersion"] = "9"
    handlers = [h for resource, h in controller.handlers() if resource == PODS]
    profile = Profile()
    for verb in ("patch", "patch_status", "delete", "create"):
        original = getattr(writer, verb)

        async def stopping(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            profile.stop()
            return await _original(*args, **kwargs)

        setattr(writer, verb, stopping)
    sys.setprofile(profile)
    pods.upsert(new)  # the informer's store takes the change, then its handlers run
    for handler in handlers:
        handler(old, new)
    key = await controller.queue.get()
    await controller.reconcile_once(key)
    profile.stop()
    return profile, list(writer.calls)


def main() -> None:
    profile, calls = asyncio.run(measure())
    total = sum(profile.calls.values())
    ours = profile.project_calls()
    print(f"writes: {calls}")
    print(f"{sum(ours.values())} calls in {len(ours)} project files before the first write")
    print(f"({total} Python calls in {len(profile.calls)} files, libraries included)")
    for name, count in profile.calls.most_common():
        print(f"{count:5d}  {name}")
    if "-v" in sys.argv:
        for name, count in profile.functions.most_common(int(sys.argv[-1]) if sys.argv[-1].isdigit() else 40):
            print(f"{count:5d}  {name}")


if __name__ == "__main__":
    main()
