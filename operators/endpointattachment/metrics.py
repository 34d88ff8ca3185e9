"""The EndpointAttachment domain metrics, computed at scrape time from the caches.

Decides: ``cozystack_endpointattachment_attachments{type, status, reason}`` (how many attachments
stand in each condition: no attachment names as labels) and
``cozystack_endpointattachment_pool_addresses{ipaddressclass, state}`` with state ``capacity`` or
``allocated``. Class names are the one object name used as a label: classes are few, set by the
hoster, and a pool filling up is exactly what an alert must name.
``cozystack_endpointattachment_not_ready_since_timestamp_seconds{reason}``: the earliest
``lastTransitionTime`` (Unix seconds) of a ``Ready=False`` condition among the attachments whose Ready
reason that is (no series for a reason no attachment has), so an alert can say "some attachment has
not been Ready for N minutes" (``time() - min(...)``) without a series per attachment. A Ready
condition's transition time moves only when its status flips, so it is when the attachment stopped
(or never started) being Ready, whatever reasons it went through since. The reconcile metrics common to
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

from operators.endpointattachment.constants import COND_READY
from operators.endpointattachment.repair import class_usage
from operators.endpointattachment.world import World
from shared.conditions import FALSE

# One prefix for every domain metric of this operator.
PREFIX: Final = "cozystack_endpointattachment"
ATTACHMENTS_METRIC: Final = f"{PREFIX}_attachments"
POOL_ADDRESSES_METRIC: Final = f"{PREFIX}_pool_addresses"
NOT_READY_SINCE_METRIC: Final = f"{PREFIX}_not_ready_since_timestamp_seconds"


def not_ready_since(attachments: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Reason -> the earliest lastTransitionTime (Unix seconds) of a Ready=False condition with that
    reason; a condition without a readable, timezone-aware time is not counted."""
    earliest: dict[str, float] = {}
    for attachment in attachments:
        for condition in (attachment.get("status") or {}).get("conditions") or []:
            if not isinstance(condition, Mapping) or condition.get("type") != COND_READY:
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

        pools = GaugeMetricFamily(
            POOL_ADDRESSES_METRIC,
            "Addresses of each IPAddressClass: its capacity and how many are allocated.",
            labels=["ipaddressclass", "state"],
        )
        for (_, name), address_class in sorted(self.world.classes.items(), key=lambda item: item[0]):
            capacity, allocated = class_usage(address_class, self.world.allocations_of_class(name))
            if capacity is not None:
                pools.add_metric([name, "capacity"], capacity)
            pools.add_metric([name, "allocated"], allocated)
        yield pools

        since = GaugeMetricFamily(
            NOT_READY_SINCE_METRIC,
            "Earliest time (Unix seconds) an attachment with this Ready reason stopped being Ready.",
            labels=["reason"],
        )
        for reason, moment in sorted(not_ready_since(list(self.world.attachments.values())).items()):
            since.add_metric([reason], moment)
        yield since
