"""Live reads: a kind read from the API instead of a cache, declared with the verbs it uses.

Some reads must not come from a cache: a kind read on every pass and never watched (GPUClass reads
the KubeVirt CR), or a check that must see the API's truth before acting on it (who took a name
after a 409, whether a holder is really gone before its address is released). Each is a ``Reads``
made by ``Manager.reads(resource, *verbs)`` when the operator is declared, so the ClusterRole is
derived from the code that reads (``rbac.required_rules``), like the caches' and the writes'.

Decides: that a read uses only the verbs it declared (any other raises at once, in tests as in
production). Does not: cache, retry, or interpret the answer (404 on ``get`` is None, as
``Kube.get``; what a refusal means is the caller's).
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.kube import Kube, Obj
from shared.resources import Resource

GET = "get"
LIST = "list"


@dataclass(frozen=True)
class Reads:
    """The declared live reads of one kind."""

    kube: Kube
    resource: Resource
    verbs: frozenset[str]

    def _check(self, verb: str) -> None:
        if verb not in self.verbs:
            raise PermissionError(
                f"{verb} {self.resource.plural} was not declared (declared: {sorted(self.verbs)})"
            )

    async def get(self, namespace: str | None, name: str) -> Obj | None:
        """The object, or None when it does not exist."""
        self._check(GET)
        return await self.kube.get(self.resource.path(namespace, name))

    async def list(self, namespace: str | None = None) -> Obj:
        """One LIST (no paging: for the few objects of a kind read, never watched)."""
        self._check(LIST)
        return await self.kube.list(self.resource.path(namespace))
