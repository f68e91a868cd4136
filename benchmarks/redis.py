"""Our Redis backends next to the peers, against one redis-server, in one run.

    python -m benchmarks.redis [--cycles 2000] [--rounds 5] [--samples 20] [--no-write]
                               [--quick]

Starts its own redis-server on a free loopback port (no persistence). Writes `RATIOS` to
benchmarks/results/redis.json.
"""

from __future__ import annotations

import sys
import uuid
from typing import Any

import redis
import redis_lock
from pottery import Redlock

from benchmarks.harness import Contender, Ratio, compare, provider_contender
from locks.backends import RedisHashProvider, RedisProvider
from tests.servers import RedisServer

PEER = "redis-py Lock"
HANDOFF_PEER = "python-redis-lock"  # its waiters are woken by the release, not polling
OURS = "fallback-locks redis"
OURS_HASH = "fallback-locks redis-hash"
RATIOS = (
    Ratio("redis/redis-vs-redis-py-lock", OURS, PEER),
    Ratio("redis/redis-hash-vs-redis-py-lock", OURS_HASH, PEER),
    Ratio("redis/redis-handoff-vs-python-redis-lock", OURS, HANDOFF_PEER, handoff=True),
    Ratio("redis/redis-hash-handoff-vs-python-redis-lock", OURS_HASH, HANDOFF_PEER, handoff=True),
)


def raw_set_del(url: str) -> Contender:
    client = redis.Redis.from_url(url)

    def acquire(key: str) -> Any:
        token = uuid.uuid4().hex
        while not client.set(key, token, nx=True, px=30_000):
            pass  # spin: only the uncontended figure of this floor is reported
        return key

    def release(key: str) -> None:
        client.delete(key)

    return Contender("raw SET NX PX + DEL", acquire, release, client.close)


def redis_py_lock(url: str) -> Contender:
    client = redis.Redis.from_url(url)

    def acquire(key: str) -> Any:
        lock = client.lock(key, timeout=30, blocking_timeout=30)
        assert lock.acquire()
        return lock

    return Contender(PEER, acquire, lambda lock: lock.release(), client.close)


def python_redis_lock(url: str) -> Contender:
    client = redis.Redis.from_url(url)

    def acquire(key: str) -> Any:
        lock = redis_lock.Lock(client, key, expire=30)
        assert lock.acquire(timeout=30)
        return lock

    return Contender(HANDOFF_PEER, acquire, lambda lock: lock.release(), client.close)


def pottery_redlock(url: str) -> Contender:
    client = redis.Redis.from_url(url)

    def acquire(key: str) -> Any:
        lock = Redlock(key=key, masters={client}, auto_release_time=30)
        assert lock.acquire(timeout=30)
        return lock

    return Contender(
        "pottery Redlock (1 master)", acquire, lambda lock: lock.release(), client.close
    )


def main(argv: list[str] | None = None) -> int:
    def contenders(server: RedisServer) -> list[Contender]:
        url = server.url
        return [
            raw_set_del(url),
            redis_py_lock(url),
            python_redis_lock(url),
            pottery_redlock(url),
            provider_contender(RedisProvider(url), OURS),
            provider_contender(RedisHashProvider(url), OURS_HASH),
        ]

    return compare(
        argv,
        module="benchmarks.redis",
        description=__doc__,
        title="Redis: uncontended cycles and hand-off",
        server=RedisServer,
        contenders=contenders,
        baseline=PEER,
        ratios=RATIOS,
        no_handoff=["raw SET NX PX + DEL"],  # it only spins
    )


if __name__ == "__main__":
    sys.exit(main())
