"""Read the KubeVirt CR (glue): one GET, or one LIST when no name is set; never a watch.

Maps what the API answers to a read result for the pure ``kubevirt`` module: 404 (the kind is not
served, or the CR is absent) or an empty namespace is ``NotInstalled``; 403 is ``Forbidden``; 5xx,
429 and transport failures are ``Unavailable`` since the first failure of the current outage. Several
CRs in the namespace (with no name set) are ``Unavailable`` too: none of them is "the" CR.
"""

from __future__ import annotations

from datetime import datetime

import httpx
import kr8s

from operators.gpuclass.kubevirt import (
    Forbidden,
    Found,
    KubeVirtRead,
    NotInstalled,
    Unavailable,
    outage_start,
)
from shared.kube import ApiError, Kube, Resource

KUBEVIRTS = Resource("kubevirt.io/v1", "kubevirts")


async def read_kubevirt(
    kube: Kube, namespace: str, name: str, previous: KubeVirtRead | None, now: datetime
) -> KubeVirtRead:
    try:
        if name:
            cr = await kube.get(KUBEVIRTS.path(namespace, name))
            return Found(cr) if cr is not None else NotInstalled()
        items = (await kube.list(KUBEVIRTS.path(namespace))).get("items") or []
    except ApiError as error:
        if error.status == 404:
            return NotInstalled()
        if error.status in (401, 403):
            return Forbidden(error.message)
        return Unavailable(outage_start(previous, now), str(error))
    except (httpx.TransportError, kr8s.APITimeoutError) as error:
        return Unavailable(outage_start(previous, now), f"{type(error).__name__}: {error}")
    if not items:
        return NotInstalled()
    if len(items) > 1:
        return Unavailable(
            outage_start(previous, now), f"{len(items)} KubeVirt CRs in {namespace}; set a name"
        )
    return Found(items[0])
