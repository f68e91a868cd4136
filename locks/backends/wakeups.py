"""Wake-ups between threads of one process that wait on the same lock of a polling backend.

The database backend waits by polling, 10 ms up to 200 ms apart. When the lock is
released by a thread of this same process, the waiter need not sleep out its pause:
the release wakes the longest-waiting thread on that key, which tries again at once and
then moves to the back of the line. Waiters in other processes still poll, and a
wake-up that comes to nothing (another process took the lock first) only means one
more try, so nothing here is needed for correctness.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from locks.forking import start_afresh_when_forked


class Wakeups:
    def __init__(self) -> None:
        self._reset()
        start_afresh_when_forked(self)

    def after_fork_in_child(self) -> None:
        self._reset()  # the parent's waiting threads do not exist here

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[str, deque[threading.Event]] = {}

    @contextmanager
    def waiting(self, key: str) -> Iterator[Callable[[float], None]]:
        """Count the caller as waiting on `key`; yields `sleep(seconds)`, which returns
        early when a thread of this process releases `key`."""
        event = threading.Event()
        with self._lock:
            self._waiting.setdefault(key, deque()).append(event)
        try:
            yield lambda seconds: _sleep(event, seconds)
        finally:
            with self._lock:
                queue = self._waiting.get(key)
                if queue is not None and event in queue:  # gone if forked meanwhile
                    queue.remove(event)
                    if not queue:
                        del self._waiting[key]

    def wake(self, key: str) -> None:
        """`key` was released here: wake the thread that has waited longest for it."""
        if not self._waiting:  # nobody waits on anything: no lock taken on this path
            return
        with self._lock:
            queue = self._waiting.get(key)
            if not queue:
                return
            event = queue[0]
            queue.rotate(-1)  # the next release wakes the next waiter
        event.set()


def _sleep(event: threading.Event, seconds: float) -> None:
    if seconds > 0:
        event.wait(seconds)
    event.clear()
