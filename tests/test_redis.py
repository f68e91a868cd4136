"""What only the Redis backends promise: outage reporting, key layout, scripts by SHA,
one subscriber connection, fence counters that expire and restart above themselves."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from redis.crc import key_slot

from locks import BackendUnavailable, FallbackChain, Lease, LockError, LockNotOwned
from locks.backends import LocalProvider, RedisHashProvider, RedisProvider
from locks.backends.redis import notify, scripts
from locks.backends.redis import pool as redis_pool
from locks.backends.redis.notify import Later, _discard
from locks.backends.redis.provider import _RedisProviderBase
from locks.backends.redis.scripts import Script, acl_rule
from locks.errors import BackendError
from locks.events import Event, EventKind, add_observer, remove_observer
from locks.owner import current_owner
from tests import workers
from tests.forks import in_forked_child
from tests.ports import free_port
from tests.servers import RedisServer
from tests.servers.redis_masters import RedisMaster
from tests.threads import in_thread, woken_after

PROVIDERS = [RedisProvider, RedisHashProvider]


@pytest.fixture(params=PROVIDERS, ids=["redis", "redis-hash"])
def provider(
    request: pytest.FixtureRequest, redis_server: RedisServer
) -> Iterator[_RedisProviderBase]:
    made: _RedisProviderBase = request.param(redis_server.url)
    yield made
    made.close()


@pytest.fixture
def admin(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    yield client
    client.close()


def test_a_killed_redis_is_reported_within_a_second_then_the_provider_recovers(
    provider: _RedisProviderBase, redis_server: RedisServer, key: str
) -> None:
    lease = provider.acquire(key, ttl=30)
    assert lease is not None
    redis_server.kill()
    started = time.monotonic()
    with pytest.raises(BackendUnavailable) as caught:
        provider.acquire(key + ":2", ttl=30)
    assert time.monotonic() - started < 1.0
    error = caught.value
    assert error.backend == provider.name
    assert error.address == redis_server.address
    assert redis_server.address in str(error) and provider.name in str(error)
    with pytest.raises(BackendUnavailable):
        provider.release(lease)  # a bare provider reports it; only a chain queues it
    redis_server.start()
    again = provider.acquire(key, ttl=30, wait=0)
    assert again is not None  # the restarted server is empty: the old lease is gone
    provider.release(again)


def test_a_paused_redis_is_reported_within_a_second_as_ambiguous(
    provider: _RedisProviderBase, redis_server: RedisServer, key: str
) -> None:
    provider.ping()  # connect while it answers
    redis_server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(BackendUnavailable) as caught:
            provider.acquire(key, ttl=30)
        assert time.monotonic() - started < 1.0
        # the request may have reached the server: whoever degrades must clean up this token
        assert caught.value.ambiguous
        assert caught.value.key == key
        assert caught.value.token
    finally:
        redis_server.resume()
    lease = provider.acquire(key, ttl=30, wait=0)
    assert lease is not None
    provider.release(lease)


def test_waiters_are_still_woken_promptly_after_redis_restarts(
    provider: _RedisProviderBase, redis_server: RedisServer, key: str
) -> None:
    # subscribe once, so the subscriber connection exists when Redis dies
    first = provider.acquire(key, ttl=30)
    assert first is not None
    waiter = threading.Thread(target=lambda: provider.acquire(key, ttl=30, wait=0.5))
    waiter.start()
    waiter.join()
    redis_server.restart()
    time.sleep(0.5)  # the subscriber notices and reconnects
    lease = provider.acquire(key, ttl=30)  # the restarted server is empty
    assert lease is not None
    assert woken_after(provider, lease, provider) < 0.5


@pytest.mark.parametrize("query", ["", "?protocol=3", "?decode_responses=true"])
@pytest.mark.parametrize("kind", PROVIDERS, ids=["redis", "redis-hash"])
def test_the_release_message_wakes_a_waiter_whatever_the_clients_protocol(
    kind: type[_RedisProviderBase], redis_server: RedisServer, key: str, query: str
) -> None:
    """The subscriber reads its connection itself: a RESP3 push and a decoded reply are
    messages too. A message it misread would leave the waiter to the holder's 30 s ttl."""
    provider = kind(redis_server.url + query)
    other = kind(redis_server.url + query)
    try:
        lease = provider.acquire(key, ttl=30)
        assert lease is not None
        assert woken_after(provider, lease, other) < 0.5
    finally:
        provider.close()
        other.close()


def test_the_password_never_appears_in_an_error() -> None:
    port = free_port()
    provider = RedisProvider(f"redis://:sup3r-s3cret@127.0.0.1:{port}/0")
    with pytest.raises(BackendUnavailable) as caught:
        provider.acquire("k", ttl=1)
    assert "sup3r-s3cret" not in str(caught.value)
    assert f"127.0.0.1:{port}" in str(caught.value)
    assert not caught.value.ambiguous  # refused at connect: nothing was sent
    provider.close()


def commands_processed(admin: redis.Redis) -> int:
    return int(admin.info("stats")["total_commands_processed"])


def test_bad_input_sends_nothing_to_the_server(
    provider: _RedisProviderBase, admin: redis.Redis
) -> None:
    before = commands_processed(admin)
    for bad in ["", "x" * 10_000, "a\0b", "a\nb"]:
        with pytest.raises(ValueError, match="key"):
            provider.acquire(bad)
    for ttl in [0, -1, float("nan"), float("inf")]:
        with pytest.raises(ValueError, match="ttl"):
            provider.acquire("k", ttl=ttl)
    with pytest.raises(ValueError, match="wait"):
        provider.acquire("k", wait=-1)
    assert commands_processed(admin) == before + 1  # the INFO above counts itself once


def test_scripts_are_called_by_sha_and_reloaded_after_a_flush(
    provider: _RedisProviderBase, admin: redis.Redis, key: str
) -> None:
    """After a flush (or a failover to a server that never saw them) each script is sent
    once as EVAL, which caches it again; every other call is by SHA."""
    admin.config_resetstat()
    admin.script_flush()
    for _ in range(3):
        lease = provider.acquire(key, ttl=30)
        assert lease is not None
        provider.extend(lease, 30)
        provider.release(lease)
    stats = admin.info("commandstats")
    assert stats["cmdstat_eval"]["calls"] == 3  # acquire, extend, release: once each
    assert stats["cmdstat_evalsha"]["calls"] >= 6


@pytest.mark.parametrize("encoding", ["utf-8", "latin-1"])
def test_a_script_call_is_packed_byte_for_byte_as_redis_py_packs_it(encoding: str) -> None:
    """The acquire and release are sent pre-packed (`Script.pack`): the bytes must be
    redis-py's own, in the connection's encoding, or names would change keys."""
    script = Script(scripts.PLAIN_ACQUIRE)
    connection = redis.Connection(encoding=encoding)  # type: ignore[no-untyped-call]
    keys = ["locks:{é:订}" if encoding == "utf-8" else "locks:{é}", "locks:{x}:fence"]
    for args in (["owner/token", 10_000, 604_800_000, -1, ""], [0, 2**53], []):
        expected = b"".join(connection.pack_command("EVALSHA", script.sha, 2, *keys, *args))  # type: ignore[no-untyped-call]
        assert script.pack(keys, args, encoding, "strict") == expected
    for wrong in (True, 1.5, b"bytes"):
        with pytest.raises(TypeError):
            script.pack(keys, [wrong], encoding, "strict")


@pytest.mark.parametrize("name", ["plain", "}x", "{a}b", "a{b}c", "{}", "锁:订单", "a%7Bb"])
def test_every_key_of_a_lock_shares_one_cluster_slot(
    provider: _RedisProviderBase, name: str
) -> None:
    keys = provider._keys(name)
    slots = {key_slot(k.encode()) for k in (keys.lock, keys.fence, keys.waiters)}
    assert len(slots) == 1
    assert provider._keys("a{b") != provider._keys("a%7Bb")  # escaping is unambiguous


def test_hostile_names_are_stored_verbatim_under_the_prefix(
    provider: _RedisProviderBase, admin: redis.Redis
) -> None:
    for name in ["../x", "a/b", "'; FLUSHALL; --", "}{", "*", "锁:订单"]:
        lease = provider.acquire(name, ttl=30)
        assert lease is not None and lease.key == name
        assert admin.exists(provider._keys(name).lock) == 1
        provider.release(lease)
        assert admin.exists(provider._keys(name).lock) == 0
    assert admin.dbsize() > 0  # nothing was flushed


def test_fence_counters_expire_and_restart_above_every_fence_handed_out(
    redis_server: RedisServer, admin: redis.Redis, key: str
) -> None:
    for cls in PROVIDERS:
        provider = cls(redis_server.url, fence_ttl=0.2)
        lease = provider.acquire(key, ttl=30)
        assert lease is not None
        provider.release(lease)
        time.sleep(0.3)
        # nothing of the lock is left in Redis once the counter expired
        assert admin.keys(f"locks:{{{key}}}*") == []
        again = provider.acquire(key, ttl=30)
        assert again is not None and again.fence > lease.fence
        provider.release(again)
        provider.close()


def test_all_waiters_share_one_subscriber_connection(
    provider: _RedisProviderBase, admin: redis.Redis, key: str
) -> None:
    waiters = 150  # more than redis-py's default pool of 100
    keys = [f"{key}:{i}" for i in range(waiters)]
    held = [provider.acquire(k, ttl=30) for k in keys]
    results: list[Lease | None] = [None] * waiters

    def wait(i: int) -> None:
        results[i] = provider.acquire(keys[i], ttl=30, wait=20)

    threads = [threading.Thread(target=wait, args=(i,)) for i in range(waiters)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    # every waiter is parked on one pub/sub connection; none holds a connection of its own,
    # so the provider stays within its pool (the pub/sub one included) and the admin's one
    clients = admin.client_list()
    assert sum(int(client["sub"]) > 0 for client in clients) == 1
    client = provider.client
    assert isinstance(client, redis.Redis)
    pool_size = client.connection_pool.max_connections
    assert pool_size < waiters
    assert len(clients) <= pool_size + 1
    started = time.monotonic()
    for lease in held:
        assert lease is not None
        provider.release(lease)
    for thread in threads:
        thread.join(30)
    assert time.monotonic() - started < 5  # woken by messages, not by the 30 s PTTL
    assert all(result is not None for result in results)
    for result in results:
        assert result is not None
        provider.release(result)


def _publishes(admin: redis.Redis) -> int:
    """PUBLISH calls the server has run, inside scripts too."""
    stats = admin.info("commandstats")
    return int(stats.get("cmdstat_publish", {}).get("calls", 0))


def test_a_release_nobody_waits_for_publishes_nothing(
    provider: _RedisProviderBase, admin: redis.Redis, key: str
) -> None:
    """Uncontended, and tries that do not wait (wait=0) on a held lock: no PUBLISH."""
    before = _publishes(admin)
    for _ in range(20):
        lease = provider.acquire(key, ttl=30, wait=0)
        assert lease is not None
        assert in_thread(lambda: provider.acquire(key, ttl=30, wait=0)) is None
        provider.release(lease)
    assert _publishes(admin) == before
    assert admin.exists(provider._keys(key).waiters) == 0


def test_every_waiter_of_a_process_is_woken_by_its_neighbours_releases(
    provider: _RedisProviderBase, admin: redis.Redis, key: str
) -> None:
    """Three threads of one process wait on a lock held with a 30 s ttl; each release
    wakes the next within a second, not the 30 s PTTL, though a grant takes the process
    out of the lock's waiters: a release wakes its own process's waiters directly."""
    holder = provider.acquire(key, ttl=30)
    assert holder is not None
    order: list[float] = []

    def wait_then_hold() -> None:
        lease = provider.acquire(key, ttl=30, wait=20)
        assert lease is not None
        order.append(time.monotonic())
        time.sleep(0.1)
        provider.release(lease)

    threads = [threading.Thread(target=wait_then_hold) for _ in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)  # all three asleep
    released = time.monotonic()
    provider.release(holder)
    for thread in threads:
        thread.join(30)
    assert len(order) == 3
    assert order[-1] - released < 3  # three hand-offs, none waited out the 30 s PTTL
    # what is left of the waiters' set expires within their wait (20 s) plus a second
    assert admin.pttl(provider._keys(key).waiters) <= 21_000


def _attempts_by_thread(
    provider: _RedisProviderBase, monkeypatch: pytest.MonkeyPatch, fail: BaseException | None = None
) -> list[str]:
    """The names of the threads that send claimed attempts from now on; with `fail`,
    each of those sends raises it instead."""
    senders: list[str] = []
    real = provider._try_later

    def try_later(*args: Any, **kwargs: Any) -> Any:
        senders.append(threading.current_thread().name)
        if fail is not None:
            raise fail
        return real(*args, **kwargs)

    monkeypatch.setattr(provider, "_try_later", try_later)
    return senders


def test_a_release_hands_over_to_its_own_waiter_from_the_releasing_thread(
    provider: _RedisProviderBase, admin: redis.Redis, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release with a waiter of its own process on the lock publishes nothing to it:
    the releasing thread sends the waiter's next attempt the moment its reply is in
    (the subscriber would hear of it a message later). No other process waits, so the
    release publishes nothing at all."""
    lease = provider.acquire(key, ttl=30)
    assert lease is not None
    senders = _attempts_by_thread(provider, monkeypatch)
    before = _publishes(admin)
    assert woken_after(provider, lease, provider) < 1  # not the 30 s ttl
    assert _publishes(admin) == before
    assert senders == [threading.current_thread().name]


def test_an_interrupted_hand_over_leaves_the_waiter_to_try_itself(
    provider: _RedisProviderBase, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal's handler raising in the releasing thread while it sends its waiter's
    attempt: the release is done, the interrupt reaches the caller, and the waiter,
    claimed for an attempt that never went out, is told to try itself (not left to
    wait for a result that never comes)."""
    lease = provider.acquire(key, ttl=30)
    assert lease is not None
    granted: list[Lease | None] = []
    waiter = threading.Thread(target=lambda: granted.append(provider.acquire(key, ttl=30, wait=20)))
    waiter.start()
    time.sleep(0.3)  # asleep on the holder's 30 s pttl
    senders = _attempts_by_thread(provider, monkeypatch, fail=KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        provider.release(lease)
    monkeypatch.undo()
    waiter.join(5)
    assert senders == [threading.current_thread().name]
    assert granted and granted[0] is not None, "the claimed waiter never tried again"
    provider.release(granted[0])


def test_a_release_in_doubt_still_wakes_its_own_waiter(
    provider: _RedisProviderBase, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release whose reply is lost may have run, and a release that hands over
    publishes nothing to its own process: its waiter is woken to look for itself, not
    left to the holder's 30 s pttl."""
    lease = provider.acquire(key, ttl=30)
    assert lease is not None
    real = provider._send
    armed: list[bool] = []  # the next send loses its reply (the holder's release)

    def send_then_lose(*args: Any, **kwargs: Any) -> Any:
        read = real(*args, **kwargs)
        assert read is not None
        if not armed:
            return read
        armed.clear()

        def lost() -> Any:
            read()  # it ran: the reply is lost on the way back
            raise provider._error(redis.ConnectionError("reply lost"), key=key)

        return lost

    monkeypatch.setattr(provider, "_send", send_then_lose)

    class LosingItsReply:
        """The holder's side of `woken_after`: its release runs, and its reply is lost."""

        def release(self, held: Lease) -> None:
            armed.append(True)
            with pytest.raises(BackendUnavailable):
                provider.release(held)

    assert woken_after(cast(Any, LosingItsReply()), lease, provider) < 1


def test_a_forked_child_never_hands_over_to_its_parents_waiters(
    provider: _RedisProviderBase, key: str
) -> None:
    """A child's copy of the notifier counts its parent's waiting threads, which do not
    exist in the child: a release there must not claim one (its grant would be held by
    nobody until its ttl)."""
    lease = provider.acquire(key, ttl=30)
    assert lease is not None
    waiter = threading.Thread(target=lambda: provider.acquire(key, ttl=30, wait=2))
    waiter.start()
    time.sleep(0.3)
    lock = provider._keys(key).lock
    try:
        assert provider._notifier.waits_on(lock)
        assert in_forked_child(lambda: [not provider._notifier.waits_on(lock)]) == [True]
    finally:
        provider.release(lease)
        waiter.join(5)


def test_a_release_wakes_at_most_two_processes_and_each_waiter_gets_its_turn(
    redis_server: RedisServer, admin: redis.Redis, key: str
) -> None:
    """Four providers (each listens on a channel of its own, as processes do) wait on a
    lock another holds with a 30 s ttl. Each release publishes to two of them at most,
    and every one gets the lock within a second of the release before its turn: a woken
    process that loses marks the set again, one not woken stays in it."""
    holder = RedisProvider(redis_server.url)
    waiters = [RedisProvider(redis_server.url) for _ in range(4)]
    lease = holder.acquire(key, ttl=30)
    assert lease is not None
    got: list[tuple[RedisProvider, Lease]] = []

    def wait(provider: RedisProvider) -> None:
        won = provider.acquire(key, ttl=30, wait=20)
        assert won is not None
        got.append((provider, won))

    threads = [threading.Thread(target=wait, args=(p,)) for p in waiters]
    for thread in threads:
        thread.start()
    time.sleep(0.5)  # all four asleep, each process in the set
    assert admin.zcard(holder._keys(key).waiters) == 4
    releaser = holder
    for turn in range(4):
        before = _publishes(admin)
        released = time.monotonic()
        releaser.release(lease)
        while len(got) == turn and time.monotonic() - released < 5:
            time.sleep(0.005)
        assert len(got) == turn + 1, f"turn {turn}: nobody was woken"
        assert time.monotonic() - released < 1.0, f"turn {turn}"
        assert _publishes(admin) - before <= 2
        releaser, lease = got[turn]
    releaser.release(lease)
    for thread in threads:
        thread.join(5)
    for provider in [holder, *waiters]:
        provider.close()


def test_an_existing_client_is_accepted_even_decoding_responses(
    redis_server: RedisServer, key: str
) -> None:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    for cls in PROVIDERS:
        provider = cls(client=client)
        lease = provider.acquire(key, ttl=30)
        assert lease is not None
        assert provider.is_held(lease)
        provider.release(lease)
        assert not provider.is_held(lease)
        provider.close()
    assert client.ping()  # a client passed in stays open: it is the caller's
    client.close()


def test_renewal_failures_past_validity_mark_the_lease_lost(
    provider: _RedisProviderBase, redis_server: RedisServer, key: str
) -> None:
    provider = type(provider)(redis_server.url, watchdog_ttl=1.0)
    events: list[Event] = []
    add_observer(events.append)
    lost = threading.Event()
    try:
        lease = provider.acquire(key, on_lost=lambda _: lost.set())
        assert lease is not None
        redis_server.pause()
        paused_at = time.monotonic()
        assert lost.wait(3.0)
        # not before the validity it had, not long after
        assert 0.3 <= time.monotonic() - paused_at <= 2.0
        assert lease.lost
    finally:
        redis_server.resume()
        remove_observer(events.append)
        provider.close()
    kinds = {event.kind for event in events if event.key == key}
    assert {EventKind.ACQUIRED, EventKind.BACKEND_ERROR, EventKind.LOST} <= kinds


# -- a restart or failover under held leases -------------------------------------------


def _wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_a_redis_restarted_empty_has_every_lease_on_it_told_lost_when_any_connection_returns(
    provider: _RedisProviderBase, redis_server: RedisServer, key: str
) -> None:
    """Found by a fault campaign: Redis killed and restarted empty while a watchdog lease
    was held; nothing told its holder until its release, and another process could take
    the key meanwhile. Now the first connection that meets the new run (here another
    thread's ping; a reconnecting subscriber does as well) has each lease checked, and
    the ones gone are lost at once: before any renewal (30 s away) or release."""
    lost: list[Lease] = []
    renewed = provider.acquire(key, on_lost=lost.append)
    fixed = provider.acquire(key + ":fixed", ttl=60, on_lost=lost.append)
    assert renewed is not None and fixed is not None
    redis_server.restart()
    provider.ping()
    assert _wait_for(lambda: len(lost) == 2, 2.0), "the restart went unnoticed"
    assert {id(lease) for lease in lost} == {id(renewed), id(fixed)}
    assert "restarted or failed over" in renewed.state.reason
    with pytest.raises(LockNotOwned, match="lost"):
        provider.release(renewed)
    again = provider.acquire(key, ttl=30, wait=0)  # the server agrees: the key is free
    assert again is not None
    provider.release(again)


@pytest.fixture
def aof_redis(tmp_path: Path) -> Iterator[RedisMaster]:
    server = RedisMaster(tmp_path)
    server.start()
    yield server
    server.stop()


@pytest.mark.parametrize("cls", PROVIDERS, ids=["redis", "redis-hash"])
def test_a_restart_that_kept_a_grant_in_its_aof_loses_only_what_it_lost(
    cls: type[_RedisProviderBase], aof_redis: RedisMaster, key: str
) -> None:
    """The check after a new run is exact: a grant the restarted server restored is still
    held; one it lacks (here deleted before anyone reconnected) is lost."""
    provider = cls(aof_redis.url)
    lost: list[Lease] = []
    kept = provider.acquire(key, on_lost=lost.append)
    gone = provider.acquire(key + ":gone", on_lost=lost.append)
    assert kept is not None and gone is not None
    aof_redis.restart()
    admin = redis.Redis.from_url(aof_redis.url)
    admin.delete(provider._keys(key + ":gone").lock)
    admin.close()
    provider.ping()
    assert _wait_for(lambda: bool(lost), 2.0), "the restart went unnoticed"
    time.sleep(0.2)
    assert lost == [gone]
    assert provider.is_held(kept) and not kept.lost
    provider.release(kept)
    provider.close()


def test_without_info_the_provider_warns_once_and_still_locks(
    redis_server: RedisServer, admin: redis.Redis, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    rule = acl_rule().replace(" +info", "")
    admin.execute_command("ACL", "SETUSER", "locks-noinfo", *rule.split(), ">pw")  # type: ignore[no-untyped-call]
    provider = RedisProvider(redis_server.url.replace("redis://", "redis://locks-noinfo:pw@"))
    try:
        with caplog.at_level(logging.WARNING, logger="locks"):
            for _ in range(2):
                lease = provider.acquire(key, ttl=30, wait=0)
                assert lease is not None
                provider.release(lease)
                provider.client.connection_pool.disconnect()  # type: ignore[union-attr]
        warnings = [r for r in caplog.records if "refused INFO" in r.getMessage()]
        assert len(warnings) == 1
        assert "+info" in warnings[0].getMessage()
    finally:
        provider.close()
        admin.acl_deluser("locks-noinfo")


def test_the_provider_rejects_bad_settings_before_connecting() -> None:
    with pytest.raises(ValueError, match="prefix"):
        RedisProvider(prefix="a{b}")
    with pytest.raises(ValueError, match="watchdog_ttl"):
        RedisProvider(watchdog_ttl=0)
    with pytest.raises(TypeError, match="client"):
        RedisProvider(client=object())  # type: ignore[arg-type]


def test_a_failed_subscribe_leaves_no_trace(redis_server: RedisServer, key: str) -> None:
    provider = RedisProvider(redis_server.url)
    lease = provider.acquire(key, ttl=30)
    assert lease is not None
    notifier = provider._notifier
    redis_server.kill()
    with (
        pytest.raises(BackendUnavailable),
        notifier.waiting("lock", None, lambda: Later(lambda: 0, print)),
    ):
        pass
    assert notifier._waiters == {} and notifier._pubsub is None
    redis_server.start()
    holder = RedisProvider(redis_server.url)  # another process, as the server sees it
    lease = holder.acquire(key, ttl=30)  # the restarted server is empty
    assert lease is not None
    # the next waiter subscribes afresh and is woken through the server by the release
    started = time.monotonic()
    threading.Timer(0.3, holder.release, args=(lease,)).start()
    other = provider.acquire(key, ttl=30, wait=10)
    assert other is not None and time.monotonic() - started < 1.0
    provider.release(other)
    holder.close()
    provider.close()


# -- every driver error is ours ----------------------------------------------------------


@pytest.fixture
def small_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of this test's own, so its settings harm no other test."""
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()


def test_a_redis_out_of_memory_is_unavailable_and_degrades(
    small_redis: RedisServer, key: str
) -> None:
    provider = RedisHashProvider(small_redis.url, name="redis")
    admin = redis.Redis.from_url(small_redis.url)
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", 1)  # every write is refused with OOM
    with pytest.raises(BackendUnavailable, match="OutOfMemoryError"):
        provider.acquire(key, ttl=30, wait=0)
    chain = FallbackChain([provider, LocalProvider(name=f"oom-{key}")])
    lease = chain.acquire(key, ttl=30, wait=0)  # OOM is a server that cannot serve now
    assert lease is not None and lease.backend.startswith("oom-")
    chain.release(lease)
    admin.config_set("maxmemory", 0)
    again = provider.acquire(key, ttl=30, wait=0)
    assert again is not None
    provider.release(again)
    admin.close()
    provider.close()


def test_the_two_redis_types_exclude_each_other_on_one_name(
    redis_server: RedisServer, key: str
) -> None:
    """A service on `redis` and another on `redis-hash` with one prefix: one lock domain,
    never a WRONGTYPE error, fences from one counter."""
    plain, hashed = RedisProvider(redis_server.url), RedisHashProvider(redis_server.url)
    first = plain.acquire(key, ttl=30)
    assert first is not None
    assert in_thread(lambda: hashed.acquire(key, ttl=30, wait=0)) is None
    assert hashed.holder(key) is not None
    plain.release(first)
    second = hashed.acquire(key, ttl=30)
    assert second is not None and second.fence > first.fence
    assert in_thread(lambda: plain.acquire(key, ttl=30, wait=0)) is None
    holder = plain.holder(key)
    assert holder is not None and holder.owner == second.owner
    with pytest.raises(LockNotOwned):  # a stale `redis` lease meets a hash: not its lock
        plain.release(first)
    assert hashed.is_held(second)
    hashed.release(second)
    plain.close()
    hashed.close()


@pytest.fixture
def not_redis() -> Iterator[str]:
    """An address where something that is not Redis answers (an HTTP-ish server)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn, contextlib.suppress(OSError):
                conn.recv(1024)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"redis://127.0.0.1:{port}/0"
    stop.set()
    thread.join()
    listener.close()


def test_a_service_that_is_not_redis_is_a_backend_error_not_a_crash(
    not_redis: str, key: str, tmp_path: Path
) -> None:
    provider = RedisProvider(not_redis)
    with pytest.raises(BackendError, match="redis backend 'redis'"):
        provider.ping()
    with pytest.raises(LockError):
        provider.acquire(key, ttl=30, wait=0)
    provider.close()
    config = tmp_path / "locks.toml"
    config.write_text(f'[backends]\nr = {{ type = "redis", url = "{not_redis}" }}\n')
    for command in (["status"], ["inspect", key]):
        done = subprocess.run(
            [sys.executable, "-m", "locks", *command, "--config", str(config)],
            capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
        assert done.returncode in (1, 3), done.stdout + done.stderr
        assert "Traceback" not in done.stderr, done.stderr


# -- a try split in two (what a quorum sends to all its members before reading) ------------


@pytest.mark.parametrize("cls", [RedisProvider, RedisHashProvider])
def test_a_split_try_grants_refuses_a_rival_and_survives_a_script_flush(
    redis_server: RedisServer, key: str, cls: type[_RedisProviderBase]
) -> None:
    mine, other = cls(redis_server.url), cls(redis_server.url)
    try:
        assert mine.start_acquire(key, ttl=5) is None  # no answer yet: it may have to connect
        mine.ping()
        mine.client.script_flush()  # the first send meets NOSCRIPT, and is sent again
        read = mine.start_acquire(key, ttl=5)
        assert read is not None
        lease = read()
        assert lease is not None and lease.fence > 0 and mine.is_held(lease)
        assert lease.valid_until is not None and lease.valid_until <= time.monotonic() + 5
        other.ping()
        rival = in_thread(lambda: other.start_acquire(key, ttl=5))
        assert rival is not None and in_thread(rival) is None
        if cls.capabilities.reentrant:  # a nested level needs no round trip at all
            nested = mine.start_acquire(key, ttl=5)
            assert nested is not None
            inner = nested()
            assert inner is not None and inner.depth == 2
            mine.release(inner)
        mine.release(lease)
        taken = in_thread(lambda: other.acquire(key, ttl=5, wait=0))
        assert taken is not None
        other.release(taken)
    finally:
        mine.close()
        other.close()


def test_a_split_try_whose_answer_never_comes_is_ambiguous_and_undoable(
    redis_server: RedisServer, key: str
) -> None:
    provider = RedisProvider(redis_server.url, socket_timeout=0.3)
    try:
        provider.ping()  # a connection in the pool: the send goes into its socket
        redis_server.pause()
        read = provider.start_acquire(key, ttl=30)
        assert read is not None
        with pytest.raises(BackendUnavailable) as raised:
            read()
        assert raised.value.ambiguous and raised.value.token
        redis_server.resume()
        # whether the script ran once the server woke up cannot be known (here Redis
        # saw the connection closed first): the token releases whatever it took
        provider.release_token(key, current_owner(), raised.value.token)
        assert provider.holder(key) is None
        lease = in_thread(lambda: provider.acquire(key, ttl=5, wait=0))
        assert lease is not None
    finally:
        provider.close()


class _Interrupted(BaseException):
    """What a signal handler, a gevent `Timeout` or a Celery soft time limit raises."""


@pytest.mark.parametrize("kind", PROVIDERS, ids=["redis", "redis-hash"])
def test_an_interrupted_read_never_leaves_its_reply_to_the_next_call(
    kind: type[_RedisProviderBase], redis_server: RedisServer, key: str
) -> None:
    """A try's reply read late (a quorum reads its members one after another) is waited
    for on the socket first. An interrupt there gave the connection back to the pool
    with the reply still to come, and the next call on it read that reply as its own: a
    grant of one key taken for a try at another, which someone else holds (two owners).
    The interrupted connection is closed instead, with the try's release written behind
    it, so that what the try took is not held for nobody until its ttl."""
    provider, other = kind(redis_server.url, socket_timeout=1.0), kind(redis_server.url)

    def interrupt(signum: int, frame: object) -> None:
        raise _Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        held = in_thread(lambda: other.acquire(f"{key}:held", ttl=30))  # another owner
        assert held is not None
        provider.ping()  # one connection in the pool: every call below takes it
        redis_server.pause()
        read = provider.start_acquire(key, ttl=30)
        assert read is not None
        time.sleep(0.2)  # late: the read waits on the socket before reading
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(_Interrupted):
            read()
        redis_server.resume()  # the try runs now, and the release written behind it
        taken = provider.acquire(f"{key}:held", ttl=30, wait=0)
        assert taken is None, f"granted {taken} while {held} holds the key"
        # what the interrupted try took is freed at once, not left to its 30 s ttl
        freed = _wait_for(lambda: provider.holder(key) is None, 2.0)
        assert freed, "the interrupted try's grant was left to its ttl"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if redis_server.paused:
            redis_server.resume()
        provider.close()
        other.close()


@pytest.mark.parametrize("split", [True, False], ids=["split", "whole"])
@pytest.mark.parametrize("kind", PROVIDERS, ids=["redis", "redis-hash"])
def test_a_try_made_for_a_waiter_that_left_leaves_nothing_held(
    kind: type[_RedisProviderBase], redis_server: RedisServer, key: str, split: bool
) -> None:
    """A release wakes the waiting process's subscriber, which sends its waiter's next
    try (or runs it whole, where a call cannot be split: a Cluster, `sync_replicas`, a
    server that has not answered yet). A waiter interrupted meanwhile (a signal's
    handler raising) has left when the reply comes, and what the try took was held for
    nobody until its 30 s ttl. The notifier discards such a reply (`_leave`,
    `_released`): here a real try, made as the subscriber makes it, discarded as it
    would be, frees the key."""
    provider = kind(redis_server.url)
    try:
        warm = provider.acquire(f"{key}:warm", ttl=5)  # the server answered: tries split
        assert warm is not None
        provider.release(warm)
        provider._answering = split
        keys = provider._keys(key)
        sent = provider._try_later(keys, current_owner(), uuid.uuid4().hex, 30_000, None)
        assert isinstance(sent, Later)
        _discard(sent)
        assert provider.holder(key) is None, "the try made for a gone waiter kept its grant"
        assert in_thread(lambda: provider.acquire(key, ttl=5, wait=0)) is not None
    finally:
        provider.close()


@pytest.mark.parametrize("kind", PROVIDERS, ids=["redis", "redis-hash"])
def test_an_interrupt_just_after_a_send_never_leaves_its_reply_to_the_next_call(
    kind: type[_RedisProviderBase], redis_server: RedisServer, key: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A signal's handler runs between two bytecodes: here the one right after redis-py
    has sent a try. The connection went back to the pool open, its reply still to come,
    and the next call on it read that reply as its own (two owners)."""
    provider, other = kind(redis_server.url), kind(redis_server.url)
    try:
        held = in_thread(lambda: other.acquire(f"{key}:held", ttl=30))  # another owner
        assert held is not None
        provider.ping()  # one connection in the pool: every call below takes it
        client = provider.topology.client()
        assert isinstance(client, redis.Redis)
        connection = client.connection_pool.get_connection()
        client.connection_pool.release(connection)
        send = connection.send_packed_command

        def sent_then_interrupted(*args: Any, **kwargs: Any) -> None:
            send(*args, **kwargs)  # type: ignore[no-untyped-call]
            raise _Interrupted

        monkeypatch.setattr(connection, "send_packed_command", sent_then_interrupted)
        with pytest.raises(_Interrupted):
            provider.start_acquire(key, ttl=30)
        monkeypatch.undo()
        taken = provider.acquire(f"{key}:held", ttl=30, wait=0)
        assert taken is None, f"granted {taken} while {held} holds the key"
        # and the interrupted try's grant was released
        freed = _wait_for(lambda: provider.holder(key) is None, 2.0)
        assert freed, "the interrupted try's grant was left to its ttl"
    finally:
        provider.close()
        other.close()


def test_connections_the_server_closed_while_idle_are_made_anew(
    provider: _RedisProviderBase, admin: redis.Redis, key: str
) -> None:
    """Redis closes idle clients (its `timeout`, a CLIENT KILL, a restart): the pool's
    checkout sees the closed socket and connects again, so the next acquire succeeds
    instead of reporting Redis down (a chain would fail over for nothing)."""
    lease = provider.acquire(key, ttl=30)
    assert lease is not None
    provider.release(lease)  # its connection idles in the pool
    assert admin.client_kill_filter(_type="normal", skipme=True) >= 1
    for _ in range(3):
        lease = provider.acquire(key, ttl=30)
        assert lease is not None
        provider.release(lease)


def test_the_pool_takes_redis_pys_own_path_while_its_metrics_are_on(
    redis_server: RedisServer, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkout without redis-py's connection metrics is only taken while they are
    off: a user who turned them on sees every checkout of ours counted."""
    provider = RedisProvider(redis_server.url)
    try:
        pool = cast(Any, provider.topology.client()).connection_pool
        counted: list[str] = []
        real = type(pool)._counted

        def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
            counted.append("checkout")
            return real(self, *args, **kwargs)

        monkeypatch.setattr(type(pool), "_counted", counting)
        lease = provider.acquire(key, ttl=30)  # the first connection is made: counted
        assert lease is not None
        provider.release(lease)
        made = len(counted)
        lease = provider.acquire(key, ttl=30)
        assert lease is not None
        provider.release(lease)
        assert len(counted) == made  # metrics off: our own checkout
        monkeypatch.setattr(redis_pool, "_metrics_recorded", lambda: True)
        lease = provider.acquire(key, ttl=30)
        assert lease is not None
        provider.release(lease)
        assert len(counted) > made
    finally:
        provider.close()


def test_a_waiter_whose_sleep_ended_is_never_claimed_once_it_tries_itself() -> None:
    """The subscriber claims only a sleeping waiter, and sends its next try under the
    waiter's token. A waiter whose sleep timed out checked for a claim, then went back
    to BUSY, in two sections of the notifier's lock: a claim in between had the waiter
    send its own try while the claimed one was out, two grants under one token on
    redis-hash, and the release by token of the one nobody used freed the other's live
    lease. Here the subscriber claims (its try still out) after every section of the
    lock the waiter leaves once its sleep is over."""
    claims: list[int] = []

    class ClaimingLock:
        def __init__(self) -> None:
            self.lock = threading.Lock()
            self.waiter: notify.Waiter[int] | None = None
            self.sections = 0

        def __enter__(self) -> None:
            self.lock.acquire()

        def __exit__(self, *exc: object) -> None:
            self.lock.release()
            self.sections += 1
            waiter = self.waiter
            if waiter is not None and self.sections >= 2:  # the first put it to sleep
                with self.lock:
                    if waiter._state == notify._SLEEPING:
                        waiter._state = notify._CLAIMED
                        claims.append(self.sections)

    lock = ClaimingLock()
    waiter: notify.Waiter[int] = notify.Waiter(lambda: Later(lambda: 7, print), cast(Any, lock))
    lock.waiter = waiter
    outcome = waiter.wait(0.01)
    assert outcome is notify.NO_RESULT  # it tries itself...
    assert not claims, f"...while a try was claimed for it after section {claims}"


def test_backends_that_cannot_split_a_try_say_so_after_checking_the_arguments() -> None:
    local = LocalProvider()
    assert local.start_acquire("k", ttl=1) is None
    with pytest.raises(ValueError, match="ttl"):
        local.start_acquire("k", ttl=-1)
    with pytest.raises(ValueError, match="key"):
        local.start_acquire("")


@pytest.mark.parametrize("kind", ["redis", "redis-hash"])
def test_a_release_wakes_a_few_waiting_processes_not_the_herd(
    kind: str, redis_server: RedisServer, admin: redis.Redis, key: str
) -> None:
    """Twelve processes take one key in turns for two seconds. A release wakes at most
    two waiting processes, so a grant costs the release, the winner's try, a loser's
    try, and the releaser's own next try: about four script calls, where waking every
    process cost one per process (13 here), and more with more processes."""
    processes, seconds = 12, 2.0
    start = time.time() + 8.0  # every process is up, warm and waiting by then
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        counts = pool.starmap_async(
            workers.cycle_until,
            [(kind, redis_server.url, key, start, start + seconds)] * processes,
        )
        time.sleep(max(0.0, start - time.time() - 0.01))
        before = admin.info("commandstats")
        grants = sum(counts.get(timeout=60))
    after = admin.info("commandstats")
    calls = sum(
        after.get(name, {}).get("calls", 0) - before.get(name, {}).get("calls", 0)
        for name in ("cmdstat_evalsha", "cmdstat_eval")
    )
    assert grants > 20, f"only {grants} grants in {seconds} s"
    assert calls / grants <= 4.5, f"{calls / grants:.2f} script calls per grant"


def test_threads_taking_one_key_in_turns_never_lose_a_grant(
    provider: _RedisProviderBase, key: str
) -> None:
    """Ten threads of one process take one key in turns. A waiter woken by a release of
    its own process must never also be claimed by the subscriber thread: that attempt
    could win a grant after the waiter had moved on, and the lock would stay held, by
    nobody, for its ttl (every thread then timed out within a second or two)."""
    until = time.monotonic() + 2.0
    timed_out: list[float] = []
    grants = [0]

    def take_turns() -> None:
        while time.monotonic() < until:
            started = time.monotonic()
            lease = provider.acquire(key, ttl=30, wait=10)
            if lease is None:
                timed_out.append(time.monotonic() - started)
                return
            grants[0] += 1
            provider.release(lease)

    threads = [threading.Thread(target=take_turns) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not timed_out, f"{len(timed_out)} waits timed out after {grants[0]} grants"
    assert grants[0] > 100


@pytest.mark.parametrize("provider_class", PROVIDERS, ids=["redis", "redis-hash"])
def test_leases_due_together_are_renewed_in_one_pipeline_and_a_lost_one_is_told(
    provider_class: type[_RedisProviderBase], redis_server: RedisServer,
    admin: redis.Redis, key: str,
) -> None:  # fmt: skip
    """300 auto-renewed leases of one provider fall due together: their extends go in
    pipelines (the server reads a large pipeline in chunks: far fewer reads than
    renewals, where one by one it reads each), every one stays held, and the one whose
    key vanished is told it was lost, alone."""
    provider = provider_class(redis_server.url, watchdog_ttl=0.9)  # renewed every 0.3 s
    try:
        lost: list[Lease] = []
        leases = [provider.acquire(f"{key}:{i}", on_lost=lost.append) for i in range(300)]
        assert all(lease is not None for lease in leases)
        admin.delete(provider._keys(f"{key}:7").lock)  # gone behind its holder's back
        before = admin.info("stats")["total_reads_processed"]
        calls_before = admin.info("commandstats")["cmdstat_evalsha"]["calls"]
        time.sleep(1.0)  # three rounds
        reads = admin.info("stats")["total_reads_processed"] - before
        renewals = admin.info("commandstats")["cmdstat_evalsha"]["calls"] - calls_before
        assert renewals >= 2 * 299, f"only {renewals} renewals"
        # one by one, the server reads each renewal alone (reads >= renewals); here 140
        # to 310 reads for ~1,200, more the slower the process writes its chunks (after
        # the rest of this file, twice as many as alone)
        assert reads < renewals / 2, f"{reads} reads for {renewals} renewals"
        assert [lease.key for lease in lost] == [f"{key}:7"]
        for lease in leases:
            assert lease is not None
            if lease.key != f"{key}:7":
                assert provider.is_held(lease)
                provider.release(lease)
    finally:
        provider.close()


def test_a_thread_past_max_connections_waits_for_one_then_gives_up_at_pool_timeout(
    redis_server: RedisServer, key: str
) -> None:
    """The pool (`locks.backends.redis.pool`): a thread that finds every connection in
    use waits for one, gets the first given back, and after `pool_timeout` without one
    the call is an outage, never a hang."""
    provider = RedisProvider(redis_server.url, max_connections=2, pool_timeout=0.3)
    pool = provider.client.connection_pool  # type: ignore[union-attr]
    held = [pool.get_connection(), pool.get_connection()]
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match="No connection available"):
        provider.acquire(key, ttl=5, wait=0)
    assert 0.25 <= time.monotonic() - started < 1.0
    got: list[float] = []

    def take_one() -> None:
        lease = provider.acquire(key, ttl=5, wait=0)
        got.append(time.monotonic())
        assert lease is not None
        provider.release(lease)

    waiter = threading.Thread(target=take_one)
    waiter.start()
    time.sleep(0.1)
    given_back = time.monotonic()
    pool.release(held.pop())
    waiter.join(5)
    assert got and got[0] - given_back < 0.1, "the waiting thread missed the connection"
    pool.release(held.pop())
    provider.close()
