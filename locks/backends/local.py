"""In-process locks: the last tier of a chain, and the reference for the contract suite.

A registry of per-key entries, each created on first use and dropped as soon as no
owner holds it and no thread waits for it, so a million distinct keys leave nothing
behind. Ownership is recorded by owner and token rather than left to a bare
`threading.RLock`, so a lease is released the same way as on every other backend:
by whoever holds the lease, from any thread.
"""

from __future__ import annotations

import itertools
import threading
import time

from locks.base import Grant, ProviderBase
from locks.provider import Capabilities, Holder, Lease


class _Entry:
    __slots__ = ("depth", "fence", "free", "owner", "token", "users")

    def __init__(self) -> None:
        self.free = threading.Condition(threading.Lock())
        self.owner: str | None = None
        self.token = ""
        self.fence = 0
        self.depth = 0
        self.users = 0  # outstanding grants plus waiting threads; 0 means removable


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
        self._registry_lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._fences = itertools.count(1)

    def __len__(self) -> int:
        """How many keys are held or waited for right now."""
        return len(self._entries)

    def _acquire(
        self, key: str, owner: str, token: str, ttl: float, deadline: float | None
    ) -> Grant | None:
        with self._registry_lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry()
            entry.users += 1
        with entry.free:
            if entry.owner == owner:
                entry.depth += 1
                return Grant(entry.token, entry.fence, entry.depth, time.monotonic())
            while entry.owner is not None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                entry.free.wait(remaining)
            else:
                entry.owner, entry.token, entry.depth = owner, token, 1
                entry.fence = next(self._fences)
                return Grant(token, entry.fence, 1, time.monotonic())
        self._drop_user(key, entry)
        return None

    def _release(self, lease: Lease) -> bool:
        entry = self._entries.get(lease.key)
        if entry is None:
            return False
        with entry.free:
            if entry.token != lease.token or entry.owner is None:
                return False
            entry.depth -= 1
            if entry.depth == 0:
                entry.owner, entry.token = None, ""
                entry.free.notify()
        self._drop_user(lease.key, entry)
        return True

    def _drop_user(self, key: str, entry: _Entry) -> None:
        with self._registry_lock:
            entry.users -= 1
            if entry.users == 0:
                del self._entries[key]

    def _extend(self, lease: Lease, ttl: float) -> bool:
        return self._is_held(lease)

    def _is_held(self, lease: Lease) -> bool:
        entry = self._entries.get(lease.key)
        return entry is not None and entry.owner is not None and entry.token == lease.token

    def _holder(self, key: str) -> Holder | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        with entry.free:
            if entry.owner is None:
                return None
            return Holder(key, self.name, entry.owner, entry.depth, entry.fence, None)

    def ping(self) -> None:
        """Always answers: the local backend cannot be unavailable."""
