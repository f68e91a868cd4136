"""The asyncio database face's pool of driver connections: the threaded pool's rules
(`locks.backends.dbpool`) on one loop.

Taking a free connection is a list pop with no suspension while nobody waits (LIFO:
the connection just used serves next). Past the limit, tasks queue, each with a
future, and a connection given back goes to the first of them, never to the list for
the task that gave it to take again. A connection idle, or unchecked, for `ping_after`
seconds proves itself first (`alive`: the read-only check on MySQL/MariaDB, a ping
elsewhere); one found dead takes the other idle ones with it, and a ping that failed
slowly (a hung server) is said at once. Closing is the driver's and may suspend: a
discarded connection frees its place at once and is closed in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import exc

from locks.backends.dbpool import Refused
from locks.forking import start_afresh_when_forked

_inherited: list[Any] = []  # in a forked child: the parent's connections, never used

_NEW = object()  # handed to a queued taker: a place is free, open a connection in it
_SLOW_PING = 0.25  # seconds: a ping that failed after this long met a hung server


class Connection:
    """A pooled connection: SQLAlchemy's adapted DBAPI connection (closing it, telling a
    disconnect) and the asyncio driver's own under it (the statements)."""

    __slots__ = ("adapted", "checked_at", "driver", "used_at")

    def __init__(self, adapted: Any, driver: Any) -> None:
        self.adapted = adapted
        self.driver = driver
        self.used_at = self.checked_at = time.monotonic()


class AsyncConnectionPool:
    def __init__(
        self,
        connect: Callable[[], Awaitable[Connection]],
        alive: Callable[[Connection], Awaitable[None]],
        close: Callable[[Connection], Awaitable[None]],
        *,
        size: int,
        timeout: float,
        ping_after: float,
        check_new: bool,
    ) -> None:
        """Opens up to twice `size` connections and keeps those it opened (see
        `give`); a taker waits `timeout` seconds for one. `alive(connection)` raises `Refused`, or
        the driver's error when the connection is dead; with `check_new` it also runs on
        every new connection (the read-only check)."""
        self._connect_one, self._alive, self._close_one = connect, alive, close
        self._limit = 2 * size
        self._timeout = timeout
        self._ping_after = ping_after
        self._check_new = check_new
        self._closed = False
        self._reset()
        start_afresh_when_forked(self)

    def _reset(self) -> None:
        self._idle: list[Connection] = []
        self._queue: deque[asyncio.Future[Any]] = deque()  # takers waiting, first come first
        self._open = 0  # connections made and not yet closed: idle + in use
        self._closing: set[asyncio.Task[None]] = set()

    def after_fork_in_child(self) -> None:
        _inherited.extend(self._idle)  # the parent's sockets: kept, never spoken on
        self._reset()

    async def take(self) -> Connection:
        """A connection for one statement; `give` it back, or `discard` it if broken.
        Raises the driver's error when a new connection cannot be made, `Refused` when
        the server must not be used, or `sqlalchemy.exc.TimeoutError` when all are busy
        for `timeout` seconds."""
        while True:
            connection = self._idle.pop() if self._idle and not self._queue else None
            if connection is None:
                handed = await self._take_in_turn()
                if handed is _NEW:
                    return await self._connect()
                connection = handed
            now = time.monotonic()
            if now - connection.used_at < self._ping_after and (
                not self._check_new or now - connection.checked_at < self._ping_after
            ):
                return connection
            try:
                await self._alive(connection)
            except Refused:  # the server is unfit: so are the other idle connections
                self.discard(connection)
                self.discard_idle()
                raise
            except Exception:
                # Dead: so most likely are those idle as long (see the threaded pool)
                self.discard(connection)
                self.discard_idle()
                if time.monotonic() - now > _SLOW_PING:
                    raise exc.DisconnectionError(
                        "the database did not answer a ping in time"
                    ) from None
                continue
            except BaseException:  # cancelled mid-ping: the place must not be lost
                self.discard(connection)
                raise
            connection.checked_at = time.monotonic()
            return connection

    def give(self, connection: Connection) -> None:
        # Idle ones are kept up to the limit, not to `size` as threads keep them: tasks
        # give their connections back in bursts (the replies a loop turn runs), and
        # closing past `size` made a crowd of 16 tasks over 10 reopen one every 20 ms
        # (a PostgreSQL connect: ~0.7 ms of password hashing on the loop).
        if self._closed or len(self._idle) >= self._limit:
            self.discard(connection)
            return
        connection.used_at = time.monotonic()
        if not self._hand(connection):
            self._idle.append(connection)

    def discard(self, connection: Connection) -> None:
        """Close a connection that may be broken, and free its place."""
        self._close_in_background(connection)
        self._free(1)

    def discard_idle(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            self._close_in_background(connection)
        self._free(len(idle))

    async def close(self) -> None:
        """Close the idle connections (those in use are closed when given back) and
        wait for every close under way."""
        self._closed = True
        self.discard_idle()
        while self._closing:
            await asyncio.wait(list(self._closing))

    def _hand(self, handed: Any) -> bool:
        """Give the first queued taker `handed`; whether there was one."""
        while self._queue:
            taker = self._queue.popleft()
            if not taker.done():
                taker.set_result(handed)
                return True
        return False

    def _free(self, places: int) -> None:
        """`places` connections are gone: queued takers may open new ones in them."""
        self._open -= places
        while places and self._hand(_NEW):
            self._open += 1
            places -= 1

    async def _take_in_turn(self) -> Any:
        """An idle connection, or _NEW when the caller is to open one, in the order the
        takers came."""
        if self._closed or (not self._queue and self._open < self._limit):
            self._open += 1
            return _NEW
        taker: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append(taker)
        try:
            async with asyncio.timeout(self._timeout):
                return await taker
        except BaseException as error:
            timed_out = isinstance(error, TimeoutError)
            if taker.done() and not taker.cancelled():  # handed over as the wait ended
                if timed_out:
                    return taker.result()
                self._hand_back(taker.result())
            if timed_out:
                raise exc.TimeoutError(
                    f"all {self._limit} connections of the lock provider stayed busy "
                    f"for {self._timeout:g} s (raise pool_size?)"
                ) from None
            raise
        finally:
            with contextlib.suppress(ValueError):
                self._queue.remove(taker)

    def _hand_back(self, handed: Any) -> None:
        """What a cancelled taker was handed goes to the next one."""
        if handed is _NEW:
            self._free(1)
        else:
            self.give(handed)

    async def _connect(self) -> Connection:
        """A new connection for a place already counted in `_open`."""
        connection = None
        try:
            connection = await self._connect_one()
            if self._check_new:
                await self._alive(connection)
        except BaseException:
            if connection is not None:
                self._close_in_background(connection)
            self._free(1)
            raise
        return connection

    def _close_in_background(self, connection: Connection) -> None:
        task = asyncio.get_running_loop().create_task(self._close_quietly(connection))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _close_quietly(self, connection: Connection) -> None:
        with contextlib.suppress(Exception):  # already broken or closed
            await self._close_one(connection)
