"""A thin async Kubernetes client speaking plain JSON, for both operators and their tests.

Decides: how a resource maps to its URL path, which HTTP status means what (404 is "absent", not an
error; 409 is a conflict the caller decides about), and the content type of each kind of patch.

Also decides how long a call may take: every request has a connect and a read timeout (the
instance's, by default ``DEFAULT_TIMEOUT``); a watch has its own idle timeout (the longest silence
between two lines) apart from the server-side ``timeoutSeconds``. A call that gets no answer raises
one of ``NO_ANSWER``: kr8s's ``APITimeoutError`` for any timeout (kr8s wraps httpx's, also in the
middle of a watch stream) or httpx's ``TransportError`` for a refused or broken connection; kr8s
retries only 401/403 (re-authenticating) and TLS verification failures, three times each, so no call
retries forever.

Does not: cache, retry, or interpret objects. Authentication (kubeconfig, exec plugins, in-cluster
ServiceAccount tokens) and the HTTP session are kr8s's; everything here is a few lines over
``kr8s.asyncio.Api.call_api`` so that objects stay plain dicts the pure cores can read.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import httpx
import kr8s
import kr8s.asyncio
from opentelemetry import trace

from shared.telemetry.tracing import note_write

Obj = dict[str, Any]
PatchKind = Literal["json", "merge", "strategic", "apply"]

_PATCH_CONTENT_TYPES: dict[PatchKind, str] = {
    "json": "application/json-patch+json",
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "apply": "application/apply-patch+yaml",
}


# The API server answers every call but a watch in well under this; a LIST page of 500 Pods included.
DEFAULT_READ_TIMEOUT_SECONDS: Final = 30.0
# A TCP + TLS handshake to a reachable API server takes milliseconds; longer means it is not there.
DEFAULT_CONNECT_TIMEOUT_SECONDS: Final = 5.0
DEFAULT_TIMEOUT: Final = httpx.Timeout(DEFAULT_READ_TIMEOUT_SECONDS, connect=DEFAULT_CONNECT_TIMEOUT_SECONDS)
# A watch with no idle timeout of its own may stay silent for its whole timeoutSeconds: the server
# closes it then, so this much more is a dead connection, not a quiet one.
WATCH_IDLE_GRACE_SECONDS: Final = 10.0
# What a call that got no answer raises (see the module docstring); ``TimeoutError`` is a caller's
# own deadline around the call.
NO_ANSWER: Final = (httpx.TransportError, kr8s.APITimeoutError, TimeoutError)


class ApiError(Exception):
    """A non-2xx answer from the API server, with its HTTP status and the Status object's reason."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def transient(self) -> bool:
        """Worth retrying: throttled, timed out or a server-side failure; never a refusal."""
        return self.status in (429, 504) or self.status >= 500


@dataclass(frozen=True)
class Resource:
    """One kind's REST coordinates: ``Resource("apps/v1", "deployments")``."""

    api_version: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        parts = [base]
        if self.namespaced and namespace:
            parts += ["namespaces", namespace]
        parts.append(self.plural)
        if name:
            parts.append(name)
        return "/".join(parts)


NAMESPACES = Resource("v1", "namespaces", namespaced=False)
NODES = Resource("v1", "nodes", namespaced=False)
PODS = Resource("v1", "pods")
SERVICES = Resource("v1", "services")
SERVICE_ACCOUNTS = Resource("v1", "serviceaccounts")
EVENTS = Resource("v1", "events")
RESOURCE_QUOTAS = Resource("v1", "resourcequotas")
ENDPOINT_SLICES = Resource("discovery.k8s.io/v1", "endpointslices")
CRDS = Resource("apiextensions.k8s.io/v1", "customresourcedefinitions", namespaced=False)
ROLES = Resource("rbac.authorization.k8s.io/v1", "roles")
ROLE_BINDINGS = Resource("rbac.authorization.k8s.io/v1", "rolebindings")
CLUSTER_ROLES = Resource("rbac.authorization.k8s.io/v1", "clusterroles", namespaced=False)
CLUSTER_ROLE_BINDINGS = Resource("rbac.authorization.k8s.io/v1", "clusterrolebindings", namespaced=False)


class Kube:
    """Plain-JSON verbs over one authenticated kr8s session."""

    def __init__(
        self,
        api: kr8s.asyncio.Api,
        tracer: trace.Tracer | None = None,
        *,
        timeout: httpx.Timeout | None = None,
    ) -> None:
        self.api = api
        # Every write becomes a child span of the current pass and marks that pass "changed".
        self.tracer = tracer
        # Per request, never on kr8s's session: kr8s shares one Api (and session) between callers.
        self.timeout = timeout or DEFAULT_TIMEOUT

    @classmethod
    async def connect(
        cls,
        kubeconfig: str | None = None,
        *,
        timeout: httpx.Timeout | None = None,  # noqa: ASYNC109 - every request's, not this call's
    ) -> Kube:
        """From a kubeconfig path, or (None) the usual chain: $KUBECONFIG, ~/.kube/config, in-cluster."""
        with warnings.catch_warnings():
            # kr8s warns about any server newer than the releases it was tested with; the verbs used
            # here are stable v1 REST, so the warning says nothing about this code.
            warnings.filterwarnings("ignore", "Kubernetes version", UserWarning)
            api = await kr8s.asyncio.api(kubeconfig=kubeconfig) if kubeconfig else await kr8s.asyncio.api()
        return cls(api, timeout=timeout)

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        if method == "GET":
            return await self._send(method, path, body, params, content_type)
        note_write()
        if self.tracer is None:
            return await self._send(method, path, body, params, content_type)
        attributes = {"http.request.method": method, "k8s.request.path": path}
        with self.tracer.start_as_current_span(
            f"{method} {_resource_of(path)}", kind=trace.SpanKind.CLIENT, attributes=attributes
        ) as span:
            try:
                return await self._send(method, path, body, params, content_type)
            except ApiError as error:
                span.set_attribute("http.response.status_code", error.status)
                raise

    async def _send(
        self, method: str, path: str, body: Any, params: Mapping[str, str] | None, content_type: str
    ) -> Obj:
        base, _, rest = path.lstrip("/").partition("/")
        kwargs: dict[str, Any] = {"params": dict(params or {}), "timeout": self.timeout}
        if body is not None:
            kwargs["content"] = json.dumps(body)
            kwargs["headers"] = {"Content-Type": content_type}
        try:
            async with self.api.call_api(method, version="", base=f"/{base}", url=rest, **kwargs) as response:
                return response.json() if response.content else {}
        except kr8s.ServerError as error:
            raise _api_error(error) from None

    async def get(self, path: str) -> Obj | None:
        """The object, or None when it (or its whole kind) is not there."""
        try:
            return await self.request("GET", path)
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    async def list(
        self,
        path: str,
        *,
        label_selector: str = "",
        field_selector: str = "",
        limit: int = 0,
        continue_: str = "",
        resource_version: str = "",
    ) -> Obj:
        """One LIST (page): ``limit`` and ``continue_`` page it (the answer's ``metadata.continue``
        names the next page); ``resource_version`` as the API defines it ("" = a consistent read)."""
        params = {
            k: v
            for k, v in (
                ("labelSelector", label_selector),
                ("fieldSelector", field_selector),
                ("continue", continue_),
                ("resourceVersion", resource_version),
            )
            if v
        }
        if limit:
            params["limit"] = str(limit)
        return await self.request("GET", path, params=params)

    async def count(self, path: str) -> int:
        """How many objects a LIST would return, read from one item and ``remainingItemCount``."""
        page = await self.list(path, limit=1)
        return len(page.get("items") or []) + int(page["metadata"].get("remainingItemCount") or 0)

    async def create(self, path: str, body: Mapping[str, Any]) -> Obj:
        return await self.request("POST", path, body=body)

    async def replace(self, path: str, body: Mapping[str, Any]) -> Obj:
        return await self.request("PUT", path, body=body)

    async def apply(self, path: str, obj: Mapping[str, Any], field_manager: str) -> Obj:
        """Server-side apply of ``obj`` at its own path, taking ownership of every field it sets."""
        return await self.request(
            "PATCH",
            path,
            body=obj,
            params={"fieldManager": field_manager, "force": "true"},
            content_type=_PATCH_CONTENT_TYPES["apply"],
        )

    async def patch(self, path: str, patch: Any, kind: PatchKind = "json") -> Obj:
        """``path`` may end in ``/status`` to patch the status subresource."""
        return await self.request("PATCH", path, body=patch, content_type=_PATCH_CONTENT_TYPES[kind])

    async def delete(
        self,
        path: str,
        *,
        uid: str | None = None,
        propagation: str | None = None,
        grace_period_seconds: int | None = None,
    ) -> bool:
        """Delete; with ``uid`` only that incarnation. False when it was already gone."""
        options: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        if uid:
            options["preconditions"] = {"uid": uid}
        if propagation:
            options["propagationPolicy"] = propagation
        try:
            await self.request("DELETE", path, body=options)
        except ApiError as error:
            if error.status == 404:
                return False
            raise
        return True

    async def watch(
        self,
        path: str,
        *,
        resource_version: str = "",
        label_selector: str = "",
        field_selector: str = "",
        timeout_seconds: int = 300,
        idle_timeout: float | None = None,
    ) -> AsyncGenerator[tuple[str, Obj]]:
        """One watch request (bookmarks on): yields (type, object) until the server closes it.

        ``timeout_seconds`` is the server's: it ends the watch normally then. ``idle_timeout`` is
        ours: the longest silence allowed between two reads of the stream (default: the server's
        timeout plus a grace), after which kr8s's ``APITimeoutError`` is raised."""
        base, _, rest = path.lstrip("/").partition("/")
        params = {"watch": "true", "timeoutSeconds": str(timeout_seconds), "allowWatchBookmarks": "true"}
        if resource_version:
            params["resourceVersion"] = resource_version
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        idle = idle_timeout if idle_timeout is not None else timeout_seconds + WATCH_IDLE_GRACE_SECONDS
        # httpx's read timeout bounds each read of the socket: exactly "silence between two reads".
        timeout = httpx.Timeout(
            idle, connect=self.timeout.connect, write=self.timeout.write, pool=self.timeout.pool
        )
        loads = json.loads
        try:
            async with self.api.call_api(
                "GET", version="", base=f"/{base}", url=rest, params=params, stream=True, timeout=timeout
            ) as response:
                # Lines are split on the newline byte, not with httpx's ``aiter_lines``: that decodes
                # to text and splits on every Unicode line boundary, U+0085 included, which a JSON
                # string may carry unescaped; and bytes go to ``json.loads`` as they are.
                parts: list[bytes] = []  # the start of a line not yet ended
                async for chunk in response.aiter_bytes():
                    if b"\n" not in chunk:
                        parts.append(chunk)
                        continue
                    if parts:
                        parts.append(chunk)
                        chunk = b"".join(parts)
                        parts.clear()
                    lines = chunk.split(b"\n")
                    rest_of_chunk = lines.pop()
                    if rest_of_chunk:
                        parts.append(rest_of_chunk)
                    for line in lines:
                        if line:
                            event = loads(line)
                            yield event["type"], event["object"]
                last = b"".join(parts)
                if last.strip():
                    event = loads(last)
                    yield event["type"], event["object"]
        except kr8s.ServerError as error:
            raise _api_error(error) from None


def _resource_of(path: str) -> str:
    """The resource (and subresource) a path names, for a span name without object names in it."""
    parts = path.strip("/").split("/")
    parts = parts[2:] if parts[0] == "api" else parts[3:]  # drop /api/v1 or /apis/<group>/<version>
    if len(parts) >= 2 and parts[0] == "namespaces" and len(parts) > 2:
        parts = parts[2:]
    return "/".join(parts[:1] + parts[2:3])


def _api_error(error: kr8s.ServerError) -> ApiError:
    response = error.response
    status_code = response.status_code if response is not None else 0
    status: dict[str, Any] = error.status if isinstance(error.status, dict) else {}
    return ApiError(status_code, str(status.get("reason", "")), str(status.get("message", error)))
