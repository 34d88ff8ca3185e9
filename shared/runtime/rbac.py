"""The RBAC rules a manager's declarations need: what a ClusterRole must grant, no more, no less.

Decides: every cached kind needs ``list`` and ``watch``; every ``Write`` of every wiring, and every
access declared with ``Manager.uses`` (a read outside the caches, a write outside a controller),
needs its verbs on its resource (or subresource). Rules are keyed by (API group, resource) so a test
can compare them with a ClusterRole rule by rule and fail on a missing or an unused grant.

Does not: read any manifest, or cover the Lease of leader election (a namespaced Role of its own).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from shared.resources import Resource
from shared.runtime.controller import Wiring, Write

Rules = dict[tuple[str, str], frozenset[str]]

# What an informer does with its kind.
INFORMER_VERBS = ("list", "watch")


def group_of(resource: Resource) -> str:
    return "" if resource.api_version == "v1" else resource.api_version.rsplit("/", 1)[0]


def required_rules(cached: Iterable[Resource], wirings: Iterable[Wiring], uses: Iterable[Write]) -> Rules:
    verbs: dict[tuple[str, str], set[str]] = defaultdict(set)
    for resource in cached:
        verbs[(group_of(resource), resource.plural)].update(INFORMER_VERBS)
    for write in (*(w for wiring in wirings for w in wiring.writes), *uses):
        plural = (
            f"{write.resource.plural}/{write.subresource}" if write.subresource else write.resource.plural
        )
        verbs[(group_of(write.resource), plural)].update(write.verbs)
    return {key: frozenset(v) for key, v in verbs.items()}


def granted_rules(cluster_role: Mapping[str, Any]) -> Rules:
    """The (group, resource) -> verbs a ClusterRole grants (resourceNames ignored: none are used)."""
    verbs: dict[tuple[str, str], set[str]] = defaultdict(set)
    for rule in cluster_role.get("rules") or []:
        for group in rule.get("apiGroups") or [""]:
            for resource in rule.get("resources") or []:
                verbs[(group, resource)].update(rule.get("verbs") or [])
    return {key: frozenset(v) for key, v in verbs.items()}
