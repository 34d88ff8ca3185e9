"""The event loop's exception handler: only uvloop's report of TLS data on a connection we closed is
quieted; every other error reaches asyncio's default handler (logged at error level)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from shared.operator import quiet_closed_transport

CLOSED_HANDLER = RuntimeError("unable to perform operation on <TCPTransport>; the handler is closed")
FATAL = "Fatal error on SSL protocol"


class Transport:
    def __init__(self, closing: bool) -> None:
        self.closing = closing

    def is_closing(self) -> bool:
        return self.closing


# (what, the context the loop hands the handler, whether it is logged as an error)
CONTEXTS: list[tuple[str, dict[str, Any], bool]] = [
    (
        "uvloop: TLS data for a transport we closed",
        {"message": FATAL, "exception": CLOSED_HANDLER, "transport": Transport(True)},
        False,
    ),
    (
        "the same error on a transport still open",
        {
            "message": "Fatal error on SSL protocol",
            "exception": CLOSED_HANDLER,
            "transport": Transport(False),
        },
        True,
    ),
    (
        "another error on a closed transport",
        {
            "message": "Fatal error on SSL protocol",
            "exception": ValueError("bad"),
            "transport": Transport(True),
        },
        True,
    ),
    ("no transport", {"message": "Task exception was never retrieved", "exception": CLOSED_HANDLER}, True),
    ("no exception", {"message": "something odd"}, True),
]


@pytest.mark.parametrize(("what", "context", "logged"), CONTEXTS, ids=[c[0] for c in CONTEXTS])
def test_only_data_for_a_closed_transport_is_quieted(
    what: str, context: dict[str, Any], logged: bool, caplog: pytest.LogCaptureFixture
) -> None:
    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.DEBUG):
            quiet_closed_transport(loop, context)
    finally:
        loop.close()
    errors = [r for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.ERROR]
    assert bool(errors) == logged
