"""Wake-ups for threads waiting on Redis locks: one pub/sub connection per provider.

A connection per waiting thread would exhaust redis-py's pool (100 by default), so
one subscriber thread owns a single `PubSub` and fans release messages out to the
waiters of each channel, waking the longest-waiting one per message. A waiter that
leaves with a wake-up it did not use passes it on. A channel nobody waits on stays
subscribed for a while (`linger`) before the subscriber thread drops it, so a busy
key is not resubscribed on every wait and no caller pays for an UNSUBSCRIBE.

Messages can still be lost (a reconnect, a crash between release and publish):
callers bound every wait by the lock's PTTL, so a lost message costs time, never
correctness.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from redis import Redis
from redis.client import PubSub
from redis.exceptions import RedisError

from locks.errors import BackendUnavailable

logger = logging.getLogger("locks")


class Waiter:
    __slots__ = ("_woken",)

    def __init__(self) -> None:
        self._woken = threading.Event()

    def wait(self, timeout: float | None) -> bool:
        """Sleep until woken or `timeout`; True if woken. Consumes the wake-up."""
        woken = self._woken.wait(timeout)
        self._woken.clear()
        return woken


class ReleaseNotifier:
    def __init__(
        self,
        client: Redis,
        unavailable: Callable[[Exception], BackendUnavailable],
        confirm_timeout: float,
        linger: float = 1.0,
    ) -> None:
        self._client = client
        self._unavailable = unavailable
        self._confirm_timeout = confirm_timeout
        self._linger = linger
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._waiters: dict[str, deque[Waiter]] = {}
        self._subscribed: dict[str, threading.Event] = {}
        self._idle_since: dict[str, float] = {}  # subscribed channels nobody waits on
        self._pubsub: PubSub | None = None
        self._closed = False

    @contextmanager
    def waiting(self, channel: str, deadline: float | None) -> Iterator[Waiter]:
        """Register a waiter on `channel`; on entry the subscription is confirmed (or the
        confirmation took too long), so a release published from then on wakes someone."""
        waiter = Waiter()
        try:
            with self._lock:
                if self._pid != os.getpid():  # forked: the parent's subscriber is not ours
                    self._reset()
                queue = self._waiters.get(channel)
                if queue is None:
                    queue = self._waiters[channel] = deque()
                    if self._idle_since.pop(channel, None) is None:
                        self._subscribed[channel] = threading.Event()
                        self._subscribe(channel)
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
        # under self._lock: subscribe and unsubscribe must reach Redis in the order decided
        try:
            if self._pubsub is None:
                self._pubsub = self._client.pubsub()  # type: ignore[no-untyped-call]
                self._pubsub.subscribe(channel)
                pubsub = self._pubsub
                threading.Thread(
                    target=self._run, args=(pubsub,), name="locks-redis-notify", daemon=True
                ).start()
            else:
                self._pubsub.subscribe(channel)
        except RedisError as exc:
            raise self._unavailable(exc) from exc

    def _leave(self, channel: str, waiter: Waiter) -> None:
        with self._lock:
            queue = self._waiters.get(channel)
            if queue is None or waiter not in queue:
                return
            queue.remove(waiter)
            if waiter._woken.is_set():
                self._wake_one(queue)
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

    @staticmethod
    def _wake_one(queue: deque[Waiter]) -> None:
        for waiter in queue:
            if not waiter._woken.is_set():
                waiter._woken.set()
                return

    def _run(self, pubsub: PubSub) -> None:
        while True:
            with self._lock:
                if self._closed or pubsub is not self._pubsub:
                    return
            try:
                message = pubsub.get_message(timeout=self._linger)
            except (RedisError, OSError, ValueError) as exc:
                self._connection_broke(exc)
                time.sleep(0.1)
                continue
            if message is not None:
                self._dispatch(message)
            self._drop_idle_channels()

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        channel = message["channel"]
        if isinstance(channel, bytes):
            channel = channel.decode()
        with self._lock:
            if kind == "message":
                queue = self._waiters.get(channel)
                if queue:
                    self._wake_one(queue)
            elif kind == "subscribe":
                if channel in self._subscribed:
                    self._subscribed[channel].set()
            elif kind == "unsubscribe" and channel in self._subscribed:
                # a confirmation read before this belonged to the previous subscription
                self._subscribed[channel].clear()

    def _connection_broke(self, exc: BaseException) -> None:
        """Wake every waiter: each retries now and either wins or reports the outage."""
        logger.debug("redis release notifications interrupted: %s", exc)
        with self._lock:
            for event in self._subscribed.values():
                event.clear()
            for queue in self._waiters.values():
                for waiter in queue:
                    waiter._woken.set()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pubsub, self._pubsub = self._pubsub, None
            for queue in self._waiters.values():
                for waiter in queue:
                    waiter._woken.set()
        if pubsub is not None and self._pid == os.getpid():
            pubsub.close()
