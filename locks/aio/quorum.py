"""Quorum for tasks: `locks.quorum_logic.QuorumLogic` (votes, validity, fences, renewal and
loss) driven on the loop, each member call a task of its own acting for the caller, the
grant locks `asyncio.Lock`s, renewal a task (`locks.aio.watchdog`) and queued releases
tasks.

A cancelled acquire undoes in the background the member grants it held: the rounds
record each grant as it arrives (`Each.heard`), and a member whose own acquire was
cancelled undoes its grant itself."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

from locks.aio.base import AsyncLostCallback, _on_this_loop
from locks.aio.handle import MakesAsyncLocks
from locks.aio.owner import task_owner
from locks.aio.watchdog import TaskWatchdog
from locks.forking import start_afresh_when_forked
from locks.holds import Hold
from locks.pending import PendingReleases
from locks.provider import Holder, Lease
from locks.quorum_logic import QuorumLogic, _Guard
from locks.steps import Steps, run_async

R = TypeVar("R")


class Quorum(QuorumLogic, MakesAsyncLocks):
    """An async provider over independent asyncio members, granting on a quorum of
    them, with the threaded `locks.Quorum`'s arguments and semantics."""

    _async_members = True

    def _set_up(self) -> None:
        self._watchdog = TaskWatchdog(f"locks-renew-{self.name}", self._renew_grants,
                                      self._end_grants)  # fmt: skip
        self._pending = PendingReleases(self._start_flush)
        self._background: set[asyncio.Future[Any]] = set()  # kept alive until done
        start_afresh_when_forked(self)

    def after_fork_in_child(self) -> None:
        super().after_fork_in_child()
        self._background = set()  # the parent's loop's

    def _new_guard(self) -> _Guard:
        return asyncio.Lock()

    def _start_flush(self, steps: Steps[None]) -> object:
        return self._in_background(run_async(steps))

    def _in_background(self, work: Awaitable[R]) -> asyncio.Future[R]:
        running = asyncio.ensure_future(work)
        self._background.add(running)
        running.add_done_callback(self._background.discard)
        return running

    async def _renew_grants(self, grants: Sequence[Hold]) -> list[float | None]:
        """The watchdog's call: every grant due renewed at once; each one's next due."""
        renewals = [run_async(self._renewing(grant)) for grant in grants]  # type: ignore[arg-type]
        return list(await asyncio.gather(*renewals))

    async def _end_grants(self, reason: str) -> None:
        await run_async(self._closing(reason))

    # -- the protocol ----------------------------------------------------------------------

    async def acquire(
        self,
        key: str,
        *,
        ttl: float | None = None,
        wait: float | None = None,
        on_lost: AsyncLostCallback | None = None,
    ) -> Lease | None:
        request = self._request(key, ttl, wait, _on_this_loop(on_lost), task_owner())
        self._watchdog.attend()
        try:
            return await run_async(self._acquiring(request))
        except BaseException:
            if request.held:  # cancelled midway: the member grants it held go
                self._in_background(run_async(self._undo_held(request)))
            raise

    async def release(self, lease: Lease) -> None:
        """Release on every member; one that does not answer gets it queued, so this
        raises only `LockNotOwned` for a lease that had ended or expired."""
        await run_async(self._releasing(lease))

    async def extend(self, lease: Lease, ttl: float | None = None) -> Lease:
        return await run_async(self._extending(lease, ttl))

    async def is_held(self, lease: Lease) -> bool:
        return await run_async(self._checking(lease))

    async def holder(self, key: str) -> Holder | None:
        return await run_async(self._finding(key, task_owner()))

    async def break_lock(self, key: str, *, by: str | None = None) -> Holder | None:
        return await run_async(self._breaking(key, by, task_owner()))

    async def ping(self) -> None:
        await run_async(self._pinging(task_owner()))

    async def close(self) -> None:
        """End every lease this quorum granted (their `on_lost` run) and release their
        member grants; wait for queued releases under way. The members may serve others
        and are closed by whoever made them."""
        self._closed = True
        self._watchdog.close()
        await run_async(self._closing(f"its quorum {self.name!r} was closed"))
        while self._background:
            await asyncio.wait(list(self._background))
