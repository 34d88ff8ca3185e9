"""The EndpointAttachment domain metrics, computed at scrape time from the watch caches.

Decides: ``endpointattachment_attachments{type, status, reason}`` (how many attachments stand in each
condition: no attachment names as labels) and ``endpointattachment_pool_addresses{ipaddressclass,
state}`` with state ``capacity`` or ``allocated``. Class names are the one object name used as a
label: classes are few, set by the hoster, and a pool filling up is exactly what an alert must name.
Does not compute anything the reconcile decides: it counts what the caches hold.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from operators.endpointattachment.repair import class_usage
from operators.endpointattachment.world import World


class WorldCollector(Collector):
    def __init__(self, world: World) -> None:
        self.world = world

    def collect(self) -> Iterator[GaugeMetricFamily]:
        by_condition = GaugeMetricFamily(
            "endpointattachment_attachments",
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
            "endpointattachment_pool_addresses",
            "Addresses of each IPAddressClass: its capacity and how many are allocated.",
            labels=["ipaddressclass", "state"],
        )
        allocations = list(self.world.allocations.values())
        for name, address_class in sorted(self.world.classes.items()):
            capacity, allocated = class_usage(address_class, allocations)
            if capacity is not None:
                pools.add_metric([name, "capacity"], capacity)
            pools.add_metric([name, "allocated"], allocated)
        yield pools
