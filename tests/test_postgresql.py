"""PostgreSQL as users run it (issue 17): both drivers, a killed, frozen and restarted
server, refused credentials and privileges, a read-only session, and releases heard of
across processes through LISTEN/NOTIFY. The contract suite runs on it too (kind
`postgresql` in tests/backends.py)."""

from __future__ import annotations

import multiprocessing
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg2.extensions  # type: ignore[import-untyped]  # no stubs in the dev extra
import pytest

from locks import AccessDenied, BackendUnavailable
from locks.backends import DatabaseProvider
from tests.recovery import recovered
from tests.servers.postgresql import PostgreSQLServer
from tests.threads import in_thread

SPAWN = multiprocessing.get_context("spawn")
DRIVERS = ["psycopg", "psycopg2"]


def url_for(server: PostgreSQLServer, driver: str) -> str:
    return server.url if driver == "psycopg" else server.psycopg2_url


@pytest.fixture(params=DRIVERS)
def pg(request: pytest.FixtureRequest, postgresql_server: PostgreSQLServer) -> Iterator[str]:
    yield url_for(postgresql_server, request.param)


def test_both_drivers_exclude_each_other_and_share_fences(
    postgresql_server: PostgreSQLServer, key: str
) -> None:
    three, two = (DatabaseProvider(url_for(postgresql_server, d)) for d in DRIVERS)
    try:
        lease = three.acquire(key, ttl=30)
        assert lease is not None
        assert in_thread(lambda: two.acquire(key, ttl=30, wait=0)) is None  # another owner
        three.release(lease)
        successor = two.acquire(key, ttl=30, wait=0)
        assert successor is not None and successor.fence > lease.fence
        two.release(successor)
    finally:
        three.close()
        two.close()


def _prepared_on(provider: DatabaseProvider) -> set[str]:
    """The statements prepared on the provider's pooled connection (a session's own)."""
    connection = provider._connections.take()
    try:
        cursor = connection.cursor()
        cursor.execute("SELECT name FROM pg_prepared_statements")
        return {name for (name,) in cursor.fetchall()}
    finally:
        provider._connections.give(connection)


def _fences_of_cycles(provider: DatabaseProvider, key: str, count: int) -> list[int]:
    """`count` acquire+release cycles on `key`; each grant's fence."""
    fences = []
    for _ in range(count):
        lease = provider.acquire(key, ttl=30)
        assert lease is not None
        fences.append(lease.fence)
        provider.release(lease)
    return fences


def _deallocate_all(provider: DatabaseProvider) -> None:
    connection = provider._connections.take()
    connection.cursor().execute("DEALLOCATE ALL")
    provider._connections.give(connection)


def test_statements_are_prepared_once_per_session_and_again_after_a_deallocate(
    pg: str, key: str
) -> None:
    """Each statement is prepared on a connection the first time it runs there (psycopg
    2 never prepares, psycopg 3 only from a statement's fifth run); a session that lost
    them (DEALLOCATE, DISCARD ALL) prepares them again."""
    provider = DatabaseProvider(pg, pool_size=1)
    try:
        fences = _fences_of_cycles(provider, key, 3)
        prepared = _prepared_on(provider)
        assert prepared and all(name.startswith("locks_") for name in prepared)
        _deallocate_all(provider)
        assert _prepared_on(provider) == set()
        assert _fences_of_cycles(provider, key, 1)[0] > fences[-1] > fences[0]
        again = _prepared_on(provider)
        assert len(again) == 2 and again <= prepared  # the take and the release, again
    finally:
        provider.close()


def test_prepare_threshold_none_keeps_every_statement_unprepared(
    postgresql_server: PostgreSQLServer, key: str
) -> None:
    """PgBouncer in transaction mode moves a session's statements between server
    connections, so psycopg 3's users turn preparing off (`prepare_threshold=None`):
    honoured."""
    provider = DatabaseProvider(postgresql_server.url, pool_size=1,
                                connect_args={"prepare_threshold": None})  # fmt: skip
    try:
        _fences_of_cycles(provider, key, 10)  # past psycopg's own threshold (5) too
        assert _prepared_on(provider) == set()
    finally:
        provider.close()


class _Forgetful(psycopg2.extensions.connection):  # type: ignore[misc]
    """A session that forgets its prepared statements before every statement, as one
    behind PgBouncer in transaction mode does when the next lands on another server
    connection."""

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        cursor = super().cursor(*args, **kwargs)
        cursor.execute("DEALLOCATE ALL")
        return cursor


def test_psycopg2_statements_go_unprepared_where_the_server_forgets_them(
    postgresql_server: PostgreSQLServer, key: str
) -> None:
    provider = DatabaseProvider(postgresql_server.psycopg2_url, pool_size=1,
                                connect_args={"connection_factory": _Forgetful})  # fmt: skip
    try:
        fences = _fences_of_cycles(provider, key, 3)
        assert fences == sorted(set(fences))
        assert provider._release_sql.unkept  # type: ignore[attr-defined]  # then sent as text
    finally:
        provider.close()


def test_a_killed_server_is_reported_then_the_provider_recovers(
    pg: str, postgresql_server: PostgreSQLServer, key: str
) -> None:
    db = DatabaseProvider(pg)
    try:
        lease = db.acquire(key, ttl=30)
        assert lease is not None
        postgresql_server.kill()
        with pytest.raises(BackendUnavailable) as caught:
            db.acquire(key + ":2", ttl=30)
        assert postgresql_server.address in str(caught.value)
        assert postgresql_server.password not in str(caught.value)
        postgresql_server.start()
        again = recovered(db, key + ":3", tries=3)  # dead pooled connections are dropped
        db.release(again)
        db.release(lease)  # the row survived the restart
    finally:
        db.close()


def test_a_frozen_server_costs_one_socket_timeout(
    pg: str, postgresql_server: PostgreSQLServer, key: str
) -> None:
    """libpq waits for a reply for ever: without the provider's own deadline a frozen
    server held the caller for as long as TCP takes to give up."""
    db = DatabaseProvider(pg, socket_timeout=0.5)
    try:
        assert db.acquire(key, ttl=30) is not None  # a pooled connection to freeze with it
        postgresql_server.pause()
        try:
            started = time.monotonic()
            with pytest.raises(BackendUnavailable):
                db.acquire(key + ":2", ttl=30, wait=0)
            assert time.monotonic() - started < 0.5 + 0.5
        finally:
            postgresql_server.resume()
        again = db.acquire(key + ":3", ttl=30, wait=2)
        assert again is not None
        db.release(again)
    finally:
        db.close()


def test_refused_credentials_and_privileges_are_access_denied_never_unavailable(
    pg: str, postgresql_server: PostgreSQLServer, key: str
) -> None:
    wrong = DatabaseProvider(pg.replace(postgresql_server.password, "not-the-password"))
    with pytest.raises(AccessDenied) as denied:
        wrong.acquire(key, ttl=30)
    assert "not-the-password" not in str(denied.value)
    wrong.close()
    role = f"nobody_{uuid.uuid4().hex[:8]}"
    postgresql_server.sql(f"CREATE ROLE {role} LOGIN PASSWORD 'pw'; "
                          f"GRANT CONNECT ON DATABASE locks TO {role};")  # fmt: skip
    user_url = pg.replace(f"locks:{postgresql_server.password}@", f"{role}:pw@")
    table_owner = DatabaseProvider(pg)
    table_owner.create_table()  # the table exists; this role may not touch it
    unprivileged = DatabaseProvider(user_url, create_table=False)
    try:
        with pytest.raises(AccessDenied, match=r"42501|permission denied"):
            unprivileged.acquire(key, ttl=30)
    finally:
        unprivileged.close()
        table_owner.close()


def test_a_read_only_session_grants_nothing_and_says_why(
    pg: str, postgresql_server: PostgreSQLServer, key: str
) -> None:
    role = f"reader_{uuid.uuid4().hex[:8]}"
    postgresql_server.sql(
        f"CREATE ROLE {role} LOGIN PASSWORD 'pw'; GRANT CONNECT ON DATABASE locks TO {role};"
        f"GRANT USAGE ON SCHEMA public TO {role};"
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON public.locks TO {role};"
        f"ALTER ROLE {role} SET default_transaction_read_only = on;"
    )
    reader = DatabaseProvider(
        pg.replace(f"locks:{postgresql_server.password}@", f"{role}:pw@"), create_table=False
    )
    try:
        with pytest.raises(BackendUnavailable, match="read-only"):
            reader.acquire(key, ttl=30)
    finally:
        reader.close()


def test_a_release_reaches_a_waiter_in_another_process_by_notify_also_after_a_restart(
    pg: str, postgresql_server: PostgreSQLServer, key: str
) -> None:
    """The waiter's poll interval is a minute and the holder's lease 60 s: only a notice
    can wake it in time. Then the server restarts under the waiting process, whose
    listening connection must be made anew."""
    holder = DatabaseProvider(pg)
    ready, done = SPAWN.Event(), SPAWN.Queue()
    try:
        for round_ in range(2):
            lease = holder.acquire(f"{key}:{round_}", ttl=60)
            assert lease is not None
            child = SPAWN.Process(target=_wait_for, args=(pg, f"{key}:{round_}", ready, done))
            child.start()
            assert ready.wait(30)
            ready.clear()
            time.sleep(0.5)  # the child is asleep on the key by now
            released_at = time.time()
            holder.release(lease)
            got_at = done.get(timeout=30)
            child.join(10)
            assert got_at is not None, "the waiter never got the lock"
            assert got_at - released_at < 0.5, "woken by its poll, not by the release"
            if round_ == 0:
                postgresql_server.restart()
                holder.close()
                holder = DatabaseProvider(pg)
    finally:
        holder.close()


def _wait_for(url: str, key: str, ready: object, done: object) -> None:
    provider = DatabaseProvider(url, poll_interval=60)
    try:
        assert provider.acquire(key, ttl=30, wait=0) is None  # it is held: now wait
        ready.set()  # type: ignore[attr-defined]
        lease = provider.acquire(key, ttl=30, wait=20)
        done.put(time.time() if lease is not None else None)  # type: ignore[attr-defined]
    finally:
        provider.close()
