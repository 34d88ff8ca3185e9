"""shared.lineage: the application is named only by all three labels; tenant-facing only by "true"."""

from __future__ import annotations

from typing import Any

import pytest

from shared.lineage import (
    APPLICATION_GROUP_LABEL,
    APPLICATION_KIND_LABEL,
    APPLICATION_NAME_LABEL,
    MANAGED_BY_COZYSTACK_LABEL,
    TENANT_RESOURCE_LABEL,
    ApplicationRef,
    application_of,
    application_selector,
    belongs_to,
    is_managed_by_cozystack,
    is_tenant_facing,
    labels_of,
)

FULL = {
    APPLICATION_GROUP_LABEL: "apps.cozystack.io",
    APPLICATION_KIND_LABEL: "Postgres",
    APPLICATION_NAME_LABEL: "db",
}


def obj(labels: dict[str, Any] | None) -> dict[str, Any]:
    return {"metadata": {"name": "x", **({"labels": labels} if labels is not None else {})}}


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        pytest.param(FULL, ApplicationRef("apps.cozystack.io", "Postgres", "db"), id="all three"),
        pytest.param(
            {**FULL, "other": "x"}, ApplicationRef("apps.cozystack.io", "Postgres", "db"), id="extra labels"
        ),
        pytest.param({k: v for k, v in FULL.items() if k != APPLICATION_NAME_LABEL}, None, id="name missing"),
        pytest.param({k: v for k, v in FULL.items() if k != APPLICATION_KIND_LABEL}, None, id="kind missing"),
        pytest.param(
            {k: v for k, v in FULL.items() if k != APPLICATION_GROUP_LABEL}, None, id="group missing"
        ),
        pytest.param({**FULL, APPLICATION_NAME_LABEL: ""}, None, id="empty name"),
        pytest.param({}, None, id="no labels"),
        pytest.param(None, None, id="no labels key"),
    ],
)
def test_application_of(labels: dict[str, Any] | None, expected: ApplicationRef | None) -> None:
    assert application_of(obj(labels)) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("true", True, id="true"),
        pytest.param("True", False, id="capitalised is not the webhook's value"),
        pytest.param("false", False, id="false"),
        pytest.param("", False, id="empty"),
        pytest.param(None, False, id="absent"),
    ],
)
def test_is_tenant_facing_only_exact_true(value: str | None, expected: bool) -> None:
    labels = {**FULL, **({TENANT_RESOURCE_LABEL: value} if value is not None else {})}
    assert is_tenant_facing(obj(labels)) is expected


def test_lineage_alone_is_not_tenant_facing() -> None:
    assert not is_tenant_facing(obj({**FULL, MANAGED_BY_COZYSTACK_LABEL: "true"}))


def test_managed_by_cozystack() -> None:
    assert is_managed_by_cozystack(obj({MANAGED_BY_COZYSTACK_LABEL: "true"}))
    assert not is_managed_by_cozystack(obj(FULL))


def test_selector_names_the_three_labels() -> None:
    selector = application_selector(ApplicationRef("apps.cozystack.io", "Postgres", "db"))
    assert selector == (
        "apps.cozystack.io/application.group=apps.cozystack.io,"
        "apps.cozystack.io/application.kind=Postgres,"
        "apps.cozystack.io/application.name=db"
    )


def test_belongs_to_compares_all_three() -> None:
    app = ApplicationRef("apps.cozystack.io", "Postgres", "db")
    assert belongs_to(obj(FULL), app)
    assert not belongs_to(obj({**FULL, APPLICATION_KIND_LABEL: "MySQL"}), app)


def test_labels_of_tolerates_missing_metadata() -> None:
    assert labels_of({}) == {}
    assert labels_of({"metadata": None}) == {}
