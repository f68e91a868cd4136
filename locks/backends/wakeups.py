"""The waiters of one process on each key of a polling backend, in the order they came.

Only the first waiter on a key (the head) asks the database; the others sleep until
they are woken. So a process sends one poll per key per interval however many of its
threads wait, and its waiters are served first come, first served. A waiter is woken:
- when a thread of this process releases the key (`wake`): the head tries at once;
- when a release in another process is heard of (PostgreSQL's NOTIFY, `wake`);
- when the head leaves (granted, timed out, failed): the next one becomes the head
  and starts asking;
- when notices may have been missed (`wake_all`).
A wake-up that comes to nothing (another process took the lock first) only means one
more try, so nothing here is needed for correctness.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

from locks.forking import start_afresh_when_forked


class Waiter:
    """One thread's place in a key's line."""

    __slots__ = ("_event", "_line")

    def __init__(self, line: deque[threading.Event], event: threading.Event) -> None:
        self._line = line
        self._event = event

    @property
    def first(self) -> bool:
        """Whether this waiter is the head, the one that asks the database."""
        line = self._line
        return bool(line) and line[0] is self._event

    def sleep(self, seconds: float) -> None:
        """Sleep up to `seconds`; returns early when woken."""
        if seconds > 0:
            self._event.wait(seconds)
        self._event.clear()


class Wakeups:
    def __init__(self) -> None:
        self._reset()
        start_afresh_when_forked(self)

    def after_fork_in_child(self) -> None:
        self._reset()  # the parent's waiting threads do not exist here

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._lines: dict[str, deque[threading.Event]] = {}

    @contextmanager
    def waiting(self, key: str) -> Iterator[Waiter]:
        """Count the caller in `key`'s line until the block ends."""
        event = threading.Event()
        with self._lock:
            line = self._lines.setdefault(key, deque())
            line.append(event)
        try:
            yield Waiter(line, event)
        finally:
            with self._lock:
                was_first = bool(line) and line[0] is event
                if event in line:  # gone if forked meanwhile
                    line.remove(event)
                if not line:
                    self._lines.pop(key, None)
                elif was_first:
                    line[0].set()  # the next one asks from now on

    def wake(self, key: str) -> None:
        """`key` was released: the head of its line tries at once."""
        if not self._lines:  # nobody waits on anything: no lock taken on this path
            return
        with self._lock:
            line = self._lines.get(key)
            if line:
                line[0].set()

    def wake_all(self) -> None:
        """Releases may have gone unheard: every head looks again."""
        with self._lock:
            for line in self._lines.values():
                if line:
                    line[0].set()
