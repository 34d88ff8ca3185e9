"""Write the charts (``python -m hack.charts``), or, with ``--check``, name the stale files.

Decides: the set of chart files (``generate``), which differ from what is on disk or should not
exist (``stale``), and writing them (``write``). Never writes outside ``charts/<operator>/``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from hack.charts.chart import MONITORING, Chart, collect
from hack.charts.kustomize import kustomize
from hack.charts.metadata import chart_yaml, helpers, notes, project_version, readme
from hack.charts.templates import crd_file, dashboard_files, template_file
from hack.charts.values import Value, values_of, values_schema, values_yaml
from hack.regenerate import check_or_write

ROOT: Final = Path(__file__).resolve().parents[2]
CHARTS_DIR: Final = "charts"
OPERATORS: Final = ("gpuclass", "endpointattachment")


def charts(root: Path = ROOT) -> list[tuple[Chart, dict[str, str]]]:
    """Each operator's chart, its settings read, with its templates and files (path in the chart ->
    text), but for those made from its values."""
    monitoring = kustomize(root, MONITORING)
    result = []
    for operator in OPERATORS:
        chart = collect(root, operator, monitoring)
        files = {f"crds/{name}": crd_file(source, crds) for name, (source, crds) in chart.crds.items()}
        for target, (source, objs) in chart.templates.items():
            files[f"templates/{target}"] = template_file(chart, source, objs)
        files.update(dashboard_files(chart, chart.dashboards))
        result.append((chart, files))  # the templates have read config/'s settings into chart
    return result


def generate(root: Path = ROOT) -> dict[str, str]:
    """Every file of every chart: path relative to the repository -> content."""
    version = project_version(root)
    files: dict[str, str] = {}
    for chart, chart_files in charts(root):
        values = values_of(chart)
        chart_files |= {
            "templates/_helpers.tpl": helpers(chart),
            "templates/NOTES.txt": notes(chart),
            "Chart.yaml": chart_yaml(chart, version),
            "values.yaml": values_yaml(values, chart.name),
            "values.schema.json": values_schema(values),
            "README.md": readme(chart, values),
        }
        files |= {f"{CHARTS_DIR}/{chart.operator}/{path}": text for path, text in chart_files.items()}
    return files


def chart_values(root: Path = ROOT) -> dict[str, list[Value]]:
    """Each operator's chart values (for the docs' check)."""
    return {chart.operator: values_of(chart) for chart, _ in charts(root)}


def stale(root: Path = ROOT) -> list[str]:
    """Chart files that differ from what config/ generates, are missing, or should not exist."""
    files = generate(root)
    wrong = [
        path
        for path, text in files.items()
        if not (root / path).exists() or (root / path).read_text() != text
    ]
    return sorted([*wrong, *(_on_disk(root) - files.keys())])


def _on_disk(root: Path) -> set[str]:
    return {
        str(p.relative_to(root))
        for operator in OPERATORS
        for p in (root / CHARTS_DIR / operator).rglob("*")
        if p.is_file()
    }


def write(root: Path = ROOT) -> list[str]:
    files = generate(root)
    for old in _on_disk(root) - files.keys():
        (root / old).unlink()
    changed = []
    for path, text in files.items():
        target = root / path
        if not target.exists() or target.read_text() != text:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            changed.append(path)
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hack.charts", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a chart file is stale")
    args = parser.parse_args(argv)
    return check_or_write(args.check, stale, write, "python -m hack.charts")
