"""Database backend (SQLAlchemy 2 Core): one row per held lock in one table.

Acquire is one statement: an upsert that decides by the database server's clock, on
MySQL/MariaDB `INSERT ... ON DUPLICATE KEY UPDATE`, on PostgreSQL and SQLite `INSERT ...
ON CONFLICT DO UPDATE ... WHERE`; it takes the row over only when it is free or expired.
The outcome comes back with the statement (MySQL: `LAST_INSERT_ID(expr)` in the OK
packet; elsewhere `RETURNING`), so nothing is read back and no transaction is opened.
A key whose row this process has not seen lately is tried with a plain `INSERT` first
(on MariaDB parsing the upsert's long update clause costs as much as a fifth of a
cycle); a duplicate means the row is there, and the upsert follows.

A row is one grant (depth 1): nested levels are counted in the holder's process
(`locks.holds`). A row already held by the acquiring owner is one its process lost
track of (a lost reply, a release not yet delivered): it is taken over as a new grant,
with a new token and fence. Release, renewal and `is_held` are guarded by owner, fence
and the row's expiry, so an expired lease can never be released or brought back.

Fences strictly increase by the rule of the row: a new row starts from the server clock
in microseconds and a take-over gives max(fence + 1, clock). A statement reads that clock
when it arrives, not when it writes, so a row must outlive its grant: a waiter whose
statement arrived, then slept (descheduled, or queued on the row) while another grant
came and went would otherwise insert a fresh row below that grant's fence. Release
therefore keeps the row, free (`expires_at` 0), and the next grant counts on from it
under the row's lock. A free row, or an expired one of a holder that died, is purged
once its fence and expiry are older than `purge_after` (far longer than any statement
waits on a server), by which time every clock in flight has passed it. The same rule
carries fences across the promotion of a replica that lacks a row or holds an older
version of it, as long as the promoted server's clock is not behind the old primary's by
more than the time since the last grant there (docs/topologies/mariadb-replica.md).

Minimal privileges for the lock user: SELECT, INSERT, UPDATE, DELETE on the lock table
(plus CREATE on the database if the provider is to create the table itself).

A read-only server (a replica, a standby, a demoted primary) grants, renews and releases
nothing: its refusal is a `BackendUnavailable` naming `read_only`, so a chain moves on
and queues the release. An unprivileged lock user is refused by the server itself, at
every statement, at no cost to us. A user whose privileges bypass read_only (MariaDB's
READ ONLY ADMIN, which root has; MySQL's SUPER or CONNECTION_ADMIN) would write on a
replica unhindered, its rows lost at the next resync or, worse, taken for granted after
a promotion. On MySQL/MariaDB the pool therefore reads `@@global.read_only` on every new
connection and again, in place of the idle ping, on a connection last checked
`_IDLE_PING` seconds ago: one round trip per connection every 5 s at most, none per
acquire. A privileged user on a primary turned read-only while its connections are busy
can still write for up to those 5 s; give the lock user no such privilege. PostgreSQL
needs no check: a standby refuses every user.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool
from sqlalchemy.schema import CreateTable

from locks.backends import dialects
from locks.backends.dbpool import ConnectionPool, Refused
from locks.backends.deadlines import Deadlines
from locks.backends.notices import Notices
from locks.backends.wakeups import Wakeups
from locks.base import ProviderBase
from locks.errors import AccessDenied, BackendError, BackendUnavailable
from locks.keeper import Grant, LeaseKeeper
from locks.names import check_count, check_name, check_seconds
from locks.provider import Capabilities, Holder, Lease
from locks.steps import Steps, call, run

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

logger = logging.getLogger("locks")

E = TypeVar("E")

_NUDGE = 1.0  # seconds: the longest a waiter sleeps without asking (notices may be lost)
_PURGE_EVERY = 1000  # releases between purges of rows left by dead holders
_DEADLOCK_RETRIES = 10  # a statement chosen as a deadlock victim is run again this often
_IDLE_PING = 5.0  # a pooled connection idle, or unchecked, for longer is pinged before use
_ROWS_SEEN = 10_000  # keys remembered to have a row (their tries skip the plain INSERT)
_COM_QUERY = 0x03  # the MySQL protocol's command for a query in text
_CR_SERVER_LOST = 2013  # the client error "Lost connection to MySQL server during query"

_CLOCK_US = {
    "mysql": "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))",
    "postgresql": "CAST(EXTRACT(EPOCH FROM statement_timestamp()) * 1000000 AS BIGINT)",
    "sqlite": "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)",
}
_GREATEST = {"mysql": "GREATEST", "postgresql": "GREATEST", "sqlite": "MAX"}

# the common case: the lock is free and no row is there. MySQL reports a duplicate key
# as an error; elsewhere no row comes back.
# The new row's fence comes back as LAST_INSERT_ID (its depth is 1). MySQL lets a value
# refer to a column set earlier in the list, so the clock is read once.
_MYSQL_INSERT = """
INSERT INTO {t} (name, owner, token, depth, fence, expires_at, acquired_at)
VALUES (:name, :owner, :token, 1, LAST_INSERT_ID({now}), fence + :ttl_us, fence)
"""

_INSERT = """
INSERT INTO {t} (name, owner, token, depth, fence, expires_at, acquired_at)
VALUES (:name, :owner, :token, 1, {now}, {now} + :ttl_us, {now})
ON CONFLICT (name) DO NOTHING
RETURNING fence, depth
"""

# A row is there: take it over if it has expired, or if it is this owner's (a grant its
# process lost track of). MySQL applies ON DUPLICATE KEY UPDATE assignments left to
# right, each seeing the ones before it: the row's old expiry and owner decide, so
# `owner` and `expires_at` go last; the fence comes back through LAST_INSERT_ID (0: held).
_MYSQL_UPSERT = """
INSERT INTO {t} (name, owner, token, depth, fence, expires_at, acquired_at)
VALUES (:name, :owner, :token, 1, LAST_INSERT_ID({now}), fence + :ttl_us, fence)
ON DUPLICATE KEY UPDATE
  fence = IF(expires_at <= {now} OR owner = VALUES(owner), GREATEST(fence + 1, {now}), fence),
  token = IF(expires_at <= {now} OR owner = VALUES(owner), VALUES(token), token),
  depth = 1,
  acquired_at = IF(expires_at <= {now} OR owner = VALUES(owner), {now}, acquired_at),
  owner = IF(expires_at <= {now}, VALUES(owner), owner),
  expires_at = IF(LAST_INSERT_ID(IF(owner = VALUES(owner), fence, 0)) > 0,
                  VALUES(expires_at), expires_at)
"""

# ON CONFLICT assignments all see the old row, so the order does not matter here.
_UPSERT = """
INSERT INTO {t} AS l (name, owner, token, depth, fence, expires_at, acquired_at)
VALUES (:name, :owner, :token, 1, {now}, {now} + :ttl_us, {now})
ON CONFLICT (name) DO UPDATE SET
  fence = {greatest}(l.fence + 1, {now}), token = excluded.token, depth = 1,
  acquired_at = {now}, owner = excluded.owner, expires_at = excluded.expires_at
WHERE l.expires_at <= {now} OR l.owner = excluded.owner
RETURNING fence, depth
"""

# A row this process has seen: take it if it is free or expired, or if it is this
# owner's. MySQL applies SET assignments left to right (`expires_at` sees the new
# `acquired_at`); elsewhere each sees the old row. No row updated: held, or not there.
_MYSQL_TAKE = """
UPDATE {t} SET fence = LAST_INSERT_ID(GREATEST(fence + 1, {now})), token = :token, depth = 1,
  acquired_at = {now}, expires_at = acquired_at + :ttl_us, owner = :owner
WHERE name = :name AND (expires_at <= {now} OR owner = :owner)
"""

_TAKE = """
UPDATE {t} SET fence = {greatest}(fence + 1, {now}), token = :token, depth = 1,
  acquired_at = {now}, expires_at = {now} + :ttl_us, owner = :owner
WHERE name = :name AND (expires_at <= {now} OR owner = :owner)
RETURNING fence
"""

# The fence names the grant, so it guards release and renewal together with the owner.
# Renewal and `is_held` also need the row unexpired: an expired lease is over even while
# nobody has taken the row, and a renewal must not bring it back. A release does not:
# the caller has already refused an expired lease (the server's expiry counts from when
# the INSERT arrived, so it never comes before the caller's), and deleting our own
# expired row frees it sooner. (On MariaDB the clock in the WHERE cost 10 % of a cycle.)
_GRANT = "name = :name AND owner = :owner AND fence = :fence"
_LIVE_GRANT = _GRANT + " AND expires_at > {now}"

# Release keeps the row, free, for its fence (the module's docstring): expiry 0 is before
# any clock, so the next upsert takes it over whenever its statement arrived, and it
# marks the row released, so that the same lease cannot be released twice
_FREE = "UPDATE {t} SET expires_at = 0 WHERE expires_at > 0 AND "
_RELEASE = _FREE + _GRANT

# a grant whose reply was lost: its token is known, its fence is not
_RELEASE_TOKEN = _FREE + "name = :name AND owner = :owner AND token = :token"

_EXTEND = "UPDATE {t} SET expires_at = {now} + :ttl_us WHERE " + _LIVE_GRANT

_IS_HELD = "SELECT 1 FROM {t} WHERE " + _LIVE_GRANT

_HOLDER = """
SELECT owner, depth, fence, expires_at - {now} FROM {t}
WHERE name = :name AND expires_at > {now}
"""

# an operator breaking a stuck lock: the grant read by `_HOLDER` ends now, as if released
_BREAK = _FREE + "name = :name AND fence = :fence"


def _announcing(channel: str) -> Callable[[str], str]:
    """PostgreSQL: a statement that frees rows (`DELETE`/`UPDATE ... WHERE`), made to
    notify `channel` with each freed row's name, in the same round trip; its row count
    is still the number of rows it freed."""

    def announced(statement: str) -> str:
        literal = channel.replace("'", "''")
        return (f"WITH freed AS ({statement} RETURNING name) "
                f"SELECT pg_notify('{literal}', name) FROM freed")  # fmt: skip

    return announced


# rows freed, or left by holders that died, whose fence and expiry are older than the
# grace: no statement still in flight read a clock below their fence (found, then deleted)
_IDLE = "expires_at < {now} - :grace_us AND fence < {now} - :grace_us"
_PURGE_FIND = "SELECT name FROM {t} WHERE " + _IDLE + " LIMIT 1000"
_PURGE = "DELETE FROM {t} WHERE name = :name AND " + _IDLE


@dataclass(frozen=True)
class _Statement:
    """A statement compiled once for the driver, run through a DBAPI cursor."""

    sql: str
    positions: tuple[str, ...]  # parameter order, for positional styles (qmark, format)
    named: bool  # the driver takes a mapping of parameters
    every_row: bool = False  # `run` returns every row read, not the first

    @staticmethod
    def compile(sql: str, dialect: Any, *, every_row: bool = False) -> _Statement:
        if dialect.driver == "psycopg" and not every_row:
            return _PsycopgStatement.compiled(sql, dialect)
        if dialect.driver == "psycopg2" and not every_row:
            return _Psycopg2Statement.compiled(sql, dialect)
        direct = dialect.driver == "pymysql" and not sql.lstrip().startswith("SELECT")
        if direct:
            dialect = type(dialect)(paramstyle="format")  # positional: a tuple to format
        compiled = sa.text(sql).compile(dialect=dialect)
        positions = tuple(compiled.positiontup or ())
        kind = _PyMySQLStatement if direct else _Statement
        return kind(compiled.string, positions, not compiled.positional, every_row)

    def _args(self, params: dict[str, Any]) -> Any:
        return params if self.named else [params[n] for n in self.positions]

    def run(self, connection: Any, params: dict[str, Any]) -> tuple[int, int, Any]:
        """The rowcount, the lastrowid and the first row, if any (every row read, as a
        list, for a statement compiled `every_row`)."""
        return self._through_cursor(connection, self.sql, self._args(params))

    def _through_cursor(self, connection: Any, sql: str, args: Any) -> tuple[int, int, Any]:
        cursor = connection.cursor()
        try:
            cursor.execute(sql, args)
            read = cursor.fetchall if self.every_row else cursor.fetchone
            row = read() if cursor.description else None
            # only MySQL's fence comes back as LAST_INSERT_ID; psycopg 3 has no lastrowid
            return cursor.rowcount, getattr(cursor, "lastrowid", None) or 0, row
        finally:
            cursor.close()

    async def arun(self, connection: Any, params: dict[str, Any]) -> tuple[int, int, Any]:
        """`run` on an asyncio driver's connection (asyncmy, aiomysql, psycopg's
        AsyncConnection, aiosqlite): the same cursor calls, those that do I/O awaited."""
        cursor = await _awaited(connection.cursor())
        try:
            await cursor.execute(
                self.sql, params if self.named else [params[n] for n in self.positions]
            )
            read = cursor.fetchall if self.every_row else cursor.fetchone
            row = await _awaited(read()) if cursor.description else None
            return cursor.rowcount, getattr(cursor, "lastrowid", None) or 0, row
        finally:
            await _awaited(cursor.close())


async def _awaited(outcome: Any) -> Any:
    """Where the asyncio drivers differ: some make a cursor, fetch or close without I/O."""
    return await outcome if inspect.isawaitable(outcome) else outcome


class _PyMySQLStatement(_Statement):
    """On PyMySQL a statement without rows is written as one COM_QUERY and its reply read
    as the OK packet it must be, with the connection's own packet calls (sequence
    numbers, timeouts, error packets and lost connections handled as `query` handles
    them). Strings are escaped by the connection exactly as `Cursor.execute` escapes
    them; integers are written as they are. The cursor's bookkeeping (make, clear, read
    back, close) cost ~10 µs a statement, and `query`'s result object (made, read, kept
    for `insert_id`) ~11 µs a cycle more: together ~6 % of a cycle against a durable
    MariaDB."""

    def run(self, connection: Any, params: dict[str, Any]) -> tuple[int, int, Any]:
        escape = connection.escape
        values = [params[n] for n in self.positions]
        sql = self.sql % tuple([str(v) if type(v) is int else escape(v) for v in values])
        connection._execute_command(_COM_QUERY, sql)
        packet = connection._read_packet()  # raises the server's error, as `query` does
        if not packet.is_ok_packet():  # a statement without rows answered with rows
            connection._force_close()
            raise connection.OperationalError(  # a lost connection, to `_run`: discarded
                _CR_SERVER_LOST, "the server answered a statement without rows with rows"
            )
        packet.advance(1)
        rows = packet.read_length_encoded_integer()
        insert_id = packet.read_length_encoded_integer()
        # its escaping depends on the session's NO_BACKSLASH_ESCAPES, told here
        connection.server_status = packet.read_uint16()
        return rows, insert_id, None


@dataclass(frozen=True)
class _PsycopgStatement(_Statement):
    """On psycopg 3 (the threaded face) a statement is prepared once per connection
    under a name of its own and run with libpq's `exec_prepared`, its parameters and
    its first row in text: the cursor, its adapters and its result object cost ~30 µs
    a cycle, ~8 % against a durable PostgreSQL. (psycopg prepares a statement run five
    times too; a cursor's `prepare_threshold=None`, for PgBouncer's transaction mode,
    is honoured by keeping the cursor.) The asyncio face keeps the cursor (`arun`)."""

    prepared_as: bytes = b""  # the name it is prepared under: the same for the same text
    numbered_sql: bytes = b""  # with $1, $2 for `numbered`, UTF-8
    numbered: tuple[str, ...] = ()  # the parameters, in the order of their numbers

    @staticmethod
    def compiled(sql: str, dialect: Any) -> _PsycopgStatement:
        named, numbered, order, name = _prepared_forms(sql, dialect)
        return _PsycopgStatement(named, (), True, False, prepared_as=name.encode(),
                                 numbered_sql=numbered.encode(), numbered=order)  # fmt: skip

    def run(self, connection: Any, params: dict[str, Any]) -> tuple[int, int, Any]:
        pgconn = connection.pgconn
        if (connection.prepare_threshold is None
                or pgconn.parameter_status(b"client_encoding") != b"UTF8"):  # fmt: skip
            return super().run(connection, params)
        values = [str(params[n]).encode() for n in self.numbered]
        result = pgconn.exec_prepared(self.prepared_as, values)
        if result.status == _FATAL_ERROR and result.error_field(_SQLSTATE) == _NOT_PREPARED_PQ:
            # not prepared on this connection yet (or deallocated since): once
            _settled(pgconn, pgconn.prepare(self.prepared_as, self.numbered_sql, None))
            result = pgconn.exec_prepared(self.prepared_as, values)
        _settled(pgconn, result)
        row = None
        if result.ntuples:
            row = tuple([None if (value := result.get_value(0, column)) is None
                         else value.decode() for column in range(result.nfields)])  # fmt: skip
        return result.command_tuples or 0, 0, row


@dataclass(frozen=True)
class _Psycopg2Statement(_Statement):
    """psycopg2 never prepares: PostgreSQL parsed and planned each statement anew, ~25 %
    of a cycle against a durable server. Here a statement is prepared once per
    connection (`PREPARE`, again after a DEALLOCATE) and run as `EXECUTE name (...)`,
    its arguments quoted by the driver as ever. A server that forgets a statement
    between two of ours (PgBouncer in transaction mode hands each to any server
    connection) has them sent unprepared from then on."""

    prepare_sql: str = ""  # PREPARE name AS the statement, numbered
    unprepared_sql: str = ""  # the statement itself, as the driver quotes it
    unkept: list[bool] = field(default_factory=list)  # [True]: the server keeps none

    @staticmethod
    def compiled(sql: str, dialect: Any) -> _Psycopg2Statement:
        named, numbered, order, name = _prepared_forms(sql, dialect)
        arguments = ", ".join(f"%({n})s" for n in order)
        return _Psycopg2Statement(
            f"EXECUTE {name} ({arguments})" if arguments else f"EXECUTE {name}", (), True,
            False, prepare_sql=f"PREPARE {name} AS {numbered}", unprepared_sql=named,
        )  # fmt: skip

    def run(self, connection: Any, params: dict[str, Any]) -> tuple[int, int, Any]:
        if self.unkept:
            return self._through_cursor(connection, self.unprepared_sql, params)
        for attempt in range(2):
            try:
                return self._through_cursor(connection, self.sql, params)
            except connection.Error as error:
                if dialects.sqlstate(error) != _NOT_PREPARED:
                    raise
            if attempt == 0:  # not on this connection yet: nothing ran
                self._through_cursor(connection, self.prepare_sql, None)
        self.unkept.append(True)  # prepared, and gone by the next statement
        return self._through_cursor(connection, self.unprepared_sql, params)


_NOT_PREPARED = "26000"  # SQLSTATE invalid_sql_statement_name: no such prepared statement
_NOT_PREPARED_PQ = _NOT_PREPARED.encode()  # as libpq's result reports it


def _prepared_forms(sql: str, dialect: Any) -> tuple[str, str, tuple[str, ...], str]:
    """What both PostgreSQL drivers' statements are made of: the statement with named
    parameters (as the driver quotes them), the same with $1, $2 (as PostgreSQL
    prepares it), the parameters in the order of their numbers, and its name: the same
    for the same text, on every connection and in every process."""
    named = sa.text(sql).compile(dialect=dialect).string
    numbered = sa.text(sql).compile(dialect=type(dialect)(paramstyle="numeric_dollar"))
    digest = hashlib.sha1(numbered.string.encode(), usedforsecurity=False).hexdigest()[:16]
    return named, numbered.string, tuple(numbered.positiontup or ()), f"locks_{digest}"


# libpq's result status and error field, as psycopg's `pq` numbers them
_COMMAND_OK, _TUPLES_OK, _FATAL_ERROR = 1, 2, 7
_SQLSTATE = ord("C")


def _settled(pgconn: Any, result: Any) -> None:
    """Raise what psycopg's cursor would for a failed `result`: the server's error by
    its SQLSTATE, or `OperationalError` when the connection is gone (no SQLSTATE, the
    connection bad), which the pool then discards."""
    if result.status in (_COMMAND_OK, _TUPLES_OK):
        return
    import psycopg  # noqa: PLC0415 - only a failure needs the module's errors

    if result.error_field(_SQLSTATE) is None or pgconn.status != 0:  # 0: CONNECTION_OK
        message = (result.error_message or pgconn.error_message).decode(errors="replace")
        raise psycopg.OperationalError(message.strip() or "the connection to PostgreSQL failed")
    raise psycopg.errors.error_from_result(result, encoding="utf-8")


class DatabaseRules(LeaseKeeper):
    """Type `database`, what both faces share: arguments, statements, the table, error
    translation, and every decision about a statement's outcome. The threaded face
    (`DatabaseProvider`) and the asyncio one (`locks.aio.DatabaseProvider`) add only
    connections and the calls on them."""

    type_name = "database"

    capabilities = Capabilities(
        reentrant=True,
        expires=True,
        renewable=True,
        fair=False,
        fenced=True,
        cross_process=True,
        cross_host=True,
    )

    def _configure(
        self,
        engine: Engine | AsyncEngine,
        *,
        engine_given: bool,
        table: str,
        create_table: bool,
        socket_timeout: float,
        purge_after: float,
        poll_interval: float,
        connect_args: Mapping[str, Any] | None,
    ) -> None:
        """Check the arguments and the database, compile the statements for `engine`'s
        driver (the threaded face's engine, or the asyncio face's)."""
        self.table_name = check_name(table, "table")
        self.purge_after = check_seconds(purge_after, "purge_after")
        self.poll_interval = check_seconds(poll_interval, "poll_interval")
        self.socket_timeout = check_seconds(socket_timeout, "socket_timeout")
        self._owns_engine = not engine_given
        self._connect_args = dict(connect_args or {})
        self._sa_dialect = engine.dialect
        self._url = engine.url
        dialect = dialects.family(engine.dialect.name)
        if dialect not in dialects.FAMILIES:
            raise ValueError(
                f"unsupported database {dialect!r}: use MySQL/MariaDB, PostgreSQL or SQLite"
            )
        if dialect == "sqlite" and _in_memory(engine.url):
            raise ValueError(
                f"{'engine' if engine_given else 'url'}: an in-memory SQLite database "
                "belongs to one connection and cannot hold locks; use a file such as "
                "sqlite:///locks.db"
            )
        self._dialect = dialect
        self._mysql = dialect == "mysql"
        # the hot statements run on raw DBAPI connections, so the driver's own errors
        # count too, besides SQLAlchemy's (pool timeouts, wrapped connect errors)
        dbapi = engine.dialect.loaded_dbapi
        self._dbapi_error: type[Any] = dbapi.Error
        self.unavailable_errors = (
            *dialects.UNAVAILABLE,
            dbapi.OperationalError,
            # SQLAlchemy's aiosqlite adapter has none (sqlite3 has: the driver raises it)
            getattr(dbapi, "InterfaceError", sqlite3.InterfaceError),
        )
        # what taking a connection may raise: those, or the pool's check refusing the server
        self._take_errors: tuple[type[BaseException], ...] = (*self.unavailable_errors, Refused)
        self.driver_errors = (exc.SQLAlchemyError, dbapi.Error)
        self.address = _address(engine.url)
        self._duplicate_key: type[Any] = dbapi.IntegrityError
        # PostgreSQL: what frees a lock announces it to waiting processes (`notices`)
        self._channel = f"locks.{self.table_name}"[:63]  # an identifier: 63 bytes at most
        self._compile(self._channel if dialect == "postgresql" else None)
        self._create_table = create_table
        self._table_ready = False
        self._releases = 0
        # keys whose row this process saw lately (a hint: a wrong one costs a statement)
        self._rows_seen: dict[str, None] = {}

    def _compile(self, channel: str | None) -> None:
        """Every statement, compiled once for the driver; those that free a lock notify
        `channel` where there is one."""
        sa_dialect, dialect = self._sa_dialect, self._dialect
        quoted = sa_dialect.identifier_preparer.quote(self.table_name)
        parts = {"t": quoted, "now": _CLOCK_US[dialect], "greatest": _GREATEST[dialect]}
        announced = str if channel is None else _announcing(channel)

        def compiled(sql: str, *, every_row: bool = False) -> _Statement:
            return _Statement.compile(sql.format(**parts), sa_dialect, every_row=every_row)

        self._insert_sql = compiled(_MYSQL_INSERT if self._mysql else _INSERT)
        self._upsert_sql = compiled(_MYSQL_UPSERT if self._mysql else _UPSERT)
        self._take_sql = compiled(_MYSQL_TAKE if self._mysql else _TAKE)
        self._release_sql = compiled(announced(_RELEASE))
        self._extend_sql = compiled(_EXTEND)
        self._release_token_sql = compiled(announced(_RELEASE_TOKEN))
        self._is_held_sql = compiled(_IS_HELD)
        self._holder_sql = compiled(_HOLDER)
        self._break_sql = compiled(announced(_BREAK))
        self._purge_sql = compiled(_PURGE)
        self._purge_find_sql = compiled(_PURGE_FIND, every_row=True)
        self._ping_sql = compiled("SELECT 1")
        self._read_only_sql = compiled("SELECT @@global.read_only")

    # -- setup and errors -----------------------------------------------------------------

    def table(self, metadata: sa.MetaData | None = None) -> sa.Table:
        """The lock table, for migrations or `create_all`."""
        metadata = sa.MetaData() if metadata is None else metadata
        collation = None
        if self._dialect == "mysql":
            # a binary collation without PAD SPACE: 'a' and 'a ' are two locks
            mariadb = getattr(self._sa_dialect, "is_mariadb", False)
            collation = "utf8mb4_nopad_bin" if mariadb else "utf8mb4_0900_bin"
        return sa.Table(
            self.table_name,
            metadata,
            sa.Column("name", sa.String(255, collation=collation), primary_key=True),
            sa.Column("owner", sa.String(64), nullable=False),
            sa.Column("token", sa.String(64), nullable=False),
            sa.Column("depth", sa.Integer, nullable=False),
            sa.Column("fence", sa.BigInteger, nullable=False),
            sa.Column("expires_at", sa.BigInteger, nullable=False),  # µs, database clock; 0: free
            sa.Column("acquired_at", sa.BigInteger, nullable=False),
            mysql_engine="InnoDB",
            mysql_charset="utf8mb4",
        )

    def ddl(self) -> str:
        """The statement that creates the lock table, for a migration run by its owner
        (the lock user then needs no CREATE). On a `mysql://` URL the collation depends
        on the server being MySQL or MariaDB, which SQLAlchemy learns on the first
        connection: `ping()` first where the server is reachable."""
        return str(CreateTable(self.table()).compile(dialect=self._sa_dialect)).strip()

    def _make_table(self, conn: sa.Connection) -> None:
        """Create the lock table on `conn` if it does not exist. Needs the CREATE
        privilege only when it is missing: a user with DML rights alone passes once the
        table is there. (Connected first: the server, MariaDB or MySQL, decides the
        collation; IF NOT EXISTS: processes starting together may all try.)"""
        if not sa.inspect(conn).has_table(self.table_name):
            conn.execute(CreateTable(self.table(), if_not_exists=True))
        self._table_ready = True

    def _secrets(self) -> list[str]:
        """The password, and a TLS key's password from the url or `connect_args`."""
        return dialects.secrets(self._url, self._connect_args)

    def _domain(self) -> Hashable:
        return ("database", self._url.render_as_string(hide_password=True), self.table_name)

    def _classify(self, error: BaseException) -> type[BackendUnavailable] | type[BackendError]:
        if dialects.denied(error):
            return AccessDenied
        if dialects.read_only(error):
            return BackendUnavailable
        return super()._classify(error)

    def _unavailable(
        self,
        error: BaseException,
        *,
        ambiguous: bool = False,
        key: str | None = None,
        token: str | None = None,
    ) -> BackendUnavailable:
        if not dialects.read_only(error):
            return super()._unavailable(error, ambiguous=ambiguous, key=key, token=token)
        # refused before it ran: never ambiguous, nothing to release later
        return BackendUnavailable(
            f"{self._where()} is read-only ({dialects.READ_ONLY_HINT[self._dialect]}); it grants, "
            f"renews and releases nothing: {self._detail(error)}",
            backend=self.name, address=self.address, key=key,
        )  # fmt: skip

    def _failed(
        self,
        error: BaseException,
        attempt: int,
        *,
        ambiguous: bool,
        key: str | None,
        token: str | None,
    ) -> BaseException | None:
        """What a driver error raised by a statement becomes: None to run it again (a
        deadlock victim was rolled back whole: nothing happened), else the error to
        raise."""
        if dialects.deadlock_victim(error) and attempt + 1 < _DEADLOCK_RETRIES:
            return None
        if isinstance(error, self.unavailable_errors) or dialects.read_only(error):
            return self._unavailable(error, ambiguous=ambiguous, key=key, token=token)
        return error

    # -- the algorithm's decisions --------------------------------------------------------

    @staticmethod
    def _grant_params(lease: Lease) -> dict[str, Any]:
        return {"name": lease.key, "owner": lease.owner, "fence": lease.fence}

    def _first_statement(self, key: str, row_seen: bool) -> _Statement:
        """One try's first statement, by what this process knows of the key's row: a
        waiter that found it held a moment ago (`row_seen`) sends the upsert, which
        decides whether the row is there or not, so a poll is one statement; a key whose
        row it has seen lately, the update that takes it; any other key, the insert
        that makes it. Where the update or the insert grants nothing, the upsert decides
        (`_then_upsert`)."""
        if row_seen:
            return self._upsert_sql
        return self._take_sql if key in self._rows_seen else self._insert_sql

    def _then_upsert(self, first: _Statement, key: str) -> bool:
        """After `first` granted nothing: whether the upsert is to try next."""
        if first is self._upsert_sql:
            return False
        self._saw_row(key)
        return True

    def _fence_of(self, rows: int, fence: int, row: Any) -> int | None:
        """The new grant's fence from a statement's outcome, or None if it granted
        nothing."""
        if not self._mysql:
            return None if row is None else int(row[0])  # RETURNING
        # LAST_INSERT_ID: 0 when nothing was granted, and also when a trigger on the
        # table hid it from an insert's reply (MariaDB does). That row is this owner's:
        # the upsert, whose reply keeps it, takes it over.
        return fence if rows and fence else None

    def _saw_row(self, key: str) -> None:
        seen = self._rows_seen
        if len(seen) >= _ROWS_SEEN:
            seen.clear()  # bounded: forgotten keys cost one more statement once
        seen[key] = None

    def _released_row(self, key: str) -> bool:
        """After a release: the row is kept, free, so the next try goes straight to the
        upsert; whether it is time to purge."""
        self._saw_row(key)
        self._releases += 1
        return self._releases % _PURGE_EVERY == 0

    def _holder_of(self, key: str, row: Any) -> Holder | None:
        if row is None:
            return None
        owner, _, fence, left_us = row
        return Holder(key, self.name, owner, None, int(fence), int(left_us) / 1e6)

    def _wait_steps(
        self, waiter: Any, params: dict[str, Any], token: str, *,
        deadline: float | None, notified: bool,
    ) -> Steps[Grant | None]:  # fmt: skip
        """A waiter's turns until it is granted or its time is up: only the head of
        this process's line on the key asks (`waiter.first`); the others wait their
        turn, woken when the head leaves or the key is released here."""
        key = params["name"]
        while True:
            if waiter.first:
                grant = yield from call(self, "_take", params, key, token, row_seen=True)
                if grant is not None:
                    return grant  # type: ignore[no-any-return]
                pause = random.uniform(0.75, 1.25) * self.poll_interval
                if notified:  # heard-of releases wake it: it waits for the holder's expiry
                    holder = yield from call(self, "_holder", key)
                    pause = _pause_for(holder)
            else:
                pause = _NUDGE  # woken when the head leaves or the key is released
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                pause = min(pause, left)
            yield from call(waiter, "sleep", pause)


class DatabaseProvider(DatabaseRules, ProviderBase):
    """Type `database`: MySQL/MariaDB (pymysql), PostgreSQL or SQLite through SQLAlchemy."""

    def __init__(
        self,
        url: str = "sqlite:///locks.db",
        *,
        engine: Engine | None = None,
        name: str = "database",
        table: str = "locks",
        watchdog_ttl: float = 30.0,
        create_table: bool = True,
        connect_timeout: float = 1.0,
        socket_timeout: float = 2.0,
        pool_size: int = 10,
        pool_timeout: float = 5.0,
        purge_after: float = 3600.0,
        connect_args: Mapping[str, Any] | None = None,
        poll_interval: float = 0.025,
    ) -> None:
        """`poll_interval`: how often a process's first waiter on a key asks for it
        where releases are not announced (MySQL/MariaDB, SQLite): a hand-off to another
        process takes about half of it, for 1/poll_interval queries a second per key
        and waiting process. PostgreSQL announces releases (LISTEN/NOTIFY)."""
        super().__init__(name, watchdog_ttl)
        engine_given = engine is not None
        if engine is None:
            engine = make_engine(
                url,
                check_seconds(connect_timeout, "connect_timeout"),
                check_seconds(socket_timeout, "socket_timeout"),
                dict(connect_args or {}),
            )
        elif not isinstance(engine, Engine):
            raise TypeError(f"engine must be a sqlalchemy Engine, not {type(engine).__name__}")
        self.engine = engine
        self._configure(engine, engine_given=engine_given, table=table,
                        create_table=create_table, socket_timeout=socket_timeout,
                        purge_after=purge_after, poll_interval=poll_interval,
                        connect_args=connect_args)  # fmt: skip
        # libpq has no read timeout: PostgreSQL's statements get one of ours
        self._deadlines = (
            Deadlines(self.socket_timeout, f"locks-deadlines-{self.name}")
            if self._dialect == "postgresql"
            else None
        )
        self._connections = ConnectionPool(
            engine,
            check_count(pool_size, "pool_size"),
            check_seconds(pool_timeout, "pool_timeout"),
            _IDLE_PING,
            check=self._check_writable if self._mysql else None,
            deadlines=self._deadlines,
        )
        self._setup_lock = threading.Lock()
        self._wakeups = Wakeups()
        self._notices = None
        if self._dialect == "postgresql":
            self._notices = Notices(
                engine, self._channel, on_notice=self._wakeups.wake,
                on_gap=self._wakeups.wake_all, timeout=self.socket_timeout,
                name=f"locks-notices-{self.name}",
            )  # fmt: skip

    def create_table(self) -> None:
        """Create the lock table if it does not exist (see `_make_table`)."""
        with self._translated(), self.engine.connect() as conn:
            self._make_table(conn)

    def _ready(self) -> None:
        if not self._table_ready and self._create_table:
            with self._setup_lock:
                if not self._table_ready:
                    self.create_table()

    def _check_writable(self, connection: Any) -> None:
        """The pool's check on MySQL/MariaDB: one round trip that refuses a read-only
        server, whatever the user's privileges (see the module's docstring)."""
        _refuse_read_only(self._read_only_sql.run(connection, {})[2])

    def _run(
        self,
        statement: _Statement,
        params: dict[str, Any],
        *,
        ambiguous: bool = False,
        key: str | None = None,
        token: str | None = None,
    ) -> tuple[int, int, Any]:
        """Run one statement on a DBAPI connection, without SQLAlchemy's execution layer
        (it cost more than the round trip); returns rowcount, lastrowid, first row.
        Driver errors are translated here; a broken connection is closed."""
        pool, deadlines = self._connections, self._deadlines
        for attempt in range(_DEADLOCK_RETRIES):
            try:
                connection = pool.take()
            except self._take_errors as error:  # nothing was sent
                raise self._unavailable(error, key=key) from error
            ticket = None if deadlines is None else deadlines.start(connection)
            try:
                outcome = statement.run(connection, params)
            except self._dbapi_error as error:
                if self.engine.dialect.is_disconnect(error, connection, None):
                    pool.discard(connection)
                    pool.discard_idle()
                else:
                    pool.give(connection)
                failed = self._failed(error, attempt, ambiguous=ambiguous, key=key, token=token)
                if failed is None:
                    continue
                if failed is error:
                    raise
                raise failed from error
            except BaseException:  # interrupted mid-reply: the protocol state is unknown
                pool.discard(connection)
                raise
            finally:
                if deadlines is not None and ticket is not None:
                    deadlines.stop(ticket)
            pool.give(connection)
            return outcome
        raise AssertionError("unreachable: the last attempt returns or raises")

    # -- the algorithm --------------------------------------------------------------------

    def _acquire(
        self, key: str, owner: str, token: str, ttl: float, deadline: float | None
    ) -> Grant | None:
        self._ready()
        params = {"name": key, "owner": owner, "token": token, "ttl_us": round(ttl * 1e6)}
        grant = self._take(params, key, token)
        if grant is not None or (deadline is not None and time.monotonic() >= deadline):
            return grant
        with self._wakeups.waiting(key) as waiter:
            # subscribed before the next look: a release from now on is heard of
            notified = self._notices is not None and self._notices.listen()
            return run(self._wait_steps(waiter, params, token, deadline=deadline,
                                        notified=notified))  # fmt: skip

    def _take(
        self, params: dict[str, Any], key: str, token: str, *, row_seen: bool = False
    ) -> Grant | None:
        """One try: the grant if this owner holds the lock now, else None."""
        sent_at = time.monotonic()
        first = self._first_statement(key, row_seen)
        fence = self._fence_from(first, params, key, token)
        if fence is None and self._then_upsert(first, key):
            fence = self._fence_from(self._upsert_sql, params, key, token)
        return None if fence is None else Grant(token, fence, 1, sent_at)

    def _fence_from(
        self, statement: _Statement, params: dict[str, Any], key: str, token: str
    ) -> int | None:
        try:
            rows, fence, row = self._run(statement, params, ambiguous=True, key=key, token=token)
        except self._duplicate_key:  # MySQL's insert: a row is there
            return None
        return self._fence_of(rows, fence, row)

    def _release(self, lease: Lease) -> bool:
        released = self._run(self._release_sql, self._grant_params(lease))[0] == 1
        if released:  # the lock is free
            self._wakeups.wake(lease.key)
        if self._released_row(lease.key):
            self.purge()
        return released

    def _release_unknown(self, lease: Lease) -> bool:
        params = {"name": lease.key, "owner": lease.owner, "token": lease.token}
        released = self._run(self._release_token_sql, params)[0] == 1
        if released:
            self._wakeups.wake(lease.key)
        return released

    def purge(self) -> int:
        """Delete rows free, or expired (their holders died), whose fence and expiry are
        older than `purge_after`, up to 1000 a call; returns how many."""
        params: dict[str, Any] = {"grace_us": round(self.purge_after * 1e6)}
        # Found by a plain read, then deleted one by one by key. A DELETE with the expiry
        # in its WHERE scans the table (the expiry has no index): InnoDB would lock every
        # row it reads and wait for any row an open transaction holds. On a pooled
        # connection: the engine's would be a new one (a handshake, ~30 ms with PyMySQL's
        # TLS context), paid by every thousandth release.
        found = self._run(self._purge_find_sql, params)[2] or []
        deleted = 0
        for (name,) in found:
            deleted += self._run(self._purge_sql, {**params, "name": name})[0]
        return deleted

    def _extend(self, lease: Lease, ttl: float) -> bool:
        params = {**self._grant_params(lease), "ttl_us": round(ttl * 1e6)}
        return self._run(self._extend_sql, params)[0] == 1

    def _is_held(self, lease: Lease) -> bool:
        return self._run(self._is_held_sql, self._grant_params(lease))[2] is not None

    def _holder(self, key: str) -> Holder | None:
        self._ready()
        return self._holder_of(key, self._run(self._holder_sql, {"name": key})[2])

    def _break(self, key: str) -> Holder | None:
        """Guarded by the fence read: a grant made since is not touched (None then)."""
        holder = self._holder(key)
        if holder is None:
            return None
        if self._run(self._break_sql, {"name": key, "fence": holder.fence})[0] != 1:
            return None
        self._wakeups.wake(key)
        return holder

    def ping(self) -> None:
        self._run(self._ping_sql, {})

    def close(self) -> None:
        super().close()
        if self._notices is not None:
            self._notices.close()
        self._connections.close()
        if self._owns_engine:
            self.engine.dispose()


def _refuse_read_only(row: Any) -> None:
    """The read-only check's verdict on its reply (`SELECT @@global.read_only`), for
    either face's pool."""
    if row is not None and int(row[0]):
        raise Refused("@@global.read_only = 1")


def _pause_for(holder: Holder | None) -> float:
    """Where releases are heard of, how long the head waits before it asks again: until
    the holder's expiry (a dead holder's lock frees itself then), at most `_NUDGE`."""
    left = _NUDGE if holder is None or holder.expires_in is None else holder.expires_in
    return min(max(left, 0.0) + 0.001, _NUDGE)


def make_engine(
    url: str,
    connect_timeout: float,
    socket_timeout: float,
    connect_args: dict[str, Any],
    *,
    parse: Callable[[str], sa.engine.URL] = dialects.database_url,
    create: Callable[..., E] = sa.create_engine,  # type: ignore[assignment]
) -> E:
    """An engine whose connections run in autocommit mode: one statement, one round trip.
    It pools nothing itself (the face's pool does); it makes connections, and serves
    the rare setup statements. The asyncio face passes its own `parse` (the asyncio
    driver of the URL's family) and `create` (`create_async_engine`)."""
    parsed = parse(url)
    args = dialects.connect_args(parsed, connect_timeout, socket_timeout, connect_args)
    dialects.check_tls_files(parsed, args)
    try:
        return create(parsed, isolation_level="AUTOCOMMIT", poolclass=NullPool, connect_args=args)
    except (exc.ArgumentError, exc.NoSuchModuleError) as error:
        raise ValueError(f"url {dialects.redacted(url)!r}: {error}") from None


def _in_memory(url: sa.engine.URL) -> bool:
    database = url.database or ""
    return database in ("", ":memory:") or url.query.get("mode") == "memory"


def _address(url: sa.engine.URL) -> str:
    if url.get_backend_name() == "sqlite":
        return f"sqlite:{url.database or ':memory:'}"
    return f"{url.host or 'localhost'}:{url.port or ''}".rstrip(":")
