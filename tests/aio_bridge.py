"""The threaded `LockProvider` protocol over an asyncio provider, so that the contract
suite (threads, processes, forks) runs against the asyncio face unchanged.

One event loop runs on a thread of its own per process (a forked child starts its
own). Each thread that calls in gets a task of its own on that loop, which makes every
call the thread asks for, one after another: the task is the owner, so a thread here
is one owner there, as the suite expects (reentrancy, owner-only release). Only the
marshalling is here; every decision is the asyncio provider's."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from locks.aio.base import AsyncProviderBase
from locks.aio.chain import FallbackChain
from locks.aio.owner import task_owner
from locks.aio.quorum import Quorum
from locks.provider import Capabilities, Holder, Lease, LostCallback, MakesLocks

R = TypeVar("R")

_Request = tuple[Callable[[], Awaitable[Any]], "concurrent.futures.Future[Any]"]


class _Loop:
    """This process's loop thread, started on first use."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True, name="aio-bridge").start()
        self.agents = threading.local()


_current: _Loop | None = None
_lock = threading.Lock()
# a forked child keeps its parent's loop uncollected: collecting it would close its
# transports, taking their sockets out of the epoll instance it shares with the parent
_parents: list[_Loop] = []


def _the_loop() -> _Loop:
    global _current
    with _lock:
        if _current is None or _current.pid != os.getpid():
            if _current is not None:
                _parents.append(_current)
            _current = _Loop()
        return _current


async def _serve(inbox: asyncio.Queue[_Request | None]) -> None:
    while True:
        request = await inbox.get()
        if request is None:
            return
        await _answer(*request)
        del request  # a lease answered must not stay referenced here (the suite drops some)


async def _answer(
    call: Callable[[], Awaitable[Any]], outcome: concurrent.futures.Future[Any]
) -> None:
    try:
        outcome.set_result(await call())
    except BaseException as error:  # the calling thread raises it
        outcome.set_exception(error)


class _Agent:
    """One calling thread's task on the loop; it ends when the thread's record goes."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

        async def start() -> asyncio.Queue[_Request | None]:
            inbox: asyncio.Queue[_Request | None] = asyncio.Queue()
            self.task = asyncio.get_running_loop().create_task(_serve(inbox))
            return inbox

        self.inbox = asyncio.run_coroutine_threadsafe(start(), loop).result()
        weakref.finalize(self, loop.call_soon_threadsafe, self.inbox.put_nowait, None)

    def call(self, make: Callable[[], Awaitable[R]]) -> R:
        outcome: concurrent.futures.Future[R] = concurrent.futures.Future()
        self.loop.call_soon_threadsafe(self.inbox.put_nowait, (make, outcome))
        return outcome.result()


def run(make: Callable[[], Awaitable[R]]) -> R:
    """`make()` awaited by the calling thread's task."""
    loop = _the_loop()
    agent: _Agent | None = getattr(loop.agents, "agent", None)
    if agent is None:
        agent = loop.agents.agent = _Agent(loop.loop)
    return agent.call(make)


async def _owner() -> str:
    return task_owner()


class Threaded(MakesLocks):
    """An asyncio provider (or chain), called as a threaded one."""

    def __init__(self, provider: AsyncProviderBase | FallbackChain | Quorum) -> None:
        self.aio = cast(AsyncProviderBase, provider)  # a chain answers the same calls
        self.name = provider.name

    @property
    def tiers(self) -> dict[str, Threaded]:
        """A chain's tiers, called as threaded ones (closed by whoever made them)."""
        return {name: Threaded(tier) for name, tier in getattr(self.aio, "tiers", {}).items()}

    @property
    def members(self) -> dict[str, Threaded]:
        """A quorum's members, called as threaded ones (closed by whoever made them)."""
        return {name: Threaded(member) for name, member in getattr(self.aio, "members", {}).items()}

    @property
    def capabilities(self) -> Capabilities:
        return self.aio.capabilities

    def __getattr__(self, name: str) -> Any:  # _watchdog, type_name, address...
        return getattr(self.aio, name)

    def acquire(
        self,
        key: str,
        *,
        ttl: float | None = None,
        wait: float | None = None,
        on_lost: LostCallback | None = None,
    ) -> Lease | None:
        return run(lambda: self.aio.acquire(key, ttl=ttl, wait=wait, on_lost=on_lost))

    def release(self, lease: Lease) -> None:
        run(lambda: self.aio.release(lease))

    def extend(self, lease: Lease, ttl: float | None = None) -> Lease:
        return run(lambda: self.aio.extend(lease, ttl))

    def is_held(self, lease: Lease) -> bool:
        return run(lambda: self.aio.is_held(lease))

    def holder(self, key: str) -> Holder | None:
        return run(lambda: self.aio.holder(key))

    def break_lock(self, key: str, *, by: str | None = None) -> Holder | None:
        return run(lambda: self.aio.break_lock(key, by=by))

    def release_token(self, key: str, owner: str, token: str) -> bool:
        return run(lambda: self.aio.release_token(key, owner, token))

    def ping(self) -> None:
        run(self.aio.ping)

    def current_owner(self) -> str:
        """The owner the calling thread is here: its task's."""
        return run(_owner)

    def close(self) -> None:
        run(self.aio.close)
