"""render: the rendered Service, its name, and the minimal patch that keeps it in step."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from operators.endpointattachment.addresses import parse_address
from operators.endpointattachment.constants import ATTACHMENT_LABEL, SERVICE_PROXY_NAME_LABEL
from operators.endpointattachment.render import (
    ClassSettings,
    InvalidClassSettings,
    attachment_label_value,
    class_settings,
    mirrored_ports,
    needs_recreate,
    render_service,
    service_name,
    service_needs_update,
    service_patch,
)
from tests.ea_builders import ATTACHMENT_UID, make_attachment, make_class, make_service

DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
V4 = parse_address("203.0.113.10")
V6 = parse_address("2001:db8::10")


def render(
    *,
    mode: str = "Standard",
    settings: ClassSettings | None = None,
    allow_icmp: bool = True,
    proxy_name: str | None = None,
    address: Any = V4,
    endpoint: dict[str, Any] | None = None,
    attachment: dict[str, Any] | None = None,
) -> dict[str, Any]:
    endpoint = endpoint or make_service()
    return render_service(
        attachment or make_attachment(),
        selector=endpoint["spec"]["selector"],
        ports=endpoint["spec"]["ports"],
        address=address,
        settings=settings or ClassSettings(),
        mode=mode,
        allow_icmp=allow_icmp,
        proxy_name=proxy_name,
    )


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch, as the API server applies it."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge(result.get(key), value)
    return result


def as_stored(desired: dict[str, Any], ingress: str | None = "203.0.113.10") -> dict[str, Any]:
    """``desired`` as the API server stores it: defaults, allocations and other writers' keys added."""
    stored = copy.deepcopy(desired)
    stored["metadata"].update(uid="svc-uid", resourceVersion="7", creationTimestamp="2024-01-01T00:00:00Z")
    stored["metadata"]["labels"]["team"] = "someone-else"
    stored["metadata"].setdefault("annotations", {})["kubectl.kubernetes.io/last-applied"] = "{}"
    stored["spec"].update(
        clusterIP="10.96.1.1",
        clusterIPs=["10.96.1.1"],
        sessionAffinity="None",
        internalTrafficPolicy="Cluster",
        healthCheckNodePort=31000,
    )
    for port in stored["spec"]["ports"]:
        port["nodePort"] = 30001
    stored["status"] = {"loadBalancer": {"ingress": [{"ip": ingress}] if ingress else []}}
    return stored


# --- names -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("db-public", "ea-db-public", id="short name kept"),
        pytest.param("a" * 60, "ea-" + "a" * 60, id="exactly 63"),
    ],
)
def test_service_name_plain(name: str, expected: str) -> None:
    assert service_name(name) == expected


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("a" * 61, id="64 would be too long"),
        pytest.param("a" * 253, id="longest object name"),
        pytest.param("db.public", id="dot is not DNS-1035"),
        pytest.param("x" * 70 + "-", id="cut at a dash"),
        pytest.param("1" * 80, id="digits"),
    ],
)
def test_service_name_cut_is_valid_and_hashed(name: str) -> None:
    rendered = service_name(name)
    assert len(rendered) <= 63
    assert DNS_1035.match(rendered)
    assert re.search(r"-[0-9a-f]{8}$", rendered)
    assert service_name(name) == rendered


@pytest.mark.parametrize(
    ("a", "b"),
    [
        pytest.param("a" * 70 + "x", "a" * 70 + "y", id="differ past the cut"),
        pytest.param("db.public", "db-public", id="dot versus dash"),
    ],
)
def test_service_names_do_not_collide(a: str, b: str) -> None:
    assert service_name(a) != service_name(b)


@pytest.mark.parametrize("name", ["db-public", "a" * 63, "a" * 64, "a.b" * 40])
def test_attachment_label_value_fits_a_label(name: str) -> None:
    value = attachment_label_value(name)
    assert len(value) <= 63
    assert re.match(r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$", value)
    assert (value == name) is (len(name) <= 63)


# --- the Service -----------------------------------------------------------------------------------


def test_standard_metallb_service_exactly() -> None:
    assert render() == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "ea-db-public",
            "namespace": "tenant-a",
            "labels": {ATTACHMENT_LABEL: "db-public"},
            "annotations": {"metallb.io/loadBalancerIPs": "203.0.113.10"},
            "ownerReferences": [
                {
                    "apiVersion": "local.sdn.cozystack.io/v1alpha1",
                    "kind": "EndpointAttachment",
                    "name": "db-public",
                    "uid": ATTACHMENT_UID,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "type": "LoadBalancer",
            "externalTrafficPolicy": "Local",
            "allocateLoadBalancerNodePorts": False,
            "ipFamilyPolicy": "SingleStack",
            "ipFamilies": ["IPv4"],
            "selector": {"app": "db", "role": "primary"},
            "ports": [{"name": "postgres", "protocol": "TCP", "port": 5432, "targetPort": 5432}],
        },
    }


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        pytest.param(ClassSettings("MetalLB"), {"metallb.io/loadBalancerIPs": "203.0.113.10"}, id="MetalLB"),
        pytest.param(
            ClassSettings("MetalLB", metallb_pool="public-v4"),
            {"metallb.io/loadBalancerIPs": "203.0.113.10", "metallb.io/address-pool": "public-v4"},
            id="MetalLB with pool",
        ),
        pytest.param(
            ClassSettings("CiliumLBIPAM", metallb_pool="ignored"),
            {"lbipam.cilium.io/ips": "203.0.113.10"},
            id="Cilium ignores the MetalLB pool",
        ),
    ],
)
def test_provider_annotations(settings: ClassSettings, expected: dict[str, str]) -> None:
    assert render(settings=settings)["metadata"]["annotations"] == expected


@pytest.mark.parametrize(
    ("mode", "allow_icmp", "expected"),
    [
        pytest.param("Standard", True, {}, id="Standard has none"),
        pytest.param("Standard", False, {}, id="Standard ignores allowICMP"),
        pytest.param("WholeIP", True, {"networking.cozystack.io/wholeIP": "true"}, id="WholeIP"),
        pytest.param(
            "PortList",
            True,
            {"networking.cozystack.io/wholeIP": "false", "networking.cozystack.io/allowICMP": "true"},
            id="PortList ICMP",
        ),
        pytest.param(
            "PortList",
            False,
            {"networking.cozystack.io/wholeIP": "false", "networking.cozystack.io/allowICMP": "false"},
            id="PortList no ICMP",
        ),
    ],
)
def test_mode_annotations(mode: str, allow_icmp: bool, expected: dict[str, str]) -> None:
    annotations = render(mode=mode, allow_icmp=allow_icmp, proxy_name="cozy-proxy")["metadata"]["annotations"]
    assert {k: v for k, v in annotations.items() if k.startswith("networking.")} == expected


@pytest.mark.parametrize(
    ("mode", "proxy_name", "expected"),
    [
        pytest.param(
            "Standard", "cozy-proxy", {ATTACHMENT_LABEL: "db-public"}, id="Standard: our label only"
        ),
        pytest.param(
            "PortList",
            "cozy-proxy",
            {ATTACHMENT_LABEL: "db-public", SERVICE_PROXY_NAME_LABEL: "cozy-proxy"},
            id="PortList",
        ),
        pytest.param(
            "WholeIP",
            "proxy-east",
            {ATTACHMENT_LABEL: "db-public", SERVICE_PROXY_NAME_LABEL: "proxy-east"},
            id="declared name, never a literal",
        ),
    ],
)
def test_labels(mode: str, proxy_name: str, expected: dict[str, str]) -> None:
    assert render(mode=mode, proxy_name=proxy_name)["metadata"]["labels"] == expected


def test_vm_mode_without_proxy_name_is_a_caller_bug() -> None:
    with pytest.raises(ValueError, match="proxy"):
        render(mode="WholeIP", proxy_name=None)


def test_nothing_is_copied_from_endpoint_or_attachment() -> None:
    endpoint = make_service(
        annotations={"metallb.io/address-pool": "theirs", "networking.cozystack.io/wholeIP": "true"},
        labels={
            **make_service()["metadata"]["labels"],
            SERVICE_PROXY_NAME_LABEL: "cozy-proxy",
            "team": "db",
        },
    )
    attachment = make_attachment()
    attachment["metadata"]["labels"] = {"tenant-label": "x"}
    attachment["metadata"]["annotations"] = {"tenant-annotation": "y"}
    service = render(endpoint=endpoint, attachment=attachment)
    assert service["metadata"]["labels"] == {ATTACHMENT_LABEL: "db-public"}
    assert service["metadata"]["annotations"] == {"metallb.io/loadBalancerIPs": "203.0.113.10"}


def test_ipv6_family_and_load_balancer_class() -> None:
    service = render(address=V6, settings=ClassSettings(load_balancer_class="io.cilium/bgp"))
    assert service["spec"]["ipFamilies"] == ["IPv6"]
    assert service["spec"]["loadBalancerClass"] == "io.cilium/bgp"
    assert "loadBalancerClass" not in render()["spec"]


@pytest.mark.parametrize(
    ("port", "expected"),
    [
        pytest.param(
            {"name": "pg", "protocol": "TCP", "port": 5432, "targetPort": 5432, "nodePort": 30000},
            {"name": "pg", "protocol": "TCP", "port": 5432, "targetPort": 5432},
            id="nodePort dropped",
        ),
        pytest.param(
            {"port": 53, "protocol": "UDP"}, {"protocol": "UDP", "port": 53, "targetPort": 53}, id="defaults"
        ),
        pytest.param(
            {"name": "h", "port": 80, "targetPort": "http", "appProtocol": "http"},
            {"name": "h", "protocol": "TCP", "port": 80, "targetPort": "http", "appProtocol": "http"},
            id="named targetPort and appProtocol",
        ),
    ],
)
def test_mirrored_ports(port: dict[str, Any], expected: dict[str, Any]) -> None:
    assert mirrored_ports([port]) == [expected]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param({}, ClassSettings("MetalLB", "", ""), id="defaults to MetalLB"),
        pytest.param(
            {"provider": "MetalLB", "metallbAddressPool": "p", "loadBalancerClass": "lb"},
            ClassSettings("MetalLB", "p", "lb"),
            id="all set",
        ),
        pytest.param({"provider": "CiliumLBIPAM"}, ClassSettings("CiliumLBIPAM"), id="cilium"),
    ],
)
def test_class_settings(spec: dict[str, Any], expected: ClassSettings) -> None:
    address_class = make_class(provider=None)
    address_class["spec"].update(spec)
    assert class_settings(address_class) == expected


def test_unknown_provider() -> None:
    with pytest.raises(InvalidClassSettings):
        class_settings(make_class(provider="F5"))


# --- updates ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["Standard", "PortList", "WholeIP"])
def test_stored_copy_needs_no_update(mode: str) -> None:
    desired = render(mode=mode, proxy_name="cozy-proxy")
    stored = as_stored(desired)
    assert service_patch(stored, desired) is None
    assert not service_needs_update(stored, desired)
    assert not needs_recreate(stored, desired)


@pytest.mark.parametrize(
    ("change", "patch"),
    [
        pytest.param(
            lambda s: s["spec"]["selector"].update(role="replica"),
            {"spec": {"selector": {"role": "primary"}}},
            id="selector value",
        ),
        pytest.param(
            lambda s: s["spec"]["selector"].update(extra="x"),
            {"spec": {"selector": {"extra": None}}},
            id="selector key removed with null",
        ),
        pytest.param(
            lambda s: s["spec"]["ports"][0].update(port=6543),
            {"spec": {"ports": [{"name": "postgres", "protocol": "TCP", "port": 5432, "targetPort": 5432}]}},
            id="ports replaced whole",
        ),
        pytest.param(
            lambda s: s["metadata"]["annotations"].update({"metallb.io/loadBalancerIPs": "203.0.113.99"}),
            {"metadata": {"annotations": {"metallb.io/loadBalancerIPs": "203.0.113.10"}}},
            id="our annotation restored",
        ),
        pytest.param(
            lambda s: s["metadata"]["labels"].update({SERVICE_PROXY_NAME_LABEL: "cozy-proxy"}),
            {"metadata": {"labels": {SERVICE_PROXY_NAME_LABEL: None}}},
            id="proxy label removed when back to Standard",
        ),
        pytest.param(
            lambda s: s["metadata"]["annotations"].update({"networking.cozystack.io/wholeIP": "true"}),
            {"metadata": {"annotations": {"networking.cozystack.io/wholeIP": None}}},
            id="stale mode annotation removed",
        ),
        pytest.param(
            lambda s: s["spec"].update(externalTrafficPolicy="Cluster"),
            {"spec": {"externalTrafficPolicy": "Local"}},
            id="owned spec field",
        ),
        pytest.param(
            lambda s: s["metadata"]["labels"].update(other="x"), None, id="foreign label left alone"
        ),
        pytest.param(
            lambda s: s["spec"].update(sessionAffinity="ClientIP"), None, id="foreign spec field left alone"
        ),
    ],
)
def test_patch_touches_only_our_fields(change: Any, patch: dict[str, Any] | None) -> None:
    desired = render()
    stored = as_stored(desired)
    change(stored)
    assert service_patch(stored, desired) == patch
    if patch is not None:
        patched = merge(stored, patch)
        assert service_patch(patched, desired) is None, "a second pass writes nothing"
        assert patched["metadata"]["labels"]["team"] == "someone-else"


def test_mode_switch_patch_converges() -> None:
    stored = as_stored(render())
    desired = render(mode="PortList", allow_icmp=False, proxy_name="cozy-proxy")
    patch = service_patch(stored, desired)
    assert patch is not None
    patched = merge(stored, patch)
    assert service_patch(patched, desired) is None
    assert patched["metadata"]["labels"][SERVICE_PROXY_NAME_LABEL] == "cozy-proxy"


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        pytest.param(ClassSettings(), ClassSettings(load_balancer_class="lb"), True, id="class added"),
        pytest.param(ClassSettings(load_balancer_class="lb"), ClassSettings(), True, id="class removed"),
        pytest.param(
            ClassSettings(load_balancer_class="a"),
            ClassSettings(load_balancer_class="b"),
            True,
            id="class changed",
        ),
        pytest.param(
            ClassSettings(load_balancer_class="a"),
            ClassSettings(load_balancer_class="a"),
            False,
            id="same class",
        ),
    ],
)
def test_needs_recreate_on_load_balancer_class(
    old: ClassSettings, new: ClassSettings, expected: bool
) -> None:
    assert needs_recreate(as_stored(render(settings=old)), render(settings=new)) is expected


def test_needs_recreate_on_family() -> None:
    assert needs_recreate(as_stored(render(address=V4)), render(address=V6))
