"""Five independent redis-servers, no replication between them: the members of a
quorum (RedLock) that the quorum tests kill, pause and restart — with their data (an
append-only file, written before each reply), or empty."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import RedisServer, _running, _session_server

MASTERS = 5


class RedisMaster(RedisServer):
    """A redis-server that keeps its data across a kill (AOF; no fsync: a killed process
    loses nothing it acknowledged, only a machine crash would)."""

    def command(self) -> list[str]:
        command = super().command()
        at = command.index("--appendonly")
        command[at + 1] = "yes"
        return [*command, "--appendfsync", "no"]

    def restart_empty(self) -> None:
        """Kill it and start it with its data gone, as after a crash with no persistence."""
        self.kill()
        shutil.rmtree(self.workdir / "appendonlydir", ignore_errors=True)
        self.start()


class RedisMasters:
    """`MASTERS` redis-servers, each in a dir of its own."""

    def __init__(self, workdir: Path) -> None:
        self.servers: list[RedisMaster] = []
        for index in range(MASTERS):
            (workdir / str(index)).mkdir()
            self.servers.append(RedisMaster(workdir / str(index)))

    @property
    def urls(self) -> list[str]:
        return [server.url for server in self.servers]

    @property
    def url(self) -> str:
        """Every member's URL, joined by `|` (as the contract suite passes addresses)."""
        return "|".join(self.urls)

    def start(self) -> None:
        for server in self.servers:
            server.start()

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def ensure_running(self) -> None:
        for server in self.servers:
            server.ensure_running()


@pytest.fixture(scope="session")
def redis_masters_session(server_dir: Path) -> Iterator[RedisMasters]:
    yield from _session_server(RedisMasters, "redis-masters", server_dir)


@pytest.fixture
def redis_masters(redis_masters_session: RedisMasters) -> Iterator[RedisMasters]:
    yield from _running(redis_masters_session)
