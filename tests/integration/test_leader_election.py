"""Two replicas of each operator on one Lease, on the local control plane: issue 9's proofs that
leader election holds with real processes, a real API server and real signals.

Each replica is ``python -m operators.<name>`` as a subprocess (``harness.operators``) under the
operator's own ServiceAccount, authorised by config/rbac/<operator> only (the ClusterRole and the
leader-election Role on Leases), both on one Lease named per test (``--leader-election-id``), so no
test inherits a Lease another test's replica still holds. Each replica gets a distinct ``POD_NAME``,
which the runtime puts in front of its lease identity (``<POD_NAME>_<random>``, see
``shared.runtime.manager.default_identity``): the Lease's ``spec.holderIdentity``, read from the API
server, names the replica that holds it.

How "only the leader writes" is proved, from the API server's side. The API server cannot tell the two
replicas' requests apart: same ServiceAccount, same User-Agent, same field manager, and the
local control plane has neither an audit log nor API Priority and Fairness metrics. What it does
record is *when* each write happened relative to every other write: one etcd stores every kind, and
an object's ``resourceVersion`` is the etcd revision of the write that produced it, a total order of
all writes (the API contract calls resourceVersions opaque; this suite's control plane, like kind, has
one etcd, and the comparison is made only here). So the proof freezes the leader with SIGSTOP (it still
holds a fresh lease, as in a long GC pause or a partitioned node), creates new work that only a
running controller would act on, and checks in the API server's record that the first write touching
that work (the attachment, its rendered Service, its allocation) comes *after* the Lease write that
made the standby the holder. A standby that ran its controllers, or ignored its Writer's gate, would
write within milliseconds of the attachment's creation, some fifteen seconds before that Lease write.
The replicas' own counters back it up: ``controller_runtime_reconcile_total`` stays 0 on a standby.

Timing: the runtime's defaults (lease 15 s, renew deadline 10 s, retry 2 s; ``shared.operator`` has no
flags for them), so a takeover after SIGKILL or SIGSTOP takes 13-19 s by design: the standby counts
the lease duration from when *it* first saw the last renewal (up to one retry period after the
renewal), and notices expiry at its next retry. Every wait is on a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import httpx
import pytest

from hack.devcluster import ClusterInfo
from harness.ea_cluster import (
    ATTACHMENT_LABEL,
    ATTACHMENTS,
    CLAIMS,
    Tenant,
    World,
    addresses,
    attached,
    controller_uid,
    ea_world,
)
from harness.identity import serviceaccount_kubeconfig
from harness.manifests import apply_all, load
from harness.operators import RunningOperator, operator_process
from harness.waiting import eventually, wait_for_object
from operators.gpuclass.api import GPUCLASSES
from shared.kube import Kube, Obj
from shared.resources import LEASES, NODES, PODS, SERVICE_ACCOUNTS, SERVICES, Resource
from shared.runtime.manager import LeaderElection
from tests.gpuclass_builders import gpu_pod, make_node
from tests.gpuclass_builders import make_class as make_gpu_class

# --- the runtime's lease timings (its defaults: no flag changes them) --------------------------------

_DEFAULT_ELECTION: Final = LeaderElection(enabled=True, namespace="", name="")
LEASE_DURATION_SECONDS: Final = _DEFAULT_ELECTION.lease_duration
RETRY_PERIOD_SECONDS: Final = _DEFAULT_ELECTION.retry_period
# A standby takes an abandoned lease within lease duration + this of the leader's death: up to one
# retry period before it first sees the last renewal, one more before it notices the expiry, and
# slack for a loaded machine.
TAKEOVER_SLACK_SECONDS: Final = 5.0
TAKEOVER_BOUND_SECONDS: Final = LEASE_DURATION_SECONDS + TAKEOVER_SLACK_SECONDS
# A released lease is taken at the standby's next retry: the shutdown up to the release (up to 1.5 s
# measured on a loaded machine), one retry period, a few requests, and slack.
# Half the lease duration: a takeover by expiry could not come before EARLIEST_TAKEOVER_SECONDS.
HANDOVER_BOUND_SECONDS: Final = LEASE_DURATION_SECONDS / 2
# A replica stopped by SIGTERM, or a leader resumed after its lease passed on (it must notice at once:
# its renew deadline is long past), exits within this; its shutdown takes part of it.
EXIT_TIMEOUT_SECONDS: Final = 15.0
# A frozen leader renewed at most one retry period before it froze, and the standby counts the lease
# duration from no earlier than that renewal: a takeover sooner than this came before expiry.
EARLIEST_TAKEOVER_SECONDS: Final = LEASE_DURATION_SECONDS - RETRY_PERIOD_SECONDS
# Both replicas start, sync their caches and elect within this.
ELECTION_TIMEOUT_SECONDS: Final = 45.0
# The separator between POD_NAME and the random suffix in a lease identity.
IDENTITY_SEPARATOR: Final = "_"
MASTER_STATUS: Final = "leader_election_master_status"
RECONCILE_TOTAL: Final = "controller_runtime_reconcile_total"
READY_HTTP_STATUS: Final = 200
HTTP_TIMEOUT_SECONDS: Final = 5.0
LOG_TAIL_LINES: Final = 80
REPLICA_NAMES: Final = ("replica-a", "replica-b")

# --- EndpointAttachment ------------------------------------------------------------------------------

EA_MODULE: Final = "operators.endpointattachment"
EA_NAMESPACE: Final = "cozy-endpointattachment"
EA_SERVICE_ACCOUNT: Final = "endpointattachment-operator"
EA_RBAC_DIR: Final = "config/rbac/endpointattachment"
EA_TENANT_ROLES: Final = frozenset({"tenant_roles.yaml"})  # the tenants' roles, not the operator's
EA_ARGS: Final = (f"--leader-election-namespace={EA_NAMESPACE}",)
# The controller whose passes show the work was done.
ATTACHMENT_CONTROLLER: Final = "endpointattachment"
APP: Final = "db"
APP_KIND: Final = "Postgres"
ENDPOINT: Final = "postgres-db-rw"
# The substrate deletes a class's addresses with their claims: each test leaves nothing held.
RECLAIM_DELETE: Final = "Delete"
# Attachments in the SIGKILL test, all minting from one class; killed once this many claims exist.
BATCH_SIZE: Final = 30
KILL_AT_CLAIMS: Final = 5
# Each test mints from its own block of TEST-NET-1 (192.0.2.0/24): an IPAddress is named by its
# address, cluster-wide, so blocks never overlap. The batch's /26 holds 62 addresses for 30.
BATCH_CIDR: Final = "192.0.2.128/26"
ELECTION_CIDR: Final = "192.0.2.192/29"
FROZEN_CIDR: Final = "192.0.2.200/29"
HANDOVER_CIDR: Final = "192.0.2.208/29"
# Everything the batch needs (mint, render, the load balancer's answer, Ready) after a takeover.
WORK_TIMEOUT_SECONDS: Final = 90.0
READY_TIMEOUT_SECONDS: Final = 40.0
# Deleting a batch: the leader removes each Service and finalizer.
DRAIN_TIMEOUT_SECONDS: Final = 60.0

# --- GPUClass ----------------------------------------------------------------------------------------

GPU_MODULE: Final = "operators.gpuclass"
GPU_NAMESPACE: Final = "cozy-gpuclass"
GPU_SERVICE_ACCOUNT: Final = "gpuclass-operator"
GPU_RBAC_DIR: Final = "config/rbac/gpuclass"
GPU_ARGS: Final = (
    "--debounce-seconds=0.2",
    "--kubevirt-recheck-seconds=2",
    f"--leader-election-namespace={GPU_NAMESPACE}",
)
GPU_CRD_FILE: Final = "config/crd/gpuclass/gpu.cozystack.io_gpuclasses.yaml"
# A resource name of this test's own, so no other class (a leftover, an older owner) conflicts.
GPU_RESOURCE: Final = "nvidia.com/LEADER_ELECTION_TEST"
GPU_NODE: Final = "gpu-le-node"
GPU_CLASS: Final = "le-gpu"
GPU_UNITS: Final = 8
GPU_POD_UNITS: Final = 3
GPU_TIMEOUT_SECONDS: Final = 45.0

NAMESPACED_RBAC_KINDS: Final = frozenset({"ServiceAccount", "Role", "RoleBinding"})


# --- replicas ----------------------------------------------------------------------------------------


@dataclass
class Replica:
    """One operator process and the POD_NAME its lease identity starts with."""

    pod_name: str
    operator: RunningOperator

    @property
    def process(self) -> asyncio.subprocess.Process:
        return self.operator.process

    def named_by(self, identity: str) -> bool:
        return identity.startswith(f"{self.pod_name}{IDENTITY_SEPARATOR}")

    def holds(self, lease: Obj | None) -> bool:
        """Whether the Lease (as the API server stores it) names this replica as its holder."""
        return self.named_by(holder_of(lease))

    async def master_status(self, lease_name: str) -> float | None:
        """``leader_election_master_status`` for the lease; None while the metrics port is not up."""
        try:
            samples = await self.operator.scrape()
        except httpx.TransportError:
            return None
        return samples.get((MASTER_STATUS, (("name", lease_name),)))

    async def reconciles(self) -> dict[tuple[str, str], float]:
        """(controller, result) -> passes, for every series this replica serves."""
        samples = await self.operator.scrape()
        return {
            (dict(labels)["controller"], dict(labels)["result"]): value
            for (name, labels), value in samples.items()
            if name == RECONCILE_TOTAL
        }

    async def readyz(self) -> int:
        async with httpx.AsyncClient() as client:
            response = await client.get(
                f"http://127.0.0.1:{self.operator.health_port}/readyz", timeout=HTTP_TIMEOUT_SECONDS
            )
        return response.status_code

    def log(self) -> str:
        return f"--- {self.pod_name} ---\n{self.operator.log_tail(LOG_TAIL_LINES)}"

    def assert_clean(self) -> None:
        """Still running, and nothing in its log crashed."""
        assert self.process.returncode is None, f"{self.pod_name} died:\n{self.log()}"
        text = self.operator.log_path.read_text(errors="replace")
        assert "Traceback" not in text, self.log()


def holder_of(lease: Obj | None) -> str:
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


def logs(group: Sequence[Replica]) -> str:
    return "\n".join(replica.log() for replica in group)


@contextlib.asynccontextmanager
async def replicas(
    kube: Kube,
    cluster: ClusterInfo,
    tmp_path: Path,
    *,
    module: str,
    namespace: str,
    service_account: str,
    args: Sequence[str],
    lease_name: str,
) -> AsyncIterator[list[Replica]]:
    """Two processes of one operator, under one ServiceAccount (a token each, as two Pods would have),
    on one Lease; started together, so they race for it. Stopped (SIGTERM) on exit."""
    async with contextlib.AsyncExitStack() as stack:
        group: list[Replica] = []
        for pod_name in REPLICA_NAMES:
            kubeconfig = await serviceaccount_kubeconfig(
                kube, cluster.kubeconfig, namespace, service_account, tmp_path / f"{pod_name}.kubeconfig"
            )
            running = await stack.enter_async_context(
                operator_process(
                    module,
                    kubeconfig,
                    [*args, f"--leader-election-id={lease_name}"],
                    tmp_path / f"{pod_name}.log",
                    {"POD_NAME": pod_name},
                )
            )
            group.append(Replica(pod_name, running))
        yield group


async def elect(group: Sequence[Replica], lease_name: str) -> tuple[Replica, Replica]:
    """Wait until exactly one replica reports 1 for the lease and the other 0: (leader, standby)."""

    async def one_leader() -> tuple[Replica, Replica] | None:
        statuses = [await replica.master_status(lease_name) for replica in group]
        if sorted(s if s is not None else -1.0 for s in statuses) != [0.0, 1.0]:
            return None
        return group[statuses.index(1.0)], group[statuses.index(0.0)]

    try:
        return await eventually(one_leader, timeout=ELECTION_TIMEOUT_SECONDS, what="exactly one leader")
    except AssertionError as error:
        raise AssertionError(f"{error}\n{logs(group)}") from None


@dataclass(frozen=True)
class LeaseWrite:
    """One write of the Lease as the API server reports it: who it names, and its etcd revision."""

    holder: str
    revision: int


async def holders_until(
    kube: Kube,
    namespace: str,
    lease_name: str,
    since_version: str,
    done: Callable[[str], bool],
    timeout: float,
) -> list[LeaseWrite]:
    """Every write of the Lease after ``since_version``, in order, up to and including the first
    whose holder ``done`` accepts (a watch from that version misses no write)."""
    seen: list[LeaseWrite] = []

    async def follow() -> list[LeaseWrite]:
        events = kube.watch(
            LEASES.path(namespace),
            resource_version=since_version,
            field_selector=f"metadata.name={lease_name}",
        )
        async with contextlib.aclosing(events):
            async for kind, lease in events:
                if kind not in ("ADDED", "MODIFIED"):
                    continue
                seen.append(LeaseWrite(holder_of(lease), int(lease["metadata"]["resourceVersion"])))
                if done(seen[-1].holder):
                    return seen
        raise AssertionError(f"the watch on Lease {lease_name} ended; writes seen: {seen}")

    try:
        async with asyncio.timeout(timeout):
            return await follow()
    except TimeoutError:
        raise AssertionError(f"no takeover within {timeout}s; Lease writes seen: {seen}") from None


def holders(writes: Sequence[LeaseWrite]) -> list[str]:
    return [write.holder for write in writes]


async def lease_of(kube: Kube, namespace: str, lease_name: str) -> Obj:
    lease = await kube.get(LEASES.path(namespace, lease_name))
    assert lease is not None, f"no Lease {namespace}/{lease_name}"
    return lease


async def wait_master(replica: Replica, lease_name: str, timeout: float) -> None:
    async def leading() -> bool:
        return await replica.master_status(lease_name) == 1.0

    await eventually(leading, timeout=timeout, what=f"{replica.pod_name} reporting itself leader")


def operator_rbac(rbac_dir: str, namespace: str, skip: frozenset[str] = frozenset()) -> list[Obj]:
    """What config/rbac/<operator> installs for the operator itself (its kustomization's resources
    but ``skip``), with the operator's namespace where kustomize would set it."""
    listed = load(f"{rbac_dir}/kustomization.yaml")[0]["resources"]
    docs = [doc for name in listed if name not in skip for doc in load(f"{rbac_dir}/{name}")]
    for doc in docs:
        if doc["kind"] in NAMESPACED_RBAC_KINDS:
            doc["metadata"].setdefault("namespace", namespace)
    return docs


async def install_operator_identity(kube: Kube, namespace: str, rbac: Sequence[Obj]) -> None:
    namespace_doc = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    await apply_all(kube, [namespace_doc, *rbac])


# --- EndpointAttachment world ------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def world(kube: Kube) -> AsyncIterator[World]:
    """The CRDs, MetalLB and the address substrate's model, for the EndpointAttachment tests."""
    async with ea_world(kube) as running:
        yield running


class ElectionTenant(Tenant):
    """One tenant namespace with one application and its tenant-facing Service, an address class,
    and the attachments a test makes; all removed afterwards (``Tenant.cleanup``)."""

    async def setup(self, class_name: str, cidr: str) -> None:
        await self.address_class(class_name, cidr, reclaim=RECLAIM_DELETE)
        await self.app(APP, APP_KIND)
        await self.endpoint(ENDPOINT, APP, kind=APP_KIND, selector={"app": APP})

    async def mint(self, name: str, class_name: str) -> Obj:
        return await self.attachment(name, ENDPOINT, app=APP, kind=APP_KIND, class_name=class_name)

    async def attachments(self) -> list[Obj]:
        items: list[Obj] = (await self.kube.list(ATTACHMENTS.path(self.namespace)))["items"]
        return items

    async def claims(self) -> list[Obj]:
        items: list[Obj] = (await self.kube.list(CLAIMS.path(self.namespace)))["items"]
        return items

    async def drain(self, group: Sequence[Replica]) -> None:
        """Delete every attachment and wait until the leader has finalized them all."""
        for attachment in await self.attachments():
            await self.kube.delete(ATTACHMENTS.path(self.namespace, attachment["metadata"]["name"]))

        async def drained() -> bool:
            return not await self.attachments()

        try:
            await eventually(drained, timeout=DRAIN_TIMEOUT_SECONDS, what="the attachments finalized")
        except AssertionError as error:
            raise AssertionError(f"{error}\n{logs(group)}") from None


@pytest.fixture
async def tenant(kube: Kube, namespace: str, world: World) -> AsyncIterator[ElectionTenant]:
    await wait_for_object(kube, SERVICE_ACCOUNTS, "default", lambda o: o is not None, namespace=namespace)
    made = ElectionTenant(kube, namespace, world)
    yield made
    await made.cleanup()


@contextlib.asynccontextmanager
async def ea_replicas(
    kube: Kube, cluster: ClusterInfo, tmp_path: Path, lease_name: str, tenant: ElectionTenant
) -> AsyncIterator[list[Replica]]:
    """Two EndpointAttachment replicas (MetalLB and the substrate run for the module); when the test
    passed, the tenant's attachments are deleted while a leader still runs, so they are finalized
    now (their Services withdrawn) instead of being left for the next test's replicas."""
    await install_operator_identity(
        kube, EA_NAMESPACE, operator_rbac(EA_RBAC_DIR, EA_NAMESPACE, EA_TENANT_ROLES)
    )
    async with replicas(
        kube,
        cluster,
        tmp_path,
        module=EA_MODULE,
        namespace=EA_NAMESPACE,
        service_account=EA_SERVICE_ACCOUNT,
        args=EA_ARGS,
        lease_name=lease_name,
    ) as group:
        yield group
        await tenant.drain(group)


async def wait_published(kube: Kube, namespace: str, name: str, group: Sequence[Replica]) -> Obj:
    """The attachment once Attached (both conditions True); the replicas' logs if it never is."""
    try:
        found = await wait_for_object(
            kube, ATTACHMENTS, name, attached, namespace=namespace, timeout=READY_TIMEOUT_SECONDS
        )
    except AssertionError as error:
        raise AssertionError(f"{error}\n{logs(group)}") from None
    assert found is not None
    return found


async def wait_for_claims(kube: Kube, namespace: str, count: int, timeout: float) -> int:
    """Until at least ``count`` claims exist in the namespace (on a watch, so the moment is not
    missed by a poll's interval); returns how many there are then."""
    names: set[str] = set()

    async def follow() -> int:
        listing = await kube.list(CLAIMS.path(namespace))
        names.update(c["metadata"]["name"] for c in listing["items"])
        if len(names) >= count:
            return len(names)
        events = kube.watch(CLAIMS.path(namespace), resource_version=listing["metadata"]["resourceVersion"])
        async with contextlib.aclosing(events):
            async for kind, claim in events:
                if kind == "ADDED":
                    names.add(claim["metadata"]["name"])
                    if len(names) >= count:
                        return len(names)
        raise AssertionError("the watch on claims ended")

    try:
        async with asyncio.timeout(timeout):
            return await follow()
    except TimeoutError:
        raise AssertionError(f"only {len(names)} claims in {namespace} after {timeout}s") from None


@dataclass(frozen=True)
class Write:
    """One write the API server recorded: the etcd revision it was stored at, and what it touched."""

    revision: int
    what: str


async def record_writes(
    kube: Kube, namespace: str, attachment: str, since_version: str, into: list[Write]
) -> None:
    """Every write after ``since_version`` to the attachment, and to the Services and claims
    labelled for it (its rendered Service, its minted claim: their names are generated), appended to
    ``into`` as the API server reports them (until cancelled)."""

    async def follow(resource: Resource, fields: str = "", labels: str = "") -> None:
        events = kube.watch(
            resource.path(namespace),
            resource_version=since_version,
            field_selector=fields,
            label_selector=labels,
        )
        async with contextlib.aclosing(events):
            async for kind, obj in events:
                if kind != "BOOKMARK":
                    metadata = obj["metadata"]
                    into.append(Write(int(metadata["resourceVersion"]), f"{kind} {resource.plural}"))

    ours = f"{ATTACHMENT_LABEL}={attachment}"
    await asyncio.gather(
        follow(ATTACHMENTS, fields=f"metadata.name={attachment}"),
        follow(SERVICES, labels=ours),
        follow(CLAIMS, labels=ours),
    )


# --- EndpointAttachment: the proofs ------------------------------------------------------------------


async def test_ea_two_replicas_elect_exactly_one_leader_and_only_it_reconciles(
    kube: Kube, cluster: ClusterInfo, tenant: ElectionTenant, tmp_path: Path
) -> None:
    """Started together on one Lease, one replica leads (its gauge 1, the Lease names it) and the
    other stands by (gauge 0) with its caches synced (/readyz); the leader does the work, and the
    standby has not run a single pass of any of its controllers."""
    lease_name = "le-ea-election"
    async with ea_replicas(kube, cluster, tmp_path, lease_name, tenant) as group:
        leader, standby = await elect(group, lease_name)
        assert leader.holds(await lease_of(kube, EA_NAMESPACE, lease_name))

        await tenant.setup("le-election", ELECTION_CIDR)
        names = [f"e{i}" for i in range(3)]
        for name in names:
            await tenant.mint(name, "le-election")
        for name in names:
            await wait_published(kube, tenant.namespace, name, group)

        assert [await r.readyz() for r in group] == [READY_HTTP_STATUS] * len(group), logs(group)
        standby_passes = await standby.reconciles()
        assert standby_passes, "the standby serves no reconcile series"
        assert set(standby_passes.values()) == {0.0}, standby_passes
        assert (await leader.reconciles())[(ATTACHMENT_CONTROLLER, "success")] >= len(names)
        # Nothing moved meanwhile: one leader throughout.
        assert (await leader.master_status(lease_name), await standby.master_status(lease_name)) == (1.0, 0.0)
        assert leader.holds(await lease_of(kube, EA_NAMESPACE, lease_name))
        for replica in group:
            replica.assert_clean()


async def test_ea_standby_writes_nothing_while_a_frozen_leader_holds_the_lease(
    kube: Kube, cluster: ClusterInfo, tenant: ElectionTenant, tmp_path: Path
) -> None:
    """The API server's own record (see the module docstring): with the leader frozen (SIGSTOP) but
    its lease still fresh, an attachment created now is first written after the Lease write that
    makes the standby the holder, never before. Resumed (SIGCONT), the old leader finds its renew
    deadline long past and exits non-zero instead of writing."""
    lease_name = "le-ea-frozen"
    async with ea_replicas(kube, cluster, tmp_path, lease_name, tenant) as group:
        leader, standby = await elect(group, lease_name)
        await tenant.setup("le-frozen", FROZEN_CIDR)
        await tenant.mint("early", "le-frozen")
        await wait_published(kube, tenant.namespace, "early", group)

        lease = await lease_of(kube, EA_NAMESPACE, lease_name)
        assert leader.holds(lease)
        loop = asyncio.get_running_loop()
        assert leader.process.pid is not None
        os.kill(leader.process.pid, signal.SIGSTOP)
        frozen_at = loop.time()
        try:
            created = await tenant.mint("late", "le-frozen")
            writes: list[Write] = []
            recorder = asyncio.create_task(
                record_writes(kube, tenant.namespace, "late", created["metadata"]["resourceVersion"], writes)
            )
            try:
                lease_writes = await holders_until(
                    kube,
                    EA_NAMESPACE,
                    lease_name,
                    lease["metadata"]["resourceVersion"],
                    standby.named_by,
                    TAKEOVER_BOUND_SECONDS,
                )
                took_over = loop.time() - frozen_at
                await wait_published(kube, tenant.namespace, "late", group)
                await eventually(
                    lambda: _some(writes), timeout=READY_TIMEOUT_SECONDS, what="the late attachment's writes"
                )
            finally:
                recorder.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await recorder
        finally:
            os.kill(leader.process.pid, signal.SIGCONT)
            resumed_at = loop.time()
        print(
            f"\nfrozen leader: standby took over after {took_over:.1f}s; {holders(lease_writes)}; "
            f"takeover at revision {lease_writes[-1].revision}, the late attachment's {len(writes)} "
            f"writes from revision {min(w.revision for w in writes)}"
        )

        # The last Lease write seen is the one that made the standby the holder: every write
        # touching the late attachment must come after it in the API server's order.
        taken_at = lease_writes[-1].revision
        early = [w for w in writes if w.revision <= taken_at]
        assert not early, f"written before the standby held the lease (revision {taken_at}): {early}"
        assert took_over >= EARLIEST_TAKEOVER_SECONDS, (
            f"taken over after {took_over:.1f}s: before the frozen leader's lease could expire"
        )
        await wait_master(standby, lease_name, HTTP_TIMEOUT_SECONDS)

        try:
            code = await asyncio.wait_for(leader.process.wait(), EXIT_TIMEOUT_SECONDS)
        except TimeoutError:
            raise AssertionError(f"the resumed old leader did not exit:\n{leader.log()}") from None
        print(f"frozen leader: exited {code}, {loop.time() - resumed_at:.1f}s after it was resumed")
        assert code != 0, f"the old leader exited {code} after losing its lease:\n{leader.log()}"
        standby.assert_clean()


async def _some(writes: list[Write]) -> bool:
    return bool(writes)


async def test_ea_sigkill_of_the_leader_mid_batch_the_standby_takes_over_and_finishes(
    kube: Kube, cluster: ClusterInfo, tenant: ElectionTenant, tmp_path: Path
) -> None:
    """SIGKILL the leader with a batch of mints in flight: the standby holds the lease within lease
    duration + 5 s of the kill and finishes the batch: every attachment Attached with its own
    address, and exactly one claim per attachment, controlled by it and the one its status names:
    a claim the dead leader created but never recorded is found again by its owner reference, never
    minted twice, and no address is handed out twice."""
    lease_name = "le-ea-sigkill"
    async with ea_replicas(kube, cluster, tmp_path, lease_name, tenant) as group:
        leader, standby = await elect(group, lease_name)
        await tenant.setup("le-batch", BATCH_CIDR)
        lease = await lease_of(kube, EA_NAMESPACE, lease_name)
        assert leader.holds(lease)

        names = [f"b{i:02d}" for i in range(BATCH_SIZE)]
        await asyncio.gather(*(tenant.mint(name, "le-batch") for name in names))
        minted = await wait_for_claims(kube, tenant.namespace, KILL_AT_CLAIMS, READY_TIMEOUT_SECONDS)
        loop = asyncio.get_running_loop()
        leader.process.kill()
        killed_at = loop.time()
        await leader.process.wait()
        ready_at_kill = sum(attached(a) for a in await tenant.attachments())
        assert ready_at_kill < BATCH_SIZE, "the leader finished before the kill: no work was in flight"

        lease_writes = await holders_until(
            kube,
            EA_NAMESPACE,
            lease_name,
            lease["metadata"]["resourceVersion"],
            standby.named_by,
            TAKEOVER_BOUND_SECONDS,
        )
        took_over = loop.time() - killed_at
        await wait_master(standby, lease_name, max(0.0, TAKEOVER_BOUND_SECONDS - took_over))
        print(
            f"\nSIGKILL: {minted} claims minted and {ready_at_kill}/{BATCH_SIZE} Attached at the kill; "
            f"standby took over after {took_over:.1f}s; {holders(lease_writes)}"
        )

        async def all_attached() -> list[Obj] | None:
            items = await tenant.attachments()
            done = [a for a in items if attached(a) and addresses(a)]
            return items if len(done) == BATCH_SIZE else None

        try:
            items = await eventually(
                all_attached, timeout=WORK_TIMEOUT_SECONDS, what="the whole batch Attached"
            )
        except AssertionError as error:
            raise AssertionError(f"{error}\n{standby.log()}") from None
        finished = loop.time() - killed_at
        held = {a["metadata"]["uid"]: tuple(addresses(a)) for a in items}
        assert len(set(held.values())) == BATCH_SIZE, f"an address handed out twice: {held}"
        recorded = {a["metadata"]["uid"]: a["status"]["claimName"] for a in items}
        claims = await tenant.claims()
        controlled = {controller_uid(c): c["metadata"]["name"] for c in claims}
        assert len(claims) == BATCH_SIZE, f"{len(claims)} claims for {BATCH_SIZE} attachments: {controlled}"
        assert controlled == recorded, f"claims by owner {controlled}, by status {recorded}"
        print(f"SIGKILL: the batch was finished {finished:.1f}s after the kill")
        standby.assert_clean()


async def test_ea_sigterm_hands_the_lease_over_at_once(
    kube: Kube, cluster: ClusterInfo, tenant: ElectionTenant, tmp_path: Path
) -> None:
    """A graceful stop releases the lease (the Lease shows no holder) and the standby takes it at its
    next retry, well before the lease could have expired; the old leader exits 0 and the new one
    does the work."""
    lease_name = "le-ea-sigterm"
    async with ea_replicas(kube, cluster, tmp_path, lease_name, tenant) as group:
        leader, standby = await elect(group, lease_name)
        lease = await lease_of(kube, EA_NAMESPACE, lease_name)
        assert leader.holds(lease)

        loop = asyncio.get_running_loop()
        watching = asyncio.create_task(
            holders_until(
                kube,
                EA_NAMESPACE,
                lease_name,
                lease["metadata"]["resourceVersion"],
                standby.named_by,
                HANDOVER_BOUND_SECONDS,
            )
        )
        leader.process.terminate()
        stopped_at = loop.time()
        handover = holders(await watching)
        handed_over = loop.time() - stopped_at
        print(f"\nSIGTERM: standby took over after {handed_over:.1f}s; {handover}")
        assert "" in handover, f"the lease was not released, it expired: {handover}"
        await wait_master(standby, lease_name, HTTP_TIMEOUT_SECONDS)
        code = await asyncio.wait_for(leader.process.wait(), EXIT_TIMEOUT_SECONDS)
        print(f"SIGTERM: the old leader exited {code}, {loop.time() - stopped_at:.1f}s after the signal")
        assert code == 0, f"the graceful stop exited {code}:\n{leader.log()}"

        await tenant.setup("le-handover", HANDOVER_CIDR)
        await tenant.mint("after", "le-handover")
        await wait_published(kube, tenant.namespace, "after", [standby])
        standby.assert_clean()


# --- GPUClass ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def gpuclass_crd(kube: Kube) -> None:
    await apply_all(kube, load(GPU_CRD_FILE))


class GPUWorld:
    """One GPU node (played kubelet: Ready, allocatable), one class, and pods; removed afterwards."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube, self.namespace = kube, namespace
        self.nodes: list[str] = []
        self.classes: list[str] = []

    async def node(self, name: str, units: int) -> None:
        built = make_node(name, allocatable={GPU_RESOURCE: str(units)})
        await self.kube.create(
            NODES.path(), {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": {}}
        )
        self.nodes.append(name)
        status = built["status"]
        await self.kube.patch(
            NODES.path(name=name) + "/status",
            {
                "status": {
                    "conditions": status["conditions"],
                    "capacity": status["allocatable"],
                    "allocatable": status["allocatable"],
                }
            },
            kind="merge",
        )
        # Play the node lifecycle controller: lift the not-ready taint admission put on the new Node.
        await self.kube.patch(NODES.path(name=name), {"spec": {"taints": None}}, kind="merge")

    async def gpu_class(self, name: str) -> None:
        built = make_gpu_class(name, GPU_RESOURCE)
        await self.kube.create(
            GPUCLASSES.path(),
            {
                "apiVersion": built["apiVersion"],
                "kind": "GPUClass",
                "metadata": {"name": name},
                "spec": built["spec"],
            },
        )
        self.classes.append(name)

    async def pod(self, name: str, units: int, node: str) -> None:
        built = gpu_pod(name, GPU_RESOURCE, units, node=node)
        await self.kube.create(
            PODS.path(self.namespace),
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": built["spec"]},
        )
        await self.kube.patch(
            PODS.path(self.namespace, name) + "/status", {"status": {"phase": "Running"}}, kind="merge"
        )

    async def cleanup(self) -> None:
        for name in self.classes:
            await self.kube.delete(GPUCLASSES.path(name=name))
        for pod in (await self.kube.list(PODS.path(self.namespace)))["items"]:
            await self.kube.delete(PODS.path(self.namespace, pod["metadata"]["name"]), grace_period_seconds=0)
        for name in self.nodes:
            await self.kube.delete(NODES.path(name=name))


@pytest.fixture
async def gpu_world(kube: Kube, namespace: str, gpuclass_crd: None) -> AsyncIterator[GPUWorld]:
    await wait_for_object(kube, SERVICE_ACCOUNTS, "default", lambda o: o is not None, namespace=namespace)
    world = GPUWorld(kube, namespace)
    yield world
    await world.cleanup()


async def wait_free_units(kube: Kube, units: int, group: Sequence[Replica]) -> None:
    def free(gpu_class: Obj | None) -> bool:
        return ((gpu_class or {}).get("status") or {}).get("freeUnits") == units

    try:
        await wait_for_object(kube, GPUCLASSES, GPU_CLASS, free, timeout=GPU_TIMEOUT_SECONDS)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{logs(group)}") from None


async def test_gpuclass_two_replicas_one_leader_and_a_sigkill_takeover(
    kube: Kube, cluster: ClusterInfo, gpu_world: GPUWorld, tmp_path: Path
) -> None:
    """Two GPUClass replicas: one leads and writes the status, the other has run no pass; SIGKILL the
    leader and the standby holds the lease within lease duration + 5 s, and the status follows a
    change made after the kill."""
    lease_name = "le-gpuclass"
    await install_operator_identity(kube, GPU_NAMESPACE, operator_rbac(GPU_RBAC_DIR, GPU_NAMESPACE))
    async with replicas(
        kube,
        cluster,
        tmp_path,
        module=GPU_MODULE,
        namespace=GPU_NAMESPACE,
        service_account=GPU_SERVICE_ACCOUNT,
        args=GPU_ARGS,
        lease_name=lease_name,
    ) as group:
        leader, standby = await elect(group, lease_name)
        lease = await lease_of(kube, GPU_NAMESPACE, lease_name)
        assert leader.holds(lease)
        await gpu_world.node(GPU_NODE, GPU_UNITS)
        await gpu_world.gpu_class(GPU_CLASS)
        await wait_free_units(kube, GPU_UNITS, group)
        assert set((await standby.reconciles()).values()) == {0.0}

        loop = asyncio.get_running_loop()
        leader.process.kill()
        killed_at = loop.time()
        await leader.process.wait()
        # A change the dead leader never saw.
        await gpu_world.pod("consumer", GPU_POD_UNITS, GPU_NODE)
        lease_writes = await holders_until(
            kube,
            GPU_NAMESPACE,
            lease_name,
            lease["metadata"]["resourceVersion"],
            standby.named_by,
            TAKEOVER_BOUND_SECONDS,
        )
        took_over = loop.time() - killed_at
        await wait_master(standby, lease_name, max(0.0, TAKEOVER_BOUND_SECONDS - took_over))
        print(f"\nGPUClass SIGKILL: standby took over after {took_over:.1f}s; {holders(lease_writes)}")

        await wait_free_units(kube, GPU_UNITS - GPU_POD_UNITS, [standby])
        assert (await standby.reconciles()).get(("gpuclass", "success"), 0.0) >= 1
        standby.assert_clean()
