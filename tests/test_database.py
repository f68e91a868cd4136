"""What only the database backend promises: one statement per acquire and release,
rows kept for their fences and purged once idle, fences across re-created rows,
verbatim names, clear errors when the server dies or turns read-only, and the minimal
grant."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pymysql  # type: ignore[import-untyped]  # no stubs in the dev extra
import pytest
import sqlalchemy as sa

from locks import BackendUnavailable, Lease, LockNotOwned
from locks.backends import DatabaseProvider, database
from tests.recovery import recovered
from tests.servers import MariaDBServer, SQLiteFile


@pytest.fixture
def db(mariadb_server: MariaDBServer) -> Iterator[DatabaseProvider]:
    provider = DatabaseProvider(mariadb_server.url)
    yield provider
    provider.close()


def status(server: MariaDBServer, *names: str) -> dict[str, int]:
    rows = server.sql(
        "SHOW GLOBAL STATUS WHERE Variable_name IN ({})".format(
            ", ".join(f"'{name}'" for name in names)
        )
    )
    return {line.split("\t")[0]: int(line.split("\t")[1]) for line in rows.splitlines()}


def test_acquire_and_release_are_one_statement_each_with_no_commit_or_rollback(
    db: DatabaseProvider, mariadb_server: MariaDBServer, key: str
) -> None:
    """A key new to the process is inserted, one whose row it has seen is taken by an
    update; a release updates the row, kept free for its fence."""
    db.release(db.acquire(key, ttl=30) or pytest.fail("not acquired"))  # table, pool warm
    counters = ("Com_insert", "Com_delete", "Com_update", "Com_commit", "Com_rollback", "Questions")
    for names, inserts in (([key] * 100, 0), ([f"{key}:{i}" for i in range(100)], 100)):
        before = status(mariadb_server, *counters)
        for name in names:
            lease = db.acquire(name, ttl=30)
            assert lease is not None
            db.release(lease)
        after = status(mariadb_server, *counters)
        delta = {name: after[name] - before[name] for name in counters}
        # every statement the server saw: 200 of ours, and the two the `mariadb` client
        # sends for the second SHOW STATUS (its version query and the SHOW itself)
        assert delta == {
            "Com_insert": inserts, "Com_delete": 0, "Com_update": 200 - inserts,
            "Com_commit": 0, "Com_rollback": 0, "Questions": 202,
        }  # fmt: skip


def test_hostile_and_unicode_names_are_stored_and_released_verbatim(
    db: DatabaseProvider, mariadb_server: MariaDBServer
) -> None:
    names = ["../x", "a/b", "'; DROP TABLE locks; --", "锁:订单", "a", "a ", "A", "%", "_"]
    leases = [db.acquire(name, ttl=30, wait=0) for name in names]
    assert all(lease is not None for lease in leases), "some names collided"
    stored = set(mariadb_server.sql("SELECT name FROM locks.locks").split("\n"))
    assert {"../x", "a/b", "'; DROP TABLE locks; --", "锁:订单", "A"} <= stored
    for lease in leases:
        assert lease is not None
        db.release(lease)
    assert mariadb_server.sql("SHOW TABLES FROM locks") == "locks"


def test_names_stay_verbatim_when_the_session_takes_backslashes_literally(
    mariadb_server: MariaDBServer,
) -> None:
    """Our statements escape strings as the session reads them: with NO_BACKSLASH_ESCAPES
    a backslash is an ordinary character, and escaping it as one would store another
    name (and release nothing)."""
    mode = "SET SESSION sql_mode = CONCAT(@@sql_mode, ',NO_BACKSLASH_ESCAPES')"
    provider = DatabaseProvider(mariadb_server.url, connect_args={"init_command": mode})
    names = ["a\\b", "a\\", "x'y", "\\'", "\\\\'; --"]
    try:
        for _ in range(2):  # the insert of a new row, then the update of a kept one
            leases = [provider.acquire(name, ttl=30, wait=0) for name in names]
            assert all(lease is not None for lease in leases), "some names collided"
            for lease in leases:
                assert lease is not None
                provider.release(lease)
    finally:
        provider.close()
    rows = pymysql.connect(**mariadb_server.pymysql_args())
    with rows.cursor() as cursor:
        cursor.execute("SELECT name, expires_at FROM locks WHERE name IN %s", (names,))
        assert dict(cursor.fetchall()) == dict.fromkeys(names, 0)  # verbatim, and free
    rows.close()


def test_a_statement_without_rows_answered_with_rows_closes_its_connection(
    db: DatabaseProvider, key: str
) -> None:
    """The lean path reads an OK packet and nothing else: a reply it cannot read leaves
    the connection's protocol state unknown, so it is closed, as a lost connection."""
    db.release(db.acquire(key, ttl=30) or pytest.fail("not acquired"))
    statement = database._PyMySQLStatement("SELECT 1, 2", (), named=False)
    connection = db._connections.take()
    with pytest.raises(pymysql.OperationalError) as raised:
        statement.run(connection, {})
    assert raised.value.args[0] == 2013
    assert not connection.open
    db._connections.discard(connection)
    db.release(db.acquire(key, ttl=30) or pytest.fail("not acquired"))  # a new connection


def test_rows_of_released_and_dead_holders_are_purged_once_idle_and_fences_keep_rising(
    mariadb_server: MariaDBServer, key: str
) -> None:
    db = DatabaseProvider(mariadb_server.url, purge_after=0.2)

    def rows(live: bool = False) -> str:
        where = f"name LIKE '{key}%'" + (" AND expires_at > 0" if live else "")
        return mariadb_server.sql(f"SELECT COUNT(*) FROM locks.locks WHERE {where}")

    released = [f"{key}:released:{i}" for i in range(10)]
    abandoned = [f"{key}:abandoned:{i}" for i in range(10)]
    fences = {}
    for name in released + abandoned:
        lease = db.acquire(name, ttl=0.1)
        assert lease is not None
        fences[name] = lease.fence
        if name in released:
            db.release(lease)
    assert (rows(), rows(live=True)) == ("20", "10")  # a released row stays, free
    time.sleep(0.4)  # the abandoned ones expire, then every row outlives the grace
    assert db.purge() >= 20  # (and the rows other tests left in the table)
    assert rows() == "0"
    for name in released + abandoned:  # re-created rows start from the clock: higher
        lease = db.acquire(name, ttl=30)
        assert lease is not None and lease.fence > fences[name]
        db.release(lease)
    db.close()


def test_the_purge_every_thousand_releases_opens_no_connection(
    mariadb_server: MariaDBServer, key: str
) -> None:
    """It ran on a new connection of the engine's: a handshake (~30 ms with PyMySQL's
    TLS context) paid by every thousandth release. Now on a pooled one."""
    db = DatabaseProvider(mariadb_server.url, pool_size=1)

    def connections() -> int:
        return int(mariadb_server.sql("SHOW GLOBAL STATUS LIKE 'Connections'").split()[-1])

    try:
        lease = db.acquire(key, ttl=30)  # the pool's connection made, the table ready
        assert lease is not None
        db.release(lease)
        before = connections()
        for _ in range(1001):  # a purge among them
            lease = db.acquire(key, ttl=30)
            assert lease is not None
            db.release(lease)
        assert connections() - before == 1  # the `sql` call's own
    finally:
        db.close()


def test_an_expired_row_is_taken_over_with_a_higher_fence_and_a_level_counts_down(
    db: DatabaseProvider, key: str
) -> None:
    outer = db.acquire(key, ttl=0.2)
    assert outer is not None
    inner = db.acquire(key, ttl=0.2)
    assert inner is not None and (inner.depth, inner.fence) == (2, outer.fence)
    db.release(outer)  # one level off, whichever lease names it: the row stays held
    with ThreadPoolExecutor(max_workers=1) as other_owner:
        assert other_owner.submit(db.acquire, key, ttl=30, wait=0).result() is None
        time.sleep(0.3)
        successor = other_owner.submit(db.acquire, key, ttl=30, wait=0).result()
    assert successor is not None and successor.fence > outer.fence
    with pytest.raises(LockNotOwned):  # the stale lease touches nothing
        db.release(inner)
    assert db.is_held(successor)
    db.release(successor)


def test_a_killed_mariadb_is_reported_then_the_provider_recovers(
    db: DatabaseProvider, mariadb_server: MariaDBServer, key: str
) -> None:
    lease = db.acquire(key, ttl=30)
    assert lease is not None
    _hold_connections(db, key, 4)  # four idle connections, all to die with the server
    mariadb_server.kill()
    started = time.monotonic()
    with pytest.raises(BackendUnavailable) as caught:
        db.acquire(key + ":2", ttl=30)
    assert time.monotonic() - started < 2.0
    assert caught.value.ambiguous and caught.value.key == key + ":2"
    assert mariadb_server.address in str(caught.value)
    assert mariadb_server.password not in str(caught.value)
    mariadb_server.start()
    # one dead connection found, the pool drops the other idle ones: one failure at most
    again = recovered(db, key + ":3", tries=2)
    db.release(again)
    db.release(lease)  # the row survived the restart: InnoDB is durable


def _hold_connections(db: DatabaseProvider, key: str, count: int) -> None:
    """Leave `count` connections idle in the pool: as many threads in one statement."""
    together = threading.Barrier(count)

    def take(n: int) -> None:
        together.wait()
        lease = db.acquire(f"{key}:held:{n}", ttl=30)
        assert lease is not None
        together.wait()  # all of them hold a lease, each took its own connection
        db.release(lease)

    with ThreadPoolExecutor(max_workers=count) as pool:
        list(pool.map(take, range(count)))


def test_an_engine_passed_in_gets_each_statement_committed(
    mariadb_server: MariaDBServer, key: str
) -> None:
    engine = sa.create_engine(mariadb_server.url)  # transactional: no autocommit asked for
    ours, other = DatabaseProvider(engine=engine), DatabaseProvider(mariadb_server.url)
    lease = ours.acquire(key, ttl=30)
    assert lease is not None
    with ThreadPoolExecutor(max_workers=1) as other_owner:
        try_other = lambda: other.acquire(key, ttl=30, wait=0)  # noqa: E731
        assert other_owner.submit(try_other).result() is None  # the row is committed
        ours.release(lease)
        successor = other_owner.submit(try_other).result()  # and so is its deletion
        assert successor is not None
        other_owner.submit(other.release, successor).result()
    ours.close()
    other.close()
    engine.dispose()


def test_a_pool_with_every_connection_busy_reports_unavailable_after_pool_timeout(
    mariadb_server: MariaDBServer, key: str
) -> None:
    db = DatabaseProvider(mariadb_server.url, pool_size=1, pool_timeout=0.3)  # 2 at most
    db.release(db.acquire(key + ":warm", ttl=30) or pytest.fail("not acquired"))
    blocker = pymysql.connect(**mariadb_server.pymysql_args(), autocommit=False)
    with blocker.cursor() as cursor:  # an uncommitted row: inserts of its name wait on it
        cursor.execute(
            "INSERT INTO locks (name, owner, token, depth, fence, expires_at, acquired_at)"
            " VALUES (%s, 'blocker', 'blocker', 1, 1, 0, 0)",
            (key,),
        )
    with ThreadPoolExecutor(max_workers=2) as stuck:
        waiting = [stuck.submit(db.acquire, key, ttl=30, wait=0) for _ in range(2)]
        time.sleep(0.3)  # both connections are now in an INSERT that waits
        started = time.monotonic()
        with pytest.raises(BackendUnavailable, match="busy") as caught:
            db.acquire(key + ":other", ttl=30)
        assert 0.25 < time.monotonic() - started < 2.0
        assert mariadb_server.address in str(caught.value)
        assert not caught.value.ambiguous  # nothing was sent
        blocker.rollback()  # the row never was: one waiter inserts, the other finds it
        outcomes = [future.result() for future in waiting]
    granted = [lease for lease in outcomes if lease is not None]
    assert len(granted) == 1
    db.release(granted[0])
    blocker.close()
    db.close()


@pytest.mark.parametrize("given_engine", [False, True], ids=["url", "engine"])
def test_a_forked_child_opens_its_own_connections(
    mariadb_server: MariaDBServer, key: str, given_engine: bool
) -> None:
    """The child must not speak on its parent's sockets: both run at once here, and a
    shared connection would mix up their replies. With an engine passed in, the parent
    also uses that engine's own pool meanwhile, as an application would."""
    engine = sa.create_engine(mariadb_server.url) if given_engine else None
    db = DatabaseProvider(mariadb_server.url, engine=engine)
    db.release(db.acquire(key, ttl=30) or pytest.fail("not acquired"))  # connections pooled
    if engine is not None:
        with engine.connect() as connection:  # the application's own, pooled by the engine
            connection.execute(sa.text("SELECT 1"))
    held = threading.Thread(target=db._wakeups._lock.acquire)  # held at the fork, for good
    held.start()
    held.join()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for _ in range(200):
                lease = db.acquire(key + ":child", ttl=30) or pytest.fail("not acquired")
                with ThreadPoolExecutor(max_workers=1) as other_thread:  # waits a moment
                    assert other_thread.submit(db.acquire, lease.key, wait=0.02).result() is None
                db.release(lease)
            code = 0
        finally:
            os._exit(code)
    for _ in range(200):
        if engine is not None:
            with engine.connect() as connection:
                connection.execute(sa.text("SELECT 1"))
        db.release(db.acquire(key + ":parent", ttl=30) or pytest.fail("not acquired"))
    assert _exit_code(pid, within=30.0) == 0
    db.close()
    if engine is not None:
        engine.dispose()


def test_a_lease_is_released_even_after_its_provider_closed(
    mariadb_server: MariaDBServer, key: str
) -> None:
    """A service shutting down closes its providers while requests still hold locks: the
    close releases their rows (or they would stay until they expire) and tells each
    holder its lease is over; the holder's own release then finds it ended."""
    db = DatabaseProvider(mariadb_server.url)
    lost: list[Lease] = []
    lease = db.acquire(key, ttl=30, on_lost=lost.append)
    assert lease is not None
    db.close()
    live = f"SELECT COUNT(*) FROM locks.locks WHERE name = '{key}' AND expires_at > 0"
    assert mariadb_server.sql(live) == "0"
    assert lost == [lease]
    with pytest.raises(LockNotOwned):
        db.release(lease)


def test_a_purge_neither_waits_for_nor_locks_rows_it_does_not_delete(
    db: DatabaseProvider, mariadb_server: MariaDBServer, key: str
) -> None:
    """The purge scans the whole table (no index on expiry). Scanning under REPEATABLE
    READ it would lock every row it reads and wait for any row another transaction
    holds: a held lock's row being renewed, say, for up to innodb_lock_wait_timeout."""
    live = db.acquire(key + ":live", ttl=30)
    assert live is not None
    busy = pymysql.connect(**mariadb_server.pymysql_args(), autocommit=False)
    with busy.cursor() as cursor:  # an open transaction holds the live row
        cursor.execute("UPDATE locks SET depth = depth WHERE name = %s", (live.key,))
    purging = ThreadPoolExecutor(max_workers=1)
    purged = purging.submit(db.purge)
    try:
        assert purged.result(timeout=5.0) >= 0
    finally:
        busy.rollback()
        busy.close()
        purging.shutdown()
    db.release(live)


def _exit_code(pid: int, within: float) -> int:
    """The child's exit code; a child still running after `within` seconds is hung:
    it is killed and the test fails."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.WEXITSTATUS(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked child hung for {within:g} s")


def test_threads_queueing_for_a_busy_pool_are_served_in_turn(
    mariadb_server: MariaDBServer, key: str
) -> None:
    """Sixteen threads share two connections for three seconds: none may time out as
    'unavailable', and none may be starved by threads that give a connection back and
    take it again at once."""
    db = DatabaseProvider(mariadb_server.url, pool_size=1, pool_timeout=2.0)
    cycles = [0] * 16
    failures: list[BaseException] = []
    stop = time.monotonic() + 3.0

    def cycle(n: int) -> None:
        while time.monotonic() < stop:
            try:
                lease = db.acquire(f"{key}:{n}", ttl=30)
                assert lease is not None
                db.release(lease)
            except BackendUnavailable as error:
                failures.append(error)
                return
            cycles[n] += 1

    threads = [threading.Thread(target=cycle, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    db.close()
    assert failures == []
    assert min(cycles) > max(cycles) / 4, cycles  # starved threads got one or none


def test_a_release_wakes_a_waiting_thread_of_the_same_process_at_once(
    db: DatabaseProvider, key: str
) -> None:
    """Waiters that have polled for a while sleep 100-200 ms between tries; a release by a
    thread of the same process must not leave them to sleep it out. Three waiters take
    the lock in turn, six hand-offs in all."""
    holder = db.acquire(key, ttl=30)
    assert holder is not None
    handoffs: list[float] = []
    released_at: list[float] = []
    lock = threading.Lock()

    def wait_then_hold_twice() -> None:
        for _ in range(2):
            lease = db.acquire(key, ttl=30, wait=20)
            assert lease is not None
            with lock:
                handoffs.append(time.monotonic() - released_at[-1])
            time.sleep(0.6)  # the others' backoff grows to its 200 ms ceiling
            with lock:
                released_at.append(time.monotonic())
            db.release(lease)

    waiters = [threading.Thread(target=wait_then_hold_twice) for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    time.sleep(1.5)
    released_at.append(time.monotonic())
    db.release(holder)
    for waiter in waiters:
        waiter.join(30)
    assert len(handoffs) == 6
    # polling alone would make each of these 50-200 ms: all six under 80 ms is wake-ups
    assert max(handoffs) < 0.08, handoffs


def test_a_read_only_server_gives_a_clear_error_and_writes_nothing(
    db: DatabaseProvider, mariadb_server: MariaDBServer, key: str
) -> None:
    held = db.acquire(key, ttl=30)
    assert held is not None
    before = mariadb_server.sql("SELECT * FROM locks.locks ORDER BY name")
    mariadb_server.sql("SET GLOBAL read_only = 1")
    try:
        with pytest.raises(BackendUnavailable, match=r"read-only|read_only|READ-ONLY"):
            db.acquire(key + ":new", ttl=30)
        with pytest.raises(BackendUnavailable):
            db.release(held)
        assert mariadb_server.sql("SELECT * FROM locks.locks ORDER BY name") == before
    finally:
        mariadb_server.sql("SET GLOBAL read_only = 0")
    db.release(held)


def test_the_minimal_grant_is_enough(mariadb_server: MariaDBServer, key: str) -> None:
    DatabaseProvider(mariadb_server.url).create_table()  # created once, by whoever may
    mariadb_server.sql(
        "CREATE USER IF NOT EXISTS 'dml'@'127.0.0.1' IDENTIFIED BY 'dml-pw';"
        "GRANT SELECT, INSERT, UPDATE, DELETE ON locks.locks TO 'dml'@'127.0.0.1';"
    )
    url = f"mysql+pymysql://dml:dml-pw@{mariadb_server.address}/locks?charset=utf8mb4"
    db = DatabaseProvider(url, watchdog_ttl=0.6)  # create_table: it finds the table there
    lease = db.acquire(key)
    assert lease is not None
    time.sleep(0.5)  # renewed by the watchdog with the same grant
    assert db.is_held(lease)
    db.release(lease)
    assert db.purge() >= 0
    db.close()


def test_a_sqlite_file_is_created_and_shared(sqlite_file: SQLiteFile, key: str) -> None:
    first, second = DatabaseProvider(sqlite_file.url), DatabaseProvider(sqlite_file.url)
    lease = first.acquire(key, ttl=30)
    assert lease is not None
    with ThreadPoolExecutor(max_workers=1) as other_owner:
        assert other_owner.submit(second.acquire, key, ttl=30, wait=0).result() is None
        first.release(lease)
        other = other_owner.submit(second.acquire, key, ttl=30, wait=0).result()
        assert other is not None and other.fence > lease.fence
        second.release(other)
    first.close()
    second.close()


def test_bad_settings_are_refused_before_connecting(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="table"):
        DatabaseProvider("sqlite:///x.db", table="")
    with pytest.raises(ValueError, match="purge_after"):
        DatabaseProvider("sqlite:///x.db", purge_after=0)
    with pytest.raises(ValueError, match="pool_size"):
        DatabaseProvider("sqlite:///x.db", pool_size=0)
    with pytest.raises(TypeError, match="engine"):
        DatabaseProvider(engine=object())  # type: ignore[arg-type]
    for memory in ("sqlite://", "sqlite:///:memory:", "sqlite:///file:m?mode=memory&uri=true"):
        with pytest.raises(ValueError, match=r"^url: an in-memory SQLite"):
            DatabaseProvider(memory)
    with pytest.raises(ValueError, match=r"^engine: an in-memory SQLite"):
        DatabaseProvider(engine=sa.create_engine("sqlite://"))
    provider = DatabaseProvider(engine=sa.create_engine(f"sqlite:///{tmp_path}/x.db"))
    assert provider.address == f"sqlite:{tmp_path}/x.db"
    assert not (tmp_path / "x.db").exists()  # nothing was opened


def test_many_providers_creating_the_table_at_once_all_succeed(
    mariadb_server: MariaDBServer, key: str
) -> None:
    table = "race_" + key.rsplit(":", 1)[1][:12]
    providers = [DatabaseProvider(mariadb_server.url, table=table) for _ in range(8)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        leases = list(pool.map(lambda p: p.acquire(f"{key}:{id(p)}", ttl=30), providers))
    assert all(lease is not None for lease in leases)
    for provider, lease in zip(providers, leases, strict=True):
        assert lease is not None
        provider.release(lease)
        provider.close()


def test_sqlite_fences_rise_within_one_millisecond_of_its_clock(tmp_path: Path) -> None:
    """SQLite's clock counts milliseconds, and in WAL mode many grants fit in one."""
    url = f"sqlite:///{tmp_path / 'wal.db'}"
    setup = sa.create_engine(url)
    with setup.connect() as conn:
        conn.exec_driver_sql("PRAGMA journal_mode=WAL")
    setup.dispose()
    db = DatabaseProvider(url)
    fences = []
    started = time.monotonic()
    while time.monotonic() - started < 1.0:
        lease = db.acquire("k", ttl=30)
        assert lease is not None
        fences.append(lease.fence)
        db.release(lease)
    repeats = sum(1 for a, b in itertools.pairwise(fences) if a >= b)
    assert repeats == 0, f"{repeats} of {len(fences)} fences did not rise"
    assert len(fences) > 1000, "too slow to show anything: fewer than one grant per ms"
    db.close()


def test_a_hung_database_costs_one_socket_timeout_not_one_per_pooled_connection(
    mariadb_server: MariaDBServer, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No call runs past its `wait` by more than one socket timeout, whatever the server
    does: here it is frozen while five idle connections wait to be pinged."""
    monkeypatch.setattr(database, "_IDLE_PING", 0.2)
    db = DatabaseProvider(mariadb_server.url)
    bound = getattr(db, "socket_timeout", 5.0)
    db.release(db.acquire(key, ttl=30) or pytest.fail("not acquired"))
    _hold_connections(db, key, 5)
    time.sleep(0.3)  # every idle connection is now due for a ping
    mariadb_server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(BackendUnavailable):
            db.acquire(key, ttl=30, wait=0)
        elapsed = time.monotonic() - started
    finally:
        mariadb_server.resume()
    assert elapsed < bound + 0.5, f"{elapsed:.1f} s for one try with a {bound} s timeout"
    lease = db.acquire(key, ttl=30, wait=5)  # and it recovers
    assert lease is not None
    db.release(lease)
    db.close()


def test_one_thread_per_process_polls_a_held_key_however_many_wait(
    mariadb_server: MariaDBServer, key: str
) -> None:
    """MySQL has no notify: a waiting process polls every `poll_interval`. Eight threads
    waiting on one key must cost one poller's queries (the head of the process's line
    asks; the rest wait their turn), not eight, and get the lock in the order they came."""
    provider = DatabaseProvider(mariadb_server.url, poll_interval=0.05)
    other = DatabaseProvider(mariadb_server.url, name="other")
    try:
        holder = other.acquire(key, ttl=30)
        assert holder is not None

        def inserts() -> int:  # a first try: INSERT, then the upsert; a poll: the upsert
            return int(mariadb_server.sql("SHOW GLOBAL STATUS LIKE 'Com_insert'").split()[1])

        before = inserts()
        with ThreadPoolExecutor(max_workers=8) as pool:
            outcomes = list(pool.map(lambda _: provider.acquire(key, ttl=30, wait=1.0), range(8)))
        statements = inserts() - before
        assert outcomes == [None] * 8
        # one poller: 20 polls in the second (jittered), plus each thread's first try
        assert statements <= 1.0 / 0.05 * 1.5 + 8 * 2, f"{statements} in 1 s: all polled"

        order: list[int] = []
        started: list[threading.Thread] = []
        for index in range(4):  # they queue in this order, then the holder lets go
            thread = threading.Thread(target=_take_and_note, args=(provider, key, index, order))
            thread.start()
            started.append(thread)
            time.sleep(0.1)
        other.release(holder)
        for thread in started:
            thread.join(30)
        assert order == [0, 1, 2, 3]
    finally:
        provider.close()
        other.close()


def _take_and_note(provider: DatabaseProvider, key: str, index: int, order: list[int]) -> None:
    lease = provider.acquire(key, ttl=30, wait=20)
    assert lease is not None
    order.append(index)
    provider.release(lease)


# a statement of a session with the flag set sleeps in a BEFORE INSERT trigger: it has
# read the server's clock (on arrival) and inserts half a second later
_DELAY = {
    "mariadb": (
        "CREATE TRIGGER locks.{t}_delay BEFORE INSERT ON locks.{t} FOR EACH ROW "
        "SET @slept = IF(@delayed = 1, SLEEP(0.5), 0)",
        {"init_command": "SET @delayed = 1"},
    ),
    "postgresql": (
        "CREATE FUNCTION {t}_delay() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF current_setting('locks.delayed', true) = 'on' THEN PERFORM pg_sleep(0.5); "
        "END IF; RETURN NEW; END $$; "
        "CREATE TRIGGER {t}_delay BEFORE INSERT ON {t} FOR EACH ROW EXECUTE FUNCTION {t}_delay();",
        {"options": "-c locks.delayed=on"},
    ),
}


@pytest.mark.parametrize("kind", sorted(_DELAY))
def test_a_grant_delayed_on_the_server_still_gets_a_fence_above_one_made_meanwhile(
    kind: str, request: pytest.FixtureRequest, key: str
) -> None:
    """The server's clock is read when a statement arrives, not when it writes: a grant
    whose statement arrived first but wrote last (descheduled, or waiting on a row) must
    still count on from every grant made in between, even one that came and went."""
    server = request.getfixturevalue(f"{kind}_server")
    table = f"delay_{uuid.uuid4().hex[:12]}"
    prompt = DatabaseProvider(server.url, table=table)
    prompt.create_table()
    trigger, delayed_session = _DELAY[kind]
    server.sql(trigger.format(t=table))
    delayed = DatabaseProvider(server.url, table=table, connect_args=delayed_session)
    try:
        first = prompt.acquire(key, ttl=30) or pytest.fail("not acquired")
        prompt.release(first)
        with ThreadPoolExecutor(max_workers=1) as other:
            late = other.submit(delayed.acquire, key, ttl=30, wait=5)
            time.sleep(0.2)  # its statement is on the server, asleep before it writes
            between = prompt.acquire(key, ttl=30, wait=0) or pytest.fail("not acquired")
            prompt.release(between)
            lease = late.result(timeout=10) or pytest.fail("the delayed grant failed")
        assert first.fence < between.fence < lease.fence
        delayed.release(lease)
    finally:
        delayed.close()
        prompt.close()
