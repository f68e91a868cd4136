"""Real servers for the tests: started once per session on free 127.0.0.1 ports in a
temp dir, and killed, paused (SIGSTOP) and restarted by fault tests.

Loaded as a pytest plugin (`-p tests.servers` in pyproject.toml). A missing server
binary fails the run with the command that installs it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ports import free_port

INSTALL_HINT = "apt-get install -y redis-server zookeeper mariadb-server (or run `make test`)"


def require_binary(name: str, *candidates: str) -> str:
    for candidate in (name, *candidates):
        path = shutil.which(candidate) or (candidate if os.access(candidate, os.X_OK) else None)
        if path:
            return path
    pytest.fail(f"{name} is not installed; install it with: {INSTALL_HINT}", pytrace=False)


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
        """SIGSTOP: the server keeps its sockets but answers nothing (a blackhole)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        self.paused = True

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


@pytest.fixture(scope="session")
def server_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="locks-servers-") as path:
        yield Path(path)


@pytest.fixture(scope="session")
def redis_session(server_dir: Path) -> Iterator[RedisServer]:
    workdir = server_dir / "redis"
    workdir.mkdir()
    server = RedisServer(workdir)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_server(redis_session: RedisServer) -> Iterator[RedisServer]:
    """The session's redis-server, running when the test starts and left running after it."""
    redis_session.ensure_running()
    yield redis_session
    redis_session.ensure_running()
