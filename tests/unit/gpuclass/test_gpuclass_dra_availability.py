"""What the allocator would grant, on issue 33's worlds: the pure core against figures worked out by
hand from kube-scheduler's allocator rules (``tests/gpuclass_dra_worlds.py`` says how), one row each;
the integration test asks the real kube-scheduler the same."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from operators.gpuclass.allocator import Candidate, claims_granted
from operators.gpuclass.dra import DraInventory
from operators.gpuclass.inventory import Inventory
from operators.gpuclass.kubevirt import Found
from operators.gpuclass.reconcile import decide
from tests.gpuclass_builders import make_class, make_kubevirt_cr, make_node
from tests.gpuclass_dra_worlds import (
    WORLDS,
    World,
    device_classes,
    held_claims,
    slices,
    taint_rules,
)

NODE = "rows-n1"
PERMITS = Found(make_kubevirt_cr(pci=[], dra=True))


def folded(world: World) -> tuple[Inventory, DraInventory]:
    """The world's node and DRA objects, folded as the operator folds them."""
    inventory, dra = Inventory(), DraInventory()
    inventory.upsert_node(make_node(NODE))
    for obj in device_classes():
        dra.upsert_class(obj)
    for obj in slices(world, NODE):
        dra.upsert_slice(("", obj["metadata"]["name"]), obj)
    for obj in taint_rules(world, NODE):
        dra.upsert_taint_rule(obj)
    for obj in held_claims(world, NODE):
        dra.upsert_claim(("t", obj["metadata"]["name"]), obj)
    return inventory, dra


def counted(world: World) -> int:
    """What GPUClass says of the world: VMs of ``k`` devices that could start now."""
    inventory, dra = folded(world)
    cls = make_class("rows", "", device_class=world.device_class, vm_sizes=[world.k])
    (fit,) = decide([cls], inventory, PERMITS, dra)["rows"].status.fits
    return fit.vms


@pytest.mark.parametrize("world", WORLDS, ids=[w.name for w in WORLDS])
def test_the_count_is_what_the_allocator_grants(world: World) -> None:
    assert counted(world) == world.counted


def test_free_units_of_a_partitioned_gpu_are_single_claims_granted_in_order() -> None:
    inventory, dra = folded(WORLDS[1])  # two GPUs, each whole and in halves
    status = decide([make_class("rows", "", device_class="rows-gpu")], inventory, PERMITS, dra)["rows"].status
    # One at a time: whole-0, whole-1. A claim of two: {whole-0, whole-1}, nothing left for another.
    # A claim of four backtracks to the four halves: the largest VM the node holds.
    assert (status.free_units, status.max_free_units_per_node) == (2, 4)
    assert [(f.units, f.vms) for f in status.fits] == [(1, 2), (2, 1), (4, 1), (8, 0)]


SET = ("d", "p", "gpu-0")


@pytest.mark.parametrize(
    ("candidates", "counters", "k", "granted"),
    [
        # plain devices: k at a time
        ([Candidate()] * 5, {}, 2, 2),
        # a claim of two halves when the whole comes first: the search backtracks past it
        (
            [
                Candidate(((SET, (("m", 80),)),)),
                Candidate(((SET, (("m", 40),)),)),
                Candidate(((SET, (("m", 40),)),)),
            ],
            {SET: {"m": 80}},
            2,
            1,
        ),
        # a shared device with three shares left serves three claims of one, no claim of two
        ([Candidate(shares=3)], {}, 1, 3),
        ([Candidate(shares=3)], {}, 2, 0),
        # a shared device in use has its counters charged already
        ([Candidate(((SET, (("m", 80),)),), shares=2, charged=True)], {SET: {"m": 0}}, 1, 2),
        # two devices of one physical GPU without a common counter set: one of them
        ([Candidate(physical="0000:17:00.0"), Candidate(physical="0000:17:00.0")], {}, 1, 1),
        # ... with one (MIG partitions of one GPU): the counters decide
        (
            [
                Candidate(((SET, (("m", 40),)),), physical="a"),
                Candidate(((SET, (("m", 40),)),), physical="a"),
            ],
            {SET: {"m": 80}},
            1,
            2,
        ),
    ],
)
def test_claims_granted_one_after_another(
    candidates: list[Candidate], counters: dict[tuple[str, str, str], dict[str, int]], k: int, granted: int
) -> None:
    assert claims_granted(candidates, counters, k) == granted


def test_the_offer_follows_every_change_in_any_order() -> None:
    """The counter slice before or after the devices, the claim before or after its device, a taint
    rule coming and going: the offer is always the allocator's for what is there now."""
    world = WORLDS[0]  # whole-0 and its halves; half-0a held: one unit left
    objects: list[tuple[str, Any]] = [("slice", obj) for obj in slices(world, NODE)]
    objects += [("claim", obj) for obj in held_claims(world, NODE)]
    rule = {
        "metadata": {"name": "r"},
        "spec": {"deviceSelector": {"device": "half-0b"}, "taint": {"key": "k", "effect": "NoSchedule"}},
    }
    results = set()
    for order in itertools.permutations(objects):
        dra = DraInventory()
        for obj in device_classes():
            dra.upsert_class(obj)
        seen = []
        for kind, obj in order:
            if kind == "slice":
                dra.upsert_slice(("", obj["metadata"]["name"]), obj)
            else:
                dra.upsert_claim(("t", obj["metadata"]["name"]), obj)
            seen.append(dra.offer("rows-gpu", NODE).free)
        dra.upsert_taint_rule(rule)
        tainted = dra.offer("rows-gpu", NODE).free
        dra.delete_taint_rule("r")
        results.add((seen[-1], tainted, dra.offer("rows-gpu", NODE).free))
        dra.delete_claim(("t", held_claims(world, NODE)[0]["metadata"]["name"]))
        assert dra.offer("rows-gpu", NODE).free == 1  # whole-0 now fits again, first in order
    assert results == {(1, 0, 1)}


def test_a_pool_without_its_counter_slice_is_incomplete_until_it_comes() -> None:
    world = WORLDS[1]
    counters, devices = slices(world, NODE)
    dra = DraInventory()
    for obj in device_classes():
        dra.upsert_class(obj)
    dra.upsert_slice(("", devices["metadata"]["name"]), devices)
    assert dra.offer("rows-gpu", NODE).free == 0
    dra.upsert_slice(("", counters["metadata"]["name"]), counters)
    assert dra.offer("rows-gpu", NODE).free == 2
    dra.delete_slice(("", counters["metadata"]["name"]))
    assert dra.offer("rows-gpu", NODE).free == 0


def test_a_pod_bound_to_a_sibling_that_cannot_start_still_takes_the_nodes_cpu() -> None:
    """gpu-0 held, the class over vfio devices: the allocator grants vfio-0 first (it would not
    start) and vfio-1 next. A node with CPU for one VM places only the first: none starts."""
    sibling_world = WORLDS[-1]
    _, dra = folded(sibling_world)
    offer = dra.offer("rows-vfio", NODE)
    assert (offer.granted(1), offer.vms(1)) == (2, 1)
    assert (offer.vms(1, placed=1), offer.vms(1, placed=2)) == (0, 1)
