"""Virtual time for async tests: an event loop whose clock jumps to the next timer.

Decides: where the loop would block waiting for its next timer, time jumps to it at once, so
``await asyncio.sleep(5)`` takes no real time, timers fire in order, and a test that would wait
forever (nothing scheduled) fails instead of hanging. Does not fake anything else: sockets still
work (a ready one is served before time moves).
"""

from __future__ import annotations

import asyncio
import functools
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec

P = ParamSpec("P")


class _JumpingSelector(selectors.DefaultSelector):
    """Never blocks: where the loop would wait for its next timer, virtual time jumps to it."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise RuntimeError("nothing is scheduled: the test would wait forever")
        self._loop.now += timeout
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(_JumpingSelector(self))

    def time(self) -> float:
        return self.now


def virtual_time(test: Callable[P, Coroutine[Any, Any, None]]) -> Callable[P, None]:
    """Run an async test on its own ``VirtualTimeLoop``."""

    @functools.wraps(test)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
            runner.run(test(*args, **kwargs))

    return run


def now() -> float:
    return asyncio.get_running_loop().time()
