"""Redis Sentinel and Redis Cluster for the tests: real redis-server processes on free
loopback ports, with short failure timeouts so a failover takes about two seconds.

Each topology starts once per session, only when a test asks for it; the function
fixtures hand it over healthy (every node up, a primary serving, replicas linked) and
repair it after a test that killed or paused nodes.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from tests.ports import free_port
from tests.servers import (
    RedisServer,
    ServerProcess,
    _answers,
    _running,
    _session_server,
    require_binary,
)

# Sentinel: a primary is declared down after this long without an answer
DOWN_AFTER_MS = 500
# Cluster: a node is declared failing after this long
NODE_TIMEOUT_MS = 700


def _wait_for(condition: object, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if callable(condition) and condition():
                return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def _acknowledged(primary: RedisNode, key: str = "healthcheck") -> bool:
    """A write on `primary` reaches a replica within 0.2 s: what synced grants need."""
    with primary.admin() as client:
        client.set(key, 1)
        return int(client.wait(1, 200)) >= 1


def _owned_key(node: RedisNode) -> str:
    """A key in one of the slots `node` serves as a cluster primary."""
    with node.admin() as client:
        ranges = [
            (int(start), int(end))
            for start, end, primary, *_ in client.execute_command("CLUSTER", "SLOTS")
            if int(primary[1]) == node.port
        ]
    for i in range(1_000_000):
        slot = key_slot(f"healthcheck{i}".encode())
        if any(start <= slot <= end for start, end in ranges):
            return f"healthcheck{i}"
    raise RuntimeError(f"{node.name} serves no slot")


class RedisNode(RedisServer):
    """A data node of a topology; `extra` adds server options (replicaof, cluster mode)."""

    def __init__(self, workdir: Path, name: str, extra: list[str] | None = None) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        super().__init__(workdir)
        self.name = name
        self.extra = list(extra or [])

    def command(self) -> list[str]:
        # a replica's full sync starts at once, not after the default 5 s wait for others
        return [*super().command(), "--repl-diskless-sync-delay", "0", *self.extra]

    def admin(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)

    def info(self, section: str) -> dict[str, object]:
        with self.admin() as client:
            return dict(client.info(section))


class SentinelProcess(ServerProcess):
    """`redis-server sentinel.conf --sentinel`; the config file is rewritten by the
    sentinel itself, so it is written afresh before each start."""

    def __init__(self, workdir: Path, name: str, service: str) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        super().__init__(workdir)
        self.name = name
        self.service = service
        self.binary = require_binary("redis-server", "/usr/bin/redis-server")
        self.primary_port = 0

    def command(self) -> list[str]:
        conf = self.workdir / "sentinel.conf"
        conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self.workdir}\n"
            "loglevel warning\nsentinel resolve-hostnames no\n"
            f"sentinel monitor {self.service} 127.0.0.1 {self.primary_port} 2\n"
            f"sentinel down-after-milliseconds {self.service} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {self.service} 2000\n"
            f"sentinel parallel-syncs {self.service} 1\n"
        )
        return [self.binary, str(conf), "--sentinel"]

    def ready(self) -> bool:
        return _answers(self.port, b"PING\r\n", b"+PONG")

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1)


class SentinelTopology:
    """A primary, one replica and three sentinels (quorum 2) watching service `locks`."""

    service = "locks"

    def __init__(self, workdir: Path) -> None:
        self.nodes = [RedisNode(workdir / f"node{i}", f"redis-node{i}") for i in range(2)]
        self.sentinels = [
            SentinelProcess(workdir / f"sentinel{i}", f"sentinel{i}", self.service)
            for i in range(3)
        ]

    @property
    def url(self) -> str:
        hosts = ",".join(s.address for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    @property
    def sentinel_addresses(self) -> list[str]:
        return [s.address for s in self.sentinels]

    def start(self) -> None:
        primary, replica = self.nodes
        primary.start()
        replica.extra = ["--replicaof", "127.0.0.1", str(primary.port)]
        replica.start()
        for sentinel in self.sentinels:
            sentinel.primary_port = primary.port
            sentinel.start()
        self.wait_healthy()

    def primary_port(self) -> int:
        """The primary every live sentinel names now (they may disagree for a moment
        after a failover: then this waits for them to agree)."""
        deadline = time.monotonic() + 20
        while True:
            named = set()
            for sentinel in self.sentinels:
                if sentinel.process is None:
                    continue
                try:
                    with sentinel.client() as client:
                        found = client.sentinel_get_master_addr_by_name(self.service)
                except redis.RedisError:
                    continue
                named.add(int(found[1]) if found else 0)
            if len(named) == 1 and 0 not in named:
                return named.pop()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the sentinels do not agree on a primary: {named}")
            time.sleep(0.05)

    def primary(self) -> RedisNode:
        port = self.primary_port()
        return next(node for node in self.nodes if node.port == port)

    def replica(self) -> RedisNode:
        port = self.primary_port()
        return next(node for node in self.nodes if node.port != port)

    def describe(self) -> str:
        """Each node's role and each sentinel's primary now, for a failure's message."""
        parts = []
        for node in self.nodes:
            try:
                info = node.info("replication")
                parts.append(f"{node.name}:{node.port} {info.get('role')} "
                             f"(link {info.get('master_link_status', '-')})")  # fmt: skip
            except (redis.RedisError, OSError) as error:
                parts.append(f"{node.name}:{node.port} unreachable ({error})")
        for sentinel in self.sentinels:
            try:
                with sentinel.client() as client:
                    named = client.sentinel_get_master_addr_by_name(self.service)
                    # one more each failover: tells a second, unasked-for one
                    epoch = client.sentinel_master(self.service).get("config-epoch")
                parts.append(f"{sentinel.name} names {named} (epoch {epoch})")
            except (redis.RedisError, OSError) as error:
                parts.append(f"{sentinel.name} unreachable ({error})")
        return "; ".join(parts)

    def _healthy(self) -> bool:
        primary = self.primary()
        if primary.info("replication").get("role") != "master":
            return False
        replica = self.replica()
        info = replica.info("replication")
        if info.get("role") != "slave" or info.get("master_link_status") != "up":
            return False
        if int(str(info.get("master_port"))) != primary.port:
            return False
        if not _acknowledged(primary):
            return False
        # every sentinel agrees, and knows the replica (it may be promoted)
        for sentinel in self.sentinels:
            with sentinel.client() as client:
                addr = client.sentinel_get_master_addr_by_name(self.service)
                if not addr or int(addr[1]) != primary.port:
                    return False
                replicas = client.sentinel_slaves(self.service)
                if not any(
                    int(r["port"]) == replica.port and "s_down" not in r["flags"] for r in replicas
                ):
                    return False
                masters = client.sentinel_master(self.service)
                if int(masters.get("num-other-sentinels", 0)) < len(self.sentinels) - 1:
                    return False
        return True

    def wait_healthy(self, timeout: float = 30.0) -> None:
        _wait_for(self._healthy, "a healthy Sentinel topology", timeout)

    def wait_failover(self, old_primary_port: int, timeout: float = 20.0) -> int:
        """Block until the sentinels name another primary and it accepts writes."""

        def moved() -> bool:
            port = self.primary_port()
            if port == old_primary_port:
                return False
            node = next(n for n in self.nodes if n.port == port)
            return node.info("replication").get("role") == "master"

        _wait_for(moved, "a Sentinel failover", timeout)
        return self.primary_port()

    def hold_still(self) -> None:
        """No failover but the one a test makes: a primary stalled past DOWN_AFTER_MS
        by a loaded machine would be replaced, and until Sentinel demotes it both nodes
        accept writes (Sentinel's own split brain, not what a test asks about)."""
        self._down_after(60_000)

    def _down_after(self, milliseconds: int) -> None:
        for sentinel in self.sentinels:
            with sentinel.client() as client:
                client.sentinel_set(self.service, "down-after-milliseconds", milliseconds)

    def ensure_healthy(self) -> None:
        """After a test: every process up, a killed primary back as a replica of the
        one the sentinels promoted (never the other way round: it restarts empty)."""
        for sentinel in self.sentinels:
            sentinel.ensure_running()
        self._down_after(DOWN_AFTER_MS)
        for node in self.nodes:
            if node.paused:
                node.resume()

        def named_primary_runs() -> bool:
            port = self.primary_port()
            return any(n.port == port and n.process is not None for n in self.nodes)

        _wait_for(named_primary_runs, "the sentinels to name a running primary", 20)
        primary_port = self.primary_port()
        for node in self.nodes:
            if node.process is None or node.process.poll() is not None:
                node.process = None
                node.extra = ["--replicaof", "127.0.0.1", str(primary_port)]
                node.start()
            with node.admin() as client:
                client.config_set("masterauth", "")
                # a demoted primary waits up to ~10 s for Sentinel to reconfigure it
                if node.port != primary_port and client.info("replication")["role"] == "master":
                    client.replicaof("127.0.0.1", primary_port)
        self.wait_healthy()

    def stop(self) -> None:
        for process in [*self.sentinels, *self.nodes]:
            process.stop()

    ensure_running = ensure_healthy  # what the session fixtures call


class ClusterTopology:
    """Three primaries, each with one replica (six nodes), all 16384 slots covered."""

    def __init__(self, workdir: Path) -> None:
        self.nodes = [
            RedisNode(
                workdir / f"node{i}",
                f"cluster-node{i}",
                [
                    "--cluster-enabled",
                    "yes",
                    # its own bus port: port + 10000 may be taken, or past 65535
                    "--cluster-port",
                    str(free_port()),
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    str(NODE_TIMEOUT_MS),
                    # a replica that lost its primary long ago may still be promoted
                    "--cluster-replica-validity-factor",
                    "0",
                    "--cluster-require-full-coverage",
                    "no",
                ],
            )
            for i in range(6)
        ]
        self.cli = require_binary("redis-cli", "/usr/bin/redis-cli")

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(node.address for node in self.nodes[:3])

    @property
    def addresses(self) -> list[str]:
        return [node.address for node in self.nodes]

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        subprocess.run(
            [self.cli, "--cluster", "create", *self.addresses, "--cluster-replicas", "1",
             "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        self.wait_healthy()

    def node_of_port(self, port: int) -> RedisNode:
        return next(node for node in self.nodes if node.port == port)

    def primary_of(self, key: str) -> RedisNode:
        """The node serving `key` now."""
        live = next(n for n in self.nodes if n.process is not None and not n.paused)
        with live.admin() as client:
            slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
            for start, end, primary, *_ in client.execute_command("CLUSTER", "SLOTS"):
                if int(start) <= slot <= int(end):
                    return self.node_of_port(int(primary[1]))
        raise RuntimeError(f"no node serves the slot of {key!r}")

    def _healthy(self) -> bool:
        roles = []
        for node in self.nodes:
            if node.process is None:
                return False
            with node.admin() as client:
                if "cluster_state:ok" not in client.execute_command("CLUSTER", "INFO").decode():
                    return False
                info = node.info("replication")
                roles.append(info.get("role"))
                if info.get("role") == "master" and not _acknowledged(node, _owned_key(node)):
                    return False
                if info.get("role") == "slave" and info.get("master_link_status") != "up":
                    return False
                # every node sees all six, none flagged failing
                nodes = client.execute_command("CLUSTER", "NODES").decode()
                if sum(1 for line in nodes.splitlines() if "fail" not in line.split()[2]) < 6:
                    return False
        return roles.count("master") == 3

    def wait_healthy(self, timeout: float = 30.0) -> None:
        _wait_for(self._healthy, "a healthy Redis Cluster", timeout)

    def wait_failover(self, key: str, old_port: int, timeout: float = 20.0) -> RedisNode:
        """Block until another node serves `key`'s slot and takes writes."""

        def moved() -> bool:
            node = self.primary_of(key)
            return node.port != old_port and node.info("replication").get("role") == "master"

        _wait_for(moved, "a Cluster failover", timeout)
        return self.primary_of(key)

    def ensure_healthy(self) -> None:
        """After a test: every node up (a restarted node rejoins from its nodes.conf as
        a replica of whoever took over its slots)."""
        for node in self.nodes:
            node.ensure_running()
        self.wait_healthy()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    ensure_running = ensure_healthy  # what the session fixtures call


@pytest.fixture(scope="session")
def sentinel_session(server_dir: Path) -> Iterator[SentinelTopology]:
    yield from _session_server(SentinelTopology, "sentinel", server_dir)


@pytest.fixture
def sentinel_topology(sentinel_session: SentinelTopology) -> Iterator[SentinelTopology]:
    yield from _running(sentinel_session)


@pytest.fixture(scope="session")
def cluster_session(server_dir: Path) -> Iterator[ClusterTopology]:
    yield from _session_server(ClusterTopology, "cluster", server_dir)


@pytest.fixture
def cluster_topology(cluster_session: ClusterTopology) -> Iterator[ClusterTopology]:
    yield from _running(cluster_session)
