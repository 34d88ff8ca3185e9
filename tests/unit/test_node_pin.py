"""The test node (hack/node) runs the control plane's own Kubernetes release: kubelet, scheduler and
API server from one k8s.io/kubernetes version, each staging module replaced by the same release."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pins(module: str) -> dict[str, str]:
    """Every k8s.io module version the go.mod of hack/<module> requires or replaces to."""
    text = (ROOT / "hack" / module / "go.mod").read_text()
    found = dict(re.findall(r"^\s*(k8s\.io/kubernetes)\s+(v\S+)", text, re.M))
    found.update(re.findall(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+k8s\.io/[\w.-]+\s+(v\S+)", text, re.M))
    return found


def test_node_and_control_plane_pin_the_same_release() -> None:
    node, controlplane = pins("node"), pins("controlplane")
    assert node["k8s.io/kubernetes"] == controlplane["k8s.io/kubernetes"]
    assert {k: v for k, v in node.items() if k in controlplane} == {
        k: v for k, v in controlplane.items() if k in node
    }
