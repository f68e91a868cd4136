"""Type `local` for tasks: the same process-wide namespaces as the threaded
`LocalProvider` (a task and a thread exclude each other on one name), with waiting
tasks woken through their loop instead of a condition."""

from __future__ import annotations

import asyncio
import contextlib
import time

from locks.aio.base import AsyncProviderBase
from locks.aio.wakeups import new_wakeup, woken_within
from locks.backends.local import InProcess
from locks.keeper import Grant
from locks.provider import Holder, Lease


class LocalProvider(InProcess, AsyncProviderBase):
    """Type `local`: reentrant per task, never expires, one process only."""

    async def _acquire(
        self, key: str, owner: str, token: str, ttl: float, deadline: float | None
    ) -> Grant | None:
        space = self._space
        entry = space.join(key)
        loop = asyncio.get_running_loop()
        first = False  # woken by a release: first in line, it tries whoever queues
        try:
            while True:
                with entry.free:
                    if first or not entry.waiting or entry.owner == owner:
                        grant = entry.take(owner, token, space.fences)
                        if grant is not None:
                            return grant
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        break
                    woken = new_wakeup()
                    # no barging: a task that just released and loops queues behind
                    # those that waited; one woken but beaten (by a thread) stays first
                    (entry.waiting.appendleft if first else entry.waiting.append)((loop, woken))
                try:
                    first = await woken_within(woken, remaining)
                except BaseException:
                    with entry.free:
                        if woken.done() and not woken.cancelled() and woken.result():
                            entry.wake_first()  # it leaves with a wake-up it will not use
                    raise
                finally:
                    with entry.free, contextlib.suppress(ValueError):
                        entry.waiting.remove((loop, woken))
        except BaseException:
            space.leave(key, entry)
            raise
        space.leave(key, entry)
        return None

    async def _release(self, lease: Lease) -> bool:
        return self._space.release(lease.key, lease.token)

    async def _extend(self, lease: Lease, ttl: float) -> bool:
        return self._space.holds(lease.key, lease.token)

    async def _is_held(self, lease: Lease) -> bool:
        return self._space.holds(lease.key, lease.token)

    async def _holder(self, key: str) -> Holder | None:
        return self._space.holder(key, self.name)

    async def ping(self) -> None:
        """Always answers: the local backend cannot be unavailable."""
