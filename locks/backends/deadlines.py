"""A read timeout for database drivers that have none.

libpq (under psycopg 3 and psycopg2) waits for a reply for ever: a PostgreSQL server
that is frozen (SIGSTOP, a VM paused, a partition that drops nothing) holds the call,
and the lock's `wait`, with it. Its `connect_timeout` covers connecting only, and the
server-side `statement_timeout` needs a server that runs. So each statement is given a
deadline here, and a thread shuts down the socket of one still running past it: the
driver's read then fails at once ("server closed the connection"), which is an outage
like any other (`BackendUnavailable`), and the connection is discarded.

A statement costs two dictionary operations and two uncontended locks, and never wakes
the thread: it looks every quarter of the timeout (a deadline is set that much early,
so a frozen call still ends within one timeout), and ends after a minute with nothing
to watch. Waking it on every statement cost a context switch per statement: ~30 µs of
a 290 µs PostgreSQL cycle.
"""

from __future__ import annotations

import itertools
import socket
import threading
import time
from typing import Any

from locks.forking import start_afresh_when_forked

_IDLE_END = 60.0  # seconds with nothing to watch before the thread ends


class Deadlines:
    def __init__(self, timeout: float, name: str) -> None:
        self.timeout = timeout
        self.name = name
        self._look_every = timeout / 4
        self._reset()
        start_afresh_when_forked(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._closed = threading.Event()  # never set: the thread's interruptible sleep
        self._running: dict[int, tuple[float, int]] = {}  # ticket -> (deadline, fd)
        self._tickets = itertools.count()
        self._thread: threading.Thread | None = None

    def after_fork_in_child(self) -> None:
        self._reset()

    def start(self, connection: Any) -> int:
        """A statement on `connection` begins: its ticket, for `stop`."""
        ticket = next(self._tickets)
        entry = (time.monotonic() + self.timeout - self._look_every, connection.fileno())
        with self._lock:
            self._running[ticket] = entry
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
        return ticket

    def stop(self, ticket: int) -> None:
        """The statement is over. Under the lock: once this returns, its socket is never
        shut down, whatever happens to its file descriptor next."""
        with self._lock:
            self._running.pop(ticket, None)

    def _run(self) -> None:
        idle_since = time.monotonic()
        while True:
            self._closed.wait(self._look_every)
            now = time.monotonic()
            with self._lock:
                overdue = [t for t, (deadline, _) in self._running.items() if deadline <= now]
                for ticket in overdue:
                    _shut_down(self._running.pop(ticket)[1])
                if self._running:
                    idle_since = now
                elif now - idle_since > _IDLE_END:
                    self._thread = None  # the next statement starts another
                    return


def _shut_down(fd: int) -> None:
    """End the connection under `fd` both ways without closing the descriptor, which
    belongs to the driver: its blocked read returns at once."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return  # not a socket (any more)
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.detach()  # the driver still owns the descriptor
