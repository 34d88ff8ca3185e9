"""The bad-input catalogue (tests/catalogue/): every row's object or update, and the answer it gets.

Admission rows ask the API server only (no operator): each is refused with a message a person can act
on (the row's phrase, no regex, no huge echo, a few lines at most) and, for an update, leaves the
stored object exactly as it was. Operator rows run in groups, each group sharing one running
EndpointAttachment operator and one GPUClass operator (subprocesses under their own ServiceAccounts,
with the test load balancer): a row's objects are created, the operator's answer is awaited, the row's
objects are deleted again; then nothing else may have changed (the sentinels' objects, statuses and
rendered Service keep their resourceVersions), no operator logged a traceback, both are idle again
within seconds (CPU time from /proc/<pid>/stat), the substrate's IPAddresses are those of the
sentinels again (the catalogue's classes reclaim with Delete: nothing leaked), and no address is
Provisioned on two attachments. The address substrate is its real CRDs and the model of its
controllers (harness/substrate.py); the group ``datapath`` runs the operator with the
platform's cozy-proxy contract declared.

``python -m tests.catalogue`` prints the refused / conditioned / handled counts of the table.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import os
from collections.abc import AsyncIterator, Awaitable, Mapping
from pathlib import Path
from typing import Any

import pytest

from hack.devcluster import ClusterInfo
from harness.ea_cluster import NODE, ea_operator
from harness.identity import serviceaccount_kubeconfig
from harness.lane import address_substrate
from harness.loadbalancer import load_balancer
from harness.manifests import apply_all, load
from harness.operators import RunningOperator, operator_process
from harness.substrate import BOUND, REASON_BOUND
from harness.waiting import eventually, wait_for_object
from operators.endpointattachment.api import ADDRESSES, ATTACHMENTS, CLAIMS, CLASSES
from operators.gpuclass.api import GPUCLASSES
from shared.kube import ApiError, Kube, Obj
from shared.resources import NAMESPACES, NODES, PODS, SERVICE_ACCOUNTS, SERVICES, Resource
from tests.catalogue import ROWS
from tests.catalogue.admission import CHANGES_TRIED, FIELDS_TRIED
from tests.catalogue.model import (
    MAX_MESSAGE,
    OTHER,
    REGEX_TELLS,
    SENTINEL_SERVICE,
    TENANT,
    Expect,
    Operated,
    Refused,
    Step,
    Update,
)
from tests.catalogue.objects import (
    APP,
    APP_KIND,
    CLASS,
    address_class,
    attachment,
    claim,
    gpu_class,
    helmrelease,
    service,
)
from tests.catalogue.operated import CONDITION_PROVISIONED, REASON_PROVISIONED, ready_pod
from tests.ea_builders import lineage_labels

FIELD_MANAGER = "cozystack-catalogue"
KINDS: dict[str, Resource] = {
    "EndpointAttachment": ATTACHMENTS,
    "IPAddressClaim": CLAIMS,
    "IPAddressClass": CLASSES,
    "IPAddress": ADDRESSES,
    "GPUClass": GPUCLASSES,
    "Service": Resource("v1", "services"),
    "Pod": Resource("v1", "pods"),
    "HelmRelease": Resource("helm.toolkit.fluxcd.io/v2", "helmreleases"),
    "Namespace": NAMESPACES,
}
# Ours, and the prerequisites a hoster installs: Flux's HelmRelease and the address substrate's CRDs.
CRD_FILES = (
    "tests/fixtures/helmrelease-crd.yaml",
    "config/crd/gpuclass/gpu.cozystack.io_gpuclasses.yaml",
    "config/crd/endpointattachment/local.sdn.cozystack.io_endpointattachments.yaml",
    *(
        f"tests/fixtures/address-substrate/local.sdn.cozystack.io_{plural}.yaml"
        for plural in ("ipaddressclasses", "ipaddresses", "ipaddressclaims")
    ),
)
# The groups whose EndpointAttachment operator runs with the platform's cozy-proxy contract declared
# (the operator's flag for it; every other group runs without, the default).
DATAPATH_ARGS: dict[str, tuple[str, ...]] = {"datapath": ("--vm-datapath=cozy-proxy",)}
# A run of this many identical characters in a message is an echo of a huge value.
ECHO = "a" * 200

REFUSED = [r for r in ROWS if isinstance(r, Refused)]


# --- Objects and paths -----------------------------------------------------------------------------


def resolve(value: Any, namespaces: Mapping[str, str]) -> Any:
    """``value`` with the namespace placeholders replaced."""
    if isinstance(value, str):
        for placeholder, name in namespaces.items():
            value = value.replace(placeholder, name)
        return value
    if isinstance(value, list):
        return [resolve(v, namespaces) for v in value]
    if isinstance(value, dict):
        return {k: resolve(v, namespaces) for k, v in value.items()}
    return value


def path_of(obj: Mapping[str, Any], *, collection: bool = False) -> str:
    resource = KINDS[obj["kind"]]
    metadata = obj["metadata"]
    namespace = metadata.get("namespace") if resource.namespaced else None
    return resource.path(namespace, None if collection else metadata["name"])


def merged(base: Any, change: Any) -> Any:
    """RFC 7386: ``change`` merged into ``base`` (None removes a key)."""
    if not isinstance(change, dict):
        return copy.deepcopy(change)
    out = copy.deepcopy(base) if isinstance(base, dict) else {}
    for key, value in change.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merged(out.get(key), value)
    return out


def json_ops(stored: Mapping[str, Any], change: Mapping[str, Any], prefix: str = "") -> list[Obj]:
    """The JSON patch (RFC 6902) doing what the merge patch ``change`` does to ``stored``."""
    ops: list[Obj] = []
    for key, value in change.items():
        path = f"{prefix}/{key}"
        if value is None:
            if key in stored:
                ops.append({"op": "remove", "path": path})
        elif isinstance(value, dict) and isinstance(stored.get(key), dict):
            ops.extend(json_ops(stored[key], value, path))
        else:
            ops.append({"op": "replace" if key in stored else "add", "path": path, "value": value})
    return ops


async def send_update(kube: Kube, stored: Obj, update: Update) -> Obj:
    path = path_of(stored)
    if update.form == "merge":
        return await kube.patch(path, update.change, "merge")
    if update.form == "json":
        return await kube.patch(path, json_ops(stored, update.change), "json")
    if update.form == "apply":
        metadata = {k: stored["metadata"][k] for k in ("name", "namespace") if k in stored["metadata"]}
        desired = {
            "apiVersion": stored["apiVersion"],
            "kind": stored["kind"],
            "metadata": metadata,
            "spec": merged(stored["spec"], update.change.get("spec", {})),
        }
        return await kube.apply(path, desired, FIELD_MANAGER)
    return await kube.replace(path, merged(stored, update.change))


def row_name(row_id: str, kind: str) -> str:
    """A short, unique, valid name for the object a row's update acts on."""
    return f"cat-u-{hashlib.sha256(f'{kind}/{row_id}'.encode()).hexdigest()[:10]}"


def assert_readable(row: Refused, error: ApiError) -> None:
    message = error.message
    where = f"{row.id}: {message[:600]}"
    assert error.status == 422, where
    assert row.says in message, where
    assert len(message) <= (row.max_message if not row.kubernetes_message else 3 * MAX_MESSAGE), where
    if not row.kubernetes_message:
        assert ECHO not in message, where
        assert not any(tell in message for tell in REGEX_TELLS), where


# --- Admission rows --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def crds(kube: Kube) -> None:
    await apply_all(kube, [doc for path in CRD_FILES for doc in load(path)])


@pytest.fixture(scope="module")
async def admission_namespace(kube: Kube, crds: None) -> AsyncIterator[str]:
    name = f"cat-admission-{os.getpid()}"
    await kube.create(
        NAMESPACES.path(), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    yield name
    await kube.delete(NAMESPACES.path(name=name))


@pytest.mark.parametrize("row", REFUSED, ids=[r.id for r in REFUSED])
async def test_refused_at_admission(kube: Kube, admission_namespace: str, row: Refused) -> None:
    obj = resolve(row.obj, {TENANT: admission_namespace, OTHER: admission_namespace})
    if row.update is None:
        try:
            created = await kube.create(path_of(obj, collection=True), obj)
        except ApiError as refusal:
            assert_readable(row, refusal)
            return
        await kube.delete(path_of(created))  # accepted after all: leave nothing behind
        pytest.fail(f"{row.id}: accepted, but should be refused with {row.says!r}")

    obj["metadata"]["name"] = row_name(row.id, obj["kind"])
    stored = await kube.apply(path_of(obj), obj, FIELD_MANAGER)
    try:
        if row.status is not None:
            stored = await kube.patch(path_of(stored) + "/status", {"status": row.status}, "merge")
        with pytest.raises(ApiError) as refused:
            await send_update(kube, stored, row.update)
        assert_readable(row, refused.value)
        after = await kube.get(path_of(stored))
        assert after is not None
        assert after["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"], row.id
    finally:
        await kube.delete(path_of(stored))


# --- Operator rows ---------------------------------------------------------------------------------

OPERATED_CREATES = [
    pytest.param(step.obj, id=f"{row.id}:{step.obj['kind']}/{step.obj['metadata']['name'][:40]}")
    for row in ROWS
    if isinstance(row, Operated)
    for step in row.steps
    if step.op == "create"
]


@pytest.mark.parametrize("obj", OPERATED_CREATES)
async def test_what_operator_rows_create_passes_admission(
    kube: Kube, admission_namespace: str, obj: Obj
) -> None:
    """An operator row is about what the schema cannot refuse: everything it creates is accepted
    (a server-side dry run, no operator needed)."""
    body = resolve(
        obj, {TENANT: admission_namespace, OTHER: admission_namespace, SENTINEL_SERVICE: "cat-sentinel-x7ktq"}
    )
    await kube.request("POST", path_of(body, collection=True), body=body, params={"dryRun": "All"})


OPERATED = [r for r in ROWS if isinstance(r, Operated)]
GROUPS = list(dict.fromkeys(r.group for r in OPERATED))
OPERATED.sort(key=lambda r: GROUPS.index(r.group))
GPU_OPERATOR_NAMESPACE = "cozy-gpuclass"
GPU_RBAC_DIR = "config/rbac/gpuclass"
KUBEVIRT_NAMESPACE = "cozy-kubevirt"
SENTINEL_CLASS = address_class("cat-sentinel", cidrs=["198.51.100.64/28"])
SENTINEL_ATTACHMENT = attachment("cat-sentinel", class_name="cat-sentinel")
SENTINEL_CLAIM = claim("cat-sentinel-claim", class_name="cat-sentinel")
SENTINEL_ATTACHED = Expect(
    "EndpointAttachment", "cat-sentinel", REASON_PROVISIONED, "True", CONDITION_PROVISIONED, namespace=TENANT
)
SENTINEL_GPU = gpu_class("cat-gpu-sentinel", "nvidia.com/GA100_A100_SXM4_80GB")
# An operator is idle when it uses less than this share of one core over a sampling window...
IDLE_SHARE = 0.2
IDLE_WINDOW = 0.5
# ...within this long after a row's objects are gone.
IDLE_WITHIN = 10.0
ANSWER_TIMEOUT = 40.0
# The first group of a session also waits for the session's load balancer (MetalLB) to start.
WORLD_TIMEOUT = 180.0


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of ``pid`` so far (/proc/<pid>/stat, fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def idle_share(pid: int) -> float:
    """The smallest CPU share ``pid`` used over a sampling window, sampling until one is under
    ``IDLE_SHARE`` or ``IDLE_WITHIN`` has passed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + IDLE_WITHIN
    lowest = float("inf")
    while True:
        started, used = loop.time(), cpu_seconds(pid)
        await asyncio.sleep(IDLE_WINDOW)  # the sampling window of a CPU measurement, not a wait
        lowest = min(lowest, (cpu_seconds(pid) - used) / (loop.time() - started))
        if lowest < IDLE_SHARE or loop.time() > deadline:
            return lowest


def conditions_of(obj: Obj) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in (obj.get("status") or {}).get("conditions") or []}


def answers(obj: Obj, expect: Expect) -> bool:
    if not expect.reason:
        return True
    found = conditions_of(obj)
    if expect.type is None:
        return any(reason == expect.reason for _, reason in found.values())
    return found.get(expect.type) == (expect.status, expect.reason)


class Harness:
    """One group's world: its namespaces, the sentinels, both operators and the load balancer."""

    def __init__(self, kube: Kube, cluster: ClusterInfo, tmp: Path) -> None:
        self.kube, self.cluster, self.tmp = kube, cluster, tmp
        self.group: str | None = None
        self.stack = contextlib.AsyncExitStack()
        self.tenant = self.other = ""
        self.operators: list[RunningOperator] = []
        self.sentinel_paths: list[str] = []
        self.sentinel_service = ""
        self.baseline_addresses: set[str] = set()
        # Each operator's CPU share once idle again, after each row (printed at the end).
        self.idle_shares: list[float] = []

    @property
    def namespaces(self) -> dict[str, str]:
        """The placeholders' values: the group's namespaces and its sentinel's rendered Service."""
        return {TENANT: self.tenant, OTHER: self.other, SENTINEL_SERVICE: self.sentinel_service}

    async def enter(self, group: str) -> None:
        if group == self.group:
            return
        await self.stack.aclose()
        self.stack = contextlib.AsyncExitStack()
        self.group = group
        await self.stack.enter_async_context(self.world(group))

    @contextlib.asynccontextmanager
    async def world(self, group: str) -> AsyncIterator[None]:
        kube, suffix = self.kube, f"{group}-{os.getpid()}"
        (self.tmp / group).mkdir(parents=True, exist_ok=True)
        self.tenant, self.other = f"cat-{suffix}", f"cat-other-{suffix}"
        for name, labels in ((self.tenant, {"cat-tenant": "yes"}), (self.other, {})):
            await kube.create(
                NAMESPACES.path(),
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}},
            )
        await wait_for_object(
            kube, SERVICE_ACCOUNTS, "default", lambda o: o is not None, namespace=self.tenant
        )
        made: list[Obj] = []
        try:
            async with contextlib.AsyncExitStack() as stack:
                await stack.enter_async_context(load_balancer(kube))
                await stack.enter_async_context(address_substrate(kube))
                ea_running = await stack.enter_async_context(
                    ea_operator(
                        kube,
                        self.cluster,
                        self.tmp / group,
                        log_name="ea.log",
                        extra_args=DATAPATH_ARGS.get(group, ()),
                    )
                )
                gpu_running = await stack.enter_async_context(self.gpu_operator(group))
                self.operators = [ea_running, gpu_running]
                for obj in self.world_objects():
                    made.append(await self.create(obj))
                for step in ready_pod("cat-vm-0", "10.244.8.10"):
                    await self.do(step, made)
                for obj in (SENTINEL_CLASS, SENTINEL_CLAIM, SENTINEL_ATTACHMENT, SENTINEL_GPU):
                    made.append(await self.create(obj))
                sentinel = await self.answer(SENTINEL_ATTACHED, timeout=WORLD_TIMEOUT)
                await self.answer(
                    Expect(
                        "IPAddressClaim", "cat-sentinel-claim", REASON_BOUND, "True", BOUND, namespace=TENANT
                    )
                )
                await self.answer(
                    Expect("GPUClass", "cat-gpu-sentinel", "NoEligibleNodes", type="Ready", namespace=""),
                    timeout=WORLD_TIMEOUT,
                )
                self.sentinel_service = sentinel["status"]["serviceName"]
                self.sentinel_paths = [
                    path_of(resolve(o, self.namespaces))
                    for o in (SENTINEL_CLASS, SENTINEL_CLAIM, SENTINEL_ATTACHMENT, SENTINEL_GPU)
                ] + [
                    SERVICES.path(self.tenant, self.sentinel_service),
                    KINDS["IPAddressClaim"].path(self.tenant, sentinel["status"]["claimName"]),
                    SERVICES.path(self.tenant, "postgres-db-rw"),
                    KINDS["HelmRelease"].path(self.tenant, "postgres-db"),
                ]
                # The sentinel attachment's minted address and the sentinel claim's.
                self.baseline_addresses = await self.addresses()
                assert len(self.baseline_addresses) == 2, self.baseline_addresses
                yield
                for obj in reversed(made):
                    await self.remove(obj)
        finally:
            for name in (self.tenant, self.other):
                for item in (await kube.list(PODS.path(name)))["items"]:
                    await kube.delete(PODS.path(name, item["metadata"]["name"]), grace_period_seconds=0)
                await kube.delete(NAMESPACES.path(name=name))

    def world_objects(self) -> list[Obj]:
        return [
            helmrelease("postgres-db", lineage_labels(kind=APP_KIND, name=APP, tenant_facing=False)),
            service("postgres-db-rw", labels=lineage_labels(kind=APP_KIND, name=APP)),
            address_class(CLASS, default=True),
        ]

    @contextlib.asynccontextmanager
    async def gpu_operator(self, group: str) -> AsyncIterator[RunningOperator]:
        kube = self.kube
        await apply_all(
            kube,
            [
                *load("tests/fixtures/kubevirt-crd.yaml"),
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUBEVIRT_NAMESPACE}},
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": GPU_OPERATOR_NAMESPACE}},
            ],
        )
        await apply_all(kube, load("tests/fixtures/kubevirt-cr-passthrough.yaml"))
        listed = load(f"{GPU_RBAC_DIR}/kustomization.yaml")[0]["resources"]
        rbac = [doc for name in listed for doc in load(f"{GPU_RBAC_DIR}/{name}")]
        for doc in rbac:
            if doc["kind"] in ("ServiceAccount", "Role", "RoleBinding"):
                doc["metadata"].setdefault("namespace", GPU_OPERATOR_NAMESPACE)
        await apply_all(kube, rbac)
        kubeconfig = await serviceaccount_kubeconfig(
            kube,
            self.cluster.kubeconfig,
            GPU_OPERATOR_NAMESPACE,
            "gpuclass-operator",
            self.tmp / group / "gpu.kubeconfig",
        )
        args = [
            "--debounce-seconds=0.2",
            "--kubevirt-recheck-seconds=2",
            f"--kubevirt-namespace={KUBEVIRT_NAMESPACE}",
            f"--leader-election-namespace={GPU_OPERATOR_NAMESPACE}",
        ]
        async with operator_process(
            "operators.gpuclass", kubeconfig, args, self.tmp / group / "gpu.log"
        ) as running:
            yield running
            assert running.process.returncode is None, running.log_tail()
            assert "Traceback" not in running.log_path.read_text(), running.log_tail(200)

    async def create(self, obj: Obj) -> Obj:
        body = resolve(obj, self.namespaces)
        return await self.kube.create(path_of(body, collection=True), body)

    async def remove(self, obj: Obj, wait: bool = True) -> None:
        path = path_of(resolve(obj, self.namespaces))
        if obj["kind"] == "Pod":
            await self.kube.delete(path, grace_period_seconds=0)
        else:
            await self.kube.delete(path)
        if wait:
            await eventually(lambda: self.gone(path), timeout=ANSWER_TIMEOUT, what=f"{path} deleted")

    async def gone(self, path: str) -> bool:
        return await self.kube.get(path) is None

    async def do(self, step: Step, made: list[Obj]) -> None:
        obj = resolve(step.obj, self.namespaces)
        body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
        suffix = f"/{step.subresource}" if step.subresource else ""
        if step.op == "create":
            made.append(await self.create(step.obj))
        elif step.op == "patch":
            await self.kube.patch(path_of(obj) + suffix, body, "merge")
        elif step.op == "refuse":
            with pytest.raises(ApiError) as refused:
                await self.kube.patch(path_of(obj), body, "merge")
            assert refused.value.status == 422, refused.value
            assert step.says in refused.value.message, refused.value
        elif step.op in ("delete", "request-delete"):
            await self.remove(step.obj, wait=step.op == "delete")
        else:
            assert step.expect is not None
            await self.answer(step.expect)

    async def context(self) -> dict[str, Any]:
        kube = self.kube
        services = (await kube.list(SERVICES.path(self.tenant)))["items"]
        attachments = (await kube.list(KINDS["EndpointAttachment"].path(self.tenant)))["items"]
        claims = (await kube.list(KINDS["IPAddressClaim"].path(self.tenant)))["items"]
        return {
            "services": {s["metadata"]["name"]: s for s in services},
            "attachments": {a["metadata"]["name"]: a for a in attachments},
            "claims": {c["metadata"]["name"]: c for c in claims},
        }

    async def answer(self, expect: Expect, timeout: float = ANSWER_TIMEOUT) -> Obj:
        namespace = resolve(expect.namespace, self.namespaces)
        path = KINDS[expect.kind].path(namespace or None, expect.name)
        last: list[Obj | None] = [None]

        async def probe() -> Obj | None:
            obj = last[0] = await self.kube.get(path)
            if obj is None or not answers(obj, expect):
                return None
            if expect.check is not None and not expect.check(obj, await self.context()):
                return None
            return obj

        try:
            return await eventually(probe, timeout=timeout, what=f"{expect}")
        except AssertionError:
            seen = conditions_of(last[0] or {})
            logs = "\n".join(op.log_tail(30) for op in self.operators)
            raise AssertionError(
                f"{expect.kind}/{expect.name}: wanted {expect.type}={expect.status} {expect.reason} "
                f"{expect.check_says}; has {seen}\n{(last[0] or {}).get('status')}\n{logs}"
            ) from None

    async def addresses(self) -> set[str]:
        """The substrate's IPAddress objects (one per IP held)."""
        items = (await self.kube.list(KINDS["IPAddress"].path()))["items"]
        return {i["metadata"]["name"] for i in items}

    async def versions(self) -> dict[str, str]:
        found: dict[str, str] = {}
        for path in self.sentinel_paths:
            obj = await self.kube.get(path)
            found[path] = obj["metadata"]["resourceVersion"] if obj else "gone"
        return found

    async def no_address_doubled(self) -> None:
        """No address is Provisioned on two attachments of the tenant namespace."""
        context = await self.context()
        provisioned = [
            address
            for a in context["attachments"].values()
            if conditions_of(a).get(CONDITION_PROVISIONED, ("", ""))[0] == "True"
            for address in (a.get("status") or {}).get("addresses") or []
        ]
        assert len(provisioned) == len(set(provisioned)), provisioned


@pytest.fixture(scope="module")
async def harness(
    kube: Kube, cluster: ClusterInfo, crds: None, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Harness]:
    # The Node the VM pods are bound to (no kubelet runs: the rows mark Pods Ready themselves).
    await kube.create(NODES.path(), {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    running = Harness(kube, cluster, tmp_path_factory.mktemp("catalogue"))
    try:
        yield running
    finally:
        await running.stack.aclose()
        await kube.delete(NODES.path(name=NODE))
        if running.idle_shares:
            shares = sorted(running.idle_shares)
            print(  # shown with -s: the figures the catalogue's closing note quotes
                f"\ncatalogue: operators idle after {len(shares)} samples: "
                f"median {shares[len(shares) // 2]:.1%}, max {shares[-1]:.1%} of a core"
            )


def operated_param(row: Operated) -> Any:
    marks = [pytest.mark.xfail(reason=row.xfail, strict=False)] if row.xfail else []
    return pytest.param(row, id=f"{row.group}:{row.id}", marks=marks)


@pytest.mark.parametrize("row", [operated_param(r) for r in OPERATED])
async def test_answered_by_the_operator(harness: Harness, row: Operated) -> None:
    await harness.enter(row.group)
    before = await harness.versions()
    made: list[Obj] = []
    try:
        for step in row.steps:
            await harness.do(step, made)
        await harness.answer(row.expect)
        await harness.no_address_doubled()
    finally:
        for obj in reversed(made):
            await harness.remove(obj)
    # Nothing else changed, nothing leaked, nobody crashed or spins.
    assert await harness.versions() == before, "a sentinel object changed"
    await eventually(
        lambda: _same(harness.addresses(), harness.baseline_addresses),
        timeout=ANSWER_TIMEOUT,
        what="every address the row took released",
    )
    for running in harness.operators:
        assert running.process.returncode is None, running.log_tail()
        assert "Traceback" not in running.log_path.read_text(), running.log_tail(200)
        share = await idle_share(running.process.pid)
        harness.idle_shares.append(share)
        assert share < IDLE_SHARE, f"{running.log_path.name}: {share:.0%} of a core after the row"


async def _same(current: Awaitable[set[str]], expected: set[str]) -> bool:
    return await current == expected


# --- The table covers the CRDs ---------------------------------------------------------------------

OUR_CRDS = [path for path in CRD_FILES if path.startswith("config/crd/")]


def crd_schemas() -> list[tuple[str, Obj]]:
    """(kind, openAPIV3Schema) of each of our CRDs."""
    return [
        (doc["spec"]["names"]["kind"], doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
        for path in OUR_CRDS
        for doc in load(path)
    ]


def spec_fields(schema: Obj, prefix: str) -> list[str]:
    """Every field under ``prefix``, through objects (not into list items or map values)."""
    found: list[str] = []
    for name, sub in (schema.get("properties") or {}).items():
        path = f"{prefix}.{name}"
        found.append(path)
        found.extend(spec_fields(sub, path))
    return found


def transition_rules(schema: Obj, path: str) -> list[str]:
    """The field paths a rule comparing with ``oldSelf`` guards (a rule's fieldPath when it has one)."""
    found = [
        f"{path}{rule['fieldPath']}" if rule.get("fieldPath") else path
        for rule in schema.get("x-kubernetes-validations") or []
        if "oldSelf" in rule["rule"]
    ]
    for name, sub in (schema.get("properties") or {}).items():
        if name != "status":
            found.extend(transition_rules(sub, f"{path}.{name}" if path else name))
    return found


def test_every_field_of_every_crd_is_tried() -> None:
    missing = []
    for kind, schema in crd_schemas():
        tried = {path for k, path in FIELDS_TRIED if k == kind}
        for path in ["metadata.name", *spec_fields(schema["properties"]["spec"], "spec")]:
            if not any(
                t == path or t.startswith(f"{path}.") or (t != "spec" and path.startswith(f"{t}."))
                for t in tried
            ):
                missing.append((kind, path))
    assert not missing, f"no row tries {missing}"
    assert len(ROWS) >= 200


def test_every_immutable_field_is_changed_in_every_form() -> None:
    missing = []
    for kind, schema in crd_schemas():
        changed = {path for k, path in CHANGES_TRIED if k == kind}
        for guarded in transition_rules(schema, ""):
            guarded = guarded.lstrip(".")
            if not any(c == guarded or c.startswith(f"{guarded}.") for c in changed):
                missing.append((kind, guarded))
    assert not missing, f"no row changes {missing} after create"
