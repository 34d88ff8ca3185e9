"""A ResourceQuota in force, as config/samples/resourcequota.yaml tells the hoster to make one.

Decides: how a test waits for a quota to be enforced. Admission enforces a quota only once
kube-controller-manager's resource-quota controller has counted its usage; a quota made before the
controller discovered its kinds (every 30 s) is counted only at its next full resync (5 minutes by
default), one made afterwards at once. So the quota is re-created until it is counted.

Does not: decide the quota's limits (the caller's body does).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from harness.waiting import eventually, wait_for_object
from shared.kube import Kube
from shared.resources import RESOURCE_QUOTAS

# How long one quota object is given to be counted, and how long in all.
ATTEMPT_SECONDS: Final = 15.0
DEADLINE_SECONDS: Final = 240.0


async def quota_in_force(kube: Kube, namespace: str, body: Mapping[str, Any], key: str) -> None:
    """Create the quota ``body`` in ``namespace``, re-created until the controller counts ``key``."""
    name = body["metadata"]["name"]
    path = RESOURCE_QUOTAS.path(namespace, name)

    async def counted() -> bool:
        found = await kube.get(path)
        return key in (((found or {}).get("status") or {}).get("used") or {})

    for _ in range(int(DEADLINE_SECONDS / ATTEMPT_SECONDS)):
        await kube.create(RESOURCE_QUOTAS.path(namespace), body)
        try:
            await eventually(counted, timeout=ATTEMPT_SECONDS, what=f"quota {name} counted")
            return
        except AssertionError:
            await kube.delete(path)
            await wait_for_object(kube, RESOURCE_QUOTAS, name, lambda q: q is None, namespace=namespace)
    raise AssertionError(f"the resource-quota controller never counted {key} in {DEADLINE_SECONDS}s")
