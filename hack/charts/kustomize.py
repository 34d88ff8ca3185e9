"""The objects a kustomization renders, each with the config/ file it came from: ``kubectl kustomize``.

Decides: which kubectl (the local control plane's, as the tests and the demo find it:
``hack.devcluster.build_controlplane``) and how an object's source is learnt (kustomize's own
origin annotation, asked for by a throwaway kustomization over the directory, then removed). Does
not: read a kustomization itself; whatever kustomize supports renders here as it does for
``kubectl apply -k``.
"""

from __future__ import annotations

import functools
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from hack.devcluster import build_controlplane

ORIGIN: Final = "config.kubernetes.io/origin"
# libyaml's loader when PyYAML has it (the CRDs are large), else the pure-Python one: same result.
LOADER: Final[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
Obj = dict[str, Any]


@dataclass(frozen=True)
class Rendered:
    source: str  # the file it came from, relative to the repository (a generator's kustomization)
    obj: Obj  # as kustomize renders it, without the origin annotation


@functools.cache
def kubectl() -> str:
    return str(build_controlplane() / "kubectl")


def kustomize(root: Path, directory: str) -> list[Rendered]:
    """``kubectl kustomize <root>/<directory>``, in kustomize's order."""
    root = root.resolve()
    with tempfile.TemporaryDirectory(prefix="charts-kustomize-") as name:
        wrapper = Path(name).resolve()
        kustomization = {
            "resources": [os.path.relpath(root / directory, wrapper)],
            "buildMetadata": ["originAnnotations"],
        }
        (wrapper / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        result = subprocess.run(
            [kubectl(), "kustomize", str(wrapper)], capture_output=True, text=True, check=False
        )
    if result.returncode != 0:
        raise SystemExit(f"kubectl kustomize {directory} failed:\n{result.stderr}")
    return [_rendered(root, wrapper, doc) for doc in yaml.load_all(result.stdout, Loader=LOADER) if doc]


def _rendered(root: Path, wrapper: Path, obj: Obj) -> Rendered:
    annotations = obj["metadata"]["annotations"]
    origin = yaml.safe_load(annotations.pop(ORIGIN))
    if not annotations:
        del obj["metadata"]["annotations"]
    source = Path(os.path.normpath(wrapper / (origin.get("path") or origin["configuredIn"])))
    return Rendered(str(source.relative_to(root)), obj)
