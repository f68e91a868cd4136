"""Our database backend next to the peers, against one MariaDB, in one run.

    python -m benchmarks.database [--cycles 2000] [--rounds 3] [--samples 20] [--window 5]
                                  [--json PATH] [--no-write] [--quick]

Starts its own MariaDB (`tests.servers.MariaDBServer`, durable: the redo log flushed at
every commit, as in production) on a free loopback port, and measures:

1. Uncontended acquire + release cycles/s (--cycles per contender and round, --rounds
   rounds, contenders interleaved) and the hand-off between two threads of one process
   (median of --samples), as `benchmarks.harness.measure` does. Baseline: a raw PyMySQL
   pair in autocommit on a table of its own (INSERT of a unique key to take, DELETE to
   give back; it only spins to wait, so no hand-off is reported). The floor: our own
   two statements on a key in use (`DatabaseProvider`'s update that takes the free row,
   and its owner-and-fence guarded release, which keeps the row free for its fence, on
   a lock table of its own) replayed by bare PyMySQL in autocommit; the
   target is ours >= 0.95x of it. Peer: tooz's mysql
   driver (GET_LOCK/RELEASE_LOCK; it opens a connection per lock object and closes it
   on release). Like ours (`wait=30`), tooz waits with `timeout=30`, which waits inside
   GET_LOCK; tooz's `blocking=True` without a timeout polls GET_LOCK(name, 0) about
   once a second instead.
2. Hand-off to another process: this process takes a fresh key and keeps it 0.3 s while
   a waiter in a process of its own (spawned and warmed up once per contender) waits
   for it; the time from the holder's release call to the waiter's acquire returning
   (both read CLOCK_MONOTONIC, which the processes share), --samples times: median and
   p90. MariaDB announces no release, so our waiter polls: at the default
   poll_interval (25 ms) and at 10 ms. tooz's waiter sits inside GET_LOCK.
3. What a waiting process costs the server: N threads of one process (1, then 8) wait
   on a key another process holds; after a second to settle, the server's Com_insert +
   Com_update + Com_delete + Com_select over --window seconds, per second, and the
   connections the waiting process holds meanwhile (Threads_connected, against the
   count before it started, the holder holding a key).

Appends a section to docs/benchmarks.md, draws docs/img/database.png and writes the raw
results to docs/img/database.json (what `python -m benchmarks.plots database` redraws
from). --no-write writes none of these; --json still writes the results. `RATIOS` go to
benchmarks/results/database.json; --quick measures those (part 1, without tooz) only.

The cross-process parts (`Peer`, `Waiting`, `process_handoffs`, `contended`) serve
`benchmarks.postgresql` too.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import random
import re
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pymysql  # type: ignore[import-untyped]  # no stubs in the dev extra
from tooz import coordination

from benchmarks import harness, plots
from benchmarks.harness import (
    Contender,
    Ratio,
    Result,
    provider_contender,
    utc_stamp,
)
from locks import measure as core
from locks.backends import DatabaseProvider
from locks.backends.database import _CLOCK_US, _MYSQL_TAKE, _MYSQL_UPSERT, _RELEASE
from tests.servers import MariaDBServer

TITLE = "Database (MariaDB): uncontended cycles, hand-off across processes, polling cost"
MODULE = "benchmarks.database"
RAW = "raw pymysql INSERT + DELETE"
REPLAY = "bare pymysql, our take + release"
OURS = "fallback-locks database"
RATIOS = (
    Ratio("database/database-vs-bare-pymysql-our-statements", OURS, REPLAY),
    Ratio("database/database-vs-raw-pymysql", OURS, RAW),
)
HOLD = 0.3  # s the holder keeps a key in a cross-process hand-off
SETTLE = 1.0  # s waiting threads get before the query count starts
CROWDS = (1, 8)  # waiting threads in the one waiting process
COUNTERS = ("Com_insert", "Com_update", "Com_delete", "Com_select")

SPAWN = multiprocessing.get_context("spawn")  # a fresh interpreter: no fork of our threads
REPLY_LIMIT = 60.0  # s: a waiting process silent for longer is stuck, and the run fails
IDLE_LIMIT = 300.0  # s: a waiting process told nothing for longer exits by itself


# -- contenders that another process can make too ----------------------------------------


@dataclass(frozen=True)
class Peer:
    """A contender that a spawned process can make again: `make(*args)`, a module-level
    function (pickled by name), builds it; `name` labels it."""

    name: str
    make: Callable[..., Contender]
    args: tuple[Any, ...] = ()

    def contender(self) -> Contender:
        made = self.make(*self.args)
        made.name = self.name
        return made


def ours(url: str, poll_interval: float = 0.025) -> Contender:
    """Our provider (ttl=30, wait=30), polling every `poll_interval` where it must."""
    return provider_contender(DatabaseProvider(url, poll_interval=poll_interval), OURS)


def tooz_mysql(url: str) -> Contender:
    """tooz's mysql driver: a lock object per acquire, as `with coordinator.get_lock(..)`
    makes one; it connects in get_lock and disconnects on release."""
    coordinator = coordination.get_coordinator(url, uuid.uuid4().hex.encode())
    coordinator.start()

    def acquire(key: str) -> Any:
        lock = coordinator.get_lock(key.encode())
        assert lock.acquire(blocking=True, timeout=30)
        return lock

    return Contender("tooz mysql", acquire, lambda lock: lock.release(), coordinator.stop)


def _per_thread(server: MariaDBServer) -> tuple[Callable[[], Any], Callable[[], None]]:
    """A bare PyMySQL connection per thread, in autocommit, and a way to close them all."""
    return harness.per_thread(lambda: pymysql.connect(**server.pymysql_args(), autocommit=True))


def raw_insert_delete(server: MariaDBServer) -> Contender:
    server.sql("CREATE TABLE IF NOT EXISTS locks.bench_raw (name VARCHAR(255) PRIMARY KEY)")
    connection, close = _per_thread(server)

    def acquire(key: str) -> Any:
        cursor = connection().cursor()
        while True:
            try:
                cursor.execute("INSERT INTO bench_raw (name) VALUES (%s)", (key,))
                return key
            except pymysql.IntegrityError:
                pass  # spin: only the uncontended figure of this floor is reported

    def release(key: str) -> None:
        connection().cursor().execute("DELETE FROM bench_raw WHERE name = %s", (key,))

    return Contender(RAW, acquire, release, close)


def replay_ours(server: MariaDBServer) -> Contender:
    """The floor of the target: the provider's own acquire and release statements, as
    it sends them on a key in use while the lock is free, on a lock table it made, with
    the library left out (the fence comes back as LAST_INSERT_ID, and guards the
    release)."""
    table = "bench_replay"
    made = DatabaseProvider(server.url, table=table)
    made.create_table()
    made.close()

    def pyformat(sql: str) -> str:  # the provider's `:name` parameters, as PyMySQL's
        named = re.sub(r":([A-Za-z_]\w*)", r"%(\1)s", sql)  # before the clock's '00:00'
        return named.format(t=table, now=_CLOCK_US["mysql"])

    take, upsert, free = pyformat(_MYSQL_TAKE), pyformat(_MYSQL_UPSERT), pyformat(_RELEASE)
    owner = uuid.uuid4().hex
    connection, close = _per_thread(server)

    def acquire(key: str) -> Any:
        cursor = connection().cursor()
        params = {"name": key, "owner": owner, "ttl_us": 30_000_000}
        while True:  # as a try of ours: the take, the upsert where it took nothing
            params["token"] = f"{random.getrandbits(128):032x}"
            if not cursor.execute(take, params):
                cursor.execute(upsert, params)
            if cursor.lastrowid:  # else held: spin (only the uncontended figure counts)
                return key, cursor.lastrowid

    def release(handle: tuple[str, int]) -> None:
        key, fence = handle
        params = {"name": key, "owner": owner, "fence": fence}
        connection().cursor().execute(free, params)

    return Contender(REPLAY, acquire, release, close)


# -- a waiting process ------------------------------------------------------------------


def _serve(peer: Peer, pipe: Connection) -> None:
    """A waiting process: makes `peer`'s contender, warms it up, then waits for what it
    is told, one command at a time:
    ("wait", key, 1): "waiting" just before it acquires `key`, "got" (monotonic s) as
    soon as it has it, then releases it;
    ("crowd", key, n): n threads acquire `key` (each releases at once), "waiting" when
    they have started, "got" (how many had it) when all are done;
    ("stop", "", 0): close and exit. Whatever it raises is sent back as "error"."""
    try:
        contender = peer.contender()
        try:
            core.warm_up(contender.acquire, contender.release, core.bench_key(), 20)
            pipe.send(("ready", 0.0))
            while pipe.poll(IDLE_LIMIT):
                command, key, threads = pipe.recv()
                if command == "stop":
                    break
                if command == "wait":
                    pipe.send(("waiting", time.monotonic()))
                    handle = contender.acquire(key)
                    got = time.monotonic()
                    contender.release(handle)
                    pipe.send(("got", got))
                elif command == "crowd":
                    pipe.send(("got", _crowd(contender, key, threads, pipe)))
        finally:
            contender.close()
    except BaseException as exc:
        pipe.send(("error", f"{peer.name}: {type(exc).__name__}: {exc}"))
        raise


def _crowd(contender: Contender, key: str, threads: int, pipe: Connection) -> int:
    granted: list[int] = []

    def one() -> None:
        contender.release(contender.acquire(key))
        granted.append(1)

    crowd = [threading.Thread(target=one, daemon=True) for _ in range(threads)]
    for thread in crowd:
        thread.start()
    pipe.send(("waiting", time.monotonic()))
    deadline = time.monotonic() + REPLY_LIMIT
    for thread in crowd:
        thread.join(max(0.0, deadline - time.monotonic()))
    return len(granted)


class Waiting:
    """A process of its own that waits for `peer`'s locks when told to (`_serve`)."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.pipe, child = SPAWN.Pipe()
        self.process = SPAWN.Process(
            target=_serve, args=(peer, child), name="locks-bench-waiting", daemon=True
        )
        self.process.start()
        child.close()
        self.expect("ready")

    def ask(self, command: str, key: str, threads: int = 1) -> None:
        self.pipe.send((command, key, threads))

    def expect(self, what: str) -> float:
        """The number the process sent with `what`; raises on silence or its error."""
        if not self.pipe.poll(REPLY_LIMIT):
            raise RuntimeError(f"{self.peer.name}: the waiting process said nothing for "
                               f"{REPLY_LIMIT:g} s (expected {what!r})")  # fmt: skip
        said, value = self.pipe.recv()
        if said == "error":
            raise RuntimeError(f"the waiting process failed: {value}")
        if said != what:
            raise RuntimeError(f"{self.peer.name}: the waiting process said {said!r}, not {what!r}")
        return float(value)

    def close(self) -> None:
        with contextlib.suppress(OSError):  # gone already
            self.ask("stop", "")
        self.process.join(10)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(5)
        self.pipe.close()


@contextmanager
def waiting(peer: Peer) -> Iterator[Waiting]:
    process = Waiting(peer)
    try:
        yield process
    finally:
        process.close()


def process_handoffs(
    holder: Contender, waiter: Waiting, samples: int, hold: float = HOLD
) -> list[float]:
    """Milliseconds from `holder`'s release call (this process) to the acquire of the
    same key returning in `waiter`'s process, once per sample, each on a fresh key that
    the holder kept `hold` seconds; the waiter starts waiting as soon as it is held."""
    latencies = []
    for _ in range(samples):
        key = core.bench_key()
        handle = holder.acquire(key)
        held_at = time.monotonic()
        waiter.ask("wait", key)
        waiter.expect("waiting")
        time.sleep(max(0.0, held_at + hold - time.monotonic()))
        released_at = time.monotonic()
        holder.release(handle)
        latencies.append((waiter.expect("got") - released_at) * 1000)
    return latencies


# -- N threads of one process on one key -------------------------------------------------


@dataclass
class Contention:
    """What `contended` rounds found for one contender."""

    rates: list[float] = field(default_factory=list)  # grants/s, per round
    latencies: list[float] = field(default_factory=list)  # ms, every acquire of every round


def contended(
    contender: Contender, key: str, threads: int, seconds: float, into: Contention | None = None
) -> Contention:
    """`threads` threads of this process take `key` and give it back at once, over and
    over, for `seconds`; each acquire is timed from its call to its return. The round
    ends when the last thread has had its last grant (those waiting at the deadline
    still get theirs), and its rate is all grants over that time."""
    found = into if into is not None else Contention()
    start = threading.Barrier(threads + 1, timeout=REPLY_LIMIT)
    per_thread: list[list[float]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []
    ends = [0.0]
    limit = 1_000_000  # acquires per thread: a bound besides the clock

    def run(mine: list[float]) -> None:
        try:
            start.wait()
            while time.perf_counter() < ends[0] and len(mine) < limit:
                asked = time.perf_counter()
                handle = contender.acquire(key)
                mine.append((time.perf_counter() - asked) * 1000)
                contender.release(handle)
        except BaseException as exc:
            errors.append(exc)

    crowd = [threading.Thread(target=run, args=(mine,), daemon=True) for mine in per_thread]
    for thread in crowd:
        thread.start()
    started = time.perf_counter()
    ends[0] = started + seconds
    start.wait()
    for thread in crowd:
        thread.join(seconds + REPLY_LIMIT)
    elapsed = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"{contender.name}: a contending thread failed") from errors[0]
    if any(thread.is_alive() for thread in crowd):
        raise RuntimeError(f"{contender.name}: a contending thread did not finish")
    grants = [latency for mine in per_thread for latency in mine]
    found.rates.append(len(grants) / elapsed)
    found.latencies.extend(grants)
    return found


# -- what a waiting process costs the server ---------------------------------------------


class Status:
    """The server's global status counters, read as root over the Unix socket (SHOW
    STATUS counts as none of the counters read)."""

    def __init__(self, server: MariaDBServer) -> None:
        self.connection = pymysql.connect(unix_socket=str(server.socket), user="root")

    def read(self) -> dict[str, int]:
        names = ", ".join(f"'{name}'" for name in (*COUNTERS, "Threads_connected"))
        with self.connection.cursor() as cursor:
            cursor.execute(f"SHOW GLOBAL STATUS WHERE Variable_name IN ({names})")
            return {str(name): int(value) for name, value in cursor.fetchall()}

    def close(self) -> None:
        self.connection.close()


@dataclass
class Load:
    queries_per_second: float  # the four counters, summed
    by_counter: dict[str, float]  # each counter, per second
    connections: int  # held by the waiting process (Threads_connected, against before)


def idle_load(status: Status, window: float) -> Load:
    """The counters with nobody waiting: the server's own background, and ours."""
    before = status.read()
    started = time.monotonic()
    time.sleep(window)
    after = status.read()
    return _load(before, after, time.monotonic() - started, before["Threads_connected"])


def waiting_load(
    holder: Contender,
    waiter: Waiting,
    status: Status,
    *,
    threads: int,
    window: float,
    connections_before: int,
) -> Load:
    """The counters over `window` seconds while `threads` threads of `waiter`'s process
    wait on a key `holder` keeps; then the holder lets go and every thread has it."""
    key = core.bench_key()
    handle = holder.acquire(key)
    try:
        waiter.ask("crowd", key, threads)
        waiter.expect("waiting")
        time.sleep(SETTLE)
        before = status.read()
        started = time.monotonic()
        time.sleep(window)
        after = status.read()
        elapsed = time.monotonic() - started
    finally:
        holder.release(handle)
    granted = waiter.expect("got")
    if granted != threads:
        raise RuntimeError(f"{waiter.peer.name}: {granted:g} of {threads} waiters got the key")
    return _load(before, after, elapsed, connections_before)


def _load(before: dict[str, int], after: dict[str, int], seconds: float, base: int) -> Load:
    by_counter = {name: (after[name] - before[name]) / seconds for name in COUNTERS}
    return Load(sum(by_counter.values()), by_counter, after["Threads_connected"] - base)


# -- the run ----------------------------------------------------------------------------


def arguments(argv: list[str] | None) -> argparse.Namespace:
    options = harness.parser(__doc__, results=plots.DATABASE_RESULTS["database"])
    options.add_argument("--window", type=float, default=5.0, help="s of query counting")
    options.set_defaults(rounds=3)  # tooz's connection per lock: ~50 cycles/s, ~2 min
    args = harness.parse(options, argv)
    if args.cycles < 1 or args.rounds < 1 or args.samples < 1 or args.window <= 0:
        options.error("need --cycles, --rounds, --samples >= 1 and --window > 0")
    return args


def row(name: str, is_ours: bool) -> plots.DatabaseRow:
    """A table row with nothing measured yet."""
    return plots.DatabaseRow(
        name=name, ours=is_ours, cycles_per_second=None, handoff_ms=None,
        process_handoffs_ms=[], contended_grants_per_second=None, contended_p50_ms=None,
        contended_p99_ms=None, waiting_queries_per_second={}, waiting_by_counter={},
        waiting_connections={},
    )  # fmt: skip


def from_results(rows: dict[str, plots.DatabaseRow], results: Sequence[Result]) -> None:
    """The uncontended rounds' medians into `rows` (made where missing)."""
    for result in results:
        entry = rows.setdefault(result.name, row(result.name, result.ours))
        entry["cycles_per_second"] = result.cycles_per_second
        entry["handoff_ms"] = result.handoff_ms


def run(args: argparse.Namespace) -> tuple[list[plots.DatabaseRow], dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="locks-bench-") as workdir:
        server = MariaDBServer(Path(workdir), durable=True)  # fsync per commit
        server.start()
        status: Status | None = None
        try:
            status = Status(server)
            version = server.sql("SELECT VERSION()")
            tooz_url = f"mysql://locks:{server.password}@{server.address}/locks"
            peers = [
                Peer("tooz mysql", tooz_mysql, (tooz_url,)),
                Peer(OURS, ours, (server.url,)),
                Peer(f"{OURS}, poll_interval=0.01", ours, (server.url, 0.01)),
            ]
            print("uncontended cycles and hand-off between threads", flush=True)
            contenders = [
                raw_insert_delete(server),
                replay_ours(server),
                *(p.contender() for p in peers[:2]),
            ]
            if args.quick:
                contenders = harness.needed(contenders, RATIOS)
            results = harness.measure(
                contenders, args.cycles, args.rounds, args.samples, no_handoff=(RAW, REPLAY)
            )
            rows: dict[str, plots.DatabaseRow] = {}
            from_results(rows, results)
            settings: dict[str, Any] = {"mariadb": version}
            if not args.quick:
                idle = idle_load(status, args.window)
                settings["idle_queries_per_second"] = idle.queries_per_second
                print(f"  nobody waiting: {idle.queries_per_second:.1f} queries/s", flush=True)
                for peer in peers:
                    entry = rows.setdefault(peer.name, row(peer.name, peer.name.startswith(OURS)))
                    measure_waiting(peer, entry, status, args)
        finally:
            if status is not None:
                status.close()
            server.stop()
    return list(rows.values()), settings


def measure_waiting(
    peer: Peer, entry: plots.DatabaseRow, status: Status, args: argparse.Namespace
) -> None:
    """`peer`'s hand-offs to another process, then the load its waiting threads put on
    the server, into `entry`."""
    holder = peer.contender()
    try:
        core.warm_up(holder.acquire, holder.release, core.bench_key(), 20)
        # the server's connections before the waiting process, the holder's while it
        # holds a key among them (tooz's holder connects for each lock)
        probe = holder.acquire(core.bench_key())
        connections_before = status.read()["Threads_connected"]
        holder.release(probe)
        with waiting(peer) as waiter:
            entry["process_handoffs_ms"] = process_handoffs(holder, waiter, args.samples)
            median, p90 = plots.median_p90(entry["process_handoffs_ms"])
            print(f"  {peer.name}: hand-off to another process {median:.2f} ms, p90 {p90:.2f}",
                  flush=True)  # fmt: skip
            for threads in CROWDS:
                load = waiting_load(
                    holder, waiter, status, threads=threads, window=args.window,
                    connections_before=connections_before,
                )  # fmt: skip
                entry["waiting_queries_per_second"][str(threads)] = load.queries_per_second
                entry["waiting_by_counter"][str(threads)] = load.by_counter
                entry["waiting_connections"][str(threads)] = load.connections
                print(f"  {peer.name}, {threads} waiting: {load.queries_per_second:.1f} "
                      f"queries/s, {load.connections} connections", flush=True)  # fmt: skip
    finally:
        holder.close()


# -- report -----------------------------------------------------------------------------


def uncontended(rows: Sequence[plots.DatabaseRow]) -> list[Result]:
    """The contenders of the uncontended rounds, as `harness.measure` found them."""
    return [
        Result(r["name"], r["cycles_per_second"], r["handoff_ms"], r["ours"])
        for r in rows
        if r["cycles_per_second"] is not None
    ]


def cycles_table(rows: Sequence[plots.DatabaseRow], baseline: str) -> str:
    """The contenders of the uncontended rounds, as `harness.table` writes them (the
    table `benchmarks.plots` parses)."""
    return harness.table(uncontended(rows), baseline)


def waiting_table(rows: Sequence[plots.DatabaseRow]) -> str:
    lines = [
        "| contender | hand-off to another process, median ms | p90 ms "
        + "".join(f"| queries/s, {n} waiting " for n in CROWDS)
        + f"| connections held, {CROWDS[-1]} waiting |",
        "|---|---:|---:|" + "---:|" * len(CROWDS) + "---:|",
    ]
    for r in rows:
        if not r["process_handoffs_ms"]:
            continue
        median, p90 = plots.median_p90(r["process_handoffs_ms"])
        load = "".join(f"| {r['waiting_queries_per_second'][str(n)]:.1f} " for n in CROWDS)
        held = r["waiting_connections"][str(CROWDS[-1])]
        lines.append(f"| {r['name']} | {median:.2f} | {p90:.2f} {load}| {held} |")
    return "\n".join(lines)


def _by_name(rows: Sequence[plots.DatabaseRow], name: str) -> plots.DatabaseRow:
    return next(r for r in rows if r["name"] == name)


def summary(rows: Sequence[plots.DatabaseRow], settings: dict[str, Any]) -> str:
    raw = _by_name(rows, RAW)["cycles_per_second"]
    mine, fast = _by_name(rows, OURS), _by_name(rows, f"{OURS}, poll_interval=0.01")
    peer = _by_name(rows, "tooz mysql")
    assert raw and mine["cycles_per_second"] and peer["cycles_per_second"]
    handoff = {r["name"]: plots.median_p90(r["process_handoffs_ms"])[0] for r in (mine, fast, peer)}
    few, many = (str(n) for n in CROWDS)
    total = mine["waiting_queries_per_second"][few]
    inserts = mine["waiting_by_counter"][few]["Com_insert"] / total if total else 0.0
    text = (
        f"Uncontended, ours ran {mine['cycles_per_second'] / raw:.2f}x the raw pair and "
        f"{mine['cycles_per_second'] / peer['cycles_per_second']:.1f}x tooz. A release "
        f"reached a waiter in another process in {handoff[OURS]:.1f} ms (median) at the "
        f"default poll_interval of 25 ms, {handoff[fast['name']]:.1f} ms at 10 ms; "
        f"tooz's, inside GET_LOCK, in {handoff['tooz mysql']:.2f} ms. "
        f"While it waited, a process of ours cost the server "
        f"{mine['waiting_queries_per_second'][few]:.0f} statements a second with one "
        f"waiting thread ({inserts:.0%} of them INSERTs: a poll is one INSERT ... ON "
        "DUPLICATE KEY UPDATE, which MySQL counts as an INSERT) and "
        f"{mine['waiting_queries_per_second'][many]:.0f} "
        f"with {many}; {fast['waiting_queries_per_second'][few]:.0f} and "
        f"{fast['waiting_queries_per_second'][many]:.0f} at 10 ms. tooz's waiters sent "
        f"{peer['waiting_queries_per_second'][many]:.1f} a second but held "
        f"{peer['waiting_connections'][many]} connections for {many} waiting threads "
        f"(ours: {mine['waiting_connections'][many]}). With nobody waiting the counters "
        f"moved by {settings['idle_queries_per_second']:.1f} a second."
    )
    return textwrap.fill(text, 88, break_long_words=False, break_on_hyphens=False)


def setup_note(settings: dict[str, Any], seconds: float) -> str:
    text = (
        f"{harness.run_conditions(settings, seconds)} MariaDB {settings['mariadb']} on "
        "loopback, its redo log flushed at every commit. PyMySQL "
        f"{settings['pymysql']}, SQLAlchemy {settings['sqlalchemy']}, tooz "
        f"{settings['tooz']}. Cycles: {settings['cycles']} per contender and round, "
        f"{settings['rounds']} rounds interleaved, the median round; hand-off between "
        f"threads: median of {settings['samples']}, a fresh key each. Hand-off to another "
        f"process: {settings['samples']} samples, the holder keeping each fresh key "
        f"{HOLD:g} s. Queries: {settings['window']:g} s windows, {SETTLE:g} s after the "
        "waiting threads started, on a key this process holds (ttl 30 s). "
        "`docs/img/database.json` holds the raw results of the newest run."
    )
    return textwrap.fill(text, 88, break_long_words=False, break_on_hyphens=False)


def machine(args: argparse.Namespace, load_before: float) -> dict[str, Any]:
    """What the figures depend on besides the code: the machine and the versions."""
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cycles": args.cycles,
        "rounds": args.rounds,
        "samples": args.samples,
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg()[0],
        "sqlalchemy": metadata.version("SQLAlchemy"),
        "tooz": metadata.version("tooz"),
    }


def write(
    name: str, results: plots.DatabaseResults, body: str, json_path: Path | None, no_write: bool
) -> None:
    """Print the section; write the raw results to `json_path` if any; unless told not
    to, draw docs/img/<name>.png and append the section to docs/benchmarks.md."""
    print(body)
    harness.save_results(json_path, results)
    if no_write:
        return
    title, stamp = results["title"], results["stamp"]

    def draw() -> Path:
        return plots.draw_database(name, f"{title} ({stamp})", results["rows"])

    harness.append_with_plot(title, results["command"], body, stamp, draw)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    load_before = os.getloadavg()[0]  # 1-minute: other work on the machine skews figures
    started = time.perf_counter()
    rows, found = run(args)
    elapsed = time.perf_counter() - started
    print(f"whole run {elapsed:.0f} s")
    harness.write_ratios("database", args, uncontended(rows), RATIOS)
    if args.quick:  # its ratios only: the rest of the report was not measured
        print(cycles_table(rows, RAW))
        return 0
    settings = {
        **machine(args, load_before),
        **found,
        "window": args.window,
        "pymysql": metadata.version("PyMySQL"),
    }
    command = f"python -m {MODULE} " + " ".join(argv if argv is not None else sys.argv[1:])
    results = plots.DatabaseResults(
        title=TITLE, stamp=utc_stamp(), command=command.strip(), seconds=round(elapsed, 1),
        settings=settings, rows=rows,
    )  # fmt: skip
    body = "\n\n".join(
        [
            cycles_table(rows, RAW),
            waiting_table(rows),
            summary(rows, settings),
            setup_note(settings, elapsed),
        ]
    )
    json_path = args.json or (None if args.no_write else plots.DATABASE_RESULTS["database"])
    write("database", results, body, json_path, args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
