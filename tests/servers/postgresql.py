"""A PostgreSQL on loopback (Debian's `postgresql` package), for the database tests:
`initdb` into the test's work dir, then `postgres` on a free 127.0.0.1 port with its Unix
socket in the work dir, a `locks` database and a `locks` role that is no superuser.

PostgreSQL refuses to run as root. As root, initdb, the server and psql run as the
`postgres` user the package creates, switched to by `subprocess.Popen(user=, group=,
extra_groups=[])` in the child just before it execs: `self.process` is the postmaster
itself, so SIGKILL and SIGSTOP reach the server and not a wrapper (`runuser` forks and
waits for its child; `su` too). That user owns the work dir; each directory above it
that it could not search (the session's 0700 server dir) is handed to its group with
search permission only (mode 0710, never to everyone: the session's other servers keep
sockets there). As anyone else, everything runs as the calling user.

The postmaster forks a process per connection, besides its auxiliary processes, each in
a session of its own: `kill`, `pause` and `resume` signal the postmaster and every child
of it, so that a killed server's connections vanish mid-conversation and a paused
server's open connections answer nothing either.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.servers import INSTALL_HINT, ServerProcess, _running, _session_server

TOOLS = ("postgres", "initdb", "psql")


def postgresql_bindir() -> Path:
    """The newest /usr/lib/postgresql/<version>/bin with the server and its tools (where
    Debian puts them, off PATH), else the directory of a `postgres` on PATH."""
    found: list[tuple[tuple[int, ...], Path]] = []
    for bindir in Path("/usr/lib/postgresql").glob("*/bin"):
        try:
            version = tuple(int(part) for part in bindir.parent.name.split("."))
        except ValueError:
            continue
        if all(os.access(bindir / tool, os.X_OK) for tool in TOOLS):
            found.append((version, bindir))
    if found:
        return max(found)[1]
    on_path = shutil.which("postgres")
    if on_path and all(os.access(Path(on_path).parent / tool, os.X_OK) for tool in TOOLS):
        return Path(on_path).parent
    pytest.fail(f"PostgreSQL is not installed; install it with: {INSTALL_HINT}", pytrace=False)


@dataclass(frozen=True)
class Account:
    """The user PostgreSQL runs as: `postgres` for root, else the calling user."""

    name: str
    uid: int
    gid: int

    @classmethod
    def for_server(cls) -> Account:
        if os.geteuid() == 0:
            try:
                entry = pwd.getpwnam("postgres")
            except KeyError:
                pytest.fail(
                    "PostgreSQL refuses to run as root and there is no `postgres` user to "
                    f"run it as; install the package that creates it: {INSTALL_HINT}",
                    pytrace=False,
                )
        else:
            entry = pwd.getpwuid(os.geteuid())
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid)

    def popen_args(self) -> dict[str, Any]:
        """`subprocess` arguments that run a child as this user (none if we are it); no
        supplementary groups: root's would come along otherwise."""
        if self.uid == os.geteuid():
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def can_search(self, directory: Path) -> bool:
        info = directory.stat()
        if self.uid == 0:
            return True
        if info.st_uid == self.uid:
            return bool(info.st_mode & stat.S_IXUSR)
        if info.st_gid == self.gid:
            return bool(info.st_mode & stat.S_IXGRP)
        return bool(info.st_mode & stat.S_IXOTH)

    def give_way(self, path: Path) -> None:
        """Let this user reach `path`: each directory above it that it cannot search, if
        ours and closed to its group (0700, as temp dirs are made), goes to this user's
        group with search permission only."""
        for directory in reversed(path.resolve().parents):
            if self.can_search(directory):
                continue
            info = directory.stat()
            if info.st_uid != os.geteuid() or info.st_mode & stat.S_IRWXG:
                pytest.fail(
                    f"{self.name} (which runs PostgreSQL) cannot reach {path}: {directory} "
                    "is not searchable by it; give the server a work dir it can reach",
                    pytrace=False,
                )
            os.chown(directory, -1, self.gid)
            os.chmod(directory, stat.S_IMODE(info.st_mode) | stat.S_IXGRP)


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rpartition(") ")[2].split()


def _running_pid(pid: int) -> bool:
    """The process exists and is not a zombie (one reaped whenever whatever adopts
    orphans here gets to it)."""
    fields = _proc_stat(pid)
    return fields is not None and fields[0] != "Z"


def _children(pid: int) -> list[int]:
    """The live children of `pid`: the postmaster's backends and auxiliary processes."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _proc_stat(int(entry.name))
            if fields is not None and fields[1] == str(pid) and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # gone already
        os.kill(pid, signum)


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class PostgreSQLServer(ServerProcess):
    """PostgreSQL in a temp dir, with a `locks` database and a `locks` role (password
    auth, scram-sha-256, over TCP) that owns nothing and may only connect to `locks` and
    create tables in its schema `public`."""

    name = "postgresql"
    password = "locks-test-pw"

    def __init__(
        self, workdir: Path, *, durable: bool = False, options: Sequence[str] = ()
    ) -> None:
        """`durable`: fsync and full page writes, as production servers run (benchmarks);
        the tests skip them to run faster. `options`: more `-c name=value` settings,
        after ours."""
        super().__init__(workdir)
        bindir = postgresql_bindir()
        self.binary, self.initdb, self.client = (str(bindir / tool) for tool in TOOLS)
        self.account = Account.for_server()
        self.superuser = self.account.name  # initdb names the superuser after its user
        self.durable = durable
        self.options = list(options)
        self.datadir = workdir / "data"
        # the server and psql get no PG* variables of ours (PGHOST, PGOPTIONS, ...)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        self.account.give_way(workdir)
        os.chown(workdir, self.account.uid, self.account.gid)
        workdir.chmod(0o700)
        if not self.datadir.exists():
            self._initdb()
        self._initialised = False

    def _as_server_user(self, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, cwd=self.workdir, env=self.env, capture_output=True, text=True, check=False,
            **self.account.popen_args(), **kwargs,
        )  # fmt: skip

    def _initdb(self) -> None:
        done = self._as_server_user([
            self.initdb, "-D", str(self.datadir), "--encoding=UTF8", "--locale=C",
            "--auth-local=peer", "--auth-host=scram-sha-256", "--no-sync", "--no-instructions",
        ])  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed:\n{done.stdout}{done.stderr}")
        # the superuser through the socket as its own OS user; every role over TCP from
        # 127.0.0.1 by password (the superuser has none, so only `locks` gets in)
        hba = self.datadir / "pg_hba.conf"
        hba.write_text(
            "# TYPE  DATABASE  USER  ADDRESS       METHOD\n"
            "local   all       all                 peer\n"
            "host    all       all   127.0.0.1/32  scram-sha-256\n"
        )
        os.chown(hba, self.account.uid, self.account.gid)

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://locks:{self.password}@{self.address}/locks"

    @property
    def psycopg2_url(self) -> str:
        return f"postgresql+psycopg2://locks:{self.password}@{self.address}/locks"

    def psycopg_args(self) -> dict[str, Any]:
        """`psycopg.connect` arguments for the `locks` role: the raw driver, over TCP."""
        return {"host": "127.0.0.1", "port": self.port, "user": "locks",
                "password": self.password, "dbname": "locks"}  # fmt: skip

    def command(self) -> list[str]:
        flush = "on" if self.durable else "off"
        settings = [
            "listen_addresses=127.0.0.1",
            f"unix_socket_directories={self.workdir}",
            "max_connections=500",
            "shared_buffers=64MB",
            # without fsync a commit still writes its WAL to the kernel before it returns
            # (synchronous_commit on): a killed server loses no commit, only a crashed
            # machine would, as with MariaDB's innodb_flush_log_at_trx_commit=2. Off, a
            # kill -9 would drop the last ~0.6 s of commits: locks granted, then gone
            "synchronous_commit=on",
            f"fsync={flush}",
            f"full_page_writes={flush}",
            *self.options,
        ]
        argv = [self.binary, "-D", str(self.datadir), "-p", str(self.port)]
        for setting in settings:
            argv += ["-c", setting]
        return argv

    def ready(self) -> bool:
        """The postmaster we started says `ready` in its pid file, and takes TCP."""
        if self.process is None:
            return False
        try:
            lines = (self.datadir / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        return (
            len(lines) >= 8
            and lines[0] == str(self.process.pid)
            and lines[7].strip() == "ready"
            and _port_open(self.port)
        )

    def start(self, timeout: float = 30.0) -> None:
        log_path = self.workdir / f"{self.name}.log"
        with log_path.open("ab") as log:
            # a session of its own: a Ctrl-C of the test run does not shut it down
            # before the fixtures do
            self.process = subprocess.Popen(
                self.command(), cwd=self.workdir, env=self.env, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True, **self.account.popen_args(),
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while not self.ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-2000:]
                self.kill()
                raise RuntimeError(f"{self.name} did not start on {self.address}:\n{tail}")
            time.sleep(0.01)
        if not self._initialised:
            self.sql(
                "SELECT format('CREATE ROLE locks LOGIN PASSWORD %L', :'password')"
                " WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'locks') \\gexec\n"
                "SELECT 'CREATE DATABASE locks'"
                " WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'locks') \\gexec\n"
                "\\connect locks\n"
                # PUBLIC may connect and make temp tables in a new database: `locks` alone
                # may connect. PostgreSQL 15 grants CREATE on schema public to its owner
                # only (the database owner): `locks` gets it, and nothing else
                "REVOKE ALL ON DATABASE locks FROM PUBLIC;\n"
                "GRANT CONNECT ON DATABASE locks TO locks;\n"
                "GRANT CREATE ON SCHEMA public TO locks;\n",
                database="postgres",
                variables={"password": self.password},
            )
            self._initialised = True

    def sql(
        self,
        statement: str,
        *,
        database: str = "locks",
        check: bool = True,
        timeout: float = 30.0,
        variables: dict[str, str] | None = None,
    ) -> str:
        """Run `statement` (one or more, psql's meta-commands too) as the superuser through
        the Unix socket; return the rows, unaligned (`|` between columns), no headers."""
        argv = [self.client, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
                "-h", str(self.workdir), "-p", str(self.port), "-U", self.superuser,
                "-d", database, "-f", "-"]  # fmt: skip
        for name, value in (variables or {}).items():
            argv += ["-v", f"{name}={value}"]
        done = self._as_server_user(argv, input=statement, timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"psql failed ({done.returncode}) on {statement!r}:\n{done.stderr}")
        return done.stdout.strip()

    def _stopped(self, pid: int, timeout: float = 5.0) -> None:
        """Wait until `pid` has taken a SIGSTOP: it forks nothing from then on."""
        deadline = time.monotonic() + timeout
        while (fields := _proc_stat(pid)) is not None and fields[0] not in ("T", "Z"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} (pid {pid}) did not stop")
            time.sleep(0.001)

    def kill(self) -> None:
        """SIGKILL to the postmaster and every process it forked, as in a crash."""
        if self.process is None:
            return
        pid = self.process.pid
        if self.process.poll() is None:
            _signal(pid, signal.SIGSTOP)  # no new child between the list and the kill
            self._stopped(pid)
            children = _children(pid)
            for child in children:
                _signal(child, signal.SIGKILL)
            _signal(pid, signal.SIGKILL)
        else:
            children = []
        self.process.wait()
        deadline = time.monotonic() + 10
        while any(_running_pid(child) for child in children) and time.monotonic() < deadline:
            time.sleep(0.005)
        self.process = None
        self.paused = False

    def pause(self) -> None:
        """SIGSTOP to the postmaster, then to each of its children: it keeps its sockets
        (and its connections) but answers nothing."""
        assert self.process is not None
        pid = self.process.pid
        _signal(pid, signal.SIGSTOP)
        self._stopped(pid)
        for child in _children(pid):
            _signal(child, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        assert self.process is not None
        pid = self.process.pid
        for child in _children(pid):
            _signal(child, signal.SIGCONT)
        _signal(pid, signal.SIGCONT)
        self.paused = False


@pytest.fixture(scope="session")
def postgresql_session(server_dir: Path) -> Iterator[PostgreSQLServer]:
    yield from _session_server(PostgreSQLServer, PostgreSQLServer.name, server_dir)


@pytest.fixture
def postgresql_server(postgresql_session: PostgreSQLServer) -> Iterator[PostgreSQLServer]:
    yield from _running(postgresql_session)
