"""Exclusivity as cozy-proxy really behaves: decided over every pod an endpoint selects (ready or
not), rivals rendered or not, the survivors a change of ours must have programmed again, and what
cozy-proxy itself will program (the v1 Endpoints). One row per invariant; the whole pass over the
caches at the end."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pytest

from operators.endpointattachment.datapath import (
    AttachmentRank,
    ProxiedService,
    check_exclusivity,
    could_render,
    programmed_backends,
    programmed_token,
    reprogram_token,
    selected_pods,
    selectors_nested,
    selects,
    survivors,
    uncached_rank,
)
from operators.endpointattachment.reasons import (
    REASON_BACKEND_ALREADY_DELEGATED,
    REASON_WAITING_FOR_ADDRESS,
)
from operators.endpointattachment.reconcile import Plan, reconcile
from operators.endpointattachment.render import RenderSettings
from operators.endpointattachment.world import World
from shared.runtime.cache import Obj
from tests.ea_builders import (
    make_attachment,
    make_claim,
    make_class,
    make_endpoints,
    make_endpointslice,
    make_helmrelease,
    make_service,
)
from tests.ea_caches import Step, put, world_of

NS = "tenant-a"
ME = AttachmentRank("2024-01-02T00:00:00Z", "me", NS, "uid-me")
OLDER = AttachmentRank("2024-01-01T00:00:00Z", "old", NS, "uid-old")
YOUNGER = AttachmentRank("2024-01-03T00:00:00Z", "young", NS, "uid-young")
VM = {"vm": "vm1"}


def pod(name: str, labels: Mapping[str, str], phase: str | None = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "labels": dict(labels)},
        "status": {"phase": phase},
    }


def rival(
    name: str,
    pods: set[str] = frozenset(),  # type: ignore[assignment]
    rank: AttachmentRank | None = None,
    selector: Mapping[str, str] | None = None,
    uid: str = "",
    proxy: str = "cozy-proxy",
) -> ProxiedService:
    return ProxiedService(NS, name, proxy, frozenset(pods), rank, selector, uid, "7" if uid else "")


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        (VM, {"vm": "vm1", "x": "y"}, True),
        (VM, {"vm": "vm2"}, False),
        (VM, {}, False),
        ({}, {"vm": "vm1"}, False),  # no selector selects nothing (Services' semantics, not all)
        (None, {"vm": "vm1"}, False),
    ],
)
def test_selects(selector: Mapping[str, str] | None, labels: Mapping[str, str], expected: bool) -> None:
    assert selects(selector, labels) is expected


def test_selected_pods_ready_or_not_but_never_finished() -> None:
    pods = [
        pod("running", VM),
        pod("pending", VM, "Pending"),
        pod("unscheduled", VM, None),
        pod("done", VM, "Succeeded"),
        pod("failed", VM, "Failed"),
        pod("other", {"vm": "vm2"}),
    ]
    assert selected_pods(VM, pods) == {"uid-running", "uid-pending", "uid-unscheduled"}


@pytest.mark.parametrize(
    ("a", "b", "nested"),
    [
        (VM, VM, True),  # two attachments to one endpoint: they meet even with no pod at all
        (VM, {**VM, "role": "x"}, True),
        ({**VM, "role": "x"}, VM, True),
        (VM, {"vm": "vm2"}, False),
        (VM, {"app": "db"}, False),  # might overlap; judged by the pods that exist
        (VM, {}, False),
        (None, VM, False),
    ],
)
def test_selectors_nested(a: Mapping[str, str] | None, b: Mapping[str, str] | None, nested: bool) -> None:
    assert selectors_nested(a, b) is nested


@pytest.mark.parametrize(
    ("others", "winner"),
    [
        pytest.param(
            [rival("chart", selector=VM)],
            "Service tenant-a/chart",
            id="chart selecting the same: wins with no pod",
        ),
        pytest.param(
            [rival("", rank=OLDER, selector=VM)],
            "EndpointAttachment tenant-a/old",
            id="older, not rendered, no pod: wins, named",
        ),
        pytest.param([rival("ea-young", rank=YOUNGER, selector=VM)], None, id="younger loses"),
        pytest.param(
            [rival("ea-old", {"uid-vm"}, OLDER, {"app": "x"}, uid="o")],
            "Service tenant-a/ea-old",
            id="shared unready pod",
        ),
        pytest.param([rival("ea-old", {"uid-other"}, OLDER, {"vm": "vm2"})], None, id="another VM"),
        pytest.param(
            [rival("ea-gone", {"uid-vm"}, uncached_rank("gone", NS, "u"), VM)],
            None,
            id="an attachment not cached is never the oldest",
        ),
        pytest.param(
            [ProxiedService("tenant-b", "chart", "cozy-proxy", frozenset(), None, VM)],
            None,
            id="selectors of another namespace never meet",
        ),
    ],
)
def test_exclusivity_over_selected_pods(others: list[ProxiedService], winner: str | None) -> None:
    verdict = check_exclusivity(ME, (NS, "ea-me"), "cozy-proxy", frozenset({"uid-vm"}), others, VM)
    assert verdict.ok is (winner is None)
    if winner is not None:
        assert verdict.reason == REASON_BACKEND_ALREADY_DELEGATED
        assert winner in verdict.message


def test_uncached_ranks_after_every_cached_attachment() -> None:
    assert uncached_rank("a", NS, "u") > AttachmentRank("9999-12-31T23:59:59Z", "z", NS, "z")


@pytest.mark.parametrize(
    ("others", "expected"),
    [
        pytest.param([rival("chart", {"uid-vm"}, uid="c")], [(NS, "chart")], id="chart sharing the pod"),
        pytest.param(
            [rival("chart", selector=VM, uid="c")], [(NS, "chart")], id="chart, same selector, no pod"
        ),
        pytest.param([rival("ea-old", {"uid-vm"}, OLDER, uid="o")], [(NS, "ea-old")], id="attachment's"),
        pytest.param(
            [rival("ea-old", {"uid-vm"}, OLDER)], [], id="an attachment not rendered: nothing to program"
        ),
        pytest.param([rival("other", {"uid-x"}, uid="x")], [], id="other pods"),
        pytest.param([rival("other", {"uid-vm"}, uid="x", proxy="p2")], [], id="another proxy"),
        pytest.param([rival("ea-me", {"uid-vm"}, ME, uid="me")], [], id="never itself"),
    ],
)
def test_survivors(others: list[ProxiedService], expected: list[tuple[str, str]]) -> None:
    changed = ProxiedService(NS, "ea-me", "cozy-proxy", frozenset({"uid-vm"}), ME, VM, "me", "41")
    assert survivors(changed, others) == expected


def test_reprogram_token_is_deterministic_and_names_the_change() -> None:
    changed = ProxiedService(NS, "ea-me", "cozy-proxy", frozenset(), ME, VM, "me", "41")
    assert reprogram_token(changed) == reprogram_token(dataclasses.replace(changed)) == f"{NS}/ea-me/me/41"
    assert reprogram_token(changed) != reprogram_token(dataclasses.replace(changed, resource_version="42"))


@pytest.mark.parametrize(
    ("endpoints", "expected"),
    [
        (None, ()),  # no Endpoints yet: nothing for cozy-proxy to program
        (make_endpoints(backends=[]), ()),
        (make_endpoints(backends=[("p1", "10.0.0.1", False)]), ()),  # not ready never counts
        (
            make_endpoints(
                backends=[("p2", "10.0.0.2", True), ("p1", "10.0.0.1", False), ("p2", "10.0.0.3", True)]
            ),
            (("p2", "pod pod-p2 (10.0.0.2)"),),  # one per pod, in the API's order
        ),
        (
            make_endpoints(backends=[(None, "10.0.0.9", True), ("p3", "10.0.0.3", True)]),
            (("address:10.0.0.9", "address 10.0.0.9"), ("p3", "pod pod-p3 (10.0.0.3)")),
        ),
    ],
)
def test_programmed_backends_read_the_v1_endpoints(
    endpoints: Obj | None, expected: tuple[tuple[str, str], ...]
) -> None:
    assert programmed_backends(endpoints) == expected


def test_programmed_token_is_deterministic_per_address_and_backend() -> None:
    assert programmed_token("192.0.2.7", "p1") == programmed_token("192.0.2.7", "p1")
    assert programmed_token("192.0.2.7", "p1") != programmed_token("192.0.2.7", "p2")
    assert programmed_token("192.0.2.7", "p1") != programmed_token("192.0.2.8", "p1")


# --- the whole pass, from the caches -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "ports", "proxy_name", "expected"),
    [
        ("WholeIP", [{"port": 22, "targetPort": 2222}], "cozy-proxy", True),
        ("PortList", [{"port": 22}], "cozy-proxy", True),
        ("PortList", [{"port": 22, "targetPort": 2222}], "cozy-proxy", False),  # never renders
        ("PortList", [{"port": 22}], None, False),  # no datapath declared
        ("WholeIP", [{"port": 22}], "", False),
        ("WholeIP", None, "cozy-proxy", False),  # no endpoint
        ("", [{"port": 22}], "cozy-proxy", False),  # not a VM mode
    ],
)
def test_could_render(
    mode: str, ports: list[dict[str, Any]] | None, proxy_name: str | None, expected: bool
) -> None:
    assert could_render(mode, ports, proxy_name) is expected


def condition(plan: Plan) -> tuple[str, str]:
    found = plan.provisioned
    assert found is not None
    return found.reason, found.message


def two_attachments(*extra: Step) -> World:
    """Two WholeIP attachments to one VM endpoint, each with its minted claim Bound, neither rendered."""
    older = make_attachment("a-old", uid="uid-a", method="WholeIP", created="2024-01-01T00:00:00Z")
    newer = make_attachment("b-new", uid="uid-b", method="WholeIP", created="2024-01-02T00:00:00Z")
    return world_of(
        put("attachment", older),
        put("attachment", newer),
        put("claim", make_claim("a-old-1", owner=older, addresses=("203.0.113.1",))),
        put("claim", make_claim("b-new-1", owner=newer, addresses=("203.0.113.2",))),
        put("service", make_service(selector=VM, ports=[{"port": 22}])),
        put("helmrelease", make_helmrelease()),
        put("class", make_class()),
        *extra,
        settings=RenderSettings(proxy_name="cozy-proxy"),
    )


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param([], id="VM stopped: no pod"),
        pytest.param([put("pod", pod("vm", VM, "Pending"))], id="VM starting: pod not ready"),
        pytest.param(
            [
                put("pod", pod("vm", VM)),
                put("slice", make_endpointslice(backends=[("uid-vm", "10.0.0.1", True)])),
            ],
            id="VM running",
        ),
    ],
)
def test_from_the_caches_the_younger_of_two_unrendered_attachments_loses(extra: list[Step]) -> None:
    world = two_attachments(*extra)
    verdicts = {}
    for name in ("a-old", "b-new"):
        observed = world.observe((NS, name))
        assert observed is not None
        verdicts[name] = condition(reconcile(observed))
    assert verdicts["a-old"][0] == REASON_WAITING_FOR_ADDRESS, "the older renders"
    assert verdicts["b-new"] == (
        REASON_BACKEND_ALREADY_DELEGATED,
        "a backend pod is published by EndpointAttachment tenant-a/a-old (an older attachment); "
        "cozy-proxy serves one Service per pod",
    )


def test_from_the_caches_a_chart_s_cozy_proxy_service_beats_every_attachment() -> None:
    chart = make_service(
        "vm1-chart", selector=VM, labels={"service.kubernetes.io/service-proxy-name": "cozy-proxy"}
    )
    world = two_attachments(put("service", chart))
    for name in ("a-old", "b-new"):
        observed = world.observe((NS, name))
        assert observed is not None
        reason, message = condition(reconcile(observed))
        assert reason == REASON_BACKEND_ALREADY_DELEGATED
        assert "Service tenant-a/vm1-chart" in message


def test_from_the_caches_an_older_attachment_that_cannot_resolve_takes_no_pod() -> None:
    """A typo in an older attachment's applicationRef (it never renders) does not keep the VM dark."""
    typo = make_attachment(
        "a-typo", uid="uid-t", app_name="dbb", method="WholeIP", created="2023-01-01T00:00:00Z"
    )
    world = two_attachments(put("attachment", typo))
    observed = world.observe((NS, "a-old"))
    assert observed is not None
    assert condition(reconcile(observed))[0] == REASON_WAITING_FOR_ADDRESS
