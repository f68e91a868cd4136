"""Wake-ups for threads waiting on Redis locks: one pub/sub channel per provider.

Each provider listens on a channel of its own, on a single `PubSub` read by one thread
(a connection per waiting thread would exhaust redis-py's pool, 100 by default). A try
that will wait puts the channel into the lock's `waiters` set; a release wakes the two
processes with the lowest scores there (`locks.backends.redis.scripts`) by publishing
the lock's key on their channels, so a release reaches a bounded few processes, never
every one that waits. The subscriber thread then sends the next attempt of the
longest-sleeping waiter on that key itself and wakes it to read the reply (the thread
switch overlaps the round trip); a waiter that leaves with a wake-up it did not use
passes it on to its process's next waiter. A release by a process with waiters
of its own on the lock serves them first: the releasing thread sends the next one's
attempt itself the moment its reply is in (`hand_over`; nothing is published to its
own channel), a message and a thread's wake-up sooner than the subscriber could; an
operator's break here wakes them directly (`wake_local`).

A wake-up that finds no waiter (it came between a try that marked the set and its
waiter being counted here, or its waiters have left) is kept for a moment: a waiter
counted meanwhile takes it and tries at once; else it is passed on to the next process
(`pass_on`), so a process that gave up cannot swallow the wake-up of those still waiting.

A broken subscriber connection is replaced by a new `PubSub` that subscribes again, and
every waiter tries again (marking the set anew): on a Sentinel primary the new one
reaches the promoted server; on a Cluster (whose classic pub/sub is broadcast to every
node, so one connection to any node hears every release) it reaches a node that still
answers.

Messages can still be lost (a reconnect, a failover, a crash between release and
publish, two woken processes that both died): callers bound every wait by the lock's
PTTL, so a lost message costs time, never correctness.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
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

_BUSY, _SLEEPING, _WOKEN, _CLAIMED = range(4)
_READ_EVERY = 1.0  # s: how often the subscriber thread looks up when nothing arrives
_CLAIM_FOR = 0.05  # s a wake-up finding no waiter waits for one before it is passed on
_KEEP_FOR = 1.0  # s a passed-on wake-up still lets a newly counted waiter try at once


class _Failure:
    """An attempt made for a waiter raised `error`; the waiter re-raises it."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


class Later(Generic[T]):
    """An attempt sent, its reply still to read: what an attempt made for a waiter may
    return, so that the waiter's thread is woken while the request travels and reads
    the reply itself (the thread switch overlaps the round trip instead of following
    it). `read` must be called exactly once: it also gives the connection back.
    `abandon` undoes what `read` returned when nobody will use it."""

    __slots__ = ("abandon", "read")

    def __init__(self, read: Callable[[], T], abandon: Callable[[T], None]) -> None:
        self.read = read
        self.abandon = abandon


def _discard(result: object) -> None:
    """A reply nobody will use (its waiter was interrupted, or left) read all the same,
    so its connection goes back to the pool, and what it took undone."""
    if isinstance(result, Later):
        try:
            result.abandon(result.read())
        except Exception as exc:  # the server frees a grant at its ttl
            logger.debug("undoing an attempt for a waiter that left failed: %s", exc)


class Waiter(Generic[T]):
    """A thread waiting for one lock.

    While it sleeps, the subscriber thread may claim it and send its next `attempt`
    itself the moment a release arrives: the attempt then reaches Redis before the
    sleeping thread could even be scheduled, which is most of a hand-off's latency; the
    waiter is woken at once and reads the reply (`Later`; where the attempt cannot be
    split, it was run whole and the `Later` holds its outcome). Its state changes under
    the notifier's lock: BUSY (its own thread is running), SLEEPING, WOKEN (its own
    thread is told to try, so nobody may claim it: an attempt claimed now could win a
    grant after the thread had moved on, and the grant would be lost), CLAIMED (an
    attempt is under way on its behalf; the result follows)."""

    __slots__ = ("_attempt", "_lock", "_pending", "_result", "_state", "_woken")

    def __init__(self, attempt: Callable[[], Later[T]], lock: threading.Lock) -> None:
        self._attempt = attempt
        self._lock = lock
        self._woken = threading.Event()
        self._state = _BUSY
        self._pending = False  # woken while busy: try again at once instead of sleeping
        self._result: Later[T] | _NoResult | _Failure = NO_RESULT

    def wait(self, timeout: float | None) -> T | _NoResult:
        """Sleep until woken or `timeout`. Returns the outcome of an attempt made on
        this waiter's behalf (raising what it raised; a reply left to read is read
        here), or NO_RESULT when it should try again itself."""
        with self._lock:
            if self._pending:
                self._pending = False
                return NO_RESULT
            self._state = _SLEEPING
        self._woken.wait(timeout)
        # the check for a claim and the return to BUSY are one section: a claim in
        # between would send a try under this waiter's token while it sends its own
        with self._lock:
            claimed = self._state == _CLAIMED
            if not claimed:
                result = self._took()
        if claimed:  # the attempt under way ends within a socket timeout
            self._woken.wait()
            with self._lock:
                result = self._took()
        if isinstance(result, _Failure):
            raise result.error
        if isinstance(result, Later):
            return result.read()
        return result  # nothing made for it: it tries again itself

    def _took(self) -> Later[T] | _NoResult | _Failure:
        """Back to BUSY with the outcome left for it (under the notifier's lock)."""
        self._state = _BUSY
        self._woken.clear()
        result, self._result = self._result, NO_RESULT
        return result

    def _fail(self, error: Exception) -> None:
        """Wake with `error` to raise (under the notifier's lock), unless an attempt for
        it is under way (its outcome comes first)."""
        if self._state != _CLAIMED:
            self._result = _Failure(error)
            self._pending = False
            if self._state == _SLEEPING:
                self._state = _WOKEN
            self._woken.set()

    def _wake(self) -> None:
        """Wake without an attempt (under the notifier's lock)."""
        if self._state == _SLEEPING:
            self._state = _WOKEN
            self._woken.set()
        elif self._state != _WOKEN:
            self._pending = True


def _next_message(pubsub: PubSub, timeout: float) -> list[Any] | None:
    """The next reply on the subscriber's connection ([kind, channel, data]), or None
    after `timeout`. Read straight off the connection: `PubSub.get_message` spends
    ~80 µs of Python per message (retries, metrics, handlers) on every hand-off's
    critical path, and would reconnect by itself, unseen by the waiters that must then
    mark the set again. Connection errors reach the caller."""
    connection = pubsub.connection
    # closed (by `close`, from another thread): `can_read` would connect it again
    if connection is None or getattr(connection, "_sock", None) is None:
        raise ConnectionError("the subscriber's connection is closed")
    if not connection.can_read(timeout):
        return None
    reply: list[Any] = connection.read_response(disconnect_on_error=False, push_request=True)
    return reply


class ReleaseNotifier:
    def __init__(
        self,
        client: Callable[[], Client],
        translate: Callable[[Exception], LockError],
        confirm_timeout: float,
        prefix: str,
        pass_on: Callable[[str], None],
    ) -> None:
        """`prefix`: the channel's (an ACL grants the provider its prefix's channels);
        `pass_on(lock_key)`: wake the next process waiting on `lock_key` instead."""
        self._client = client  # built on first use
        self._translate = translate  # a driver's error as ours
        self._confirm_timeout = confirm_timeout
        self._prefix = prefix
        self._pass_on = pass_on
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self.channel = f"{self._prefix}:wake:{uuid.uuid4().hex}"  # a forked child's own
        self._lock = threading.Lock()
        self._waiters: dict[str, deque[Waiter[Any]]] = {}
        # wake-ups that found no waiter: lock key -> (when, passed on yet)
        self._unclaimed: dict[str, tuple[float, bool]] = {}
        self._subscribed = threading.Event()  # the server confirmed the subscription
        self._pubsub: PubSub | None = None
        self._closed = False

    @property
    def listening(self) -> bool:
        """Whether a try that marks the set now will hear of the release: subscribed,
        confirmed, in this very process. Without I/O."""
        return self._subscribed.is_set() and self._pid == os.getpid()

    @contextmanager
    def waiting(
        self, lock: str, deadline: float | None, attempt: Callable[[], Later[T]]
    ) -> Iterator[Waiter[T]]:
        """Count a waiter on the lock key `lock` whose next try is `attempt` (which may
        send now and leave the reply for later). On entry the subscription is confirmed
        (or the confirmation took too long), so a try from then on that marks the set
        hears of the release."""
        waiter = Waiter(attempt, self._lock)
        try:
            with self._lock:
                if self._pid != os.getpid():  # forked: the parent's subscriber is not ours
                    self._reset()
                if self._pubsub is None:
                    self._start()
                if self._unclaimed.pop(lock, None) is not None:
                    waiter._pending = True  # a wake-up came before this waiter counted
                queue = self._waiters.get(lock)
                if queue is None:
                    queue = self._waiters[lock] = deque()
                queue.append(waiter)
            bound = self._confirm_timeout
            if deadline is not None:
                bound = max(0.0, min(bound, deadline - time.monotonic()))
            self._subscribed.wait(bound)
            yield waiter
        finally:
            self._leave(lock, waiter)

    def _start(self) -> None:
        """Under self._lock: a new subscriber to our channel, read by a thread of its
        own. On failure nothing is recorded: the next waiter starts one afresh."""
        self._subscribed.clear()
        try:
            pubsub: PubSub = self._client().pubsub()  # type: ignore[no-untyped-call]
            try:
                pubsub.subscribe(self.channel)
            except BaseException:
                pubsub.close()
                raise
        except (RedisError, RedisClusterException) as exc:
            raise self._translate(exc) from exc
        self._pubsub = pubsub
        threading.Thread(
            target=self._run, args=(pubsub,), name="locks-redis-notify", daemon=True
        ).start()

    def _leave(self, lock: str, waiter: Waiter[Any]) -> None:
        with self._lock:
            unread, waiter._result = waiter._result, NO_RESULT
            queue = self._waiters.get(lock)
            if queue is not None and waiter in queue:
                queue.remove(waiter)
                if waiter._pending and queue:  # a wake-up it did not use goes to the next
                    queue[0]._wake()
                if not queue:
                    del self._waiters[lock]
        _discard(unread)  # its thread was interrupted before it read a reply

    def waits_on(self, lock: str) -> bool:
        """Whether a waiter of this process waits on `lock` (a hint, without the lock;
        never in a forked child, whose copy counts its parent's threads)."""
        return bool(self._waiters) and lock in self._waiters and self._pid == os.getpid()

    def wake_local(self, lock: str) -> None:
        """`lock` was freed here without a release (an operator's break): its
        longest-sleeping waiter here tries at once, on its own thread."""
        if not self._waiters:  # nobody waits on anything: no lock taken on this path
            return
        with self._lock:
            queue = self._waiters.get(lock)
            if queue:
                target = next((w for w in queue if w._state == _SLEEPING), queue[0])
                target._wake()

    def _run(self, pubsub: PubSub) -> None:
        while True:
            with self._lock:
                if self._closed or pubsub is not self._pubsub:
                    return
            try:
                message = _next_message(pubsub, _CLAIM_FOR if self._unclaimed else _READ_EVERY)
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
            try:
                if message is not None:
                    self._dispatch(message)
                if self._unclaimed:
                    self._pass_unclaimed()
            except Exception:  # a bug here must not end every wake-up of the process
                logger.exception("the release subscriber failed on %r", message)

    def _dispatch(self, message: Any) -> None:
        if not isinstance(message, list) or len(message) < 3:
            return  # not a subscription's message (a PING's reply, say)
        kind = message[0]
        if kind in (b"message", "message"):
            data = message[2]
            self._released(data.decode() if isinstance(data, bytes) else str(data))
        elif kind in (b"subscribe", "subscribe"):
            self._subscribed.set()

    def hand_over(self, lock: str) -> None:
        """`lock` was just released on this thread, by a release that was told to
        publish nothing to this process (its waiters on `lock` are woken from here):
        what the subscriber does on a release's message, without waiting for one. A
        wake-up nobody here takes goes on to the next process at once."""
        if self._released(lock, here=True):
            try:
                self._pass_on(lock)
            except Exception as exc:  # they find out by themselves, at their pttl
                logger.debug("passing a wake-up on for %s failed: %s", lock, exc)

    def _released(self, lock: str, *, here: bool = False) -> bool:
        """Send (or run) the next attempt of the longest-sleeping waiter on `lock`. True
        if no waiter here could use it (kept a moment for one counted meanwhile, and
        passed on: by the caller when `here`, else by the subscriber later)."""
        with self._lock:
            queue = self._waiters.get(lock)
            if not queue:
                self._unclaimed[lock] = (time.monotonic(), here)
                return True
            target = next((w for w in queue if w._state == _SLEEPING), None)
            if target is None:  # all are trying already; the first tries once more
                queue[0]._pending = True
                return False
            target._state = _CLAIMED
        result: Any = NO_RESULT
        try:
            result = target._attempt()
        except Exception as exc:  # the waiter raises it: it may say the lock was taken
            result = _Failure(exc)
        finally:  # interrupted (the releasing thread's signal): the waiter tries itself
            with self._lock:
                queue = self._waiters.get(lock)
                kept = queue is not None and target in queue
                if kept:
                    target._result = result
                    target._woken.set()
            if not kept:  # it left meanwhile (interrupted): nobody reads this reply
                _discard(result)
        return False

    def _pass_unclaimed(self) -> None:
        """Pass on the wake-ups nobody took within `_CLAIM_FOR`; forget them, passed on,
        after `_KEEP_FOR` (a waiter counted until then still tries at once)."""
        now = time.monotonic()
        due = []
        with self._lock:
            for lock, (since, passed) in list(self._unclaimed.items()):
                if now - since >= _KEEP_FOR:
                    del self._unclaimed[lock]
                elif not passed and now - since >= _CLAIM_FOR:
                    self._unclaimed[lock] = (since, True)
                    due.append(lock)
        for lock in due:
            try:
                self._pass_on(lock)
            except Exception as exc:  # the server is gone, or the provider closing: the
                # waiters find out by themselves; this thread must live on
                logger.debug("passing a wake-up on for %s failed: %s", lock, exc)

    def _resubscribe(self) -> None:
        """A new subscriber, tried every 0.1 s until a server answers (unless a waiter
        started one first, or nobody waits any more)."""
        while True:
            time.sleep(0.1)
            with self._lock:
                if self._closed or self._pubsub is not None or not self._waiters:
                    return
                try:
                    self._start()
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
            for queue in self._waiters.values():
                for waiter in queue:
                    waiter._fail(error)
        return True

    def _connection_broke(self, exc: BaseException) -> None:
        """Wake every waiter: each retries now (marking the set again) and either wins
        or reports the outage."""
        logger.debug("redis release notifications interrupted: %s", exc)
        with self._lock:
            self._subscribed.clear()
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
