"""Wake-ups for threads waiting on Redis locks: one pub/sub connection per provider.

A connection per waiting thread would exhaust redis-py's pool (100 by default), so
one subscriber thread owns a single `PubSub` and fans release messages out to the
waiters of each channel, waking the longest-waiting one per message. A waiter that
leaves with a wake-up it did not use passes it on. A channel nobody waits on stays
subscribed for a while (`linger`) before the subscriber thread drops it, so a busy
key is not resubscribed on every wait and no caller pays for an UNSUBSCRIBE.

A broken subscriber connection is replaced by a new `PubSub` that subscribes every
channel again: on a Sentinel primary the new one reaches the promoted server; on a
Cluster (whose classic pub/sub is broadcast to every node, so one connection to any
node hears every release) it reaches a node that still answers.

Messages can still be lost (a reconnect, a failover, a crash between release and
publish): callers bound every wait by the lock's PTTL, so a lost message costs time,
never correctness.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from typing import Any, Generic, TypeVar

from redis.client import PubSub
from redis.exceptions import RedisClusterException, RedisError

from locks.backends.redis.topology import Client
from locks.errors import AccessDenied, LockError

logger = logging.getLogger("locks")

T = TypeVar("T")


class _NoResult(Enum):
    NO_RESULT = "retry yourself"


NO_RESULT = _NoResult.NO_RESULT

_BUSY, _SLEEPING, _CLAIMED = range(3)


class _Failure:
    """An attempt made for a waiter raised `error`; the waiter re-raises it."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


class Waiter(Generic[T]):
    """A thread waiting for one lock.

    While it sleeps, the subscriber thread may claim it and run its next `attempt`
    itself the moment a release arrives: the attempt then reaches Redis before the
    sleeping thread could even be scheduled, which is most of a hand-off's latency.
    Its state changes under the notifier's lock: BUSY (its own thread is running),
    SLEEPING, CLAIMED (an attempt is under way on its behalf; the result follows).
    """

    __slots__ = ("_attempt", "_lock", "_pending", "_result", "_state", "_woken")

    def __init__(self, attempt: Callable[[], T], lock: threading.Lock) -> None:
        self._attempt = attempt
        self._lock = lock
        self._woken = threading.Event()
        self._state = _BUSY
        self._pending = False  # woken while busy: try again at once instead of sleeping
        self._result: T | _NoResult | _Failure = NO_RESULT

    def wait(self, timeout: float | None) -> T | _NoResult:
        """Sleep until woken or `timeout`. Returns the outcome of an attempt made on
        this waiter's behalf (raising what it raised), or NO_RESULT when it should try
        again itself."""
        with self._lock:
            if self._pending:
                self._pending = False
                return NO_RESULT
            self._state = _SLEEPING
        self._woken.wait(timeout)
        with self._lock:
            claimed = self._state == _CLAIMED
        if claimed:  # the attempt under way ends within a socket timeout
            self._woken.wait()
        with self._lock:
            self._state = _BUSY
            self._woken.clear()
            result, self._result = self._result, NO_RESULT
        if isinstance(result, _Failure):
            raise result.error
        return result

    def _fail(self, error: Exception) -> None:
        """Wake with `error` to raise (under the notifier's lock), unless an attempt for
        it is under way (its outcome comes first)."""
        if self._state != _CLAIMED:
            self._result = _Failure(error)
            self._pending = False
            self._woken.set()

    def _wake(self) -> None:
        """Wake without an attempt (under the notifier's lock)."""
        if self._state == _SLEEPING:
            self._woken.set()
        else:
            self._pending = True


class ReleaseNotifier:
    def __init__(
        self,
        client: Callable[[], Client],
        translate: Callable[[Exception], LockError],
        confirm_timeout: float,
        linger: float = 1.0,
    ) -> None:
        self._client = client  # built on first use
        self._translate = translate  # a driver's error as ours
        self._confirm_timeout = confirm_timeout
        self._linger = linger
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._waiters: dict[str, deque[Waiter[Any]]] = {}
        self._subscribed: dict[str, threading.Event] = {}
        self._idle_since: dict[str, float] = {}  # subscribed channels nobody waits on
        self._pubsub: PubSub | None = None
        self._closed = False

    @contextmanager
    def waiting(
        self, channel: str, deadline: float | None, attempt: Callable[[], T]
    ) -> Iterator[Waiter[T]]:
        """Register a waiter on `channel` whose next try is `attempt`. On entry the
        subscription is confirmed (or the confirmation took too long), so a release
        published from then on reaches a waiter."""
        waiter = Waiter(attempt, self._lock)
        try:
            with self._lock:
                if self._pid != os.getpid():  # forked: the parent's subscriber is not ours
                    self._reset()
                if channel not in self._subscribed:  # else subscribed, maybe idle, or resubscribing
                    self._subscribe(channel)
                self._idle_since.pop(channel, None)
                queue = self._waiters.get(channel)
                if queue is None:
                    queue = self._waiters[channel] = deque()
                subscribed = self._subscribed[channel]
                queue.append(waiter)
            bound = self._confirm_timeout
            if deadline is not None:
                bound = max(0.0, min(bound, deadline - time.monotonic()))
            subscribed.wait(bound)
            yield waiter
        finally:
            self._leave(channel, waiter)

    def _subscribe(self, channel: str) -> None:
        """Under self._lock, so subscribes and unsubscribes reach Redis in the order
        decided. On failure nothing is recorded: the next waiter subscribes afresh."""
        try:
            if self._pubsub is None:
                self._start([*self._subscribed, channel])
            else:
                self._pubsub.subscribe(channel)
        except (RedisError, RedisClusterException) as exc:
            raise self._translate(exc) from exc
        self._subscribed[channel] = threading.Event()

    def _start(self, channels: list[str]) -> None:
        """Under self._lock: a new subscriber to `channels`, read by a thread of its own."""
        pubsub: PubSub = self._client().pubsub()  # type: ignore[no-untyped-call]
        try:
            pubsub.subscribe(*channels)
        except BaseException:
            pubsub.close()
            raise
        self._pubsub = pubsub
        threading.Thread(
            target=self._run, args=(pubsub,), name="locks-redis-notify", daemon=True
        ).start()

    def _leave(self, channel: str, waiter: Waiter[Any]) -> None:
        with self._lock:
            queue = self._waiters.get(channel)
            if queue is None or waiter not in queue:
                return
            queue.remove(waiter)
            if waiter._pending and queue:  # a wake-up it did not use goes to the next
                queue[0]._wake()
            if not queue:
                del self._waiters[channel]
                self._idle_since[channel] = time.monotonic()

    def _drop_idle_channels(self) -> None:
        """Unsubscribe channels nobody has waited on for `linger` seconds."""
        with self._lock:
            if not self._idle_since or self._pubsub is None:
                return
            cutoff = time.monotonic() - self._linger
            idle = [channel for channel, since in self._idle_since.items() if since <= cutoff]
            if not idle:
                return
            for channel in idle:
                del self._idle_since[channel]
                del self._subscribed[channel]
            try:
                self._pubsub.unsubscribe(*idle)  # type: ignore[no-untyped-call]
            except RedisError as exc:  # the reconnect will not resubscribe them either
                logger.debug("unsubscribe from %d channels failed: %s", len(idle), exc)

    def _run(self, pubsub: PubSub) -> None:
        while True:
            with self._lock:
                if self._closed or pubsub is not self._pubsub:
                    return
            try:
                message = pubsub.get_message(timeout=self._linger)
            except Exception as exc:  # redis-py raises odd things when closed under a read
                with self._lock:
                    if self._closed or pubsub is not self._pubsub:
                        return
                    self._pubsub = None
                if self._refused(exc):
                    with contextlib.suppress(Exception):
                        pubsub.close()
                    return
                self._connection_broke(exc)
                with contextlib.suppress(Exception):
                    pubsub.close()
                self._resubscribe()
                return
            if message is not None:
                self._dispatch(message)
            self._drop_idle_channels()

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        channel = message["channel"]
        if isinstance(channel, bytes):
            channel = channel.decode()
        if kind == "message":
            self._released(channel)
            return
        with self._lock:
            if kind == "subscribe":
                if channel in self._subscribed:
                    self._subscribed[channel].set()
            elif kind == "unsubscribe" and channel in self._subscribed:
                # a confirmation read before this belonged to the previous subscription
                self._subscribed[channel].clear()

    def _released(self, channel: str) -> None:
        """Run the next attempt of the longest-sleeping waiter on `channel`."""
        with self._lock:
            queue = self._waiters.get(channel)
            if not queue:
                return
            target = next((w for w in queue if w._state == _SLEEPING), None)
            if target is None:  # all are trying already; the first tries once more
                queue[0]._pending = True
                return
            target._state = _CLAIMED
        result: Any
        try:
            result = target._attempt()
        except Exception as exc:  # the waiter raises it: it may say the lock was taken
            result = _Failure(exc)
        with self._lock:
            target._result = result
            target._woken.set()

    def _resubscribe(self) -> None:
        """A new subscriber for every channel, tried every 0.1 s until a server answers
        (unless a waiter started one first, or nobody waits any more)."""
        while True:
            time.sleep(0.1)
            with self._lock:
                if self._closed or self._pubsub is not None or not self._subscribed:
                    return
                try:
                    self._start(list(self._subscribed))
                except Exception as exc:  # still no server
                    logger.debug("redis release notifications: resubscribe failed: %s", exc)
                    continue
                return

    def _refused(self, exc: Exception) -> bool:
        """A subscription the server refused (the ACL grants no such channel): every
        waiter raises it, and nothing is resubscribed until the next waiter asks — a
        misconfiguration never turns quietly into polling."""
        error = self._translate(exc)
        if not isinstance(error, AccessDenied):
            return False
        error.__cause__ = exc
        with self._lock:
            self._subscribed.clear()
            self._idle_since.clear()
            for queue in self._waiters.values():
                for waiter in queue:
                    waiter._fail(error)
        return True

    def _connection_broke(self, exc: BaseException) -> None:
        """Wake every waiter: each retries now and either wins or reports the outage."""
        logger.debug("redis release notifications interrupted: %s", exc)
        with self._lock:
            for event in self._subscribed.values():
                event.clear()
            for queue in self._waiters.values():
                for waiter in queue:
                    waiter._wake()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pubsub, self._pubsub = self._pubsub, None
            for queue in self._waiters.values():
                for waiter in queue:
                    waiter._wake()
        if pubsub is not None and self._pid == os.getpid():
            pubsub.close()
