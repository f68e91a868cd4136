"""The `locks` command, run as users run it: against real servers, and without any."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
import tomllib
import uuid
from pathlib import Path

import pytest

from locks import Event, EventKind, Switch, add_observer, from_config, remove_observer
from locks.cli import main
from tests.ports import free_port
from tests.servers import MariaDBServer, RedisServer
from tests.servers.postgresql import PostgreSQLServer

DEAD_SQLITE = "sqlite:////nonexistent-dir/locks.db"

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "locks.toml"


def test_switch_commands_drive_a_watching_switch(tmp_path: Path) -> None:
    path = tmp_path / "run" / "switch.toml"
    switch = Switch(file=path, poll_interval=0.05, environ={})
    try:

        def settles(condition: object) -> bool:
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                if callable(condition) and condition():
                    return True
                time.sleep(0.01)
            return False

        assert main(["switch", "--file", str(path), "force", "db"]) == 0
        assert settles(lambda: switch.state.forced == "db")
        # readable by applications running as other users (mkstemp's 0600 was not)
        assert path.stat().st_mode & 0o777 == 0o644
        path.chmod(0o640)  # an operator's choice is kept
        assert main(["switch", "--file", str(path), "disable", "redis", "zk"]) == 0
        assert path.stat().st_mode & 0o777 == 0o640
        assert settles(lambda: switch.state.disabled == {"redis", "zk"})
        assert switch.state.forced is None
        assert main(["switch", "--file", str(path), "clear"]) == 0
        assert settles(lambda: switch.state.disabled == frozenset())
        assert not path.exists()  # the environment and the config decide again
        assert main(["switch", "--file", str(path), "show"]) == 0
        assert main(["switch", "--file", str(path), "force", "a", "b"]) == 2
        assert main(["switch", "--file", str(path), "force", "bad\nname"]) == 2
        assert main(["switch", "--file", str(path), "clear", "db"]) == 2
    finally:
        switch.close()


def test_a_switch_file_that_cannot_be_read_is_seen_not_to_be_obeyed(tmp_path: Path) -> None:
    """(As root, nothing is unreadable by mode: a directory where the file should be
    fails the read the same way.)"""
    path = tmp_path / "switch.toml"
    events: list[Event] = []
    observe = events.append  # one object: observers are removed by identity
    add_observer(observe)
    switch = Switch(file=path, poll_interval=60, environ={})
    try:
        path.mkdir()
        switch.refresh()
        assert switch.problem is not None and "IsADirectoryError" in switch.problem
        assert switch.state.source == "default"  # nothing obeyed
        told = [e.detail or "" for e in events if e.kind is EventKind.SWITCHED]
        assert told[-1].startswith("unreadable, ignored: IsADirectoryError")
        path.rmdir()
        path.write_text('force = "db"\n')
        switch.refresh()
        assert switch.problem is None and switch.state.forced == "db"
    finally:
        remove_observer(observe)
        switch.close()


def test_check_reports_a_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCKS_DB_PASSWORD", "x")
    config = tmp_path / "locks.toml"
    config.write_text(EXAMPLE.read_text().replace("/var/run/locks", str(tmp_path)))
    assert main(["check", str(config)]) == 0
    assert "scenarios inventory, order, idempotent, funds, default" in capsys.readouterr().out
    config.write_text('[scenarios]\nx = { chain = ["nope"] }\n')
    assert main(["check", str(config)]) == 1
    assert "scenarios.x.chain[0]" in capsys.readouterr().err
    config.write_text(
        '[backends]\ndb = { type = "database", url = "mysql+mysqldb://u:hunter2@/x" }\n'
    )
    command = [sys.executable, "-m", "locks", "check", str(config)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 1, done.stderr
    assert "backends.db.url" in done.stderr and "Traceback" not in done.stderr
    assert "hunter2" not in done.stderr


# -- demo, status, inspect, db init ------------------------------------------------------

ROW = r"^{phase}\s+(?P<stock>\d+)\s+(?P<sold>\d+)\s+(?P<oversold>\d+)\s+(?P<served>.+?)\s{{2,}}"


def demo_rows(output: str) -> dict[str, dict[str, str]]:
    """The summary table's rows of a demo, by phase."""
    rows = {}
    for phase in ("no lock", "scenario demo"):
        found = re.search(ROW.format(phase=phase), output, re.MULTILINE)
        assert found is not None, f"no {phase!r} row in:\n{output}"
        rows[phase] = found.groupdict()
    return rows


def write_config(tmp_path: Path, backends: str, chain: str) -> Path:
    config = tmp_path / "locks.toml"
    config.write_text(f"[backends]\n{backends}\n[scenarios]\ndemo = {{ chain = {chain} }}\n")
    return config


def redis_then_db(tmp_path: Path, redis: RedisServer, mariadb: MariaDBServer) -> Path:
    return write_config(
        tmp_path,
        f'redis = {{ type = "redis-hash", url = "{redis.url}" }}\n'
        f'db = {{ type = "database", url = "{mariadb.url}" }}',
        '["redis", "db"]',
    )


def test_demo_on_the_embedded_default_oversells_without_the_lock_and_never_with_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)  # no ./locks.toml
    monkeypatch.delenv("LOCKS_CONFIG", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the default's per-user folder
    assert main(["demo", "--workers", "3", "--stock", "20", "--work", "20"]) == 0
    output = capsys.readouterr().out
    rows = demo_rows(output)
    assert int(rows["no lock"]["oversold"]) > 0  # 20 ms windows, three sellers: they overlap
    assert rows["scenario demo"]["sold"] == "20"
    assert rows["scenario demo"]["oversold"] == "0"
    served = rows["scenario demo"]["served"]
    if "redis" not in served:  # nothing listens on 6379 here: the demo says it degraded
        assert "redis" in output and "UNAVAILABLE" in output
        assert re.fullmatch(r"file \d+", served)
    assert (tmp_path / f"fallback-locks-{os.getuid()}" / "locks").is_dir()  # the lock files


def test_demo_moves_to_the_database_when_redis_is_killed_mid_run(
    tmp_path: Path, redis_server: RedisServer, mariadb_server: MariaDBServer
) -> None:
    config = redis_then_db(tmp_path, redis_server, mariadb_server)
    command = [sys.executable, "-m", "locks", "demo", "--config", str(config),
               "--workers", "2", "--stock", "600", "--work", "5"]  # fmt: skip
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as demo:
        assert demo.stdout is not None
        for line in demo.stdout:
            if line.startswith("-> scenario demo"):
                break
        time.sleep(0.5)  # some sales on Redis first
        redis_server.kill()
        output = demo.stdout.read()
        assert demo.wait(timeout=120) == 0, output
    row = demo_rows(output)["scenario demo"]
    assert (row["sold"], row["oversold"]) == ("600", "0")
    assert re.search(r"redis \d+", row["served"]) and re.search(r"db \d+", row["served"]), row
    assert "redis x" in output  # the degradations column counts them


def test_status_reports_each_backend_and_fails_when_one_is_down(
    tmp_path: Path, redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    dead_address = f"127.0.0.1:{free_port()}"
    dead = f"redis://{dead_address}/0"
    switch_file = tmp_path / "switch.toml"
    switch_file.write_text('disable = ["spare"]\n')
    config = write_config(
        tmp_path,
        f'redis = {{ type = "redis-hash", url = "{redis_server.url}" }}\n'
        f'spare = {{ type = "redis", url = "{dead}" }}\n'
        'local = { type = "local" }\n'
        f'[switch]\nfile = "{switch_file}"\n',
        '["redis", "spare", "local"]',
    )
    assert main(["status", "--config", str(config)]) == 1
    captured = capsys.readouterr()
    lines = {line.split()[0]: line for line in captured.out.splitlines()[1:]}
    assert re.match(r"redis\s+redis-hash\s+yes\s+[\d.]+ ms\s+closed\s+-", lines["redis"])
    assert re.match(r"spare\s+redis\s+no\s+-\s+open\s+disabled \(file\)", lines["spare"])
    assert dead_address in captured.err  # the address that failed
    spare = f'spare = {{ type = "redis", url = "{dead}" }}\n'
    config.write_text(config.read_text().replace(spare, "").replace('"spare", ', ""))
    assert main(["status", "--config", str(config)]) == 0


def test_inspect_shows_the_holder_on_each_backend(
    tmp_path: Path,
    redis_server: RedisServer,
    mariadb_server: MariaDBServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = redis_then_db(tmp_path, redis_server, mariadb_server)
    registry = from_config(config)
    try:
        name = f"order:{uuid.uuid4().hex}"
        lease = registry.backend("db").acquire(name, ttl=30)
        assert lease is not None
        assert main(["inspect", name, "--config", str(config)]) == 0
        out = capsys.readouterr().out
        assert re.search(r"^redis\s+redis-hash\s+free", out, re.MULTILINE)
        db_row = rf"^db\s+database\s+{re.escape(lease.owner)}\s+1\s+{lease.fence}\s+(2\d|30)\.\d s"
        assert re.search(db_row, out, re.MULTILINE), out
        registry.backend("db").release(lease)
        redis_server.kill()
        assert main(["inspect", name, "--config", str(config)]) == 3
        captured = capsys.readouterr()
        assert re.search(r"^redis\s+redis-hash\s+\(unavailable\)", captured.out, re.MULTILINE)
        assert re.search(r"^db\s+database\s+free", captured.out, re.MULTILINE)
        assert redis_server.address in captured.err
        assert main(["inspect", "", "--config", str(config)]) == 2
    finally:
        registry.close()


def test_db_init_creates_the_table_once_and_refuses_what_is_not_a_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sqlite = tmp_path / "locks.sqlite"
    config = write_config(
        tmp_path,
        f'db = {{ type = "database", url = "sqlite:///{sqlite}", create_table = false }}\n'
        'local = { type = "local" }',
        '["db", "local"]',
    )
    for _ in range(2):  # again: the table is left as it is
        assert main(["db", "init", "--config", str(config)]) == 0
    assert "db: table 'locks' ready" in capsys.readouterr().out
    assert sqlite3.connect(sqlite).execute("SELECT COUNT(*) FROM locks").fetchone() == (0,)
    assert main(["db", "init", "--config", str(config), "--backend", "local"]) == 2
    assert main(["db", "init", "--config", str(config), "--backend", "nope"]) == 1
    dead = write_config(tmp_path, f'db = {{ type = "database", url = "{DEAD_SQLITE}" }}', '["db"]')
    assert main(["db", "init", "--config", str(dead)]) == 3


def test_db_init_print_sql_prints_each_servers_ddl_and_creates_nothing(
    tmp_path: Path,
    mariadb_server: MariaDBServer,
    postgresql_server: PostgreSQLServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """For a migration run by the table's owner: the lock user then needs DML only."""
    table = f"t{uuid.uuid4().hex[:12]}"
    config = write_config(
        tmp_path,
        f'maria = {{ type = "database", url = "{mariadb_server.url.replace("+pymysql", "")}", '
        f'table = "{table}" }}\n'
        f'pg = {{ type = "database", url = "{postgresql_server.url}", table = "{table}" }}\n'
        f'down = {{ type = "database", url = "mariadb://u:pw@127.0.0.1:{free_port()}/x" }}',
        '["maria", "pg"]',
    )
    assert main(["db", "init", "--print-sql", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert f"-- maria: {mariadb_server.address}\nCREATE TABLE {table}" in out
    assert "utf8mb4_nopad_bin" in out  # a mysql:// URL, yet the server said MariaDB
    assert f"-- pg: {postgresql_server.address}\nCREATE TABLE {table}" in out
    assert "(not reached: compiled from the URL alone)" in out  # `down`, from mariadb://
    assert mariadb_server.sql(f"SHOW TABLES FROM locks LIKE '{table}'") == ""  # nothing made


def test_switch_finds_its_file_in_the_config(tmp_path: Path) -> None:
    switch_file = tmp_path / "run" / "switch.toml"
    config = write_config(
        tmp_path, f'local = {{ type = "local" }}\n[switch]\nfile = "{switch_file}"', '["local"]'
    )
    assert main(["switch", "--config", str(config), "force", "local"]) == 0
    assert tomllib.loads(switch_file.read_text()) == {"force": "local"}
    assert main(["switch", "--config", str(config), "disable", "redos"]) == 2  # a typo
    assert tomllib.loads(switch_file.read_text()) == {"force": "local"}  # untouched
    assert not list(switch_file.parent.glob(".switch.toml.*"))  # no temporary left behind
    bare = write_config(tmp_path, 'local = { type = "local" }', '["local"]')
    assert main(["switch", "--config", str(bare), "clear"]) == 1  # no file named anywhere


def test_the_command_runs_with_no_server_client_installed(tmp_path: Path) -> None:
    """`pip install fallback-locks` alone: no redis, kazoo or SQLAlchemy to import."""
    hide = "import sys; sys.modules.update(dict.fromkeys(['redis', 'kazoo', 'sqlalchemy']))"
    switch = tmp_path / "switch.toml"
    for argv in (["--help"], ["switch", "--file", str(switch), "disable", 'odd"name']):
        code = f"{hide}; from locks.cli import main; sys.exit(main({argv!r}))"
        done = subprocess.run(
            [sys.executable, "-c", code], check=False, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
    assert tomllib.loads(switch.read_text()) == {"disable": ['odd"name']}


def test_the_entry_point_has_a_version_and_takes_options_where_users_put_them(
    tmp_path: Path,
) -> None:
    """Through the installed `locks` script: --version; -v after the subcommand; `check`
    takes the file as an argument, as --config, or from $LOCKS_CONFIG."""
    script = str(Path(sys.executable).with_name("locks"))
    plain = {k: v for k, v in os.environ.items() if k != "LOCKS_CONFIG"}

    def locks(*arguments: str, env: dict[str, str] = plain) -> subprocess.CompletedProcess[str]:
        return subprocess.run([script, *arguments], capture_output=True, text=True,
                              timeout=60, env=env, cwd=tmp_path, check=False)  # fmt: skip

    assert re.fullmatch(r"locks \d+\.\d+\.\d+\S*\n", locks("--version").stdout)
    config = tmp_path / "app.toml"
    config.write_text('[backends]\nlocal = { type = "local" }\n')
    for done in [
        locks("check", str(config), "-v"),
        locks("check", "--config", str(config)),
        locks("check", env={**plain, "LOCKS_CONFIG": str(config)}),
    ]:
        assert (done.returncode, done.stdout) == (0, "ok: backends local; scenarios \n"), done
    nothing = locks("check")  # no file, no $LOCKS_CONFIG, no ./locks.toml
    assert nothing.returncode == 2 and "no configuration to check" in nothing.stderr


@pytest.mark.parametrize(
    ("backend", "says"),
    [
        ('{ type = "database", url = "nosuch://x/y" }', "backends.db.url: url 'nosuch://x/y'"),
        ('{ type = "database", url = "postgresql+pg8000://u:secret@127.0.0.1/db" }',
         "needs the pg8000 driver, whose module 'pg8000' is not installed: pip install pg8000"),
        ('{ type = "redis", max_connections = true }',
         "backends.db.max_connections: max_connections must be a whole number"),
        ('{ type = "database", pool_size = 0 }', "backends.db.pool_size: pool_size must be"),
    ],
)  # fmt: skip
def test_check_names_what_is_wrong_without_a_traceback(
    backend: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(f"[backends]\ndb = {backend}\n")
    assert main(["check", str(config)]) == 1
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err and "secret" not in err


def test_demo_with_an_unknown_scenario_is_bad_usage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "locks.toml"
    config.write_text('[backends]\nlocal = { type = "local" }\n'
                      '[scenarios]\nmine = { chain = ["local"] }\n')  # fmt: skip
    assert main(["demo", "--config", str(config), "--scenario", "nope"]) == 2
    assert "--scenario 'nope' is not configured" in capsys.readouterr().err


# -- the embedded default, with nothing but the core install -----------------------------

EXTRAS_CLIENTS = ("redis", "kazoo", "sqlalchemy")


def core_only(folder: Path) -> dict[str, str]:
    """The environment of a process (and of every process it starts) where the extras'
    clients are not installed, as after `pip install fallback-locks` alone: a
    `sitecustomize` first on the path marks them missing, so importing them fails and
    `importlib.util.find_spec` finds nothing, as for a package that is not there."""
    hide = folder / "core-only"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(
        f"import sys\nsys.modules.update(dict.fromkeys({list(EXTRAS_CLIENTS)!r}))\n"
    )
    path = os.pathsep.join(p for p in (str(hide), os.environ.get("PYTHONPATH")) if p)
    return {**no_config(folder), "PYTHONPATH": path}


def no_config(folder: Path) -> dict[str, str]:
    """No configuration anywhere (no $LOCKS_CONFIG, no switch settings; the command runs
    in an empty directory) and a per-user folder private to the test ($TMPDIR)."""
    unset = {"LOCKS_CONFIG", "LOCKS_SWITCH_FILE", "LOCKS_FORCE", "LOCKS_DISABLE"}
    env = {k: v for k, v in os.environ.items() if k not in unset}
    (folder / "tmp").mkdir(exist_ok=True)
    return {**env, "TMPDIR": str(folder / "tmp")}


def run_locks(
    folder: Path, env: dict[str, str], *arguments: str
) -> subprocess.CompletedProcess[str]:
    """The installed `locks` script, run in `folder`."""
    script = str(Path(sys.executable).with_name("locks"))
    return subprocess.run([script, *arguments], capture_output=True, text=True, timeout=120,
                          env=env, cwd=folder, check=False)  # fmt: skip


def test_a_core_only_install_runs_the_demo_without_overselling(tmp_path: Path) -> None:
    """Issue 14: with no extra installed, the embedded default kept only `local`, and the
    demo's worker processes oversold under the lock. The file tier needs nothing more."""
    env = core_only(tmp_path)
    probe = "import importlib.util as u; print([u.find_spec(n) for n in {names!r}]); import {name}"
    for name in EXTRAS_CLIENTS:
        code = probe.format(names=EXTRAS_CLIENTS, name=name)
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=env, cwd=tmp_path, check=False)  # fmt: skip
        assert done.stdout == "[None, None, None]\n", done.stderr
        assert done.returncode == 1 and "ModuleNotFoundError" in done.stderr
    done = run_locks(tmp_path, env, "demo", "--workers", "4", "--stock", "40", "--work", "5")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "redis: left out, its client 'redis' is not installed" in done.stdout
    rows = demo_rows(done.stdout)
    assert int(rows["no lock"]["oversold"]) > 0  # the sellers do overlap
    assert (rows["scenario demo"]["sold"], rows["scenario demo"]["oversold"]) == ("40", "0")
    assert re.fullmatch(r"file 40", rows["scenario demo"]["served"])


def test_the_switch_works_on_the_embedded_default(tmp_path: Path) -> None:
    """Issue 14: the README's `locks switch disable redis`, with no configuration file."""
    env = no_config(tmp_path)
    switch = tmp_path / "tmp" / f"fallback-locks-{os.getuid()}" / "switch.toml"
    done = run_locks(tmp_path, env, "switch", "disable", "redis")
    assert done.returncode == 0, done.stderr
    assert tomllib.loads(switch.read_text()) == {"disable": ["redis"]}
    status = run_locks(tmp_path, env, "status")  # 1 where no Redis listens on 6379
    assert status.returncode in (0, 1), status.stderr
    assert "config: embedded default; switch: disable=redis (from file)" in status.stdout
    assert re.search(r"^redis\s+redis-hash\s.*disabled \(file\)$", status.stdout, re.MULTILINE)
    assert re.search(r"^file\s+file\s+yes\s.*-$", status.stdout, re.MULTILINE), status.stdout
    assert run_locks(tmp_path, env, "switch", "disable", "redos").returncode == 2  # a typo
    done = run_locks(tmp_path, env, "switch", "clear")
    assert done.returncode == 0, done.stderr
    assert not switch.exists()
    status = run_locks(tmp_path, env, "status")
    assert "switch: all backends allowed" in status.stdout
    assert re.search(r"^redis\s+redis-hash\s.*\s-$", status.stdout, re.MULTILINE), status.stdout
