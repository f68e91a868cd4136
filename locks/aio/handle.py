"""`async with provider.lock("order:1", wait=2) as lease:` and `@provider.locked(...)` on
`async def`: the threaded face's `Lock` and `locked`, for tasks."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from locks.aio.owner import task_owner
from locks.names import check_ttl, check_wait
from locks.provider import Handle, Lease, key_maker

if TYPE_CHECKING:
    from locks.aio.base import AsyncLostCallback, AsyncProviderBase

P = ParamSpec("P")
R = TypeVar("R")


class _Wait:
    """The handle's own `wait` (a default that None, waiting for ever, cannot be)."""


_HANDLE_WAIT = _Wait()


class AsyncLock(Handle):
    """A named lock bound to an async provider. One handle may be shared by tasks: each
    task's leases are kept apart (the owner is the task), and nested `async with`
    blocks on a reentrant backend nest."""

    owner_kind = "task"
    block = "async with"
    provider: AsyncProviderBase

    def __init__(
        self,
        provider: AsyncProviderBase,
        key: str,
        *,
        ttl: float | None = None,
        wait: float | None = None,
        on_lost: AsyncLostCallback | None = None,
    ) -> None:
        super().__init__(provider, key, ttl=ttl, wait=wait, on_lost=on_lost)
        self._held: dict[str, list[Lease]] = {}  # by task owner: its leases, innermost last

    @property
    def lease(self) -> Lease | None:
        """The calling task's innermost lease from this handle, if any."""
        stack = self._held.get(task_owner())
        return stack[-1] if stack else None

    async def acquire(self, wait: float | _Wait | None = _HANDLE_WAIT) -> Lease | None:
        """Acquire with the handle's `wait` (or the one given); None if it ran out."""
        lease = await self.provider.acquire(
            self.key,
            ttl=self.ttl,
            wait=self.wait if isinstance(wait, _Wait) else wait,
            on_lost=self.on_lost,
        )
        if lease is not None:
            self._held.setdefault(lease.owner, []).append(lease)
        return lease

    def _innermost(self) -> tuple[str, list[Lease]]:
        owner = task_owner()
        stack = self._held.get(owner)
        if not stack:
            raise RuntimeError(f"{self!r} is not held by this task")
        return owner, stack

    async def release(self) -> None:
        """Release the calling task's innermost lease from this handle."""
        owner, stack = self._innermost()
        lease = stack.pop()
        if not stack:
            del self._held[owner]
        await self.provider.release(lease)

    async def extend(self, ttl: float | None = None) -> Lease:
        _, stack = self._innermost()
        stack[-1] = await self.provider.extend(stack[-1], ttl)
        return stack[-1]

    async def locked(self) -> bool:
        """Whether the calling task holds this lock through this handle, asked of the
        backend."""
        lease = self.lease
        return lease is not None and await self.provider.is_held(lease)

    async def __aenter__(self) -> Lease:
        mine = self.lease is not None
        lease = await self.acquire()
        if lease is None:
            raise self._timed_out(mine)
        return lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.release()


class MakesAsyncLocks:
    """`lock` and the `locked` decorator for every async provider and chain."""

    def lock(
        self,
        key: str,
        *,
        ttl: float | None = None,
        wait: float | None = None,
        on_lost: AsyncLostCallback | None = None,
    ) -> AsyncLock:
        return AsyncLock(self, key, ttl=ttl, wait=wait, on_lost=on_lost)  # type: ignore[arg-type]

    def locked(
        self, key_template: str, *, ttl: float | None = None, wait: float | None = None
    ) -> Callable[[Callable[P, Coroutine[Any, Any, R]]], Callable[P, Coroutine[Any, Any, R]]]:
        """Run the decorated `async def` under the lock named by `key_template`,
        formatted with the call's arguments, held for the whole awaited body:
        `@provider.locked("order:{order_id}", wait=2)`. Raises `LockTimeout` when
        `wait` runs out."""
        check_ttl(ttl)
        check_wait(wait)

        def decorate(
            function: Callable[P, Coroutine[Any, Any, R]],
        ) -> Callable[P, Coroutine[Any, Any, R]]:
            if not inspect.iscoroutinefunction(function):
                raise TypeError(
                    f"{getattr(function, '__qualname__', function)!r} is not an `async def`: "
                    "an async lock guards awaited bodies (a plain function takes the "
                    "threaded providers' `locked`)"
                )
            key_of = key_maker(key_template, function)

            @functools.wraps(function)
            async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
                async with self.lock(key_of(*args, **kwargs), ttl=ttl, wait=wait):
                    return await function(*args, **kwargs)

            return wrapper

        return decorate
