"""The asyncio face (`locks.aio`) next to the asyncio peers, against one redis-server.

    python -m benchmarks.aio [--cycles 2000] [--rounds 5] [--samples 20] [--seconds 4]
                             [--tasks 1000] [--keys 100] [--threads 16] [--peer-wait 10]
                             [--no-peer-crowd] [--json PATH] [--no-write] [--quick]

Starts its own redis-server on a free loopback port (no persistence) and measures, in one
run and, but for the threaded crowd, on one event loop (one `asyncio.run`):

1. Uncontended cycles/s: acquire + release of one key by one task, `--cycles` per round,
   `--rounds` rounds interleaved across the contenders (as `benchmarks.harness` does), the
   median kept. Ours (`locks.aio.RedisProvider`, `RedisHashProvider`; ttl 30 s, wait
   30 s), redis-py's `redis.asyncio.lock.Lock` (timeout 30 s, blocking_timeout 30 s) on
   `Redis.from_url`'s defaults and again on a client set up as ours (socket timeouts, a
   blocking pool of our default size), and pottery's `AIORedlock` over one master (auto_release_time
   30 s).
2. Hand-off: a task holds a key while another task waits for it; the time from the
   holder's release call to the waiter's acquire returning, `--samples` times (each on a
   fresh key, the waiter given 50 ms to reach its wait first): median and p99. The
   peers keep their defaults: redis.asyncio Lock polls every 0.1 s, AIORedlock after a
   random 0-0.2 s.
3. A crowd: `--tasks` tasks over `--keys` keys (a random one per cycle), each looping
   acquire (wait 30 s) + release for `--seconds`: grants/s and acquire latency (from call
   to return) p50/p99/max, for both of ours; beside it the threaded
   `locks.backends.RedisProvider` with `--threads` threads over as many keys
   (`benchmarks.scale.crowd_threads`) and `locks.aio.RedisProvider` with as many tasks
   (the faces at equal concurrency), and redis.asyncio Lock in the same crowd as ours,
   its blocking capped at `--peer-wait` s (a grant not made by then counts as a timeout;
   tasks still waiting well past the end are cancelled, and the row says so).

Prints a Markdown table of every figure and of the ratios. Unless --no-write:

- writes them to benchmarks/results/aio.json: the ratios in the shape every benchmark
  writes (as `harness.write_ratios`: higher is better, hand-off and p99 times are the
  base's over ours), the figures beside them; --json PATH writes that record there
  instead, also with --no-write;
- appends the tables, a summary and the machine line as a dated section to
  docs/benchmarks.md, keeps the record (with the section's title, stamp and command) in
  docs/img/aio.json, and draws docs/img/aio.png from it (`python -m benchmarks.plots
  aio` draws it again from that file), as `benchmarks.quorum` does.

--no-write writes nothing but what --json names. --quick takes smaller defaults
(--cycles 500 --rounds 7 --samples 15 --seconds 1); unlike the other benchmarks' --quick
it leaves writing to --no-write: give both for a run that touches nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import textwrap
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, cast

import redis
import redis.asyncio as aioredis
from pottery import AIORedlock

from benchmarks import harness, plots, scale
from benchmarks.harness import Ratio, Result
from locks import aio
from locks.aio.base import AsyncProviderBase
from locks.errors import LockError
from locks.measure import SETTLE, bench_key, percentiles
from tests.servers import RedisServer

MODULE = "benchmarks.aio"
TITLE = "asyncio: locks.aio next to redis.asyncio Lock and pottery AIORedlock"
RESULTS = harness.RESULTS / "aio.json"

OURS = "locks.aio redis"
OURS_HASH = "locks.aio redis-hash"
PEER = "redis.asyncio Lock"
PEER_LIKE_OURS = "redis.asyncio Lock, ours' client settings"
REDLOCK = "pottery AIORedlock (1 master)"
THREADED = "locks.backends redis (threads)"
OURS_MATCHED = "locks.aio redis, as many tasks as threads"

TTL = 30.0  # s: every contender's lock lifetime
WAIT = 30.0  # s: how long ours may wait (the peers: as long, but the crowd's peer)
POOL = 50  # connections: the crowd peer's blocking pool
OURS_POOL: int = inspect.signature(aio.RedisProvider).parameters["max_connections"].default
GRACE = 30.0  # s past the crowd's end (and the peer's cap) before waiting tasks are cancelled
MAX_ERRORS = 100  # a crowd worker whose acquires fail this often stops

QUICK = {**harness.QUICK, "seconds": 1.0}
DEFAULTS = {"cycles": 2000, "rounds": 5, "samples": 20, "seconds": 4.0}

RATIOS = (
    Ratio("aio/redis-vs-redis-asyncio-lock", OURS, PEER),
    Ratio("aio/redis-hash-vs-redis-asyncio-lock", OURS_HASH, PEER),
    Ratio("aio/redis-vs-redis-asyncio-lock-like-ours", OURS, PEER_LIKE_OURS),
    Ratio("aio/redis-vs-aioredlock", OURS, REDLOCK),
    Ratio("aio/redis-hash-vs-aioredlock", OURS_HASH, REDLOCK),
    Ratio("aio/redis-handoff-vs-redis-asyncio-lock", OURS, PEER, handoff=True),
    Ratio("aio/redis-hash-handoff-vs-redis-asyncio-lock", OURS_HASH, PEER, handoff=True),
)


@dataclass(frozen=True)
class CrowdRatio:
    """A ratio between two crowds, higher is better: grants/s are ours over the base's,
    p99 acquire latencies the base's over ours."""

    id: str
    ours: str  # crowd libraries, as measured
    base: str
    p99: bool = False

    @property
    def compares(self) -> str:
        if self.p99:
            return f"crowd acquire p99 of {self.base} / of {self.ours}"
        return f"crowd grants/s of {self.ours} / of {self.base}"

    def value(self, crowds: Sequence[Crowd]) -> float | None:
        """None where either side was not measured, or granted nothing."""
        found = {crowd.library: crowd for crowd in crowds}
        ours, base = found.get(self.ours), found.get(self.base)
        if ours is None or base is None:
            return None
        if self.p99:
            if ours.p99_ms is None or base.p99_ms is None or ours.p99_ms <= 0:
                return None
            return base.p99_ms / ours.p99_ms
        return ours.grants_per_second / base.grants_per_second if base.grants_per_second else None


CROWD_RATIOS = (
    CrowdRatio("aio/redis-matched-crowd-vs-threaded-redis", OURS_MATCHED, THREADED),
    CrowdRatio("aio/redis-matched-crowd-p99-vs-threaded-redis", OURS_MATCHED, THREADED, p99=True),
    CrowdRatio("aio/redis-crowd-vs-threaded-redis", OURS, THREADED),
    CrowdRatio("aio/redis-hash-crowd-vs-threaded-redis", OURS_HASH, THREADED),
    CrowdRatio("aio/redis-crowd-p99-vs-threaded-redis", OURS, THREADED, p99=True),
    CrowdRatio("aio/redis-hash-crowd-p99-vs-threaded-redis", OURS_HASH, THREADED, p99=True),
    CrowdRatio("aio/redis-crowd-vs-redis-asyncio-lock", OURS, PEER),
    CrowdRatio("aio/redis-hash-crowd-vs-redis-asyncio-lock", OURS_HASH, PEER),
    CrowdRatio("aio/redis-crowd-p99-vs-redis-asyncio-lock", OURS, PEER, p99=True),
    CrowdRatio("aio/redis-hash-crowd-p99-vs-redis-asyncio-lock", OURS_HASH, PEER, p99=True),
)


# -- contenders ----------------------------------------------------------------------


@dataclass
class AsyncContender:
    """A lock to time on the loop: `acquire(key)` waits (as long as the contender was
    made to) and returns a handle for `release`, or None if its wait ran out."""

    name: str
    acquire: Callable[[str], Awaitable[Any]]
    release: Callable[[Any], Awaitable[None]]
    close: Callable[[], Awaitable[None]]
    ours: bool = False
    note: str | None = None  # how it waits, for the report
    handoff: bool = True  # timed (else only its cycles: its waiting is another's)


def ours(provider: AsyncProviderBase, label: str, *, wait: float = WAIT) -> AsyncContender:
    async def acquire(key: str) -> Any:
        return await provider.acquire(key, ttl=TTL, wait=wait)

    return AsyncContender(label, acquire, provider.release, provider.close, ours=True,
                          note="woken by the release (pub/sub)")  # fmt: skip


def redis_asyncio_lock(
    client: aioredis.Redis, *, wait: float = WAIT, name: str = PEER
) -> AsyncContender:
    """redis-py's asyncio Lock with its default `sleep` (0.1 s between tries). Closing
    closes `client` and its pool, whoever made them."""

    async def acquire(key: str) -> Any:
        lock = client.lock(key, timeout=TTL, blocking_timeout=wait)
        return lock if await lock.acquire() else None

    async def release(lock: Any) -> None:
        await lock.release()

    async def close() -> None:
        await client.aclose()
        await client.connection_pool.disconnect()

    return AsyncContender(name, acquire, release, close,
                          note="polls: its default sleep=0.1 s between tries")  # fmt: skip


def aio_redlock(client: aioredis.Redis) -> AsyncContender:
    async def acquire(key: str) -> Any:
        lock = AIORedlock(key=key, masters={client}, auto_release_time=TTL)
        return lock if await lock.acquire(timeout=WAIT) else None

    async def release(lock: Any) -> None:
        await lock.release()

    async def close() -> None:
        await client.aclose()

    return AsyncContender(REDLOCK, acquire, release, close,
                          note="polls: a random 0-0.2 s between tries (its default)")  # fmt: skip


async def held(contender: AsyncContender, key: str) -> Any:
    """A grant of `key`, which nobody else uses: a timeout here is a fault."""
    handle = await contender.acquire(key)
    if handle is None:
        raise RuntimeError(f"{contender.name}: acquire of {key!r} timed out")
    return handle


# -- 1 and 2: uncontended cycles, hand-off -------------------------------------------


@dataclass
class Uncontended:
    name: str
    ours: bool
    cycles_per_second: float  # the median of the rounds
    rounds: list[float]
    handoff_ms: float | None  # median
    handoff_p99_ms: float | None
    handoff_samples: int
    note: str | None

    def result(self) -> Result:
        """As `harness.Ratio` reads it."""
        return Result(self.name, self.cycles_per_second, self.handoff_ms, self.ours)


async def warm_up(contender: AsyncContender, key: str, cycles: int = 50) -> None:
    """Connections and scripts made before the clock starts."""
    for _ in range(cycles):
        await contender.release(await held(contender, key))


async def cycle_rate(contender: AsyncContender, key: str, cycles: int) -> float:
    started = time.perf_counter()
    for _ in range(cycles):
        await contender.release(await held(contender, key))
    return cycles / (time.perf_counter() - started)


async def handoff_latencies(
    contender: AsyncContender, samples: int, *, settle: float = SETTLE, timeout: float = WAIT
) -> list[float]:
    """Milliseconds from a holding task's release call to a waiting task's acquire
    returning, once per sample, each on a fresh key (`locks.measure.handoff_latencies`,
    with tasks for threads)."""
    latencies = []
    for _ in range(samples):
        key = bench_key()
        holding = await held(contender, key)
        granted: list[float] = []

        async def waiter(key: str = key, granted: list[float] = granted) -> None:
            handle = await held(contender, key)
            granted.append(time.perf_counter())
            await contender.release(handle)

        task = asyncio.create_task(waiter(), name="locks-bench-waiter")
        await asyncio.sleep(settle)
        released_at = time.perf_counter()
        await contender.release(holding)
        try:
            await asyncio.wait_for(task, timeout)
        except Exception as exc:
            exc.add_note(f"{contender.name}: raised by the waiting task of a hand-off")
            raise
        latencies.append((granted[0] - released_at) * 1000)
    return latencies


async def uncontended(
    contenders: Sequence[AsyncContender], cycles: int, rounds: int, samples: int
) -> list[Uncontended]:
    """Medians per contender, rounds interleaved (as `harness.measure`), then each one's
    hand-offs."""
    keys = {c.name: bench_key() for c in contenders}
    rates: dict[str, list[float]] = {c.name: [] for c in contenders}
    for contender in contenders:
        await warm_up(contender, keys[contender.name])
    for _ in range(rounds):
        for contender in contenders:
            rates[contender.name].append(await cycle_rate(contender, keys[contender.name], cycles))
    results = []
    for contender in contenders:
        timed = samples and contender.handoff
        latencies = await handoff_latencies(contender, samples) if timed else []
        tail = percentiles(latencies) if latencies else None
        row = Uncontended(
            contender.name, contender.ours, statistics.median(rates[contender.name]),
            rates[contender.name], tail.p50 if tail else None, tail.p99 if tail else None,
            len(latencies), contender.note,
        )  # fmt: skip
        print(
            f"  {row.name}: {row.cycles_per_second:,.0f} cycles/s, hand-off median "
            f"{_ms(row.handoff_ms)} ms, p99 {_ms(row.handoff_p99_ms)} ms",
            flush=True,
        )
        results.append(row)
    return results


# -- 3: crowds -------------------------------------------------------------------------


@dataclass
class Crowd:
    """Workers looping acquire + release over `keys` keys for a while (a random key per
    cycle); `seconds` runs from the start to the last worker's last release."""

    library: str
    ours: bool
    mode: str  # "tasks" (of one loop, one provider) or "threads" (of one provider)
    workers: int
    keys: int
    wait_s: float  # each acquire's wait
    seconds: float
    grants: int
    grants_per_second: float
    p50_ms: float | None  # acquire, from call to return
    p99_ms: float | None
    max_ms: float | None
    drain_s: float  # from the loop's end to the last worker's last release
    timeouts: int
    errors: int
    error: str | None  # the first, if any
    cancelled: int = 0  # tasks still waiting GRACE s after the end
    note: str | None = None


async def _work(
    contender: AsyncContender,
    keys: Sequence[str],
    seed: int,
    *,
    start: asyncio.Event,
    deadline: list[float],
    tally: scale.Tally,
) -> None:
    pick = random.Random(seed).choice
    await start.wait()
    try:
        while time.monotonic() < deadline[0] and tally.errors < MAX_ERRORS:
            key = pick(keys)
            asked = time.perf_counter()
            try:
                handle = await contender.acquire(key)
                if handle is None:
                    tally.timeouts += 1
                    continue
                tally.latencies.append((time.perf_counter() - asked) * 1000)
                await contender.release(handle)
                tally.grants += 1
            except (LockError, redis.RedisError) as exc:
                tally.errors += 1
                tally.first_error = tally.first_error or f"{type(exc).__name__}: {exc}"
    finally:
        tally.ended_at = time.monotonic()


async def crowd_tasks(
    contender: AsyncContender, workers: int, keys: int, seconds: float, wait: float
) -> Crowd:
    """`workers` tasks of this loop, sharing one contender, loop for `seconds` (all
    start together); those still waiting `wait` + GRACE s after the end are cancelled,
    and the row counts them."""
    await warm_up(contender, bench_key(), 20)
    names = scale.crowd_keys(keys)
    tallies = [scale.Tally() for _ in range(workers)]
    start, deadline = asyncio.Event(), [0.0]
    tasks = [asyncio.create_task(_work(contender, names, index, start=start,
                                       deadline=deadline, tally=tally),
                                 name=f"locks-bench-worker-{index}")
             for index, tally in enumerate(tallies)]  # fmt: skip
    await asyncio.sleep(0)  # every task at the start line
    began = time.monotonic()
    deadline[0] = began + seconds
    start.set()
    _, pending = await asyncio.wait(tasks, timeout=seconds + wait + GRACE)
    for task in pending:
        task.cancel()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    failed = [outcome for outcome, task in zip(outcomes, tasks, strict=True)
              if isinstance(outcome, BaseException) and not task.cancelled()]  # fmt: skip
    if failed:  # a fault of the benchmark's, not an error of a lock's
        raise failed[0]
    return _crowd(contender.name, contender.ours, "tasks", workers=workers, keys=keys,
                  wait=wait, began=began, seconds=seconds, tallies=tallies,
                  cancelled=len(pending))  # fmt: skip


def _crowd(
    library: str,
    ours: bool,
    mode: str,
    *,
    workers: int,
    keys: int,
    wait: float,
    began: float,
    seconds: float,
    tallies: Sequence[scale.Tally],
    cancelled: int,
) -> Crowd:
    grants = sum(t.grants for t in tallies)
    elapsed = max(t.ended_at for t in tallies) - began
    latencies = [ms for t in tallies for ms in t.latencies]
    tail = percentiles(latencies) if latencies else None
    return Crowd(
        library=library, ours=ours, mode=mode, workers=workers, keys=keys, wait_s=wait,
        seconds=round(elapsed, 3), grants=grants,
        grants_per_second=grants / elapsed if elapsed > 0 else 0.0,
        p50_ms=tail.p50 if tail else None, p99_ms=tail.p99 if tail else None,
        max_ms=max(latencies, default=None), drain_s=round(elapsed - seconds, 3),
        timeouts=sum(t.timeouts for t in tallies), errors=sum(t.errors for t in tallies),
        error=next((t.first_error for t in tallies if t.first_error), None),
        cancelled=cancelled,
    )  # fmt: skip


def threaded_crowd(url: str, threads: int, keys: int, seconds: float) -> Crowd:
    """The threaded `RedisProvider` in `benchmarks.scale`'s crowd, outside any loop."""
    row = scale.crowd_threads(scale.Target("redis", url), threads, keys, seconds)
    return Crowd(
        library=THREADED, ours=True, mode="threads", workers=threads, keys=keys,
        wait_s=scale.WAIT, seconds=row["seconds"], grants=row["grants"],
        grants_per_second=row["grants_per_second"], p50_ms=row["p50_ms"],
        p99_ms=row["p99_ms"], max_ms=row["max_ms"], drain_s=row["drain_s"],
        timeouts=row["timeouts"], errors=row["errors"], error=row["error"],
    )  # fmt: skip


def _said(crowd: Crowd) -> None:
    print(f"  {crowd.library}, {crowd.workers:,} {crowd.mode} on {crowd.keys:,} keys: "
          f"{crowd.grants_per_second:,.0f} grants/s, p99 {_ms(crowd.p99_ms)} ms, "
          f"{crowd.timeouts} timeouts, {crowd.errors} errors, {crowd.cancelled} cancelled",
          flush=True)  # fmt: skip


# -- the run ---------------------------------------------------------------------------


def _peer_client(url: str, connections: int = POOL, **settings: Any) -> aioredis.Redis:
    """A blocking pool of `connections`, as ours is (redis-py's default pool refuses a
    connection past 100: a crowd would fail, not wait), with `settings`."""
    pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=connections, **settings)
    return aioredis.Redis(connection_pool=pool)


def peer_like_ours(url: str) -> AsyncContender:
    """redis.asyncio Lock on a client set up as ours is by default (socket timeouts
    0.5/0.25 s, a blocking pool of OURS_POOL, 5 s for a connection): with a socket
    timeout, redis-py wraps each send in `asyncio.wait_for`, which costs on Python 3.11."""
    client = _peer_client(url, OURS_POOL, socket_timeout=0.5, socket_connect_timeout=0.25,
                          timeout=5.0)  # fmt: skip
    contender = redis_asyncio_lock(client, name=PEER_LIKE_OURS)
    contender.handoff = False  # it waits as PEER does
    return contender


async def run_on_loop(url: str, args: argparse.Namespace) -> tuple[list[Uncontended], list[Crowd]]:
    """Every async part, on this one loop; every provider and client closed at the end."""
    contenders = [
        ours(aio.RedisProvider(url), OURS),
        ours(aio.RedisHashProvider(url), OURS_HASH),
        redis_asyncio_lock(aioredis.Redis.from_url(url)),
        peer_like_ours(url),
        aio_redlock(aioredis.Redis.from_url(url)),
    ]
    crowds: list[Crowd] = []
    try:
        print("uncontended cycles and hand-off:", flush=True)
        measured = await uncontended(contenders, args.cycles, args.rounds, args.samples)
        print(f"crowds of {args.tasks:,} tasks over {args.keys:,} keys, {args.seconds:g} s:")
        for contender in contenders[:2]:
            crowds.append(await crowd_tasks(contender, args.tasks, args.keys, args.seconds,
                                            WAIT))  # fmt: skip
            _said(crowds[-1])
        matched = ours(aio.RedisProvider(url), OURS_MATCHED)
        try:
            crowd = await crowd_tasks(matched, args.threads, args.keys, args.seconds, WAIT)
        finally:
            await matched.close()
        crowds.append(crowd)
        _said(crowd)
        if not args.no_peer_crowd:
            peer = redis_asyncio_lock(_peer_client(url), wait=args.peer_wait)
            try:
                crowd = await crowd_tasks(peer, args.tasks, args.keys, args.seconds,
                                          args.peer_wait)  # fmt: skip
            finally:
                await peer.close()
            crowd.note = (
                f"polls every 0.1 s (its default); blocking_timeout {args.peer_wait:g} s; "
                f"a blocking pool of {POOL} connections"
            )
            crowds.append(crowd)
            _said(crowd)
    finally:
        for contender in contenders:
            await contender.close()
    return measured, crowds


def server_version(url: str) -> str:
    client = redis.Redis.from_url(url)
    try:
        return str(client.info("server")["redis_version"])
    finally:
        client.close()


def record(
    args: argparse.Namespace,
    measured: Sequence[Uncontended],
    crowds: Sequence[Crowd],
    settings: dict[str, Any],
    *,
    command: str = "",
    stamp: str | None = None,
) -> dict[str, Any]:
    """What `harness.write_ratios` writes (the ratios, read by `benchmarks.check`), with
    the figures, the run's settings and its section's title, stamp and command beside
    them (`plots.AioResults`, once the run's "seconds" are added)."""
    results = {row.name: row.result() for row in measured}
    ratios = [{"id": r.id, "value": r.value(results), "compares": r.compares} for r in RATIOS]
    ratios += [{"id": r.id, "value": r.value(crowds), "compares": r.compares}
               for r in CROWD_RATIOS]  # fmt: skip
    return {
        "benchmark": "aio",
        "title": TITLE,
        "stamp": stamp or harness.utc_stamp(),
        "command": command,
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "arguments": vars(args),
        "ratios": ratios,
        "settings": settings,
        "uncontended": [asdict(row) for row in measured],
        "crowds": [asdict(crowd) for crowd in crowds],
    }


def _ms(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def report(saved: dict[str, Any]) -> str:
    """Markdown: the uncontended table, the crowds, the ratios, the main figures in words
    and how the run went."""
    measured = saved["uncontended"]
    lines = [
        f"Uncontended and hand-off (one task; {saved['arguments']['rounds']} rounds of "
        f"{saved['arguments']['cycles']:,} cycles, {saved['arguments']['samples']} hand-offs):",
        "",
        f"| contender | cycles/s | vs {PEER} | hand-off median ms | hand-off p99 ms | waits |",
        "|---|---:|---:|---:|---:|---|",
    ]
    base = next((r["cycles_per_second"] for r in measured if r["name"] == PEER), None)
    for r in measured:
        versus = f"{r['cycles_per_second'] / base:.2f}x" if base else "—"
        lines.append(
            f"| {r['name']} | {r['cycles_per_second']:,.0f} | {versus} "
            f"| {_ms(r['handoff_ms'])} | {_ms(r['handoff_p99_ms'])} | {r['note'] or ''} |"
        )
    lines += [
        "",
        "Crowds (acquire latency from call to return):",
        "",
        "| library | workers | keys | wait s | grants/s | p50 ms | p99 ms | max ms | drain s "
        "| timeouts | errors | cancelled |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in saved["crowds"]:
        lines.append(
            f"| {c['library']} | {c['workers']:,} {c['mode']} | {c['keys']:,} | {c['wait_s']:g} "
            f"| {c['grants_per_second']:,.0f} | {_ms(c['p50_ms'])} | {_ms(c['p99_ms'])} "
            f"| {_ms(c['max_ms'])} | {c['drain_s']:.2f} | {c['timeouts']:,} | {c['errors']:,} "
            f"| {c['cancelled']:,} |"
        )
    given = saved["arguments"]
    notes = [
        f"{given['tasks'] / given['keys']:g} workers per key in the crowds of "
        f"{given['tasks']:,} tasks, {given['threads'] / given['keys']:g} in those of "
        f"{given['threads']}: the big crowd's p50/p99 are mostly queueing (for ours, for the "
        f"key and for one of the provider's connections: max_connections, {OURS_POOL} by "
        f"default); {OURS_MATCHED} compares the faces at equal concurrency"
    ]
    notes += [f"{c['library']}: {c['note']}" for c in saved["crowds"] if c["note"]]
    notes += [f"{c['library']}: first error {c['error']}" for c in saved["crowds"] if c["error"]]
    if notes:
        lines += ["", *(f"- {note}" for note in notes)]
    lines += ["", "Ratios (higher is better):", "", "| ratio | value | compares |",
              "|---|---:|---|"]  # fmt: skip
    for r in saved["ratios"]:
        lines.append(f"| {r['id']} | {_ms(r['value'])} | {r['compares']} |")
    said = summary(saved)
    if said:
        lines += ["", said]
    lines += ["", setup_note(saved)]
    return "\n".join(lines)


def summary(saved: dict[str, Any]) -> str:
    """The run's main figures in words; a sentence is left out where its rows were not
    measured."""
    rows = {r["name"]: r for r in saved["uncontended"]}
    crowds = {c["library"]: c for c in saved["crowds"]}
    said = []
    ours, hashed, peer, redlock = (rows.get(n) for n in (OURS, OURS_HASH, PEER, REDLOCK))
    if ours and peer:
        rate, base = ours["cycles_per_second"], peer["cycles_per_second"]
        sentence = (f"One task's uncontended cycles: {OURS} {rate:,.0f}/s, "
                    f"{rate / base:.2f}x {PEER}'s ({base:,.0f}/s)")  # fmt: skip
        if redlock:
            other = redlock["cycles_per_second"]
            sentence += f" and {rate / other:.2f}x {REDLOCK}'s ({other:,.0f}/s)"
        if hashed:
            sentence += f"; {OURS_HASH} {hashed['cycles_per_second'] / base:.2f}x {PEER}'s"
        said.append(sentence + ".")
    waited = [r for r in (peer, redlock) if r and r["handoff_ms"] is not None]
    if ours and ours["handoff_ms"] is not None and waited:
        polls = " and ".join(f"{r['handoff_ms']:.1f} ms for {r['name']}" for r in waited)
        said.append(
            f"Hand-off median {ours['handoff_ms']:.2f} ms (p99 {_ms(ours['handoff_p99_ms'])}) "
            f"against {polls}, which poll."
        )
    matched, threaded = crowds.get(OURS_MATCHED), crowds.get(THREADED)
    if matched and threaded and threaded["grants_per_second"]:
        said.append(
            f"At equal concurrency ({matched['workers']:,} workers over {matched['keys']:,} "
            f"keys) {OURS} made {matched['grants_per_second']:,.0f} grants/s, "
            f"{matched['grants_per_second'] / threaded['grants_per_second']:.2f}x the "
            f"threaded provider's {threaded['grants_per_second']:,.0f}, acquire p50/p99 "
            f"{_ms(matched['p50_ms'])}/{_ms(matched['p99_ms'])} ms against "
            f"{_ms(threaded['p50_ms'])}/{_ms(threaded['p99_ms'])} ms."
        )
    big = [c for c in (crowds.get(OURS), crowds.get(OURS_HASH)) if c]
    if big:
        sentence = (f"In the crowd of {big[0]['workers']:,} tasks over {big[0]['keys']:,} keys, "
                    + " and ".join(f"{c['library']} made {c['grants_per_second']:,.0f} grants/s "
                                   f"(p99 {_ms(c['p99_ms'])} ms)" for c in big))  # fmt: skip
        polled = crowds.get(PEER)
        if polled:
            missed = polled["timeouts"] + polled["cancelled"]
            sentence += (f"; {PEER} in the same crowd {polled['grants_per_second']:,.0f} "
                         f"(p99 {_ms(polled['p99_ms'])} ms, {missed:,} acquires not granted "
                         f"within its {polled['wait_s']:g} s)")  # fmt: skip
        said.append(sentence + ".")
    return _fill(" ".join(said))


def setup_note(saved: dict[str, Any]) -> str:
    """The machine line: the run's conditions, the versions and the set-up."""
    settings = saved["settings"]
    return _fill(
        f"{harness.run_conditions(settings, saved['seconds'])} redis-server "
        f"{settings['redis_server']} on loopback, no persistence; redis-py "
        f"{settings['redis_py']}, pottery {settings['pottery']}, Python {saved['python']}; "
        f"every task on one event loop (`asyncio.run`), the threaded crowd outside it. "
        f"ttl {TTL:g} s, wait {WAIT:g} s unless said. `docs/img/aio.json` holds the raw "
        "results of the newest run."
    )


def _fill(text: str) -> str:
    return textwrap.fill(text, 88, break_long_words=False, break_on_hyphens=False)


def arguments(argv: list[str] | None) -> argparse.Namespace:
    options = argparse.ArgumentParser(
        prog=f"python -m {MODULE}", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    options.add_argument("--cycles", type=int, help="per contender and round (default: 2000)")
    options.add_argument("--rounds", type=int, help="(default: 5)")
    options.add_argument("--samples", type=int, help="hand-offs per contender (default: 20)")
    options.add_argument("--seconds", type=float, help="each crowd's loop (default: 4)")
    options.add_argument("--tasks", type=int, default=1000, help="of a crowd on the loop")
    options.add_argument("--keys", type=int, default=100, help="a crowd's keys")
    options.add_argument("--threads", type=int, default=16, help="of the threaded crowd")
    options.add_argument("--peer-wait", type=float, default=10.0,
                         help="the crowd peer's blocking_timeout, s")  # fmt: skip
    options.add_argument("--no-peer-crowd", action="store_true",
                         help=f"leave {PEER} out of the crowds")  # fmt: skip
    options.add_argument("--json", type=Path, help=f"default: {RESULTS}")
    options.add_argument("--no-write", action="store_true",
                         help=f"write neither {RESULTS.name} nor docs/ (but --json)")  # fmt: skip
    options.add_argument(
        "--quick", action="store_true",
        help="smaller defaults: " + ", ".join(f"--{k} {v:g}" for k, v in QUICK.items()),
    )  # fmt: skip
    args = options.parse_args(argv)
    for name, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ("cycles", "rounds", "tasks", "keys", "threads"):
        if getattr(args, name) < 1:
            options.error(f"--{name} must be at least 1")
    if args.samples < 0 or args.seconds <= 0 or args.peer_wait <= 0:
        options.error("--samples must be >= 0, --seconds and --peer-wait > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="locks-bench-") as workdir:
        server = RedisServer(Path(workdir))
        server.start()
        try:
            version = server_version(server.url)
            measured, crowds = asyncio.run(run_on_loop(server.url, args))
            crowd = threaded_crowd(server.url, args.threads, args.keys, args.seconds)
            crowds.append(crowd)
            _said(crowd)
        finally:
            server.stop()
    settings = {
        "cpus": os.cpu_count(),
        "cpu": scale.machine(load_before)["cpu"],
        "load_average_before": load_before,
        "load_average_after": os.getloadavg()[0],
        "redis_server": version,
        "redis_py": metadata.version("redis"),
        "pottery": metadata.version("pottery"),
    }
    command = f"python -m {MODULE} " + " ".join(argv if argv is not None else sys.argv[1:])
    saved = record(args, measured, crowds, settings, command=command.strip())
    saved["seconds"] = round(time.perf_counter() - started, 1)
    body = report(saved)
    print(body)
    path = args.json or (None if args.no_write else RESULTS)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(saved, indent=2, default=str) + "\n")
        print(f"wrote {path}")
    if not args.no_write:
        publish(saved, body)
    return 0


def publish(saved: dict[str, Any], body: str) -> None:
    """The record kept in docs/img/aio.json, the section appended to docs/benchmarks.md
    with the image drawn from that record, as `benchmarks.quorum` does."""
    harness.save_results(plots.AIO_RESULTS, json.loads(json.dumps(saved, default=str)))
    results = cast(plots.AioResults, saved)
    harness.append_with_plot(TITLE, saved["command"], body, saved["stamp"],
                             lambda: plots.draw_aio(results))  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
