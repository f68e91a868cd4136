"""ZooKeeper 3.8 requiring SASL (DIGEST-MD5) of every client, for
tests/test_zookeeper_sasl.py and the `zookeeper-sasl` contract kind: the users are
DigestLoginModule's in a JAAS file, and `enforce.auth.schemes=sasl` closes the session
of a client that has not authenticated with SASL (an anonymous or digest-only one)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import ZooKeeperServer, _running, _session_server

# name -> password, of the SASL users the server knows
USERS = {"locker": "sasl-locker-pw", "other": "sasl-other-pw"}


class SASLZooKeeperServer(ZooKeeperServer):
    """A standalone ZooKeeper that admits only clients authenticated with SASL as one of
    `USERS` (no plaintext identity: `srvr`, the readiness probe, needs none)."""

    name = "zookeeper-sasl"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        users = " ".join(f'user_{user}="{password}"' for user, password in USERS.items())
        self.jaas = workdir / "jaas.conf"
        login = "org.apache.zookeeper.server.auth.DigestLoginModule"
        self.jaas.write_text(f"Server {{\n  {login} required {users};\n}};\n")
        with (workdir / "zoo.cfg").open("a") as config:
            config.write(
                "authProvider.sasl=org.apache.zookeeper.server.auth.SASLAuthenticationProvider\n"
                "enforce.auth.enabled=true\n"
                "enforce.auth.schemes=sasl\n"
            )

    def command(self) -> list[str]:
        java, *options = super().command()
        return [java, f"-Djava.security.auth.login.config={self.jaas}", *options]


@pytest.fixture(scope="session")
def zookeeper_sasl_session(server_dir: Path) -> Iterator[SASLZooKeeperServer]:
    yield from _session_server(SASLZooKeeperServer, SASLZooKeeperServer.name, server_dir)


@pytest.fixture
def zookeeper_sasl(zookeeper_sasl_session: SASLZooKeeperServer) -> Iterator[SASLZooKeeperServer]:
    yield from _running(zookeeper_sasl_session)
