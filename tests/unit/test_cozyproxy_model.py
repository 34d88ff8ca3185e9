"""The cozy-proxy model (``harness.cozyproxy``) itself: one row per behaviour of cozy-proxy
it stands for, driven by events as its watches would deliver them. ``test_model`` runs the model
without the address-before-Endpoints race (its rows are about everything else, in either order of
events); ``test_race`` is the race."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from harness.cozyproxy import CozyProxyModel

NS = "tenant-a"
Obj = dict[str, Any]
Event = tuple[str, str, Obj]  # ("service" | "endpoints", kind, object)


def service(
    name: str,
    address: str | None = "198.51.100.1",
    *,
    proxy: str | None = "cozy-proxy",
    whole_ip: bool = False,
    icmp: bool = True,
    ports: Sequence[Mapping[str, Any]] = ({"port": 22, "protocol": "TCP"},),
    extra_ingress: Sequence[str] = (),
) -> Obj:
    labels = {"service.kubernetes.io/service-proxy-name": proxy} if proxy else {}
    annotations = {
        "networking.cozystack.io/wholeIP": "true" if whole_ip else "false",
        "networking.cozystack.io/allowICMP": "true" if icmp else "false",
    }
    ingress = [{"ip": a} for a in ([address] if address else []) + list(extra_ingress)]
    return {
        "metadata": {"name": name, "namespace": NS, "labels": labels, "annotations": annotations},
        "spec": {"ports": [dict(p) for p in ports]},
        "status": {"loadBalancer": {"ingress": ingress}},
    }


def endpoints(name: str, *ready: tuple[str, str], not_ready: Sequence[tuple[str, str]] = ()) -> Obj:
    """v1 Endpoints with (ip, pod name) ready addresses, in the order given."""
    subset: Obj = {}
    if ready:
        subset["addresses"] = [{"ip": ip, "targetRef": {"kind": "Pod", "name": pod}} for ip, pod in ready]
    if not_ready:
        subset["notReadyAddresses"] = [
            {"ip": ip, "targetRef": {"kind": "Pod", "name": p}} for ip, p in not_ready
        ]
    return {"metadata": {"name": name, "namespace": NS}, "subsets": [subset] if subset else []}


def svc(kind: str, obj: Obj) -> Event:
    return "service", kind, obj


def eps(kind: str, obj: Obj) -> Event:
    return "endpoints", kind, obj


def run(*events: Event, race: bool = False) -> CozyProxyModel:
    model = CozyProxyModel(race=race)
    for target, kind, obj in events:
        (model.on_service if target == "service" else model.on_endpoints)(kind, obj)
    return model


POD_A, POD_B = ("10.244.0.1", "vm-a"), ("10.244.0.2", "vm-b")
A1, A2 = "198.51.100.1", "198.51.100.2"
Probe = Callable[[CozyProxyModel], object]


@pytest.mark.parametrize(
    ("events", "probe", "expected"),
    [
        pytest.param(
            [svc("ADDED", service("s1")), eps("ADDED", endpoints("s1", POD_A))],
            lambda m: m.pod_reached(A1),
            "vm-a",
            id="address and ready endpoint: programmed",
        ),
        pytest.param(
            [eps("ADDED", endpoints("s1", POD_A)), svc("ADDED", service("s1"))],
            lambda m: m.pod_reached(A1),
            "vm-a",
            id="either order",
        ),
        pytest.param(
            [svc("ADDED", service("s1", proxy=None)), eps("ADDED", endpoints("s1", POD_A))],
            lambda m: m.reaches(A1),
            None,
            id="only Services labelled for it",
        ),
        pytest.param(
            [svc("ADDED", service("s1", proxy="other")), eps("ADDED", endpoints("s1", POD_A))],
            lambda m: m.reaches(A1),
            None,
            id="only its own proxy name",
        ),
        pytest.param(
            [svc("ADDED", service("s1", None)), eps("ADDED", endpoints("s1", POD_A))],
            lambda m: m.snat,
            {},
            id="no ingress address: nothing",
        ),
        pytest.param(
            [svc("ADDED", service("s1")), eps("ADDED", endpoints("s1", not_ready=[POD_A]))],
            lambda m: m.snat,
            {},
            id="no ready endpoint: nothing",
        ),
        pytest.param(
            [svc("ADDED", service("s1", extra_ingress=[A2])), eps("ADDED", endpoints("s1", POD_A))],
            lambda m: (m.reaches(A1), m.reaches(A2)),
            (POD_A[0], None),
            id="first ingress address only",
        ),
        pytest.param(
            [svc("ADDED", service("s1")), eps("ADDED", endpoints("s1", POD_A, POD_B))],
            lambda m: (m.reaches(A1), POD_B[0] in m.snat),
            (POD_A[0], False),
            id="first Endpoints address only: the other pod's egress is unmapped",
        ),
        pytest.param(
            [svc("ADDED", service("s1")), eps("ADDED", endpoints("s1", POD_A))],
            lambda m: (m.port_filter(POD_A[0]), m.icmp_allowed(POD_A[0])),
            (frozenset({("TCP", 22)}), True),
            id="PortList: port filter and ICMP allow on the pod",
        ),
        pytest.param(
            [svc("ADDED", service("s1", icmp=False)), eps("ADDED", endpoints("s1", POD_A))],
            lambda m: m.icmp_allowed(POD_A[0]),
            False,
            id="PortList without ICMP",
        ),
        pytest.param(
            [svc("ADDED", service("s1", whole_ip=True)), eps("ADDED", endpoints("s1", POD_A))],
            lambda m: (m.port_filter(POD_A[0]), m.icmp_allowed(POD_A[0])),
            (None, True),
            id="WholeIP: no filter",
        ),
        pytest.param(
            [
                svc("ADDED", service("s1")),
                eps("ADDED", endpoints("s1", POD_A)),
                svc("ADDED", service("s2", A2, whole_ip=True)),
                eps("ADDED", endpoints("s2", POD_A)),
            ],
            lambda m: (m.reaches(A1), m.reaches(A2), m.owner_of(POD_A[0]), m.port_filter(POD_A[0])),
            (None, POD_A[0], (NS, "s2"), None),
            id="a second Service on the pod replaces the first's entries",
        ),
        pytest.param(
            [
                svc("ADDED", service("s1")),
                eps("ADDED", endpoints("s1", POD_A)),
                svc("ADDED", service("s2", A2)),
                eps("ADDED", endpoints("s2", POD_A)),
                svc("DELETED", service("s1")),
            ],
            lambda m: (m.reaches(A2), m.port_filter(POD_A[0])),
            (None, None),
            id="deleting the replaced Service clears the pod, whoever owns it now",
        ),
        pytest.param(
            [
                svc("ADDED", service("s1")),
                eps("ADDED", endpoints("s1", POD_A)),
                svc("ADDED", service("s2", A2)),
                eps("ADDED", endpoints("s2", POD_A)),
                svc("DELETED", service("s1")),
                svc("MODIFIED", service("s2", A2)),
            ],
            lambda m: (m.pod_reached(A2), m.port_filter(POD_A[0])),
            ("vm-a", frozenset({("TCP", 22)})),
            id="any update of the survivor programs it again",
        ),
        pytest.param(
            [
                svc("ADDED", service("s1")),
                eps("ADDED", endpoints("s1", POD_A)),
                eps("MODIFIED", endpoints("s1", POD_B)),
            ],
            lambda m: (m.pod_reached(A1), POD_A[0] in m.snat),
            ("vm-b", False),
            id="a Service moving to another pod leaves the first",
        ),
        pytest.param(
            [
                svc("ADDED", service("s1")),
                eps("ADDED", endpoints("s1", POD_A)),
                eps("MODIFIED", endpoints("s1", not_ready=[POD_A])),
            ],
            lambda m: (m.reaches(A1), m.port_filter(POD_A[0])),
            (None, None),
            id="the pod no longer ready: cleared",
        ),
        pytest.param(
            [
                svc("ADDED", service("s1")),
                eps("ADDED", endpoints("s1", POD_A)),
                svc("MODIFIED", service("s1", proxy=None)),
            ],
            lambda m: m.reaches(A1),
            None,
            id="leaving the proxy: cleared",
        ),
        pytest.param(
            [svc("ADDED", service("ea-x")), svc("DELETED", service("ea-x"))],
            lambda m: m.seen,
            {"ea-x"},
            id="every Service ever seen is remembered",
        ),
    ],
)
def test_model(events: list[Event], probe: Probe, expected: object) -> None:
    assert probe(run(*events)) == expected


def test_programs_counts_every_programming() -> None:
    model = run(
        svc("ADDED", service("s1")),
        eps("ADDED", endpoints("s1", POD_A)),
        svc("MODIFIED", service("s1")),
    )
    assert model.programs[(NS, "s1")] == 2
    assert model.ip_of("vm-a") == POD_A[0]


@pytest.mark.parametrize(
    ("events", "probe", "expected"),
    [
        pytest.param(
            [
                svc("ADDED", service("s1", None)),
                svc("MODIFIED", service("s1")),
                eps("ADDED", endpoints("s1", POD_A)),
            ],
            lambda m: (m.reaches(A1), m.stuck),
            (None, {(NS, "s1")}),
            id="the address before the Endpoints exist: programmed with no backend, and left so",
        ),
        pytest.param(
            [
                svc("MODIFIED", service("s1")),
                eps("ADDED", endpoints("s1", not_ready=[POD_A])),
                eps("MODIFIED", endpoints("s1", POD_A)),
            ],
            lambda m: m.reaches(A1),
            None,
            id="no Endpoints event programs a stuck Service, not even its pod becoming ready",
        ),
        pytest.param(
            [
                svc("MODIFIED", service("s1")),
                eps("ADDED", endpoints("s1", POD_A)),
                svc("MODIFIED", service("s1")),
            ],
            lambda m: (m.pod_reached(A1), m.stuck),
            ("vm-a", set()),
            id="an update of the Service programs it again",
        ),
        pytest.param(
            [eps("ADDED", endpoints("s1", POD_A)), svc("MODIFIED", service("s1"))],
            lambda m: m.pod_reached(A1),
            "vm-a",
            id="the Endpoints first: no race",
        ),
        pytest.param(
            [
                eps("ADDED", endpoints("s1", not_ready=[POD_A])),
                svc("MODIFIED", service("s1")),
                eps("MODIFIED", endpoints("s1", POD_A)),
            ],
            lambda m: (m.pod_reached(A1), m.stuck),
            ("vm-a", set()),
            id="Endpoints that exist without a ready address are not the race: their update programs it",
        ),
        pytest.param(
            [
                svc("MODIFIED", service("s1")),
                eps("ADDED", endpoints("s1", POD_A)),
                svc("DELETED", service("s1")),
            ],
            lambda m: (m.stuck, m.snat),
            (set(), {}),
            id="a stuck Service deleted: nothing left",
        ),
    ],
)
def test_race(events: list[Event], probe: Probe, expected: object) -> None:
    assert probe(run(*events, race=True)) == expected


def test_the_race_is_off_on_request() -> None:
    model = run(svc("MODIFIED", service("s1")), eps("ADDED", endpoints("s1", POD_A)), race=False)
    assert (model.pod_reached(A1), model.stuck) == ("vm-a", set())


def test_the_race_is_on_by_default_as_cozy_proxy_has_it() -> None:
    assert CozyProxyModel().race
