"""Real servers for the tests: started once per session on free 127.0.0.1 ports in a
temp dir, and killed, paused (SIGSTOP) and restarted by fault tests.

Loaded as a pytest plugin (`pytest_plugins` in tests/conftest.py), with one module
per multi-node topology beside this one. A missing server binary fails the run with the
command that installs it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest

from tests.ports import free_port

# each topology's fixtures live in a module of its own
pytest_plugins = [
    "tests.servers.redis_topologies",
    "tests.servers.zookeeper_ensemble",
    "tests.servers.mariadb_replica",
    "tests.servers.redis_masters",
    "tests.servers.postgresql",
    "tests.servers.least_privilege",
    "tests.tls",
    "tests.servers.tls_servers",
    "tests.servers.tls_topologies",
]

INSTALL_HINT = (
    "apt-get install -y redis-server zookeeper mariadb-server postgresql (or run `make test`)"
)


def require_binary(name: str, *candidates: str) -> str:
    for candidate in (name, *candidates):
        path = shutil.which(candidate) or (candidate if os.access(candidate, os.X_OK) else None)
        if path:
            return path
    pytest.fail(f"{name} is not installed; install it with: {INSTALL_HINT}", pytrace=False)


class Managed(Protocol):
    """A server or a topology of them, as the session fixtures handle it."""

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def ensure_running(self) -> None: ...


S = TypeVar("S", bound=Managed)


def _all_stopped(pid: int) -> bool:
    """Whether every thread of `pid` is stopped (or gone)."""
    try:
        threads = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return True
    for thread in threads:
        try:
            state = (thread / "stat").read_text().rpartition(") ")[2][:1]
        except OSError:
            continue  # it ended
        if state not in ("T", "t", "Z", "X"):
            return False
    return True


class ServerProcess:
    """A server we own: start, kill -9, pause/resume, restart on the same port."""

    name = "server"

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.paused = False

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def start(self, timeout: float = 30.0) -> None:
        log = (self.workdir / f"{self.name}.log").open("ab")
        self.process = subprocess.Popen(
            self.command(), cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + timeout
        while not self.ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = (self.workdir / f"{self.name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{self.name} did not start on {self.address}:\n{tail}")
            time.sleep(0.01)

    def kill(self) -> None:
        """SIGKILL: the server vanishes mid-conversation, as in a crash."""
        if self.process is not None:
            if self.paused:
                self.resume()
            self.process.kill()
            self.process.wait()
            self.process = None

    def pause(self) -> None:
        """SIGSTOP: the server keeps its sockets but answers nothing (a blackhole).
        Returns once every thread of it has stopped: on a busy machine the signal can
        take a while to reach them, and a request sent meanwhile was answered (a
        cancellation test saw its acquire granted "while paused")."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        self.paused = True
        deadline = time.monotonic() + 5
        while not _all_stopped(self.process.pid):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{type(self).__name__} (pid {self.process.pid}) did not stop")
            time.sleep(0.001)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)
        self.paused = False

    def restart(self) -> None:
        self.kill()
        self.start()

    def ensure_running(self) -> None:
        if self.paused:
            self.resume()
        if self.process is None or self.process.poll() is not None:
            self.process = None
            self.start()

    def stop(self) -> None:
        self.kill()


def _answers(port: int, request: bytes, expect: bytes) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(request)
            return expect in sock.recv(4096)
    except OSError:
        return False


class RedisServer(ServerProcess):
    name = "redis"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.binary = require_binary("redis-server", "/usr/bin/redis-server")

    @property
    def url(self) -> str:
        return f"redis://{self.address}/0"

    def command(self) -> list[str]:
        return [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.workdir),
            "--maxclients", "2000",
            "--loglevel", "warning",
        ]  # fmt: skip

    def ready(self) -> bool:
        return _answers(self.port, b"PING\r\n", b"+PONG")


@contextmanager
def wrong_password(url: str, user: str = "locks-wrongpass") -> Iterator[str]:
    """`url` for an ACL user of that server whose password it gets wrong: the server
    refuses it (WRONGPASS) while the user exists, until the block ends."""
    import redis  # noqa: PLC0415 - only the tests of refused credentials need it

    admin = redis.Redis.from_url(url)
    admin.acl_setuser(user, enabled=True, passwords=["+right"], keys=["*"], commands=["+@all"])
    try:
        yield url.replace("redis://", f"redis://{user}:wrong@")
    finally:
        admin.acl_deluser(user)
        admin.close()


@pytest.fixture(scope="session")
def server_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="locks-servers-") as path:
        yield Path(path)


class ZooKeeperServer(ServerProcess):
    """A standalone ZooKeeper (Debian's `zookeeper` package, Java) with a short tick, so
    sessions can be as short as 0.4 s and expiry tests stay fast."""

    name = "zookeeper"
    tick_ms = 200
    heap = "256m"  # the JVM's -Xmx: an ensemble runs three of them on a small machine

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.java = require_binary("java", "/usr/bin/java")
        jar = Path("/usr/share/java/zookeeper.jar")
        if not jar.exists():
            pytest.fail(f"ZooKeeper is not installed; install it with: {INSTALL_HINT}")
        # Debian's jar names its other jars itself but ships no logging binding
        self.classpath = f"{jar}:/usr/share/java/slf4j-simple.jar"
        (workdir / "data").mkdir(exist_ok=True)
        (workdir / "zoo.cfg").write_text(
            f"tickTime={self.tick_ms}\n"
            f"dataDir={workdir / 'data'}\n"
            f"clientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\n"
            f"minSessionTimeout={2 * self.tick_ms}\n"
            "maxSessionTimeout=60000\n"
            "maxClientCnxns=0\n"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=stat,ruok,srvr\n"
            "forceSync=no\n"
        )

    @property
    def hosts(self) -> str:
        return self.address

    url = hosts

    def command(self) -> list[str]:
        return [
            self.java, f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-Xshare:auto",
            "-Dzookeeper.jmx.log4j.disable=true",
            # empty lock parents (container nodes) are swept every 0.3 s, not every minute
            "-Dznode.container.checkIntervalMs=300",
            "-cp", self.classpath,
            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            str(self.workdir / "zoo.cfg"),
        ]  # fmt: skip

    def ready(self) -> bool:
        # `ruok` answers before the server serves; `srvr` names the mode once it does
        return _answers(self.port, b"srvr", b"Mode: standalone")


class MariaDBServer(ServerProcess):
    """A MariaDB in a temp dir (`mariadb-install-db`, then `mariadbd` on a free port)
    with a `locks` database and a `locks` user allowed DML on it only."""

    name = "mariadb"
    password = "locks-test-pw"

    def __init__(
        self, workdir: Path, *, durable: bool = False, options: Sequence[str] = ()
    ) -> None:
        """`durable`: flush the redo log at every commit, as production servers do
        (benchmarks); the tests skip that fsync to run faster. `options`: more server
        options, after ours (a replica's `--server-id`, `--log-bin`, `--read-only`)."""
        super().__init__(workdir)
        self.options = list(options)
        self.binary = require_binary("mariadbd", "/usr/sbin/mariadbd")
        self.install_db = require_binary("mariadb-install-db", "/usr/bin/mariadb-install-db")
        self.client = require_binary("mariadb", "/usr/bin/mariadb")
        self.datadir = workdir / "data"
        self.socket = workdir / "mariadb.sock"
        if not self.datadir.exists():
            subprocess.run(
                [
                    self.install_db, "--no-defaults", f"--datadir={self.datadir}",
                    "--user=root", "--auth-root-authentication-method=normal",
                    "--skip-test-db", "--skip-name-resolve",
                ],
                check=True, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        self._initialised = False
        self.durable = durable

    @property
    def url(self) -> str:
        return f"mysql+pymysql://locks:{self.password}@{self.address}/locks?charset=utf8mb4"

    @property
    def root_url(self) -> str:
        return f"mysql+pymysql://root@{self.address}/locks?charset=utf8mb4"

    def pymysql_args(self) -> dict[str, Any]:
        """`pymysql.connect` arguments for the `locks` user: the raw driver, no SQLAlchemy."""
        host, port = self.address.rsplit(":", 1)
        return {"host": host, "port": int(port), "user": "locks", "password": self.password,
                "database": "locks", "ssl_disabled": True}  # fmt: skip

    def command(self) -> list[str]:
        return [
            self.binary, "--no-defaults", f"--datadir={self.datadir}",
            f"--socket={self.socket}", f"--pid-file={self.workdir / 'mariadb.pid'}",
            f"--port={self.port}", "--bind-address=127.0.0.1", "--user=root",
            "--skip-name-resolve",
            f"--innodb-flush-log-at-trx-commit={1 if self.durable else 2}",
            "--innodb-buffer-pool-size=64M", "--max-connections=500",
            "--character-set-server=utf8mb4", "--collation-server=utf8mb4_bin",
            *self.options,
        ]  # fmt: skip

    def ready(self) -> bool:
        return self.socket.exists() and self.sql("SELECT 1", check=False) == "1"

    def sql(self, statement: str, *, check: bool = True) -> str:
        """Run `statement` as root through the Unix socket; return its output."""
        done = subprocess.run(
            [self.client, "--no-defaults", f"--socket={self.socket}", "-uroot", "-N", "-B",
             "-e", statement],
            check=check, capture_output=True, text=True,
        )  # fmt: skip
        return done.stdout.strip()

    def start(self, timeout: float = 30.0) -> None:
        super().start(timeout)
        if not self._initialised:
            self.sql(
                "CREATE DATABASE IF NOT EXISTS locks CHARACTER SET utf8mb4;"
                f"CREATE USER IF NOT EXISTS 'locks'@'127.0.0.1' IDENTIFIED BY '{self.password}';"
                f"CREATE USER IF NOT EXISTS 'locks'@'localhost' IDENTIFIED BY '{self.password}';"
                "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON locks.* TO 'locks'@'127.0.0.1';"
                "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON locks.* TO 'locks'@'localhost';"
            )
            self._initialised = True


class SQLiteFile:
    """A SQLite database file shared by every process of a test, as a server stands in."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.url = f"sqlite:///{path}"


@pytest.fixture(scope="session")
def sqlite_file(server_dir: Path) -> SQLiteFile:
    return SQLiteFile(server_dir / "locks.sqlite")


class LockDirectory:
    """The file backend's directory, shared by every process of a test."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.url = str(path)


@pytest.fixture(scope="session")
def lock_directory(server_dir: Path) -> LockDirectory:
    return LockDirectory(server_dir / "file-locks")


def _session_server(cls: Callable[[Path], S], name: str, server_dir: Path) -> Iterator[S]:
    """`cls` started in a work dir of its own for the session; stopped at its end, or
    as soon as its start fails, so that no process outlives the run."""
    workdir = server_dir / name
    workdir.mkdir()
    server = cls(workdir)
    try:
        server.start()
        yield server
    finally:
        server.stop()


def _running(server: S) -> Iterator[S]:
    """The session's server, running when a test starts and left running after it,
    whatever the test killed or paused."""
    server.ensure_running()
    yield server
    server.ensure_running()


@pytest.fixture(scope="session")
def redis_session(server_dir: Path) -> Iterator[RedisServer]:
    yield from _session_server(RedisServer, RedisServer.name, server_dir)


@pytest.fixture
def redis_server(redis_session: RedisServer) -> Iterator[RedisServer]:
    yield from _running(redis_session)


@pytest.fixture(scope="session")
def zookeeper_session(server_dir: Path) -> Iterator[ZooKeeperServer]:
    yield from _session_server(ZooKeeperServer, ZooKeeperServer.name, server_dir)


@pytest.fixture
def zookeeper_server(zookeeper_session: ZooKeeperServer) -> Iterator[ZooKeeperServer]:
    yield from _running(zookeeper_session)


@pytest.fixture(scope="session")
def mariadb_session(server_dir: Path) -> Iterator[MariaDBServer]:
    yield from _session_server(MariaDBServer, MariaDBServer.name, server_dir)


@pytest.fixture
def mariadb_server(mariadb_session: MariaDBServer) -> Iterator[MariaDBServer]:
    yield from _running(mariadb_session)
