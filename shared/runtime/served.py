"""Kinds that may not be served yet: an informer whose CRD is installed after the operator started.

A platform component the operator consumes (Cozystack's address substrate, say) is installed on its
own schedule: its CRDs may arrive after the operator, or go away and come back. controller-runtime
fails to start a cache for a kind it cannot map; this runtime instead treats "not served" as a
truthful, complete and empty world, and starts listing the moment the kind is served, without a
restart and without polling.

Decides:

* **when a kind counts as served**: its CustomResourceDefinition (named ``<plural>.<group>``) is in
  the CRD cache with condition ``Established=True`` (the API server serves it from then on);
* **what an informer of an optional kind does** (``Informer(..., gate=...)``): a LIST answered 404
  while its CRD is not established means the kind is not served: every object it still holds is
  delivered as deleted (a CRD's deletion takes its objects with it), it counts as synced (nothing of
  that kind exists, so nothing is hidden from a pass) and it waits for the CRD to be established,
  then lists again. A 404 while the CRD *is* established (the API server catching up) is an ordinary
  failure: the informer backs off and lists again;
* **the CRD cache** is one informer over every CRD, slimmed on arrival (``slim_crd``: name, version,
  group, plural and the Established condition), so a cluster's large schemas are never kept. A
  wiring that must wake keys when a kind starts or stops being served watches ``CRDS`` like any
  kind, and a reconciler asks ``Caches.served(resource)``.

* **an optional built-in kind** (``RecheckGate``, ``Cache(optional=True, built_in=True)``: a
  Kubernetes API group the API server may not serve, e.g. DRA's ``resource.k8s.io/v1``): no CRD says
  when it starts being served (an API server enables a group when it starts), so while it is not
  served its informer lists again every ``BUILT_IN_RECHECK_SECONDS``; otherwise as above.

Does not: install or read any schema, or decide what a missing kind means for a controller (its
reconciler does, from ``served``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from shared.kube import Obj
from shared.resources import CRDS, Resource

__all__ = [
    "BUILT_IN_RECHECK_SECONDS",
    "CRDS",
    "ESTABLISHED",
    "NOT_FOUND",
    "RecheckGate",
    "Served",
    "ServedGate",
    "crd_name",
    "established",
    "slim_crd",
]

# The CRD condition the API server sets once it serves the kind's endpoints.
ESTABLISHED: Final = "Established"
# What a LIST of a kind the API server does not serve answers.
NOT_FOUND: Final = 404
# An optional built-in kind not served is listed again this often (an API server that starts serving
# its group has restarted: minutes are soon enough, and the LIST of a kind not served costs nothing).
BUILT_IN_RECHECK_SECONDS: Final = 300.0


def crd_name(resource: Resource) -> str:
    """The name of the CRD that defines ``resource``: ``<plural>.<group>``."""
    group = resource.api_version.rsplit("/", 1)[0] if "/" in resource.api_version else ""
    return f"{resource.plural}.{group}"


def established(crd: Mapping[str, Any] | None) -> bool:
    """Whether a CRD (slim or whole) says the API server serves its kind."""
    conditions = ((crd or {}).get("status") or {}).get("conditions") or ()
    return any(
        isinstance(c, Mapping) and c.get("type") == ESTABLISHED and c.get("status") == "True"
        for c in conditions
    )


def slim_crd(crd: Obj) -> Obj:
    """What the CRD cache keeps of a CRD: enough to name it and to know whether it is served."""
    metadata = crd.get("metadata") or {}
    conditions = ((crd.get("status") or {}).get("conditions")) or ()
    return {
        "apiVersion": crd.get("apiVersion", CRDS.api_version),
        "kind": crd.get("kind", "CustomResourceDefinition"),
        "metadata": {
            key: metadata[key] for key in ("name", "uid", "resourceVersion", "generation") if key in metadata
        },
        "status": {
            "conditions": [
                {"type": c.get("type"), "status": c.get("status")}
                for c in conditions
                if isinstance(c, Mapping) and c.get("type") == ESTABLISHED
            ]
        },
    }


class ServedGate:
    """Whether one optional kind is served, and a way to wait until it is."""

    def __init__(self, name: str) -> None:
        self.name = name  # the CRD's name
        self._served = asyncio.Event()

    def served(self) -> bool:
        return self._served.is_set()

    async def wait_served(self) -> None:
        await self._served.wait()

    def set(self, served: bool) -> None:
        if served:
            self._served.set()
        else:
            self._served.clear()


class RecheckGate(ServedGate):
    """The gate of an optional built-in kind: no CRD tells when it is served, so an informer that
    found it not served waits ``every`` seconds and lists again (a LIST that answers is served)."""

    def __init__(
        self,
        name: str,
        every: float = BUILT_IN_RECHECK_SECONDS,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        super().__init__(name)
        self.every, self._sleep = every, sleep

    def served(self) -> bool:
        return False  # a 404 of a built-in kind always means "not served"

    async def wait_served(self) -> None:
        await self._sleep(self.every)

    def set(self, served: bool) -> None:
        pass  # no CRD cache keeps this gate


class Served:
    """The gates of every optional kind, kept by the CRD cache's change handler."""

    def __init__(self) -> None:
        self._gates: dict[str, ServedGate] = {}
        self._established: set[str] = set()  # every CRD seen established (a gate may come later)

    def gate(self, resource: Resource) -> ServedGate:
        name = crd_name(resource)
        gate = self._gates.get(name)
        if gate is None:
            gate = self._gates[name] = ServedGate(name)
            gate.set(name in self._established)
        return gate

    def __call__(self, old: Obj | None, new: Obj | None) -> None:
        """The CRD cache's change handler: a CRD added, changed or deleted."""
        crd = new if new is not None else old
        if crd is None:
            return
        name = str((crd.get("metadata") or {}).get("name") or "")
        now = new is not None and established(new)
        if now:
            self._established.add(name)
        else:
            self._established.discard(name)
        gate = self._gates.get(name)
        if gate is not None:
            gate.set(now)
