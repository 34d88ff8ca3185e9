"""The rendered-Services admission policy names the substrate driver's identity the test world runs it
under (``hack/substrate.py``): one name, held in two places, kept the same here."""

from __future__ import annotations

import yaml

from hack.substrate import DRIVER_USERNAME
from tests.support.manifests import ROOT

POLICY = ROOT / "config" / "admission" / "endpointattachment" / "rendered_services_policy.yaml"


def test_the_policy_exempts_the_drivers_identity_for_the_pin() -> None:
    policy = next(
        d for d in yaml.safe_load_all(POLICY.read_text()) if d["kind"] == "ValidatingAdmissionPolicy"
    )
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert f"'{DRIVER_USERNAME}'" in variables["driver"]
    assert "variables.driver" in variables["pinOnly"]
