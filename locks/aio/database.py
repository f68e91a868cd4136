"""Type `database` for tasks: the threaded backend's table, statements and decisions
(`locks.backends.database.DatabaseRules`), sent through asyncio drivers.

SQLAlchemy's asyncio engine makes the connections (its URL handling, connect events and
isolation level apply, in autocommit mode); the statements then go straight to the
driver's connection, as the threaded face sends them to the DBAPI's: `asyncmy` for
MySQL/MariaDB (measured ~13 % more cycles a second than aiomysql, docs/asyncio.md),
psycopg 3's own asyncio connection for PostgreSQL, `aiosqlite` for SQLite (a thread per
connection: the file lock is never waited for on the loop). A URL that names a threaded
driver (`mysql+pymysql://`) gets the asyncio driver of its family, so one TOML serves
both faces.

Each statement runs to its end as a task of its own, bounded by the socket timeout:
a caller cancelled meanwhile leaves it running, and the connection goes back to the
pool when the reply is in. A cancelled acquire's grant is released by its token only
once the statement that may have made it has answered (a release sent beside it could
overtake it and find nothing, leaving the row held until its ttl).

Waiting: a process's first waiting task on a key polls every `poll_interval`
(jittered); the others wait their turn and are woken when it leaves or when a release
is made here; on PostgreSQL, also when a release anywhere is announced (LISTEN/NOTIFY,
`locks.aio.notices`), so its waiters hear of it at once.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from collections.abc import Mapping
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.util import greenlet_spawn

from locks.aio.base import AsyncProviderBase
from locks.aio.dbpool import AsyncConnectionPool, Connection
from locks.aio.notices import AsyncNotices
from locks.aio.wakeups import Lines
from locks.backends import dialects
from locks.backends.database import (
    _DEADLOCK_RETRIES,
    _IDLE_PING,
    DatabaseRules,
    _refuse_read_only,
    _Statement,
    make_engine,
)
from locks.backends.dbpool import new_connection
from locks.errors import ConfigError
from locks.keeper import Grant
from locks.names import check_count, check_seconds
from locks.provider import Holder, Lease
from locks.steps import run_async


class DatabaseProvider(DatabaseRules, AsyncProviderBase):
    """Type `database` for tasks: MySQL/MariaDB, PostgreSQL or SQLite, as the threaded
    `locks.backends.DatabaseProvider` (same arguments; `engine` is an `AsyncEngine`)."""

    def __init__(
        self,
        url: str = "sqlite:///locks.db",
        *,
        engine: AsyncEngine | None = None,
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
        super().__init__(name, watchdog_ttl)
        if importlib.util.find_spec("greenlet") is None:  # else said at the first connection
            raise ConfigError(
                "the asyncio database provider needs greenlet (SQLAlchemy's asyncio engine "
                "makes its connections): pip install 'fallback-locks[aio-mysql]' (or "
                "aio-postgresql, aio-sqlite)"
            )
        engine_given = engine is not None
        if engine is None:
            engine = make_engine(
                url,
                check_seconds(connect_timeout, "connect_timeout"),
                check_seconds(socket_timeout, "socket_timeout"),
                dict(connect_args or {}),
                parse=dialects.asyncio_url,
                create=create_async_engine,
            )
        elif not isinstance(engine, AsyncEngine):
            raise TypeError(f"engine must be a sqlalchemy AsyncEngine, not {type(engine).__name__}")
        self.engine = engine
        self._configure(engine, engine_given=engine_given, table=table,
                        create_table=create_table, socket_timeout=socket_timeout,
                        purge_after=purge_after, poll_interval=poll_interval,
                        connect_args=connect_args)  # fmt: skip
        # SQLite waits for the file lock up to the socket timeout itself: a little more here
        self._bound = self.socket_timeout * (2 if self._dialect == "sqlite" else 1)
        self._connections = AsyncConnectionPool(
            self._connect,
            self._alive,
            self._close_connection,
            size=check_count(pool_size, "pool_size"),
            timeout=check_seconds(pool_timeout, "pool_timeout"),
            ping_after=_IDLE_PING,
            check_new=self._mysql,
        )
        self._setup = asyncio.Lock()
        self._lines = Lines()
        self._notices = None
        if self._dialect == "postgresql":  # releases are announced: heard of at once
            self._notices = AsyncNotices(
                self._connect, self._close_connection, self._channel,
                on_notice=self._lines.wake, on_gap=self._lines.wake_all,
                timeout=self.socket_timeout,
            )  # fmt: skip

    def after_fork_in_child(self) -> None:
        super().after_fork_in_child()
        self._setup = asyncio.Lock()  # the parent's loop's, as its waiters and statements
        self._lines.reset()
        if self._notices is not None:
            self._notices.reset()

    # -- connections ------------------------------------------------------------------

    async def _connect(self) -> Connection:
        adapted = await greenlet_spawn(new_connection, self.engine.sync_engine)
        return Connection(adapted, self.engine.dialect.get_driver_connection(adapted))

    async def _alive(self, connection: Connection) -> None:
        """The read-only check on MySQL/MariaDB (see the threaded module), a ping
        elsewhere; within the socket timeout."""
        async with asyncio.timeout(self._bound):
            if not self._mysql:
                await self._ping_sql.arun(connection.driver, {})
                return
            row = (await self._read_only_sql.arun(connection.driver, {}))[2]
        _refuse_read_only(row)

    @staticmethod
    async def _close_connection(connection: Connection) -> None:
        await greenlet_spawn(connection.adapted.close)

    async def create_table(self) -> None:
        """Create the lock table if it does not exist (the threaded face's)."""
        with self._translated():
            async with self.engine.connect() as conn:
                await conn.run_sync(self._make_table)

    async def _ready(self) -> None:
        if not self._table_ready and self._create_table:
            async with self._setup:  # one task asks; those starting with it wait for it
                if not self._table_ready:
                    await self.create_table()

    async def _run(
        self,
        statement: _Statement,
        params: dict[str, Any],
        *,
        ambiguous: bool = False,
        key: str | None = None,
        token: str | None = None,
    ) -> tuple[int, int, Any]:
        """The threaded face's `_run`, awaited: the statement on a pooled connection,
        as a task of its own that a cancelled caller leaves running (the module's
        docstring); driver errors translated here."""
        for attempt in range(_DEADLOCK_RETRIES):
            try:
                connection = await self._connections.take()
            except self._take_errors as error:  # nothing was sent
                raise self._unavailable(error, key=key) from error
            task = self._in_background(self._on(connection, statement, params))
            self._track(token, task)
            try:
                # bounded here too: a driver may take its time to give up (psycopg asks
                # the server to cancel the statement, ~10 s against a paused one)
                async with asyncio.timeout(self._bound):
                    return await asyncio.shield(task)
            except TimeoutError as error:  # the reply did not come within the bound
                raise self._unavailable(error, ambiguous=ambiguous, key=key, token=token) from error
            except self._dbapi_error as error:
                failed = self._failed(error, attempt, ambiguous=ambiguous, key=key, token=token)
                if failed is None:
                    continue
                if failed is error:
                    raise
                raise failed from error
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _on(
        self, connection: Connection, statement: _Statement, params: dict[str, Any]
    ) -> tuple[int, int, Any]:
        """`statement` on `connection`, which goes back to the pool, or is closed when it
        may be broken (a disconnect, or a reply cut off by the timeout)."""
        pool = self._connections
        try:
            async with asyncio.timeout(self._bound):
                outcome = await statement.arun(connection.driver, params)
        except self._dbapi_error as error:
            if self.engine.dialect.is_disconnect(error, connection.adapted, None):
                pool.discard(connection)
                pool.discard_idle()
            else:
                pool.give(connection)
            raise
        except BaseException:
            pool.discard(connection)
            raise
        pool.give(connection)
        return outcome

    # -- the algorithm ----------------------------------------------------------------

    async def _acquire(
        self, key: str, owner: str, token: str, ttl: float, deadline: float | None
    ) -> Grant | None:
        await self._ready()
        params = {"name": key, "owner": owner, "token": token, "ttl_us": round(ttl * 1e6)}
        grant = await self._take(params, key, token)
        if grant is not None or (deadline is not None and time.monotonic() >= deadline):
            return grant
        async with self._lines.waiting(key) as waiter:
            # subscribed before the next look: a release from now on is heard of
            notified = self._notices is not None and await self._notices.listen()
            return await run_async(
                self._wait_steps(waiter, params, token, deadline=deadline, notified=notified)
            )

    async def _take(
        self, params: dict[str, Any], key: str, token: str, *, row_seen: bool = False
    ) -> Grant | None:
        """One try (the threaded face's `_take`)."""
        sent_at = time.monotonic()
        first = self._first_statement(key, row_seen)
        fence = await self._fence_from(first, params, key, token)
        if fence is None and self._then_upsert(first, key):
            fence = await self._fence_from(self._upsert_sql, params, key, token)
        return None if fence is None else Grant(token, fence, 1, sent_at)

    async def _fence_from(
        self, statement: _Statement, params: dict[str, Any], key: str, token: str
    ) -> int | None:
        try:
            outcome = await self._run(statement, params, ambiguous=True, key=key, token=token)
        except self._duplicate_key:  # MySQL's insert: a row is there
            return None
        return self._fence_of(*outcome)

    async def _release(self, lease: Lease) -> bool:
        released = (await self._run(self._release_sql, self._grant_params(lease)))[0] == 1
        if released:  # the lock is free
            self._lines.wake(lease.key)
        if self._released_row(lease.key):
            await self.purge()
        return released

    async def _release_unknown(self, lease: Lease) -> bool:
        """After the acquire statement that may have made the grant has answered."""
        await self._settled(lease.token)
        params = {"name": lease.key, "owner": lease.owner, "token": lease.token}
        released = (await self._run(self._release_token_sql, params))[0] == 1
        if released:
            self._lines.wake(lease.key)
        return released

    async def purge(self) -> int:
        """As the threaded face's `purge`."""
        params: dict[str, Any] = {"grace_us": round(self.purge_after * 1e6)}
        found = (await self._run(self._purge_find_sql, params))[2] or []
        deleted = 0
        for (name,) in found:
            deleted += (await self._run(self._purge_sql, {**params, "name": name}))[0]
        return deleted

    async def _extend(self, lease: Lease, ttl: float) -> bool:
        params = {**self._grant_params(lease), "ttl_us": round(ttl * 1e6)}
        return (await self._run(self._extend_sql, params))[0] == 1

    async def _is_held(self, lease: Lease) -> bool:
        return (await self._run(self._is_held_sql, self._grant_params(lease)))[2] is not None

    async def _holder(self, key: str) -> Holder | None:
        await self._ready()
        return self._holder_of(key, (await self._run(self._holder_sql, {"name": key}))[2])

    async def _break(self, key: str) -> Holder | None:
        """Guarded by the fence read: a grant made since is not touched (None then)."""
        holder = await self._holder(key)
        if holder is None:
            return None
        if (await self._run(self._break_sql, {"name": key, "fence": holder.fence}))[0] != 1:
            return None
        self._lines.wake(key)
        return holder

    async def ping(self) -> None:
        await self._run(self._ping_sql, {})

    async def _close_io(self) -> None:
        if self._notices is not None:
            await self._notices.close()
        await self._connections.close()
        if self._owns_engine:
            await self.engine.dispose()
