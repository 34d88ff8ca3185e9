"""shared.events.Recorder on the real API server: its events.k8s.io/v1 Event passes the API's
validation, a repeat patches the Event's series (which the API accepts, and ``kubectl describe``
shows as ``(x3 over ...)``), and another note is another Event."""

from __future__ import annotations

from typing import Final

from hack.devcluster import ClusterInfo
from harness.manifests import kubectl
from shared.events import Recorder
from shared.kube import Kube, Obj
from shared.resources import CONFIGMAPS, EVENTS_V1
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
