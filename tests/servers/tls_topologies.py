"""Redis Sentinel and Redis Cluster serving TLS, for the TLS forms of the topologies in
tests/test_tls.py: small (a primary and one sentinel; three primaries without
replicas), since what is tested is the handshake, not failover. Every process keeps a
plaintext port for the tests' own checks; clients of the lock speak TLS only.

- Sentinel: the primary's `--tls-port`; the sentinel's `tls-port`, and
  `tls-replication yes` so it watches the primary over TLS (with the session's client
  certificate: the primary requires one). It names the primary's TLS port.
- Cluster: `--tls-cluster yes`, so the bus is TLS and a client connected over TLS is
  told the nodes' TLS ports (`CLUSTER SLOTS`); made with `redis-cli --tls --cluster
  create`.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ports import free_port
from tests.servers import _session_server, require_binary
from tests.servers.redis_topologies import RedisNode, SentinelProcess, _wait_for
from tests.tls import PKI


def _tls_options(pki: PKI) -> list[str]:
    return [
        "--tls-cert-file", str(pki.server.cert),
        "--tls-key-file", str(pki.server.key),
        "--tls-ca-cert-file", str(pki.ca),
        "--tls-client-cert-file", str(pki.client.cert),
        "--tls-client-key-file", str(pki.client.key),
        "--tls-auth-clients", "yes",
        "--tls-replication", "yes",
    ]  # fmt: skip


class TLSNode(RedisNode):
    """A data node with a TLS port beside its plaintext one."""

    def __init__(self, workdir: Path, name: str, pki: PKI, extra: list[str] | None = None
                 ) -> None:  # fmt: skip
        self.tls_port = free_port()
        options = ["--tls-port", str(self.tls_port), *_tls_options(pki), *(extra or [])]
        super().__init__(workdir, name, options)

    @property
    def tls_address(self) -> str:
        return f"127.0.0.1:{self.tls_port}"


class TLSSentinel(SentinelProcess):
    def __init__(self, workdir: Path, name: str, service: str, pki: PKI) -> None:
        super().__init__(workdir, name, service)
        self.pki = pki
        self.tls_port = free_port()

    def command(self) -> list[str]:
        command = super().command()
        options = _tls_options(self.pki)
        lines = [f"{options[i].lstrip('-')} {options[i + 1]}" for i in range(0, len(options), 2)]
        with (self.workdir / "sentinel.conf").open("a") as conf:
            conf.write(f"tls-port {self.tls_port}\n" + "\n".join(lines) + "\n")
        return command

    @property
    def tls_address(self) -> str:
        return f"127.0.0.1:{self.tls_port}"


class TLSSentinelTopology:
    """One primary and one sentinel (quorum 1), both over TLS, serving `locks`."""

    service = "locks"

    def __init__(self, workdir: Path, pki: PKI) -> None:
        self.pki = pki
        self.primary = TLSNode(workdir / "primary", "redis-tls-primary", pki)
        self.sentinel = TLSSentinel(workdir / "sentinel", "sentinel-tls", self.service, pki)
        self.name = "redis-sentinel-tls"

    def url(self, *, ca: Path | None = None, client: bool = True) -> str:
        query = f"ssl_ca_certs={ca or self.pki.ca}"
        if client:
            query += f"&ssl_certfile={self.pki.client.cert}&ssl_keyfile={self.pki.client.key}"
        return f"rediss+sentinel://{self.sentinel.tls_address}/{self.service}/0?{query}"

    def start(self) -> None:
        self.primary.start()
        # quorum 1 of 1: the sentinel alone may act (no failover is tested here)
        self.sentinel.primary_port = self.primary.tls_port
        self.sentinel.start()
        _wait_for(self._named, "a sentinel naming the TLS primary", 30)

    def _named(self) -> bool:
        with self.sentinel.client() as client:
            named = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
        return bool(named) and int(named[1]) == self.primary.tls_port

    def ensure_running(self) -> None:
        self.primary.ensure_running()
        self.sentinel.ensure_running()

    def stop(self) -> None:
        self.sentinel.stop()
        self.primary.stop()


class TLSClusterTopology:
    """Three primaries, all 16384 slots covered, TLS on the bus and for clients."""

    def __init__(self, workdir: Path, pki: PKI) -> None:
        self.pki = pki
        self.name = "redis-cluster-tls"
        cluster = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                   "--tls-cluster", "yes"]  # fmt: skip
        self.nodes = [
            TLSNode(workdir / f"node{i}", f"node{i}", pki, [*cluster, "--cluster-port", str(port)])
            for i, port in enumerate(free_port() for _ in range(3))
        ]
        self.cli = require_binary("redis-cli", "/usr/bin/redis-cli")

    def url(self, *, ca: Path | None = None, client: bool = True) -> str:
        query = f"ssl_ca_certs={ca or self.pki.ca}"
        if client:
            query += f"&ssl_certfile={self.pki.client.cert}&ssl_keyfile={self.pki.client.key}"
        hosts = ",".join(node.tls_address for node in self.nodes)
        return f"rediss+cluster://{hosts}?{query}"

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        subprocess.run(
            [self.cli, "--tls", "--cacert", str(self.pki.ca), "--cert", str(self.pki.client.cert),
             "--key", str(self.pki.client.key), "--cluster", "create",
             *(node.tls_address for node in self.nodes), "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        _wait_for(self._healthy, "a healthy TLS Redis Cluster", 30)

    def _healthy(self) -> bool:
        for node in self.nodes:
            with node.admin() as client:
                if "cluster_state:ok" not in client.execute_command("CLUSTER", "INFO").decode():
                    return False
        return True

    def ensure_running(self) -> None:
        for node in self.nodes:
            node.ensure_running()
        _wait_for(self._healthy, "a healthy TLS Redis Cluster", 30)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


@pytest.fixture(scope="session")
def redis_sentinel_tls(server_dir: Path, pki: PKI) -> Iterator[TLSSentinelTopology]:
    yield from _session_server(lambda path: TLSSentinelTopology(path, pki), "sentinel-tls",
                               server_dir)  # fmt: skip


@pytest.fixture(scope="session")
def redis_cluster_tls(server_dir: Path, pki: PKI) -> Iterator[TLSClusterTopology]:
    yield from _session_server(lambda path: TLSClusterTopology(path, pki), "cluster-tls",
                               server_dir)  # fmt: skip
