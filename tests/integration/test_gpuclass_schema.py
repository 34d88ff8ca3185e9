"""The GPUClass CRD rejects at the API what the schema can reject: the operator never sees it."""

from __future__ import annotations

from typing import Any

import pytest

from harness.manifests import apply_all, load
from operators.gpuclass.api import GPUCLASSES
from shared.kube import ApiError, Kube, Obj

# The refusal of a malformed resource name says what the name must look like (no regex).
RESOURCE_NAME_SHAPE = "resourceName must look like vendor.com/NAME"
# The refusal of a class naming both or neither kind of GPU.
EXACTLY_ONE = "set exactly one of resourceName"
BIG_VM: dict[str, Any] = {"name": "g2-large", "units": 2, "cpu": "32", "memory": "256Gi"}


@pytest.fixture(scope="module")
async def gpuclass_crd(kube: Kube) -> None:
    await apply_all(kube, load("config/crd/gpuclass/gpu.cozystack.io_gpuclasses.yaml"))


def gpu_class(name: str, **spec: Any) -> Obj:
    return {
        "apiVersion": "gpu.cozystack.io/v1alpha1",
        "kind": "GPUClass",
        "metadata": {"name": name},
        "spec": spec,
    }


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({}, EXACTLY_ONE),
        ({"resourceName": "nvidia.com/X", "deviceClassName": "h200"}, EXACTLY_ONE),
        ({"deviceClassName": "H200"}, "deviceClassName must be a DeviceClass's name"),
        ({"resourceName": "nvidia.com/X", "vmShapes": [{**BIG_VM, "name": "Big"}]}, "must be a DNS label"),
        (
            {"resourceName": "nvidia.com/X", "vmShapes": [{**BIG_VM, "cpu": "lots"}]},
            "cpu must be a non-negative",
        ),
        ({"resourceName": "nvidia.com/X", "vmShapes": [{**BIG_VM, "memory": "-1Gi"}]}, "memory must be"),
        (
            {"resourceName": "nvidia.com/X", "vmShapes": [{**BIG_VM, "units": 0}]},
            "should be greater than or equal to 1",
        ),
        ({"resourceName": "nvidia.com/X", "vmShapes": [{"name": "bare"}]}, "a VM shape needs units"),
        (
            {"resourceName": "nvidia.com/X", "vmShapes": [{**BIG_VM, "instancetype": "u1.h200x2"}]},
            "either an instancetype or its cpu and memory",
        ),
        ({"resourceName": "gpu"}, RESOURCE_NAME_SHAPE),  # no domain prefix: not an extended resource
        ({"resourceName": "kubernetes.io/gpu"}, "not in the kubernetes.io domain"),
        ({"resourceName": "example.kubernetes.io/gpu"}, "not in the kubernetes.io domain"),
        ({"resourceName": "requests.example.com/gpu"}, "must not start with 'requests.'"),
        ({"resourceName": "NVIDIA.com/GH100"}, RESOURCE_NAME_SHAPE),  # the prefix is lower case
        ({"resourceName": "nvidia.com/" + "A" * 64}, RESOURCE_NAME_SHAPE),  # name part over 63
        ({"resourceName": "nvidia.com/-bad"}, RESOURCE_NAME_SHAPE),
        (
            {"resourceName": "nvidia.com/X", "tolerations": [{"key": "k", "operator": "Gt", "value": "1"}]},
            "a toleration's operator must be Equal or Exists",
        ),
        (
            {
                "resourceName": "nvidia.com/X",
                "tolerations": [{"key": "k", "operator": "Exists", "value": "v"}],
            },
            "operator Exists must not have a value",
        ),
        (
            {"resourceName": "nvidia.com/X", "tolerations": [{"operator": "Equal", "value": "v"}]},
            "empty key must use operator Exists",
        ),
        ({"resourceName": "nvidia.com/X", "vmSizes": [0, 1]}, "each of vmSizes must be at least 1"),
        ({"resourceName": "nvidia.com/X", "vmSizes": [2, 2]}, "vmSizes must not list a size twice"),
        ({"resourceName": "nvidia.com/X", "vmSizes": []}, "vmSizes needs at least one size"),
        ({"resourceName": "nvidia.com/X", "vmSizes": list(range(1, 10))}, "must have at most 8 items"),
    ],
)
async def test_the_schema_refuses(kube: Kube, gpuclass_crd: None, spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ApiError) as refused:
        await kube.create(GPUCLASSES.path(), gpu_class("refused", **spec))
    assert refused.value.status == 422
    assert message in refused.value.message
    assert "^[a-z0-9]" not in refused.value.message  # never the raw regex


@pytest.mark.parametrize(
    "resource",
    ["nvidia.com/GH100_H200_SXM_141GB", "nvidia.com/A10-24Q", "example.com/fpga.v2", "a.b.c/X"],
)
async def test_the_schema_accepts_device_plugin_names(kube: Kube, gpuclass_crd: None, resource: str) -> None:
    created = await kube.create(GPUCLASSES.path(), gpu_class("accepted", resourceName=resource))
    await kube.delete(GPUCLASSES.path(name=created["metadata"]["name"]))


@pytest.mark.parametrize(
    ("sizes", "stored"),
    [(None, [1, 2, 4, 8]), ([16, 1, 3], [16, 1, 3]), (list(range(1, 9)), list(range(1, 9)))],
)
async def test_vm_sizes_default_and_keep_their_order(
    kube: Kube, gpuclass_crd: None, sizes: list[int] | None, stored: list[int]
) -> None:
    spec: dict[str, Any] = {"resourceName": "nvidia.com/X"}
    if sizes is not None:
        spec["vmSizes"] = sizes
    created = await kube.create(GPUCLASSES.path(), gpu_class("sizes", **spec))
    try:
        assert created["spec"]["vmSizes"] == stored
    finally:
        await kube.delete(GPUCLASSES.path(name="sizes"))


async def test_resource_name_is_immutable(kube: Kube, gpuclass_crd: None) -> None:
    await kube.create(GPUCLASSES.path(), gpu_class("immutable", resourceName="nvidia.com/A"))
    try:
        with pytest.raises(ApiError) as refused:
            await kube.patch(
                GPUCLASSES.path(name="immutable"), {"spec": {"resourceName": "nvidia.com/B"}}, "merge"
            )
        assert "resourceName is immutable" in refused.value.message
        # Everything else may change.
        await kube.patch(GPUCLASSES.path(name="immutable"), {"spec": {"displayName": "A, renamed"}}, "merge")
    finally:
        await kube.delete(GPUCLASSES.path(name="immutable"))


async def test_a_dra_class_and_whole_vm_shapes_are_accepted(kube: Kube, gpuclass_crd: None) -> None:
    shapes = [
        BIG_VM,
        {"name": "small", "units": 1, "cpu": "8", "memory": "64Gi"},
        {"name": "bare", "units": 4},
        {"name": "typed", "instancetype": "u1.h200x2"},
    ]
    created = await kube.create(
        GPUCLASSES.path(), gpu_class("dra", deviceClassName="gpu.nvidia.com", vmShapes=shapes)
    )
    try:
        assert created["spec"]["vmShapes"] == shapes
        # A class cannot switch kinds, nor change its DeviceClass.
        for patch, message in (
            ({"spec": {"deviceClassName": None, "resourceName": "nvidia.com/X"}}, "cannot switch"),
            ({"spec": {"deviceClassName": "other"}}, "deviceClassName is immutable"),
        ):
            with pytest.raises(ApiError) as refused:
                await kube.patch(GPUCLASSES.path(name="dra"), patch, "merge")
            assert message in refused.value.message
    finally:
        await kube.delete(GPUCLASSES.path(name="dra"))
