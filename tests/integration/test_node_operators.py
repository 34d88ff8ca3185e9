"""Both operators installed as shipped, run by a real kubelet (harness/node.py).

The GPUClass operator from the kustomize tree (config/default/gpuclass), the EndpointAttachment
operator from its Helm chart (charts/endpointattachment), each with only the image overridden to the
one built here (make image). On a control plane of this module's own (its node, scheduler and
workload controllers would act on every other suite's Deployments and fake Nodes):

* both reach 2/2 Ready in namespaces enforcing ``restricted`` Pod Security;
* each Lease is held by one of the operator's Pods;
* deleting the leader Pod hands the Lease to the other within the lease duration + 5 s;
* a rolling update to a new image tag never leaves the operator without a ready replica, and the
  PodDisruptionBudget refuses the eviction that would;
* the GPUClass operator, from inside its Pods, writes a class's status; the EndpointAttachment
  operator, from inside its Pods, makes an attachment Provisioned through real MetalLB (the address
  substrate's model, in this process, binds the claim and pins the address);
* work in flight finishes across a failover: the leader Pod deleted while 20 attachments are being
  provisioned, every one ends Provisioned with exactly one claim and one Service of its own, no two
  on one address, and each attachment's Provisioned turns True once and stays so;
* the probes are what the kubelet acts on: a leader whose process is frozen (SIGSTOP) turns
  NotReady (/readyz), loses its Lease to the standby once the lease expires (within the lease
  duration, two retry periods and 5 s), and is restarted by the kubelet (/healthz).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from hack.devcluster import ClusterInfo, LocalControlPlane, external_cluster
from hack.metallb import MetalLB, metallb
from hack.substrate import pool_name
from harness.following import follow
from harness.image import build_image
from harness.lane import address_substrate
from harness.manifests import ROOT, apply_all, load
from harness.node import NodeInfo, running_node
from harness.substrate import DEFAULT_CLASS_ANNOTATION, METALLB_PROVISIONER
from harness.waiting import eventually, wait_for_object
from operators.endpointattachment.api import ATTACHMENT_KIND, ATTACHMENTS, CLAIM_ANNOTATION, CLAIMS, CLASSES
from operators.gpuclass import reasons
from operators.gpuclass.api import GPUCLASSES
from shared.kube import ApiError, Kube, Obj
from shared.lineage import (
    LABEL_TRUE,
    TENANT_RESOURCE_LABEL,
    ApplicationRef,
)
from shared.ownership import is_controlled_by
from shared.resources import DEPLOYMENTS, HELMRELEASES, LEASES, NAMESPACES, PDBS, PODS, SERVICES

SHIPPED_IMAGE = "ghcr.io/cozystack/cozystack-operators"
LEASE_DURATION_SECONDS = 15.0  # shared.runtime.manager.LeaderElection's default
HANDOVER_SLACK_SECONDS = 5.0
RETRY_PERIOD_SECONDS = 2.0  # shared.runtime.manager.LeaderElection's default
# A frozen leader releases nothing: the standby sees its last renewal up to one retry period late,
# waits the lease duration from then, and tries again within one more retry period.
FROZEN_HANDOVER_SECONDS = LEASE_DURATION_SECONDS + 2 * RETRY_PERIOD_SECONDS + HANDOVER_SLACK_SECONDS
ROLLOUT_TIMEOUT_SECONDS = 240.0
# The tenant, its application and the class the address substrate's model serves, on this module's
# control plane (RFC 5737's documentation range; MetalLB only assigns it, nothing routes it).
TENANT = "node-tenant"
APP = "db"
ENDPOINT = "postgres-db-rw"
ADDRESS_CLASS = "node-public"
ADDRESS_RANGE = "192.0.2.0/26"
IN_FLIGHT = 20  # attachments being provisioned when the leader goes
SOURCE = {"kind": "HelmRepository", "name": "apps"}  # the application's chart source (never read)
BALANCER: MetalLB | None = None  # the module's MetalLB, for a failure's message
PROVISION_TIMEOUT_SECONDS = 120.0
TOOL_TIMEOUT_SECONDS = 120.0


@dataclass(frozen=True)
class Operator:
    name: str  # the Deployment, ServiceAccount and PDB name
    namespace: str
    lease: str
    install: str  # "kustomize" | "helm"


GPUCLASS = Operator("gpuclass-operator", "cozy-gpuclass", "cozystack-gpuclass-operator", "kustomize")
ENDPOINTATTACHMENT = Operator(
    "endpointattachment-operator", "cozy-endpointattachment", "cozystack-endpointattachment-operator", "helm"
)
OPERATORS = (GPUCLASS, ENDPOINTATTACHMENT)


async def run(*argv: str, stdin: str | None = None) -> str:
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE if stdin is not None else None,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    out, err = await asyncio.wait_for(
        process.communicate(stdin.encode() if stdin is not None else None), timeout=TOOL_TIMEOUT_SECONDS
    )
    assert process.returncode == 0, f"{' '.join(argv)}:\n{err.decode()}"
    return out.decode()


# --- the world ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def node_cluster() -> Iterator[ClusterInfo]:
    if external_cluster() is not None:
        pytest.skip("the test node runs beside the local control plane only")
    with LocalControlPlane() as info:
        yield info


@pytest.fixture(scope="module")
def image() -> str:
    return build_image()


@pytest.fixture(scope="module")
def node(node_cluster: ClusterInfo, image: str) -> Iterator[NodeInfo]:
    with running_node(node_cluster, [image]) as info:
        print(f"\nnode {info.name} Ready in {info.ready_seconds:.1f}s")
        yield info


@pytest.fixture(scope="module")
async def nkube(node_cluster: ClusterInfo) -> Kube:
    return await Kube.connect(node_cluster.kubeconfig)


async def install_kustomize(cluster: ClusterInfo, image: str, directory: Path) -> None:
    """config/default/gpuclass as kustomize builds it, with kustomize's own image override only."""
    repository, _, tag = image.rpartition(":")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                # kustomize takes no absolute root; outside this directory needs LoadRestrictionsNone.
                "resources": [os.path.relpath(ROOT / "config" / "default" / "gpuclass", directory)],
                "images": [{"name": SHIPPED_IMAGE, "newName": repository, "newTag": tag}],
            }
        )
    )
    rendered = await run(
        cluster.kubectl, "kustomize", "--load-restrictor=LoadRestrictionsNone", str(directory)
    )
    await run(
        cluster.kubectl,
        f"--kubeconfig={cluster.kubeconfig}",
        "apply",
        "--server-side",
        "-f",
        "-",
        stdin=rendered,
    )


async def install_helm(cluster: ClusterInfo, kube: Kube, image: str, home: Path) -> None:
    """charts/endpointattachment into its namespace (made from config/default, as install.md says),
    with image.repository and image.tag set; its prerequisites first, as a hoster has them: Flux's
    HelmRelease CRD and the address substrate's CRDs (the operator consumes those kinds)."""
    repository, _, tag = image.rpartition(":")
    await apply_all(kube, load("tests/fixtures/helmrelease-crd.yaml"))
    substrate_crds = sorted((ROOT / "tests" / "fixtures" / "address-substrate").glob("*.yaml"))
    await apply_all(kube, [doc for path in substrate_crds for doc in load(path)])
    await apply_all(kube, load("config/default/endpointattachment/namespace.yaml"))
    helm = (await run(str(ROOT / "hack" / "build-tool.sh"), "helm")).strip().splitlines()[-1]
    env = {f"HELM_{k}_HOME": str(home / k.lower()) for k in ("CACHE", "CONFIG", "DATA")}
    process = await asyncio.create_subprocess_exec(
        helm,
        "install",
        "endpointattachment",
        "charts/endpointattachment",
        f"--kubeconfig={cluster.kubeconfig}",
        f"--namespace={ENDPOINTATTACHMENT.namespace}",
        f"--set=image.repository={repository},image.tag={tag}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, **env},
    )
    _, err = await asyncio.wait_for(process.communicate(), timeout=TOOL_TIMEOUT_SECONDS)
    assert process.returncode == 0, f"helm install: {err.decode()}"


def rolled_out(replicas: int = 2) -> Callable[[Obj | None], bool]:
    def done(deployment: Obj | None) -> bool:
        if deployment is None:
            return False
        status = deployment.get("status") or {}
        return bool(
            status.get("observedGeneration", 0) >= deployment["metadata"]["generation"]
            and status.get("updatedReplicas") == replicas
            and status.get("readyReplicas") == replicas
            and status.get("availableReplicas") == replicas
            and status.get("replicas") == replicas
        )

    return done


@pytest.fixture(scope="module")
async def installed(
    nkube: Kube,
    node_cluster: ClusterInfo,
    node: NodeInfo,
    image: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Operator]:
    started = time.monotonic()
    await install_kustomize(node_cluster, image, tmp_path_factory.mktemp("kustomize"))
    await install_helm(node_cluster, nkube, image, tmp_path_factory.mktemp("helm"))
    for operator in OPERATORS:
        await steady(nkube, operator)
    print(f"\nboth operators 2/2 Ready {time.monotonic() - started:.1f}s after install")
    return {operator.name: operator for operator in OPERATORS}


async def steady(kube: Kube, operator: Operator) -> None:
    """Wait until the operator's Deployment is rolled out with both replicas ready."""
    try:
        await wait_for_object(
            kube,
            DEPLOYMENTS,
            operator.name,
            rolled_out(),
            namespace=operator.namespace,
            timeout=ROLLOUT_TIMEOUT_SECONDS,
            what=f"{operator.name} 2/2 ready",
        )
    except AssertionError as error:
        raise AssertionError(f"{error}\n{await describe(kube, operator)}") from None


async def describe(kube: Kube, operator: Operator) -> str:
    pods = (await kube.list(PODS.path(operator.namespace)))["items"]
    return "\n".join(
        f"{p['metadata']['name']}: {p['status'].get('phase')} {p['status'].get('containerStatuses')}"
        f" {p['status'].get('conditions')}"
        for p in pods
    )


async def operator_pods(kube: Kube, operator: Operator) -> list[Obj]:
    listing = await kube.list(
        PODS.path(operator.namespace), label_selector=f"app.kubernetes.io/name={operator.name}"
    )
    return [p for p in listing["items"] if not p["metadata"].get("deletionTimestamp")]


def is_ready(pod: Obj) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", [])
    )


async def holder(kube: Kube, operator: Operator) -> str:
    lease = await kube.get(LEASES.path(operator.namespace, operator.lease))
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


def pod_of(identity: str) -> str:
    """The Pod name in a holder identity (shared.runtime.manager.default_identity: name_suffix)."""
    return identity.rpartition("_")[0]


# --- the tests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("operator", OPERATORS, ids=lambda o: o.install)
async def test_two_ready_replicas_under_restricted_pod_security(
    nkube: Kube, installed: dict[str, Operator], node: NodeInfo, operator: Operator
) -> None:
    namespace = await nkube.get(NAMESPACES.path(name=operator.namespace))
    assert namespace is not None
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    pods = await operator_pods(nkube, operator)
    assert len(pods) == 2, await describe(nkube, operator)
    for pod in pods:
        assert pod["spec"]["nodeName"] == node.name
        assert is_ready(pod), await describe(nkube, operator)
        [container] = pod["spec"]["containers"]
        assert container["image"].startswith("localhost/cozystack-operators:")


@pytest.mark.parametrize("operator", OPERATORS, ids=lambda o: o.install)
async def test_the_lease_is_held_by_one_of_the_pods(
    nkube: Kube, installed: dict[str, Operator], operator: Operator
) -> None:
    names = {p["metadata"]["name"] for p in await operator_pods(nkube, operator)}

    async def held() -> str | None:
        identity = await holder(nkube, operator)
        return identity if pod_of(identity) in names else None

    await eventually(held, timeout=30, what=f"{operator.lease} held by one of {sorted(names)}")


async def test_gpuclass_status_is_written_from_inside_the_pods(
    nkube: Kube, installed: dict[str, Operator]
) -> None:
    name = "node-test"
    await nkube.create(
        GPUCLASSES.path(),
        {
            "apiVersion": "gpu.cozystack.io/v1alpha1",
            "kind": "GPUClass",
            "metadata": {"name": name},
            "spec": {"resourceName": "nvidia.com/NODE_TEST"},
        },
    )

    def reconciled(obj: Obj | None) -> bool:
        conditions = {c["type"]: c for c in ((obj or {}).get("status") or {}).get("conditions", [])}
        ready = conditions.get(reasons.CONDITION_READY) or {}
        return ready.get("observedGeneration") == 1

    try:
        found = await wait_for_object(
            nkube, GPUCLASSES, name, reconciled, timeout=60, what="the class's status"
        )
        assert found is not None
        # No KubeVirt here: the class says so, truthfully.
        kubevirt = {c["type"]: c for c in found["status"]["conditions"]}[reasons.CONDITION_KUBEVIRT_PERMITTED]
        assert kubevirt["reason"] == reasons.REASON_KUBEVIRT_NOT_INSTALLED
    finally:
        await nkube.delete(GPUCLASSES.path(name=name))


@pytest.fixture(scope="module")
async def addresses(
    nkube: Kube,
    node_cluster: ClusterInfo,
    installed: dict[str, Operator],
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[str]:
    """MetalLB (a process beside the control plane) and the address substrate (the lane's) on this
    module's control plane, a default class, and a tenant with a Postgres application ``db`` and its
    tenant-facing Service; yields the tenant's namespace."""
    # Not under pytest's basetemp: other pytest runs on this machine rotate those away.
    log = Path(tempfile.mkdtemp(prefix="node-metallb-")) / "metallb.log"
    lineage = ApplicationRef("apps.cozystack.io", "Postgres", APP).labels()
    async with metallb(nkube, node_cluster.kubeconfig, log) as balancer, address_substrate(nkube):
        global BALANCER
        BALANCER = balancer
        await nkube.create(
            NAMESPACES.path(), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TENANT}}
        )
        await nkube.create(
            CLASSES.path(),
            {
                "apiVersion": CLASSES.api_version,
                "kind": "IPAddressClass",
                "metadata": {"name": ADDRESS_CLASS, "annotations": {DEFAULT_CLASS_ANNOTATION: "true"}},
                "spec": {"provisioner": METALLB_PROVISIONER, "parameters": {"addresses": [ADDRESS_RANGE]}},
            },
        )
        await balancer.wait_for_pool(pool_name(ADDRESS_CLASS))
        await nkube.create(
            HELMRELEASES.path(TENANT),
            {
                "apiVersion": HELMRELEASES.api_version,
                "kind": "HelmRelease",
                "metadata": {"name": f"postgres-{APP}", "labels": lineage},
                "spec": {"interval": "5m", "chart": {"spec": {"chart": "postgres", "sourceRef": SOURCE}}},
            },
        )
        await nkube.create(
            SERVICES.path(TENANT),
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": ENDPOINT, "labels": {**lineage, TENANT_RESOURCE_LABEL: LABEL_TRUE}},
                "spec": {"selector": {"app": APP}, "ports": [{"name": "postgres", "port": 5432}]},
            },
        )
        yield TENANT


def attachment(name: str) -> Obj:
    """An attachment as Cozystack documents it, minting from the default class."""
    return {
        "apiVersion": ATTACHMENTS.api_version,
        "kind": ATTACHMENT_KIND,
        "metadata": {"name": name},
        "spec": {
            "applicationRef": {"kind": "Postgres", "name": APP},
            "endpoint": {"serviceName": ENDPOINT},
            "loadBalancer": {},
        },
    }


def provisioned(obj: Obj | None) -> bool:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Provisioned" and c.get("status") == "True" for c in conditions)


async def test_an_attachment_is_provisioned_through_metallb_from_inside_the_pods(
    nkube: Kube, addresses: str
) -> None:
    await steady(nkube, ENDPOINTATTACHMENT)
    created = await nkube.create(ATTACHMENTS.path(addresses), attachment("db-public"))
    try:
        found = await wait_for_object(
            nkube,
            ATTACHMENTS,
            "db-public",
            provisioned,
            namespace=addresses,
            timeout=PROVISION_TIMEOUT_SECONDS,
            what="the attachment Provisioned",
        )
    except AssertionError as error:
        services = (await nkube.list(SERVICES.path(addresses)))["items"]
        seen = [(s["metadata"]["name"], s["metadata"].get("annotations"), s.get("status")) for s in services]
        tail = BALANCER.log_tail() if BALANCER is not None else ""
        raise AssertionError(f"{error}\nServices: {seen}\nMetalLB: {tail}") from None
    assert found is not None
    status = found["status"]
    assert status["phase"] == "Attached"
    service = await nkube.get(SERVICES.path(addresses, status["serviceName"]))
    claim = await nkube.get(CLAIMS.path(addresses, status["claimName"]))
    assert service is not None
    assert claim is not None
    uid = created["metadata"]["uid"]
    assert is_controlled_by(service, uid)
    assert is_controlled_by(claim, uid)
    assert service["metadata"]["annotations"][CLAIM_ANNOTATION] == status["claimName"]
    ingress = [i["ip"] for i in service["status"]["loadBalancer"]["ingress"]]
    assert ingress == status["addresses"] == [a["address"] for a in claim["status"]["addresses"]]


async def test_work_in_flight_finishes_across_a_leader_failover(nkube: Kube, addresses: str) -> None:
    """The leader Pod deleted while attachments are being provisioned: the standby finishes them,
    and nothing the first leader did is done twice (a second claim or Service, a second address)."""
    await steady(nkube, ENDPOINTATTACHMENT)
    names = [f"failover-{n:02d}" for n in range(IN_FLIGHT)]
    turned_true: dict[str, int] = {}  # how often each one's Provisioned went from not True to True
    went_back: list[str] = []
    last: dict[str, bool] = {}

    def on_attachment(kind: str, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        if name not in names or kind == "DELETED":
            return
        now, before = provisioned(obj), last.get(name, False)
        if now and not before:
            turned_true[name] = turned_true.get(name, 0) + 1
        if before and not now:
            went_back.append(name)
        last[name] = now

    async def nothing() -> None:
        return None

    watcher = asyncio.create_task(follow(nkube, ATTACHMENTS, addresses, on_attachment, nothing))
    try:
        leader = pod_of(await holder(nkube, ENDPOINTATTACHMENT))
        for name in names:
            await nkube.create(ATTACHMENTS.path(addresses), attachment(name))
        started = time.monotonic()
        await nkube.delete(PODS.path(ENDPOINTATTACHMENT.namespace, leader))

        async def all_provisioned() -> bool | None:
            listed = (await nkube.list(ATTACHMENTS.path(addresses)))["items"]
            done = [a for a in listed if a["metadata"]["name"] in names and provisioned(a)]
            return True if len(done) == len(names) else None

        await eventually(
            all_provisioned, timeout=PROVISION_TIMEOUT_SECONDS, what="every attachment Provisioned"
        )
        took = time.monotonic() - started
        print(f"\n{IN_FLIGHT} attachments Provisioned {took:.1f}s after the leader went")
        attachments = {
            a["metadata"]["name"]: a
            for a in (await nkube.list(ATTACHMENTS.path(addresses)))["items"]
            if a["metadata"]["name"] in names
        }
        claims = (await nkube.list(CLAIMS.path(addresses)))["items"]
        services = (await nkube.list(SERVICES.path(addresses)))["items"]
        for name, found in attachments.items():
            uid = found["metadata"]["uid"]
            own_claims = [c["metadata"]["name"] for c in claims if is_controlled_by(c, uid)]
            own_services = [s["metadata"]["name"] for s in services if is_controlled_by(s, uid)]
            assert own_claims == [found["status"]["claimName"]], (name, own_claims)
            assert own_services == [found["status"]["serviceName"]], (name, own_services)
        every = [x for a in attachments.values() for x in a["status"]["addresses"]]
        assert len(every) == len(set(every)) == IN_FLIGHT, "no address on two attachments"
        assert not went_back, f"Provisioned went back to not True: {went_back}"
        assert all(turned_true.get(name) == 1 for name in names), turned_true
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await steady(nkube, ENDPOINTATTACHMENT)


@pytest.mark.parametrize("operator", OPERATORS, ids=lambda o: o.install)
async def test_deleting_the_leader_pod_hands_the_lease_over(
    nkube: Kube, installed: dict[str, Operator], operator: Operator
) -> None:
    await steady(nkube, operator)
    leader = pod_of(await holder(nkube, operator))
    names: set[str] = {p["metadata"]["name"] for p in await operator_pods(nkube, operator)}
    assert leader in names
    [standby] = names - {leader}
    started = time.monotonic()
    await nkube.delete(PODS.path(operator.namespace, leader))

    async def handed_over() -> str | None:
        # The standby, or the Pod the ReplicaSet starts in the leader's place: the leader gives the
        # Lease up as it stops, and whichever replica asks first may take it.
        now = pod_of(await holder(nkube, operator))
        return now if now and now != leader else None

    successor = await eventually(
        handed_over,
        timeout=LEASE_DURATION_SECONDS + HANDOVER_SLACK_SECONDS,
        interval=0.1,
        what="another replica leads",
    )
    print(
        f"\n{operator.lease}: {leader} -> {successor} (standby {standby}) "
        f"in {time.monotonic() - started:.1f}s"
    )
    await steady(nkube, operator)


async def test_a_rolling_update_keeps_a_ready_replica(
    nkube: Kube, installed: dict[str, Operator], node: NodeInfo, image: str
) -> None:
    operator = GPUCLASS
    path = DEPLOYMENTS.path(operator.namespace, operator.name)
    await steady(nkube, operator)
    new_tag = node.load_tag(image, "rolled")
    fewest_ready = 2
    started = time.monotonic()

    async def watch_ready() -> None:
        """Every change of the operator's Pods, from a list and a watch from its version: the
        fewest ready at any moment."""
        nonlocal fewest_ready
        selector = f"app.kubernetes.io/name={operator.name}"
        listing = await nkube.list(PODS.path(operator.namespace), label_selector=selector)
        ready = {p["metadata"]["name"]: is_ready(p) for p in listing["items"]}
        version = listing["metadata"]["resourceVersion"]
        while True:
            events = nkube.watch(
                PODS.path(operator.namespace), resource_version=version, label_selector=selector
            )
            async with contextlib.aclosing(events):
                async for kind, pod in events:
                    if kind in ("BOOKMARK", "ERROR"):
                        version = (
                            pod["metadata"].get("resourceVersion", version) if kind == "BOOKMARK" else version
                        )
                        continue
                    version = pod["metadata"]["resourceVersion"]
                    name = pod["metadata"]["name"]
                    ready[name] = (
                        kind != "DELETED" and is_ready(pod) and not pod["metadata"].get("deletionTimestamp")
                    )
                    fewest_ready = min(fewest_ready, sum(ready.values()))

    sampler = asyncio.create_task(watch_ready())
    try:
        await nkube.patch(
            path,
            {"spec": {"template": {"spec": {"containers": [{"name": "operator", "image": new_tag}]}}}},
            kind="strategic",
        )

        def updated(deployment: Obj | None) -> bool:
            [container] = (deployment or {})["spec"]["template"]["spec"]["containers"]
            return bool(container["image"] == new_tag and rolled_out()(deployment))

        await wait_for_object(
            nkube,
            DEPLOYMENTS,
            operator.name,
            updated,
            namespace=operator.namespace,
            timeout=ROLLOUT_TIMEOUT_SECONDS,
        )
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    print(f"\nrolled to {new_tag} in {time.monotonic() - started:.1f}s, fewest ready {fewest_ready}")
    assert fewest_ready >= 1
    for pod in await operator_pods(nkube, operator):
        assert pod["spec"]["containers"][0]["image"] == new_tag


async def test_the_pdb_refuses_the_eviction_that_would_leave_no_ready_replica(
    nkube: Kube, installed: dict[str, Operator]
) -> None:
    operator = GPUCLASS
    await steady(nkube, operator)
    await wait_for_object(
        nkube,
        PDBS,
        operator.name,
        lambda p: p is not None and (p.get("status") or {}).get("disruptionsAllowed") == 1,
        namespace=operator.namespace,
        what="the PDB allowing one disruption",
    )
    first, second = sorted(p["metadata"]["name"] for p in await operator_pods(nkube, operator))

    def eviction(name: str) -> Obj:
        return {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": operator.namespace},
        }

    await nkube.create(PODS.path(operator.namespace, first) + "/eviction", eviction(first))
    with pytest.raises(ApiError) as refused:
        await nkube.create(PODS.path(operator.namespace, second) + "/eviction", eviction(second))
    assert refused.value.status == 429, refused.value
    await steady(nkube, operator)


async def test_a_frozen_leader_is_marked_unready_replaced_and_restarted(
    nkube: Kube, installed: dict[str, Operator], node: NodeInfo
) -> None:
    """SIGSTOP to the leader's process (found by its container id, on this node only): nothing in
    it answers any more, as in a deadlock. The kubelet's probes, not the test, must act."""
    operator = GPUCLASS
    await steady(nkube, operator)
    leader = pod_of(await holder(nkube, operator))
    pods: dict[str, Obj] = {p["metadata"]["name"]: p for p in await operator_pods(nkube, operator)}
    [standby] = set(pods) - {leader}
    [status] = pods[leader]["status"]["containerStatuses"]
    restarts = int(status["restartCount"])
    pid = node.container_pid(status["containerID"])
    started = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:

        async def handed_over() -> bool:
            return pod_of(await holder(nkube, operator)) == standby

        await eventually(handed_over, timeout=FROZEN_HANDOVER_SECONDS, interval=0.2, what="the standby leads")
        handover = time.monotonic() - started
        await wait_for_object(
            nkube,
            PODS,
            leader,
            lambda p: p is not None and not is_ready(p),
            namespace=operator.namespace,
            timeout=60,
            what="the frozen leader NotReady",
        )
        unready = time.monotonic() - started

        def restarted(pod: Obj | None) -> bool:
            statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or [{}]
            return int(statuses[0].get("restartCount", 0)) > restarts

        await wait_for_object(
            nkube,
            PODS,
            leader,
            restarted,
            namespace=operator.namespace,
            timeout=150,
            what="the kubelet restarting it",
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)  # if the kubelet has not killed it, let it go on
    print(
        f"\nfrozen leader: standby leads after {handover:.1f}s, NotReady after {unready:.1f}s,"
        f" restarted after {time.monotonic() - started:.1f}s"
    )
    await steady(nkube, operator)
