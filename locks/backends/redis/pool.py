"""redis-py's blocking connection pool, with a cheaper queue of free connections.

`BlockingConnectionPool` makes a thread past `max_connections` wait up to `pool_timeout`
for a free connection instead of failing at once, which a lock library under a burst of
threads needs. Its queue is a `queue.LifoQueue`, which takes a condition variable on
every get and put: ~4 µs of an uncontended Redis cycle (about 1.5 %) on a 2-core VM,
against the plain pool's list. `FreeConnections` is the part of `LifoQueue` the pool
uses, with a bare lock on the way through and the condition only for a thread that
must wait.
"""

from __future__ import annotations

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


class BlockingPool(redis.BlockingConnectionPool):
    """`BlockingConnectionPool` over `FreeConnections`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("queue_class", FreeConnections)
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
