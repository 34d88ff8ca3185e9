"""Kubernetes Events about the objects an operator manages (glue).

Decides the Event's shape, in one API, ``events.k8s.io/v1`` (``regarding``, ``reportingController``,
``reportingInstance``, ``action``, ``reason``, ``note``, ``type``, ``eventTime``), recorded by
``Recorder``: in the object's namespace or, for a cluster-scoped object, in ``default`` (the API
refuses an Event with an ``eventTime`` about a cluster-scoped object anywhere but ``default`` and
``kube-system``; Kubernetes' own recorders use ``default``). A repeat of
  the last Event of the same object and reason, with the same note, within ``SERIES_WINDOW_SECONDS``
  is no new Event: the first one's ``series`` (count, lastObservedTime) is patched. Every write about
  one object spends a token of a bucket (``BURST`` tokens, one back every ``REFILL_SECONDS``): a
  flapping object posts at most that, whatever it does; a repeat over budget is counted in memory
  and its count lands with the next write the bucket allows. What is remembered is lost on a
  restart (the next occurrence is a new Event).

Events are created through the runtime's ``Writer``, like every other write: a replica that does
not hold the leader lease posts none (``NotLeader`` propagates, as it does for any write). An Event
that could not be posted is logged, never retried or raised.

Does not decide when to emit: each operator emits on transitions only, never every pass.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from shared.kube import NO_ANSWER, ApiError, Obj
from shared.resources import EVENTS_V1
from shared.runtime.writes import Writer

log = logging.getLogger(__name__)

# What "could not be posted" means: refused, timed out, or the connection failed. Anything else
# (``NotLeader`` above all: this replica must stop writing) propagates.
POST_FAILURES: Final = (ApiError, *NO_ANSWER)


# --- events.k8s.io/v1, aggregated and bounded per object ------------------------------------------

# A repeat (same object, reason and note) this soon after the last one patches its series.
SERIES_WINDOW_SECONDS: Final = 600.0
# Writes (creates and series patches) one object may spend at once, and how fast they come back:
# at most BURST + elapsed / REFILL_SECONDS writes about one object, however fast it flaps.
BURST: Final = 16
REFILL_SECONDS: Final = 300.0
# The API's bounds (events.k8s.io/v1 validation).
NOTE_MAX: Final = 1024
INSTANCE_MAX: Final = 128
NAME_MAX: Final = 253
# Where Events about cluster-scoped objects go (client-go's recorders put them there too).
CLUSTER_NAMESPACE: Final = "default"


def micro_time(moment: datetime) -> str:
    """An ``eventTime`` / ``lastObservedTime`` (MicroTime: RFC 3339 with microseconds, UTC)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_v1_body(
    regarding: Mapping[str, Any],
    *,
    type_: str,
    reason: str,
    action: str,
    note: str,
    controller: str,
    instance: str,
    now: datetime,
) -> Obj:
    """The events.k8s.io/v1 Event about ``regarding``, in its namespace (a cluster-scoped object's
    in ``CLUSTER_NAMESPACE``), named ``<object>.<nanoseconds, hex>`` as Kubernetes' recorders name
    theirs (this API refuses a ``generateName`` ending in a dot)."""
    metadata = regarding.get("metadata") or {}
    suffix = f".{int(now.timestamp() * 1e9):x}"
    return {
        "apiVersion": EVENTS_V1.api_version,
        "kind": "Event",
        "metadata": {
            "name": str(metadata.get("name") or "object")[: NAME_MAX - len(suffix)] + suffix,
            "namespace": metadata.get("namespace") or CLUSTER_NAMESPACE,
        },
        "regarding": {
            "apiVersion": regarding.get("apiVersion"),
            "kind": regarding.get("kind"),
            "name": metadata.get("name"),
            "namespace": metadata.get("namespace"),
            "uid": metadata.get("uid"),
            "resourceVersion": metadata.get("resourceVersion"),
        },
        "eventTime": micro_time(now),
        "reportingController": controller,
        "reportingInstance": instance[:INSTANCE_MAX],
        "action": action,
        "reason": reason,
        "note": note[:NOTE_MAX],
        "type": type_,
    }


@dataclass
class _Series:
    """The last Event of one reason about one object: its name, note and count."""

    namespace: str
    name: str
    note: str
    count: int
    last: float  # when last observed (the recorder's clock)


@dataclass
class _Object:
    """What the recorder remembers of one object (one incarnation: its UID)."""

    uid: str
    tokens: float
    refilled: float
    series: dict[str, _Series] = field(default_factory=dict)


class Recorder:
    """Records events.k8s.io/v1 Events about namespaced and cluster-scoped objects: see the module
    docstring."""

    def __init__(
        self,
        writer: Writer,
        controller: str,
        instance: str | None = None,
        *,
        window: float = SERIES_WINDOW_SECONDS,
        burst: int = BURST,
        refill_seconds: float = REFILL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.writer, self.controller = writer, controller
        self.instance = instance or socket.gethostname()
        self.window, self.burst, self.refill_seconds = window, burst, refill_seconds
        self.clock, self.wall_clock = clock, wall_clock
        self._objects: dict[tuple[str, str], _Object] = {}

    def forget(self, namespace: str, name: str) -> None:
        """The object is gone: drop what is remembered of it."""
        self._objects.pop((namespace, name), None)

    def _object(self, regarding: Mapping[str, Any], now: float) -> _Object:
        metadata = regarding.get("metadata") or {}
        key = (str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))
        uid = str(metadata.get("uid") or "")
        known = self._objects.get(key)
        if known is None or known.uid != uid:
            known = self._objects[key] = _Object(uid, float(self.burst), now)
        known.tokens = min(float(self.burst), known.tokens + (now - known.refilled) / self.refill_seconds)
        known.refilled = now
        known.series = {r: s for r, s in known.series.items() if now - s.last <= self.window}
        return known

    async def record(
        self, regarding: Mapping[str, Any], *, type_: str, reason: str, action: str, note: str
    ) -> str:
        """Record one occurrence. Returns what was done: ``created`` (a new Event), ``series`` (the
        last one's series patched), ``suppressed`` (over the object's budget: counted, not sent) or
        ``failed`` (the API refused or did not answer: logged)."""
        now = self.clock()
        known = self._object(regarding, now)
        note = note[:NOTE_MAX]
        series = known.series.get(reason)
        repeat = series is not None and series.note == note
        if series is not None and repeat:
            series.count += 1
            series.last = now
        if known.tokens < 1:
            log.debug("event %s about %s suppressed (over its budget)", reason, known.uid)
            return "suppressed"
        known.tokens -= 1
        if series is not None and repeat:
            if await self._patch_series(series):
                return "series"
            known.series.pop(reason, None)  # expired or refused: a new Event below
        body = event_v1_body(
            regarding,
            type_=type_,
            reason=reason,
            action=action,
            note=note,
            controller=self.controller,
            instance=self.instance,
            now=self.wall_clock(),
        )
        try:
            created = await self.writer.create(EVENTS_V1, body)
        except POST_FAILURES as error:
            log.warning("could not post event %s about %s: %s", reason, body["regarding"]["name"], error)
            return "failed"
        metadata = created.get("metadata") or {}
        known.series[reason] = _Series(
            str(metadata.get("namespace") or ""), str(metadata.get("name") or ""), note, 1, now
        )
        return "created"

    async def _patch_series(self, series: _Series) -> bool:
        """Patch the Event's series to the count observed; False when the Event is gone (its TTL ran
        out) or the patch was refused."""
        target = {"metadata": {"namespace": series.namespace, "name": series.name}}
        value = {"count": series.count, "lastObservedTime": micro_time(self.wall_clock())}
        ops = [{"op": "add", "path": "/series", "value": value}]
        try:
            await self.writer.patch(EVENTS_V1, target, ops, "json")
        except POST_FAILURES as error:
            if not (isinstance(error, ApiError) and error.status == 404):
                log.warning("could not patch the series of event %s: %s", series.name, error)
            return False
        return True
