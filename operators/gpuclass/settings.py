"""The GPUClass operator's settings: flags, each with an environment variable as its default.

Decides: the GPUClass-specific names and defaults (the KubeVirt CR's namespace and name, how a burst
of events becomes one pass, the KubeVirt recheck, the namespace of Events); the common flags
(kubeconfig, metrics and health ports, leader election, API timeout, the stuck-reconcile bound) are
``shared.operator``'s, under the ``GPUCLASS_`` prefix. Cozystack runs one KubeVirt CR named
``kubevirt`` in ``cozy-kubevirt``; an empty name means "list the namespace and take the single CR".

Does not: read anything but its arguments and the environment, or start anything.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from shared.operator import RuntimeSettings, add_env_flag, add_runtime_flags, runtime_settings

# The prefix of every environment variable, and the Lease the replicas elect a leader through.
ENV_PREFIX: Final = "GPUCLASS"
LEADER_ELECTION_ID: Final = "cozystack-gpuclass-operator"


@dataclass(frozen=True)
class Settings:
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    kubevirt_namespace: str = "cozy-kubevirt"
    kubevirt_name: str = "kubevirt"
    # A burst of Node/Pod events becomes one pass once the stream has been quiet this long...
    debounce_seconds: float = 0.5
    # ...but a steady stream cannot hold a pass back longer than this: the status follows a change
    # within it plus a pass (the SLO is 5 s at p99; at 5.0 a steady churn measured 5.46 s).
    max_delay_seconds: float = 3.0
    # The KubeVirt CR is read, never watched: a pass runs at least this often to pick up its changes.
    kubevirt_recheck_seconds: float = 60.0
    # Namespace for Events about classes (cluster-scoped objects have none of their own).
    events_namespace: str = "default"


def parse(argv: Sequence[str] | None = None) -> Settings:
    defaults = Settings()
    parser = argparse.ArgumentParser(prog="python -m operators.gpuclass", description=__doc__)
    add_runtime_flags(parser, ENV_PREFIX, LEADER_ELECTION_ID)
    add_env_flag(parser, ENV_PREFIX, "kubevirt-namespace", defaults.kubevirt_namespace)
    add_env_flag(
        parser,
        ENV_PREFIX,
        "kubevirt-name",
        defaults.kubevirt_name,
        help="empty: list the namespace and take the single KubeVirt CR",
    )
    add_env_flag(parser, ENV_PREFIX, "debounce-seconds", defaults.debounce_seconds, float)
    add_env_flag(parser, ENV_PREFIX, "max-delay-seconds", defaults.max_delay_seconds, float)
    add_env_flag(parser, ENV_PREFIX, "kubevirt-recheck-seconds", defaults.kubevirt_recheck_seconds, float)
    add_env_flag(parser, ENV_PREFIX, "events-namespace", defaults.events_namespace)
    args = parser.parse_args(argv)
    return Settings(
        runtime=runtime_settings(args),
        kubevirt_namespace=args.kubevirt_namespace,
        kubevirt_name=args.kubevirt_name,
        debounce_seconds=args.debounce_seconds,
        max_delay_seconds=args.max_delay_seconds,
        kubevirt_recheck_seconds=args.kubevirt_recheck_seconds,
        events_namespace=args.events_namespace,
    )
