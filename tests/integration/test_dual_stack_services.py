"""The local control plane is dual-stack, IPv4 primary: what a Service gets, and what MetalLB gives it.

The launcher's ``--service-cluster-ip-range`` is ``10.96.0.0/16,fd00:10:96::/112``: IPv4 first, so a
Service that names no family is single-stack IPv4 (the ``kubernetes`` Service's ClusterIP stays
10.96.0.1, the address the API server's certificate names); a Service may still ask for IPv6 alone
or for both families, and gets a ClusterIP of each. The ranges only feed the ClusterIP allocator:
nothing routes them.

With the session's real MetalLB, a dual-stack LoadBalancer Service pinned to one address of each
family of a two-family pool gets both in ``status.loadBalancer.ingress``, and an IPv6-only one its
IPv6 address. The pool draws from 203.0.113.240/29 (RFC 5737's TEST-NET-3) and 2001:db8:d5::/125
(RFC 3849's documentation prefix), which no other test uses; it is removed at the test's end.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Final

import pytest

from hack.devcluster import external_cluster
from hack.metallb import POOLS, MetalLB, declare_pool
from harness.substrate import METALLB_IPS_ANNOTATION
from harness.waiting import wait_for_object
from shared.kube import Kube, Obj
from shared.resources import SERVICES, Resource

# The launcher's Service CIDRs (hack/controlplane/cmd/devcluster/main.go), primary first.
SERVICE_CIDR_V4: Final = ipaddress.ip_network("10.96.0.0/16")
SERVICE_CIDR_V6: Final = ipaddress.ip_network("fd00:10:96::/112")
# The ServiceCIDR object kube-apiserver makes from its flag (MultiCIDRServiceAllocator, GA).
SERVICE_CIDRS: Final = Resource("networking.k8s.io/v1", "servicecidrs")
DEFAULT_SERVICE_CIDR: Final = "kubernetes"
API_SERVICE_IP: Final = "10.96.0.1"  # the `kubernetes` Service's ClusterIP: the primary range's first
# The test's own MetalLB pool, one range of each family, from documentation ranges no other test uses.
POOL: Final = "dual-stack-it"
POOL_V4: Final = "203.0.113.240/29"
POOL_V6: Final = "2001:db8:d5::/125"
DUAL_V4: Final = "203.0.113.241"
DUAL_V6: Final = "2001:db8:d5::1"
ONLY_V6: Final = "2001:db8:d5::2"
TIMEOUT: Final = 60.0

pytestmark = pytest.mark.skipif(
    external_cluster() is not None, reason="another cluster's Service families are its own"
)


def service(name: str, kind: str = "ClusterIP", pinned: str | None = None, **spec: Any) -> Obj:
    """A selectorless Service of ``kind``; ``pinned`` asks MetalLB for those addresses."""
    metadata: Obj = {"name": name}
    if pinned is not None:
        metadata["annotations"] = {METALLB_IPS_ANNOTATION: pinned}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {"type": kind, "ports": [{"name": "http", "port": 80, "protocol": "TCP"}], **spec},
    }


def families(created: Obj) -> tuple[str, list[str], list[str]]:
    spec = created["spec"]
    return spec["ipFamilyPolicy"], spec["ipFamilies"], spec["clusterIPs"]


def ingress(found: Obj | None) -> list[str]:
    entries = (((found or {}).get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
    return [str(entry.get("ip")) for entry in entries]


async def test_the_service_cidrs_are_dual_stack_with_ipv4_primary(kube: Kube) -> None:
    cidr = await kube.get(SERVICE_CIDRS.path(name=DEFAULT_SERVICE_CIDR))
    assert cidr is not None
    assert cidr["spec"]["cidrs"] == [str(SERVICE_CIDR_V4), str(SERVICE_CIDR_V6)]
    api = await kube.get(SERVICES.path("default", "kubernetes"))
    assert api is not None
    assert families(api) == ("SingleStack", ["IPv4"], [API_SERVICE_IP])


async def test_a_service_naming_no_family_is_single_stack_ipv4(kube: Kube, namespace: str) -> None:
    created = await kube.create(SERVICES.path(namespace), service("plain"))
    policy, ip_families, [cluster_ip] = families(created)
    assert (policy, ip_families) == ("SingleStack", ["IPv4"])
    assert ipaddress.ip_address(cluster_ip) in SERVICE_CIDR_V4


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param({"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv4", "IPv6"]}, id="require"),
        pytest.param({"ipFamilyPolicy": "PreferDualStack", "ipFamilies": ["IPv4", "IPv6"]}, id="prefer"),
        pytest.param({"ipFamilyPolicy": "RequireDualStack"}, id="require-primary-first"),
    ],
)
async def test_a_dual_stack_service_gets_two_cluster_ips_ipv4_first(
    kube: Kube, namespace: str, spec: Obj
) -> None:
    created = await kube.create(SERVICES.path(namespace), service("both", **spec))
    policy, ip_families, [v4, v6] = families(created)
    assert (policy, ip_families) == (spec["ipFamilyPolicy"], ["IPv4", "IPv6"])
    assert ipaddress.ip_address(v4) in SERVICE_CIDR_V4
    assert ipaddress.ip_address(v6) in SERVICE_CIDR_V6
    assert created["spec"]["clusterIP"] == v4


async def test_an_ipv6_only_service_gets_an_ipv6_cluster_ip(kube: Kube, namespace: str) -> None:
    created = await kube.create(SERVICES.path(namespace), service("six", ipFamilies=["IPv6"]))
    policy, ip_families, [cluster_ip] = families(created)
    assert (policy, ip_families) == ("SingleStack", ["IPv6"])
    assert ipaddress.ip_address(cluster_ip) in SERVICE_CIDR_V6


async def test_metallb_assigns_both_families_of_a_dual_pool(kube: Kube, namespace: str, lb: MetalLB) -> None:
    await declare_pool(kube, POOL, [POOL_V4, POOL_V6], lb.namespace)
    try:
        await lb.wait_for_pool(POOL)
        dual = service(
            "dual",
            "LoadBalancer",
            pinned=f"{DUAL_V4},{DUAL_V6}",
            ipFamilyPolicy="RequireDualStack",
            ipFamilies=["IPv4", "IPv6"],
        )
        six = service("six", "LoadBalancer", pinned=ONLY_V6, ipFamilies=["IPv6"])
        for body in (dual, six):
            await kube.create(SERVICES.path(namespace), body)
        # Both, in MetalLB's order, not the Service's families' (v0.15.2 sorts them as strings when
        # it compares them with the annotation: here IPv6 first), so compared as a set.
        both = await wait_for_object(
            kube,
            SERVICES,
            "dual",
            lambda s: set(ingress(s)) == {DUAL_V4, DUAL_V6} and len(ingress(s)) == 2,
            namespace=namespace,
            timeout=TIMEOUT,
            what=f"MetalLB's {DUAL_V4} and {DUAL_V6} on the dual-stack Service (log: {lb.log_path})",
        )
        assert both is not None
        assert families(both)[1] == ["IPv4", "IPv6"]
        await wait_for_object(
            kube,
            SERVICES,
            "six",
            lambda s: ingress(s) == [ONLY_V6],
            namespace=namespace,
            timeout=TIMEOUT,
            what=f"MetalLB's {ONLY_V6} on the IPv6 Service (log: {lb.log_path})",
        )
        await lb.wait_for_pool(POOL, assigned=3)
    finally:
        # The Services go before their pool, so MetalLB never sees an assigned address lose its pool.
        for name in ("dual", "six"):
            await kube.delete(SERVICES.path(namespace, name))
            await wait_for_object(kube, SERVICES, name, lambda s: s is None, namespace=namespace)
        await kube.delete(POOLS.path(lb.namespace, POOL))
        await wait_for_object(kube, POOLS, POOL, lambda p: p is None, namespace=lb.namespace)
