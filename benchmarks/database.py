"""Our database backend next to the peers, against one MariaDB, in one run.

    python -m benchmarks.database [--cycles 2000] [--rounds 5] [--samples 20] [--no-write]

Starts its own MariaDB (`tests.servers.MariaDBServer`) on a free loopback port.
Baseline: a raw PyMySQL pair in autocommit on a table of its own (INSERT of a unique
key to take, DELETE to give back; it only spins to wait, so no hand-off is reported).
Peer: tooz's mysql driver (GET_LOCK/RELEASE_LOCK; it opens a connection per lock
object and closes it on release). Like ours (`wait=30`), tooz waits with
`timeout=30`, which waits inside GET_LOCK; tooz's `blocking=True` without a timeout
polls GET_LOCK(name, 0) about once a second instead.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

import pymysql  # type: ignore[import-untyped]  # no stubs in the dev extra
from tooz import coordination

from benchmarks.harness import Contender, append_report, measure, table
from locks.backends import DatabaseProvider
from locks.base import ProviderBase
from tests.servers import MariaDBServer


def ours(provider: ProviderBase, label: str) -> Contender:
    def acquire(key: str) -> Any:
        return provider.acquire(key, ttl=30, wait=30)

    return Contender(label, acquire, provider.release, provider.close)


def raw_insert_delete(server: MariaDBServer) -> Contender:
    server.sql("CREATE TABLE IF NOT EXISTS locks.bench_raw (name VARCHAR(255) PRIMARY KEY)")
    host, port = server.address.rsplit(":", 1)
    local = threading.local()  # a PyMySQL connection serves one thread at a time
    opened: list[Any] = []

    def connection() -> Any:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = pymysql.connect(
                host=host,
                port=int(port),
                user="locks",
                password=server.password,
                database="locks",
                autocommit=True,
                ssl_disabled=True,
            )
            local.conn = conn
            opened.append(conn)
        return conn

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

    def close() -> None:
        for conn in opened:
            conn.close()

    return Contender("raw pymysql INSERT + DELETE", acquire, release, close)


def tooz_mysql(server: MariaDBServer) -> Contender:
    url = f"mysql://locks:{server.password}@{server.address}/locks"
    coordinator = coordination.get_coordinator(url, uuid.uuid4().hex.encode())
    coordinator.start()

    def acquire(key: str) -> Any:
        lock = coordinator.get_lock(key.encode())
        assert lock.acquire(blocking=True, timeout=30)
        return lock

    return Contender("tooz mysql", acquire, lambda lock: lock.release(), coordinator.stop)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--no-write", action="store_true", help="do not append to docs/")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="locks-bench-") as workdir:
        server = MariaDBServer(Path(workdir), durable=True)  # fsync per commit
        server.start()
        try:
            contenders = [
                raw_insert_delete(server),
                tooz_mysql(server),
                ours(DatabaseProvider(server.url), "fallback-locks database"),
            ]
            results = measure(contenders, args.cycles, args.rounds, args.samples)
        finally:
            server.stop()
    # the raw pair has no waiting of its own worth timing
    results[0].handoff_ms = None
    report = table(results, baseline="raw pymysql INSERT + DELETE")
    print(report)
    if not args.no_write:
        command = "python -m benchmarks.database " + " ".join(argv or sys.argv[1:])
        path = append_report("Database: uncontended cycles and hand-off", command.strip(), report)
        print(f"appended to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
