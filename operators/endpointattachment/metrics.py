"""The EndpointAttachment domain metrics, computed at scrape time from the caches.

Decides: ``cozystack_endpointattachment_attachments{type, status, reason}`` (how many attachments
stand in each condition: no attachment names as labels) and
``cozystack_endpointattachment_pool_addresses{ipaddressclass, state}`` with state ``capacity`` or
``allocated``. Class names are the one object name used as a label: classes are few, set by the
hoster, and a pool filling up is exactly what an alert must name. The reconcile metrics common to
every controller are controller-runtime's (``controller_runtime_*``, ``workqueue_*``: the runtime's).
Does not: compute anything the reconcile decides; it counts what the caches hold.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Final

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from operators.endpointattachment.repair import class_usage
from operators.endpointattachment.world import World

# One prefix for every domain metric of this operator.
PREFIX: Final = "cozystack_endpointattachment"
ATTACHMENTS_METRIC: Final = f"{PREFIX}_attachments"
POOL_ADDRESSES_METRIC: Final = f"{PREFIX}_pool_addresses"


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
