"""Each operator's ClusterRole grants exactly what its wiring and declared accesses use.

The manager is built offline (no API call is made): every cached kind needs list and watch, every
``Write`` of a wiring and every ``Manager.uses`` access its verbs. A missing grant would fail at run
time; an unused one is a permission nobody needs. Both fail here.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
import yaml
from opentelemetry.trace import NoOpTracerProvider
from prometheus_client import CollectorRegistry

from operators.endpointattachment import controller as ea
from operators.endpointattachment.settings import Settings as EASettings
from operators.gpuclass import controller as gpu
from operators.gpuclass.settings import Settings as GPUSettings
from shared.kube import Kube
from shared.runtime.manager import Manager
from shared.runtime.rbac import Rules, granted_rules
from shared.telemetry.tracing import Tracing

ROOT = Path(__file__).resolve().parents[2]


def required(operator: str) -> Rules:
    registry = CollectorRegistry()
    manager = Manager(cast(Kube, None), registry, Tracing(NoOpTracerProvider(), "test"))
    if operator == "gpuclass":
        gpu.build(manager, registry, GPUSettings())
    else:
        ea.build(manager, registry, EASettings())
    return manager.required_rules()


def granted(operator: str) -> Rules:
    role = yaml.safe_load((ROOT / f"config/rbac/{operator}/role.yaml").read_text())
    assert role["kind"] == "ClusterRole"
    return granted_rules(role)


@pytest.mark.parametrize("operator", ["gpuclass", "endpointattachment"])
def test_the_cluster_role_grants_exactly_what_the_wiring_uses(operator: str) -> None:
    need, have = required(operator), granted(operator)
    missing = {key: sorted(verbs - have.get(key, frozenset())) for key, verbs in need.items()}
    unused = {key: sorted(verbs - need.get(key, frozenset())) for key, verbs in have.items()}
    assert {k: v for k, v in missing.items() if v} == {}, "missing grants"
    assert {k: v for k, v in unused.items() if v} == {}, "unused grants"
