"""How cost grows with the work (issue 20: cost that stays flat as the work grows).

    python -m benchmarks.scale [--quick] [--no-write] [--json PATH] [--redraw]
                               [--parts leases waiters workers memory]

Starts its own redis-server, ZooKeeper and MariaDB (`tests.servers`) on free loopback
ports, sweeps the work up, and measures what each step costs:

1. Held leases, 1 -> 100,000 on one `RedisProvider`, each auto-renewed (`ttl=None`,
   `watchdog_ttl` 3 s: a renewal due every second). Over a window in which the process
   only renews: renewals/s achieved against those needed, the CPU the process spends
   (s per s, less the measuring thread's own), the server's script calls and read
   events (~ round trips) per renewal, the longest any lease went unrenewed, and the
   leases lost (`on_lost`). Beside it python-redis-lock with `auto_renewal=True` (a
   thread per lock) at 1 -> 5,000 locks: a thread that cannot start, memory, or
   renewals that fall behind are reported as data, never a crash.
2. Waiters, 1 -> 1,000 threads of one process and 1 -> 16 processes, all looping
   acquire + release on one Redis key: grants/s, and the server's script calls per
   grant (each grant's wake-ups and failed tries).
3. Workers, 1 -> 64 threads and 1 -> 16 processes, on one key and on 1,000 keys (a
   random one per cycle), for Redis and the database backend on MariaDB (durable: the
   redo log flushed at every commit): grants/s and acquire latency p50/p99.
4. Server state per held lock: N locks held on Redis (INFO used_memory), ZooKeeper
   (`srvr`'s node count) and MariaDB (rows; data + index length after ANALYZE TABLE),
   then what is left once every one is released.

--quick runs fewer, smaller points (about a minute; the full run takes up to ~10) and,
as in the other benchmarks, implies --no-write. Otherwise the run appends a section to
docs/benchmarks.md, draws docs/img/scale.png and writes its raw results to
docs/img/scale.json (--json PATH: there instead, also with --no-write). --redraw draws
the image again from docs/img/scale.json (`benchmarks.plots` does not know this one).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import math
import multiprocessing
import os
import random
import re
import socket
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypedDict, cast

import redis

from benchmarks import harness, plots
from locks.errors import LockError
from locks.measure import percentiles
from locks.provider import Lease, LockProvider
from tests.servers import MariaDBServer, RedisServer, ServerProcess, ZooKeeperServer

TITLE = "Scale: renewals, waiters, workers and server state as the work grows"
MODULE = "benchmarks.scale"
RESULTS = plots.IMAGES / "scale.json"
IMAGE = plots.IMAGES / "scale.png"
PARTS = ("leases", "waiters", "workers", "memory")

WATCHDOG_TTL = 3.0  # s: our auto-renewed leases, renewed every ttl/3
DEFAULT_TTL = 30.0  # s: the providers' default watchdog_ttl, what a service runs with
DEFAULT_TTL_WINDOW = 12.0  # s: longer than one renewal period (10 s) of DEFAULT_TTL
PEER_EXPIRE = 3  # s: python-redis-lock's `expire` (whole seconds), renewed every 2/3 of it
SLACK = 1.2  # renewed in time: no lease went longer than SLACK x its period unrenewed
TTL = 30.0  # s: the fixed ttl of a crowd's grants
WAIT = 30.0  # s: how long a crowd's acquire may wait
KEYS_MANY = 1000  # the "many keys" of part 3
MAX_CLIENTS = 10_000  # the Redis server's maxclients for this run (Redis's default)
MAX_ERRORS = 100  # a worker whose acquires fail this often stops: the point is reported
SPAWN = multiprocessing.get_context("spawn")  # a fresh interpreter: no fork of our threads
REPLY_LIMIT = 60.0  # s: a worker process silent for longer is stuck, and the run fails
IDLE_LIMIT = 600.0  # s: a worker process told nothing for longer exits by itself


@dataclass(frozen=True)
class Plan:
    """The points of one run: every count is a point of a sweep."""

    leases: tuple[int, ...]
    peer_leases: tuple[int, ...]
    waiter_threads: tuple[int, ...]
    waiter_processes: tuple[int, ...]
    worker_threads: tuple[int, ...]
    worker_processes: tuple[int, ...]
    database_threads: tuple[int, ...]
    database_processes: tuple[int, ...]
    memory_locks: int
    window: float  # s of renewing only, per point of part 1
    seconds: float  # s every crowd of parts 2 and 3 loops
    # ours again with the default watchdog ttl (30 s), each over `DEFAULT_TTL_WINDOW`
    default_ttl_leases: tuple[int, ...] = ()


FULL = Plan(
    leases=(1, 100, 1000, 10_000, 100_000), peer_leases=(1, 100, 1000, 5000),
    waiter_threads=(1, 10, 100, 1000), waiter_processes=(1, 4, 16),
    worker_threads=(1, 4, 16, 64), worker_processes=(1, 4, 16),
    database_threads=(1, 4, 16, 64), database_processes=(1, 4, 16),
    memory_locks=10_000, window=6.0, seconds=4.0, default_ttl_leases=(100_000,),
)  # fmt: skip
QUICK = Plan(
    leases=(1, 100, 1000), peer_leases=(1, 100, 1000),
    waiter_threads=(1, 10, 100), waiter_processes=(1, 4),
    worker_threads=(1, 16), worker_processes=(4,),
    database_threads=(1, 16), database_processes=(),
    memory_locks=1000, window=3.0, seconds=2.0,
)  # fmt: skip


# -- raw results (docs/img/scale.json) ------------------------------------------------


class LeaseRow(TypedDict):
    """One point of part 1: `leases` auto-renewed locks held by one process."""

    library: str
    ours: bool
    leases: int  # asked for
    held: int  # granted (fewer where setting up broke)
    setup_s: float  # to acquire them all
    period_s: float  # how often the library renews each lease
    needed_per_second: float  # held / period
    renewals_per_second: float | None  # achieved over the window
    calls_per_renewal: float | None  # server script calls (EVALSHA + EVAL)
    reads_per_renewal: float | None  # server read events (~ round trips); None: the peer's
    # sampling reads would count too
    cpu_per_second: float | None  # process CPU s per s, less the measuring thread
    round_s: float | None  # the mean time between two renewals of a lease
    oldest_unrenewed_s: float | None  # the longest a lease went unrenewed, over samples
    in_time: bool  # none lost, none unrenewed for longer than SLACK x period
    lost: int
    lost_why: str | None  # the commonest reasons, counted
    threads: int  # alive in the process during the window
    rss_kib_per_lease: float | None  # resident memory grown while setting up, per lease
    failure: str | None  # why setting up stopped short, if it did


class CrowdRow(TypedDict):
    """One point of parts 2 and 3: `workers` loop acquire + release for a while."""

    backend: str  # "redis", "database"
    mode: str  # "threads" (of one process, one provider) or "processes" (one each)
    workers: int
    keys: int  # 1, or KEYS_MANY: a random one per cycle
    seconds: float  # from the start to the last worker's last release
    grants: int
    grants_per_second: float
    p50_ms: float | None  # acquire, from call to return
    p99_ms: float | None
    max_ms: float | None
    drain_s: float  # from the loop's end to the last worker's last release
    calls_per_grant: float | None  # Redis: EVALSHA + EVAL; MariaDB: Com_* statements
    timeouts: int
    errors: int
    error: str | None  # the first, if any


class MemoryRow(TypedDict):
    """Part 4: what one backend's server keeps per held lock, and after release."""

    backend: str
    locks: int
    unit: str  # what the server keeps: "keys", "nodes", "rows"
    units_per_lock: float
    bytes_per_lock: float | None  # None: the server does not say
    left: dict[str, int]  # after every lock was released, by kind
    bytes_left: int | None  # above the baseline, after release
    note: str


class ScaleResults(TypedDict):
    title: str
    stamp: str
    command: str
    seconds: float
    settings: dict[str, Any]
    leases: list[LeaseRow]
    crowds: list[CrowdRow]
    memory: list[MemoryRow]


# -- what the process and the servers count -------------------------------------------


def rss_bytes() -> int:
    """This process's resident set, from /proc (0 where there is none)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def redis_stats(client: redis.Redis) -> tuple[int, int]:
    """The server's script calls (EVALSHA + EVAL) and read events so far, in one INFO: a
    read event is one read from a client socket, about one per round trip. Between two
    of these the reads counted include the second's own."""
    info = client.info("commandstats", "stats")
    calls = sum(int(info.get(f"cmdstat_{name}", {}).get("calls", 0))
                for name in ("evalsha", "eval"))  # fmt: skip
    return calls, int(info.get("total_reads_processed", 0))


def script_calls(client: redis.Redis) -> int:
    return redis_stats(client)[0]


def statements(server: MariaDBServer) -> int:
    """Com_insert + Com_update + Com_delete + Com_select so far, read as root."""
    out = server.sql(
        "SHOW GLOBAL STATUS WHERE Variable_name IN "
        "('Com_insert', 'Com_update', 'Com_delete', 'Com_select')"
    )
    return sum(int(line.split()[1]) for line in out.splitlines() if line.strip())


# -- part 1: held leases, renewed ------------------------------------------------------


class _Renewals:
    """When each lease was last renewed, as sampled. A renewal is a later time than the
    one seen before (by more than `jitter`); the times themselves are exact, so neither
    the time between two renewals of a lease nor their mean depends on when samples
    fall. The longest a lease went unrenewed: the longest such time, or the age of a
    renewal at a sample, whichever is longer."""

    def __init__(self, jitter: float) -> None:
        self.jitter = jitter
        self.first: list[float | None] = []
        self.last: list[float | None] = []
        self.counts: list[int] = []
        self.started = False
        self.oldest: float | None = None  # s: the longest any live lease went unrenewed

    def observe(self, now: float, renewed_at: Sequence[float | None]) -> None:
        if not self.started:  # the baseline
            self.started = True
            self.first, self.last = list(renewed_at), list(renewed_at)
            self.counts = [0] * len(renewed_at)
            return
        for index, at in enumerate(renewed_at):
            last = self.last[index]
            if at is None:
                continue
            if last is None:
                self.first[index] = self.last[index] = at
            elif at > last + self.jitter:
                self.counts[index] += 1
                self.last[index] = at
                self._unrenewed(at - last)
        live = [at for at in renewed_at if at is not None]
        if live:
            self._unrenewed(now - min(live))

    def _unrenewed(self, seconds: float) -> None:
        self.oldest = seconds if self.oldest is None else max(self.oldest, seconds)

    @property
    def renewals(self) -> int:
        return sum(self.counts)

    def _spans(self) -> list[tuple[int, float]]:
        """Per lease renewed in the window: its renewals, and the time they took."""
        return [(n, (last or 0.0) - (first or 0.0))
                for first, last, n in zip(self.first, self.last, self.counts, strict=True)
                if n]  # fmt: skip

    def rate(self) -> float:
        """Renewals/s: each renewed lease's renewals over the time they took, summed (a
        lease lost meanwhile counts for the renewals it had)."""
        return sum(n / span for n, span in self._spans() if span > 0)

    def round(self) -> float | None:
        """The mean time between two renewals of a lease."""
        spans = self._spans()
        return sum(s for _, s in spans) / sum(n for n, _ in spans) if spans else None


@dataclass
class _Window:
    cpu: float | None  # process CPU s per s, less the measuring thread's own
    counted: tuple[int, int]  # the server's counters' growth over the window
    threads: int


def _renew_only(
    window: float,
    every: float,
    sample: Callable[[], None],
    counters: Callable[[], tuple[int, int]],
) -> _Window:
    """`sample()` every `every` seconds for `window` seconds while the process does
    nothing but renew (the first sample: the baseline), with the process's CPU and the
    server's counters over that time."""
    sample()
    before = counters()
    cpu, mine = time.process_time(), time.thread_time()
    began = time.monotonic()
    for tick in range(1, max(1, round(window / every)) + 1):
        time.sleep(max(0.0, began + tick * every - time.monotonic()))
        sample()
    elapsed = time.monotonic() - began
    spent = (time.process_time() - cpu) - (time.thread_time() - mine)
    after = counters()
    counted = (after[0] - before[0], after[1] - before[1] - 1)  # less the INFO's own read
    return _Window(spent / elapsed if elapsed > 0 else None, counted, threading.active_count())


def _why(reasons: Sequence[str]) -> str | None:
    """The commonest reasons, counted: "688 MaxConnectionsError"."""
    if not reasons:
        return None
    return ", ".join(f"{n:,} {why}" for why, n in collections.Counter(reasons).most_common(2))


def held_leases(url: str, count: int, *, window: float, ttl: float = WATCHDOG_TTL) -> LeaseRow:
    """`count` auto-renewed leases on one `RedisProvider`, then `window` seconds in which
    the process does nothing but renew them. A lease was last renewed `ttl` before its
    `valid_until`: renewals are counted where the library records them, so the server's
    calls per renewal are measured, not assumed."""
    from locks.backends import RedisProvider  # noqa: PLC0415  # the redis extra

    library = "fallback-locks redis"
    if ttl != WATCHDOG_TTL:
        library += f", watchdog_ttl {ttl:g} s"
    provider = RedisProvider(url, watchdog_ttl=ttl, prefix=f"scale-{uuid.uuid4().hex[:12]}")
    client = redis.Redis.from_url(url)
    lost: list[str] = []
    counting = [True]

    def on_lost(lease: Lease) -> None:
        if counting[0]:
            lost.append(lease.state.reason)

    leases: list[Lease] = []
    failure = None
    renewals = _Renewals(jitter=ttl / 12)

    def sample() -> None:
        renewed_at = [None if lease.lost or lease.valid_until is None
                      else lease.valid_until - ttl for lease in leases]  # fmt: skip
        renewals.observe(time.monotonic(), renewed_at)

    try:
        warm = provider.acquire("warm", ttl=None, wait=0)  # every script cached on the server,
        assert warm is not None  # the renewal's too: a first EVALSHA answers NOSCRIPT
        provider.release(provider.extend(warm))
        rss_before = rss_bytes()
        started = time.perf_counter()
        try:
            for index in range(count):
                lease = provider.acquire(f"held:{index}", ttl=None, wait=0, on_lost=on_lost)
                if lease is None:  # a fresh name nobody else uses: a fault
                    failure = f"lease {index + 1} was refused"
                    break
                leases.append(lease)
        except (LockError, MemoryError) as exc:
            failure = f"{type(exc).__name__} at lease {len(leases) + 1}: {exc}"
        setup = time.perf_counter() - started
        grown = rss_bytes() - rss_before
        every = 0.25 if len(leases) <= 10_000 else 0.5
        renewed = _renew_only(window, every, sample, lambda: redis_stats(client))
        counting[0] = False
    finally:
        provider.close()  # releases what is still held: N round trips
        client.close()
    calls, reads = renewed.counted
    done = renewals.renewals
    return _lease_row(
        library, True, count=count, held=len(leases), setup=setup,
        period=ttl / 3, renewals=renewals, calls=calls / done if done else None,
        reads=reads / done if done else None, window=renewed, lost=len(lost),
        lost_why=_why(lost), grown=grown, failure=failure,
    )  # fmt: skip


def _lease_row(
    library: str,
    ours: bool,
    *,
    count: int,
    held: int,
    setup: float,
    period: float,
    renewals: _Renewals,
    calls: float | None,
    reads: float | None,
    window: _Window,
    lost: int,
    lost_why: str | None,
    grown: int,
    failure: str | None,
) -> LeaseRow:
    oldest = renewals.oldest
    in_time = (failure is None and lost == 0 and held > 0 and oldest is not None
               and oldest <= SLACK * period)  # fmt: skip
    rate = renewals.rate()
    return LeaseRow(
        library=library, ours=ours, leases=count, held=held, setup_s=round(setup, 3),
        period_s=period, needed_per_second=held / period, renewals_per_second=rate,
        calls_per_renewal=calls, reads_per_renewal=reads, cpu_per_second=window.cpu,
        round_s=renewals.round(), oldest_unrenewed_s=oldest,
        in_time=in_time, lost=lost, lost_why=lost_why, threads=window.threads,
        rss_kib_per_lease=grown / held / 1024 if held >= 1000 else None, failure=failure,
    )  # fmt: skip


def peer_held_locks(url: str, count: int, *, window: float, expire: int = PEER_EXPIRE) -> LeaseRow:
    """python-redis-lock with `auto_renewal=True`: each acquire starts a thread that
    extends its lock every 2/3 of `expire`. When a lock was last renewed is read from
    its key's PTTL. Its client's pool is as large as its threads: redis-py's default
    (100 connections, then MaxConnectionsError) would end renewal threads at 1,000
    locks. A thread that cannot start, memory running out, or a refused connection end
    setting up and are reported; renewal threads that die count as lost."""
    import redis_lock  # noqa: PLC0415  # only this part needs the peer

    client = redis.Redis.from_url(url, max_connections=count + 16)
    reader = redis.Redis.from_url(url)  # samples and counts, on a pool of its own
    name = f"scale-peer-{uuid.uuid4().hex[:12]}"
    died: list[str] = []
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is not None and issubclass(
            args.exc_type, (redis_lock.NotAcquired, redis.RedisError)
        ):
            died.append(args.exc_type.__name__)  # a renewal thread ended by its error
        else:
            previous(args)

    threading.excepthook = hook
    locks: list[Any] = []
    period = expire * 2 / 3
    renewals = _Renewals(jitter=period / 4)
    keys: list[str] = []
    gone = [0]

    def sample() -> None:
        pipe = reader.pipeline(transaction=False)
        for key in keys:
            pipe.pttl(key)
        pttls = [int(p) for p in pipe.execute()] if keys else []
        now = time.monotonic()
        gone[0] = sum(1 for p in pttls if p == -2)
        renewals.observe(now, [now - (expire - p / 1000) if p >= 0 else None for p in pttls])

    try:
        rss_before = rss_bytes()
        started = time.perf_counter()
        failure = _take_peer_locks(client, name, count, expire, locks)
        setup = time.perf_counter() - started
        grown = rss_bytes() - rss_before
        keys = [f"lock:{name}:{index}" for index in range(len(locks))]
        every = 0.25 if len(keys) <= 1000 else 0.5
        renewed = _renew_only(window, every, sample, lambda: redis_stats(reader))
        lost = max(gone[0], len(died))
        why = [f"{gone[0]:,} keys expired"] if gone[0] else []
        why += [f"threads ended by {cause}" for cause in [_why(died)] if cause]
        lost_why = "; ".join(why) or None
    finally:
        for lock in locks:
            with contextlib.suppress(redis_lock.NotAcquired, redis.RedisError):
                lock.release()  # stops and joins its thread
        _delete_matching(reader, f"lock:{name}:*")  # one whose thread failed to start
        threading.excepthook = previous
        client.close()
        reader.close()
    done = renewals.renewals
    return _lease_row(
        "python-redis-lock", False, count=count, held=len(locks), setup=setup, period=period,
        renewals=renewals, calls=renewed.counted[0] / done if done else None, reads=None,
        window=renewed, lost=lost, lost_why=lost_why, grown=grown, failure=failure,
    )  # fmt: skip


def _take_peer_locks(
    client: redis.Redis, name: str, count: int, expire: int, locks: list[Any]
) -> str | None:
    """Acquire `count` auto-renewed python-redis-lock locks into `locks`; why it stopped
    short, if it did."""
    import redis_lock  # noqa: PLC0415

    warm = redis_lock.Lock(client, f"{name}:warm", expire=expire)  # its scripts cached on
    if warm.acquire(blocking=False):  # the server: a first EVALSHA answers NOSCRIPT
        warm.extend()
        warm.release()
    try:
        for index in range(count):
            lock = redis_lock.Lock(client, f"{name}:{index}", expire=expire, auto_renewal=True)
            if not lock.acquire(blocking=False):
                return f"lock {index + 1} was refused"
            locks.append(lock)
    except (RuntimeError, MemoryError, OSError, redis.RedisError) as exc:
        return f"{type(exc).__name__} at lock {len(locks) + 1}: {exc}"
    return None


def _delete_matching(client: redis.Redis, pattern: str) -> None:
    keys = list(client.scan_iter(match=pattern, count=1000))
    for start in range(0, len(keys), 1000):
        client.delete(*keys[start : start + 1000])


def sweep_leases(url: str, plan: Plan) -> list[LeaseRow]:
    """Part 1: ours at every count, then the peer until it breaks (a point that could
    not even be set up ends the peer's sweep: a larger one would break the same way)."""
    rows = []
    points = [(count, plan.window, WATCHDOG_TTL) for count in plan.leases]
    # and what a service runs with: the default ttl, a round of 10 s
    points += [(count, DEFAULT_TTL_WINDOW, DEFAULT_TTL) for count in plan.default_ttl_leases]
    for count, window, ttl in points:
        row = held_leases(url, count, window=window, ttl=ttl)
        print(f"  {row['library']}, {count:,} leases: {_rate(row['renewals_per_second'])}"
              f" of {_rate(row['needed_per_second'])} renewals/s needed, lost {row['lost']}, "
              f"oldest unrenewed {_num(row['oldest_unrenewed_s'], 2)} s", flush=True)  # fmt: skip
        rows.append(row)
    for count in plan.peer_leases:
        row = peer_held_locks(url, count, window=plan.window)
        print(f"  {row['library']}, {count:,} locks: {_rate(row['renewals_per_second'])}"
              f" of {_rate(row['needed_per_second'])} renewals/s needed, lost {row['lost']}, "
              f"{row['threads']} threads" + (f"; broke: {row['failure']}" if row["failure"]
                                             else ""), flush=True)  # fmt: skip
        rows.append(row)
        if row["failure"] is not None:
            break
    return rows


# -- parts 2 and 3: crowds of workers ---------------------------------------------------


@dataclass(frozen=True)
class Target:
    """What the workers lock, picklable so that a spawned process builds it again."""

    backend: str  # "redis" or "database"
    url: str

    def provider(self) -> LockProvider:
        from locks.backends import DatabaseProvider, RedisProvider  # noqa: PLC0415

        if self.backend == "redis":
            return RedisProvider(self.url)
        return DatabaseProvider(self.url)


@dataclass
class Tally:
    """One worker's loop: what it got, and when it finished."""

    grants: int = 0
    latencies: list[float] = field(default_factory=list)  # ms, every granted acquire
    timeouts: int = 0
    errors: int = 0
    first_error: str | None = None
    ended_at: float = 0.0  # monotonic


def _warm(provider: LockProvider) -> None:
    """Connections, scripts and the table made before the clock starts."""
    key = f"scale-warm:{uuid.uuid4().hex}"
    for _ in range(20):
        lease = provider.acquire(key, ttl=TTL, wait=WAIT)
        assert lease is not None
        provider.release(lease)


def _loop(provider: LockProvider, keys: Sequence[str], seed: int, deadline: float) -> Tally:
    """Acquire (timed) and release at once, over and over until `deadline` (monotonic);
    on one key, or on a random one of `keys` each cycle."""
    tally = Tally()
    pick = random.Random(seed).choice
    single = keys[0] if len(keys) == 1 else None
    while time.monotonic() < deadline and tally.errors < MAX_ERRORS:
        key = single or pick(keys)
        asked = time.perf_counter()
        try:
            lease = provider.acquire(key, ttl=TTL, wait=WAIT)
            if lease is None:
                tally.timeouts += 1
                continue
            tally.latencies.append((time.perf_counter() - asked) * 1000)
            provider.release(lease)
            tally.grants += 1
        except LockError as exc:
            tally.errors += 1
            tally.first_error = tally.first_error or f"{type(exc).__name__}: {exc}"
    tally.ended_at = time.monotonic()
    return tally


def crowd_keys(keys: int) -> list[str]:
    base = f"scale-crowd:{uuid.uuid4().hex[:12]}"
    return [f"{base}:{index}" for index in range(keys)]


def crowd_threads(
    target: Target,
    workers: int,
    keys: int,
    seconds: float,
    calls: Callable[[], int] | None = None,
) -> CrowdRow:
    """`workers` threads of this process, sharing one provider as an application's
    threads do, loop for `seconds` (all start together); `calls` reads the server's
    counter of the calls a grant costs."""
    provider = target.provider()
    try:
        _warm(provider)
        names = crowd_keys(keys)
        tallies: list[Tally] = [Tally() for _ in range(workers)]
        deadline: list[float] = []
        start = threading.Barrier(
            workers + 1, action=lambda: deadline.append(time.monotonic() + seconds),
            timeout=REPLY_LIMIT,
        )  # fmt: skip

        def run(index: int) -> None:
            start.wait()
            tallies[index] = _loop(provider, names, index, deadline[0])

        crowd = [threading.Thread(target=run, args=(index,), name=f"locks-bench-worker-{index}",
                                  daemon=True) for index in range(workers)]  # fmt: skip
        for thread in crowd:
            thread.start()
        before = calls() if calls else 0
        start.wait()
        for thread in crowd:
            thread.join(seconds + REPLY_LIMIT)
        spent = calls() - before if calls else None
    finally:
        provider.close()
    began = deadline[0] - seconds
    return _crowd_row(target.backend, "threads", workers=workers, keys=keys, began=began,
                      seconds=seconds, tallies=tallies, spent=spent)  # fmt: skip


def _crowd_row(
    backend: str,
    mode: str,
    *,
    workers: int,
    keys: int,
    began: float,
    seconds: float,
    tallies: Sequence[Tally],
    spent: int | None,
) -> CrowdRow:
    grants = sum(t.grants for t in tallies)
    elapsed = max(t.ended_at for t in tallies) - began
    latencies = [ms for t in tallies for ms in t.latencies]
    tail = percentiles(latencies) if latencies else None
    return CrowdRow(
        backend=backend, mode=mode, workers=workers, keys=keys, seconds=round(elapsed, 3),
        grants=grants, grants_per_second=grants / elapsed if elapsed > 0 else 0.0,
        p50_ms=tail.p50 if tail else None, p99_ms=tail.p99 if tail else None,
        max_ms=max(latencies, default=None), drain_s=round(elapsed - seconds, 3),
        calls_per_grant=spent / grants if spent is not None and grants else None,
        timeouts=sum(t.timeouts for t in tallies), errors=sum(t.errors for t in tallies),
        error=next((t.first_error for t in tallies if t.first_error), None),
    )  # fmt: skip


def _serve(target: Target, pipe: Connection) -> None:
    """A worker process: builds the provider, warms it up, says "ready", then loops when
    told ("run", keys, seed, start, deadline: monotonic) and answers ("done", its
    Tally); ("stop", None) ends it. Whatever it raises is sent back as "error"."""
    try:
        provider = target.provider()
        try:
            _warm(provider)
            pipe.send(("ready", None))
            while pipe.poll(IDLE_LIMIT):
                command = pipe.recv()
                if command[0] != "run":
                    break
                _, keys, seed, start, deadline = command
                time.sleep(max(0.0, start - time.monotonic()))
                pipe.send(("done", _loop(provider, keys, seed, deadline)))
        finally:
            provider.close()
    except BaseException as exc:
        with contextlib.suppress(OSError):
            pipe.send(("error", f"{type(exc).__name__}: {exc}"))
        raise


class Workers:
    """`count` worker processes, spawned and warmed up once, that loop when told: one
    spawn serves every process point of a backend."""

    def __init__(self, target: Target, count: int) -> None:
        self.target = target
        self.pipes: list[Connection] = []
        self.processes: list[Any] = []
        for _ in range(count):
            mine, theirs = SPAWN.Pipe()
            process = SPAWN.Process(target=_serve, args=(target, theirs),
                                    name="locks-bench-scale-worker", daemon=True)  # fmt: skip
            process.start()
            theirs.close()
            self.pipes.append(mine)
            self.processes.append(process)
        try:
            for pipe in self.pipes:
                self._expect(pipe, "ready")
        except BaseException:
            self.close()
            raise

    def _expect(self, pipe: Connection, what: str, limit: float = REPLY_LIMIT) -> Any:
        if not pipe.poll(limit):
            raise RuntimeError(f"a worker process said nothing for {limit:g} s ({what!r} due)")
        said, value = pipe.recv()
        if said != what:
            raise RuntimeError(f"a worker process said {said!r}, not {what!r}: {value}")
        return value

    def crowd(
        self, workers: int, keys: int, seconds: float, calls: Callable[[], int] | None = None
    ) -> CrowdRow:
        """The first `workers` processes loop for `seconds`, from one moment that both
        sides read on CLOCK_MONOTONIC, which the processes share."""
        names = crowd_keys(keys)
        before = calls() if calls else 0
        began = time.monotonic() + 0.2  # every process has its command by then
        for seed, pipe in enumerate(self.pipes[:workers]):
            pipe.send(("run", names, seed, began, began + seconds))
        tallies = [self._expect(pipe, "done", seconds + REPLY_LIMIT)
                   for pipe in self.pipes[:workers]]  # fmt: skip
        spent = calls() - before if calls else None
        return _crowd_row(self.target.backend, "processes", workers=workers, keys=keys,
                          began=began, seconds=seconds, tallies=tallies, spent=spent)  # fmt: skip

    def close(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.send(("stop", None))
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.terminate()
                process.join(5)
        for pipe in self.pipes:
            pipe.close()


@contextmanager
def workers(target: Target, count: int) -> Iterator[Workers | None]:
    pool = Workers(target, count) if count > 0 else None
    try:
        yield pool
    finally:
        if pool is not None:
            pool.close()


def sweep_crowds(
    target: Target,
    points: Sequence[tuple[str, int, int]],
    seconds: float,
    calls: Callable[[], int] | None,
) -> list[CrowdRow]:
    """Each (mode, workers, keys) point once, parts 2 and 3 sharing the points they have
    in common; the process points on one pool of processes."""
    rows = []
    points = list(dict.fromkeys(points))
    processes = max((n for mode, n, _ in points if mode == "processes"), default=0)
    with workers(target, processes) as pool:
        for mode, count, keys in points:
            if mode == "threads":
                row = crowd_threads(target, count, keys, seconds, calls)
            else:
                assert pool is not None
                row = pool.crowd(count, keys, seconds, calls)
            rows.append(row)
            print(f"  {target.backend}, {_workers(count, mode)} on {keys:,} key"
                  f"{'s' if keys > 1 else ''}: {row['grants_per_second']:,.0f} grants/s, p99 "
                  f"{_num(row['p99_ms'], 1)} ms, {_num(row['calls_per_grant'], 2)} calls/grant"
                  + (f", {row['errors']} errors ({row['error']})" if row["errors"] else ""),
                  flush=True)  # fmt: skip
    return rows


def _workers(count: int, mode: str) -> str:
    """ "1 thread", "16 processes"."""
    return f"{count:,} {mode if count != 1 else {'processes': 'process'}.get(mode, 'thread')}"


def waiter_points(plan: Plan) -> list[tuple[str, int, int]]:
    return [("threads", n, 1) for n in plan.waiter_threads] + [
        ("processes", n, 1) for n in plan.waiter_processes
    ]


def worker_points(threads: Sequence[int], processes: Sequence[int]) -> list[tuple[str, int, int]]:
    return [(mode, n, keys) for mode, counts in (("threads", threads), ("processes", processes))
            for n in counts for keys in (1, KEYS_MANY)]  # fmt: skip


# -- part 4: server state per held lock -------------------------------------------------


def redis_memory(url: str, count: int) -> MemoryRow:
    """`count` locks held (fixed ttl: no renewals) under a prefix of their own: the
    server's used_memory and keys per lock, then the keys left after release, by kind
    (fence counters stay, with their `fence_ttl`, by design)."""
    from locks.backends import RedisProvider  # noqa: PLC0415

    client = redis.Redis.from_url(url)
    prefix = f"scale-memory-{uuid.uuid4().hex[:12]}"
    warm = RedisProvider(url, prefix=prefix + "-warm")  # scripts cached on the server
    _warm(warm)
    warm.close()
    provider = RedisProvider(url, prefix=prefix)
    try:
        before = _used_memory(client)
        leases = [provider.acquire(f"mem:{index}", ttl=600, wait=0) for index in range(count)]
        held = _used_memory(client)
        keys_held = len(list(client.scan_iter(match=f"{prefix}:*", count=1000)))
        for lease in leases:
            assert lease is not None
            provider.release(lease)
        after = _used_memory(client)
        left = _redis_left(client, prefix)
    finally:
        provider.close()
        _delete_matching(client, f"{prefix}:*")
        _delete_matching(client, f"{prefix}-warm:*")
        client.close()
    return MemoryRow(
        backend="redis", locks=count, unit="keys", units_per_lock=keys_held / count,
        bytes_per_lock=(held - before) / count, left=left, bytes_left=after - before,
        note="fence counters are kept for fence_ttl (7 days by default), with that TTL",
    )  # fmt: skip


def _used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def _redis_left(client: redis.Redis, prefix: str) -> dict[str, int]:
    keys = [key.decode() for key in client.scan_iter(match=f"{prefix}:*", count=1000)]
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.ttl(key)
    ttls = [int(t) for t in pipe.execute()] if keys else []
    lock_keys = sum(1 for key in keys if key.endswith("}"))
    fences = sum(1 for key, t in zip(keys, ttls, strict=True) if key.endswith(":fence") and t >= 0)
    return {
        "lock keys": lock_keys,
        "keys without a TTL": sum(1 for t in ttls if t == -1),
        "fence keys, with a TTL": fences,
        "other keys": len(keys) - lock_keys - fences,
    }


def zookeeper_nodes(port: int) -> int:
    """The server's node count, from the `srvr` four-letter word."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"srvr")
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
    found = re.search(rb"Node count: (\d+)", reply)
    if found is None:
        raise RuntimeError(f"no node count in srvr's answer: {reply[:200]!r}")
    return int(found.group(1))


def zookeeper_memory(server: ZooKeeperServer, count: int, reap_wait: float = 5.0) -> MemoryRow:
    """`count` locks held under a root of their own: nodes per lock (a container parent
    and an ephemeral-sequential child each), then the nodes left after release. The
    server reaps empty parents itself, at its own pace: up to `reap_wait` s are given."""
    from kazoo.client import KazooClient  # noqa: PLC0415

    from locks.backends import ZooKeeperProvider  # noqa: PLC0415

    root = f"/scale-{uuid.uuid4().hex[:12]}"
    reader = KazooClient(hosts=server.hosts)
    reader.start(timeout=15)
    provider = ZooKeeperProvider(server.hosts, root=root)
    try:
        reader.ensure_path(root)
        before = zookeeper_nodes(server.port)
        leases = [provider.acquire(f"mem:{index}", ttl=600, wait=0) for index in range(count)]
        held = zookeeper_nodes(server.port) - before
        for lease in leases:
            assert lease is not None
            provider.release(lease)
        released = time.monotonic()
        while True:  # the parents counted on both sides of the node count: none reaped
            parents = int(reader.exists(root).numChildren)  # between, so they add up
            nodes = zookeeper_nodes(server.port) - before
            if int(reader.exists(root).numChildren) != parents:
                continue
            waited = time.monotonic() - released
            if parents == 0 or waited > reap_wait:
                break
            time.sleep(0.25)
    finally:
        provider.close()
        with contextlib.suppress(Exception):
            reader.delete(root, recursive=True)
        reader.stop()
        reader.close()
    return MemoryRow(
        backend="zookeeper", locks=count, unit="nodes", units_per_lock=held / count,
        bytes_per_lock=None, left={"lock nodes": nodes - parents, "empty parents": parents},
        bytes_left=None,
        note=f"empty parents are container nodes, which the server reaps itself at its own "
        f"pace (counted {waited:.0f} s after release)",
    )  # fmt: skip


def database_memory(server: MariaDBServer, count: int) -> MemoryRow:
    """`count` locks held in a table of their own: rows and bytes (data + index length
    after ANALYZE TABLE) per lock, then the rows left after release. Release keeps a
    row free (`expires_at` 0) for its fence until `purge_after`: those are reported
    apart from live rows. Commits are not flushed meanwhile: this part counts bytes."""
    from locks.backends import DatabaseProvider  # noqa: PLC0415

    table = f"scale_memory_{uuid.uuid4().hex[:12]}"
    flush = server.sql("SELECT @@global.innodb_flush_log_at_trx_commit")
    server.sql("SET GLOBAL innodb_flush_log_at_trx_commit = 2")
    provider = DatabaseProvider(server.url, table=table)
    try:
        provider.create_table()
        before = _table_bytes(server, table)
        leases = [provider.acquire(f"mem:{index}", ttl=600, wait=0) for index in range(count)]
        held = _table_bytes(server, table)
        rows_held, _, _ = _rows(server, table)
        for lease in leases:
            assert lease is not None
            provider.release(lease)
        after = _table_bytes(server, table)
        _, live, free = _rows(server, table)
    finally:
        provider.close()
        server.sql(f"DROP TABLE IF EXISTS locks.{table}")
        server.sql(f"SET GLOBAL innodb_flush_log_at_trx_commit = {int(flush)}")
    return MemoryRow(
        backend="mariadb", locks=count, unit="rows", units_per_lock=rows_held / count,
        bytes_per_lock=(held - before) / count, left={"live rows": live, "free rows": free},
        bytes_left=after - before,
        note=f"a released row is kept, free (expires_at = 0), for its fence until "
        f"purge_after ({provider.purge_after:g} s)",
    )  # fmt: skip


def _table_bytes(server: MariaDBServer, table: str) -> int:
    server.sql(f"ANALYZE TABLE locks.{table}")
    return int(server.sql(
        "SELECT data_length + index_length FROM information_schema.tables "
        f"WHERE table_schema = 'locks' AND table_name = '{table}'"
    ))  # fmt: skip


def _rows(server: MariaDBServer, table: str) -> tuple[int, int, int]:
    """All rows, live ones (`expires_at > 0`), free ones (`expires_at = 0`)."""
    out = server.sql(f"SELECT COUNT(*), COALESCE(SUM(expires_at > 0), 0), "
                     f"COALESCE(SUM(expires_at = 0), 0) FROM locks.{table}")  # fmt: skip
    total, live, free = (int(cell) for cell in out.split())
    return total, live, free


# -- the run ----------------------------------------------------------------------------


def run(
    args: argparse.Namespace, plan: Plan
) -> tuple[list[LeaseRow], list[CrowdRow], list[MemoryRow], dict[str, Any]]:
    parts = set(args.parts)
    leases: list[LeaseRow] = []
    crowds: list[CrowdRow] = []
    memory: list[MemoryRow] = []
    versions: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="locks-bench-") as folder, ExitStack() as stack:
        workdir = Path(folder)

        def started(server: ServerProcess) -> ServerProcess:
            server.start()
            stack.callback(server.stop)
            return server

        (workdir / "redis").mkdir()
        redis_server = cast(RedisServer, started(RedisServer(workdir / "redis")))
        admin = redis.Redis.from_url(redis_server.url)
        stack.callback(admin.close)
        versions["redis"] = admin.info("server")["redis_version"]
        # Redis's own default, not the test suite's 2,000: python-redis-lock's thousands of
        # renewal threads each open a connection when their renewals coincide
        admin.config_set("maxclients", MAX_CLIENTS)
        if "leases" in parts:
            print("held leases, auto-renewed", flush=True)
            leases = sweep_leases(redis_server.url, plan)
        points = waiter_points(plan) if "waiters" in parts else []
        if "workers" in parts:
            points += worker_points(plan.worker_threads, plan.worker_processes)
        if points:
            print("crowds on Redis: waiters on one key, workers on one and on 1,000", flush=True)
            crowds += sweep_crowds(Target("redis", redis_server.url), points, plan.seconds,
                                   lambda: script_calls(admin))  # fmt: skip
        mariadb: MariaDBServer | None = None
        if "memory" in parts or ("workers" in parts and plan.database_threads):
            (workdir / "mariadb").mkdir()
            mariadb = cast(MariaDBServer,
                           started(MariaDBServer(workdir / "mariadb", durable=True)))  # fmt: skip
            versions["mariadb"] = mariadb.sql("SELECT VERSION()")
        if "workers" in parts and mariadb is not None and plan.database_threads:
            print("crowds on MariaDB: workers on one key and on 1,000", flush=True)
            server = mariadb
            crowds += sweep_crowds(Target("database", mariadb.url),
                                   worker_points(plan.database_threads, plan.database_processes),
                                   plan.seconds, lambda: statements(server))  # fmt: skip
        if "memory" in parts:
            assert mariadb is not None
            print(f"server state, {plan.memory_locks:,} locks held", flush=True)
            memory.append(redis_memory(redis_server.url, plan.memory_locks))
            (workdir / "zookeeper").mkdir()
            zookeeper = cast(ZooKeeperServer, started(ZooKeeperServer(workdir / "zookeeper")))
            versions["zookeeper"] = _zookeeper_version(zookeeper.port)
            memory.append(zookeeper_memory(zookeeper, plan.memory_locks,
                                           reap_wait=5.0 if args.quick else 20.0))  # fmt: skip
            memory.append(database_memory(mariadb, plan.memory_locks))
            for row in memory:
                print(f"  {row['backend']}: {row['units_per_lock']:.2f} {row['unit']} and "
                      f"{_num(row['bytes_per_lock'], 0)} bytes per lock; left {row['left']}",
                      flush=True)  # fmt: skip
    return leases, crowds, memory, versions


def _zookeeper_version(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"srvr")
        reply = sock.recv(4096).decode(errors="replace")
    found = re.search(r"Zookeeper version: ([^\s,-]+)", reply)
    return found.group(1) if found else "unknown"


# -- report -----------------------------------------------------------------------------


def _num(value: float | None, digits: int) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _rate(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}" if value >= 10 else f"{value:.2f}"


def leases_table(rows: Sequence[LeaseRow]) -> str:
    lines = [
        "| library | leases | set up in s | renewals/s needed | achieved | script calls "
        "per renewal | server reads per renewal | CPU s/s | round s | oldest unrenewed s | "
        "in time | lost | threads | RSS KiB per lease |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        held = f"{r['held']:,}" if r["held"] == r["leases"] else f"{r['held']:,} of {r['leases']:,}"
        verdict = "yes" if r["in_time"] else "**no**"
        lost = f"{r['lost']:,}" + (f" ({r['lost_why']})" if r["lost_why"] else "")
        if r["failure"]:
            verdict = f"**broke**: {r['failure']}"
        lines.append(
            f"| {r['library']} | {held} | {r['setup_s']:.2f} | {_rate(r['needed_per_second'])}"
            f" | {_rate(r['renewals_per_second'])} | {_num(r['calls_per_renewal'], 2)}"
            f" | {_num(r['reads_per_renewal'], 2)}"
            f" | {_num(r['cpu_per_second'], 3)} | {_num(r['round_s'], 2)} "
            f"| {_num(r['oldest_unrenewed_s'], 2)} | {verdict} | {lost} | {r['threads']:,}"
            f" | {_num(r['rss_kib_per_lease'], 2)} |"
        )
    return "\n".join(lines)


def waiters_table(rows: Sequence[CrowdRow]) -> str:
    lines = [
        "| waiting on one key | grants/s | script calls per grant | acquire p50 ms | p99 ms "
        "| max ms | timed out | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        errors = f"{r['errors']} ({r['error']})" if r["errors"] else "0"
        lines.append(
            f"| {_workers(r['workers'], r['mode'])} | {r['grants_per_second']:,.0f} "
            f"| {_num(r['calls_per_grant'], 2)} | {_num(r['p50_ms'], 2)} "
            f"| {_num(r['p99_ms'], 2)} | {_num(r['max_ms'], 0)} | {r['timeouts']} | {errors} |"
        )
    return "\n".join(lines)


def workers_table(rows: Sequence[CrowdRow]) -> str:
    by_point = {(r["backend"], r["mode"], r["workers"], r["keys"]): r for r in rows}
    lines = [
        "| backend | workers | grants/s, one key | p99 ms | calls per grant | grants/s, "
        f"{KEYS_MANY:,} keys | p99 ms | calls per grant |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    seen = sorted({(backend, mode, count) for backend, mode, count, _ in by_point},
                  key=lambda p: (backends.index(p[0]), p[1] != "threads", p[2]))  # fmt: skip
    for backend, mode, count in seen:
        cells = []
        for keys in (1, KEYS_MANY):
            r = by_point.get((backend, mode, count, keys))
            if r is None:
                cells.append("— | — | —")
            else:
                cells.append(f"{r['grants_per_second']:,.0f} | {_num(r['p99_ms'], 2)} "
                             f"| {_num(r['calls_per_grant'], 2)}")  # fmt: skip
        lines.append(f"| {backend} | {_workers(count, mode)} | {' | '.join(cells)} |")
    return "\n".join(lines)


def memory_table(rows: Sequence[MemoryRow]) -> str:
    lines = [
        "| backend | locks held | kept per lock | bytes per lock | left after release "
        "| bytes left |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        left = ", ".join(f"{count:,} {kind}" for kind, count in r["left"].items())
        lines.append(
            f"| {r['backend']} | {r['locks']:,} | {r['units_per_lock']:.2f} {r['unit']} "
            f"| {_num(r['bytes_per_lock'], 0)} | {left} | {_num(r['bytes_left'], 0)} |"
        )
    return "\n".join(lines)


def _fill(text: str) -> str:
    return textwrap.fill(text, 88, break_long_words=False, break_on_hyphens=False)


def leases_summary(rows: Sequence[LeaseRow]) -> str:
    parts = []
    for library in dict.fromkeys(r["library"] for r in rows):
        mine = [r for r in rows if r["library"] == library]
        kept = [r["held"] for r in mine if r["in_time"]]
        late = next((r for r in mine if not r["in_time"]), None)
        text = (
            f"{library} renewed up to {max(kept):,} leases in time"
            if kept
            else f"{library} renewed no count in time"
        )
        if late is not None:
            why = late["failure"] or (
                f"{late['lost']:,} lost, {_rate(late['renewals_per_second'])} of "
                f"{_rate(late['needed_per_second'])} renewals/s needed, the oldest unrenewed "
                f"for {_num(late['oldest_unrenewed_s'], 2)} s"
            )
            text += f"; at {late['leases']:,}: {why}"
        parts.append(text + ".")
    return _fill(
        " ".join(parts) + f" In time: nothing lost and no lease unrenewed for longer than "
        f"{SLACK:g}x its period (ours: a third of the watchdog ttl, {WATCHDOG_TTL:g} s "
        f"unless the row says otherwise; "
        f"python-redis-lock: 2/3 of its {PEER_EXPIRE} s expire). When a lease was last "
        "renewed is read, exactly, from its validity (ours: `valid_until` - ttl) or its "
        "key's PTTL (python-redis-lock), sampled every 0.25-0.5 s; the round is the mean "
        "time between two renewals of a lease, and renewals/s each renewed lease's "
        "renewals over the time they took, summed. Script "
        "calls and server read events (about one per round trip; not for "
        "python-redis-lock, whose sampling pipeline the server reads too) per renewal "
        "are the server's counters over the window, divided by the renewals seen. CPU: "
        "the process's, less the measuring thread's own. python-redis-lock's client has "
        "a pool as large as its lock count: with redis-py's default of 100 connections, "
        "renewal threads die of MaxConnectionsError from about 1,000 locks."
    )  # fmt: skip


def setup_note(
    settings: dict[str, Any], seconds: float, plan: Plan, *, leases: bool, crowds: bool
) -> str:
    servers = ", ".join(f"{name} {settings[name]}" for name in ("redis", "mariadb", "zookeeper")
                        if name in settings)  # fmt: skip
    text = (
        f"{harness.run_conditions(settings, seconds)} Servers on loopback: {servers}; "
        f"redis-py {settings['redis_py']}, python-redis-lock {settings['python_redis_lock']}; "
        f"Redis's maxclients {MAX_CLIENTS:,}."
    )
    if leases:
        text += f" Renewal windows of {plan.window:g} s, right after setting up."
    if crowds:
        text += (
            f" Crowds loop for {plan.seconds:g} s (their rate counts every grant until the "
            f"last worker's last release), acquiring with ttl {TTL:g} s and wait {WAIT:g} s, "
            "threads sharing one provider, each process one of its own. Calls per grant: "
            "Redis EVALSHA + EVAL (INFO commandstats), MariaDB Com_insert + Com_update + "
            "Com_delete + Com_select; MariaDB flushes its redo log at every commit."
        )
    return _fill(
        text + f" `{RESULTS.relative_to(harness.DOCS.parent)}` holds the raw results of the "
        "newest run."
    )


def memory_summary(rows: Sequence[MemoryRow]) -> str:
    notes = [f"{r['backend']}: {r['note']}." for r in rows]
    database = next((r for r in rows if r["backend"] == "mariadb"), None)
    if database is not None:
        notes.append(
            f"On MariaDB the {database['left'].get('free rows', 0):,} free rows left are "
            "by design (a released row keeps its fence, so the next grant counts on from "
            "it); live rows are those with expires_at > 0."
        )
    return _fill(" ".join(notes))


def report(
    *,
    leases: Sequence[LeaseRow],
    crowds: Sequence[CrowdRow],
    memory: Sequence[MemoryRow],
    settings: dict[str, Any],
    seconds: float,
    plan: Plan,
) -> str:
    sections = []
    if leases:
        sections += [
            "Held leases, auto-renewed on one provider (ours) or by a thread per "
            "lock (python-redis-lock):",
            leases_table(leases),
            leases_summary(leases),
        ]
    waiting = [r for r in crowds if r["backend"] == "redis"
               and (r["mode"], r["workers"], r["keys"]) in waiter_points(plan)]  # fmt: skip
    if waiting:
        sections += ["Waiters on one Redis key, every one looping acquire + release:",
                     waiters_table(waiting)]  # fmt: skip
    points = {
        "redis": worker_points(plan.worker_threads, plan.worker_processes),
        "database": worker_points(plan.database_threads, plan.database_processes),
    }
    working = [r for r in crowds if (r["mode"], r["workers"], r["keys"]) in
               points.get(r["backend"], [])]  # fmt: skip
    if working:
        sections += ["Workers on one key, and on 1,000 keys (a random one per cycle):",
                     workers_table(working)]  # fmt: skip
    if waiting or working:
        sections.append(crowds_summary(waiting, working))
    if memory:
        sections += ["Server state per held lock, and what release leaves:",
                     memory_table(memory), memory_summary(memory)]  # fmt: skip
    sections.append(setup_note(settings, seconds, plan, leases=bool(leases),
                               crowds=bool(crowds)))  # fmt: skip
    return "\n\n".join(sections)


def crowds_summary(waiting: Sequence[CrowdRow], working: Sequence[CrowdRow]) -> str:
    """The ends of each sweep, in a sentence each."""
    parts = []
    for mode in ("threads", "processes"):
        mine = sorted((r for r in waiting if r["mode"] == mode), key=lambda r: r["workers"])
        if len(mine) >= 2:
            a, b = mine[0], mine[-1]
            parts.append(
                f"From {a['workers']:,} to {_workers(b['workers'], mode)} on one Redis key, "
                f"grants/s went {a['grants_per_second']:,.0f} -> "
                f"{b['grants_per_second']:,.0f}, script calls per grant "
                f"{_num(a['calls_per_grant'], 2)} -> {_num(b['calls_per_grant'], 2)} and "
                f"acquire p99 {_num(a['p99_ms'], 2)} -> {_num(b['p99_ms'], 2)} ms."
            )
    for backend in dict.fromkeys(r["backend"] for r in working):
        threads = [r for r in working if r["backend"] == backend and r["mode"] == "threads"]
        most = max((r["workers"] for r in threads), default=0)
        one = next((r for r in threads if r["workers"] == most and r["keys"] == 1), None)
        many = next((r for r in threads if r["workers"] == most and r["keys"] > 1), None)
        if one and many:
            parts.append(
                f"{backend}: {_workers(most, 'threads')} made {one['grants_per_second']:,.0f} "
                f"grants/s on one key and {many['grants_per_second']:,.0f} on {many['keys']:,} "
                f"keys (p99 {_num(one['p99_ms'], 2)} and {_num(many['p99_ms'], 2)} ms)."
            )
    seen = {id(r): r for r in [*waiting, *working]}.values()
    for r in seen:
        if r["timeouts"] or r["errors"] or r["drain_s"] > 1.0:
            parts.append(
                f"{r['backend']}, {_workers(r['workers'], r['mode'])} on {r['keys']:,} key"
                f"{'s' if r['keys'] > 1 else ''}: {r['timeouts']} acquires timed out (wait "
                f"{WAIT:g} s), {r['errors']} failed, and the last grant came "
                f"{r['drain_s']:.1f} s after the loop's end."
            )
    return _fill(
        " ".join(parts) + " Calls per grant: 2 are the acquire and the release; each one "
        "more is a try that found the key held again (a waiter woken, or polling)."
    )


def machine(load_before: float) -> dict[str, Any]:
    """What the figures depend on besides the code: the machine and the versions."""
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg()[0],
        "redis_py": redis.__version__,
        "python_redis_lock": metadata.version("python-redis-lock"),
        "kazoo": metadata.version("kazoo"),
    }


# -- plot -------------------------------------------------------------------------------

_BACKEND_COLOURS = {"redis": plots.OURS_COLOUR, "database": "#2ca02c"}


def draw_scale(title: str, results: ScaleResults, path: Path = IMAGE) -> Path:
    """docs/img/scale.png: held leases (top: renewals/s achieved and needed, CPU, the
    oldest unrenewed lease) and crowds (bottom: grants/s, acquire p99, server calls
    per grant), each against the work on a log axis; ours in colour, the peer grey."""
    path.parent.mkdir(parents=True, exist_ok=True)
    figure = plots._figure(15, 8.5)
    axes = figure.subplots(2, 3)
    _lease_panels(axes[0], results["leases"])
    _crowd_panels(axes[1], results["crowds"])
    for row in axes:
        for panel in row:
            panel.grid(alpha=0.3, which="both")
    return plots._save(figure, title, path)


def _lease_panels(axes: Sequence[Any], rows: Sequence[LeaseRow]) -> None:
    rate_axes, cpu_axes, age_axes = axes
    for library in dict.fromkeys(r["library"] for r in rows):
        mine = [r for r in rows if r["library"] == library and r["held"] > 0]
        colour = plots.OURS_COLOUR if mine and mine[0]["ours"] else plots.PEER_COLOUR
        held = [r["held"] for r in mine]
        rate_axes.plot(held, [r["renewals_per_second"] or math.nan for r in mine], "o-",
                       color=colour, label=f"{library}, achieved")  # fmt: skip
        rate_axes.plot(held, [r["needed_per_second"] for r in mine], ":", color=colour,
                       label=f"{library}, needed")  # fmt: skip
        cpu_axes.plot(held, [r["cpu_per_second"] or math.nan for r in mine], "o-",
                      color=colour, label=library)  # fmt: skip
        age_axes.plot(held, [r["oldest_unrenewed_s"] or math.nan for r in mine], "o-",
                      color=colour, label=library)  # fmt: skip
        if mine:
            age_axes.axhline(mine[0]["period_s"], color=colour, linestyle=":", linewidth=1)
        for r in mine:
            if r["lost"] or r["failure"]:
                label = " broke" if r["failure"] else f" {r['lost']:,} lost"
                age_axes.annotate(label, (r["held"], r["oldest_unrenewed_s"] or 0),
                                  fontsize=7, color="#d62728")  # fmt: skip
    age_axes.axhline(WATCHDOG_TTL, color="#d62728", linestyle="--", linewidth=1)
    for panel, label, log_y in (
        (rate_axes, "renewals/s (dotted: needed)", True),
        (cpu_axes, "CPU s per s while renewing", True),
        (age_axes, "oldest unrenewed lease, s\n(dotted: the period; red: the ttl)", False),
    ):
        panel.set_xscale("log")
        if log_y:
            panel.set_yscale("log")
        panel.set_xlabel("leases held by one process (log)")
        panel.set_ylabel(label)
        if not rows:
            panel.annotate("not measured", (0.5, 0.5), xycoords="axes fraction", ha="center")
    if rows:
        rate_axes.legend(fontsize=7)


def _crowd_panels(axes: Sequence[Any], rows: Sequence[CrowdRow]) -> None:
    rate_axes, tail_axes, calls_axes = axes
    series = dict.fromkeys((r["backend"], r["mode"], r["keys"]) for r in rows)
    for backend, mode, keys in series:
        mine = sorted((r for r in rows if (r["backend"], r["mode"], r["keys"]) ==
                       (backend, mode, keys)), key=lambda r: r["workers"])  # fmt: skip
        style = {
            "color": _BACKEND_COLOURS.get(backend, plots.PEER_COLOUR),
            "linestyle": "-" if mode == "threads" else "--",
            "marker": "o" if keys == 1 else "s",
            "label": f"{backend}, {mode}, {keys:,} key{'s' if keys > 1 else ''}",
        }
        counts = [r["workers"] for r in mine]
        rate_axes.plot(counts, [r["grants_per_second"] for r in mine], **style)
        tail_axes.plot(counts, [r["p99_ms"] or math.nan for r in mine], **style)
        calls_axes.plot(counts, [r["calls_per_grant"] or math.nan for r in mine], **style)
    for panel, label in (
        (rate_axes, "grants/s (higher is better)"),
        (tail_axes, "acquire p99, ms (lower is better)"),
        (calls_axes, "server calls per grant\n(Redis scripts, MariaDB statements)"),
    ):
        panel.set_xscale("log")
        if panel is not calls_axes:  # calls stay near 2: a linear axis shows their growth
            panel.set_yscale("log")
        panel.set_xlabel("workers: threads of one process, or processes (log)")
        panel.set_ylabel(label)
        if not rows:
            panel.annotate("not measured", (0.5, 0.5), xycoords="axes fraction", ha="center")
    if rows:
        rate_axes.legend(fontsize=7)
        calls_axes.set_ylim(bottom=0)


def load_results(path: Path = RESULTS) -> ScaleResults:
    if not path.exists():
        raise SystemExit(f"no {path}: run python -m {MODULE}")
    return cast(ScaleResults, json.loads(path.read_text()))


# -- main -------------------------------------------------------------------------------


def arguments(argv: list[str] | None) -> argparse.Namespace:
    options = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    options.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                         help="which sweeps to run (default: all)")  # fmt: skip
    options.add_argument("--json", type=Path, help=f"default: {RESULTS}")
    options.add_argument(
        "--no-write", action="store_true", help="do not append to docs/ or draw docs/img/"
    )
    options.add_argument(
        "--quick", action="store_true", help="fewer, smaller points: about a minute; no writing"
    )
    options.add_argument("--redraw", action="store_true",
                         help=f"only draw {IMAGE.name} again from {RESULTS.name}")  # fmt: skip
    args = options.parse_args(argv)
    if args.quick:
        args.no_write = True  # a quick run's figures are not the report's
    return args


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    if args.redraw:
        saved = load_results(args.json or RESULTS)
        title = f"{saved['title']} ({saved['stamp']})"
        print(f"drew {draw_scale(title, saved)}")
        return 0
    plan = QUICK if args.quick else FULL
    load_before = os.getloadavg()[0]  # 1-minute: other work on the machine skews figures
    started = time.perf_counter()
    leases, crowds, memory, versions = run(args, plan)
    elapsed = time.perf_counter() - started
    print(f"whole run {elapsed:.0f} s")
    settings = {
        **machine(load_before),
        **versions,
        "quick": args.quick,
        "plan": dataclasses.asdict(plan),
    }
    command = f"python -m {MODULE} " + " ".join(argv if argv is not None else sys.argv[1:])
    results = ScaleResults(
        title=TITLE, stamp=harness.utc_stamp(), command=command.strip(),
        seconds=round(elapsed, 1), settings=settings, leases=leases, crowds=crowds,
        memory=memory,
    )  # fmt: skip
    body = report(leases=leases, crowds=crowds, memory=memory, settings=settings,
                  seconds=elapsed, plan=plan)  # fmt: skip
    print(body)
    harness.save_results(args.json or (None if args.no_write else RESULTS), results)
    if args.no_write:
        return 0

    def draw() -> Path:
        return draw_scale(f"{TITLE} ({results['stamp']})", results)

    harness.append_with_plot(TITLE, results["command"], body, results["stamp"], draw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
