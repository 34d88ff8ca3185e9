"""Leader election over a ``coordination.k8s.io/v1`` Lease: one replica writes, the others stand by.

Decides:

* a replica takes the lease when it is absent, released (no holder), or expired; a lease is expired
  when its record (holder, times, duration, transitions) has not changed for the lease's duration as
  measured by OUR monotonic clock since we first saw that record: wall clocks of two machines are
  never compared, the renewTime written in the lease is for people only;
* every write carries the resourceVersion it was decided on (optimistic concurrency): a 409 means
  someone else wrote, so the lease is read again before deciding anew;
* the leader renews every ``retry_period``, each attempt cut after ``ATTEMPT_PERIODS`` of them (an
  attempt that got no answer is followed at once by another; one that got an answer, an error
  included, after a retry period);
  ``is_leader()`` is True only while the last successful
  renew was sent less than ``renew_deadline`` ago by our clock (the write path asks before every
  write, so a leader that cannot renew stops writing at that instant, hung requests included), and
  ``run`` returns when the deadline passes or another holder is seen. Since ``renew_deadline`` <
  ``lease_duration``, the old leader has stopped writing before any standby may take over;
* ``release`` gives the lease up (holder cleared, duration 1s) so a standby takes it at once.

Does not: restart anything (the caller exits when ``run`` returns) or jitter its retries (two or three
replicas per operator; the API server never sees a herd).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Protocol

from shared.kube import ApiError, ApiTimeoutError, Obj
from shared.resources import LEASES
from shared.runtime.metrics import LeaderMetrics

log = logging.getLogger(__name__)

# The MicroTime format of acquireTime/renewTime (RFC 3339 with microseconds, always UTC).
MICROTIME_FORMAT: Final = "%Y-%m-%dT%H:%M:%S.%fZ"
# A released lease says it lasts one second, so a replica that judges expiry by the lease's own
# duration (an older client) takes over at once too; ours takes an empty holder at once anyway.
RELEASED_LEASE_SECONDS: Final = 1
HTTP_CONFLICT: Final = 409
# Reads in one attempt: the first, plus one more right after a 409 (someone else wrote just now: the
# fresh record decides). A second conflict in a row waits for the next retry.
READS_PER_ATTEMPT: Final = 2
# One renew attempt may take this many retry periods (4 s by default), never the whole renew
# deadline: an attempt sent on a connection that died silently is cut in time for another, which the
# client dials afresh (a call cut by its caller's deadline retires its connections), and which is
# sent at once, with the rest of the deadline: waiting a retry period first would leave it 2 s of
# the 10, too little for a fresh TLS dial while every informer re-lists (measured behind the fault
# proxy: the half-open proof lost its lease that way).
ATTEMPT_PERIODS: Final = 2


class LeaseClient(Protocol):
    """The three verbs of ``shared.kube.Kube`` this module uses (a fake implements them in tests)."""

    async def get(self, path: str) -> Obj | None: ...
    async def create(self, path: str, body: Mapping[str, Any]) -> Obj: ...
    async def replace(self, path: str, body: Mapping[str, Any]) -> Obj: ...


@dataclass(frozen=True)
class _Record:
    """The spec of a Lease: what is compared to tell whether the holder is still renewing."""

    holder: str
    duration: int | None
    acquired: str
    renewed: str
    transitions: int

    @classmethod
    def of(cls, lease: Obj | None) -> _Record | None:
        if lease is None:
            return None
        spec = lease.get("spec") or {}
        duration = spec.get("leaseDurationSeconds")
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            duration=duration if isinstance(duration, int) else None,
            acquired=str(spec.get("acquireTime") or ""),
            renewed=str(spec.get("renewTime") or ""),
            transitions=int(spec.get("leaseTransitions") or 0),
        )


def microtime(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime(MICROTIME_FORMAT)


class LeaderElector:
    def __init__(
        self,
        kube: LeaseClient,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        metrics: LeaderMetrics | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if not lease_duration > renew_deadline > retry_period > 0:
            raise ValueError("leader election needs lease_duration > renew_deadline > retry_period > 0")
        if not identity:
            raise ValueError("leader election needs a non-empty identity")
        self.kube, self.namespace, self.name, self.identity = kube, namespace, name, identity
        self.lease_duration, self.renew_deadline = lease_duration, renew_deadline
        self.retry_period = retry_period
        self._clock, self._wall_clock, self._sleep = clock, wall_clock, sleep
        self._metrics = metrics
        self.leading = asyncio.Event()  # set while leading
        self._path = LEASES.path(namespace, name)
        self._lease: Obj | None = None  # the last version read or written
        self._observed: _Record | None = None  # the last record seen, and since when (our clock)
        self._observed_at = 0.0
        self._renewed_at: float | None = None  # when the last successful write was sent (our clock)
        self._released = False
        self._unanswered = False  # the last failed attempt got no answer (see ``_attempt``)
        if metrics is not None:
            metrics.set_leading(name, False)

    def is_leader(self) -> bool:
        """True only while the last successful renew was sent less than ``renew_deadline`` ago."""
        return (
            self.leading.is_set()
            and self._renewed_at is not None
            and self._clock() - self._renewed_at < self.renew_deadline
        )

    async def run(self) -> None:
        """Acquire the lease (waiting as long as it takes), then renew it until that fails for
        ``renew_deadline``, another holder shows up, or ``release`` is called; then return."""
        try:
            while not await self._attempt(self.renew_deadline):
                if self._released:
                    return
                await self._sleep(self.retry_period)
            if self._released:  # release() came while the winning write was in flight
                await self.release()
                return
            self.leading.set()
            if self._metrics is not None:
                self._metrics.set_leading(self.name, True)
            log.info("lease %s/%s acquired by %s", self.namespace, self.name, self.identity)
            await self._renew_until_lost()
        finally:
            self._stop_leading()

    async def release(self) -> None:
        """Stop leading at once, and give the lease up if it still names us."""
        self._released = True
        self._stop_leading()
        lease = self._lease
        for _ in range(READS_PER_ATTEMPT):
            record = _Record.of(lease)
            if lease is None or record is None or record.holder != self.identity:
                return
            now = microtime(self._wall_clock())
            spec = {
                "holderIdentity": "",
                "leaseDurationSeconds": RELEASED_LEASE_SECONDS,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": record.transitions,
            }
            try:
                self._lease = await self.kube.replace(self._path, _with_spec(lease, spec))
                log.info("lease %s/%s released by %s", self.namespace, self.name, self.identity)
                return
            except ApiError as error:
                if error.status != HTTP_CONFLICT:
                    raise
            lease = await self.kube.get(self._path)

    # --- internals -------------------------------------------------------------------------------

    async def _renew_until_lost(self) -> None:
        while True:
            await self._sleep(self.retry_period)
            while True:  # one renewal: retried until it succeeds or the deadline passes
                left = self._time_left()
                if self._released or left <= 0:
                    if not self._released:
                        log.warning(
                            "lease %s/%s: no renew succeeded for %.1fs: stepping down",
                            self.namespace,
                            self.name,
                            self.renew_deadline,
                        )
                    return
                if await self._attempt(min(left, self.retry_period * ATTEMPT_PERIODS)):
                    break
                observed = self._observed
                if observed is not None and observed.holder not in ("", self.identity):
                    log.warning(
                        "lease %s/%s is now held by %s: stepping down",
                        self.namespace,
                        self.name,
                        observed.holder,
                    )
                    return
                left = self._time_left()
                if left > 0 and not self._unanswered:
                    await self._sleep(min(self.retry_period, left))

    def _time_left(self) -> float:
        """Seconds until the renew deadline (0 when not leading)."""
        if self._renewed_at is None:
            return 0.0
        return self._renewed_at + self.renew_deadline - self._clock()

    async def _attempt(self, budget: float) -> bool:
        """One acquire-or-renew within ``budget`` seconds; True when we hold the lease afterwards.
        ``_unanswered`` says whether a failed one was cut by ``budget`` (or by the client's own
        timeout): no answer came, so no server asked us to wait."""
        started = self._clock()
        self._unanswered = False
        try:
            async with asyncio.timeout(budget):
                held = await self._try_acquire_or_renew()
        except Exception as error:  # a failed attempt is retried; only the deadline decides
            self._unanswered = isinstance(error, TimeoutError | ApiTimeoutError)
            log.warning("lease %s/%s: attempt failed: %r", self.namespace, self.name, error)
            return False
        if held:
            self._renewed_at = started
        return held

    async def _try_acquire_or_renew(self) -> bool:
        # While leading, the version we wrote last is current unless someone else wrote (then the
        # PUT answers 409 and we read): a renew is one request.
        known = self._lease if self.leading.is_set() else None
        for _ in range(READS_PER_ATTEMPT):
            lease = known if known is not None else await self.kube.get(self._path)
            known = None
            try:
                return await self._decide_and_write(lease)
            except ApiError as error:
                if error.status != HTTP_CONFLICT:
                    raise
                log.info("lease %s/%s: written by someone else meanwhile", self.namespace, self.name)
        return False

    async def _decide_and_write(self, lease: Obj | None) -> bool:
        record = _Record.of(lease)
        if record is not None:
            self._note(lease, record)
            if record.holder not in ("", self.identity) and not self._expired(record):
                return False
        if self._released:
            return False
        now = microtime(self._wall_clock())
        spec: Obj = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, math.ceil(self.lease_duration)),
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": 0,
        }
        if lease is None or record is None:
            body: Obj = {
                "apiVersion": LEASES.api_version,
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": spec,
            }
            written = await self.kube.create(LEASES.path(self.namespace), body)
        else:
            if record.holder == self.identity:
                spec["acquireTime"] = record.acquired or now
                spec["leaseTransitions"] = record.transitions
            else:
                spec["leaseTransitions"] = record.transitions + 1
            written = await self.kube.replace(self._path, _with_spec(lease, spec))
        self._note(written, _Record.of(written))
        return True

    def _note(self, lease: Obj | None, record: _Record | None) -> None:
        """Remember the latest version; restart the expiry count when the record changed."""
        self._lease = lease
        if record != self._observed:
            self._observed, self._observed_at = record, self._clock()

    def _expired(self, record: _Record) -> bool:
        duration = record.duration if record.duration and record.duration > 0 else self.lease_duration
        return self._clock() - self._observed_at >= duration

    def _stop_leading(self) -> None:
        was_leading = self.leading.is_set()
        self.leading.clear()
        self._renewed_at = None
        if self._metrics is not None:
            self._metrics.set_leading(self.name, False)
        if was_leading:
            log.info("lease %s/%s: %s stopped leading", self.namespace, self.name, self.identity)


def _with_spec(lease: Obj, spec: Obj) -> Obj:
    """``lease`` (metadata and its resourceVersion kept, for the conflict check) with a new spec."""
    body = copy.deepcopy(lease)
    body["spec"] = {**(lease.get("spec") or {}), **spec}
    return body
