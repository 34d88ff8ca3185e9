"""python -m operators.gpuclass: read the settings, then run the operator (``shared.operator``).

Decides: the operator's name (its metrics and trace name, and its Lease's). Replicas elect a leader
through a Lease: only the leader reconciles and writes, a standby keeps its caches warm.

Does not: declare caches or controllers (``controller.build`` does) or run anything itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from prometheus_client import CollectorRegistry

from operators.gpuclass.controller import build
from operators.gpuclass.settings import parse
from shared import operator
from shared.runtime.manager import Manager

NAME: Final = "gpuclass"


def main(argv: Sequence[str] | None = None) -> None:
    settings = parse(argv)

    def declare(manager: Manager, registry: CollectorRegistry) -> None:
        build(manager, registry, settings)

    operator.main(NAME, settings.runtime, declare)


if __name__ == "__main__":
    main()
