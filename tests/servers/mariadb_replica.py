"""A MariaDB primary and its replica on loopback (Debian's mariadb-server 10.11), for the
tests of a database provider pointed at a read-only server and of a promotion.

Binlog + GTID replication, asynchronous as MariaDB ships it: the primary writes its
binlog, the replica's IO thread copies it into a relay log and its SQL thread applies
it, with `read_only=ON` (which the applier itself ignores). The replica's data dir is a
copy of the primary's freshly installed one, so one `mariadb-install-db` serves both.

A replica is ready when both its threads run. `promote()` is what an operator does:
stop fetching, apply what was fetched, forget the primary, `read_only=OFF`. The pair
remembers that its copies diverged from then on (or whenever replication broke), and
`restore()` rebuilds the replica by replaying the primary's whole binlog into it (a
test session's binlog is small), so every test starts from the same topology.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymysql  # type: ignore[import-untyped]  # no stubs in the dev extra
import pytest

from tests.servers import MariaDBServer, _running, _session_server

REPLICATION_USER = "repl"
REPLICATION_PASSWORD = "repl-test-pw"


class MariaDBNode(MariaDBServer):
    """One server of the pair, with root queries over TCP (a connection per call:
    ~1 ms, against ~10 ms for each `mariadb` client run of `sql`)."""

    def __init__(self, workdir: Path, role: str, server_id: int, *, durable: bool) -> None:
        options = [
            f"--server-id={server_id}",
            f"--log-bin={role}-bin",
            f"--relay-log={role}-relay",
            "--log-slave-updates",  # a promoted replica can serve replicas of its own
            # a replica notices a dead or paused primary within seconds, not a minute
            "--slave-net-timeout=5",
        ]
        if durable:  # the binlog too is fsynced at each commit, as production servers do
            options.append("--sync-binlog=1")
        if role == "replica":
            options.append("--read-only")
        super().__init__(workdir, durable=durable, options=options)
        self.role = role

    def query(self, *statements: str, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Run `statements` as root in one session; the last one's rows as dicts."""
        connection = pymysql.connect(
            host="127.0.0.1", port=self.port, user="root", ssl_disabled=True,
            connect_timeout=max(1, round(timeout)), read_timeout=timeout,
            cursorclass=pymysql.cursors.DictCursor, autocommit=True,
        )  # fmt: skip
        try:
            with connection.cursor() as cursor:
                for statement in statements:
                    cursor.execute(statement)
                return list(cursor.fetchall())
        finally:
            connection.close()

    def value(self, statement: str, *, timeout: float = 5.0) -> Any:
        """The first column of the first row."""
        rows = self.query(statement, timeout=timeout)
        return next(iter(rows[0].values())) if rows else None

    def read_only(self) -> bool:
        return bool(self.value("SELECT @@global.read_only"))

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None and not self.paused


class MariaDBPair:
    """A primary and its replica: per-node start, kill, pause and resume (each node is a
    `ServerProcess`), replication control, promotion and a full restore."""

    def __init__(self, workdir: Path, *, durable: bool = False) -> None:
        self.workdir = workdir
        (workdir / "primary").mkdir(parents=True)
        (workdir / "replica").mkdir()
        self.primary = MariaDBNode(workdir / "primary", "primary", 1, durable=durable)
        shutil.copytree(self.primary.datadir, workdir / "replica" / "data")  # not started yet
        self.replica = MariaDBNode(workdir / "replica", "replica", 2, durable=durable)
        self.nodes = (self.primary, self.replica)
        self.diverged = False  # the replica took writes of its own, or lost its place
        self.semi_synced = False

    # -- the whole pair -------------------------------------------------------------------

    def start(self) -> None:
        """Start both servers at once, then replication; ready once the replica has
        caught up with the primary's set-up (database, users)."""
        errors: list[BaseException] = []

        def start(node: MariaDBNode) -> None:
            try:
                node.start()
            except BaseException as error:  # reported by the caller's thread
                errors.append(error)

        threads = [threading.Thread(target=start, args=(node,)) for node in self.nodes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        self.primary.query(
            f"CREATE USER IF NOT EXISTS '{REPLICATION_USER}'@'127.0.0.1' "
            f"IDENTIFIED BY '{REPLICATION_PASSWORD}'"
        )
        self.primary.query(f"GRANT REPLICATION SLAVE ON *.* TO '{REPLICATION_USER}'@'127.0.0.1'")
        self.resync()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def restore(self) -> None:
        """Back to the starting topology, whatever a test did: both servers running, the
        primary writable, the replica read-only, replicating and caught up."""
        for node in self.nodes:
            node.ensure_running()
        if self.primary.read_only():
            self.primary.query("SET GLOBAL read_only = 0")
        if self.semi_synced:
            self.primary.query("SET GLOBAL rpl_semi_sync_master_enabled = 0")
            self.replica.query("SET GLOBAL rpl_semi_sync_slave_enabled = 0")
            if not self.diverged and self.status():
                self.replica.query("STOP SLAVE IO_THREAD", "START SLAVE IO_THREAD")
            self.semi_synced = False
        if not self.diverged and not self.replicating():
            self.replica.query("START SLAVE")
            if not self._wait(self.replicating, 5.0):
                self.diverged = True
        if self.diverged:
            self.resync()
            return
        if not self.replica.read_only():
            self.replica.query("SET GLOBAL read_only = 1")
        self.wait_caught_up()

    ensure_running = restore  # what the session fixtures call

    def resync(self) -> None:
        """Rebuild the replica's copy from nothing: drop the `locks` database (unlogged),
        forget its position and replay the primary's binlog from the start."""
        replica = self.replica
        replica.query("STOP SLAVE")
        replica.query("RESET SLAVE ALL")
        replica.query("SET GLOBAL read_only = 1")
        replica.query("SET SESSION sql_log_bin = 0", "DROP DATABASE IF EXISTS locks")
        replica.query("SET GLOBAL gtid_slave_pos = ''")
        replica.query(
            f"CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {self.primary.port}, "
            f"MASTER_USER = '{REPLICATION_USER}', MASTER_PASSWORD = '{REPLICATION_PASSWORD}', "
            "MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1"
        )
        replica.query("START SLAVE")
        self.wait_replicating()
        self.wait_caught_up()
        self.diverged = False

    # -- replication ----------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The replica's `SHOW SLAVE STATUS` ({} when it replicates from nobody)."""
        rows = self.replica.query("SHOW SLAVE STATUS")
        return rows[0] if rows else {}

    def replicating(self) -> bool:
        """Both replication threads run: the IO thread is connected to the primary and
        the SQL thread applies what it fetched."""
        state = self.status()
        return state.get("Slave_IO_Running") == "Yes" and state.get("Slave_SQL_Running") == "Yes"

    def wait_replicating(self, timeout: float = 10.0) -> None:
        if not self._wait(self.replicating, timeout):
            raise RuntimeError(f"the replica does not replicate: {self._errors()}")

    def stop_replication(self) -> None:
        """STOP SLAVE: the replica keeps what it has and fetches nothing more (a lag that
        lasts as long as the test wants)."""
        self.replica.query("STOP SLAVE")

    def start_replication(self) -> None:
        self.replica.query("START SLAVE")
        self.wait_replicating()

    def wait_caught_up(self, timeout: float = 10.0) -> None:
        """Until the replica has applied everything the primary has written so far."""
        position = self.primary.value("SELECT @@global.gtid_binlog_pos")
        waited = self.replica.value(
            f"SELECT MASTER_GTID_WAIT('{position}', {timeout})", timeout=timeout + 5
        )
        if waited != 0:
            raise RuntimeError(f"the replica did not reach {position}: {self._errors()}")

    def semi_sync(self, timeout_ms: int = 10_000) -> None:
        """Semi-synchronous replication, AFTER_SYNC: a commit is acknowledged once the
        replica has it in its relay log, or after `timeout_ms` without the replica's
        answer, when the primary falls back to asynchronous replication."""
        self.semi_synced = True
        self.primary.query(
            "SET GLOBAL rpl_semi_sync_master_wait_point = AFTER_SYNC",
            f"SET GLOBAL rpl_semi_sync_master_timeout = {timeout_ms}",
            "SET GLOBAL rpl_semi_sync_master_enabled = 1",
        )
        self.replica.query(
            "SET GLOBAL rpl_semi_sync_slave_enabled = 1",
            "STOP SLAVE IO_THREAD",  # the IO thread asks for semi-sync when it connects
            "START SLAVE IO_THREAD",
        )

        def acknowledging() -> bool:
            rows = self.primary.query("SHOW STATUS LIKE 'Rpl_semi_sync_master_clients'")
            return bool(rows) and int(rows[0]["Value"]) > 0

        if not self._wait(acknowledging, 10.0):
            raise RuntimeError(f"the replica does not acknowledge: {self._errors()}")

    def promote(self) -> None:
        """Make the replica a writable primary, as an operator would: stop fetching,
        let the SQL thread apply the relay log it already has, forget the primary,
        `read_only=OFF`. What it never fetched is not there."""
        replica = self.replica
        self.diverged = True
        if self.status():
            replica.query("STOP SLAVE IO_THREAD")
            fetched = self.status().get("Gtid_IO_Pos") or ""
            if self.status().get("Slave_SQL_Running") == "Yes" and fetched:
                replica.value(f"SELECT MASTER_GTID_WAIT('{fetched}', 10)", timeout=15)
            replica.query("STOP SLAVE")
            replica.query("RESET SLAVE ALL")
        replica.query("SET GLOBAL read_only = 0")

    def _errors(self) -> str:
        state = self.status()
        return (
            f"IO {state.get('Slave_IO_Running')} ({state.get('Last_IO_Error')}), "
            f"SQL {state.get('Slave_SQL_Running')} ({state.get('Last_SQL_Error')})"
        )

    @staticmethod
    def _wait(condition: Any, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True


@pytest.fixture(scope="session")
def mariadb_pair_session(server_dir: Path) -> Iterator[MariaDBPair]:
    """Started the first time a test asks for it, stopped at the end of the session."""
    yield from _session_server(MariaDBPair, "mariadb-pair", server_dir)


@pytest.fixture
def mariadb_pair(mariadb_pair_session: MariaDBPair) -> Iterator[MariaDBPair]:
    """The pair as it starts, before and after the test, whatever the test did."""
    yield from _running(mariadb_pair_session)
