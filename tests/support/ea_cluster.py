"""The EndpointAttachment operator on a test cluster: its CRDs, its own ServiceAccount and RBAC, the
operator process, and what its integration tests read back (conditions, pass counts).

Shared by ``tests/integration/test_ea_operator.py`` (the design's proofs),
``tests/integration/test_ea_failures.py`` (refusals and waits as conditions) and
``tests/integration/test_ea_resilience.py`` (restarts and broken networks); ``Tenant`` builds a
tenant's world through the API. Decides only what they all
need the same way: the kinds' resources, the operator's namespace and RBAC (exactly what
``config/rbac/endpointattachment`` gives it, without the tenants' roles), and how it is started.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from hack.devcluster import ClusterInfo
from shared.kube import NO_ANSWER, Kube, Obj
from shared.resources import HELMRELEASES, NODES, PODS, SERVICES, Resource
from tests.ea_builders import (
    for_create,
    lineage_labels,
    make_attachment,
    make_claim,
    make_class,
    make_helmrelease,
    make_service,
    make_serviceproxy,
)
from tests.support.identity import serviceaccount_kubeconfig
from tests.support.manifests import apply_all, load
from tests.support.operators import RunningOperator, operator_process
from tests.support.waiting import eventually

GROUP_VERSION: Final = "local.sdn.cozystack.io/v1alpha1"
ATTACHMENTS: Final = Resource(GROUP_VERSION, "endpointattachments")
CLAIMS: Final = Resource(GROUP_VERSION, "ipaddressclaims")
CLASSES: Final = Resource(GROUP_VERSION, "ipaddressclasses", namespaced=False)
ALLOCATIONS: Final = Resource(GROUP_VERSION, "ipaddressallocations", namespaced=False)
PROXIES: Final = Resource(GROUP_VERSION, "serviceproxies", namespaced=False)
OPERATOR_NAMESPACE: Final = "cozy-endpointattachment"
OPERATOR_SERVICE_ACCOUNT: Final = "endpointattachment-operator"
# The Lease the operator's replicas elect a leader through (its settings' default).
LEADER_ELECTION_ID: Final = "cozystack-endpointattachment-operator"
RBAC_DIR: Final = "config/rbac/endpointattachment"
TENANT_ROLES: Final = frozenset({"tenant_roles.yaml"})  # the tenants' roles, not the operator's
# The controller whose passes the tests count (one of the operator's three).
ATTACHMENT_CONTROLLER: Final = "endpointattachment"
# The Node test Pods are bound to (no kubelet runs: tests mark Pods Ready themselves).
NODE: Final = "ea-it-node"
CRD_FILES: Final = [
    "tests/fixtures/helmrelease-crd.yaml",
    *(
        f"config/crd/endpointattachment/local.sdn.cozystack.io_{plural}.yaml"
        for plural in (
            "endpointattachments",
            "ipaddressclaims",
            "ipaddressclasses",
            "ipaddressallocations",
            "serviceproxies",
        )
    ),
]
# What every test runs the operator with: repair often, and a short grace, so orphans go quickly.
DEFAULT_ARGS: Final = ("--repair-interval-seconds=1", "--repair-grace-seconds=2")
TRACEBACK: Final = "Traceback"
# A log record starts with its time (shared.operator's format); a traceback ends at the next one.
LOG_RECORD: Final = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}")
LOG_RECORD_END: Final = "\0end of log"


@contextlib.asynccontextmanager
async def ea_crds_and_node(kube: Kube) -> AsyncIterator[None]:
    """The operator's CRDs and Flux's HelmRelease CRD (applied, established), and the test Node."""
    await apply_all(kube, [doc for path in CRD_FILES for doc in load(path)])
    await kube.create(NODES.path(), {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    try:
        yield
    finally:
        await kube.delete(NODES.path(name=NODE))


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


async def reconciles(operator: RunningOperator) -> float:
    """Passes over attachments so far, whatever their result."""
    samples = await operator.scrape()
    return sum(
        v
        for (name, labels), v in samples.items()
        if name == "controller_runtime_reconcile_total" and ("controller", ATTACHMENT_CONTROLLER) in labels
    )


class Tenant:
    """One tenant namespace and what the tests create in it (cluster-scoped objects are removed)."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube, self.namespace = kube, namespace
        self.cluster_objects: list[str] = []
        self.ips = iter(range(10, 250))

    async def app(self, name: str, kind: str = "Postgres") -> Obj:
        """A Cozystack application: its HelmRelease, carrying the lineage labels."""
        release = make_helmrelease(
            f"{kind.lower()}-{name}",
            self.namespace,
            labels=lineage_labels(kind=kind, name=name, tenant_facing=False),
        )
        body = for_create(release)
        return await self.kube.create(HELMRELEASES.path(self.namespace), body)

    async def endpoint(
        self,
        name: str,
        app: str,
        *,
        selector: Mapping[str, str],
        kind: str = "Postgres",
        ports: Sequence[Mapping[str, Any]] | None = None,
        tenant_facing: bool = True,
    ) -> Obj:
        """A Service of the app as Cozystack's lineage webhook labels it."""
        service = make_service(
            name,
            self.namespace,
            labels=lineage_labels(kind=kind, name=app, tenant_facing=tenant_facing),
            selector=selector,
            ports=ports,
        )
        body = for_create(service)
        return await self.kube.create(SERVICES.path(self.namespace), body)

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

    async def address_class(self, name: str, **kwargs: Any) -> Obj:
        self.cluster_objects.append(CLASSES.path(name=name))
        return await self.kube.create(CLASSES.path(), for_create(make_class(name, **kwargs)))

    async def proxy(self) -> Obj:
        self.cluster_objects.append(PROXIES.path(name="cozy-proxy"))
        return await self.kube.create(PROXIES.path(), for_create(make_serviceproxy()))

    async def attachment(self, name: str, endpoint: str, **kwargs: Any) -> Obj:
        built = make_attachment(name, self.namespace, endpoint=endpoint, owner_uid=None, **kwargs)
        return await self.kube.create(ATTACHMENTS.path(self.namespace), for_create(built))

    async def app_with_endpoint(self, name: str = "db") -> str:
        """An application and its tenant-facing Service ``postgres-<name>-rw`` (selecting the
        application's primary); returns the Service's name."""
        await self.app(name)
        endpoint = f"postgres-{name}-rw"
        await self.endpoint(endpoint, name, selector={"app": name, "role": "primary"})
        return endpoint

    async def claim(self, name: str, class_name: str, address: str | None = None) -> Obj:
        built = make_claim(name, self.namespace, class_name=class_name, address=address, phase=None)
        return await self.kube.create(CLAIMS.path(self.namespace), for_create(built))

    async def cleanup(self) -> None:
        for attachment in (await self.kube.list(ATTACHMENTS.path(self.namespace)))["items"]:
            await self.kube.delete(ATTACHMENTS.path(self.namespace, attachment["metadata"]["name"]))
        for path in self.cluster_objects:
            await self.kube.delete(path)
