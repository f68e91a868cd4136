"""The database URLs people write (issue 17): short forms pick the driver their extra
installs, an explicit `+driver` is honoured, and a driver that is missing is a
`ConfigError` naming what to install — never a raw import error, never the password."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from locks import ConfigError, from_config
from locks.backends import DatabaseProvider
from locks.backends.dialects import database_url, family


@pytest.mark.parametrize(
    ("url", "expected_family", "driver"),
    [
        ("mysql://u:pw@db.example/locks", "mysql", "pymysql"),
        ("mariadb://u:pw@db.example/locks", "mysql", "pymysql"),
        ("mysql+pymysql://u:pw@db.example/locks", "mysql", "pymysql"),
        ("postgresql://u:pw@db.example/locks", "postgresql", "psycopg"),
        ("postgres://u:pw@db.example/locks", "postgresql", "psycopg"),
        ("postgresql+psycopg2://u:pw@db.example/locks", "postgresql", "psycopg2"),
        ("postgres+psycopg2://u:pw@db.example/locks", "postgresql", "psycopg2"),
        ("sqlite:///locks.db", "sqlite", "pysqlite"),
    ],
)
def test_each_url_form_picks_the_driver_its_extra_installs(
    url: str, expected_family: str, driver: str
) -> None:
    parsed = database_url(url)
    assert family(parsed.get_backend_name()) == expected_family
    assert parsed.get_driver_name() == driver


@pytest.mark.parametrize(
    ("url", "install"),
    [
        ("mysql+mysqldb://u:hunter2@db.example/locks", "pip install mysqlclient"),
        ("postgresql+pg8000://u:hunter2@db.example/locks", "pip install pg8000"),
    ],
)
def test_a_missing_driver_is_a_config_error_naming_what_to_install(
    url: str, install: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=install) as raised:
        DatabaseProvider(url)
    assert "hunter2" not in str(raised.value) and "***" in str(raised.value)
    config = tmp_path / "locks.toml"
    config.write_text(f'[backends]\ndb = {{ type = "database", url = "{url}" }}\n')
    with pytest.raises(ConfigError, match=rf"backends\.db\.url.*{install}") as raised:
        from_config(config)
    assert "hunter2" not in str(raised.value)
    done = subprocess.run(
        [str(Path(sys.executable).with_name("locks")), "check", str(config)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert install in done.stderr and "Traceback" not in done.stderr
    assert "hunter2" not in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("not a url", "is not a database URL"),
        ("oracle://u:hunter2@db.example/x", "unsupported database 'oracle'"),
    ],
)
def test_what_is_not_a_supported_database_url_is_a_value_error(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as raised:
        DatabaseProvider(url)
    assert "hunter2" not in str(raised.value)
