"""The Helm charts are what hack/charts generates from config/ now, and the generator's rules hold:
a chart file edited by hand, or a config/ change without ``python -m hack.charts``, fails here.

What the charts render is checked with the real Helm in tests/integration/test_charts.py; this test
needs no server, only the local control plane's kubectl (``kubectl kustomize``, as the generator
reads config/; ``make unit`` builds it).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from hack import charts

ROOT = Path(__file__).resolve().parents[2]
INSTALL_DOC = ROOT / "docs" / "hosters" / "install.md"
# A Go template action that is Helm's (not one escaped from config/'s text).
ACTION = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}")


@pytest.fixture(scope="module")
def files() -> dict[str, str]:
    return charts.generate(ROOT)


@pytest.fixture(scope="module")
def values() -> dict[str, list[charts.Value]]:
    return charts.chart_values(ROOT)


def test_generated_chart_files_are_current() -> None:
    stale = charts.stale(ROOT)
    assert not stale, f"run `python -m hack.charts` (stale or extra: {stale})"


@pytest.mark.parametrize("operator", charts.OPERATORS)
def test_templates_never_name_the_config_namespace(operator: str, files: dict[str, str]) -> None:
    """Wherever config/ names the operator's namespace, the chart says the release's (comments aside)."""
    namespace = yaml.safe_load((ROOT / f"config/default/{operator}/namespace.yaml").read_text())["metadata"][
        "name"
    ]
    leftovers = [
        f"{path}: {line.strip()}"
        for path, text in files.items()
        if path.startswith(f"charts/{operator}/templates/")
        for line in text.splitlines()
        if not line.lstrip().startswith("#")
        and re.search(rf"(?<![\w.-]){re.escape(namespace)}(?![\w.-])", line)
    ]
    assert not leftovers, "\n".join(leftovers)


@pytest.mark.parametrize("operator", charts.OPERATORS)
def test_every_value_a_template_reads_is_declared(
    operator: str, files: dict[str, str], values: dict[str, list[charts.Value]]
) -> None:
    """values.yaml, values.schema.json and the templates name the same values."""
    read = {
        match
        for path, text in files.items()
        if path.startswith(f"charts/{operator}/templates/")
        for action in ACTION.findall(text)
        for match in re.findall(r"\.Values\.([\w.]+)", action)
    }
    declared = {value.path for value in values[operator]}
    assert read <= declared, f"read but not declared: {sorted(read - declared)}"
    assert declared <= read, f"declared but never read: {sorted(declared - read)}"
    defaults = yaml.safe_load(files[f"charts/{operator}/values.yaml"])
    for value in values[operator]:
        node = defaults
        for part in value.path.split("."):
            node = node[part]
        assert node == value.default, value.path


# How the generator writes a hole, one row per kind (the template text it must produce).
HOLES = {
    "scalar": (
        {"spec": {"replicas": charts.Hole("scalar", ".Values.replicas")}},
        "spec:\n  replicas: {{ .Values.replicas }}\n",
    ),
    "block": (
        {"c": {"resources": charts.Hole("block", ".Values.resources")}},
        "c:\n  resources:\n    {{- toYaml .Values.resources | nindent 4 }}\n",
    ),
    "optional": (
        {"pod": {"a": 1, charts.Hole("optional", ".Values.nodeSelector", "nodeSelector"): None}},
        "pod:\n  a: 1\n  {{- with .Values.nodeSelector }}\n  nodeSelector:\n    {{- toYaml . | nindent 4 }}\n"
        "  {{- end }}\n",
    ),
    "optional scalar": (
        {"pod": {"a": 1, charts.Hole("optional_scalar", ".Values.p", "priorityClassName"): None}},
        "pod:\n  a: 1\n  {{- with .Values.p }}\n  priorityClassName: {{ . | quote }}\n  {{- end }}\n",
    ),
    "splice into a list": (
        {"env": [{"name": "A", "value": "1"}, charts.Hole("splice", ".Values.extraEnv")]},
        "env:\n- name: A\n  value: '1'\n"
        "{{- with .Values.extraEnv }}\n{{- toYaml . | nindent 0 }}\n{{- end }}\n",
    ),
    "splice into a map": (
        {"labels": {"a": "b", charts.Hole("splice", ".Values.labels"): None}},
        "labels:\n  a: b\n  {{- with .Values.labels }}\n  {{- toYaml . | nindent 2 }}\n  {{- end }}\n",
    ),
}


@pytest.mark.parametrize("kind", sorted(HOLES))
def test_holes_are_written_as_templates(kind: str) -> None:
    doc, text = HOLES[kind]
    assert charts.dump(doc) == text


@pytest.mark.parametrize(
    ("text", "escaped"),
    [
        ("GPUClass {{ $labels.gpuclass }} is", 'GPUClass {{ "{{" }} $labels.gpuclass {{ "}}" }} is'),
        ("no braces", "no braces"),
        ("}} {{", '{{ "}}" }} {{ "{{" }}'),
    ],
)
def test_config_braces_reach_helm_as_text(text: str, escaped: str) -> None:
    assert charts.escape(text) == escaped


@pytest.mark.parametrize("operator", charts.OPERATORS)
def test_install_doc_carries_each_charts_values_table(
    operator: str, values: dict[str, list[charts.Value]]
) -> None:
    table = charts.values_table(values[operator])
    assert table in INSTALL_DOC.read_text(), (
        f"docs/hosters/install.md lacks the current values table of charts/{operator} (copy it from "
        f"charts/{operator}/README.md)"
    )
