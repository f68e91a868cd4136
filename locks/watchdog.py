"""One daemon thread that keeps every auto-renewed lease (`ttl=None`) alive.

Each lease is renewed every ttl/3. When the backend says the lock is gone, or the
lease's validity runs out without a successful renewal, the lease is marked lost,
its `on_lost` callbacks run once on this thread, and renewal stops.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from locks.errors import BackendUnavailable, LockLost
from locks.events import EventKind, emit
from locks.provider import Lease

logger = logging.getLogger("locks")

_LOOK_AGAIN = 1.0  # seconds: how soon an idle thread looks at new leases unasked

Renew = Callable[[Lease], bool]
"""Extend the lease by its ttl on its backend: True if still held, False if gone;
raises `BackendUnavailable` when the backend cannot say."""


@dataclass(eq=False)
class _Entry:
    lease: Lease
    renew: Renew
    group: object
    due: float  # monotonic time of the first renewal
    cancelled: bool = field(default=False)


class Watchdog:
    """Most leases are released long before their first renewal (ttl/3), so `watch` and
    `unwatch` take no lock: a new entry goes onto `_arrived`, which the thread drains
    whenever it wakes, and `unwatch` only flags the entry. The lock is taken only when a
    new entry is due before the thread's next look (`_wakes_at`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._heap: list[tuple[float, int, _Entry]] = []  # (due, tie-break, entry)
        self._arrived: list[_Entry] = []  # watched since the thread last looked
        self._entries: dict[int, _Entry] = {}  # by id(lease.state): what is watched now
        self._seq = itertools.count()
        # when the thread next drains `_arrived`; -inf while it is awake and will drain
        self._wakes_at = math.inf
        self._thread: threading.Thread | None = None

    def watch(self, lease: Lease, renew: Renew, group: object) -> None:
        """Renew `lease` until `unwatch`; `group` (its provider) lets `forget` drop it on close."""
        entry = _Entry(lease, renew, group, lease.acquired_at + lease.ttl / 3)
        self._entries[id(lease.state)] = entry
        self._arrived.append(entry)
        # Read after the append, while the thread publishes `_wakes_at` before it looks at
        # `_arrived` a last time: either it sees this entry, or this sees its wake time.
        if entry.due < self._wakes_at:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="locks-watchdog", daemon=True
                    )
                    self._thread.start()
                self._cond.notify()

    def unwatch(self, lease: Lease) -> None:
        """Stop renewing `lease`; a renewal already under way is ignored when it returns."""
        entry = self._entries.pop(id(lease.state), None)
        if entry is not None:
            entry.cancelled = True

    def forget(self, group: object) -> None:
        """Stop renewing every lease of `group` (a provider being closed)."""
        for state_id, entry in list(self._entries.items()):
            if entry.group is group:
                entry.cancelled = True
                self._entries.pop(state_id, None)

    def watching(self, lease: Lease) -> bool:
        return id(lease.state) in self._entries

    def _schedule(self, entry: _Entry, due: float) -> None:
        heapq.heappush(self._heap, (due, next(self._seq), entry))

    def _run(self) -> None:
        while True:
            self._renew(self._next_due())

    def _next_due(self) -> _Entry:
        """Sleep until the earliest live entry is due, taking in arrivals on every wake."""
        with self._lock:
            busy = False  # leases arrived since the last sleep
            while True:
                while self._arrived:
                    busy = True
                    entry = self._arrived.pop()  # one by one: `watch` appends concurrently
                    if not entry.cancelled:
                        self._schedule(entry, entry.due)
                delay: float | None = None
                if self._heap:
                    due, _, entry = self._heap[0]
                    if entry.cancelled:
                        heapq.heappop(self._heap)
                        continue
                    delay = due - time.monotonic()
                    if delay <= 0:
                        heapq.heappop(self._heap)
                        self._wakes_at = -math.inf
                        return entry
                elif busy:
                    # Leases come and go faster than they fall due: look again in a while
                    # rather than sleep for good and be woken by the next `watch`.
                    delay = _LOOK_AGAIN
                self._wakes_at = math.inf if delay is None else time.monotonic() + delay
                if not self._arrived:  # else one came in before `_wakes_at` was published
                    self._cond.wait(delay)
                    busy = False

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
        with self._lock:
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
            self._entries.pop(id(lease.state), None)
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
