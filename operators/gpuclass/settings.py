"""The GPUClass operator's settings: flags, each with an environment variable as its default.

Decides: the GPUClass-specific names and defaults (the KubeVirt CR's namespace and name, how a burst
of events becomes one pass, the KubeVirt recheck, the namespace of Events, the KubeVirt release
whose rules render a whole VM's virt-launcher); the common flags (kubeconfig, metrics and health
ports, leader election, API timeout, the stuck-reconcile bound) are ``shared.operator``'s, under the
``GPUCLASS_`` prefix. Cozystack runs one KubeVirt CR named
``kubevirt`` in ``cozy-kubevirt``; an empty name means "list the namespace and take the single CR".

Does not: read anything but its arguments and the environment, or start anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from shared.operator import RuntimeSettings, parse_settings, setting

# The prefix of every environment variable, and the Lease the replicas elect a leader through.
ENV_PREFIX: Final = "GPUCLASS"
LEADER_ELECTION_ID: Final = "cozystack-gpuclass-operator"


@dataclass(frozen=True)
class Settings:
    """Each ``setting`` field is a flag and a ``GPUCLASS_`` environment variable (``shared.operator``)."""

    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    kubevirt_namespace: str = setting("cozy-kubevirt", str, "where the KubeVirt CR lives")
    kubevirt_name: str = setting(
        "kubevirt", str, "its name; empty: list the namespace and take the single KubeVirt CR"
    )
    debounce_seconds: float = setting(
        0.1, float, "a burst of Node/Pod events becomes one pass once the stream has been quiet this long..."
    )
    # The status follows a change within it plus a pass and its writes (the SLO is 1 s at p99; at 0.6
    # a churn of 110 changes/s measured 1.54 s, the API server's own write p99 then 0.51 s).
    max_delay_seconds: float = setting(
        0.3, float, "...but a steady stream cannot hold a pass back longer than this"
    )
    kubevirt_recheck_seconds: float = setting(
        60.0,
        float,
        "the KubeVirt CR is read, never watched: a pass runs at least this often to pick up its changes",
    )
    # Whose rules render a whole VM's virt-launcher (operators/gpuclass/launcher.py).
    kubevirt_version: str = setting(
        "",
        str,
        "the KubeVirt release whose virt-launcher rendering whole-VM shapes follow (v1.9.0); empty: the "
        "KubeVirt CR's status.observedKubeVirtVersion, else the newest rules known",
    )


def parse(argv: Sequence[str] | None = None) -> Settings:
    return parse_settings(
        Settings,
        argv,
        prog="python -m operators.gpuclass",
        description=__doc__,
        prefix=ENV_PREFIX,
        leader_election_id=LEADER_ELECTION_ID,
    )
