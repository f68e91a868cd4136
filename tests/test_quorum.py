"""The quorum lock (RedLock over independent members) on real servers: five redis-servers
killed, paused and restarted with or without their data, and a mixed quorum of Redis,
ZooKeeper and MariaDB with each member killed in turn. The contract suite runs over a
quorum too (kind `quorum` in tests/backends.py)."""

from __future__ import annotations

import functools
import itertools
import multiprocessing
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from locks import (
    BackendUnavailable,
    ConfigError,
    FallbackChain,
    Lease,
    LockNotOwned,
    LockProvider,
    from_config,
)
from locks.backends import (
    DatabaseProvider,
    LocalProvider,
    RedisHashProvider,
    RedisProvider,
    ZooKeeperProvider,
)
from locks.quorum import Quorum, fenced_by_raising
from tests import workers
from tests.servers import MariaDBServer, RedisServer, ZooKeeperServer, wrong_password
from tests.servers.redis_masters import RedisMasters
from tests.test_contract import exclusive_sections
from tests.threads import in_thread

SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture
def made() -> Iterator[list[Quorum]]:
    """Quorums a test made: closed after it, members too."""
    quorums: list[Quorum] = []
    yield quorums
    for quorum in quorums:
        quorum.close()
        for member in quorum.members.values():
            member.close()


def quorum_of(
    masters: RedisMasters, made: list[Quorum], *, hash_members: bool = False, **options: Any
) -> Quorum:
    cls = RedisHashProvider if hash_members else RedisProvider
    members = [cls(url, name=f"r{i}", socket_timeout=0.25, connect_timeout=0.25)
               for i, url in enumerate(masters.urls)]  # fmt: skip
    quorum = Quorum(members, **options)
    made.append(quorum)
    return quorum


def _set(event: threading.Event, _: Lease) -> None:
    event.set()


def dead_redis(name: str) -> RedisProvider:
    return RedisProvider("redis://127.0.0.1:1/0", name=name)


# -- construction, before any I/O -----------------------------------------------------------


def test_a_quorum_smaller_than_a_majority_is_refused() -> None:
    members = [dead_redis(f"r{i}") for i in range(5)]
    with pytest.raises(ValueError, match="quorum must be from 3"):
        Quorum(members, quorum=2)
    with pytest.raises(ValueError, match="quorum must be from 3"):
        Quorum(members, quorum=6)
    with pytest.raises(TypeError, match="quorum"):
        Quorum(members, quorum=True)
    assert Quorum(members).quorum == 3
    assert Quorum(members[:4]).quorum == 3  # a majority of four


def test_members_must_be_shared_across_hosts_and_named_apart() -> None:
    with pytest.raises(ValueError, match="'local' is not shared across hosts"):
        Quorum([dead_redis("a"), dead_redis("b"), LocalProvider()])
    with pytest.raises(ValueError, match="unique"):
        Quorum([dead_redis("a"), dead_redis("a"), dead_redis("b")])
    with pytest.raises(ValueError, match="at least one"):
        Quorum([])
    with pytest.raises(ValueError, match="drift"):
        Quorum([dead_redis("a")], drift=0.9)
    with pytest.raises(ValueError, match="retry"):
        Quorum([dead_redis("a")], retry=0)


def test_which_quorums_are_fenced() -> None:
    """A fence floor must reach n - quorum + 1 members with every n - quorum of them down;
    ZooKeeper's czxid and a database row's fence cannot be raised (docs/quorum.md)."""
    redis = [dead_redis(f"r{i}") for i in range(6)]
    zk = ZooKeeperProvider("127.0.0.1:1", name="zk")
    db = DatabaseProvider("mysql+pymysql://u:p@127.0.0.1:1/locks", name="db")
    try:
        assert Quorum(redis[:5]).capabilities.fenced
        assert Quorum(redis[:3]).capabilities.fenced
        mixed = Quorum([redis[0], zk, db])  # 2 of 3
        assert not mixed.capabilities.fenced
        assert Quorum([redis[0], zk, db], quorum=3).capabilities.fenced  # every grant has redis
        assert not fenced_by_raising([*redis[:4], zk], 3)  # two redis down leave 2 < 3
        assert fenced_by_raising([*redis[:5], zk], 4)  # 6 members, 2 down: 3 redis >= 3
        assert mixed.capabilities.reentrant is False  # the plain redis member is not
        assert Quorum([redis[0], zk, db]).capabilities.expires
        assert not Quorum([redis[0], zk, db]).capabilities.fair
    finally:
        for provider in [*redis, zk, db]:
            provider.close()


# -- five independent redis-servers ---------------------------------------------------------


def test_two_members_down_it_still_grants_and_excludes(
    redis_masters: RedisMasters, made: list[Quorum], key: str
) -> None:
    quorums: list[LockProvider] = [quorum_of(redis_masters, made) for _ in range(2)]
    for server in redis_masters.servers[:2]:
        server.kill()
    most_inside, total, fences = exclusive_sections(quorums, key, threads=6, rounds=20)
    assert (most_inside, total) == (1, 120)
    assert all(a < b for a, b in itertools.pairwise(sorted(fences)))
    assert len(set(fences)) == len(fences)


def test_three_members_down_is_backend_unavailable_naming_them(
    redis_masters: RedisMasters, made: list[Quorum], key: str
) -> None:
    quorum = quorum_of(redis_masters, made)
    for server in redis_masters.servers[2:]:
        server.kill()
    started = time.monotonic()
    with pytest.raises(BackendUnavailable) as raised:
        quorum.acquire(key, ttl=5, wait=5)  # an outage is not waited out
    assert time.monotonic() - started < 2
    assert raised.value.backend == "quorum"
    message = str(raised.value)
    assert "cannot reach 3 of its 5 members" in message
    for name in ("r2", "r3", "r4"):
        assert f"{name}:" in message
    with pytest.raises(BackendUnavailable):
        quorum.ping()
    # what the two live members granted was undone: once back, the key is free
    for server in redis_masters.servers[2:]:
        server.start()
    lease = quorum.acquire(key, ttl=5, wait=0)
    assert lease is not None and len(lease.state.hold.leases) == 5  # type: ignore[attr-defined]
    quorum.release(lease)


def test_a_paused_member_is_charged_to_the_validity(
    redis_masters: RedisMasters, made: list[Quorum], key: str
) -> None:
    """SIGSTOP: the member answers nothing until its socket timeout (0.25 s); the grant
    of the others counts from when they were asked, so the round's time is gone from
    its validity. A ttl shorter than the round never stands."""
    quorum = quorum_of(redis_masters, made)
    redis_masters.servers[4].pause()
    asked = time.monotonic()
    lease = quorum.acquire(key, ttl=2.0, wait=0)
    returned = time.monotonic()
    assert lease is not None
    assert returned - asked >= 0.25
    assert lease.valid_until is not None
    assert lease.valid_until <= asked + 2.0 - 0.02 + 0.005  # ttl, less drift (1 % + 2 ms)
    assert lease.valid_until - returned <= 2.0 - 0.25
    quorum.release(lease)
    # four members live, but a ttl shorter than a round through the paused one: never
    short = quorum.acquire(key + ":short", ttl=0.2, wait=0)
    assert short is None
    redis_masters.servers[4].resume()
    other = quorum_of(redis_masters, made)
    lease = other.acquire(key + ":short", ttl=5, wait=1)  # nothing of the failed try is left
    assert lease is not None
    other.release(lease)


def test_a_minority_restarted_empty_keeps_the_exclusion(
    redis_masters: RedisMasters, made: list[Quorum], key: str
) -> None:
    holder, rival = quorum_of(redis_masters, made), quorum_of(redis_masters, made)
    lease = holder.acquire(key, ttl=30)
    assert lease is not None
    for server in redis_masters.servers[:2]:
        server.restart_empty()
    assert rival.acquire(key, ttl=30, wait=0.3) is None
    assert holder.is_held(lease)
    holder.release(lease)


def test_a_majority_restarted_empty_forgets_the_lease_and_its_holder_is_told(
    redis_masters: RedisMasters, made: list[Quorum], key: str
) -> None:
    """The documented limit (docs/quorum.md, "Members that forget"): with a majority's
    data gone the lock is free for a rival at once, and the holder hears of it at its
    next renewal, never later than its validity."""
    holder, rival = quorum_of(redis_masters, made, watchdog_ttl=0.9), quorum_of(redis_masters, made)
    lost = threading.Event()
    lease = holder.acquire(key, on_lost=lambda _: lost.set())
    assert lease is not None
    for server in redis_masters.servers[:3]:
        server.restart_empty()
    other = rival.acquire(key, ttl=30, wait=0)
    assert other is not None, "restarted empty, the majority had forgotten the holder"
    assert lost.wait(0.9), "the holder was not told it lost the lock"
    assert lease.lost
    with pytest.raises(LockNotOwned):
        holder.release(lease)
    rival.release(other)


def test_a_watchdog_lease_lives_on_two_members_down_and_is_lost_with_three(
    redis_masters: RedisMasters, made: list[Quorum], key: str
) -> None:
    quorum = quorum_of(redis_masters, made, watchdog_ttl=0.6)
    lost = threading.Event()
    lease = quorum.acquire(key, on_lost=lambda _: lost.set())
    assert lease is not None
    redis_masters.servers[0].kill()
    redis_masters.servers[1].kill()
    time.sleep(1.5)  # several renewals on three members
    assert not lost.is_set()
    lease.check()
    redis_masters.servers[2].kill()
    assert lost.wait(1.0), "renewal reached 2 of 5 and nobody was told"
    assert lease.lost


def test_a_release_a_member_misses_is_queued_and_sent_once_it_answers(
    redis_masters: RedisMasters, made: list[Quorum], key: str
) -> None:
    quorum = quorum_of(redis_masters, made)
    lease = quorum.acquire(key, ttl=60)
    assert lease is not None
    redis_masters.servers[1].kill()
    quorum.release(lease)  # no error: four released, one queued
    assert quorum.pending("r1") == 1
    redis_masters.servers[1].start()  # with its data: the key is still held there
    member = quorum.members["r1"]
    assert member.holder(key) is not None
    quorum.ping()  # it answers: what waited for it is sent
    deadline = time.monotonic() + 2
    while quorum.pending("r1") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert quorum.pending("r1") == 0
    assert member.holder(key) is None


def test_fences_strictly_increase_across_1000_grants_with_members_killed_and_restarted(
    redis_masters: RedisMasters, made: list[Quorum], key: str
) -> None:
    """Two clients take turns while up to two members at a time are down, killed and
    restarted with their data or (sometimes) without. The first phases are the case the
    raised floor exists for: members 0 and 1 first see the key after the others (their
    counters start from their clocks, far above), and the next majority shares only
    member 2 with theirs. Without the floor the fence falls back there."""
    clients = [quorum_of(redis_masters, made), quorum_of(redis_masters, made)]
    servers = redis_masters.servers
    rng = random.Random(1000)
    down: set[int] = set()
    fences: list[int] = []

    def set_down(wanted: set[int], *, empty: bool = False) -> None:
        for index in down - wanted:
            if empty:
                servers[index].restart_empty()
            else:
                servers[index].start()
        for index in wanted - down:
            servers[index].kill()
        down.clear()
        down.update(wanted)

    def grant(times: int) -> None:
        for _ in range(times):
            client = clients[len(fences) % 2]
            lease = client.acquire(key, ttl=10, wait=2)
            assert lease is not None
            fences.append(lease.fence)
            client.release(lease)

    phases = [{0, 1}, {3, 4}, {0, 1}]
    for phase in phases:
        set_down(phase)
        grant(50)
    while len(fences) < 1000:
        size = rng.choice([0, 1, 2])
        set_down(set(rng.sample(range(5), size)), empty=rng.random() < 0.2)
        grant(50)
    set_down(set())
    backwards = [(i, a, b) for i, (a, b) in enumerate(itertools.pairwise(fences)) if a >= b]
    assert not backwards, f"{len(backwards)} fences did not rise, first: {backwards[:3]}"


def test_split_votes_among_many_clients_resolve(
    redis_masters: RedisMasters, made: list[Quorum], key: str
) -> None:
    """Three quorum objects (as three hosts), twelve threads, all at once: every one of
    them gets the lock, one at a time, without livelock."""
    quorums: list[LockProvider] = [quorum_of(redis_masters, made) for _ in range(3)]
    most_inside, total, _ = exclusive_sections(quorums, key, threads=12, rounds=10)
    assert (most_inside, total) == (1, 120)


def test_mutual_exclusion_across_processes_with_two_members_down(
    redis_masters: RedisMasters, key: str, tmp_path: Path
) -> None:
    redis_masters.servers[0].kill()
    redis_masters.servers[3].kill()
    counter = tmp_path / "counter"
    counter.write_text("0")
    with SPAWN.Pool(3) as pool:
        args = [("quorum", redis_masters.url, key, str(counter), 60)] * 3
        results = pool.starmap(workers.increment, args)
    assert int(counter.read_text()) == 180
    seen = sorted(entry for result in results for entry in result)
    assert [value for value, _ in seen] == list(range(180))
    assert all(a < b for a, b in itertools.pairwise(fence for _, fence in seen))


def test_a_non_reentrant_quorum_refuses_its_holder_without_waiting_for_ever(
    redis_masters: RedisMasters, made: list[Quorum], key: str
) -> None:
    quorum = quorum_of(redis_masters, made)
    lease = quorum.acquire(key, ttl=30)
    assert lease is not None
    started = time.monotonic()
    assert quorum.acquire(key, ttl=30) is None  # wait=None: it would wait for itself
    assert quorum.acquire(key, ttl=30, wait=0.2) is None
    assert 0.2 <= time.monotonic() - started < 1.0
    quorum.release(lease)


def test_a_broken_quorum_is_a_tier_a_chain_moves_past(
    redis_masters: RedisMasters, made: list[Quorum], key: str
) -> None:
    quorum = quorum_of(redis_masters, made)
    chain = FallbackChain([quorum, LocalProvider()], name="with-quorum")
    lease = chain.acquire(key, ttl=5, wait=0)
    assert lease is not None and lease.backend == "quorum"
    chain.release(lease)
    for server in redis_masters.servers[:3]:
        server.kill()
    lease = chain.acquire(key, ttl=5, wait=0)
    assert lease is not None and lease.backend == "local"
    chain.release(lease)
    chain.close()


def test_a_quorum_from_toml(redis_masters: RedisMasters, key: str, tmp_path: Path) -> None:
    members = "\n".join(
        f'r{i} = {{ type = "redis", url = "{url}" }}' for i, url in enumerate(redis_masters.urls)
    )
    config = tmp_path / "locks.toml"
    config.write_text(
        f"[backends]\n{members}\n"
        'q = { type = "quorum", members = ["r0", "r1", "r2", "r3", "r4"], quorum = 3 }\n'
        '[scenarios]\norder = { chain = ["q"] }\n'
    )
    registry = from_config(config)
    try:
        quorum = registry.backend("q")
        assert isinstance(quorum, Quorum) and quorum.quorum == 3
        with registry.lock("order", key, ttl=5, wait=1) as lease:
            assert lease.backend == "q" and lease.fence > 0
    finally:
        registry.close()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ('{ type = "quorum", members = ["r0", "nope"] }', r"backends\.q\.members\[1\]: unknown"),
        ('{ type = "quorum", members = ["r0", "r1", "r2"], quorum = 1 }', r"backends\.q\.quorum"),
        ('{ type = "quorum", members = "r0" }', r"backends\.q\.members: must be a list"),
        ('{ type = "quorum", members = ["r0", "q"] }', r"backends\.q\.members\[1\]"),
        ('{ type = "quorum", members = ["r0"], colour = 1 }', r"backends\.q\.colour: unknown"),
    ],
)
def test_a_bad_quorum_config_names_where(spec: str, message: str) -> None:
    members = "\n".join(f'r{i} = {{ type = "redis", url = "redis://127.0.0.1:1/0" }}'
                        for i in range(3))  # fmt: skip
    with pytest.raises(ConfigError, match=message):
        from_config(_toml(f"[backends]\n{members}\nq = {spec}\n"))


def _toml(text: str) -> dict[str, Any]:
    import tomllib  # noqa: PLC0415

    return tomllib.loads(text)


# -- a mixed quorum: redis + zookeeper + mariadb, 2 of 3 ------------------------------------


@pytest.mark.parametrize("down", ["redis", "zookeeper", "database"])
def test_a_mixed_quorum_excludes_across_processes_with_each_member_down(
    down: str, request: pytest.FixtureRequest, key: str, tmp_path: Path
) -> None:
    servers: dict[str, RedisServer | ZooKeeperServer | MariaDBServer] = {
        kind: request.getfixturevalue(f"{fixture}_server")
        for kind, fixture in [("redis", "redis"), ("zookeeper", "zookeeper"),
                              ("database", "mariadb")]
    }  # fmt: skip
    address = "|".join(server.url for server in servers.values())
    servers[down].kill()
    counter = tmp_path / "counter"
    counter.write_text("0")
    with SPAWN.Pool(3) as pool:
        args = [("quorum-mixed", address, key, str(counter), 40)] * 3
        results = pool.starmap(workers.increment, args)
    assert int(counter.read_text()) == 120
    seen = sorted(entry for result in results for entry in result)
    assert [value for value, _ in seen] == list(range(120))
    assert {fence for _, fence in seen} == {0}, "a mixed 2-of-3 quorum is not fenced"


def test_lease_fields(redis_masters: RedisMasters, made: list[Quorum], key: str) -> None:
    quorum = quorum_of(redis_masters, made, hash_members=True, name="orders")
    outer = quorum.acquire(key, ttl=10)
    inner = quorum.acquire(key, ttl=10)
    assert isinstance(outer, Lease) and isinstance(inner, Lease)
    assert (outer.backend, outer.depth, inner.depth) == ("orders", 1, 2)
    assert inner.fence == outer.fence > 0
    quorum.release(inner)
    assert quorum.is_held(outer)
    quorum.release(outer)
    assert not quorum.is_held(outer)


def test_a_bound_lease_ends_on_time_everywhere_and_says_so(
    redis_masters: RedisMasters, made: list[Quorum], key: str
) -> None:
    """What a safe-mode chain does to its lower tiers' grants, a quorum does too."""
    quorum, other = quorum_of(redis_masters, made, watchdog_ttl=3), quorum_of(redis_masters, made)
    for ttl in (None, 30.0):
        lost = threading.Event()
        lease = quorum.acquire(key, ttl=ttl, on_lost=functools.partial(_set, lost))
        assert lease is not None
        quorum.bound(lease, 0.4)
        assert lease.valid_until is not None and lease.valid_until <= lease.acquired_at + 0.4
        assert other.acquire(key, ttl=5, wait=0) is None
        assert lost.wait(1.5), f"ttl={ttl}: the bound passed in silence"
        taken = other.acquire(key, ttl=5, wait=1)
        assert taken is not None, "a member still held the bounded grant"
        other.release(taken)
    chain = FallbackChain([quorum, LocalProvider()], mode="safe", max_lease=3)
    chain.close()  # a safe chain accepts a quorum as a tier: it can be read and bounded


def test_a_lease_is_served_by_any_quorum_object_of_the_same_name(
    redis_masters: RedisMasters, made: list[Quorum], key: str
) -> None:
    """As on every backend, a lease can be released through another provider object of
    its lock domain, and one from a closed object is simply over (found by the model:
    `is_held` raised instead of answering False)."""
    first, second = quorum_of(redis_masters, made), quorum_of(redis_masters, made)
    lease = first.acquire(key, ttl=30)
    assert lease is not None
    assert second.is_held(lease)
    assert second.extend(lease, 20).ttl == 20
    second.release(lease)
    assert not first.is_held(lease)
    closed = first.acquire(key, ttl=30)
    assert closed is not None
    first.close()
    assert not second.is_held(closed)
    with pytest.raises(LockNotOwned):
        second.extend(closed, 10)
    with pytest.raises(LockNotOwned):
        second.release(closed)


def test_a_member_that_refuses_access_counts_as_down_even_as_the_gate(
    redis_masters: RedisMasters, made: list[Quorum]
) -> None:
    """A member with wrong credentials is a member the quorum goes on without (each
    refusal an event), in the first round and when it is the gate of a contended key."""
    with wrong_password(redis_masters.urls[0]) as bad:
        members = [RedisProvider(bad, name="r0"),
                   *(RedisProvider(url, name=f"r{i}")
                     for i, url in enumerate(redis_masters.urls) if i)]  # fmt: skip
        quorum = Quorum(members)
        made.append(quorum)
        key = next(f"gate:{i}" for i in itertools.count() if quorum._order(f"gate:{i}")[0] == "r0")
        holder = quorum.acquire(key, ttl=5)
        assert holder is not None and sorted(holder.state.hold.leases) == ["r1", "r2", "r3", "r4"]  # type: ignore[attr-defined]
        threading.Timer(0.2, quorum.release, [holder]).start()
        waiter = in_thread(lambda: quorum.acquire(key, ttl=5, wait=3))
        assert waiter is not None and waiter.fence > holder.fence
        quorum.release(waiter)


def test_holder_is_sure_of_nobody_only_when_enough_members_answered(
    redis_masters: RedisMasters, made: list[Quorum], key: str
) -> None:
    """A safe-mode chain reads its lower tiers' holders: "nobody" must be certain."""
    quorum = quorum_of(redis_masters, made)
    lease = quorum.acquire(key, ttl=30)
    assert lease is not None
    for server in redis_masters.servers[:2]:
        server.kill()
    seen = quorum.holder(key)  # three members name the holder
    assert seen is not None and (seen.owner, seen.fence) == (lease.owner, lease.fence)
    redis_masters.servers[2].kill()  # two name it, three cannot say: it may still hold
    seen = quorum.holder(key)
    assert seen is not None and seen.owner == lease.owner
    with pytest.raises(BackendUnavailable):  # two answered "nobody": three could hold it
        quorum.holder(key + ":free")
    redis_masters.servers[2].start()
    assert quorum.holder(key + ":free") is None  # three answered "nobody": sure
