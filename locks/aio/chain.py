"""FallbackChain for tasks: `locks.fallback.chain.ChainLogic` (the walk, safe mode's
gates, retries, breakers, switch, queued releases), its calls awaited on the loop, and
its background work (queued releases, safe mode's look at failed tiers) as tasks."""

from __future__ import annotations

import asyncio
from typing import Any

from locks.aio.base import AsyncLostCallback
from locks.aio.handle import MakesAsyncLocks
from locks.aio.owner import task_owner
from locks.fallback.chain import ChainLogic
from locks.fallback.outages import WATCH_EVERY
from locks.provider import Holder, Lease
from locks.steps import Steps, run_async


class FallbackChain(ChainLogic, MakesAsyncLocks):
    """An async provider whose tiers (async providers, or chains) are tried in order
    within one deadline, with the threaded chain's arguments and semantics."""

    async def acquire(
        self,
        key: str,
        *,
        ttl: float | None = None,
        wait: float | None = None,
        on_lost: AsyncLostCallback | None = None,
    ) -> Lease | None:
        request = self._request(key, ttl, wait, on_lost, task_owner())  # type: ignore[arg-type]
        return await run_async(self._acquiring(request))

    async def release(self, lease: Lease) -> None:
        """Release on the tier that granted it; a tier that does not answer does not
        make this raise: the release is queued until it answers."""
        await run_async(self._release_or_queue(self._tier_of(lease), lease))

    async def extend(self, lease: Lease, ttl: float | None = None) -> Lease:
        return await self._tier_of(lease).extend(lease, ttl)  # type: ignore[no-any-return]

    async def is_held(self, lease: Lease) -> bool:
        return bool(await self._tier_of(lease).is_held(lease))

    async def holder(self, key: str) -> Holder | None:
        return await run_async(self._holder_steps(key))

    async def break_lock(self, key: str, *, by: str | None = None) -> Holder | None:
        return await run_async(self._break_steps(key, by))

    async def ping(self) -> None:
        await run_async(self._ping_steps())

    async def close(self) -> None:
        """Stop watching failed tiers and wait for queued releases under way. The tiers
        may serve other chains: whoever made them closes them."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.cancel()
        while self._background:
            await asyncio.wait(list(self._background))

    def _start_flush(self, steps: Steps[None]) -> object:
        return self._in_background(run_async(steps))

    def _in_background(self, work: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _watch_down_tiers(self) -> None:
        if (self._watcher is None or self._watcher.done()) and not self._stop.is_set():
            self._watcher = asyncio.get_running_loop().create_task(
                self._watch(), name=f"locks-watch-{self.name}"
            )

    async def _watch(self) -> None:
        while not self._stop.is_set():
            await asyncio.sleep(WATCH_EVERY)
            if not await run_async(self._look_at_down_tiers()):
                return
