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

import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pymysql  # type: ignore[import-untyped]  # no stubs in the dev extra
from tooz import coordination

from benchmarks.harness import Contender, compare, provider_contender
from locks.backends import DatabaseProvider
from tests.servers import MariaDBServer


def raw_insert_delete(server: MariaDBServer) -> Contender:
    server.sql("CREATE TABLE IF NOT EXISTS locks.bench_raw (name VARCHAR(255) PRIMARY KEY)")
    local = threading.local()  # a PyMySQL connection serves one thread at a time
    opened: list[Any] = []

    def connection() -> Any:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = pymysql.connect(**server.pymysql_args(), autocommit=True)
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


def durable_mariadb(workdir: Path) -> MariaDBServer:
    return MariaDBServer(workdir, durable=True)  # fsync per commit, as in production


def main(argv: list[str] | None = None) -> int:
    def contenders(server: MariaDBServer) -> list[Contender]:
        return [
            raw_insert_delete(server),
            tooz_mysql(server),
            provider_contender(DatabaseProvider(server.url), "fallback-locks database"),
        ]

    return compare(
        argv,
        module="benchmarks.database",
        description=__doc__,
        title="Database: uncontended cycles and hand-off",
        server=durable_mariadb,
        contenders=contenders,
        baseline="raw pymysql INSERT + DELETE",
        no_handoff=["raw pymysql INSERT + DELETE"],  # it only spins
    )


if __name__ == "__main__":
    sys.exit(main())
