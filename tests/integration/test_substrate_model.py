"""The substrate model (``tests.support.substrate``) against the real API and real MetalLB.

On the session's shared control plane (the project defines none of the substrate's kinds), with the
substrate's three CRDs from ``tests/fixtures/address-substrate/`` and the session's MetalLB (the
model's driver renders the pools). The model writes what the substrate would; MetalLB alone assigns
``status.loadBalancer.ingress``. The module's namespace, classes, addresses and pools are removed at
its end (its classes draw from 192.0.2.0/24 and 2001:db8:100::/120, which no other test uses). One
test also runs the cozy-proxy model with its address-before-Endpoints race on a Service the
substrate pinned.

Dual: the local control plane's Service CIDR is IPv4 only, so the API refuses a dual-stack Service
(the test proves that refusal); Dual is proved on the claim's side: two addresses bound, an IPv6
``IPAddress`` named from its IP, and MetalLB loading the class's two-family pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Final

import pytest

from hack.metallb import MetalLB
from hack.substrate import pool_name
from shared.kube import ApiError, Kube, Obj
from shared.resources import ENDPOINTS, NAMESPACES, SERVICES
from tests.support.cozyproxy import DEFAULT_PROXY_NAME, PROXY_NAME_LABEL, cozy_proxy
from tests.support.ea_cluster import address_class_body, claim_body
from tests.support.loadbalancer import load_balancer
from tests.support.manifests import ROOT, apply_all, load
from tests.support.substrate import (
    ADDRESSES,
    CLAIM_ANNOTATION,
    CLAIM_PROTECTION_FINALIZER,
    CLAIMS,
    CLASSES,
    METALLB_IPS_ANNOTATION,
    METALLB_NAMESPACE,
    METALLB_PROVISIONER,
    POOLS,
    PROVISIONER_ANNOTATION,
    SubstrateModel,
    address_name,
    substrate,
)
from tests.support.waiting import wait_for_object

FIXTURES: Final = ROOT / "tests" / "fixtures" / "address-substrate"
NS: Final = "substrate-model-it"
# Every class this module creates (removed at its end).
MODULE_CLASSES: Final = ("public", "dual")
TIMEOUT: Final = 60.0
UNPROCESSABLE: Final = 422


@pytest.fixture(scope="module")
async def world(kube: Kube) -> AsyncIterator[tuple[Kube, SubstrateModel, MetalLB]]:
    await apply_all(kube, [doc for path in sorted(FIXTURES.glob("*.yaml")) for doc in load(path)])
    await kube.create(NAMESPACES.path(), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    async with load_balancer(kube) as balancer, substrate(kube) as model:
        try:
            yield kube, model, balancer
        finally:
            await _clean_up(kube)
    await kube.delete(NAMESPACES.path(name=NS))


async def _clean_up(kube: Kube) -> None:
    """The module's claims (the model still running, so their finalizers go), then its classes'
    addresses and the classes (the model deletes their pools: waited for)."""
    for claim in (await kube.list(CLAIMS.path(NS)))["items"]:
        await kube.delete(CLAIMS.path(NS, claim["metadata"]["name"]))
    for claim in (await kube.list(CLAIMS.path(NS)))["items"]:
        await wait_for_object(kube, CLAIMS, claim["metadata"]["name"], lambda c: c is None, namespace=NS)
    for address in (await kube.list(ADDRESSES.path()))["items"]:
        if address["spec"].get("className") in MODULE_CLASSES:
            await kube.delete(ADDRESSES.path(name=address["metadata"]["name"]))
    for name in MODULE_CLASSES:
        await kube.delete(CLASSES.path(name=name))
    for name in MODULE_CLASSES:
        await wait_for_object(
            kube, POOLS, pool_name(name), lambda p: p is None, namespace=METALLB_NAMESPACE, timeout=TIMEOUT
        )


def make_service(name: str, claim: str, **spec: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "annotations": {CLAIM_ANNOTATION: claim}},
        "spec": {"type": "LoadBalancer", "ports": [{"name": "http", "port": 80, "protocol": "TCP"}], **spec},
    }


def phase(obj: Obj | None) -> str | None:
    return ((obj or {}).get("status") or {}).get("phase")


def ingress(service: Obj | None) -> list[str]:
    found = (((service or {}).get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
    return [str(i.get("ip")) for i in found]


def associated_to(address: Obj | None) -> Obj | None:
    to: Obj | None = ((address or {}).get("status") or {}).get("associatedTo")
    return to


async def bound(kube: Kube, claim: str, count: int = 1) -> Obj:
    found = await wait_for_object(
        kube,
        CLAIMS,
        claim,
        lambda c: phase(c) == "Bound" and len((c or {})["status"].get("addresses") or []) == count,
        namespace=NS,
        timeout=TIMEOUT,
        what=f"claim {claim} Bound with {count} address(es)",
    )
    assert found is not None
    return found


async def test_a_default_class_serves_a_claim_and_its_service(
    world: tuple[Kube, SubstrateModel, MetalLB],
) -> None:
    kube, _, balancer = world
    await kube.create(CLASSES.path(), address_class_body("public", ["192.0.2.0/28"], default=True))
    await balancer.wait_for_pool(pool_name("public"))

    await kube.create(CLAIMS.path(NS), claim_body("c1"))
    claim = await bound(kube, "c1")
    [entry] = claim["status"]["addresses"]
    ip, name = entry["address"], entry["name"]
    assert (claim["status"]["className"], name) == ("public", address_name(ip))
    assert claim["metadata"]["annotations"][PROVISIONER_ANNOTATION] == METALLB_PROVISIONER
    assert CLAIM_PROTECTION_FINALIZER in claim["metadata"]["finalizers"]
    address = await kube.get(ADDRESSES.path(name=name))
    assert address is not None
    assert address["spec"]["claimRef"] == {"namespace": NS, "name": "c1", "uid": claim["metadata"]["uid"]}
    assert (address["spec"]["address"], phase(address)) == (ip, "Bound")

    # The annotated Service: the model pins the address, real MetalLB assigns it.
    await kube.create(SERVICES.path(NS), make_service("s1", "c1"))
    service = await wait_for_object(
        kube, SERVICES, "s1", lambda s: ingress(s) == [ip], namespace=NS, timeout=TIMEOUT, what="s1's address"
    )
    assert service is not None
    assert service["metadata"]["annotations"][METALLB_IPS_ANNOTATION] == ip
    await wait_for_object(
        kube,
        ADDRESSES,
        name,
        lambda a: associated_to(a) == {"kind": "Service", "namespace": NS, "name": "s1"},
        timeout=TIMEOUT,
        what="the address associated to s1",
    )

    # The Service goes: the address is associated to nothing, and still the claim's.
    await kube.delete(SERVICES.path(NS, "s1"))
    address = await wait_for_object(
        kube,
        ADDRESSES,
        name,
        lambda a: associated_to(a) is None,
        timeout=TIMEOUT,
        what="associatedTo cleared",
    )
    assert phase(address) == "Bound"
    assert phase(await kube.get(CLAIMS.path(NS, "c1"))) == "Bound"

    # The claim goes (Retain): the address stays, Released, its claimRef kept.
    await kube.delete(CLAIMS.path(NS, "c1"))
    await wait_for_object(kube, CLAIMS, "c1", lambda c: c is None, namespace=NS, timeout=TIMEOUT)
    address = await wait_for_object(
        kube, ADDRESSES, name, lambda a: phase(a) == "Released", timeout=TIMEOUT, what="the address Released"
    )
    assert address is not None
    assert address["spec"]["claimRef"]["name"] == "c1"


async def test_one_claim_serves_one_service_at_a_time(world: tuple[Kube, SubstrateModel, MetalLB]) -> None:
    kube, model, _ = world
    if await kube.get(CLASSES.path(name="public")) is None:  # run alone
        await kube.create(CLASSES.path(), address_class_body("public", ["192.0.2.0/28"], default=True))
    await kube.create(CLAIMS.path(NS), claim_body("c2", "public"))
    [entry] = (await bound(kube, "c2"))["status"]["addresses"]
    ip = entry["address"]
    await kube.create(SERVICES.path(NS), make_service("first", "c2"))
    await wait_for_object(
        kube, SERVICES, "first", lambda s: ingress(s) == [ip], namespace=NS, timeout=TIMEOUT
    )
    await kube.create(SERVICES.path(NS), make_service("second", "c2"))
    # The model has seen the second Service and decided: it is not the claim's while the first lives.
    await model.wait_for(lambda m: (NS, "second") in m.services and not m.plan(""), TIMEOUT, "second seen")
    second = await kube.get(SERVICES.path(NS, "second"))
    assert second is not None
    assert METALLB_IPS_ANNOTATION not in (second["metadata"].get("annotations") or {})
    assert ingress(second) == []

    await kube.delete(SERVICES.path(NS, "first"))
    await wait_for_object(
        kube, SERVICES, "second", lambda s: ingress(s) == [ip], namespace=NS, timeout=TIMEOUT
    )
    await wait_for_object(
        kube,
        ADDRESSES,
        entry["name"],
        lambda a: (associated_to(a) or {}).get("name") == "second",
        timeout=TIMEOUT,
        what="the address associated to the second Service",
    )


async def test_dual_binds_two_addresses(world: tuple[Kube, SubstrateModel, MetalLB]) -> None:
    kube, _, balancer = world
    await kube.create(
        CLASSES.path(), address_class_body("dual", ["2001:db8:100::/120", "192.0.2.16/28"], reclaim="Delete")
    )
    await balancer.wait_for_pool(pool_name("dual"))
    await kube.create(CLAIMS.path(NS), claim_body("d1", "dual", "Dual"))
    claim = await bound(kube, "d1", count=2)
    v4, v6 = claim["status"]["addresses"]
    assert (v4["address"], v6["address"]) == ("192.0.2.17", "2001:db8:100::1")
    assert v6["name"] == "2001-db8-100--1"
    for entry in (v4, v6):
        address = await kube.get(ADDRESSES.path(name=entry["name"]))
        assert phase(address) == "Bound"

    # This control plane serves IPv4 Services only: a dual-stack Service cannot exist here.
    with pytest.raises(ApiError) as refused:
        await kube.create(
            SERVICES.path(NS),
            make_service("dual", "d1", ipFamilyPolicy="RequireDualStack", ipFamilies=["IPv4", "IPv6"]),
        )
    assert refused.value.status == UNPROCESSABLE

    # Delete: the claim goes, and both addresses with it.
    await kube.delete(CLAIMS.path(NS, "d1"))
    for entry in (v4, v6):
        await wait_for_object(kube, ADDRESSES, entry["name"], lambda a: a is None, timeout=TIMEOUT)


async def test_cozy_proxy_race_on_a_pinned_address(world: tuple[Kube, SubstrateModel, MetalLB]) -> None:
    """The cozy-proxy model's address-before-Endpoints race (``race=True``) on real watches, made
    deterministic with a selectorless Service (no Endpoints until the test writes them): stuck with
    no backend, an Endpoints event programs nothing, an update of the Service programs it."""
    kube, _, _ = world
    if await kube.get(CLASSES.path(name="public")) is None:  # run alone
        await kube.create(CLASSES.path(), address_class_body("public", ["192.0.2.0/28"], default=True))
    await kube.create(CLAIMS.path(NS), claim_body("vm-ip", "public"))
    [entry] = (await bound(kube, "vm-ip"))["status"]["addresses"]
    ip, backend = entry["address"], "10.244.0.5"
    async with cozy_proxy(kube, NS, race=True) as proxy:
        service = make_service("vm", "vm-ip")
        service["metadata"]["labels"] = {PROXY_NAME_LABEL: DEFAULT_PROXY_NAME}
        service["spec"]["ports"] = [{"name": "ssh", "port": 22, "protocol": "TCP"}]
        await kube.create(SERVICES.path(NS), service)
        await wait_for_object(
            kube, SERVICES, "vm", lambda s: ingress(s) == [ip], namespace=NS, timeout=TIMEOUT
        )
        await proxy.wait_for(lambda m: (NS, "vm") in m.stuck, TIMEOUT, "the Service stuck with no backend")

        endpoints = {
            "apiVersion": "v1",
            "kind": "Endpoints",
            "metadata": {"name": "vm", "namespace": NS},
            "subsets": [
                {"addresses": [{"ip": backend}], "ports": [{"name": "ssh", "port": 22, "protocol": "TCP"}]}
            ],
        }
        await kube.create(ENDPOINTS.path(NS), endpoints)
        await proxy.wait_for(lambda m: (NS, "vm") in m.endpoints, TIMEOUT, "the Endpoints seen")
        assert proxy.reaches(ip) is None

        await kube.patch(
            SERVICES.path(NS, "vm"), {"metadata": {"annotations": {"example.com/touch": "1"}}}, "merge"
        )
        await proxy.wait_for(lambda m: m.reaches(ip) == backend, TIMEOUT, "the Service programmed again")
        assert proxy.stuck == set()


async def test_a_restarted_model_writes_nothing(world: tuple[Kube, SubstrateModel, MetalLB]) -> None:
    """Level-based: a second model (a restart of the substrate's controllers) over the world the first
    one made finds nothing to write."""
    kube, _, _ = world
    async with substrate(kube) as again:
        await asyncio.wait_for(again.synced.wait(), TIMEOUT)
        assert again.log == []
        assert len(again.claims) + len(again.addresses) > 0  # it did see a world
