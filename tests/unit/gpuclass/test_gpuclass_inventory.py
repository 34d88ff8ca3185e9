"""The inventory follows Node and Pod events incrementally, and ends where a rebuild would."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from operators.gpuclass.inventory import Inventory, NodeState, pod_key, spec_version
from operators.gpuclass.scheduling import Taint
from tests.gpuclass_builders import (
    H200,
    L40S,
    container,
    gpu_pod,
    make_node,
    make_pod,
    nodes,
    pods,
    taint,
)


def _inventory(*objects: dict[str, Any]) -> Inventory:
    inventory = Inventory()
    for obj in objects:
        if obj["kind"] == "Node":
            inventory.upsert_node(obj)
        else:
            inventory.upsert_pod(obj)
    return inventory


def test_node_state_keeps_only_what_a_pass_needs() -> None:
    node = make_node(
        "n1",
        unschedulable=True,
        taints=[taint("nvidia.com/gpu", "NoSchedule", "present"), taint("soft", "PreferNoSchedule")],
        allocatable={H200: "8", L40S: "1500m", "example.com/bad": "lots"},
    )
    state = _inventory(node).node("n1")
    assert state == NodeState(
        name="n1",
        ready=True,
        cordoned=True,
        taints=(
            Taint("node.kubernetes.io/unschedulable", "", "NoSchedule"),
            Taint("nvidia.com/gpu", "present", "NoSchedule"),
        ),
        allocatable={H200: 8, L40S: 2, "example.com/bad": 0},  # cpu, memory, pods are not tracked
    )


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        ([gpu_pod("a", H200, 2, node="n1")], 2),
        ([gpu_pod("a", H200, 2, node="n1"), gpu_pod("b", H200, 3, node="n1")], 5),
        # an update replaces the pod's contribution instead of adding to it
        ([gpu_pod("a", H200, 2, node="n1"), gpu_pod("a", H200, 2, node="n1", phase="Pending")], 2),
        ([gpu_pod("a", H200, 2, node="n1", phase="Pending"), gpu_pod("a", H200, 2, node="n1")], 2),
        # finishing releases
        ([gpu_pod("a", H200, 2, node="n1"), gpu_pod("a", H200, 2, node="n1", phase="Succeeded")], 0),
        # binding adds
        ([gpu_pod("a", H200, 2, node=None, phase="Pending"), gpu_pod("a", H200, 2, node="n1")], 2),
    ],
)
def test_pod_updates_replace_their_last_contribution(events: list[dict[str, Any]], expected: int) -> None:
    assert _inventory(make_node("n1", allocatable={H200: "8"}), *events).requested("n1", H200) == expected


def test_delete_pod_subtracts_and_forgets() -> None:
    pod = gpu_pod("a", H200, 2, node="n1")
    inventory = _inventory(make_node("n1", allocatable={H200: "8"}), pod, gpu_pod("b", H200, 1, node="n1"))
    assert inventory.delete_pod(pod_key(pod)) is True
    assert inventory.requested("n1", H200) == 1
    assert inventory.delete_pod(pod_key(pod)) is False
    assert inventory.tracked_pods() == 1


def test_pods_without_extended_requests_store_nothing() -> None:
    inventory = _inventory(
        make_pod("cpu-only", node="n1"),
        gpu_pod("unbound", H200, 1, node=None, phase="Pending"),
        gpu_pod("done", H200, 1, node="n1", phase="Succeeded"),
    )
    assert inventory.tracked_pods() == 0
    assert inventory.snapshot().requested == {}


def test_pods_on_a_missing_node_are_kept_and_count_once_it_appears() -> None:
    inventory = _inventory(gpu_pod("early", H200, 2, node="n1"))
    assert inventory.advertisers(H200) == {}
    assert inventory.requested_on(H200) == {"n1": 2}
    inventory.upsert_node(make_node("n1", allocatable={H200: "8"}))
    assert set(inventory.advertisers(H200)) == {"n1"}
    assert inventory.requested("n1", H200) == 2
    inventory.delete_node("n1")
    assert inventory.advertisers(H200) == {}
    assert inventory.requested("n1", H200) == 2  # still remembered for when it comes back


def test_advertisers_follow_allocatable_changes() -> None:
    inventory = _inventory(make_node("n1", allocatable={H200: "8"}), make_node("n2", allocatable={H200: "0"}))
    assert set(inventory.advertisers(H200)) == {"n1", "n2"}  # "0" still advertises the name
    inventory.upsert_node(make_node("n1", allocatable={L40S: "2"}))
    assert set(inventory.advertisers(H200)) == {"n2"}
    assert set(inventory.advertisers(L40S)) == {"n1"}
    inventory.upsert_node(make_node("n2", ready="False", allocatable={H200: "0"}))
    assert inventory.advertisers(H200)["n2"].ready is False  # the index holds the current state


@pytest.mark.parametrize(
    ("before", "after", "changed"),
    [
        (make_node("n1", allocatable={H200: "8"}), make_node("n1", allocatable={H200: "8"}), False),
        (make_node("n1", allocatable={H200: "8"}), make_node("n1", allocatable={H200: "7"}), True),
        (make_node("n1"), make_node("n1", ready="Unknown"), True),
        (make_node("n1"), make_node("n1", taints=[taint("soft", "PreferNoSchedule")]), False),
    ],
)
def test_upsert_node_says_whether_a_pass_would_see_a_change(
    before: dict[str, Any], after: dict[str, Any], changed: bool
) -> None:
    inventory = _inventory(before)
    assert inventory.upsert_node(after) is changed


def test_upsert_pod_says_whether_its_contribution_changed() -> None:
    inventory = Inventory()
    assert inventory.upsert_pod(gpu_pod("a", H200, 1, node="n1")) is True
    assert inventory.upsert_pod(gpu_pod("a", H200, 1, node="n1", phase="Pending")) is False
    assert inventory.upsert_pod(make_pod("cpu", node="n1")) is False


def _versioned(pod: dict[str, Any], generation: object, uid: str | None = None) -> dict[str, Any]:
    """``pod`` with ``metadata.generation`` set (and another UID: a new life under the same name)."""
    metadata = {**pod["metadata"], "generation": generation}
    if uid is not None:
        metadata["uid"] = uid
    return {**pod, "metadata": metadata}


def _on(pod: dict[str, Any], node: str) -> dict[str, Any]:
    """``pod`` bound to ``node`` instead (hand-made: the API never moves a bound pod)."""
    return {**pod, "spec": {**pod["spec"], "nodeName": node}}


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        # a new spec version is read: a resize raises the generation
        (
            [
                _versioned(gpu_pod("a", H200, 2, node="n1"), 1),
                _versioned(gpu_pod("a", H200, 3, node="n1"), 2),
            ],
            3,
        ),
        # the same spec version is not read again: its requests are the remembered ones...
        (
            [
                _versioned(gpu_pod("a", H200, 2, node="n1"), 1),
                _versioned(gpu_pod("a", H200, 3, node="n1"), 1),
            ],
            2,
        ),
        # ...but the phase is read from every event: finishing releases, a restart of the count adds
        (
            [
                _versioned(gpu_pod("a", H200, 2, node="n1"), 1),
                _versioned(gpu_pod("a", H200, 2, node="n1", phase="Failed"), 1),
            ],
            0,
        ),
        (
            [
                _versioned(gpu_pod("a", H200, 2, node="n1", phase="Pending"), 1),
                _versioned(gpu_pod("a", H200, 2, node="n1"), 1),
            ],
            2,
        ),
        # and so is the node
        (
            [
                _versioned(gpu_pod("a", H200, 2, node="n2"), 1),
                _on(_versioned(gpu_pod("a", H200, 2, node="n2"), 1), "n1"),
            ],
            2,
        ),
        # a new life under the same key (another UID) is read, whatever its generation
        (
            [
                _versioned(gpu_pod("a", H200, 2, node="n1"), 1),
                _versioned(gpu_pod("a", H200, 4, node="n1"), 1, uid="another-life"),
            ],
            4,
        ),
        # without a usable generation every event is read
        ([gpu_pod("a", H200, 2, node="n1"), gpu_pod("a", H200, 3, node="n1")], 3),
        (
            [
                _versioned(gpu_pod("a", H200, 2, node="n1"), "1"),
                _versioned(gpu_pod("a", H200, 3, node="n1"), "1"),
            ],
            3,
        ),
        (
            [
                _versioned(gpu_pod("a", H200, 2, node="n1"), 0),
                _versioned(gpu_pod("a", H200, 3, node="n1"), 0),
            ],
            3,
        ),
        # a version that contributed nothing is remembered as nothing: the next one is read
        (
            [
                _versioned(gpu_pod("a", H200, 2, node="n1", phase="Succeeded"), 1),
                _versioned(gpu_pod("a", H200, 2, node="n1"), 1),
            ],
            2,
        ),
        ([_versioned(make_pod("a", node="n1"), 1), _versioned(gpu_pod("a", H200, 1, node="n1"), 1)], 1),
        # init containers and overhead come with the spec: remembered with it
        (
            [
                _versioned(
                    make_pod(
                        "a",
                        node="n1",
                        init_containers=[container(requests={H200: "3"})],
                        containers=[container(requests={H200: "1"})],
                        overhead={H200: "1"},
                    ),
                    1,
                ),
                _versioned(make_pod("a", node="n1", phase="Pending"), 1),
            ],
            4,
        ),
    ],
)
def test_a_spec_version_is_read_once(events: list[dict[str, Any]], expected: int) -> None:
    inventory = Inventory()
    for event in events:
        inventory.upsert_pod(event, ("tenant-root", "a"))
    assert inventory.requested("n1", H200) == expected


def test_a_deleted_pods_spec_version_is_forgotten() -> None:
    inventory = Inventory()
    key = ("tenant-root", "a")
    inventory.upsert_pod(_versioned(gpu_pod("a", H200, 2, node="n1"), 1), key)
    inventory.delete_pod(key)
    # the same UID and generation with another spec can only be a hand-made object; after a
    # deletion nothing of the old version is trusted
    inventory.upsert_pod(_versioned(gpu_pod("a", H200, 5, node="n1"), 1), key)
    assert inventory.requested("n1", H200) == 5


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ({"uid": "u", "generation": 3}, ("u", 3)),
        ({"uid": "u"}, None),
        ({"generation": 3}, None),
        ({"uid": "u", "generation": 0}, None),
        ({"uid": "u", "generation": True}, None),
        ({"uid": "u", "generation": 1.0}, None),
    ],
)
def test_spec_version_is_uid_and_a_positive_generation(metadata: dict[str, Any], expected: object) -> None:
    assert spec_version({"metadata": metadata}) == expected
    assert spec_version({"metadata": None}) is None


def test_garbage_is_logged_once_per_object_and_text(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    node = make_node("n1", allocatable={H200: "lots"})
    pod = gpu_pod("a", H200, "many", node="n1")
    inventory = _inventory(node, node, pod, pod)
    assert len(caplog.records) == 2
    inventory.upsert_node(make_node("n1", allocatable={H200: "heaps"}))
    assert len(caplog.records) == 3
    inventory.delete_pod(pod_key(pod))
    inventory.upsert_pod(pod)  # a new life of the object logs again
    assert len(caplog.records) == 4


def test_pod_key_prefers_the_uid() -> None:
    assert pod_key({"metadata": {"uid": "u-1", "namespace": "ns", "name": "p"}}) == "u-1"
    assert pod_key({"metadata": {"namespace": "ns", "name": "p"}}) == "ns/p"


# --- properties --------------------------------------------------------------------------------


def _final_state(events: list[tuple[str, dict[str, Any]]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The objects left after applying the events in order: (nodes by name, pods by key)."""
    final_nodes: dict[str, Any] = {}
    final_pods: dict[str, Any] = {}
    for op, obj in events:
        store, key = (
            (final_nodes, obj["metadata"]["name"]) if obj["kind"] == "Node" else (final_pods, pod_key(obj))
        )
        if op == "upsert":
            store[key] = obj
        else:
            store.pop(key, None)
    return final_nodes, final_pods


def _apply(inventory: Inventory, op: str, obj: dict[str, Any]) -> None:
    if obj["kind"] == "Node":
        if op == "upsert":
            inventory.upsert_node(obj)
        else:
            inventory.delete_node(obj["metadata"]["name"])
    elif op == "upsert":
        inventory.upsert_pod(obj)
    else:
        inventory.delete_pod(pod_key(obj))


events_strategy = st.lists(
    st.tuples(st.sampled_from(["upsert", "upsert", "delete"]), nodes() | pods()), max_size=40
)


@given(events_strategy)
def test_incremental_inventory_equals_one_built_from_the_final_objects(
    events: list[tuple[str, dict[str, Any]]],
) -> None:
    incremental = Inventory()
    for op, obj in events:
        _apply(incremental, op, obj)
    final_nodes, final_pods = _final_state(events)
    assert incremental.snapshot() == _inventory(*final_nodes.values(), *final_pods.values()).snapshot()


def _with_spec_versions(events: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """The events with a generation on every pod as the API server keeps it: one more for each new
    spec of a UID, so two versions share a generation exactly when they share a spec."""
    generations: dict[tuple[str, str], int] = {}
    latest: dict[str, int] = {}
    versioned = []
    for op, obj in events:
        if obj["kind"] == "Pod":
            uid = obj["metadata"]["uid"]
            spec = json.dumps({k: v for k, v in obj["spec"].items() if k != "nodeName"}, sort_keys=True)
            if (uid, spec) not in generations:
                generations[uid, spec] = latest[uid] = latest.get(uid, 0) + 1
            obj = _versioned(obj, generations[uid, spec])
        versioned.append((op, obj))
    return versioned


@given(events_strategy)
def test_remembered_spec_versions_end_where_a_rebuild_does(events: list[tuple[str, dict[str, Any]]]) -> None:
    events = _with_spec_versions(events)
    incremental = Inventory()
    for op, obj in events:
        _apply(incremental, op, obj)
    final_nodes, final_pods = _final_state(events)
    assert incremental.snapshot() == _inventory(*final_nodes.values(), *final_pods.values()).snapshot()


@given(st.lists(nodes(), max_size=5), st.lists(pods(), max_size=10), st.randoms(use_true_random=False))
def test_order_of_events_does_not_change_the_result(
    node_list: list[dict[str, Any]], pod_list: list[dict[str, Any]], random: Any
) -> None:
    # One final version per object, fed in two different orders (pods before their nodes, too).
    objects = list({o["metadata"]["uid"]: o for o in [*node_list, *pod_list]}.values())
    shuffled = list(objects)
    random.shuffle(shuffled)
    assert _inventory(*objects).snapshot() == _inventory(*shuffled).snapshot()


@given(st.lists(pods(), max_size=12))
def test_deleting_every_pod_leaves_no_requests(pod_list: list[dict[str, Any]]) -> None:
    inventory = _inventory(*pod_list)
    for pod in pod_list:
        inventory.delete_pod(pod_key(pod))
    assert inventory.tracked_pods() == 0
    assert inventory.snapshot().requested == {}
