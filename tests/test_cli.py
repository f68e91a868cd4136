"""The `locks` command writes switch files a watching Switch applies, and checks configs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from locks import Switch
from locks.cli import main

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
        assert main(["switch", "--file", str(path), "disable", "redis", "zk"]) == 0
        assert settles(lambda: switch.state.disabled == {"redis", "zk"})
        assert switch.state.forced is None
        assert main(["switch", "--file", str(path), "clear"]) == 0
        assert settles(lambda: switch.state.disabled == frozenset())
        assert main(["switch", "--file", str(path), "show"]) == 0
        assert main(["switch", "--file", str(path), "force", "a", "b"]) == 2
        assert main(["switch", "--file", str(path), "force", "bad\nname"]) == 2
        assert main(["switch", "--file", str(path), "clear", "db"]) == 2
    finally:
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
