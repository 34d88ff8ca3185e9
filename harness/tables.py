"""What ``kubectl get`` prints for one object: the API server's Table rendering of it.

Decides: how a test asks for the server-side printing (the Table media type kubectl sends) and reads
one row back as column name -> cell.

Does not: format anything itself; the columns and cells are the API server's (a CRD's
additionalPrinterColumns).
"""

from __future__ import annotations

from typing import Any, Final

import aiohttp

from shared.kube import Kube

# The media type kubectl asks for: the server prints the object as a meta.k8s.io/v1 Table.
TABLE: Final = "application/json;as=Table;v=v1;g=meta.k8s.io"


async def printed_row(kube: Kube, path: str) -> dict[str, Any]:
    """The object at ``path`` as ``kubectl get`` prints it: column name -> cell."""
    credentials = kube.credentials
    headers = {"Accept": TABLE}
    if credentials.token:
        headers["Authorization"] = f"Bearer {credentials.token}"
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{credentials.server}{path}", headers=headers, ssl=credentials.tls or False) as answer,
    ):
        table = await answer.json()
    assert table["kind"] == "Table", table
    (row,) = table["rows"]
    return {
        column["name"]: cell for column, cell in zip(table["columnDefinitions"], row["cells"], strict=True)
    }
