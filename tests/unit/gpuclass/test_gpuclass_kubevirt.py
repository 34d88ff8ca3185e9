"""The names the KubeVirt CR permits, and what a read of it means for a pass."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from operators.gpuclass.kubevirt import (
    STALE_READ_GRACE,
    UNRESTRICTED,
    Definitive,
    Forbidden,
    Found,
    KubeVirtRead,
    KubeVirtView,
    NotInstalled,
    Unavailable,
    Unreadable,
    is_permitted,
    outage_start,
    permitted_names,
    remember,
    view,
)
from tests.gpuclass_builders import A10_24Q, H200, L40S, RTX4090, T4, make_kubevirt_cr

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
CR = Found(make_kubevirt_cr(pci=[H200]))


@pytest.mark.parametrize(
    ("cr", "expected"),
    [
        (make_kubevirt_cr(pci=[H200, L40S]), frozenset({H200, L40S})),
        (make_kubevirt_cr(mediated=[A10_24Q]), frozenset({A10_24Q})),
        (make_kubevirt_cr(usb=["kubevirt.io/storage"]), frozenset({"kubevirt.io/storage"})),
        (make_kubevirt_cr(pci=[H200], mediated=[A10_24Q]), frozenset({H200, A10_24Q})),
        (make_kubevirt_cr(), frozenset()),  # a table present but empty permits nothing
        (make_kubevirt_cr(unrestricted=True), UNRESTRICTED),
        ({"spec": {"configuration": {"permittedHostDevices": None}}}, UNRESTRICTED),
        ({"spec": {}}, UNRESTRICTED),
        ({}, UNRESTRICTED),
        (
            {"spec": {"configuration": {"permittedHostDevices": {"pciHostDevices": [{"x": 1}, "junk"]}}}},
            frozenset(),
        ),
        (None, frozenset()),  # no CR at all permits nothing
    ],
)
def test_permitted_names(cr: Mapping[str, Any] | None, expected: object) -> None:
    assert permitted_names(cr) == expected


def test_unrestricted_permits_every_name() -> None:
    assert is_permitted(UNRESTRICTED, RTX4090)
    assert is_permitted(frozenset({H200}), H200)
    assert not is_permitted(frozenset({H200}), L40S)


_FIXTURES = [
    Path(__file__).parents[3] / "tests" / "fixtures",
    Path(__file__).parents[4] / "shared" / "fixtures",
]


def _fixture(name: str) -> dict[str, Any]:
    for directory in _FIXTURES:
        if (directory / name).exists():
            loaded: dict[str, Any] = yaml.safe_load((directory / name).read_text())
            return loaded
    pytest.skip(f"fixture {name} is not available here")


@pytest.mark.parametrize(
    ("fixture", "permitted", "refused"),
    [
        ("kubevirt-cr-passthrough.yaml", [H200, L40S, T4], [A10_24Q, RTX4090]),
        ("kubevirt-cr-vgpu.yaml", [A10_24Q], [H200, RTX4090]),
        ("kubevirt-cr-no-gpu.yaml", [H200, A10_24Q, RTX4090], []),
    ],
)
def test_real_cozystack_crs(fixture: str, permitted: list[str], refused: list[str]) -> None:
    devices = permitted_names(_fixture(fixture))
    assert all(is_permitted(devices, name) for name in permitted)
    assert not any(is_permitted(devices, name) for name in refused)


@pytest.mark.parametrize(
    ("read", "last_known", "expected"),
    [
        (CR, None, CR),
        (NotInstalled(), CR, NotInstalled()),
        (Forbidden(), CR, Unreadable),  # 403 is unreadable at once, whatever was known
        (Unavailable(NOW), CR, CR),
        (Unavailable(NOW - STALE_READ_GRACE), CR, CR),
        (Unavailable(NOW - STALE_READ_GRACE - timedelta(seconds=1)), CR, Unreadable),
        (Unavailable(NOW - timedelta(minutes=1)), NotInstalled(), NotInstalled()),
        (Unavailable(NOW), None, Unreadable),  # nothing known yet: nothing to keep
    ],
)
def test_view_keeps_the_last_known_read_for_the_grace_period(
    read: KubeVirtRead, last_known: Definitive | None, expected: KubeVirtView | type[Unreadable]
) -> None:
    result = view(read, last_known, NOW)
    if expected is Unreadable:
        assert isinstance(result, Unreadable)
    else:
        assert result == expected


@pytest.mark.parametrize(
    ("read", "last_known", "expected"),
    [
        (CR, None, CR),
        (NotInstalled(), CR, NotInstalled()),
        (Unavailable(NOW), CR, CR),
        (Forbidden(), CR, None),
    ],
)
def test_remember_the_last_definitive_read(
    read: KubeVirtRead, last_known: Definitive | None, expected: Definitive | None
) -> None:
    assert remember(read, last_known) == expected


def test_an_outage_starts_at_its_first_failure() -> None:
    earlier = NOW - timedelta(minutes=2)
    assert outage_start(Unavailable(earlier), NOW) == earlier
    assert outage_start(CR, NOW) == NOW
    assert outage_start(None, NOW) == NOW
