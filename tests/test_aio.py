"""What only the asyncio face can get wrong: the task as owner, cancellation, the event
loop never blocked, leases ended with their loop, async callbacks and the decorator,
faults seen from a loop. (The contract suite runs over these providers too, through
tests/aio_bridge.py.)"""

from __future__ import annotations

import asyncio
import gc
import logging
import statistics
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis

from locks import LockTimeout, aio
from locks.aio.base import AsyncProviderBase
from locks.backends import LocalProvider as ThreadedLocal
from locks.backends import RedisProvider as ThreadedRedis
from locks.errors import BackendUnavailable, LockNotOwned
from locks.provider import Lease
from tests.servers import RedisServer

KINDS = ["local", "redis", "redis-hash"]


def make(kind: str, url: str, **options: Any) -> AsyncProviderBase:
    if kind == "local":
        return aio.LocalProvider(**options)
    if kind == "redis":
        return aio.RedisProvider(url, **options)
    return aio.RedisHashProvider(url, **options)


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def url(kind: str, request: pytest.FixtureRequest) -> str:
    if kind == "local":
        return ""
    server: RedisServer = request.getfixturevalue("redis_server")
    return server.url


def run(main: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(main())  # type: ignore[arg-type]


def free(url: str, key: str) -> bool:
    """Whether `key` is free on the server, asked by a threaded provider."""
    provider = ThreadedRedis(url)
    try:
        lease = provider.acquire(key, ttl=5, wait=0)
        if lease is not None:
            provider.release(lease)
        return lease is not None
    finally:
        provider.close()


# -- the task is the owner ---------------------------------------------------------------


def test_two_tasks_exclude_each_other_and_one_task_nests(kind: str, url: str, key: str) -> None:
    async def main() -> None:
        provider = make(kind, url)
        try:
            outer = await provider.acquire(key, ttl=10)
            assert outer is not None

            async def other() -> Lease | None:
                return await provider.acquire(key, ttl=10, wait=0.1)

            assert await asyncio.create_task(other()) is None, "another task took it"
            inner = await provider.acquire(key, ttl=10, wait=0)
            if provider.capabilities.reentrant:
                assert inner is not None and inner.depth == 2 and inner.fence == outer.fence
                await provider.release(inner)
            else:
                assert inner is None, "a non-reentrant lock let its holder take it twice"

            async def release_it() -> None:
                await provider.release(outer)

            await asyncio.create_task(release_it())  # the lease, not the task, says whose
            assert await asyncio.create_task(other()) is not None
        finally:
            await provider.close()

    run(main)


def test_contended_tasks_never_overlap(kind: str, url: str, key: str) -> None:
    inside = 0
    most = 0
    done = 0

    async def worker(provider: AsyncProviderBase) -> None:
        nonlocal inside, most, done
        for _ in range(20):
            async with provider.lock(key, ttl=10, wait=30):
                inside += 1
                most = max(most, inside)
                await asyncio.sleep(0)  # another task runs here, if it can get in
                inside -= 1
                done += 1

    async def main() -> None:
        providers = [make(kind, url) for _ in range(2)]
        try:
            await asyncio.gather(*(worker(providers[i % 2]) for i in range(20)))
        finally:
            for provider in providers:
                await provider.close()

    run(main)
    assert most == 1, f"{most} tasks held {key!r} at once"
    assert done == 400


def test_a_task_and_a_thread_exclude_each_other_on_a_local_name(key: str) -> None:
    threaded = ThreadedLocal()
    held = threaded.acquire(key)
    assert held is not None
    got: list[float] = []

    async def main() -> None:
        provider = aio.LocalProvider()
        started = time.monotonic()
        threading.Timer(0.2, threaded.release, args=(held,)).start()
        lease = await provider.acquire(key, wait=5)  # woken by the thread's release
        assert lease is not None
        got.append(time.monotonic() - started)
        await provider.release(lease)

    run(main)
    assert 0.15 < got[0] < 1.0


# -- cancellation ----------------------------------------------------------------------


def test_a_waiting_acquire_cancelled_by_a_timeout_leaves_nothing(
    kind: str, url: str, key: str
) -> None:
    async def main() -> None:
        provider = make(kind, url)
        try:
            holder = await provider.acquire(key, ttl=10)
            assert holder is not None

            async def waiter() -> None:
                async with asyncio.timeout(0.2):
                    await provider.acquire(key, ttl=10, wait=5)

            with pytest.raises(TimeoutError):
                await asyncio.create_task(waiter())
            await provider.release(holder)

            async def taker() -> Lease | None:
                return await provider.acquire(key, ttl=10, wait=0)

            taken = await asyncio.create_task(taker())
            assert taken is not None, "the cancelled waiter left a grant behind"
            await provider.release(taken)
            if kind == "local":
                assert len(provider) == 0  # type: ignore[arg-type]
        finally:
            await provider.close()

    run(main)


@pytest.mark.parametrize("kind", ["redis", "redis-hash"], indirect=False)
def test_an_acquire_cancelled_while_the_server_holds_its_request_is_undone(
    kind: str, redis_server: RedisServer, key: str
) -> None:
    """The request is on the server (paused), its reply not back, when the task is
    cancelled: once the server answers, the grant it made is released before the
    cancellation reaches the caller, never left for its ttl."""
    outcome: list[str] = []

    async def main() -> None:
        provider = make(kind, redis_server.url, socket_timeout=2.0)
        try:
            await provider.ping()
            redis_server.pause()
            task = asyncio.create_task(provider.acquire(key, ttl=30))
            await asyncio.sleep(0.2)  # sent, not answered
            task.cancel()
            threading.Timer(0.3, redis_server.resume).start()
            try:
                await task
                outcome.append("granted")
            except asyncio.CancelledError:
                outcome.append("cancelled")
        finally:
            await provider.close()

    run(main)
    assert outcome == ["cancelled"]
    assert free(redis_server.url, key), "the cancelled acquire's grant was left on the server"


def test_a_release_runs_to_its_end_when_its_task_is_cancelled(
    redis_server: RedisServer, key: str
) -> None:
    async def main() -> None:
        provider = aio.RedisProvider(redis_server.url, socket_timeout=2.0)
        try:
            lease = await provider.acquire(key, ttl=30)
            assert lease is not None
            redis_server.pause()
            task = asyncio.create_task(provider.release(lease))
            await asyncio.sleep(0.1)
            task.cancel()
            threading.Timer(0.2, redis_server.resume).start()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            await provider.close()

    run(main)
    assert free(redis_server.url, key), "a cancelled release was abandoned halfway"


# -- the loop is never blocked -----------------------------------------------------------


class LagMeter:
    """How late the loop runs a 1 ms sleep's wake-up, sampled all along."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            self.lags.append(time.perf_counter() - before - 0.001)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> float:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        return statistics.quantiles(self.lags, n=100)[98]


async def contend(provider: AsyncProviderBase, key: str, seconds: float) -> tuple[int, list[str]]:
    """1,000 tasks over 100 keys, each taking its key in turn for `seconds`: grants, and
    the errors met (each followed by a pause)."""
    grants = 0
    failures: list[str] = []

    async def worker(index: int, until: float) -> None:
        nonlocal grants
        name = f"{key}:{index % 100}"
        while time.monotonic() < until:
            try:
                async with provider.lock(name, ttl=5, wait=10):
                    grants += 1
                    await asyncio.sleep(0)  # the guarded work: one turn of the loop
            except (BackendUnavailable, LockTimeout, LockNotOwned) as error:
                failures.append(type(error).__name__)
                await asyncio.sleep(0.05)

    until = time.monotonic() + seconds
    await asyncio.gather(*(worker(i, until) for i in range(1000)))
    return grants, failures


@pytest.mark.parametrize("kind", ["redis", "redis-hash"], indirect=False)
def test_1000_tasks_locking_and_a_paused_server_never_block_the_loop(
    kind: str, redis_server: RedisServer, key: str
) -> None:
    """The loop's p99 lag stays under 5 ms while 1,000 tasks contend, and while the
    server is paused under them (a blocking call would stall it a socket timeout)."""

    async def main() -> tuple[int, float, float]:
        provider = make(kind, redis_server.url)  # the defaults: what a service gets
        try:
            meter = LagMeter()
            meter.start()
            grants, _ = await contend(provider, key, 2.0)
            busy = await meter.stop()
            meter = LagMeter()
            meter.start()
            redis_server.pause()
            threading.Timer(1.0, redis_server.resume).start()
            await contend(provider, key, 2.0)
            return grants, busy, await meter.stop()
        finally:
            await provider.close()

    grants, busy, paused = run(main)
    assert grants > 1000, f"only {grants} grants in 2 s: the test measured nothing"
    assert busy <= 0.005, f"p99 loop lag {busy * 1000:.1f} ms while 1,000 tasks locked"
    assert paused <= 0.005, f"p99 loop lag {paused * 1000:.1f} ms while the server was paused"


def test_1000_tasks_on_local_locks_never_hold_the_loop_for_a_step(key: str) -> None:
    """The local backend does no I/O: what could stall the loop is one step (a task's
    run between two awaits) that takes long, e.g. a thread lock held across a wait.
    asyncio's debug mode names every step over 5 ms. (Its lag under this load is its
    throughput's, 100 keys handed over in each turn of the loop; and the collector's
    pauses, with 1,000 tasks alive, are Python's: it is off while this runs.)"""
    slow: list[str] = []

    class Slow(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if "took" in message and "worker()" in message:  # not the test's own setup
                slow.append(message)

    handler = Slow()
    logging.getLogger("asyncio").addHandler(handler)

    async def main() -> int:
        asyncio.get_running_loop().slow_callback_duration = 0.005
        grants, _ = await contend(aio.LocalProvider(), key, 1.0)
        return grants

    gc.disable()
    try:
        grants = asyncio.run(main(), debug=True)
    finally:
        gc.enable()
        logging.getLogger("asyncio").removeHandler(handler)
    assert grants > 1000
    assert not slow, f"steps over 5 ms: {slow[:3]}"


# -- leases end with their loop; async callbacks --------------------------------------


def test_leases_held_when_the_loop_shuts_down_are_ended(
    redis_server: RedisServer, key: str
) -> None:
    """`asyncio.run` returns with leases still held: one kept by the application (a
    fixed ttl, and a renewed one), one by a task still inside its `async with`. None is
    left on the server, and each holder is told."""
    told: list[str] = []
    kept: list[Lease | None] = []

    async def main() -> None:
        provider = aio.RedisHashProvider(redis_server.url)
        for name, ttl in ((":fixed", 60.0), (":renewed", None)):
            kept.append(await provider.acquire(key + name, ttl=ttl,
                                               on_lost=lambda it: told.append(it.key)))  # fmt: skip
        entered = asyncio.Event()

        async def busy() -> None:
            async with provider.lock(key + ":busy", ttl=60):
                entered.set()
                await asyncio.sleep(3600)

        asyncio.get_running_loop().create_task(busy())
        await entered.wait()
        # returns with all three held and the provider open: asyncio.run cancels the rest

    run(main)
    assert sorted(told) == [key + ":fixed", key + ":renewed"]
    for name in (":fixed", ":renewed", ":busy"):
        assert free(redis_server.url, key + name), f"{name} outlived its loop on the server"


def test_an_async_on_lost_runs_on_the_loop(redis_server: RedisServer, key: str) -> None:
    async def main() -> list[str]:
        provider = aio.RedisProvider(redis_server.url, watchdog_ttl=0.6)
        heard = asyncio.Event()
        told: list[str] = []

        async def on_lost(lease: Lease) -> None:
            await asyncio.sleep(0)
            told.append(lease.state.reason)
            heard.set()

        try:
            lease = await provider.acquire(key, on_lost=on_lost)
            assert lease is not None
            admin = redis.Redis.from_url(redis_server.url)
            admin.delete(*admin.keys(f"locks:{{{key}}}"))
            admin.close()
            async with asyncio.timeout(2):
                await heard.wait()
            return told
        finally:
            await provider.close()

    assert run(main) == ["the backend no longer holds it"]


def test_a_provider_serves_one_loop(redis_server: RedisServer, key: str) -> None:
    provider = aio.RedisProvider(redis_server.url)

    async def first() -> None:
        lease = await provider.acquire(key, ttl=10)
        assert lease is not None
        await provider.release(lease)

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    try:
        asyncio.run_coroutine_threadsafe(first(), loop).result(5)
        with pytest.raises(RuntimeError, match="another event loop"):
            run(first)
    finally:
        asyncio.run_coroutine_threadsafe(provider.close(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)


# -- the decorator ---------------------------------------------------------------------


def test_the_decorator_holds_the_lock_for_the_awaited_body(kind: str, url: str) -> None:
    inside: list[int] = []
    most = 0

    async def main() -> None:
        nonlocal most
        provider = make(kind, url)

        @provider.locked("order:{order_id}", ttl=10, wait=10)
        async def pay(order_id: int) -> int:
            nonlocal most
            inside.append(order_id)
            most = max(most, inside.count(order_id))
            await asyncio.sleep(0.01)  # the lock must still be held here
            inside.remove(order_id)
            return order_id

        try:
            results = await asyncio.gather(*(pay(i % 3) for i in range(12)))
            assert sorted(results) == sorted(i % 3 for i in range(12))
        finally:
            await provider.close()

    run(main)
    assert most == 1


def test_each_face_refuses_the_other_kind_of_function() -> None:
    async def body() -> None: ...

    def plain() -> None: ...

    with pytest.raises(TypeError, match=r"locks\.aio"):
        ThreadedLocal().locked("k")(body)
    with pytest.raises(TypeError, match="not an `async def`"):
        aio.LocalProvider().locked("k")(plain)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no argument 'order_id'"):
        aio.LocalProvider().locked("k:{order_id}")(body)


# -- bad input, faults -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "named"),
    [({"key": ""}, "key"), ({"key": "k", "ttl": -1}, "ttl"), ({"key": "k", "wait": -1}, "wait")],
)
def test_bad_input_is_refused_before_any_io(arguments: dict[str, Any], named: str) -> None:
    async def main() -> None:
        provider = aio.RedisProvider("redis://127.0.0.1:1/0")  # nobody listens: no I/O made
        with pytest.raises(ValueError, match=named):
            await provider.acquire(**arguments)
        await provider.close()

    run(main)


def test_sentinel_and_cluster_urls_are_refused_by_name() -> None:
    for url in ("redis+sentinel://127.0.0.1:1/s", "redis+cluster://127.0.0.1:1"):
        with pytest.raises(ValueError, match="one server"):
            aio.RedisProvider(url)


@pytest.fixture
def unreachable_port() -> Iterator[int]:
    from tests.ports import free_port  # noqa: PLC0415

    yield free_port()


@pytest.mark.parametrize("fault", ["killed", "paused"])
def test_a_server_down_is_backend_unavailable_naming_it_and_then_it_recovers(
    fault: str, redis_server: RedisServer, key: str
) -> None:
    async def main() -> None:
        provider = aio.RedisHashProvider(redis_server.url, socket_timeout=0.3)
        try:
            lease = await provider.acquire(key, ttl=10)
            assert lease is not None
            (redis_server.kill if fault == "killed" else redis_server.pause)()
            started = time.monotonic()
            with pytest.raises(BackendUnavailable) as raised:
                await provider.acquire(key + ":2", ttl=10)
            assert time.monotonic() - started < 2.0
            assert raised.value.backend == "redis-hash"
            assert redis_server.address in str(raised.value)
            redis_server.ensure_running()
            again = await provider.acquire(key + ":3", ttl=10, wait=2)
            assert again is not None
            await provider.release(again)
        finally:
            await provider.close()

    run(main)
