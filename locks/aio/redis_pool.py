"""redis-py's asyncio pool with a cheap way through, as `locks.backends.redis.pool` is for
threads.

`redis.asyncio.BlockingConnectionPool` takes a condition, a timeout context and a
liveness probe of the socket (`can_read_destructive`) on every get, and records metrics
on every release: about a fifth of an uncontended lock cycle. Here a free connection is
taken without a suspension, and only a task past `max_connections` waits (for a future,
up to `timeout`). No probe: every path that leaves a connection with a reply unread
(an error, a cancellation) disconnects it, ours and redis-py's alike."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from locks.aio.wakeups import new_wakeup, wake, woken_within


class AsyncPool(aioredis.ConnectionPool):
    def __init__(self, *, timeout: float | None = 5.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.timeout = timeout  # how long a task past max_connections waits for one
        self._waiting: collections.deque[asyncio.Future[bool]] = collections.deque()

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        free, in_use = self._available_connections, self._in_use_connections
        while not free and len(in_use) >= self.max_connections:
            await self._wait_for_one()
        connection = free.pop() if free else self.make_connection()  # type: ignore[no-untyped-call]
        in_use.add(connection)
        try:
            await connection.connect()  # nothing to do when it is connected
        except BaseException:
            await self.release(connection)
            raise
        return connection

    async def _wait_for_one(self) -> None:
        woken = new_wakeup()
        self._waiting.append(woken)
        try:
            if not await woken_within(woken, self.timeout):
                raise RedisConnectionError("No connection available.")
        except asyncio.CancelledError:
            if woken.done() and not woken.cancelled() and woken.result():
                self._wake_one()  # it leaves with a wake-up it will not use
            raise
        finally:
            with contextlib.suppress(ValueError):
                self._waiting.remove(woken)

    async def release(self, connection: Any) -> None:
        self._in_use_connections.discard(connection)
        if connection.should_reconnect():
            await connection.disconnect()
        self._available_connections.append(connection)
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiting:
            if wake(self._waiting.popleft()):
                break
