"""Our Redis backends next to the peers, against one redis-server, in one run.

    python -m benchmarks.redis [--cycles 2000] [--rounds 5] [--samples 20] [--no-write]

Starts its own redis-server on a free loopback port (no persistence).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import redis
import redis_lock
from pottery import Redlock

from benchmarks.harness import Contender, append_report, measure, table
from locks.backends import RedisHashProvider, RedisProvider
from locks.base import ProviderBase
from tests.servers import RedisServer


def ours(provider: ProviderBase, label: str) -> Contender:
    def acquire(key: str) -> Any:
        return provider.acquire(key, ttl=30, wait=30)

    return Contender(label, acquire, provider.release, provider.close)


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

    return Contender("redis-py Lock", acquire, lambda lock: lock.release(), client.close)


def python_redis_lock(url: str) -> Contender:
    client = redis.Redis.from_url(url)

    def acquire(key: str) -> Any:
        lock = redis_lock.Lock(client, key, expire=30)
        assert lock.acquire(timeout=30)
        return lock

    return Contender("python-redis-lock", acquire, lambda lock: lock.release(), client.close)


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
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--no-write", action="store_true", help="do not append to docs/")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="locks-bench-") as workdir:
        server = RedisServer(Path(workdir))
        server.start()
        try:
            url = server.url
            contenders = [
                raw_set_del(url),
                redis_py_lock(url),
                python_redis_lock(url),
                pottery_redlock(url),
                ours(RedisProvider(url), "fallback-locks redis"),
                ours(RedisHashProvider(url), "fallback-locks redis-hash"),
            ]
            results = measure(contenders, args.cycles, args.rounds, args.samples)
        finally:
            server.stop()
    # the raw pair has no waiting of its own worth timing
    results[0].handoff_ms = None
    report = table(results, baseline="redis-py Lock")
    print(report)
    if not args.no_write:
        command = "python -m benchmarks.redis " + " ".join(argv or sys.argv[1:])
        path = append_report("Redis: uncontended cycles and hand-off", command.strip(), report)
        print(f"appended to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
