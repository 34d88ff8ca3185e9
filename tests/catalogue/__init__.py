"""The bad-input catalogue: every bad object or update a careless hoster or a hostile tenant can send
to the operators' two kinds (EndpointAttachment, GPUClass), and the answer each must get (issues 12
and 16). Run by
tests/integration/test_bad_input_catalogue.py; ``python -m tests.catalogue`` prints its counts.

Decides: the table (``ROWS``: admission rows from ``admission``, operator rows from ``operated``) and
how its answers are counted.

Does not: run anything against a cluster.
"""

from __future__ import annotations

from collections import Counter

from tests.catalogue.admission import ROWS as ADMISSION_ROWS
from tests.catalogue.model import Refused, Row
from tests.catalogue.operated import ROWS as OPERATED_ROWS

ROWS: list[Row] = [*ADMISSION_ROWS, *OPERATED_ROWS]


def counts() -> Counter[str]:
    """Rows by expected answer: refused, conditioned, handled (and how many refusals quote Kubernetes'
    own name rule, and how many operator rows await behaviour still being built)."""
    counted: Counter[str] = Counter(row.answer for row in ROWS)
    counted["refused-by-kubernetes-name-rules"] = sum(
        1 for row in ROWS if isinstance(row, Refused) and row.kubernetes_message
    )
    counted["pending-behaviour"] = sum(1 for row in ROWS if not isinstance(row, Refused) and row.xfail)
    return counted
