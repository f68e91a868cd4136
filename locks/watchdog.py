"""Renewal of auto-renewed leases (`ttl=None`): one daemon thread per provider, and one
reaper for the whole process.

Each provider renews its own holds on its own thread, so a backend that hangs delays
only its own renewals, never another backend's. A renewal that hangs must still not hide
a loss: while a provider's thread is inside a renewal call, the reaper (which does no
I/O at all) watches the validity of that provider's leases and marks them lost, running
their `on_lost` callbacks, the moment it runs out.

`on_lost` callbacks run on one of these threads: keep them short.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from locks.errors import LockLost
from locks.events import EventKind, emit
from locks.forking import start_afresh_when_forked
from locks.provider import Lease

logger = logging.getLogger("locks")

_LOOK_AGAIN = 1.0  # seconds: how soon an idle thread looks at new items unasked
_BATCH = 500  # items due together renewed in one call of `renew_many`
_GATHER = 0.02  # s: where they are, items due this soon are renewed with the one due now
_DRAIN_AT = 1024  # arrivals waiting for the thread: past this, it is woken to take them in


class Renewable(Protocol):
    def renew(self) -> float | None:
        """Renew now (I/O allowed): the monotonic time of the next renewal, or None to
        stop renewing. Handles its own errors and losses."""

    def expire(self, now: float) -> float | None:
        """Without I/O: mark lost what has run out of validity by `now`; return when the
        next validity runs out, or None if nothing is left to watch."""


@dataclass(eq=False)
class _Entry:
    item: Renewable
    due: float  # monotonic time of the first renewal
    cancelled: bool = field(default=False)


class Watchdog:
    """Most leases are released long before their first renewal (ttl/3), so `watch` and
    `unwatch` take no lock: a new entry goes onto `_arrived`, which the thread drains
    whenever it wakes, and `unwatch` only flags the entry. The lock is taken only when a
    new entry is due before the thread's next look (`_wakes_at`)."""

    def __init__(
        self,
        name: str = "locks-watchdog",
        renew_many: Callable[[Sequence[Renewable]], list[float | None]] | None = None,
    ) -> None:
        """`renew_many`: renews the items due together at once (a provider pipelines
        their extends), in place of each item's `renew`; returns each one's next due."""
        self.name = name
        self._renew_many = renew_many
        self._reset()
        start_afresh_when_forked(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._heap: list[tuple[float, int, _Entry]] = []  # (due, tie-break, entry)
        self._arrived: list[_Entry] = []  # watched since the thread last looked
        self._entries: dict[int, _Entry] = {}  # by id(item): what is watched now
        self._seq = itertools.count()
        # when the thread next drains `_arrived`; -inf while it is awake and will drain
        self._wakes_at = math.inf
        self._thread: threading.Thread | None = None
        self._closed = False
        self.busy: list[_Entry] = []  # the entries whose renewal is under way

    def after_fork_in_child(self) -> None:
        self._reset()  # the thread is gone, and the parent's items are not the child's

    def watch(self, item: Renewable, due: float) -> None:
        """Call `item.renew()` at `due`, then whenever it asks, until `unwatch`."""
        entry = _Entry(item, due)
        self._entries[id(item)] = entry
        self._arrived.append(entry)
        # Read after the append, while the thread publishes `_wakes_at` before it looks at
        # `_arrived` a last time: either it sees this entry, or this sees its wake time.
        # Arrivals (each keeping its item, mostly released already) are taken in at
        # least every `_DRAIN_AT`: a thread asleep until a lease due in 30 s otherwise
        # kept every lease released meanwhile, 300 MB at 10,000 a second.
        if entry.due < self._wakes_at or len(self._arrived) >= _DRAIN_AT:
            with self._lock:
                if self._thread is None and not self._closed:
                    self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                    self._thread.start()
                self._cond.notify()

    def unwatch(self, item: Renewable) -> None:
        """Stop renewing `item`; a renewal already under way is ignored when it returns."""
        entry = self._entries.pop(id(item), None)
        if entry is not None:
            entry.cancelled = True

    def watching(self, item: Renewable) -> bool:
        return id(item) in self._entries

    def close(self) -> None:
        """Stop renewing everything; the thread ends."""
        with self._lock:
            self._closed = True
            for entry in self._entries.values():
                entry.cancelled = True
            self._entries.clear()
            self._cond.notify()

    def _schedule(self, entry: _Entry, due: float) -> None:
        heapq.heappush(self._heap, (due, next(self._seq), entry))

    def _run(self) -> None:
        while True:
            entries = self._next_due()
            if not entries:
                return
            self._renew(entries)

    def _next_due(self) -> list[_Entry]:
        """Sleep until the earliest live entry is due, taking in arrivals on every wake;
        then every entry due by now (up to `_BATCH` where they are renewed together)."""
        with self._lock:
            busy = False  # entries arrived since the last sleep
            while not self._closed:
                while self._arrived:
                    busy = True
                    entry = self._arrived.pop()  # one by one: `watch` appends concurrently
                    if not entry.cancelled:
                        self._schedule(entry, entry.due)
                if len(self._heap) > 2 * len(self._entries) + 64:  # mostly released: compact
                    self._heap = [item for item in self._heap if not item[2].cancelled]
                    heapq.heapify(self._heap)
                delay: float | None = None
                if self._heap:
                    due, _, entry = self._heap[0]
                    if entry.cancelled:
                        heapq.heappop(self._heap)
                        continue
                    delay = due - time.monotonic()
                    if delay <= 0:
                        self._wakes_at = -math.inf
                        self.busy = self._take_due(time.monotonic())
                        return self.busy
                elif busy:
                    # Items come and go faster than they fall due: look again in a while
                    # rather than sleep for good and be woken by the next `watch`.
                    delay = _LOOK_AGAIN
                self._wakes_at = math.inf if delay is None else time.monotonic() + delay
                if not self._arrived:  # else one came in before `_wakes_at` was published
                    self._cond.wait(delay)
                    busy = False
            self._thread = None
            return []

    def _take_due(self, now: float) -> list[_Entry]:
        """Under the lock: the live entries due by `now`, earliest first; where they are
        renewed together, also those due within `_GATHER` (a little early, so that one
        round trip serves many)."""
        limit, until = (1, now) if self._renew_many is None else (_BATCH, now + _GATHER)
        taken: list[_Entry] = []
        while self._heap and len(taken) < limit and self._heap[0][0] <= until:
            entry = heapq.heappop(self._heap)[2]
            if not entry.cancelled:
                taken.append(entry)
        return taken

    def _renew(self, entries: list[_Entry]) -> None:
        reaper.guard(self)
        items = [entry.item for entry in entries]
        try:
            if self._renew_many is None:
                dues = [item.renew() for item in items]
            else:
                dues = self._renew_many(items)
        except Exception:  # a bug in a backend must not end every lease's renewal
            logger.exception("renewal on %s failed", self.name)
            dues = [None] * len(entries)
        finally:
            reaper.unguard(self)
        with self._lock:
            self.busy = []
            for entry, due in zip(entries, dues, strict=True):
                if entry.cancelled:
                    continue
                if due is None:
                    self._entries.pop(id(entry.item), None)
                    continue
                self._schedule(entry, due)

    def expire(self, now: float) -> float | None:
        """For the reaper, while this watchdog's thread is stuck in a renewal: mark lost
        what ran out of validity; return when the next validity runs out."""
        with self._lock:
            entries = [entry for _, _, entry in self._heap if not entry.cancelled]
            entries += self.busy
        deadlines = [entry.item.expire(now) for entry in entries]
        return min((d for d in deadlines if d is not None), default=None)


class Reaper:
    """Marks leases lost on time while their provider's thread is stuck inside a renewal.
    It does no I/O, so nothing a server does can hold it up."""

    _GRACE = 0.05  # a renewal shorter than this never wakes the reaper

    def __init__(self) -> None:
        self._reset()
        start_afresh_when_forked(self)

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._busy: dict[int, tuple[Watchdog, float]] = {}  # id -> (watchdog, since)
        self._thread: threading.Thread | None = None

    def after_fork_in_child(self) -> None:
        self._reset()

    def guard(self, watchdog: Watchdog) -> None:
        with self._cond:
            self._busy[id(watchdog)] = (watchdog, time.monotonic())
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="locks-reaper", daemon=True)
                self._thread.start()
            elif len(self._busy) == 1:
                self._cond.notify()

    def unguard(self, watchdog: Watchdog) -> None:
        with self._cond:
            self._busy.pop(id(watchdog), None)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._busy:
                    self._cond.wait()
                now = time.monotonic()
                earliest = min(since for _, since in self._busy.values()) + self._GRACE
                stuck = [dog for dog, since in self._busy.values() if since + self._GRACE <= now]
            if not stuck:
                time.sleep(max(0.0, earliest - now))
                continue
            wake = now + 1.0  # look again at least this often while something is stuck
            for dog in stuck:
                deadline = dog.expire(now)
                if deadline is not None:
                    wake = min(wake, deadline)
            time.sleep(max(0.001, wake - time.monotonic()))


reaper = Reaper()


def mark_lost(lease: Lease, reason: str, *, releasing: bool = False) -> None:
    """Mark `lease` lost, emit the event and run its callbacks, each once
    (`LeaseState.mark_lost` says what `releasing` allows)."""
    callbacks = lease.state.mark_lost(reason, releasing=releasing)
    if callbacks is None:
        return
    emit(EventKind.LOST, lease.backend, lease.key, lease, error=LockLost(reason))
    for callback in callbacks:
        try:
            callback(lease)
        except Exception:
            logger.exception("on_lost callback for %r failed", lease.key)
