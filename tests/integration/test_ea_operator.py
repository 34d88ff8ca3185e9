"""The EndpointAttachment operator on the local control plane, as a subprocess under its own
ServiceAccount and ClusterRole (config/rbac/endpointattachment), with the CRDs of
config/crd/endpointattachment and Flux's real HelmRelease CRD.

The load balancer is MetalLB's real controller, with an IPAddressPool per IPAddressClass as a hoster
declares them (``tests.support.loadbalancer``). The tests play the other missing parts through the
API: Cozystack's lineage webhook (labels on the apps' Services) and the kubelet (Pods marked Ready
with an IP; the endpoint-slice controller does the rest). Each test carries one of the design's proofs.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from hack.devcluster import ClusterInfo
from hack.metallb import MetalLB
from operators.endpointattachment.constants import (
    ATTACHMENT_LABEL,
    METALLB_IPS_ANNOTATION,
    REASON_ADDRESS_NOT_ANNOUNCED,
    REASON_ADDRESS_PENDING,
    SERVICE_PROXY_NAME_LABEL,
)
from shared.kube import Kube, Obj
from shared.resources import HELMRELEASES, NAMESPACES, SERVICE_ACCOUNTS, SERVICES
from shared.telemetry.tracing import TRACEPARENT_ANNOTATION
from tests.ea_builders import (
    for_create,
    make_claim,
)
from tests.support.ea_cluster import (
    ALLOCATIONS,
    ATTACHMENT_CONTROLLER,
    ATTACHMENTS,
    CLAIMS,
    CLASSES,
    GROUP_VERSION,
    OPERATOR_NAMESPACE,
    Tenant,
    condition,
    ea_crds_and_node,
    ea_operator,
    reconciles,
)
from tests.support.loadbalancer import SILENT_LOAD_BALANCER_CLASS
from tests.support.operators import RunningOperator
from tests.support.otlp import attributes, otlp_receiver
from tests.support.waiting import eventually, wait_for_object


@pytest.fixture(scope="module")
async def ea_crds(kube: Kube) -> AsyncIterator[None]:
    async with ea_crds_and_node(kube):
        yield


@pytest.fixture
async def operator(
    kube: Kube, cluster: ClusterInfo, ea_crds: None, tmp_path: Path
) -> AsyncIterator[RunningOperator]:
    async with ea_operator(kube, cluster, tmp_path) as running:
        yield running


@pytest.fixture
async def tenant(kube: Kube, namespace: str, ea_crds: None) -> AsyncIterator[Tenant]:
    await wait_for_object(kube, SERVICE_ACCOUNTS, "default", lambda o: o is not None, namespace=namespace)
    world = Tenant(kube, namespace)
    yield world
    await world.cleanup()


async def wait_attachment(
    kube: Kube,
    namespace: str,
    name: str,
    status: str,
    reason: str,
    operator: RunningOperator,
    type_: str = "Ready",
) -> Obj:
    try:
        found = await wait_for_object(
            kube,
            ATTACHMENTS,
            name,
            lambda o: condition(o, type_) == (status, reason),
            namespace=namespace,
            timeout=40,
        )
    except AssertionError as error:
        raise AssertionError(f"{error}\noperator log:\n{operator.log_tail()}") from None
    assert found is not None
    return found


async def rendered(kube: Kube, namespace: str, attachment: str) -> Obj | None:
    return await kube.get(SERVICES.path(namespace, f"ea-{attachment}"))


# --- the tests -------------------------------------------------------------------------------------


async def test_minted_attachment_renders_a_mirroring_service_and_becomes_ready(
    kube: Kube, tenant: Tenant, operator: RunningOperator, lb: MetalLB
) -> None:
    ns = tenant.namespace
    await tenant.address_class("it-mint", cidrs=["198.51.100.0/29"])
    await tenant.app("db")
    await tenant.endpoint("postgres-db-rw", "db", selector={"app": "db"})
    await tenant.attachment("db-public", "postgres-db-rw", class_name="it-mint")
    ready = await wait_attachment(kube, ns, "db-public", "True", "Published", operator)

    address = ready["status"]["address"]
    assert address.startswith("198.51.100.")
    owner = ready["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("HelmRelease", "postgres-db")
    service = await rendered(kube, ns, "db-public")
    assert service is not None
    assert service["spec"]["type"] == "LoadBalancer"
    assert service["spec"]["selector"] == {"app": "db"}
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(5432, 5432)]
    assert service["metadata"]["annotations"][METALLB_IPS_ANNOTATION] == address
    # Nothing of the app's labels is copied: the platform must not take it for the app's own Service.
    assert set(service["metadata"]["labels"]) == {ATTACHMENT_LABEL}
    assert service["metadata"]["ownerReferences"][0]["uid"] == ready["metadata"]["uid"]
    allocation = await kube.get(ALLOCATIONS.path(name=address))
    assert allocation is not None
    assert allocation["spec"]["holder"]["uid"] == ready["metadata"]["uid"]

    # A pass with nothing to change writes nothing: wake the attachment through its endpoint.
    versions = (ready["metadata"]["resourceVersion"], service["metadata"]["resourceVersion"])
    before = await reconciles(operator)
    await kube.patch(
        SERVICES.path(ns, "postgres-db-rw"), {"metadata": {"annotations": {"touch": "1"}}}, "merge"
    )
    await eventually(lambda: _more(operator, before), what="a pass over the attachment")
    again = await kube.get(ATTACHMENTS.path(ns, "db-public"))
    again_service = await rendered(kube, ns, "db-public")
    assert again is not None
    assert again_service is not None
    assert (again["metadata"]["resourceVersion"], again_service["metadata"]["resourceVersion"]) == versions

    # It follows the endpoint: a new port is mirrored.
    await kube.patch(
        SERVICES.path(ns, "postgres-db-rw"),
        {
            "spec": {
                "ports": [
                    {"name": "postgres", "port": 5432, "targetPort": 5432},
                    {"name": "metrics", "port": 9187},
                ]
            }
        },
        "merge",
    )
    await wait_for_object(
        kube, SERVICES, "ea-db-public", lambda s: s is not None and len(s["spec"]["ports"]) == 2, namespace=ns
    )

    # Deleting the attachment removes the Service first, then releases the minted address.
    await kube.delete(ATTACHMENTS.path(ns, "db-public"))
    await wait_for_object(kube, ATTACHMENTS, "db-public", lambda o: o is None, namespace=ns)
    assert await rendered(kube, ns, "db-public") is None
    assert await kube.get(ALLOCATIONS.path(name=address)) is None


async def _more(operator: RunningOperator, before: float) -> bool:
    return await reconciles(operator) > before


async def test_a_load_balancer_that_never_answers_leaves_the_attachment_not_ready(
    kube: Kube, tenant: Tenant, operator: RunningOperator, lb: MetalLB
) -> None:
    """The one misbehaving load balancer of the suite, a silent one: the class names a
    loadBalancerClass no load balancer here serves, so nothing ever writes the rendered Service's
    ingress (no test writes it either). The attachment reports that, not Ready, while an attachment
    of a class MetalLB serves, rendered after it, is Published; once the hoster drops that
    loadBalancerClass, the Service is rendered anew, MetalLB answers, and it is Published too."""
    ns = tenant.namespace
    await tenant.address_class(
        "it-silent", cidrs=["198.51.100.96/29"], load_balancer_class=SILENT_LOAD_BALANCER_CLASS
    )
    await tenant.address_class("it-served", cidrs=["198.51.100.104/29"])
    for app in ("silent", "served"):
        await tenant.app(app)
        await tenant.endpoint(f"postgres-{app}-rw", app, selector={"app": app})
    await tenant.attachment("silent", "postgres-silent-rw", class_name="it-silent")
    silent_service = await wait_for_object(kube, SERVICES, "ea-silent", lambda s: s is not None, namespace=ns)
    assert silent_service is not None
    assert silent_service["spec"]["loadBalancerClass"] == SILENT_LOAD_BALANCER_CLASS

    await tenant.attachment("served", "postgres-served-rw", class_name="it-served")
    await wait_attachment(kube, ns, "served", "True", "Published", operator)
    unanswered = {("False", REASON_ADDRESS_PENDING), ("False", REASON_ADDRESS_NOT_ANNOUNCED)}
    silent = await wait_for_object(
        kube, ATTACHMENTS, "silent", lambda o: condition(o, "Ready") in unanswered, namespace=ns
    )
    assert condition(silent, "AddressBound")[0] == "True"
    address = (silent or {})["status"]["address"]
    service = await rendered(kube, ns, "silent")
    assert service is not None
    assert service["metadata"]["annotations"][METALLB_IPS_ANNOTATION] == address
    assert not ((service.get("status") or {}).get("loadBalancer") or {}).get("ingress")

    # The hoster fixes the class: MetalLB serves Services without a loadBalancerClass.
    await kube.patch(CLASSES.path(name="it-silent"), {"spec": {"loadBalancerClass": None}}, "merge")
    published = await wait_attachment(kube, ns, "silent", "True", "Published", operator)
    assert published["status"]["address"] == address
    service = await rendered(kube, ns, "silent")
    assert service is not None
    assert "loadBalancerClass" not in service["spec"]
    assert [i["ip"] for i in service["status"]["loadBalancer"]["ingress"]] == [address]


async def test_hold_and_move_a_claimed_address(
    kube: Kube, tenant: Tenant, operator: RunningOperator, lb: MetalLB
) -> None:
    ns = tenant.namespace
    await tenant.address_class("it-claims", cidrs=["198.51.100.16/29"])
    await tenant.claim("my-ip", "it-claims", address="198.51.100.20")
    await wait_for_object(
        kube, CLAIMS, "my-ip", lambda c: (c or {}).get("status", {}).get("phase") == "Bound", namespace=ns
    )
    await tenant.app("one")
    await tenant.endpoint("postgres-one-rw", "one", selector={"app": "one"})
    await tenant.attachment("first", "postgres-one-rw", class_name=None, claim_name="my-ip")
    first = await wait_attachment(kube, ns, "first", "True", "Published", operator)
    assert first["status"]["address"] == "198.51.100.20"

    # Hold: the claim's address survives the attachment that used it.
    await kube.delete(ATTACHMENTS.path(ns, "first"))
    await wait_for_object(kube, ATTACHMENTS, "first", lambda o: o is None, namespace=ns)
    claim = await kube.get(CLAIMS.path(ns, "my-ip"))
    assert claim is not None
    assert (claim["status"]["phase"], claim["status"]["address"]) == ("Bound", "198.51.100.20")
    assert "attachment" not in claim["status"]
    assert await kube.get(ALLOCATIONS.path(name="198.51.100.20")) is not None

    # Move: another application in the namespace binds the same address.
    await tenant.app("two", kind="MySQL")
    await tenant.endpoint("mysql-two", "two", kind="MySQL", selector={"app": "two"})
    await tenant.attachment("second", "mysql-two", class_name=None, claim_name="my-ip")
    second = await wait_attachment(kube, ns, "second", "True", "Published", operator)
    assert second["status"]["address"] == "198.51.100.20"

    # A claim in use cannot be deleted; it goes once its user is gone.
    await kube.delete(CLAIMS.path(ns, "my-ip"))
    held = await kube.get(CLAIMS.path(ns, "my-ip"))
    assert held is not None
    assert held["metadata"].get("deletionTimestamp")
    await kube.delete(ATTACHMENTS.path(ns, "second"))
    await wait_for_object(kube, CLAIMS, "my-ip", lambda c: c is None, namespace=ns)
    await wait_for_object(kube, ALLOCATIONS, "198.51.100.20", lambda a: a is None)


async def test_a_claim_in_another_namespace_cannot_be_named(
    kube: Kube, tenant: Tenant, operator: RunningOperator, namespace: str
) -> None:
    other = f"{namespace}-other"[:63]
    await kube.create(
        NAMESPACES.path(), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": other}}
    )
    try:
        await tenant.address_class("it-xns", cidrs=["198.51.100.32/29"])
        await kube.create(
            CLAIMS.path(other),
            for_create(make_claim("theirs", other, class_name="it-xns", address=None, phase=None)),
        )
        await tenant.app("db")
        await tenant.endpoint("postgres-db-rw", "db", selector={"app": "db"})
        await tenant.attachment("steal", "postgres-db-rw", class_name=None, claim_name="theirs")
        await wait_attachment(
            kube, namespace, "steal", "False", "ClaimNotFound", operator, type_="AddressBound"
        )
    finally:
        await kube.delete(NAMESPACES.path(name=other))


async def test_identity_a_squatting_service_is_never_touched(
    kube: Kube, tenant: Tenant, operator: RunningOperator
) -> None:
    ns = tenant.namespace
    await tenant.address_class("it-ident", cidrs=["198.51.100.40/29"])
    await tenant.app("db")
    await tenant.endpoint("postgres-db-rw", "db", selector={"app": "db"})
    squatter = await kube.create(
        SERVICES.path(ns),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "ea-db-public", "labels": {ATTACHMENT_LABEL: "db-public"}},
            "spec": {"selector": {"app": "elsewhere"}, "ports": [{"port": 1}]},
        },
    )
    await tenant.attachment("db-public", "postgres-db-rw", class_name="it-ident")
    await wait_attachment(kube, ns, "db-public", "False", "ServiceNameConflict", operator)
    still = await rendered(kube, ns, "db-public")
    assert still is not None
    assert still["metadata"]["resourceVersion"] == squatter["metadata"]["resourceVersion"]


async def test_identity_deleting_the_application_collects_its_attachment(
    kube: Kube, tenant: Tenant, operator: RunningOperator, lb: MetalLB
) -> None:
    ns = tenant.namespace
    await tenant.address_class("it-gc", cidrs=["198.51.100.48/29"])
    app = await tenant.app("db")
    await tenant.endpoint("postgres-db-rw", "db", selector={"app": "db"})
    await tenant.attachment("db-public", "postgres-db-rw", class_name="it-gc")
    ready = await wait_attachment(kube, ns, "db-public", "True", "Published", operator)
    address = ready["status"]["address"]

    # Real garbage collection: the owner reference to the HelmRelease takes the attachment along,
    # and our finalizer releases its Service and address on the way out.
    await kube.delete(HELMRELEASES.path(ns, app["metadata"]["name"]))
    await wait_for_object(kube, ATTACHMENTS, "db-public", lambda o: o is None, namespace=ns, timeout=60)
    assert await rendered(kube, ns, "db-public") is None
    await wait_for_object(kube, ALLOCATIONS, address, lambda a: a is None)

    # The application recreated under the same name inherits nothing.
    await tenant.app("db")
    assert (await kube.list(ATTACHMENTS.path(ns)))["items"] == []


async def test_no_double_mint_and_pool_exhaustion_recovers(
    kube: Kube, tenant: Tenant, operator: RunningOperator, lb: MetalLB
) -> None:
    ns = tenant.namespace
    await tenant.address_class("it-small", cidrs=["198.51.100.56/29"])  # 6 usable addresses
    await tenant.app("db")
    await tenant.endpoint("postgres-db-rw", "db", selector={"app": "db"})
    names = [f"a{i}" for i in range(8)]
    await asyncio.gather(*(tenant.attachment(n, "postgres-db-rw", class_name="it-small") for n in names))

    async def settled() -> list[Obj] | None:
        items = (await kube.list(ATTACHMENTS.path(ns)))["items"]
        ready = [a for a in items if condition(a, "Ready") == ("True", "Published")]
        exhausted = [a for a in items if condition(a, "AddressBound") == ("False", "PoolExhausted")]
        return items if len(ready) == 6 and len(exhausted) == 2 else None

    items = await eventually(settled, timeout=60, what="6 published, 2 exhausted")
    addresses = [a["status"]["address"] for a in items if a.get("status", {}).get("address")]
    assert len(addresses) == len(set(addresses)) == 6
    allocations = [
        a for a in (await kube.list(ALLOCATIONS.path()))["items"] if a["spec"]["className"] == "it-small"
    ]
    assert sorted(a["spec"]["address"] for a in allocations) == sorted(addresses)

    # Freeing one address lets an exhausted attachment have it.
    winner = next(a for a in items if a.get("status", {}).get("address"))
    await kube.delete(ATTACHMENTS.path(ns, winner["metadata"]["name"]))
    items = await eventually(
        lambda: _published_count(kube, ns, 6),
        timeout=60,
        what="an exhausted attachment takes the freed address",
    )
    assert len({a["status"]["address"] for a in items}) == 6


async def _published_count(kube: Kube, ns: str, count: int) -> list[Obj] | None:
    items = (await kube.list(ATTACHMENTS.path(ns)))["items"]
    ready = [a for a in items if condition(a, "Ready") == ("True", "Published")]
    return ready if len(ready) == count else None


async def test_vm_modes_need_a_declared_proxy_and_no_port_translation(
    kube: Kube, tenant: Tenant, operator: RunningOperator, lb: MetalLB
) -> None:
    ns = tenant.namespace
    await tenant.address_class("it-vm", cidrs=["198.51.100.64/29"])
    await tenant.app("vm1", kind="VMInstance")
    await tenant.endpoint(
        "vm1",
        "vm1",
        kind="VMInstance",
        selector={"vm": "vm1"},
        ports=[{"name": "ssh", "protocol": "TCP", "port": 22, "targetPort": 22}],
    )
    await tenant.endpoint(
        "vm1-web",
        "vm1",
        kind="VMInstance",
        selector={"vm": "vm1"},
        ports=[{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}],
    )
    await tenant.attachment("vm-ssh", "vm1", class_name="it-vm", mode="PortList")
    await wait_attachment(kube, ns, "vm-ssh", "False", "ProxyNotDeclared", operator, type_="DatapathAdmitted")
    assert await rendered(kube, ns, "vm-ssh") is None

    await tenant.proxy()
    await tenant.pod("vm1-launcher", {"vm": "vm1"})
    await wait_attachment(kube, ns, "vm-ssh", "True", "Published", operator)
    service = await rendered(kube, ns, "vm-ssh")
    assert service is not None
    assert service["metadata"]["labels"][SERVICE_PROXY_NAME_LABEL] == "cozy-proxy"

    await tenant.attachment("vm-web", "vm1-web", class_name="it-vm", mode="PortList")
    await wait_attachment(
        kube, ns, "vm-web", "False", "PortTranslationUnsupported", operator, type_="DatapathAdmitted"
    )


async def test_exclusivity_per_backend_pod(
    kube: Kube, tenant: Tenant, operator: RunningOperator, lb: MetalLB
) -> None:
    ns = tenant.namespace
    await tenant.address_class("it-excl", cidrs=["198.51.100.72/29"])
    await tenant.proxy()
    await tenant.app("vm2", kind="VMInstance")
    await tenant.endpoint(
        "vm2",
        "vm2",
        kind="VMInstance",
        selector={"vm": "vm2"},
        ports=[{"name": "ssh", "protocol": "TCP", "port": 22, "targetPort": 22}],
    )
    await tenant.pod("vm2-launcher", {"vm": "vm2"})

    # Two VM-mode attachments on one pod: the older publishes, the younger is dark.
    await tenant.attachment("older", "vm2", class_name="it-excl", mode="WholeIP")
    await wait_attachment(kube, ns, "older", "True", "Published", operator)
    await tenant.attachment("younger", "vm2", class_name="it-excl", mode="WholeIP")
    await wait_attachment(
        kube, ns, "younger", "False", "ExclusivityConflict", operator, type_="DatapathAdmitted"
    )
    assert await rendered(kube, ns, "younger") is None

    # A chart's own cozy-proxy Service on the pod beats every attachment.
    await kube.create(
        SERVICES.path(ns),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "vm2-chart", "labels": {SERVICE_PROXY_NAME_LABEL: "cozy-proxy"}},
            "spec": {"selector": {"vm": "vm2"}, "ports": [{"port": 22}]},
        },
    )
    await wait_attachment(
        kube, ns, "older", "False", "ExclusivityConflict", operator, type_="DatapathAdmitted"
    )
    await wait_for_object(kube, SERVICES, "ea-older", lambda s: s is None, namespace=ns)
    await kube.delete(SERVICES.path(ns, "vm2-chart"))
    await wait_attachment(kube, ns, "older", "True", "Published", operator)
    await kube.delete(ATTACHMENTS.path(ns, "younger"))

    # WholeIP with two ready backends stays dark, and publishes again at one.
    await tenant.pod("vm2-launcher-2", {"vm": "vm2"})
    await wait_attachment(kube, ns, "older", "False", "MultipleBackends", operator, type_="DatapathAdmitted")
    await wait_for_object(kube, SERVICES, "ea-older", lambda s: s is None, namespace=ns)
    await tenant.set_ready("vm2-launcher-2", False)
    await wait_attachment(kube, ns, "older", "True", "Published", operator)


async def test_repair_releases_an_orphaned_allocation(
    kube: Kube, tenant: Tenant, operator: RunningOperator
) -> None:
    await tenant.address_class("it-repair", cidrs=["198.51.100.80/29"])
    orphan = {
        "apiVersion": GROUP_VERSION,
        "kind": "IPAddressAllocation",
        "metadata": {"name": "198.51.100.81"},
        "spec": {
            "address": "198.51.100.81",
            "className": "it-repair",
            "holder": {
                "kind": "EndpointAttachment",
                "namespace": tenant.namespace,
                "name": "gone",
                "uid": "0000-gone",
            },
        },
    }
    await kube.create(ALLOCATIONS.path(), orphan)
    await wait_for_object(kube, ALLOCATIONS, "198.51.100.81", lambda a: a is None, timeout=30)


async def test_traces_chain_an_attachments_life_and_metrics_describe_it(
    kube: Kube, cluster: ClusterInfo, tenant: Tenant, lb: MetalLB, tmp_path: Path
) -> None:
    ns = tenant.namespace
    with otlp_receiver() as receiver:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "COZY_TRACE_UNCHANGED_RATIO": "1",
            "OTEL_RESOURCE_ATTRIBUTES": f"k8s.pod.name=ea-under-test,k8s.namespace.name={OPERATOR_NAMESPACE}",
        }
        async with ea_operator(kube, cluster, tmp_path, env) as operator:
            await tenant.address_class("it-trace", cidrs=["198.51.100.88/29"])
            await tenant.app("db")
            await tenant.endpoint("postgres-db-rw", "db", selector={"app": "db"})
            await tenant.attachment("traced", "postgres-db-rw", class_name="it-trace")
            ready = await wait_attachment(kube, ns, "traced", "True", "Published", operator)
            uid = ready["metadata"]["uid"]

            # The rendered Service carries the traceparent of the pass that wrote it.
            service = await rendered(kube, ns, "traced")
            assert service is not None
            traceparent = service["metadata"]["annotations"][TRACEPARENT_ANNOTATION]
            version, trace_id, _, _ = traceparent.split("-")
            assert (version, len(trace_id)) == ("00", 32)

            def passes() -> list[Span]:
                return sorted(
                    (
                        s
                        for s in receiver.snapshot()
                        if s.name == "reconcile EndpointAttachment"
                        and attributes(s).get("k8s.object.uid") == uid
                    ),
                    key=lambda s: s.start_time_unix_nano,
                )

            async def published() -> list[Span] | None:
                chain = passes()
                reasons = [attributes(s).get("condition.reasons") for s in chain]
                return chain if any(isinstance(r, list) and "Published" in r for r in reasons) else None

            chain = await eventually(published, what="the pass that published, exported")
            # At least: minted and rendered (one pass decides again after a mint), then the load
            # balancer answered and the attachment was Ready.
            assert len(chain) >= 2
            for earlier, later in itertools.pairwise(chain):
                assert any(link.span_id == earlier.span_id for link in later.links), "passes are not chained"
            outcomes = {attributes(s)["outcome"] for s in chain}
            assert "changed" in outcomes
            writes = [s for s in receiver.snapshot() if s.name == "POST services"]
            assert any(s.trace_id.hex() == trace_id for s in writes), (
                "no Service write in the annotated trace"
            )
            assert any(r.get("k8s.pod.name") == "ea-under-test" for r in receiver.resources)
            assert any(
                r.get("service.name") == "cozystack-endpointattachment-operator" for r in receiver.resources
            )

            # Metrics, parsed as Prometheus would.
            samples = await operator.scrape()
            names = {name for name, _ in samples}
            assert {
                "controller_runtime_reconcile_total",
                "controller_runtime_reconcile_time_seconds_bucket",
                "workqueue_depth",
                "leader_election_master_status",
            } <= names
            assert {labels for name, labels in samples if name == "controller_runtime_active_workers"} == {
                (("controller", controller),)
                for controller in ("endpointattachment", "ipaddressclaim", "ipaddressclass")
            }
            success = (
                "controller_runtime_reconcile_total",
                (("controller", ATTACHMENT_CONTROLLER), ("result", "success")),
            )
            assert samples[success] >= 1
            allocated = (
                "cozystack_endpointattachment_pool_addresses",
                (("ipaddressclass", "it-trace"), ("state", "allocated")),
            )
            assert samples[allocated] == 1
            published_ready = (
                "cozystack_endpointattachment_attachments",
                (("reason", "Published"), ("status", "True"), ("type", "Ready")),
            )
            assert samples[published_ready] >= 1
            assert await operator.healthz() == 200
