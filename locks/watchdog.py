"""One daemon thread that keeps every auto-renewed lease (`ttl=None`) alive.

Each lease is renewed every ttl/3. When the backend says the lock is gone, or the
lease's validity runs out without a successful renewal, the lease is marked lost,
its `on_lost` callbacks run once on this thread, and renewal stops.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from locks.errors import BackendUnavailable, LockLost
from locks.events import EventKind, emit
from locks.provider import Lease

logger = logging.getLogger("locks")

Renew = Callable[[Lease], bool]
"""Extend the lease by its ttl on its backend: True if still held, False if gone;
raises `BackendUnavailable` when the backend cannot say."""


@dataclass(eq=False)
class _Entry:
    lease: Lease
    renew: Renew
    group: object
    cancelled: bool = field(default=False)


class Watchdog:
    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, _Entry]] = []
        self._entries: dict[int, _Entry] = {}
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def watch(self, lease: Lease, renew: Renew, group: object) -> None:
        """Renew `lease` until `unwatch`; `group` (its provider) lets `forget` drop it on close."""
        entry = _Entry(lease, renew, group)
        with self._cond:
            self._entries[id(lease.state)] = entry
            self._schedule(entry, lease.acquired_at + lease.ttl / 3)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="locks-watchdog", daemon=True
                )
                self._thread.start()

    def unwatch(self, lease: Lease) -> None:
        """Stop renewing `lease`; a renewal already under way is ignored when it returns."""
        with self._cond:
            entry = self._entries.pop(id(lease.state), None)
            if entry is not None:
                entry.cancelled = True

    def forget(self, group: object) -> None:
        """Stop renewing every lease of `group` (a provider being closed)."""
        with self._cond:
            for state_id, entry in list(self._entries.items()):
                if entry.group is group:
                    entry.cancelled = True
                    del self._entries[state_id]

    def watching(self, lease: Lease) -> bool:
        with self._cond:
            return id(lease.state) in self._entries

    def _schedule(self, entry: _Entry, due: float) -> None:
        heapq.heappush(self._heap, (due, next(self._seq), entry))
        if self._heap[0][2] is entry:
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if not self._heap:
                        self._cond.wait()
                        continue
                    due, _, entry = self._heap[0]
                    if entry.cancelled:
                        heapq.heappop(self._heap)
                        continue
                    delay = due - time.monotonic()
                    if delay > 0:
                        self._cond.wait(delay)
                        continue
                    heapq.heappop(self._heap)
                    break
            self._renew(entry)

    def _renew(self, entry: _Entry) -> None:
        lease = entry.lease
        sent_at = time.monotonic()
        error: BaseException | None = None
        held: bool | None = None
        try:
            held = entry.renew(lease)
        except BackendUnavailable as exc:
            error = exc
        except Exception as exc:  # a bug in a backend must not kill every lease's renewal
            logger.exception("renewing %r on %r failed", lease.key, lease.backend)
            error = exc
        if error is not None:
            emit(EventKind.BACKEND_ERROR, lease.backend, lease.key, lease, error=error)
        now = time.monotonic()
        with self._cond:
            if entry.cancelled:
                return
            if held:
                lease.state.renewed(sent_at + lease.ttl)
                self._schedule(entry, sent_at + lease.ttl / 3)
                return
            valid_until = lease.state.valid_until
            if held is None and valid_until is not None and now < valid_until:
                # keep trying until the lease's validity runs out, then declare it lost
                retry = min(max(lease.ttl / 30, 0.05), 1.0)
                self._schedule(entry, min(now + retry, valid_until))
                return
            del self._entries[id(lease.state)]
        reason = "the backend no longer holds it" if held is False else f"renewal failed: {error}"
        mark_lost(lease, reason)


def mark_lost(lease: Lease, reason: str) -> None:
    """Mark `lease` lost, emit the event and run its callbacks, each once."""
    callbacks = lease.state.mark_lost(reason)
    if callbacks is None:
        return
    emit(EventKind.LOST, lease.backend, lease.key, lease, error=LockLost(reason))
    for callback in callbacks:
        try:
            callback(lease)
        except Exception:
            logger.exception("on_lost callback for %r failed", lease.key)


_watchdog = Watchdog()


def _reset_after_fork() -> None:
    # the child has no renewal thread and must not renew its parent's leases
    global _watchdog
    _watchdog = Watchdog()


os.register_at_fork(after_in_child=_reset_after_fork)


def watchdog() -> Watchdog:
    """This process's watchdog."""
    return _watchdog
