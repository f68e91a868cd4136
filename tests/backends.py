"""The backends the contract suite runs over, built the same way in the test process
and in the worker processes it spawns (which get only the kind and the address)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import redis
import sqlalchemy as sa

from locks.backends import (
    DatabaseProvider,
    LocalProvider,
    RedisHashProvider,
    RedisProvider,
    ZooKeeperProvider,
)
from locks.base import ProviderBase
from locks.names import redis_hash_tag
from locks.provider import Capabilities
from tests.ports import free_port

CLASSES: dict[str, type[ProviderBase]] = {
    "local": LocalProvider,
    "redis": RedisProvider,
    "redis-hash": RedisHashProvider,
    "zookeeper": ZooKeeperProvider,
    "mariadb": DatabaseProvider,
    "sqlite": DatabaseProvider,
}

# the server fixture each kind needs, if any
SERVERS: dict[str, str | None] = {
    "local": None,
    "redis": "redis_server",
    "redis-hash": "redis_server",
    "zookeeper": "zookeeper_server",
    "mariadb": "mariadb_server",
    "sqlite": "sqlite_file",
}

# an address of each kind where nobody listens, given a free port
DEAD_ADDRESS = {
    "redis": "redis://127.0.0.1:{port}/0",
    "redis-hash": "redis://127.0.0.1:{port}/0",
    "zookeeper": "127.0.0.1:{port}",
    "mariadb": "mysql+pymysql://locks:pw@127.0.0.1:{port}/locks",
    "sqlite": "sqlite:////nonexistent-dir-{port}/locks.db",
}


def kinds(**required: bool) -> list[str]:
    """The kinds whose declared capabilities match every `name=value` given."""
    return [
        kind
        for kind, cls in CLASSES.items()
        if all(getattr(cls.capabilities, name) == value for name, value in required.items())
    ]


def make_provider(kind: str, address: str | None, **options: Any) -> ProviderBase:
    if kind == "zookeeper-short-session":  # a holder whose death is noticed within 1 s
        return ZooKeeperProvider(address or "", session_timeout=1.0)
    cls = CLASSES[kind]
    if address is None:
        return cls(**options)
    return cls(address, **options)


@dataclass
class Backend:
    """One backend under test: builds providers against its server and closes them after."""

    kind: str
    address: str | None
    made: list[ProviderBase] = field(default_factory=list)

    @property
    def capabilities(self) -> Capabilities:
        return CLASSES[self.kind].capabilities

    def make(self, **options: Any) -> ProviderBase:
        return self._made(make_provider(self.kind, self.address, **options))

    def make_unreachable(self) -> ProviderBase:
        """A provider of this kind whose server address has nobody listening."""
        if self.address is None:
            return self.make()
        dead = DEAD_ADDRESS[self.kind].format(port=free_port())
        return self._made(make_provider(self.kind, dead))

    def _made(self, provider: ProviderBase) -> ProviderBase:
        self.made.append(provider)
        return provider

    def delete_behind_back(self, key: str) -> None:
        """Remove a lock the way an operator or a failover would, without its owner."""
        assert self.address is not None, f"{self.kind} has no server to delete from"
        if self.kind.startswith("redis"):
            client = redis.Redis.from_url(self.address)
            client.delete(f"locks:{{{redis_hash_tag(key)}}}")
            client.close()
        elif self.kind in ("mariadb", "sqlite"):
            engine = sa.create_engine(self.address)
            with engine.begin() as conn:
                conn.execute(sa.text("DELETE FROM locks WHERE name = :name"), {"name": key})
            engine.dispose()
        else:
            raise AssertionError(f"no way to delete a {self.kind} lock behind its back")

    def close(self) -> None:
        for provider in self.made:
            provider.close()
