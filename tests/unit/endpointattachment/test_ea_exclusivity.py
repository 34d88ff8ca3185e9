"""Exclusivity as cozy-proxy really behaves: decided over every pod an endpoint selects (ready or
not), rivals rendered or not, the survivors a change of ours must have programmed again, and what
Ready says in the VM modes. One row per invariant."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pytest

from operators.endpointattachment.constants import (
    COND_DATAPATH_ADMITTED,
    COND_READY,
    PROGRAMMED_ANNOTATION,
    REASON_ADMITTED,
    REASON_EXCLUSIVITY_CONFLICT,
    REASON_MULTIPLE_BACKENDS,
    REASON_NO_READY_BACKEND,
    REASON_PROXY_DECLARATION_CONFLICT,
    REASON_PUBLISHED,
)
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
from operators.endpointattachment.reconcile import Observed, Plan, ServiceAction, reconcile
from operators.endpointattachment.world import World
from shared.runtime.cache import Obj
from tests.ea_builders import (
    make_attachment,
    make_class,
    make_endpoints,
    make_endpointslice,
    make_helmrelease,
    make_namespace_labels,
    make_service,
    make_serviceproxy,
)
from tests.ea_caches import put, world_of

NS = "tenant-a"
ME = AttachmentRank("2024-01-02T00:00:00Z", "me", NS, "uid-me")
OLDER = AttachmentRank("2024-01-01T00:00:00Z", "old", NS, "uid-old")
YOUNGER = AttachmentRank("2024-01-03T00:00:00Z", "young", NS, "uid-young")
VM = {"vm": "vm1"}
ADDRESS = "203.0.113.10"


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
        pytest.param([rival("chart", selector=VM)], "chart", id="chart selecting the same: wins with no pod"),
        pytest.param(
            [rival("ea-old", rank=OLDER, selector=VM)], "ea-old", id="older, not rendered, no pod: wins"
        ),
        pytest.param([rival("ea-young", rank=YOUNGER, selector=VM)], None, id="younger loses"),
        pytest.param([rival("ea-old", {"uid-vm"}, OLDER, {"app": "x"})], "ea-old", id="shared unready pod"),
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
        assert verdict.reason == REASON_EXCLUSIVITY_CONFLICT
        assert f"{NS}/{winner}" in verdict.message


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


# --- the whole pass --------------------------------------------------------------------------------


def vm(**changes: Any) -> Observed:
    base = Observed(
        attachment=make_attachment(mode="WholeIP"),
        endpoint=make_service(selector=VM, ports=[{"port": 22}]),
        helmrelease=make_helmrelease(),
        address_class=make_class(),
        held_address=ADDRESS,
        taken_addresses=frozenset({ADDRESS}),
        endpoint_slices=[make_endpointslice(backends=[("uid-vm", "10.244.0.10", True)])],
        service_proxies=[make_serviceproxy()],
        namespace_labels=make_namespace_labels(),
        pods=[pod("vm", VM)],
    )
    return dataclasses.replace(base, **changes)


def announced(plan: Plan) -> dict[str, Any]:
    assert plan.service is not None
    stored = {**plan.service, "status": {"loadBalancer": {"ingress": [{"ip": ADDRESS}]}}}
    stored["metadata"] = {**stored["metadata"], "uid": "svc-uid"}
    return stored


def cond(plan: Plan, type_: str) -> tuple[str, str, str]:
    found = next(c for c in plan.conditions if c.type == type_)
    return found.status, found.reason, found.message


PROGRAMMED = make_endpoints(backends=[("uid-vm", "10.244.0.10", True)])


def test_published_names_the_pod_that_receives_the_traffic() -> None:
    plan = reconcile(vm())
    again = reconcile(vm(service=announced(plan), rendered_endpoints=PROGRAMMED))
    status, reason, message = cond(again, COND_READY)
    assert (status, reason) == ("True", REASON_PUBLISHED)
    assert "pod pod-uid-vm (10.244.0.10)" in message


def test_published_touches_the_service_once_for_cozy_proxy() -> None:
    rendered = announced(reconcile(vm()))
    first = reconcile(vm(service=rendered, rendered_endpoints=PROGRAMMED))
    assert first.programmed == programmed_token(ADDRESS, "uid-vm")
    touched = {
        **rendered,
        "metadata": {
            **rendered["metadata"],
            "annotations": {
                **rendered["metadata"].get("annotations", {}),
                PROGRAMMED_ANNOTATION: first.programmed,
            },
        },
    }
    again = reconcile(vm(service=touched, rendered_endpoints=PROGRAMMED))
    assert again.programmed is None  # a second pass writes nothing
    assert again.service_action is ServiceAction.NONE
    moved = make_endpoints(backends=[("uid-vm-2", "10.244.0.11", True)])
    assert reconcile(vm(service=touched, rendered_endpoints=moved)).programmed == programmed_token(
        ADDRESS, "uid-vm-2"
    )


@pytest.mark.parametrize(
    ("endpoints", "reason"),
    [
        (None, REASON_NO_READY_BACKEND),  # its Endpoints not written yet: slices ran ahead
        (make_endpoints(backends=[("uid-vm", "10.244.0.10", False)]), REASON_NO_READY_BACKEND),
        (
            make_endpoints(backends=[("uid-vm", "10.244.0.10", True), ("uid-2", "10.244.0.11", True)]),
            REASON_MULTIPLE_BACKENDS,
        ),
    ],
)
def test_ready_follows_the_v1_endpoints_cozy_proxy_reads(endpoints: Obj | None, reason: str) -> None:
    plan = reconcile(vm(service=announced(reconcile(vm())), rendered_endpoints=endpoints))
    assert cond(plan, COND_READY)[:2] == ("False", reason)
    assert plan.programmed is None


def test_no_ready_backend_renders_but_is_not_ready() -> None:
    unready = [make_endpointslice(backends=[("uid-vm", "10.244.0.10", False)])]
    plan = reconcile(vm(endpoint_slices=unready))
    assert plan.service_action is ServiceAction.CREATE  # programmed the moment the pod is ready
    again = reconcile(vm(endpoint_slices=unready, service=announced(plan)))
    assert cond(again, COND_READY)[:2] == ("False", REASON_NO_READY_BACKEND)


def test_a_loser_never_renders_even_while_its_pod_is_not_ready() -> None:
    older = rival("ea-old", {"uid-vm"}, AttachmentRank("2023-01-01T00:00:00Z", "old", NS, "uid-old"), VM)
    plan = reconcile(vm(endpoint_slices=[], proxied_services=[older]))
    assert cond(plan, COND_DATAPATH_ADMITTED)[:2] == ("False", REASON_EXCLUSIVITY_CONFLICT)
    assert plan.service is None
    assert plan.service_action is ServiceAction.NONE


def test_a_proxy_declaration_conflict_freezes_a_live_service() -> None:
    rendered = announced(reconcile(vm()))
    ambiguous = [make_serviceproxy("a", proxy_name="cozy-proxy"), make_serviceproxy("b", proxy_name="other")]
    plan = reconcile(vm(service=rendered, service_proxies=ambiguous))
    assert cond(plan, COND_DATAPATH_ADMITTED)[:2] == ("False", REASON_PROXY_DECLARATION_CONFLICT)
    assert cond(plan, COND_READY)[:2] == ("False", REASON_PROXY_DECLARATION_CONFLICT)
    assert plan.service_action is ServiceAction.NONE  # neither relabelled nor deleted
    fresh = reconcile(vm(service_proxies=ambiguous))
    assert fresh.service_action is ServiceAction.NONE  # and nothing new rendered


def test_one_attachment_alone_is_admitted() -> None:
    assert cond(reconcile(vm()), COND_DATAPATH_ADMITTED)[:2] == ("True", REASON_ADMITTED)


@pytest.mark.parametrize(
    ("mode", "ports", "proxies", "expected"),
    [
        ("WholeIP", [{"port": 22, "targetPort": 2222}], [make_serviceproxy()], True),
        ("PortList", [{"port": 22}], [make_serviceproxy()], True),
        ("PortList", [{"port": 22, "targetPort": 2222}], [make_serviceproxy()], False),  # never renders
        ("PortList", [{"port": 22}], [], False),  # no proxy declared
        ("WholeIP", None, [make_serviceproxy()], False),  # no endpoint
    ],
)
def test_could_render(
    mode: str, ports: list[dict[str, Any]] | None, proxies: list[dict[str, Any]], expected: bool
) -> None:
    assert could_render(mode, ports, proxies) is expected


def two_attachments(*extra: Any) -> World:
    """Two WholeIP attachments to one VM endpoint, neither rendered, the VM's pod not ready."""
    return world_of(
        put(
            "attachment",
            make_attachment("a-old", uid="uid-a", mode="WholeIP", created="2024-01-01T00:00:00Z"),
        ),
        put(
            "attachment",
            make_attachment("b-new", uid="uid-b", mode="WholeIP", created="2024-01-02T00:00:00Z"),
        ),
        put("service", make_service(selector=VM, ports=[{"port": 22}])),
        put("helmrelease", make_helmrelease()),
        put("class", make_class()),
        put("proxy", make_serviceproxy()),
        *extra,
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
def test_from_the_caches_the_younger_of_two_unrendered_attachments_loses(extra: list[Any]) -> None:
    world = two_attachments(*extra)
    verdicts = {}
    for name in ("a-old", "b-new"):
        observed = world.observe((NS, name))
        assert observed is not None
        observed = dataclasses.replace(observed, held_address=ADDRESS)
        verdicts[name] = cond(reconcile(observed), COND_DATAPATH_ADMITTED)[:2]
    assert verdicts == {"a-old": ("True", REASON_ADMITTED), "b-new": ("False", REASON_EXCLUSIVITY_CONFLICT)}
