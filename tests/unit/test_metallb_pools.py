"""The IPAddressPools the tests declare (``hack.metallb``): a pool's sizes as MetalLB counts them
(``pool_decl``), its manifest (``pool_object``), and when MetalLB's pool status says it loaded one
(``pool_loaded``); one row per rule. (Pools for address classes are the substrate driver's: its
model's rules are in ``test_substrate_model_rules.py``.)"""

from __future__ import annotations

import pytest

from hack.metallb import HUGE, PoolDecl, pool_decl, pool_loaded, pool_object
from shared.kube import Obj


def test_pool_object_never_auto_assigns() -> None:
    pool = pool_object("own", pool_decl(["203.0.113.0/26"]))
    assert pool["spec"] == {"addresses": ["203.0.113.0/26"], "autoAssign": False, "avoidBuggyIPs": False}
    assert pool["metadata"] == {"name": "own", "namespace": "metallb-system"}


@pytest.mark.parametrize(
    ("addresses", "ipv4", "ipv6"),
    [
        pytest.param(("198.51.100.0/29",), 8, 0, id="a-cidr-counts-every-address"),
        pytest.param(("198.51.100.8-198.51.100.10",), 3, 0, id="a-range-counts-inclusively"),
        pytest.param(("2001:db8::/64",), 0, HUGE, id="metallb-deems-a-64-endless"),
        pytest.param(("2001:db8::/120",), 0, 256, id="a-small-v6-cidr"),
    ],
)
def test_pool_sizes_as_metallb_counts_them(addresses: tuple[str, ...], ipv4: int, ipv6: int) -> None:
    decl = pool_decl(addresses)
    assert (decl.ipv4, decl.ipv6) == (ipv4, ipv6)


EIGHT = PoolDecl(("198.51.100.0/29",), 8, 0)


@pytest.mark.parametrize(
    ("status", "decl", "loaded"),
    [
        pytest.param(None, EIGHT, False, id="no-status-yet"),
        pytest.param({"assignedIPv4": 0, "availableIPv4": 0}, EIGHT, False, id="zeros"),
        pytest.param({"assignedIPv4": 1, "availableIPv4": 7}, EIGHT, True, id="full-size"),
        pytest.param({"assignedIPv4": 0, "availableIPv4": 4}, EIGHT, False, id="older-size"),
        pytest.param({"availableIPv6": 2**63 - 1}, PoolDecl(("x",), 0, HUGE), True, id="endless-v6"),
    ],
)
def test_pool_loaded(status: Obj | None, decl: PoolDecl, loaded: bool) -> None:
    pool = None if status is None else {"status": status}
    assert pool_loaded(pool, decl) is loaded
