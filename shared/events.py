"""Kubernetes Events about the objects an operator manages (glue).

Decides the Event's shape: core/v1, one Event per transition (no aggregation or counting), in the
object's namespace or, for cluster-scoped objects, a namespace the operator is configured with.
Events are created through the runtime's ``Writer``, like every other write: a replica that does
not hold the leader lease posts none (``NotLeader`` propagates, as it does for any write).

Does not decide when to emit: each operator emits on condition transitions only, never every pass.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping
from typing import Any, Final

from shared.kube import NO_ANSWER, ApiError, Obj
from shared.resources import EVENTS
from shared.runtime.writes import Writer

log = logging.getLogger(__name__)

# What "could not be posted" means: refused, timed out, or the connection failed. Anything else
# (``NotLeader`` above all: this replica must stop writing) propagates.
POST_FAILURES: Final = (ApiError, *NO_ANSWER)


async def post_event(
    writer: Writer,
    obj: Mapping[str, Any],
    *,
    type_: str,
    reason: str,
    message: str,
    component: str,
    now: str,
    namespace: str | None = None,
) -> None:
    """Best effort: an Event that could not be posted is logged, never retried or raised."""
    event = event_body(
        obj, type_=type_, reason=reason, message=message, component=component, now=now, namespace=namespace
    )
    try:
        await writer.create(EVENTS, event)
    except POST_FAILURES as error:
        log.warning("could not post event %s %s: %s", reason, event["involvedObject"]["name"], error)


def event_body(
    obj: Mapping[str, Any],
    *,
    type_: str,
    reason: str,
    message: str,
    component: str,
    now: str,
    namespace: str | None = None,
) -> Obj:
    """The core/v1 Event about ``obj``."""
    metadata = obj.get("metadata", {})
    target_namespace = metadata.get("namespace") or namespace or "default"
    return {
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
