"""The EndpointAttachment operator's settings: flags, each with an environment variable as its default.

Decides: the flags only this operator has, under the ``EA_`` prefix: workers; the platform's
declaration of a VM datapath (``--vm-datapath``: ``none``, the default, or ``cozy-proxy``, when a
cozy-proxy contract implementor is deployed: only then do the VM methods render); whether rendered
Services allocate nodePorts (``--allocate-load-balancer-node-ports``, default false: an L2 or BGP
load balancer announcing the address needs none); how long a rendered Service waits for the load
balancer before ``AddressNotAnnounced``; how often a quota refusal is tried again. The common ones
(kubeconfig, metrics and health ports, leader election, API timeout) are ``shared.operator``'s,
under the same prefix.

Does not: read anything but the command line and the environment.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from operators.endpointattachment.api import COZY_PROXY
from operators.endpointattachment.reconcile import (
    ANNOUNCE_TIMEOUT_SECONDS,
    HANDOVER_HOLD_SECONDS,
    QUOTA_RETRY_SECONDS,
)
from operators.endpointattachment.render import RenderSettings
from shared.operator import RuntimeSettings, add_env_flag, add_runtime_flags, flag_bool, runtime_settings

# Environment variables of this operator start with this.
ENV_PREFIX: Final = "EA"
# The Lease replicas elect a leader through (in the operator's namespace).
LEADER_ELECTION_ID: Final = "cozystack-endpointattachment-operator"
# --vm-datapath: no VM datapath declared (the default), or cozy-proxy's contract.
VM_DATAPATH_NONE: Final = "none"
VM_DATAPATHS: Final = (VM_DATAPATH_NONE, COZY_PROXY)


@dataclass(frozen=True)
class Settings:
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    # Passes over different attachments run concurrently; one never runs twice at once.
    workers: int = 16
    vm_datapath: str = VM_DATAPATH_NONE
    allocate_load_balancer_node_ports: bool = False
    # A load balancer announces an address within seconds; after this long without it, the attachment
    # says so (AddressNotAnnounced) instead of WaitingForAddress.
    announce_timeout_seconds: float = ANNOUNCE_TIMEOUT_SECONDS
    # A Service refused for an exhausted quota is asked for again this often (quota frees unseen).
    quota_retry_seconds: float = QUOTA_RETRY_SECONDS
    # A freshly Bound claim's Service waits at most this long while its class's other claims are
    # being provisioned (the substrate's hand-over through MetalLB; 0: never waits).
    handover_hold_seconds: float = HANDOVER_HOLD_SECONDS

    @property
    def render(self) -> RenderSettings:
        return RenderSettings(
            allocate_node_ports=self.allocate_load_balancer_node_ports,
            proxy_name=None if self.vm_datapath == VM_DATAPATH_NONE else self.vm_datapath,
        )


def _vm_datapath(text: str) -> str:
    if text not in VM_DATAPATHS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(VM_DATAPATHS)}, got {text!r}")
    return text


def parse(argv: Sequence[str] | None = None) -> Settings:
    d = Settings()
    parser = argparse.ArgumentParser(prog="python -m operators.endpointattachment", description=__doc__)
    add_runtime_flags(parser, ENV_PREFIX, LEADER_ELECTION_ID)
    add_env_flag(parser, ENV_PREFIX, "workers", d.workers, int)
    add_env_flag(parser, ENV_PREFIX, "vm-datapath", d.vm_datapath, _vm_datapath)
    add_env_flag(
        parser,
        ENV_PREFIX,
        "allocate-load-balancer-node-ports",
        str(d.allocate_load_balancer_node_ports).lower(),
        flag_bool,
    )
    add_env_flag(parser, ENV_PREFIX, "announce-timeout-seconds", d.announce_timeout_seconds, float)
    add_env_flag(parser, ENV_PREFIX, "quota-retry-seconds", d.quota_retry_seconds, float)
    add_env_flag(parser, ENV_PREFIX, "handover-hold-seconds", d.handover_hold_seconds, float)
    args = parser.parse_args(argv)
    return Settings(
        runtime=runtime_settings(args),
        workers=args.workers,
        vm_datapath=args.vm_datapath,
        allocate_load_balancer_node_ports=args.allocate_load_balancer_node_ports,
        announce_timeout_seconds=args.announce_timeout_seconds,
        quota_retry_seconds=args.quota_retry_seconds,
        handover_hold_seconds=args.handover_hold_seconds,
    )
