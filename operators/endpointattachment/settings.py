"""The EndpointAttachment operator's settings: flags, each with an environment variable as its default.

Decides: the flags only this operator has (workers, the repair period and grace, how long a rendered
Service waits for the load balancer before ``AddressNotAnnounced``, how often a quota refusal is tried
again), under the ``EA_``
prefix; the common ones (kubeconfig, metrics and health ports, leader election, API timeout) are
``shared.operator``'s, under the same prefix.

Does not: read anything but the command line and the environment.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from operators.endpointattachment.reconcile import ANNOUNCE_TIMEOUT_SECONDS, QUOTA_RETRY_SECONDS
from shared.operator import RuntimeSettings, add_env_flag, add_runtime_flags, runtime_settings

# Environment variables of this operator start with this.
ENV_PREFIX: Final = "EA"
# The Lease replicas elect a leader through (in the operator's namespace).
LEADER_ELECTION_ID: Final = "cozystack-endpointattachment-operator"


@dataclass(frozen=True)
class Settings:
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    # Passes over different attachments (and claims) run concurrently; one never runs twice at once.
    workers: int = 16
    # How often orphaned allocations are looked for, and how old one must be before it is removed:
    # long enough that a mint whose holder is not yet in our cache is never mistaken for an orphan.
    repair_interval_seconds: float = 60.0
    repair_grace_seconds: float = 300.0
    # A load balancer announces an address within seconds; after this long without it, the attachment
    # says so (AddressNotAnnounced) instead of AddressPending.
    announce_timeout_seconds: float = ANNOUNCE_TIMEOUT_SECONDS
    # A Service refused for an exhausted quota is asked for again this often (quota frees unseen).
    quota_retry_seconds: float = QUOTA_RETRY_SECONDS


def parse(argv: Sequence[str] | None = None) -> Settings:
    d = Settings()
    parser = argparse.ArgumentParser(prog="python -m operators.endpointattachment", description=__doc__)
    add_runtime_flags(parser, ENV_PREFIX, LEADER_ELECTION_ID)
    add_env_flag(parser, ENV_PREFIX, "workers", d.workers, int)
    add_env_flag(parser, ENV_PREFIX, "repair-interval-seconds", d.repair_interval_seconds, float)
    add_env_flag(parser, ENV_PREFIX, "repair-grace-seconds", d.repair_grace_seconds, float)
    add_env_flag(parser, ENV_PREFIX, "announce-timeout-seconds", d.announce_timeout_seconds, float)
    add_env_flag(parser, ENV_PREFIX, "quota-retry-seconds", d.quota_retry_seconds, float)
    args = parser.parse_args(argv)
    return Settings(
        runtime=runtime_settings(args),
        workers=args.workers,
        repair_interval_seconds=args.repair_interval_seconds,
        repair_grace_seconds=args.repair_grace_seconds,
        announce_timeout_seconds=args.announce_timeout_seconds,
        quota_retry_seconds=args.quota_retry_seconds,
    )
