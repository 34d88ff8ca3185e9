"""Lease leader election against an in-memory Lease API, in virtual time.

Each test runs on an event loop whose clock jumps to the next timer whenever nothing is ready (see
``VirtualTimeLoop``): electors use that clock and ``asyncio.sleep``, so a minute of renewals takes
no real time. The fake API keeps a resourceVersion per write and answers 409 to a stale one.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import pytest
from prometheus_client import CollectorRegistry

from harness.virtualtime import now, virtual_time
from shared.kube import ApiError, Obj
from shared.resources import LEASES
from shared.runtime.leader import ATTEMPT_PERIODS, LeaderElector, microtime
from shared.runtime.metrics import LeaderMetrics

NAMESPACE, NAME = "cozy-system", "gpuclass-operator"
PATH = LEASES.path(NAMESPACE, NAME)
EPOCH = datetime(2030, 1, 1, tzinfo=UTC)
# Timings of controller-runtime's defaults: renew every 2s, step down after 10s without a renew,
# standbys take over after 15s without a change.
LEASE, DEADLINE, RETRY = 15.0, 10.0, 2.0


async def sleep_until(moment: float) -> None:
    await asyncio.sleep(max(0.0, moment - now()))


# --- the fake Lease API ----------------------------------------------------------------------------


class LeaseServer:
    """Leases by path; every write gets the next resourceVersion; a PUT with another one is a 409."""

    def __init__(self) -> None:
        self.leases: dict[str, Obj] = {}
        self.version = 0
        self.conflicts = 0

    def store(self, path: str, body: Mapping[str, Any]) -> Obj:
        self.version += 1
        stored = copy.deepcopy(dict(body))
        stored.setdefault("metadata", {})["resourceVersion"] = str(self.version)
        self.leases[path] = stored
        return copy.deepcopy(stored)

    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.leases[PATH]["spec"]
        return spec

    def meddle(self, **spec: Any) -> None:
        """Someone else writes the lease (a label, or a forced holder)."""
        lease = copy.deepcopy(self.leases[PATH])
        lease["metadata"].setdefault("labels", {})["touched"] = str(self.version)
        lease["spec"].update(spec)
        self.store(PATH, lease)


class LeaseClient:
    """One replica's connection to the server: it can fail, or hang, like a partitioned one."""

    def __init__(self, server: LeaseServer) -> None:
        self.server = server
        self.broken: Literal["", "error", "hang"] = ""
        self.latency = 0.0  # of every call; even 0 yields, so concurrent electors interleave

    async def _call(self) -> None:
        await asyncio.sleep(self.latency)
        if self.broken == "error":
            raise ApiError(503, "ServiceUnavailable", "the API server is unreachable")
        if self.broken == "hang":
            await asyncio.Event().wait()

    async def get(self, path: str) -> Obj | None:
        await self._call()
        lease = self.server.leases.get(path)
        return copy.deepcopy(lease) if lease is not None else None

    async def create(self, path: str, body: Mapping[str, Any]) -> Obj:
        await self._call()
        full = f"{path}/{body['metadata']['name']}"
        if full in self.server.leases:
            self.server.conflicts += 1
            raise ApiError(409, "AlreadyExists", "leases.coordination.k8s.io already exists")
        return self.server.store(full, body)

    async def replace(self, path: str, body: Mapping[str, Any]) -> Obj:
        await self._call()
        current = self.server.leases.get(path)
        if current is None:
            raise ApiError(404, "NotFound", "not found")
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            self.server.conflicts += 1
            raise ApiError(409, "Conflict", "the object has been modified")
        return self.server.store(path, body)


class Replica:
    """An elector with its own client, registry and (possibly skewed) wall clock."""

    def __init__(self, server: LeaseServer, identity: str, wall_skew: float = 0.0) -> None:
        self.client = LeaseClient(server)
        self.registry = CollectorRegistry()
        self.stalled = 0.0  # seconds the elector's clock is ahead of the loop's (a blocked loop)
        self.elector = LeaderElector(
            self.client,
            NAMESPACE,
            NAME,
            identity,
            lease_duration=LEASE,
            renew_deadline=DEADLINE,
            retry_period=RETRY,
            clock=lambda: now() + self.stalled,
            wall_clock=lambda: EPOCH + timedelta(seconds=now() + wall_skew),
            metrics=LeaderMetrics(self.registry),
        )
        self.task: asyncio.Task[None] | None = None
        self.led_at: float | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.elector.run())

    async def leads_within(self, seconds: float) -> bool:
        try:
            async with asyncio.timeout(seconds):
                await self.elector.leading.wait()
        except TimeoutError:
            return False
        self.led_at = now()
        return True

    async def stops_within(self, seconds: float) -> bool:
        assert self.task is not None
        done, _ = await asyncio.wait({self.task}, timeout=seconds)
        if done:
            self.task.result()  # run() returned, it did not raise
        return bool(done)

    def metric(self) -> float | None:
        return self.registry.get_sample_value("leader_election_master_status", {"name": NAME})

    async def stop(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


def wall(moment: float) -> str:
    return microtime(EPOCH + timedelta(seconds=moment))


# --- tests -----------------------------------------------------------------------------------------


@virtual_time
async def test_acquires_an_absent_lease_and_renews_it() -> None:
    server = LeaseServer()
    a = Replica(server, "a")
    assert a.metric() == 0.0  # exported before any election
    a.start()
    assert await a.leads_within(1)
    assert a.elector.is_leader()
    assert a.metric() == 1.0
    assert server.spec() == {
        "holderIdentity": "a",
        "leaseDurationSeconds": 15,
        "acquireTime": wall(0),
        "renewTime": wall(0),
        "leaseTransitions": 0,
    }
    await sleep_until(7)
    assert server.spec()["renewTime"] == wall(6)  # renewed every retry period
    assert server.spec()["acquireTime"] == wall(0)
    assert server.conflicts == 0
    await a.stop()
    assert a.metric() == 0.0
    assert not a.elector.is_leader()


@pytest.mark.parametrize("skew", [0.0, 3600.0, -3600.0])
@virtual_time
async def test_a_standby_never_takes_a_live_lease_whatever_its_wall_clock(skew: float) -> None:
    server = LeaseServer()
    a, b = Replica(server, "a"), Replica(server, "b", wall_skew=skew)
    a.start()
    assert await a.leads_within(1)
    b.start()
    assert not await b.leads_within(120)
    assert server.spec()["holderIdentity"] == "a"
    assert server.spec()["leaseTransitions"] == 0
    assert a.elector.is_leader()
    assert b.metric() == 0.0
    await a.stop()
    await b.stop()


@virtual_time
async def test_a_fresh_standby_waits_a_full_lease_duration_however_old_the_renew_time() -> None:
    server = LeaseServer()
    # A lease last renewed an hour ago by a wall clock: only our own observation of it counts.
    server.store(
        PATH,
        {
            "metadata": {"name": NAME, "namespace": NAMESPACE},
            "spec": {
                "holderIdentity": "gone",
                "leaseDurationSeconds": 15,
                "acquireTime": wall(-3600),
                "renewTime": wall(-3600),
                "leaseTransitions": 4,
            },
        },
    )
    b = Replica(server, "b")
    b.start()
    assert await b.leads_within(60)
    assert b.led_at is not None
    assert LEASE <= b.led_at <= LEASE + RETRY + 1
    assert server.spec()["holderIdentity"] == "b"
    assert server.spec()["leaseTransitions"] == 5
    assert server.spec()["acquireTime"] == server.spec()["renewTime"] == wall(b.led_at)
    await b.stop()


@virtual_time
async def test_a_standby_takes_over_once_the_leader_stops_renewing() -> None:
    server = LeaseServer()
    a, b = Replica(server, "a"), Replica(server, "b")
    a.start()
    assert await a.leads_within(1)
    await sleep_until(1)
    b.start()
    await sleep_until(5)
    last_renew = 4.0
    assert server.spec()["renewTime"] == wall(last_renew)
    a.client.broken = "error"  # partitioned: its renews fail from now on
    assert await b.leads_within(60)
    assert b.led_at is not None
    # B saw A's last renew at its next poll (t=5) and then no change for a whole lease duration.
    assert last_renew + LEASE <= b.led_at <= last_renew + LEASE + 2 * RETRY
    assert not a.elector.is_leader()  # A had stopped writing before B could take over
    assert a.task is not None
    assert a.task.done()
    assert server.spec()["holderIdentity"] == "b"
    assert server.spec()["leaseTransitions"] == 1
    assert (a.metric(), b.metric()) == (0.0, 1.0)
    await b.stop()


@pytest.mark.parametrize("failure", ["error", "hang"])
@virtual_time
async def test_a_leader_that_cannot_renew_stops_at_the_deadline(failure: Literal["error", "hang"]) -> None:
    server = LeaseServer()
    a = Replica(server, "a")
    a.start()
    assert await a.leads_within(1)
    await sleep_until(3)
    assert server.spec()["renewTime"] == wall(2)  # the last renew that will succeed was sent at t=2
    a.client.broken = failure
    await sleep_until(2 + DEADLINE - 0.001)
    assert a.elector.is_leader()
    assert a.elector.leading.is_set()
    await sleep_until(2 + DEADLINE)
    assert not a.elector.is_leader()  # at once, whatever the renew loop is doing
    assert await a.stops_within(0.1)
    assert not a.elector.leading.is_set()
    assert a.metric() == 0.0


class HangsOnce(LeaseClient):
    """The first call after ``arm`` hangs (sent on a connection that died silently); the next ones,
    dialled afresh, are answered."""

    armed = False

    async def _call(self) -> None:
        if self.armed:
            self.armed = False
            await asyncio.Event().wait()
        await super()._call()


async def leading_since_two(server: LeaseServer, client: LeaseClient | None = None) -> Replica:
    """Replica "a" (with ``client``, if given) leading at t=3, its last renew sent at t=2."""
    a = Replica(server, "a")
    if client is not None:
        a.client = a.elector.kube = client
    a.start()
    assert await a.leads_within(1)
    await sleep_until(3)
    return a


@virtual_time
async def test_a_renew_hung_on_a_dead_connection_is_cut_in_time_for_another() -> None:
    """The attempt sent at t=4 is cut at t=8 (ATTEMPT_PERIODS x RETRY) and the next one is sent at
    once, not a retry period later: it gets the rest of the deadline. An attempt given the whole
    deadline would have hung until t=12 and stepped down."""
    server = LeaseServer()
    hangs = HangsOnce(server)
    a = await leading_since_two(server, hangs)
    hangs.armed = True
    cut = 4 + ATTEMPT_PERIODS * RETRY
    await sleep_until(cut + RETRY / 2)
    assert server.spec()["renewTime"] == wall(cut)
    await sleep_until(2 + DEADLINE + RETRY)
    assert a.elector.is_leader()
    assert a.elector.leading.is_set()
    assert server.spec()["renewTime"] == wall(cut + 2 * RETRY)  # and on
    await a.stop()


@virtual_time
async def test_an_attempt_answered_with_an_error_waits_a_retry_period() -> None:
    """An answer, even a refusal, means a server is there: the next attempt is paced."""
    server = LeaseServer()
    a = await leading_since_two(server)
    a.client.broken = "error"
    await sleep_until(4.5)  # the attempt at t=4 answered 503
    a.client.broken = ""
    await sleep_until(4 + RETRY / 2)
    assert server.spec()["renewTime"] == wall(2)
    await sleep_until(4 + RETRY + RETRY / 2)
    assert server.spec()["renewTime"] == wall(4 + RETRY)
    await a.stop()


@virtual_time
async def test_is_leader_turns_false_by_the_clock_alone_while_the_loop_is_blocked() -> None:
    server = LeaseServer()
    a = await leading_since_two(server)
    a.stalled = DEADLINE - 1.001  # the loop was blocked for ~9s: no task has run meanwhile
    assert a.elector.is_leader()
    a.stalled = DEADLINE - 1  # now 10s after the last renew, and still no task has run
    assert not a.elector.is_leader()
    assert a.elector.leading.is_set()  # the renew loop has not noticed yet; writers must not wait for it
    await a.stop()


@virtual_time
async def test_the_deadline_counts_from_when_the_last_renew_was_sent_not_answered() -> None:
    server = LeaseServer()
    a = Replica(server, "a")
    a.client.latency = 1.0  # a slow API server: every call takes a second
    a.start()
    assert await a.leads_within(3)
    await sleep_until(8.5)
    # Acquired (GET 0-1, POST 1-2), renewed by PUTs sent at 4 and 7 (each lands a second later).
    assert server.spec()["renewTime"] == wall(7)
    a.client.broken = "hang"
    await sleep_until(7 + DEADLINE - 0.001)
    assert a.elector.is_leader()
    await sleep_until(7 + DEADLINE)
    assert not a.elector.is_leader()
    assert await a.stops_within(0.1)


@virtual_time
async def test_a_write_by_someone_else_is_read_again_and_the_leader_renews() -> None:
    server = LeaseServer()
    a = Replica(server, "a")
    a.start()
    assert await a.leads_within(1)
    await sleep_until(3)
    server.meddle()  # a label added: the version A wrote last is stale
    await sleep_until(5)
    assert server.conflicts == 1
    assert server.spec()["renewTime"] == wall(4)  # renewed right after reading again
    assert server.leases[PATH]["metadata"]["labels"] == {"touched": "2"}
    assert a.elector.is_leader()
    await sleep_until(30)
    assert a.elector.is_leader()
    await a.stop()


@virtual_time
async def test_a_leader_steps_down_at_once_when_another_holder_shows_up() -> None:
    server = LeaseServer()
    a = Replica(server, "a")
    a.start()
    assert await a.leads_within(1)
    await sleep_until(3)
    server.meddle(holderIdentity="intruder")
    assert await a.stops_within(RETRY + 1)  # at its next renew, long before the deadline
    assert not a.elector.is_leader()
    assert server.spec()["holderIdentity"] == "intruder"
    assert a.metric() == 0.0


@virtual_time
async def test_two_replicas_racing_for_an_absent_lease_elect_exactly_one() -> None:
    server = LeaseServer()
    a, b = Replica(server, "a"), Replica(server, "b")
    a.start()
    b.start()
    await sleep_until(60)
    leaders = [r.elector.identity for r in (a, b) if r.elector.is_leader()]
    assert leaders == [server.spec()["holderIdentity"]]
    assert server.conflicts == 1  # the loser's create
    assert server.spec()["leaseTransitions"] == 0
    await a.stop()
    await b.stop()


@virtual_time
async def test_release_lets_the_standby_acquire_at_once() -> None:
    server = LeaseServer()
    a, b = Replica(server, "a"), Replica(server, "b")
    a.start()
    assert await a.leads_within(1)
    await sleep_until(1)
    b.start()
    await sleep_until(30)
    released = asyncio.create_task(a.elector.release())
    await asyncio.sleep(0)
    assert not a.elector.is_leader()  # before the lease is even written
    await released
    assert server.spec()["holderIdentity"] in ("", "b")
    assert await a.stops_within(RETRY + 1)
    assert await b.leads_within(RETRY + 1)  # not a whole lease duration
    assert server.spec()["holderIdentity"] == "b"
    assert server.spec()["leaseTransitions"] == 1
    assert (a.metric(), b.metric()) == (0.0, 1.0)
    await b.stop()


@virtual_time
async def test_release_writes_an_empty_holder_and_a_one_second_lease() -> None:
    server = LeaseServer()
    a = Replica(server, "a")
    a.start()
    assert await a.leads_within(1)
    await sleep_until(5)
    await a.elector.release()
    assert server.spec()["holderIdentity"] == ""
    assert server.spec()["leaseDurationSeconds"] == 1
    assert server.spec()["leaseTransitions"] == 0
    assert await a.stops_within(RETRY + 1)
    await sleep_until(30)
    assert server.spec()["holderIdentity"] == ""  # it does not take the lease back


@virtual_time
async def test_release_of_a_lease_held_by_someone_else_writes_nothing() -> None:
    server = LeaseServer()
    a, b = Replica(server, "a"), Replica(server, "b")
    a.start()
    assert await a.leads_within(1)
    b.start()
    await sleep_until(5)
    version = server.version
    await b.elector.release()
    assert server.version == version
    assert server.spec()["holderIdentity"] == "a"
    assert await b.stops_within(RETRY + 1)
    await a.stop()


@pytest.mark.parametrize(
    ("lease", "deadline", "retry"),
    [(10.0, 10.0, 2.0), (15.0, 2.0, 2.0), (15.0, 10.0, 0.0), (5.0, 10.0, 2.0)],
)
def test_timings_that_would_let_two_leaders_write_are_refused(
    lease: float, deadline: float, retry: float
) -> None:
    with pytest.raises(ValueError, match="lease_duration > renew_deadline > retry_period > 0"):
        LeaderElector(
            LeaseClient(LeaseServer()),
            NAMESPACE,
            NAME,
            "a",
            lease_duration=lease,
            renew_deadline=deadline,
            retry_period=retry,
        )
