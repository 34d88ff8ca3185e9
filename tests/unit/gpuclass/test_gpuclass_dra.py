"""Classes of DRA devices: selectors, the DRA inventory one event at a time, and the pass's figures."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import pytest

import operators.gpuclass.dra as dra_module
from operators.gpuclass import reasons
from operators.gpuclass.device_selectors import Selector
from operators.gpuclass.dra import DraInventory, device_variable_of, required_driver
from operators.gpuclass.dra_objects import holding
from operators.gpuclass.inventory import Inventory
from operators.gpuclass.kubevirt import Found, NotInstalled, dra_gpus_enabled
from operators.gpuclass.reconcile import DEVICE_CLASS_PREFIX, decide
from shared.conditions import FALSE, TRUE
from tests.gpuclass_builders import (
    DAY1,
    DAY2,
    GPU_DRIVER,
    GPU_TOLERATION,
    H200,
    gpu_device,
    make_claim,
    make_class,
    make_device_class,
    make_kubevirt_cr,
    make_node,
    make_slice,
    taint,
)

H200_SELECTOR = f'device.driver == "{GPU_DRIVER}" && device.attributes["{GPU_DRIVER}"].productName == "H200"'
DRA_ON = Found(make_kubevirt_cr(pci=[H200], dra=True))
DRA_OFF = Found(make_kubevirt_cr(pci=[H200]))


def device_view(**attributes: Any) -> Mapping[str, Any]:
    """What a selector sees of one device of the default driver."""
    return device_variable_of(GPU_DRIVER, gpu_device("gpu-0", **attributes))


# --- selectors: one row per rule ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "selected"),
    [
        (f'device.driver == "{GPU_DRIVER}"', True),
        ('device.driver == "other.example.com"', False),
        (f'device.attributes["{GPU_DRIVER}"].productName == "H200"', True),
        # an unqualified attribute name is in the driver's domain; a qualified one in its own
        (f'device.attributes["{GPU_DRIVER}"].migCapable == false', True),
        (f'device.attributes["{GPU_DRIVER}"].index == 0', True),
        (f'device.capacity["{GPU_DRIVER}"].memory.compareTo(quantity("80Gi")) >= 0', True),
        (f'device.capacity["{GPU_DRIVER}"].memory.isLessThan(quantity("80Gi"))', False),
        (f'device.capacity["{GPU_DRIVER}"].memory == quantity("144384Mi")', True),  # equal values
        (f'device.attributes["{GPU_DRIVER}"].driverVersion.compareTo(semver("550.0.0")) > 0', True),
        (f'device.attributes["{GPU_DRIVER}"].driverVersion.isLessThan(semver("580.65.6-rc.1"))', False),
        # a runtime error on a device (a domain it does not have) does not select it
        ('device.attributes["amd.com"].productName == "MI300X"', False),
        ('"amd.com" in device.attributes', False),
        # a type error (a version is no string) does not match either
        (f'device.attributes["{GPU_DRIVER}"].driverVersion == "580.65.6"', False),
    ],
)
def test_a_selector_sees_a_device_as_the_dra_plugin_shows_it(expression: str, selected: bool) -> None:
    assert Selector.compile([expression]).selects(device_view()) is selected


def test_every_selector_must_hold_and_none_selects_every_device() -> None:
    device = device_view()
    assert Selector.compile([]).selects(device)
    assert not Selector.compile([f'device.driver == "{GPU_DRIVER}"', "false"]).selects(device)


def test_a_selector_that_does_not_compile_selects_nothing_and_says_why() -> None:
    selector = Selector.compile(["device.driver =="])
    assert selector.error
    assert not selector.selects(device_view())


# --- the DRA inventory ---------------------------------------------------------------------------


def h200_world() -> DraInventory:
    dra = DraInventory()
    dra.upsert_class(make_device_class("h200", H200_SELECTOR))
    dra.upsert_class(make_device_class("l40s", f'device.attributes["{GPU_DRIVER}"].productName == "L40S"'))
    dra.upsert_slice(("", "n1"), make_slice("n1", "n1", [gpu_device(f"gpu-{i}") for i in range(4)]))
    mixed = [gpu_device("gpu-0"), gpu_device("gpu-1", "L40S")]
    dra.upsert_slice(("", "n2"), make_slice("n2", "n2", mixed))
    return dra


def test_a_node_offers_the_devices_of_its_slices_that_the_class_selects() -> None:
    dra = h200_world()
    assert dra.selected_on("h200") == {"n1": 4, "n2": 1}
    assert dra.selected_on("l40s") == {"n2": 1}
    assert dra.allocated_on("h200") == {}


def test_a_claims_allocation_takes_its_devices_and_two_claims_of_one_device_take_it_once() -> None:
    dra = h200_world()
    assert dra.upsert_claim(
        ("t", "a"), make_claim("a", "h200", 2, allocated=[("n1", "gpu-0"), ("n1", "gpu-1")])
    )
    assert dra.upsert_claim(("t", "b"), make_claim("b", "h200", allocated=[("n1", "gpu-1")]))
    assert dra.allocated_on("h200") == {"n1": 2}
    assert dra.delete_claim(("t", "a"))
    assert dra.allocated_on("h200") == {"n1": 1}
    assert dra.delete_claim(("t", "b"))
    assert dra.allocated_on("h200") == {}


def test_an_unallocated_claim_holds_nothing_and_changes_nothing() -> None:
    dra = h200_world()
    assert not dra.upsert_claim(("t", "a"), make_claim("a", "h200", 2))
    assert dra.tracked_claims() == 0


def test_a_claim_seen_before_its_device_counts_once_the_device_appears() -> None:
    dra = DraInventory()
    dra.upsert_class(make_device_class("h200", H200_SELECTOR))
    dra.upsert_claim(("t", "a"), make_claim("a", "h200", allocated=[("n1", "gpu-0")]))
    dra.upsert_slice(("", "n1"), make_slice("n1", "n1", [gpu_device("gpu-0"), gpu_device("gpu-1")]))
    assert (dra.selected_on("h200"), dra.allocated_on("h200")) == ({"n1": 2}, {"n1": 1})


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    dra = DraInventory()
    dra.upsert_class(make_device_class("h200", H200_SELECTOR))
    old = make_slice("n1-a", "n1", [gpu_device(f"gpu-{i}") for i in range(4)], pool="n1", generation=1)
    new = make_slice("n1-b", "n1", [gpu_device("gpu-0")], pool="n1", generation=2)
    dra.upsert_slice(("", "n1-a"), old)
    dra.upsert_slice(("", "n1-b"), new)
    assert dra.selected_on("h200") == {"n1": 1}  # the old slice is retired before it is deleted
    dra.delete_slice(("", "n1-b"))
    assert dra.selected_on("h200") == {"n1": 4}  # the old generation is the newest again
    dra.delete_slice(("", "n1-a"))
    assert dra.selected_on("h200") == {}


def test_a_slice_not_tied_to_one_node_offers_nothing() -> None:
    dra = DraInventory()
    dra.upsert_class(make_device_class("h200", H200_SELECTOR))
    dra.upsert_slice(("", "net"), make_slice("net", None, [gpu_device("gpu-0")], pool="fabric"))
    assert dra.selected_on("h200") == {}


def test_a_device_class_change_reselects_and_its_deletion_forgets() -> None:
    dra = h200_world()
    dra.upsert_claim(("t", "a"), make_claim("a", "h200", allocated=[("n2", "gpu-1")]))  # the L40S
    assert dra.allocated_on("h200") == {}
    assert dra.upsert_class(make_device_class("h200", f'device.driver == "{GPU_DRIVER}"'))
    assert dra.selected_on("h200") == {"n1": 4, "n2": 2}
    assert dra.allocated_on("h200") == {"n2": 1}
    assert not dra.upsert_class(make_device_class("h200", f'device.driver == "{GPU_DRIVER}"'))
    assert dra.delete_class("h200")
    assert dra.selected_on("h200") == {}
    assert dra.device_class("h200") is None


def test_a_slice_event_with_the_same_spec_changes_nothing() -> None:
    dra = h200_world()
    again = make_slice("n1", "n1", [gpu_device(f"gpu-{i}") for i in range(4)])
    again["metadata"]["resourceVersion"] = "99"
    assert not dra.upsert_slice(("", "n1"), again)


def test_a_slice_of_the_same_generation_is_not_compared_and_a_new_generation_is_read() -> None:
    dra = h200_world()
    four = [gpu_device(f"gpu-{i}") for i in range(4)]
    assert dra.upsert_slice(("", "n1"), make_slice("n1", "n1", four[:2], spec_generation=2))
    # The API server raises metadata.generation with every spec change: the same one is the same spec.
    assert not dra.upsert_slice(("", "n1"), make_slice("n1", "n1", four[:1], spec_generation=2))
    assert dra.selected_on("h200")["n1"] == 2
    assert dra.upsert_slice(("", "n1"), make_slice("n1", "n1", four[:1], spec_generation=3))
    assert dra.selected_on("h200")["n1"] == 1


def test_the_aggregates_do_not_depend_on_the_order_of_events() -> None:
    events: list[tuple[str, Any]] = [
        ("class", make_device_class("h200", H200_SELECTOR)),
        ("slice", make_slice("n1", "n1", [gpu_device(f"gpu-{i}") for i in range(3)])),
        (
            "slice",
            make_slice("n1-new", "n1", [gpu_device("gpu-0"), gpu_device("gpu-9")], pool="n1", generation=2),
        ),
        ("claim", make_claim("a", "h200", allocated=[("n1", "gpu-9")])),
        ("claim", make_claim("b", "h200", allocated=[("n1", "gpu-2")])),
    ]
    results = set()
    for order in itertools.permutations(events):
        dra = DraInventory()
        for kind, obj in order:
            key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
            if kind == "class":
                dra.upsert_class(obj)
            elif kind == "slice":
                dra.upsert_slice(key, obj)
            else:
                dra.upsert_claim(key, obj)
        results.add((tuple(dra.selected_on("h200").items()), tuple(dra.allocated_on("h200").items())))
    assert results == {((("n1", 2),), (("n1", 1),))}


def test_allocated_devices_reads_the_allocation_results() -> None:
    claim = make_claim("a", "h200", 2, allocated=[("n1", "gpu-0"), ("n1", "gpu-1")])
    assert holding(claim).devices == {(GPU_DRIVER, "n1", "gpu-0"), (GPU_DRIVER, "n1", "gpu-1")}
    assert holding(make_claim("b", "h200")).devices == frozenset()


# --- the pass: a DRA class beside a device-plugin class -------------------------------------------


def world() -> tuple[Inventory, DraInventory]:
    inventory = Inventory()
    for node in (
        make_node("plugin-1", allocatable={H200: "4"}),
        make_node("dra-1", taints=[taint("nvidia.com/gpu", "NoSchedule", "present")]),
        make_node("dra-2"),
        make_node("dra-3", unschedulable=True),
    ):
        inventory.upsert_node(node)
    dra = DraInventory()
    dra.upsert_class(make_device_class("h200", H200_SELECTOR, extended_resource_name=H200))
    for name, count in (("dra-1", 4), ("dra-2", 2), ("dra-3", 8)):
        dra.upsert_slice(("", name), make_slice(name, name, [gpu_device(f"gpu-{i}") for i in range(count)]))
    dra.upsert_claim(("t", "vm-a"), make_claim("vm-a", "h200", allocated=[("dra-1", "gpu-0")]))
    return inventory, dra


def test_a_dra_class_and_a_device_plugin_class_report_their_own_figures_side_by_side() -> None:
    classes = [
        make_class("h200", H200, tolerations=[GPU_TOLERATION]),
        make_class("h200-dra", "", device_class="h200", tolerations=[GPU_TOLERATION]),
    ]
    inventory, dra = world()
    decisions = decide(classes, inventory, DRA_ON, dra)
    plugin, claimed = decisions["h200"], decisions["h200-dra"]
    assert (plugin.status.free_units, plugin.status.max_free_units_per_node) == (4, 4)
    assert (claimed.status.free_units, claimed.status.max_free_units_per_node) == (5, 3)  # 3 + 2
    assert claimed.status.condition(reasons.CONDITION_READY).status == TRUE
    permitted = claimed.status.condition(reasons.CONDITION_KUBEVIRT_PERMITTED)
    assert (permitted.status, permitted.reason) == (TRUE, reasons.REASON_GPUS_WITH_DRA)
    figures = claimed.figures
    assert figures.resource == f"{DEVICE_CLASS_PREFIX}h200"
    assert (figures.allocatable, figures.requested, figures.free) == (14, 1, 5)
    assert [(f.units, f.vms) for f in claimed.status.fits] == [(1, 5), (2, 2), (4, 0), (8, 0)]


def test_a_dra_class_without_the_kubevirt_gate_is_not_permitted_and_says_so() -> None:
    classes = [make_class("h200-dra", "", device_class="h200", tolerations=[GPU_TOLERATION])]
    inventory, dra = world()
    status = decide(classes, inventory, DRA_OFF, dra)["h200-dra"].status
    permitted = status.condition(reasons.CONDITION_KUBEVIRT_PERMITTED)
    assert (permitted.status, permitted.reason) == (FALSE, reasons.REASON_NOT_PERMITTED)
    assert "GPUsWithDRA" in permitted.message
    assert status.condition(reasons.CONDITION_READY).reason == reasons.REASON_READY_NOT_PERMITTED
    assert status.free_units == 5  # figures never depend on the KubeVirt read
    not_installed = decide(classes, inventory, NotInstalled(), dra)["h200-dra"].status
    assert not_installed.condition(reasons.CONDITION_KUBEVIRT_PERMITTED).reason == (
        reasons.REASON_KUBEVIRT_NOT_INSTALLED
    )


def test_two_classes_naming_one_device_class_conflict_by_creation_order() -> None:
    classes = [
        make_class("late", "", device_class="h200", created=DAY2),
        make_class("early", "", device_class="h200", created=DAY1, tolerations=[GPU_TOLERATION]),
    ]
    inventory, dra = world()
    decisions = decide(classes, inventory, DRA_ON, dra)
    conflict = decisions["late"].status.condition(reasons.CONDITION_RESOURCE_NAME_CONFLICT)
    assert (conflict.status, conflict.reason) == (TRUE, reasons.REASON_RESOURCE_NAME_IN_USE)
    assert "early" in conflict.message
    assert decisions["late"].status.free_units == 0
    assert decisions["early"].status.free_units == 5


def test_a_class_naming_a_missing_device_class_is_not_ready() -> None:
    classes = [make_class("a100", "", device_class="a100")]
    inventory, dra = world()
    ready = decide(classes, inventory, DRA_ON, dra)["a100"].status.condition(reasons.CONDITION_READY)
    assert (ready.status, ready.reason) == (FALSE, reasons.REASON_DEVICE_CLASS_NOT_FOUND)


def test_a_class_with_both_or_neither_device_source_gets_no_decision() -> None:
    both = make_class("both", H200, device_class="h200")
    neither = make_class("neither", "")
    inventory, dra = world()
    assert decide([both, neither], inventory, DRA_ON, dra) == {}


def test_the_kubevirt_gate_must_be_listed_explicitly() -> None:
    assert dra_gpus_enabled(make_kubevirt_cr(dra=True))
    assert not dra_gpus_enabled(make_kubevirt_cr())
    assert not dra_gpus_enabled(None)


@pytest.mark.parametrize(
    ("selectors", "driver"),
    [
        ((f'device.driver == "{GPU_DRIVER}"',), GPU_DRIVER),
        ((f'device.driver == "{GPU_DRIVER}" && device.attributes["x"].y == 1', "true"), GPU_DRIVER),
        ((f'device.driver == "{GPU_DRIVER}" && false || true',), ""),  # || may select any driver's
        ((f'device.driver == "{GPU_DRIVER}" ? true : true',), ""),
        (('device.attributes["x"].y == 1',), ""),
        ((), ""),
    ],
)
def test_a_class_naming_its_driver_first_is_never_asked_about_other_drivers(
    selectors: tuple[str, ...], driver: str
) -> None:
    assert required_driver(selectors) == driver


def test_a_device_that_comes_back_keeps_its_selection_unless_a_class_changed_meanwhile() -> None:
    dra = h200_world()
    four = [gpu_device(f"gpu-{i}") for i in range(4)]
    dra.upsert_slice(("", "n1"), make_slice("n1", "n1", four[:3]))
    assert dra.selected_on("h200")["n1"] == 3
    dra.upsert_slice(("", "n1"), make_slice("n1", "n1", four))  # back, as it was
    assert dra.selected_on("h200")["n1"] == 4
    dra.upsert_slice(("", "n1"), make_slice("n1", "n1", four[:3]))
    dra.upsert_class(make_device_class("h200", 'device.attributes["gpu.nvidia.com"].index < 3'))
    dra.upsert_slice(("", "n1"), make_slice("n1", "n1", four))  # back, but judged again
    assert dra.selected_on("h200")["n1"] == 3


# --- a new version of a slice: only the devices that changed are judged again ---------------------


def judged_devices(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the devices shown to the selectors from now on."""
    judged: list[str] = []
    convert = dra_module.device_variable_of

    def spy(driver: str, device: Mapping[str, Any]) -> Mapping[str, Any]:
        judged.append(device["name"])
        return convert(driver, device)

    monkeypatch.setattr(dra_module, "device_variable_of", spy)
    return judged


def test_an_unchanged_device_keeps_its_verdict_without_being_judged(monkeypatch: pytest.MonkeyPatch) -> None:
    dra = h200_world()
    judged = judged_devices(monkeypatch)
    again = make_slice("n1", "n1", [gpu_device(f"gpu-{i}") for i in range(4)], generation=2)
    assert not dra.upsert_slice(("", "n1"), again)  # a new pool generation, the same devices
    assert judged == []
    assert dra.selected_on("h200") == {"n1": 4, "n2": 1}


def test_a_changed_device_alone_is_judged_again(monkeypatch: pytest.MonkeyPatch) -> None:
    dra = h200_world()
    judged = judged_devices(monkeypatch)
    devices = [gpu_device(f"gpu-{i}") for i in range(4)]
    devices[2] = gpu_device("gpu-2", "L40S")
    assert dra.upsert_slice(("", "n1"), make_slice("n1", "n1", devices, spec_generation=2))
    assert judged == ["gpu-2"]
    assert dra.selected_on("h200") == {"n1": 3, "n2": 1}
    assert dra.selected_on("l40s") == {"n1": 1, "n2": 1}


def test_a_removed_device_is_dropped_with_its_allocation() -> None:
    dra = h200_world()
    dra.upsert_claim(("t", "a"), make_claim("a", "h200", allocated=[("n1", "gpu-3")]))
    assert dra.allocated_on("h200") == {"n1": 1}
    assert dra.upsert_slice(("", "n1"), make_slice("n1", "n1", [gpu_device(f"gpu-{i}") for i in range(3)]))
    assert (dra.selected_on("h200"), dra.allocated_on("h200")) == ({"n1": 3, "n2": 1}, {})
    assert (GPU_DRIVER, "n1", "gpu-3") not in {device for device, _, _ in dra.devices()}


def test_a_device_moving_to_another_node_is_counted_there() -> None:
    dra = DraInventory()
    dra.upsert_class(make_device_class("h200", H200_SELECTOR))
    dra.upsert_slice(("", "a"), make_slice("a", "n1", [gpu_device("gpu-0"), gpu_device("gpu-1")], pool="p"))
    dra.upsert_slice(("", "b"), make_slice("b", "n2", [gpu_device("gpu-2")], pool="p"))
    assert dra.selected_on("h200") == {"n1": 2, "n2": 1}
    dra.upsert_slice(("", "a"), make_slice("a", "n1", [gpu_device("gpu-0")], pool="p"))
    assert dra.upsert_slice(
        ("", "b"), make_slice("b", "n2", [gpu_device("gpu-2"), gpu_device("gpu-1")], pool="p")
    )
    assert dra.selected_on("h200") == {"n1": 1, "n2": 2}
    dra.delete_slice(("", "b"))
    assert dra.upsert_slice(("", "a"), make_slice("a", "n3", [gpu_device("gpu-0")], pool="p"))  # its node
    assert dra.selected_on("h200") == {"n3": 1}


def test_entries_without_a_string_name_are_skipped_or_named_by_their_text() -> None:
    dra = DraInventory()
    dra.upsert_class(make_device_class("h200", H200_SELECTOR))
    slice_ = make_slice("n1", "n1", [])
    slice_["spec"]["devices"] = [
        gpu_device("gpu-0"),
        {"attributes": {}},
        "junk",
        {**gpu_device("gpu-1"), "name": 7},
    ]
    dra.upsert_slice(("", "n1"), slice_)
    assert {name for (_, _, name), _, _ in dra.devices()} == {"gpu-0", "7"}
    assert dra.selected_on("h200") == {"n1": 2}
