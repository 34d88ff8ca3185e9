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
from shared.operator import RuntimeSettings, flag_bool, one_of, parse_settings, setting

# Environment variables of this operator start with this.
ENV_PREFIX: Final = "EA"
# The Lease replicas elect a leader through (in the operator's namespace).
LEADER_ELECTION_ID: Final = "cozystack-endpointattachment-operator"
# --vm-datapath: no VM datapath declared (the default), or cozy-proxy's contract.
VM_DATAPATH_NONE: Final = "none"
VM_DATAPATHS: Final = (VM_DATAPATH_NONE, COZY_PROXY)


@dataclass(frozen=True)
class Settings:
    """Each ``setting`` field is a flag and an ``EA_`` environment variable (``shared.operator``)."""

    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    workers: int = setting(16, int, "attachments reconciled concurrently (never one object twice at once)")
    vm_datapath: str = setting(
        VM_DATAPATH_NONE,
        one_of(*VM_DATAPATHS),
        "the VM datapath the platform runs: cozy-proxy when a cozy-proxy contract implementor is "
        "deployed (the WholeIP and PortList methods then render); none: they render nothing "
        "(DatapathContractUnavailable). Chart value vmDatapath",
    )
    allocate_load_balancer_node_ports: bool = setting(
        False,
        flag_bool,
        "spec.allocateLoadBalancerNodePorts of the rendered Services (an L2 or BGP load balancer needs "
        "no nodePorts)",
    )
    announce_timeout_seconds: float = setting(
        ANNOUNCE_TIMEOUT_SECONDS,
        float,
        "how long the load balancer may take to announce an address before Provisioned says "
        "AddressNotAnnounced (instead of WaitingForAddress)",
    )
    quota_retry_seconds: float = setting(
        QUOTA_RETRY_SECONDS,
        float,
        "how often a rendered Service refused for an exhausted ResourceQuota is asked for again "
        "(quota frees unseen)",
    )
    handover_hold_seconds: float = setting(
        HANDOVER_HOLD_SECONDS,
        float,
        "how long a freshly Bound claim's Service may wait while other claims of its class are being "
        "provisioned, so that MetalLB does not hand the address to one of them (the substrate's "
        "hand-over, docs/hosters/load-balancer.md); 0: never waits",
    )

    @property
    def render(self) -> RenderSettings:
        return RenderSettings(
            allocate_node_ports=self.allocate_load_balancer_node_ports,
            proxy_name=None if self.vm_datapath == VM_DATAPATH_NONE else self.vm_datapath,
        )


def parse(argv: Sequence[str] | None = None) -> Settings:
    return parse_settings(
        Settings,
        argv,
        prog="python -m operators.endpointattachment",
        description=__doc__,
        prefix=ENV_PREFIX,
        leader_election_id=LEADER_ELECTION_ID,
    )
