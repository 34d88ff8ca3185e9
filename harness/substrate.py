"""A model of Cozystack's address substrate, for tests: its core controller and its MetalLB driver.

The substrate (``IPAddressClass`` / ``IPAddress`` / ``IPAddressClaim`` in ``local.sdn.cozystack.io/
v1alpha1``; its CRDs are in ``tests/fixtures/address-substrate/``, whose README says what each field
means) is a platform component the EndpointAttachment operator consumes. Its controllers cannot be
built here, so the tests run this model of their published contract, driven by watches of the real
API and writing what the real controllers would write, through the real API.

It answers as the real substrate was observed to answer on a real control plane over real MetalLB;
where a rule below was not observed, it says so.

Decides (the core):
- a claim's class: ``spec.className``, else the one class annotated ``DEFAULT_CLASS_ANNOTATION:
  "true"`` (none: ``NoDefaultClass``; two or more: ``MultipleDefaultClasses``, never a guess; a named
  class missing: ``ClassNotFound``). Once resolved, ``status.className`` sticks: a later default or
  a deleted class never moves a claim (the ``ClassResolved`` condition still says whether that class
  exists now). ``ClassResolved`` True reads ``resolved to IPAddressClass "<class>"``, as observed;
  the other conditions' messages are the model's own.
- the provisioner stamp ``PROVISIONER_ANNOTATION: <class's spec.provisioner>`` on a claim once its
  class resolves, written as an **annotation**: the fixtures' README says only that the core
  "stamps" it, and the pattern it names (a PersistentVolumeClaim's
  ``volume.kubernetes.io/storage-provisioner``) stamps an annotation.
- the finalizer ``CLAIM_PROTECTION_FINALIZER`` on every live claim, removed once its addresses are
  reclaimed: the pass after the claim is marked deleted (it waits for no Service naming the claim).
- matching: for each family a live ``Pending`` (or new) claim lacks, an ``Available`` address of its
  resolved class and that family (any provisioner; in name order, none to two claims) gets
  ``spec.claimRef {namespace, name, uid}``; in the same pass the claim counts it, so it goes
  straight to ``Bound`` (no ``Pending`` written) and nothing is provisioned for that family.
- binding: an ``IPAddress``'s ``status.phase`` is ``Bound`` while the claim its ``claimRef`` names
  (by UID) lives, ``Available`` with no ``claimRef``, ``Released`` once that claim is being deleted
  or gone (``Retain``). A ``claimRef`` without a UID naming a live claim gets the claim's UID (the
  driver sets one itself; other writers are not observed). The claim's ``status.addresses`` lists
  ``{name, address}`` for each address bound to it (IPv4 first); ``status.phase`` is ``Bound`` once
  every family it asks for has one (``Dual``: two), ``Pending`` before (an exhausted class:
  ``Bound`` False ``WaitingForProvisioning``, as observed), ``Lost`` (sticky; not observed) when an
  address it had bound is gone.
- reclaim: a claim being deleted leaves its ``Retain`` addresses ``Released`` (``claimRef`` kept:
  never matched again until a hoster clears it, which makes the address ``Available``) and deletes
  its ``Delete`` addresses; then its finalizer goes.

Decides (the MetalLB driver, ``METALLB_PROVISIONER``; only classes naming it):
- one MetalLB ``IPAddressPool`` (``autoAssign: false``, ``avoidBuggyIPs: false``) and one
  ``L2Advertisement`` per class, both named ``iad-<class>`` in MetalLB's namespace, labelled
  ``MANAGED_BY_LABEL`` (the model's label: only those are ever changed or deleted); the pool holds
  the class's ``spec.parameters.addresses`` (CIDRs).
- names: an ``IPAddress`` is named ``address_name(ip)``: ``ip-`` and the IPv4 with ``-`` for ``.``
  (observed: ``192.0.2.0`` is ``ip-192-0-2-0``). IPv6 is a guess (not observed): ``ip-`` and the
  compressed form with ``-`` for ``:``, the exploded form when the compressed one ends in ``:``.
- provisioning, for a stamped ``Pending`` claim of its class, one address per family it still lacks
  after the core's matches: first the placeholder ``iad-<claim uid>-v4`` (``-v6``: a guess) in
  ``PLACEHOLDER_NAMESPACE``, a selectorless single-stack LoadBalancer Service annotated
  ``POOL_ANNOTATION: iad-<class>`` and ``METALLB_IPS_ANNOTATION: <ip>``, then the ``IPAddress`` of
  that IP with ``spec.claimRef {namespace, name, uid}``, ``spec.address``, ``spec.className``, the
  class's ``spec.reclaimPolicy`` and ``spec.source.fromClass: {}``. The IP is the first address of
  the class's CIDRs of that family in the order listed, the network's own and the broadcast
  address included (as MetalLB hands them out with ``avoidBuggyIPs: false``: a /30 holds four; the
  IPv6 network's own address too, not observed), whose ``IPAddress`` name is not taken and that no
  placeholder holds. The ``IPAddress`` create is the lock: a 409 marks the name taken
  (``on_conflict``) and the next pass re-pins the claim's placeholder (an Update) to the next IP;
  a placeholder already holding a free IP is kept and only the address is created.
- placeholders: an address of the driver's that no Service uses stays held by the placeholder that
  holds it (the provisioning one is never renamed, even once the claim is gone under ``Retain``),
  else by a new ``iad-<IPAddress name>``. A placeholder holding an address that a Service now uses
  is deleted, and one holding no address (gone, or deleted by the core in this plan) is deleted
  unless provisioning uses it in this plan.
- pinning: of the live Services in a Bound claim's namespace annotated ``CLAIM_ANNOTATION: <claim>``,
  ONE is the claim's: the one its addresses' ``status.associatedTo`` already names, else the oldest
  (creation time, then name). In this order, as observed: each address's ``status.associatedTo
  {kind: Service, namespace, name}``, then the delete of every placeholder holding it, then ONE plain
  Update (``Write`` verb ``update``: the whole cached Service behind its resourceVersion) adding
  ``METALLB_IPS_ANNOTATION`` (comma-separated, IPv4 first, for ``Dual``: not observed) and
  ``PINNED_MARKER: "true"``. Nothing is written to a second Service naming the claim while the
  first lives. Any Service naming a claim that is not its claim's Service loses a pin or marker it
  carries (observed only for the Service of a claim gone under ``Delete``; a Service holding a
  ``Released`` address keeps its pin, below). When the
  claim's Service goes, ``associatedTo`` is cleared and ``iad-<IPAddress name>`` re-holds the
  address; a later Service naming the claim gets the same address. If another Service names the
  claim then, it becomes the claim's in the same plan (association, pin): the model skips the
  ``iad-<IPAddress name>`` placeholder the real driver creates and deletes in between. A Service
  that drops the annotation or names another claim is treated as gone, and the pin the driver
  wrote on it removed (not observed).
- ``Released`` (``Retain``) addresses: from the pass the claim is marked deleted, ``associatedTo``
  stays on the live Service it names, which keeps its pin and address; once that Service goes,
  ``associatedTo`` is cleared and ``iad-<IPAddress name>`` re-holds it. (Not observed: when that
  Service is meanwhile a live claim's, a claim of the same name created again, that claim wins and
  the Released address is re-held.) A ``Delete`` address goes with its placeholders, and the
  Service that used it loses both annotations.

Does not: write a Service's status (real MetalLB assigns the pinned address to
``status.loadBalancer.ingress``); let MetalLB choose an IP (the real driver creates its placeholder
unpinned and pins it once an IP is chosen; the model chooses and creates it pinned, and knows of no
IP held in MetalLB's books but by its own placeholders), so it never shows the real driver's worst
cases: MetalLB giving a hand-over's freed address to a claim being provisioned (``LedgerMismatch``,
the pin refused, MetalLB's and the driver's backoff: a burst of claims is fast on the model lane
only), a ``Delete`` unpin racing the driver's own re-pin, or an IPv6 address ending in ``::`` whose
``ip-...--`` name no label may carry (the real claim stays Pending; the model names it exploded);
model the address finalizers (addresses
are deleted outright), ``spec.addressName`` pre-binding, static (``providerRef``) addresses, the
``Conflict`` phase, or the substrate's own admission.

Shape: both controllers are one controller declared on the project's runtime (``shared/runtime``):
``wiring`` has one key for the whole substrate (``MODEL_KEY``: every change of a class, the primary
kind, and of a claim, an address, a Service or a rendered MetalLB object wakes it, as each real
controller answers an event from the whole world it caches) and a ``Cache`` per kind, kept as
listed (``managedFields`` too: a pin's Update sends the cached Service whole). The model reads the
runtime's stores (``stores``); ``plan(now)`` is pure and returns the writes both controllers would
make (``Write``, data); ``SubstrateController.reconcile`` plans and applies one plan, each answer
handed to its informer by the runtime's ``Writer`` (write-through), and asks the runtime to decide
again until a plan is empty. ``substrate`` runs it on a ``Manager`` of its own (no leader election;
no pass before every kind listed once). Unit tests feed the stores with ``on_event`` (as an
informer would) and drive ``plan``/``on_conflict`` without a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence, ValuesView
from dataclasses import dataclass, field
from datetime import UTC, datetime
from operator import itemgetter
from typing import Any, Final, Literal

from opentelemetry.trace import NoOpTracerProvider
from prometheus_client import CollectorRegistry

from hack.substrate import PLACEHOLDER_NAMESPACE, pool_name
from harness.following import cancel_all, notify, object_key, wait_until
from shared.conditions import FALSE, TRUE, Condition, render, rfc3339, same_condition
from shared.kube import ApiError, Kube, Obj
from shared.resources import SERVICES, Resource
from shared.runtime import controller as runtime
from shared.runtime.cache import Store
from shared.runtime.controller import Cache, Caches, Conflict, Result, Watch, Wiring
from shared.runtime.manager import Manager
from shared.runtime.reads import Reads
from shared.runtime.writes import Writer
from shared.telemetry.tracing import Tracing

API_VERSION: Final = "local.sdn.cozystack.io/v1alpha1"
CLASSES: Final = Resource(API_VERSION, "ipaddressclasses", namespaced=False)
ADDRESSES: Final = Resource(API_VERSION, "ipaddresses", namespaced=False)
CLAIMS: Final = Resource(API_VERSION, "ipaddressclaims")
POOLS: Final = Resource("metallb.io/v1beta1", "ipaddresspools")
L2_ADVERTISEMENTS: Final = Resource("metallb.io/v1beta1", "l2advertisements")
# Every kind the model reads, one store each (MetalLB's only in its namespace).
KINDS: Final = (CLASSES, CLAIMS, ADDRESSES, SERVICES, POOLS, L2_ADVERTISEMENTS)

# The published annotation marking the class of claims that name none.
DEFAULT_CLASS_ANNOTATION: Final = "ipaddressclass.local.sdn.cozystack.io/is-default-class"
# The core's stamp on a resolved claim naming the driver that serves it (an annotation: see above).
PROVISIONER_ANNOTATION: Final = "local.sdn.cozystack.io/provisioner"
# The core's finalizer on every claim: its addresses are reclaimed before the claim goes.
CLAIM_PROTECTION_FINALIZER: Final = "local.sdn.cozystack.io/claim-protection"
# The annotation by which a Service asks the driver for the addresses of a claim in its namespace.
CLAIM_ANNOTATION: Final = "local.sdn.cozystack.io/ip-address-claim"
# MetalLB's own annotation naming the addresses a Service must get (comma-separated for two families).
METALLB_IPS_ANNOTATION: Final = "metallb.io/loadBalancerIPs"
# MetalLB's annotation naming the pool a Service's address comes from (on the driver's placeholders).
POOL_ANNOTATION: Final = "metallb.io/address-pool"
# The driver's placeholders are named with this prefix, after the address (or the claim's UID).
PLACEHOLDER_PREFIX: Final = "iad-"
PLACEHOLDER_PORT: Final = 1
# The driver's marker, written with the pin in the same Update.
PINNED_MARKER: Final = "metallb.drivers.local.sdn.cozystack.io/pinned"
# The MetalLB driver's published provisioner name: classes naming it are the driver's.
METALLB_PROVISIONER: Final = "metallb.drivers.local.sdn.cozystack.io"
# The MetalLB objects the driver rendered carry this label; it never touches one without it.
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "substrate-metallb-driver-model"
# Where MetalLB reads its configuration (hack/metallb.py runs it with this namespace).
METALLB_NAMESPACE: Final = "metallb-system"
FIELD_MANAGER: Final = "substrate-model"

# The claim's condition types and reasons, as the substrate publishes them.
CLASS_RESOLVED: Final = "ClassResolved"
BOUND: Final = "Bound"
REASON_RESOLVED: Final = "Resolved"
REASON_CLASS_NOT_FOUND: Final = "ClassNotFound"
REASON_NO_DEFAULT_CLASS: Final = "NoDefaultClass"
REASON_MULTIPLE_DEFAULT_CLASSES: Final = "MultipleDefaultClasses"
REASON_BOUND: Final = "Bound"
REASON_WAITING_FOR_PROVISIONING: Final = "WaitingForProvisioning"
REASON_ADDRESS_LOST: Final = "AddressLost"

# Phases (claims: Pending | Bound | Lost; addresses: the core's Available | Bound | Released).
PENDING: Final = "Pending"
LOST: Final = "Lost"
AVAILABLE: Final = "Available"
RELEASED: Final = "Released"
RETAIN: Final = "Retain"
DELETE: Final = "Delete"
IPV4: Final = "IPv4"
IPV6: Final = "IPv6"
DUAL: Final = "Dual"
FAMILIES: Final[Mapping[str, tuple[int, ...]]] = {IPV4: (4,), IPV6: (6,), DUAL: (4, 6)}

# The API's answer to a create whose name exists (and to a write behind a stale resourceVersion).
CONFLICT: Final = 409
# Before re-planning after a failed write.
RETRY_SECONDS: Final = 0.5
# A plan applied this many times in a row without settling is a bug in the model, not a world.
MAX_PASSES: Final = 20
# The controller's name (its queue's, its metrics'), and the one key every change wakes.
CONTROLLER_NAME: Final = "substrate-model"
MODEL_KEY: Final = ("", "substrate")

Key = tuple[str, str]
Verb = Literal["create", "patch", "update", "status", "apply", "delete"]


@dataclass(frozen=True)
class Write:
    """One request the substrate's controllers would send (``patch``/``status``: a merge patch;
    ``update``: a plain Update of the whole object, behind its resourceVersion)."""

    verb: Verb
    resource: Resource
    name: str
    namespace: str | None = None
    body: Obj | None = None
    why: str = ""

    def path(self) -> str:
        if self.verb == "create":
            return self.resource.path(self.namespace)
        path = self.resource.path(self.namespace, self.name)
        return f"{path}/status" if self.verb == "status" else path


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


_key = object_key


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return _meta(obj).get("annotations") or {}


def _deleting(obj: Mapping[str, Any]) -> bool:
    return bool(_meta(obj).get("deletionTimestamp"))


def _older(new: Mapping[str, Any], cached: Mapping[str, Any] | None) -> bool:
    """Whether ``new`` is an older version of the cached object (etcd's resourceVersions are
    integers; anything else counts as not older)."""
    if cached is None or _meta(new).get("uid") != _meta(cached).get("uid"):
        return False
    try:
        return int(_meta(new).get("resourceVersion") or 0) < int(_meta(cached).get("resourceVersion") or 0)
    except ValueError:
        return False


def address_name(ip: str) -> str:
    """The ``IPAddress`` name for an IP, as the driver names it: ``ip-`` and the IP with ``-`` for
    ``.`` (IPv4) or ``:`` (IPv6, compressed; exploded when the compressed form would end in ``-``)."""
    parsed = ipaddress.ip_address(ip)
    if parsed.version == 4:
        return "ip-" + str(parsed).replace(".", "-")
    text = parsed.compressed
    if text.endswith(":"):
        text = parsed.exploded
    return "ip-" + text.replace(":", "-")


def _pinned(service: Mapping[str, Any]) -> list[str]:
    """The IPs a Service's ``METALLB_IPS_ANNOTATION`` names."""
    return [ip for ip in (_annotations(service).get(METALLB_IPS_ANNOTATION) or "").split(",") if ip]


def _family(ip: str) -> int:
    return ipaddress.ip_address(ip).version


def _address_sort_key(entry: Mapping[str, Any]) -> tuple[int, str]:
    return _family(str(entry["address"])), str(entry["name"])


def class_cidrs(address_class: Mapping[str, Any]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """The class's ``spec.parameters.addresses`` the driver can parse (others are skipped)."""
    networks = []
    parameters = (address_class.get("spec") or {}).get("parameters") or {}
    for cidr in parameters.get("addresses") or []:
        with contextlib.suppress(ValueError, TypeError):
            networks.append(ipaddress.ip_network(str(cidr), strict=False))
    return networks


def gone_obj(write: Write) -> Obj:
    """What a watch's DELETED event of the written object carries, for the caches."""
    return {"metadata": {"name": write.name, "namespace": write.namespace}}


@dataclass(frozen=True)
class Resolution:
    """Which class a claim resolved to (None: unresolved, ``reason`` says why)."""

    class_name: str | None
    reason: str
    message: str


def resolved_message(class_name: str) -> str:
    """``ClassResolved``'s message once resolved, as the real core writes it (named or default)."""
    return f'resolved to IPAddressClass "{class_name}"'


def resolve_class(claim: Mapping[str, Any], classes: Mapping[str, Obj]) -> Resolution:
    """The core's class resolution (see the module docstring): pure."""
    status = claim.get("status") or {}
    stuck = status.get("className")
    if stuck:
        if stuck in classes:
            return Resolution(str(stuck), REASON_RESOLVED, resolved_message(str(stuck)))
        return Resolution(str(stuck), REASON_CLASS_NOT_FOUND, f"class {stuck} (resolved earlier) is gone")
    named = (claim.get("spec") or {}).get("className")
    if named:
        if named in classes and not _deleting(classes[named]):
            return Resolution(str(named), REASON_RESOLVED, resolved_message(str(named)))
        return Resolution(None, REASON_CLASS_NOT_FOUND, f"no IPAddressClass named {named}")
    defaults = sorted(
        name
        for name, c in classes.items()
        if _annotations(c).get(DEFAULT_CLASS_ANNOTATION) == "true" and not _deleting(c)
    )
    if not defaults:
        return Resolution(
            None, REASON_NO_DEFAULT_CLASS, "the claim names no class and no class is the default"
        )
    if len(defaults) > 1:
        return Resolution(
            None, REASON_MULTIPLE_DEFAULT_CLASSES, f"more than one default class: {', '.join(defaults)}"
        )
    return Resolution(defaults[0], REASON_RESOLVED, resolved_message(defaults[0]))


class ByKey(Mapping[Key, Obj]):
    """A store read as a mapping by (namespace, name): read through, never copied."""

    __slots__ = ("store",)

    def __init__(self, store: Store) -> None:
        self.store = store

    def __getitem__(self, key: Key) -> Obj:
        obj = self.store.get(key)
        if obj is None:
            raise KeyError(key)
        return obj

    def __iter__(self) -> Iterator[Key]:
        return iter(self.store.keys())

    def __len__(self) -> int:
        return len(self.store)

    def __contains__(self, key: object) -> bool:
        return key in self.store

    def values(self) -> ValuesView[Obj]:
        return self.store.values()


class ByName(Mapping[str, Obj]):
    """A store of a cluster-scoped kind read as a mapping by name: read through, never copied."""

    __slots__ = ("store",)

    def __init__(self, store: Store) -> None:
        self.store = store

    def __getitem__(self, name: str) -> Obj:
        obj = self.store.get(("", name))
        if obj is None:
            raise KeyError(name)
        return obj

    def __iter__(self) -> Iterator[str]:
        return map(itemgetter(1), self.store.keys())

    def __len__(self) -> int:
        return len(self.store)

    def __contains__(self, name: object) -> bool:
        return ("", name) in self.store

    def values(self) -> ValuesView[Obj]:
        return self.store.values()


def plain_stores() -> dict[Resource, Store]:
    """A store per kind the model reads, fed by ``on_event`` (unit tests: no cluster, no runtime)."""
    return {resource: Store() for resource in KINDS}


@dataclass
class SubstrateModel:
    """The substrate's core controller and MetalLB driver, as the module docstring describes them."""

    provisioner: str = METALLB_PROVISIONER
    metallb_namespace: str = METALLB_NAMESPACE
    placeholder_namespace: str = PLACEHOLDER_NAMESPACE
    # Whether MetalLB serves L2Advertisement (the integration test renders it; unit tests may not).
    l2_advertisements: bool = True
    # What it reads, a store per kind: the runtime's informers' on a cluster (``substrate``).
    stores: Mapping[Resource, Store] = field(default_factory=plain_stores)
    taken: set[str] = field(default_factory=set)  # IPAddress names a create was refused (409)
    log: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        # The stores under the keys the planning code reads them by.
        self.classes: Mapping[str, Obj] = ByName(self.stores[CLASSES])
        self.claims: Mapping[Key, Obj] = ByKey(self.stores[CLAIMS])
        self.addresses: Mapping[str, Obj] = ByName(self.stores[ADDRESSES])
        self.services: Mapping[Key, Obj] = ByKey(self.stores[SERVICES])
        self.changed = asyncio.Condition()
        # Set once every kind was listed and the first reconcile after that is done.
        self.synced = asyncio.Event()
        self._by_claim: dict[Key, list[Obj]] = {}  # claimRef (namespace, name) -> addresses, per plan
        self._by_claim_name: dict[Key, list[Obj]] = {}  # (namespace, claim) -> Services naming it
        self._held: dict[str, list[Key]] = {}  # IP -> the driver's placeholders holding it, per plan
        self._provisioning: set[Key] = set()  # placeholders provisioning uses in this plan

    @property
    def rendered(self) -> dict[tuple[str, str], Obj]:
        """The driver's MetalLB objects by (plural, name)."""
        kinds = (POOLS, L2_ADVERTISEMENTS)
        return {
            (resource.plural, name): obj
            for resource in kinds
            if resource in self.stores
            for (_, name), obj in self.stores[resource].items()
        }

    # --- events ----------------------------------------------------------------------------------

    def on_event(self, resource: Resource, kind: str, obj: Obj) -> None:
        """A watch event (ADDED, MODIFIED, DELETED) of one of the kinds the model reads, into its
        store as the runtime's informer takes it: an event older than what the store holds for the
        same object (the answer to our own write is in before the watch delivers the versions
        before it) is ignored."""
        store, key = self.stores[resource], _key(obj)
        if kind == "DELETED":
            store.delete(key)
        elif not _older(obj, store.get(key)):
            store.upsert(obj)

    def on_conflict(self, write: Write) -> None:
        """A create refused with 409: the name (an IP's lock) is taken; the next plan skips it."""
        if write.resource == ADDRESSES and write.verb == "create":
            self.taken.add(write.name)
            self.log.append(f"409 on {write.name}: taken")

    # --- the plan (pure) -------------------------------------------------------------------------

    def plan(self, now: str) -> list[Write]:
        """Every write both controllers would make now; empty when the world already agrees. No I/O,
        no clock (``now`` stamps a condition that flips); it only refreshes the model's indexes."""
        self._index()
        notes: dict[Key, str] = {}
        matched = self._match_available()
        writes = [*self._plan_pools(), *self._plan_matches(matched), *self._plan_provisioning(notes, matched)]
        writes += self._plan_addresses()
        writes += self._plan_claims(now, notes, matched)
        writes += self._plan_services()
        return writes

    def _driver_classes(self) -> dict[str, Obj]:
        return {
            name: c
            for name, c in self.classes.items()
            if (c.get("spec") or {}).get("provisioner") == self.provisioner and not _deleting(c)
        }

    def _index(self) -> None:
        """Who names whom, computed once per plan (a plan stays linear in the objects there are)."""
        self._by_claim, self._by_claim_name = {}, {}
        for address in self.addresses.values():
            ref = (address.get("spec") or {}).get("claimRef") or {}
            if ref:
                key = (str(ref.get("namespace")), str(ref.get("name")))
                self._by_claim.setdefault(key, []).append(address)
        for service in self.services.values():
            claim_name = _annotations(service).get(CLAIM_ANNOTATION)
            if claim_name and not _deleting(service):
                self._by_claim_name.setdefault((_key(service)[0], claim_name), []).append(service)
        self._held = self._placeholders()
        self._provisioning = set()

    def _bound_to(self, claim: Mapping[str, Any]) -> list[Obj]:
        """The addresses whose claimRef names this claim (its UID, or none yet), IPv4 first."""
        uid = _meta(claim).get("uid") or ""
        found = [
            a
            for a in self._by_claim.get(_key(claim), [])
            if ((a.get("spec") or {}).get("claimRef") or {}).get("uid", "") in ("", uid)
        ]
        return sorted(found, key=lambda a: (_family(a["spec"]["address"]), _key(a)[1]))

    # The driver: pools.

    def _plan_pools(self) -> list[Write]:
        writes: list[Write] = []
        wanted: dict[tuple[str, str], Obj] = {}
        for name, address_class in sorted(self._driver_classes().items()):
            cidrs = [str(n) for n in class_cidrs(address_class)]
            if not cidrs:
                continue
            pool = pool_name(name)
            metadata = {
                "name": pool,
                "namespace": self.metallb_namespace,
                "labels": {MANAGED_BY_LABEL: MANAGED_BY},
            }
            wanted[(POOLS.plural, pool)] = {
                "apiVersion": POOLS.api_version,
                "kind": "IPAddressPool",
                "metadata": metadata,
                "spec": {"addresses": cidrs, "autoAssign": False, "avoidBuggyIPs": False},
            }
            if self.l2_advertisements:
                wanted[(L2_ADVERTISEMENTS.plural, pool)] = {
                    "apiVersion": L2_ADVERTISEMENTS.api_version,
                    "kind": "L2Advertisement",
                    "metadata": metadata,
                    "spec": {"ipAddressPools": [pool]},
                }
        resources = {POOLS.plural: POOLS, L2_ADVERTISEMENTS.plural: L2_ADVERTISEMENTS}
        rendered = self.rendered
        for (plural, name), obj in wanted.items():
            have = rendered.get((plural, name))
            if have is None or any(have.get("spec", {}).get(k) != v for k, v in obj["spec"].items()):
                writes.append(
                    Write(
                        "apply",
                        resources[plural],
                        name,
                        self.metallb_namespace,
                        obj,
                        f"render {plural} {name}",
                    )
                )
        for plural, name in sorted(rendered.keys() - wanted.keys()):
            labels = _meta(rendered[(plural, name)]).get("labels") or {}
            if labels.get(MANAGED_BY_LABEL) == MANAGED_BY:
                writes.append(
                    Write("delete", resources[plural], name, self.metallb_namespace, why="class gone")
                )
        return writes

    # The driver: provisioning.

    def _free_ip(self, address_class: Mapping[str, Any], version: int, used: set[str]) -> str | None:
        """The first address of the class's CIDRs of ``version`` (the network's own address too, as
        MetalLB hands it out) whose name is not in ``used``."""
        for network in class_cidrs(address_class):
            if network.version != version:
                continue
            for host in network:
                if address_name(str(host)) not in used:
                    return str(host)
        return None

    def _plan_provisioning(self, notes: dict[Key, str], matched: Mapping[Key, list[str]]) -> list[Write]:
        """For each family a stamped ``Pending`` claim of the driver's still lacks (after the core's
        matches in this plan): its placeholder ``iad-<claim uid>-v<family>`` holding a free IP, then
        the address of that IP."""
        writes: list[Write] = []
        mine = self._driver_classes()
        # The names taken, and those this plan creates: two claims pending at once get two addresses
        # (the same free IP planned twice would be one create and one 409 for every other claim).
        used = self.taken | set(self.addresses)
        # An IP a placeholder holds is in MetalLB's books: never handed out to another claim.
        busy = {address_name(ip) for ip in self._held}
        for key, claim in sorted(self.claims.items()):
            status = claim.get("status") or {}
            class_name = status.get("className")
            if (
                _deleting(claim)
                or class_name not in mine
                or _annotations(claim).get(PROVISIONER_ANNOTATION) != self.provisioner
                or (status.get("phase") or PENDING) != PENDING
            ):
                continue
            address_class = mine[str(class_name)]
            family = (claim.get("spec") or {}).get("family") or IPV4
            have = {_family(a["spec"]["address"]) for a in self._bound_to(claim)}
            have |= {_family(self.addresses[name]["spec"]["address"]) for name in matched.get(key, [])}
            for version in FAMILIES.get(family, (4,)):
                if version in have:
                    continue
                placeholder = (
                    self.placeholder_namespace,
                    f"{PLACEHOLDER_PREFIX}{_meta(claim).get('uid')}-v{version}",
                )
                ip = self._holding(placeholder)
                if ip is None or address_name(ip) in used:
                    # (else the placeholder holds a free IP already: only the address is missing)
                    ip = self._free_ip(address_class, version, used | busy)
                    if ip is None:
                        notes[key] = f"class {class_name} has no free IPv{version} address"
                        continue
                    if placeholder in self.services:  # its IP was taken meanwhile: it holds the next
                        writes.append(self._annotate(placeholder, {METALLB_IPS_ANNOTATION: ip}, f"hold {ip}"))
                    else:
                        writes.append(self._placeholder(placeholder[1], ip, str(class_name)))
                self._provisioning.add(placeholder)
                used.add(address_name(ip))
                spec = {
                    "address": ip,
                    "className": class_name,
                    "claimRef": {"namespace": key[0], "name": key[1], "uid": _meta(claim).get("uid")},
                    "reclaimPolicy": (address_class.get("spec") or {}).get("reclaimPolicy") or RETAIN,
                    "source": {"fromClass": {}},
                }
                body = {
                    "apiVersion": API_VERSION,
                    "kind": "IPAddress",
                    "metadata": {"name": address_name(ip)},
                    "spec": spec,
                }
                writes.append(Write("create", ADDRESSES, address_name(ip), None, body, f"provision {key[1]}"))
        return writes

    def _holding(self, key: Key) -> str | None:
        """The IP a live placeholder holds (None: no such placeholder, or it holds none)."""
        service = self.services.get(key)
        if service is None or _deleting(service):
            return None
        return (_annotations(service).get(METALLB_IPS_ANNOTATION) or "").split(",")[0] or None

    # The core: matching Available addresses.

    def _match_available(self) -> dict[Key, list[str]]:
        """The ``Available`` addresses the core binds now: for each family a live ``Pending`` claim
        still lacks, one of its resolved class (any provisioner), in name order, none twice."""
        matched: dict[Key, list[str]] = {}
        taken: set[str] = set()
        for key, claim in sorted(self.claims.items()):
            if _deleting(claim) or ((claim.get("status") or {}).get("phase") or PENDING) != PENDING:
                continue
            resolution = resolve_class(claim, self.classes)
            if resolution.reason != REASON_RESOLVED or resolution.class_name is None:
                continue
            family = (claim.get("spec") or {}).get("family") or IPV4
            have = {_family(a["spec"]["address"]) for a in self._bound_to(claim)}
            for version in FAMILIES.get(family, (4,)):
                available = (
                    None if version in have else self._available(resolution.class_name, version, taken)
                )
                if available is not None:
                    taken.add(available)
                    matched.setdefault(key, []).append(available)
        return matched

    def _plan_matches(self, matched: Mapping[Key, list[str]]) -> list[Write]:
        """The core sets each matched address's ``claimRef``, the claim's UID with it."""
        writes: list[Write] = []
        for key, names in sorted(matched.items()):
            ref = {"namespace": key[0], "name": key[1], "uid": _meta(self.claims[key]).get("uid")}
            for name in names:
                writes.append(
                    Write("patch", ADDRESSES, name, None, {"spec": {"claimRef": ref}}, f"match {key[1]}")
                )
        return writes

    def _available(self, class_name: str, version: int, matched: set[str]) -> str | None:
        """An ``Available`` address of the class and family not matched in this plan (by name)."""
        for name, address in sorted(self.addresses.items()):
            spec = address.get("spec") or {}
            if (
                name not in matched
                and not spec.get("claimRef")
                and not _deleting(address)
                and spec.get("className") == class_name
                and (address.get("status") or {}).get("phase") == AVAILABLE
                and _family(str(spec.get("address"))) == version
            ):
                return name
        return None

    # The core: addresses.

    def _claim_of(self, address: Mapping[str, Any]) -> Obj | None:
        """The live claim the address's claimRef names (None: no ref, or that claim is gone)."""
        ref = (address.get("spec") or {}).get("claimRef") or {}
        if not ref:
            return None
        claim = self.claims.get((str(ref.get("namespace")), str(ref.get("name"))))
        if claim is None or ref.get("uid", "") not in ("", _meta(claim).get("uid")):
            return None
        return claim

    def _phase(self, address: Mapping[str, Any]) -> str | None:
        """The phase the core gives the address now (None: it deletes it, its claim gone under
        ``Delete``): ``Available`` without ``claimRef``, ``Bound`` while its claim lives,
        ``Released`` once that claim is being deleted or gone (``Retain``)."""
        spec = address.get("spec") or {}
        if not spec.get("claimRef"):
            return AVAILABLE
        claim = self._claim_of(address)
        if claim is not None and not _deleting(claim):
            return BOUND
        return None if (spec.get("reclaimPolicy") or RETAIN) == DELETE else RELEASED

    def _plan_addresses(self) -> list[Write]:
        writes: list[Write] = []
        for name, address in sorted(self.addresses.items()):
            ref = (address.get("spec") or {}).get("claimRef") or {}
            wanted = self._phase(address)
            claim = self._claim_of(address)
            if wanted == BOUND and claim is not None and not ref.get("uid"):
                # A claimRef without a UID (not the driver's: it sets one) is completed.
                body = {"spec": {"claimRef": {"uid": _meta(claim)["uid"]}}}
                writes.append(Write("patch", ADDRESSES, name, body=body, why=f"bind to {ref.get('name')}"))
            if wanted is None:
                writes.append(
                    Write("delete", ADDRESSES, name, why=f"reclaim (Delete) from {ref.get('name')}")
                )
                continue
            if (address.get("status") or {}).get("phase") != wanted:
                writes.append(
                    Write("status", ADDRESSES, name, body={"status": {"phase": wanted}}, why=wanted)
                )
        return writes

    # The core: claims.

    def _plan_claims(
        self, now: str, notes: Mapping[Key, str], matched: Mapping[Key, list[str]]
    ) -> list[Write]:
        writes: list[Write] = []
        for key, claim in sorted(self.claims.items()):
            metadata = _meta(claim)
            finalizers = list(metadata.get("finalizers") or [])
            if _deleting(claim):
                held = [a for a in self._bound_to(claim) if (a.get("status") or {}).get("phase") == BOUND]
                if not held and CLAIM_PROTECTION_FINALIZER in finalizers:
                    kept = [f for f in finalizers if f != CLAIM_PROTECTION_FINALIZER]
                    writes.append(self._claim_patch(claim, {"finalizers": kept}, "reclaimed"))
                continue
            resolution = resolve_class(claim, self.classes)
            meta_patch: Obj = {}
            if CLAIM_PROTECTION_FINALIZER not in finalizers:
                meta_patch["finalizers"] = [*finalizers, CLAIM_PROTECTION_FINALIZER]
            provisioner = None
            if resolution.class_name is not None and resolution.class_name in self.classes:
                provisioner = (self.classes[resolution.class_name].get("spec") or {}).get("provisioner")
            if provisioner and _annotations(claim).get(PROVISIONER_ANNOTATION) != provisioner:
                meta_patch["annotations"] = {PROVISIONER_ANNOTATION: provisioner}
            if meta_patch:
                writes.append(self._claim_patch(claim, meta_patch, "finalizer and stamp"))
            bound = [self.addresses[name] for name in matched.get(key, [])]
            status_write = self._claim_status(claim, resolution, now, notes.get(key), bound)
            if status_write is not None:
                writes.append(status_write)
        return writes

    def _claim_patch(self, claim: Obj, metadata: Obj, why: str) -> Write:
        """A metadata patch behind the claim's resourceVersion (the finalizer list is replaced whole)."""
        namespace, name = _key(claim)
        body = {"metadata": {**metadata, "resourceVersion": _meta(claim).get("resourceVersion")}}
        return Write("patch", CLAIMS, name, namespace, body, why)

    def _claim_status(
        self, claim: Obj, resolution: Resolution, now: str, note: str | None, matched: Sequence[Obj]
    ) -> Write | None:
        """The claim's status; ``matched``: the Available addresses the core binds to it in this plan
        (so such a claim goes straight to ``Bound``, never ``Pending``)."""
        stored = claim.get("status") or {}
        family = (claim.get("spec") or {}).get("family") or IPV4
        bound = [a for a in self._bound_to(claim) if (a.get("spec") or {}).get("claimRef", {}).get("uid")]
        bound += matched
        entries = sorted(
            ({"name": _key(a)[1], "address": str(a["spec"]["address"])} for a in bound),
            key=_address_sort_key,
        )
        families = {_family(e["address"]) for e in entries}
        had = {str(e.get("name")) for e in stored.get("addresses") or []}
        lost = sorted(had - {e["name"] for e in entries})
        if stored.get("phase") == LOST or (stored.get("phase") == BOUND and lost):
            phase = LOST
            bound_condition = Condition(
                BOUND, FALSE, REASON_ADDRESS_LOST, f"address {', '.join(lost) or 'it had'} is gone"
            )
        elif resolution.class_name is not None and set(FAMILIES.get(family, (4,))) <= families:
            phase = BOUND
            bound_condition = Condition(BOUND, TRUE, REASON_BOUND, ", ".join(e["address"] for e in entries))
        else:
            phase = PENDING
            message = note or (
                f"waiting for {resolution.class_name}'s provisioner"
                if resolution.reason == REASON_RESOLVED
                else "waiting for the class to resolve"
            )
            bound_condition = Condition(BOUND, FALSE, REASON_WAITING_FOR_PROVISIONING, message)
        resolved_condition = Condition(
            CLASS_RESOLVED,
            TRUE if resolution.reason == REASON_RESOLVED else FALSE,
            resolution.reason,
            resolution.message,
        )
        generation = int(_meta(claim).get("generation") or 0)
        stored_conditions = {c.get("type"): c for c in stored.get("conditions") or []}
        conditions = [
            render(c, stored_conditions.get(c.type), generation, now)
            for c in (resolved_condition, bound_condition)
        ]
        conditions += [c for t, c in stored_conditions.items() if t not in (CLASS_RESOLVED, BOUND)]
        wanted: Obj = {"phase": phase, "addresses": entries, "conditions": conditions}
        if resolution.class_name is not None:
            wanted["className"] = resolution.class_name
        same = (
            stored.get("phase") == phase
            and (stored.get("addresses") or []) == entries
            and stored.get("className") == wanted.get("className")
            and len(stored.get("conditions") or []) == len(conditions)
            and all(same_condition(stored_conditions.get(c["type"]) or {}, c) for c in conditions)
        )
        if same:
            return None
        namespace, name = _key(claim)
        return Write(
            "status", CLAIMS, name, namespace, {"status": wanted}, f"{phase}: {bound_condition.message}"
        )

    # The driver: Services.

    def _claims_service(self, claim: Obj, holders: Sequence[Obj]) -> Key | None:
        """Which live Service naming the claim is the claim's (see the module docstring)."""
        candidates = {_key(s): s for s in self._by_claim_name.get(_key(claim), [])}
        for address in holders:
            to = (address.get("status") or {}).get("associatedTo") or {}
            current = (str(to.get("namespace")), str(to.get("name")))
            if to.get("kind") == "Service" and current in candidates:
                return current
        if not candidates:
            return None
        oldest = min(
            candidates.values(), key=lambda s: (str(_meta(s).get("creationTimestamp") or ""), _key(s)[1])
        )
        return _key(oldest)

    def _plan_services(self) -> list[Write]:
        """Associations first, then the placeholders they free, then the pins: the driver's order."""
        mine = self._driver_classes()
        pins: dict[Key, str] = {}  # Service -> the pin it must carry
        associations: dict[str, Key | None] = {}  # address -> the Service it is associated to
        for claim in self.claims.values():
            status = claim.get("status") or {}
            if status.get("className") not in mine:
                continue
            holders = [a for a in self._bound_to(claim) if (a.get("status") or {}).get("phase") == BOUND]
            if status.get("phase") != BOUND or _deleting(claim) or not holders:
                continue
            winner = self._claims_service(claim, holders)
            if winner is None:
                continue
            pins[winner] = ",".join(str(a["spec"]["address"]) for a in holders)
            for address in holders:
                associations[_key(address)[1]] = winner
        self._keep_released(mine, pins, associations)
        pin_writes: list[Write] = []
        for key, service in sorted(self.services.items()):
            annotations = _annotations(service)
            pinned = annotations.get(METALLB_IPS_ANNOTATION)
            wanted = pins.get(key)
            marked = annotations.get(PINNED_MARKER) == "true"
            if wanted is not None and (pinned != wanted or not marked):
                pin_writes.append(self._pin(key, wanted, "pin the claim's addresses"))
            elif wanted is None and CLAIM_ANNOTATION in annotations and (pinned is not None or marked):
                pin_writes.append(self._pin(key, None, "not the claim's Service: no pin"))
        associate, unpin = self._plan_associations(mine, pins, associations)
        return [*associate, *self._plan_placeholders(mine, associations), *pin_writes, *unpin]

    def _keep_released(
        self, mine: Mapping[str, Obj], pins: dict[Key, str], associations: dict[str, Key | None]
    ) -> None:
        """A Released address (its claim being deleted or gone under Retain) stays associated to the
        live Service it was, which keeps its pin: the driver only reports the claim missing. (Unless
        that Service is now a live claim's: that claim's decision wins, not observed.)"""
        for name, address in sorted(self.addresses.items()):
            if (address.get("spec") or {}).get("className") not in mine or name in associations:
                continue
            to = (address.get("status") or {}).get("associatedTo") or {}
            current = (str(to.get("namespace")), str(to.get("name")))
            service = self.services.get(current) if to.get("kind") == "Service" else None
            if self._phase(address) == RELEASED and service is not None and current not in pins:
                associations[name] = current
                pinned = _annotations(service).get(METALLB_IPS_ANNOTATION)
                pins[current] = pinned or str(address["spec"]["address"])

    def _plan_associations(
        self, mine: Mapping[str, Obj], pins: Mapping[Key, str], associations: Mapping[str, Key | None]
    ) -> tuple[list[Write], list[Write]]:
        """Each address's ``associatedTo`` as decided, and the unpin of a Service that left its claim."""
        writes: list[Write] = []
        unpins: dict[Key, Write] = {}
        for name, address in sorted(self.addresses.items()):
            if (address.get("spec") or {}).get("className") not in mine or self._phase(address) is None:
                continue  # (an address the core deletes in this plan is written no more)
            to = (address.get("status") or {}).get("associatedTo") or {}
            current = (str(to.get("namespace")), str(to.get("name"))) if to else None
            wanted_key = associations.get(name)
            if current == wanted_key:
                continue
            left = self.services.get(current) if current is not None else None
            if (
                current is not None
                and left is not None
                and current not in pins
                and CLAIM_ANNOTATION not in _annotations(left)
                and str(address["spec"]["address"]) in _pinned(left)
            ):
                # A pin the driver wrote on a Service that stays but no longer names the claim.
                unpins[current] = self._pin(current, None, "left the claim: unpin")
            associated = (
                {"kind": "Service", "namespace": wanted_key[0], "name": wanted_key[1]} if wanted_key else None
            )
            writes.append(
                Write(
                    "status", ADDRESSES, name, body={"status": {"associatedTo": associated}}, why="associate"
                )
            )
        return writes, list(unpins.values())

    def _placeholders(self) -> dict[str, list[Key]]:
        """The driver's placeholders by the address they pin."""
        held: dict[str, list[Key]] = {}
        for key, service in self.services.items():
            if key[0] == self.placeholder_namespace and not _deleting(service):
                for ip in _pinned(service):
                    held.setdefault(ip, []).append(key)
        return held

    def _plan_placeholders(
        self, mine: Mapping[str, Obj], associations: Mapping[str, Key | None]
    ) -> list[Write]:
        """Every address of the driver's held in MetalLB's books: by its Service while associated,
        else by a placeholder (an existing one, or ``iad-<address>``); a placeholder holding no
        address (the core deletes it in this plan, or it is gone) goes, unless provisioning uses it."""
        writes: list[Write] = []
        held = self._held
        wanted: set[str] = set()
        kept = {
            name: a for name, a in self.addresses.items() if not _deleting(a) and self._phase(a) is not None
        }
        for name, address in sorted(kept.items()):
            spec = address.get("spec") or {}
            if spec.get("className") not in mine:
                continue
            ip = str(spec.get("address"))
            if associations.get(name) is not None:
                for key in held.get(ip, []):
                    writes.append(
                        Write("delete", SERVICES, key[1], key[0], why=f"{ip} handed to its Service")
                    )
                continue
            wanted.add(ip)
            if not held.get(ip):
                writes.append(self._placeholder(f"{PLACEHOLDER_PREFIX}{name}", ip, str(spec["className"])))
        addressed = {str((a.get("spec") or {}).get("address")) for a in kept.values()}
        for ip, keys in sorted(held.items()):
            if ip not in wanted and ip not in addressed:
                for key in keys:
                    if key not in self._provisioning:
                        writes.append(Write("delete", SERVICES, key[1], key[0], why=f"{ip} held for nothing"))
        return writes

    def _placeholder(self, name: str, ip: str, class_name: str) -> Write:
        """A selectorless LoadBalancer Service pinning ``ip`` from the class's pool (MetalLB's books)."""
        family = IPV6 if _family(ip) == 6 else IPV4
        body = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": name,
                "namespace": self.placeholder_namespace,
                "annotations": {POOL_ANNOTATION: pool_name(class_name), METALLB_IPS_ANNOTATION: ip},
            },
            "spec": {
                "type": "LoadBalancer",
                "ipFamilyPolicy": "SingleStack",
                "ipFamilies": [family],
                "ports": [{"name": "hold", "port": PLACEHOLDER_PORT, "protocol": "TCP"}],
            },
        }
        return Write("create", SERVICES, name, self.placeholder_namespace, body, f"hold {ip}")

    def _pin(self, key: Key, value: str | None, why: str) -> Write:
        """The driver's pin (or unpin) as it writes it: the address annotation and the marker
        together, in one plain Update."""
        if value is None:
            return self._annotate(key, {METALLB_IPS_ANNOTATION: None, PINNED_MARKER: None}, why)
        return self._annotate(key, {METALLB_IPS_ANNOTATION: value, PINNED_MARKER: "true"}, why)

    def _annotate(self, key: Key, changes: Mapping[str, str | None], why: str) -> Write:
        """One plain Update of the whole cached Service behind its resourceVersion, its annotations
        changed (None: removed)."""
        service = self.services[key]
        annotations = {k: v for k, v in {**_annotations(service), **changes}.items() if v is not None}
        body = {**service, "metadata": {**_meta(service), "annotations": annotations}}
        return Write("update", SERVICES, key[1], key[0], body, why)

    # --- queries ---------------------------------------------------------------------------------

    def claim(self, namespace: str, name: str) -> Obj | None:
        return self.claims.get((namespace, name))

    def address(self, name: str) -> Obj | None:
        return self.addresses.get(name)

    # --- driven by the cluster -------------------------------------------------------------------

    async def notify(self) -> None:
        """Waiters re-check (after each decision of its controller)."""
        await notify(self.changed)

    async def wait_for(self, predicate: Callable[[SubstrateModel], bool], timeout: float, what: str) -> None:
        """Until ``predicate(self)`` holds, re-checked on every change; fails after ``timeout``."""
        await wait_until(
            self.changed,
            lambda: predicate(self),
            timeout,
            lambda: f"{what} (substrate model: log={self.log[-10:]})",
        )


# --- declared on the runtime ---------------------------------------------------------------------


def the_substrate(obj: Obj) -> Key:
    """Which key a class change wakes: the one pass over the whole substrate."""
    return MODEL_KEY


def whole_substrate(caches: Caches, obj: Obj) -> Iterable[Key]:
    """Which keys a change of any other kind the model reads wakes: the one pass."""
    return (MODEL_KEY,)


def wiring(*, metallb_namespace: str = METALLB_NAMESPACE, l2_advertisements: bool = True) -> Wiring:
    """Both controllers as one: classes (never written) the primary kind, every other kind read
    watched, one key for all; each kind cached as listed, MetalLB's only in its namespace."""
    rendered = (POOLS, L2_ADVERTISEMENTS) if l2_advertisements else (POOLS,)
    return Wiring(
        name=CONTROLLER_NAME,
        primary=CLASSES,
        key=the_substrate,
        watches=tuple(Watch(kind, map=whole_substrate) for kind in (CLAIMS, ADDRESSES, SERVICES, *rendered)),
        writes=(
            runtime.Write(CLAIMS, ("patch",)),
            runtime.Write(CLAIMS, ("patch",), "status"),
            runtime.Write(ADDRESSES, ("create", "patch", "delete")),
            runtime.Write(ADDRESSES, ("patch",), "status"),
            runtime.Write(SERVICES, ("create", "update", "delete")),
            *(runtime.Write(kind, ("create", "patch", "delete")) for kind in rendered),
        ),
        caches=(
            *(Cache(kind, transform=None) for kind in (CLASSES, CLAIMS, ADDRESSES, SERVICES)),
            *(
                Cache(kind, transform=None, field_selector=f"metadata.namespace={metallb_namespace}")
                for kind in rendered
            ),
        ),
    )


class SubstrateController:
    """The reconciler: one decision is a plan from the stores, applied (see the module docstring)."""

    def __init__(
        self, model: SubstrateModel, kube: Kube, writer: Writer, reads: Mapping[Resource, Reads]
    ) -> None:
        self.model, self.kube, self.writer = model, kube, writer
        self.reads = reads  # of the kinds it Updates: a stale Update reads the object again
        self.unsettled = 0  # plans applied in a row without an empty one

    async def reconcile(self, key: Key) -> Result:
        """Plan and apply; decided again at once while a plan was applied, after a pause when a
        write failed, and not at all once a plan is empty (or after ``MAX_PASSES`` plans in a row:
        the next change wakes it)."""
        model = self.model
        writes = model.plan(rfc3339(datetime.now(UTC)))
        if writes and self.unsettled < MAX_PASSES:
            self.unsettled += 1
            applied = await self.apply(writes)
            await model.notify()
            return Result(again=True) if applied else Result(requeue_after=RETRY_SECONDS)
        if writes:
            model.log.append(f"no fixed point after {MAX_PASSES} passes: {writes[:3]}")
        self.unsettled = 0
        model.synced.set()
        await model.notify()
        return Result()

    async def apply(self, writes: Iterable[Write]) -> bool:
        """Send the writes in order, each answer handed to its informer (write-through); False if one
        failed (the rest of that plan is dropped: the next pass plans again from what is known then).
        A create refused as a taken name is not a failure: ``on_conflict`` records it."""
        log = self.model.log
        for write in writes:
            try:
                if write.verb == "delete":  # by name, as the controllers delete: no UID precondition
                    await self.writer.delete(write.resource, gone_obj(write), forget=True)
                    log.append(f"delete {write.resource.plural}/{write.name}: {write.why}")
                    continue
                answer = await self.send(write)
            except ApiError as error:
                if error.status == CONFLICT and write.verb == "create":
                    self.model.on_conflict(write)  # the name is taken: the next pass takes the next IP
                    continue
                if error.status == CONFLICT and write.verb == "update":
                    await self.read_again(write)  # a stale resourceVersion: the next pass plans from it
                    continue
                log.append(f"{write.verb} {write.resource.plural}/{write.name}: {error}")
                return False
            except Conflict as error:  # a delete refused (409)
                log.append(f"{write.verb} {write.resource.plural}/{write.name}: {error}")
                return False
            log.append(f"{write.verb} {write.resource.plural}/{write.name}: {write.why}")
            self.writer.remember(write.resource, answer)
        return True

    async def send(self, write: Write) -> Obj:
        """The request the controllers send (the client's own: nothing is stamped on the body)."""
        if write.verb == "create":
            return await self.kube.create(write.path(), write.body or {})
        if write.verb == "apply":
            return await self.kube.apply(write.path(), write.body or {}, FIELD_MANAGER)
        if write.verb == "update":
            return await self.kube.replace(write.path(), write.body or {})
        return await self.kube.patch(write.path(), write.body, "merge")

    async def read_again(self, write: Write) -> None:
        """The object as the API has it now, into its cache (gone: out of it)."""
        fresh = await self.reads[write.resource].get(write.namespace, write.name)
        if fresh is not None:
            self.writer.remember(write.resource, fresh)
        elif (informer := self.writer.informer_of(write.resource)) is not None:
            informer.forget(_key(gone_obj(write)))


@contextlib.asynccontextmanager
async def substrate(kube: Kube, *, l2_advertisements: bool = True) -> AsyncIterator[SubstrateModel]:
    """The model, following the cluster's classes, claims, addresses, Services and its MetalLB
    objects for the duration (the substrate's CRDs and MetalLB's must be installed): a ``Manager`` of
    its own on ``kube`` (which stays the caller's to close), without leader election."""
    manager = Manager(
        kube, CollectorRegistry(), Tracing(NoOpTracerProvider(), CONTROLLER_NAME), freeze_heap=False
    )
    declared = wiring(l2_advertisements=l2_advertisements)
    manager.declare_caches(declared)
    stores = {kind: manager.store(kind) for kind in declared.resources()}
    model = SubstrateModel(l2_advertisements=l2_advertisements, stores=stores)
    reconciler = SubstrateController(model, kube, manager.writer, {SERVICES: manager.reads(SERVICES, "get")})
    manager.add(declared, reconciler).queue.add(MODEL_KEY)  # the first pass, whatever the world holds
    task = asyncio.create_task(manager.run(), name=CONTROLLER_NAME)
    try:
        yield model
    finally:
        await cancel_all([task])
