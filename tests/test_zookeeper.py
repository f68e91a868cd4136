"""What only the ZooKeeper backend promises: the session is the lease, waiters are served
in arrival order, parents are swept, names cannot leave the root."""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from locks import BackendUnavailable, Lease, LockLost
from locks.backends import ZooKeeperProvider
from locks.names import zookeeper_node_name
from tests import workers
from tests.servers import ZooKeeperServer

SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture
def zk(zookeeper_server: ZooKeeperServer) -> Iterator[ZooKeeperProvider]:
    provider = ZooKeeperProvider(zookeeper_server.hosts, session_timeout=2.0)
    yield provider
    provider.close()


@pytest.fixture
def admin(zookeeper_server: ZooKeeperServer) -> Iterator[KazooClient]:
    client = KazooClient(hosts=zookeeper_server.hosts)
    client.start(timeout=10)
    yield client
    client.stop()
    client.close()


def wait_for(condition: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return True
        time.sleep(0.02)
    return False


def test_a_killed_holder_frees_the_lock_when_its_session_expires(
    zk: ZooKeeperProvider, zookeeper_server: ZooKeeperServer, key: str
) -> None:
    held = SPAWN.Event()
    session = 1.0
    child = SPAWN.Process(
        target=workers.hold_until_killed,
        args=("zookeeper-short-session", zookeeper_server.hosts, key, 30.0, held),
    )
    child.start()
    try:
        assert held.wait(30)
        assert zk.acquire(key, wait=0) is None
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        lease = zk.acquire(key, wait=session + 2)
        assert lease is not None
        assert time.monotonic() - killed_at <= session + 2
        zk.release(lease)
    finally:
        child.kill()
        child.join()


def test_an_expired_session_loses_its_leases(
    zk: ZooKeeperProvider, zookeeper_server: ZooKeeperServer, key: str
) -> None:
    lost = threading.Event()
    lease = zk.acquire(key, on_lost=lambda _: lost.set())
    assert lease is not None
    lease.check()
    # the classic way to expire a session: another client takes it over and closes it
    session_id, password = zk.client.client_id
    thief = KazooClient(hosts=zookeeper_server.hosts, client_id=(session_id, password))
    thief.start(timeout=10)
    thief.stop()
    thief.close()
    assert lost.wait(10), "on_lost was not called"
    assert lease.lost
    with pytest.raises(LockLost):
        lease.check()
    # the provider recovers with a new session (failing fast until then); the lock is free
    assert wait_for(lambda: zk.client.state == "CONNECTED", 10)
    again = zk.acquire(key, wait=0)
    assert again is not None
    zk.release(again)


def test_waiters_are_served_in_arrival_order(zk: ZooKeeperProvider, key: str) -> None:
    holder = zk.acquire(key)
    assert holder is not None
    order: list[int] = []

    def wait(i: int) -> None:
        lease = zk.acquire(key, wait=30)
        assert lease is not None
        order.append(i)
        zk.release(lease)

    threads = []
    for i in range(8):
        thread = threading.Thread(target=wait, args=(i,))
        thread.start()
        threads.append(thread)
        time.sleep(0.1)  # each is queued before the next arrives
    zk.release(holder)
    for thread in threads:
        thread.join(30)
    assert order == list(range(8))


def test_a_suspended_connection_puts_leases_in_doubt_until_it_is_back(
    zookeeper_server: ZooKeeperServer, key: str
) -> None:
    # kazoo suspends after 2/3 of the session timeout; resume before the session expires
    zk = ZooKeeperProvider(zookeeper_server.hosts, session_timeout=9.0)
    lease = zk.acquire(key)
    assert lease is not None
    zookeeper_server.pause()
    try:
        assert wait_for(lambda: lease.state.suspended, 8), "never suspended"
        with pytest.raises(LockLost, match="suspended"):
            lease.check()
        with pytest.raises(BackendUnavailable):
            zk.acquire(key + ":other", wait=0)
    finally:
        zookeeper_server.resume()
    assert wait_for(lambda: not lease.state.suspended, 10), "never reconnected"
    lease.check()  # same session: still held
    assert zk.is_held(lease)
    zk.release(lease)
    zk.close()


def test_names_cannot_leave_the_root(zk: ZooKeeperProvider, admin: KazooClient) -> None:
    before = set(admin.get_children("/"))  # other tests' roots (a digest identity's, ...)
    for name in ["../x", "a/b", ".", "..", "/", "锁:订单", "%2E", "'; DROP TABLE locks; --"]:
        lease = zk.acquire(name, wait=5)
        assert lease is not None and lease.key == name
        parent = admin.get_children("/locks")
        assert zookeeper_node_name(name) in parent
        assert "/" not in zookeeper_node_name(name)
        zk.release(lease)
    assert set(admin.get_children("/")) <= before | {"locks"}  # nothing outside the root


@pytest.mark.parametrize("face", ["threaded", "asyncio"])
def test_a_chroot_in_the_hosts_keeps_every_node_under_it(
    zookeeper_server: ZooKeeperServer, admin: KazooClient, key: str, face: str
) -> None:
    """`host:port/chroot` (configuration.md): the lock's nodes are made, found by the
    holder and deleted under the chroot; two providers there exclude each other."""
    from locks import aio  # noqa: PLC0415
    from tests.aio_bridge import Threaded  # noqa: PLC0415

    admin.ensure_path("/app")
    hosts = zookeeper_server.hosts + "/app"
    made: list[Any] = [ZooKeeperProvider(hosts), ZooKeeperProvider(hosts)]
    if face == "asyncio":
        made = [Threaded(aio.ZooKeeperProvider(hosts)) for _ in range(2)]
    first, second = made
    parent = f"/app/locks/{zookeeper_node_name(key)}"
    try:
        lease = first.acquire(key, wait=5)
        assert lease is not None
        assert [child.startswith(lease.token) for child in admin.get_children(parent)] == [True]
        holder = second.holder(key)
        assert holder is not None and holder.fence == lease.fence
        other: list[Lease | None] = []
        thread = threading.Thread(target=lambda: other.append(second.acquire(key, wait=0)))
        thread.start()
        thread.join()
        assert other == [None]
        first.release(lease)
        assert admin.get_children(parent) == []
        outside = f"/locks/{zookeeper_node_name(key)}"
        assert admin.exists(outside) is None, "a node outside the chroot"
    finally:
        for provider in made:
            provider.close()


def test_a_lock_cycle_leaves_next_to_nothing_to_the_garbage_collector(
    zk: ZooKeeperProvider, key: str
) -> None:
    """kazoo's `create_async` made ~50 objects of reference cycles a lock, which only
    the collector frees (its passes stall every thread); our create is one request. What
    is left is the odd exception's traceback (a parent swept and made again)."""
    for _ in range(20):  # the parent and the session's first requests
        zk.release(zk.acquire(key) or pytest.fail("not granted"))
    # until a pass finds nothing: objects an earlier test left behind whose finalizers
    # (redis-py's) resurrect them are only freed by the pass after the one that ran them
    for _ in range(10):
        if not gc.collect():
            break
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(100):
            zk.release(zk.acquire(key) or pytest.fail("not granted"))
        gc.collect()
        assert len(gc.garbage) < 200, sorted({type(thing).__name__ for thing in gc.garbage})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def test_empty_parents_are_swept_and_fences_survive_it(
    zk: ZooKeeperProvider, admin: KazooClient, key: str
) -> None:
    parent = f"/locks/{zookeeper_node_name(key)}"
    first = zk.acquire(key)
    assert first is not None
    zk.release(first)
    assert wait_for(lambda: admin.exists(parent) is None, 5), "the empty parent stayed"
    again = zk.acquire(key)  # a new parent: its sequence numbers start over, czxid does not
    assert again is not None and again.fence > first.fence
    zk.release(again)


def test_a_dead_zookeeper_is_reported_fast_and_the_provider_recovers(
    zk: ZooKeeperProvider, zookeeper_server: ZooKeeperServer, key: str
) -> None:
    zk.ping()
    zookeeper_server.kill()
    assert wait_for(lambda: zk.client.state != "CONNECTED", 5)
    started = time.monotonic()
    with pytest.raises(BackendUnavailable) as caught:
        zk.acquire(key, wait=0)
    assert time.monotonic() - started < 0.1  # no waiting: kazoo reconnects in the background
    assert zookeeper_server.address in str(caught.value)
    zookeeper_server.start()
    assert wait_for(lambda: zk.client.state == "CONNECTED", 15)
    lease = zk.acquire(key, wait=5)
    assert lease is not None
    zk.release(lease)


def test_nodes_left_by_lost_replies_are_deleted_when_zookeeper_answers(
    zk: ZooKeeperProvider, admin: KazooClient, key: str
) -> None:
    # a create whose reply never came: the node exists, nobody knows it holds the lock
    parent = f"/locks/{zookeeper_node_name(key)}"
    token = "f" * 32
    admin.create(f"{parent}/{token}-", ephemeral=True, sequence=True, makepath=True)
    zk._leftovers.add((parent, token))
    lease = zk.acquire(key, wait=5)  # cleans up first, so it is not blocked by the ghost
    assert lease is not None
    assert not zk._leftovers
    zk.release(lease)


def test_a_create_that_times_out_on_a_live_connection_leaves_no_node_once_it_runs(
    zookeeper_server: ZooKeeperServer, key: str
) -> None:
    """ZooKeeper paused longer than the request timeout, shorter than the session's:
    the create times out (an ambiguous outage), the cleaner's listing times out too, and
    the connection never drops. Once the server answers, the node the create made must
    go; left, it would hold the lock for the session's life with nobody to release it."""
    zk = ZooKeeperProvider(zookeeper_server.hosts, session_timeout=20.0, request_timeout=0.5)
    other = ZooKeeperProvider(zookeeper_server.hosts)
    try:
        zk.ping()
        held = other.acquire(key, wait=0)  # keeps the lock's parent (a container) there
        assert held is not None
        zookeeper_server.pause()
        try:
            failed: list[BaseException] = []
            # another thread: on this one, the key held by `other` would just nest
            asker = threading.Thread(target=lambda: _raised(failed, zk.acquire, key, wait=0))
            asker.start()
            asker.join(10)
            assert failed and isinstance(failed[0], BackendUnavailable), failed
            time.sleep(1.5)  # the cleaner's own listing has timed out by now
        finally:
            zookeeper_server.resume()
        other.release(held)
        # its reply comes as soon as the server runs again: the node goes then (left to a
        # reconnection, it would stay while the connection lives: seconds here, or ever)
        lease = other.acquire(key, wait=1)
        assert lease is not None, "the timed-out create's node holds the lock"
        other.release(lease)
    finally:
        zk.close()
        other.close()


def _raised(into: list[BaseException], call: Any, *args: Any, **kwargs: Any) -> None:
    try:
        call(*args, **kwargs)
    except BaseException as error:
        into.append(error)


def test_reentrant_leases_share_one_node(
    zk: ZooKeeperProvider, admin: KazooClient, key: str
) -> None:
    outer = zk.acquire(key)
    inner = zk.acquire(key, wait=0)
    assert outer is not None and inner is not None
    assert len(admin.get_children(f"/locks/{zookeeper_node_name(key)}")) == 1
    zk.release(inner)
    zk.release(outer)
    # the parent is a container node: ZooKeeper may already have reaped it, empty
    try:
        left = admin.get_children(f"/locks/{zookeeper_node_name(key)}")
    except NoNodeError:
        left = []
    assert left == []


def test_a_nested_acquire_while_suspended_is_refused(
    zookeeper_server: ZooKeeperServer, key: str
) -> None:
    """A nested level is vouched for by the session, like the first: while the session is
    in doubt it is refused, never answered from the count kept in the process."""
    zk = ZooKeeperProvider(zookeeper_server.hosts, session_timeout=9.0)
    outer = zk.acquire(key)
    assert outer is not None
    zookeeper_server.pause()
    try:
        assert wait_for(lambda: outer.state.suspended, 8), "never suspended"
        with pytest.raises(BackendUnavailable):
            zk.acquire(key, wait=0)
    finally:
        zookeeper_server.resume()
    assert wait_for(lambda: not outer.state.suspended, 10), "never reconnected"
    inner = zk.acquire(key, wait=0)
    assert inner is not None and inner.depth == 2
    inner.check()
    zk.release(inner)
    zk.release(outer)
    zk.close()


def test_a_session_unanswered_for_its_timeout_loses_its_leases(
    zookeeper_server: ZooKeeperServer, key: str
) -> None:
    """kazoo says LOST only once it reaches a server again; with the server gone for good
    the holder must still be told, once the session timeout has passed (as Curator does)."""
    zk = ZooKeeperProvider(zookeeper_server.hosts, session_timeout=2.0)
    lost: list[Lease] = []
    lease = zk.acquire(key, on_lost=lost.append)
    assert lease is not None
    zookeeper_server.kill()
    killed_at = time.monotonic()
    assert wait_for(lambda: bool(lost), 6), "the lease was never marked lost"
    assert time.monotonic() - killed_at < 2.0 + 2.0
    assert lost == [lease] and lease.lost
    with pytest.raises(LockLost):
        lease.check()
    time.sleep(0.5)
    assert len(lost) == 1, "on_lost must run once"
    zk.close()


def test_a_waiter_keeps_one_watch_however_long_it_waits(
    zk: ZooKeeperProvider, zookeeper_server: ZooKeeperServer, key: str
) -> None:
    holder = zk.acquire(key)
    assert holder is not None
    waiter = ZooKeeperProvider(zookeeper_server.hosts, session_timeout=4.0)
    got: list[Lease | None] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(key, wait=20)))
    thread.start()
    time.sleep(4.5)  # the waiter re-reads the queue every second
    watchers = sum(len(found) for found in waiter.client._data_watchers.values())
    zk.release(holder)
    thread.join(10)
    assert watchers == 1, f"{watchers} watches piled up on the predecessor"
    assert got and got[0] is not None
    waiter.release(got[0])
    waiter.close()


def test_a_break_after_a_connection_loss_is_still_heard(
    zookeeper_server: ZooKeeperServer, admin: KazooClient, key: str
) -> None:
    """kazoo drops every watch when its connection is lost (it fires them with a NONE
    event). The held node's watch is set again once the connection is back: a break
    that comes afterwards is heard at once, not at the holder's next call."""
    zk = ZooKeeperProvider(zookeeper_server.hosts, session_timeout=3.0)
    lost = threading.Event()
    try:
        lease = zk.acquire(key, on_lost=lambda _: lost.set())
        assert lease is not None
        time.sleep(0.2)  # its node is watched by now
        zookeeper_server.pause()
        try:
            assert wait_for(lambda: lease.state.suspended, 5), "never suspended"
        finally:
            zookeeper_server.resume()
        assert wait_for(lambda: not lease.state.suspended, 5), "never reconnected"
        time.sleep(0.2)
        parent = f"/locks/{zookeeper_node_name(key)}"
        for child in admin.get_children(parent):  # an operator breaks the lock
            admin.delete(f"{parent}/{child}")
        assert lost.wait(2), "the break after the reconnection went unheard"
        assert lease.lost
    finally:
        zk.close()


@pytest.mark.parametrize(
    "root", ["/a/./b", "/a/../b", "/a//b", "/a\x00b", "/a\x1fb", "/", "a/b", "/a/"]
)
def test_a_root_zookeeper_would_refuse_is_refused_before_any_io(root: str) -> None:
    with pytest.raises(ValueError, match="root"):
        ZooKeeperProvider("127.0.0.1:1", root=root)  # nobody listens: no I/O is attempted


def test_a_short_grant_sets_no_watch_and_a_break_is_heard_however_soon_it_comes(
    zk: ZooKeeperProvider, admin: KazooClient, key: str
) -> None:
    """A grant's node is watched only once it has been held 50 ms (the watch cost each
    release a notification and a thread hand-off, ~40 % of an uncontended cycle). A
    grant released sooner leaves no watch behind; one broken sooner is still heard, as
    soon as its watch is set; one broken later, at once."""
    watched: list[str] = []
    exists = zk.client.exists_async

    def counting(path: str, watch: Any = None) -> Any:
        if watch is not None:
            watched.append(path)
        return exists(path, watch=watch)

    zk.client.exists_async = counting
    for _ in range(20):
        lease = zk.acquire(key, ttl=30)
        assert lease is not None
        zk.release(lease)
    time.sleep(0.1)
    assert watched == [], "a grant released at once was watched"
    for hold_first in (0.0, 0.3):
        lost = threading.Event()

        def on_lost(_: Lease, told: threading.Event = lost) -> None:
            told.set()

        lease = zk.acquire(key, ttl=30, on_lost=on_lost)
        assert lease is not None
        time.sleep(hold_first)
        node = zk._nodes[lease.token]
        broken_at = time.monotonic()
        admin.delete(node)  # an operator's break
        assert lost.wait(2.0), f"a break {hold_first} s into the grant went unheard"
        assert time.monotonic() - broken_at < 0.5
