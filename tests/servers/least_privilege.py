"""Least-privileged users of the session's servers, granted exactly what docs/security.md
tells operators to grant, so that the contract suite proves it is enough (kinds
`redis-acl`, `redis-hash-acl`, `mariadb-least`, `postgresql-least`, `zookeeper-digest`,
`zookeeper-sasl` in tests/backends.py)."""

from __future__ import annotations

import pytest

from tests.servers import MariaDBServer, RedisServer, ZooKeeperServer
from tests.servers.postgresql import PostgreSQLServer
from tests.servers.zookeeper_sasl import USERS, SASLZooKeeperServer


class LeastPrivileged:
    """A user or role of one server, and the URL that connects as it."""

    def __init__(self, url: str) -> None:
        self.url = url


def _lock_table(url: str) -> None:
    """The lock table, made by its owner (the session's `locks` user), as a migration
    or `locks db init` would make it: the least-privileged user cannot."""
    from locks.backends import DatabaseProvider  # noqa: PLC0415

    owner = DatabaseProvider(url)
    owner.create_table()
    owner.close()


@pytest.fixture
def redis_least_privilege(redis_server: RedisServer) -> LeastPrivileged:
    import redis  # noqa: PLC0415 - only these tests need it

    from locks.backends.redis.scripts import acl_rule  # noqa: PLC0415

    user, password = "locks-least", "least-pw"
    with redis.Redis.from_url(redis_server.url) as admin:
        admin.execute_command("ACL", "SETUSER", user, "reset", *acl_rule().split(),
                              f">{password}")  # fmt: skip
    return LeastPrivileged(redis_server.url.replace("redis://", f"redis://{user}:{password}@"))


@pytest.fixture(scope="session")
def mariadb_least_privilege(mariadb_session: MariaDBServer) -> LeastPrivileged:
    _lock_table(mariadb_session.url)
    mariadb_session.sql(
        "CREATE USER IF NOT EXISTS 'locks_dml'@'127.0.0.1' IDENTIFIED BY 'dml-pw';"
        "GRANT SELECT, INSERT, UPDATE, DELETE ON locks.locks TO 'locks_dml'@'127.0.0.1';"
    )
    return LeastPrivileged(
        mariadb_session.url.replace(f"locks:{mariadb_session.password}@", "locks_dml:dml-pw@")
    )


@pytest.fixture(scope="session")
def postgresql_least_privilege(postgresql_session: PostgreSQLServer) -> LeastPrivileged:
    _lock_table(postgresql_session.url)
    postgresql_session.sql(
        "DO $$ BEGIN CREATE ROLE locks_dml LOGIN PASSWORD 'dml-pw'; "
        "EXCEPTION WHEN duplicate_object THEN NULL; END $$;"
        "GRANT CONNECT ON DATABASE locks TO locks_dml;"
        "GRANT USAGE ON SCHEMA public TO locks_dml;"
        "GRANT SELECT, INSERT, UPDATE, DELETE ON public.locks TO locks_dml;"
    )
    owner = f"locks:{postgresql_session.password}@"
    return LeastPrivileged(postgresql_session.url.replace(owner, "locks_dml:dml-pw@"))


@pytest.fixture
def zookeeper_digest(zookeeper_server: ZooKeeperServer) -> LeastPrivileged:
    """A digest identity (`username:password@hosts`, split again by tests/backends.py);
    its nodes go under a root of its own, which it creates with its ACL."""
    return LeastPrivileged(f"locker:digest-pw@{zookeeper_server.url}")


@pytest.fixture
def zookeeper_sasl_locker(zookeeper_sasl: SASLZooKeeperServer) -> LeastPrivileged:
    """The SASL user `locker` of a server that admits SASL clients only
    (`username:password@hosts`, split again by tests/backends.py)."""
    return LeastPrivileged(f"locker:{USERS['locker']}@{zookeeper_sasl.url}")
