"""FallbackChain against real servers: degrade only on unavailability, breakers, queued
releases, ambiguous acquires, the switch, and safe mode's gate and fail-back."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis
from tenacity import Retrying, stop_after_attempt

from locks import (
    AccessDenied,
    AllBackendsUnavailable,
    BackendUnavailable,
    Breaker,
    Event,
    EventKind,
    FallbackChain,
    Lease,
    LockLost,
    LockProvider,
    Switch,
    add_observer,
    remove_observer,
)
from locks.backends import (
    DatabaseProvider,
    LocalProvider,
    RedisHashProvider,
    RedisProvider,
    ZooKeeperProvider,
)
from locks.names import redis_hash_tag
from tests import workers
from tests.ports import free_port
from tests.servers import MariaDBServer, RedisServer, ZooKeeperServer, wrong_password
from tests.threads import in_thread

SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture
def tiers(redis_server: RedisServer) -> Iterator[tuple[RedisHashProvider, LocalProvider]]:
    upper, lower = RedisHashProvider(redis_server.url, name="redis"), LocalProvider()
    yield upper, lower
    upper.close()


def kinds_of(events: list[Event], *kinds: EventKind) -> list[Event]:
    return [event for event in events if event.kind in kinds]


def test_contention_never_degrades(
    tiers: tuple[RedisHashProvider, LocalProvider], events: list[Event], key: str
) -> None:
    upper, lower = tiers
    chain = FallbackChain([upper, lower])
    held = chain.acquire(key, ttl=30)
    assert held is not None and held.backend == "redis"
    started = time.monotonic()
    assert in_thread(lambda: chain.acquire(key, ttl=30, wait=0.3)) is None
    assert 0.25 <= time.monotonic() - started < 1.5
    assert len(lower) == 0, "the lower tier was asked"
    assert not kinds_of(events, EventKind.DEGRADED)
    chain.release(held)


def test_an_unreachable_tier_degrades_and_its_breaker_then_skips_it(
    events: list[Event], key: str
) -> None:
    dead = RedisProvider(f"redis://127.0.0.1:{free_port()}/0")
    chain = FallbackChain([dead, LocalProvider()], breaker=Breaker(reset_timeout=60))
    lease = chain.acquire(key, ttl=30)
    assert lease is not None and lease.backend == "local"
    degraded = kinds_of(events, EventKind.DEGRADED)
    assert [(e.backend, e.detail) for e in degraded] == [("redis", "to local")]
    assert chain.breakers["redis"].state == "open"
    chain.release(lease)
    started = time.monotonic()
    again = chain.acquire(key, ttl=30)
    assert time.monotonic() - started < 0.01, "an open breaker must cost no I/O"
    assert again is not None and again.backend == "local"
    chain.release(again)
    dead.close()


def test_fail_back_after_the_breaker_resets(
    tiers: tuple[RedisHashProvider, LocalProvider],
    redis_server: RedisServer,
    events: list[Event],
    key: str,
) -> None:
    upper, lower = tiers
    chain = FallbackChain([upper, lower], breaker=Breaker(reset_timeout=0.5))
    redis_server.kill()
    lease = chain.acquire(key, ttl=30)
    assert lease is not None and lease.backend == "local"
    chain.release(lease)
    redis_server.start()
    restarted = time.monotonic()
    while True:
        lease = chain.acquire(key, ttl=30)
        assert lease is not None
        chain.release(lease)
        if lease.backend == "redis":
            break
        assert time.monotonic() - restarted < 0.5 + 1.0, "no fail-back within reset_timeout + 1 s"
        time.sleep(0.05)
    assert kinds_of(events, EventKind.RECOVERED)
    states = [e.detail for e in kinds_of(events, EventKind.BREAKER) if e.backend == "redis"]
    assert states == ["closed -> open", "open -> half-open", "half-open -> closed"]


def test_every_tier_down_raises_with_each_cause(key: str) -> None:
    first = RedisProvider(f"redis://127.0.0.1:{free_port()}/0", name="first")
    second = RedisProvider(f"redis://127.0.0.1:{free_port()}/0", name="second")
    chain = FallbackChain([first, second])
    with pytest.raises(AllBackendsUnavailable) as caught:
        chain.acquire(key, ttl=30, wait=0)
    assert set(caught.value.causes) == {"first", "second"}
    assert all(isinstance(c, BackendUnavailable) for c in caught.value.causes.values())
    first.close()
    second.close()


def test_a_release_on_a_dead_tier_is_queued_and_sent_when_it_answers(
    tiers: tuple[RedisHashProvider, LocalProvider],
    redis_server: RedisServer,
    events: list[Event],
    key: str,
) -> None:
    upper, lower = tiers
    chain = FallbackChain([upper, lower], breaker=Breaker(reset_timeout=0.2))
    lease = chain.acquire(key, ttl=30)
    assert lease is not None and lease.backend == "redis"
    redis_server.pause()
    try:
        chain.release(lease)  # does not raise: the caller's work is done
    finally:
        redis_server.resume()
    assert chain.pending("redis") == 1
    assert kinds_of(events, EventKind.RELEASE_QUEUED)
    time.sleep(0.3)  # past reset_timeout: the next acquire probes Redis
    other = chain.acquire(key + ":other", ttl=30)
    assert other is not None and other.backend == "redis"
    chain.release(other)
    deadline = time.monotonic() + 2
    while chain.pending("redis") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert chain.pending("redis") == 0
    free = in_thread(lambda: chain.acquire(key, ttl=30, wait=0))
    assert free is not None and free.backend == "redis"
    chain.release(free)


class ReplyLost:
    """A real provider whose first acquire takes the lock on the server and then loses
    the reply (the fault a timeout after sending causes)."""

    def __init__(self, provider: LockProvider) -> None:
        self.provider = provider
        self.lost = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.provider, name)

    def acquire(self, key: str, **options: Any) -> Lease | None:
        lease = self.provider.acquire(key, **options)
        if self.lost or lease is None:
            return lease
        self.lost += 1
        raise BackendUnavailable(
            "reply lost", backend=self.provider.name, ambiguous=True, key=key, token=lease.token
        )


def test_an_ambiguous_acquire_is_released_once_the_tier_answers(
    redis_server: RedisServer, key: str
) -> None:
    upper = RedisProvider(redis_server.url, name="redis")
    flaky = ReplyLost(upper)
    retry = Retrying(stop=stop_after_attempt(1), reraise=True)
    chain = FallbackChain(
        [flaky, LocalProvider()],
        retry=retry,
        breaker=Breaker(reset_timeout=0.1),
    )
    lease = chain.acquire(key, ttl=30, wait=0)
    assert lease is not None and lease.backend == "local"
    assert chain.counts["ambiguous"] == 1 and chain.pending("redis") == 1
    admin = redis.Redis.from_url(redis_server.url)
    lock_key = f"locks:{{{redis_hash_tag(key)}}}"
    assert admin.exists(lock_key), "the lost reply's lock is on Redis"
    time.sleep(0.2)
    probe = chain.acquire(key + ":probe", ttl=30)  # Redis answers again
    assert probe is not None and probe.backend == "redis"
    chain.release(probe)
    deadline = time.monotonic() + 2
    while admin.exists(lock_key) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not admin.exists(lock_key), "the ambiguous lock was never released"
    assert chain.pending("redis") == 0
    chain.release(lease)
    admin.close()
    upper.close()


def test_capabilities_are_the_intersection(
    tiers: tuple[RedisHashProvider, LocalProvider],
) -> None:
    chain = FallbackChain(list(tiers))
    assert chain.capabilities == tiers[0].capabilities & tiers[1].capabilities
    assert not chain.capabilities.cross_process


def test_the_switch_forces_and_disables_at_run_time(
    tiers: tuple[RedisHashProvider, LocalProvider], events: list[Event], key: str
) -> None:
    upper, lower = tiers
    switch = Switch(environ={})
    chain = FallbackChain([upper, lower], switch=switch)
    redis_lease = chain.acquire(key, ttl=30)
    assert redis_lease is not None and redis_lease.backend == "redis"
    switch.force("local")
    forced = chain.acquire(key + ":2", ttl=30)
    assert forced is not None and forced.backend == "local"
    # the older lease still goes to the tier that granted it
    chain.release(redis_lease)
    assert not upper.is_held(redis_lease)
    chain.release(forced)
    switch.clear()
    switch.disable("redis")
    disabled = chain.acquire(key, ttl=30)
    assert disabled is not None and disabled.backend == "local"
    chain.release(disabled)
    switch.enable("redis")
    back = chain.acquire(key, ttl=30)
    assert back is not None and back.backend == "redis"
    chain.release(back)
    assert len(kinds_of(events, EventKind.SWITCHED)) == 4
    assert not kinds_of(events, EventKind.DEGRADED)


def test_forcing_a_dead_backend_fails_instead_of_falling_back(key: str) -> None:
    dead = RedisProvider(f"redis://127.0.0.1:{free_port()}/0", name="redis")
    switch = Switch(environ={"LOCKS_FORCE": "redis"})
    chain = FallbackChain([dead, LocalProvider()], switch=switch)
    with pytest.raises(AllBackendsUnavailable):
        chain.acquire(key, ttl=30, wait=0)
    switch.force("zookeeper")  # not a tier of this chain: it gets no tier at all
    with pytest.raises(AllBackendsUnavailable, match="switch"):
        chain.acquire(key, ttl=30, wait=0)
    dead.close()


def test_a_watched_switch_file_applies_within_its_poll_and_survives_corruption(
    tmp_path: Path, events: list[Event]
) -> None:
    path = tmp_path / "switch.toml"
    path.write_text('disable = ["redis"]\n')
    switch = Switch(file=path, poll_interval=0.05, environ={"LOCKS_FORCE": "zk"})
    try:
        assert switch.state.disabled == {"redis"} and switch.state.source == "file"
        path.write_text('force = "local"\n')
        deadline = time.monotonic() + 2
        while switch.state.forced != "local" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert switch.state.forced == "local"
        path.write_text("force = [unterminated\n")  # a broken push
        time.sleep(0.3)
        assert switch.state.forced == "local", "a corrupt file must keep the last good state"
        switch.force("redis")  # code wins over the file
        assert switch.state.forced == "redis" and switch.state.source == "code"
        switch.clear()
        assert switch.state.forced == "local"
        path.unlink()  # no file: the environment decides
        deadline = time.monotonic() + 2
        while switch.state.source != "environment" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert switch.state.forced == "zk"
    finally:
        switch.close()


def test_safe_mode_holds_the_lower_tier_back_for_max_lease(
    tiers: tuple[RedisHashProvider, LocalProvider], redis_server: RedisServer, key: str
) -> None:
    upper, lower = tiers
    upper.watchdog_ttl = 1.0
    chain = FallbackChain(
        [upper, lower], mode="safe", max_lease=1.0, breaker=Breaker(reset_timeout=0.3)
    )
    redis_server.kill()
    started = time.monotonic()
    with pytest.raises(AllBackendsUnavailable, match="safe mode"):
        chain.acquire(key, ttl=1, wait=0.2)
    lease = chain.acquire(key, ttl=1, wait=5)
    assert lease is not None and lease.backend == "local"
    assert time.monotonic() - started >= 1.0, "the lower tier granted inside max_lease"
    # fail-back: Redis answers again, the outage's holder on `local` still excludes others
    redis_server.start()
    time.sleep(0.4)
    assert in_thread(lambda: chain.acquire(key, ttl=1, wait=0.3)) is None
    chain.release(lease)
    back = in_thread(lambda: chain.acquire(key, ttl=1, wait=1))
    assert back is not None and back.backend == "redis"
    assert lower.holder(key) is None
    chain.release(back)
    chain.close()


def test_safe_mode_refuses_leases_longer_than_max_lease(
    tiers: tuple[RedisHashProvider, LocalProvider],
) -> None:
    with pytest.raises(ValueError, match="max_lease"):
        FallbackChain(list(tiers), mode="safe", max_lease=10)  # watchdog_ttl is 30
    chain = FallbackChain(list(tiers), mode="safe", max_lease=30)
    with pytest.raises(ValueError, match="max_lease"):
        chain.acquire("k", ttl=31)
    with pytest.raises(ValueError, match="mode"):
        FallbackChain(list(tiers), mode="yolo")
    with pytest.raises(ValueError, match="unique"):
        FallbackChain([tiers[1], LocalProvider()])


def test_the_breaker_lets_one_probe_through_after_its_reset_timeout() -> None:
    now = [0.0]
    breaker = Breaker(failures=2, reset_timeout=5.0, clock=lambda: now[0])
    changes: list[tuple[str, str]] = []
    breaker.listen(lambda old, new: changes.append((old, new)))
    breaker.failure()
    assert breaker.allow(), "one failure of two keeps it closed"
    breaker.failure()
    assert not breaker.allow()
    now[0] = 4.9
    assert not breaker.allow()
    now[0] = 5.0
    assert breaker.allow(), "the first caller after reset_timeout probes"
    assert not breaker.allow(), "only one probe at a time"
    breaker.release_probe()  # the probe never reached the tier
    assert breaker.allow()
    breaker.failure()  # the probe failed: open again, for a full reset_timeout
    assert not breaker.allow()
    now[0] = 10.0
    assert breaker.allow()
    breaker.success()
    assert breaker.allow() and breaker.state == "closed"
    assert changes == [
        ("closed", "open"), ("open", "half-open"), ("half-open", "open"),  # released
        ("open", "half-open"), ("half-open", "open"),  # failed
        ("open", "half-open"), ("half-open", "closed"),
    ]  # fmt: skip


# -- ended leases through a chain ----------------------------------------------------------


def wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


class ReleaseReplyLost:
    """A real provider whose first release takes effect on the server and then loses its
    reply: the caller sees a timeout for a call that ran."""

    def __init__(self, provider: LockProvider) -> None:
        self.provider = provider
        self.lost = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.provider, name)

    def release(self, lease: Lease) -> None:
        self.provider.release(lease)
        if not self.lost:
            self.lost += 1
            raise BackendUnavailable("reply lost", backend=self.provider.name)


@pytest.mark.parametrize(
    ("kind", "fault"),
    [("redis-hash", "reply lost"), ("mariadb", "reply lost"), ("mariadb", "server paused")],
)
def test_a_release_that_ran_is_never_replayed_onto_the_outer_grant(
    kind: str, fault: str, request: pytest.FixtureRequest, key: str
) -> None:
    """An inner level's release runs on the server but its caller sees a timeout, so the
    chain queues it and sends it again once the tier answers: the outer grant must stay
    whole. (Pausing MariaDB does this for real: it runs the statement on resuming.
    redis-py resets a connection that timed out, so a paused Redis drops the call; the
    lost reply is injected there.)"""
    server = request.getfixturevalue("redis_server" if kind == "redis-hash" else "mariadb_server")
    upper: LockProvider
    if kind == "redis-hash":
        upper = RedisHashProvider(server.url, name="upper")
    else:
        upper = DatabaseProvider(server.url, name="upper", socket_timeout=0.5)
    tier = ReleaseReplyLost(upper) if fault == "reply lost" else upper
    chain = FallbackChain(
        [tier, LocalProvider(name=f"lower-{key}")], breaker=Breaker(reset_timeout=0.2)
    )
    outer = chain.acquire(key, ttl=30)
    inner = chain.acquire(key, ttl=30)
    assert outer is not None and inner is not None and inner.backend == "upper"
    if fault == "server paused":
        server.pause()
    try:
        chain.release(inner)  # times out after it ran; a chain queues it, never raises
    finally:
        if fault == "server paused":
            server.resume()
    time.sleep(0.3)
    probe = chain.acquire(key + ":probe", ttl=30)  # the tier answers: queued releases go
    assert probe is not None
    chain.release(probe)
    assert wait_until(lambda: chain.pending("upper") == 0, 5)
    outer.check()
    assert chain.is_held(outer)
    assert in_thread(lambda: chain.acquire(key, ttl=30, wait=0)) is None
    chain.release(outer)
    upper.close()


def test_a_phantom_row_the_same_thread_meets_again_is_released_for_good(
    mariadb_server: MariaDBServer, key: str
) -> None:
    """An acquire took the row and lost its reply; the chain queued a release of its
    token and served the caller from the next tier. The same thread then gets the row
    again from the database: once all is released, the key must be free, not held by
    the phantom until its ttl runs out."""
    db = DatabaseProvider(mariadb_server.url, name="db")
    flaky = ReplyLost(db)
    chain = FallbackChain(
        [flaky, LocalProvider(name=f"lower-{key}")],
        retry=Retrying(stop=stop_after_attempt(1), reraise=True),
        breaker=Breaker(reset_timeout=0.1),
    )
    first = chain.acquire(key, ttl=30, wait=0)
    assert first is not None and first.backend != "db"
    assert chain.pending("db") == 1
    chain.release(first)
    time.sleep(0.2)
    again = chain.acquire(key, ttl=30, wait=0)
    assert again is not None and again.backend == "db"
    assert wait_until(lambda: chain.pending("db") == 0, 5)
    chain.release(again)
    free = in_thread(lambda: chain.acquire(key, ttl=30, wait=0))
    assert free is not None, "the phantom row still holds the key"
    chain.release(free)
    db.close()


# -- safe mode across tiers and processes --------------------------------------------------


def safe_chain(redis_url: str, lower: LockProvider, max_lease: float) -> FallbackChain:
    upper = RedisHashProvider(redis_url, name="redis", watchdog_ttl=max_lease)
    return FallbackChain(
        [upper, lower], mode="safe", max_lease=max_lease, breaker=Breaker(reset_timeout=0.3)
    )


def test_safe_mode_bounds_a_lower_tiers_lease_by_max_lease(
    redis_server: RedisServer, zookeeper_server: ZooKeeperServer, key: str
) -> None:
    """A ZooKeeper lease does not expire, so the fail-back window alone proves nothing
    about it: it must end by max_lease, and no Redis grant may overlap it."""
    zk = ZooKeeperProvider(zookeeper_server.hosts, name="zk")
    chain = safe_chain(redis_server.url, zk, 1.0)
    redis_server.kill()
    lost: list[Lease] = []
    held = chain.acquire(key, ttl=1, wait=5, on_lost=lost.append)
    assert held is not None and held.backend == "zk"
    redis_server.start()
    ends = held.acquired_at + 1.0
    overlaps = []
    while time.monotonic() < ends + 1.5:
        other = in_thread(lambda: chain.acquire(key, ttl=1, wait=0))
        if other is not None:
            try:
                held.check()
                overlaps.append(other.backend)
            except LockLost:
                pass
            chain.release(other)
        time.sleep(0.1)
    assert not overlaps, f"granted by {overlaps} while the zk lease still passed check()"
    with pytest.raises(LockLost):
        held.check()
    assert lost == [held], "the bounded lease ended without telling its holder"
    chain.close()
    zk.close()


def test_safe_mode_restarts_its_outage_clock_after_a_recovery(
    redis_server: RedisServer, key: str
) -> None:
    """A first outage longer than max_lease, a recovery during which another process
    takes a Redis lease, a second outage: the lower tier must not grant while that
    lease may still be valid."""
    chain = safe_chain(redis_server.url, LocalProvider(name=f"lower-{key}"), 1.0)
    redis_server.kill()
    first = chain.acquire(key + ":warm", ttl=1, wait=5)  # waits out the first outage
    assert first is not None and first.backend != "redis"
    chain.release(first)
    time.sleep(0.5)
    redis_server.start()
    time.sleep(0.5)  # up long enough for anyone looking to see it
    elsewhere = RedisHashProvider(redis_server.url)
    theirs = elsewhere.acquire(key, ttl=1.0)
    assert theirs is not None and theirs.valid_until is not None
    elsewhere.close()
    redis_server.kill()
    ours = chain.acquire(key, ttl=1, wait=3)
    assert ours is not None
    assert time.monotonic() >= theirs.valid_until, "granted while the Redis lease was valid"
    chain.release(ours)
    chain.close()


def test_safe_mode_probes_a_half_open_tier_with_a_ping_not_a_lock(
    redis_server: RedisServer, key: str
) -> None:
    """While the half-open probe was a user's acquire waiting on a contended key, every
    other caller skipped the healthy Redis and got the key from the lower tier."""
    chain = safe_chain(redis_server.url, LocalProvider(name=f"lower-{key}"), 0.5)
    redis_server.kill()
    with pytest.raises(AllBackendsUnavailable):
        chain.acquire(key + ":x", ttl=0.5, wait=0)  # the breaker opens, the clock starts
    time.sleep(0.7)  # the outage outlasts max_lease: the lower tier's gate is open
    redis_server.start()
    elsewhere = RedisHashProvider(redis_server.url)
    theirs = elsewhere.acquire(key, ttl=30)  # another process holds it on the live Redis
    assert theirs is not None
    time.sleep(0.4)  # past reset_timeout: the next caller is the half-open probe
    with ThreadPoolExecutor(max_workers=2) as pool:
        waiting = pool.submit(chain.acquire, key, ttl=0.5, wait=2)
        time.sleep(0.3)
        second = pool.submit(chain.acquire, key, ttl=0.5, wait=0).result()
        assert second is None, f"granted by {second.backend} while Redis held the key"
        elsewhere.release(theirs)
        granted = waiting.result()
    assert granted is not None and granted.backend == "redis"
    chain.release(granted)
    elsewhere.close()
    chain.close()


def test_safe_mode_fail_back_holds_for_a_process_that_never_saw_the_outage(
    redis_server: RedisServer, zookeeper_server: ZooKeeperServer, key: str
) -> None:
    zk = ZooKeeperProvider(zookeeper_server.hosts, name="zk")
    chain = safe_chain(redis_server.url, zk, 3.0)
    redis_server.kill()
    held = chain.acquire(key, ttl=3, wait=10)  # granted by zk once max_lease has passed
    assert held is not None and held.backend == "zk"
    redis_server.start()
    with SPAWN.Pool(1) as pool:
        args = (redis_server.url, zookeeper_server.hosts, key, 3.0)
        theirs = pool.apply(workers.safe_chain_acquire, args)
        still = held.valid_until is not None and time.monotonic() < held.valid_until
    assert still, "too slow to show anything: the zk lease ran out first"
    assert theirs is None, f"a fresh process got the key from {theirs} while zk held it"
    chain.release(held)
    chain.close()
    zk.close()


def test_wrong_credentials_are_refused_not_degraded_to_a_lower_tier(
    redis_server: RedisServer, key: str
) -> None:
    """A wrong password is a configuration error, not an outage: no tier below is asked
    (with `local` there, every lock would exclude nobody), and no retry is made."""
    events: list[Event] = []
    add_observer(events.append)
    with wrong_password(redis_server.url) as url:
        upper, lower = RedisHashProvider(url, name="redis"), LocalProvider(name="wrongpass-local")
        chain = FallbackChain([upper, lower])
        try:
            with pytest.raises(AccessDenied) as refused:
                chain.acquire(key, ttl=5, wait=0)
            assert refused.value.backend == "redis" and "wrong" not in str(refused.value)
            assert len(lower) == 0, "a lower tier granted past bad credentials"
            assert not kinds_of(events, EventKind.DEGRADED)
            assert len(kinds_of(events, EventKind.BACKEND_ERROR)) == 1, "bad credentials retried"
        finally:
            remove_observer(events.append)
            chain.close()
            upper.close()
