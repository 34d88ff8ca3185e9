"""python -m operators.endpointattachment: read the settings, then run the operator.

Decides only the operator's name (its metrics, trace and Lease name) and hands the rest to
``shared.operator``: it runs the process, the runtime's manager runs the caches, the leader
election and the controllers ``controller.build`` declares.

Does not: declare any cache or controller itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from operators.endpointattachment.controller import build
from operators.endpointattachment.settings import parse
from shared.operator import main as run_operator

NAME: Final = "endpointattachment"


def main(argv: Sequence[str] | None = None) -> None:
    settings = parse(argv)
    run_operator(NAME, settings.runtime, lambda manager, registry: build(manager, registry, settings))


if __name__ == "__main__":
    main()
