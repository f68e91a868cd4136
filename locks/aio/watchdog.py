"""Renewal of auto-renewed leases in async code: one task per provider on the loop that
uses it, sleeping until the next renewal is due and renewing every hold due then in one
call (one pipeline where the backend has one). Nothing blocks the loop: the renewals
are the provider's own async calls.

The task lives while its loop does: when the loop shuts down (`asyncio.run` cancels
what is left), the provider's leases are ended there, released on the server and their
`on_lost` told, never left to be renewed by nobody."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from locks.forking import start_afresh_when_forked
from locks.holds import Hold

logger = logging.getLogger("locks")

_BATCH = 500  # holds due together renewed in one call
_GATHER = 0.02  # s: holds due this soon are renewed with the one due now


@dataclass(eq=False)
class _Entry:
    hold: Hold
    cancelled: bool = field(default=False)


class TaskWatchdog:
    """`watch` and `unwatch` are plain calls on the loop's thread; the task sleeps until
    the earliest due, and is woken only when a new one comes earlier."""

    def __init__(
        self,
        name: str,
        renew: Callable[[Sequence[Hold]], Awaitable[list[float | None]]],
        end: Callable[[str], Awaitable[None]],
    ) -> None:
        self.name = name
        self._renew = renew  # renews the holds due together; each one's next due
        self._end = end  # ends every lease of the provider (its loop is shutting down)
        self._reset()
        start_afresh_when_forked(self)

    def _reset(self) -> None:
        self._heap: list[tuple[float, int, _Entry]] = []
        self._entries: dict[int, _Entry] = {}
        self._seq = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._sleeps_until = math.inf
        self._closing = False
        self._thread: int | None = None  # the loop's thread

    def after_fork_in_child(self) -> None:
        # the parent's loop and task do not exist here; the child's first lease starts anew
        self._reset()

    def attend(self) -> None:
        """Start the task on the running loop if it is not running (a provider's first
        lease); `RuntimeError` if the provider serves another loop already."""
        loop = asyncio.get_running_loop()
        if self._task is not None and not self._task.done():
            if loop is not self._loop:
                raise RuntimeError(
                    f"{self.name}: this provider serves another event loop (make one "
                    "provider per loop)"
                )
            return
        self._loop, self._closing, self._thread = loop, False, threading.get_ident()
        self._wake = asyncio.Event()
        self._task = loop.create_task(self._run(), name=self.name)

    def watch(self, item: Hold, due: float) -> None:
        if self._elsewhere():
            self._loop.call_soon_threadsafe(self.watch, item, due)  # type: ignore[union-attr]
            return
        entry = _Entry(item)
        self._entries[id(item)] = entry
        heapq.heappush(self._heap, (due, next(self._seq), entry))
        if due < self._sleeps_until:
            self._wake.set()

    def unwatch(self, item: Hold) -> None:
        if self._elsewhere():
            self._loop.call_soon_threadsafe(self.unwatch, item)  # type: ignore[union-attr]
            return
        entry = self._entries.pop(id(item), None)
        if entry is not None:
            entry.cancelled = True
        if len(self._heap) > 2 * len(self._entries) + 64:  # mostly released: compact
            self._heap = [item for item in self._heap if not item[2].cancelled]
            heapq.heapify(self._heap)

    def _elsewhere(self) -> bool:
        """Called from a thread other than the loop's (a lease's `on_lost` on a thread,
        a test): the call is passed to the loop."""
        return self._thread is not None and threading.get_ident() != self._thread

    def close(self) -> None:
        """Stop renewing (the provider ends its leases itself)."""
        self._closing = True
        self._entries.clear()
        self._heap.clear()
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def _run(self) -> None:
        try:
            while True:
                due = await self._next_due()
                await self._renew_due(due)
        except asyncio.CancelledError:
            if not self._closing:  # the loop is shutting down with leases held
                await self._end("its event loop was shut down")
            raise

    async def _next_due(self) -> list[_Entry]:
        loop = asyncio.get_running_loop()
        while True:
            heap = self._heap
            while heap and heap[0][2].cancelled:
                heapq.heappop(heap)
            now = time.monotonic()
            if heap and heap[0][0] <= now:
                taken: list[_Entry] = []
                while heap and len(taken) < _BATCH and heap[0][0] <= now + _GATHER:
                    entry = heapq.heappop(heap)[2]
                    if not entry.cancelled:
                        taken.append(entry)
                if taken:
                    return taken
                continue
            self._sleeps_until = heap[0][0] if heap else math.inf
            self._wake.clear()
            timer = None
            if heap:
                timer = loop.call_later(self._sleeps_until - now, self._wake.set)
            try:
                await self._wake.wait()
            finally:
                self._sleeps_until = -math.inf  # awake: a new entry is seen at once
                if timer is not None:
                    timer.cancel()

    async def _renew_due(self, entries: list[_Entry]) -> None:
        try:
            dues = await self._renew([entry.hold for entry in entries])
        except Exception:  # a bug in a backend must not end every lease's renewal
            logger.exception("renewal on %s failed", self.name)
            dues = [time.monotonic() + 1.0] * len(entries)
        for entry, due in zip(entries, dues, strict=True):
            if entry.cancelled or due is None:
                with contextlib.suppress(KeyError):
                    if self._entries[id(entry.hold)] is entry:
                        del self._entries[id(entry.hold)]
                continue
            heapq.heappush(self._heap, (due, next(self._seq), entry))
