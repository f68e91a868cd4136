"""The database backend's own pool of DBAPI connections, lean enough for a lock's hot path.

Against a durable MariaDB a lock cycle is two fsynced statements, ~600 µs here, and
SQLAlchemy's QueuePool added ~25 µs to each checkout (fairies, events, a queue behind a
Condition): 8 % of the cycle for bookkeeping. Here taking and giving back a connection
is a list pop and append while nobody waits (LIFO: the connection just used serves
next).

When every connection is busy, takers queue up, each with a slot of its own, and a
connection given back goes into the first slot: not back to the list, where the thread
that gave it would take it again at once and starve the queue (every other thread
would time out as "unavailable", the watchdog's renewals with them). While anyone
queues, the fast path is closed.

Connections are made by the engine (its connect events, isolation level and connect
arguments apply) and then detached from the engine's pool: they count against this
pool's limit only. A forked child starts with an empty pool and a fresh engine pool,
and never speaks on its parent's sockets.

A connection idle for `ping_after` seconds is pinged before it serves again. A pool
given a `check` (one round trip that raises `Refused` when the server must not be used:
the database backend's read-only check on MySQL/MariaDB) runs it on every new
connection, and in place of the ping: when a connection is taken that was last checked
`ping_after` seconds ago or more, busy or not. So a server that turns unfit is noticed
within `ping_after` on every connection, for one round trip per connection per
`ping_after`; while it stays fit, a take costs one dictionary lookup more.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from sqlalchemy import exc
from sqlalchemy.engine import Engine

from locks.backends.deadlines import Deadlines
from locks.forking import start_afresh_when_forked

_inherited: list[Any] = []  # in a forked child: the parent's connections, never used

_NEW = object()  # handed to a queued taker: a place is free, open a connection in it
_SLOW_PING = 0.25  # seconds: a ping that failed after this long met a hung server


class Refused(Exception):
    """A pool's `check` found the server answering but not fit to serve (read-only)."""


class _Slot:
    """A queued taker's place: what it is handed arrives here, then `ready` is set."""

    __slots__ = ("handed", "ready")

    def __init__(self) -> None:
        self.handed: Any = None  # (connection, last use), or _NEW
        self.ready = threading.Event()


class ConnectionPool:
    def __init__(
        self,
        engine: Engine,
        size: int,
        timeout: float,
        ping_after: float,
        *,
        check: Callable[[Any], None] | None = None,
        deadlines: Deadlines | None = None,
    ) -> None:
        """Keeps up to `size` idle connections and opens as many again under load; a
        taker waits `timeout` seconds for one; a connection idle for `ping_after`
        seconds is pinged before it serves again. `check(connection)`, if given, is run
        on each new connection and at least every `ping_after` seconds on each (see the
        module's docstring); it raises `Refused`, or the driver's error when the
        connection is dead."""
        self._engine = engine
        self._size = size
        self._limit = 2 * size
        self._timeout = timeout
        self._ping_after = ping_after
        self._check = check
        self._deadlines = deadlines  # a read timeout for drivers without one (pings too)
        self._closed = False
        self._reset()
        start_afresh_when_forked(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[tuple[Any, float]] = []  # (connection, monotonic time of last use)
        self._queue: deque[_Slot] = deque()  # takers waiting, first come first
        self._open = 0  # connections made and not yet closed: idle + in use
        self._checked: dict[int, float] = {}  # id(connection) -> monotonic time of its check

    def after_fork_in_child(self) -> None:
        # The sockets belong to the parent. They are kept, not dropped: some drivers'
        # finalizers (psycopg's) tell the server goodbye, which would end the parent's
        # session. An engine passed in still pools the parent's connections: it gets a
        # fresh pool, as SQLAlchemy advises for a forked child.
        _inherited.extend(connection for connection, _ in self._idle)
        self._reset()
        self._engine.dispose(close=False)

    def take(self) -> Any:
        """A connection for one statement; `give` it back, or `discard` it if broken.
        Raises the driver's error when a new connection cannot be made, or
        `sqlalchemy.exc.TimeoutError` when all are busy for `timeout` seconds."""
        while True:
            entry = None if self._queue else self._pop_idle()
            if entry is None:
                entry = self._take_in_turn()
                if entry is _NEW:
                    return self._connect()
            connection, used_at = entry
            pinged_at = time.monotonic()
            try:
                if self._fresh(connection, used_at, pinged_at) or self._alive(connection):
                    return connection
            except Refused:  # the server is unfit: so are the other idle connections
                self.discard(connection)
                self.discard_idle()
                raise
            except BaseException:  # interrupted while pinging: the place must not be lost
                self.discard(connection)
                raise
            # Dead. The others idle as long most likely are too: close them all rather
            # than ping each in turn (a frozen server would hold every ping for a whole
            # socket timeout). A ping that failed at once means the server closed or
            # restarted: a new connection will do. One that failed slowly means the
            # server hangs: say so now, within this one timeout.
            self.discard(connection)
            self.discard_idle()
            if time.monotonic() - pinged_at > _SLOW_PING:
                raise exc.DisconnectionError("the database did not answer a ping in time")

    def give(self, connection: Any) -> None:
        if self._closed or len(self._idle) >= self._size:
            self.discard(connection)  # closed, or a connection opened for a burst
            return
        self._idle.append((connection, time.monotonic()))
        # Takers queued (the fast path is closed): the first one gets a connection. A
        # taker queues itself before it looks at the list, so reading the queue after
        # the append is enough to never leave a connection idle while someone waits.
        if self._queue:
            with self._lock:
                if self._queue:
                    entry = self._pop_idle()
                    if entry is not None:
                        self._hand(entry)

    def discard(self, connection: Any) -> None:
        """Close a connection that may be broken, and free its place."""
        self._close(connection)
        self._free(1)

    def discard_idle(self) -> None:
        """Close every idle connection: after one was found dead, the server most likely
        went away, and each of the others would fail one more statement."""
        idle = []
        with self._lock:
            # pop, not swap the list: `take` and `give` use it without the lock
            while (entry := self._pop_idle()) is not None:
                idle.append(entry)
        for connection, _ in idle:
            self._close(connection)
        self._free(len(idle))

    def close(self) -> None:
        """Close the idle connections. Those in use are closed when given back, and a
        statement run after `close` (a release, say) gets a connection of its own."""
        self._closed = True
        self.discard_idle()

    def _fresh(self, connection: Any, used_at: float, now: float) -> bool:
        """Whether `connection` may serve without a round trip first: used recently,
        and (with a check) checked recently."""
        if now - used_at >= self._ping_after:
            return False
        if self._check is None:
            return True
        return now - self._checked.get(id(connection), 0.0) < self._ping_after

    def _close(self, connection: Any) -> None:
        self._checked.pop(id(connection), None)
        _close_quietly(connection)

    def _pop_idle(self) -> tuple[Any, float] | None:
        # no `if self._idle` first: a taker on the fast path may pop in between
        try:
            return self._idle.pop()
        except IndexError:
            return None

    def _hand(self, handed: Any) -> None:
        """Give the first queued taker `handed`; the caller holds `_lock`."""
        slot = self._queue.popleft()
        slot.handed = handed
        slot.ready.set()

    def _free(self, places: int) -> None:
        """`places` connections are gone: queued takers may open new ones in them."""
        with self._lock:
            self._open -= places
            while places and self._queue:
                self._open += 1
                self._hand(_NEW)
                places -= 1

    def _take_in_turn(self) -> Any:
        """An idle connection, or _NEW when the caller is to open one, in the order the
        takers came."""
        with self._lock:
            if self._closed:
                self._open += 1
                return _NEW
            slot = _Slot()
            self._queue.append(slot)  # counted first, then looking: see `give`
            if self._queue[0] is slot:
                entry = self._pop_idle()
                if entry is not None:
                    self._queue.popleft()
                    return entry
                if self._open < self._limit:
                    self._queue.popleft()
                    self._open += 1
                    return _NEW
        slot.ready.wait(self._timeout)
        with self._lock:
            if slot.handed is None:
                self._queue.remove(slot)
                raise exc.TimeoutError(
                    f"all {self._limit} connections of the lock provider stayed busy "
                    f"for {self._timeout:g} s (raise pool_size?)"
                )
        return slot.handed

    def _connect(self) -> Any:
        """A new connection for a place already counted in `_open`."""
        connection = None
        try:
            connection = new_connection(self._engine)
            if self._check is not None:
                self._check(connection)
                self._checked[id(connection)] = time.monotonic()
        except BaseException:
            if connection is not None:
                self._close(connection)
            self._free(1)
            raise
        return connection

    def _alive(self, connection: Any) -> bool:
        """One round trip: the check if there is one (its `Refused` propagates), else a
        ping; False if the connection is dead."""
        deadlines = self._deadlines
        ticket = None if deadlines is None else deadlines.start(connection)
        try:
            if self._check is not None:
                self._check(connection)
                self._checked[id(connection)] = time.monotonic()
                return True
            cursor = connection.cursor()
            try:
                cursor.execute("SELECT 1")
                cursor.fetchall()
            finally:
                cursor.close()
        except Refused:
            raise
        except Exception:
            return False
        finally:
            if deadlines is not None and ticket is not None:
                deadlines.stop(ticket)
        return True


def new_connection(engine: Engine) -> Any:
    """A DBAPI connection of its own, made by `engine` (its connect events and
    arguments apply) and detached from the engine's pool, in autocommit mode."""
    proxied = engine.raw_connection()
    connection = proxied.dbapi_connection
    proxied.detach()
    if connection is None:
        raise exc.DisconnectionError("the engine handed out a closed connection")
    try:
        # an engine passed in may run transactions; our statements commit themselves
        engine.dialect.set_isolation_level(connection, "AUTOCOMMIT")
    except BaseException:
        _close_quietly(connection)
        raise
    return connection


def _close_quietly(connection: Any) -> None:
    with contextlib.suppress(Exception):  # already broken or closed: nothing left to free
        connection.close()
