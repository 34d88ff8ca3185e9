"""Owner references: build one, and tell whether an object is controlled by a given owner.

Decides: the owner reference that points at an object (from its apiVersion, kind, name and UID), whether
an object carries a controller reference with a given UID, which owners of a kind it names, and its
single controller.

Does not: look at labels or names. Labels and names can be written by anyone, so they are never proof
of ownership; only an owner reference carrying the owner's UID is. It also never decides whether to
adopt an object: callers that find no reference leave the object alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shared.resources import Resource, group_of


def owner_reference(obj: Mapping[str, Any], controller: bool, block_owner_deletion: bool) -> dict[str, Any]:
    """A reference to ``obj`` for another object's ``metadata.ownerReferences``.

    Raises ValueError when ``obj`` lacks any of apiVersion, kind, name or UID: a reference without a UID
    would let garbage collection and "is this ours" checks match a different incarnation.
    """
    metadata = obj.get("metadata") or {}
    fields = {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "name": metadata.get("name"),
        "uid": metadata.get("uid"),
    }
    missing = sorted(key for key, value in fields.items() if not isinstance(value, str) or not value)
    if missing:
        raise ValueError(f"cannot reference an object without {', '.join(missing)}")
    return {**fields, "controller": controller, "blockOwnerDeletion": block_owner_deletion}


def owner_references(obj: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    """The object's owner references, empty when it has none."""
    references = (obj.get("metadata") or {}).get("ownerReferences") or ()
    return [ref for ref in references if isinstance(ref, Mapping)]


def is_controlled_by(obj: Mapping[str, Any], owner_uid: str) -> bool:
    """Whether ``obj`` carries a controller reference to the owner with this UID."""
    if not owner_uid:
        return False
    return any(ref.get("controller") is True and ref.get("uid") == owner_uid for ref in owner_references(obj))


def has_owner(obj: Mapping[str, Any], owner_uid: str) -> bool:
    """Whether ``obj`` carries any owner reference (controller or not) with this UID."""
    return bool(owner_uid) and any(ref.get("uid") == owner_uid for ref in owner_references(obj))


def owner_uids(
    obj: Mapping[str, Any], kind: str | None = None, api_group: str | None = None
) -> tuple[str, ...]:
    """UIDs of the object's owners, in reference order, optionally only those of one kind (and API group).

    ``api_group`` matches the group part of the reference's apiVersion at any version, so an owner
    recorded at an older version of its API still counts.
    """
    return tuple(
        str(ref["uid"])
        for ref in owner_references(obj)
        if isinstance(ref.get("uid"), str)
        and ref["uid"]
        and (kind is None or ref.get("kind") == kind)
        and (api_group is None or group_of(str(ref.get("apiVersion", ""))) == api_group)
    )


def sole_controller(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The object's controller reference, or None when it has none or (invalidly) more than one."""
    found: Mapping[str, Any] | None = None
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            if found is not None:
                return None  # two controllers: none is the controller
            found = ref
    return found


def names_kind(ref: Mapping[str, Any], resource: Resource) -> bool:
    """Whether an owner reference names an object of ``resource``'s kind: its kind and its group, at
    any version (an owner recorded at an older version of its API still counts)."""
    return ref.get("kind") == resource.kind and group_of(str(ref.get("apiVersion") or "")) == resource.group
