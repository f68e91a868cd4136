"""Type `file` for tasks: the threaded backend's files, records and decisions
(`locks.backends.file.FileStore`), each flock'ed read-modify-write run on a thread of
the loop's executor: it is microseconds of system calls, but one may wait up to
`flock_timeout` for a flock a frozen process holds, which the loop must never do.

A task cancelled while its operation runs leaves it running to its end (it cannot be
stopped midway, nor should it be: a half-written record is what the flock is for). A
cancelled acquire's grant is released by its token once that operation has returned:
a release run beside it could find the file before the grant is in it, and the grant
would stay for its ttl. Waiting tasks of one provider line up per name: the first
polls, the others are woken when it leaves or when a release is made here."""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

from locks.aio.base import AsyncProviderBase
from locks.aio.wakeups import Lines
from locks.backends.file import FileStore
from locks.keeper import Grant
from locks.provider import Holder, Lease
from locks.steps import run_async

R = TypeVar("R")


class FileProvider(FileStore, AsyncProviderBase):
    """Type `file` for tasks: one file per lock in a directory; the processes of one
    host. The threaded `locks.backends.FileProvider`'s arguments and files: a task and
    a thread (of any process) exclude each other on one name."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        name: str = "file",
        watchdog_ttl: float = 30.0,
        flock_timeout: float = 1.0,
    ) -> None:
        super().__init__(name, watchdog_ttl)
        self._configure(path, flock_timeout)
        self._lines = Lines()

    def after_fork_in_child(self) -> None:
        super().after_fork_in_child()
        self._lines.reset()  # the parent's loop's waiters

    async def _off_loop(
        self, operation: Callable[..., R], *args: Any, token: str | None = None
    ) -> R:
        """`operation(*args)` on an executor thread, run to its end whatever happens to
        the caller (`close` waits for it); an acquire's is known by its `token`."""
        done = self._in_background(
            asyncio.get_running_loop().run_in_executor(None, functools.partial(operation, *args))
        )
        self._track(token, done)
        return await asyncio.shield(done)

    async def _acquire(
        self, key: str, owner: str, token: str, ttl: float, deadline: float | None
    ) -> Grant | None:
        grant, left = await self._try(key, owner, token, ttl)
        if grant is not None or (deadline is not None and time.monotonic() >= deadline):
            return grant
        async with self._lines.waiting(key) as waiter:
            return await run_async(self._wait_steps(waiter, key, owner, token, ttl,
                                                    deadline=deadline, left=left))  # fmt: skip

    async def _try(
        self, key: str, owner: str, token: str, ttl: float
    ) -> tuple[Grant | None, float]:
        return await self._off_loop(self._try_now, key, owner, token, ttl, token=token)

    async def _release(self, lease: Lease) -> bool:
        released = await self._off_loop(self._free_now, lease)
        if released:
            self._lines.wake(lease.key)
        return released

    async def _release_unknown(self, lease: Lease) -> bool:
        """After the acquire's operation that may have made the grant has returned."""
        await self._settled(lease.token)
        return await self._release(lease)

    async def _extend(self, lease: Lease, ttl: float) -> bool:
        return await self._off_loop(self._extend_now, lease, ttl)

    async def _is_held(self, lease: Lease) -> bool:
        return await self._off_loop(self._held_now, lease)

    async def _holder(self, key: str) -> Holder | None:
        return await self._off_loop(self._holder_now, key)

    async def _break(self, key: str) -> Holder | None:
        ended = await self._off_loop(self._end_now, key)
        if ended is not None:
            self._lines.wake(key)
        return ended

    async def ping(self) -> None:
        """Make the directory if it is missing, and create (and remove) a file in it."""
        await self._off_loop(self._probe_now)
