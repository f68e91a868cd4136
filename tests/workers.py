"""Code run in worker processes (spawned, so each starts with a fresh interpreter)."""

from __future__ import annotations

import time
from multiprocessing.synchronize import Event as EventType
from pathlib import Path

from tests.backends import make_provider


def increment(
    kind: str, address: str | None, key: str, counter: str, rounds: int
) -> list[tuple[int, int]]:
    """`rounds` read-sleep-write increments of the number in `counter` under the lock.
    Returns (value read, fence) per round, for the caller's ordering check."""
    provider = make_provider(kind, address)
    path = Path(counter)
    seen = []
    try:
        for _ in range(rounds):
            with provider.lock(key, ttl=30, wait=60) as lease:
                value = int(path.read_text())
                time.sleep(0.0005)
                path.write_text(str(value + 1))
                seen.append((value, lease.fence))
    finally:
        provider.close()
    return seen


def hold_until_killed(
    kind: str, address: str | None, key: str, watchdog_ttl: float, held: EventType
) -> None:
    """Take `key` with a watchdog lease, say so, then wait for SIGKILL."""
    provider = make_provider(kind, address, watchdog_ttl=watchdog_ttl)
    lease = provider.acquire(key, wait=10)
    assert lease is not None
    held.set()
    time.sleep(120)
