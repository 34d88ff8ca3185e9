"""The API server's own count of the requests it served (``apiserver_request_total`` on /metrics).

Decides: how to reach /metrics with the kubeconfig's client certificate (its embedded PEM data is
written next to the control plane's files, which the run removes), and how the counter is read: by
(verb, resource, subresource, code), summed over the other labels. The difference of two readings
says how many requests of each kind a phase cost, whoever made them.
"""

from __future__ import annotations

import base64
import re
import ssl
from collections import Counter
from pathlib import Path

import httpx
import yaml

RequestKey = tuple[str, str, str, str]  # verb, resource, subresource, code
_PREFIX = "apiserver_request_total{"
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


class ApiServerMetrics:
    def __init__(self, kubeconfig: str, scratch: Path) -> None:
        config = yaml.safe_load(Path(kubeconfig).read_text())
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        self.server = str(cluster["server"])
        cert, key = scratch / "metrics-client.crt", scratch / "metrics-client.key"
        cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
        key.write_bytes(base64.b64decode(user["client-key-data"]))
        key.chmod(0o600)
        context = ssl.create_default_context(
            cadata=base64.b64decode(cluster["certificate-authority-data"]).decode()
        )
        context.load_cert_chain(str(cert), str(key))
        self.client = httpx.AsyncClient(verify=context, timeout=30)

    async def requests(self) -> Counter[RequestKey]:
        response = await self.client.get(f"{self.server}/metrics")
        response.raise_for_status()
        counts: Counter[RequestKey] = Counter()
        for line in response.text.splitlines():
            if not line.startswith(_PREFIX):
                continue
            labels_text, _, value = line[len(_PREFIX) :].rpartition("} ")
            labels = dict(_LABEL.findall(labels_text))
            key = (
                labels.get("verb", ""),
                labels.get("resource", ""),
                labels.get("subresource", ""),
                labels.get("code", ""),
            )
            counts[key] += int(float(value))
        return counts

    async def close(self) -> None:
        await self.client.aclose()


def count(delta: Counter[RequestKey], verb: str, resource: str, subresource: str = "", code: str = "") -> int:
    """Requests in ``delta`` with this verb, resource and subresource (and code, if given)."""
    return sum(
        n
        for (v, r, s, c), n in delta.items()
        if v == verb and r == resource and s == subresource and (not code or c == code)
    )
