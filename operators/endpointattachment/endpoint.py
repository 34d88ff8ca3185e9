"""Resolution: which application incarnation an attachment belongs to, and whether its endpoint is a
tenant-facing Service of that application.

Decides, in this order (the first failure is the ``Resolved`` verdict):
1. the application: the HelmRelease of the namespace whose three lineage labels equal
   ``applicationRef`` (group defaulted), found by the caller; none is ``ApplicationNotFound``. With
   no owner reference to a HelmRelease on the attachment yet, the one found resolves and the caller
   stamps the reference and the lineage labels (``stamp``). With one, only a HelmRelease of that UID
   does: the same name with another UID is ``ApplicationIncarnationChanged`` (a recreated
   application inherits nothing).
2. the endpoint: the Service ``spec.endpoint.serviceName`` of the namespace (``EndpointNotFound``),
   not itself rendered by an attachment (our label or an attachment's controller reference:
   ``EndpointNotTenantFacing``, so attachments never chain), carrying the three lineage labels of
   ``applicationRef`` (``EndpointLineageMismatch``) and the tenant-facing marker
   (``EndpointNotTenantFacing``).

Does not: look anything up, stamp anything, or judge what the endpoint publishes (selector, ports:
``reconcile`` reports ``NothingToPublish``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from operators.endpointattachment.api import (
    ATTACHMENT_LABEL,
    ATTACHMENTS,
    HELMRELEASE_GROUP,
    HELMRELEASE_KIND,
    AttachmentSpec,
)
from operators.endpointattachment.reasons import (
    REASON_APPLICATION_INCARNATION_CHANGED,
    REASON_APPLICATION_NOT_FOUND,
    REASON_ENDPOINT_LINEAGE_MISMATCH,
    REASON_ENDPOINT_NOT_FOUND,
    REASON_ENDPOINT_NOT_TENANT_FACING,
    REASON_RESOLVED,
)
from shared.lineage import ApplicationRef, belongs_to, is_tenant_facing, labels_of
from shared.ownership import names_kind, owner_references, owner_uids


@dataclass(frozen=True)
class Resolution:
    """The ``Resolved`` verdict; ``application_uid`` is the incarnation when it resolves."""

    ok: bool
    reason: str
    message: str
    application_uid: str | None = None
    # No owner reference to the application yet: the caller stamps it (and the lineage labels).
    stamp: bool = False


def application_ref(spec: AttachmentSpec) -> ApplicationRef:
    return ApplicationRef(group=spec.app_group, kind=spec.app_kind, name=spec.app_name)


def is_rendered_by_attachment(service: Mapping[str, Any]) -> bool:
    """Whether a Service looks rendered by some attachment (our label, or an attachment controls it)."""
    if ATTACHMENT_LABEL in labels_of(service):
        return True
    return any(
        ref.get("controller") is True and names_kind(ref, ATTACHMENTS) for ref in owner_references(service)
    )


def bound_application_uid(attachment: Mapping[str, Any]) -> str | None:
    """The UID of the HelmRelease the attachment's owner reference points at, if it has one."""
    uids = owner_uids(attachment, kind=HELMRELEASE_KIND, api_group=HELMRELEASE_GROUP)
    return uids[0] if uids else None


def resolve(
    attachment: Mapping[str, Any],
    spec: AttachmentSpec,
    helmrelease: Mapping[str, Any] | None,
    endpoint: Mapping[str, Any] | None,
) -> Resolution:
    """The ``Resolved`` verdict (see the module docstring)."""
    app = application_ref(spec)
    label = f"{app.kind} {app.name}"
    stored = bound_application_uid(attachment)
    found = str(((helmrelease or {}).get("metadata") or {}).get("uid") or "")
    if helmrelease is None or not found or not belongs_to(helmrelease, app):
        gone = f" ({stored}) is gone" if stored else " has no HelmRelease in this namespace"
        return Resolution(False, REASON_APPLICATION_NOT_FOUND, f"application {label}{gone}")
    if stored is not None and stored != found:
        return Resolution(
            False,
            REASON_APPLICATION_INCARNATION_CHANGED,
            f"application {label} was recreated ({found}); this attachment belongs to {stored}: "
            "recreate the attachment",
        )
    name = spec.endpoint
    if endpoint is None:
        return Resolution(False, REASON_ENDPOINT_NOT_FOUND, f"no Service {name} in this namespace")
    if is_rendered_by_attachment(endpoint):
        return Resolution(
            False, REASON_ENDPOINT_NOT_TENANT_FACING, f"Service {name} is rendered by an EndpointAttachment"
        )
    if not belongs_to(endpoint, app):
        return Resolution(
            False, REASON_ENDPOINT_LINEAGE_MISMATCH, f"Service {name} does not belong to {label}"
        )
    if not is_tenant_facing(endpoint):
        return Resolution(
            False,
            REASON_ENDPOINT_NOT_TENANT_FACING,
            f"Service {name} is not one of {label}'s tenant-facing endpoints",
        )
    return Resolution(True, REASON_RESOLVED, f"Service {name} of {label}", found, stamp=stored is None)
