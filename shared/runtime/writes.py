"""Every write a reconcile makes, once: guarded, traced, and put back into the caches at once.

Decides:

* **status** is written by a JSON patch behind a ``test`` of the object's UID, so a patch meant for
  one incarnation never lands on a successor of the same name; nothing is sent when the patch is
  empty; a 404 means "gone" (None), a refused ``test`` or a 409 is a ``Conflict`` (retry the key);
* **finalizers, owner references and labels** are added by one JSON patch (also UID-guarded) and a
  finalizer is removed behind a ``test`` of its index, so a concurrent writer of another finalizer
  is never erased; ``Finalizer`` is that protocol for one finalizer of ours (hold, releasing,
  release);
* creates and merge patches carry the current pass's traceparent annotation (so the next pass over
  the object links to the pass that wrote it); status writes never do;
* **write-through**: the answer of each write is handed to the kind's informer (``remember``) just
  after the write returns (scheduled on the loop, in the pass's context: no indexer, handler or map
  function runs inside a write), so the pass's next decision sees it (the runtime yields once
  before deciding again), the write's own watch event is recognised as an echo, and the pass that
  wrote is not woken again by it;
* a write is refused locally (``NotLeader``) unless the gate says this replica leads: a leader that
  could not renew its lease stops writing at once, before the lease can pass to another replica;
* what the ``OwnerReferencesPermissionEnforcement`` admission plugin (hardened clusters) asks beyond
  the verb of a write that sets owner references, as ``Write`` declarations for RBAC:
  ``sets_owner_references`` and ``blocks_deletion_of``.

Does not: decide what to write (the pure cores do), retry (the controller does), or delete without
a UID precondition.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from shared.conditions import JsonPatch
from shared.kube import ApiError, Kube, PatchKind
from shared.resources import Resource
from shared.runtime.cache import Informer, Obj, key_of
from shared.runtime.controller import Conflict, NotLeader, Write, wrote
from shared.telemetry.tracing import stamp


def _path(resource: Resource, obj: Mapping[str, Any]) -> str:
    namespace, name = key_of(obj)
    return resource.path(namespace or None, name)


def _after_the_write(deliver: Callable[[Any], None], what: Any) -> None:
    """Hand an answer to its informer once the write has returned (next on the loop, in the current
    context, so the pass's own key is still not woken by it); outside a loop (a tool), at once."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        deliver(what)
        return
    loop.call_soon(deliver, what, context=contextvars.copy_context())


def uid_guard(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON-patch ``test`` that pins a patch to this incarnation of the object."""
    return {"op": "test", "path": "/metadata/uid", "value": (obj.get("metadata") or {}).get("uid")}


class Writer:
    def __init__(
        self,
        kube: Kube,
        informer_of: Callable[[Resource], Informer | None],
        is_leader: Callable[[], bool] = lambda: True,
    ) -> None:
        self.kube, self.informer_of, self.is_leader = kube, informer_of, is_leader

    def _gate(self) -> None:
        if not self.is_leader():
            raise NotLeader("this replica does not hold the leader lease")

    def remember(self, resource: Resource, obj: Obj | None) -> Obj | None:
        """Hand our write's answer to the informer of its kind (if it is watched). An answer with a
        deletion timestamp and no finalizer left is an object this write removed: the informer
        forgets it (its DELETED event may already have been applied; remembering it would keep a
        ghost in the cache for good)."""
        if obj:
            wrote(resource, obj)
        informer = self.informer_of(resource)
        if obj and informer is not None:
            metadata = obj.get("metadata") or {}
            if metadata.get("deletionTimestamp") and not metadata.get("finalizers"):
                _after_the_write(informer.forget, key_of(obj))
            else:
                _after_the_write(informer.remember, obj)
        return obj

    async def create(self, resource: Resource, body: Mapping[str, Any]) -> Obj:
        self._gate()
        namespace = (body.get("metadata") or {}).get("namespace")
        created = await self.kube.create(resource.path(namespace), stamp(body))
        self.remember(resource, created)
        return created

    async def patch(
        self, resource: Resource, obj: Mapping[str, Any], patch: Any, kind: PatchKind = "merge"
    ) -> Obj:
        """A merge patch (stamped with the traceparent) or a JSON patch of the object."""
        self._gate()
        body = stamp(patch) if kind == "merge" else patch
        updated = await self.kube.patch(_path(resource, obj), body, kind=kind)
        self.remember(resource, updated)
        return updated

    async def delete(self, resource: Resource, obj: Mapping[str, Any], *, forget: bool = False) -> bool:
        """Delete exactly this incarnation (UID precondition). False when it was already gone; a
        different incarnation under the name (409) is a ``Conflict``. ``forget``: the kind carries
        no finalizer, so the object is gone once answered: drop it from the cache at once."""
        self._gate()
        try:
            deleted = await self.kube.delete(_path(resource, obj), uid=(obj.get("metadata") or {}).get("uid"))
        except ApiError as error:
            if error.status == 409:
                raise Conflict(str(error)) from None
            raise
        informer = self.informer_of(resource) if forget else None
        if informer is not None:
            _after_the_write(informer.forget, key_of(obj))
        return deleted

    async def patch_status(self, resource: Resource, obj: Mapping[str, Any], ops: JsonPatch) -> Obj | None:
        """Apply a status JSON patch pinned to the object's UID; nothing when ``ops`` is empty.
        Returns the updated object (None when nothing was sent or the object is gone)."""
        if not ops:
            return None
        return await self._json_patch(resource, obj, [uid_guard(obj), *ops], subresource="/status")

    async def ensure_metadata(
        self,
        resource: Resource,
        obj: Obj,
        *,
        finalizer: str | None = None,
        owner_reference: Mapping[str, Any] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> Obj:
        """Add ``finalizer`` and ``owner_reference`` where missing and set ``labels``, in one guarded
        patch (nothing is sent when all of it is there already)."""
        metadata = obj.get("metadata") or {}
        ops: JsonPatch = []
        present = metadata.get("labels")
        wanted = {k: v for k, v in (labels or {}).items() if (present or {}).get(k) != v}
        if wanted and not present:
            ops.append({"op": "add", "path": "/metadata/labels", "value": dict(wanted)})
        else:
            for key, value in sorted(wanted.items()):
                escaped = key.replace("~", "~0").replace("/", "~1")
                ops.append({"op": "add", "path": f"/metadata/labels/{escaped}", "value": value})
        finalizers = metadata.get("finalizers")
        if finalizer and finalizer not in (finalizers or []):
            ops.append(
                {"op": "add", "path": "/metadata/finalizers/-", "value": finalizer}
                if finalizers
                else {"op": "add", "path": "/metadata/finalizers", "value": [finalizer]}
            )
        references = metadata.get("ownerReferences")
        if owner_reference is not None and all(
            r.get("uid") != owner_reference.get("uid") for r in references or []
        ):
            ops.append(
                {"op": "add", "path": "/metadata/ownerReferences/-", "value": dict(owner_reference)}
                if references
                else {"op": "add", "path": "/metadata/ownerReferences", "value": [dict(owner_reference)]}
            )
        if not ops:
            return obj
        updated = await self._json_patch(resource, obj, [uid_guard(obj), *ops])
        return updated if updated is not None else obj

    async def remove_finalizer(self, resource: Resource, obj: Obj, finalizer: str) -> Obj | None:
        """Remove ``finalizer`` (behind a ``test`` of its index); None when the object is gone."""
        finalizers: Sequence[str] = (obj.get("metadata") or {}).get("finalizers") or []
        if finalizer not in finalizers:
            return obj
        index = list(finalizers).index(finalizer)
        ops = [
            uid_guard(obj),
            {"op": "test", "path": f"/metadata/finalizers/{index}", "value": finalizer},
            {"op": "remove", "path": f"/metadata/finalizers/{index}"},
        ]
        return await self._json_patch(resource, obj, ops)

    async def _json_patch(
        self, resource: Resource, obj: Mapping[str, Any], ops: JsonPatch, subresource: str = ""
    ) -> Obj | None:
        self._gate()
        try:
            updated = await self.kube.patch(_path(resource, obj) + subresource, ops)
        except ApiError as error:
            if error.status == 404:
                return None
            if error.status in (409, 422):  # 422: a ``test`` failed — another incarnation, or moved on
                raise Conflict(str(error)) from None
            raise
        self.remember(resource, updated)
        return updated


def sets_owner_references(resource: Resource) -> Write:
    """What ``ensure_metadata(owner_reference=...)`` on an existing object of ``resource`` needs
    beyond ``patch`` where the OwnerReferencesPermissionEnforcement admission plugin runs: ``delete``
    on that object (only who may delete an object may change its owners). Never sent as a request."""
    return Write(resource, ("delete",))


def blocks_deletion_of(owner: Resource) -> Write:
    """What writing an owner reference with ``blockOwnerDeletion: true`` to an object of ``owner``
    needs under the same plugin: ``update`` on the owner's ``finalizers`` subresource (only who may
    finalize an owner may hold up its foreground deletion). Never sent as a request."""
    return Write(owner, ("update",), "finalizers")


class Finalizer:
    """One finalizer of ours on one kind, the whole protocol in one place (as Operator SDK's helper):
    ``hold`` adds it where missing (with the other metadata the pass adds, in one guarded patch),
    ``releasing`` says an object is being deleted and still held by it (the pass must release what it
    holds for the object), ``release`` removes it once that is done. ``writes`` is what it needs for
    RBAC (a patch of the kind), for the wiring to declare."""

    def __init__(self, name: str, resource: Resource) -> None:
        self.name, self.resource = name, resource
        self.writes = Write(resource, ("patch",))

    def held(self, obj: Mapping[str, Any]) -> bool:
        return self.name in ((obj.get("metadata") or {}).get("finalizers") or [])

    def releasing(self, obj: Mapping[str, Any]) -> bool:
        """Being deleted, and still ours to release."""
        return bool((obj.get("metadata") or {}).get("deletionTimestamp")) and self.held(obj)

    async def hold(
        self,
        writer: Writer,
        obj: Obj,
        *,
        owner_reference: Mapping[str, Any] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> Obj:
        return await writer.ensure_metadata(
            self.resource, obj, finalizer=self.name, owner_reference=owner_reference, labels=labels
        )

    async def release(self, writer: Writer, obj: Obj) -> Obj | None:
        return await writer.remove_finalizer(self.resource, obj, self.name)
