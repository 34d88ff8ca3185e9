"""The EndpointAttachment operator on a test cluster: its CRD beside the ones it consumes, its own
ServiceAccount and RBAC, the operator process, the address substrate it draws from (the model of
``harness/substrate.py`` over real MetalLB), and what its integration tests read back.

Shared by the integration tests of the operator (``test_ea_operator.py``, ``test_ea_failures.py``,
``test_ea_datapath.py``, ``test_ea_resilience.py`` and others); ``Tenant`` builds a tenant's world
through the API in Cozystack's documented shapes: a HelmRelease per application, its tenant-facing
Services labelled as Cozystack's lineage webhook labels them, the attachment as Cozystack's
documentation writes it (``spec.applicationRef``, ``spec.endpoint.serviceName``,
``spec.loadBalancer``), and the hoster's side of the substrate (``IPAddressClass`` objects naming the
MetalLB driver, reserved ``IPAddressClaim`` objects).

Decides only what they all need the same way: the CRDs installed (the project's EndpointAttachment,
the substrate's three from ``tests/fixtures/address-substrate/``, Flux's HelmRelease; nothing else),
the operator's namespace and RBAC (exactly what ``config/rbac/endpointattachment`` gives it, without
the tenants' roles), how it is started, how a test world is cleaned up (attachments, claims, the
addresses and classes a test made, and the MetalLB pools the substrate rendered for them, so the
next test's pools never overlap a stale one), and the contract's words the tests assert (reasons,
phases, the diagnostic label): the tests check the contract, not the operator's constants.

Does not: allocate or bind an address (the substrate model does), write a Service's status (MetalLB
does), or run the operator in-process.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from hack.devcluster import ClusterInfo
from hack.metallb import MetalLB
from hack.substrate import PLACEHOLDER_NAMESPACE
from harness.ea_objects import (
    HELMRELEASE_API_VERSION,
    attachment_spec,
    helmrelease_spec,
    lineage_labels,
    load_balancer_spec,
)
from harness.identity import serviceaccount_kubeconfig
from harness.lane import Substrate, address_substrate
from harness.loadbalancer import load_balancer
from harness.manifests import ROOT, apply_all, load
from harness.operators import RunningOperator, operator_process

# The substrate's kinds and the claim annotation are re-exported: a test names every kind from here.
from harness.substrate import ADDRESSES as ADDRESSES
from harness.substrate import CLAIM_ANNOTATION as CLAIM_ANNOTATION
from harness.substrate import CLAIMS as CLAIMS
from harness.substrate import CLASSES as CLASSES
from harness.substrate import (
    DEFAULT_CLASS_ANNOTATION,
    METALLB_NAMESPACE,
    METALLB_PROVISIONER,
    RETAIN,
)
from harness.substrate import POOLS as POOLS
from harness.waiting import eventually, wait_for_object
from operators.endpointattachment.api import ATTACHMENTS as ATTACHMENTS
from operators.endpointattachment.api import HELMRELEASE_KIND
from shared.kube import NO_ANSWER, Kube, Obj
from shared.resources import HELMRELEASES, NODES, PODS, SERVICES, Resource

OPERATOR_NAMESPACE: Final = "cozy-endpointattachment"
OPERATOR_SERVICE_ACCOUNT: Final = "endpointattachment-operator"
# The Lease the operator's replicas elect a leader through (its settings' default).
LEADER_ELECTION_ID: Final = "cozystack-endpointattachment-operator"
RBAC_DIR: Final = "config/rbac/endpointattachment"
TENANT_ROLES: Final = frozenset({"tenant_roles.yaml"})  # the tenants' roles, not the operator's
# The controller whose passes the tests count.
ATTACHMENT_CONTROLLER: Final = "endpointattachment"
# The Node test Pods are bound to (no kubelet runs: tests mark Pods Ready themselves).
NODE: Final = "ea-it-node"
EA_CRD_FILE: Final = "config/crd/endpointattachment/local.sdn.cozystack.io_endpointattachments.yaml"
HELMRELEASE_CRD_FILE: Final = "tests/fixtures/helmrelease-crd.yaml"
# The substrate's CRDs, as a hoster installs them (the operator consumes these kinds, never defines them).
SUBSTRATE_CRD_FILES: Final = sorted(
    str(path.relative_to(ROOT)) for path in (ROOT / "tests" / "fixtures" / "address-substrate").glob("*.yaml")
)
CRD_FILES: Final = [HELMRELEASE_CRD_FILE, EA_CRD_FILE, *SUBSTRATE_CRD_FILES]
# What every test runs the operator with (each test adds its own flags after these).
DEFAULT_ARGS: Final[tuple[str, ...]] = ()
TRACEBACK: Final = "Traceback"
# A log record starts with its time (shared.operator's format); a traceback ends at the next one.
LOG_RECORD: Final = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}")
LOG_RECORD_END: Final = "\0end of log"

# --- the contract's words (design reference), asserted as written there --------------------------

# Cozystack's applications are in this API group; an attachment's applicationRef defaults to it.
APP_GROUP: Final = "apps.cozystack.io"
# The diagnostic label on a rendered Service and a minted claim (never proof of ownership).
ATTACHMENT_LABEL: Final = "cozystack.io/endpoint-attachment"
CONDITION_RESOLVED: Final = "Resolved"
CONDITION_PROVISIONED: Final = "Provisioned"
ATTACHED: Final = "Attached"
DETACHED: Final = "Detached"
PENDING: Final = "Pending"
# How long a wait for the operator's answer may take on this shared machine.
ANSWER_TIMEOUT: Final = 40.0
# What a test waits for the cleanup of its world before it gives up waiting (and forces it).
CLEANUP_TIMEOUT: Final = 20.0
# The one namespace a silenced pool serves: the driver's placeholders are there (so a claim still
# binds: the real driver draws its addresses through MetalLB), a tenant's Services are not.
POLICIES: Final = Resource("admissionregistration.k8s.io/v1", "validatingadmissionpolicies", namespaced=False)
POLICY_BINDINGS: Final = Resource(
    "admissionregistration.k8s.io/v1", "validatingadmissionpolicybindings", namespaced=False
)
NAMESPACE_NAME_LABEL: Final = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class World:
    """What the operator's tests stand on besides the control plane: MetalLB and the address
    substrate (the real one or the model: ``harness/lane.py``)."""

    balancer: MetalLB
    substrate: Substrate


@contextlib.asynccontextmanager
async def ea_crds_and_node(kube: Kube, crd_files: Sequence[str] = CRD_FILES) -> AsyncIterator[None]:
    """The CRDs (applied, established) and the test Node."""
    await apply_all(kube, [doc for path in crd_files for doc in load(path)])
    await kube.create(NODES.path(), {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    try:
        yield
    finally:
        await kube.delete(NODES.path(name=NODE))


@contextlib.asynccontextmanager
async def ea_world(kube: Kube) -> AsyncIterator[World]:
    """The CRDs and the Node, the session's MetalLB, and the lane's address substrate following the
    cluster for the duration: one per test module (two substrates would fight)."""
    async with ea_crds_and_node(kube), load_balancer(kube) as balancer, address_substrate(kube) as running:
        yield World(balancer, running)


async def operator_kubeconfig(kube: Kube, cluster: ClusterInfo, path: Path) -> str:
    """Install the operator's namespace, ServiceAccount and RBAC; write a kubeconfig of its
    ServiceAccount (a TokenRequest token) at ``path``."""
    namespace_doc = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NAMESPACE}}
    # Everything config/rbac/endpointattachment installs for the operator itself (its ClusterRole,
    # and the Role on Leases in its namespace for leader election), but the tenants' roles.
    files = [f for f in load(f"{RBAC_DIR}/kustomization.yaml")[0]["resources"] if f not in TENANT_ROLES]
    rbac = [doc for f in files for doc in load(f"{RBAC_DIR}/{f}")]
    await apply_all(kube, [namespace_doc, *rbac])
    return await serviceaccount_kubeconfig(
        kube, cluster.kubeconfig, OPERATOR_NAMESPACE, OPERATOR_SERVICE_ACCOUNT, path
    )


@contextlib.asynccontextmanager
async def ea_operator(
    kube: Kube,
    cluster: ClusterInfo,
    tmp_path: Path,
    extra_env: Mapping[str, str] | None = None,
    *,
    kubeconfig: str | None = None,
    extra_args: Sequence[str] = (),
    log_name: str = "operator.log",
    check_on_exit: Callable[[RunningOperator], None] | None = None,
) -> AsyncIterator[RunningOperator]:
    """The operator, authenticated as its own ServiceAccount, authorised by its ClusterRole only.

    ``kubeconfig`` replaces the one made here (one from ``operator_kubeconfig``, possibly pointed
    at a fault proxy); ``extra_args`` come after the defaults. On a normal exit the process must
    still be running and its log free of tracebacks (``check_on_exit`` replaces that check)."""
    if kubeconfig is None:
        kubeconfig = await operator_kubeconfig(kube, cluster, tmp_path / "op.kubeconfig")
    args = [*DEFAULT_ARGS, f"--leader-election-namespace={OPERATOR_NAMESPACE}", *extra_args]
    async with operator_process(
        "operators.endpointattachment", kubeconfig, args, tmp_path / log_name, extra_env
    ) as running:
        yield running
        (check_on_exit or healthy_to_the_end)(running)


async def leading(running: RunningOperator, timeout: float = 60.0) -> None:
    """Until the operator leads (its ``leader_election_master_status`` reads 1): its controllers
    run from then on, so what changes afterwards is its to report."""

    async def leads() -> bool:
        try:
            samples = await running.scrape()
        except Exception:  # its metrics server is not up yet (refused, whichever HTTP client)
            return False
        return samples.get(("leader_election_master_status", (("name", LEADER_ELECTION_ID),))) == 1

    await eventually(leads, timeout=timeout, what="the operator to lead")


def healthy_to_the_end(running: RunningOperator) -> None:
    """The process still runs, and logged no traceback."""
    assert running.process.returncode is None, f"operator died:\n{running.log_tail()}"
    assert TRACEBACK not in running.log_path.read_text(), running.log_tail(200)


def alive_and_no_unexpected_traceback(running: RunningOperator) -> None:
    """The process still runs, and every traceback it logged ends in a call that got no answer (a
    refused connection, a timeout: ``shared.kube.NO_ANSWER``), as a broken network must cause."""
    assert running.process.returncode is None, f"operator died:\n{running.log_tail()}"
    unexpected = unexpected_tracebacks(running.log_path.read_text(), no_answer_names())
    assert not unexpected, "\n\n".join(unexpected)


def no_answer_names() -> frozenset[str]:
    """How a traceback names each exception of ``NO_ANSWER`` (and their subclasses)."""

    def family(cls: type) -> Iterator[type]:
        yield cls
        subclass: type
        for subclass in cls.__subclasses__():
            yield from family(subclass)

    return frozenset(
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
        for base in NO_ANSWER
        for cls in family(base)
    )


def unexpected_tracebacks(log: str, allowed: frozenset[str]) -> list[str]:
    """Every traceback in ``log`` whose final exception is not one of ``allowed`` (chained causes
    before it do not matter). A traceback runs from its first line to the next log record."""
    found: list[str] = []
    block: list[str] | None = None
    for line in [*log.splitlines(), LOG_RECORD_END]:
        if LOG_RECORD.match(line) or line == LOG_RECORD_END:
            if block is not None:
                final = next((b for b in reversed(block) if b and not b[0].isspace()), "")
                if final.split(":", 1)[0] not in allowed:
                    found.append("\n".join(block))
            block = None
        elif line.startswith(TRACEBACK) and block is None:
            block = [line]
        elif block is not None:
            block.append(line)
    return found


def condition(obj: Obj | None, type_: str) -> tuple[str, str]:
    """(status, reason) of the condition ``type_`` of ``obj``; ("", "") when it has none."""
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return c["status"], c["reason"]
    return "", ""


def message(obj: Obj | None, type_: str) -> str:
    """The message of the condition ``type_`` of ``obj`` ("" when it has none)."""
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return str(c.get("message") or "")
    return ""


def phase(obj: Obj | None) -> str:
    return str(((obj or {}).get("status") or {}).get("phase") or "")


def attached(obj: Obj | None) -> bool:
    """Phase Attached, both conditions True (what ``status.phase`` projects them to)."""
    return (
        phase(obj) == ATTACHED
        and condition(obj, CONDITION_RESOLVED)[0] == "True"
        and condition(obj, CONDITION_PROVISIONED) == ("True", CONDITION_PROVISIONED)
    )


def provisioned_false(reason: str) -> Callable[[Obj | None], bool]:
    """The predicate: Provisioned False for ``reason``."""
    return lambda obj: condition(obj, CONDITION_PROVISIONED) == ("False", reason)


def resolved_false(reason: str) -> Callable[[Obj | None], bool]:
    """The predicate: Resolved False for ``reason``."""
    return lambda obj: condition(obj, CONDITION_RESOLVED) == ("False", reason)


def addresses(obj: Obj | None) -> list[str]:
    """An attachment's (or a claim's) addresses: ``status.addresses`` as strings either way."""
    found = ((obj or {}).get("status") or {}).get("addresses") or []
    return [str(a["address"]) if isinstance(a, Mapping) else str(a) for a in found]


def ingress(service: Obj | None) -> list[str]:
    found = (((service or {}).get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
    return [str(i.get("ip")) for i in found]


def controller_uid(obj: Obj | None) -> str | None:
    """The UID the object's controller owner reference names (None: no controller)."""
    for ref in ((obj or {}).get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


async def wait_attachment(
    kube: Kube,
    namespace: str,
    name: str,
    predicate: Callable[[Obj | None], bool],
    operator: RunningOperator | None = None,
    *,
    timeout: float = ANSWER_TIMEOUT,
    what: str = "",
) -> Obj:
    """The first state of the attachment satisfying ``predicate`` (the operator's log tail on failure)."""
    try:
        found = await wait_for_object(
            kube, ATTACHMENTS, name, predicate, namespace=namespace, timeout=timeout, what=what or name
        )
    except AssertionError as error:
        tail = f"\noperator log:\n{operator.log_tail()}" if operator is not None else ""
        raise AssertionError(f"{error}{tail}") from None
    assert found is not None
    return found


async def reconciles(operator: RunningOperator) -> float:
    """Passes over attachments so far, whatever their result."""
    samples = await operator.scrape()
    return sum(
        v
        for (name, labels), v in samples.items()
        if name == "controller_runtime_reconcile_total" and ("controller", ATTACHMENT_CONTROLLER) in labels
    )


# --- builders (the API's shapes, ready to create) --------------------------------------------------


def lineage(kind: str, name: str, group: str = APP_GROUP, *, tenant_facing: bool = True) -> dict[str, str]:
    """The labels Cozystack's lineage webhook stamps on an application's object (the tenant-facing
    marker only on Services the application lists as endpoints)."""
    return lineage_labels(group, kind, name, tenant_facing=tenant_facing)


def helmrelease_body(name: str, labels: Mapping[str, str]) -> Obj:
    """A Flux HelmRelease (an application), as Cozystack creates it, ready to create."""
    metadata: Obj = {"name": name, "labels": dict(labels)} if labels else {"name": name}
    return {
        "apiVersion": HELMRELEASE_API_VERSION,
        "kind": HELMRELEASE_KIND,
        "metadata": metadata,
        "spec": helmrelease_spec(),
    }


DEFAULT_PORTS: Final = ({"name": "postgres", "protocol": "TCP", "port": 5432, "targetPort": 5432},)


def service_body(
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    selector: Mapping[str, str] | None = None,
    ports: Sequence[Mapping[str, Any]] | None = None,
    annotations: Mapping[str, str] | None = None,
    type_: str = "ClusterIP",
) -> Obj:
    """A Service (by default a ClusterIP one on 5432)."""
    metadata: Obj = {"name": name}
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    spec: Obj = {"type": type_, "ports": [dict(p) for p in (DEFAULT_PORTS if ports is None else ports)]}
    if selector is not None:
        spec["selector"] = dict(selector)
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": spec}


def attachment_body(
    name: str,
    endpoint: str,
    *,
    app: str = "db",
    kind: str = "Postgres",
    group: str | None = None,
    class_name: str | None = None,
    claim_name: str | None = None,
    family: str | None = None,
    ports: Sequence[int] | None = None,
    method: str | None = None,
    allow_icmp: bool | None = None,
) -> Obj:
    """An EndpointAttachment as Cozystack's documentation writes it (``loadBalancer`` with neither
    ``className`` nor ``claimName``: the default class)."""
    balancer = load_balancer_spec(
        class_name=class_name,
        claim_name=claim_name,
        family=family,
        ports=ports,
        method=method,
        allow_icmp=allow_icmp,
    )
    return {
        "apiVersion": ATTACHMENTS.api_version,
        "kind": "EndpointAttachment",
        "metadata": {"name": name},
        "spec": attachment_spec(kind, app, group, endpoint, balancer),
    }


def address_class_body(
    name: str,
    cidrs: Sequence[str],
    *,
    reclaim: str = RETAIN,
    default: bool = False,
    provisioner: str = METALLB_PROVISIONER,
) -> Obj:
    """An IPAddressClass of the substrate, served by its MetalLB driver from ``cidrs``."""
    metadata: Obj = {"name": name}
    if default:
        metadata["annotations"] = {DEFAULT_CLASS_ANNOTATION: "true"}
    return {
        "apiVersion": CLASSES.api_version,
        "kind": "IPAddressClass",
        "metadata": metadata,
        "spec": {
            "provisioner": provisioner,
            "reclaimPolicy": reclaim,
            "parameters": {"addresses": list(cidrs)},
        },
    }


def claim_body(name: str, class_name: str | None = None, family: str | None = None) -> Obj:
    """A reserved IPAddressClaim (a tenant's, or a hoster's for a tenant)."""
    spec: Obj = {}
    if class_name is not None:
        spec["className"] = class_name
    if family is not None:
        spec["family"] = family
    return {
        "apiVersion": CLAIMS.api_version,
        "kind": "IPAddressClaim",
        "metadata": {"name": name},
        "spec": spec,
    }


def pool_body(name: str, cidrs: Sequence[str], *, silent: bool = False) -> Obj:
    """The MetalLB IPAddressPool the substrate's driver renders for class ``name`` (same spec, so the
    driver finds it as it wants it and leaves it); ``silent``: restricted to the driver's placeholder
    namespace, so MetalLB refuses every tenant Service the pinned address is asked for (a load
    balancer that never answers)."""
    spec: Obj = {
        "addresses": [str(ipaddress.ip_network(c, strict=False)) for c in cidrs],
        "autoAssign": False,
        "avoidBuggyIPs": False,
    }
    if silent:
        spec["serviceAllocation"] = {"namespaces": [PLACEHOLDER_NAMESPACE]}
    return {
        "apiVersion": POOLS.api_version,
        "kind": "IPAddressPool",
        "metadata": {"name": name, "namespace": METALLB_NAMESPACE},
        "spec": spec,
    }


class Tenant:
    """One tenant namespace and what the tests create in it; ``cleanup`` removes it all, the
    cluster-scoped objects included (``world``: the substrate and MetalLB, None for tests without
    addresses)."""

    def __init__(self, kube: Kube, namespace: str, world: World | None = None) -> None:
        self.kube, self.namespace, self.world = kube, namespace, world
        self.classes: list[str] = []
        self.cluster_objects: list[str] = []
        self.ips = iter(range(10, 250))

    async def app(self, name: str, kind: str = "Postgres") -> Obj:
        """A Cozystack application: its HelmRelease ``<kind>-<name>``, carrying the lineage labels."""
        body = helmrelease_body(f"{kind.lower()}-{name}", lineage(kind, name, tenant_facing=False))
        return await self.kube.create(HELMRELEASES.path(self.namespace), body)

    async def endpoint(
        self,
        name: str,
        app: str,
        *,
        selector: Mapping[str, str] | None,
        kind: str = "Postgres",
        ports: Sequence[Mapping[str, Any]] | None = None,
        tenant_facing: bool = True,
    ) -> Obj:
        """A Service of the app as Cozystack's lineage webhook labels it."""
        body = service_body(
            name, labels=lineage(kind, app, tenant_facing=tenant_facing), selector=selector, ports=ports
        )
        return await self.kube.create(SERVICES.path(self.namespace), body)

    async def app_with_endpoint(self, name: str = "db", kind: str = "Postgres") -> str:
        """An application and its tenant-facing Service ``<kind>-<name>-rw`` (selecting the
        application's primary); returns the Service's name."""
        await self.app(name, kind)
        endpoint = f"{kind.lower()}-{name}-rw"
        await self.endpoint(endpoint, name, kind=kind, selector={"app": name, "role": "primary"})
        return endpoint

    async def pod(self, name: str, labels: Mapping[str, str], ready: bool = True) -> Obj:
        """A Pod on the test node, marked Running (and Ready) with an IP, as the kubelet would."""
        pod = await self.kube.create(
            PODS.path(self.namespace),
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "labels": dict(labels)},
                "spec": {"nodeName": NODE, "containers": [{"name": "app", "image": "example.invalid/app:1"}]},
            },
        )
        await self.set_ready(name, ready)
        return pod

    async def set_ready(self, name: str, ready: bool) -> None:
        ip = f"10.244.1.{next(self.ips)}"
        status = {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        }
        await self.kube.patch(PODS.path(self.namespace, name) + "/status", {"status": status}, kind="merge")

    async def address_class(
        self,
        name: str,
        *cidrs: str,
        reclaim: str = RETAIN,
        default: bool = False,
        provisioner: str = METALLB_PROVISIONER,
        silent: bool = False,
    ) -> Obj:
        """An IPAddressClass (removed at cleanup, with its addresses and MetalLB pool). ``silent``:
        its pool is declared first, restricted so that MetalLB answers none of its Services (the
        driver finds the pool as it wants it and keeps it); ``answer`` lifts that."""
        self.classes.append(name)
        if silent:
            assert self.world is not None, "a silent class needs MetalLB"
            pool = Substrate.pool(name)
            self.cluster_objects.append(POOLS.path(METALLB_NAMESPACE, pool))
            await self.kube.create(POOLS.path(METALLB_NAMESPACE), pool_body(pool, cidrs, silent=True))
            await self.world.balancer.wait_for_pool(pool)
        body = address_class_body(name, cidrs, reclaim=reclaim, default=default, provisioner=provisioner)
        created = await self.kube.create(CLASSES.path(), body)
        if self.world is not None and provisioner == METALLB_PROVISIONER and cidrs:
            await self.world.balancer.wait_for_pool(Substrate.pool(name))
        return created

    async def answer(self, class_name: str) -> None:
        """MetalLB answers the Services of a silent class from now on (the restriction lifted)."""
        await self.kube.patch(
            POOLS.path(METALLB_NAMESPACE, Substrate.pool(class_name)),
            {"spec": {"serviceAllocation": None}},
            "merge",
        )

    async def policy(
        self,
        name: str,
        rules: Sequence[Mapping[str, Any]],
        expression: str,
        said: str,
        *,
        reason: str = "Forbidden",
    ) -> None:
        """A ValidatingAdmissionPolicy (as a hoster's webhook or policy would) bound to this namespace:
        it refuses, with ``said`` (403 Forbidden, or 422 for ``reason`` Invalid), the requests
        ``rules`` match whose ``expression`` is false (removed at cleanup; a test waits for it in force
        with a probe of its own)."""
        name = f"{name}-{self.namespace}"[:63]
        group = "admissionregistration.k8s.io/v1"
        validation = {"expression": expression, "message": said, "reason": reason}
        policy = {
            "apiVersion": group,
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [dict(r) for r in rules]},
                "validations": [validation],
            },
        }
        binding = {
            "apiVersion": group,
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: self.namespace}}
                },
            },
        }
        for resource, body in ((POLICIES, policy), (POLICY_BINDINGS, binding)):
            await self.kube.create(resource.path(), body)
            self.cluster_objects.append(resource.path(name=name))

    async def claim(self, name: str, class_name: str | None = None, family: str | None = None) -> Obj:
        """A reserved claim in the namespace."""
        return await self.kube.create(CLAIMS.path(self.namespace), claim_body(name, class_name, family))

    async def bound_claim(self, name: str, class_name: str | None = None, family: str | None = None) -> Obj:
        """A reserved claim, once the substrate bound it (every family it asks for)."""
        await self.claim(name, class_name, family)
        found = await wait_for_object(
            self.kube,
            CLAIMS,
            name,
            lambda c: phase(c) == "Bound",
            namespace=self.namespace,
            timeout=ANSWER_TIMEOUT,
            what=f"claim {name} Bound",
        )
        assert found is not None
        return found

    async def attachment(self, name: str, endpoint: str, **spec: Any) -> Obj:
        """An attachment of ``endpoint`` (``attachment_body``'s keywords)."""
        return await self.kube.create(
            ATTACHMENTS.path(self.namespace), attachment_body(name, endpoint, **spec)
        )

    async def get(self, name: str) -> Obj | None:
        return await self.kube.get(ATTACHMENTS.path(self.namespace, name))

    async def labelled_services(self, attachment: str) -> list[Obj]:
        """Every Service in the namespace carrying the diagnostic label for ``attachment``."""
        listing = await self.kube.list(
            SERVICES.path(self.namespace), label_selector=f"{ATTACHMENT_LABEL}={attachment}"
        )
        return list(listing["items"])

    async def service_of(self, attachment: Obj) -> Obj | None:
        """The Service the attachment controls (by owner reference to its UID); None: none."""
        uid = attachment["metadata"]["uid"]
        listing = await self.kube.list(SERVICES.path(self.namespace))
        mine = [s for s in listing["items"] if controller_uid(s) == uid]
        assert len(mine) <= 1, f"{len(mine)} Services controlled by {attachment['metadata']['name']}"
        return mine[0] if mine else None

    async def minted_claims(self, attachment: Obj) -> list[Obj]:
        """The claims the attachment controls (by owner reference to its UID)."""
        uid = attachment["metadata"]["uid"]
        listing = await self.kube.list(CLAIMS.path(self.namespace))
        return [c for c in listing["items"] if controller_uid(c) == uid]

    async def cleanup(self) -> None:
        """Attachments, claims, then the classes' addresses, classes and pools; each wait bounded,
        then forced (a finalizer whose owner is not running any more is removed)."""
        kube, ns = self.kube, self.namespace
        await _delete_all(kube, ATTACHMENTS, ns)
        await _delete_all(kube, CLAIMS, ns)
        for item in (await kube.list(ADDRESSES.path()))["items"]:
            if (item.get("spec") or {}).get("className") in self.classes:
                await kube.delete(ADDRESSES.path(name=item["metadata"]["name"]))
        for name in self.classes:
            await kube.delete(CLASSES.path(name=name))
        for path in self.cluster_objects:
            await kube.delete(path)
        if self.world is not None:
            for name in self.classes:
                await wait_for_object(
                    kube,
                    CLASSES,
                    name,
                    lambda c: c is None,
                    timeout=CLEANUP_TIMEOUT,
                    what=f"class {name} gone",
                )
                # The real driver's pool goes with its class by garbage collection, which only learns
                # of MetalLB's kinds at its next discovery (up to 30 s): delete it as the collector would.
                await kube.delete(POOLS.path(METALLB_NAMESPACE, Substrate.pool(name)))
                await wait_for_object(
                    kube,
                    POOLS,
                    Substrate.pool(name),
                    lambda p: p is None,
                    namespace=METALLB_NAMESPACE,
                    timeout=CLEANUP_TIMEOUT,
                    what=f"the pool of class {name} gone",
                )


async def _delete_all(kube: Kube, resource: Resource, namespace: str) -> None:
    """Delete every object of ``resource`` in the namespace and wait until they are gone; whatever
    a finalizer still holds after the bounded wait loses its finalizers."""
    for item in (await kube.list(resource.path(namespace)))["items"]:
        await kube.delete(resource.path(namespace, item["metadata"]["name"]))

    async def gone() -> bool:
        return not (await kube.list(resource.path(namespace)))["items"]

    try:
        await eventually(gone, timeout=CLEANUP_TIMEOUT, what=f"{resource.plural} in {namespace} gone")
    except AssertionError:
        for item in (await kube.list(resource.path(namespace)))["items"]:
            path = resource.path(namespace, item["metadata"]["name"])
            await kube.patch(path, {"metadata": {"finalizers": None}}, "merge")
