"""shared.ownership: owner references carry UIDs, and only a controller reference with the UID is "ours"."""

from __future__ import annotations

from typing import Any

import pytest

from shared.ownership import has_owner, is_controlled_by, owner_reference, owner_uids, sole_controller

OWNER: dict[str, Any] = {
    "apiVersion": "local.sdn.cozystack.io/v1alpha1",
    "kind": "EndpointAttachment",
    "metadata": {"name": "db-public", "namespace": "tenant-a", "uid": "uid-1"},
}


def ref(
    uid: str,
    *,
    kind: str = "EndpointAttachment",
    controller: bool | None = True,
    api: str = "local.sdn.cozystack.io/v1alpha1",
) -> dict[str, Any]:
    reference: dict[str, Any] = {"apiVersion": api, "kind": kind, "name": "n", "uid": uid}
    if controller is not None:
        reference["controller"] = controller
    return reference


def owned(*refs: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "ea-db-public", "ownerReferences": list(refs), "labels": labels or {}}}


@pytest.mark.parametrize(("controller", "block"), [(True, True), (False, False), (True, False)])
def test_owner_reference_fields(controller: bool, block: bool) -> None:
    assert owner_reference(OWNER, controller, block) == {
        "apiVersion": "local.sdn.cozystack.io/v1alpha1",
        "kind": "EndpointAttachment",
        "name": "db-public",
        "uid": "uid-1",
        "controller": controller,
        "blockOwnerDeletion": block,
    }


@pytest.mark.parametrize("missing", ["apiVersion", "kind", "name", "uid"])
def test_owner_reference_refuses_incomplete_owner(missing: str) -> None:
    owner: dict[str, Any] = {**OWNER, "metadata": dict(OWNER["metadata"])}
    if missing in ("name", "uid"):
        del owner["metadata"][missing]
    else:
        del owner[missing]
    with pytest.raises(ValueError, match=missing):
        owner_reference(owner, True, True)


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        pytest.param(owned(ref("uid-1")), True, id="controller with the uid"),
        pytest.param(owned(ref("uid-1", controller=False)), False, id="non-controller reference"),
        pytest.param(owned(ref("uid-1", controller=None)), False, id="controller unset"),
        pytest.param(owned(ref("uid-2")), False, id="controller with another uid (a previous incarnation)"),
        pytest.param(
            owned(labels={"local.sdn.cozystack.io/endpoint-attachment": "db-public"}),
            False,
            id="label is no proof",
        ),
        pytest.param({"metadata": {"name": "x"}}, False, id="no references"),
        pytest.param(owned(ref("uid-2", controller=False), ref("uid-1")), True, id="second reference"),
    ],
)
def test_is_controlled_by(obj: dict[str, Any], expected: bool) -> None:
    assert is_controlled_by(obj, "uid-1") is expected


def test_is_controlled_by_empty_uid_never_matches() -> None:
    assert not is_controlled_by(owned(ref("")), "")


def test_has_owner_counts_any_reference() -> None:
    assert has_owner(owned(ref("uid-1", controller=False)), "uid-1")
    assert not has_owner(owned(ref("uid-1")), "uid-2")


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        pytest.param({}, ("a", "b", "c"), id="all"),
        pytest.param({"kind": "HelmRelease"}, ("b", "c"), id="by kind"),
        pytest.param(
            {"kind": "HelmRelease", "api_group": "helm.toolkit.fluxcd.io"}, ("b",), id="by kind and group"
        ),
        pytest.param({"api_group": ""}, (), id="core group"),
    ],
)
def test_owner_uids(kwargs: dict[str, Any], expected: tuple[str, ...]) -> None:
    obj = owned(
        ref("a"),
        ref("b", kind="HelmRelease", api="helm.toolkit.fluxcd.io/v2", controller=False),
        ref("c", kind="HelmRelease", api="other.example.com/v1", controller=False),
    )
    assert owner_uids(obj, **kwargs) == expected


@pytest.mark.parametrize(
    ("obj", "expected_uid"),
    [
        pytest.param(owned(ref("a", controller=False), ref("b")), "b", id="one controller"),
        pytest.param(owned(ref("a", controller=False)), None, id="no controller"),
        pytest.param(owned(ref("a"), ref("b")), None, id="two controllers is ambiguous"),
    ],
)
def test_sole_controller(obj: dict[str, Any], expected_uid: str | None) -> None:
    controller = sole_controller(obj)
    assert (controller or {}).get("uid") == expected_uid
