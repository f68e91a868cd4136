"""The servers again, serving TLS with the session's throwaway PKI (tests/tls.py), for
tests/test_tls.py. Each backend has two: one with the certificate for 127.0.0.1 and
localhost, and one whose certificate names only `wronghost` (a host-name mismatch). Each
requires a client certificate where the server can (Redis, ZooKeeper) or for a user of
its own (`certuser`: MariaDB REQUIRE X509, PostgreSQL's `cert` method); the password
users need TLS (MariaDB REQUIRE SSL, PostgreSQL `hostssl` lines only).

- Redis: `--tls-port` beside a plaintext `--port` (for a TLS client against it), and
  `tls-auth-clients yes`. Debian's redis-server is built with TLS.
- ZooKeeper 3.8: Netty's connection factory, `secureClientPort` beside the plaintext
  `clientPort`, key and trust stores as PEM files (no keytool). Debian's jar leaves
  netty-codec off its manifest's class path: without it every TLS connection dies with
  `NoClassDefFoundError: io/netty/handler/codec/ByteToMessageDecoder`.
- MariaDB: `--ssl-cert/--ssl-key/--ssl-ca`; `locks` REQUIRE SSL, `certuser` REQUIRE X509.
- PostgreSQL: `ssl=on` and only `hostssl` lines; the key is the server user's, mode 0600.
"""

from __future__ import annotations

import functools
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ports import free_port
from tests.servers import (
    MariaDBServer,
    RedisServer,
    ZooKeeperServer,
    _running,
    _session_server,
)
from tests.servers.postgresql import PostgreSQLServer
from tests.tls import CLIENT_CN, PKI, Pair

CERT_PASSWORD = "cert-user-pw"  # MariaDB's certuser: a certificate and a password


def _pair(pki: PKI, wronghost: bool) -> Pair:
    return pki.wronghost if wronghost else pki.server


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class TLSRedisServer(RedisServer):
    """redis-server on a plaintext port and a TLS port; TLS clients must present a
    certificate of the CA (`tls-auth-clients yes`, Redis's default)."""

    name = "redis-tls"

    def __init__(self, workdir: Path, *, pki: PKI, wronghost: bool = False) -> None:
        super().__init__(workdir)
        self.pki = pki
        self.pair = _pair(pki, wronghost)
        self.tls_port = free_port()

    @property
    def tls_address(self) -> str:
        return f"127.0.0.1:{self.tls_port}"

    def tls_url(self, *, ca: Path | None = None, client: bool = True, host: str = "127.0.0.1"
                ) -> str:  # fmt: skip
        """A `rediss://` URL of the TLS port: verified against `ca` (the session's CA by
        default), with the client certificate unless `client` is False."""
        query = f"ssl_ca_certs={ca or self.pki.ca}"
        if client:
            query += f"&ssl_certfile={self.pki.client.cert}&ssl_keyfile={self.pki.client.key}"
        return f"rediss://{host}:{self.tls_port}/0?{query}"

    def command(self) -> list[str]:
        return [
            *super().command(),
            "--tls-port", str(self.tls_port),
            "--tls-cert-file", str(self.pair.cert),
            "--tls-key-file", str(self.pair.key),
            "--tls-ca-cert-file", str(self.pki.ca),
            "--tls-auth-clients", "yes",
        ]  # fmt: skip

    def ready(self) -> bool:
        return super().ready() and _accepts(self.tls_port)


class TLSZooKeeperServer(ZooKeeperServer):
    """ZooKeeper with a secure client port (TLS, client certificates required) beside
    its plaintext one."""

    name = "zookeeper-tls"

    def __init__(self, workdir: Path, *, pki: PKI, wronghost: bool = False) -> None:
        super().__init__(workdir)
        self.pki = pki
        self.secure_port = free_port()
        netty = ("netty-codec", "netty-resolver", "netty-transport-native-unix-common")
        jars = [f"/usr/share/java/{jar}.jar" for jar in netty]
        missing = [jar for jar in jars if not Path(jar).exists()]
        if missing:
            pytest.fail(f"ZooKeeper's TLS needs {', '.join(missing)} (Debian's libnetty-java)",
                        pytrace=False)  # fmt: skip
        self.classpath = ":".join([self.classpath, *jars])
        with (workdir / "zoo.cfg").open("a") as config:
            config.write(
                f"secureClientPort={self.secure_port}\n"
                "secureClientPortAddress=127.0.0.1\n"
                "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n"
                f"ssl.keyStore.location={pki.keystore(_pair(pki, wronghost))}\n"
                "ssl.keyStore.type=PEM\n"
                f"ssl.trustStore.location={pki.ca}\n"
                "ssl.trustStore.type=PEM\n"
                "ssl.clientAuth=need\n"
                # the server would match each client certificate's names against the
                # client's address: client certificates name a user, not a host
                "ssl.hostnameVerification=false\n"
            )

    @property
    def tls_address(self) -> str:
        return f"127.0.0.1:{self.secure_port}"

    def ready(self) -> bool:
        return super().ready() and _accepts(self.secure_port)


class TLSMariaDBServer(MariaDBServer):
    """MariaDB with TLS: `locks` REQUIRE SSL (a password over TLS), `certuser` REQUIRE
    X509 (a password and a certificate of the CA)."""

    name = "mariadb-tls"

    def __init__(self, workdir: Path, *, pki: PKI, wronghost: bool = False) -> None:
        pair = _pair(pki, wronghost)
        super().__init__(workdir, options=[
            f"--ssl-cert={pair.cert}", f"--ssl-key={pair.key}", f"--ssl-ca={pki.ca}",
        ])  # fmt: skip
        self.pki = pki
        self._tls_users = False

    def tls_url(self, *, user: str = "locks", host: str = "127.0.0.1", query: str = "") -> str:
        password = self.password if user == "locks" else CERT_PASSWORD
        url = f"mysql+pymysql://{user}:{password}@{host}:{self.port}/locks?charset=utf8mb4"
        return f"{url}&{query}" if query else url

    def start(self, timeout: float = 30.0) -> None:
        super().start(timeout)
        if not self._tls_users:
            self.sql(
                "ALTER USER 'locks'@'127.0.0.1' REQUIRE SSL;"
                "ALTER USER 'locks'@'localhost' REQUIRE SSL;"
                f"CREATE USER IF NOT EXISTS '{CLIENT_CN}'@'127.0.0.1' "
                f"IDENTIFIED BY '{CERT_PASSWORD}' REQUIRE X509;"
                f"GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON locks.* "
                f"TO '{CLIENT_CN}'@'127.0.0.1';"
            )
            self._tls_users = True


class TLSPostgreSQLServer(PostgreSQLServer):
    """PostgreSQL with `ssl=on` and `hostssl` lines only: `locks` by password,
    `certuser` (a member of `locks`) by its certificate (the `cert` method: the CN is
    the role)."""

    name = "postgresql-tls"

    def __init__(self, workdir: Path, *, pki: PKI, wronghost: bool = False) -> None:
        self.pki = pki
        pair = _pair(pki, wronghost)
        tls = workdir / "tls"
        super().__init__(workdir, options=[
            "ssl=on",
            f"ssl_cert_file={tls / 'server.crt'}",
            f"ssl_key_file={tls / 'server.key'}",
            f"ssl_ca_file={tls / 'ca.crt'}",
        ])  # fmt: skip
        # the server reads these as its own user, and refuses a key others may read
        tls.mkdir(exist_ok=True)
        for source, target in ((pair.cert, "server.crt"), (pair.key, "server.key"),
                               (pki.ca, "ca.crt")):  # fmt: skip
            shutil.copyfile(source, tls / target)
            os.chown(tls / target, self.account.uid, self.account.gid)
            (tls / target).chmod(0o600)
        os.chown(tls, self.account.uid, self.account.gid)
        tls.chmod(0o700)
        self._cert_user = False

    def _initdb(self) -> None:
        super()._initdb()
        hba = self.datadir / "pg_hba.conf"
        hba.write_text(
            "# TYPE  DATABASE  USER      ADDRESS       METHOD\n"
            "local   all       all                     peer\n"
            f"hostssl locks     {CLIENT_CN}  127.0.0.1/32  cert\n"
            "hostssl all       all       127.0.0.1/32  scram-sha-256\n"
        )
        os.chown(hba, self.account.uid, self.account.gid)

    def tls_url(self, *, user: str = "locks", host: str = "127.0.0.1", query: str = "") -> str:
        password = f":{self.password}" if user == "locks" else ""
        url = f"postgresql+psycopg://{user}{password}@{host}:{self.port}/locks"
        return f"{url}?{query}" if query else url

    def start(self, timeout: float = 30.0) -> None:
        super().start(timeout)
        if not self._cert_user:
            self.sql(
                f"SELECT 'CREATE ROLE {CLIENT_CN} LOGIN' WHERE NOT EXISTS "
                f"(SELECT FROM pg_roles WHERE rolname = '{CLIENT_CN}') \\gexec\n"
                # the tables `locks` makes are its own: certuser acts as `locks`
                f"GRANT locks TO {CLIENT_CN};\n"
            )
            self._cert_user = True


def _tls_session(cls: Any, name: str, server_dir: Path, pki: PKI, *, wronghost: bool
                 ) -> Iterator[Any]:  # fmt: skip
    suffix = "-wronghost" if wronghost else ""
    yield from _session_server(functools.partial(cls, pki=pki, wronghost=wronghost),
                               f"{name}{suffix}", server_dir)  # fmt: skip


@pytest.fixture(scope="session")
def redis_tls_session(server_dir: Path, pki: PKI) -> Iterator[TLSRedisServer]:
    yield from _tls_session(TLSRedisServer, "redis-tls", server_dir, pki, wronghost=False)


@pytest.fixture
def redis_tls(redis_tls_session: TLSRedisServer) -> Iterator[TLSRedisServer]:
    yield from _running(redis_tls_session)


@pytest.fixture(scope="session")
def redis_tls_wronghost(server_dir: Path, pki: PKI) -> Iterator[TLSRedisServer]:
    yield from _tls_session(TLSRedisServer, "redis-tls", server_dir, pki, wronghost=True)


@pytest.fixture(scope="session")
def zookeeper_tls_session(server_dir: Path, pki: PKI) -> Iterator[TLSZooKeeperServer]:
    yield from _tls_session(TLSZooKeeperServer, "zookeeper-tls", server_dir, pki,
                            wronghost=False)  # fmt: skip


@pytest.fixture
def zookeeper_tls(zookeeper_tls_session: TLSZooKeeperServer) -> Iterator[TLSZooKeeperServer]:
    yield from _running(zookeeper_tls_session)


@pytest.fixture(scope="session")
def zookeeper_tls_wronghost(server_dir: Path, pki: PKI) -> Iterator[TLSZooKeeperServer]:
    yield from _tls_session(TLSZooKeeperServer, "zookeeper-tls", server_dir, pki,
                            wronghost=True)  # fmt: skip


@pytest.fixture(scope="session")
def mariadb_tls_session(server_dir: Path, pki: PKI) -> Iterator[TLSMariaDBServer]:
    yield from _tls_session(TLSMariaDBServer, "mariadb-tls", server_dir, pki, wronghost=False)


@pytest.fixture
def mariadb_tls(mariadb_tls_session: TLSMariaDBServer) -> Iterator[TLSMariaDBServer]:
    yield from _running(mariadb_tls_session)


@pytest.fixture(scope="session")
def mariadb_tls_wronghost(server_dir: Path, pki: PKI) -> Iterator[TLSMariaDBServer]:
    yield from _tls_session(TLSMariaDBServer, "mariadb-tls", server_dir, pki, wronghost=True)


@pytest.fixture(scope="session")
def postgresql_tls_session(server_dir: Path, pki: PKI) -> Iterator[TLSPostgreSQLServer]:
    yield from _tls_session(TLSPostgreSQLServer, "postgresql-tls", server_dir, pki,
                            wronghost=False)  # fmt: skip


@pytest.fixture
def postgresql_tls(postgresql_tls_session: TLSPostgreSQLServer) -> Iterator[TLSPostgreSQLServer]:
    yield from _running(postgresql_tls_session)


@pytest.fixture(scope="session")
def postgresql_tls_wronghost(server_dir: Path, pki: PKI) -> Iterator[TLSPostgreSQLServer]:
    yield from _tls_session(TLSPostgreSQLServer, "postgresql-tls", server_dir, pki,
                            wronghost=True)  # fmt: skip
