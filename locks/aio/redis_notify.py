"""Wake-ups for tasks waiting on Redis locks: the threaded face's protocol
(`locks.backends.redis.notify`: one channel per provider, put into a lock's `waiters`
set by a try that will wait, published on by a release) with a task reading the
subscription and each waiter an `asyncio` future.

A release wakes the longest-waiting task on the lock, which then tries; a wake-up that
finds no waiter is kept for a moment (a waiter counted meanwhile tries at once) and
then passed on to the next process, so a process that gave up never swallows the
wake-up of those still waiting. A broken subscription wakes every waiter (each tries
again, marking the set anew) and is made again. Messages can still be lost: every wait
is bounded by the holder's PTTL, so a lost one costs time, never correctness."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from locks.aio.wakeups import new_wakeup, wake, woken_within
from locks.backends.redis.notify import _CLAIM_FOR, _KEEP_FOR, _READ_EVERY  # one protocol
from locks.errors import AccessDenied, LockError
from locks.forking import start_afresh_when_forked

logger = logging.getLogger("locks")


class AsyncNotifier:
    def __init__(
        self,
        pubsub: Callable[[], Any],
        prefix: str,
        pass_on: Callable[[str], Awaitable[None]],
        translate: Callable[[Exception], LockError],
    ) -> None:
        self._pubsub = pubsub  # makes a new redis.asyncio PubSub
        self._prefix = prefix
        self._pass_on = pass_on
        self._translate = translate
        self._reset()
        start_afresh_when_forked(self)

    def after_fork_in_child(self) -> None:
        self._reset()  # the parent's subscription and task are the parent's

    def _reset(self) -> None:
        self.channel = f"{self._prefix}:wake:{uuid.uuid4().hex}"  # a forked child's own
        self._waiters: dict[str, deque[asyncio.Future[bool]]] = {}
        self._kept: dict[str, float] = {}  # lock -> when a wake-up for nobody came
        self._task: asyncio.Task[None] | None = None
        self._subscribed: asyncio.Event | None = None
        self._refusal: AccessDenied | None = None
        self._background: set[asyncio.Task[None]] = set()

    @property
    def listening(self) -> bool:
        """Subscribed now: a try's mark is heard."""
        return self._subscribed is not None and self._subscribed.is_set()

    def waits_on(self, lock: str) -> bool:
        return bool(self._waiters.get(lock))

    async def listen(self, timeout: float) -> None:
        """Be subscribed within `timeout` if the server answers (else the waiters poll,
        bounded by the PTTL); `AccessDenied` if it refuses our channel."""
        if self._refusal is not None:
            refusal, self._refusal = self._refusal, None
            raise refusal
        if self._task is None or self._task.done():
            self._subscribed = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._listen())
        assert self._subscribed is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._subscribed.wait(), timeout)
        if self._refusal is not None:
            refusal, self._refusal = self._refusal, None
            raise refusal

    async def wait(self, lock: str, timeout: float | None) -> None:
        """Until a release of `lock` wakes this waiter, or `timeout`."""
        kept = self._kept.pop(lock, None)
        if kept is not None and time.monotonic() - kept < _KEEP_FOR:
            return  # a release came just before this waiter was counted
        woken = new_wakeup()
        queue = self._waiters.setdefault(lock, deque())
        queue.append(woken)
        try:
            await woken_within(woken, timeout)
        except asyncio.CancelledError:
            if woken.done() and not woken.cancelled() and woken.result():
                self._woke_nobody(lock)  # it leaves with a wake-up it did not use
            raise
        finally:
            with contextlib.suppress(ValueError):
                queue.remove(woken)
            if not queue and self._waiters.get(lock) is queue:
                del self._waiters[lock]

    def wake_local(self, lock: str) -> None:
        """Wake this provider's waiters on `lock` (an operator's break here)."""
        for woken in self._waiters.get(lock, ()):
            wake(woken)

    def _released(self, lock: str) -> None:
        for woken in self._waiters.get(lock, ()):
            if wake(woken):
                return
        self._woke_nobody(lock)

    def _woke_nobody(self, lock: str) -> None:
        stamp = self._kept[lock] = time.monotonic()
        asyncio.get_running_loop().call_later(_CLAIM_FOR, self._pass_if_unclaimed, lock, stamp)

    def _pass_if_unclaimed(self, lock: str, stamp: float) -> None:
        if self._kept.get(lock) != stamp:
            return  # taken by a waiter
        task = asyncio.get_running_loop().create_task(self._pass(lock))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _pass(self, lock: str) -> None:
        try:
            await self._pass_on(lock)
        except Exception as exc:  # the server is gone: the waiters find out by themselves
            logger.debug("passing a wake-up on for %s failed: %s", lock, exc)

    async def _listen(self) -> None:
        subscribed = self._subscribed
        assert subscribed is not None
        while True:
            pubsub = self._pubsub()
            try:
                await pubsub.subscribe(self.channel)
                subscribed.set()
                while True:
                    message = await pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=_READ_EVERY
                    )
                    if message is not None and message.get("type") == "message":
                        data = message["data"]
                        self._released(data.decode() if isinstance(data, bytes) else str(data))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                subscribed.clear()
                error = self._translate(exc)
                if isinstance(error, AccessDenied):  # the ACL grants no such channel
                    error.__cause__ = exc
                    self._refusal = error
                    self._wake_all()
                    subscribed.set()  # whoever waits for the subscription hears it now
                    return
                logger.debug("redis release notifications interrupted: %s", exc)
                self._wake_all()  # each retries now, marking the set again
                await asyncio.sleep(0.1)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.shield(pubsub.aclose())

    def _wake_all(self) -> None:
        for queue in self._waiters.values():
            for woken in queue:
                wake(woken)

    async def close(self) -> None:
        self._wake_all()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
