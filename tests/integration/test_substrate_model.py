"""The address substrate's model against the real one: the same scenarios, the same answers.

Every scenario runs on the model lane (``harness/substrate.py``) and, when the real binaries
are named (``COZY_SUBSTRATE_BIN``, see ``hack/substrate.py``), on the real lane too, each on the
session's control plane with the substrate's real CRDs and the session's real MetalLB. A scenario
asserts only what the real substrate was seen to do (``harness/substrate.py``'s docstring
lists it), so a difference between the lanes is a failing test. The module's namespace, classes,
addresses and pools are removed at the end of each lane (its classes draw from 192.0.2.0/24 and
2001:db8:100::/56, which no other test uses).

One scenario also runs the cozy-proxy model with its address-before-Endpoints race on a Service the
substrate pinned; one, a restarted model, is the model's alone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Final

import pytest

from hack.metallb import MetalLB
from hack.substrate import PLACEHOLDER_NAMESPACE, Lane, bin_dir, pool_name
from harness.cozyproxy import DEFAULT_PROXY_NAME, PROXY_NAME_LABEL, cozy_proxy
from harness.ea_cluster import address_class_body, claim_body
from harness.lane import Substrate, address_substrate
from harness.loadbalancer import load_balancer
from harness.manifests import ROOT, apply_all, load
from harness.substrate import (
    ADDRESSES,
    CLAIM_ANNOTATION,
    CLAIM_PROTECTION_FINALIZER,
    CLAIMS,
    CLASSES,
    METALLB_IPS_ANNOTATION,
    METALLB_NAMESPACE,
    METALLB_PROVISIONER,
    PINNED_MARKER,
    POOLS,
    PROVISIONER_ANNOTATION,
    address_name,
    substrate,
)
from harness.waiting import eventually, wait_for_object
from shared.kube import Kube, Obj
from shared.resources import ENDPOINTS, NAMESPACES, SERVICES

FIXTURES: Final = ROOT / "tests" / "fixtures" / "address-substrate"
TIMEOUT: Final = 60.0
EVENTS: Final = "/api/v1/namespaces/{}/events"
LANES: Final[tuple[Lane, ...]] = ("model", "real")


@dataclass(frozen=True)
class World:
    """One lane's world: its namespace, its classes' names and ranges (per lane, so the lanes never
    share a pool), the substrate and MetalLB."""

    kube: Kube
    lane: Lane
    substrate: Substrate
    balancer: MetalLB

    @property
    def ns(self) -> str:
        return f"substrate-{self.lane}-it"

    def cls(self, name: str) -> str:
        return f"{name}-{self.lane}"

    def ip(self, offset: int) -> str:
        """An address of this lane's half of 192.0.2.0/24."""
        return f"192.0.2.{offset + (0 if self.lane == 'model' else 128)}"

    def cidr(self, offset: int, bits: int) -> str:
        return f"{self.ip(offset)}/{bits}"

    @property
    def v6(self) -> str:
        return "2001:db8:100:1::100" if self.lane == "model" else "2001:db8:100:2::100"


@pytest.fixture(scope="module", params=LANES)
async def w(kube: Kube, request: pytest.FixtureRequest) -> AsyncIterator[World]:
    on: Lane = request.param
    if on == "real" and bin_dir() is None:
        pytest.skip("the real substrate's binaries are not named (COZY_SUBSTRATE_BIN)")
    await apply_all(kube, [doc for path in sorted(FIXTURES.glob("*.yaml")) for doc in load(path)])
    async with load_balancer(kube) as balancer, address_substrate(kube, on=on) as running:
        made = World(kube, on, running, balancer)
        await kube.create(
            NAMESPACES.path(), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": made.ns}}
        )
        try:
            yield made
        finally:
            await _clean_up(made)
    await kube.delete(NAMESPACES.path(name=made.ns))


async def _clean_up(w: World) -> None:
    """The lane's Services and claims (its substrate still running, so their finalizers go), then its
    classes' addresses, the classes and their pools."""
    kube, ns = w.kube, w.ns
    for service in (await kube.list(SERVICES.path(ns)))["items"]:
        await kube.delete(SERVICES.path(ns, service["metadata"]["name"]))
    for claim in (await kube.list(CLAIMS.path(ns)))["items"]:
        await kube.delete(CLAIMS.path(ns, claim["metadata"]["name"]))
    for claim in (await kube.list(CLAIMS.path(ns)))["items"]:
        await wait_for_object(kube, CLAIMS, claim["metadata"]["name"], lambda c: c is None, namespace=ns)
    classes = [c["metadata"]["name"] for c in (await kube.list(CLASSES.path()))["items"]]
    mine = [c for c in classes if c.endswith(f"-{w.lane}")]
    for address in (await kube.list(ADDRESSES.path()))["items"]:
        if address["spec"].get("className") in mine:
            await kube.delete(ADDRESSES.path(name=address["metadata"]["name"]))
    for name in mine:
        await kube.delete(CLASSES.path(name=name))
    for name in mine:
        await wait_for_object(kube, CLASSES, name, lambda c: c is None, timeout=TIMEOUT)
        await kube.delete(POOLS.path(METALLB_NAMESPACE, pool_name(name)))  # as the collector would


def make_service(name: str, claim: str, **spec: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "annotations": {CLAIM_ANNOTATION: claim}},
        "spec": {"type": "LoadBalancer", "ports": [{"name": "http", "port": 80, "protocol": "TCP"}], **spec},
    }


def phase(obj: Obj | None) -> str | None:
    return ((obj or {}).get("status") or {}).get("phase")


def ingress(service: Obj | None) -> set[str]:
    found = (((service or {}).get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
    return {str(i.get("ip")) for i in found}


def associated_to(address: Obj | None) -> Obj | None:
    to: Obj | None = ((address or {}).get("status") or {}).get("associatedTo")
    return to


def pin(service: Obj | None) -> tuple[str | None, str | None]:
    annotations = ((service or {}).get("metadata") or {}).get("annotations") or {}
    return annotations.get(METALLB_IPS_ANNOTATION), annotations.get(PINNED_MARKER)


def condition(obj: Obj | None, type_: str) -> tuple[str, str]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return str(c.get("status")), str(c.get("reason"))
    return "", ""


async def make_class(w: World, name: str, *cidrs: str, **options: Any) -> str:
    """The lane's class ``name`` from ``cidrs``, once MetalLB loaded its pool; returns its name."""
    full = w.cls(name)
    await w.kube.create(CLASSES.path(), address_class_body(full, list(cidrs), **options))
    await w.balancer.wait_for_pool(pool_name(full))
    return full


async def bound(w: World, claim: str, count: int = 1) -> Obj:
    found = await wait_for_object(
        w.kube,
        CLAIMS,
        claim,
        lambda c: phase(c) == "Bound" and len((c or {})["status"].get("addresses") or []) == count,
        namespace=w.ns,
        timeout=TIMEOUT,
        what=f"claim {claim} Bound with {count} address(es)",
    )
    assert found is not None
    return found


async def served(w: World, service: str, addresses: set[str]) -> Obj:
    found = await wait_for_object(
        w.kube,
        SERVICES,
        service,
        lambda s: ingress(s) == addresses,
        namespace=w.ns,
        timeout=TIMEOUT,
        what=f"{service}'s ingress {addresses}",
    )
    assert found is not None
    return found


async def associated(w: World, address: str, service: str | None) -> Obj:
    wanted = {"kind": "Service", "namespace": w.ns, "name": service} if service else None
    found = await wait_for_object(
        w.kube,
        ADDRESSES,
        address,
        lambda a: associated_to(a) == wanted,
        timeout=TIMEOUT,
        what=f"{address} -> {service}",
    )
    assert found is not None
    return found


async def held_by_placeholder(w: World, ip: str) -> str:
    """The name of the driver's placeholder Service pinning ``ip`` (waited for)."""

    async def find() -> str | None:
        for service in (await w.kube.list(SERVICES.path(PLACEHOLDER_NAMESPACE)))["items"]:
            if pin(service)[0] == ip and not service["metadata"].get("deletionTimestamp"):
                return str(service["metadata"]["name"])
        return None

    return await eventually(find, timeout=TIMEOUT, what=f"a placeholder holding {ip}")


# --- the scenarios ----------------------------------------------------------------------------------


async def test_a_claim_of_the_default_class_binds_and_is_held_by_its_placeholder(w: World) -> None:
    """Without an Available address: the first address of the range (the network's own), named
    ``ip-<ip>``, provisioned under a placeholder named after the claim's UID; the core's stamp and
    finalizer; the address Bound with the claim's UID."""
    public = await make_class(w, "public", w.cidr(0, 28), default=True)
    await w.kube.create(CLAIMS.path(w.ns), claim_body("c1"))
    claim = await bound(w, "c1")
    [entry] = claim["status"]["addresses"]
    ip, name = entry["address"], entry["name"]
    assert (claim["status"]["className"], ip, name) == (public, w.ip(0), address_name(w.ip(0)))
    assert claim["metadata"]["annotations"][PROVISIONER_ANNOTATION] == METALLB_PROVISIONER
    assert CLAIM_PROTECTION_FINALIZER in claim["metadata"]["finalizers"]
    assert condition(claim, "ClassResolved") == ("True", "Resolved")
    assert condition(claim, "Bound") == ("True", "Bound")
    # The real core may say the claim is Bound a moment before the address's own phase does.
    address = await wait_for_object(w.kube, ADDRESSES, name, lambda a: phase(a) == "Bound", timeout=TIMEOUT)
    assert address is not None
    assert address["spec"]["claimRef"] == {"namespace": w.ns, "name": "c1", "uid": claim["metadata"]["uid"]}
    assert (address["spec"]["address"], phase(address), associated_to(address)) == (ip, "Bound", None)
    assert await held_by_placeholder(w, ip) == f"iad-{claim['metadata']['uid']}-v4"


async def test_the_pin_detach_and_re_hold(w: World) -> None:
    """A Service naming the claim: associated, its placeholder gone, one Update adding the pin and
    the marker, MetalLB's answer. Deleted: associated to nothing, re-held by ``iad-<address>``; a new
    Service gets the same address."""
    await make_class(w, "pin", w.cidr(16, 28))
    await w.kube.create(CLAIMS.path(w.ns), claim_body("c2", w.cls("pin")))
    [entry] = (await bound(w, "c2"))["status"]["addresses"]
    ip, name = entry["address"], entry["name"]
    await w.kube.create(SERVICES.path(w.ns), make_service("s1", "c2"))
    service = await served(w, "s1", {ip})
    assert pin(service) == (ip, "true")
    await associated(w, name, "s1")
    assert [
        p for p in (await w.kube.list(SERVICES.path(PLACEHOLDER_NAMESPACE)))["items"] if pin(p)[0] == ip
    ] == []

    await w.kube.delete(SERVICES.path(w.ns, "s1"))
    address = await associated(w, name, None)
    assert phase(address) == "Bound"
    assert await held_by_placeholder(w, ip) == f"iad-{name}"
    await w.kube.create(SERVICES.path(w.ns), make_service("s2", "c2"))
    await served(w, "s2", {ip})


async def test_one_claim_serves_one_service_at_a_time(w: World) -> None:
    """A second Service naming a held claim is never pinned while the first lives; once the first
    goes, it takes the address over."""
    await make_class(w, "one", w.cidr(32, 28))
    await w.kube.create(CLAIMS.path(w.ns), claim_body("c3", w.cls("one")))
    [entry] = (await bound(w, "c3"))["status"]["addresses"]
    ip = entry["address"]
    await w.kube.create(SERVICES.path(w.ns), make_service("first", "c3"))
    await served(w, "first", {ip})
    seen: list[Obj] = []
    async with _recording(w.kube, w.ns, "second", seen):
        await w.kube.create(SERVICES.path(w.ns), make_service("second", "c3"))
        await _second_judged(w, "second")
        await w.kube.delete(SERVICES.path(w.ns, "first"))
        await served(w, "second", {ip})
    before_takeover = [s for s in seen if not ingress(s)]
    assert before_takeover, seen
    first_pin = next(i for i, s in enumerate(seen) if pin(s)[0] is not None)
    assert all(pin(s) == (None, None) for s in seen[:first_pin]), seen
    await associated(w, entry["name"], "second")


async def test_a_claim_deleted_under_retain_and_delete(w: World) -> None:
    """Retain: the claim goes at once, its address Released (claimRef and association kept) and the
    Service keeps its pin and address; the Service gone, a placeholder re-holds the address. Delete:
    the address goes."""
    await make_class(w, "keep", w.cidr(48, 28))
    await w.kube.create(CLAIMS.path(w.ns), claim_body("r1", w.cls("keep")))
    [entry] = (await bound(w, "r1"))["status"]["addresses"]
    ip, name = entry["address"], entry["name"]
    await w.kube.create(SERVICES.path(w.ns), make_service("rs", "r1"))
    await served(w, "rs", {ip})
    await w.kube.delete(CLAIMS.path(w.ns, "r1"))
    await wait_for_object(w.kube, CLAIMS, "r1", lambda c: c is None, namespace=w.ns, timeout=TIMEOUT)
    address = await wait_for_object(
        w.kube, ADDRESSES, name, lambda a: phase(a) == "Released", timeout=TIMEOUT
    )
    assert address is not None
    assert address["spec"]["claimRef"]["name"] == "r1"
    assert associated_to(address) == {"kind": "Service", "namespace": w.ns, "name": "rs"}
    service = await w.kube.get(SERVICES.path(w.ns, "rs"))
    assert (pin(service), ingress(service)) == ((ip, "true"), {ip})
    await w.kube.delete(SERVICES.path(w.ns, "rs"))
    await associated(w, name, None)
    assert await held_by_placeholder(w, ip) == f"iad-{name}"

    await make_class(w, "drop", w.cidr(64, 28), reclaim="Delete")
    await w.kube.create(CLAIMS.path(w.ns), claim_body("d1", w.cls("drop")))
    [entry] = (await bound(w, "d1"))["status"]["addresses"]
    await w.kube.create(SERVICES.path(w.ns), make_service("ds", "d1"))
    await served(w, "ds", {entry["address"]})
    await w.kube.delete(CLAIMS.path(w.ns, "d1"))
    await wait_for_object(w.kube, ADDRESSES, entry["name"], lambda a: a is None, timeout=TIMEOUT)
    # (The real driver then unpins the Service, but races its own re-pin: seen to end either way.)


async def test_an_exhausted_class_and_an_available_address(w: World) -> None:
    """A /30 holds four addresses: the fifth claim stays Pending (WaitingForProvisioning). A Released
    address whose claimRef a hoster cleared is Available, and a new claim binds it straight away."""
    small = await make_class(w, "small", w.cidr(80, 30))
    for name in ("e1", "e2", "e3", "e4", "e5"):
        await w.kube.create(CLAIMS.path(w.ns), claim_body(name, small))
    ips = {(await bound(w, name))["status"]["addresses"][0]["address"] for name in ("e1", "e2", "e3", "e4")}
    assert len(ips) == 4
    pending = await wait_for_object(
        w.kube,
        CLAIMS,
        "e5",
        lambda c: condition(c, "Bound") == ("False", "WaitingForProvisioning"),
        namespace=w.ns,
        timeout=TIMEOUT,
    )
    assert phase(pending) in (None, "Pending")

    await make_class(w, "again", w.cidr(96, 29))
    await w.kube.create(CLAIMS.path(w.ns), claim_body("a1", w.cls("again")))
    [entry] = (await bound(w, "a1"))["status"]["addresses"]
    await w.kube.delete(CLAIMS.path(w.ns, "a1"))
    await wait_for_object(w.kube, ADDRESSES, entry["name"], lambda a: phase(a) == "Released", timeout=TIMEOUT)
    await w.kube.patch(ADDRESSES.path(name=entry["name"]), {"spec": {"claimRef": None}}, "merge")
    await wait_for_object(
        w.kube, ADDRESSES, entry["name"], lambda a: phase(a) == "Available", timeout=TIMEOUT
    )
    await w.kube.create(CLAIMS.path(w.ns), claim_body("a2", w.cls("again")))
    claim = await bound(w, "a2")
    assert claim["status"]["addresses"] == [entry]


async def test_dual_binds_two_addresses_and_a_dual_stack_service_gets_both(w: World) -> None:
    await make_class(w, "dual", f"{w.v6}/120", w.cidr(112, 28), reclaim="Delete")
    await w.kube.create(CLAIMS.path(w.ns), claim_body("d2", w.cls("dual"), "Dual"))
    v4, v6 = (await bound(w, "d2", count=2))["status"]["addresses"]
    assert (v4["address"], v6["address"]) == (w.ip(112), w.v6)
    assert v6["name"] == address_name(w.v6)
    service = make_service("both", "d2", ipFamilyPolicy="RequireDualStack", ipFamilies=["IPv4", "IPv6"])
    await w.kube.create(SERVICES.path(w.ns), service)
    await served(w, "both", {v4["address"], v6["address"]})
    await w.kube.delete(SERVICES.path(w.ns, "both"))
    await w.kube.delete(CLAIMS.path(w.ns, "d2"))
    for entry in (v4, v6):
        await wait_for_object(w.kube, ADDRESSES, entry["name"], lambda a: a is None, timeout=TIMEOUT)


async def test_cozy_proxy_race_on_a_pinned_address(w: World) -> None:
    """The cozy-proxy model's address-before-Endpoints race (``race=True``) on real watches, made
    deterministic with a selectorless Service (no Endpoints until the test writes them): stuck with
    no backend, an Endpoints event programs nothing, an update of the Service programs it."""
    vm = await make_class(w, "vmip", w.cidr(104, 29))
    await w.kube.create(CLAIMS.path(w.ns), claim_body("vm-ip", vm))
    [entry] = (await bound(w, "vm-ip"))["status"]["addresses"]
    ip, backend = entry["address"], "10.244.0.5"
    async with cozy_proxy(w.kube, w.ns, race=True) as proxy:
        service = make_service("vm", "vm-ip")
        service["metadata"]["labels"] = {PROXY_NAME_LABEL: DEFAULT_PROXY_NAME}
        service["spec"]["ports"] = [{"name": "ssh", "port": 22, "protocol": "TCP"}]
        await w.kube.create(SERVICES.path(w.ns), service)
        await served(w, "vm", {ip})
        await proxy.wait_for(lambda m: (w.ns, "vm") in m.stuck, TIMEOUT, "the Service stuck with no backend")
        endpoints = {
            "apiVersion": "v1",
            "kind": "Endpoints",
            "metadata": {"name": "vm", "namespace": w.ns},
            "subsets": [
                {"addresses": [{"ip": backend}], "ports": [{"name": "ssh", "port": 22, "protocol": "TCP"}]}
            ],
        }
        await w.kube.create(ENDPOINTS.path(w.ns), endpoints)
        await proxy.wait_for(lambda m: (w.ns, "vm") in m.endpoints, TIMEOUT, "the Endpoints seen")
        assert proxy.reaches(ip) is None
        await w.kube.patch(
            SERVICES.path(w.ns, "vm"), {"metadata": {"annotations": {"example.com/touch": "1"}}}, "merge"
        )
        await proxy.wait_for(lambda m: m.reaches(ip) == backend, TIMEOUT, "the Service programmed again")
        assert proxy.stuck == set()


async def test_a_restarted_model_writes_nothing(w: World) -> None:
    """Level-based: a second model (a restart of the substrate's controllers) over the world the first
    one made finds nothing to write. The model's own property."""
    if w.substrate.model is None:
        pytest.skip("the model's property")
    await w.substrate.settled()
    async with substrate(w.kube) as again:
        await asyncio.wait_for(again.synced.wait(), TIMEOUT)
        assert again.log == []
        assert len(again.claims) + len(again.addresses) > 0  # it did see a world


# --- helpers of the one-Service scenario -------------------------------------------------------------


@contextlib.asynccontextmanager
async def _recording(kube: Kube, namespace: str, name: str, seen: list[Obj]) -> AsyncIterator[None]:
    """Every version of Service ``name`` from its creation on, in order, while open."""
    listing = await kube.list(SERVICES.path(namespace))
    version = listing["metadata"]["resourceVersion"]

    async def follow() -> None:
        events = kube.watch(
            SERVICES.path(namespace), resource_version=version, field_selector=f"metadata.name={name}"
        )
        async with contextlib.aclosing(events):
            async for kind, obj in events:
                if kind in ("ADDED", "MODIFIED"):
                    seen.append(obj)

    task = asyncio.create_task(follow())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _second_judged(w: World, service: str) -> None:
    """Until the substrate decided about a second Service naming a held claim: the model's plan is
    empty; the real driver records AssociationRejected on it."""
    if w.substrate.model is not None:
        await w.substrate.settled()
        return

    async def rejected() -> bool:
        events = (await w.kube.list(EVENTS.format(w.ns)))["items"]
        return any(
            e.get("reason") == "AssociationRejected"
            and (e.get("involvedObject") or {}).get("name") == service
            for e in events
        )

    await eventually(rejected, timeout=TIMEOUT, what=f"the driver's AssociationRejected on {service}")
