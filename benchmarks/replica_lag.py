"""How long after a lock row is committed on a MariaDB primary its replica has it: the
window in which a promoted replica can lack a lock, idle and under a write load.

    python -m benchmarks.replica_lag [--writes 300] [--seconds 15] [--loads 0,1,4]
                                     [--semi-sync] [--no-write]

Starts its own primary and replica (`tests.servers.mariadb_replica.MariaDBPair`) on free
loopback ports, durable as production servers are (redo log and binlog fsynced at each
commit, on both), with MariaDB 10.11's replication defaults: asynchronous binlog + GTID,
MIXED format, one applier thread.

One sample: acquire a fresh key on the primary through our provider (the row is
committed when `acquire` returns), then poll the replica, one connection as fast as it
answers, until the row is there with that fence. The lag runs from the acquire's return
to the poll that saw the row: a poll's round trip (~0.1 ms) is its resolution. The lease
is released, and the next sample starts 2-10 ms later; a phase ends after `--writes`
samples or `--seconds`, whichever comes first. Under load, N other threads run acquire
+ release cycles on keys of their own on the primary, as fast as they can (two commits a
cycle), for the whole phase; afterwards, how long the replica took to apply what it
still had to. One applier applies serially what the primary's threads committed in
parallel (its group commit shares the fsyncs): once the primary commits faster than the
replica applies, the lag grows for as long as the load lasts.

`--semi-sync`: semi-synchronous replication (AFTER_SYNC), so an acquire returns only once
the replica has the row in its relay log; the lag measured is still until it is applied
and visible. The acquire column shows what the wait for the replica costs.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pymysql  # type: ignore[import-untyped]  # no stubs in the dev extra

from benchmarks.harness import publish
from locks.backends import DatabaseProvider
from locks.measure import bench_key, percentiles
from tests.servers.mariadb_replica import MariaDBPair

TITLE = "MariaDB replica lag: commit of a lock row on the primary -> row on the replica"
POLL_LIMIT = 120.0  # seconds: a sample that waits longer is a broken replica, not a lag


@dataclass
class Phase:
    threads: int  # load threads beside the sampler
    lags_ms: list[float]
    acquires_ms: list[float]  # the sampled acquires' own latency
    load_writes_per_s: float  # lock-row commits per second by the load threads
    drained_ms: float  # after the load stopped: until the replica had applied everything


class Load:
    """`threads` threads cycling acquire + release on their own keys until stopped."""

    def __init__(self, db: DatabaseProvider, threads: int) -> None:
        self._db = db
        self._stop = threading.Event()
        self._cycles = [0] * threads
        self._threads = [
            threading.Thread(target=self._run, args=(i,), name=f"load-{i}", daemon=True)
            for i in range(threads)
        ]
        self.started = time.perf_counter()
        for thread in self._threads:
            thread.start()

    def _run(self, index: int) -> None:
        key = bench_key()
        while not self._stop.is_set():
            lease = self._db.acquire(key, ttl=30)
            if lease is not None:
                self._db.release(lease)
                self._cycles[index] += 1

    def stop(self) -> float:
        """Stop; the load's lock-row commits per second."""
        self._stop.set()
        for thread in self._threads:
            thread.join()
        elapsed = time.perf_counter() - self.started
        return 2 * sum(self._cycles) / elapsed if elapsed > 0 else 0.0


def sample(db: DatabaseProvider, replica: pymysql.Connection) -> tuple[float, float]:
    """One write's lag, in ms: from `acquire` returning to the replica showing the row;
    and the acquire's own latency."""
    key = bench_key()
    called = time.perf_counter()
    lease = db.acquire(key, ttl=30)
    assert lease is not None
    committed = time.perf_counter()
    with replica.cursor() as cursor:
        while True:
            cursor.execute("SELECT fence FROM locks WHERE name = %s", (key,))
            found = cursor.fetchone()
            seen = time.perf_counter()
            if found is not None and found[0] == lease.fence:
                break
            if seen - committed > POLL_LIMIT:
                raise RuntimeError(f"the replica lacked {key!r} after {POLL_LIMIT} s")
    db.release(lease)
    return (seen - committed) * 1000, (committed - called) * 1000


def phase(
    pair: MariaDBPair, db: DatabaseProvider, threads: int, writes: int, seconds: float
) -> Phase:
    replica = pymysql.connect(**pair.replica.pymysql_args(), autocommit=True)
    load = Load(db, threads) if threads else None
    try:
        time.sleep(0.5 if load else 0)  # the load reaches its pace
        lags: list[float] = []
        acquires: list[float] = []
        ends = time.perf_counter() + seconds
        while len(lags) < writes and time.perf_counter() < ends:
            lag, acquire = sample(db, replica)
            lags.append(lag)
            acquires.append(acquire)
            time.sleep(random.uniform(0.002, 0.010))
    finally:
        rate = load.stop() if load else 0.0
        replica.close()
    stopped = time.perf_counter()
    pair.wait_caught_up(timeout=300)
    drained = (time.perf_counter() - stopped) * 1000
    return Phase(threads, lags, acquires, rate, drained)


def table(phases: list[Phase], replication: str) -> str:
    lines = [
        f"| {replication} replication, load on the primary | load, lock-row commits/s "
        "| writes sampled | lag median ms | p99 ms | max ms | acquire median ms "
        "| replica caught up after the load, ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in phases:
        stats = percentiles(p.lags_ms)
        plural = "s" if p.threads > 1 else ""
        load = f"{p.threads} thread{plural} of acquire + release" if p.threads else "idle"
        rate = "—" if not p.threads else f"{p.load_writes_per_s:,.0f}"
        drained = "—" if not p.threads else f"{p.drained_ms:,.0f}"
        lines.append(
            f"| {load} | {rate} | {stats.samples} | {stats.p50:.2f} | {stats.p99:.2f} "
            f"| {max(p.lags_ms):.2f} | {statistics.median(p.acquires_ms):.2f} | {drained} |"
        )
    return "\n".join(lines)


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--writes", type=int, default=300, help="samples per phase, at most")
    parser.add_argument("--seconds", type=float, default=15.0, help="per phase, at most")
    parser.add_argument(
        "--loads", default="0,1,4", help="load threads per phase, comma-separated (0: idle)"
    )
    parser.add_argument(
        "--semi-sync", action="store_true", help="semi-synchronous replication (AFTER_SYNC)"
    )
    parser.add_argument(
        "--no-write", action="store_true", help="do not append to docs/benchmarks.md"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    loads = [int(n) for n in args.loads.split(",")]
    with tempfile.TemporaryDirectory(prefix="locks-bench-") as workdir:
        pair = MariaDBPair(Path(workdir) / "pair", durable=True)
        try:
            pair.start()
            if args.semi_sync:
                pair.semi_sync()
            db = DatabaseProvider(pair.primary.url, pool_size=max(loads) + 2)
            try:
                db.release(db.acquire(bench_key(), ttl=30) or sys.exit("not acquired"))
                pair.wait_caught_up()  # the table is on the replica
                phases = []
                for threads in loads:
                    done = phase(pair, db, threads, args.writes, args.seconds)
                    phases.append(done)
                    print(f"  load threads {threads}: {len(done.lags_ms)} samples", flush=True)
            finally:
                db.close()
        finally:
            pair.stop()
    replication = "semi-synchronous" if args.semi_sync else "asynchronous"
    body = table(phases, replication)
    publish(TITLE, "benchmarks.replica_lag", argv, body, not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
