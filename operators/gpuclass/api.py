"""The GPUClass operator's API: its own kind, defined once (group, version, kind, ``GPUCLASSES``).

Pure (no client, no I/O): the pass, the glue, the tests, the benchmarks and the tools all name the
kind from here. Every other kind it touches is Kubernetes' or the platform's (``shared.resources``),
but for Kubernetes' DRA kinds, which only this operator reads (here, beside the kind they feed).

Decides: the coordinates of ``gpu.cozystack.io/v1alpha1`` ``GPUClass`` and of the
``resource.k8s.io/v1`` kinds a class of DRA devices is counted from. Does not: read or write them.
"""

from __future__ import annotations

from typing import Final

from shared.resources import Resource

GROUP: Final = "gpu.cozystack.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
GPUCLASS_KIND: Final = "GPUClass"
# Cluster-scoped: a class is the hoster's, and every authenticated user reads it.
GPUCLASSES: Final = Resource(API_VERSION, "gpuclasses", namespaced=False, kind=GPUCLASS_KIND)

# Dynamic Resource Allocation (GA in Kubernetes 1.34): a GPUClass may name a DeviceClass; its units
# are the devices of ResourceSlices that the DeviceClass selects, less those ResourceClaims hold.
DRA_API_VERSION: Final = "resource.k8s.io/v1"
DEVICE_CLASSES: Final = Resource(DRA_API_VERSION, "deviceclasses", namespaced=False, kind="DeviceClass")
RESOURCE_SLICES: Final = Resource(DRA_API_VERSION, "resourceslices", namespaced=False, kind="ResourceSlice")
RESOURCE_CLAIMS: Final = Resource(DRA_API_VERSION, "resourceclaims", kind="ResourceClaim")
# Taints a hoster puts on devices without the driver (GA in Kubernetes 1.37): a tainted device is
# not counted.
DEVICE_TAINT_RULES: Final = Resource(
    DRA_API_VERSION, "devicetaintrules", namespaced=False, kind="DeviceTaintRule"
)
# KubeVirt's cluster instance types: a whole-VM shape may name one (read on a pass, never watched).
CLUSTER_INSTANCETYPES: Final = Resource(
    "instancetype.kubevirt.io/v1beta1",
    "virtualmachineclusterinstancetypes",
    namespaced=False,
    kind="VirtualMachineClusterInstancetype",
)
