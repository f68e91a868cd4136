"""Degradation proven by killing, pausing and restarting real servers under load."""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Iterator
from multiprocessing.pool import AsyncResult
from pathlib import Path

import pytest
import redis

from locks import AllBackendsUnavailable, Breaker, FallbackChain, Lease, Switch
from locks.backends import DatabaseProvider, LocalProvider, RedisProvider, ZooKeeperProvider
from locks.names import redis_hash_tag
from tests import workers
from tests.servers import MariaDBServer, RedisServer, ZooKeeperServer

SPAWN = multiprocessing.get_context("spawn")
PROCESSES, ROUNDS = 4, 150


@pytest.fixture
def servers(
    redis_server: RedisServer, zookeeper_server: ZooKeeperServer, mariadb_server: MariaDBServer
) -> dict[str, str]:
    return {"redis": redis_server.url, "zk": zookeeper_server.hosts, "db": mariadb_server.url}


def wait_for_count(
    counter: Path,
    at_least: int,
    results: AsyncResult[list[list[tuple[str, float]]]],
    timeout: float = 60,
) -> None:
    """Wait for the shared counter, surfacing a worker's error at once."""
    deadline = time.monotonic() + timeout
    while int(counter.read_text() or 0) < at_least:
        assert time.monotonic() < deadline, f"the workers stalled below {at_least}"
        assert not results.ready() or results.successful() or results.get()
        time.sleep(0.01)


@pytest.mark.parametrize("mode", ["fast", "safe"])
def test_redis_killed_under_load(  # noqa: PLR0917 - pytest fixtures
    mode: str,
    servers: dict[str, str],
    redis_server: RedisServer,
    key: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """(a) 4 processes increment a shared counter through redis -> zk -> db -> local while
    Redis is SIGKILLed; in safe mode Redis also comes back mid-run (b)."""
    counter = tmp_path / "counter"
    counter.write_text("0")
    total = PROCESSES * ROUNDS
    restarted_at = None
    with SPAWN.Pool(PROCESSES) as pool:
        args = (servers, mode, key, str(counter), ROUNDS)
        results = pool.starmap_async(workers.chain_increment, [args] * PROCESSES)
        wait_for_count(counter, total // 4, results)
        redis_server.kill()  # callers must see no error: a worker's exception fails the test
        killed_at = time.monotonic()
        if mode == "safe":
            # fail-back under load: holders still on ZooKeeper keep excluding newcomers
            wait_for_count(counter, total // 2, results)
            redis_server.start()
            restarted_at = time.monotonic()
        granted = [entry for result in results.get(timeout=300) for entry in result]
    final = int(counter.read_text())
    first_zk = min(at for tier, at in granted if tier == "zk" and at > killed_at)
    report = (
        f"\n[{mode}] counter {final}/{total}, increments lost to overlapping holders: "
        f"{total - final}; first ZooKeeper lease {first_zk - killed_at:.2f} s after the kill"
    )
    if restarted_at is not None:
        back = [at for tier, at in granted if tier == "redis" and at > restarted_at]
        assert back, "the chain never failed back to Redis"
        report += f"; first Redis lease {min(back) - restarted_at:.2f} s after the restart"
        assert min(back) - restarted_at < 1.0 + 1.0  # reset_timeout + 1 s
    with capsys.disabled():
        print(report)
    assert {tier for tier, _ in granted} <= {"redis", "zk"}
    if mode == "fast":
        assert first_zk - killed_at < 1.0
        # only the one lease held on Redis when it died can overlap a ZooKeeper lease
        assert total - final <= 1
    else:
        assert final == total
        assert first_zk - killed_at >= 2.0 - 0.1, "safe mode granted inside max_lease"


def test_a_paused_redis_costs_one_timeout_then_nothing(redis_server: RedisServer, key: str) -> None:
    upper = RedisProvider(redis_server.url, name="redis", socket_timeout=0.3)
    chain = FallbackChain([upper, LocalProvider()], breaker=Breaker(reset_timeout=30))
    upper.ping()
    redis_server.pause()  # a blackhole, not a refusal
    try:
        started = time.monotonic()
        lease = chain.acquire(key, ttl=30)
        first = time.monotonic() - started
        assert lease is not None and lease.backend == "local"
        assert first < 3 * 0.3 + 2 * 0.1 + 0.5  # tries x socket timeout, plus the pauses
        chain.release(lease)
        started = time.monotonic()
        for _ in range(100):
            again = chain.acquire(key, ttl=30)
            assert again is not None and again.backend == "local"
            chain.release(again)
        assert (time.monotonic() - started) / 100 < 0.005, "the open breaker cost I/O"
    finally:
        redis_server.resume()
        upper.close()


@pytest.fixture
def full_chain(servers: dict[str, str]) -> Iterator[tuple[FallbackChain, FallbackChain]]:
    redis_tier = RedisProvider(servers["redis"], name="redis")
    zk_tier = ZooKeeperProvider(servers["zk"], name="zk", session_timeout=2.0)
    db_tier = DatabaseProvider(servers["db"], name="db")
    breaker = Breaker(reset_timeout=60)
    everything = FallbackChain(
        [redis_tier, zk_tier, db_tier, LocalProvider()], name="order", breaker=breaker
    )
    funds = FallbackChain(
        [redis_tier, zk_tier], name="funds", mode="safe", max_lease=30, breaker=breaker
    )
    yield everything, funds
    for tier in (redis_tier, zk_tier, db_tier):
        tier.close()


def test_each_server_killed_in_turn_moves_down_the_chain(
    full_chain: tuple[FallbackChain, FallbackChain],
    redis_server: RedisServer,
    zookeeper_server: ZooKeeperServer,
    mariadb_server: MariaDBServer,
    key: str,
) -> None:
    chain, funds = full_chain

    def tier_now() -> str:
        lease = chain.acquire(key, ttl=10, wait=5)
        assert lease is not None
        chain.release(lease)
        return lease.backend

    assert tier_now() == "redis"
    redis_server.kill()
    assert tier_now() == "zk"
    zookeeper_server.kill()
    assert tier_now() == "db"
    mariadb_server.kill()
    assert tier_now() == "local"
    # funds never falls back to a local lock: with Redis and ZooKeeper down it fails
    with pytest.raises(AllBackendsUnavailable) as caught:
        funds.acquire(key, ttl=10, wait=0)
    assert set(caught.value.causes) == {"redis", "zk"}


def test_a_switch_file_forcing_local_takes_effect_while_work_runs(
    redis_server: RedisServer, key: str, tmp_path: Path
) -> None:
    path = tmp_path / "switch.toml"
    path.write_text("")
    switch = Switch(file=path, environ={})  # polled every second, the default
    upper = RedisProvider(redis_server.url, name="redis")
    chain = FallbackChain([upper, LocalProvider()], switch=switch)
    older = chain.acquire(key + ":held", ttl=30)
    assert older is not None and older.backend == "redis"
    tiers: list[tuple[str, float]] = []
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            lease = chain.acquire(key, ttl=30, wait=5)
            assert lease is not None
            tiers.append((lease.backend, time.monotonic()))
            chain.release(lease)
            time.sleep(0.005)

    worker = threading.Thread(target=work)
    worker.start()
    try:
        time.sleep(0.3)
        path.write_text('force = "local"\n')
        written_at = time.monotonic()
        deadline = written_at + 3
        while not any(t == "local" and at > written_at for t, at in tiers):
            assert time.monotonic() < deadline, "the switch file was not applied"
            time.sleep(0.01)
        first_local = min(at for t, at in tiers if t == "local" and at > written_at)
        assert first_local - written_at < 2.0
        # a lease granted by Redis before the switch is still released on Redis
        chain.release(older)
        admin = redis.Redis.from_url(redis_server.url)
        assert not admin.exists(f"locks:{{{redis_hash_tag(key + ':held')}}}")
        admin.close()
    finally:
        stop.set()
        worker.join()
        switch.close()
        upper.close()
    assert {t for t, _ in tiers} == {"redis", "local"}


def test_a_hung_database_never_delays_a_healthy_redis_lease_or_a_loss(
    redis_server: RedisServer, mariadb_server: MariaDBServer, key: str
) -> None:
    """Renewals of different backends never wait on each other, and `on_lost` runs when a
    lease's validity runs out even while its own renewal is stuck on a frozen server."""
    db = DatabaseProvider(mariadb_server.url, watchdog_ttl=1.5)
    fast = RedisProvider(redis_server.url, watchdog_ttl=0.6)
    lost_at: dict[str, float] = {}
    valid_until: dict[str, float] = {}

    def note(lease: Lease) -> None:
        lost_at[lease.key] = time.monotonic()

    held = []  # kept: a watchdog lease nobody references is let go (docs/semantics.md)
    for n in range(5):
        lease = db.acquire(f"{key}:db:{n}", on_lost=note)
        assert lease is not None and lease.valid_until is not None
        valid_until[lease.key] = lease.valid_until
        held.append(lease)
    redis_lease = fast.acquire(key, on_lost=note)
    assert redis_lease is not None
    mariadb_server.pause()
    try:
        time.sleep(3.0)  # five renewals of the Redis lease are due meanwhile
        assert key not in lost_at, "the Redis lease was lost while Redis was healthy"
        redis_lease.check()
        assert fast.is_held(redis_lease)
    finally:
        mariadb_server.resume()
    late = {name: lost_at[name] - until for name, until in valid_until.items() if name in lost_at}
    assert set(late) == set(valid_until), "a database lease was never marked lost"
    assert max(late.values()) < 0.5, f"on_lost ran late: {late}"
    fast.release(redis_lease)
    fast.close()
    db.close()
