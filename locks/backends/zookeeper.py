"""ZooKeeper backend: an ephemeral-sequential child per acquisition under a container
node per lock; the lowest sequence holds the lock and each waiter watches only its
predecessor, so waiters are served in arrival order and a release wakes one of them.

The lease is the session: `ttl` is accepted and has no effect, a crashed holder's node
vanishes when its session expires, and a connection that is SUSPENDED makes `check()`
raise until it is back. LOST marks the leases lost and calls `on_lost`; so does a
connection that stays SUSPENDED for the whole session timeout, as Curator does: kazoo
says LOST only once the server is reached again, which may be never.

Over an ensemble (`hosts="h1:2181,h2:2181,h3:2181"`) a session outlives the member it is
connected through: kazoo moves it to another member, and the leases stay in doubt only
until it has (docs/topologies/zookeeper-ensemble.md has the windows measured).

This is the threaded face: the algorithm and the session's handling are shared with the
asyncio face (`locks.backends.zookeeper_session`); here each request's reply is waited
for on the calling thread, and work leaves kazoo's threads on threads of its own.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

from locks.backends.zookeeper_session import (
    WATCH_AFTER,
    Blocking,
    Pause,
    Steps,
    ZooKeeperSession,
)
from locks.base import Grant, ProviderBase
from locks.provider import Holder, Lease
from locks.watchdog import Watchdog

R = TypeVar("R")


class ZooKeeperProvider(ZooKeeperSession, ProviderBase):
    """Type `zookeeper` (kazoo): fair, reentrant per owner, fenced by the node's czxid."""

    client: KazooClient  # ours, or the one passed in

    def _reset(self) -> None:
        super()._reset()
        # sets grants' node watches (`_NodeWatch`), a thread: one of its own in a child
        self._watches = Watchdog(f"locks-{self.name}-node-watches")

    def after_fork_in_child(self) -> None:
        self._start_afresh()

    # -- how this face waits, and leaves kazoo's threads --------------------------------

    def _drive(self, steps: Steps[R]) -> R:
        """Make `steps`' requests on this thread: each reply waited for up to
        `request_timeout` (kazoo's time-out error is theirs to translate), each pause
        slept on its signal."""
        try:
            step = next(steps)
            while True:
                try:
                    if isinstance(step, Pause):
                        assert isinstance(step.signal, threading.Event)
                        step.signal.wait(step.seconds)
                        value = None
                    elif isinstance(step, Blocking):
                        value = step.call()
                    else:
                        value = step.get(timeout=self.request_timeout)
                except BaseException as error:  # the steps decide: they may catch it
                    step = steps.throw(error)
                    continue
                step = steps.send(value)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    def _new_signal(self) -> threading.Event:
        return threading.Event()

    def _run_in_background(self, steps: Steps[object]) -> None:
        self._hand_off(self._drive, steps)

    def _watch_node_later(self, node: str, token: str) -> None:
        watch = self._node_watches[token] = _NodeWatch(self, node, token)
        self._watches.watch(watch, time.monotonic() + WATCH_AFTER)

    def _unwatch_node(self, watch: Any) -> None:
        self._watches.unwatch(watch)

    # -- the primitives the base class builds on ---------------------------------------

    def _acquire(
        self, key: str, owner: str, token: str, ttl: float, deadline: float | None
    ) -> Grant | None:
        return self._drive(self._acquire_steps(key, owner, token, deadline))

    def _release(self, lease: Lease) -> bool:
        return self._drive(self._release_steps(lease))

    def _release_unknown(self, lease: Lease) -> bool:
        return self._drive(self._release_unknown_steps(lease))

    def _extend(self, lease: Lease, ttl: float) -> bool:
        return self._is_held(lease)

    def _is_held(self, lease: Lease) -> bool:
        return self._drive(self._is_held_steps(lease))

    def _holder(self, key: str) -> Holder | None:
        return self._drive(self._holder_steps(key))

    def _break(self, key: str) -> Holder | None:
        return self._drive(self._break_steps(key))

    def ping(self) -> None:
        self._drive(self._ping_steps())

    def close(self) -> None:
        super().close()
        self._watches.close()
        self.client.remove_listener(self._on_state)
        self._stop_client()


class _NodeWatch:
    """A granted node's watch, set by the provider's watch thread once the grant has
    been held `WATCH_AFTER` (`locks.watchdog.Renewable`: set once, never renewed)."""

    __slots__ = ("node", "provider", "token")

    def __init__(self, provider: ZooKeeperProvider, node: str, token: str) -> None:
        self.provider, self.node, self.token = provider, node, token

    def renew(self) -> float | None:
        provider = self.provider
        if provider._node_watches.get(self.token) is self:  # not released meanwhile
            # a connection lost or closed: the session's own listener tells the holder
            with contextlib.suppress(KazooException):
                provider._watch_own(self.node, self.token)
        return None

    def expire(self, now: float) -> float | None:
        return None
