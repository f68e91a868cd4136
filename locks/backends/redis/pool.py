"""redis-py's blocking connection pool, with a cheaper queue of free connections.

`BlockingConnectionPool` makes a thread past `max_connections` wait up to `pool_timeout`
for a free connection instead of failing at once, which a lock library under a burst of
threads needs. Its queue is a `queue.LifoQueue`, which takes a condition variable on
every get and put: ~4 µs of an uncontended Redis cycle (about 1.5 %) on a 2-core VM,
against the plain pool's list. `FreeConnections` is the part of `LifoQueue` the pool
uses, with a bare lock on the way through and the condition only for a thread that
must wait. Its `get_connection` and `release` also record redis-py's connection metrics
(four counter updates and a pool name formatted per checkout, ~2 µs of the ~7 a
checkout and return cost): while those metrics are off (redis-py's OpenTelemetry
support, opt-in) `BlockingPool` takes a connection and gives it back without them,
with the same checks (fork, a socket the server closed, data waiting where the server
does not push, a pool that no longer owns the connection); anything unusual
(maintenance, client-side caching, a connection still to make) goes through redis-py's
own path.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from typing import Any

import redis


class FreeConnections:
    """Last in, first out (the pool's order: the warmest connection first). `None`
    stands for a connection not made yet, as in redis-py's pool."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self.queue: list[Any] = []  # read by the pool (its size, its connections)
        self._lock = threading.Lock()
        self._put = threading.Condition(self._lock)
        self._waiting = 0

    def put_nowait(self, item: Any) -> None:
        with self._lock:
            if len(self.queue) >= self.maxsize:
                raise queue.Full
            self.queue.append(item)
            if self._waiting:
                self._put.notify()

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        with self._lock:
            if self.queue:
                return self.queue.pop()
            if not block:
                raise queue.Empty
            deadline = None if timeout is None else time.monotonic() + timeout
            self._waiting += 1
            try:
                while not self.queue:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise queue.Empty
                    self._put.wait(left)
                return self.queue.pop()
            finally:
                self._waiting -= 1


try:  # redis-py 8: connection metrics, recorded only once OpenTelemetry is set up
    from redis.observability.providers import get_observability_instance
except ImportError:  # older: none recorded
    get_observability_instance = None  # type: ignore[assignment]


def _metrics_recorded() -> bool:
    """Whether redis-py records connection metrics now (they can be switched on late)."""
    if get_observability_instance is None:
        return False
    manager = get_observability_instance().get_provider_manager()
    return manager is not None and bool(manager.config.enabled_telemetry)


class BlockingPool(redis.BlockingConnectionPool):
    """`BlockingConnectionPool` over `FreeConnections`, checked out and back without
    redis-py's metrics while they are off (the module's docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("queue_class", FreeConnections)
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]

    def _plain(self) -> bool:
        """Whether a checkout needs nothing redis-py's own path adds."""
        return (
            not getattr(self, "_in_maintenance", False)
            and getattr(self, "cache", None) is None
            and not _metrics_recorded()
        )

    def _pushes(self) -> bool:
        """Whether the server may push on an idle connection (maintenance notices, on by
        default in redis-py 8): data waiting is then no sign of a reply left unread."""
        enabled = getattr(self, "maint_notifications_enabled", None)
        return enabled is not None and bool(enabled())

    def get_connection(self, *args: Any, **options: Any) -> Any:
        if not self._plain():
            return self._counted(*args, **options)
        self._checkpid()
        try:
            connection = self.pool.get(block=True, timeout=self.timeout)
        except queue.Empty:
            raise redis.ConnectionError("No connection available.") from None
        if connection is None:  # one still to make: redis-py makes and counts it
            self.pool.put_nowait(None)
            return self._counted(*args, **options)
        try:
            connection.connect()
            # a connection closed by the server while it idled, or (unless the server
            # may push) given back before its reply was read: a fresh one, as redis-py's
            # own path does
            try:
                if connection.can_read() and not self._pushes():
                    raise redis.ConnectionError("Connection has data")
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                connection.disconnect()
                connection.connect()
                if connection.can_read() and not self._pushes():
                    raise redis.ConnectionError("Connection not ready") from None
        except BaseException:
            self.release(connection)
            raise
        return connection

    def _counted(self, *args: Any, **options: Any) -> Any:
        """redis-py's own checkout, metrics and all (its arguments are deprecated: passed
        on only as given)."""
        return super().get_connection(*args, **options)  # type: ignore[no-untyped-call]

    def release(self, connection: Any) -> None:
        if os.getpid() != self.pid or not self.owns_connection(connection) or not self._plain():
            super().release(connection)  # type: ignore[no-untyped-call]
            return
        if connection.should_reconnect():
            connection.disconnect()
        with contextlib.suppress(queue.Full):
            self.pool.put_nowait(connection)
