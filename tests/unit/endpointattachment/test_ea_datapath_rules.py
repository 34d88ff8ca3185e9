"""datapath: the platform's declaration of a VM datapath, PortList ports, backends, exclusivity on the
backend pod."""

from __future__ import annotations

from typing import Any

import pytest

from operators.endpointattachment.api import WITHDRAWN_SELECTOR_KEY
from operators.endpointattachment.datapath import (
    AttachmentRank,
    ProxiedService,
    admit,
    backend_key,
    check_backends,
    check_exclusivity,
    check_port_list,
    find_proxy,
    is_withdrawn,
    rank_of,
    ready_backends,
    selects,
    served_selector,
    withdrawn_selector,
)
from operators.endpointattachment.reasons import (
    REASON_BACKEND_ALREADY_DELEGATED,
    REASON_DATAPATH_CONTRACT_UNAVAILABLE,
    REASON_MULTIPLE_BACKENDS,
    REASON_PROVISIONED,
    REASON_RENDER_FAILED,
)
from tests.ea_builders import make_attachment, make_endpointslice

ME = AttachmentRank("2024-01-02T00:00:00Z", "b-attachment", "tenant-a", "uid-me")
MY_SERVICE = ("tenant-a", "ea-b-attachment")
OLDER = AttachmentRank("2024-01-01T00:00:00Z", "z-attachment", "tenant-a", "uid-older")
NEWER = AttachmentRank("2024-01-03T00:00:00Z", "a-attachment", "tenant-a", "uid-newer")
SAME_TIME_SMALLER_NAME = AttachmentRank("2024-01-02T00:00:00Z", "a-attachment", "tenant-a", "uid-a")
SAME_TIME_LARGER_NAME = AttachmentRank("2024-01-02T00:00:00Z", "c-attachment", "tenant-a", "uid-c")


def proxied(
    name: str, backends: set[str], rank: AttachmentRank | None = None, proxy: str = "cozy-proxy"
) -> ProxiedService:
    """A Service delegated to ``proxy`` (rendered by the attachment ``rank``, or a chart's own)."""
    return ProxiedService("tenant-a", name, proxy, frozenset(backends), rank, uid=f"uid-{name}")


def unrendered(rank: AttachmentRank, backends: set[str]) -> ProxiedService:
    """A VM-mode attachment that could render and has no Service yet."""
    return ProxiedService("tenant-a", "", "cozy-proxy", frozenset(backends), rank)


@pytest.mark.parametrize(
    ("proxy_name", "method", "family", "ok", "said"),
    [
        pytest.param("cozy-proxy", "PortList", "IPv4", True, "cozy-proxy serves PortList", id="declared"),
        pytest.param(
            "cozy-proxy", "WholeIP", "IPv4", True, "cozy-proxy serves WholeIP", id="declared WholeIP"
        ),
        pytest.param(None, "PortList", "IPv4", False, "vm-datapath setting is off", id="setting off"),
        pytest.param("", "WholeIP", "IPv4", False, "vm-datapath setting is off", id="empty name"),
        pytest.param("cozy-proxy", "WholeIP", "IPv6", False, "IPv4 only", id="IPv6"),
        pytest.param("cozy-proxy", "PortList", "Dual", False, "IPv4 only", id="Dual"),
        pytest.param("cozy-proxy", "", "IPv4", False, "not a VM mode", id="not a VM mode"),
    ],
)
def test_find_proxy(proxy_name: str | None, method: str, family: str, ok: bool, said: str) -> None:
    verdict = find_proxy(proxy_name, method, family)
    assert (verdict.ok, verdict.proxy_name) == (ok, proxy_name if ok else None)
    assert verdict.reason == (REASON_PROVISIONED if ok else REASON_DATAPATH_CONTRACT_UNAVAILABLE)
    assert said in verdict.message


@pytest.mark.parametrize(
    ("ports", "ok"),
    [
        pytest.param([{"port": 5432, "targetPort": 5432, "protocol": "TCP"}], True, id="equal"),
        pytest.param([{"port": 53, "protocol": "UDP"}], True, id="targetPort absent means equal"),
        pytest.param([{"port": 80}], True, id="protocol absent means TCP"),
        pytest.param([{"port": 80, "targetPort": 8080}], False, id="translation"),
        pytest.param([{"port": 80, "targetPort": "http"}], False, id="named targetPort"),
        pytest.param([{"port": 80, "targetPort": "80"}], False, id="string targetPort"),
        pytest.param([{"port": 9000, "protocol": "SCTP"}], False, id="SCTP"),
        pytest.param([{"port": 80}, {"port": 443, "targetPort": 8443}], False, id="one bad port is enough"),
    ],
)
def test_port_list(ports: list[dict[str, Any]], ok: bool) -> None:
    verdict = check_port_list(ports)
    assert verdict.ok is ok
    assert verdict.reason == (REASON_PROVISIONED if ok else REASON_RENDER_FAILED)


@pytest.mark.parametrize(
    ("slices", "expected"),
    [
        pytest.param([make_endpointslice()], {"pod-uid-1"}, id="one ready"),
        pytest.param(
            [make_endpointslice(backends=[("p1", "10.0.0.1", True), ("p2", "10.0.0.2", False)])],
            {"p1"},
            id="not ready skipped",
        ),
        pytest.param(
            [make_endpointslice(backends=[("p1", "10.0.0.1", None)])], {"p1"}, id="nil ready counts as ready"
        ),
        pytest.param(
            [
                make_endpointslice(name="s4", backends=[("p1", "10.0.0.1", True)]),
                make_endpointslice(name="s6", backends=[("p1", "fd00::1", True)], address_type="IPv6"),
            ],
            {"p1"},
            id="deduplicated by pod across slices",
        ),
        pytest.param(
            [make_endpointslice(backends=[(None, "10.0.0.9", True)])],
            {"address:10.0.0.9"},
            id="no targetRef: keyed by address",
        ),
        pytest.param([make_endpointslice(backends=[])], set(), id="empty"),
    ],
)
def test_ready_backends(slices: list[dict[str, Any]], expected: set[str]) -> None:
    assert ready_backends(slices) == frozenset(expected)


def test_backend_key_without_anything() -> None:
    assert backend_key({"addresses": []}) is None


@pytest.mark.parametrize(
    ("mode", "count", "ok"),
    [
        ("WholeIP", 0, True),
        ("WholeIP", 1, True),
        ("WholeIP", 2, False),
        ("PortList", 1, True),
        ("PortList", 2, False),
    ],
)
def test_check_backends(mode: str, count: int, ok: bool) -> None:
    verdict = check_backends(mode, frozenset(f"p{i}" for i in range(count)))
    assert verdict.ok is ok
    assert verdict.reason == (REASON_PROVISIONED if ok else REASON_MULTIPLE_BACKENDS)


@pytest.mark.parametrize(
    ("others", "winner"),
    [
        pytest.param([], None, id="alone"),
        pytest.param(
            [proxied("vm-proxy", {"p1"})], "Service tenant-a/vm-proxy", id="chart Service always wins"
        ),
        pytest.param(
            [proxied("ea-old", {"p1"}, OLDER)], "Service tenant-a/ea-old", id="older attachment wins"
        ),
        pytest.param(
            [unrendered(OLDER, {"p1"})],
            "EndpointAttachment tenant-a/z-attachment",
            id="an older attachment not rendered yet wins, named",
        ),
        pytest.param([unrendered(NEWER, {"p1"})], None, id="a newer attachment not rendered loses"),
        pytest.param([proxied("ea-new", {"p1"}, NEWER)], None, id="newer attachment loses"),
        pytest.param(
            [proxied("ea-a", {"p1"}, SAME_TIME_SMALLER_NAME)],
            "tenant-a/ea-a",
            id="same time: smaller name wins",
        ),
        pytest.param(
            [proxied("ea-c", {"p1"}, SAME_TIME_LARGER_NAME)], None, id="same time: larger name loses"
        ),
        pytest.param([proxied("vm-proxy", {"p9"})], None, id="no shared pod"),
        pytest.param([proxied("vm-proxy", {"p1"}, proxy="other-proxy")], None, id="another proxy"),
        pytest.param([proxied("ea-b-attachment", {"p1"}, ME)], None, id="own rendered Service"),
        pytest.param(
            [ProxiedService("tenant-a", "ea-old-name", "cozy-proxy", frozenset({"p1"}), ME)],
            None,
            id="own older Service",
        ),
        pytest.param(
            [proxied("ea-old", {"p1"}, OLDER), proxied("vm-proxy", {"p2"})],
            "Service tenant-a/vm-proxy",
            id="chart reported before attachment",
        ),
    ],
)
def test_exclusivity(others: list[ProxiedService], winner: str | None) -> None:
    verdict = check_exclusivity(ME, MY_SERVICE, "cozy-proxy", frozenset({"p1", "p2"}), others)
    assert verdict.ok is (winner is None)
    if winner is not None:
        assert verdict.reason == REASON_BACKEND_ALREADY_DELEGATED
        assert winner in verdict.message


def test_exclusivity_is_symmetric_exactly_one_wins() -> None:
    a = AttachmentRank("2024-01-01T00:00:00Z", "a", "tenant-a", "ua")
    b = AttachmentRank("2024-01-01T00:00:00Z", "b", "tenant-a", "ub")
    pods = frozenset({"p1"})
    a_view = check_exclusivity(a, ("tenant-a", "ea-a"), "cozy-proxy", pods, [proxied("ea-b", {"p1"}, b)])
    b_view = check_exclusivity(b, ("tenant-a", "ea-b"), "cozy-proxy", pods, [proxied("ea-a", {"p1"}, a)])
    assert [a_view.ok, b_view.ok] == [True, False]


def test_rank_of() -> None:
    rank = rank_of(make_attachment("x", created="2024-05-01T00:00:00Z", uid="u"))
    assert rank == AttachmentRank("2024-05-01T00:00:00Z", "x", "tenant-a", "u")


@pytest.mark.parametrize(
    ("mode", "ports", "backends", "others", "reason"),
    [
        pytest.param("PortList", [{"port": 22}], {"p1"}, [], REASON_PROVISIONED, id="PortList admitted"),
        pytest.param(
            "PortList",
            [{"port": 22, "targetPort": 2222}],
            {"p1"},
            [],
            REASON_RENDER_FAILED,
            id="ports first",
        ),
        pytest.param(
            "WholeIP",
            [{"port": 22, "targetPort": 2222}],
            {"p1"},
            [],
            REASON_PROVISIONED,
            id="WholeIP ignores ports",
        ),
        pytest.param(
            "WholeIP", [{"port": 22}], {"p1", "p2"}, [], REASON_MULTIPLE_BACKENDS, id="WholeIP two backends"
        ),
        pytest.param(
            "WholeIP",
            [{"port": 22}],
            {"p1"},
            [proxied("vm", {"p1"})],
            REASON_BACKEND_ALREADY_DELEGATED,
            id="exclusivity",
        ),
    ],
)
def test_admit(
    mode: str, ports: list[dict[str, Any]], backends: set[str], others: list[ProxiedService], reason: str
) -> None:
    verdict = admit(
        mode=mode,
        family="IPv4",
        ports=ports,
        backends=frozenset(backends),
        proxy_name="declared",
        me=ME,
        my_service=MY_SERVICE,
        others=[
            ProxiedService(o.namespace, o.name, "declared", o.backends, o.attachment, uid=o.uid)
            for o in others
        ],
    )
    assert verdict.reason == reason
    assert verdict.proxy_name == ("declared" if verdict.ok else None)


@pytest.mark.parametrize("proxy_name", [None, ""])
def test_admit_without_a_declared_datapath_decides_nothing_else(proxy_name: str | None) -> None:
    verdict = admit(
        mode="PortList",
        family="IPv4",
        ports=[{"port": 22, "targetPort": 2222}],
        backends=frozenset({"p1", "p2"}),
        proxy_name=proxy_name,
        me=ME,
        my_service=MY_SERVICE,
        others=[proxied("vm", {"p1"})],
    )
    assert verdict.reason == REASON_DATAPATH_CONTRACT_UNAVAILABLE


def test_a_withdrawn_selector_selects_no_pod_and_still_holds_its_pods_for_rivals() -> None:
    selector = {"vm.kubevirt.io/name": "vm1"}
    withdrawn = withdrawn_selector(selector, "ea-uid-1")
    assert withdrawn == {**selector, WITHDRAWN_SELECTOR_KEY: "ea-uid-1"}
    assert is_withdrawn(withdrawn)
    assert not is_withdrawn(selector)
    assert not is_withdrawn(None)
    assert not selects(withdrawn, selector), "the endpoint's pods do not carry our key"
    assert served_selector(withdrawn) == selector
    assert served_selector(selector) is selector
    # A younger attachment on the same pods loses to the withdrawn Service, read as the World reads
    # every proxied Service (through served_selector).
    ours = ProxiedService(
        "tenant-a",
        "vm1-public-x7ktq",
        "cozy-proxy",
        frozenset(),
        attachment=rank_of(make_attachment("vm1-public", created="2024-01-01T00:00:00Z")),
        selector=served_selector(withdrawn),
        uid="uid-ours",
    )
    younger = make_attachment("vm1-other", uid="uid-younger", created="2024-06-01T00:00:00Z")
    verdict = admit(
        mode="WholeIP",
        family="IPv4",
        ports=[{"port": 22}],
        backends=frozenset({"pod-uid-1"}),
        proxy_name="cozy-proxy",
        me=rank_of(younger),
        my_service=("tenant-a", ""),
        others=[ours],
        selector=selector,
    )
    assert verdict.reason == REASON_BACKEND_ALREADY_DELEGATED, verdict
