"""api: how an attachment's spec reads (``spec_of``): Cozystack's fields, the defaults, and what the
schema would refuse read as absent, never as a crash."""

from __future__ import annotations

from typing import Any

import pytest

from operators.endpointattachment.api import OWNED_ANNOTATIONS, OWNED_LABELS, AttachmentSpec, spec_of
from tests.ea_builders import make_attachment

DEFAULT = AttachmentSpec(
    app_group="apps.cozystack.io",
    app_kind="Postgres",
    app_name="db",
    endpoint="postgres-db-rw",
    class_name="",
    claim_name="",
    family="",
    ports=(),
    method="",
    allow_icmp=False,
)


@pytest.mark.parametrize(
    ("load_balancer", "changes"),
    [
        pytest.param({}, {}, id="neither: the default class"),
        pytest.param({"className": "public"}, {"class_name": "public"}, id="className"),
        pytest.param({"claimName": "held-ip"}, {"claim_name": "held-ip"}, id="claimName"),
        pytest.param({"family": "Dual"}, {"family": "Dual"}, id="family"),
        pytest.param({"family": "IPv5"}, {}, id="an unknown family reads as none"),
        pytest.param({"ports": [443, 80, 443]}, {"ports": (443, 80)}, id="ports: a set, in order"),
        pytest.param({"ports": [0, 65536, "80", 22]}, {"ports": (22,)}, id="ports out of range or mistyped"),
        pytest.param({"ports": "80"}, {}, id="ports not a list"),
        pytest.param({"method": "WholeIP"}, {"method": "WholeIP"}, id="WholeIP"),
        pytest.param(
            {"method": "PortList", "allowICMP": True},
            {"method": "PortList", "allow_icmp": True},
            id="PortList",
        ),
        pytest.param({"method": "Standard"}, {}, id="an unknown method: no VM mode"),
        pytest.param({"allowICMP": "true"}, {}, id="allowICMP not a boolean"),
    ],
)
def test_the_load_balancer_member(load_balancer: dict[str, Any], changes: dict[str, Any]) -> None:
    attachment = make_attachment()
    attachment["spec"]["loadBalancer"] = load_balancer
    spec = spec_of(attachment)
    assert spec == AttachmentSpec(**{**DEFAULT.__dict__, **changes})
    assert spec.minted is not bool(changes.get("claim_name"))
    assert spec.vm_mode is bool(changes.get("method"))


@pytest.mark.parametrize(
    "spec",
    [
        None,
        "x",
        [],
        {"applicationRef": "db", "endpoint": 3, "loadBalancer": ["x"]},
        {"applicationRef": {"kind": 1}},
    ],
)
def test_a_malformed_spec_reads_as_absent(spec: Any) -> None:
    attachment = make_attachment()
    attachment["spec"] = spec
    read = spec_of(attachment)
    assert (read.app_kind, read.app_name, read.endpoint, read.app_group) == ("", "", "", "apps.cozystack.io")


def test_the_application_group_defaults_to_cozystack_s() -> None:
    assert spec_of(make_attachment(app_group="example.com")).app_group == "example.com"
    assert spec_of(make_attachment()).app_group == "apps.cozystack.io"


def test_we_never_own_the_driver_s_pin() -> None:
    assert "metallb.io/loadBalancerIPs" not in OWNED_ANNOTATIONS | OWNED_LABELS
