"""Kubernetes Events about the objects an operator manages (glue).

Decides the Event's shape: core/v1, one Event per transition (no aggregation or counting), in the
object's namespace or, for cluster-scoped objects, a namespace the operator is configured with.
Does not decide when to emit: each operator emits on condition transitions only, never every pass.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping
from typing import Any

from shared.kube import EVENTS, ApiError, Kube

log = logging.getLogger(__name__)


async def post_event(
    kube: Kube,
    obj: Mapping[str, Any],
    *,
    type_: str,
    reason: str,
    message: str,
    component: str,
    now: str,
    namespace: str | None = None,
) -> None:
    """Best effort: an Event that cannot be posted is logged, never retried or raised."""
    metadata = obj.get("metadata", {})
    target_namespace = metadata.get("namespace") or namespace or "default"
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{metadata.get('name', 'object')}.", "namespace": target_namespace},
        "involvedObject": {
            "apiVersion": obj.get("apiVersion"),
            "kind": obj.get("kind"),
            "name": metadata.get("name"),
            "namespace": metadata.get("namespace"),
            "uid": metadata.get("uid"),
            "resourceVersion": metadata.get("resourceVersion"),
        },
        "type": type_,
        "reason": reason,
        "message": message[:1024],
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": socket.gethostname(),
    }
    try:
        await kube.create(EVENTS.path(target_namespace), event)
    except ApiError as error:
        log.warning("could not post event %s %s: %s", reason, metadata.get("name"), error)
