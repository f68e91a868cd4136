"""Our database backend on PostgreSQL next to the bare driver and tooz, in one run.

    python -m benchmarks.postgresql [--cycles 2000] [--rounds 5] [--samples 20]
                                    [--threads 8] [--seconds 3] [--json PATH] [--no-write]
                                    [--quick]

Starts its own PostgreSQL (`tests.servers.postgresql.PostgreSQLServer`, durable: fsync
and full page writes on, synchronous_commit on, as in production) on a free loopback
port, and measures:

1. Uncontended acquire + release cycles/s (--cycles per contender and round, --rounds
   rounds, contenders interleaved) and the hand-off between two threads of one process
   (median of --samples), as `benchmarks.harness.measure` does. Ours on psycopg 3 (the
   default driver) and on psycopg2 (`postgresql+psycopg2://`). The floor: our own two
   statements on a key in use (`DatabaseProvider`'s update that takes the free row,
   and its release, which keeps the row free and announces it by `pg_notify`), as the
   provider compiles them, replayed by bare psycopg 3 in autocommit on a lock table of
   their own; the target is ours >= 0.95x of it. Beside it the bare pair: an INSERT of
   a unique key into a one-column table to take, a DELETE to give back (neither floor
   waits: each only spins, so no hand-off is reported). Peer: tooz's PostgreSQL driver
   (`postgresql://user:password@host:port?dbname=name`; it needs psycopg2, and tooz
   9.1 warns that it is deprecated): a session-level advisory lock,
   `pg_advisory_lock(k1, k2)` with k1, k2 the first two bytes of the name's MD5, on a
   connection it opens for each lock object and closes on release. It waits inside
   `pg_advisory_lock`, woken by the server's lock manager, and takes no timeout.
2. Hand-off to another process (`benchmarks.database.process_handoffs`): this process
   takes a fresh key and keeps it 0.3 s while a waiter in a process of its own waits
   for it; from the holder's release call to the waiter's acquire returning, --samples
   times: median and p90. Our waiter hears of the release by LISTEN/NOTIFY.
3. --threads threads of one process on one key, each taking it and giving it back at
   once, for --seconds per round (--rounds rounds, contenders interleaved): grants/s
   (the median round) and the acquire latency, call to return, p50/p99 over all rounds.

Appends a section to docs/benchmarks.md, draws docs/img/postgresql.png and writes the
raw results to docs/img/postgresql.json (what `python -m benchmarks.plots postgresql`
redraws from). --no-write writes none of these; --json still writes the results. `RATIOS`
go to benchmarks/results/postgresql.json; --quick measures those (part 1, without tooz)
only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import textwrap
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import psycopg
import psycopg2  # type: ignore[import-untyped]  # no stubs in the dev extra
from tooz import coordination

from benchmarks import harness, plots
from benchmarks.database import (
    OURS,
    Contention,
    Peer,
    contended,
    cycles_table,
    from_results,
    machine,
    ours,
    process_handoffs,
    uncontended,
    waiting,
    write,
)
from benchmarks.harness import Contender, Ratio, utc_stamp
from locks import measure as core
from locks.backends import DatabaseProvider
from tests.servers.postgresql import PostgreSQLServer

TITLE = "PostgreSQL: uncontended cycles, hand-off across processes, 8 threads on one key"
MODULE = "benchmarks.postgresql"
BARE = "bare psycopg 3 INSERT + DELETE"
REPLAY = "bare psycopg 3, our take + release"
REPLAY_2 = "bare psycopg2, our take + release"
TOOZ = "tooz postgresql"
OURS_3 = f"{OURS} (psycopg 3)"
OURS_2 = f"{OURS} (psycopg2)"
TARGET = 0.95  # ours / bare, uncontended
RATIOS = (
    Ratio("postgresql/psycopg3-vs-bare-psycopg-our-statements", OURS_3, REPLAY),
    Ratio("postgresql/psycopg2-vs-bare-psycopg2-our-statements", OURS_2, REPLAY_2),
    Ratio("postgresql/psycopg2-vs-bare-psycopg-our-statements", OURS_2, REPLAY),
    Ratio("postgresql/psycopg3-vs-bare-psycopg", OURS_3, BARE),
    Ratio("postgresql/psycopg2-vs-bare-psycopg", OURS_2, BARE),
)
WARM_UP = 0.5  # s of contention before the timed rounds: connections opened, pools grown


def _per_thread(
    args: dict[str, Any],
) -> tuple[Callable[[], psycopg.Connection[Any]], Callable[[], None]]:
    """A bare psycopg 3 connection per thread, in autocommit, and a way to close them."""
    return harness.per_thread(lambda: psycopg.connect(**args, autocommit=True))


def bare_psycopg(args: dict[str, Any]) -> Contender:
    """The floor: an INSERT of the name into a one-column table of its own, a DELETE to
    give it back, in autocommit, on one psycopg 3 connection per thread."""
    connection, close = _per_thread(args)
    connection().execute("CREATE TABLE IF NOT EXISTS bench_raw (name VARCHAR(255) PRIMARY KEY)")

    def acquire(key: str) -> Any:
        conn = connection()
        while True:
            try:
                conn.execute("INSERT INTO bench_raw (name) VALUES (%s)", (key,))
                return key
            except psycopg.errors.UniqueViolation:
                pass  # spin: only the uncontended figure of this floor is reported

    def release(key: str) -> None:
        connection().execute("DELETE FROM bench_raw WHERE name = %s", (key,))

    return Contender(BARE, acquire, release, close)


def _per_thread_psycopg2(
    args: dict[str, Any], prepare: Sequence[str] = ()
) -> tuple[Callable[[], Any], Callable[[], None]]:
    """As `_per_thread`, on psycopg2, each connection running `prepare` first."""

    def connect() -> Any:
        conn = psycopg2.connect(**args)
        conn.autocommit = True
        for statement in prepare:
            conn.cursor().execute(statement)
        return conn

    return harness.per_thread(connect)


def replay_ours(url: str, args: dict[str, Any], *, psycopg2_driver: bool = False) -> Contender:
    """The floor of the target: the provider's own take and release, as it compiles
    and sends them on a key in use while the lock is free, on a lock table it made,
    run by the bare driver it uses (psycopg 3, or psycopg2 for a `+psycopg2` url)
    with the library left out."""
    table = "bench_replay2" if psycopg2_driver else "bench_replay"
    made = DatabaseProvider(url, table=table)
    made.create_table()
    take, free = made._take_sql, made._release_sql  # its very statements
    made.close()
    if psycopg2_driver:  # they are EXECUTEs of statements each connection prepares once
        prepared = [take.prepare_sql, free.prepare_sql]  # type: ignore[attr-defined]
        connection, close = _per_thread_psycopg2(args, prepared)
    else:  # psycopg prepares them itself, as the provider does, from their fifth run
        connection, close = _per_thread(args)
    owner = uuid.uuid4().hex

    def acquire(key: str) -> Any:
        cur = connection().cursor()  # a cursor per call, as the provider per statement
        params = {"name": key, "owner": owner, "ttl_us": 30_000_000}
        while True:  # the first cycle inserts the row; then, as ours, the take alone
            params["token"] = uuid.uuid4().hex
            cur.execute(take.sql, params)
            row = cur.fetchone()
            if row is None:
                cur.execute(
                    f"INSERT INTO {table} (name, owner, token, depth, fence, expires_at,"
                    " acquired_at) VALUES (%s, %s, %s, 1, 1, 0, 0) ON CONFLICT DO NOTHING",
                    (key, owner, params["token"]),
                )
                continue
            return key, int(row[0])

    def release(handle: tuple[str, int]) -> None:
        key, fence = handle
        cur = connection().cursor()
        cur.execute(free.sql, {"name": key, "owner": owner, "fence": fence})
        cur.fetchall()

    return Contender(REPLAY_2 if psycopg2_driver else REPLAY, acquire, release, close)


def tooz_postgresql(url: str) -> Contender:
    """tooz's PostgreSQL driver: a lock object per acquire, as `with
    coordinator.get_lock(..)` makes one; it connects in acquire, disconnects on release."""
    with warnings.catch_warnings():  # "PostgreSQL driver is deprecated"
        warnings.simplefilter("ignore", DeprecationWarning)
        coordinator = coordination.get_coordinator(url, uuid.uuid4().hex.encode())
    coordinator.start()

    def acquire(key: str) -> Any:
        lock = coordinator.get_lock(key.encode())
        assert lock.acquire(blocking=True)  # no timeout: tooz raises NotImplemented
        return lock

    return Contender(TOOZ, acquire, lambda lock: lock.release(), coordinator.stop)


# -- the run ----------------------------------------------------------------------------


def driver_version(*distributions: str) -> str:
    """The version of the first of `distributions` installed (psycopg2 comes as either)."""
    for distribution in distributions:
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def arguments(argv: list[str] | None) -> argparse.Namespace:
    options = harness.parser(__doc__, results=plots.DATABASE_RESULTS["postgresql"])
    options.add_argument("--threads", type=int, default=8, help="on one key")
    options.add_argument("--seconds", type=float, default=3.0, help="per contended round")
    args = harness.parse(options, argv)
    if min(args.cycles, args.rounds, args.samples, args.threads) < 1 or args.seconds <= 0:
        options.error("need --cycles, --rounds, --samples, --threads >= 1 and --seconds > 0")
    return args


def run(args: argparse.Namespace) -> tuple[list[plots.DatabaseRow], dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="locks-bench-") as workdir:
        server = PostgreSQLServer(Path(workdir), durable=True)
        server.start()
        try:
            version = server.sql("SHOW server_version")
            tooz_url = f"postgresql://locks:{server.password}@{server.address}?dbname=locks"
            peers = [
                Peer(TOOZ, tooz_postgresql, (tooz_url,)),
                Peer(OURS_3, ours, (server.url,)),
                Peer(OURS_2, ours, (server.psycopg2_url,)),
            ]
            print("uncontended cycles and hand-off between threads", flush=True)
            floors = [
                replay_ours(server.url, server.psycopg_args()),
                replay_ours(server.psycopg2_url, server.psycopg_args(), psycopg2_driver=True),
                bare_psycopg(server.psycopg_args()),
            ]
            contenders = [*floors, *(p.contender() for p in peers)]
            if args.quick:
                contenders = harness.needed(contenders, RATIOS)
            results = harness.measure(
                contenders,
                args.cycles,
                args.rounds,
                args.samples,
                no_handoff=(REPLAY, REPLAY_2, BARE),
            )
            rows: dict[str, plots.DatabaseRow] = {}
            from_results(rows, results)
            if not args.quick:  # a quick run is its ratios only
                for peer in peers:
                    rows[peer.name]["process_handoffs_ms"] = handoffs(peer, args.samples)
                measure_contention(peers, rows, args)
        finally:
            server.stop()
    return list(rows.values()), {"postgresql": version}


def handoffs(peer: Peer, samples: int) -> list[float]:
    """`peer`'s hand-offs from this process to another."""
    holder = peer.contender()
    try:
        core.warm_up(holder.acquire, holder.release, core.bench_key(), 20)
        with waiting(peer) as waiter:
            found = process_handoffs(holder, waiter, samples)
    finally:
        holder.close()
    median, p90 = plots.median_p90(found)
    print(f"  {peer.name}: hand-off to another process {median:.2f} ms, p90 {p90:.2f}",
          flush=True)  # fmt: skip
    return found


def measure_contention(
    peers: Sequence[Peer], rows: dict[str, plots.DatabaseRow], args: argparse.Namespace
) -> None:
    """--threads threads on one key per contender, rounds interleaved, into `rows`."""
    print(f"{args.threads} threads on one key", flush=True)
    contenders = [peer.contender() for peer in peers]
    keys = [core.bench_key() for _ in contenders]
    found = [Contention() for _ in contenders]
    try:
        for contender, key in zip(contenders, keys, strict=True):
            contended(contender, key, args.threads, WARM_UP)  # discarded
        for index in range(args.rounds):
            for contender, key, into in zip(contenders, keys, found, strict=True):
                contended(contender, key, args.threads, args.seconds, into)
            print(f"  round {index + 1} of {args.rounds}", flush=True)
    finally:
        for contender in contenders:
            contender.close()
    for contender, figures in zip(contenders, found, strict=True):
        entry = rows[contender.name]
        tail = core.percentiles(figures.latencies)
        entry["contended_grants_per_second"] = statistics.median(figures.rates)
        entry["contended_p50_ms"] = tail.p50
        entry["contended_p99_ms"] = tail.p99
        print(f"  {contender.name}: {entry['contended_grants_per_second']:,.0f} grants/s, "
              f"acquire p50 {tail.p50:.2f} ms p99 {tail.p99:.2f} ms", flush=True)  # fmt: skip


# -- report -----------------------------------------------------------------------------


def _by_name(rows: Sequence[plots.DatabaseRow], name: str) -> plots.DatabaseRow:
    return next(r for r in rows if r["name"] == name)


def waiting_table(rows: Sequence[plots.DatabaseRow], threads: int) -> str:
    peer = _by_name(rows, TOOZ)
    peer_handoff = plots.median_p90(peer["process_handoffs_ms"])[0]
    peer_grants = peer["contended_grants_per_second"] or 0.0
    lines = [
        "| contender | hand-off to another process, median ms | p90 ms | median vs tooz "
        f"| {threads} threads on one key, grants/s | vs tooz | acquire p50 ms "
        "| acquire p99 ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if not r["process_handoffs_ms"]:
            continue
        median, p90 = plots.median_p90(r["process_handoffs_ms"])
        grants = r["contended_grants_per_second"] or 0.0
        lines.append(
            f"| {r['name']} | {median:.2f} | {p90:.2f} | {median / peer_handoff:.2f}x "
            f"| {grants:,.0f} | {grants / peer_grants:.2f}x | {r['contended_p50_ms'] or 0:.2f} "
            f"| {r['contended_p99_ms'] or 0:.2f} |"
        )
    return "\n".join(lines)


def targets(rows: Sequence[plots.DatabaseRow]) -> str:
    """Ours against the floor (our statements, bare), reported, never asserted."""
    bare = _by_name(rows, BARE)["cycles_per_second"] or 1.0
    peer = _by_name(rows, TOOZ)["cycles_per_second"] or 1.0
    parts = []
    for name, driver, replay in ((OURS_3, "psycopg 3", REPLAY), (OURS_2, "psycopg2", REPLAY_2)):
        floor = _by_name(rows, replay)["cycles_per_second"] or 1.0
        rate = _by_name(rows, name)["cycles_per_second"] or 0.0
        met = "met" if rate / floor >= TARGET else "not met"
        parts.append(
            f"{driver} {rate / floor:.2f}x ({met}; {rate / bare:.2f}x the bare psycopg 3 "
            f"pair, {rate / peer:.1f}x tooz)"
        )
    text = (
        f"Target: ours >= {TARGET}x our own statements replayed by the same driver, "
        "bare: " + ", ".join(parts) + "."
    )  # fmt: skip
    return textwrap.fill(text, 88, break_long_words=False, break_on_hyphens=False)


def summary(rows: Sequence[plots.DatabaseRow], threads: int) -> str:
    mine, peer = _by_name(rows, OURS_3), _by_name(rows, TOOZ)
    other = _by_name(rows, OURS_2)
    mine_handoff, mine_p90 = plots.median_p90(mine["process_handoffs_ms"])
    other_handoff = plots.median_p90(other["process_handoffs_ms"])[0]
    peer_handoff, peer_p90 = plots.median_p90(peer["process_handoffs_ms"])
    text = (
        f"A release reached a waiter in another process in {mine_handoff:.2f} ms (median; "
        f"p90 {mine_p90:.2f}) on psycopg 3 and {other_handoff:.2f} ms on psycopg2, by "
        f"NOTIFY; tooz's waiter, blocked in pg_advisory_lock, had it in "
        f"{peer_handoff:.2f} ms (p90 {peer_p90:.2f}). With {threads} threads of one "
        f"process on one key ours granted {mine['contended_grants_per_second'] or 0:,.0f} "
        f"a second (psycopg2 {other['contended_grants_per_second'] or 0:,.0f}), tooz "
        f"{peer['contended_grants_per_second'] or 0:,.0f}; acquire p99 "
        f"{mine['contended_p99_ms'] or 0:.1f} ms against tooz's "
        f"{peer['contended_p99_ms'] or 0:.1f} ms."
    )
    return textwrap.fill(text, 88, break_long_words=False, break_on_hyphens=False)


def setup_note(settings: dict[str, Any], seconds: float) -> str:
    text = (
        f"{harness.run_conditions(settings, seconds)} PostgreSQL {settings['postgresql']} "
        "on loopback, fsync and full_page_writes on, synchronous_commit on. psycopg "
        f"{settings['psycopg']}, psycopg2 {settings['psycopg2']}, SQLAlchemy "
        f"{settings['sqlalchemy']}, tooz {settings['tooz']}. Cycles: {settings['cycles']} "
        f"per contender and round, {settings['rounds']} rounds interleaved, the median "
        f"round; hand-off between threads: median of {settings['samples']}, a fresh key "
        f"each. Hand-off to another process: {settings['samples']} samples, the holder "
        "keeping each fresh key 0.3 s. Threads on one key: a discarded warm-up of "
        f"{WARM_UP:g} s, then {settings['rounds']} rounds of {settings['seconds']:g} s "
        "interleaved, the median round's grants/s, p50/p99 over every acquire of them; "
        "nothing is done while the key is held. Ours: ttl 30 s, wait 30 s. "
        "`docs/img/postgresql.json` holds the raw results of the newest run."
    )
    return textwrap.fill(text, 88, break_long_words=False, break_on_hyphens=False)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    load_before = os.getloadavg()[0]  # 1-minute: other work on the machine skews figures
    started = time.perf_counter()
    rows, found = run(args)
    elapsed = time.perf_counter() - started
    print(f"whole run {elapsed:.0f} s")
    harness.write_ratios("postgresql", args, uncontended(rows), RATIOS)
    if args.quick:  # its ratios only: the rest of the report was not measured
        print(cycles_table(rows, BARE))
        return 0
    settings = {
        **machine(args, load_before),
        **found,
        "threads": args.threads,
        "seconds": args.seconds,
        "psycopg": metadata.version("psycopg"),
        "psycopg2": driver_version("psycopg2-binary", "psycopg2"),
    }
    command = f"python -m {MODULE} " + " ".join(argv if argv is not None else sys.argv[1:])
    results = plots.DatabaseResults(
        title=TITLE, stamp=utc_stamp(), command=command.strip(), seconds=round(elapsed, 1),
        settings=settings, rows=rows,
    )  # fmt: skip
    body = "\n\n".join(
        [
            cycles_table(rows, BARE),
            targets(rows),
            waiting_table(rows, args.threads),
            summary(rows, args.threads),
            setup_note(settings, elapsed),
        ]
    )
    json_path = args.json or (None if args.no_write else plots.DATABASE_RESULTS["postgresql"])
    write("postgresql", results, body, json_path, args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
