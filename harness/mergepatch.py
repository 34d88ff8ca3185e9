"""RFC 7386 JSON merge patch, as the API server applies a ``merge`` patch, for the tests' small API
models (``harness.memapi``, the substrate model's store).

Decides: how a merge patch changes an object (a null removes the key; a mapping merges; anything else
replaces). Does not: do strategic merge or JSON patch (``jsonpatch`` does RFC 6902)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


def merge_patch(target: Any, patch: Any) -> Any:
    """``target`` with ``patch`` merged in (neither is changed in place)."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    merged = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged
