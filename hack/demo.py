"""make demo: both operators on the local control plane with sample objects, and what people see.

It starts the local control plane, installs each operator's CRDs with kubectl
(``kubectl apply -k config/crd/<operator>``) and the platform's (KubeVirt's, Flux's, and the address
substrate's real CRDs from ``tests/fixtures/``), runs both operators, MetalLB's controller and the
address substrate (its real controllers when ``COZY_SUBSTRATE_BIN`` names them, else the documented
model of ``harness/substrate.py``, which renders an IPAddressPool per IPAddressClass as the
substrate's MetalLB driver does), plays the kubelets, creates a small GPU cloud and a tenant with a
database and a VM, then prints what a tenant sees and what a hoster sees.
It waits for Ctrl-C (or, with ``--once``, stops right away) and leaves nothing running.

It also starts a real Jaeger (v2, in-memory, built and cached like the control plane:
``hack/jaeger.py``), points both operators' OTLP exporter at it, and ends with the story of one
attachment read back from Jaeger's query API as a terminal waterfall (``hack/waterfall.py``). With
``OTEL_EXPORTER_OTLP_ENDPOINT`` already set, the operators' traces go there instead, and no Jaeger
is started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import yaml

from hack.devcluster import ROOT, ClusterInfo, LocalControlPlane
from hack.jaeger import Jaeger, running_jaeger
from hack.metallb import metallb
from hack.substrate import lane
from hack.waterfall import Span, passes_of, render_waterfall
from harness.lane import address_substrate
from harness.substrate import DEFAULT_CLASS_ANNOTATION, METALLB_PROVISIONER
from operators.endpointattachment.api import ATTACHMENTS
from operators.gpuclass.api import GPUCLASSES
from shared.kube import ApiError, Kube, Obj
from shared.resources import HELMRELEASES, NAMESPACES, NODES, PODS, SERVICE_ACCOUNTS, SERVICES

TENANT = "tenant-demo"
# The attachment whose story the demo draws from Jaeger: a VM's, on the tenant's reserved claim.
STORY_ATTACHMENT = "vm1-ssh"
EA_TRACE_SERVICE = "cozystack-endpointattachment-operator"
TRACE_WAIT_SECONDS = 30.0  # the operators' span batches reach Jaeger within this
# Each operator's CRDs, one kustomization apiece (kubectl apply -k takes one directory).
CRD_DIRS = ("config/crd/gpuclass", "config/crd/endpointattachment")
H200, L40S, RTX4090 = (
    "nvidia.com/GH100_H200_SXM_141GB",
    "nvidia.com/AD102GL_L40S",
    "nvidia.com/AD102_GEFORCE_RTX_4090",
)
SDN = "local.sdn.cozystack.io/v1alpha1"
# The address substrate's CRDs (a platform package of its own; the operator ships none of them).
SUBSTRATE_CRDS = ROOT / "tests/fixtures/address-substrate"
LINEAGE = "apps.cozystack.io/application"


def lineage(kind: str, name: str, tenant_facing: bool) -> dict[str, str]:
    labels = {
        f"{LINEAGE}.group": "apps.cozystack.io",
        f"{LINEAGE}.kind": kind,
        f"{LINEAGE}.name": name,
        "internal.cozystack.io/managed-by-cozystack": "true",
    }
    if tenant_facing:
        labels["internal.cozystack.io/tenantresource"] = "true"
    return labels


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def kubectl(cluster: ClusterInfo, *args: str, capture: bool = False) -> str:
    command = [cluster.kubectl, "--kubeconfig", cluster.kubeconfig, *args]
    result = subprocess.run(command, check=True, text=True, capture_output=capture)
    return result.stdout if capture else ""


# --- the world the demo builds -----------------------------------------------------------------


async def gpu_node(
    kube: Kube, name: str, resource: str, count: int, taint: str = "", cordoned: bool = False
) -> None:
    spec: dict[str, Any] = {"unschedulable": cordoned} if cordoned else {}
    if taint:
        key, _, value_effect = taint.partition("=")
        value, _, effect = value_effect.partition(":")
        spec["taints"] = [{"key": key, "value": value, "effect": effect}]
    await kube.create(NODES.path(), {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    allocatable = {"cpu": "64", "memory": "512Gi", "pods": "110", resource: str(count)}
    status = {
        "conditions": [{"type": "Ready", "status": "True"}],
        "capacity": allocatable,
        "allocatable": allocatable,
    }
    await kube.patch(NODES.path(name=name) + "/status", {"status": status}, kind="merge")
    # The node lifecycle controller's part: lift the not-ready taint admission put on the new Node.
    await kube.patch(
        NODES.path(name=name), {"spec": {"taints": spec.pop("taints", None), **spec}}, kind="merge"
    )


async def running_pod(
    kube: Kube,
    name: str,
    node: str,
    labels: Mapping[str, str],
    ip: str,
    gpus: Mapping[str, str] | None = None,
) -> None:
    resources = {"limits": dict(gpus)} if gpus else {}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "compute", "image": "registry.k8s.io/pause:3.10", "resources": resources}
            ],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
    }
    await kube.create(PODS.path(TENANT), pod)
    status = {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    await kube.patch(PODS.path(TENANT, name) + "/status", {"status": status}, kind="merge")


async def install_platform_crds(kube: Kube, cluster: ClusterInfo) -> None:
    """What Cozystack already runs: KubeVirt's and Flux's CRDs (the operators watch HelmReleases,
    so Flux's CRD must be served before they start), and the address substrate's."""
    for doc in yaml.safe_load_all((ROOT / "tests/fixtures/kubevirt-crd.yaml").read_text()):
        if doc:
            await kube.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", doc)
    kubectl(cluster, "apply", "--server-side", "-f", str(ROOT / "tests/fixtures/helmrelease-crd.yaml"))
    kubectl(cluster, "apply", "--server-side", "-f", str(SUBSTRATE_CRDS))
    kubectl(
        cluster,
        "wait",
        "--for=condition=Established",
        "crd/kubevirts.kubevirt.io",
        "crd/helmreleases.helm.toolkit.fluxcd.io",
        "crd/ipaddressclaims.local.sdn.cozystack.io",
        "crd/ipaddressclasses.local.sdn.cozystack.io",
        "crd/ipaddresses.local.sdn.cozystack.io",
    )


async def build_world(kube: Kube, cluster: ClusterInfo) -> None:
    for namespace in ("cozy-kubevirt", TENANT):
        await kube.create(
            NAMESPACES.path(), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        )
    kubectl(cluster, "apply", "-f", str(ROOT / "tests/fixtures/kubevirt-cr-passthrough.yaml"))

    # The hoster's GPU nodes, as the NVIDIA KubeVirt device plugin advertises them.
    await gpu_node(kube, "gpu-node-1", H200, 8, taint="nvidia.com/gpu=present:NoSchedule")
    await gpu_node(kube, "gpu-node-2", H200, 8, cordoned=True)
    await gpu_node(kube, "gpu-node-3", L40S, 2)
    await gpu_node(kube, "gpu-node-4", RTX4090, 2)
    # GPU classes: one conflicting (an older class owns the name), one KubeVirt does not permit.
    classes = [
        (
            "h200",
            H200,
            "NVIDIA H200 SXM 141GB",
            [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        ),
        ("l40s", L40S, "NVIDIA L40S", []),
        ("rtx4090", RTX4090, "GeForce RTX 4090 (not in the KubeVirt table)", []),
        ("h200-premium", H200, "H200, premium (a second class on the same name)", []),
    ]
    for name, resource, display, tolerations in classes:
        spec: dict[str, Any] = {"resourceName": resource, "displayName": display}
        if tolerations:
            spec["tolerations"] = tolerations
        await kube.create(
            GPUCLASSES.path(),
            {
                "apiVersion": "gpu.cozystack.io/v1alpha1",
                "kind": "GPUClass",
                "metadata": {"name": name},
                "spec": spec,
            },
        )

    # The tenant: a Postgres and a VM with a GPU, as Cozystack renders them (HelmRelease + labels).
    while await kube.get(SERVICE_ACCOUNTS.path(TENANT, "default")) is None:
        await asyncio.sleep(0.2)  # the serviceaccount controller creates it within a moment
    for kind, name in (("Postgres", "db"), ("VMInstance", "vm1")):
        release = {
            "apiVersion": "helm.toolkit.fluxcd.io/v2",
            "kind": "HelmRelease",
            "metadata": {
                "name": f"{kind.lower()}-{name}",
                "labels": lineage(kind, name, tenant_facing=False),
            },
            "spec": {
                "interval": "5m",
                "chart": {
                    "spec": {
                        "chart": kind.lower(),
                        "sourceRef": {"kind": "HelmRepository", "name": "cozystack-apps"},
                    }
                },
            },
        }
        await kube.create(HELMRELEASES.path(TENANT), release)
    services = [
        (
            "postgres-db-rw",
            "Postgres",
            "db",
            {"app": "db"},
            [{"name": "postgres", "port": 5432, "targetPort": 5432}],
        ),
        ("vm1", "VMInstance", "vm1", {"vm": "vm1"}, [{"name": "ssh", "port": 22, "targetPort": 22}]),
    ]
    for service, kind, app, selector, ports in services:
        await kube.create(
            SERVICES.path(TENANT),
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": service, "labels": lineage(kind, app, tenant_facing=True)},
                "spec": {"selector": selector, "ports": ports},
            },
        )
    await running_pod(kube, "db-0", "gpu-node-3", {"app": "db"}, "10.244.3.10")
    await running_pod(kube, "virt-launcher-vm1", "gpu-node-1", {"vm": "vm1"}, "10.244.1.20", {H200: "2"})
    await running_pod(kube, "virt-launcher-train", "gpu-node-1", {"vm": "train"}, "10.244.1.21", {H200: "4"})
    await running_pod(
        kube, "virt-launcher-render", "gpu-node-3", {"vm": "render"}, "10.244.3.11", {L40S: "1"}
    )

    # Addresses: the hoster's default class (the substrate's); the tenant's reserved claim and
    # attachments. vm1-ssh and vm1-whole both want the VM's one pod for cozy-proxy: the older wins.
    manifests = [
        {
            "apiVersion": SDN,
            "kind": "IPAddressClass",
            "metadata": {"name": "public", "annotations": {DEFAULT_CLASS_ANNOTATION: "true"}},
            "spec": {"provisioner": METALLB_PROVISIONER, "parameters": {"addresses": ["198.51.100.0/28"]}},
        },
        {
            "apiVersion": SDN,
            "kind": "IPAddressClaim",
            "metadata": {"name": "reserved-ip", "namespace": TENANT},
            "spec": {"className": "public"},
        },
        {
            "apiVersion": SDN,
            "kind": "EndpointAttachment",
            "metadata": {"name": "db-public", "namespace": TENANT},
            "spec": {
                "applicationRef": {"kind": "Postgres", "name": "db"},
                "endpoint": {"serviceName": "postgres-db-rw"},
                "loadBalancer": {},
            },
        },
        {
            "apiVersion": SDN,
            "kind": "EndpointAttachment",
            "metadata": {"name": "vm1-ssh", "namespace": TENANT},
            "spec": {
                "applicationRef": {"kind": "VMInstance", "name": "vm1"},
                "endpoint": {"serviceName": "vm1"},
                "loadBalancer": {"claimName": "reserved-ip", "method": "PortList", "ports": [22]},
            },
        },
        {
            "apiVersion": SDN,
            "kind": "EndpointAttachment",
            "metadata": {"name": "vm1-whole", "namespace": TENANT},
            "spec": {
                "applicationRef": {"kind": "VMInstance", "name": "vm1"},
                "endpoint": {"serviceName": "vm1"},
                "loadBalancer": {"className": "public", "method": "WholeIP"},
            },
        },
    ]
    for manifest in manifests:
        kubectl_input = yaml.safe_dump(manifest)
        subprocess.run(
            [cluster.kubectl, "--kubeconfig", cluster.kubeconfig, "apply", "-f", "-"],
            input=kubectl_input,
            text=True,
            check=True,
            capture_output=True,
        )


# --- running the operators -----------------------------------------------------------------------


@contextlib.asynccontextmanager
async def operator(
    module: str, cluster: ClusterInfo, log: Path, tracing: Mapping[str, str]
) -> AsyncIterator[int]:
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **tracing}
    args = [
        "--kubeconfig",
        cluster.kubeconfig,
        "--metrics-address",
        "127.0.0.1",
        "--metrics-port",
        str(port),
        "--health-port",
        "0",
    ]
    if module == "operators.gpuclass":
        args += ["--debounce-seconds", "0.3", "--kubevirt-recheck-seconds", "5"]
    else:
        args += ["--vm-datapath", "cozy-proxy"]  # the platform declares cozy-proxy deployed
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            module,
            *args,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            cwd=ROOT,
            env=env,
        )
    try:
        yield port
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 15)
            except TimeoutError:
                process.kill()
                await process.wait()


# Reasons on the way to a settled answer (a claim binding, the load balancer answering).
UNSETTLED = ("", "WaitingForAddress", "ClaimPending")


async def converged(kube: Kube) -> bool:
    classes = (await kube.list(GPUCLASSES.path()))["items"]
    attachments = (await kube.list(ATTACHMENTS.path(TENANT)))["items"]
    settled = [o for o in classes + attachments if _verdict(o)[1] not in UNSETTLED]
    return len(classes) == 4 and len(attachments) == 3 and len(settled) == 7


def _verdict(obj: Obj) -> tuple[str, str, str]:
    """The condition that says whether it works: a GPU class's Ready, an attachment's Provisioned."""
    wanted = "Provisioned" if obj.get("kind") == "EndpointAttachment" else "Ready"
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition["type"] == wanted:
            return condition["status"], condition["reason"], condition.get("message", "")
    return "", "", ""


async def show(
    kube: Kube, cluster: ClusterInfo, ports: Mapping[str, int], jaeger: Jaeger | None, since: datetime
) -> None:
    bar = "=" * 100
    print(f"\n{bar}\nWHAT A TENANT SEES\n{bar}")
    print("$ kubectl get gpuclasses            # can a VM of this class start now, and how big?")
    kubectl(cluster, "get", "gpuclasses")
    print(f"\n$ kubectl get endpointattachments -n {TENANT}")
    kubectl(cluster, "get", "endpointattachments", "-n", TENANT)
    print(f"\n$ kubectl get ipaddressclaims -n {TENANT}")
    kubectl(cluster, "get", "ipaddressclaims", "-n", TENANT)
    for name in ("db-public", "vm1-whole"):  # what the operator did; what it refused, and why
        print(f"\n$ kubectl describe endpointattachment {name} -n {TENANT}   # ... its Events:")
        described = kubectl(cluster, "describe", "endpointattachment", name, "-n", TENANT, capture=True)
        print(described[described.find("Events:") :].rstrip())

    print(f"\n{bar}\nWHAT A HOSTER SEES\n{bar}")
    print("Why each GPU class that is not Ready, and each attachment that is not Provisioned, is not:")
    objects = (await kube.list(GPUCLASSES.path()))["items"] + (await kube.list(ATTACHMENTS.path(TENANT)))[
        "items"
    ]
    for obj in objects:
        status, reason, message = _verdict(obj)
        if status != "True":
            metadata = obj["metadata"]
            where = f"{metadata['namespace']}/" if metadata.get("namespace") else ""
            verdict = "Provisioned" if obj["kind"] == "EndpointAttachment" else "Ready"
            print(f"  {obj['kind']} {where}{metadata['name']}: {verdict}={status} {reason}: {message}")
    print("\nInventory, from the operators' Prometheus metrics (never in the world-readable status):")
    wanted = (
        "cozystack_gpuclass_allocatable",
        "cozystack_gpuclass_requested",
        "cozystack_gpuclass_free",
        'cozystack_gpuclass_nodes{gpuclass="h200"',
        "cozystack_endpointattachment_attachments",
    )
    async with httpx.AsyncClient() as client:
        for name, port in ports.items():
            text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
            print(f"  -- {name} operator, http://127.0.0.1:{port}/metrics")
            for line in text.splitlines():
                if line.startswith(wanted):
                    print(f"  {line}")
    print(f"\n{bar}\nTRACES\n{bar}")
    await show_traces(kube, jaeger, since)
    print(f"\nThe control plane stays up until you stop the demo:\n  export KUBECONFIG={cluster.kubeconfig}")
    print(f"  alias kubectl={cluster.kubectl}")


async def show_traces(kube: Kube, jaeger: Jaeger | None, since: datetime) -> None:
    """The story of one attachment, from Jaeger's query API, and how to get the same elsewhere."""
    if jaeger is None:
        endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
        print(f"Spans went to your collector at {endpoint}: look for service {EA_TRACE_SERVICE}.")
    else:
        attachment = await kube.get(ATTACHMENTS.path(TENANT, STORY_ATTACHMENT))
        uid = str((attachment or {}).get("metadata", {}).get("uid", ""))
        spans = jaeger.find_spans(EA_TRACE_SERVICE, since)
        deadline = asyncio.get_running_loop().time() + TRACE_WAIT_SECONDS
        while not _story_told(spans, uid) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.5)  # polling Jaeger for the last batch of spans, bounded
            spans = jaeger.find_spans(EA_TRACE_SERVICE, since)
        traces = len({s.trace_id for s in spans})
        print(f"Jaeger ({jaeger.query_url}) holds {traces} traces of {EA_TRACE_SERVICE};")
        print(f"the life of EndpointAttachment {TENANT}/{STORY_ATTACHMENT}, one reconcile pass per row:\n")
        print(render_waterfall(spans, uid))
        print(
            "Read it as: each pass is a trace of its own; ← links a pass to the one before it over the same"
        )
        print("object; ⇠ links it to the pass that wrote what it read (its own Service). Objects written by")
        print("people or other components (the IPAddressClass, the reserved claim) carry no writer.")
        print(f"Query it yourself: curl '{jaeger.query_url}/api/services'")
    print("\nIn a real cluster, point each operator at your OTLP/HTTP collector (Jaeger, Tempo, ...):")
    print("  helm upgrade ... --set otel.endpoint=http://jaeger-collector.monitoring:4318")
    print("  or set OTEL_EXPORTER_OTLP_ENDPOINT in config/manager/<operator>/deployment.yaml")
    print("See docs/hosters/tracing.md.")


def _story_told(spans: list[Span], uid: str) -> bool:
    """Jaeger holds the attachment's passes up to the one that provisioned it, and every link resolves."""
    ids = {(s.trace_id, s.span_id) for s in spans}
    passes = passes_of(spans, uid)
    published = any("Provisioned" in str(p.attributes.get("condition.reasons")) for p in passes)
    return published and all((link.trace_id, link.span_id) in ids for p in passes for link in p.links)


@contextlib.contextmanager
def tracing_backend(logs: Path) -> Iterator[tuple[Jaeger | None, dict[str, str]]]:
    """A local Jaeger and the operators' environment for it; none when the user set an endpoint."""
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        yield None, {}
        return
    print("starting Jaeger (the first run builds it from Go modules, a few minutes)...")
    with running_jaeger(logs / "jaeger") as jaeger:
        print(f"Jaeger ready: OTLP {jaeger.otlp_endpoint}, query API {jaeger.query_url}")
        yield jaeger, {"OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_endpoint, "OTEL_BSP_SCHEDULE_DELAY": "200"}


async def demo(once: bool) -> None:
    with LocalControlPlane() as cluster:
        print(f"local control plane ready in {cluster.ready_seconds:.1f}s at {cluster.server}")
        kube = await Kube.connect(cluster.kubeconfig)
        for crds in CRD_DIRS:
            print(f"$ kubectl apply -k {crds}")
            kubectl(cluster, "apply", "-k", str(ROOT / crds))
        kubectl(cluster, "wait", "--for=condition=Established", "--all", "crd")
        await install_platform_crds(kube, cluster)
        logs = Path(cluster.kubeconfig).parent / "logs"
        since = datetime.now(UTC) - timedelta(seconds=5)
        with tracing_backend(logs) as (jaeger, tracing):
            await run_operators(kube, cluster, logs, jaeger, tracing, since, once)
    print("demo stopped: operators, Jaeger and control plane are down, nothing left running")


async def run_operators(
    kube: Kube,
    cluster: ClusterInfo,
    logs: Path,
    jaeger: Jaeger | None,
    tracing: Mapping[str, str],
    since: datetime,
    once: bool,
) -> None:
    async with (
        operator("operators.gpuclass", cluster, logs / "gpuclass-operator.log", tracing) as gpu_port,
        operator(
            "operators.endpointattachment", cluster, logs / "endpointattachment-operator.log", tracing
        ) as ea_port,
        metallb(kube, cluster.kubeconfig, logs / "metallb.log"),
        address_substrate(kube),
    ):
        print(f"operators running (logs in {logs}); building the sample world...")
        if lane() == "real":
            print("addresses: Cozystack's address substrate (its real controllers), over real MetalLB")
        else:
            print(
                "addresses: the address substrate's controllers are not here (COZY_SUBSTRATE_BIN), so "
                "its documented model (harness/substrate.py) plays them, over real MetalLB"
            )
        await build_world(kube, cluster)
        deadline = asyncio.get_running_loop().time() + 90
        while not await converged(kube) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.5)  # polling the objects' status, bounded by the deadline
        await show(kube, cluster, {"gpuclass": gpu_port, "endpointattachment": ea_port}, jaeger, since)
        if not once:
            print("\nPress Ctrl-C to stop the demo.")
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__)
    parser.add_argument("--once", action="store_true", help="show, then stop at once (no Ctrl-C needed)")
    args = parser.parse_args()
    try:
        asyncio.run(demo(args.once))
    except ApiError as error:
        sys.exit(f"demo failed: {error}")


if __name__ == "__main__":
    main()
