"""Redis behind Sentinel and as a Cluster, proven by killing and moving things: a
failover keeps leases, renewals, releases and waiting working; `sync_replicas` turns the
seeds' lost-lock hazard (a promoted replica that never got the lock) from a double grant
into a refused acquire; a cluster slot moving under a lock is followed.

The contract suite runs on both topologies too (tests/backends.py); this file holds what
only a topology can show.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest
import redis

from locks import (
    AccessDenied,
    BackendError,
    BackendUnavailable,
    Lease,
    LockNotOwned,
    LockProvider,
    aio,
)
from locks.backends import RedisHashProvider, RedisProvider
from locks.backends.redis.scripts import acl_rule, sentinel_acl_rule
from locks.backends.redis.topology import DEFAULT_URL
from locks.names import redis_hash_tag
from tests.aio_bridge import Threaded
from tests.servers import RedisServer
from tests.servers.redis_topologies import ClusterTopology, RedisNode, SentinelTopology

T = TypeVar("T")


@pytest.fixture
def made() -> Iterator[list[Any]]:
    providers: list[Any] = []
    yield providers
    for provider in providers:
        provider.close()


Build = Callable[..., Any]


@pytest.fixture(params=["threaded", "asyncio"])
def build(request: pytest.FixtureRequest, made: list[Any]) -> Build:
    """`build(hash_lock, url, **options)`: a Redis provider of the face under test (the
    asyncio one called through tests/aio_bridge.py), closed after the test."""

    def make(hash_lock: bool, url: str, **options: Any) -> Any:
        if request.param == "threaded":
            provider: Any = (RedisHashProvider if hash_lock else RedisProvider)(url, **options)
        else:
            cls = aio.RedisHashProvider if hash_lock else aio.RedisProvider
            provider = Threaded(cls(url, **options))
        made.append(provider)
        return provider

    return make


def lock_key(key: str) -> str:
    return f"locks:{{{redis_hash_tag(key)}}}"


def elsewhere(call: Callable[[], T]) -> T:
    """`call` on another thread: another owner than the test's thread."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(call).result(timeout=60)


def acquire_until_served(
    provider: LockProvider, key: str, *, ttl: float | None, timeout: float = 20.0
) -> Lease | None:
    """Another owner tries `key` (one try each) until a server answers. Only
    BackendUnavailable may come while no primary answers."""
    deadline = time.monotonic() + timeout

    def attempt() -> Lease | None:
        while True:
            try:
                return provider.acquire(key, ttl=ttl, wait=0)
            except BackendUnavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    return elsewhere(attempt)


def waiting(provider: LockProvider, key: str) -> tuple[threading.Thread, list[Lease | None]]:
    """A started thread (another owner) that waits for `key` for up to 25 s, trying
    again while no primary answers; its outcome lands in the list."""
    got: list[Lease | None] = []

    def wait_for_it() -> None:
        deadline = time.monotonic() + 25
        while time.monotonic() < deadline:
            try:
                got.append(provider.acquire(key, ttl=5, wait=deadline - time.monotonic()))
                return
            except BackendUnavailable:  # while no primary answers
                time.sleep(0.05)
        got.append(None)

    thread = threading.Thread(target=wait_for_it)
    thread.start()
    return thread, got


# -- checked before any I/O ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"sentinels": ["127.0.0.1"], "service": "locks"}, "sentinels[0]"),
        ({"sentinels": ["127.0.0.1:0"], "service": "locks"}, "sentinels[0]"),
        ({"sentinels": "127.0.0.1:26379", "service": "locks"}, "sentinels"),
        ({"sentinels": ["127.0.0.1:26379"]}, "service"),
        ({"service": "locks"}, "sentinels"),
        ({"cluster_nodes": []}, "cluster_nodes"),
        ({"cluster_nodes": ["a:1"], "sentinels": ["b:2"], "service": "s"}, "sentinels"),
        ({"cluster_nodes": ["a:1"], "db": 3}, "db"),
        ({"url": "redis+cluster://a:1/2"}, "database 0"),
        ({"url": "redis+sentinel://a:1"}, "service"),
        ({"url": "redis+sentinel://a:1/locks/x"}, "database"),
        ({"url": "redis://h:1/0", "cluster_nodes": ["a:1"]}, "url"),
        ({"sync_replicas": -1}, "sync_replicas"),
        ({"sync_replicas": True}, "sync_replicas"),
        ({"sync_replicas": 1, "sync_timeout": 0.5}, "socket_timeout"),
        ({"sync_replicas": 1, "sync_timeout": 0}, "sync_timeout"),
        ({"sync_aof": True}, "sync_replicas"),
    ],
)
def test_bad_topology_arguments_are_refused_before_any_io(
    kwargs: dict[str, object], named: str
) -> None:
    for face in (RedisProvider, aio.RedisProvider):
        with pytest.raises(ValueError, match=re.escape(named)):
            face(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("scheme", ["redis+cluster", "redis+sentinel"])
def test_an_unreachable_topology_is_an_outage_of_the_first_call_never_ambiguous(
    scheme: str, build: Build
) -> None:
    """Constructing does no I/O; the first call is a BackendUnavailable naming the
    topology (not the password), and not ambiguous: no primary was found, so nothing
    was sent and a chain has nothing to clean up."""
    from tests.ports import free_port  # noqa: PLC0415

    port = free_port()
    url = f"{scheme}://user:s3cret@127.0.0.1:{port}" + ("/locks" if "sentinel" in scheme else "")
    provider = build(False, url)
    with pytest.raises(BackendUnavailable, match=f"127.0.0.1:{port}") as caught:
        provider.acquire("k", ttl=5, wait=0)
    assert "s3cret" not in str(caught.value)
    assert not caught.value.ambiguous
    assert len(str(caught.value)) < 500


# -- sync_replicas on a server without enough replicas ------------------------------------


def test_a_grant_no_replica_acknowledged_is_undone_and_unavailable(
    redis_server: RedisServer, key: str, build: Build
) -> None:
    """A lone server has no replica: every grant is taken back, never left behind."""
    for hash_lock in (False, True):
        provider = build(hash_lock, redis_server.url, sync_replicas=1, sync_timeout=0.05)
        with pytest.raises(BackendUnavailable, match="0 of 1 replicas") as caught:
            provider.acquire(key, ttl=5, wait=0)
        assert not caught.value.ambiguous  # undone: nothing to clean up later
        with redis.Redis.from_url(redis_server.url) as admin:
            assert admin.exists(lock_key(key)) == 0


def test_waitaof_on_a_server_that_lacks_it_is_loud_and_leaves_nothing(
    redis_server: RedisServer, key: str, build: Build
) -> None:
    provider = build(True, redis_server.url, sync_replicas=1, sync_timeout=0.05, sync_aof=True)
    with redis.Redis.from_url(redis_server.url) as admin:
        if (
            int(admin.info("server")["redis_version"].split(".")[0]) * 100
            + int(admin.info("server")["redis_version"].split(".")[1])
            >= 702
        ):
            pytest.skip("this Redis has WAITAOF")  # pragma: no cover
        with pytest.raises(BackendError) as caught:
            provider.acquire(key, ttl=5, wait=0)
        assert not isinstance(caught.value, BackendUnavailable)
        assert "WAITAOF" in str(caught.value) or "unknown command" in str(caught.value)
        assert admin.exists(lock_key(key)) == 0


# -- Sentinel -----------------------------------------------------------------------------


def test_sentinel_failover_keeps_a_synced_lease_its_renewals_release_and_fence(
    sentinel_topology: SentinelTopology, key: str, build: Build
) -> None:
    """Kill the primary under a watchdog lease taken with sync_replicas=1: once the
    replica is promoted the lease is renewed there, is still held, excludes others,
    is released there, and the next grant's fence is above it."""
    # renewed every 10 s: a lease outlives a failover of up to ~20 s (measured: mostly
    # 1.3-5.3 s, now and then 13-18 s when the first election fails)
    holder = build(True, sentinel_topology.url, watchdog_ttl=30.0, sync_replicas=1,
                   sync_timeout=0.2)  # fmt: skip
    other = build(True, sentinel_topology.url)
    lost: list[Lease] = []
    lease = holder.acquire(key, on_lost=lost.append)
    assert lease is not None
    old = sentinel_topology.primary()
    old.kill()
    killed_at = time.monotonic()
    sentinel_topology.wait_failover(old.port)
    # the old primary comes back as a replica, so synced renewals can succeed again
    sentinel_topology.ensure_healthy()
    sentinel_topology.hold_still()
    print(f"failover took {time.monotonic() - killed_at:.2f} s")
    refused = acquire_until_served(other, key, ttl=5)
    assert refused is None  # the promoted replica has the lock
    time.sleep(10.5)  # past a renewal (every watchdog_ttl/3 = 10 s) on the new primary
    state = sentinel_topology.describe  # in each message: a harness race shows there
    assert holder.is_held(lease), state()
    lease.check()
    assert not lost, state()
    try:
        holder.release(lease)
    except LockNotOwned as error:
        pytest.fail(f"{error}; {state()}")
    taken = elsewhere(lambda: other.acquire(key, ttl=5, wait=0))
    assert taken is not None, state()
    assert taken.fence > lease.fence


def test_sentinel_failover_wakes_a_waiter_on_the_new_primary(
    sentinel_topology: SentinelTopology, key: str, build: Build
) -> None:
    """A waiter parked across a failover is woken by a release on the new primary well
    before the 30 s ttl that bounds a lost wake-up."""
    holder = build(False, sentinel_topology.url, sync_replicas=1, sync_timeout=0.2)
    waiter_provider = build(False, sentinel_topology.url)
    lease = holder.acquire(key, ttl=30, wait=0)
    assert lease is not None
    thread, got = waiting(waiter_provider, key)
    time.sleep(0.3)
    old = sentinel_topology.primary()
    old.kill()
    sentinel_topology.wait_failover(old.port)
    sentinel_topology.ensure_healthy()
    sentinel_topology.hold_still()
    time.sleep(1.0)  # the waiter has resubscribed on the new primary by now
    released_at = time.monotonic()
    holder.release(lease)
    thread.join(timeout=30)
    handed_over = time.monotonic() - released_at
    assert got and isinstance(got[0], Lease), got
    assert handed_over < 3.0, f"the waiter was not woken: {handed_over:.2f} s"
    waiter_provider.release(got[0])


def test_a_demoted_primary_is_an_outage_never_a_raw_readonly(
    sentinel_topology: SentinelTopology, key: str, build: Build
) -> None:
    """Straight to a replica, and through Sentinel while it demotes the primary (a
    graceful `SENTINEL FAILOVER`): grants or BackendUnavailable, nothing else."""
    replica = sentinel_topology.replica()
    direct = build(False, replica.url)
    through = build(True, sentinel_topology.url)
    with pytest.raises(BackendUnavailable, match="ReadOnlyError"):
        direct.acquire(key, ttl=5, wait=0)
    old_port = sentinel_topology.primary_port()
    fail_over(sentinel_topology)
    outcomes: list[str] = []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            lease = through.acquire(f"{key}:{len(outcomes)}", ttl=5, wait=0)
            assert lease is not None
            through.release(lease)
            outcomes.append("granted")
        except BackendUnavailable:
            outcomes.append("unavailable")
        if sentinel_topology.primary_port() != old_port and outcomes[-1] == "granted":
            break
        time.sleep(0.01)
    where = f"outcomes {outcomes[-6:]} of {len(outcomes)}; {sentinel_topology.describe()}"
    assert sentinel_topology.primary_port() != old_port, where
    assert outcomes[-1] == "granted", where


def fail_over(topology: SentinelTopology) -> None:
    """`SENTINEL FAILOVER`, asked again while Sentinel finds no replica to promote yet
    (NOGOODSLAVE: it has not seen the replica's link healthy recently enough, e.g. just
    after an earlier test's failover; it failed a CI run once)."""
    deadline = time.monotonic() + 15
    while True:
        try:
            with topology.sentinels[0].client() as client:
                client.execute_command("SENTINEL", "FAILOVER", topology.service)
            return
        except redis.ResponseError as error:
            if "NOGOODSLAVE" not in str(error) or time.monotonic() > deadline:
                raise AssertionError(f"{error}; {topology.describe()}") from error
            time.sleep(0.2)


def cut_replication(topology: SentinelTopology) -> None:
    """Stop the replica from receiving anything more from the primary, without pausing
    it (Sentinel must still see it healthy, to promote it): it reconnects with a
    password the primary rejects, after its link is killed."""
    replica, primary = topology.replica(), topology.primary()
    with replica.admin() as client:
        client.config_set("masterauth", "not-the-password")
    with primary.admin() as client:
        client.client_kill_filter(_type="replica")

    def link_down() -> bool:
        return replica.info("replication").get("master_link_status") == "down"

    deadline = time.monotonic() + 5
    while not link_down():
        assert time.monotonic() < deadline, "the replication link stayed up"
        time.sleep(0.02)


@pytest.mark.parametrize("sync_replicas", [0, 1])
def test_the_seeds_hazard_a_promoted_replica_that_missed_the_lock(
    sentinel_topology: SentinelTopology, key: str, build: Build, sync_replicas: int
) -> None:
    """Hold a lock whose write never reached the replica, kill the primary, let Sentinel
    promote the replica. Without sync_replicas a second owner gets the lock the first
    still holds (the hazard, asserted where it exists); with sync_replicas=1 the first
    grant is refused and undone instead, so no second owner can overlap it."""
    first = build(True, sentinel_topology.url, sync_replicas=sync_replicas, sync_timeout=0.2)
    second = build(True, sentinel_topology.url)
    before = first.acquire(f"{key}:before", ttl=60, wait=0)  # replicated while linked
    assert before is not None
    cut_replication(sentinel_topology)
    if sync_replicas:
        with pytest.raises(BackendUnavailable, match="0 of 1") as caught:
            first.acquire(key, ttl=60, wait=0)
        assert not caught.value.ambiguous
        held = None
    else:
        held = first.acquire(key, ttl=60, wait=0)
        assert held is not None  # granted by the primary alone
    old = sentinel_topology.primary()
    old.kill()
    sentinel_topology.wait_failover(old.port)
    taken = acquire_until_served(second, key, ttl=60)
    if sync_replicas:
        assert taken is not None  # the only owner: the first was never granted
    else:
        assert held is not None and taken is not None  # two owners of one lock at once
        assert taken.fence > held.fence  # the fence still tells them apart
        # but its holder is told, as soon as it reaches the promoted replica
        first.ping()
        deadline = time.monotonic() + 2
        while not held.lost and time.monotonic() < deadline:
            time.sleep(0.01)
        assert held.lost, f"the lost grant was never told; {sentinel_topology.describe()}"
        assert not before.lost and first.is_held(before)  # the replicated one is kept
    # the lock the replica did receive survives the failover
    assert elsewhere(lambda: second.acquire(f"{key}:before", ttl=5, wait=0)) is None


# -- Cluster ------------------------------------------------------------------------------


def test_cluster_failover_keeps_a_lease_and_wakes_a_waiter(
    cluster_topology: ClusterTopology, key: str, build: Build
) -> None:
    """Kill the primary of the lock's slot: its replica takes over with the lock, the
    holder's renewals and release reach it, and a waiter subscribed before the failover
    is woken well before the 30 s that bound a lost wake-up."""
    holder = build(True, cluster_topology.url, watchdog_ttl=6.0)
    waiter_provider = build(False, cluster_topology.url)
    lost: list[Lease] = []
    lease = holder.acquire(key, on_lost=lost.append)
    assert lease is not None
    thread, got = waiting(waiter_provider, key)
    time.sleep(0.3)
    old = cluster_topology.primary_of(lock_key(key))
    old.kill()
    started = time.monotonic()
    cluster_topology.wait_failover(lock_key(key), old.port)
    print(f"cluster failover took {time.monotonic() - started:.2f} s")
    time.sleep(2.5)  # a renewal lands on the new primary; the waiter resubscribes
    assert holder.is_held(lease)
    assert not lost
    released_at = time.monotonic()
    holder.release(lease)
    thread.join(timeout=30)
    assert got and isinstance(got[0], Lease), got
    assert time.monotonic() - released_at < 3.0
    assert got[0].fence > lease.fence
    waiter_provider.release(got[0])


@pytest.mark.parametrize("hash_lock", [False, True])
def test_an_asyncio_acquire_cancelled_on_a_cluster_is_undone_on_its_primary(
    cluster_topology: ClusterTopology, key: str, hash_lock: bool
) -> None:
    """The request is on the key's primary (paused), its reply not back, when the task
    is cancelled: once the primary answers, the grant it made is released (the undo
    written behind it on its connection, and the release of its token after it: the
    test fails only without both), never left for its ttl."""
    primary = cluster_topology.primary_of(lock_key(key))
    outcome: list[str] = []

    async def main() -> None:
        cls = aio.RedisHashProvider if hash_lock else aio.RedisProvider
        provider = cls(cluster_topology.url, socket_timeout=2.0)
        try:
            # the slot table read, and the script cached on the primary (a NOSCRIPT
            # reply to the cancelled call would grant nothing to undo)
            warm = await provider.acquire(key, ttl=30)
            assert warm is not None
            await provider.release(warm)
            primary.pause()
            task = asyncio.create_task(provider.acquire(key, ttl=30))
            await asyncio.sleep(0.2)  # sent, not answered
            task.cancel()
            threading.Timer(0.3, primary.resume).start()
            try:
                await task
                outcome.append("granted")
            except asyncio.CancelledError:
                outcome.append("cancelled")
            await asyncio.sleep(0.5)  # the drain reads the grant's reply and the undo's
        finally:
            await provider.close()

    asyncio.run(main())
    assert outcome == ["cancelled"]
    with primary.admin() as client:
        assert client.exists(lock_key(key)) == 0, "the cancelled acquire's grant was left"


def migrate_slot(
    topology: ClusterTopology, key: str, *, finish: bool
) -> tuple[RedisNode, RedisNode]:
    """Move `key`'s slot to another primary: MIGRATING/IMPORTING, MIGRATE its keys, and
    (`finish`) SETSLOT NODE everywhere. Unfinished, the source answers ASK for keys it
    no longer has."""
    source = topology.primary_of(key)
    target = next(
        node for node in topology.nodes
        if node is not source and node.info("replication").get("role") == "master"
    )  # fmt: skip
    with source.admin() as src, target.admin() as dst:
        slot = int(src.execute_command("CLUSTER", "KEYSLOT", key))
        source_id = src.execute_command("CLUSTER", "MYID").decode()
        target_id = dst.execute_command("CLUSTER", "MYID").decode()
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
        if keys:
            src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
        if finish:
            for node in topology.nodes:
                if node.info("replication").get("role") != "master":
                    continue
                with node.admin() as client:
                    client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
    return source, target


@pytest.mark.parametrize("sync_replicas", [0, 1])
def test_cluster_slot_migration_is_followed_through_ask_and_moved(
    cluster_topology: ClusterTopology,
    key: str,
    build: Build,
    sync_replicas: int,
) -> None:
    holder = build(False, cluster_topology.url, sync_replicas=sync_replicas, sync_timeout=0.2)
    other = build(False, cluster_topology.url, sync_replicas=sync_replicas, sync_timeout=0.2)
    lease = holder.acquire(key, ttl=30, wait=0)
    assert lease is not None
    migrate_slot(cluster_topology, lock_key(key), finish=False)
    # the source answers ASK: followed to the target, which has the lock
    assert elsewhere(lambda: other.acquire(key, ttl=5, wait=0)) is None
    assert holder.is_held(lease)
    holder.extend(lease, 30)
    migrate_slot(cluster_topology, lock_key(key), finish=True)
    # now MOVED: followed, and the slot table refreshed
    assert elsewhere(lambda: other.acquire(key, ttl=5, wait=0)) is None
    holder.release(lease)
    taken = elsewhere(lambda: other.acquire(key, ttl=5, wait=0))
    assert taken is not None and taken.fence > lease.fence


def test_clients_passed_in_serve_each_topology_and_stay_open(
    sentinel_topology: SentinelTopology,
    cluster_topology: ClusterTopology,
    key: str,
    made: list[Any],
) -> None:
    """A redis-py Sentinel primary client and a RedisCluster given as `client=` work as
    the URL forms do, are named by their topology, and are left open by close()."""
    from redis.cluster import ClusterNode, RedisCluster  # noqa: PLC0415
    from redis.sentinel import Sentinel  # noqa: PLC0415

    sentinels = [("127.0.0.1", s.port) for s in sentinel_topology.sentinels]
    manager = Sentinel(sentinels, socket_timeout=1)  # type: ignore[no-untyped-call]
    sentinel_client: redis.Redis = manager.master_for(  # type: ignore[no-untyped-call]
        sentinel_topology.service, socket_timeout=1
    )
    node = ClusterNode("127.0.0.1", cluster_topology.nodes[0].port)  # type: ignore[no-untyped-call]
    cluster_client = RedisCluster(startup_nodes=[node])
    clients: list[tuple[redis.Redis | RedisCluster, str]] = [
        (sentinel_client, "sentinel "), (cluster_client, "cluster "),
    ]  # fmt: skip
    for client, named in clients:
        provider = RedisHashProvider(client=client)
        assert provider.address.startswith(named)
        lease = provider.acquire(key, ttl=5, wait=0)
        assert lease is not None

        def other_try(p: RedisHashProvider = provider) -> Lease | None:
            return p.acquire(key, ttl=5, wait=0)

        assert elsewhere(other_try) is None
        provider.release(lease)
        provider.close()
        assert client.get(lock_key(key)) is None  # still usable: not ours to close
    cluster_client.close()
    sentinel_client.close()


def test_asyncio_clients_passed_in_serve_each_topology_and_stay_open(
    sentinel_topology: SentinelTopology, cluster_topology: ClusterTopology, key: str
) -> None:
    """The same with redis.asyncio's Sentinel primary client and RedisCluster: a
    cluster's lends the provider its nodes and settings for pools of the provider's own,
    and both are left open by close()."""
    from redis.asyncio.cluster import ClusterNode, RedisCluster  # noqa: PLC0415
    from redis.asyncio.sentinel import Sentinel  # noqa: PLC0415

    async def main() -> None:
        sentinels = [("127.0.0.1", s.port) for s in sentinel_topology.sentinels]
        manager = Sentinel(sentinels, socket_timeout=1)  # type: ignore[no-untyped-call]
        sentinel_client = manager.master_for(sentinel_topology.service, socket_timeout=1)
        node = ClusterNode("127.0.0.1", cluster_topology.nodes[0].port)
        cluster_client = RedisCluster(startup_nodes=[node])
        clients: list[tuple[Any, str]] = [
            (sentinel_client, "sentinel "), (cluster_client, "cluster "),
        ]  # fmt: skip
        for client, named in clients:
            provider = aio.RedisHashProvider(client=client)
            assert provider.address.startswith(named)
            lease = await provider.acquire(key, ttl=5, wait=0)
            assert lease is not None
            other = aio.RedisHashProvider(client=client)  # another process's view
            assert await asyncio.create_task(other.acquire(key, ttl=5, wait=0)) is None
            await provider.release(lease)
            await provider.close()
            await other.close()
            assert await client.get(lock_key(key)) is None  # still usable: not ours
        await cluster_client.aclose()
        await sentinel_client.aclose()

    asyncio.run(main())


def _acl_user(clients: list[redis.Redis], name: str, rule: str) -> None:
    for client in clients:
        with client:
            client.execute_command("ACL", "SETUSER", name, "reset", *rule.split(), ">pw")  # type: ignore[no-untyped-call]


def _drop_acl_user(clients: list[redis.Redis], name: str) -> None:
    for client in clients:
        with client:
            client.execute_command("ACL", "DELUSER", name)  # type: ignore[no-untyped-call]


@pytest.mark.parametrize("hash_lock", [False, True])
def test_least_privileged_users_serve_sentinel_and_cluster(
    sentinel_topology: SentinelTopology,
    cluster_topology: ClusterTopology,
    key: str,
    hash_lock: bool,
    build: Build,
) -> None:
    """`acl_rule()` on the data nodes and `sentinel_acl_rule()` on the sentinels, and
    `acl_rule(cluster=True)` on a cluster's nodes, are all each needs: a grant, a
    waiter woken by the release, a renewal and a release of a lock whose slot is being
    migrated (ASKING). Without its cluster part, a cluster user is refused."""

    def data_nodes() -> list[redis.Redis]:
        return [node.admin() for node in sentinel_topology.nodes]

    def sentinels() -> list[redis.Redis]:
        return [sentinel.client() for sentinel in sentinel_topology.sentinels]

    def cluster_nodes() -> list[redis.Redis]:
        return [node.admin() for node in cluster_topology.nodes]

    _acl_user(data_nodes(), "locker", acl_rule())
    _acl_user(sentinels(), "watcher", sentinel_acl_rule())
    _acl_user(cluster_nodes(), "locker", acl_rule(cluster=True))
    try:
        cluster_url = cluster_topology.url.replace("//", "//locker:pw@", 1)
        made = [
            build(hash_lock, DEFAULT_URL, sentinels=sentinel_topology.sentinel_addresses,
                  service=sentinel_topology.service, username="locker", password="pw",
                  sentinel_username="watcher", sentinel_password="pw", name="sentinel"),
            build(hash_lock, cluster_url, name="cluster"),
        ]  # fmt: skip
        for provider in made:
            lease = provider.acquire(key, ttl=5, wait=0)
            assert lease is not None
            with ThreadPoolExecutor(1) as pool:
                waiter = pool.submit(provider.acquire, key, ttl=5, wait=5)  # another thread
                time.sleep(0.2)
                provider.release(lease)
                woken = waiter.result(timeout=10)
            assert woken is not None
            provider.release(woken)
        lease = made[1].acquire(key, ttl=5, wait=0)
        assert lease is not None
        migrate_slot(cluster_topology, lock_key(key), finish=False)  # the source says ASK
        try:
            made[1].extend(lease, 5)  # followed to the importing node, with ASKING
            made[1].release(lease)
        finally:
            migrate_slot(cluster_topology, lock_key(key), finish=True)
        _acl_user(cluster_nodes(), "locker", acl_rule())
        bare = build(hash_lock, cluster_url, name="cluster")
        with pytest.raises(AccessDenied):
            bare.acquire(key, ttl=5, wait=0)
    finally:
        _drop_acl_user(data_nodes(), "locker")
        _drop_acl_user(sentinels(), "watcher")
        _drop_acl_user(cluster_nodes(), "locker")
