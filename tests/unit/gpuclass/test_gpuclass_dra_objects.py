"""What the allocator reads of DRA objects (``operators.gpuclass.dra_objects``), one rule a row; the
rules are the allocator's and kube-scheduler's (``foreachAllocatedDevice``, ``fillEmptyRequest``,
``taintPreventsAllocation``), the figures worked out by hand."""

from __future__ import annotations

from typing import Any

import pytest

from operators.gpuclass.dra_objects import PLAIN, DeviceFacts, TaintRule, device_facts, holding, taint_rule

DRIVER = "gpu.example.com"


def result(device: str, **more: Any) -> dict[str, Any]:
    return {"request": "gpu", "driver": DRIVER, "pool": "p", "device": device, **more}


def claim(*results: dict[str, Any]) -> dict[str, Any]:
    return {"status": {"allocation": {"devices": {"results": list(results)}}}}


@pytest.mark.parametrize(
    ("obj", "dedicated", "shared"),
    [
        (claim(result("a"), result("b")), {"a", "b"}, set()),
        # a monitoring agent's admin access holds nothing
        (claim(result("a", adminAccess=True), result("b")), {"b"}, set()),
        # a share of a shareable device: held, with the capacity it consumed
        (claim(result("s", shareID="u-1", consumedCapacity={"memory": "20Gi"})), set(), {"s"}),
        ({"status": {}}, set(), set()),
        ({}, set(), set()),
    ],
)
def test_a_claim_holds_its_results_but_admin_access(
    obj: dict[str, Any], dedicated: set[str], shared: set[str]
) -> None:
    held = holding(obj)
    assert {d for _, _, d in held.dedicated} == dedicated
    assert {d for (_, _, d), _ in held.shares} == shared


def test_a_share_takes_the_capacity_it_consumed() -> None:
    (share,) = holding(claim(result("s", shareID="u-1", consumedCapacity={"memory": "20Gi"}))).shares
    assert share == ((DRIVER, "p", "s"), (("memory", 20 * 2**30),))


@pytest.mark.parametrize(
    ("device", "shares_free", "shares_after_one"),
    [
        # the default is what a claim that asks no capacity takes: 80 / 20
        ({"capacity": {"memory": {"value": "80Gi", "requestPolicy": {"default": "20Gi"}}}}, 4, 3),
        # no request policy: a share takes all of the capacity
        ({"capacity": {"memory": {"value": "80Gi"}}}, 1, 0),
        # the fewest over the capacities
        (
            {
                "capacity": {
                    "memory": {"value": "80Gi", "requestPolicy": {"default": "20Gi"}},
                    "cores": {"value": "6", "requestPolicy": {"default": "3"}},
                }
            },
            2,
            1,
        ),
        # shares that take nothing of any capacity: one unit
        ({"capacity": {"memory": {"value": "80Gi", "requestPolicy": {"default": "0"}}}}, 1, 1),
        ({}, 1, 1),
    ],
)
def test_a_shareable_device_has_as_many_shares_as_its_capacity_allows(
    device: dict[str, Any], shares_free: int, shares_after_one: int
) -> None:
    facts = device_facts({"name": "s", "allowMultipleAllocations": True, **device}, DRIVER)
    assert facts.shared
    assert facts.shares({}) == shares_free
    taken = {name: per_share for name, _, per_share in facts.capacity}
    assert facts.shares(taken) == shares_after_one


@pytest.mark.parametrize(
    ("effect", "tainted"),
    [("NoSchedule", True), ("NoExecute", True), ("None", False), ("PreferNoSchedule", False)],
)
def test_a_device_taint_keeps_claims_off_with_a_blocking_effect(effect: str, tainted: bool) -> None:
    facts = device_facts({"name": "d", "taints": [{"key": "k", "effect": effect}]}, DRIVER)
    assert facts.tainted is tainted


def test_a_plain_device_is_the_one_shared_view_and_a_pci_address_names_its_gpu() -> None:
    assert device_facts({"name": "d", "attributes": {"type": {"string": "gpu"}}}, DRIVER) is PLAIN
    attributes = {"resource.kubernetes.io/pciBusID": {"string": "0000:17:00.0"}}
    assert device_facts({"name": "d", "attributes": attributes}, DRIVER) == DeviceFacts(
        physical="0000:17:00.0"
    )
    own = {f"{DRIVER}/pciBusID": {"string": "0000:65:00.0"}}
    assert device_facts({"name": "d", "attributes": own}, DRIVER).physical == "0000:65:00.0"


@pytest.mark.parametrize(
    ("spec", "rule"),
    [
        (
            {
                "deviceSelector": {"driver": DRIVER, "device": "gpu-1"},
                "taint": {"key": "k", "effect": "NoSchedule"},
            },
            TaintRule(DRIVER, None, "gpu-1"),
        ),
        # the empty selector matches every device
        ({"deviceSelector": {}, "taint": {"key": "k", "effect": "NoExecute"}}, TaintRule(None, None, None)),
        # without a selector no device is matched; a None taint keeps no claim off
        ({"taint": {"key": "k", "effect": "NoSchedule"}}, None),
        ({"deviceSelector": {}, "taint": {"key": "k", "effect": "None"}}, None),
    ],
)
def test_a_device_taint_rule(spec: dict[str, Any], rule: TaintRule | None) -> None:
    assert taint_rule({"metadata": {"name": "r"}, "spec": spec}) == rule


def test_a_taint_rule_matches_by_every_field_it_sets() -> None:
    rule = TaintRule(DRIVER, "p", None)
    assert rule.matches((DRIVER, "p", "gpu-0"))
    assert not rule.matches((DRIVER, "q", "gpu-0"))
    assert not rule.matches(("other.example.com", "p", "gpu-0"))
