"""The IPAddressPools a hoster declares for IPAddressClasses (``hack.metallb.pools_for_classes``), one
row per rule, and when MetalLB's pool status says it loaded one (``pool_loaded``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from hack.metallb import (
    HUGE,
    MANAGED_BY_LABEL,
    PoolDecl,
    pool_decl,
    pool_loaded,
    pool_object,
    pools_for_classes,
)
from shared.kube import Obj


def klass(name: str, created: str = "2026-01-01T00:00:00Z", deleting: bool = False, **spec: Any) -> Obj:
    metadata: Obj = {"name": name, "creationTimestamp": created}
    if deleting:
        metadata["deletionTimestamp"] = "2026-02-01T00:00:00Z"
    return {"metadata": metadata, "spec": spec}


@dataclass(frozen=True)
class Case:
    classes: list[Obj]
    expected: dict[str, tuple[str, ...]]  # pool name -> its address entries
    lb_class: str = ""
    taken: tuple[str, ...] = ()


CASES = [
    pytest.param(
        Case([klass("public-v4", cidrs=["203.0.113.0/26"])], {"public-v4": ("203.0.113.0/26",)}),
        id="one-pool-per-class-named-after-it",
    ),
    pytest.param(
        Case(
            [klass("public-v4", cidrs=["203.0.113.0/26"], metallbAddressPool="public")],
            {"public": ("203.0.113.0/26",)},
        ),
        id="named-by-metallbAddressPool",
    ),
    pytest.param(
        Case(
            [klass("v6", cidrs=None, ranges=[{"start": "2001:DB8:2::A", "end": "2001:db8:2:0::00ff"}])],
            {"v6": ("2001:db8:2::a-2001:db8:2::ff",)},
        ),
        id="ranges-as-canonical-start-end",
    ),
    pytest.param(
        Case([klass("cilium", cidrs=["203.0.113.0/26"], provider="CiliumLBIPAM")], {}),
        id="cilium-classes-get-no-metallb-pool",
    ),
    pytest.param(
        Case([klass("other-lb", cidrs=["203.0.113.0/26"], loadBalancerClass="example.com/other")], {}),
        id="a-load-balancer-class-this-metallb-does-not-serve",
    ),
    pytest.param(
        Case(
            [klass("ours", cidrs=["203.0.113.0/26"], loadBalancerClass="example.com/ours")],
            {"ours": ("203.0.113.0/26",)},
            lb_class="example.com/ours",
        ),
        id="the-load-balancer-class-this-metallb-serves",
    ),
    pytest.param(
        Case(
            [
                klass("newer", "2026-01-02T00:00:00Z", cidrs=["203.0.113.0/24"]),
                klass("older", "2026-01-01T00:00:00Z", cidrs=["203.0.113.16/28"]),
            ],
            {"older": ("203.0.113.16/28",)},
        ),
        id="an-overlapping-newer-class-gets-none",
    ),
    pytest.param(
        Case(
            [
                klass("a", cidrs=["198.51.100.0/29"]),
                klass("b", ranges=[{"start": "198.51.100.7", "end": "198.51.100.9"}]),
            ],
            {"a": ("198.51.100.0/29",)},
        ),
        id="a-range-overlapping-a-cidr-of-an-equal-age-class-by-name",
    ),
    pytest.param(
        Case([klass("a", cidrs=["198.51.100.0/29"])], {}, taken=("198.51.100.4-198.51.100.5",)),
        id="overlapping-a-pool-declared-otherwise",
    ),
    pytest.param(
        Case([klass("going", deleting=True, cidrs=["198.51.100.0/29"])], {}),
        id="a-class-being-deleted",
    ),
    pytest.param(
        Case(
            [klass("bad", cidrs=["198.51.100.1/29"]), klass("good", cidrs=["198.51.100.8/29"])],
            {"good": ("198.51.100.8/29",)},
        ),
        id="an-invalid-class-is-skipped-alone",
    ),
    pytest.param(
        Case(
            [
                klass("a", cidrs=["198.51.100.0/29"], metallbAddressPool="shared"),
                klass("b", cidrs=["198.51.100.8/29"], metallbAddressPool="shared"),
            ],
            {"shared": ("198.51.100.0/29", "198.51.100.8/29")},
        ),
        id="classes-naming-one-pool-share-it",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_pools_for_classes(case: Case) -> None:
    pools = pools_for_classes(case.classes, case.lb_class, case.taken)
    assert {name: decl.addresses for name, decl in pools.items()} == case.expected


def test_pool_object_never_auto_assigns_and_carries_the_mirrors_label() -> None:
    decl = pools_for_classes([klass("public-v4", cidrs=["203.0.113.0/26"])])["public-v4"]
    pool = pool_object("public-v4", decl)
    assert pool["spec"] == {"addresses": ["203.0.113.0/26"], "autoAssign": False, "avoidBuggyIPs": False}
    assert MANAGED_BY_LABEL in pool["metadata"]["labels"]
    assert "labels" not in pool_object("own", decl, mirrored=False)["metadata"]


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


EIGHT = PoolDecl(("198.51.100.0/29",), (), 8, 0)


@pytest.mark.parametrize(
    ("status", "decl", "loaded"),
    [
        pytest.param(None, EIGHT, False, id="no-status-yet"),
        pytest.param({"assignedIPv4": 0, "availableIPv4": 0}, EIGHT, False, id="zeros"),
        pytest.param({"assignedIPv4": 1, "availableIPv4": 7}, EIGHT, True, id="full-size"),
        pytest.param({"assignedIPv4": 0, "availableIPv4": 4}, EIGHT, False, id="older-size"),
        pytest.param({"availableIPv6": 2**63 - 1}, PoolDecl(("x",), (), 0, HUGE), True, id="endless-v6"),
    ],
)
def test_pool_loaded(status: Obj | None, decl: PoolDecl, loaded: bool) -> None:
    pool = None if status is None else {"status": status}
    assert pool_loaded(pool, decl) is loaded
