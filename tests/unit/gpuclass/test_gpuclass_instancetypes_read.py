"""KubeVirt cluster instance types are read as the KubeVirt CR is: on a pass, never required to be served."""

from __future__ import annotations

from typing import Any, cast

import pytest

from operators.gpuclass.controller import Reconciler
from operators.gpuclass.inventory import Inventory
from operators.gpuclass.settings import Settings
from shared.kube import ApiError, ApiTimeoutError, Obj
from shared.runtime.reads import Reads
from tests.gpuclass_builders import H200, make_class

NAMED = make_class("h200", H200, vm_shapes=[{"name": "g2", "instancetype": "g2.large"}])
UNNAMED = make_class("h200", H200, vm_shapes=[{"name": "g2", "units": 2, "cpu": "8"}])
G2: Obj = {"metadata": {"name": "g2.large"}, "spec": {"cpu": {"guest": 8}, "memory": {"guest": "64Gi"}}}


class FakeReads:
    """Answers LISTs in turn: an object list, or raises the error given."""

    def __init__(self, *answers: Obj | BaseException) -> None:
        self.answers = list(answers)
        self.lists = 0

    async def list(self, namespace: str | None = None) -> Obj:
        self.lists += 1
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


def reconciler(reads: FakeReads) -> Reconciler:
    unused = cast(Any, None)
    return Reconciler(
        unused, unused, unused, unused, Inventory(), unused, Settings(), instancetypes=cast(Reads, reads)
    )


async def test_no_shape_naming_one_reads_nothing() -> None:
    reads = FakeReads()
    assert await reconciler(reads)._read_instancetypes([UNNAMED]) == {}
    assert reads.lists == 0


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
    reads = FakeReads({"items": [G2]}, failure)
    glue = reconciler(reads)
    assert await glue._read_instancetypes([NAMED]) == {"g2.large": G2}
    assert await glue._read_instancetypes([NAMED]) == ({"g2.large": G2} if kept else {})
