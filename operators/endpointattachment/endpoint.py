"""The endpoint check, and which application incarnation an attachment belongs to.

Decides:
- whether a Service may be an attachment's endpoint: in the attachment's namespace, carrying the three
  lineage labels and ``tenantresource: "true"``, a non-empty selector, not ExternalName, at least one
  port (a LoadBalancer Service needs one; the design is silent, so this reports
  ``EndpointHasNoPorts``), and not itself rendered by an attachment (our label, or a controller
  reference to an EndpointAttachment: either is enough to refuse, so attachments never chain).
  Checks run in that order and the first failure is the reason.
- whether the HelmRelease found by the endpoint's lineage labels is the application this attachment
  belongs to: with no stored owner reference yet, any matching HelmRelease resolves (and the caller
  stamps the reference); with one, only a HelmRelease with that UID does. A recreated application has
  a new UID, so it never inherits an old attachment (``ApplicationMismatch``).

Does not: look anything up (the glue lists the HelmRelease by ``shared.lineage.application_selector``),
stamp the owner reference, or judge ports for a datapath (``datapath`` does, per mode).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from operators.endpointattachment.constants import (
    ATTACHMENT_LABEL,
    ENDPOINT_ATTACHMENT_KIND,
    GROUP,
    HELMRELEASE_GROUP,
    HELMRELEASE_KIND,
    REASON_APPLICATION_MISMATCH,
    REASON_APPLICATION_NOT_FOUND,
    REASON_ENDPOINT_HAS_NO_PORTS,
    REASON_ENDPOINT_HAS_NO_SELECTOR,
    REASON_ENDPOINT_NOT_FOUND,
    REASON_ENDPOINT_NOT_TENANT_FACING,
    REASON_RESOLVED,
    SERVICE_TYPE_EXTERNAL_NAME,
)
from shared.lineage import ApplicationRef, application_of, belongs_to, is_tenant_facing, labels_of
from shared.ownership import owner_references, owner_uids


@dataclass(frozen=True)
class EndpointCheck:
    """The endpoint check's verdict; on success, what the rendered Service mirrors."""

    ok: bool
    reason: str
    message: str
    application: ApplicationRef | None = None
    selector: Mapping[str, str] = field(default_factory=dict)
    ports: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class ApplicationMatch:
    """Which application incarnation the attachment belongs to, or why none."""

    ok: bool
    reason: str
    message: str
    uid: str | None = None
    # True when the attachment has no owner reference to the application yet: the glue stamps one.
    stamp_owner: bool = False


def is_rendered_by_attachment(service: Mapping[str, Any]) -> bool:
    """Whether a Service looks rendered by some attachment (our label, or an attachment controls it)."""
    if ATTACHMENT_LABEL in labels_of(service):
        return True
    return any(
        ref.get("controller") is True
        and ref.get("kind") == ENDPOINT_ATTACHMENT_KIND
        and str(ref.get("apiVersion", "")).partition("/")[0] == GROUP
        for ref in owner_references(service)
    )


def check_endpoint(
    service: Mapping[str, Any] | None, namespace: str, name: str | None = None
) -> EndpointCheck:
    """Whether ``service`` may be the endpoint of an attachment in ``namespace`` (and named ``name``)."""
    metadata = (service or {}).get("metadata") or {}
    if service is None or metadata.get("namespace") != namespace or name not in (None, metadata.get("name")):
        wanted = f"Service {name}" if name else "such Service"
        return EndpointCheck(False, REASON_ENDPOINT_NOT_FOUND, f"no {wanted} in namespace {namespace}")
    name = str(metadata.get("name") or "")
    if is_rendered_by_attachment(service):
        return EndpointCheck(
            False, REASON_ENDPOINT_NOT_TENANT_FACING, f"Service {name} is rendered by an EndpointAttachment"
        )
    application = application_of(service)
    if application is None:
        return EndpointCheck(
            False, REASON_ENDPOINT_NOT_TENANT_FACING, f"Service {name} carries no application lineage labels"
        )
    if not is_tenant_facing(service):
        return EndpointCheck(
            False, REASON_ENDPOINT_NOT_TENANT_FACING, f"Service {name} is not marked tenant-facing"
        )
    spec = service.get("spec") or {}
    if spec.get("type") == SERVICE_TYPE_EXTERNAL_NAME:
        return EndpointCheck(
            False, REASON_ENDPOINT_HAS_NO_SELECTOR, f"Service {name} is ExternalName: nothing to mirror"
        )
    selector = spec.get("selector") or {}
    if not isinstance(selector, Mapping) or not selector:
        return EndpointCheck(False, REASON_ENDPOINT_HAS_NO_SELECTOR, f"Service {name} has no selector")
    ports = tuple(port for port in spec.get("ports") or () if isinstance(port, Mapping))
    if not ports:
        return EndpointCheck(False, REASON_ENDPOINT_HAS_NO_PORTS, f"Service {name} lists no ports")
    return EndpointCheck(
        True,
        REASON_RESOLVED,
        f"Service {name} of {application.kind} {application.name}",
        application=application,
        selector={str(key): str(value) for key, value in selector.items()},
        ports=ports,
    )


def bound_application_uid(attachment: Mapping[str, Any]) -> str | None:
    """The UID of the HelmRelease the attachment's owner reference points at, if it has one."""
    uids = owner_uids(attachment, kind=HELMRELEASE_KIND, api_group=HELMRELEASE_GROUP)
    return uids[0] if uids else None


def match_application(
    stored_uid: str | None, helmrelease: Mapping[str, Any] | None, application: ApplicationRef
) -> ApplicationMatch:
    """Whether the HelmRelease found by the endpoint's labels is this attachment's application."""
    if helmrelease is not None and not belongs_to(helmrelease, application):
        helmrelease = None  # found by a selector that does not name this application: not it
    label = f"{application.kind} {application.name}"
    if helmrelease is None:
        if stored_uid:
            return ApplicationMatch(
                False, REASON_APPLICATION_NOT_FOUND, f"application {label} ({stored_uid}) is gone"
            )
        return ApplicationMatch(False, REASON_APPLICATION_NOT_FOUND, f"no HelmRelease for {label}")
    found_uid = str((helmrelease.get("metadata") or {}).get("uid") or "")
    if not found_uid:
        return ApplicationMatch(False, REASON_APPLICATION_NOT_FOUND, f"HelmRelease for {label} has no UID")
    if stored_uid is None:
        return ApplicationMatch(True, REASON_RESOLVED, f"application {label}", found_uid, stamp_owner=True)
    if stored_uid != found_uid:
        return ApplicationMatch(
            False,
            REASON_APPLICATION_MISMATCH,
            f"application {label} was recreated ({found_uid}); this attachment belongs to {stored_uid}",
        )
    return ApplicationMatch(True, REASON_RESOLVED, f"application {label}", found_uid)
