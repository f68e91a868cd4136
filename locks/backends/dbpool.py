"""The database backend's own pool of DBAPI connections, lean enough for a lock's hot path.

Against a durable MariaDB a lock cycle is two fsynced statements, ~600 µs here, and
SQLAlchemy's QueuePool added ~25 µs to each checkout (fairies, events, a queue behind a
Condition): 8 % of the cycle for bookkeeping. Here taking and giving back a connection
is a list pop and append while nobody waits (LIFO: the connection just used serves
next). When every connection is busy, takers wait on a Condition, and the fast path
stays closed while anyone waits, so a connection given back goes through the Condition,
which wakes waiters in the order they came.

Connections are made by the engine (its connect events, isolation level and connect
arguments apply) and then detached from the engine's pool: they count against this
pool's limit only. A forked child starts with an empty pool and never touches its
parent's sockets.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from typing import Any

from sqlalchemy import exc
from sqlalchemy.engine import Engine

_pools: weakref.WeakSet[ConnectionPool] = weakref.WeakSet()
_inherited: list[Any] = []  # in a forked child: the parent's connections, never used


class ConnectionPool:
    def __init__(self, engine: Engine, size: int, timeout: float, ping_after: float) -> None:
        """Keeps up to `size` idle connections and opens as many again under load; a
        taker waits `timeout` seconds for one; a connection idle for `ping_after`
        seconds is pinged before it serves again."""
        self._engine = engine
        self._size = size
        self._limit = 2 * size
        self._timeout = timeout
        self._ping_after = ping_after
        self._reset()
        _pools.add(self)

    def _reset(self) -> None:
        self._idle: list[tuple[Any, float]] = []  # (connection, monotonic time of last use)
        self._open = 0  # connections made and not yet closed: idle + in use
        self._waiting = 0
        self._closed = False
        self._cond = threading.Condition(threading.Lock())

    def take(self) -> Any:
        """A connection for one statement; `give` it back, or `discard` it if broken.
        Raises the driver's error when a new connection cannot be made, or
        `sqlalchemy.exc.TimeoutError` when all are busy for `timeout` seconds."""
        while True:
            entry = None
            if not self._waiting:
                try:
                    entry = self._idle.pop()
                except IndexError:  # none idle (no `if`: another thread may pop between)
                    entry = None
            if entry is None:
                entry = self._take_in_turn()
                if entry is None:
                    return self._connect()
            connection, used_at = entry
            if time.monotonic() - used_at < self._ping_after or self._alive(connection):
                return connection
            self.discard(connection)  # the server closed it, or restarted: try another

    def give(self, connection: Any) -> None:
        if self._closed or len(self._idle) >= self._size:
            self.discard(connection)  # closed, or a connection opened for a burst
            return
        self._idle.append((connection, time.monotonic()))
        if self._waiting:  # read after the append: a waiter counted itself before looking
            with self._cond:
                self._cond.notify()
        if self._closed:  # closed while this was being given back
            self.discard_idle()

    def discard(self, connection: Any) -> None:
        """Close a connection that may be broken, and free its place."""
        _close_quietly(connection)
        with self._cond:
            self._open -= 1
            self._cond.notify()

    def discard_idle(self) -> None:
        """Close every idle connection: after one was found dead, the server most likely
        went away, and each of the others would fail one more statement."""
        idle = []
        with self._cond:
            while True:  # pop, not swap the list: `take` and `give` use it without the lock
                try:
                    idle.append(self._idle.pop())
                except IndexError:
                    break
            self._open -= len(idle)
            self._cond.notify_all()
        for connection, _ in idle:
            _close_quietly(connection)

    def close(self) -> None:
        """Close the idle connections; those in use are closed when given back."""
        self._closed = True
        self.discard_idle()

    def _take_in_turn(self) -> tuple[Any, float] | None:
        """An idle connection, or None when the caller is to make a new one."""
        deadline = time.monotonic() + self._timeout
        with self._cond:
            self._waiting += 1
            try:
                while True:
                    if self._closed:
                        raise RuntimeError("the database lock provider was closed")
                    if self._idle:
                        return self._idle.pop()
                    if self._open < self._limit:
                        self._open += 1
                        return None
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise exc.TimeoutError(
                            f"all {self._limit} connections of the lock provider stayed "
                            f"busy for {self._timeout:g} s (raise pool_size?)"
                        )
                    self._cond.wait(left)
            finally:
                self._waiting -= 1

    def _connect(self) -> Any:
        """A new connection for a place already counted in `_open`."""
        connection = None
        try:
            proxied = self._engine.raw_connection()
            connection = proxied.dbapi_connection
            proxied.detach()
            if connection is None:
                raise exc.DisconnectionError("the engine handed out a closed connection")
            # an engine passed in may run transactions; our statements commit themselves
            self._engine.dialect.set_isolation_level(connection, "AUTOCOMMIT")
        except BaseException:
            if connection is not None:
                _close_quietly(connection)
            with self._cond:
                self._open -= 1
                self._cond.notify()
            raise
        return connection

    def _alive(self, connection: Any) -> bool:
        try:
            cursor = connection.cursor()
            try:
                cursor.execute("SELECT 1")
                cursor.fetchall()
            finally:
                cursor.close()
        except Exception:
            return False
        return True


def _close_quietly(connection: Any) -> None:
    with contextlib.suppress(Exception):  # already broken or closed: nothing left to free
        connection.close()


def _forget_parents_connections() -> None:
    # The sockets belong to the parent. They are kept, not dropped: some drivers' finalizers
    # (psycopg's) tell the server goodbye, which would end the parent's session.
    for pool in list(_pools):
        _inherited.extend(connection for connection, _ in pool._idle)
        pool._reset()


os.register_at_fork(after_in_child=_forget_parents_connections)
