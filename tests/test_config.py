"""Configuration: everything checked at load time with the bad key's path, secrets from
the environment, presets, the decorator, and third-party backend types."""

from __future__ import annotations

import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from locks import ConfigError, FallbackChain, from_config
from locks.backends import LocalProvider, RedisHashProvider
from tests.ports import free_port

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "locks.toml"


def test_the_example_config_loads_without_touching_any_server(tmp_path: Path) -> None:
    text = EXAMPLE.read_text().replace("/var/run/locks/switch.toml", str(tmp_path / "s.toml"))
    path = tmp_path / "locks.toml"
    path.write_text(text)
    registry = from_config(path, environ={"LOCKS_DB_PASSWORD": "s3cret"})
    try:
        assert registry.scenarios == ["inventory", "order", "idempotent", "funds", "default"]
        funds = registry.chain("funds")
        assert funds.order == ["redis", "zk"] and funds.mode == "safe"
        assert registry.chain("idempotent").order == ["redis", "local"]
        assert isinstance(registry.backend("redis"), RedisHashProvider)
        assert "s3cret" in str(registry.backend("db").engine.url.password)  # type: ignore[attr-defined]
    finally:
        registry.close()


BAD: list[tuple[dict[str, Any], str]] = [
    ({"bakends": {}}, "bakends: unknown key"),
    ({"backends": {"r": {"type": "redys"}}}, "backends.r.type: unknown backend type 'redys'"),
    ({"backends": {"r": {"type": "local", "url": "x"}}}, "backends.r.url: unknown key"),
    ({"backends": {"r": "local"}}, "backends.r: must be a table"),
    (
        {"backends": {"r": {"type": "redis", "watchdog_ttl": -1}}},
        "backends.r.watchdog_ttl: watchdog_ttl",
    ),
    (
        {"backends": {"a": {"type": "local"}}, "scenarios": {"s": {"chain": ["a", "b"]}}},
        "scenarios.s.chain[1]: unknown backend 'b'",
    ),
    (
        {"backends": {"a": {"type": "local"}}, "scenarios": {"s": {"chain": ["a"], "x": 1}}},
        "scenarios.s.x: unknown key",
    ),
    ({"scenarios": {"s": {"preset": "gold"}}}, "scenarios.s.preset: unknown preset 'gold'"),
    (
        {"backends": {"a": {"type": "local"}}, "scenarios": {"s": {"chain": ["a"], "mode": "x"}}},
        "scenarios.s.mode: mode",
    ),
    ({"backends": {"a": {"type": "local"}}, "switch": {"force": "b"}}, "switch.force: unknown"),
    ({"switch": {"disable": ["zk"]}}, "switch.disable: unknown backend 'zk'"),
    ({"switch": {"every": 1}}, "switch.every: unknown key"),
    (
        {"backends": {"redis": {"type": "local"}}, "switch": {"disable": "redis"}},
        r"switch.disable: must be a list of backend names",
    ),
    (
        {"backends": {"a": {"type": "local"}}, "switch": {"force": ["a"]}},
        "switch.force: must be one backend name",
    ),
    ({"backends": {"r": {"type": "redis", "url": "redis://:${NOPE}@h/0"}}}, "NOPE is not set"),
    # values that used to load and fail only at the first failover, or first acquire
    (
        {
            "backends": {"a": {"type": "local"}},
            "scenarios": {"s": {"chain": ["a"], "retries": "3"}},
        },
        "scenarios.s.retries: must be a whole number",
    ),
    (
        {"backends": {"a": {"type": "local"}}, "scenarios": {"s": {"chain": ["a"], "retries": 0}}},
        "scenarios.s.retries: must be a whole number",
    ),
    (
        {
            "backends": {
                "a": {"type": "local"},
            },
            "scenarios": {"s": {"chain": ["a"], "retry_delay": -1}},
        },
        "scenarios.s.retry_delay: retry_delay must be >= 0",
    ),
    ({"backends": {"d": {"type": "database", "url": "nosuchdb://h/x"}}}, "backends.d.url: url"),
    ({"backends": {"d": {"type": "database", "url": "::not a url::"}}}, "backends.d.url: url"),
    ({"backends": {"z": {"type": "zookeeper", "hosts": 5}}}, "backends.z.hosts: hosts must be"),
    ({"backends": {"z": {"type": "zookeeper", "root": "/a/./b"}}}, "backends.z.root: root"),
    ({"backends": {"r": {"type": "redis", "watchdog_ttl": 1e17}}}, "backends.r.watchdog_ttl:"),
]


@pytest.mark.parametrize(("data", "message"), BAD)
def test_bad_config_is_refused_at_load_naming_the_key(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        from_config(data, environ={})
    assert message in str(caught.value)


def test_secrets_come_from_the_environment() -> None:
    port = free_port()
    registry = from_config(
        {"backends": {"r": {"type": "redis", "url": f"redis://:${{PW}}@127.0.0.1:{port}/0"}}},
        environ={"PW": "hunter2"},
    )
    provider = registry.backend("r")
    assert provider.client.connection_pool.connection_kwargs["password"] == "hunter2"  # type: ignore[attr-defined]
    registry.close()


def test_secrets_come_from_files_and_a_missing_one_is_named(tmp_path: Path) -> None:
    """A mounted secret (Kubernetes, Docker, systemd credentials): `${file:/path}`."""
    secret = tmp_path / "redis-password"
    secret.write_text("hunter2\n")
    port = free_port()
    url = f"redis://:${{file:{secret}}}@127.0.0.1:{port}/0"
    registry = from_config({"backends": {"r": {"type": "redis", "url": url}}}, environ={})
    provider = registry.backend("r")
    assert provider.client.connection_pool.connection_kwargs["password"] == "hunter2"  # type: ignore[attr-defined]
    registry.close()
    missing = {"backends": {"r": {"type": "redis", "url": url.replace("redis-pass", "nope")}}}
    with pytest.raises(ConfigError, match=r"backends\.r\.url: cannot read secret file"):
        from_config(missing, environ={})


def test_locked_formats_the_key_from_the_call_and_holds_the_lock() -> None:
    registry = from_config(
        {"backends": {"local": {"type": "local"}}, "scenarios": {"order": {"chain": ["local"]}}}
    )
    local = registry.backend("local")
    assert isinstance(local, LocalProvider)
    seen: list[int] = []

    @registry.locked("order:{order_id}:{kind}", scenario="order", wait=1)
    def place(order_id: int, kind: str = "new") -> str:
        seen.append(len(local))
        # held by us for the whole call: another owner cannot take it
        other = threading.Thread(target=lambda: seen.append(
            int(local.acquire(f"order:{order_id}:{kind}", wait=0) is None)))  # fmt: skip
        other.start()
        other.join()
        return f"placed {order_id}"

    assert place(1001) == "placed 1001"
    assert seen == [1, 1]
    assert len(local) == 0  # released after the call
    with pytest.raises(ConfigError, match="unknown scenario"):
        registry.locked("x", scenario="nope")
    with pytest.raises(ConfigError, match="unknown scenario"):
        registry.lock("nope", "k")
    assert isinstance(registry.chain("order"), FallbackChain)


def test_third_party_backends_register_through_entry_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "acme_locks.py"
    package.write_text(
        textwrap.dedent("""
        from locks.backends import LocalProvider

        class AcmeProvider(LocalProvider):
            def __init__(self, name: str = "acme", flavour: str = "") -> None:
                super().__init__(name)
                self.flavour = flavour
    """)
    )
    dist = tmp_path / "acme_locks-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-locks\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[locks.backends]\nacme = acme_locks:AcmeProvider\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = from_config({"backends": {"mine": {"type": "acme", "flavour": "plum"}}})
    provider = registry.backend("mine")
    assert type(provider).__name__ == "AcmeProvider"
    assert provider.flavour == "plum"  # type: ignore[attr-defined]
    assert provider.name == "mine"
    with provider.lock("k") as lease:
        assert lease.backend == "mine"
    sys.modules.pop("acme_locks", None)


def test_the_configs_own_switch_state_yields_to_the_file_and_the_environment(
    tmp_path: Path,
) -> None:
    path = tmp_path / "switch.toml"
    data = {
        "backends": {"a": {"type": "local"}, "b": {"type": "local"}},
        "switch": {"force": "a", "file": str(path)},
    }
    registry = from_config(data, environ={})
    assert registry.switch.state.forced == "a"
    registry.close()
    overridden = from_config(data, environ={"LOCKS_DISABLE": "b"})
    assert overridden.switch.state.forced is None and overridden.switch.state.disabled == {"b"}
    overridden.close()
    path.write_text('force = "b"\n')  # the watched file wins over the config
    pushed = from_config(data, environ={})
    assert pushed.switch.state.forced == "b"
    pushed.close()
