"""Node readiness, cordon, taints against tolerations, and the scheduler's pod request."""

from __future__ import annotations

from typing import Any

import pytest

from operators.gpuclass import scheduling
from operators.gpuclass.scheduling import (
    NAME_MEMO_LIMIT,
    NodeVerdict,
    Taint,
    Toleration,
    blocking_taints,
    bound_node,
    eligible,
    extended_requests,
    is_cordoned,
    is_extended_resource,
    is_ready,
    parse_tolerations,
    pod_request,
    verdict,
)
from tests.gpuclass_builders import GPU_TOLERATION, H200, L40S, container, make_node, make_pod, taint

GPU_TAINT = Taint("nvidia.com/gpu", "present", "NoSchedule")


@pytest.mark.parametrize(
    ("ready", "expected"), [("True", True), ("False", False), ("Unknown", False), (None, False)]
)
def test_ready_only_when_the_ready_condition_is_true(ready: str | None, expected: bool) -> None:
    assert is_ready(make_node("n", ready=ready)) is expected


@pytest.mark.parametrize(("unschedulable", "expected"), [(True, True), (False, False)])
def test_cordoned_is_spec_unschedulable(unschedulable: bool, expected: bool) -> None:
    assert is_cordoned(make_node("n", unschedulable=unschedulable)) is expected


def test_only_noschedule_and_noexecute_taints_block_sorted_and_deduplicated() -> None:
    node = make_node(
        "n",
        taints=[
            taint("z", "NoExecute"),
            taint("soft", "PreferNoSchedule", "x"),
            taint("a", "NoSchedule", "v"),
            taint("a", "NoSchedule", "v"),
        ],
    )
    assert blocking_taints(node) == (Taint("a", "v", "NoSchedule"), Taint("z", "", "NoExecute"))


@pytest.mark.parametrize(
    ("toleration", "taint_", "expected"),
    [
        # effect: empty matches every effect; otherwise it must be equal
        (Toleration("nvidia.com/gpu", "Exists"), GPU_TAINT, True),
        (Toleration("nvidia.com/gpu", "Exists", effect="NoSchedule"), GPU_TAINT, True),
        (Toleration("nvidia.com/gpu", "Exists", effect="NoExecute"), GPU_TAINT, False),
        # key: empty with Exists matches every key; otherwise equal
        (Toleration(operator="Exists"), GPU_TAINT, True),
        (Toleration(operator="Exists", effect="NoSchedule"), GPU_TAINT, True),
        (Toleration(operator="Exists", effect="NoExecute"), GPU_TAINT, False),
        (Toleration("other", "Exists"), GPU_TAINT, False),
        # Exists ignores the value
        (Toleration("nvidia.com/gpu", "Exists", value="whatever"), GPU_TAINT, True),
        # Equal and the empty operator compare values; empty equals empty
        (Toleration("nvidia.com/gpu", "Equal", "present"), GPU_TAINT, True),
        (Toleration("nvidia.com/gpu", "", "present"), GPU_TAINT, True),
        (Toleration("nvidia.com/gpu", "Equal", "absent"), GPU_TAINT, False),
        (Toleration("nvidia.com/gpu", "Equal"), GPU_TAINT, False),
        (Toleration("k", "Equal"), Taint("k", "", "NoSchedule"), True),
        (Toleration("k"), Taint("k", "", "NoSchedule"), True),
        # an empty key needs Exists (the API rejects it with Equal)
        (Toleration("", "Equal", "present"), GPU_TAINT, False),
        # keys are case-sensitive; unknown operators match nothing
        (Toleration("NVIDIA.com/gpu", "Exists"), GPU_TAINT, False),
        (Toleration("nvidia.com/gpu", "Gt", "present"), GPU_TAINT, False),
    ],
)
def test_toleration_matching_is_the_schedulers(toleration: Toleration, taint_: Taint, expected: bool) -> None:
    assert toleration.tolerates(taint_) is expected


def test_parse_tolerations_reads_the_core_v1_shape_and_drops_junk() -> None:
    parsed = parse_tolerations(
        [GPU_TOLERATION, {"key": "k", "value": "v", "tolerationSeconds": 30}, "junk", None]
    )
    assert parsed == (Toleration("nvidia.com/gpu", "Exists", "", "NoSchedule"), Toleration("k", "", "v", ""))
    assert parse_tolerations(None) == ()


GPU_TAINTED = [taint("nvidia.com/gpu", "NoSchedule", "present")]


@pytest.mark.parametrize(
    ("node", "tolerations", "expected"),
    [
        (make_node("n"), [], NodeVerdict.ELIGIBLE),
        (make_node("n", taints=GPU_TAINTED), [], NodeVerdict.UNTOLERATED_TAINT),
        (make_node("n", taints=GPU_TAINTED), [GPU_TOLERATION], NodeVerdict.ELIGIBLE),
        (make_node("n", taints=[taint("soft", "PreferNoSchedule")]), [], NodeVerdict.ELIGIBLE),
        (
            make_node("n", taints=[*GPU_TAINTED, taint("d", "NoExecute")]),
            [GPU_TOLERATION],
            NodeVerdict.UNTOLERATED_TAINT,
        ),
        (make_node("n", ready="Unknown"), [], NodeVerdict.NOT_READY),
        (make_node("n", ready="False", unschedulable=True), [], NodeVerdict.NOT_READY),
        (make_node("n", unschedulable=True), [], NodeVerdict.CORDONED),
        # cordon means maintenance: tolerating the unschedulable taint does not make it eligible
        (
            make_node("n", unschedulable=True),
            [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}],
            NodeVerdict.CORDONED,
        ),
        (make_node("n", unschedulable=True), [{"operator": "Exists"}], NodeVerdict.CORDONED),
    ],
)
def test_node_verdict_and_eligibility(
    node: dict[str, Any], tolerations: list[Any], expected: NodeVerdict
) -> None:
    parsed = parse_tolerations(tolerations)
    assert verdict(is_ready(node), is_cordoned(node), blocking_taints(node), parsed) is expected
    assert eligible(node, parsed) is (expected is NodeVerdict.ELIGIBLE)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (H200, True),
        ("example.com/fpga", True),
        ("devices.kubevirt.io/kvm", True),
        ("cpu", False),
        ("hugepages-2Mi", False),
        ("kubernetes.io/foo", False),
        ("node.kubernetes.io/foo", False),
        ("requests.example.com/foo", False),
    ],
)
def test_extended_resources(name: str, expected: bool) -> None:
    assert is_extended_resource(name) is expected


@pytest.mark.parametrize(
    ("node", "phase", "expected"),
    [
        ("n1", "Running", "n1"),
        ("n1", "Pending", "n1"),
        ("n1", "Unknown", "n1"),
        ("n1", "Succeeded", None),
        ("n1", "Failed", None),
        (None, "Pending", None),
    ],
)
def test_bound_unfinished_pods_hold_resources(node: str | None, phase: str, expected: str | None) -> None:
    assert bound_node(make_pod("p", node=node, phase=phase)) == expected


def test_terminating_pods_still_hold_resources() -> None:
    assert bound_node(make_pod("p", node="n1", deleting=True)) == "n1"


def _gpu(amount: str, *, sidecar: bool = False, limit_only: bool = False) -> dict[str, Any]:
    amounts = {H200: amount}
    if limit_only:
        return container(limits=amounts)
    return container(requests=amounts, limits=amounts, restart_policy="Always" if sidecar else None)


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (make_pod("cpu-only"), 0),
        (make_pod("app", containers=[_gpu("2")]), 2),
        (make_pod("apps", containers=[_gpu("1"), _gpu("2")]), 3),
        (make_pod("limit-falls-back", containers=[_gpu("2", limit_only=True)]), 2),
        # a plain init container's peak beats the app containers...
        (make_pod("init-peak", init_containers=[_gpu("3")], containers=[_gpu("1")]), 3),
        # ...or not; init containers run one at a time, so their peak is a max, not a sum
        (make_pod("init-lower", init_containers=[_gpu("1"), _gpu("1")], containers=[_gpu("2")]), 2),
        # a sidecar runs beside the app containers
        (make_pod("sidecar", init_containers=[_gpu("1", sidecar=True)], containers=[_gpu("1")]), 2),
        # a plain init container after a sidecar runs beside it
        (
            make_pod(
                "sidecar-then-init",
                init_containers=[_gpu("1", sidecar=True), _gpu("3")],
                containers=[_gpu("1")],
            ),
            4,
        ),
        # ...but one before a sidecar does not
        (
            make_pod(
                "init-then-sidecar",
                init_containers=[_gpu("3"), _gpu("1", sidecar=True)],
                containers=[_gpu("1")],
            ),
            3,
        ),
        (make_pod("overhead", containers=[_gpu("1")], overhead={H200: "1"}), 2),
        # sums are exact, rounded up once at the end
        (make_pod("millis", containers=[_gpu("500m"), _gpu("500m")]), 1),
        (make_pod("millis-up", containers=[_gpu("1500m")]), 2),
        (make_pod("kilo", containers=[_gpu("1k")]), 1000),
        # garbage counts 0
        (make_pod("garbage", containers=[_gpu("lots"), _gpu("1")]), 1),
        (make_pod("negative", containers=[_gpu("-4"), _gpu("1")]), 1),
        # a request shadows its limit, even a garbage one...
        (make_pod("garbage-request", containers=[container(requests={H200: "bad"}, limits={H200: "2"})]), 0),
        # ...and a limit stands in only for its own name
        (make_pod("limit-beside", containers=[container(requests={L40S: "1"}, limits={H200: "2"})]), 2),
        # a container naming no extended resource adds nothing, before or after one that does
        (make_pod("cpu-beside", containers=[container(), _gpu("2"), container()]), 2),
    ],
)
def test_pod_request_is_the_schedulers(pod: dict[str, Any], expected: int) -> None:
    assert pod_request(pod, H200) == expected
    assert extended_requests(pod).amounts.get(H200, 0) == expected


def test_extended_requests_cover_every_extended_resource_and_report_garbage() -> None:
    pod = make_pod(
        "mixed",
        containers=[container(requests={H200: "1", L40S: "bad"}), container(limits={"example.com/x": "0"})],
    )
    requests = extended_requests(pod)
    assert dict(requests.amounts) == {H200: 1}  # zero and garbage leave nothing; cpu is not extended
    assert requests.garbage == ((L40S, "bad"),)


def test_pod_request_tolerates_missing_and_odd_fields() -> None:
    assert pod_request({}, H200) == 0
    assert pod_request({"spec": {"containers": [None, {"resources": None}, {}]}}, H200) == 0


def test_the_name_memo_of_one_predicate_never_answers_for_another() -> None:
    pod = make_pod("cpu-and-gpu", containers=[_gpu("2")])
    assert dict(extended_requests(pod).amounts) == {H200: 2}  # cpu is remembered as not extended
    assert pod_request(pod, "cpu") == 1  # 100m, rounded up: asked for by name, it counts
    assert dict(extended_requests(pod).amounts) == {H200: 2}


def test_the_name_memo_is_bounded() -> None:
    names = {f"example.com/r{i}": "1" for i in range(NAME_MEMO_LIMIT + 5)}
    pod = make_pod("many-names", containers=[container(requests=names)])
    assert dict(extended_requests(pod).amounts) == dict.fromkeys(names, 1)
    assert len(scheduling._EXTENDED.wanted_names) + len(scheduling._EXTENDED.unwanted) <= NAME_MEMO_LIMIT
    assert dict(extended_requests(pod).amounts) == dict.fromkeys(names, 1)
