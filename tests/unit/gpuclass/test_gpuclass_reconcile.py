"""One pass decides every class: the design's reference fixture, the rules one by one, and properties."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.manifests import load
from operators.gpuclass import reasons
from operators.gpuclass.inventory import Inventory, pod_key
from operators.gpuclass.kubevirt import Found, KubeVirtView, NotInstalled, Unreadable
from operators.gpuclass.reconcile import (
    DEFAULT_VM_SIZES,
    MAX_VM_SIZES,
    ClassDecision,
    ClassStatus,
    Event,
    Fit,
    decide,
    fits_summary,
    owners,
    transition_events,
    vm_sizes,
)
from operators.gpuclass.scheduling import NodeVerdict, parse_tolerations, verdict
from operators.gpuclass.vmshape import MAX_VM_SHAPES
from shared.conditions import FALSE, TRUE, UNKNOWN, Condition
from tests.gpuclass_builders import (
    A10_24Q,
    DAY1,
    DAY2,
    GPU_TOLERATION,
    H200,
    L40S,
    class_lists,
    gpu_pod,
    make_class,
    make_kubevirt_cr,
    make_node,
    nodes,
    pods,
    reference_classes,
    reference_kubevirt_cr,
    reference_nodes,
    reference_pods,
    taint,
)

PERMITS_ALL = Found(make_kubevirt_cr(unrestricted=True))


def _inventory(node_list: Iterable[dict[str, Any]], pod_list: Iterable[dict[str, Any]] = ()) -> Inventory:
    inventory = Inventory()
    for node in node_list:
        inventory.upsert_node(node)
    for pod in pod_list:
        inventory.upsert_pod(pod)
    return inventory


def _reference(
    classes: Sequence[dict[str, Any]] | None = None, kubevirt: KubeVirtView | None = None
) -> dict[str, ClassDecision]:
    return decide(
        reference_classes() if classes is None else classes,
        _inventory(reference_nodes(), reference_pods()),
        Found(reference_kubevirt_cr()) if kubevirt is None else kubevirt,
    )


def _summary(decision: ClassDecision) -> tuple[int, int, str, str, str, str]:
    status = decision.status
    conflict, permitted, ready = (status.condition(t) for t in _TYPES)
    return (
        status.free_units,
        status.max_free_units_per_node,
        conflict.status,
        f"{permitted.status}/{permitted.reason}",
        f"{ready.status}/{ready.reason}",
        decision.name,
    )


_TYPES = (
    reasons.CONDITION_RESOURCE_NAME_CONFLICT,
    reasons.CONDITION_KUBEVIRT_PERMITTED,
    reasons.CONDITION_READY,
)


# --- the design's reference fixture ------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "free", "max_free", "conflict", "permitted", "ready"),
    [
        ("h200", 4, 2, FALSE, "True/Permitted", "True/Ready"),
        ("h200-premium", 0, 0, TRUE, "True/Permitted", "False/ResourceNameConflict"),
        ("l40s", 1, 1, FALSE, "True/Permitted", "True/Ready"),
        ("a10-24q", 0, 0, FALSE, "False/NotPermitted", "False/NotPermitted"),
        ("rtx4090", 0, 0, FALSE, "False/NotPermitted", "False/NotPermitted"),
    ],
)
def test_reference_fixture(
    name: str, free: int, max_free: int, conflict: str, permitted: str, ready: str
) -> None:
    assert _summary(_reference()[name]) == (free, max_free, conflict, permitted, ready, name)


def test_reference_conflict_names_the_owner() -> None:
    message = _reference()["h200-premium"].status.condition(reasons.CONDITION_RESOURCE_NAME_CONFLICT).message
    assert "h200" in message
    assert _reference()["h200-premium"].status.condition(reasons.CONDITION_RESOURCE_NAME_CONFLICT).reason == (
        reasons.REASON_RESOURCE_NAME_IN_USE
    )


def test_reference_delete_h200_hands_the_name_to_h200_premium() -> None:
    classes = [c for c in reference_classes() if c["metadata"]["name"] != "h200"]
    decision = _reference(classes)["h200-premium"]
    # it tolerates nothing, so only n5 (PreferNoSchedule) counts: 4 - 2 = 2
    assert _summary(decision) == (2, 2, FALSE, "True/Permitted", "True/Ready", "h200-premium")
    assert decision.figures.allocatable == 32


def test_reference_terminating_h200_already_hands_over() -> None:
    classes = [
        make_class("h200", H200, tolerations=[GPU_TOLERATION], created=DAY1, deleting=True),
        *reference_classes()[1:],
    ]
    decisions = _reference(classes)
    assert "h200" not in decisions  # terminating: no decision, no status write
    assert decisions["h200-premium"].status.free_units == 2


def test_reference_without_kubevirt_keeps_free_units() -> None:
    with_kubevirt = _reference()
    without = _reference(kubevirt=NotInstalled())
    for name, decision in without.items():
        permitted = decision.status.condition(reasons.CONDITION_KUBEVIRT_PERMITTED)
        assert (permitted.status, permitted.reason) == (FALSE, reasons.REASON_KUBEVIRT_NOT_INSTALLED)
        assert decision.status.free_units == with_kubevirt[name].status.free_units
        assert decision.status.max_free_units_per_node == with_kubevirt[name].status.max_free_units_per_node
        assert decision.figures == with_kubevirt[name].figures
    assert (
        without["h200"].status.condition(reasons.CONDITION_READY).reason
        == reasons.REASON_KUBEVIRT_NOT_INSTALLED
    )


def test_reference_figures() -> None:
    decisions = _reference()
    h200, premium, l40s = (
        decisions["h200"].figures,
        decisions["h200-premium"].figures,
        decisions["l40s"].figures,
    )
    # allocatable counts every node advertising H (n1..n5), for the owner only
    assert (h200.allocatable, premium.allocatable) == (32, None)
    # requested: n1 2+1+3, n2 2, n5 2; finished, unscheduled and missing-node pods are not counted
    assert (h200.requested, premium.requested) == (10, 10)
    assert (h200.free, premium.free) == (4, 0)
    assert h200.nodes == {
        NodeVerdict.ELIGIBLE: 2,  # n1, n5
        NodeVerdict.NOT_READY: 1,  # n3
        NodeVerdict.CORDONED: 1,  # n2
        NodeVerdict.UNTOLERATED_TAINT: 1,  # n4
    }
    assert premium.nodes[NodeVerdict.ELIGIBLE] == 1  # n5
    assert premium.nodes[NodeVerdict.UNTOLERATED_TAINT] == 2  # n1, n4
    assert (l40s.allocatable, l40s.requested, l40s.free) == (2, 2, 1)
    assert l40s.nodes[NodeVerdict.ELIGIBLE] == 2
    assert decisions["a10-24q"].figures.nodes == dict.fromkeys(NodeVerdict, 0)


def test_status_never_carries_inventory() -> None:
    for decision in _reference().values():
        assert set(decision.status.fields()) == {"freeUnits", "maxFreeUnitsPerNode", "fits", "fitsSummary"}
        assert all(set(fit) == {"units", "vms"} for fit in decision.status.fields()["fits"])
        for condition in decision.status.conditions:
            assert not any(node in condition.message for node in ("n1", "n2", "n5", "n6"))


def test_every_condition_is_set_on_the_first_pass() -> None:
    for decision in _reference(kubevirt=Unreadable()).values():
        assert tuple(c.type for c in decision.status.conditions) == _TYPES


# --- the rules, one invariant each -------------------------------------------------------------


@pytest.mark.parametrize(
    ("classes", "expected"),
    [
        # older wins
        ([make_class("b", H200, created=DAY1), make_class("a", H200, created=DAY2)], {H200: "b"}),
        # same creation second: name breaks the tie
        ([make_class("b", H200, created=DAY1), make_class("a", H200, created=DAY1)], {H200: "a"}),
        # terminating classes own nothing
        (
            [make_class("a", H200, created=DAY1, deleting=True), make_class("b", H200, created=DAY2)],
            {H200: "b"},
        ),
        # a class without a creation time never steals a name
        ([make_class("a", H200, created=None), make_class("b", H200, created=DAY2)], {H200: "b"}),
        # different names, different owners
        ([make_class("a", H200), make_class("b", L40S)], {H200: "a", L40S: "b"}),
    ],
)
def test_ownership(classes: list[dict[str, Any]], expected: dict[str, str]) -> None:
    assert owners(classes) == expected


def test_classes_without_a_resource_name_are_skipped() -> None:
    broken = make_class("broken", H200)
    del broken["spec"]["resourceName"]
    assert decide([broken], Inventory(), PERMITS_ALL) == {}


H_NODE = make_node("n1", allocatable={H200: "2"})


@pytest.mark.parametrize(
    ("node_list", "kubevirt", "ready", "permitted"),
    [
        ([H_NODE], PERMITS_ALL, "True/Ready", "True/Unrestricted"),
        ([H_NODE], Found(make_kubevirt_cr(pci=[H200])), "True/Ready", "True/Permitted"),
        ([H_NODE], Found(make_kubevirt_cr(pci=[L40S])), "False/NotPermitted", "False/NotPermitted"),
        ([H_NODE], NotInstalled(), "False/KubeVirtNotInstalled", "False/KubeVirtNotInstalled"),
        ([H_NODE], Unreadable(), "Unknown/KubeVirtUnreadable", "Unknown/KubeVirtUnreadable"),
        # no eligible node outranks an unreadable permission: it is False whatever KubeVirt says
        ([], Unreadable(), "False/NoEligibleNodes", "Unknown/KubeVirtUnreadable"),
        ([], PERMITS_ALL, "False/NoEligibleNodes", "True/Unrestricted"),
        (
            [make_node("n1", allocatable={H200: "0"})],
            PERMITS_ALL,
            "False/NoEligibleNodes",
            "True/Unrestricted",
        ),
        (
            [make_node("n1", ready="False", allocatable={H200: "2"})],
            PERMITS_ALL,
            "False/NoEligibleNodes",
            "True/Unrestricted",
        ),
        (
            [make_node("n1", unschedulable=True, allocatable={H200: "2"})],
            PERMITS_ALL,
            "False/NoEligibleNodes",
            "True/Unrestricted",
        ),
    ],
)
def test_ready_and_permitted(
    node_list: list[dict[str, Any]], kubevirt: KubeVirtView, ready: str, permitted: str
) -> None:
    status = decide([make_class("c", H200)], _inventory(node_list), kubevirt)["c"].status
    assert _cs(status.condition(reasons.CONDITION_READY)) == ready
    assert _cs(status.condition(reasons.CONDITION_KUBEVIRT_PERMITTED)) == permitted


def _cs(condition: Condition) -> str:
    return f"{condition.status}/{condition.reason}"


def test_ready_holds_when_every_unit_is_taken() -> None:
    inventory = _inventory([H_NODE], [gpu_pod("p", H200, 2, node="n1")])
    status = decide([make_class("c", H200)], inventory, PERMITS_ALL)["c"].status
    assert (status.free_units, _cs(status.condition(reasons.CONDITION_READY))) == (0, "True/Ready")


def test_free_is_clamped_per_node() -> None:
    inventory = _inventory(
        [make_node("n1", allocatable={H200: "1"}), make_node("n2", allocatable={H200: "3"})],
        [gpu_pod("p", H200, 4, node="n1")],
    )
    status = decide([make_class("c", H200)], inventory, PERMITS_ALL)["c"].status
    assert (status.free_units, status.max_free_units_per_node) == (3, 3)


def test_observed_generation_is_the_class_generation() -> None:
    decision = decide([make_class("c", H200, generation=7)], Inventory(), PERMITS_ALL)["c"]
    assert decision.generation == 7


def test_tolerations_select_nodes_per_class() -> None:
    tainted = make_node(
        "n1", taints=[taint("nvidia.com/gpu", "NoSchedule", "present")], allocatable={H200: "2"}
    )
    inventory = _inventory([tainted, make_node("n2", allocatable={L40S: "1"})])
    classes = [make_class("tolerant", H200, tolerations=[GPU_TOLERATION]), make_class("plain", L40S)]
    decisions = decide(classes, inventory, PERMITS_ALL)
    assert decisions["tolerant"].status.free_units == 2
    plain_h = decide([make_class("plain-h", H200)], inventory, PERMITS_ALL)["plain-h"]
    assert (plain_h.status.free_units, plain_h.figures.nodes[NodeVerdict.UNTOLERATED_TAINT]) == (0, 1)


# --- fits: how many VMs of each size could start now --------------------------------------------

GPU_TAINT = taint("nvidia.com/gpu", "NoSchedule", "present")


def _free_node(name: str, free: int, *, alloc: int | None = None, **node: Any) -> list[dict[str, Any]]:
    """A node advertising H200 with ``free`` units free: allocatable ``alloc`` (default ``free``,
    or 8 when ``free`` is 0), the rest held by one running pod. Node first, then its pod."""
    total = alloc if alloc is not None else (free or 8)
    objects = [make_node(name, allocatable={H200: str(total)}, **node)]
    if total > free:
        objects.append(gpu_pod(f"{name}-vm", H200, total - free, node=name))
    return objects


def _fits(
    world: Sequence[dict[str, Any]],
    sizes: Any = None,
    *,
    tolerations: Sequence[dict[str, Any]] = (),
    kubevirt: KubeVirtView = PERMITS_ALL,
    classes: Sequence[dict[str, Any]] = (),
) -> dict[int, int]:
    inventory = _inventory(
        [o for o in world if o["kind"] == "Node"], [o for o in world if o["kind"] == "Pod"]
    )
    cls = make_class("c", H200, tolerations=tolerations, vm_sizes=sizes, created=DAY2)
    status = decide([cls, *classes], inventory, kubevirt)["c"].status
    return {fit.units: fit.vms for fit in status.fits}


@pytest.mark.parametrize(
    ("world", "sizes", "expected"),
    [
        # the example: 3 and 5 free, sizes [1, 2, 4]
        ([*_free_node("a", 3), *_free_node("b", 5)], [1, 2, 4], {1: 8, 2: 3, 4: 1}),
        # the default sizes when vmSizes is absent
        ([*_free_node("a", 3), *_free_node("b", 5)], None, {1: 8, 2: 3, 4: 1, 8: 0}),
        # a size larger than any node fits nothing, however many units are free in total
        ([*_free_node("a", 6), *_free_node("b", 6)], [7, 12], {7: 0, 12: 0}),
        # 6 free as 1+1+1+3 fit one VM of 2, not three
        ([*(n for i in range(3) for n in _free_node(f"n{i}", 1)), *_free_node("d", 3)], [2], {2: 1}),
        # nodes with every unit taken, or nothing allocatable, add nothing
        ([*_free_node("a", 0), *_free_node("b", 0, alloc=0), *_free_node("c", 4)], [1, 4], {1: 4, 4: 1}),
        # over-requested (a pod asks for more than the node has): clamped at 0, never negative
        (
            [make_node("a", allocatable={H200: "1"}), gpu_pod("p", H200, 4, node="a"), *_free_node("b", 2)],
            [1, 2],
            {1: 2, 2: 1},
        ),
        # cordoned and not-ready nodes are not eligible
        (
            [
                *_free_node("cordoned", 8, unschedulable=True),
                *_free_node("down", 8, ready="False"),
                *_free_node("up", 2),
            ],
            [1, 2, 8],
            {1: 2, 2: 1, 8: 0},
        ),
        # an untolerated taint excludes its nodes; PreferNoSchedule never does
        (
            [
                *_free_node("tainted", 8, taints=[GPU_TAINT]),
                *_free_node("soft", 4, taints=[taint("gpu-maintenance", "PreferNoSchedule")]),
            ],
            [4, 8],
            {4: 1, 8: 0},
        ),
        # the order of vmSizes does not matter: fits are ascending
        ([*_free_node("a", 8)], [8, 1, 3], {1: 8, 3: 2, 8: 1}),
        # no node at all
        ([], [1, 2], {1: 0, 2: 0}),
    ],
)
def test_fits_count_whole_vms_per_node(
    world: list[dict[str, Any]], sizes: list[int] | None, expected: dict[int, int]
) -> None:
    assert _fits(world, sizes) == expected


def test_fits_follow_the_class_tolerations() -> None:
    world = [*_free_node("tainted", 8, taints=[GPU_TAINT]), *_free_node("plain", 2)]
    assert _fits(world, [2, 8]) == {2: 1, 8: 0}
    assert _fits(world, [2, 8], tolerations=[GPU_TOLERATION]) == {2: 5, 8: 1}


@pytest.mark.parametrize(
    ("kubevirt", "older"),
    [
        (PERMITS_ALL, [make_class("older", H200, created=DAY1)]),  # ResourceNameConflict
        (Found(make_kubevirt_cr(pci=[L40S])), []),  # NotPermitted
        (NotInstalled(), []),  # KubeVirtNotInstalled
    ],
    ids=["conflict", "not-permitted", "kubevirt-not-installed"],
)
def test_a_class_that_cannot_serve_fits_no_vm(kubevirt: KubeVirtView, older: list[dict[str, Any]]) -> None:
    assert _fits(_free_node("a", 8), [1, 8], kubevirt=kubevirt, classes=older) == {1: 0, 8: 0}


def test_an_unreadable_permission_still_counts_fits_as_free_units_does() -> None:
    assert _fits(_free_node("a", 8), [1, 8], kubevirt=Unreadable()) == {1: 8, 8: 1}


def test_fits_of_the_reference_fixture() -> None:
    decisions = _reference()
    assert decisions["h200"].status.fields()["fitsSummary"] == "1:4 2:2 4:0 8:0"  # n1 and n5: 2 + 2
    assert decisions["l40s"].status.fields()["fitsSummary"] == "1:1 2:0 4:0 8:0"
    for name in ("h200-premium", "a10-24q", "rtx4090"):  # conflict, not permitted, not permitted
        assert all(fit.vms == 0 for fit in decisions[name].status.fits)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, DEFAULT_VM_SIZES),
        ([4, 1, 2], (1, 2, 4)),
        ([1, 2, 3, 4, 5, 6, 7, 8], (1, 2, 3, 4, 5, 6, 7, 8)),
        # anything the CRD refuses reads as the default
        ([], DEFAULT_VM_SIZES),
        ([1, 2, 3, 4, 5, 6, 7, 8, 9], DEFAULT_VM_SIZES),
        ([2, 2], DEFAULT_VM_SIZES),
        ([0, 1], DEFAULT_VM_SIZES),
        ([-1], DEFAULT_VM_SIZES),
        ([1.5], DEFAULT_VM_SIZES),
        (["2"], DEFAULT_VM_SIZES),
        ([True], DEFAULT_VM_SIZES),
        (4, DEFAULT_VM_SIZES),
        ({"units": 4}, DEFAULT_VM_SIZES),
    ],
)
def test_vm_sizes_read_from_the_spec(value: object, expected: tuple[int, ...]) -> None:
    assert vm_sizes(value) == expected
    decision = decide([make_class("c", A10_24Q, vm_sizes=value)], Inventory(), PERMITS_ALL)["c"]
    assert tuple(fit.units for fit in decision.status.fits) == expected


def test_the_crd_agrees_with_the_pure_core_on_vm_sizes_and_shows_fits_summary() -> None:
    (crd,) = load("config/crd/gpuclass/gpu.cozystack.io_gpuclasses.yaml")
    (version,) = crd["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]["properties"]
    sizes = schema["spec"]["properties"]["vmSizes"]
    assert (tuple(sizes["default"]), sizes["maxItems"]) == (DEFAULT_VM_SIZES, MAX_VM_SIZES)
    assert schema["status"]["properties"]["fits"]["maxItems"] == MAX_VM_SIZES + MAX_VM_SHAPES
    assert schema["spec"]["properties"]["vmShapes"]["maxItems"] == MAX_VM_SHAPES
    column = next(c for c in version["additionalPrinterColumns"] if c["name"] == "Fits")
    assert (column["jsonPath"], column["type"], column.get("priority", 0)) == (
        ".status.fitsSummary",
        "string",
        0,
    )
    # the status field the column reads is one ClassStatus.fields() writes
    assert "fitsSummary" in ClassStatus(0, 0, ()).fields()


@pytest.mark.parametrize(
    ("fits", "text"),
    [
        ((Fit(1, 12), Fit(2, 5), Fit(4, 2), Fit(8, 0)), "1:12 2:5 4:2 8:0"),
        ((Fit(3, 1),), "3:1"),
        ((), ""),
    ],
)
def test_fits_summary_is_the_column_text(fits: tuple[Fit, ...], text: str) -> None:
    assert fits_summary(fits) == text


# --- events ------------------------------------------------------------------------------------


def _status(
    conflict: str = FALSE, permitted: tuple[str, str] = (TRUE, "Permitted"), free: int = 1
) -> ClassStatus:
    return ClassStatus(
        free_units=free,
        max_free_units_per_node=free,
        conditions=(
            Condition(reasons.CONDITION_RESOURCE_NAME_CONFLICT, conflict, "r", "conflict message"),
            Condition(reasons.CONDITION_KUBEVIRT_PERMITTED, permitted[0], permitted[1], "permitted message"),
            Condition(reasons.CONDITION_READY, TRUE, "Ready", ""),
        ),
    )


def _stored(status: ClassStatus) -> dict[str, Any]:
    return {
        **status.fields(),
        "conditions": [{"type": c.type, "status": c.status, "reason": c.reason} for c in status.conditions],
    }


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (_status(), _status(), []),
        # conflicts: warning on entry (also on the first pass), normal on recovery only
        (None, _status(conflict=TRUE, free=0), [("Warning", "ResourceNameConflict")]),
        (_status(), _status(conflict=TRUE, free=0), [("Warning", "ResourceNameConflict")]),
        (
            _status(conflict=TRUE, free=0),
            _status(),
            [("Normal", "ResourceNameOwned"), ("Normal", "CapacityAvailable")],
        ),
        (None, _status(), []),
        # permission
        (_status(), _status(permitted=(FALSE, "NotPermitted")), [("Warning", "NotPermitted")]),
        (None, _status(permitted=(FALSE, "NotPermitted")), [("Warning", "NotPermitted")]),
        (
            _status(permitted=(FALSE, "NotPermitted")),
            _status(permitted=(FALSE, "KubeVirtNotInstalled")),
            [("Warning", "KubeVirtNotInstalled")],
        ),
        (_status(), _status(permitted=(UNKNOWN, "KubeVirtUnreadable")), [("Warning", "KubeVirtUnreadable")]),
        (_status(permitted=(FALSE, "NotPermitted")), _status(), [("Normal", "Permitted")]),
        (_status(permitted=(UNKNOWN, "KubeVirtUnreadable")), _status(), [("Normal", "Permitted")]),
        (_status(permitted=(TRUE, "Unrestricted")), _status(), []),
        # capacity
        (_status(free=3), _status(free=0), [("Warning", "Exhausted")]),
        (_status(free=0), _status(free=2), [("Normal", "CapacityAvailable")]),
        (_status(free=3), _status(free=1), []),
        (None, _status(free=0), []),
    ],
)
def test_events_fire_on_transitions_only(
    old: ClassStatus | None, new: ClassStatus, expected: list[tuple[str, str]]
) -> None:
    events = transition_events(None if old is None else _stored(old), new)
    assert [(e.type, e.reason) for e in events] == expected
    assert all(isinstance(e, Event) and e.message for e in events)


def test_a_steady_pass_sends_no_event() -> None:
    for decision in _reference().values():
        assert transition_events(_stored(decision.status), decision.status) == ()


# --- properties --------------------------------------------------------------------------------

_KUBEVIRT_VIEWS = st.sampled_from([PERMITS_ALL, Found(reference_kubevirt_cr()), NotInstalled(), Unreadable()])


@given(st.lists(nodes(), max_size=6), st.lists(pods(), max_size=10), class_lists(), _KUBEVIRT_VIEWS)
def test_free_units_are_never_negative_and_bounded(
    node_list: list[dict[str, Any]],
    pod_list: list[dict[str, Any]],
    classes: list[dict[str, Any]],
    kubevirt: KubeVirtView,
) -> None:
    for decision in decide(classes, _inventory(node_list, pod_list), kubevirt).values():
        status = decision.status
        assert 0 <= status.max_free_units_per_node <= status.free_units
        assert decision.figures.free == status.free_units
        if status.condition(reasons.CONDITION_RESOURCE_NAME_CONFLICT).status == TRUE:
            assert status.free_units == 0
        if status.condition(reasons.CONDITION_READY).status == TRUE:
            assert decision.figures.nodes[NodeVerdict.ELIGIBLE] >= 1
        assert all(count >= 0 for count in decision.figures.nodes.values())
        units = [fit.units for fit in status.fits]
        assert units == sorted(set(units))
        assert 1 <= len(units) <= MAX_VM_SIZES
        for fit in status.fits:  # a VM's units come from one node: bounded by the largest block
            assert 0 <= fit.vms <= status.free_units // fit.units
            assert fit.vms == 0 or fit.units <= status.max_free_units_per_node


@given(st.lists(nodes(), max_size=6), st.lists(pods(), max_size=10), class_lists(), _KUBEVIRT_VIEWS)
def test_fits_agree_with_a_count_node_by_node(
    node_list: list[dict[str, Any]],
    pod_list: list[dict[str, Any]],
    classes: list[dict[str, Any]],
    kubevirt: KubeVirtView,
) -> None:
    inventory = _inventory(node_list, pod_list)
    for decision in decide(classes, inventory, kubevirt).values():
        cls = next(c for c in classes if c["metadata"]["name"] == decision.name)
        tolerations = parse_tolerations(cls["spec"].get("tolerations"))
        resource = decision.figures.resource
        frees = [
            max(0, node.allocatable[resource] - inventory.requested(node.name, resource))
            for node in inventory.advertisers(resource).values()
            if verdict(node.ready, node.cordoned, node.taints, tolerations) == NodeVerdict.ELIGIBLE
        ]
        status = decision.status
        serves = status.condition(reasons.CONDITION_READY).status != FALSE
        expected = {
            u: sum(f // u for f in frees) if serves else 0 for u in vm_sizes(cls["spec"].get("vmSizes"))
        }
        assert {fit.units: fit.vms for fit in status.fits} == expected


@given(
    st.lists(st.tuples(st.sampled_from(["upsert", "delete"]), nodes() | pods()), max_size=30),
    class_lists(),
    _KUBEVIRT_VIEWS,
)
def test_a_pass_is_a_function_of_the_final_objects(
    events: list[tuple[str, dict[str, Any]]], classes: list[dict[str, Any]], kubevirt: KubeVirtView
) -> None:
    incremental = Inventory()
    final: dict[str, dict[str, Any]] = {}
    for op, obj in events:
        is_node = obj["kind"] == "Node"
        key = f"node/{obj['metadata']['name']}" if is_node else pod_key(obj)
        if op == "upsert":
            final[key] = obj
            incremental.upsert_node(obj) if is_node else incremental.upsert_pod(obj)
        else:
            final.pop(key, None)
            incremental.delete_node(obj["metadata"]["name"]) if is_node else incremental.delete_pod(key)
    from_scratch = _inventory(
        [o for o in final.values() if o["kind"] == "Node"], [o for o in final.values() if o["kind"] == "Pod"]
    )
    assert decide(classes, incremental, kubevirt) == decide(classes, from_scratch, kubevirt)


@given(class_lists(), st.randoms(use_true_random=False))
def test_class_order_does_not_change_any_decision(classes: list[dict[str, Any]], random: Any) -> None:
    inventory = _inventory(reference_nodes(), reference_pods())
    shuffled = list(classes)
    random.shuffle(shuffled)
    kubevirt = Found(reference_kubevirt_cr())
    assert decide(classes, inventory, kubevirt) == decide(shuffled, inventory, kubevirt)


@given(st.lists(nodes(), max_size=6), class_lists())
def test_node_states_agree_with_the_per_node_verdict(
    node_list: list[dict[str, Any]], classes: list[dict[str, Any]]
) -> None:
    inventory = _inventory(node_list)
    for decision in decide(classes, inventory, PERMITS_ALL).values():
        cls = next(c for c in classes if c["metadata"]["name"] == decision.name)
        tolerations = parse_tolerations(cls["spec"].get("tolerations"))
        expected = Counter(
            verdict(n.ready, n.cordoned, n.taints, tolerations)
            for n in inventory.advertisers(decision.figures.resource).values()
        )
        assert decision.figures.nodes == {state: expected[state] for state in NodeVerdict}
