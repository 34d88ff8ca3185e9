"""One operator's chart, as the objects of config/ that go into it and the settings its values take.

Decides: which rendered objects a chart holds and where: everything ``config/default/<operator>``
renders but its Namespace (whose name is the namespace config/ installs into), then every object of
``config/admission/<operator>`` not already there, then ``config/monitoring``'s objects labelled
``app.kubernetes.io/name=<operator>-operator``; CRDs go to ``crds/``, Grafana dashboard ConfigMaps
to one template, the rest to ``templates/<area>/<file>`` after the config/ file each came from
(``config/<area>/.../<file>``). Does not: change an object (``hack.charts.templates`` does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from hack.charts.kustomize import Obj, Rendered, kustomize

CRD_KIND: Final = "CustomResourceDefinition"
NAMESPACE_KIND: Final = "Namespace"
NAME_LABEL: Final = "app.kubernetes.io/name"
# Grafana's dashboard sidecar loads the ConfigMaps labelled so.
DASHBOARD_LABEL: Final = "grafana_dashboard"
MONITORING: Final = "config/monitoring"
Placed = tuple[str, list[Obj]]


@dataclass
class Chart:
    operator: str
    namespace: str = ""
    # A path under crds/ or templates/ -> (the config/ file, its objects in kustomize's order).
    crds: dict[str, Placed] = field(default_factory=dict)
    templates: dict[str, Placed] = field(default_factory=dict)
    dashboards: list[Rendered] = field(default_factory=list)
    # config/'s settings, learnt while templating (the values' defaults)
    image: tuple[str, str, str] = ("", "", "")  # repository, tag, digest
    replicas: int = 0
    env_prefix: str = ""
    leader_election_id: str = ""
    otel_endpoint: str = ""
    # The VM datapath the platform declares (EA_VM_DATAPATH); None for an operator without the flag.
    vm_datapath: str | None = None
    # The address substrate driver's user name its admission policy lets pin addresses (None: no
    # such policy).
    driver_username: str | None = None
    resources: Obj = field(default_factory=dict)
    min_available: int | str = 1
    scrape: tuple[str, str] = ("", "")
    dashboards_namespace: str = ""

    @property
    def name(self) -> str:
        return f"{self.operator}-operator"


def key(obj: Obj) -> tuple[str, str, str]:
    metadata = obj["metadata"]
    return obj["kind"], metadata.get("namespace") or "", metadata["name"]


def rendered_objects(root: Path, operator: str, monitoring: list[Rendered]) -> list[Rendered]:
    """What config/ installs for the operator, as kustomize renders it (``monitoring``: all of
    config/monitoring)."""
    objects = kustomize(root, f"config/default/{operator}")
    if (root / "config" / "admission" / operator).is_dir():
        listed = {key(r.obj) for r in objects}
        objects += [r for r in kustomize(root, f"config/admission/{operator}") if key(r.obj) not in listed]
    name = Chart(operator).name
    return objects + [r for r in monitoring if labels(r.obj).get(NAME_LABEL) == name]


def collect(root: Path, operator: str, monitoring: list[Rendered]) -> Chart:
    chart = Chart(operator)
    for rendered in rendered_objects(root, operator, monitoring):
        obj, kind = rendered.obj, rendered.obj["kind"]
        if kind == NAMESPACE_KIND:
            chart.namespace = obj["metadata"]["name"]
        elif kind == CRD_KIND:
            place(chart.crds, Path(rendered.source).name, rendered)
        elif kind == "ConfigMap" and DASHBOARD_LABEL in labels(obj):
            chart.dashboards.append(rendered)
        else:
            area = Path(rendered.source).relative_to("config").parts[0]
            place(chart.templates, f"{area}/{Path(rendered.source).name}", rendered)
    assert chart.namespace, f"config/default/{operator} has no Namespace"
    return chart


def place(files: dict[str, Placed], target: str, rendered: Rendered) -> None:
    source, objs = files.setdefault(target, (rendered.source, []))
    assert source == rendered.source, f"{source} and {rendered.source} would both be {target}"
    objs.append(rendered.obj)


def labels(obj: Obj) -> dict[str, Any]:
    return dict(obj["metadata"].get("labels") or {})
