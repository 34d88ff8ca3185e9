"""Read the KubeVirt CR (glue): one GET, or one LIST when no name is set; never a watch.

Decides: what the API's answer is as a read result for the pure ``kubevirt`` module: 404 (the kind
is not served, or the CR is absent) or an empty namespace is ``NotInstalled``; 401/403 is
``Forbidden``; 5xx, 429, transport failures and **timeouts** are ``Unavailable`` since the first
failure of the current outage (so the pass keeps the last definitive read for the grace period).
A call with no answer fails in whichever shape the client gives it (``shared.kube.NO_ANSWER``:
``ApiTimeoutError``, an aiohttp client error, or a bare ``TimeoutError`` from a deadline
around the call): every one is ``Unavailable``, never an error of the pass. Several CRs in the
namespace (with no name set) are ``Unavailable`` too: none of them is "the" CR.

Does not: retry (the next pass reads again), watch, or decide what a read means for a condition.
"""

from __future__ import annotations

from datetime import datetime

from operators.gpuclass.kubevirt import (
    Forbidden,
    Found,
    KubeVirtRead,
    NotInstalled,
    Unavailable,
    outage_start,
)
from shared.kube import NO_ANSWER, ApiError
from shared.runtime.reads import GET, LIST, Reads

# Read on every pass, never watched: the named CR, or a list of the namespace when no name is set.
KUBEVIRT_VERBS = (GET, LIST)


async def read_kubevirt(
    kubevirts: Reads, namespace: str, name: str, previous: KubeVirtRead | None, now: datetime
) -> KubeVirtRead:
    try:
        if name:
            cr = await kubevirts.get(namespace, name)
            return Found(cr) if cr is not None else NotInstalled()
        items = (await kubevirts.list(namespace)).get("items") or []
    except ApiError as error:
        if error.status == 404:
            return NotInstalled()
        if error.status in (401, 403):
            return Forbidden(error.message)
        return Unavailable(outage_start(previous, now), str(error))
    except NO_ANSWER as error:
        return Unavailable(outage_start(previous, now), f"{type(error).__name__}: {error}")
    if not items:
        return NotInstalled()
    if len(items) > 1:
        return Unavailable(
            outage_start(previous, now), f"{len(items)} KubeVirt CRs in {namespace}; set a name"
        )
    return Found(items[0])
