"""harness.node_layout: the test node's configuration carries the measured traps, and every
path and address stays inside what the node owns (its directory, its network namespace)."""

from __future__ import annotations

import ipaddress
import json
import tomllib
from pathlib import Path

import pytest

from harness.node_layout import (
    API_SERVICE_IP,
    NODE_IP,
    POD_SUBNET,
    NodeLayout,
    cni_config,
    containerd_config,
    kubelet_config,
)

LAYOUT = NodeLayout(id="abc123", dir=Path("/var/tmp/cozy-node-abc123"), pause_image="localhost/pause:x")


def test_containerd_config_parses_and_restricts_oom_score_adj() -> None:
    config = tomllib.loads(containerd_config(LAYOUT))
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"] is True
    assert cri["sandbox_image"] == "localhost/pause:x"
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False


def test_kubelet_accepts_cgroup_v1_and_uses_the_node_cgroup_root() -> None:
    config = kubelet_config(LAYOUT)
    assert config["failCgroupV1"] is False
    assert config["cgroupRoot"] == "/cozy-node-abc123"
    assert config["containerRuntimeEndpoint"] == "unix:///var/tmp/cozy-node-abc123/containerd.sock"


@pytest.mark.parametrize(
    ("where", "paths"),
    [
        ("containerd", lambda: _strings(tomllib.loads(containerd_config(LAYOUT)))),
        ("kubelet", lambda: _strings(kubelet_config(LAYOUT))),
        ("cni", lambda: _strings(cni_config(LAYOUT))),
    ],
)
def test_every_path_is_under_the_node_directory(where: str, paths: object) -> None:
    assert callable(paths)
    for value in paths():
        if value.startswith("/") and not value.startswith("/usr/lib/cni") and value != LAYOUT.cgroup_root:
            assert value.startswith(str(LAYOUT.dir)), (where, value)


def test_addresses_are_private_and_not_loopback() -> None:
    for address in (NODE_IP, API_SERVICE_IP):
        ip = ipaddress.ip_address(address)
        assert ip.is_private
        assert not ip.is_loopback
    assert ipaddress.ip_address(NODE_IP) not in ipaddress.ip_network(POD_SUBNET)
    assert json.dumps(cni_config(LAYOUT)).count('"ipMasq": false') == 1


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []
