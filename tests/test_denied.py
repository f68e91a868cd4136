"""Misconfiguration never degrades (issue 18): refused credentials or permissions are
`AccessDenied`, raised at once by the backend and by a chain over it (never granted from
the next tier, never retried), named with the backend's address and never its secret.
One test per row of docs/security.md's table that is not proven elsewhere
(PostgreSQL: tests/test_postgresql.py; ZooKeeper: tests/test_zookeeper_acl.py; a wrong
Redis password through a chain: tests/test_chain.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from locks import AccessDenied, FallbackChain, LockProvider
from locks.backends import DatabaseProvider, LocalProvider, RedisHashProvider, RedisProvider
from locks.backends.redis.scripts import acl_rule
from tests.servers import MariaDBServer, RedisServer


def refused_through_a_chain(make: Callable[[], LockProvider], key: str, secret: str) -> None:
    """The backend alone and a chain over it (with `local` below) both raise."""
    provider = make()
    chain = FallbackChain([make(), LocalProvider()], name="chain")
    try:
        # keys of their own: a script refused half way may have taken its key first
        for subject, name in ((provider, key), (chain, key + ":chain")):
            with pytest.raises(AccessDenied) as denied:
                subject.acquire(name, ttl=30, wait=0)
            assert secret not in str(denied.value)
    finally:
        provider.close()
        for tier in chain.tiers.values():
            tier.close()


@pytest.mark.parametrize("cls", [RedisProvider, RedisHashProvider])
def test_a_redis_user_missing_a_command_a_script_runs_is_denied(
    redis_server: RedisServer, key: str, cls: type[RedisProvider]
) -> None:
    """Redis checks each command inside a script against the caller's ACL and answers
    with a plain error (no NOPERM), which escaped raw before."""
    user = f"short-{uuid.uuid4().hex[:8]}"
    rule = acl_rule().replace(" +incr", "")  # every first grant INCRs the fence counter
    with redis.Redis.from_url(redis_server.url) as admin:
        admin.execute_command("ACL", "SETUSER", user, "reset", *rule.split(), ">pw-x1")
    url = redis_server.url.replace("redis://", f"redis://{user}:pw-x1@")
    try:
        refused_through_a_chain(lambda: cls(url, name="redis"), key, "pw-x1")
    finally:
        with redis.Redis.from_url(redis_server.url) as admin:
            admin.acl_deluser(user)


def test_a_redis_user_without_the_channel_pattern_is_denied(
    redis_server: RedisServer, key: str
) -> None:
    """Redis 7 gives a new user no channel at all: a waiter's SUBSCRIBE is refused, and
    so is the PUBLISH of a release that someone waits for. Uncontended, neither is sent:
    the lock works until the first wait."""
    user = f"nochan-{uuid.uuid4().hex[:8]}"
    rule = acl_rule().replace(" &locks:*", "")
    with redis.Redis.from_url(redis_server.url) as admin:
        admin.execute_command("ACL", "SETUSER", user, "reset", *rule.split(), ">pw-x2")
    url = redis_server.url.replace("redis://", f"redis://{user}:pw-x2@")
    provider = RedisHashProvider(url)
    try:
        lease = provider.acquire(key, ttl=30, wait=0)
        assert lease is not None
        with ThreadPoolExecutor(1) as other:  # another owner waits: SUBSCRIBE
            waiter = other.submit(provider.acquire, key, ttl=30, wait=2)
            with pytest.raises(AccessDenied):
                waiter.result(timeout=30)
        with pytest.raises(AccessDenied):  # it marked the lock: the release publishes
            provider.release(lease)
    finally:
        provider.close()
        with redis.Redis.from_url(redis_server.url) as admin:
            admin.acl_deluser(user)


def test_a_wrong_mariadb_password_is_denied(mariadb_server: MariaDBServer, key: str) -> None:
    url = mariadb_server.url.replace(mariadb_server.password, "not-it-x3")
    refused_through_a_chain(lambda: DatabaseProvider(url, name="db"), key, "not-it-x3")


def test_a_mariadb_user_without_create_is_denied_when_the_table_is_missing(
    mariadb_server: MariaDBServer, key: str
) -> None:
    """Least privilege with `create_table = true` left on: 1142, a configuration error
    (make the table with `locks db init` or `--print-sql`), not an outage."""
    user, table = f"dml{uuid.uuid4().hex[:8]}", f"t{uuid.uuid4().hex[:8]}"
    mariadb_server.sql(
        f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY 'pw-x4';"
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON locks.* TO '{user}'@'127.0.0.1';"
    )
    url = mariadb_server.url.replace(f"locks:{mariadb_server.password}@", f"{user}:pw-x4@")
    refused_through_a_chain(lambda: DatabaseProvider(url, name="db", table=table), key, "pw-x4")
