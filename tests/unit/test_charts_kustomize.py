"""hack/charts reads config/ only through ``kubectl kustomize`` (the local control plane's kubectl):
whatever kustomize does (patches, name prefixes, generators, nested kustomizations) reaches the
charts as ``kubectl apply -k`` would install it, each object with the config/ file it came from, and
kustomize's own bookkeeping (the origin annotation) removed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hack.charts.kustomize import kustomize
from hack.charts.templates import split_image

BASE = """\
resources:
- deployment.yaml
images:
- name: example/operator
  newTag: v2
"""
DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: operator, namespace: ops}
spec:
  replicas: 2
  template:
    spec:
      containers:
      - {name: operator, image: example/operator:v1}
"""
OVERLAY = """\
resources:
- ../base
- role.yaml
namePrefix: cozy-
patches:
- target: {kind: Deployment}
  patch: |
    - {op: replace, path: /spec/replicas, value: 3}
configMapGenerator:
- name: settings
  namespace: ops
  literals: [a=b]
  options: {disableNameSuffixHash: true}
"""
ROLE = """\
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: reader, namespace: ops, annotations: {kept: "yes"}}
rules: []
"""


def test_objects_are_what_kustomize_renders_with_their_files(tmp_path: Path) -> None:
    files = {
        "config/base/kustomization.yaml": BASE,
        "config/base/deployment.yaml": DEPLOYMENT,
        "config/overlay/kustomization.yaml": OVERLAY,
        "config/overlay/role.yaml": ROLE,
    }
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    rendered = {(r.obj["kind"], r.obj["metadata"]["name"]): r for r in kustomize(tmp_path, "config/overlay")}
    assert {k: r.source for k, r in rendered.items()} == {
        ("Deployment", "cozy-operator"): "config/base/deployment.yaml",
        ("Role", "cozy-reader"): "config/overlay/role.yaml",
        ("ConfigMap", "cozy-settings"): "config/overlay/kustomization.yaml",
    }
    deployment = rendered["Deployment", "cozy-operator"].obj
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "example/operator:v2"
    assert "annotations" not in deployment["metadata"]
    assert rendered["Role", "cozy-reader"].obj["metadata"]["annotations"] == {"kept": "yes"}
    assert rendered["ConfigMap", "cozy-settings"].obj["data"] == {"a": "b"}


def test_a_kustomization_kustomize_refuses_stops_the_generator(tmp_path: Path) -> None:
    (tmp_path / "config" / "broken").mkdir(parents=True)
    (tmp_path / "config" / "broken" / "kustomization.yaml").write_text("resources: [missing.yaml]\n")
    with pytest.raises(SystemExit, match="kubectl kustomize config/broken failed"):
        kustomize(tmp_path, "config/broken")


@pytest.mark.parametrize(
    ("image", "parts"),
    [
        (
            "ghcr.io/cozystack/cozystack-operators:latest",
            ("ghcr.io/cozystack/cozystack-operators", "latest", ""),
        ),
        ("registry:5000/ops", ("registry:5000/ops", "", "")),
        ("registry:5000/ops:v1", ("registry:5000/ops", "v1", "")),
        ("registry/ops@sha256:abc", ("registry/ops", "", "sha256:abc")),
    ],
)
def test_an_image_splits_into_its_values(image: str, parts: tuple[str, str, str]) -> None:
    assert split_image(image) == parts


def test_an_image_with_both_tag_and_digest_is_refused() -> None:
    """The chart's image helper writes repository@digest: config/'s tag would be lost."""
    with pytest.raises(AssertionError, match="without the tag"):
        split_image("registry/ops:v1@sha256:abc")
