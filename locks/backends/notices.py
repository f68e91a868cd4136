"""PostgreSQL's LISTEN/NOTIFY, for waiters in other processes.

Every release of a lock (and every break) notifies one channel per lock table with the
lock's name as payload, in the same statement. A provider that has waiters keeps one
connection of its own LISTENing on that channel, on a thread, and hands each name to
`on_notice`, which wakes this process's first waiter on it: a release in one process
reaches a waiter in another in about a round trip, not a poll interval.

Nothing here is needed for correctness. A waiter subscribes (`listen`) before it looks
at the row again, so a release between its failed try and its sleep is never missed;
when the listening connection breaks (a restart, a failover), every waiter is woken to
look again, and the connection is made anew. While it cannot be, waiters poll.
"""

from __future__ import annotations

import logging
import select
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import Engine

from locks.backends.dbpool import new_connection
from locks.forking import start_afresh_when_forked

logger = logging.getLogger("locks")

_RETRY = 0.5  # seconds between attempts to listen again after the connection broke
_LOOK = 1.0  # seconds between looks at `closed` while no notice comes


class Notices:
    def __init__(
        self,
        engine: Engine,
        channel: str,
        *,
        on_notice: Callable[[str], None],
        on_gap: Callable[[], None],
        timeout: float,
        name: str,
    ) -> None:
        """`on_notice(payload)` for each notice; `on_gap()` when notices may have been
        missed (the connection broke): every waiter should look again. `timeout`: how
        long `listen` waits for the subscription."""
        self._engine = engine
        self._channel = channel
        self._on_notice = on_notice
        self._on_gap = on_gap
        self._timeout = timeout
        self._name = name
        self._closed = False
        self._reset()
        start_afresh_when_forked(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._listening = threading.Event()  # a subscription is in place now
        self._thread: threading.Thread | None = None

    def after_fork_in_child(self) -> None:
        self._reset()  # the parent's thread and connection are not the child's

    def listen(self) -> bool:
        """Make sure this process is subscribed; whether it is (False: not within the
        timeout, so the caller polls)."""
        if self._listening.is_set():
            return True
        with self._lock:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
        return self._listening.wait(self._timeout)

    def close(self) -> None:
        self._closed = True

    def _run(self) -> None:
        while not self._closed:
            connection = None
            try:
                connection = self._subscribe()
                while not self._closed:
                    for payload in _drain(connection, _LOOK):
                        self._on_notice(payload)
            except Exception as error:  # a broken connection, whatever the driver says
                if not self._closed:
                    logger.debug("listening for lock releases stopped: %s", error)
            finally:
                self._listening.clear()
                if connection is not None:
                    _close_quietly(connection)
            if not self._closed:
                self._on_gap()  # what was released meanwhile was not heard of
                threading.Event().wait(_RETRY)

    def _subscribe(self) -> Any:
        connection = new_connection(self._engine)
        cursor = connection.cursor()
        try:
            cursor.execute(listen_to(self._channel))
        finally:
            cursor.close()
        self._listening.set()
        return connection


def listen_to(channel: str) -> str:
    quoted = channel.replace('"', '""')
    return f'LISTEN "{quoted}"'


def _drain(connection: Any, timeout: float) -> list[str]:
    """The payloads that arrived, or arrive within `timeout` (none: an empty list).
    Raises when the connection is broken."""
    payloads = _arrived(connection, read=False)  # a notice read along with a reply
    if payloads:
        return payloads
    readable, _, _ = select.select([connection.fileno()], [], [], timeout)
    return _arrived(connection, read=True) if readable else []


def _arrived(connection: Any, *, read: bool) -> list[str]:
    """What the driver has received, psycopg 3 or psycopg2; `read`: read the socket."""
    notifies = connection.notifies
    if callable(notifies):  # psycopg 3: a generator over the received, reading more
        return [notice.payload for notice in notifies(timeout=0)]
    if read:
        connection.poll()  # psycopg2: reads what arrived into the `notifies` list
    payloads = [notice.payload for notice in notifies]
    notifies.clear()
    return payloads


def _close_quietly(connection: Any) -> None:
    try:
        connection.close()
    except Exception:  # already broken: nothing left to free
        logger.debug("closing the listening connection failed", exc_info=True)
