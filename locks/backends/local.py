"""In-process locks: the last tier of a chain, and the reference for the contract suite.

A local lock is a process-wide named lock: every `LocalProvider` of one name in this
process shares one namespace, so two provider objects (two registries, two chains)
exclude each other on the same key. A provider of another name is another namespace.

Each namespace is a registry of per-key entries, created on first use and dropped as
soon as no owner holds them and nobody waits, so a million distinct keys leave
nothing behind. A forked child starts with empty namespaces: its parent's threads, and
what they held, do not exist there.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import threading
import time
from collections.abc import Hashable, Iterator

from locks.aio.wakeups import wake
from locks.base import Grant, ProviderBase
from locks.forking import start_afresh_when_forked
from locks.keeper import LeaseKeeper
from locks.provider import Capabilities, Holder, Lease


class _Entry:
    __slots__ = ("fence", "free", "owner", "token", "users", "waiting")

    def __init__(self) -> None:
        self.free = threading.Condition(threading.Lock())
        self.owner: str | None = None
        self.token = ""
        self.fence = 0
        self.users = 0  # outstanding grants plus waiters; 0 means removable
        # tasks waiting (locks.aio), first come first served: each one's loop and
        # future; a release wakes the first
        self.waiting: collections.deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[bool]]]
        self.waiting = collections.deque()

    def take(self, owner: str, token: str, fences: Iterator[int]) -> Grant | None:
        """Under `free`: the grant if nobody else holds the key (a grant of this owner
        nobody tracks is taken over, as a new period), else None."""
        if self.owner is not None and self.owner != owner:
            return None
        if self.owner == owner:
            self.users -= 1  # it takes over the earlier grant's place
        self.owner, self.token, self.fence = owner, token, next(fences)
        return Grant(token, self.fence, 1, time.monotonic())

    def give_back(self, token: str) -> bool:
        """Under `free`: end the grant made under `token`, waking a waiting thread and
        the first waiting task; False if it is not the grant held."""
        if self.token != token or self.owner is None:
            return False
        self.owner, self.token = None, ""
        self.free.notify()
        self.wake_first()
        return True

    def wake_first(self) -> None:
        """Under `free`: wake the first waiting task (which then tries first)."""
        if self.waiting:
            loop, woken = self.waiting.popleft()
            loop.call_soon_threadsafe(wake, woken)


class _Namespace:
    """The keys of one provider name in this process, shared by both faces."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: dict[str, _Entry] = {}
        self.fences = itertools.count(1)

    def join(self, key: str) -> _Entry:
        """The key's entry, counting one more user (a try, then a wait or a grant)."""
        with self.lock:
            entry = self.entries.get(key)
            if entry is None:
                entry = self.entries[key] = _Entry()
            entry.users += 1
        return entry

    def leave(self, key: str, entry: _Entry) -> None:
        """One user fewer: the entry goes with its last one."""
        with self.lock:
            entry.users -= 1
            if entry.users == 0 and self.entries.get(key) is entry:
                del self.entries[key]

    def release(self, key: str, token: str) -> bool:
        entry = self.entries.get(key)
        if entry is None:
            return False
        with entry.free:
            released = entry.give_back(token)
        if released:
            self.leave(key, entry)
        return released

    def holds(self, key: str, token: str) -> bool:
        entry = self.entries.get(key)
        return entry is not None and entry.owner is not None and entry.token == token

    def holder(self, key: str, backend: str) -> Holder | None:
        entry = self.entries.get(key)
        if entry is None:
            return None
        with entry.free:
            if entry.owner is None:
                return None
            return Holder(key, backend, entry.owner, None, entry.fence, None)


class _Namespaces:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_name: dict[str, _Namespace] = {}
        start_afresh_when_forked(self)

    def after_fork_in_child(self) -> None:
        # A thread of the parent may have held a key, or a lock, at fork time: it does
        # not exist here. Providers made before the fork find their namespace anew.
        self._lock = threading.Lock()
        self._by_name = {}

    def get(self, name: str) -> _Namespace:
        space = self._by_name.get(name)
        if space is None:
            with self._lock:
                space = self._by_name.setdefault(name, _Namespace())
        return space


_namespaces = _Namespaces()


class InProcess(LeaseKeeper):
    """What both faces' local providers share: the type, and their namespace."""

    type_name = "local"
    address = "this process"
    capabilities = Capabilities(
        reentrant=True,
        expires=False,
        renewable=False,
        fair=False,
        fenced=True,
        cross_process=False,
        cross_host=False,
    )

    def __init__(self, name: str = "local") -> None:
        super().__init__(name)

    @property
    def _space(self) -> _Namespace:
        return _namespaces.get(self.name)  # looked up each time: a fork replaces it

    def __len__(self) -> int:
        """How many keys are held or waited for right now, in this provider's namespace."""
        return len(self._space.entries)

    def _domain(self) -> Hashable:
        return ("local", self.name)


class LocalProvider(InProcess, ProviderBase):
    """Type `local`: reentrant, thread-bound, never expires, one process only."""

    def _acquire(
        self, key: str, owner: str, token: str, ttl: float, deadline: float | None
    ) -> Grant | None:
        space = self._space
        entry = space.join(key)
        with entry.free:
            while (grant := entry.take(owner, token, space.fences)) is None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                entry.free.wait(remaining)
            else:
                return grant
        space.leave(key, entry)
        return None

    def _release(self, lease: Lease) -> bool:
        return self._space.release(lease.key, lease.token)

    def _extend(self, lease: Lease, ttl: float) -> bool:
        return self._is_held(lease)

    def _is_held(self, lease: Lease) -> bool:
        return self._space.holds(lease.key, lease.token)

    def _holder(self, key: str) -> Holder | None:
        return self._space.holder(key, self.name)

    def ping(self) -> None:
        """Always answers: the local backend cannot be unavailable."""
