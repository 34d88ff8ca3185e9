"""The rendered-Services admission policy names the substrate driver's identity the test world runs it
under (``hack/substrate.py``): one name, held in two places, kept the same here."""

from __future__ import annotations

import yaml

from hack.substrate import DRIVER_USERNAME
from harness.manifests import ROOT

POLICY = ROOT / "config" / "admission" / "endpointattachment" / "rendered_services_policy.yaml"


def test_the_policy_exempts_the_drivers_identity_for_the_pin() -> None:
    policy = next(
        d for d in yaml.safe_load_all(POLICY.read_text()) if d["kind"] == "ValidatingAdmissionPolicy"
    )
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert f"'{DRIVER_USERNAME}'" in variables["driver"]
    assert "variables.driver" in variables["pinOnly"]


def test_the_drivers_identity_is_a_setting_at_the_path_the_docs_give() -> None:
    """The hoster's handle on the driver's identity: the policy's first variable (the path the docs'
    kustomize overlay replaces), and the chart's value admission.substrateDriverUsername, whose
    default is the policy's own name."""
    policy = next(
        d for d in yaml.safe_load_all(POLICY.read_text()) if d["kind"] == "ValidatingAdmissionPolicy"
    )
    assert policy["spec"]["variables"][0]["name"] == "driver"
    docs = (ROOT / "docs" / "hosters" / "admission.md").read_text()
    assert "path: /spec/variables/0/expression" in docs
    assert "admission.substrateDriverUsername" in docs
    values = yaml.safe_load((ROOT / "charts" / "endpointattachment" / "values.yaml").read_text())
    assert values["admission"]["substrateDriverUsername"] == DRIVER_USERNAME
    template = (
        ROOT / "charts/endpointattachment/templates/admission/rendered_services_policy.yaml"
    ).read_text()
    assert "{{ .Values.admission.substrateDriverUsername | squote }}" in template
    assert DRIVER_USERNAME not in template.split("spec:", 1)[1], "the name is the value's, not literal"
