"""The EndpointAttachment domain metrics, computed at scrape time from the caches.

Decides: ``cozystack_endpointattachment_attachments{type, status, reason}`` (how many attachments
stand in each condition: no attachment names as labels) and
``cozystack_endpointattachment_not_provisioned_since_timestamp_seconds{reason}``: the earliest
``lastTransitionTime`` (Unix seconds) of a ``Provisioned=False`` condition among the attachments whose
Provisioned reason that is (no series for a reason no attachment has), so an alert can say "some
attachment has not been Provisioned for N minutes" (``time() - min(...)``) without a series per
attachment. A condition's transition time moves only when its status flips, so it is when the
attachment stopped (or never started) being Provisioned, whatever reasons it went through since.
Addresses and their classes are the address substrate's to measure. The reconcile metrics common to
every controller are controller-runtime's (``controller_runtime_*``, ``workqueue_*``: the runtime's).

Does not: compute anything the reconcile decides; it counts what the caches hold.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any, Final

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from operators.endpointattachment.reasons import CONDITION_PROVISIONED
from operators.endpointattachment.world import World
from shared.conditions import FALSE

# One prefix for every domain metric of this operator.
PREFIX: Final = "cozystack_endpointattachment"
ATTACHMENTS_METRIC: Final = f"{PREFIX}_attachments"
NOT_PROVISIONED_SINCE_METRIC: Final = f"{PREFIX}_not_provisioned_since_timestamp_seconds"


def not_provisioned_since(attachments: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Reason -> the earliest lastTransitionTime (Unix seconds) of a Provisioned=False condition with that
    reason; a condition without a readable, timezone-aware time is not counted."""
    earliest: dict[str, float] = {}
    for attachment in attachments:
        for condition in (attachment.get("status") or {}).get("conditions") or []:
            if not isinstance(condition, Mapping) or condition.get("type") != CONDITION_PROVISIONED:
                continue
            if condition.get("status") != FALSE:
                continue
            moment = _timestamp(condition.get("lastTransitionTime"))
            if moment is None:
                continue
            reason = str(condition.get("reason") or "")
            earliest[reason] = min(moment, earliest.get(reason, moment))
    return earliest


def _timestamp(text: object) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment.timestamp() if moment.tzinfo is not None else None


class WorldCollector(Collector):
    def __init__(self, world: World) -> None:
        self.world = world

    def collect(self) -> Iterator[GaugeMetricFamily]:
        by_condition = GaugeMetricFamily(
            ATTACHMENTS_METRIC,
            "Attachments by condition type, status and reason.",
            labels=["type", "status", "reason"],
        )
        counts: Counter[tuple[str, str, str]] = Counter()
        for attachment in list(self.world.attachments.values()):
            for condition in (attachment.get("status") or {}).get("conditions") or []:
                counts[
                    (str(condition.get("type")), str(condition.get("status")), str(condition.get("reason")))
                ] += 1
        for labels, count in sorted(counts.items()):
            by_condition.add_metric(list(labels), count)
        yield by_condition

        since = GaugeMetricFamily(
            NOT_PROVISIONED_SINCE_METRIC,
            "Earliest time (Unix seconds) an attachment with this reason stopped being Provisioned.",
            labels=["reason"],
        )
        for reason, moment in sorted(not_provisioned_since(list(self.world.attachments.values())).items()):
            since.add_metric([reason], moment)
        yield since
