"""Where one acquire+release cycle's time goes, per backend.

    python -m benchmarks.profile [BACKEND ...] [--cycles 3000] [--top 12] [--null-driver]

BACKEND: redis, redis-hash, zookeeper, mariadb, postgresql, file, local (default: all).
Each runs against a server this process starts on a free loopback port. For each: the
wall time of a cycle without a profiler, then one run under cProfile with every
function's own time (`tottime`) sorted into: our code (`locks/`), the driver's Python
(redis-py, kazoo, PyMySQL, psycopg, SQLAlchemy), waiting on the socket (the round trip
and the server: `recv`, `select`, `poll`, locks and events a driver's reader thread
sets), and the rest (the standard library, the interpreter). The profiler inflates
Python time, so read the shares, not the microseconds; the top functions of our own
code come last. This is what issue 20's optimizations start from.

--null-driver (the database backends): after the profile, the cycle once more with every
statement answered at once by a connection that does no I/O, so what is left is our own
code's time, unprofiled: what a database cycle costs beyond the driver and the server.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from locks.backends import (
    DatabaseProvider,
    FileProvider,
    LocalProvider,
    RedisHashProvider,
    RedisProvider,
    ZooKeeperProvider,
)
from locks.provider import LockProvider

BACKENDS = ("redis", "redis-hash", "zookeeper", "mariadb", "postgresql", "file", "local")
_DRIVERS = ("/redis/", "/kazoo/", "/pymysql/", "/psycopg/", "/psycopg2/", "/sqlalchemy/")
# builtins a cycle spends waiting in: for the reply (the round trip and the server), or
# for a driver's reader thread to hand it over (kazoo)
_WAITS = ("recv", "recv_into", "select", "poll", "acquire", "wait", "sendall", "send",
          "_wait_for_tstate_lock")  # fmt: skip


@contextmanager
def provider_for(backend: str, workdir: Path) -> Iterator[LockProvider]:
    from tests.servers import MariaDBServer, RedisServer, ZooKeeperServer  # noqa: PLC0415
    from tests.servers.postgresql import PostgreSQLServer  # noqa: PLC0415

    servers: dict[str, Callable[[Path], Any]] = {
        "redis": RedisServer, "redis-hash": RedisServer, "zookeeper": ZooKeeperServer,
        "mariadb": lambda path: MariaDBServer(path, durable=True),
        "postgresql": lambda path: PostgreSQLServer(path, durable=True),
    }  # fmt: skip
    server = None
    if backend in servers:
        (workdir / backend).mkdir()
        server = servers[backend](workdir / backend)
        server.start()
    try:
        url = "" if server is None else str(server.url)
        made: dict[str, Callable[[], LockProvider]] = {
            "redis": lambda: RedisProvider(url),
            "redis-hash": lambda: RedisHashProvider(url),
            "zookeeper": lambda: ZooKeeperProvider(url),
            "mariadb": lambda: DatabaseProvider(url),
            "postgresql": lambda: DatabaseProvider(url),
            "file": lambda: FileProvider(str(workdir / "files")),
            "local": LocalProvider,
        }
        provider = made[backend]()
        try:
            yield provider
        finally:
            provider.close()
    finally:
        if server is not None:
            server.stop()


def cycles(provider: LockProvider, count: int) -> float:
    """Seconds per uncontended acquire+release cycle (fixed ttl, one try)."""
    key = f"profile:{uuid.uuid4().hex}"
    for _ in range(min(count, 200)):  # connections made, scripts cached, tables created
        lease = provider.acquire(key, ttl=30, wait=0)
        assert lease is not None
        provider.release(lease)
    started = time.perf_counter()
    for _ in range(count):
        lease = provider.acquire(key, ttl=30, wait=0)
        assert lease is not None
        provider.release(lease)
    return (time.perf_counter() - started) / count


def where(entry: tuple[str, int, str]) -> str:
    filename, _, function = entry
    if "/locks/" in filename:
        return "ours"
    if any(driver in filename for driver in _DRIVERS):
        return "driver"
    if filename == "~" and any(f"'{name}'" in function for name in _WAITS):
        return "waiting on the socket"  # "<method 'recv_into' of '_socket.socket' objects>"
    return "the rest"


def profile(provider: LockProvider, count: int, top: int) -> str:
    wall = cycles(provider, count)
    profiler = cProfile.Profile()
    profiler.enable()
    profiled = cycles(provider, count)
    profiler.disable()
    stats = pstats.Stats(profiler)
    shares: dict[str, float] = {}
    ours: list[tuple[float, str]] = []
    for entry, (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        part = where(entry)
        shares[part] = shares.get(part, 0.0) + tottime
        if part == "ours":
            filename, line, function = entry
            name = f"{filename.split('/locks/', 1)[1]}:{line} {function}"
            ours.append((tottime, name))
    rest = sorted(
        (
            (t, f"{e[0]}:{e[2]}")
            for e, (_, _, t, _, _) in stats.stats.items()  # type: ignore[attr-defined]
            if where(e) == "the rest"
        ),
        reverse=True,
    )[:5]
    total = sum(shares.values()) or 1.0
    lines = [
        f"{wall * 1e6:8.1f} µs a cycle ({1 / wall:,.0f} cycles/s) without the profiler; "
        f"{profiled * 1e6:.1f} µs with it",
        *[f"  {share / total:6.1%}  {part}" for part, share in
          sorted(shares.items(), key=lambda item: -item[1])],
        "  the rest, its largest:",
        *[f"    {seconds / count * 1e6:7.2f} µs  {name}" for seconds, name in rest],
        "  our code's own time, per cycle (profiled):",
        *[f"    {seconds / count * 1e6:7.2f} µs  {name}" for seconds, name in
          sorted(ours, reverse=True)[:top]],
    ]  # fmt: skip
    return "\n".join(lines)


class _NullCursor:
    """Every statement answered at once, as granted: one row, one row counted."""

    description = ("row",)
    rowcount = 1
    lastrowid = 1

    def execute(self, sql: str, args: Any) -> None:
        pass

    def fetchone(self) -> tuple[int, int]:
        return (1, 1)

    def fetchall(self) -> list[Any]:
        return []

    def close(self) -> None:
        pass


class _NullConnection:
    """A DBAPI connection that does no I/O (PyMySQL's packet calls included)."""

    def cursor(self) -> _NullCursor:
        return _NullCursor()

    def escape(self, value: object) -> str:
        return repr(value)

    server_status = 2  # autocommit

    def _execute_command(self, command: int, sql: str) -> None:
        pass

    def _read_packet(self) -> Any:
        """An OK packet: one row changed, LAST_INSERT_ID 1, autocommit, no warnings."""
        from pymysql.protocol import MysqlPacket  # type: ignore[import-untyped]  # noqa: PLC0415

        return MysqlPacket(b"\x00\x01\x01\x02\x00\x00\x00", "utf8mb4")

    def fileno(self) -> int:
        return -1


def our_own_time(provider: LockProvider, count: int) -> float:
    """Seconds per cycle with the driver and the server taken out (`--null-driver`)."""
    pool: Any = provider._connections  # type: ignore[attr-defined]
    take, give = pool.take, pool.give
    null = _NullConnection()
    pool.take, pool.give = (lambda: null), (lambda connection: None)
    try:
        return cycles(provider, count)
    finally:
        pool.take, pool.give = take, give


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("backends", nargs="*", choices=[*BACKENDS, []], metavar="BACKEND")
    parser.add_argument("--cycles", type=int, default=3000)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--null-driver", action="store_true",
                        help="the database backends: our code's own time, no I/O")  # fmt: skip
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="locks-profile-") as folder:
        for backend in args.backends or BACKENDS:
            with provider_for(backend, Path(folder)) as provider:
                print(f"## {backend}\n{profile(provider, args.cycles, args.top)}", flush=True)
                if args.null_driver and backend in ("mariadb", "postgresql"):
                    own = our_own_time(provider, args.cycles * 5)
                    print(f"{own * 1e6:8.1f} µs a cycle of our own code (a null driver: "
                          "every statement answered at once, no I/O)", flush=True)  # fmt: skip
                print(flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
