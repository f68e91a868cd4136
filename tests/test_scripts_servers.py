"""scripts/servers and compose/: the local servers users start, and the config that points
at them.

The slow test runs `scripts/servers start` for real on free ports in a temp dir, checks
each server the way the library uses it (and that the database user may only touch rows),
then `status` and `stop`. The fast ones keep compose/docker-compose.yml, compose/locks.toml,
compose/init.sql and the script's default ports from drifting apart.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pymysql  # type: ignore[import-untyped]
import pytest
import redis
import sqlalchemy as sa
import yaml  # type: ignore[import-untyped]
from kazoo.client import KazooClient
from sqlalchemy.schema import CreateTable

from locks.backends import DatabaseProvider, RedisHashProvider, ZooKeeperProvider
from locks.config import Registry, from_config
from locks.fallback.scenarios import PRESETS
from locks.provider import LockProvider
from tests.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "servers"
COMPOSE = ROOT / "compose" / "docker-compose.yml"
TOML = ROOT / "compose" / "locks.toml"
INIT_SQL = ROOT / "compose" / "init.sql"
LOCKS_CLI = Path(sys.executable).parent / "locks"  # the console script of this venv

# server name in scripts/servers -> (compose service, backend in locks.toml, port variable)
SERVERS = {
    "redis": ("redis", "redis", "LOCKS_REDIS_PORT"),
    "zookeeper": ("zookeeper", "zk", "LOCKS_ZK_PORT"),
    "mariadb": ("mysql", "db", "LOCKS_MYSQL_PORT"),
}
CONTAINER_PORTS = {"redis": 6379, "zookeeper": 2181, "mysql": 3306}


# -- what the files say -------------------------------------------------------------------


def toml_addresses() -> dict[str, tuple[str, int]]:
    """Backend name in compose/locks.toml -> (host, port) it connects to."""
    backends = tomllib.loads(TOML.read_text())["backends"]
    redis_url = urlsplit(backends["redis"]["url"])
    zk_host, _, zk_port = backends["zk"]["hosts"].partition(":")
    db_url = sa.engine.make_url(backends["db"]["url"])
    assert redis_url.hostname and redis_url.port and db_url.host and db_url.port
    return {
        "redis": (redis_url.hostname, redis_url.port),
        "zk": (zk_host, int(zk_port)),
        "db": (db_url.host, db_url.port),
    }


def compose_ports() -> dict[str, tuple[str, int, int]]:
    """Service in compose/docker-compose.yml -> (host address, host port, container port)."""
    services: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())["services"]
    published = {}
    for service, spec in services.items():
        (mapping,) = spec["ports"]  # one published port each
        address, host_port, container_port = str(mapping).split(":")
        published[service] = (address, int(host_port), int(container_port))
    return published


def run_script(command: str, env: dict[str, str], timeout: float = 90) -> str:
    done = subprocess.run(
        [str(SCRIPT), command],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == (3 if command == "status" and "stopped" in done.stdout else 0), (
        f"scripts/servers {command} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    )
    return done.stdout


def status_ports(output: str) -> dict[str, tuple[str, int]]:
    """`scripts/servers status` lines -> server name -> (state, port)."""
    found = {}
    for line in output.splitlines():
        match = re.match(r"(\w+)\s+(running|stopped)\s+127\.0\.0\.1:(\d+)", line)
        assert match, f"unexpected status line {line!r}"
        found[match[1]] = (match[2], int(match[3]))
    return found


# -- fast: the files agree ----------------------------------------------------------------


def test_compose_toml_and_script_name_the_same_ports(tmp_path: Path) -> None:
    addresses = toml_addresses()
    published = compose_ports()
    assert set(published) == set(CONTAINER_PORTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKS_")}
    env["LOCKS_SERVERS_DIR"] = str(tmp_path / "never-started")
    defaults = status_ports(run_script("status", env))  # the script's default ports
    assert set(defaults) == set(SERVERS)
    for server, (service, backend, _) in SERVERS.items():
        address, host_port, container_port = published[service]
        assert address == "127.0.0.1", f"compose publishes {service} beyond loopback"
        assert container_port == CONTAINER_PORTS[service]
        assert addresses[backend] == ("127.0.0.1", host_port), (service, backend)
        assert defaults[server] == ("stopped", host_port), server
    assert not (tmp_path / "never-started").exists()  # status writes nothing


def test_compose_files_agree_on_the_database() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())["services"]
    mysql = compose["mysql"]
    assert mysql["image"] == "mysql:8.0"
    assert mysql["environment"]["MYSQL_ROOT_PASSWORD"]
    # MYSQL_USER would be granted ALL on the database: init.sql makes the user instead
    assert "MYSQL_USER" not in mysql["environment"]
    assert "./init.sql:/docker-entrypoint-initdb.d/init.sql:ro" in mysql["volumes"]
    assert all("healthcheck" in spec for spec in compose.values())
    url = sa.engine.make_url(tomllib.loads(TOML.read_text())["backends"]["db"]["url"])
    assert (url.username, url.password, url.database) == ("locks", "locks", "locks")
    assert mysql["environment"]["MYSQL_DATABASE"] == url.database
    init = INIT_SQL.read_text()
    assert "CREATE USER IF NOT EXISTS 'locks'@'%' IDENTIFIED BY 'locks';" in init
    assert "GRANT SELECT, INSERT, UPDATE, DELETE ON locks.locks TO 'locks'@'%';" in init


def test_compose_toml_passes_locks_check() -> None:
    done = subprocess.run(
        [str(LOCKS_CLI), "check", str(TOML)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    registry = from_config(TOML)
    try:
        assert registry.scenarios == ["demo", *PRESETS]
        assert list(registry.chain("demo").tiers) == ["redis", "zk", "db"]
    finally:
        registry.close()


# -- slow: the servers, for real ----------------------------------------------------------


@dataclass
class Servers:
    dir: Path
    env: dict[str, str]
    ports: dict[str, int]  # scripts/servers name -> port

    @property
    def socket(self) -> Path:
        return self.dir / "mariadb.sock"

    def root_sql(self, sql: str, *, comments: bool = False) -> str:
        """Run `sql` as MariaDB's root through the Unix socket, as the mysql image runs
        its init files; returns the output (tab-separated, no headers)."""
        done = subprocess.run(
            ["mariadb", "--no-defaults", f"--socket={self.socket}", "-uroot", "-N", "-B",
             *(["--comments"] if comments else [])],
            input=sql, capture_output=True, text=True, check=True, timeout=30,
        )  # fmt: skip
        return done.stdout.strip()


def distinct_free_ports(count: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(free_port())
    return sorted(ports)


def port_closed(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return False
    except OSError:
        return True


@pytest.fixture
def servers() -> Iterator[Servers]:
    # a short path: a Unix socket path must stay under 108 bytes
    with tempfile.TemporaryDirectory(prefix="locks-script-servers-") as path:
        servers_dir = Path(path) / "s"
        ports = dict(zip(SERVERS, distinct_free_ports(len(SERVERS)), strict=True))
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKS_")}
        env["LOCKS_SERVERS_DIR"] = str(servers_dir)
        env["LOCKS_SERVERS_TIMEOUT"] = "45"
        for name, port in ports.items():
            env[SERVERS[name][2]] = str(port)
        pids: dict[str, int] = {}
        try:
            done = subprocess.run(
                [str(SCRIPT), "start"],
                env=env,
                check=False,
                capture_output=True,
                text=True,
                timeout=90,
            )
            for name in SERVERS:  # whatever started, so that it is stopped below
                pid_file = servers_dir / f"{name}.pid"
                if pid_file.exists():
                    pids[name] = int(pid_file.read_text())
            assert done.returncode == 0, done.stdout + done.stderr
            for name, port in ports.items():
                assert f"{name}: started on 127.0.0.1:{port}" in done.stdout, done.stdout
            yield Servers(servers_dir, env, ports)
        finally:
            subprocess.run(
                [str(SCRIPT), "stop"], env=env, check=False, capture_output=True, timeout=120
            )
            for name, pid in pids.items():  # a straggler `stop` missed: ours if it runs
                try:  # the command `start` gave it
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
                except OSError:
                    continue
                if str(servers_dir) in cmdline or f"127.0.0.1:{ports[name]}" in cmdline:
                    os.kill(pid, signal.SIGKILL)


def compose_registry(servers: Servers, tmp_path: Path) -> Registry:
    """compose/locks.toml as users load it, pointed at the ports the servers got."""
    data = tomllib.loads(TOML.read_text())
    default_ports = {backend: port for backend, (_, port) in toml_addresses().items()}
    for name, (_, backend, _) in SERVERS.items():
        spec = data["backends"][backend]
        key = "hosts" if backend == "zk" else "url"
        old = f"127.0.0.1:{default_ports[backend]}"
        assert old in spec[key]
        spec[key] = spec[key].replace(old, f"127.0.0.1:{servers.ports[name]}")
    data["switch"]["file"] = str(tmp_path / "switch.toml")
    return from_config(data)


def normalized(ddl: str) -> str:
    return re.sub(r"\s+", "", ddl).replace("locks.locks", "locks")


@pytest.mark.slow
def test_start_serves_the_library_then_status_and_stop(servers: Servers, tmp_path: Path) -> None:
    check_clients(servers.ports)
    check_library(servers, tmp_path)
    check_init_sql(servers)
    check_status_start_again_and_stop(servers)


def check_clients(ports: dict[str, int]) -> None:
    """Each server answers its own client; the database user may touch rows only."""
    client = redis.Redis(host="127.0.0.1", port=ports["redis"], socket_timeout=5)
    try:
        assert client.ping() is True
    finally:
        client.close()

    zk = KazooClient(hosts=f"127.0.0.1:{ports['zookeeper']}", timeout=10)
    zk.start(timeout=15)
    try:
        assert zk.get_children("/") is not None
        assert zk.connected
    finally:
        zk.stop()
        zk.close()

    db = pymysql.connect(
        host="127.0.0.1", port=ports["mariadb"], user="locks", password="locks",
        database="locks", ssl_disabled=True, connect_timeout=5,
    )  # fmt: skip
    try:
        with db.cursor() as cursor:
            cursor.execute(
                "SELECT column_name, column_type, is_nullable, collation_name"
                " FROM information_schema.columns WHERE table_schema = 'locks'"
                " AND table_name = 'locks' ORDER BY ordinal_position"
            )
            columns = [tuple(row) for row in cursor.fetchall()]
            # owner and token take the utf8mb4 default, whichever this MariaDB has
            assert columns[1][3].startswith("utf8mb4_") and columns[2][3] == columns[1][3]
            assert [(n, t, null, c if n == "name" else None) for n, t, null, c in columns] == [
                ("name", "varchar(255)", "NO", "utf8mb4_nopad_bin"),
                ("owner", "varchar(64)", "NO", None),
                ("token", "varchar(64)", "NO", None),
                ("depth", "int(11)", "NO", None),
                ("fence", "bigint(20)", "NO", None),
                ("expires_at", "bigint(20)", "NO", None),
                ("acquired_at", "bigint(20)", "NO", None),
            ]
            cursor.execute("SHOW GRANTS")
            grants = [row[0] for row in cursor.fetchall()]
            assert grants[0].startswith("GRANT USAGE ON *.* TO `locks`@`127.0.0.1`")
            assert grants[1:] == [
                "GRANT SELECT, INSERT, UPDATE, DELETE ON `locks`.`locks` TO `locks`@`127.0.0.1`"
            ]
            for ddl in ("CREATE TABLE other (x INT)", "CREATE TABLE IF NOT EXISTS locks (x INT)"):
                with pytest.raises(pymysql.err.OperationalError) as denied:
                    cursor.execute(ddl)
                assert denied.value.args[0] == 1142  # CREATE command denied
    finally:
        db.close()


def check_library(servers: Servers, tmp_path: Path) -> None:
    """The library, configured by compose/locks.toml: acquire + release on every server."""
    registry = compose_registry(servers, tmp_path)
    try:
        expected = {"redis": RedisHashProvider, "zk": ZooKeeperProvider, "db": DatabaseProvider}
        for backend, cls in expected.items():
            provider: LockProvider = registry.backend(backend)
            assert isinstance(provider, cls)
            lease = provider.acquire("scripts-servers:锁", ttl=10, wait=5)
            assert lease is not None, backend
            assert lease.backend == backend
            assert provider.is_held(lease)
            provider.release(lease)
            again = provider.acquire("scripts-servers:锁", ttl=10, wait=0)
            assert again is not None, f"{backend}: release left the lock held"
            provider.release(again)
        with registry.lock("demo", "scripts-servers:demo", ttl=10, wait=5) as lease:
            assert lease.backend == "redis"
    finally:
        registry.close()


def check_status_start_again_and_stop(servers: Servers) -> None:
    ports = servers.ports
    assert status_ports(run_script("status", servers.env)) == {
        name: ("running", port) for name, port in ports.items()
    }
    again = run_script("start", servers.env)  # idempotent
    for name, port in ports.items():
        assert f"{name}: already running on 127.0.0.1:{port}" in again, again

    stopped = run_script("stop", servers.env)
    for name in SERVERS:
        assert f"{name}: stopped" in stopped, stopped
    for name, port in ports.items():
        assert port_closed(port), f"{name} still listens on {port}"
    assert status_ports(run_script("status", servers.env)) == {
        name: ("stopped", port) for name, port in ports.items()
    }
    assert run_script("stop", servers.env).count("not running") == len(SERVERS)


def check_init_sql(servers: Servers) -> None:
    """compose/init.sql on MariaDB (as far as MariaDB takes MySQL 8's syntax): run as the
    mysql image runs it, it makes the same table as scripts/servers and as
    `DatabaseProvider.create_table()`, and a user with DML on it only. Its MySQL 8
    statement is the provider's MySQL 8 DDL."""
    made_by_script = servers.root_sql("SHOW CREATE TABLE locks.locks")
    servers.root_sql("DROP TABLE locks.locks")
    chosen = servers.root_sql(INIT_SQL.read_text() + "\nSELECT @locks_create_table;\n",
                              comments=True)  # fmt: skip
    assert servers.root_sql("SHOW CREATE TABLE locks.locks") == made_by_script
    servers.root_sql(INIT_SQL.read_text())  # again, as by hand (comments stripped): idempotent
    assert servers.root_sql("SHOW GRANTS FOR 'locks'@'%'").splitlines()[1:] == [
        "GRANT SELECT, INSERT, UPDATE, DELETE ON `locks`.`locks` TO `locks`@`%`"
    ]
    servers.root_sql("DROP USER 'locks'@'%'")

    root_url = f"mysql+pymysql://root@localhost/locks?unix_socket={servers.socket}&charset=utf8mb4"
    provider = DatabaseProvider(root_url, table="locks_from_provider")
    try:
        provider.create_table()
        mariadb_ddl = CreateTable(provider.table(), if_not_exists=True).compile(
            dialect=provider.engine.dialect
        )
        made_by_provider = servers.root_sql("SHOW CREATE TABLE locks.locks_from_provider")
        servers.root_sql("DROP TABLE locks.locks_from_provider")
    finally:
        provider.close()
    assert made_by_provider.replace("locks_from_provider", "locks") == made_by_script
    assert normalized(chosen) == normalized(
        str(mariadb_ddl).replace("locks_from_provider", "locks")
    )

    # MySQL 8 (not reachable here): the same statement with MySQL's collation
    mysql8 = DatabaseProvider("mysql+pymysql://locks:locks@127.0.0.1:1/locks", create_table=False)
    try:
        mysql8_ddl = CreateTable(mysql8.table(), if_not_exists=True).compile(
            dialect=mysql8.engine.dialect
        )
    finally:
        mysql8.close()
    assert "'utf8mb4_nopad_bin', 'utf8mb4_0900_bin'" in INIT_SQL.read_text()
    assert normalized(chosen.replace("utf8mb4_nopad_bin", "utf8mb4_0900_bin")) == normalized(
        str(mysql8_ddl)
    )
