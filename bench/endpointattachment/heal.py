"""``heal``: how fast a VM-mode attachment is Attached again when its VM goes from two ready backends
back to one (``MultipleBackends`` healing), and how long its rendered Service's Endpoints ever list
two backends for cozy-proxy.

One run starts its own local control plane with the operator (a subprocess, ``--vm-datapath=
cozy-proxy``), the lane's address substrate (``harness/lane.py``), MetalLB's real controller
and the cozy-proxy model (``harness.cozyproxy``, the address-before-Endpoints race on)
following the namespace. One VM with two launcher pods on the test node and a PortList attachment
publishing its ssh port. Each round starts with one pod ready and the attachment Provisioned at it;
the other pod becomes ready (``MultipleBackends``: the address goes dark in the model), then the
first one becomes not ready. Measured per round, from watches of the attachment, the Services, the
v1 Endpoints and the EndpointSlices of the namespace (timestamps on arrival):

* heal: from the answer to the write that took the first pod's readiness to the attachment's
  ``Provisioned=True`` (target: p50 and max at most ``HEAL_TARGET_SECONDS``, 0.3 s, the ratio
  being the figure over it), and to the model's address reaching the remaining pod (context);
* the two-backend window: how long the rendered Service's v1 Endpoints (what cozy-proxy reads) and
  its EndpointSlices list two ready backends, while going dark and while healing (target while
  healing: none at all);
* the address held: the rendered Service's UIDs seen (one: it was never withdrawn) and whether its
  ingress ever lost the address after it was first announced (target: never).

``--heal-rounds`` rounds (default 10). Targets live here, never in tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from hack.devcluster import ClusterInfo, LocalControlPlane
from harness.cozyproxy import CozyProxyModel, cozy_proxy
from harness.ea_cluster import (
    ATTACHMENTS,
    CONDITION_PROVISIONED,
    NODE,
    Tenant,
    attachment_body,
    condition,
    ea_operator,
    ea_world,
)
from harness.following import following, wait_until
from harness.report import Row, duration, percentile, ratio
from harness.substrate import DELETE
from shared.kube import Kube, Obj
from shared.resources import ENDPOINT_SLICES, ENDPOINTS, NAMESPACES, PODS, SERVICES

HEAL_TARGET_SECONDS: Final = 0.3
ROUNDS: Final = 10
NAMESPACE: Final = "bench-heal"
CIDR: Final = "198.51.100.240/29"
SSH: Final = [{"name": "ssh", "protocol": "TCP", "port": 22, "targetPort": 22}]
SELECTOR: Final = {"vm": "vm1"}
PODS_OF_VM: Final = ("vm1-a", "vm1-b")
ATTACHMENT: Final = "ssh"
TIMEOUT: Final = 60.0
SERVICE_NAME_LABEL: Final = "kubernetes.io/service-name"
# The watcher's phase once the rounds are over (the cleanup's deletions are not measured).
DONE: Final = "done"


@dataclasses.dataclass(frozen=True)
class HealOptions:
    rounds: int = ROUNDS


@dataclasses.dataclass
class Window:
    """How long a count stayed at two or more: the total, split by the phase it fell in."""

    since: float | None = None
    phase: str = ""
    totals: dict[str, float] = dataclasses.field(default_factory=dict)

    def saw(self, count: int, now: float, phase: str) -> None:
        if count >= 2 and self.since is None:
            self.since, self.phase = now, phase
        elif count < 2 and self.since is not None:
            self.totals[self.phase] = self.totals.get(self.phase, 0.0) + now - self.since
            self.since = None


class Watcher:
    """Follows the namespace: the attachment's Provisioned condition, the rendered Service (its UID
    and whether it keeps its address), and how many ready backends its Endpoints and slices list."""

    def __init__(self) -> None:
        self.changed = asyncio.Condition()
        self.attachment: Obj | None = None
        self.provisioned: tuple[str, str] | None = None
        self.provisioned_at: dict[tuple[str, str], float] = {}
        self.rendered: str | None = None
        self.uids: set[str] = set()
        self.address: str | None = None
        self.lost_address = False
        self.phase = "setup"
        self.endpoints = Window()
        self.slices = Window()
        self.slice_ready: dict[str, int] = {}

    @staticmethod
    def now() -> float:
        return asyncio.get_running_loop().time()

    def on_attachment(self, kind: str, obj: Obj) -> None:
        if obj["metadata"]["name"] != ATTACHMENT or kind == "DELETED":
            return
        self.attachment = obj
        state = condition(obj, CONDITION_PROVISIONED)
        if state != self.provisioned:
            self.provisioned = state
            self.provisioned_at[state] = self.now()
        name = (obj.get("status") or {}).get("serviceName")
        if name:
            self.rendered = str(name)

    def on_service(self, kind: str, obj: Obj) -> None:
        metadata = obj["metadata"]
        if not str(metadata["name"]).startswith(f"{ATTACHMENT}-") or self.phase == DONE:
            return
        if kind == "DELETED":
            self.lost_address = self.lost_address or self.address is not None
            return
        self.uids.add(str(metadata["uid"]))
        ingress = ((obj.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
        ips = {str(i.get("ip")) for i in ingress if i.get("ip")}
        if self.address is None and ips:
            self.address = sorted(ips)[0]
        elif self.address is not None and self.address not in ips:
            self.lost_address = True

    def on_endpoints(self, kind: str, obj: Obj) -> None:
        if self.rendered is None or obj["metadata"]["name"] != self.rendered:
            return
        ready = (
            0 if kind == "DELETED" else sum(len(s.get("addresses") or []) for s in obj.get("subsets") or [])
        )
        self.endpoints.saw(ready, self.now(), self.phase)

    def on_slice(self, kind: str, obj: Obj) -> None:
        labels = obj["metadata"].get("labels") or {}
        if self.rendered is None or labels.get(SERVICE_NAME_LABEL) != self.rendered:
            return
        ready = [
            e for e in obj.get("endpoints") or [] if (e.get("conditions") or {}).get("ready") is not False
        ]
        self.slice_ready[obj["metadata"]["name"]] = 0 if kind == "DELETED" else len(ready)
        self.slices.saw(sum(self.slice_ready.values()), self.now(), self.phase)

    async def until(self, predicate: Callable[[], bool], what: str) -> None:
        await wait_until(self.changed, predicate, TIMEOUT, lambda: f"{what} (attachment: {self.provisioned})")


@dataclasses.dataclass
class Round:
    to_attached: float
    to_datapath: float


def _dark(address: str) -> Callable[[CozyProxyModel], bool]:
    return lambda model: model.reaches(address) is None


def _reaching(address: str, pod: str) -> Callable[[CozyProxyModel], bool]:
    return lambda model: model.pod_reached(address) == pod


async def _ready(kube: Kube, namespace: str, pod: str, ready: bool, ip: str) -> None:
    status = {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    await kube.patch(PODS.path(namespace, pod) + "/status", {"status": status}, kind="merge")


async def _measure(
    kube: Kube, cluster: ClusterInfo, work: Path, options: HealOptions, say: Callable[[str], None]
) -> tuple[list[Round], Watcher]:
    namespace_body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    await kube.create(NAMESPACES.path(), namespace_body)
    watcher = Watcher()
    rounds: list[Round] = []
    async with contextlib.AsyncExitStack() as stack:
        world = await stack.enter_async_context(ea_world(kube))
        tenant = Tenant(kube, NAMESPACE, world)
        await tenant.address_class("heal", CIDR, reclaim=DELETE)
        await tenant.app("vm1", "VMInstance")
        await tenant.endpoint("vm1", "vm1", kind="VMInstance", selector=SELECTOR, ports=SSH)
        ips = {pod: f"10.244.3.{10 + i}" for i, pod in enumerate(PODS_OF_VM)}
        for i, pod in enumerate(PODS_OF_VM):
            body = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": pod, "labels": SELECTOR},
                "spec": {"nodeName": NODE, "containers": [{"name": "vm", "image": "example.invalid/vm:1"}]},
            }
            await kube.create(PODS.path(NAMESPACE), body)
            await _ready(kube, NAMESPACE, pod, i == 0, ips[pod])
        model: CozyProxyModel = await stack.enter_async_context(cozy_proxy(kube, NAMESPACE))
        handlers: list[tuple[Any, Callable[[str, Obj], None]]] = [
            (ATTACHMENTS, watcher.on_attachment),
            (SERVICES, watcher.on_service),
            (ENDPOINTS, watcher.on_endpoints),
            (ENDPOINT_SLICES, watcher.on_slice),
        ]
        await stack.enter_async_context(following(kube, NAMESPACE, handlers, watcher.changed))
        await stack.enter_async_context(
            ea_operator(kube, cluster, work, extra_args=("--vm-datapath=cozy-proxy",), log_name="heal.log")
        )
        body = attachment_body(
            ATTACHMENT,
            "vm1",
            app="vm1",
            kind="VMInstance",
            class_name="heal",
            method="PortList",
            ports=[22],
        )
        await kube.create(ATTACHMENTS.path(NAMESPACE), body)
        await watcher.until(lambda: watcher.provisioned == ("True", "Provisioned"), "the first Provisioned")
        standing, other = PODS_OF_VM
        say(f"heal: attached at {standing}; {options.rounds} rounds")
        for number in range(options.rounds):
            watcher.phase = "dark"
            await _ready(kube, NAMESPACE, other, True, ips[other])
            await watcher.until(
                lambda: watcher.provisioned == ("False", "MultipleBackends"), "MultipleBackends"
            )
            address = watcher.address or ""
            await model.wait_for(_dark(address), TIMEOUT, "the address dark")
            watcher.phase = "heal"
            await _ready(kube, NAMESPACE, standing, False, ips[standing])
            started = watcher.now()
            await watcher.until(lambda: watcher.provisioned == ("True", "Provisioned"), "healed")
            attached_at = watcher.provisioned_at[("True", "Provisioned")]
            await model.wait_for(_reaching(address, other), TIMEOUT, "the datapath")
            reached = watcher.now()
            rounds.append(Round(attached_at - started, reached - started))
            say(f"heal round {number + 1}: Attached after {duration(attached_at - started)}")
            standing, other = other, standing
        watcher.phase = DONE  # what the cleanup deletes is not the scenario's
        await tenant.cleanup()
    return rounds, watcher


def run(options: HealOptions, say: Callable[[str], None]) -> tuple[list[Row], list[str]]:
    """The scenario on a control plane of its own; its rows and notes."""
    control_plane = LocalControlPlane()
    work = Path(tempfile.mkdtemp(prefix="bench-heal-"))
    with control_plane as cluster:
        say(f"heal: control plane ready in {cluster.ready_seconds or 0:.1f}s")

        async def go() -> tuple[list[Round], Watcher]:
            kube = await Kube.connect(cluster.kubeconfig)
            try:
                return await _measure(kube, cluster, work, options, say)
            finally:
                await kube.close()

        rounds, watcher = asyncio.run(go())
    shutil.rmtree(control_plane.dir, ignore_errors=True)
    return rows(rounds, watcher), [f"heal: the operator's log in {work}"]


def rows(rounds: list[Round], watcher: Watcher) -> list[Row]:
    attached = [r.to_attached for r in rounds]
    reached = [r.to_datapath for r in rounds]
    p50, worst = percentile(attached, 0.5), max(attached)
    target = f"≤ {duration(HEAL_TARGET_SECONDS)}"
    heal_window = watcher.endpoints.totals.get("heal", 0.0)
    dark_window = watcher.endpoints.totals.get("dark", 0.0)
    return [
        Row(
            "heal: two backends -> one, to Attached, p50",
            duration(p50),
            target,
            p50 <= HEAL_TARGET_SECONDS,
            ratio(p50 / HEAL_TARGET_SECONDS),
        ),
        Row(
            "heal: to Attached, max",
            duration(worst),
            target,
            worst <= HEAL_TARGET_SECONDS,
            ratio(worst / HEAL_TARGET_SECONDS),
        ),
        Row(
            "heal: to the address reaching the pod (model), p50 / max",
            f"{duration(percentile(reached, 0.5))} / {duration(max(reached))}",
        ),
        Row(
            "heal: Endpoints listing two backends while healing",
            duration(heal_window),
            "none",
            heal_window == 0.0,
        ),
        Row(
            "going dark: Endpoints listing two backends, per round",
            duration(dark_window / max(1, len(rounds))),
            ratio=f"slices: {duration(watcher.slices.totals.get('dark', 0.0) / max(1, len(rounds)))}",
        ),
        Row(
            "the address held: rendered Services seen / address lost",
            f"{len(watcher.uids)} / {'yes' if watcher.lost_address else 'no'}",
            "1 / no",
            len(watcher.uids) == 1 and not watcher.lost_address,
        ),
    ]
