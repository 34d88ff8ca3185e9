"""Generates the Helm charts ``charts/<operator>/`` from what ``kubectl kustomize`` renders of config/.

Decides: what each chart holds (``chart``: config/default/<operator> but its Namespace, its
admission policies, its monitoring objects), which fields are values, config/'s own setting the
default (``templates``, ``values``), and how a value is written into a manifest (``holes``). So
``helm template`` with the default values renders exactly config/'s objects
(tests/integration/test_charts.py holds it to that).

Does not: read a kustomization itself (``kustomize``: kubectl does, so whatever kustomize supports
renders as ``kubectl apply -k`` would), or change any field that is not a value.

    python -m hack.charts           write the charts
    python -m hack.charts --check   exit 1 when a chart file is not what config/ generates
"""

from __future__ import annotations

from hack.charts.cli import CHARTS_DIR, OPERATORS, ROOT, chart_values, generate, main, stale, write
from hack.charts.holes import Hole, dump, escape
from hack.charts.values import Value, values_table

__all__ = [
    "CHARTS_DIR",
    "OPERATORS",
    "ROOT",
    "Hole",
    "Value",
    "chart_values",
    "dump",
    "escape",
    "generate",
    "main",
    "stale",
    "values_table",
    "write",
]
