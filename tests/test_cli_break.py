"""`locks break`, through the installed `locks` script, as an operator runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from locks import LockNotOwned, from_config
from tests.servers import MariaDBServer, RedisServer

SCRIPT = str(Path(sys.executable).with_name("locks"))


def locks(*arguments: str, answer: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "LOCKS_CONFIG"}
    return subprocess.run([SCRIPT, *arguments], input=answer, capture_output=True, text=True,
                          timeout=60, env=env, check=False)  # fmt: skip


def test_break_shows_the_holder_asks_and_frees_the_lock_for_good(
    tmp_path: Path, redis_server: RedisServer, mariadb_server: MariaDBServer
) -> None:
    config = tmp_path / "locks.toml"
    config.write_text(
        "[backends]\n"
        f'redis = {{ type = "redis-hash", url = "{redis_server.url}" }}\n'
        f'db = {{ type = "database", url = "{mariadb_server.url}" }}\n'
        'local = { type = "local" }\n'
    )
    registry = from_config(config)
    name = f"order:{uuid.uuid4().hex}"
    db = registry.backend("db")
    try:
        lease = db.acquire(name, ttl=30)
        assert lease is not None
        declined = locks("break", name, "--config", str(config), answer="n\n")
        assert declined.returncode == 2, declined.stderr
        assert f"held by {lease.owner}, fence {lease.fence}" in declined.stdout
        assert "local" not in declined.stdout  # in-process only: not breakable from here
        nobody = locks("break", name, "--config", str(config))  # no answer: a script
        assert nobody.returncode == 2 and "--yes" in nobody.stderr
        db.extend(lease)  # still held: nothing was broken

        done = locks("-v", "break", name, "--config", str(config), answer="y\n")
        assert done.returncode == 0, done.stderr
        assert f"db: broken; it was held by {lease.owner} (fence {lease.fence})" in done.stdout
        assert "redis: free, nothing to break" in done.stdout
        # the event, logged with who broke it
        assert re.search(rf"db broken key='{name}' by \S+@\S+ pid \d+ \(locks break\)", done.stderr)
        with pytest.raises(LockNotOwned):
            db.extend(lease)  # the broken holder can no longer renew
        successor = db.acquire(name, ttl=30, wait=0)
        assert successor is not None and successor.fence > lease.fence
        db.release(successor)

        for bad in (["--backend", "local"], ["--backend", "nope"], ["--backend", "db", ""]):
            refused = locks("break", *([name] if "" not in bad else []), *bad, "--yes",
                            "--config", str(config))  # fmt: skip
            assert refused.returncode == 2, refused.stderr
            assert "Traceback" not in refused.stderr
        redis_server.kill()
        down = locks("break", name, "--yes", "--config", str(config))
        assert down.returncode == 3, down.stderr
        assert "redis: not broken" in down.stdout and redis_server.address in down.stdout
        assert "db: free, nothing to break" in down.stdout
    finally:
        registry.close()
