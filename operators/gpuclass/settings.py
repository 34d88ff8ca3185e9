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

from operators.gpuclass.vmshape import MIB, Overhead
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
    # What KubeVirt adds to a whole VM's virt-launcher request (operators/gpuclass/vmshape.py): a
    # fixed memory amount (virt-launcher, libvirt, QEMU, video, and 1 GiB for VFIO passthrough),
    # memory per vCPU, and a CPU share; the guest's page tables (memory / 512) are always added.
    vm_memory_overhead_mib: int = 1280
    vm_memory_overhead_per_cpu_mib: int = 8
    vm_cpu_overhead_millis: int = 0

    def overhead(self) -> Overhead:
        return Overhead(
            memory_fixed=self.vm_memory_overhead_mib * MIB,
            memory_per_cpu=self.vm_memory_overhead_per_cpu_mib * MIB,
            cpu_millis=self.vm_cpu_overhead_millis,
        )


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
    add_env_flag(parser, ENV_PREFIX, "vm-memory-overhead-mib", defaults.vm_memory_overhead_mib, int)
    add_env_flag(
        parser, ENV_PREFIX, "vm-memory-overhead-per-cpu-mib", defaults.vm_memory_overhead_per_cpu_mib, int
    )
    add_env_flag(parser, ENV_PREFIX, "vm-cpu-overhead-millis", defaults.vm_cpu_overhead_millis, int)
    args = parser.parse_args(argv)
    return Settings(
        runtime=runtime_settings(args),
        kubevirt_namespace=args.kubevirt_namespace,
        kubevirt_name=args.kubevirt_name,
        debounce_seconds=args.debounce_seconds,
        max_delay_seconds=args.max_delay_seconds,
        kubevirt_recheck_seconds=args.kubevirt_recheck_seconds,
        events_namespace=args.events_namespace,
        vm_memory_overhead_mib=args.vm_memory_overhead_mib,
        vm_memory_overhead_per_cpu_mib=args.vm_memory_overhead_per_cpu_mib,
        vm_cpu_overhead_millis=args.vm_cpu_overhead_millis,
    )
