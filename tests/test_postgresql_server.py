"""The PostgreSQL the tests start (tests/servers/postgresql.py): the `locks` role gets in
over TCP by password and is no superuser, may create its table and little else, and the
server dies, comes back, freezes and thaws as the fault tests need."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from tests.servers.postgresql import PostgreSQLServer, _children, _port_open, _running_pid


def connect(server: PostgreSQLServer, **kwargs: Any) -> psycopg.Connection[Any]:
    return psycopg.connect(**server.psycopg_args(), connect_timeout=5, autocommit=True, **kwargs)


def test_locks_role_connects_over_tcp_and_is_no_superuser(
    postgresql_server: PostgreSQLServer,
) -> None:
    with connect(postgresql_server) as conn:
        row = conn.execute(
            "SELECT current_user, current_database(), host(inet_server_addr()),"
            " inet_server_port(), rolsuper, rolcreatedb, rolcreaterole, rolreplication,"
            " rolbypassrls FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        assert row == ("locks", "locks", "127.0.0.1", postgresql_server.port,
                       False, False, False, False, False)  # fmt: skip
        # it owns no database and no schema
        assert conn.execute(
            "SELECT count(*) FROM pg_database WHERE datdba = 'locks'::regrole"
        ).fetchone() == (0,)
        assert conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspowner = 'locks'::regrole"
        ).fetchone() == (0,)
        assert conn.execute("SHOW server_version_num").fetchone()[0] >= "150000"  # type: ignore[index]
    # the superuser has no password: only the Unix socket lets it in
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(host="127.0.0.1", port=postgresql_server.port,
                        user=postgresql_server.superuser, dbname="postgres",
                        connect_timeout=5)  # fmt: skip
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(**{**postgresql_server.psycopg_args(), "password": "wrong"},
                        connect_timeout=5)  # fmt: skip
    assert postgresql_server.sql("SELECT rolsuper FROM pg_roles WHERE rolname = current_user") == (
        "t"
    )


def test_locks_role_may_create_its_table_and_nothing_more(
    postgresql_server: PostgreSQLServer,
) -> None:
    with connect(postgresql_server) as conn:
        conn.execute("CREATE TABLE smoke_table (name VARCHAR(255) PRIMARY KEY, fence BIGINT)")
        try:
            conn.execute("INSERT INTO smoke_table VALUES ('锁', 1)")
            assert conn.execute("SELECT name, fence FROM smoke_table").fetchall() == [("锁", 1)]
        finally:
            conn.execute("DROP TABLE smoke_table")
        for statement in ("CREATE SCHEMA smoke", "CREATE DATABASE smoke", "CREATE ROLE smoke",
                          "CREATE TEMP TABLE smoke (x INT)"):  # fmt: skip
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)


@pytest.mark.parametrize(("url", "driver"), [("url", "psycopg"), ("psycopg2_url", "psycopg2")])
def test_sqlalchemy_urls_reach_the_locks_database(
    postgresql_server: PostgreSQLServer, url: str, driver: str
) -> None:
    engine = sa.create_engine(getattr(postgresql_server, url))
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT current_user, current_database()")).one() == (
                "locks",
                "locks",
            )
            assert engine.dialect.driver == driver
    finally:
        engine.dispose()


def test_kill_ends_every_connection_and_restart_keeps_the_data(
    postgresql_server: PostgreSQLServer,
) -> None:
    server = postgresql_server
    with connect(server) as conn:
        conn.execute("CREATE TABLE smoke_kill (x INT)")
        conn.execute("INSERT INTO smoke_kill VALUES (7)")
    conn = connect(server)
    postmaster = server.process
    assert postmaster is not None
    backends = _children(postmaster.pid)
    assert backends  # the connection's backend, and the auxiliary processes
    try:
        server.kill()
        assert server.process is None
        assert not _port_open(server.port)
        assert [pid for pid in backends if _running_pid(pid)] == []
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    finally:
        conn.close()
    server.restart()  # on the same port, from the same data (crash recovery)
    with connect(server) as conn:
        assert conn.execute("SELECT x FROM smoke_kill").fetchall() == [(7,)]
        conn.execute("DROP TABLE smoke_kill")
    server.restart()  # a running one: killed and started again
    with connect(server) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def in_thread(work: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """`work` started in a thread; its result (or exception) lands in the list."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(work())
        except Exception as error:
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_paused_server_answers_nothing_until_resumed(postgresql_server: PostgreSQLServer) -> None:
    server = postgresql_server
    conn = connect(server)
    try:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        server.pause()
        started = time.monotonic()
        # an open connection and a new one both get no answer within 1 s
        old, old_outcome = in_thread(lambda: conn.execute("SELECT 2").fetchone())

        def query_anew() -> Any:
            with connect(server) as fresh:
                return fresh.execute("SELECT 3").fetchone()

        new, new_outcome = in_thread(query_anew)
        old.join(1.0 - (time.monotonic() - started))
        new.join(max(0.0, 1.0 - (time.monotonic() - started)))
        assert old.is_alive() and new.is_alive(), (old_outcome, new_outcome)
        server.resume()
        old.join(10)
        new.join(10)
        assert old_outcome == [(2,)]
        assert new_outcome == [(3,)]
    finally:
        if server.paused:
            server.resume()
        conn.close()
