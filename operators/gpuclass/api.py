"""The GPUClass operator's API: its own kind, defined once (group, version, kind, ``GPUCLASSES``).

Pure (no client, no I/O): the pass, the glue, the tests, the benchmarks and the tools all name the
kind from here. Every other kind it touches is Kubernetes' or the platform's (``shared.resources``).

Decides: the coordinates of ``gpu.cozystack.io/v1alpha1`` ``GPUClass``. Does not: read or write it.
"""

from __future__ import annotations

from typing import Final

from shared.resources import Resource

GROUP: Final = "gpu.cozystack.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
GPUCLASS_KIND: Final = "GPUClass"
# Cluster-scoped: a class is the hoster's, and every authenticated user reads it.
GPUCLASSES: Final = Resource(API_VERSION, "gpuclasses", namespaced=False)
