"""Live reads: only the declared verbs, and each declaration is a grant the ClusterRole must hold."""

from __future__ import annotations

import pytest
from opentelemetry.trace import NoOpTracerProvider
from prometheus_client import CollectorRegistry

from harness.memapi import MemApi
from shared.resources import Resource
from shared.runtime.manager import Manager
from shared.runtime.reads import GET, LIST, Reads
from shared.telemetry.tracing import Tracing

GADGETS = Resource("example.com/v1", "gadgets")


async def test_a_read_uses_its_declared_verbs_only() -> None:
    api = MemApi()
    reads = Reads(api, GADGETS, frozenset({GET}))
    assert await reads.get("ns", "g") is None
    with pytest.raises(PermissionError, match="list gadgets was not declared"):
        await reads.list("ns")
    assert [(r.verb, r.path) for r in api.requests] == [
        ("get", "/apis/example.com/v1/namespaces/ns/gadgets/g")
    ]


def test_a_declared_read_is_a_required_grant() -> None:
    manager = Manager(MemApi(), CollectorRegistry(), Tracing(NoOpTracerProvider(), "test"))
    manager.reads(GADGETS, GET, LIST)
    assert manager.required_rules() == {("example.com", "gadgets"): frozenset({"get", "list"})}
