"""render: the minted claim, the rendered Service, its generateName, the published ports, and the
minimal merge patch that keeps a live Service of ours in step."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from operators.endpointattachment.api import (
    ALLOW_ICMP_ANNOTATION,
    ATTACHMENT_LABEL,
    CLAIM_ANNOTATION,
    METALLB_IPS_ANNOTATION,
    SERVICE_PROXY_NAME_LABEL,
    WHOLE_IP_ANNOTATION,
    spec_of,
)
from operators.endpointattachment.render import (
    RenderSettings,
    immutable_mismatch,
    ip_families,
    label_value,
    method_annotations,
    mirrored_port,
    no_port_message,
    publish_ports,
    render_claim,
    render_service,
    service_patch,
    service_prefix,
)
from tests.ea_builders import (
    ATTACHMENT_UID,
    CLAIM,
    NAMESPACE,
    as_stored,
    controlled_by,
    lineage_labels,
    make_attachment,
)

DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
COZY = RenderSettings(proxy_name="cozy-proxy")
SELECTOR = {"app": "db", "role": "primary"}
POSTGRES = {"name": "postgres", "protocol": "TCP", "port": 5432, "targetPort": 5432}
SENTINEL = {"name": "sentinel", "protocol": "TCP", "port": 65535, "targetPort": 65535}


def render(
    attachment: dict[str, Any] | None = None,
    *,
    family: str = "IPv4",
    ports: list[dict[str, Any]] | None = None,
    load_balancer_class: str = "",
    settings: RenderSettings | None = None,
) -> dict[str, Any]:
    attachment = attachment or make_attachment()
    return render_service(
        attachment,
        spec_of(attachment),
        claim_name=CLAIM,
        family=family,
        selector=SELECTOR,
        ports=[POSTGRES] if ports is None else ports,
        load_balancer_class=load_balancer_class,
        settings=settings or RenderSettings(),
    )


# --- the minted claim -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attachment", "spec"),
    [
        pytest.param(make_attachment(), {}, id="neither: the default class and family"),
        pytest.param(make_attachment(class_name="public"), {"className": "public"}, id="className"),
        pytest.param(make_attachment(family="Dual"), {"family": "Dual"}, id="family alone"),
        pytest.param(
            make_attachment(class_name="public", family="IPv6"),
            {"className": "public", "family": "IPv6"},
            id="both",
        ),
    ],
)
def test_the_minted_claim_exactly(attachment: dict[str, Any], spec: dict[str, Any]) -> None:
    assert render_claim(attachment, spec_of(attachment)) == {
        "apiVersion": "local.sdn.cozystack.io/v1alpha1",
        "kind": "IPAddressClaim",
        "metadata": {
            "generateName": "db-public-",
            "namespace": NAMESPACE,
            "labels": {ATTACHMENT_LABEL: "db-public"},
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
        "spec": spec,
    }


# --- names ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "prefix"),
    [
        ("db-public", "db-public-"),
        ("1db", "ea-1db-"),
        ("9", "ea-9-"),
        ("db.public", "db-public-"),
        ("a" * 100, "a" * 57 + "-"),
        ("a" * 56 + "-b" + "c" * 10, "a" * 56 + "-"),  # the cut lands after a dash: no double dash
        ("a.b" * 40, ("a-b" * 40)[:57].rstrip("-") + "-"),
    ],
)
def test_service_prefix(name: str, prefix: str) -> None:
    assert service_prefix(name) == prefix


@given(st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,250}[a-z0-9])?", fullmatch=True))
def test_every_attachment_name_gives_a_valid_service_name(name: str) -> None:
    generated = service_prefix(name) + "x7ktq"  # the API server's 5 random characters
    assert DNS_1035.match(generated), generated
    assert len(generated) <= 63


@given(st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,250}[a-z0-9])?", fullmatch=True))
def test_the_diagnostic_label_value_fits_a_label(name: str) -> None:
    value = label_value(name)
    assert LABEL_VALUE.match(value), value
    assert len(value) <= 63
    assert name.startswith(value)


def test_the_service_and_the_claim_are_named_after_the_attachment() -> None:
    attachment = make_attachment("1st.db")
    assert render(attachment)["metadata"]["generateName"] == "ea-1st-db-"
    assert render_claim(attachment, spec_of(attachment))["metadata"]["generateName"] == "1st.db-", (
        "a claim's name is a DNS subdomain: the attachment's name is one"
    )


# --- ports ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint_ports", "ports", "method", "published"),
    [
        pytest.param([POSTGRES], None, None, [POSTGRES], id="mirrored"),
        pytest.param(
            [POSTGRES, SENTINEL], None, None, [POSTGRES, SENTINEL], id="beside real ports, mirrored like them"
        ),
        pytest.param([SENTINEL], None, None, [], id="the sentinel alone: nothing"),
        pytest.param([SENTINEL], None, "WholeIP", [SENTINEL], id="the sentinel alone in WholeIP"),
        pytest.param([SENTINEL], None, "PortList", [], id="the sentinel alone in PortList"),
        pytest.param(
            [POSTGRES, {"name": "m", "protocol": "TCP", "port": 9187, "targetPort": "metrics"}],
            [9187],
            None,
            [{"name": "m", "protocol": "TCP", "port": 9187, "targetPort": "metrics"}],
            id="a subset keeps the endpoint's port",
        ),
        pytest.param(
            [SENTINEL],
            [22, 80],
            "PortList",
            [
                {"name": "port-22", "protocol": "TCP", "port": 22, "targetPort": 22},
                {"name": "port-80", "protocol": "TCP", "port": 80, "targetPort": 80},
            ],
            id="ports the endpoint lacks: plain TCP",
        ),
        pytest.param(
            [SENTINEL],
            [65535],
            None,
            [{"name": "port-65535", "protocol": "TCP", "port": 65535, "targetPort": 65535}],
            id="the sentinel named",
        ),
    ],
)
def test_publish_ports(
    endpoint_ports: list[dict[str, Any]],
    ports: list[int] | None,
    method: str | None,
    published: list[dict[str, Any]],
) -> None:
    spec = spec_of(make_attachment(ports=ports, method=method))
    assert publish_ports(endpoint_ports, spec) == published


DNS = {"name": "dns", "protocol": "UDP", "port": 53, "targetPort": 53}


@pytest.mark.parametrize(
    ("endpoint_ports", "ports", "method", "says", "never"),
    [
        pytest.param(
            [POSTGRES],
            [9999],
            None,
            "does not publish the asked port 9999 (it publishes 5432/TCP)",
            "sentinel",
            id="an asked port the endpoint lacks, named with what it publishes",
        ),
        pytest.param(
            [POSTGRES, DNS],
            [9999, 80],
            None,
            "does not publish the asked ports 80, 9999 (it publishes 5432/TCP, 53/UDP)",
            "sentinel",
            id="several asked ports, sorted",
        ),
        pytest.param(
            [SENTINEL],
            None,
            None,
            "publishes only a VM's sentinel port 65535",
            "asked",
            id="a VM's sentinel alone",
        ),
        pytest.param(
            [SENTINEL],
            None,
            "PortList",
            "publishes only a VM's sentinel port 65535",
            "asked",
            id="in PortList",
        ),
        pytest.param([], None, None, "publishes no port", "sentinel", id="no port at all"),
        pytest.param([], [5432], None, "publishes no port", "sentinel", id="no port at all, ports asked"),
    ],
)
def test_the_nothing_to_publish_message_says_which_port(
    endpoint_ports: list[dict[str, Any]], ports: list[int] | None, method: str | None, says: str, never: str
) -> None:
    """The tenant reads which asked port the endpoint lacks (and what it offers), never the VM's
    sentinel when the endpoint is no VM's."""
    spec = spec_of(make_attachment(ports=ports, method=method))
    assert publish_ports(endpoint_ports, spec) == [], "the message is for an empty publication only"
    message = no_port_message("postgres-db", endpoint_ports, spec)
    assert message.startswith("Service postgres-db ")
    assert says in message
    assert never not in message


@pytest.mark.parametrize(
    ("port", "mirrored"),
    [
        ({"port": 80}, {"protocol": "TCP", "port": 80, "targetPort": 80}),
        (
            {
                "name": "h",
                "protocol": "UDP",
                "port": 53,
                "targetPort": 5353,
                "nodePort": 31000,
                "appProtocol": "dns",
            },
            {"name": "h", "protocol": "UDP", "port": 53, "targetPort": 5353, "appProtocol": "dns"},
        ),
        (
            {"name": "", "port": 80, "targetPort": "http"},
            {"protocol": "TCP", "port": 80, "targetPort": "http"},
        ),
    ],
)
def test_a_mirrored_port_never_carries_a_node_port_and_spells_out_defaults(
    port: dict[str, Any], mirrored: dict[str, Any]
) -> None:
    assert mirrored_port(port) == mirrored


# --- the Service ------------------------------------------------------------------------------------


def test_the_standard_service_exactly() -> None:
    assert render() == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "generateName": "db-public-",
            "namespace": NAMESPACE,
            "labels": {ATTACHMENT_LABEL: "db-public"},
            "annotations": {CLAIM_ANNOTATION: CLAIM},
            "ownerReferences": controlled_by(make_attachment()),
        },
        "spec": {
            "type": "LoadBalancer",
            "externalTrafficPolicy": "Local",
            "allocateLoadBalancerNodePorts": False,
            "ipFamilyPolicy": "SingleStack",
            "ipFamilies": ["IPv4"],
            "selector": SELECTOR,
            "ports": [POSTGRES],
        },
    }


@pytest.mark.parametrize(
    ("family", "policy", "families"),
    [
        ("IPv4", "SingleStack", ["IPv4"]),
        ("IPv6", "SingleStack", ["IPv6"]),
        ("Dual", "RequireDualStack", ["IPv4", "IPv6"]),
    ],
)
def test_families(family: str, policy: str, families: list[str]) -> None:
    assert ip_families(family) == families
    spec = render(family=family)["spec"]
    assert (spec["ipFamilyPolicy"], spec["ipFamilies"]) == (policy, families)


def test_load_balancer_class_and_node_ports_follow_the_class_and_the_setting() -> None:
    spec = render(load_balancer_class="metallb", settings=RenderSettings(allocate_node_ports=True))["spec"]
    assert (spec["loadBalancerClass"], spec["allocateLoadBalancerNodePorts"]) == ("metallb", True)
    assert "loadBalancerClass" not in render()["spec"]


@pytest.mark.parametrize(
    ("method", "settings", "proxy_label"),
    [
        (None, COZY, None),
        ("WholeIP", COZY, "cozy-proxy"),
        ("PortList", COZY, "cozy-proxy"),
        ("WholeIP", RenderSettings(), None),
    ],
)
def test_the_cozy_proxy_label_only_with_the_setting(
    method: str | None, settings: RenderSettings, proxy_label: str | None
) -> None:
    attachment = make_attachment(method=method, ports=[5432] if method == "PortList" else None)
    labels = render(attachment, settings=settings)["metadata"]["labels"]
    assert labels.get(SERVICE_PROXY_NAME_LABEL) == proxy_label
    assert labels[ATTACHMENT_LABEL] == "db-public"


@pytest.mark.parametrize(
    ("method", "allow_icmp", "annotations"),
    [
        (None, None, {}),
        ("WholeIP", None, {WHOLE_IP_ANNOTATION: "true"}),
        ("PortList", None, {WHOLE_IP_ANNOTATION: "false", ALLOW_ICMP_ANNOTATION: "false"}),
        ("PortList", True, {WHOLE_IP_ANNOTATION: "false", ALLOW_ICMP_ANNOTATION: "true"}),
    ],
)
def test_method_annotations(method: str | None, allow_icmp: bool | None, annotations: dict[str, str]) -> None:
    attachment = make_attachment(method=method, allow_icmp=allow_icmp)
    assert method_annotations(spec_of(attachment)) == annotations
    assert render(attachment, settings=COZY)["metadata"]["annotations"] == {
        CLAIM_ANNOTATION: CLAIM,
        **annotations,
    }


def test_nothing_is_copied_from_the_endpoint_or_the_attachment() -> None:
    attachment = make_attachment()
    attachment["metadata"]["labels"] = {**lineage_labels(), "team": "a"}
    attachment["metadata"]["annotations"] = {"note": "x"}
    service = render(attachment)
    assert service["metadata"]["labels"] == {ATTACHMENT_LABEL: "db-public"}
    assert service["metadata"]["annotations"] == {CLAIM_ANNOTATION: CLAIM}


# --- the patch of a live Service ---------------------------------------------------------------------


def live(**changes: Any) -> dict[str, Any]:
    return as_stored(
        render(**changes), ingress=("203.0.113.7",), annotations={METALLB_IPS_ANNOTATION: "203.0.113.7"}
    )


@pytest.mark.parametrize("method", [None, "WholeIP", "PortList"])
def test_a_stored_copy_needs_no_patch(method: str | None) -> None:
    attachment = make_attachment(method=method, ports=[5432] if method else None)
    desired = render(attachment, settings=COZY)
    stored = as_stored(desired, annotations={METALLB_IPS_ANNOTATION: "203.0.113.7"})
    stored["metadata"]["labels"]["other.io/x"] = "theirs"
    for port in stored["spec"]["ports"]:
        port["nodePort"] = 31000  # the API server's, never ours
    assert service_patch(stored, desired) is None


def _with(service: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(service)
    target = changed
    for key in path[:-1]:
        target = target.setdefault(key, {})
    if value is None:
        target.pop(path[-1], None)
    else:
        target[path[-1]] = value
    return changed


@pytest.mark.parametrize(
    ("drift", "value", "patch"),
    [
        pytest.param(
            ("metadata", "labels", ATTACHMENT_LABEL),
            "x",
            {"metadata": {"labels": {ATTACHMENT_LABEL: "db-public"}}},
            id="our label",
        ),
        pytest.param(
            ("metadata", "labels", SERVICE_PROXY_NAME_LABEL),
            "cozy-proxy",
            {"metadata": {"labels": {SERVICE_PROXY_NAME_LABEL: None}}},
            id="a proxy label we no longer want",
        ),
        pytest.param(
            ("metadata", "annotations", CLAIM_ANNOTATION),
            "other",
            {"metadata": {"annotations": {CLAIM_ANNOTATION: CLAIM}}},
            id="the claim annotation",
        ),
        pytest.param(
            ("metadata", "annotations", METALLB_IPS_ANNOTATION),
            None,
            None,
            id="the driver's pin removed: not ours",
        ),
        pytest.param(
            ("metadata", "annotations", METALLB_IPS_ANNOTATION),
            "198.51.100.1",
            None,
            id="the driver's pin changed: not ours",
        ),
        pytest.param(("metadata", "annotations", "theirs"), "x", None, id="another writer's annotation"),
        pytest.param(
            ("spec", "selector", "extra"),
            "x",
            {"spec": {"selector": {"extra": None}}},
            id="a selector key too many",
        ),
        pytest.param(
            ("spec", "allocateLoadBalancerNodePorts"),
            True,
            {"spec": {"allocateLoadBalancerNodePorts": False}},
            id="node ports",
        ),
        pytest.param(("spec", "ports"), [], {"spec": {"ports": [POSTGRES]}}, id="ports"),
        pytest.param(("spec", "sessionAffinity"), "ClientIP", None, id="a field we do not set"),
    ],
)
def test_the_patch_touches_only_what_we_own(
    drift: tuple[str, ...], value: Any, patch: dict[str, Any] | None
) -> None:
    desired = render()
    assert service_patch(_with(live(), drift, value), desired) == patch


def test_a_method_switch_patch_converges() -> None:
    whole = render(make_attachment(method="WholeIP"), settings=COZY)
    port_list = render(make_attachment(method="PortList", ports=[5432], allow_icmp=True), settings=COZY)
    stored = as_stored(whole)
    patch = service_patch(stored, port_list)
    assert patch == {
        "metadata": {"annotations": {ALLOW_ICMP_ANNOTATION: "true", WHOLE_IP_ANNOTATION: "false"}}
    }
    stored["metadata"]["annotations"].update(patch["metadata"]["annotations"])
    assert service_patch(stored, port_list) is None
    back = service_patch(stored, whole)
    assert back == {"metadata": {"annotations": {ALLOW_ICMP_ANNOTATION: None, WHOLE_IP_ANNOTATION: "true"}}}


@pytest.mark.parametrize(
    ("stored", "desired", "mismatch"),
    [
        pytest.param({}, {}, None, id="same"),
        pytest.param(
            {"load_balancer_class": "metallb"}, {}, "loadBalancerClass is metallb", id="class dropped"
        ),
        pytest.param({}, {"load_balancer_class": "metallb"}, "the class asks for metallb", id="class added"),
        pytest.param({"family": "IPv4"}, {"family": "IPv6"}, "primary IP family is IPv4", id="family"),
        pytest.param({"family": "IPv4"}, {"family": "Dual"}, None, id="IPv4 to Dual keeps the primary"),
    ],
)
def test_immutable_mismatch(stored: dict[str, Any], desired: dict[str, Any], mismatch: str | None) -> None:
    found = immutable_mismatch(as_stored(render(**stored)), render(**desired))
    if mismatch is None:
        assert found is None
    else:
        assert found is not None
        assert mismatch in found


def test_the_patch_never_touches_an_immutable_field() -> None:
    patch = service_patch(as_stored(render(load_balancer_class="metallb")), render())
    assert patch is None or "loadBalancerClass" not in patch.get("spec", {})
