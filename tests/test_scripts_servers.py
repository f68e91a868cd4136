"""scripts/servers and compose/: the local servers users start, and the configs that point
at them.

The slow tests run `scripts/servers start` for real on free ports in a temp dir: the four
single servers, checked the way the library uses them (and that the database users may only
touch rows), and each topology (sentinel, cluster, ensemble, replica), checked the way a
lock server's client uses it; then `status` and `stop`. The fast ones keep
compose/docker-compose.yml, compose/locks.toml, compose/init.sql,
compose/postgres-init.sql, the topology compose files, compose/topologies.toml and the
script's default ports from drifting apart.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pymysql  # type: ignore[import-untyped]
import pytest
import redis
import redis.cluster
import sqlalchemy as sa
import yaml  # type: ignore[import-untyped]
from kazoo.client import KazooClient
from sqlalchemy.schema import CreateTable

from locks.backends import DatabaseProvider, RedisHashProvider, ZooKeeperProvider
from locks.config import Registry, from_config
from locks.fallback.scenarios import PRESETS
from locks.provider import LockProvider
from tests.ports import free_port
from tests.servers.postgresql import Account, postgresql_bindir

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "servers"
COMPOSE = ROOT / "compose" / "docker-compose.yml"
TOML = ROOT / "compose" / "locks.toml"
INIT_SQL = ROOT / "compose" / "init.sql"
PG_INIT_SQL = ROOT / "compose" / "postgres-init.sql"
LOCKS_CLI = Path(sys.executable).parent / "locks"  # the console script of this venv

# server name in scripts/servers -> (compose service, backend in locks.toml, port variable)
SERVERS = {
    "redis": ("redis", "redis", "LOCKS_REDIS_PORT"),
    "zookeeper": ("zookeeper", "zk", "LOCKS_ZK_PORT"),
    "mariadb": ("mysql", "db", "LOCKS_MYSQL_PORT"),
    "postgresql": ("postgres", "pg", "LOCKS_PG_PORT"),
}
CONTAINER_PORTS = {"redis": 6379, "zookeeper": 2181, "mysql": 3306, "postgres": 5432}

TOPOLOGIES_TOML = ROOT / "compose" / "topologies.toml"
REDIS: Any = redis  # its Sentinel and cluster helpers carry no annotations
# topology -> scripts/servers server -> (port variable, default port)
TOPOLOGIES: dict[str, dict[str, tuple[str, int]]] = {
    "sentinel": {
        "sentinel-primary": ("LOCKS_SENTINEL_PRIMARY_PORT", 6380),
        "sentinel-replica": ("LOCKS_SENTINEL_REPLICA_PORT", 6381),
        **{f"sentinel-{n}": (f"LOCKS_SENTINEL_{n}_PORT", 26378 + n) for n in (1, 2, 3)},
    },
    "cluster": {f"cluster-{n}": (f"LOCKS_CLUSTER_{n}_PORT", 6999 + n) for n in range(1, 7)},
    "ensemble": {f"ensemble-{n}": (f"LOCKS_ENSEMBLE_{n}_PORT", 2190 + n) for n in (1, 2, 3)},
    "replica": {"mariadb-replica": ("LOCKS_MYSQL_REPLICA_PORT", 3307)},
}
# the other ports a server binds, each with its variable
EXTRA_PORTS = {
    **{f"cluster-{n}": [f"LOCKS_CLUSTER_{n}_BUS_PORT"] for n in range(1, 7)},
    **{
        f"ensemble-{n}": [f"LOCKS_ENSEMBLE_{n}_QUORUM_PORT", f"LOCKS_ENSEMBLE_{n}_ELECTION_PORT"]
        for n in (1, 2, 3)
    },
}
# the backends of compose/topologies.toml, exactly as the library's topology support reads them
TOPOLOGY_BACKENDS: dict[str, dict[str, Any]] = {
    "sentinel": {
        "type": "redis-hash",
        "sentinels": ["127.0.0.1:26379", "127.0.0.1:26380", "127.0.0.1:26381"],
        "service": "locks",
        "sync_replicas": 1,
    },
    "cluster": {
        "type": "redis",
        "cluster_nodes": ["127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"],
    },
    "ensemble": {"type": "zookeeper", "hosts": "127.0.0.1:2191,127.0.0.1:2192,127.0.0.1:2193"},
    "replica": {"type": "database", "url": "mysql+pymysql://locks:locks@127.0.0.1:3307/locks"},
}


# -- what the files say -------------------------------------------------------------------


def start_servers(
    args: list[str],
    env: dict[str, str],
    servers_dir: Path,
    ports: dict[str, int],
    pids: dict[str, int],
) -> subprocess.CompletedProcess[str]:
    """`scripts/servers start ARGS`, checked: each server in `ports` said it started on its
    port. The pid of whatever started is put in `pids` first, so a caller stops it even
    when the start failed."""
    done = subprocess.run(
        [str(SCRIPT), "start", *args], env=env, check=False, capture_output=True, text=True,
        timeout=90,
    )  # fmt: skip
    for name in ports:
        pid_file = servers_dir / f"{name}.pid"
        if pid_file.exists():
            pids[name] = int(pid_file.read_text())
    assert done.returncode == 0, done.stdout + done.stderr
    for name, port in ports.items():
        assert f"{name}: started on 127.0.0.1:{port}" in done.stdout, done.stdout
    return done


def toml_addresses() -> dict[str, tuple[str, int]]:
    """Backend name in compose/locks.toml -> (host, port) it connects to."""
    backends = tomllib.loads(TOML.read_text())["backends"]
    redis_url = urlsplit(backends["redis"]["url"])
    zk_host, _, zk_port = backends["zk"]["hosts"].partition(":")
    db_url = sa.engine.make_url(backends["db"]["url"])
    pg_url = sa.engine.make_url(backends["pg"]["url"])
    assert redis_url.hostname and redis_url.port and db_url.host and db_url.port
    assert pg_url.host and pg_url.port
    return {
        "redis": (redis_url.hostname, redis_url.port),
        "zk": (zk_host, int(zk_port)),
        "db": (db_url.host, db_url.port),
        "pg": (pg_url.host, pg_url.port),
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


def run_script(command: str, env: dict[str, str], *topologies: str, timeout: float = 90) -> str:
    done = subprocess.run(
        [str(SCRIPT), command, *topologies],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == (3 if command == "status" and "stopped" in done.stdout else 0), (
        f"scripts/servers {command} {' '.join(topologies)} exited {done.returncode}:\n"
        f"{done.stdout}{done.stderr}"
    )
    return done.stdout


def status_ports(output: str) -> dict[str, tuple[str, int]]:
    """`scripts/servers status` lines -> server name -> (state, port)."""
    found = {}
    for line in output.splitlines():
        match = re.match(r"([\w-]+)\s+(running|stopped)\s+127\.0\.0\.1:(\d+)", line)
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


# the lock table as DatabaseProvider.table() makes it on PostgreSQL: information_schema's
# column_name, data_type, character_maximum_length, is_nullable, in order
PG_COLUMNS = [
    ("name", "character varying", 255, "NO"),
    ("owner", "character varying", 64, "NO"),
    ("token", "character varying", 64, "NO"),
    ("depth", "integer", None, "NO"),
    ("fence", "bigint", None, "NO"),
    ("expires_at", "bigint", None, "NO"),
    ("acquired_at", "bigint", None, "NO"),
]


def test_compose_files_agree_on_postgresql() -> None:
    """docker-compose.yml's postgres runs compose/postgres-init.sql (which scripts/servers
    runs too), with the database, role and password compose/locks.toml names; its table is
    the provider's."""
    postgres = yaml.safe_load(COMPOSE.read_text())["services"]["postgres"]
    assert postgres["image"] == "postgres:15"
    assert postgres["environment"]["POSTGRES_PASSWORD"]
    # POSTGRES_USER would be the superuser: postgres-init.sql makes the role instead
    assert "POSTGRES_USER" not in postgres["environment"]
    assert postgres["volumes"] == ["./postgres-init.sql:/docker-entrypoint-initdb.d/init.sql:ro"]
    assert "PGPASSWORD=locks psql -h 127.0.0.1 -U locks -d locks" in str(
        postgres["healthcheck"]["test"]
    )
    url = sa.engine.make_url(tomllib.loads(TOML.read_text())["backends"]["pg"]["url"])
    assert url.drivername == "postgresql+psycopg"  # the `postgresql` extra's driver
    assert (url.username, url.password, url.database) == ("locks", "locks", "locks")
    assert postgres["environment"]["POSTGRES_DB"] == url.database
    init = PG_INIT_SQL.read_text()
    assert "CREATE ROLE locks LOGIN PASSWORD 'locks';" in init
    assert "GRANT SELECT, INSERT, UPDATE, DELETE ON public.locks TO locks;" in init
    assert "compose/postgres-init.sql" in SCRIPT.read_text()
    assert re.search(r"^db_password=locks\b", SCRIPT.read_text(), re.MULTILINE)

    provider = DatabaseProvider(str(url), create_table=False)  # compiles, connects nothing
    try:
        ddl = str(CreateTable(provider.table(), if_not_exists=True).compile(
            dialect=provider.engine.dialect
        ))  # fmt: skip
    finally:
        provider.close()
    statement = re.search(r"CREATE TABLE IF NOT EXISTS public\.locks \(.*?\n\);", init, re.DOTALL)
    assert statement, "postgres-init.sql creates no lock table"
    without_comments = re.sub(r"--[^\n]*", "", statement[0]).rstrip(";")
    assert normalized(without_comments.replace("public.locks", "locks")) == normalized(ddl)


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


def topology_services(topology: str) -> dict[str, Any]:
    """The services of compose/<topology>.yml."""
    services: dict[str, Any] = yaml.safe_load((ROOT / "compose" / f"{topology}.yml").read_text())[
        "services"
    ]
    return services


def published(spec: dict[str, Any]) -> list[tuple[str, int, int]]:
    """A service's published ports: (host address, host port, container port)."""
    found = []
    for mapping in spec.get("ports", []):
        address, host_port, container_port = str(mapping).split(":")
        found.append((address, int(host_port), int(container_port)))
    return found


def command_text(spec: dict[str, Any]) -> str:
    command = spec["command"]
    return command if isinstance(command, str) else " ".join(map(str, command))


def test_script_topologies_and_compose_files_name_the_same_ports(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKS_")}
    env["LOCKS_SERVERS_DIR"] = str(tmp_path / "never-started")
    defaults = status_ports(run_script("status", env, *TOPOLOGIES))  # the script's defaults
    assert defaults == {
        name: ("stopped", port)
        for servers in TOPOLOGIES.values()
        for name, (_, port) in servers.items()
    }
    everything = status_ports(run_script("status", env, "all"))
    assert list(everything) == [*SERVERS, *defaults]
    assert status_ports(run_script("status", env, "single")) == status_ports(
        run_script("status", env)
    )
    assert not (tmp_path / "never-started").exists()  # status writes nothing

    project = yaml.safe_load(COMPOSE.read_text())["name"]
    for topology in ("sentinel", "cluster", "ensemble"):  # a project each: `down` is theirs
        assert yaml.safe_load((ROOT / "compose" / f"{topology}.yml").read_text())["name"] == (
            f"{project}-{topology}"
        )
    for topology, servers in TOPOLOGIES.items():
        services = topology_services(topology)
        assert all("healthcheck" in spec for name, spec in services.items() if name != "mysql")
        ports = [port for spec in services.values() for port in published(spec)]
        assert {address for address, _, _ in ports} == {"127.0.0.1"}, topology
        assert sorted(host for _, host, _ in ports) == sorted(p for _, p in servers.values())

    # Redis hands out addresses: one network namespace, the same port inside as outside
    for topology in ("sentinel", "cluster"):
        services = topology_services(topology)
        holder = services.pop(topology)
        assert all(host == inside for _, host, inside in published(holder))
        assert set(services) == set(TOPOLOGIES[topology])
        for name, spec in services.items():
            assert spec["network_mode"] == f"service:{topology}", name
            port = TOPOLOGIES[topology][name][1]
            text = command_text(spec)
            assert f"--port {port} " in text or f"port {port}\n" in text, name
            assert str(port) in str(spec["healthcheck"]["test"]), name
    sentinel = topology_services("sentinel")
    assert "--replicaof 127.0.0.1 6380" in command_text(sentinel["sentinel-replica"])
    for n in (1, 2, 3):
        assert "sentinel monitor locks 127.0.0.1 6380 2\n" in command_text(
            sentinel[f"sentinel-{n}"]
        )
    cluster = topology_services("cluster")
    create = command_text(cluster["cluster"])
    assert "--cluster-replicas 1 --cluster-yes" in create
    assert all(f"127.0.0.1:{port}" in create for _, port in TOPOLOGIES["cluster"].values())
    for n in range(1, 7):
        assert "--cluster-announce-ip 127.0.0.1" in command_text(cluster[f"cluster-{n}"])

    ensemble = topology_services("ensemble")
    assert set(ensemble) == set(TOPOLOGIES["ensemble"])
    for n in (1, 2, 3):
        spec = ensemble[f"ensemble-{n}"]
        assert published(spec) == [("127.0.0.1", 2190 + n, 2181)]
        assert spec["environment"]["ZOO_MY_ID"] == str(n)
        assert spec["environment"]["ZOO_SERVERS"].split() == [
            f"server.{m}=ensemble-{m}:2888:3888;2181" for m in (1, 2, 3)
        ]


def test_replica_compose_file_adds_to_the_single_servers() -> None:
    single = yaml.safe_load(COMPOSE.read_text())["services"]
    replica = topology_services("replica")
    assert set(replica) == {"mysql", "mysql-replica"}  # mysql: the primary, given GTIDs
    assert "command" not in single["mysql"]  # docker-compose.yml alone runs it as before
    for spec in replica.values():
        assert {"--gtid-mode=ON", "--enforce-gtid-consistency=ON"} <= set(spec["command"])
    spec = replica["mysql-replica"]
    assert spec["image"] == single["mysql"]["image"]
    assert "--read-only=ON" in spec["command"]
    assert published(spec) == [("127.0.0.1", 3307, 3306)]
    assert spec["depends_on"] == {"mysql": {"condition": "service_healthy"}}
    # replica-init.sh logs in to the primary with the replica's own root password
    assert (
        spec["environment"]["MYSQL_ROOT_PASSWORD"]
        == single["mysql"]["environment"]["MYSQL_ROOT_PASSWORD"]
    )
    assert spec["environment"]["MYSQL_DATABASE"] == single["mysql"]["environment"]["MYSQL_DATABASE"]
    mounts = [volume.split(":") for volume in spec["volumes"]]
    assert [target for _, target, _ in mounts] == [
        "/docker-entrypoint-initdb.d/1-init.sql",
        "/docker-entrypoint-initdb.d/2-replica-init.sh",
    ]
    assert all((ROOT / "compose" / source).is_file() for source, _, _ in mounts)
    assert mounts[0][0] == "./init.sql"


def test_topologies_toml_points_at_the_script_ports() -> None:
    data = tomllib.loads(TOPOLOGIES_TOML.read_text())
    assert data["backends"] == TOPOLOGY_BACKENDS
    backends = data["backends"]

    def ports(topology: str, prefix: str) -> list[int]:
        return [port for name, (_, port) in TOPOLOGIES[topology].items() if name.startswith(prefix)]

    assert backends["sentinel"]["sentinels"] == [
        f"127.0.0.1:{TOPOLOGIES['sentinel'][f'sentinel-{n}'][1]}" for n in (1, 2, 3)
    ]
    assert set(backends["cluster"]["cluster_nodes"]) <= {
        f"127.0.0.1:{port}" for port in ports("cluster", "cluster-")
    }
    assert backends["ensemble"]["hosts"] == ",".join(
        f"127.0.0.1:{port}" for port in ports("ensemble", "ensemble-")
    )
    url = sa.engine.make_url(backends["replica"]["url"])
    assert (url.host, url.port) == ("127.0.0.1", TOPOLOGIES["replica"]["mariadb-replica"][1])
    single = sa.engine.make_url(tomllib.loads(TOML.read_text())["backends"]["db"]["url"])
    assert (url.username, url.password, url.database) == (
        single.username,
        single.password,
        single.database,
    )
    used = {tier for spec in data["scenarios"].values() for tier in spec["chain"]}
    assert used == set(backends)  # every topology is in some scenario, nothing else is


def test_usage_names_every_topology(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKS_")}
    env["LOCKS_SERVERS_DIR"] = str(tmp_path / "never-started")
    for args in ([], ["start", "sentinels"], ["status", "all", "nonsense"]):
        done = subprocess.run(
            [str(SCRIPT), *args], env=env, check=False, capture_output=True, text=True
        )
        assert done.returncode == 2, args
        assert done.stderr.startswith("usage: scripts/servers start|stop|status [TOPOLOGY...]")
        for topology in (*TOPOLOGIES, "single", "all"):
            assert f"\n  {topology} " in done.stderr or f" or {topology}:" in done.stderr
    env["LOCKS_CLUSTER_3_PORT"] = "70000"
    done = subprocess.run(
        [str(SCRIPT), "status", "cluster"], env=env, check=False, capture_output=True, text=True
    )
    assert done.returncode == 1
    assert "the port for cluster-3 must be a number from 1 to 65535, got '70000'" in done.stderr
    assert not (tmp_path / "never-started").exists()


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

    @property
    def pg_home(self) -> Path:
        """PostgreSQL's dir (data dir and socket); as root, outside `dir`, linked from it."""
        return (self.dir / "postgresql").resolve()

    def pg_sql(self, sql: str, database: str = "locks") -> str:
        """Run `sql` with psql as PostgreSQL's superuser through its Unix socket, as
        scripts/servers does (as root: as the postgres user); returns the rows."""
        account = Account.for_server()
        done = subprocess.run(
            [str(postgresql_bindir() / "psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
             "-h", str(self.pg_home), "-p", str(self.ports["postgresql"]), "-U", account.name,
             "-d", database, "-f", "-"],
            input=sql, capture_output=True, text=True, check=True, timeout=30,
            cwd=self.pg_home, **account.popen_args(),
        )  # fmt: skip
        rows: str = done.stdout  # Any: the user switch's arguments hide the overload
        return rows.strip()


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
            start_servers([], env, servers_dir, ports, pids)
            yield Servers(servers_dir, env, ports)
        finally:
            # as root, PostgreSQL's data is in the postgres user's home: ours to remove
            pg_home = (servers_dir / "postgresql").resolve()
            subprocess.run(
                [str(SCRIPT), "stop"], env=env, check=False, capture_output=True, timeout=120
            )
            for name, pid in pids.items():  # a straggler `stop` missed: ours if it runs
                try:  # the command `start` gave it
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
                except OSError:
                    continue
                if any(
                    mark in cmdline
                    for mark in (str(servers_dir), str(pg_home), f"127.0.0.1:{ports[name]}")
                ):
                    os.kill(pid, signal.SIGKILL)
            if not pg_home.is_relative_to(servers_dir) and pg_home.name.startswith(
                "fallback-locks."
            ):
                shutil.rmtree(pg_home, ignore_errors=True)


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
    check_postgresql_client(servers.ports["postgresql"])
    check_library(servers, tmp_path)
    check_init_sql(servers)
    check_postgres_init_sql(servers)
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


def check_postgresql_client(port: int) -> None:
    """The `locks` role over TCP by password: no superuser, owning nothing, allowed only
    to read and write rows of the lock table, which is the provider's."""
    with psycopg.connect(host="127.0.0.1", port=port, user="locks", password="locks",
                         dbname="locks", connect_timeout=5, autocommit=True) as db:  # fmt: skip
        columns = db.execute(
            "SELECT column_name, data_type, character_maximum_length, is_nullable"
            " FROM information_schema.columns WHERE table_schema = 'public'"
            " AND table_name = 'locks' ORDER BY ordinal_position"
        ).fetchall()
        assert columns == PG_COLUMNS
        assert db.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid"
            " AND a.attnum = ANY(i.indkey) WHERE i.indrelid = 'public.locks'::regclass"
            " AND i.indisprimary"
        ).fetchall() == [("name",)]
        assert db.execute(
            "SELECT rolsuper, rolcreatedb, rolcreaterole FROM pg_roles WHERE rolname = 'locks'"
        ).fetchone() == (False, False, False)
        grants = db.execute(
            "SELECT table_schema, table_name, privilege_type"
            " FROM information_schema.role_table_grants WHERE grantee = 'locks'"
            " ORDER BY privilege_type"
        ).fetchall()
        assert grants == [("public", "locks", privilege)
                          for privilege in ("DELETE", "INSERT", "SELECT", "UPDATE")]  # fmt: skip
        assert db.execute(
            "SELECT (SELECT count(*) FROM pg_class WHERE relowner = 'locks'::regrole)"
            " + (SELECT count(*) FROM pg_namespace WHERE nspowner = 'locks'::regrole)"
            " + (SELECT count(*) FROM pg_database WHERE datdba = 'locks'::regrole)"
        ).fetchone() == (0,)
        for ddl in ("CREATE TABLE other (x INT)", "CREATE TABLE IF NOT EXISTS locks (x INT)",
                    "CREATE SCHEMA other", "CREATE TEMP TABLE other (x INT)"):  # fmt: skip
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                db.execute(ddl)


def check_library(servers: Servers, tmp_path: Path) -> None:
    """The library, configured by compose/locks.toml: acquire + release on every server."""
    registry = compose_registry(servers, tmp_path)
    try:
        expected = {"redis": RedisHashProvider, "zk": ZooKeeperProvider, "db": DatabaseProvider,
                    "pg": DatabaseProvider}  # fmt: skip
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


def check_postgres_init_sql(servers: Servers) -> None:
    """compose/postgres-init.sql, which made scripts/servers' table, role and grants, is
    idempotent, as the Docker image and a person by hand run it; the table it made has
    the columns and key the provider gives the table it creates itself."""
    grants = "SELECT privilege_type FROM information_schema.role_table_grants" \
        " WHERE grantee = 'locks' ORDER BY 1"  # fmt: skip
    before = servers.pg_sql(grants)
    servers.pg_sql(PG_INIT_SQL.read_text(), database="postgres")  # again: no error
    assert servers.pg_sql(grants) == before == "DELETE\nINSERT\nSELECT\nUPDATE"
    assert servers.pg_sql("SELECT count(*) FROM pg_roles WHERE rolname = 'locks'") == "1"

    provider = DatabaseProvider(
        f"postgresql+psycopg://locks:locks@127.0.0.1:{servers.ports['postgresql']}/locks",
        table="locks_from_provider", create_table=False,
    )  # fmt: skip
    try:
        ddl = CreateTable(provider.table()).compile(dialect=provider.engine.dialect)
    finally:
        provider.close()
    servers.pg_sql(str(ddl))  # as the superuser: the role may not create tables

    def shape(table: str) -> str:
        return servers.pg_sql(
            "SELECT column_name, data_type, character_maximum_length, is_nullable,"
            " collation_name FROM information_schema.columns WHERE table_schema = 'public'"
            f" AND table_name = '{table}' ORDER BY ordinal_position;"
            f" SELECT pg_get_indexdef(indexrelid) FROM pg_index"
            f" WHERE indrelid = 'public.{table}'::regclass AND indisprimary"
        ).replace(table, "locks")

    try:
        assert shape("locks_from_provider") == shape("locks")
    finally:
        servers.pg_sql("DROP TABLE locks_from_provider")


# -- slow: the topologies, for real -------------------------------------------------------


@dataclass
class Topology:
    name: str
    dir: Path
    env: dict[str, str]
    ports: dict[str, int]  # scripts/servers name -> port, for every server started
    extra_ports: list[int]  # cluster bus, ZooKeeper quorum and election ports
    pids: dict[str, int]


def pid_alive(pid: int) -> bool:
    """The process runs (a zombie, waiting for whatever reaps orphans here, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(") ")[2].split()[0] != "Z"


@contextlib.contextmanager
def started(topology: str) -> Iterator[Topology]:
    """`scripts/servers start TOPOLOGY` on free ports in a temp dir; everything it started is
    stopped (or killed) on the way out."""
    servers = dict(TOPOLOGIES[topology])
    if topology == "replica":  # `start replica` starts its primary too
        servers = {"mariadb": ("LOCKS_MYSQL_PORT", 3306), **servers}
    variables = [var for var, _ in servers.values()]
    extra = [var for name in servers for var in EXTRA_PORTS.get(name, [])]
    values = dict(zip(variables + extra, distinct_free_ports(len(variables + extra)), strict=True))
    with tempfile.TemporaryDirectory(prefix="locks-script-topology-") as path:
        servers_dir = Path(path) / "s"  # short: a Unix socket path stays under 108 bytes
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKS_")}
        env |= {var: str(port) for var, port in values.items()}
        env["LOCKS_SERVERS_DIR"] = str(servers_dir)
        env["LOCKS_SERVERS_TIMEOUT"] = "45"
        ports = {name: values[var] for name, (var, _) in servers.items()}
        pids: dict[str, int] = {}
        try:
            done = start_servers([topology], env, servers_dir, ports, pids)
            assert f"\n{topology}: ready (" in done.stdout, done.stdout
            yield Topology(topology, servers_dir, env, ports, [values[v] for v in extra], pids)
        finally:
            for args in ([topology], []) if topology == "replica" else ([topology],):
                subprocess.run(
                    [str(SCRIPT), "stop", *args],
                    env=env,
                    check=False,
                    capture_output=True,
                    timeout=120,
                )
            for name, pid in pids.items():  # a straggler `stop` missed: ours if it runs
                try:  # the command `start` gave it
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
                except OSError:
                    continue
                if str(servers_dir) in cmdline or f"127.0.0.1:{ports[name]}" in cmdline:
                    os.kill(pid, signal.SIGKILL)


def check_topology_status_and_stop(topology: Topology) -> str:
    """`status` shows every server of the topology running, `start` again changes nothing,
    `stop` ends every process and frees every port; returns the `status` output."""
    members = TOPOLOGIES[topology.name]
    status = run_script("status", topology.env, topology.name)  # exit 0: all ready
    assert status_ports(status) == {name: ("running", topology.ports[name]) for name in members}
    again = run_script("start", topology.env, topology.name)
    for name in members:
        assert f"{name}: already running on 127.0.0.1:{topology.ports[name]}" in again, again

    stopped = run_script("stop", topology.env, topology.name)
    assert stopped.splitlines() == [
        f"{name}: stopped (was on 127.0.0.1:{topology.ports[name]})" for name in reversed(members)
    ]
    for name in members:
        assert not pid_alive(topology.pids[name]), f"{name} still runs"
    member_ports = [topology.ports[name] for name in members] + topology.extra_ports
    assert [port for port in member_ports if not port_closed(port)] == []
    assert status_ports(run_script("status", topology.env, topology.name)) == {
        name: ("stopped", topology.ports[name]) for name in members
    }
    return status


@pytest.mark.slow
def test_sentinel_topology_serves_a_primary_and_its_replica() -> None:
    with started("sentinel") as topology:
        ports = topology.ports
        sentinel = REDIS.Sentinel(
            [("127.0.0.1", ports[f"sentinel-{n}"]) for n in (1, 2, 3)], socket_timeout=5
        )
        primary = sentinel.master_for("locks", socket_timeout=5)
        replica = sentinel.slave_for("locks", socket_timeout=5)
        try:
            assert sentinel.discover_master("locks") == ("127.0.0.1", ports["sentinel-primary"])
            assert sentinel.discover_slaves("locks") == [("127.0.0.1", ports["sentinel-replica"])]
            assert primary.set("scripts-servers:锁", "held") is True
            assert primary.get("scripts-servers:锁") == b"held"
            assert primary.wait(1, 5000) == 1  # the replica has the write
            assert replica.get("scripts-servers:锁") == b"held"
            with pytest.raises(redis.exceptions.ReadOnlyError):
                replica.set("scripts-servers:锁", "not here")
        finally:
            primary.close()
            replica.close()
            for client in sentinel.sentinels:
                client.close()
        status = check_topology_status_and_stop(topology)
    assert f"replica of 127.0.0.1:{ports['sentinel-primary']}, link up" in status
    assert status.count(f"watching 127.0.0.1:{ports['sentinel-primary']}, quorum reachable") == 3


@pytest.mark.slow
def test_cluster_topology_spreads_keys_over_three_primaries() -> None:
    with started("cluster") as topology:
        ports = topology.ports
        cluster = REDIS.cluster.RedisCluster(
            startup_nodes=[REDIS.cluster.ClusterNode("127.0.0.1", ports["cluster-1"])],
            socket_timeout=5,
        )
        try:
            keys = [f"scripts-servers:{n}" for n in range(30)]
            for key in keys:
                assert cluster.set(key, key) is True
            assert [cluster.get(key) for key in keys] == [key.encode() for key in keys]
            primaries = {node.port for node in cluster.get_primaries()}
            replicas = {node.port for node in cluster.get_replicas()}
            assert len(primaries) == len(replicas) == 3
            assert primaries | replicas == set(ports.values())
            assert {cluster.get_node_from_key(key).port for key in keys} == primaries
            assert {node.host for node in cluster.get_nodes()} == {"127.0.0.1"}
        finally:
            cluster.close()
        status = check_topology_status_and_stop(topology)
    assert status.count(", primary, cluster_state:ok") == 3
    assert status.count(", replica, cluster_state:ok") == 3


@pytest.mark.slow
def test_ensemble_topology_serves_from_every_node() -> None:
    with started("ensemble") as topology:
        clients = []
        try:
            for n in (1, 2, 3):
                client = KazooClient(hosts=f"127.0.0.1:{topology.ports[f'ensemble-{n}']}")
                clients.append(client)
                client.start(timeout=15)
            for n, client in enumerate(clients, 1):
                client.create(f"/scripts-servers/node-{n}", f"锁 {n}".encode(), makepath=True)
            for client in clients:  # each node has every write (sync: a follower catches up)
                client.sync("/scripts-servers")
                assert sorted(client.get_children("/scripts-servers")) == [
                    "node-1",
                    "node-2",
                    "node-3",
                ]
                for n in (1, 2, 3):
                    assert client.get(f"/scripts-servers/node-{n}")[0] == f"锁 {n}".encode()
        finally:
            for client in clients:
                client.stop()
                client.close()
        status = check_topology_status_and_stop(topology)
    assert sorted(re.findall(r"pid \d+, (\w+)$", status, re.MULTILINE)) == [
        "follower",
        "follower",
        "leader",
    ]


@pytest.mark.slow
def test_replica_topology_copies_rows_and_refuses_the_lock_user() -> None:
    row = ("scripts-servers:锁", "owner", "token", 1, 7, 0, 0)
    insert = (
        "INSERT INTO locks (name, owner, token, depth, fence, expires_at, acquired_at)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s)"
    )
    with started("replica") as topology:

        def connect(server: str) -> Any:
            return pymysql.connect(
                host="127.0.0.1", port=topology.ports[server], user="locks", password="locks",
                database="locks", ssl_disabled=True, connect_timeout=5, autocommit=True,
            )  # fmt: skip

        def on_replica(cursor: Any, present: bool) -> bool:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                cursor.execute("SELECT owner, fence FROM locks WHERE name = %s", (row[0],))
                if (cursor.fetchall() == (("owner", 7),)) == present:
                    return True
                time.sleep(0.05)
            return False

        primary, replica = connect("mariadb"), connect("mariadb-replica")
        try:
            with primary.cursor() as on_primary, replica.cursor() as cursor:
                on_primary.execute(insert, row)
                assert on_replica(cursor, present=True), "the row did not reach the replica"
                for statement, args in (
                    (insert, (*row[:1], "other", *row[2:])),
                    ("UPDATE locks SET fence = 8 WHERE name = %s", row[:1]),
                    ("DELETE FROM locks WHERE name = %s", row[:1]),
                ):
                    with pytest.raises(pymysql.err.OperationalError) as refused:
                        cursor.execute(statement, args)
                    assert refused.value.args[0] == 1290  # running with --read-only
                on_primary.execute("DELETE FROM locks WHERE name = %s", row[:1])
                assert on_replica(cursor, present=False), "the delete did not reach the replica"
        finally:
            primary.close()
            replica.close()
        status = check_topology_status_and_stop(topology)
        assert pid_alive(topology.pids["mariadb"])  # `stop replica` leaves the primary alone
    assert f", replicating from 127.0.0.1:{topology.ports['mariadb']}" in status
