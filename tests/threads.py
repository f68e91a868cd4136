"""Running a call as another owner: on a thread of its own; timing a wake-up."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from locks.provider import Lease, LockProvider

T = TypeVar("T")


def in_thread(call: Callable[[], T]) -> T:
    """Run `call` on another thread (another owner) and return its result."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(call).result(timeout=60)


def woken_after(holder: LockProvider, lease: Lease, waiter: LockProvider) -> float:
    """Seconds from `lease`'s release to a thread waiting on its key with `waiter`
    getting the lock (inf if it never did): the waiter waits with a 30 s ttl and wait
    20 s, parked 0.3 s before the release, so only a wake-up makes this small."""
    acquired_at: list[float] = []

    def wait_for_it() -> None:
        other = waiter.acquire(lease.key, ttl=30, wait=20)
        acquired_at.append(time.monotonic())
        assert other is not None
        waiter.release(other)

    thread = threading.Thread(target=wait_for_it)
    thread.start()
    time.sleep(0.3)  # subscribed and sleeping on the holder's 30 s pttl
    released_at = time.monotonic()
    holder.release(lease)
    thread.join(25)
    return acquired_at[0] - released_at if acquired_at else math.inf
