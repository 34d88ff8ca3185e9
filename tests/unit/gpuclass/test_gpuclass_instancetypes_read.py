"""KubeVirt cluster instance types are read as the KubeVirt CR is: on a pass, never required to be served."""

from __future__ import annotations

from typing import Any, cast

import pytest

from harness.memapi import MemApi
from operators.gpuclass.api import CLUSTER_INSTANCETYPES
from operators.gpuclass.controller import Reconciler
from operators.gpuclass.inventory import Inventory
from operators.gpuclass.settings import Settings
from shared.kube import ApiError, ApiTimeoutError, Obj
from shared.runtime.reads import LIST, Reads
from tests.gpuclass_builders import H200, make_class

NAMED = make_class("h200", H200, vm_shapes=[{"name": "g2", "instancetype": "g2.large"}])
UNNAMED = make_class("h200", H200, vm_shapes=[{"name": "g2", "units": 2, "cpu": "8"}])
G2: Obj = {"metadata": {"name": "g2.large"}, "spec": {"cpu": {"guest": 8}, "memory": {"guest": "64Gi"}}}


def reconciler(api: MemApi) -> Reconciler:
    unused = cast(Any, None)
    reads = Reads(api, CLUSTER_INSTANCETYPES, frozenset({LIST}))
    return Reconciler(unused, unused, unused, unused, Inventory(), unused, Settings(), instancetypes=reads)


def lists(api: MemApi) -> int:
    return sum(1 for r in api.requests if r.verb == "list")


async def test_no_shape_naming_one_reads_nothing() -> None:
    api = MemApi()
    assert await reconciler(api)._read_instancetypes([UNNAMED]) == {}
    assert lists(api) == 0


@pytest.mark.parametrize(
    ("failure", "kept"),
    [
        (ApiError(404, "NotFound", "the server could not find the requested resource"), False),
        (ApiError(403, "Forbidden", "forbidden"), False),
        (ApiError(503, "ServiceUnavailable", "etcd"), True),
        (ApiTimeoutError("no answer"), True),
    ],
)
async def test_not_served_is_none_and_no_answer_keeps_the_last_read(
    failure: BaseException, kept: bool
) -> None:
    api = MemApi()
    g2 = api.seed(CLUSTER_INSTANCETYPES, G2)  # as the API holds it: with its uid and version
    glue = reconciler(api)
    assert await glue._read_instancetypes([NAMED]) == {"g2.large": g2}
    api.refuse(failure, verb="list")
    assert await glue._read_instancetypes([NAMED]) == ({"g2.large": g2} if kept else {})
    assert lists(api) == 2
