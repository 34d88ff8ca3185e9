"""harness.memapi: the in-memory API answers as the API server does, one table per invariant, and the
runtime's own client-side code (Writer, Informer, Reads, the leader elector) runs over it unchanged."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from harness.memapi import MemApi, Request, parse, selects
from shared.kube import ApiError, Obj
from shared.resources import CONFIGMAPS, LEASES, SERVICES
from shared.runtime.cache import Informer, Store
from shared.runtime.leader import LeaderElector
from shared.runtime.reads import GET, LIST, Reads
from shared.runtime.writes import Writer

NOW = datetime(2026, 12, 5, 10, 0, 0, tzinfo=UTC)
NS = "ns"
COLLECTION = SERVICES.path(NS)
STALE = {"preconditions": {"resourceVersion": "0"}}


def api() -> MemApi:
    return MemApi(clock=lambda: NOW)


def service(name: str = "a", **metadata: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, **metadata},
        "spec": {"ports": [{"port": 80}]},
    }


def at(name: str = "a") -> str:
    return SERVICES.path(NS, name)


async def refused(call: Awaitable[Any]) -> tuple[int, str]:
    with pytest.raises(ApiError) as raised:
        await call
    return raised.value.status, raised.value.reason


async def read_all(events: Any, count: int) -> list[tuple[str, str, str]]:
    """The first ``count`` events of a watch: (type, name, resourceVersion)."""
    seen = []
    async for kind, obj in events:
        seen.append((kind, obj["metadata"].get("name", ""), obj["metadata"]["resourceVersion"]))
        if len(seen) == count:
            break
    await events.aclose()
    return seen


# --- paths and selectors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "parsed"),
    [
        ("/api/v1/pods", ("/api/v1", "pods", "", "", "")),
        ("/api/v1/namespaces/ns/pods", ("/api/v1", "pods", "ns", "", "")),
        ("/api/v1/namespaces/ns/pods/p", ("/api/v1", "pods", "ns", "p", "")),
        ("/apis/g.io/v1/namespaces/ns/things/t/status", ("/apis/g.io/v1", "things", "ns", "t", "status")),
        ("/apis/g.io/v1/things/t", ("/apis/g.io/v1", "things", "", "t", "")),
        ("/api/v1/namespaces", ("/api/v1", "namespaces", "", "", "")),
        ("/api/v1/namespaces/ns", ("/api/v1", "namespaces", "", "ns", "")),
    ],
)
def test_a_path_names_its_collection_namespace_name_and_subresource(
    path: str, parsed: tuple[str, ...]
) -> None:
    target = parse(path)
    assert (target.prefix, target.plural, target.namespace, target.name, target.subresource) == parsed


POD = {"metadata": {"name": "p", "labels": {"app": "db", "tier": "x"}}, "spec": {"nodeName": "n1"}}


@pytest.mark.parametrize(
    ("labels", "fields", "selected"),
    [
        ("", "", True),
        ("app=db", "", True),
        ("app==db,tier=x", "", True),
        ("app!=db", "", False),
        ("app in (db, web)", "", True),
        ("app notin (db)", "", False),
        ("tier", "", True),
        ("!tier", "", False),
        ("", "spec.nodeName=n1", True),
        ("", "spec.nodeName!=", True),
        ("", "status.phase!=Failed,metadata.name=p", True),
        ("", "metadata.name=q", False),
    ],
)
def test_label_and_field_selectors_select_as_the_api_does(labels: str, fields: str, selected: bool) -> None:
    assert selects(labels, fields, POD) is selected


# --- writes ------------------------------------------------------------------------------------------


async def test_every_write_bumps_one_global_resource_version() -> None:
    memory = api()
    first = await memory.create(COLLECTION, service("a"))
    second = await memory.create(CONFIGMAPS.path(NS), {"metadata": {"name": "c"}, "data": {}})
    patched = await memory.patch(at("a"), {"metadata": {"labels": {"x": "1"}}}, "merge")
    versions = [int(o["metadata"]["resourceVersion"]) for o in (first, second, patched)]
    assert versions == sorted(set(versions))
    listed = await memory.list(COLLECTION)
    assert listed["metadata"]["resourceVersion"] == memory.resource_version == str(versions[-1])


async def test_a_write_that_changes_nothing_is_no_write() -> None:
    memory = api()
    created = await memory.create(COLLECTION, service())
    again = await memory.patch(at(), {"spec": {"ports": [{"port": 80}]}}, "merge")
    assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


@pytest.mark.parametrize(
    ("body", "name"),
    [
        (service("named"), "named"),
        ({"metadata": {"generateName": "web-"}, "spec": {}}, "web-bbbbb"),
    ],
)
async def test_a_create_gets_a_uid_a_creation_time_a_generation_and_a_name(body: Obj, name: str) -> None:
    created = await api().create(COLLECTION, body)
    metadata = created["metadata"]
    assert (metadata["name"], metadata["namespace"], metadata["generation"]) == (name, NS, 1)
    assert (bool(metadata["uid"]), metadata["creationTimestamp"]) == (True, "2026-12-05T10:00:00Z")


async def test_generate_name_tries_another_suffix_on_a_collision() -> None:
    names = iter(["web-taken", "web-taken", "web-free"])
    memory = MemApi(generate=lambda prefix: next(names))
    await memory.create(COLLECTION, {"metadata": {"generateName": "web-"}})
    created = await memory.create(COLLECTION, {"metadata": {"generateName": "web-"}})
    assert created["metadata"]["name"] == "web-free"


@pytest.mark.parametrize(
    ("call", "status", "reason"),
    [
        (lambda m: m.create(COLLECTION, {"metadata": {}}), 422, "Invalid"),  # neither name nor generateName
        (lambda m: m.create(COLLECTION, service("a")), 409, "AlreadyExists"),
        (lambda m: m.request("GET", at("absent")), 404, "NotFound"),
        (lambda m: m.patch(at("absent"), {}, "merge"), 404, "NotFound"),
        (lambda m: m.replace(at("absent"), service("absent")), 404, "NotFound"),
        (lambda m: m.request("DELETE", at("absent")), 404, "NotFound"),
        (lambda m: m.delete(at(), uid="another"), 409, "Conflict"),
        (
            lambda m: m.request("DELETE", at(), body=STALE),
            409,
            "Conflict",
        ),
        (lambda m: m.replace(at(), service("a", resourceVersion="0")), 409, "Conflict"),
        (lambda m: m.patch(at(), {"metadata": {"resourceVersion": "0"}}, "merge"), 409, "Conflict"),
        (lambda m: m.patch(at(), [{"op": "test", "path": "/metadata/uid", "value": "x"}]), 422, "Invalid"),
        (lambda m: m.patch(at(), [{"op": "remove", "path": "/spec/absent"}]), 422, "Invalid"),
        (lambda m: m.patch(at(), {"metadata": {"uid": "another"}}, "merge"), 422, "Invalid"),
        (lambda m: m.replace(at(), service("b")), 400, "BadRequest"),  # the body names another object
        (lambda m: m.create(COLLECTION, service("b", namespace="other")), 400, "BadRequest"),
    ],
)
async def test_what_the_api_refuses(
    call: Callable[[MemApi], Awaitable[Any]], status: int, reason: str
) -> None:
    memory = api()
    await memory.create(COLLECTION, service("a"))
    assert await refused(call(memory)) == (status, reason)
    assert await memory.get(at("absent")) is None, "get: 404 is None, as Kube's"


@pytest.mark.parametrize(
    ("patch", "kind", "generation"),
    [
        ({"spec": {"ports": [{"port": 81}]}}, "merge", 2),
        ({"metadata": {"labels": {"a": "b"}}}, "merge", 1),
        ({"metadata": {"annotations": {"a": "b"}}, "spec": {"ports": [{"port": 80}]}}, "strategic", 1),
        ([{"op": "replace", "path": "/spec/ports/0/port", "value": 82}], "json", 2),
        ({"status": {"loadBalancer": {}}}, "merge", 1),
    ],
)
async def test_generation_follows_spec_changes_only(patch: Any, kind: Any, generation: int) -> None:
    memory = api()
    await memory.create(COLLECTION, service())
    assert (await memory.patch(at(), patch, kind))["metadata"]["generation"] == generation


@pytest.mark.parametrize(
    ("path", "patch", "spec_port", "status"),
    [
        (at(), {"spec": {"ports": [{"port": 81}]}, "status": {"x": 1}}, 81, {"x": 0}),  # main: status kept
        (at() + "/status", {"spec": {"ports": [{"port": 81}]}, "status": {"x": 1}}, 80, {"x": 1}),
    ],
)
async def test_the_status_subresource_and_the_main_resource_write_apart(
    path: str, patch: Obj, spec_port: int, status: Obj
) -> None:
    memory = api()
    created = await memory.create(COLLECTION, {**service(), "status": {"ignored": True}})
    assert "status" not in created, "a create cannot set status"
    await memory.patch(at() + "/status", {"status": {"x": 0}}, "merge")
    written = await memory.patch(path, patch, "merge")
    assert (written["spec"]["ports"][0]["port"], written["status"]) == (spec_port, status)


async def test_an_update_without_a_version_is_unconditional_and_with_the_current_one_applies() -> None:
    memory = api()
    created = await memory.create(COLLECTION, service())
    body = {**created, "spec": {"ports": [{"port": 90}]}}
    replaced = await memory.replace(at(), body)
    unversioned = service()
    unversioned["spec"] = {"ports": [{"port": 91}]}
    again = await memory.replace(at(), unversioned)
    assert (replaced["spec"]["ports"][0]["port"], again["spec"]["ports"][0]["port"]) == (90, 91)
    assert again["metadata"]["uid"] == created["metadata"]["uid"], "system fields are kept"


@pytest.mark.parametrize(
    ("finalizers", "after_delete"),
    [
        ([], None),  # gone at once
        (["f"], "marked"),  # marked, kept until its last finalizer goes
    ],
)
async def test_finalizers_hold_a_deleted_object_until_the_last_goes(
    finalizers: list[str], after_delete: str | None
) -> None:
    memory = api()
    created = await memory.create(COLLECTION, service(finalizers=finalizers))
    assert await memory.delete(at(), uid=created["metadata"]["uid"]) is True
    stored = memory.stored(at())
    if after_delete is None:
        assert stored is None
        assert await memory.delete(at()) is False, "already gone"
        return
    assert stored is not None
    assert stored["metadata"]["deletionTimestamp"] == "2026-12-05T10:00:00Z"
    assert stored["metadata"]["generation"] == 2, "marking a deletion bumps the generation"
    assert await refused(memory.patch(at(), {"metadata": {"finalizers": ["f", "g"]}}, "merge")) == (
        422,
        "Invalid",
    ), "no new finalizer on a deleting object"
    final = await memory.patch(at(), [{"op": "remove", "path": "/metadata/finalizers/0"}])
    assert (bool(final["metadata"]["deletionTimestamp"]), final["metadata"]["finalizers"]) == (True, [])
    assert memory.stored(at()) is None, "the last finalizer went: gone"


async def test_apply_creates_or_merges() -> None:
    memory = api()
    created = await memory.apply(at(), {**service(), "metadata": {"name": "a", "namespace": NS}}, "test")
    merged = await memory.apply(at(), {"metadata": {"name": "a", "labels": {"l": "1"}}}, "test")
    assert created["metadata"]["generation"] == merged["metadata"]["generation"] == 1
    assert (merged["metadata"]["labels"], merged["spec"]) == ({"l": "1"}, created["spec"])
    assert memory.requests[-1].params == {"fieldManager": "test", "force": "true"}


# --- lists and watches -------------------------------------------------------------------------------


async def test_a_list_pages_in_key_order_from_one_snapshot_and_filters() -> None:
    memory = api()
    for name in ("c", "a", "b"):
        await memory.create(COLLECTION, service(name, labels={"keep": str(name != "b")}))
    await memory.create(SERVICES.path("other"), service("z"))
    first = await memory.list(COLLECTION, limit=1)
    await memory.create(COLLECTION, service("aa"))  # after the snapshot
    second = await memory.list(COLLECTION, limit=5, continue_=first["metadata"]["continue"])
    assert [o["metadata"]["name"] for o in first["items"] + second["items"]] == ["a", "b", "c"]
    assert second["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    assert (first["kind"], first["apiVersion"]) == ("ServiceList", "v1")
    selected = await memory.list(COLLECTION, label_selector="keep=True")
    assert [o["metadata"]["name"] for o in selected["items"]] == ["a", "c"]
    everywhere = await memory.list(SERVICES.path())
    assert len(everywhere["items"]) == 5
    assert await refused(memory.list(COLLECTION, continue_="stale")) == (410, "Expired")
    future = str(int(memory.resource_version) + 1)
    assert await refused(
        memory.list(COLLECTION, resource_version=future, resource_version_match="NotOlderThan")
    ) == (
        504,
        "Timeout",
    )


async def test_every_open_watch_gets_every_change_in_order() -> None:
    memory = api()
    since = memory.resource_version
    watches = [memory.watch(COLLECTION, resource_version=since) for _ in range(2)]
    readers = [asyncio.create_task(read_all(w, 4)) for w in watches]
    await asyncio.sleep(0)
    created = await memory.create(COLLECTION, service(finalizers=["f"]))
    patched = await memory.patch(at(), {"metadata": {"labels": {"a": "b"}}}, "merge")
    await memory.delete(at())
    final = await memory.patch(at(), [{"op": "remove", "path": "/metadata/finalizers"}])
    expected = [
        ("ADDED", "a", created["metadata"]["resourceVersion"]),
        ("MODIFIED", "a", patched["metadata"]["resourceVersion"]),
        ("MODIFIED", "a", str(int(patched["metadata"]["resourceVersion"]) + 1)),
        ("DELETED", "a", final["metadata"]["resourceVersion"]),
    ]
    assert await asyncio.gather(*readers) == [expected, expected]


@pytest.mark.parametrize(
    ("since", "expected"),
    [
        ("", ["ADDED a", "ADDED b"]),  # the current objects first
        ("0", ["ADDED a", "ADDED b"]),
        ("after-a", ["ADDED b"]),  # the history since that version
    ],
)
async def test_a_watch_resumes_from_a_version(since: str, expected: list[str]) -> None:
    memory = api()
    created = await memory.create(COLLECTION, service("a"))
    await memory.create(COLLECTION, service("b"))
    version = created["metadata"]["resourceVersion"] if since == "after-a" else since
    seen = await read_all(memory.watch(COLLECTION, resource_version=version), len(expected))
    assert [f"{kind} {name}" for kind, name, _ in seen] == expected


@pytest.mark.parametrize("history", ["compacted", "overflowed"])
async def test_a_watch_from_a_version_older_than_the_history_is_gone(history: str) -> None:
    memory = MemApi(history=1)
    created = await memory.create(COLLECTION, service("a"))
    await memory.create(COLLECTION, service("b"))
    if history == "compacted":
        memory.compact()
    else:
        await memory.create(COLLECTION, service("c"))
    events = memory.watch(COLLECTION, resource_version=created["metadata"]["resourceVersion"])
    [(kind, status)] = [event async for event in events]
    assert (kind, status["code"], status["reason"]) == ("ERROR", 410, "Expired")


async def test_a_selector_watch_sees_an_object_leave_and_enter_its_selection() -> None:
    memory = api()
    await memory.create(COLLECTION, service(labels={"on": "yes"}))
    events = memory.watch(COLLECTION, resource_version=memory.resource_version, label_selector="on=yes")
    reader = asyncio.create_task(read_all(events, 2))
    await asyncio.sleep(0)
    await memory.patch(at(), {"metadata": {"labels": {"on": "no"}}}, "merge")
    await memory.patch(at(), {"metadata": {"labels": {"other": "x"}}}, "merge")  # not selected: unseen
    await memory.patch(at(), {"metadata": {"labels": {"on": "yes"}}}, "merge")
    assert [kind for kind, _, _ in await reader] == ["DELETED", "ADDED"]


async def test_a_watch_ends_with_a_bookmark_after_its_timeout_and_when_ended() -> None:
    memory = api()
    timed = [event async for event in memory.watch(COLLECTION, timeout_seconds=0)]
    assert timed == [("BOOKMARK", {"metadata": {"resourceVersion": "0"}})]
    events = memory.watch(COLLECTION)
    reader = asyncio.create_task(read_all(events, 99))
    await asyncio.sleep(0)
    assert memory.open_watches(COLLECTION) == 1
    memory.end_watches()
    assert await reader == []
    assert memory.open_watches() == 0


# --- what tests see: the requests, faults and the world as given ------------------------------------


async def test_every_request_is_recorded_with_its_verb_before_it_is_answered() -> None:
    memory = api()
    await memory.create(COLLECTION, service())
    await memory.get(at())
    await memory.list(COLLECTION)
    await memory.patch(at() + "/status", {"status": {}}, "merge")
    await memory.replace(at(), service())
    await memory.delete(at())
    await memory.delete(at())  # refused 404: recorded all the same
    await read_all(memory.watch(COLLECTION, timeout_seconds=0), 1)
    assert [(r.verb, r.target.name, r.target.subresource) for r in memory.requests] == [
        ("create", "", ""),
        ("get", "a", ""),
        ("list", "", ""),
        ("patch", "a", "status"),
        ("update", "a", ""),
        ("delete", "a", ""),
        ("delete", "a", ""),
        ("watch", "", ""),
    ]
    assert memory.requests[3].patch_kind == "merge"


async def test_a_fault_refuses_the_requests_it_matches_after_they_are_recorded() -> None:
    memory = api()
    await memory.create(COLLECTION, service())
    fault = memory.refuse(ApiError(500, "InternalError", "boom"), verb="patch", name="a", times=1)
    assert await refused(memory.patch(at(), {}, "merge")) == (500, "InternalError")
    assert fault not in memory.faults, "spent"
    await memory.patch(at(), {}, "merge")
    memory.refuse(TimeoutError(), verb="get")
    with pytest.raises(TimeoutError):
        await memory.get(at())
    assert [r.verb for r in memory.requests] == ["create", "patch", "patch", "get"]


async def test_admission_refuses_after_a_generated_name_was_drawn_and_before_anything_is_stored() -> None:
    memory = api()
    refusal = ApiError(403, "Forbidden", "exceeded quota")
    memory.admission.append(lambda request, obj: refusal if obj["metadata"]["name"] == "web-bbbbb" else None)
    assert await refused(memory.create(COLLECTION, {"metadata": {"generateName": "web-"}})) == (
        403,
        "Forbidden",
    )
    created = await memory.create(COLLECTION, {"metadata": {"generateName": "web-"}})
    assert created["metadata"]["name"] == "web-bbbbc", "the refused create used its name"
    assert [r.name for r in memory.requests] == ["", "web-bbbbc"], "a name once answered"
    assert (await memory.list(COLLECTION))["items"] == [created]


async def test_a_seeded_object_keeps_what_it_was_given_and_moves_the_counter() -> None:
    memory = api()
    given = {**service(namespace=NS, uid="u-1", resourceVersion="41"), "status": {"s": 1}}
    seeded = memory.seed(SERVICES, given)
    assert (seeded["metadata"]["uid"], seeded["status"]) == ("u-1", {"s": 1})
    created = await memory.create(COLLECTION, service("b"))
    assert created["metadata"]["resourceVersion"] == "42"
    assert memory.remove(at()) is not None
    assert memory.stored(at()) is None
    assert memory.requests == [Request("POST", COLLECTION, {}, service("b"), "application/json")]


# --- the runtime's own code over it ---------------------------------------------------------------


async def test_an_informer_lists_then_follows_the_writers_writes() -> None:
    memory = api()
    memory.seed(SERVICES, service("seeded", namespace=NS))
    store = Store()
    informer = Informer(memory, SERVICES, store=store, namespace=NS)
    changes: list[tuple[str | None, str | None]] = []
    informer.add_handler(
        lambda old, new: changes.append(
            ((old or {}).get("metadata", {}).get("name"), (new or {}).get("metadata", {}).get("name"))
        )
    )
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 5)
        await memory.settled()
        writer = Writer(memory, lambda _: informer)
        created = await writer.create(SERVICES, service("b", namespace=NS))
        await writer.patch_status(SERVICES, created, [{"op": "add", "path": "/status", "value": {"x": 1}}])
        await memory.create(COLLECTION, service("by-another"))
        await memory.settled()
        assert sorted(name for _, name in list(store.keys())) == ["b", "by-another", "seeded"]
        assert (store.get((NS, "b")) or {})["status"] == {"x": 1}
        assert changes == [(None, "seeded"), (None, "b"), ("b", "b"), (None, "by-another")], (
            "our own writes remembered once, their echoes dropped"
        )
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_reads_and_the_leader_elector_run_over_it() -> None:
    memory = api()
    memory.seed(CONFIGMAPS, {"metadata": {"name": "c", "namespace": NS}, "data": {"k": "v"}})
    reads = Reads(memory, CONFIGMAPS, frozenset({GET, LIST}))
    assert ((await reads.get(NS, "c")) or {})["data"] == {"k": "v"}
    assert [o["metadata"]["name"] for o in (await reads.list(NS))["items"]] == ["c"]
    elector = LeaderElector(memory, NS, "lock", "me")
    assert await elector._try_acquire_or_renew() is True
    rival = LeaderElector(memory, NS, "lock", "them")
    assert await rival._try_acquire_or_renew() is False
    lease = memory.stored(LEASES.path(NS, "lock")) or {}
    assert lease["spec"]["holderIdentity"] == "me"
    assert [r.verb for r in memory.requests[-3:]] == ["get", "create", "get"]
