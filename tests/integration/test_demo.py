"""``make demo`` keeps working: run it once, end to end, on its own control plane."""

from __future__ import annotations

import os
import subprocess
import sys

from hack.devcluster import ROOT
from hack.substrate import lane


def test_the_demo_shows_a_tenant_and_a_hoster_what_they_need() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hack.demo", "--once"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        # The demo's own Jaeger, not a collector this shell may point at.
        env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    for expected in (
        # The addresses come from the lane's substrate, and the demo says which.
        "its real controllers" if lane() == "real" else "documented model (harness/substrate.py)",
        "WHAT A TENANT SEES",
        "ResourceNameConflict",  # h200-premium
        "NotPermitted",  # rtx4090
        "Attached",  # attachments with their addresses
        "reserved-ip",  # the tenant's reserved claim, Bound
        "BackendAlreadyDelegated",  # vm1-whole loses the VM's pod to vm1-ssh
        "kubectl describe endpointattachment db-public",  # its Events: what the operator did
        "ClaimMinted",
        "Rendered",
        "Warning  BackendAlreadyDelegated",  # vm1-whole's Event, as kubectl describe shows it
        "WHAT A HOSTER SEES",
        "cozystack_gpuclass_free",
        "cozystack_endpointattachment_attachments",
        # The story of vm1-ssh read back from the demo's Jaeger: its passes, chained.
        "TRACES",
        "EndpointAttachment tenant-demo/vm1-ssh",
        "follows the previous pass",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "nothing left running",
    ):
        assert expected in output, f"{expected!r} missing from the demo:\n{output[-4000:]}"
