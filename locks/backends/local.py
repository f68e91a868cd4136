"""In-process locks: the last tier of a chain, and the reference for the contract suite.

A local lock is a process-wide named lock: every `LocalProvider` of one name in this
process shares one namespace, so two provider objects (two registries, two chains)
exclude each other on the same key. A provider of another name is another namespace.

Each namespace is a registry of per-key entries, created on first use and dropped as
soon as no owner holds them and no thread waits, so a million distinct keys leave
nothing behind. A forked child starts with empty namespaces: its parent's threads, and
what they held, do not exist there.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Hashable

from locks.base import Grant, ProviderBase
from locks.forking import start_afresh_when_forked
from locks.provider import Capabilities, Holder, Lease


class _Entry:
    __slots__ = ("fence", "free", "owner", "token", "users")

    def __init__(self) -> None:
        self.free = threading.Condition(threading.Lock())
        self.owner: str | None = None
        self.token = ""
        self.fence = 0
        self.users = 0  # outstanding grants plus waiting threads; 0 means removable


class _Namespace:
    """The keys of one provider name in this process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: dict[str, _Entry] = {}
        self.fences = itertools.count(1)


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


class LocalProvider(ProviderBase):
    """Type `local`: reentrant, thread-bound, never expires, one process only."""

    type_name = "local"

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
        self.address = "this process"

    @property
    def _space(self) -> _Namespace:
        return _namespaces.get(self.name)  # looked up each time: a fork replaces it

    def __len__(self) -> int:
        """How many keys are held or waited for right now, in this provider's namespace."""
        return len(self._space.entries)

    def _domain(self) -> Hashable:
        return ("local", self.name)

    def _acquire(
        self, key: str, owner: str, token: str, ttl: float, deadline: float | None
    ) -> Grant | None:
        space = self._space
        with space.lock:
            entry = space.entries.get(key)
            if entry is None:
                entry = space.entries[key] = _Entry()
            entry.users += 1
        with entry.free:
            if entry.owner == owner:  # a grant of this owner nobody tracks: a new period
                entry.token, entry.fence = token, next(space.fences)
                entry.users -= 1  # it takes over the earlier grant's place
                return Grant(token, entry.fence, 1, time.monotonic())
            while entry.owner is not None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                entry.free.wait(remaining)
            else:
                entry.owner, entry.token = owner, token
                entry.fence = next(space.fences)
                return Grant(token, entry.fence, 1, time.monotonic())
        self._drop_user(space, key, entry)
        return None

    def _release(self, lease: Lease) -> bool:
        space = self._space
        entry = space.entries.get(lease.key)
        if entry is None:
            return False
        with entry.free:
            if entry.token != lease.token or entry.owner is None:
                return False
            entry.owner, entry.token = None, ""
            entry.free.notify()
        self._drop_user(space, lease.key, entry)
        return True

    def _drop_user(self, space: _Namespace, key: str, entry: _Entry) -> None:
        with space.lock:
            entry.users -= 1
            if entry.users == 0 and space.entries.get(key) is entry:
                del space.entries[key]

    def _extend(self, lease: Lease, ttl: float) -> bool:
        return self._is_held(lease)

    def _is_held(self, lease: Lease) -> bool:
        entry = self._space.entries.get(lease.key)
        return entry is not None and entry.owner is not None and entry.token == lease.token

    def _holder(self, key: str) -> Holder | None:
        entry = self._space.entries.get(key)
        if entry is None:
            return None
        with entry.free:
            if entry.owner is None:
                return None
            return Holder(key, self.name, entry.owner, None, entry.fence, None)

    def ping(self) -> None:
        """Always answers: the local backend cannot be unavailable."""
