"""shared.events.Recorder on the real API server: its events.k8s.io/v1 Event passes the API's
validation, a repeat patches the Event's series (which the API accepts, and ``kubectl describe``
shows as ``(x3 over ...)``), and another note is another Event."""

from __future__ import annotations

from typing import Final

from hack.devcluster import ClusterInfo
from harness.manifests import kubectl
from shared.events import Recorder
from shared.kube import Kube, Obj
from shared.resources import CONFIGMAPS, EVENTS_V1, NODES
from shared.runtime.writes import Writer

CONTROLLER: Final = "cozystack.io/test-recorder"


async def events_about(kube: Kube, regarding: Obj) -> list[Obj]:
    metadata = regarding["metadata"]
    found = (await kube.list(EVENTS_V1.path(metadata["namespace"])))["items"]
    return [e for e in found if (e.get("regarding") or {}).get("uid") == metadata["uid"]]


async def test_a_repeat_is_the_series_of_one_event(kube: Kube, cluster: ClusterInfo, namespace: str) -> None:
    regarding = await kube.create(
        CONFIGMAPS.path(namespace),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "subject"}, "data": {}},
    )
    recorder = Recorder(Writer(kube, lambda resource: None), CONTROLLER, "test-pod-0")

    async def record(note: str) -> str:
        return await recorder.record(
            regarding, type_="Warning", reason="ClaimInUse", action="Claim", note=note
        )

    assert [await record("claim x is in use by Service y") for _ in range(3)] == [
        "created",
        "series",
        "series",
    ]
    [event] = await events_about(kube, regarding)
    assert event["series"]["count"] == 3
    assert event["series"]["lastObservedTime"]
    assert (event["reportingController"], event["reportingInstance"]) == (CONTROLLER, "test-pod-0")
    assert (event["type"], event["reason"], event["action"]) == ("Warning", "ClaimInUse", "Claim")

    code, out, err = await kubectl(cluster, "-n", namespace, "describe", "configmap", "subject")
    assert code == 0, err
    events = out[out.index("Events:") :]
    assert "ClaimInUse" in events
    assert "(x3 over" in events, events

    assert await record("claim x is in use by Service z") == "created", "a note is immutable: a new Event"
    assert len(await events_about(kube, regarding)) == 2


async def test_an_event_about_a_cluster_scoped_object_is_in_default(
    kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    """A cluster-scoped object (a GPUClass; here a Node, which every API server serves) has no
    namespace: its Events go to ``default`` (the API refuses them elsewhere), with a regarding
    reference that has none, and ``kubectl describe`` of the object shows them."""
    name = f"{namespace}-events"
    regarding = await kube.create(
        NODES.path(), {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
    )
    try:
        writer = Writer(kube, lambda resource: None)
        recorder = Recorder(writer, CONTROLLER, "test-pod-0")
        recorded = await recorder.record(
            regarding, type_="Warning", reason="Exhausted", action="Count", note="none"
        )
        assert recorded == "created"
        found = (await kube.list(EVENTS_V1.path("default")))["items"]
        [event] = [e for e in found if (e.get("regarding") or {}).get("uid") == regarding["metadata"]["uid"]]
        assert event["regarding"].get("namespace") in (None, "")
        code, out, err = await kubectl(cluster, "describe", "node", name)
        assert code == 0, err
        assert "Exhausted" in out[out.index("Events:") :], out
    finally:
        await kube.delete(NODES.path(name=name))
