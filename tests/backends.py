"""The backends the contract suite runs over, built the same way in the test process
and in the worker processes it spawns (which get only the kind and the address)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from locks import FallbackChain, LockProvider, aio
from locks.backends import (
    DatabaseProvider,
    FileProvider,
    LocalProvider,
    RedisHashProvider,
    RedisProvider,
    ZooKeeperProvider,
)
from locks.keeper import LeaseKeeper
from locks.names import redis_hash_tag
from locks.provider import Capabilities
from locks.quorum import Quorum
from tests.aio_bridge import Threaded
from tests.ports import free_port

# a chain joins the contract suite as Redis (reentrant hash) over MariaDB: the
# intersection of their capabilities is what the chain promises
CHAIN_CAPABILITIES = RedisHashProvider.capabilities & DatabaseProvider.capabilities
# a quorum joins it over five independent redis-servers (reentrant hash members): fenced
# by raising each member's fence floor
QUORUM_CAPABILITIES = Capabilities(reentrant=True, expires=True, renewable=True, fair=False,
                                   fenced=True, cross_process=True, cross_host=True)  # fmt: skip

CLASSES: dict[str, type[LeaseKeeper]] = {
    "local": LocalProvider,
    "redis": RedisProvider,
    "redis-hash": RedisHashProvider,
    "zookeeper": ZooKeeperProvider,
    "mariadb": DatabaseProvider,
    "sqlite": DatabaseProvider,
    "postgresql": DatabaseProvider,
    "file": FileProvider,
    # as the least-privileged users docs/security.md grants (tests/servers/least_privilege.py)
    "redis-acl": RedisProvider,
    "redis-hash-acl": RedisHashProvider,
    "mariadb-least": DatabaseProvider,
    "postgresql-least": DatabaseProvider,
    "zookeeper-digest": ZooKeeperProvider,
    "zookeeper-sasl": ZooKeeperProvider,
    # the topologies: one of each Redis type, so both scripts run on both
    "redis-sentinel": RedisHashProvider,
    "redis-cluster": RedisProvider,
    # the asyncio face, called through tests/aio_bridge.py: one task per calling thread
    "aio-local": aio.LocalProvider,
    "aio-redis": aio.RedisProvider,
    "aio-redis-hash": aio.RedisHashProvider,
    "aio-zookeeper": aio.ZooKeeperProvider,
    "aio-file": aio.FileProvider,
    "aio-mariadb": aio.DatabaseProvider,
    "aio-sqlite": aio.DatabaseProvider,
    "aio-postgresql": aio.DatabaseProvider,
    "aio-redis-sentinel": aio.RedisProvider,  # (the threaded face's is the hash type)
    "aio-redis-cluster": aio.RedisHashProvider,  # (the threaded face's is the plain type)
}
QUORUMS = ("quorum", "aio-quorum")  # over the redis_masters, one member each
TOPOLOGIES = ("redis-sentinel", "redis-cluster", "aio-redis-sentinel", "aio-redis-cluster")

# the server fixture each kind needs, if any
SERVERS: dict[str, tuple[str, ...]] = {
    "local": (),
    "redis": ("redis_server",),
    "redis-hash": ("redis_server",),
    "zookeeper": ("zookeeper_server",),
    "mariadb": ("mariadb_server",),
    "sqlite": ("sqlite_file",),
    "file": ("lock_directory",),
    "redis-acl": ("redis_least_privilege",),
    "redis-hash-acl": ("redis_least_privilege",),
    "mariadb-least": ("mariadb_least_privilege",),
    "postgresql-least": ("postgresql_least_privilege",),
    "zookeeper-digest": ("zookeeper_digest",),
    "zookeeper-sasl": ("zookeeper_sasl_locker",),
    "postgresql": ("postgresql_server",),
    "chain": ("redis_server", "mariadb_server"),
    "redis-sentinel": ("sentinel_topology",),
    "redis-cluster": ("cluster_topology",),
    "quorum": ("redis_masters",),
    "aio-local": (),
    "aio-redis": ("redis_server",),
    "aio-redis-hash": ("redis_server",),
    "aio-chain": ("redis_server",),
    "aio-zookeeper": ("zookeeper_server",),
    "aio-file": ("lock_directory",),
    "aio-mariadb": ("mariadb_server",),
    "aio-sqlite": ("sqlite_file",),
    "aio-postgresql": ("postgresql_server",),
    "aio-quorum": ("redis_masters",),
    "aio-redis-sentinel": ("sentinel_topology",),
    "aio-redis-cluster": ("cluster_topology",),
}

# an address of each kind where nobody listens, given a free port
DEAD_ADDRESS = {
    "redis": "redis://127.0.0.1:{port}/0",
    "redis-hash": "redis://127.0.0.1:{port}/0",
    "aio-redis": "redis://127.0.0.1:{port}/0",
    "aio-redis-hash": "redis://127.0.0.1:{port}/0",
    "aio-chain": "redis://127.0.0.1:{port}/0",
    "aio-zookeeper": "127.0.0.1:{port}",
    "aio-file": "/dev/null/locks-{port}",
    "aio-mariadb": "mysql+pymysql://locks:pw@127.0.0.1:{port}/locks",
    "aio-sqlite": "sqlite:////nonexistent-dir-{port}/locks.db",
    "aio-postgresql": "postgresql://locks:pw@127.0.0.1:{port}/locks",
    "redis-acl": "redis://locks-least:least-pw@127.0.0.1:{port}/0",
    "redis-hash-acl": "redis://locks-least:least-pw@127.0.0.1:{port}/0",
    "mariadb-least": "mysql+pymysql://locks_dml:dml-pw@127.0.0.1:{port}/locks",
    "postgresql-least": "postgresql://locks_dml:dml-pw@127.0.0.1:{port}/locks",
    "zookeeper-digest": "locker:digest-pw@127.0.0.1:{port}",
    "zookeeper-sasl": "locker:sasl-locker-pw@127.0.0.1:{port}",
    "zookeeper": "127.0.0.1:{port}",
    "mariadb": "mysql+pymysql://locks:pw@127.0.0.1:{port}/locks",
    "sqlite": "sqlite:////nonexistent-dir-{port}/locks.db",
    "postgresql": "postgresql://locks:pw@127.0.0.1:{port}/locks",
    "file": "/dev/null/locks-{port}",  # under a file: no directory can be made, even by root
    "chain": "redis://127.0.0.1:{port}/0|mysql+pymysql://locks:pw@127.0.0.1:{port}/locks",
    "redis-sentinel": "redis+sentinel://127.0.0.1:{port}/locks/0",
    "redis-cluster": "redis+cluster://127.0.0.1:{port}",
    "quorum": "|".join(["redis://127.0.0.1:{port}/0"] * 3),
    "aio-quorum": "|".join(["redis://127.0.0.1:{port}/0"] * 3),
    "aio-redis-sentinel": "redis+sentinel://127.0.0.1:{port}/locks/0",
    "aio-redis-cluster": "redis+cluster://127.0.0.1:{port}",
}


def capabilities_of(kind: str) -> Capabilities:
    if kind == "chain":
        return CHAIN_CAPABILITIES
    if kind == "aio-chain":  # two redis-hash tiers
        return RedisHashProvider.capabilities
    if kind in QUORUMS:
        return QUORUM_CAPABILITIES
    return CLASSES[kind].capabilities


def kinds(*, topologies: bool = True, **required: bool) -> list[str]:
    """The kinds whose declared capabilities match every `name=value` given (without
    the multi-node topologies if `topologies` is false)."""
    return [
        kind
        for kind in SERVERS
        if all(getattr(capabilities_of(kind), name) == value for name, value in required.items())
        and (topologies or kind not in TOPOLOGIES)
    ]


def make_provider(kind: str, address: str | None, **options: Any) -> LockProvider:
    if kind == "zookeeper-short-session":  # a holder whose death is noticed within 1 s
        return ZooKeeperProvider(address or "", session_timeout=1.0)
    if kind in ("zookeeper-digest", "zookeeper-sasl"):  # username:password@hosts
        credentials, hosts = (address or "@").rsplit("@", 1)
        username, password = credentials.split(":", 1)
        auth = kind.removeprefix("zookeeper-")  # under a root of its own: /locks-digest
        return ZooKeeperProvider(hosts, username=username, password=password, auth=auth,
                                 root=f"/locks-{auth}", **options)  # fmt: skip
    if kind in ("mariadb-least", "postgresql-least"):  # no CREATE: the table is made
        return DatabaseProvider(address or "", create_table=False, **options)
    if kind == "chain":
        redis_url, database_url = (address or "|").split("|")
        return FallbackChain(
            [
                RedisHashProvider(redis_url, name="redis", **options),
                DatabaseProvider(database_url, **options),
            ],
            name="chain",
        )
    if kind == "aio-chain":  # the asyncio chain over two redis-hash tiers (prefixes)
        tiers = [
            aio.RedisHashProvider(address or "", name="redis", **options),
            aio.RedisHashProvider(address or "", name="redis-b", prefix="locks-b", **options),
        ]
        return Threaded(aio.FallbackChain(tiers, name="chain"))
    if kind == "quorum-mixed":  # redis + zookeeper + database, 2 of 3
        redis_url, zk_hosts, database_url = (address or "||").split("|")
        members = [
            RedisProvider(redis_url, name="redis", **options),
            ZooKeeperProvider(zk_hosts, name="zookeeper", **options),
            DatabaseProvider(database_url, name="database", **options),
        ]
        return Quorum(members, name="quorum-mixed")
    if kind in QUORUMS:
        watchdog_ttl = options.pop("watchdog_ttl", 30.0)
        urls = (address or "").split("|")
        member_class: Any = aio.RedisHashProvider if kind == "aio-quorum" else RedisHashProvider
        members = [member_class(url, name=f"r{i}", **options) for i, url in enumerate(urls)]
        if kind == "aio-quorum":
            return Threaded(aio.Quorum(members, name="quorum", watchdog_ttl=watchdog_ttl))
        return Quorum(members, name="quorum", watchdog_ttl=watchdog_ttl)
    cls: Any = CLASSES[kind]
    made = cls(**options) if address is None else cls(address, **options)
    return Threaded(made) if kind.startswith("aio-") else made


@dataclass
class Backend:
    """One backend under test: builds providers against its server and closes them after."""

    kind: str
    address: str | None
    made: list[LockProvider] = field(default_factory=list)

    @property
    def capabilities(self) -> Capabilities:
        return capabilities_of(self.kind)

    def make(self, **options: Any) -> LockProvider:
        return self._made(make_provider(self.kind, self.address, **options))

    def make_unreachable(self) -> LockProvider:
        """A provider of this kind whose server address has nobody listening."""
        if self.address is None:
            return self.make()
        dead = DEAD_ADDRESS[self.kind].format(port=free_port())
        return self._made(make_provider(self.kind, dead))

    def _made(self, provider: LockProvider) -> LockProvider:
        self.made.append(provider)
        return provider

    def delete_behind_back(self, key: str) -> None:
        """Remove a lock the way an operator or a failover would, without its owner."""
        assert self.address is not None, f"{self.kind} has no server to delete from"
        if self.kind.startswith(("redis", "aio-redis")) or self.kind in (
            "chain",
            *QUORUMS,
            "aio-chain",
        ):
            urls = self.address.split("|")
            for url in urls if self.kind in QUORUMS else urls[:1]:  # a quorum: every member
                provider = RedisProvider(url)
                provider.client.delete(f"locks:{{{redis_hash_tag(key)}}}")
                provider.close()
        elif self.kind in ("file", "aio-file"):  # an operator's `rm`: its fence goes too
            FileProvider(self.address).path_of(key).unlink()
        elif self.kind.removeprefix("aio-") in (
            "mariadb",
            "sqlite",
            "postgresql",
            "mariadb-least",
            "postgresql-least",
        ):
            engine = sa.create_engine(self.address)
            with engine.begin() as conn:
                conn.execute(sa.text("DELETE FROM locks WHERE name = :name"), {"name": key})
            engine.dispose()
        else:
            raise AssertionError(f"no way to delete a {self.kind} lock behind its back")

    def close(self) -> None:
        for provider in self.made:
            provider.close()
            # a chain's own tiers, a quorum's own members
            for part in [*getattr(provider, "tiers", {}).values(),
                         *getattr(provider, "members", {}).values()]:  # fmt: skip
                part.close()
