"""datapath: proxy declarations, PortList ports, backends, exclusivity on the backend pod."""

from __future__ import annotations

from typing import Any

import pytest

from operators.endpointattachment.constants import (
    REASON_ADDRESS_FAMILY_UNSUPPORTED,
    REASON_ADMITTED,
    REASON_EXCLUSIVITY_CONFLICT,
    REASON_MULTIPLE_BACKENDS,
    REASON_PORT_TRANSLATION_UNSUPPORTED,
    REASON_PROXY_DECLARATION_CONFLICT,
    REASON_PROXY_NOT_DECLARED,
)
from operators.endpointattachment.datapath import (
    AttachmentRank,
    ProxiedService,
    admit,
    backend_key,
    check_backends,
    check_exclusivity,
    check_port_list,
    find_proxy,
    proxy_declarations,
    rank_of,
    ready_backends,
)
from tests.ea_builders import make_attachment, make_endpointslice, make_serviceproxy

ME = AttachmentRank("2024-01-02T00:00:00Z", "b-attachment", "tenant-a", "uid-me")
MY_SERVICE = ("tenant-a", "ea-b-attachment")
OLDER = AttachmentRank("2024-01-01T00:00:00Z", "z-attachment", "tenant-a", "uid-older")
NEWER = AttachmentRank("2024-01-03T00:00:00Z", "a-attachment", "tenant-a", "uid-newer")
SAME_TIME_SMALLER_NAME = AttachmentRank("2024-01-02T00:00:00Z", "a-attachment", "tenant-a", "uid-a")
SAME_TIME_LARGER_NAME = AttachmentRank("2024-01-02T00:00:00Z", "c-attachment", "tenant-a", "uid-c")


def proxied(
    name: str, backends: set[str], rank: AttachmentRank | None = None, proxy: str = "cozy-proxy"
) -> ProxiedService:
    return ProxiedService("tenant-a", name, proxy, frozenset(backends), rank)


@pytest.mark.parametrize(
    ("proxies", "mode", "family", "reason", "proxy_name"),
    [
        pytest.param([make_serviceproxy()], "PortList", "IPv4", REASON_ADMITTED, "cozy-proxy", id="declared"),
        pytest.param(
            [make_serviceproxy()], "WholeIP", "IPv4", REASON_ADMITTED, "cozy-proxy", id="declared WholeIP"
        ),
        pytest.param([], "PortList", "IPv4", REASON_PROXY_NOT_DECLARED, None, id="no declaration"),
        pytest.param(
            [make_serviceproxy(modes=["PortList"])],
            "WholeIP",
            "IPv4",
            REASON_PROXY_NOT_DECLARED,
            None,
            id="mode not declared",
        ),
        pytest.param(
            [make_serviceproxy(modes=[])],
            "PortList",
            "IPv4",
            REASON_PROXY_NOT_DECLARED,
            None,
            id="no modes declares none",
        ),
        pytest.param(
            [make_serviceproxy()],
            "PortList",
            "IPv6",
            REASON_ADDRESS_FAMILY_UNSUPPORTED,
            None,
            id="family unsupported",
        ),
        pytest.param(
            [make_serviceproxy(families=None)],
            "PortList",
            "IPv4",
            REASON_ADMITTED,
            "cozy-proxy",
            id="families default IPv4",
        ),
        pytest.param(
            [make_serviceproxy(families=None)],
            "PortList",
            "IPv6",
            REASON_ADDRESS_FAMILY_UNSUPPORTED,
            None,
            id="default is not IPv6",
        ),
        pytest.param(
            [make_serviceproxy(deleting=True)],
            "PortList",
            "IPv4",
            REASON_PROXY_NOT_DECLARED,
            None,
            id="deleting ignored",
        ),
        pytest.param(
            [make_serviceproxy(proxy_name="")],
            "PortList",
            "IPv4",
            REASON_PROXY_NOT_DECLARED,
            None,
            id="nameless ignored",
        ),
        pytest.param(
            [
                make_serviceproxy("v4", proxy_name="proxy-v4"),
                make_serviceproxy("v6", proxy_name="proxy-v6", families=["IPv6"]),
            ],
            "WholeIP",
            "IPv6",
            REASON_ADMITTED,
            "proxy-v6",
            id="picks the one for the family, with its declared name",
        ),
        pytest.param(
            [make_serviceproxy("zz", proxy_name="same"), make_serviceproxy("aa", proxy_name="same")],
            "PortList",
            "IPv4",
            REASON_ADMITTED,
            "same",
            id="several naming one proxy are one",
        ),
        pytest.param(
            [make_serviceproxy("zz", proxy_name="second"), make_serviceproxy("aa", proxy_name="first")],
            "PortList",
            "IPv4",
            REASON_PROXY_DECLARATION_CONFLICT,
            None,
            id="several naming different proxies: ambiguous, no name guessed",
        ),
        pytest.param(
            [make_serviceproxy()], "Standard", "IPv4", REASON_PROXY_NOT_DECLARED, None, id="not a VM mode"
        ),
    ],
)
def test_find_proxy(
    proxies: list[dict[str, Any]], mode: str, family: str, reason: str, proxy_name: str | None
) -> None:
    verdict = find_proxy(proxies, mode, family)
    assert (verdict.ok, verdict.reason, verdict.proxy_name) == (reason == REASON_ADMITTED, reason, proxy_name)


def test_proxy_declarations_sorted() -> None:
    names = [d.name for d in proxy_declarations([make_serviceproxy("b"), make_serviceproxy("a")])]
    assert names == ["a", "b"]


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
    assert verdict.reason == (REASON_ADMITTED if ok else REASON_PORT_TRANSLATION_UNSUPPORTED)


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
    assert verdict.reason == (REASON_ADMITTED if ok else REASON_MULTIPLE_BACKENDS)


@pytest.mark.parametrize(
    ("others", "winner"),
    [
        pytest.param([], None, id="alone"),
        pytest.param([proxied("vm-proxy", {"p1"})], "vm-proxy", id="chart Service always wins"),
        pytest.param([proxied("ea-old", {"p1"}, OLDER)], "ea-old", id="older attachment wins"),
        pytest.param([proxied("ea-new", {"p1"}, NEWER)], None, id="newer attachment loses"),
        pytest.param(
            [proxied("ea-a", {"p1"}, SAME_TIME_SMALLER_NAME)], "ea-a", id="same time: smaller name wins"
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
            "vm-proxy",
            id="chart reported before attachment",
        ),
    ],
)
def test_exclusivity(others: list[ProxiedService], winner: str | None) -> None:
    verdict = check_exclusivity(ME, MY_SERVICE, "cozy-proxy", frozenset({"p1", "p2"}), others)
    assert verdict.ok is (winner is None)
    if winner is not None:
        assert verdict.reason == REASON_EXCLUSIVITY_CONFLICT
        assert f"tenant-a/{winner}" in verdict.message


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
        pytest.param("PortList", [{"port": 22}], {"p1"}, [], REASON_ADMITTED, id="PortList admitted"),
        pytest.param(
            "PortList",
            [{"port": 22, "targetPort": 2222}],
            {"p1"},
            [],
            REASON_PORT_TRANSLATION_UNSUPPORTED,
            id="ports first",
        ),
        pytest.param(
            "WholeIP",
            [{"port": 22, "targetPort": 2222}],
            {"p1"},
            [],
            REASON_ADMITTED,
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
            REASON_EXCLUSIVITY_CONFLICT,
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
        service_proxies=[make_serviceproxy(proxy_name="declared")],
        me=ME,
        my_service=MY_SERVICE,
        others=[ProxiedService(o.namespace, o.name, "declared", o.backends, o.attachment) for o in others],
    )
    assert verdict.reason == reason
    assert verdict.proxy_name == ("declared" if verdict.ok else None)
