"""What only the asyncio database face can get wrong: the driver a URL gets, statements
cut off by a cancellation or a paused server, the loop kept free, the read-only check.
(The contract suite and the model run over it too: kinds aio-mariadb, aio-postgresql,
aio-sqlite.)"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from locks import aio
from locks.backends import DatabaseProvider as ThreadedDatabase
from locks.errors import BackendUnavailable, ConfigError, LockNotOwned
from locks.provider import Lease
from tests.servers import MariaDBServer
from tests.test_aio import LagMeter, Lags, lag_within, run

SERVERS = {"mariadb": "mariadb_server", "postgresql": "postgresql_server", "sqlite": "sqlite_file"}


@pytest.fixture(params=list(SERVERS))
def database(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(SERVERS[request.param])


@pytest.fixture(params=["mariadb", "postgresql"])
def networked(request: pytest.FixtureRequest) -> Any:
    """A database server process: paused, killed, restarted here."""
    return request.getfixturevalue(SERVERS[request.param])


def free(url: str, key: str) -> bool:
    """Whether `key` is free on the server, asked by a threaded provider."""
    provider = ThreadedDatabase(url)
    try:
        lease = provider.acquire(key, ttl=5, wait=0)
        if lease is not None:
            provider.release(lease)
        return lease is not None
    finally:
        provider.close()


async def warmed(url: str, key: str, **options: Any) -> aio.DatabaseProvider:
    """A provider whose table is there and whose pool holds a connection: what a server
    paused next meets is a statement, not a connection attempt."""
    provider = aio.DatabaseProvider(url, **options)
    lease = await provider.acquire(key + ":warm", ttl=5)
    assert lease is not None
    await provider.release(lease)
    return provider


# -- the driver each URL gets -----------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "driver"),
    [
        ("mysql://u:p@127.0.0.1:1/locks", "asyncmy"),
        ("mysql+pymysql://u:p@127.0.0.1:1/locks", "asyncmy"),  # the threaded face's URL
        ("mariadb://u:p@127.0.0.1:1/locks", "asyncmy"),
        ("sqlite+aiosqlite:////tmp/locks-aio-url-test.db", "aiosqlite"),  # named: kept
        ("postgres://u:p@127.0.0.1:1/locks", "psycopg"),
        ("postgresql+psycopg2://u:p@127.0.0.1:1/locks", "psycopg"),
        ("sqlite:////tmp/locks-aio-url-test.db", "aiosqlite"),
    ],
)
def test_one_url_serves_both_faces_with_the_asyncio_driver_of_its_family(
    url: str, driver: str
) -> None:
    async def main() -> str:
        provider = aio.DatabaseProvider(url)  # no I/O yet
        try:
            return str(provider.engine.dialect.driver)
        finally:
            await provider.close()

    assert run(main) == driver


@pytest.mark.parametrize(
    ("arguments", "error", "named"),
    [
        ({"url": "sqlite:///:memory:"}, ValueError, "in-memory"),
        ({"url": "redis://127.0.0.1/0"}, ValueError, "unsupported database"),
        ({"url": "mysql://u:secret@127.0.0.1:1/locks", "table": ""}, ValueError, "table"),
        ({"url": "mysql://u:secret@127.0.0.1:1/locks", "pool_size": 0}, ValueError, "pool_size"),
        ({"engine": sa.create_engine("sqlite:///x.db")}, TypeError, "AsyncEngine"),
    ],
)
def test_bad_arguments_are_refused_before_any_io(
    arguments: dict[str, Any], error: type[Exception], named: str
) -> None:
    with pytest.raises(error, match=named) as raised:
        aio.DatabaseProvider(**arguments)
    assert "secret" not in str(raised.value)


def test_the_same_toml_gives_an_asyncio_database_backend(mariadb_server: MariaDBServer) -> None:
    config = {
        "backends": {"db": {"type": "database", "url": mariadb_server.url}},
        "scenarios": {"default": {"chain": ["db"]}},
    }

    async def main() -> str:
        registry = aio.from_config(config)
        try:
            async with registry.lock("default", "aio-db-config", ttl=5) as lease:
                return lease.backend
        finally:
            await registry.close()

    assert run(main) == "db"


# -- tasks, cancellation ------------------------------------------------------------------


def test_tasks_exclude_each_other_and_a_cancelled_waiter_leaves_nothing(
    database: Any, key: str
) -> None:
    async def main() -> None:
        provider = aio.DatabaseProvider(database.url)
        try:
            holder = await provider.acquire(key, ttl=10)
            assert holder is not None

            async def other(wait: float) -> Lease | None:
                return await provider.acquire(key, ttl=10, wait=wait)

            assert await asyncio.create_task(other(0)) is None
            waiter = asyncio.create_task(other(5))
            await asyncio.sleep(0.2)  # waiting: polling the row
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            await provider.release(holder)
            taken = await asyncio.create_task(other(0))
            assert taken is not None, "the cancelled waiter left a grant behind"
            await provider.release(taken)
        finally:
            await provider.close()

    run(main)


def test_an_acquire_cancelled_while_the_server_holds_its_statement_is_undone(
    networked: Any, key: str
) -> None:
    """The statement is on the paused server, its reply not back, when the task is
    cancelled: once the server answers, the grant it made is released, never left for
    its ttl (a release by token sent beside it would run first and find nothing)."""
    url: str = networked.url
    outcome: list[str] = []

    async def main() -> None:
        provider = await warmed(url, key, socket_timeout=3.0)
        try:
            networked.pause()
            task = asyncio.create_task(provider.acquire(key, ttl=60))
            await asyncio.sleep(0.2)  # sent, not answered
            assert not task.done(), f"answered while the server was paused: {task}"
            task.cancel()
            threading.Timer(0.3, networked.resume).start()
            try:
                await task
                outcome.append("granted")
            except asyncio.CancelledError:
                outcome.append("cancelled")
        finally:
            await provider.close()  # waits for what runs in the background

    try:
        run(main)
    finally:
        networked.ensure_running()
    assert outcome == ["cancelled"]
    assert free(url, key), "the cancelled acquire's grant was left on the server"


@contextlib.contextmanager
def statements_held_on(server: Any, key: str) -> Iterator[None]:
    """An open transaction that makes an acquire's first statement on `key` wait on the
    server, while a release by token on `key` runs at once (and finds nothing): on
    MariaDB a gap lock where `key`'s row would go (gap locks never conflict with one
    another, an insert waits for them); on PostgreSQL `key`'s row inserted and not yet
    committed (an insert of the same key waits to see it commit; an update does not
    see it). Rolled back when the block ends."""
    mariadb = isinstance(server, MariaDBServer)
    engine = sa.create_engine(server.root_url if mariadb else server.url)
    try:
        with engine.connect() as conn:
            if mariadb:
                conn.execute(sa.text("SELECT name FROM locks WHERE name = :k FOR UPDATE"),
                             {"k": key})  # fmt: skip
            else:
                conn.execute(
                    sa.text("INSERT INTO locks (name, owner, token, depth, fence, expires_at, "
                            "acquired_at) VALUES (:k, 'x', 'x', 1, 1, 0, 0)"), {"k": key},
                )  # fmt: skip
            yield
            conn.rollback()
    finally:
        engine.dispose()


def test_a_cancelled_acquires_grant_is_released_after_it_is_made_never_before(
    networked: Any, key: str
) -> None:
    """The acquire's statement waits on the server when its task is cancelled; the
    release that undoes it, sent on another connection at once, would find nothing and
    leave the grant made a moment later for its whole ttl. It waits for the statement's
    outcome instead."""
    url: str = networked.url

    async def main() -> None:
        provider = aio.DatabaseProvider(url, socket_timeout=5.0)
        try:
            # two connections in the pool: the release is not held up making one
            warm = [await provider.acquire(f"{key}:warm:{i}", ttl=5) for i in range(2)]
            await asyncio.gather(*(asyncio.create_task(provider.release(lease))
                                   for lease in warm if lease is not None))  # fmt: skip
            with statements_held_on(networked, key):
                task = asyncio.create_task(provider.acquire(key, ttl=60))
                await asyncio.sleep(0.3)  # its insert waits on the server
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                await asyncio.sleep(0.3)  # a release sent at once would have run by now
        finally:
            await provider.close()  # waits for what runs in the background

    run(main)
    assert free(url, key), "the cancelled acquire's grant was left on the server"


def test_a_release_runs_to_its_end_when_its_task_is_cancelled(networked: Any, key: str) -> None:
    url: str = networked.url

    async def main() -> None:
        provider = await warmed(url, key, socket_timeout=3.0)
        try:
            lease = await provider.acquire(key, ttl=60)
            assert lease is not None
            networked.pause()
            task = asyncio.create_task(provider.release(lease))
            await asyncio.sleep(0.1)
            task.cancel()
            threading.Timer(0.2, networked.resume).start()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            await provider.close()

    try:
        run(main)
    finally:
        networked.ensure_running()
    assert free(url, key), "a cancelled release was abandoned halfway"


def test_a_release_reaches_a_waiter_of_another_provider_by_notify_also_after_a_restart(
    postgresql_server: Any, key: str
) -> None:
    """The waiter's poll interval is a minute and the holder's lease 60 s, and the two
    providers share no line of waiters: only PostgreSQL's notice can wake it in time.
    Then the server restarts under them, and the listening connection is made anew."""

    async def handed_over(holder: aio.DatabaseProvider, waiter: aio.DatabaseProvider,
                          name: str) -> float:  # fmt: skip
        lease = await holder.acquire(name, ttl=60)
        assert lease is not None

        async def wait() -> float:
            got = await waiter.acquire(name, ttl=30, wait=20)
            assert got is not None, "the waiter never got the lock"
            return time.monotonic()

        task = asyncio.create_task(wait())
        await asyncio.sleep(0.5)  # asleep on the key by now
        released_at = time.monotonic()
        await holder.release(lease)
        return await task - released_at

    async def main() -> list[float]:
        holder = aio.DatabaseProvider(postgresql_server.url)
        waiter = aio.DatabaseProvider(postgresql_server.url, poll_interval=60)
        try:
            took = [await handed_over(holder, waiter, f"{key}:0")]
            await asyncio.to_thread(postgresql_server.restart)
            for provider in (holder, waiter):  # their pooled connections broke
                for _ in range(50):
                    with contextlib.suppress(BackendUnavailable):
                        await provider.ping()
                        break
                    await asyncio.sleep(0.1)
            took.append(await handed_over(holder, waiter, f"{key}:1"))
            return took
        finally:
            await holder.close()
            await waiter.close()

    before, after = run(main)
    assert before < 0.5, f"woken by its poll after {before:.2f} s, not by the release"
    assert after < 0.5, f"no notice heard after the restart ({after:.2f} s)"


# -- faults --------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["killed", "paused"])
def test_a_server_down_is_backend_unavailable_naming_it_and_then_it_recovers(
    fault: str, networked: Any, key: str
) -> None:
    url: str = networked.url

    async def main() -> None:
        provider = await warmed(url, key, socket_timeout=0.5, connect_timeout=0.5)
        try:
            (networked.kill if fault == "killed" else networked.pause)()
            started = time.monotonic()
            with pytest.raises(BackendUnavailable) as raised:
                await provider.acquire(key, ttl=10)
            assert time.monotonic() - started < 3.0
            assert raised.value.backend == "database"
            assert networked.address in str(raised.value)
            assert "pw@" not in str(raised.value)
            networked.ensure_running()
            again = None
            for _ in range(50):  # the first tries may meet connections the fault broke
                try:
                    again = await provider.acquire(key, ttl=10, wait=1)
                    break
                except BackendUnavailable:
                    await asyncio.sleep(0.1)
            assert again is not None
            await provider.release(again)
        finally:
            await provider.close()

    try:
        run(main)
    finally:
        networked.ensure_running()


def test_a_read_only_mariadb_grants_nothing_whatever_the_users_privileges(
    mariadb_server: MariaDBServer, key: str
) -> None:
    """The pool's check reads @@global.read_only on each new connection: refused as an
    outage naming read_only (the test user could write past read_only)."""

    async def main() -> None:
        provider = aio.DatabaseProvider(mariadb_server.url)
        try:
            with pytest.raises(BackendUnavailable, match="read-only"):
                await provider.acquire(key, ttl=10)
        finally:
            await provider.close()

    mariadb_server.sql("SET GLOBAL read_only = 1")
    try:
        run(main)
    finally:
        mariadb_server.sql("SET GLOBAL read_only = 0")
    assert free(mariadb_server.url, key)


def test_without_greenlet_the_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util  # noqa: PLC0415

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "greenlet" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"fallback-locks\[aio-mysql\]"):
        aio.DatabaseProvider("sqlite:////tmp/locks-aio-greenlet-test.db")


# -- the loop is never blocked -------------------------------------------------------------


def test_tasks_locking_and_a_paused_server_never_block_the_loop(
    mariadb_server: MariaDBServer, key: str
) -> None:
    """200 tasks over 20 keys, then the server paused under them for 1 s: the loop's p99
    lag stays under 20 ms and no wake-up is 250 ms late (a blocking call would stall it
    for a socket timeout). The p99 is not Redis's 5 ms: asyncmy reads each reply in
    Python on the loop, several packets a statement, and a 2-core machine running the
    suite put it at 5-6 ms with nothing of ours blocking."""

    async def contend(provider: aio.DatabaseProvider, seconds: float) -> int:
        grants = 0

        async def worker(index: int, until: float) -> None:
            nonlocal grants
            while time.monotonic() < until:
                try:
                    async with provider.lock(f"{key}:{index % 20}", ttl=5, wait=3):
                        grants += 1
                except (BackendUnavailable, LockNotOwned, TimeoutError):
                    await asyncio.sleep(0.05)
                except Exception as error:  # LockTimeout
                    assert type(error).__name__ == "LockTimeout"

        until = time.monotonic() + seconds
        await asyncio.gather(*(worker(i, until) for i in range(200)))
        return grants

    async def main() -> tuple[int, Lags]:
        provider = aio.DatabaseProvider(mariadb_server.url, socket_timeout=0.5)
        try:
            meter = LagMeter()
            meter.start()
            grants = await contend(provider, 2.0)
            busy = await meter.stop()
            meter = LagMeter()
            meter.start()
            mariadb_server.pause()
            threading.Timer(1.0, mariadb_server.resume).start()
            await contend(provider, 2.0)
            return grants, {"busy": busy, "paused": await meter.stop()}
        finally:
            await provider.close()

    lag_within(0.020, lambda: run(main), fewest=200, after=mariadb_server.ensure_running)
