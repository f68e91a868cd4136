"""Waiting for a wake-up, or a time-out, on the loop: a future and a timer, without
`asyncio.wait_for`'s extra future, callbacks and task bookkeeping on every wait (a
tenth of the loop's work with 1,000 tasks contending)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator


def new_wakeup() -> asyncio.Future[bool]:
    """A future that `wake` sets to True (a time-out sets it to False)."""
    return asyncio.get_running_loop().create_future()


def wake(woken: asyncio.Future[bool]) -> bool:
    """Set `woken` if nobody did yet; whether this call did."""
    if woken.done():
        return False
    woken.set_result(True)
    return True


async def woken_within(woken: asyncio.Future[bool], timeout: float | None) -> bool:
    """Await `woken` for up to `timeout` seconds (None: for ever): True if it was woken,
    False if the time ran out. A cancellation cancels `woken` too."""
    if timeout is None:
        return await woken
    timer = asyncio.get_running_loop().call_later(timeout, _time_out, woken)
    try:
        return await woken
    finally:
        timer.cancel()


def _time_out(woken: asyncio.Future[bool]) -> None:
    if not woken.done():
        woken.set_result(False)


class Waiter:
    """One task's place in a key's line (`Lines`): as the threaded `Waiter`, with a
    wake-up that arrives while the task is not asleep kept for its next sleep."""

    __slots__ = ("_line", "_pending", "_woken")

    def __init__(self, line: deque[Waiter]) -> None:
        self._line = line
        self._woken: asyncio.Future[bool] | None = None
        self._pending = False

    @property
    def first(self) -> bool:
        """Whether this waiter is the head, the one that asks the server."""
        line = self._line
        return bool(line) and line[0] is self

    async def sleep(self, seconds: float) -> None:
        """Sleep up to `seconds`; returns early when woken."""
        if self._pending or seconds <= 0:
            self._pending = False
            return
        self._woken = new_wakeup()
        try:
            await woken_within(self._woken, seconds)
        finally:
            self._woken = None
            self._pending = False

    def wake(self) -> None:
        if self._woken is None or not wake(self._woken):
            self._pending = True


class Lines:
    """The waiting tasks of one provider on each key of a polling backend, in the order
    they came: as `locks.backends.wakeups.Wakeups` for threads (one head asks; a release
    here, or the head leaving, wakes the next), on one loop."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """No line (also in a forked child: the parent's waiting tasks are not here)."""
        self._lines: dict[str, deque[Waiter]] = {}

    @contextlib.asynccontextmanager
    async def waiting(self, key: str) -> AsyncIterator[Waiter]:
        line = self._lines.setdefault(key, deque())
        waiter = Waiter(line)
        line.append(waiter)
        try:
            yield waiter
        finally:
            was_first = line[0] is waiter
            line.remove(waiter)
            if not line:
                self._lines.pop(key, None)
            elif was_first:
                line[0].wake()  # the next one asks from now on

    def wake(self, key: str) -> None:
        """`key` was released: the head of its line tries at once."""
        line = self._lines.get(key)
        if line:
            line[0].wake()

    def wake_all(self) -> None:
        """Releases may have gone unheard: every head looks again."""
        for line in self._lines.values():
            line[0].wake()
