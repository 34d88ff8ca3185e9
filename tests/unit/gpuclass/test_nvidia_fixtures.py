"""The NVIDIA DRA fixtures (tests/fixtures/nvidia-dra) keep the shape NVIDIA's driver gives them.

Each rule is one the driver's source or Kubernetes v1.37's ResourceSlice validation states (see the
fixtures' README): the split layout of DynamicMIG (a counters-only slice, then a devices-only slice
per GPU), one counter set per GPU that the full GPU consumes whole and each MIG placement consumes
a part of, the placements of each H100 80GB profile, and passthrough's gpu/vfio siblings sharing a
PCI bus ID and no counter; and the chart's DeviceClasses select exactly the devices of their type.
"""

from __future__ import annotations

import re
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from operators.gpuclass.device_selectors import Selector, device_variable

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia-dra"
DRIVER = "gpu.nvidia.com"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
SLICE_FILES = sorted(p.name for p in FIXTURES.glob("slices-*.yaml"))
MIG_FILE = "slices-dynamic-mig-h100-80gb.yaml"
PASSTHROUGH_FILE = "slices-passthrough-h100-80gb.yaml"
PREPARED_FILE = "slices-passthrough-h100-80gb-vfio-0-prepared.yaml"
# gpu-<minor>-mig-<profile, dots dropped, other characters outside [a-z0-9-] as "-">-<NVML profile id>-<start>
MIG_NAME = re.compile(r"^gpu-(\d+)-mig-(.+)-(\d+)-(\d+)$")
# H100 80GB HBM3: every placement NVML gives for each profile (nvidia-smi mig -lgipp)
H100_PLACEMENTS = {
    "1g.10gb": [0, 1, 2, 3, 4, 5, 6],
    "1g.10gb+me": [0, 1, 2, 3, 4, 5, 6],
    "1g.20gb": [0, 2, 4, 6],
    "2g.20gb": [0, 2, 4],
    "3g.40gb": [0, 4],
    "4g.40gb": [0],
    "7g.80gb": [0],
}


def load(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((FIXTURES / name).read_text()) if doc]


def devices(slices: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for item in slices:
        yield from item["spec"].get("devices") or []


def attr(device: Mapping[str, Any], name: str) -> Any:
    (value,) = device["attributes"][name].values()
    return value


def counter_sets(slices: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    return {
        cs["name"]: {k: v["value"] for k, v in cs["counters"].items()}
        for item in slices
        for cs in item["spec"].get("sharedCounters") or []
    }


def counter_name(capacity: str) -> str:
    """The driver's counter for a capacity: camelCase as a DNS label (copyEngines: copy-engines)."""
    return re.sub(r"([a-z0-9])([A-Z])", r"\1-\2", capacity).lower()


def consumed(device: Mapping[str, Any]) -> dict[str, str]:
    (consumption,) = device["consumesCounters"]
    return {k: v["value"] for k, v in consumption["counters"].items()}


@pytest.mark.parametrize("name", SLICE_FILES)
def test_every_slice_keeps_the_v1_37_rules(name: str) -> None:
    slices = load(name)
    pools = {item["spec"]["pool"]["name"] for item in slices}
    assert len(pools) == 1
    for item in slices:
        spec = item["spec"]
        assert (item["apiVersion"], item["kind"], spec["driver"]) == (
            "resource.k8s.io/v1",
            "ResourceSlice",
            DRIVER,
        )
        # a node-local pool: every slice, the counters-only one too, names the node (exactly one selection)
        assert spec["nodeName"] == spec["pool"]["name"]
        assert spec["pool"]["resourceSliceCount"] == len(slices)
        assert ("devices" in spec) != ("sharedCounters" in spec)  # only one of them in a slice (1.35+)
        assert len(spec.get("sharedCounters") or []) <= 8
        assert all(len(cs["counters"]) <= 32 for cs in spec.get("sharedCounters") or [])
        device_list = spec.get("devices") or []
        assert len(device_list) <= (64 if any("consumesCounters" in d for d in device_list) else 128)
        for device in device_list:
            assert len(device["attributes"]) + len(device.get("capacity", {})) <= 32
            assert len(device.get("consumesCounters", [])) <= 2
    names = [d["name"] for d in devices(slices)]
    assert len(names) == len(set(names))


def test_dynamic_mig_lays_out_a_counters_slice_then_one_slice_per_gpu() -> None:
    slices = load(MIG_FILE)
    assert "sharedCounters" in slices[0]["spec"]
    sets = counter_sets(slices)
    assert sorted(sets) == ["gpu-0-counter-set", "gpu-1-counter-set"]
    for minor, item in enumerate(slices[1:]):
        names = [d["name"] for d in item["spec"]["devices"]]
        assert names[0] == f"gpu-{minor}"
        assert names == sorted(names)
        assert all(n == f"gpu-{minor}" or n.startswith(f"gpu-{minor}-mig-") for n in names)
    for counters in sets.values():
        memory_slices = sorted(k for k in counters if k.startswith("memory-slice-"))
        assert memory_slices == [f"memory-slice-{i}" for i in range(8)]
        assert {counters[k] for k in memory_slices} == {"1"}


def test_the_full_gpu_consumes_its_whole_counter_set() -> None:
    slices = load(MIG_FILE)
    sets = counter_sets(slices)
    for device in devices(slices):
        if attr(device, "type") == "gpu":
            assert device["consumesCounters"][0]["counterSet"] == f"{device['name']}-counter-set"
            assert consumed(device) == sets[f"{device['name']}-counter-set"]


def test_each_mig_placement_consumes_its_memory_slices_from_its_parents_set() -> None:
    slices = load(MIG_FILE)
    sets = counter_sets(slices)
    parents = {attr(d, "uuid"): d["name"] for d in devices(slices) if attr(d, "type") == "gpu"}
    placements: dict[tuple[str, str], list[int]] = {}
    for device in devices(slices):
        if attr(device, "type") != "mig":
            continue
        match = MIG_NAME.match(device["name"])
        assert match is not None
        minor, _, _, start = match.groups()
        assert parents[attr(device, "parentUUID")] == f"gpu-{minor}"
        assert device["consumesCounters"][0]["counterSet"] == f"gpu-{minor}-counter-set"
        counters = consumed(device)
        assert set(counters) <= set(sets[f"gpu-{minor}-counter-set"])
        slice_numbers = sorted(int(k.rsplit("-", 1)[1]) for k in counters if k.startswith("memory-slice-"))
        assert slice_numbers == list(range(int(start), int(start) + len(slice_numbers)))
        # the placement's capacity is what it consumes, under the counter's DNS-label name
        capacity = {counter_name(k): v["value"] for k, v in device["capacity"].items()}
        assert {k: v for k, v in counters.items() if not k.startswith("memory-slice-")} == capacity
        placements.setdefault((minor, attr(device, "profile")), []).append(int(start))
    for minor in ("0", "1"):
        assert {p: sorted(s) for (m, p), s in placements.items() if m == minor} == H100_PLACEMENTS


def test_passthrough_publishes_each_gpu_twice_without_counters() -> None:
    slices = load(PASSTHROUGH_FILE)
    assert not counter_sets(slices)
    by_bus: dict[str, Counter[str]] = {}
    for device in devices(slices):
        assert "consumesCounters" not in device
        by_bus.setdefault(attr(device, PCI_BUS_ID), Counter())[attr(device, "type")] += 1
        if attr(device, "type") == "vfio":
            assert device["name"].startswith("gpu-vfio-")
            # the driver's vfio uuid: SHA-1 (v5) of the PCI bus ID in the DNS namespace
            assert attr(device, "uuid") == str(uuid.uuid5(uuid.NAMESPACE_DNS, attr(device, PCI_BUS_ID)))
    assert list(by_bus.values()) == [Counter(gpu=1, vfio=1)] * 2


def test_a_prepared_vfio_device_hides_its_gpu_sibling() -> None:
    before, after = load(PASSTHROUGH_FILE), load(PREPARED_FILE)
    assert before[0]["metadata"]["name"] == after[0]["metadata"]["name"]
    names = {d["name"]: attr(d, PCI_BUS_ID) for d in devices(after)}
    assert sorted(names) == ["gpu-1", "gpu-vfio-0", "gpu-vfio-1"]
    gone = {d["name"] for d in devices(before)} - set(names)
    assert gone == {"gpu-0"}
    gpu0 = next(d for d in devices(before) if d["name"] == "gpu-0")
    assert attr(gpu0, PCI_BUS_ID) == names["gpu-vfio-0"]


def cel_device(device: Mapping[str, Any]) -> dict[str, Any]:
    """The ``device`` a selector sees (attribute values only; this driver's names are unqualified)."""
    domains: dict[str, dict[str, object]] = {}
    for name, value in device["attributes"].items():
        domain, _, short = name.rpartition("/")
        (domains.setdefault(domain or DRIVER, {})[short],) = value.values()
    return device_variable(DRIVER, domains, {})


def test_the_chart_device_classes_select_exactly_their_type() -> None:
    classes = {c["metadata"]["name"]: c for c in load("deviceclasses.yaml")}
    expected = {"gpu.nvidia.com": "gpu", "mig.nvidia.com": "mig", "vfio.gpu.nvidia.com": "vfio"}
    everything = [d for name in SLICE_FILES for d in devices(load(name))]
    for class_name, device_type in expected.items():
        expressions = [s["cel"]["expression"] for s in classes[class_name]["spec"]["selectors"]]
        selector = Selector.compile(expressions)
        assert not selector.error
        selected = [d for d in everything if selector.selects(cel_device(d))]
        assert selected
        assert all(attr(d, "type") == device_type for d in selected)
        assert len(selected) == sum(attr(d, "type") == device_type for d in everything)
    assert classes["gpu.nvidia.com"]["spec"]["extendedResourceName"] == "nvidia.com/gpu"
