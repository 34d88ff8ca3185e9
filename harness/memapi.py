"""An in-memory Kubernetes API for unit tests: the project's client-side code runs over it unchanged.

``MemApi`` is a ``shared.kube.Kube`` whose wire is memory: ``Kube``'s own verbs (``request``,
``get``, ``list``, ``create``, ``replace``, ``apply``, ``patch`` of every kind it accepts,
``delete`` with its preconditions; their parameters, 404 as None, ``note_write`` and client spans)
run unchanged and hand each request to ``_send``, which answers it here instead of over HTTP;
``watch``, ``with_own_connections`` (the same API) and ``close`` are its own. So the runtime's
``Writer``, ``Informer``, ``Reads``, the leader elector and the Events ``Recorder`` take it where
they take a ``Kube``. Pure asyncio: no network. Its errors are the ``ApiError`` the client raises
for the same answer.

Models, as the API server does:

* one global resourceVersion counter: every write bumps it and stamps the object (a write that
  changes nothing is no write: no new version, no event); a LIST carries the current one;
* on create: ``uid``, ``creationTimestamp``, ``generation`` 1, a name from ``generateName`` (a
  collision is tried again with another suffix), 422 without either, 409 AlreadyExists for a name
  taken; a create cannot set ``status``;
* ``metadata.generation`` bumped when anything but metadata and status changes (and when a
  deletion is marked, as the API server does);
* the status subresource: a write to ``.../status`` changes only ``status``; a main write keeps
  the stored ``status`` whatever it sends (every kind is modelled with the subresource);
* preconditions: a DELETE's ``uid`` / ``resourceVersion``, an update's or a patch's
  ``metadata.resourceVersion`` (409 Conflict); a changed ``uid`` is 422 (immutable); a JSON patch
  that does not apply (a failed ``test`` included) is 422; 404 for what is not there;
* finalizers: a DELETE of an object with finalizers marks it (``deletionTimestamp``); it goes when
  its last finalizer does (the write that removes it is answered with the final object), and a
  deleting object takes no new finalizer (422);
* watches: every open watch of a path gets ADDED / MODIFIED / DELETED in order (as a selector sees
  them: an object that stops matching is DELETED for it), resumable from a resourceVersion still
  in the event history (``history`` events are kept; older, or after ``compact``: an ERROR event
  with a 410 Gone Status, as the API server's watch cache answers), from "" or "0" with the
  current objects first as ADDED; each ends after its ``timeoutSeconds`` with a BOOKMARK;
* LIST: key order, label and field selectors (``=``, ``==``, ``!=``; ``in``, ``notin``, ``key``,
  ``!key`` for labels), pages (``limit`` / ``continue``, each page of the first one's snapshot; an
  unknown token is 410), ``NotOlderThan`` (a version from the future: 504, "Too large resource
  version").

Records every request (``requests``: method, path, params, body, content type, and its answer;
``Request.verb`` is the Kubernetes verb, ``Request.target`` the parsed path) before answering it,
so tests assert on what was sent. ``faults`` make chosen requests fail (``refuse``), after they are
recorded; ``admission`` checks refuse a create or an update where the API server's validating
admission does (a quota, a policy): after a generated name was drawn, before anything is stored.

The test's own side, never recorded: ``seed`` (an object as another actor left it, versions
kept), ``remove`` (gone outright), ``stored``, ``compact``, ``end_watches``, ``settled``.

Does not model: admission, validation beyond the above, defaulting, garbage collection or deletion
propagation (``propagationPolicy`` is recorded, not acted on), grace periods, strategic merge's
directives (a ``strategic`` patch is merged as a JSON merge patch, lists replaced), server-side
apply's field ownership (an ``apply`` creates the object or merges it in), one kind served at two
versions (each API version's path is its own collection), or subresources but ``status``.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import re
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import jsonpatch
import jsonpointer

from harness.mergepatch import merge_patch
from shared.credentials import Credentials
from shared.kube import ApiError, Kube, Obj, PatchKind, watch_params
from shared.resources import Resource

_CONTENT_TYPES: Final[dict[str, PatchKind]] = {
    "application/json-patch+json": "json",
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/apply-patch+yaml": "apply",
}
# Kubernetes' alphabet for generated name suffixes (no vowels, no look-alikes).
SUFFIX_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"
DEFAULT_HISTORY: Final = 1000
GENERATE_ATTEMPTS: Final = 8
MEMORY: Final = "memory://"  # the server a MemApi's credentials name: none
_VERBS: Final = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
Collection = tuple[str, str]  # (API prefix, plural): "/api/v1", "pods"
Sent = list[tuple[str, Obj]]  # watch events: (type, object)
# What the API server keeps of an object's metadata whatever an update sends.
_SYSTEM_FIELDS: Final = (
    "uid",
    "creationTimestamp",
    "generation",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
)
Fault = Callable[["Request"], BaseException | None]
# A validating admission check: the request and the object it would store; an error refuses it.
Admission = Callable[["Request", Obj], BaseException | None]


@dataclass(frozen=True)
class Target:
    """What a path names: ``prefix`` (``/api/v1``, ``/apis/<group>/<version>``), the kind's
    ``plural``, and ``namespace``, ``name``, ``subresource`` where given ("" otherwise)."""

    prefix: str
    plural: str
    namespace: str = ""
    name: str = ""
    subresource: str = ""

    @property
    def collection(self) -> Collection:
        return self.prefix, self.plural

    @property
    def api_version(self) -> str:
        return self.prefix.removeprefix("/api/").removeprefix("/apis/")


def parse(path: str) -> Target:
    parts = path.split("?")[0].strip("/").split("/")
    cut = 2 if parts[0] == "api" else 3
    if len(parts) <= cut - 1 or parts[0] not in ("api", "apis"):
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
    prefix, rest = "/" + "/".join(parts[:cut]), parts[cut:]
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest:
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
    return Target(prefix, rest[0], namespace, *[*rest[1:3], "", ""][:2])


@dataclass
class Request:
    """One request as sent: its HTTP ``method``, ``path``, query ``params``, ``body``, content type;
    and, once answered, the ``answer`` (not part of what was sent: equality ignores it)."""

    method: str
    path: str
    params: Mapping[str, str] = field(default_factory=dict)
    body: Any = None
    content_type: str = ""
    answer: Obj | None = field(default=None, compare=False, repr=False)

    @property
    def name(self) -> str:
        """The name of the object written or read: the path's, else the answer's (a generated one)
        or the body's."""
        for obj in (self.answer, self.body):
            if self.target.name or not isinstance(obj, Mapping):
                continue
            if name := (obj.get("metadata") or {}).get("name"):
                return str(name)
        return self.target.name

    @property
    def target(self) -> Target:
        return parse(self.path)

    @property
    def verb(self) -> str:
        """The Kubernetes verb: get, list, watch, create, update, patch, delete."""
        if self.method == "GET":
            if self.params.get("watch") == "true":
                return "watch"
            return "get" if self.target.name else "list"
        return _VERBS.get(self.method, self.method.lower())

    @property
    def patch_kind(self) -> PatchKind | None:
        return _CONTENT_TYPES.get(self.content_type) if self.method == "PATCH" else None


@dataclass(frozen=True)
class _Event:
    version: int
    kind: str  # ADDED, MODIFIED, DELETED
    collection: Collection
    old: Obj | None  # the version before (a selector watch decides with both)
    new: Obj


class _Watch:
    """One open watch: its filter and its backlog of events not yet read."""

    def __init__(self, target: Target, labels: str, fields: str) -> None:
        self.target, self.labels, self.fields = target, labels, fields
        self.backlog: deque[tuple[str, Obj]] = deque()
        self.ready = asyncio.Event()
        self.ended = False

    def offer(self, event: _Event) -> None:
        translated = self.translate(event)
        if translated is not None:
            self.backlog.append(translated)
            self.ready.set()

    def translate(self, event: _Event) -> tuple[str, Obj] | None:
        """The event as this watch sees it (None: not for it)."""
        if event.collection != self.target.collection:
            return None
        namespace = event.new["metadata"].get("namespace") or ""
        if self.target.namespace and namespace != self.target.namespace:
            return None
        if self.target.name and event.new["metadata"]["name"] != self.target.name:
            return None
        if event.kind == "DELETED":
            return ("DELETED", event.new) if self.matches(event.new) else None
        before = event.old is not None and self.matches(event.old)
        if self.matches(event.new):
            return ("MODIFIED" if before else "ADDED", event.new)
        return ("DELETED", event.new) if before else None

    def matches(self, obj: Obj) -> bool:
        return selects(self.labels, self.fields, obj)


def _terms(selector: str) -> list[str]:
    """A selector's comma-separated terms (commas inside ``in (...)`` kept)."""
    return [t.strip() for t in re.split(r",(?![^(]*\))", selector) if t.strip()]


_SET_TERM: Final = re.compile(r"^([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)$")


def _label_term(term: str, labels: Mapping[str, str]) -> bool:
    found = _SET_TERM.match(term)
    if found:
        key, operator, values = found.groups()
        inside = labels.get(key) in {v.strip() for v in values.split(",")}
        return inside if operator == "in" else not inside
    if "!=" in term:
        key, _, value = term.partition("!=")
        return labels.get(key.strip()) != value.strip()
    if "=" in term:
        key, _, value = term.replace("==", "=").partition("=")
        return labels.get(key.strip()) == value.strip()
    if term.startswith("!"):
        return term[1:].strip() not in labels
    return term in labels


def _field_value(obj: Obj, path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return "" if value is None else str(value)


def _field_term(term: str, obj: Obj) -> bool:
    if "!=" in term:
        path, _, value = term.partition("!=")
        return _field_value(obj, path.strip()) != value.strip()
    path, _, value = term.replace("==", "=").partition("=")
    return _field_value(obj, path.strip()) == value.strip()


def selects(label_selector: str, field_selector: str, obj: Obj) -> bool:
    """Whether ``obj`` matches both selectors (empty ones match everything)."""
    labels = obj.get("metadata", {}).get("labels") or {}
    return all(_label_term(t, labels) for t in _terms(label_selector)) and all(
        _field_term(t, obj) for t in _terms(field_selector)
    )


def _timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _default_uids() -> Callable[[Obj], str]:
    counter = itertools.count(1)
    return lambda _: "{0:08x}-0000-4000-8000-{0:012x}".format(next(counter))


def _default_names() -> Callable[[str], str]:
    counter = itertools.count(0)
    size = len(SUFFIX_ALPHABET)

    def generate(prefix: str) -> str:
        n = next(counter)
        return prefix + "".join(SUFFIX_ALPHABET[(n // size**i) % size] for i in range(4, -1, -1))

    return generate


def _spec_of(obj: Obj) -> Obj:
    """What ``generation`` follows: everything but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _conflict(message: str) -> ApiError:
    return ApiError(409, "Conflict", message)


def _invalid(message: str) -> ApiError:
    return ApiError(422, "Invalid", message)


class MemApi(Kube):
    """The in-memory API (see the module docstring): a ``Kube`` whose wire is memory. ``clock``: the
    wall clock of creation and deletion timestamps; ``uid``: an object's UID at its create;
    ``generate``: a name from a ``generateName``; ``history``: how many events a watch can resume
    across."""

    def __init__(
        self,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        uid: Callable[[Obj], str] | None = None,
        generate: Callable[[str], str] | None = None,
        history: int = DEFAULT_HISTORY,
    ) -> None:
        super().__init__(Credentials(MEMORY, None), reload=self._credentials)
        self.clock = clock
        self.uid = uid or _default_uids()
        self.generate = generate or _default_names()
        self.requests: list[Request] = []
        self.faults: list[Fault] = []
        self.admission: list[Admission] = []
        self._sending: Request | None = None  # the request being answered
        self._version = 0
        self._objects: dict[Collection, dict[tuple[str, str], Obj]] = {}
        self._kinds: dict[Collection, str] = {}
        self._history: deque[_Event] = deque()
        self._history_size = history
        self._compacted = 0  # a watch from before this version is answered 410
        self._watches: set[_Watch] = set()
        self._pages: dict[str, tuple[list[Obj], str]] = {}
        self._tokens = itertools.count(1)

    # --- the wire: what Kube's verbs send, answered here ---------------------------------------------

    async def _send(
        self, method: str, path: str, body: Any, params: Mapping[str, str] | None, content_type: str
    ) -> Obj:
        """One request as ``Kube.request`` sends it (its verbs, ``note_write`` and spans ran above),
        recorded, then answered from memory instead of over HTTP."""
        sent = Request(method, path, dict(params or {}), copy.deepcopy(body), content_type)
        self._record(sent)
        self._sending = sent
        try:
            sent.answer = self._answered(sent)
        finally:
            self._sending = None
        return copy.deepcopy(sent.answer)

    def _answered(self, sent: Request) -> Obj:
        method, target = sent.method, sent.target
        if method == "GET":
            return self._get(target) if target.name else self._list(target, sent.params)
        if method == "POST":
            return self._create(target, sent.body)
        if method == "PUT":
            return self._update(target, lambda _: sent.body)
        if method == "PATCH":
            return self._patch(target, sent)
        if method == "DELETE":
            return self._delete(target, sent.body or {})
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported")

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
        params = watch_params(resource_version, label_selector, field_selector, timeout_seconds)
        self._record(Request("GET", path, params))
        opened = _Watch(parse(path), label_selector, field_selector)
        replay = self._replay(opened, resource_version)
        if replay is None:
            yield "ERROR", self._status(410, "Expired", f"too old resource version: {resource_version}")
            return
        opened.backlog.extend(replay)
        self._watches.add(opened)
        deadline = asyncio.get_running_loop().time() + timeout_seconds
        try:
            while True:
                while opened.backlog:
                    yield opened.backlog.popleft()
                if opened.ended:
                    return
                opened.ready.clear()
                left = deadline - asyncio.get_running_loop().time()
                try:
                    async with asyncio.timeout(max(left, 0)):
                        await opened.ready.wait()
                except TimeoutError:
                    yield "BOOKMARK", {"metadata": {"resourceVersion": str(self._version)}}
                    return
        finally:
            self._watches.discard(opened)

    async def _credentials(self) -> Credentials:
        return self.credentials  # never asked: nothing here answers 401

    def with_own_connections(self) -> MemApi:
        """The same API (there are no connections to keep apart)."""
        return self

    async def close(self) -> None:
        self.end_watches()

    # --- the test's side (not requests) ------------------------------------------------------------

    @property
    def resource_version(self) -> str:
        return str(self._version)

    def refuse(
        self,
        error: BaseException,
        *,
        verb: str | None = None,
        plural: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
        times: int | None = None,
    ) -> Fault:
        """Make the requests that match (every given part) fail with ``error``; ``times``: only
        that many. Returns the fault (``faults.remove`` lifts it)."""
        left = [times]

        def fault(request: Request) -> BaseException | None:
            target = request.target
            wanted = ((verb, request.verb), (plural, target.plural), (name, target.name))
            if any(w is not None and w != got for w, got in wanted):
                return None
            if subresource is not None and subresource != target.subresource:
                return None
            if left[0] is not None:
                left[0] -= 1
                if left[0] <= 0:
                    self.faults.remove(fault)
            return error

        self.faults.append(fault)
        return fault

    def seed(self, where: Resource | str, obj: Mapping[str, Any]) -> Obj:
        """``obj`` stored as another actor left it (its uid, versions and status kept; what it lacks
        filled in), its ADDED or MODIFIED event sent; the counter moves past its resourceVersion."""
        stored = copy.deepcopy(dict(obj))
        metadata = stored.setdefault("metadata", {})
        namespace = metadata.get("namespace") or ""
        path = where.path(namespace or None) if isinstance(where, Resource) else where
        target = parse(path)
        metadata.setdefault("uid", self.uid(stored))
        metadata.setdefault("creationTimestamp", _timestamp(self.clock()))
        version = str(metadata.get("resourceVersion") or "")
        if version.isdigit():
            self._version = max(self._version, int(version))
        else:
            self._version += 1
            metadata["resourceVersion"] = str(self._version)
        self._remember_kind(target, stored)
        key = (namespace, metadata["name"])
        old = self._collection(target).get(key)
        self._collection(target)[key] = stored
        self._emit("MODIFIED" if old is not None else "ADDED", target, old, stored)
        return copy.deepcopy(stored)

    def remove(self, path: str) -> Obj | None:
        """The object gone outright (finalizers or not), its DELETED event sent; None: not there."""
        target = parse(path)
        old = self._collection(target).pop((target.namespace, target.name), None)
        if old is None:
            return None
        final = self._stamped(old)
        self._emit("DELETED", target, old, final)
        return copy.deepcopy(final)

    def stored(self, path: str) -> Obj | None:
        """A copy of what the API holds at ``path`` (None: nothing)."""
        target = parse(path)
        found = self._collection(target).get((target.namespace, target.name))
        return copy.deepcopy(found) if found is not None else None

    def compact(self) -> None:
        """Forget the event history: a watch from any version before now is answered 410 Gone."""
        self._history.clear()
        self._compacted = self._version

    def end_watches(self) -> None:
        """End every open watch (as a restarting API server does): each is sent nothing more, and
        ends once its reader has taken what was sent before."""
        for opened in self._watches:
            opened.ended = True
            opened.ready.set()
        self._watches.clear()

    def open_watches(self, path: str | None = None) -> int:
        return sum(1 for w in self._watches if path is None or parse(path) == w.target)

    async def settled(self, rounds: int = 100) -> None:
        """Let every open watch's reader take what was sent to it."""
        for _ in range(rounds):
            await asyncio.sleep(0)
            if not any(w.backlog for w in self._watches):
                break
        await asyncio.sleep(0)

    # --- the machinery ---------------------------------------------------------------------------

    def _record(self, request: Request) -> None:
        self.requests.append(request)
        for fault in list(self.faults):
            error = fault(request)
            if error is not None:
                raise error

    def _admit(self, obj: Obj) -> None:
        """Validating admission: each check sees the object as it would be stored (a generated name
        included: a refused create has used its name, as on the API server)."""
        if self._sending is None:
            return
        for check in self.admission:
            error = check(self._sending, obj)
            if error is not None:
                raise error

    def _collection(self, target: Target) -> dict[tuple[str, str], Obj]:
        return self._objects.setdefault(target.collection, {})

    def _remember_kind(self, target: Target, obj: Obj) -> None:
        if obj.get("kind"):
            self._kinds.setdefault(target.collection, str(obj["kind"]))

    def _status(self, code: int, reason: str, message: str) -> Obj:
        return {"kind": "Status", "apiVersion": "v1", "code": code, "reason": reason, "message": message}

    def _current(self, target: Target) -> Obj:
        found = self._collection(target).get((target.namespace, target.name))
        if found is None:
            raise ApiError(404, "NotFound", f'{target.plural} "{target.name}" not found')
        return found

    def _stamped(self, obj: Obj) -> Obj:
        """``obj`` (a copy) at the next resourceVersion."""
        self._version += 1
        stamped = copy.deepcopy(obj)
        stamped["metadata"]["resourceVersion"] = str(self._version)
        return stamped

    def _emit(self, kind: str, target: Target, old: Obj | None, new: Obj) -> None:
        event = _Event(self._version, kind, target.collection, old, new)
        self._history.append(event)
        if len(self._history) > self._history_size:
            self._compacted = self._history.popleft().version
        for opened in self._watches:
            opened.offer(event)

    def _get(self, target: Target) -> Obj:
        if target.subresource not in ("", "status"):
            raise ApiError(404, "NotFound", f"no subresource {target.subresource} of {target.plural}")
        return copy.deepcopy(self._current(target))

    def _list(self, target: Target, params: Mapping[str, str]) -> Obj:
        token = params.get("continue", "")
        if token:
            if token not in self._pages:
                raise ApiError(410, "Expired", "the provided continue parameter is too old")
            items, version = self._pages.pop(token)
        else:
            self._check_list_version(params)
            version = str(self._version)
            items = [
                copy.deepcopy(obj)
                for (namespace, _), obj in sorted(self._collection(target).items())
                if (not target.namespace or namespace == target.namespace)
                and selects(params.get("labelSelector", ""), params.get("fieldSelector", ""), obj)
            ]
        limit = int(params.get("limit") or 0)
        metadata: Obj = {"resourceVersion": version}
        if limit and len(items) > limit:
            token = f"{version}-{next(self._tokens)}"
            self._pages[token] = (items[limit:], version)
            items, metadata["continue"] = items[:limit], token
        kind = self._kinds.get(target.collection, "")
        return {"kind": f"{kind}List", "apiVersion": target.api_version, "metadata": metadata, "items": items}

    def _check_list_version(self, params: Mapping[str, str]) -> None:
        asked, match = params.get("resourceVersion", ""), params.get("resourceVersionMatch", "")
        if asked.isdigit() and int(asked) > self._version:
            raise ApiError(504, "Timeout", f"Too large resource version: {asked}, current: {self._version}")
        if match == "Exact" and asked != str(self._version):
            raise ApiError(410, "Expired", f"too old resource version: {asked}")

    def _replay(self, opened: _Watch, version: str) -> Sent | None:
        """What a new watch reads first: the current objects (from "" or "0"), or the events
        since ``version``; None when that version is older than the history keeps."""
        if version in ("", "0"):
            return [
                ("ADDED", copy.deepcopy(obj))
                for obj in self._collection(opened.target).values()
                if opened.translate(_Event(0, "ADDED", opened.target.collection, None, obj)) is not None
            ]
        since = int(version) if version.isdigit() else -1
        if since < self._compacted:
            return None
        events = (opened.translate(e) for e in self._history if e.version > since)
        return [e for e in events if e is not None]

    def _create(self, target: Target, body: Any, *, generated: bool = True) -> Obj:
        if not isinstance(body, Mapping):
            raise ApiError(400, "BadRequest", "the body of a create is an object")
        obj = copy.deepcopy(dict(body))
        metadata = obj.setdefault("metadata", {})
        if target.namespace and metadata.get("namespace", target.namespace) != target.namespace:
            raise ApiError(400, "BadRequest", "the namespace of the object does not match the request's")
        if target.namespace:
            metadata["namespace"] = target.namespace
        objects = self._collection(target)
        name = metadata.get("name") or ""
        prefix = metadata.get("generateName") or ""
        if not name and not prefix:
            raise _invalid(
                f"{target.plural}: metadata.name: Required value: name or generateName is required"
            )
        for _ in range(GENERATE_ATTEMPTS if not name and generated else 1):
            candidate = name or self.generate(prefix)
            if (target.namespace, candidate) not in objects:
                break
        else:
            raise ApiError(409, "AlreadyExists", f'{target.plural} "{candidate}" already exists')
        for system in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion", "uid"):
            metadata.pop(system, None)
        metadata["name"] = candidate
        metadata["uid"] = self.uid(obj)
        metadata["creationTimestamp"] = _timestamp(self.clock())
        metadata["generation"] = 1
        obj.pop("status", None)  # a create cannot set status
        self._admit(obj)
        created = self._stamped(obj)
        objects[(target.namespace, candidate)] = created
        self._remember_kind(target, created)
        self._emit("ADDED", target, None, created)
        return copy.deepcopy(created)

    def _patch(self, target: Target, sent: Request) -> Obj:
        kind = sent.patch_kind
        if kind is None:
            raise ApiError(
                415, "UnsupportedMediaType", f"the content type {sent.content_type} is not a patch"
            )
        if kind == "apply":
            if not sent.params.get("fieldManager"):
                raise ApiError(400, "BadRequest", "fieldManager is required for apply patch")
            if (target.namespace, target.name) not in self._collection(target):
                return self._create(target, sent.body, generated=False)
        if kind == "json":
            return self._update(target, lambda current: _json_patched(current, sent.body))
        return self._update(target, lambda current: merge_patch(current, sent.body))

    def _update(self, target: Target, change: Callable[[Obj], Any]) -> Obj:
        """One update of the object at ``target`` (its status alone for ``.../status``)."""
        if target.subresource not in ("", "status"):
            raise ApiError(404, "NotFound", f"no subresource {target.subresource} of {target.plural}")
        current = self._current(target)
        wanted = change(copy.deepcopy(current))
        if not isinstance(wanted, Mapping) or not isinstance(wanted.get("metadata", {}), Mapping):
            raise ApiError(400, "BadRequest", "the result of a write is an object")
        wanted = dict(wanted)
        metadata = dict(wanted.get("metadata") or {})
        old_meta = current["metadata"]
        if metadata.get("name", target.name) != target.name:
            raise ApiError(400, "BadRequest", "the name of the object does not match the request's")
        if metadata.get("uid", old_meta["uid"]) != old_meta["uid"]:
            raise _invalid(f'{target.plural} "{target.name}": metadata.uid: field is immutable')
        version = metadata.get("resourceVersion")
        if version and version != old_meta["resourceVersion"]:
            raise _conflict(
                f'Operation cannot be fulfilled on {target.plural} "{target.name}": the object has been '
                "modified; please apply your changes to the latest version and try again"
            )
        if target.subresource == "status":
            updated = {**current, "status": wanted.get("status")}
            if updated["status"] is None:
                updated.pop("status")
        else:
            updated = self._main_write(target, current, wanted, metadata)
        self._admit(updated)  # admission sees every update, one that changes nothing too
        if updated == current:
            return copy.deepcopy(current)  # nothing changed: no write
        return self._store(target, current, updated)

    def _main_write(self, target: Target, current: Obj, wanted: Obj, metadata: Obj) -> Obj:
        old_meta = current["metadata"]
        for system in (
            "uid",
            "creationTimestamp",
            "generation",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ):
            if system in old_meta:
                metadata[system] = old_meta[system]
            else:
                metadata.pop(system, None)
        metadata["namespace"] = old_meta.get("namespace")
        if metadata["namespace"] is None:
            metadata.pop("namespace")
        metadata["resourceVersion"] = old_meta["resourceVersion"]
        updated = {**wanted, "metadata": metadata}
        updated.pop("status", None)
        if "status" in current:
            updated["status"] = current["status"]
        added = set(metadata.get("finalizers") or ()) - set(old_meta.get("finalizers") or ())
        if old_meta.get("deletionTimestamp") and added:
            raise _invalid(
                f'{target.plural} "{target.name}": metadata.finalizers: Forbidden: no new finalizers '
                "can be added if the object is being deleted"
            )
        if _spec_of(updated) != _spec_of(current) and "generation" in metadata:
            metadata["generation"] = int(metadata["generation"]) + 1
        return updated

    def _store(self, target: Target, current: Obj, updated: Obj) -> Obj:
        key = (target.namespace, target.name)
        written = self._stamped(updated)
        metadata = written["metadata"]
        if metadata.get("deletionTimestamp") and not metadata.get("finalizers"):
            del self._collection(target)[key]  # the last finalizer went: gone
            self._emit("DELETED", target, current, written)
        else:
            self._collection(target)[key] = written
            self._emit("MODIFIED", target, current, written)
        return copy.deepcopy(written)

    def _delete(self, target: Target, options: Mapping[str, Any]) -> Obj:
        current = self._current(target)
        metadata = current["metadata"]
        preconditions = options.get("preconditions") or {}
        for field_name in ("uid", "resourceVersion"):
            wanted = preconditions.get(field_name)
            if wanted and wanted != metadata.get(field_name):
                raise _conflict(
                    f"Precondition failed: {field_name.capitalize()} in precondition: {wanted}, "
                    f"{field_name.capitalize()} in object meta: {metadata.get(field_name)}"
                )
        if metadata.get("deletionTimestamp"):
            return copy.deepcopy(current)  # its deletion is under way
        if metadata.get("finalizers"):
            marked = copy.deepcopy(current)
            marked["metadata"]["deletionTimestamp"] = _timestamp(self.clock())
            marked["metadata"]["deletionGracePeriodSeconds"] = 0
            if marked["metadata"].get("generation"):
                marked["metadata"]["generation"] += 1
            return self._store(target, current, marked)
        gone = self.remove(self._path_of(target))
        assert gone is not None
        return gone

    @staticmethod
    def _path_of(target: Target) -> str:
        namespace = f"/namespaces/{target.namespace}" if target.namespace else ""
        return f"{target.prefix}{namespace}/{target.plural}/{target.name}"


def _json_patched(current: Obj, ops: Any) -> Obj:
    """RFC 6902 as the API server applies it: a patch that does not apply is 422."""
    if not isinstance(ops, Iterable) or isinstance(ops, (str, bytes, Mapping)):
        raise ApiError(400, "BadRequest", "a JSON patch is a list of operations")
    try:
        patched: Obj = jsonpatch.apply_patch(current, list(ops))
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as error:
        raise _invalid(f"the JSON patch does not apply: {error}") from None
    return patched
