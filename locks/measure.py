"""Measuring a lock: uncontended cycle rate, hand-off latency, acquire latency percentiles.

The one implementation behind `locks bench` (any configured backend) and `benchmarks/`
(ours next to peer libraries). It measures anything given as a pair of callables:
`acquire(key)` blocks until the lock is held and returns a handle, `release(handle)`
gives it back; `provider_ops` makes that pair for a `LockProvider`, so a peer library
and one of ours are timed by the same loop.

What is measured, and why these three:

- cycle rate: acquire + release of one key nobody else wants, back to back. The cost a
  caller pays per critical section when there is no contention: round trips, scripts,
  commits.
- hand-off: a holder releases while another thread waits for the key; the time from
  the release call to the waiter's acquire returning. This is where backends differ
  most (a watch or a notification answers in a round trip or two, polling in half a
  poll period), and it is invisible in the cycle rate.
- acquire latency p50/p99: single uncontended acquires timed one by one; the tail
  shows pauses (fsync, GC, a reconnect) that a mean over many cycles hides.

Figures move with the machine: compare backends within one run, never assert speed.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from locks.provider import Lease, LockProvider

Acquire = Callable[[str], Any]  # blocks until held, returns a handle for `Release`
Release = Callable[[Any], None]

KEY_PREFIX = "bench:"
SETTLE = 0.05  # s a hand-off waiter gets to reach its wait before the holder releases


def bench_key() -> str:
    """A lock name no one else uses, so no earlier lease or waiter skews a figure."""
    return f"{KEY_PREFIX}{uuid.uuid4().hex}"


def provider_ops(
    provider: LockProvider, *, ttl: float | None = 30.0, wait: float | None = 30.0
) -> tuple[Acquire, Release]:
    """`provider` as an acquire/release pair. A fixed ttl by default: a watchdog lease
    (`ttl=None`) would add renewal traffic that belongs to no single acquire."""

    def acquire(key: str) -> Lease:
        lease = provider.acquire(key, ttl=ttl, wait=wait)
        if lease is None:  # nobody else uses bench keys: this is a fault, not contention
            raise RuntimeError(f"{provider.name}: acquire of {key!r} timed out after {wait} s")
        return lease

    return acquire, provider.release


def warm_up(acquire: Acquire, release: Release, key: str, cycles: int = 50) -> None:
    """Open connections, load scripts and sessions before timing, so the first
    acquire's set-up cost is not counted as lock cost."""
    for _ in range(cycles):
        release(acquire(key))


def cycle_rate(acquire: Acquire, release: Release, key: str, cycles: int) -> float:
    """Acquire+release cycles per second on one uncontended key."""
    if cycles < 1:
        raise ValueError(f"cycles must be >= 1, got {cycles}")
    started = time.perf_counter()
    for _ in range(cycles):
        release(acquire(key))
    return cycles / (time.perf_counter() - started)


def _waiter(acquire: Acquire, release: Release, key: str, outcome: list[Any]) -> None:
    """A waiting thread's part of a hand-off: acquire, note when it returned (or what
    it raised, for the measuring thread to report), release."""
    try:
        handle = acquire(key)
    except BaseException as exc:
        outcome.append(exc)
        return
    outcome.append(time.perf_counter())
    release(handle)


def handoff_latencies(
    acquire: Acquire,
    release: Release,
    samples: int,
    *,
    label: str = "lock",
    settle: float = SETTLE,
    timeout: float = 30.0,
) -> list[float]:
    """Milliseconds from a holder's release call to a waiting thread's acquire returning,
    once per sample, each on a fresh key. The waiter gets `settle` seconds to reach its
    wait first: we time the wake-up, not the waiter's start."""
    latencies = []
    for _ in range(samples):
        key = bench_key()
        held = acquire(key)
        outcome: list[Any] = []  # the waiter's perf_counter() at acquire, or its error
        waiter = threading.Thread(
            target=_waiter, args=(acquire, release, key, outcome), name="locks-bench-waiter",
            daemon=True,
        )  # fmt: skip
        waiter.start()
        time.sleep(settle)
        released_at = time.perf_counter()
        release(held)
        waiter.join(timeout)
        if not outcome:
            raise RuntimeError(f"{label}: the waiter did not acquire within {timeout} s")
        if isinstance(outcome[0], BaseException):  # as it is: a BackendUnavailable stays one
            outcome[0].add_note(f"{label}: raised by the waiting thread of a hand-off")
            raise outcome[0]
        latencies.append((outcome[0] - released_at) * 1000)
    return latencies


def handoff_ms(acquire: Acquire, release: Release, samples: int, *, label: str = "lock") -> float:
    """Median hand-off latency in milliseconds (see `handoff_latencies`): the median,
    because one sample that met a GC pause or a poll period's worst case says little."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    return statistics.median(handoff_latencies(acquire, release, samples, label=label))


def acquire_latencies(acquire: Acquire, release: Release, key: str, samples: int) -> list[float]:
    """Milliseconds of each of `samples` uncontended acquires of `key`; the release after
    each is not timed."""
    latencies = []
    for _ in range(samples):
        started = time.perf_counter()
        handle = acquire(key)
        latencies.append((time.perf_counter() - started) * 1000)
        release(handle)
    return latencies


@dataclass(frozen=True)
class Percentiles:
    """Acquire latency in milliseconds: the typical acquire and its tail."""

    p50: float
    p99: float
    samples: int


def percentiles(latencies: list[float]) -> Percentiles:
    """p50 and p99 by linear interpolation between order statistics; with fewer than
    100 samples p99 is close to the maximum, which is what it then honestly is."""
    if not latencies:
        raise ValueError("no latencies to summarise")
    if len(latencies) == 1:
        return Percentiles(latencies[0], latencies[0], 1)
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return Percentiles(statistics.median(latencies), cuts[98], len(latencies))


def acquire_percentiles(acquire: Acquire, release: Release, key: str, samples: int) -> Percentiles:
    """p50/p99 of `samples` single uncontended acquires of `key`."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    return percentiles(acquire_latencies(acquire, release, key, samples))


@dataclass(frozen=True)
class Figures:
    """Everything `measure_provider` finds for one backend."""

    cycles_per_second: float
    handoff_ms: float
    acquire: Percentiles


def measure_provider(
    provider: LockProvider, *, cycles: int, samples: int, ttl: float = 30.0
) -> Figures:
    """Cycle rate and acquire percentiles over `cycles` each (one key), and the median
    hand-off over `samples`, all on `bench:<uuid>` keys with a fixed `ttl`."""
    acquire, release = provider_ops(provider, ttl=ttl)
    key = bench_key()
    warm_up(acquire, release, key, min(50, cycles))
    rate = cycle_rate(acquire, release, key, cycles)
    tail = acquire_percentiles(acquire, release, key, cycles)
    handoff = handoff_ms(acquire, release, samples, label=provider.name)
    return Figures(rate, handoff, tail)
