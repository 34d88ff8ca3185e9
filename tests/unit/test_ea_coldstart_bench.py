"""The EndpointAttachment cold-start benchmark's pure parts: when a start has drained, what counts as a
write, memory from /proc, the class's size, the NodePort range's ports, the baseline's lists, and the
stand-in's bodies."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import pytest

from bench.endpointattachment.coldstart import (
    ACTIVE,
    COLD_ATTACHMENTS,
    COLD_NODE_PORT_RANGE,
    CONTROLLER,
    DEPTH,
    LEADER,
    RECONCILES,
    ColdOptions,
    Samples,
    class_prefix,
    drained,
    memory,
    node_ports,
    passes_by_result,
    run,
    writes,
)
from bench.endpointattachment.listing import LISTS, informer_lists
from harness.apimetrics import RequestKey
from harness.standin import (
    address_body,
    associated_status,
    claim_status,
    hosts,
    ingress_status,
)
from operators.endpointattachment.controller import ATTACHMENT_CONTROLLER
from operators.endpointattachment.world import POD_FIELD_SELECTOR
from shared.resources import PODS, SERVICES
from shared.runtime.controller import Cache


def samples(
    passes: float = 100, depth: float = 0, active: float = 0, leading: float = 1, other: float = 0
) -> Samples:
    """A filtered scrape of the operator: its attachments' controller, and another controller."""
    return {
        (RECONCILES, (("controller", CONTROLLER), ("result", "success"))): passes,
        (RECONCILES, (("controller", CONTROLLER), ("result", "error"))): 0,
        (RECONCILES, (("controller", "other"), ("result", "success"))): other,
        (DEPTH, (("name", CONTROLLER),)): depth,
        (DEPTH, (("name", "other"),)): 7,
        (ACTIVE, (("controller", CONTROLLER),)): active,
        (LEADER, (("name", "lease"),)): leading,
    }


# (what, samples, attachments, drained)
DRAINED: list[tuple[str, Samples, int, bool]] = [
    ("every key reconciled, nothing queued or running", samples(), 100, True),
    ("more passes than keys (a wake during the start) still drained", samples(passes=130), 100, True),
    ("fewer passes than attachments", samples(passes=99), 100, False),
    ("another controller's passes do not count", samples(passes=50, other=50), 100, False),
    ("a key still queued", samples(depth=1), 100, False),
    ("a worker still on a key", samples(active=1), 100, False),
    ("not leading: the controllers have not started", samples(passes=0, leading=0), 0, False),
    ("an empty world drains once leading", samples(passes=0), 0, True),
    ("no samples yet", {}, 0, False),
]


@pytest.mark.parametrize(("what", "scraped", "attachments", "expected"), DRAINED, ids=[c[0] for c in DRAINED])
def test_drained(what: str, scraped: Samples, attachments: int, expected: bool) -> None:
    assert drained(scraped, attachments) is expected


def test_an_operator_without_leader_election_drains_without_leading() -> None:
    assert drained(samples(passes=0, leading=0), 0, elected=False)
    assert not drained(samples(passes=0, leading=0, depth=3), 0, elected=False)


def test_passes_by_result_counts_only_the_attachments_controller_and_seen_results() -> None:
    assert passes_by_result(samples(passes=5, other=3)) == {"success": 5}


# (what, apiserver_request_total delta, writes counted)
WRITES: list[tuple[str, dict[RequestKey, int], dict[str, int]]] = [
    ("reads are not writes", {("LIST", "services", "", "200"): 10, ("WATCH", "pods", "", "200"): 3}, {}),
    (
        "a status patch is one",
        {("PATCH", "endpointattachments", "status", "200"): 2},
        {"PATCH endpointattachments/status": 2},
    ),
    ("Leases are left out (leader election)", {("PUT", "leases", "", "200"): 4}, {}),
    (
        "refused writes count too",
        {("POST", "services", "", "422"): 1, ("POST", "services", "", "201"): 1},
        {"POST services": 2},
    ),
    ("server-side apply counts", {("APPLY", "services", "", "200"): 1}, {"APPLY services": 1}),
    ("a vanished counter (negative) is nothing", {("DELETE", "services", "", "200"): -1}, {}),
]


@pytest.mark.parametrize(("what", "delta", "expected"), WRITES, ids=[c[0] for c in WRITES])
def test_writes(what: str, delta: dict[RequestKey, int], expected: dict[str, int]) -> None:
    assert writes(Counter(delta)) == Counter(expected)


# (what, /proc/<pid>/status text, bytes)
MEMORY: list[tuple[str, str, dict[str, int]]] = [
    (
        "both, in bytes",
        "Name:\tpython\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nThreads:\t3\n",
        {"VmHWM": 2 << 20, "VmRSS": 1 << 20},
    ),
    ("a zombie has neither", "Name:\tpython\nState:\tZ (zombie)\n", {}),
]


@pytest.mark.parametrize(("what", "text", "expected"), MEMORY, ids=[c[0] for c in MEMORY])
def test_memory(what: str, text: str, expected: dict[str, int]) -> None:
    assert memory(text) == expected


# (addresses, prefix): the network holds them, one bit shorter would not.
PREFIXES: list[tuple[int, int]] = [(1, 30), (2, 30), (3, 29), (200, 24), (254, 24), (255, 23), (5_000, 19)]


@pytest.mark.parametrize(("addresses", "prefix"), PREFIXES)
def test_class_prefix(addresses: int, prefix: int) -> None:
    assert class_prefix(addresses) == prefix
    assert 2 ** (32 - prefix) - 2 >= addresses


def test_the_baseline_lists_every_informer_of_the_wiring_with_its_field_selector() -> None:
    listed = {spec.plural: spec for spec in LISTS}
    assert set(listed) == {resource.plural for resource in ATTACHMENT_CONTROLLER.resources()}
    assert listed[PODS.plural].field_selector == POD_FIELD_SELECTOR
    assert listed[SERVICES.plural].path == "/api/v1/services"  # cluster-wide, as the informer


@pytest.mark.parametrize(
    "cache", [Cache(SERVICES, label_selector="a=b"), Cache(SERVICES, page_size=50)], ids=["label", "page"]
)
def test_the_baseline_refuses_a_cache_it_cannot_list_the_same_way(cache: Cache) -> None:
    wiring = dataclasses.replace(ATTACHMENT_CONTROLLER, caches=(cache,))
    with pytest.raises(ValueError, match="services"):
        informer_lists(wiring)


CLAIM: dict[str, Any] = {"metadata": {"namespace": "t", "name": "ea-1-x", "uid": "u-1", "generation": 3}}


def test_the_stand_in_writes_the_substrates_shapes() -> None:
    address = address_body("198.18.0.1", "pool", CLAIM)
    assert address["metadata"]["name"] == "ip-198-18-0-1"
    assert address["spec"]["claimRef"] == {"namespace": "t", "name": "ea-1-x", "uid": "u-1"}
    assert address["spec"]["source"] == {"fromClass": {}}
    status = claim_status(CLAIM, "pool", "198.18.0.1", "2026-01-01T00:00:00Z")["status"]
    assert status["phase"] == "Bound"
    assert status["className"] == "pool"
    assert status["addresses"] == [{"name": "ip-198-18-0-1", "address": "198.18.0.1"}]
    assert [(c["type"], c["status"], c["observedGeneration"]) for c in status["conditions"]] == [
        ("ClassResolved", "True", 3),
        ("Bound", "True", 3),
    ]
    service = {"metadata": {"namespace": "t", "name": "ea-1-svc"}}
    assert associated_status(service)["status"]["associatedTo"] == {
        "kind": "Service",
        "namespace": "t",
        "name": "ea-1-svc",
    }
    assert ingress_status("198.18.0.1") == {"status": {"loadBalancer": {"ingress": [{"ip": "198.18.0.1"}]}}}


def test_the_stand_in_hands_out_host_addresses_in_order() -> None:
    address_class = {"spec": {"parameters": {"addresses": ["198.18.0.0/30", "198.18.1.0/31"]}}}
    assert list(hosts(address_class)) == ["198.18.0.1", "198.18.0.2", "198.18.1.0", "198.18.1.1"]


# (what, --service-node-port-range, its ports)
NODE_PORTS: list[tuple[str, str, int]] = [
    ("Kubernetes' default", "30000-32767", 2_768),
    ("the bench's own", COLD_NODE_PORT_RANGE, 10_000),
    ("one port", "30000-30000", 1),
    ("up to the highest port", "30000-65535", 35_536),
]


@pytest.mark.parametrize(("what", "port_range", "expected"), NODE_PORTS, ids=[c[0] for c in NODE_PORTS])
def test_node_ports(what: str, port_range: str, expected: int) -> None:
    assert node_ports(port_range) == expected


NOT_RANGES = ["", "30000", "30000+2768", "32767-30000", "0-10", "30000-65536", "a-b", "-1-5"]


@pytest.mark.parametrize("port_range", NOT_RANGES)
def test_node_ports_refuses_what_is_not_a_first_last_range(port_range: str) -> None:
    with pytest.raises(ValueError, match="not a NodePort range"):
        node_ports(port_range)


def test_the_default_attachments_fit_the_bench_s_node_port_range() -> None:
    assert node_ports(ColdOptions().node_port_range) >= COLD_ATTACHMENTS


def test_more_attachments_than_health_check_node_ports_is_refused_before_any_cluster() -> None:
    options = ColdOptions(attachments=11, node_port_range="30000-30009")
    with pytest.raises(ValueError, match="NodePorts"):
        run(options, lambda message: None)
