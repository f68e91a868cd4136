"""The asyncio quorum on real servers: five redis-servers, paused and killed under it.
What the threaded quorum promises is the contract suite's (kind `aio-quorum`); here is
what only the asyncio face can get wrong: members asked as tasks acting for the caller,
cancellation midway through a vote, renewal as a task, the loop never blocked by a
member that does not answer, and the loop's end with a lease held."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from locks import BackendUnavailable, Lease, LockNotOwned, aio
from locks.backends import RedisProvider as ThreadedRedis
from locks.quorum import Quorum as ThreadedQuorum
from tests.servers.redis_masters import RedisMasters
from tests.test_aio import LagMeter, Lags, lag_within, run


def quorum_of(masters: RedisMasters, *, members: int = 5, **options: Any) -> aio.Quorum:
    made = [aio.RedisHashProvider(url, name=f"r{i}", socket_timeout=0.5, connect_timeout=0.5)
            for i, url in enumerate(masters.urls[:members])]  # fmt: skip
    return aio.Quorum(made, **options)


async def close(quorum: aio.Quorum) -> None:
    await quorum.close()
    for member in quorum.members.values():
        await member.close()


def held_on(masters: RedisMasters, key: str) -> list[int]:
    """Which members hold `key`, asked by threaded providers."""
    holding = []
    for index, url in enumerate(masters.urls):
        provider = ThreadedRedis(url, socket_timeout=0.5)
        try:
            raw = provider.client.exists(f"locks:{{{key}}}")
        finally:
            provider.close()
        if raw:
            holding.append(index)
    return holding


def until(check: Callable[[], bool], seconds: float = 3.0) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# -- construction --------------------------------------------------------------------------


def test_members_are_of_the_quorums_own_face() -> None:
    threaded = [ThreadedRedis("redis://127.0.0.1:1/0", name=f"r{i}") for i in range(3)]
    asyncio_members = [aio.RedisProvider("redis://127.0.0.1:1/0", name=f"r{i}") for i in range(3)]
    with pytest.raises(TypeError, match=r"'r0' is not a asyncio provider"):
        aio.Quorum(threaded)
    with pytest.raises(TypeError, match=r"'r0' is not a threaded provider"):
        ThreadedQuorum(asyncio_members)
    with pytest.raises(ValueError, match="a majority"):
        aio.Quorum(asyncio_members, quorum=1)


def test_from_config_builds_an_asyncio_quorum_of_asyncio_members(
    redis_masters: RedisMasters, key: str
) -> None:
    backends = {f"r{i}": {"type": "redis-hash", "url": url}
                for i, url in enumerate(redis_masters.urls[:3])}  # fmt: skip
    config = {"backends": {**backends, "q": {"type": "quorum", "members": list(backends)}},
              "scenarios": {"default": {"chain": ["q"]}}}  # fmt: skip

    async def main() -> None:
        registry = aio.from_config(config)
        try:
            quorum = registry.backend("q")
            assert isinstance(quorum, aio.Quorum)
            assert all(isinstance(m, aio.RedisHashProvider) for m in quorum.members.values())
            async with registry.lock("default", key, ttl=5) as lease:
                assert lease.backend == "q"
                assert held_on(redis_masters, key) == [0, 1, 2]
        finally:
            await registry.close()

    run(main)
    assert held_on(redis_masters, key) == []


# -- the members, asked as tasks -------------------------------------------------------------


def test_tasks_exclude_each_other_and_reenter_their_own(
    redis_masters: RedisMasters, key: str
) -> None:
    """Each member call is a task of its own: it must act for the task that asked
    (else a task would not re-enter its own lease, and another could release it)."""

    async def main() -> tuple[int, int]:
        quorum = quorum_of(redis_masters)
        inside = overlaps = 0

        async def worker() -> None:
            nonlocal inside, overlaps
            for _ in range(10):
                async with quorum.lock(key, ttl=5, wait=30):
                    async with quorum.lock(key, ttl=5, wait=0) as again:  # its own: re-entered
                        assert again is not None
                    inside += 1
                    overlaps += inside > 1
                    await asyncio.sleep(0.001)
                    inside -= 1

        try:
            await asyncio.gather(*(worker() for _ in range(8)))
            lease = await quorum.acquire(key, ttl=5)
            assert lease is not None
            other = asyncio.create_task(quorum.release(lease))  # another task: not its owner
            await other  # a lease is released by whoever has it: the object is the proof
            return inside, overlaps
        finally:
            await close(quorum)

    assert run(main) == (0, 0)
    assert held_on(redis_masters, key) == []


def test_a_cancelled_acquire_leaves_no_member_holding_the_key(
    redis_masters: RedisMasters, key: str
) -> None:
    """Two members pause: three grant at once, the paused two keep the round open, and
    the caller gives up. The three grants go at once, not when their ttl runs out
    (60 s here)."""

    async def main() -> list[int]:
        quorum = quorum_of(redis_masters)
        redis_masters.servers[3].pause()
        redis_masters.servers[4].pause()
        try:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await quorum.acquire(key, ttl=60)
            redis_masters.servers[3].resume()
            redis_masters.servers[4].resume()
            deadline = time.monotonic() + 3
            while (holding := held_on(redis_masters, key)) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            return holding
        finally:
            redis_masters.servers[3].resume()
            redis_masters.servers[4].resume()
            await close(quorum)

    assert run(main) == []


def test_a_waiter_cancelled_at_any_moment_leaves_the_key_free(
    redis_masters: RedisMasters, key: str
) -> None:
    """Waiters cancelled at random points of their rounds (at the gate, among the
    rest, undoing a split vote): once the holder lets go, the key is free everywhere."""

    async def main() -> None:
        quorum = quorum_of(redis_masters)
        try:
            for round_ in range(20):
                holder = await quorum.acquire(key, ttl=30)
                assert holder is not None
                waiters = [asyncio.create_task(quorum.acquire(key, ttl=30, wait=5))
                           for _ in range(4)]  # fmt: skip
                await asyncio.sleep(0.002 * round_)
                releasing = asyncio.create_task(quorum.release(holder))
                await asyncio.sleep(0.001 * (round_ % 5))
                for waiter in waiters:
                    waiter.cancel()
                await releasing
                for outcome in await asyncio.gather(*waiters, return_exceptions=True):
                    if isinstance(outcome, Lease):  # it won before the cancel: let go
                        await quorum.release(outcome)
                await asyncio.sleep(0.1)  # what cancelled tasks undo runs in the background
                assert held_on(redis_masters, key) == [], f"held after round {round_}"
        finally:
            await close(quorum)

    run(main)


# -- renewal, loss and the loop's end --------------------------------------------------------


def test_the_watchdog_renews_on_the_loop_and_an_async_on_lost_hears_the_loss(
    redis_masters: RedisMasters, key: str
) -> None:
    async def main() -> tuple[bool, list[str]]:
        quorum = quorum_of(redis_masters, members=3, watchdog_ttl=1.0)
        told: list[str] = []

        async def lost(lease: Lease) -> None:
            told.append(lease.state.reason)

        try:
            lease = await quorum.acquire(key, on_lost=lost)
            assert lease is not None
            await asyncio.sleep(2.5)  # past two ttls: renewed by a task, or gone
            kept = await quorum.is_held(lease) and held_on(redis_masters, key) == [0, 1, 2]
            redis_masters.servers[1].kill()
            redis_masters.servers[2].kill()
            for _ in range(100):
                if told:
                    break
                await asyncio.sleep(0.05)
            with pytest.raises(LockNotOwned):
                await quorum.release(lease)
            return kept, told
        finally:
            redis_masters.servers[1].start()
            redis_masters.servers[2].start()
            await close(quorum)

    kept, told = run(main)
    assert kept
    assert len(told) == 1 and "member" in told[0]


def test_the_loops_end_ends_its_leases_on_every_member(
    redis_masters: RedisMasters, key: str
) -> None:
    leases: list[Lease] = []

    async def main() -> None:
        quorum = quorum_of(redis_masters, members=3)
        lease = await quorum.acquire(key)  # watchdog-renewed: a task on this loop
        assert lease is not None
        leases.append(lease)
        assert held_on(redis_masters, key) == [0, 1, 2]
        # asyncio.run cancels the watchdog task as the loop ends, with the lease held

    run(main)
    assert leases[0].state.lost
    assert until(lambda: held_on(redis_masters, key) == [])


def test_two_members_down_it_grants_and_three_down_names_them(
    redis_masters: RedisMasters, key: str
) -> None:
    async def main() -> None:
        quorum = quorum_of(redis_masters)
        try:
            redis_masters.servers[0].kill()
            redis_masters.servers[1].kill()
            lease = await quorum.acquire(key, ttl=5, wait=0)
            assert lease is not None
            await quorum.release(lease)
            redis_masters.servers[2].kill()
            with pytest.raises(BackendUnavailable, match="cannot reach 3 of its 5") as raised:
                await quorum.acquire(key, ttl=5, wait=0)
            assert raised.value.backend == "quorum"
        finally:
            for server in redis_masters.servers[:3]:
                server.start()
            await close(quorum)

    run(main)


def test_a_paused_member_never_blocks_the_loop(redis_masters: RedisMasters) -> None:
    """100 tasks on 50 keys while one member is paused (each round waits out its socket
    timeout, 0.5 s): the loop's p99 lag stays under 20 ms, as the database's, and no
    wake-up is 250 ms late: three members' calls for every step of a task."""

    async def main() -> tuple[int, Lags]:
        quorum = quorum_of(redis_masters, members=3)
        prefix = uuid.uuid4().hex
        grants = 0

        async def worker(index: int, until: float) -> None:
            nonlocal grants
            while time.monotonic() < until:
                # each round waits for the paused member's pool (10 connections, each
                # held 0.5 s, for 100 tasks): a grant may come with little validity left
                # and have run out at its release, which says so (LockNotOwned)
                with contextlib.suppress(LockNotOwned):
                    async with quorum.lock(f"{prefix}:{index % 50}", ttl=5, wait=30):
                        grants += 1
                        await asyncio.sleep(0)

        try:
            redis_masters.servers[2].pause()
            meter = LagMeter()
            meter.start()
            end = time.monotonic() + 2.0
            await asyncio.gather(*(worker(i, end) for i in range(100)))
            return grants, {"lag": await meter.stop()}
        finally:
            redis_masters.servers[2].resume()
            await close(quorum)

    lag_within(0.020, lambda: run(main), fewest=100)


def test_a_threaded_and_an_asyncio_quorum_exclude_each_other(
    redis_masters: RedisMasters, key: str
) -> None:
    """One lock, two faces: a thread's grant keeps the task out, and the other way."""
    threaded = ThreadedQuorum([ThreadedRedis(url, name=f"r{i}") for i, url in
                               enumerate(redis_masters.urls)])  # fmt: skip
    lease = threaded.acquire(key, ttl=5)
    assert lease is not None

    async def main() -> Lease | None:
        quorum = quorum_of(redis_masters)
        try:
            return await quorum.acquire(key, ttl=5, wait=0.2)
        finally:
            await close(quorum)  # it ends the lease again

    try:
        assert run(main) is None
        threaded.release(lease)
        assert run(main) is not None
        again = threaded.acquire(key, ttl=5, wait=0)
        assert again is not None  # the asyncio grant was released with its quorum
        threaded.release(again)
    finally:
        threaded.close()
        for member in threaded.members.values():
            member.close()


def test_bad_input_is_a_value_error_before_any_io() -> None:
    async def main() -> None:
        quorum = aio.Quorum([aio.RedisProvider("redis://127.0.0.1:1/0", name=f"r{i}")
                             for i in range(3)])  # fmt: skip
        with pytest.raises(ValueError, match="ttl"):
            await quorum.acquire("k", ttl=-1)
        with pytest.raises(ValueError, match="key"):
            await quorum.acquire("", ttl=1)
        await close(quorum)

    run(main)


def test_a_closed_quorum_says_so(redis_masters: RedisMasters) -> None:
    async def main() -> None:
        quorum = quorum_of(redis_masters, members=3)
        await close(quorum)
        with pytest.raises(BackendUnavailable, match="closed"):
            await quorum.acquire("k", ttl=1)

    run(main)
