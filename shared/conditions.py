"""Status conditions in the ``metav1.Condition`` shape, and the JSON patch that stores a status.

Decides: what a condition list becomes when an operator sets its computed conditions
(``lastTransitionTime`` is kept unless ``status`` flips; ``observedGeneration`` is stamped on each),
whether a stored status differs from a computed one (ignoring timestamps), and the smallest JSON
patch that turns one into the other: an empty patch means "write nothing".

Does not: read a clock (callers pass ``now``), talk to the API, or know any operator's condition
types and reasons. Conditions of types the caller does not compute are left exactly as they are:
each changed condition is replaced at its index behind a ``test`` of its type, never by replacing
the whole list, so two writers of different condition types cannot erase each other's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

TRUE: Final = "True"
FALSE: Final = "False"
UNKNOWN: Final = "Unknown"

JsonPatch = list[dict[str, Any]]

# Fields compared when deciding whether a stored condition is already what we would write.
_COMPARED_FIELDS: Final = ("status", "reason", "message", "observedGeneration")


@dataclass(frozen=True)
class Condition:
    """A computed condition, before it gets its timestamps and generation."""

    type: str
    status: str
    reason: str
    message: str = ""


def rfc3339(moment: datetime) -> str:
    """Kubernetes' ``metav1.Time`` text: UTC, whole seconds, ``Z`` suffix."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def find(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    for condition in conditions or ():
        if condition.get("type") == type_:
            return condition
    return None


def is_true(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> bool:
    condition = find(conditions, type_)
    return condition is not None and condition.get("status") == TRUE


def render(desired: Condition, stored: Mapping[str, Any] | None, generation: int, now: str) -> dict[str, Any]:
    """The condition to store: ``lastTransitionTime`` moves only when ``status`` flips."""
    keep_time = stored is not None and stored.get("status") == desired.status
    return {
        "type": desired.type,
        "status": desired.status,
        "reason": desired.reason,
        "message": desired.message,
        "observedGeneration": generation,
        "lastTransitionTime": (stored or {}).get("lastTransitionTime", now) if keep_time else now,
    }


def same_condition(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Equal for every purpose but timestamps."""
    return all(a.get(field) == b.get(field) for field in ("type", *_COMPARED_FIELDS))


def status_patch(
    stored_status: Mapping[str, Any] | None,
    fields: Mapping[str, Any],
    conditions: Sequence[Condition],
    generation: int,
    now: str,
) -> JsonPatch:
    """The JSON patch (RFC 6902) that stores ``fields`` and ``conditions`` under ``/status``.

    ``fields`` maps top-level status keys to values; ``None`` removes the key. ``observedGeneration``
    is always one of the fields. An empty result means the stored status already says all of it.
    """
    stored = dict(stored_status or {})
    ops: JsonPatch = []
    if stored_status is None:
        ops.append({"op": "add", "path": "/status", "value": {}})
    for key, value in {**fields, "observedGeneration": generation}.items():
        path = f"/status/{_escape(key)}"
        if value is None:
            if key in stored:
                ops.append({"op": "remove", "path": path})
        elif key not in stored:
            ops.append({"op": "add", "path": path, "value": value})
        elif stored[key] != value:
            ops.append({"op": "replace", "path": path, "value": value})

    stored_conditions: list[Mapping[str, Any]] = list(stored.get("conditions") or [])
    if "conditions" not in stored:
        wanted = [render(c, None, generation, now) for c in conditions]
        if wanted:
            ops.append({"op": "add", "path": "/status/conditions", "value": wanted})
        return ops
    for desired in conditions:
        index = next((i for i, c in enumerate(stored_conditions) if c.get("type") == desired.type), None)
        if index is None:
            ops.append(
                {"op": "add", "path": "/status/conditions/-", "value": render(desired, None, generation, now)}
            )
            continue
        current = stored_conditions[index]
        wanted_condition = render(desired, current, generation, now)
        if not same_condition(current, wanted_condition):
            path = f"/status/conditions/{index}"
            ops.append({"op": "test", "path": f"{path}/type", "value": desired.type})
            ops.append({"op": "replace", "path": path, "value": wanted_condition})
    return ops


def _escape(key: str) -> str:
    """JSON pointer escaping (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")
