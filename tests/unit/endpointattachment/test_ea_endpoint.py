"""endpoint: which application incarnation an attachment belongs to and whether its endpoint is a
tenant-facing Service of that application; the first failure, in order, is the verdict."""

from __future__ import annotations

from typing import Any

import pytest

from operators.endpointattachment.api import ATTACHMENT_LABEL, spec_of
from operators.endpointattachment.endpoint import (
    Resolution,
    bound_application_uid,
    is_rendered_by_attachment,
    resolve,
)
from operators.endpointattachment.reasons import (
    REASON_APPLICATION_INCARNATION_CHANGED,
    REASON_APPLICATION_NOT_FOUND,
    REASON_ENDPOINT_LINEAGE_MISMATCH,
    REASON_ENDPOINT_NOT_FOUND,
    REASON_ENDPOINT_NOT_TENANT_FACING,
    REASON_RESOLVED,
)
from tests.ea_builders import (
    HELMRELEASE_UID,
    controlled_by,
    lineage_labels,
    make_attachment,
    make_helmrelease,
    make_service,
)

OTHER_APP = lineage_labels(name="other")
RENDERED = make_service(
    "db-public-x7ktq", labels={**lineage_labels(), ATTACHMENT_LABEL: "db-public"}, type_="LoadBalancer"
)


def verdict(
    attachment: dict[str, Any] | None = None,
    helmrelease: dict[str, Any] | str | None = "default",
    endpoint: dict[str, Any] | str | None = "default",
) -> Resolution:
    attachment = attachment or make_attachment()
    return resolve(
        attachment,
        spec_of(attachment),
        make_helmrelease() if helmrelease == "default" else helmrelease,  # type: ignore[arg-type]
        make_service() if endpoint == "default" else endpoint,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        pytest.param({}, REASON_RESOLVED, id="resolves"),
        pytest.param({"helmrelease": None}, REASON_APPLICATION_NOT_FOUND, id="no HelmRelease"),
        pytest.param(
            {"helmrelease": make_helmrelease(labels=lineage_labels(name="other", tenant_facing=False))},
            REASON_APPLICATION_NOT_FOUND,
            id="a HelmRelease of another application",
        ),
        pytest.param(
            {"helmrelease": {"metadata": {"name": "postgres-db", "labels": lineage_labels()}}},
            REASON_APPLICATION_NOT_FOUND,
            id="a HelmRelease without a UID",
        ),
        pytest.param(
            {"helmrelease": make_helmrelease(uid="hr-uid-2")},
            REASON_APPLICATION_INCARNATION_CHANGED,
            id="recreated",
        ),
        pytest.param({"endpoint": None}, REASON_ENDPOINT_NOT_FOUND, id="no endpoint"),
        pytest.param(
            {"endpoint": make_service(labels=OTHER_APP)}, REASON_ENDPOINT_LINEAGE_MISMATCH, id="another app's"
        ),
        pytest.param(
            {"endpoint": make_service(labels={})}, REASON_ENDPOINT_LINEAGE_MISMATCH, id="no lineage"
        ),
        pytest.param(
            {"endpoint": make_service(labels=lineage_labels(tenant_facing=False))},
            REASON_ENDPOINT_NOT_TENANT_FACING,
            id="operator-internal",
        ),
        pytest.param(
            {"endpoint": RENDERED}, REASON_ENDPOINT_NOT_TENANT_FACING, id="rendered by an attachment (label)"
        ),
        pytest.param(
            {"endpoint": make_service(owner_references=controlled_by(make_attachment("other", uid="ea-2")))},
            REASON_ENDPOINT_NOT_TENANT_FACING,
            id="rendered by an attachment (controller)",
        ),
    ],
)
def test_resolve_reasons(changes: dict[str, Any], reason: str) -> None:
    found = verdict(**changes)
    assert (found.ok, found.reason) == (reason == REASON_RESOLVED, reason)
    assert found.message


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        pytest.param(
            {"helmrelease": None, "endpoint": None},
            REASON_APPLICATION_NOT_FOUND,
            id="the application before the endpoint",
        ),
        pytest.param(
            {"helmrelease": make_helmrelease(uid="hr-uid-2"), "endpoint": None},
            REASON_APPLICATION_INCARNATION_CHANGED,
            id="the incarnation before the endpoint",
        ),
        pytest.param(
            {"endpoint": make_service(labels={**OTHER_APP, ATTACHMENT_LABEL: "x"})},
            REASON_ENDPOINT_NOT_TENANT_FACING,
            id="rendered by an attachment before lineage",
        ),
        pytest.param(
            {"endpoint": make_service(labels=lineage_labels(name="other", tenant_facing=False))},
            REASON_ENDPOINT_LINEAGE_MISMATCH,
            id="lineage before the marker",
        ),
    ],
)
def test_resolve_order(changes: dict[str, Any], reason: str) -> None:
    assert verdict(**changes).reason == reason


def test_the_first_sight_asks_for_the_stamp_and_names_the_incarnation() -> None:
    fresh = verdict(make_attachment(owner_uid=None))
    assert (fresh.ok, fresh.stamp, fresh.application_uid) == (True, True, HELMRELEASE_UID)
    stamped = verdict()
    assert (stamped.ok, stamped.stamp, stamped.application_uid) == (True, False, HELMRELEASE_UID)


def test_an_unstamped_attachment_resolves_to_whichever_incarnation_is_there() -> None:
    found = verdict(make_attachment(owner_uid=None), helmrelease=make_helmrelease(uid="hr-uid-2"))
    assert (found.ok, found.application_uid, found.stamp) == (True, "hr-uid-2", True)


def test_a_gone_incarnation_is_named() -> None:
    assert HELMRELEASE_UID in verdict(helmrelease=None).message


def test_application_group_defaults_and_must_match() -> None:
    assert verdict(make_attachment(app_group="apps.cozystack.io")).ok
    other_group = verdict(make_attachment(app_group="example.com"))
    assert other_group.reason == REASON_APPLICATION_NOT_FOUND


@pytest.mark.parametrize(
    ("service", "rendered"),
    [
        (make_service(), False),
        (RENDERED, True),
        (make_service(owner_references=controlled_by(make_attachment())), True),
        (
            make_service(
                owner_references=[{**controlled_by(make_attachment())[0], "controller": False}],
            ),
            False,
        ),
        (
            make_service(
                owner_references=[{**controlled_by(make_attachment())[0], "apiVersion": "example.com/v1"}]
            ),
            False,
        ),
    ],
)
def test_is_rendered_by_attachment(service: dict[str, Any], rendered: bool) -> None:
    assert is_rendered_by_attachment(service) is rendered


def test_bound_application_uid_reads_only_a_helmrelease_reference() -> None:
    assert bound_application_uid(make_attachment()) == HELMRELEASE_UID
    assert bound_application_uid(make_attachment(owner_uid=None)) is None
    other = make_attachment(owner_uid=None)
    other["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u"}
    ]
    assert bound_application_uid(other) is None
