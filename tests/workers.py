"""Code run in worker processes (spawned, so each starts with a fresh interpreter)."""

from __future__ import annotations

import threading
import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import NoReturn

from locks import Breaker, FallbackChain, LockNotOwned
from locks.backends import (
    DatabaseProvider,
    LocalProvider,
    RedisHashProvider,
    RedisProvider,
    ZooKeeperProvider,
)
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


def hold_until_broken(
    kind: str, address: str | None, key: str, watchdog_ttl: float, report: Queue[object]
) -> None:
    """Take `key` with a watchdog lease and report (owner, fence); once told it was lost,
    try to release it and report (the loss reason, what the release raised)."""
    provider = make_provider(kind, address, watchdog_ttl=watchdog_ttl)
    told = threading.Event()
    lease = provider.acquire(key, wait=10, on_lost=lambda _: told.set())
    assert lease is not None
    report.put((lease.owner, lease.fence))
    told.wait(30)
    try:
        provider.release(lease)
        outcome = "released"
    except LockNotOwned:
        outcome = "LockNotOwned"
    report.put((lease.state.reason if told.is_set() else "never told", outcome))
    provider.close()


def chain_increment(
    addresses: dict[str, str], mode: str, key: str, counter: str, rounds: int
) -> list[tuple[str, float]]:
    """Read-sleep-write increments through a redis -> zk -> db -> local chain while the
    test kills servers. Returns (tier that granted, monotonic time granted) per round."""
    chain = FallbackChain(
        [
            RedisProvider(addresses["redis"], name="redis", watchdog_ttl=2.0),
            ZooKeeperProvider(addresses["zk"], name="zk", session_timeout=4.0),
            DatabaseProvider(addresses["db"], name="db", watchdog_ttl=2.0),
            LocalProvider(),
        ],
        mode=mode,
        max_lease=2.0,
        breaker=Breaker(reset_timeout=1.0),
    )
    path = Path(counter)
    granted = []
    for _ in range(rounds):
        with chain.lock(key, ttl=2.0, wait=60) as lease:
            granted.append((lease.backend, time.monotonic()))
            value = int(path.read_text())
            time.sleep(0.002)
            path.write_text(str(value + 1))
    for tier in chain.tiers.values():
        tier.close()
    return granted


def safe_chain_acquire(redis_url: str, zk_hosts: str, key: str, max_lease: float) -> str | None:
    """A fresh process, which never saw any outage, takes `key` once through a safe
    redis -> zk chain: the tier that granted it, or None."""
    chain = FallbackChain(
        [
            RedisHashProvider(redis_url, name="redis", watchdog_ttl=max_lease),
            ZooKeeperProvider(zk_hosts, name="zk"),
        ],
        mode="safe",
        max_lease=max_lease,
    )
    try:
        lease = chain.acquire(key, ttl=max_lease, wait=0)
        if lease is None:
            return None
        chain.release(lease)
        return lease.backend
    finally:
        chain.close()
        for tier in chain.tiers.values():
            tier.close()


def cycle_until(kind: str, address: str, key: str, start: float, until: float) -> int:
    """Acquire and release `key` from `start` to `until` (wall clock, which the processes
    share), holding it a millisecond each time; returns how many grants it got."""
    provider = make_provider(kind, address)
    try:
        provider.release(provider.acquire(key, ttl=30, wait=30) or _timed_out(key))  # warm
        time.sleep(max(0.0, start - time.time()))
        grants = 0
        while time.time() < until:
            lease = provider.acquire(key, ttl=30, wait=30) or _timed_out(key)
            time.sleep(0.001)
            provider.release(lease)
            grants += 1
        return grants
    finally:
        provider.close()


def _timed_out(key: str) -> NoReturn:
    raise AssertionError(f"{key!r}: waited 30 s")
