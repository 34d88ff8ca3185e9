"""settings: the operator's flags, each defaulting to its EA_ environment variable, and what the
rendered Service takes from them. One row per invariant."""

from __future__ import annotations

import pytest

from operators.endpointattachment.reconcile import ANNOUNCE_TIMEOUT_SECONDS, QUOTA_RETRY_SECONDS
from operators.endpointattachment.render import RenderSettings
from operators.endpointattachment.settings import VM_DATAPATH_NONE, Settings, parse


def test_the_defaults() -> None:
    settings = parse([])
    assert (settings.vm_datapath, settings.allocate_load_balancer_node_ports) == (VM_DATAPATH_NONE, False)
    assert (settings.announce_timeout_seconds, settings.quota_retry_seconds) == (
        ANNOUNCE_TIMEOUT_SECONDS,
        QUOTA_RETRY_SECONDS,
    )
    assert settings.render == RenderSettings(allocate_node_ports=False, proxy_name=None), "VM modes off"
    assert settings.workers == Settings().workers


@pytest.mark.parametrize(
    ("argv", "env", "render"),
    [
        (["--vm-datapath", "cozy-proxy"], {}, RenderSettings(proxy_name="cozy-proxy")),
        ([], {"EA_VM_DATAPATH": "cozy-proxy"}, RenderSettings(proxy_name="cozy-proxy")),
        (["--vm-datapath", "none"], {"EA_VM_DATAPATH": "cozy-proxy"}, RenderSettings()),  # the flag wins
        (["--allocate-load-balancer-node-ports", "true"], {}, RenderSettings(allocate_node_ports=True)),
        ([], {"EA_ALLOCATE_LOAD_BALANCER_NODE_PORTS": "true"}, RenderSettings(allocate_node_ports=True)),
    ],
)
def test_what_the_rendered_service_takes(
    argv: list[str], env: dict[str, str], render: RenderSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert parse(argv).render == render


def test_the_waits_and_workers_from_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EA_QUOTA_RETRY_SECONDS", "5")
    settings = parse(["--announce-timeout-seconds", "2.5", "--workers", "3"])
    assert (settings.announce_timeout_seconds, settings.quota_retry_seconds, settings.workers) == (
        2.5,
        5.0,
        3,
    )


@pytest.mark.parametrize("value", ["cilium", "Cozy-Proxy", ""])
def test_an_undeclared_datapath_is_refused(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(["--vm-datapath", value])
    assert "expected one of none, cozy-proxy" in capsys.readouterr().err
