"""What only the asyncio ZooKeeper provider can get wrong: a cancelled task leaves no
node behind (even one whose create is answered after the cancellation), kazoo's threads
never block the loop and hand their news to it, and a lost or expired session loses the
leases. (The contract suite runs over it too, as `aio-zookeeper`.)"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from locks import BackendUnavailable, Lease, LockLost, LockNotOwned, LockTimeout, aio
from locks.names import zookeeper_node_name
from tests.ports import free_port
from tests.servers import ZooKeeperServer
from tests.test_aio import LagMeter, Lags, lag_within


@pytest.fixture
def admin(zookeeper_server: ZooKeeperServer) -> Iterator[KazooClient]:
    client = KazooClient(hosts=zookeeper_server.hosts)
    client.start(timeout=10)
    yield client
    client.stop()
    client.close()


def run(main: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(main())  # type: ignore[arg-type]


def nodes(admin: KazooClient, key: str) -> list[str]:
    """The nodes queued for `key` (its parent is a container: it may be gone, empty)."""
    try:
        return sorted(admin.get_children(f"/locks/{zookeeper_node_name(key)}"))
    except NoNodeError:
        return []


async def nodes_within(admin: KazooClient, key: str, expected: int, seconds: float) -> list[str]:
    """The nodes of `key` once there are `expected` of them, or as they are after
    `seconds` (read off the loop: the admin client blocks)."""
    deadline = time.monotonic() + seconds
    while True:
        found = await asyncio.to_thread(nodes, admin, key)
        if len(found) == expected or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.05)


class Told:
    """An `on_lost` of either kind that records where it ran: (key, thread, in a task)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.calls: list[tuple[str, int, bool]] = []

    def callback(self) -> Callable[[Lease], object]:
        return self._plain if self.kind == "plain" else self._coroutine

    def _plain(self, lease: Lease) -> None:
        try:
            in_task = asyncio.current_task() is not None
        except RuntimeError:  # no loop runs on this thread
            in_task = False
        self.calls.append((lease.key, threading.get_ident(), in_task))

    async def _coroutine(self, lease: Lease) -> None:
        await asyncio.sleep(0)
        self._plain(lease)

    def check(self, key: str) -> None:
        """Told once, on the loop's thread (this one: `asyncio.run`'s), in a task for an
        `async def`."""
        assert len(self.calls) == 1, f"on_lost ran {len(self.calls)} times"
        assert self.calls[0][:2] == (key, threading.get_ident()), "on_lost ran off the loop"
        assert self.calls[0][2] == (self.kind == "async def")


# -- cancellation ----------------------------------------------------------------------


def test_an_acquire_cancelled_before_its_create_is_answered_leaves_no_node(
    zookeeper_server: ZooKeeperServer, admin: KazooClient, key: str
) -> None:
    """The create is on the server (paused), its reply not back, when the task is
    cancelled; the server stays paused past `request_timeout`, so a release by token
    sent meanwhile finds nothing in time. Once the server answers, the node it made is
    deleted, while the session that owns it lives on: nobody else would ever delete
    it. (Another provider holds the key, so the lock's parent exists and the create
    makes a node.)"""

    async def main() -> None:
        holder = aio.ZooKeeperProvider(zookeeper_server.hosts)
        provider = aio.ZooKeeperProvider(zookeeper_server.hosts, request_timeout=0.5)
        try:
            held = await holder.acquire(key)
            assert held is not None
            await provider.ping()
            zookeeper_server.pause()
            try:
                task = asyncio.create_task(provider.acquire(key, wait=5))
                await asyncio.sleep(0.2)  # sent, not answered
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                await asyncio.sleep(1.0)  # twice request_timeout: every other try gave up
            finally:
                zookeeper_server.resume()
            await asyncio.sleep(1.0)  # the create is answered, and what follows it
            left = await nodes_within(admin, key, 1, 2.0)
            assert len(left) == 1 and left[0].startswith(held.token), (
                f"the cancelled acquire's node outlived it: {left}"
            )
            await holder.release(held)
            taken = await holder.acquire(key, wait=0)
            assert taken is not None, "the cancelled acquire's node holds the lock"
            await holder.release(taken)
        finally:
            await provider.close()
            await holder.close()

    run(main)


@pytest.mark.parametrize("how", ["cancel", "timeout"])
def test_a_waiter_cancelled_while_it_waits_leaves_no_node(
    zookeeper_server: ZooKeeperServer, admin: KazooClient, key: str, how: str
) -> None:
    async def main() -> None:
        provider = aio.ZooKeeperProvider(zookeeper_server.hosts)
        try:
            holder = await provider.acquire(key)
            assert holder is not None

            async def waiter() -> Lease | None:
                if how == "timeout":
                    async with asyncio.timeout(0.3):
                        return await provider.acquire(key, wait=30)
                return await provider.acquire(key, wait=30)

            task = asyncio.create_task(waiter())
            assert len(await nodes_within(admin, key, 2, 2.0)) == 2, "the waiter never queued"
            if how == "cancel":
                task.cancel()
            with pytest.raises(asyncio.CancelledError if how == "cancel" else TimeoutError):
                await task
            left = await nodes_within(admin, key, 1, 2.0)
            assert len(left) == 1 and left[0].startswith(holder.token), left
            await provider.release(holder)
            assert await nodes_within(admin, key, 0, 2.0) == []
        finally:
            await provider.close()

    run(main)


def test_a_release_cancelled_midway_still_frees_the_lock(
    zookeeper_server: ZooKeeperServer, admin: KazooClient, key: str
) -> None:
    async def main() -> None:
        provider = aio.ZooKeeperProvider(zookeeper_server.hosts, request_timeout=0.5)
        try:
            lease = await provider.acquire(key)
            assert lease is not None
            zookeeper_server.pause()
            try:
                task = asyncio.create_task(provider.release(lease))
                await asyncio.sleep(0.1)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                await asyncio.sleep(0.8)
            finally:
                zookeeper_server.resume()
            assert await nodes_within(admin, key, 0, 3.0) == [], "the cancelled release's node"
            with pytest.raises(LockNotOwned):  # over for its holder all the same
                await provider.release(lease)
        finally:
            await provider.close()

    run(main)


# -- the loop is never blocked -------------------------------------------------------------


def test_a_paused_or_dead_server_costs_its_timeout_and_never_the_loop(
    zookeeper_server: ZooKeeperServer, key: str
) -> None:
    """A call to a paused server fails after `request_timeout`, a first connection to
    nobody after `connect_timeout`, each `BackendUnavailable` naming the backend and its
    address; the loop keeps running meanwhile (a 10 ms ticker never misses a beat)."""
    gaps: list[float] = []

    async def ticker() -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(0.01)
            gaps.append(time.monotonic() - before)

    async def failing(call: Awaitable[object]) -> tuple[float, BackendUnavailable]:
        started = time.monotonic()
        with pytest.raises(BackendUnavailable) as raised:
            await call
        return time.monotonic() - started, raised.value

    async def main() -> None:
        ticking = asyncio.create_task(ticker())
        provider = aio.ZooKeeperProvider(zookeeper_server.hosts, name="zk", request_timeout=0.4)
        nobody = f"127.0.0.1:{free_port()}"
        dead = aio.ZooKeeperProvider(nobody, name="dead", connect_timeout=0.5)
        try:
            await provider.ping()
            zookeeper_server.pause()
            try:
                took, error = await failing(provider.holder(key))
            finally:
                zookeeper_server.resume()
            assert 0.35 <= took < 1.0, took
            assert error.backend == "zk" and zookeeper_server.address in str(error)
            took, error = await failing(dead.acquire(key, wait=0))
            assert 0.45 <= took < 1.5, took
            assert error.backend == "dead" and nobody in str(error)
        finally:
            ticking.cancel()
            await provider.close()
            await dead.close()

    run(main)
    assert len(gaps) > 50
    assert max(gaps) < 0.1, f"the loop stalled {max(gaps) * 1000:.0f} ms"


def test_200_tasks_on_20_keys_never_block_the_loop(
    zookeeper_server: ZooKeeperServer, key: str
) -> None:
    """kazoo's replies and watches come from its threads onto the loop: the loop's p99
    lag stays under 20 ms while 200 tasks contend, and no wake-up is 250 ms late. A wait
    on a kazoo result on the loop stalls it a round trip per step: 300-660 ms p99 here
    when the steps waited so. kazoo's reader and completion threads run Python too and
    take the GIL in turns with the loop (5 ms a turn), which lags it by that much under a
    busy machine (13 ms seen with a benchmark beside it) without any call of ours
    blocking. Measured after half a second of the same load: a JVM compiling its hot
    paths takes a core of the two a CI runner may have."""

    async def main() -> tuple[int, Lags]:
        provider = aio.ZooKeeperProvider(zookeeper_server.hosts)
        grants = 0

        async def worker(index: int, until: float) -> None:
            nonlocal grants
            name = f"{key}:{index % 20}"
            while time.monotonic() < until:
                async with provider.lock(name, wait=10):
                    grants += 1
                    await asyncio.sleep(0)  # the guarded work: one turn of the loop

        async def contend(seconds: float) -> None:
            until = time.monotonic() + seconds
            await asyncio.gather(*(worker(i, until) for i in range(200)))

        try:
            await contend(0.5)
            grants = 0
            meter = LagMeter()
            meter.start()
            await contend(2.0)
            return grants, {"lag": await meter.stop()}
        finally:
            await provider.close()

    lag_within(0.020, lambda: run(main), fewest=200)


# -- waiting -------------------------------------------------------------------------------


def test_a_release_through_one_provider_wakes_the_waiter_of_another_at_once(
    zookeeper_server: ZooKeeperServer, key: str
) -> None:
    """The waiter's watch on its predecessor fires on kazoo's thread and wakes the task:
    it is granted well before its once-a-second look at the queue would find out."""

    async def main() -> list[float]:
        first = aio.ZooKeeperProvider(zookeeper_server.hosts)
        second = aio.ZooKeeperProvider(zookeeper_server.hosts)
        delays = []
        try:
            for _ in range(3):
                held = await first.acquire(key)
                assert held is not None
                waiter = asyncio.create_task(second.acquire(key, wait=10))
                await asyncio.sleep(0.2)  # queued, its watch set, its look a second away
                released_at = time.monotonic()
                await first.release(held)
                lease = await waiter
                delays.append(time.monotonic() - released_at)
                assert lease is not None
                await second.release(lease)
        finally:
            await first.close()
            await second.close()
        return delays

    delays = run(main)
    assert max(delays) < 0.3, f"woken {max(delays):.2f} s after the release: no watch"


def test_a_wait_that_runs_out_leaves_the_queue_as_it_was(
    zookeeper_server: ZooKeeperServer, admin: KazooClient, key: str
) -> None:
    async def main() -> None:
        provider = aio.ZooKeeperProvider(zookeeper_server.hosts)
        try:
            held = await provider.acquire(key)
            assert held is not None

            async def contend() -> None:
                started = time.monotonic()
                with pytest.raises(LockTimeout):
                    async with provider.lock(key, wait=0.4):
                        pass
                assert 0.35 <= time.monotonic() - started < 1.5

            await asyncio.create_task(contend())
            assert len(await asyncio.to_thread(nodes, admin, key)) == 1
            await provider.release(held)
        finally:
            await provider.close()

    run(main)


# -- the session ---------------------------------------------------------------------------


@pytest.mark.parametrize("callback", ["plain", "async def"])
def test_a_killed_server_is_unavailable_and_its_leases_are_lost_after_the_session(
    zookeeper_server: ZooKeeperServer, key: str, callback: str
) -> None:
    """kazoo says LOST only once it reaches a server again; with the server gone the
    holder is told once the session timeout has passed, on the loop, once."""
    told = Told(callback)

    async def main() -> None:
        provider = aio.ZooKeeperProvider(zookeeper_server.hosts, session_timeout=2.0)
        try:
            lease = await provider.acquire(key, on_lost=told.callback())
            assert lease is not None
            zookeeper_server.kill()
            killed_at = time.monotonic()
            while not lease.state.suspended and time.monotonic() - killed_at < 2:
                await asyncio.sleep(0.01)
            with pytest.raises(LockLost):
                lease.check()
            started = time.monotonic()
            with pytest.raises(BackendUnavailable) as raised:
                await provider.acquire(key + ":other", wait=0)
            assert time.monotonic() - started < 0.1  # kazoo reconnects in the background
            assert zookeeper_server.address in str(raised.value)
            while not told.calls and time.monotonic() - killed_at < 2.0 + 2.0:
                await asyncio.sleep(0.02)
            assert told.calls, "on_lost was never called"
            assert lease.lost
            await asyncio.sleep(0.5)
            told.check(key)
            zookeeper_server.start()  # the provider recovers with a new session
            deadline = time.monotonic() + 15
            while True:
                try:
                    again = await provider.acquire(key, wait=1)
                    break
                except BackendUnavailable:
                    assert time.monotonic() < deadline, "never reconnected"
                    await asyncio.sleep(0.1)
            assert again is not None
            await provider.release(again)
        finally:
            await provider.close()

    run(main)


@pytest.mark.parametrize("callback", ["plain", "async def"])
def test_an_expired_session_loses_its_leases(
    zookeeper_server: ZooKeeperServer, key: str, callback: str
) -> None:
    told = Told(callback)

    async def main() -> None:
        provider = aio.ZooKeeperProvider(zookeeper_server.hosts)
        try:
            lease = await provider.acquire(key, on_lost=told.callback())
            assert lease is not None
            lease.check()
            # the classic way to expire a session: another client takes it over, closes it
            thief = KazooClient(hosts=zookeeper_server.hosts, client_id=provider.client.client_id)
            await asyncio.to_thread(thief.start, 10)
            await asyncio.to_thread(thief.stop)
            thief.close()
            async with asyncio.timeout(10):
                while not told.calls:
                    await asyncio.sleep(0.02)
            assert lease.lost
            with pytest.raises(LockLost):
                lease.check()
            with pytest.raises(LockNotOwned):
                await provider.release(lease)
            async with asyncio.timeout(10):  # a new session; the lock is free
                while provider.client.state != "CONNECTED":
                    await asyncio.sleep(0.05)
            again = await provider.acquire(key, wait=0)
            assert again is not None
            await provider.release(again)
            told.check(key)
        finally:
            await provider.close()

    run(main)


# -- closing -------------------------------------------------------------------------------


def test_close_deletes_the_nodes_of_a_client_passed_in_and_leaves_it_running(
    zookeeper_server: ZooKeeperServer, admin: KazooClient, key: str
) -> None:
    client = KazooClient(hosts=zookeeper_server.hosts)
    client.start(timeout=10)
    lost: list[str] = []
    kept: list[Lease | None] = []  # a lease dropped unreleased is let go: these are not

    async def main() -> None:
        ours = aio.ZooKeeperProvider(zookeeper_server.hosts)
        given = aio.ZooKeeperProvider(client=client)
        try:
            for provider, name in ((ours, key + ":ours"), (given, key + ":given")):
                kept.append(await provider.acquire(name, on_lost=lambda it: lost.append(it.key)))
                assert kept[-1] is not None
                assert len(await asyncio.to_thread(nodes, admin, name)) == 1
        finally:
            await ours.close()
            await given.close()

    try:
        run(main)
        assert sorted(lost) == [key + ":given", key + ":ours"]
        assert nodes(admin, key + ":given") == [], "a client passed in kept the node"
        assert client.connected, "the client passed in was stopped"
        assert nodes(admin, key + ":ours") == [], "our client's session outlived close()"
    finally:
        client.stop()
        client.close()
