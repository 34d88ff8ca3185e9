"""endpoint: which Services may be endpoints, and which application incarnation an attachment belongs to."""

from __future__ import annotations

from typing import Any

import pytest

from operators.endpointattachment.constants import (
    ATTACHMENT_LABEL,
    REASON_APPLICATION_MISMATCH,
    REASON_APPLICATION_NOT_FOUND,
    REASON_ENDPOINT_HAS_NO_PORTS,
    REASON_ENDPOINT_HAS_NO_SELECTOR,
    REASON_ENDPOINT_NOT_FOUND,
    REASON_ENDPOINT_NOT_TENANT_FACING,
    REASON_RESOLVED,
)
from operators.endpointattachment.endpoint import (
    bound_application_uid,
    check_endpoint,
    is_rendered_by_attachment,
    match_application,
)
from shared.lineage import ApplicationRef
from tests.ea_builders import (
    HELMRELEASE_UID,
    NAMESPACE,
    helmrelease_owner,
    lineage_labels,
    make_attachment,
    make_helmrelease,
    make_service,
)

APP = ApplicationRef("apps.cozystack.io", "Postgres", "db")
ATTACHMENT_OWNER = {
    "apiVersion": "local.sdn.cozystack.io/v1alpha1",
    "kind": "EndpointAttachment",
    "name": "other",
    "uid": "ea-other",
    "controller": True,
}


@pytest.mark.parametrize(
    ("service", "reason"),
    [
        pytest.param(None, REASON_ENDPOINT_NOT_FOUND, id="missing"),
        pytest.param(make_service(namespace="tenant-b"), REASON_ENDPOINT_NOT_FOUND, id="other namespace"),
        pytest.param(make_service(labels={}), REASON_ENDPOINT_NOT_TENANT_FACING, id="no labels"),
        pytest.param(
            make_service(labels=lineage_labels(tenant_facing=False)),
            REASON_ENDPOINT_NOT_TENANT_FACING,
            id="lineage without tenantresource (operator-internal Service)",
        ),
        pytest.param(
            make_service(labels={"internal.cozystack.io/tenantresource": "true"}),
            REASON_ENDPOINT_NOT_TENANT_FACING,
            id="tenantresource without lineage",
        ),
        pytest.param(
            make_service(labels={**lineage_labels(), "internal.cozystack.io/tenantresource": "yes"}),
            REASON_ENDPOINT_NOT_TENANT_FACING,
            id="tenantresource not exactly true",
        ),
        pytest.param(
            make_service(labels={**lineage_labels(), ATTACHMENT_LABEL: "x"}),
            REASON_ENDPOINT_NOT_TENANT_FACING,
            id="carries our label",
        ),
        pytest.param(
            make_service(owner_references=[ATTACHMENT_OWNER]),
            REASON_ENDPOINT_NOT_TENANT_FACING,
            id="controlled by an attachment",
        ),
        pytest.param(make_service(type_="ExternalName"), REASON_ENDPOINT_HAS_NO_SELECTOR, id="ExternalName"),
        pytest.param(make_service(selector={}), REASON_ENDPOINT_HAS_NO_SELECTOR, id="empty selector"),
        pytest.param(make_service(ports=[]), REASON_ENDPOINT_HAS_NO_PORTS, id="no ports"),
    ],
)
def test_endpoint_rejected(service: dict[str, Any] | None, reason: str) -> None:
    check = check_endpoint(service, NAMESPACE)
    assert not check.ok
    assert check.reason == reason
    assert check.message


def test_endpoint_accepted_carries_what_to_mirror() -> None:
    service = make_service(selector={"app": "db"}, ports=[{"name": "pg", "port": 5432, "nodePort": 30000}])
    check = check_endpoint(service, NAMESPACE)
    assert check.ok
    assert check.reason == REASON_RESOLVED
    assert check.application == APP
    assert check.selector == {"app": "db"}
    assert check.ports == ({"name": "pg", "port": 5432, "nodePort": 30000},)


def test_endpoint_of_another_name_is_not_found() -> None:
    check = check_endpoint(make_service("other"), NAMESPACE, "postgres-db-rw")
    assert (check.ok, check.reason) == (False, REASON_ENDPOINT_NOT_FOUND)
    assert check_endpoint(make_service(), NAMESPACE, "postgres-db-rw").ok


def test_headless_endpoint_with_selector_is_accepted() -> None:
    service = make_service()
    service["spec"]["clusterIP"] = "None"
    assert check_endpoint(service, NAMESPACE).ok


@pytest.mark.parametrize(
    ("service", "expected"),
    [
        pytest.param(make_service(labels={ATTACHMENT_LABEL: "a"}), True, id="our label"),
        pytest.param(make_service(owner_references=[ATTACHMENT_OWNER]), True, id="attachment controller"),
        pytest.param(
            make_service(owner_references=[{**ATTACHMENT_OWNER, "controller": False}]),
            False,
            id="non-controller reference",
        ),
        pytest.param(
            make_service(owner_references=[{**ATTACHMENT_OWNER, "apiVersion": "example.com/v1"}]),
            False,
            id="another group's EndpointAttachment",
        ),
        pytest.param(make_service(), False, id="plain endpoint"),
    ],
)
def test_is_rendered_by_attachment(service: dict[str, Any], expected: bool) -> None:
    assert is_rendered_by_attachment(service) is expected


@pytest.mark.parametrize(
    ("stored", "helmrelease", "ok", "reason", "stamp"),
    [
        pytest.param(None, make_helmrelease(), True, REASON_RESOLVED, True, id="first reconcile stamps"),
        pytest.param(
            HELMRELEASE_UID, make_helmrelease(), True, REASON_RESOLVED, False, id="same incarnation"
        ),
        pytest.param(
            HELMRELEASE_UID,
            make_helmrelease(uid="hr-uid-2"),
            False,
            REASON_APPLICATION_MISMATCH,
            False,
            id="recreated app never inherits",
        ),
        pytest.param(None, None, False, REASON_APPLICATION_NOT_FOUND, False, id="no app yet"),
        pytest.param(HELMRELEASE_UID, None, False, REASON_APPLICATION_NOT_FOUND, False, id="app gone"),
        pytest.param(
            None,
            make_helmrelease(labels=lineage_labels(name="other", tenant_facing=False)),
            False,
            REASON_APPLICATION_NOT_FOUND,
            False,
            id="HelmRelease of another app",
        ),
    ],
)
def test_match_application(
    stored: str | None, helmrelease: dict[str, Any] | None, ok: bool, reason: str, stamp: bool
) -> None:
    match = match_application(stored, helmrelease, APP)
    assert (match.ok, match.reason, match.stamp_owner) == (ok, reason, stamp)
    if ok:
        assert match.uid == (helmrelease or {})["metadata"]["uid"]


def test_bound_application_uid() -> None:
    assert bound_application_uid(make_attachment()) == HELMRELEASE_UID
    assert bound_application_uid(make_attachment(owner_uid=None)) is None
    other_group = make_attachment(owner_uid=None)
    other_group["metadata"]["ownerReferences"] = [{**helmrelease_owner(), "apiVersion": "example.com/v1"}]
    assert bound_application_uid(other_group) is None
