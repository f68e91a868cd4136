"""Type `zookeeper` for tasks: the threaded provider's arguments, nodes, queue, fences,
session handling and errors, from the same code (`locks.backends.zookeeper_session`,
where the algorithm is written once as steps), with each step awaited on the loop. A
task and a thread exclude each other on one name; the owner is the task.

How kazoo's replies reach the loop: kazoo's `*_async` calls only queue a request for its
connection thread and return an `IAsyncResult`. A callback linked to it (`rawlink`, run
on kazoo's completion thread) hands the outcome to an asyncio future with
`loop.call_soon_threadsafe`; a timer on the loop fails that future with kazoo's own
time-out error after `request_timeout`, which the shared steps translate into
`BackendUnavailable` naming the backend and its address, as the threaded face's wait
does. A waiter's watch on its predecessor, the state listener (SUSPENDED, LOST, back),
and a held node's deletion run on kazoo's threads too: they set a signal whose waiters'
futures are set through their loops (`_LoopSignal`), or hand their work to the loop
(`_hand_off`), so `on_lost` and every change to the leases run there. Nothing on the
loop's thread waits for kazoo: the first connection is a signal awaited, and
`client.stop()` and our own TLS handshake run in threads.

Cancellation: a request sent runs on the server whatever happens to its task. A task
cancelled while it awaits a step closes its steps there (`GeneratorExit` at the yield),
and the steps undo what they sent: a create whose reply has not come is followed in the
background (`_in_background`, which `close()` waits for) until it comes, however late
(kazoo fails it if the connection goes), and the node it made is then deleted; the node
of a waiter, or of a release, is handed to the background cleaner, whose listing
ZooKeeper answers after every earlier request of the session. What ZooKeeper cannot
answer for now is remembered and deleted once the session is connected again."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from kazoo.exceptions import KazooException, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from locks.aio.base import AsyncProviderBase
from locks.aio.wakeups import new_wakeup, wake, woken_within
from locks.backends import zookeeper_session as shared
from locks.backends.zookeeper_session import Steps, ZooKeeperSession
from locks.errors import LockError
from locks.keeper import Grant
from locks.provider import Holder, Lease

R = TypeVar("R")


class ZooKeeperProvider(ZooKeeperSession, AsyncProviderBase):
    """Type `zookeeper` for tasks: fair, reentrant per task, fenced by the node's czxid."""

    def _reset(self) -> None:
        """Also forget the loop: a forked child's is its own."""
        super()._reset()
        # the loop that serves this provider, where kazoo's threads hand their work
        self._loop: asyncio.AbstractEventLoop | None = None

    def after_fork_in_child(self) -> None:
        AsyncProviderBase.after_fork_in_child(self)
        self._start_afresh()

    # -- the loop's side: awaiting steps, work handed over from kazoo's threads ----------

    async def _adrive(self, steps: Steps[R]) -> R:
        """Await `steps`' requests on the running loop: each outcome is sent in, each
        error thrown in (the steps decide). Cancelled, they are closed at the step
        awaited, and undo what they sent (see the module docstring)."""
        self._loop = asyncio.get_running_loop()
        resume: Callable[[Any], Any] = steps.send
        outcome: Any = None  # `send(None)` starts them
        while True:
            try:
                step = resume(outcome)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            try:
                outcome, resume = await self._step(step), steps.send
            except Exception as error:
                outcome, resume = error, steps.throw
            except BaseException:  # cancelled: nobody waits for this reply now
                steps.close()
                raise

    async def _step(self, step: Any) -> Any:
        if isinstance(step, shared.Pause):
            assert isinstance(step.signal, _LoopSignal)
            await step.signal.wait(step.seconds)
            return None
        if isinstance(step, shared.Blocking):
            return await asyncio.to_thread(step.call)
        return await _reply(step, self.request_timeout)

    def _new_signal(self) -> _LoopSignal:
        return _LoopSignal()

    def _hand_off(self, call: Callable[..., object], *args: Any) -> None:
        """Onto the loop; with no loop left, the threaded face's way."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # closed
                loop.call_soon_threadsafe(call, *args)
                return
        super()._hand_off(call, *args)

    def _later(self, seconds: float, call: Callable[..., object], *args: Any) -> None:
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(loop.call_later, seconds, call, *args)
                return
        super()._later(seconds, call, *args)

    def _run_in_background(self, steps: Steps[object], *, handed: bool = False) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            if handed:  # no loop serves this provider any more: one of its own, here
                asyncio.run(self._adrive(steps))
            else:  # on kazoo's thread
                self._hand_off(functools.partial(self._run_in_background, steps, handed=True))
            return
        self._in_background(self._adrive(steps))

    def _watch_node_later(self, node: str, token: str) -> None:
        loop = asyncio.get_running_loop()
        due = loop.call_later(shared.WATCH_AFTER, self._watch_held, node, token)
        self._node_watches[token] = due

    def _watch_held(self, node: str, token: str) -> None:
        if token in self._nodes:  # not released or lost meanwhile
            with contextlib.suppress(KazooException):  # a lost session is heard otherwise
                self._watch_own(node, token)

    def _unwatch_node(self, watch: Any) -> None:
        watch.cancel()

    def _create_abandoned(self, created: Any, parent: str, token: str) -> None:
        self._in_background(self._undo_create(created, parent, token))

    async def _undo_create(self, created: Any, parent: str, token: str) -> None:
        """Wait for the reply to a create its task gave up on, and delete the node it
        made: a node nobody knows of would hold the lock for the session's life."""
        try:
            path, _ = await _reply(created, None)
        except NoNodeError:
            return  # no lock parent: nothing was made
        except shared.UNAVAILABLE:  # it may have run: deleted once ZooKeeper answers
            self._leave(parent, token)
            return
        except KazooException:
            return  # refused: nothing was made
        with contextlib.suppress(LockError):  # a delete that fails is left to the cleaner
            await self._adrive(self._delete_steps(parent, path, token))

    # -- the primitives the base class builds on ---------------------------------------

    async def _acquire(
        self, key: str, owner: str, token: str, ttl: float, deadline: float | None
    ) -> Grant | None:
        return await self._adrive(self._acquire_steps(key, owner, token, deadline))

    async def _release(self, lease: Lease) -> bool:
        return await self._adrive(self._release_steps(lease))

    async def _release_unknown(self, lease: Lease) -> bool:
        """`release_token`'s, and a cancelled acquire's: the node is named after the
        token, so it is found and deleted (now, or once ZooKeeper answers again)."""
        return await self._adrive(self._release_unknown_steps(lease))

    async def _extend(self, lease: Lease, ttl: float) -> bool:
        return await self._is_held(lease)

    async def _is_held(self, lease: Lease) -> bool:
        return await self._adrive(self._is_held_steps(lease))

    async def _holder(self, key: str) -> Holder | None:
        return await self._adrive(self._holder_steps(key))

    async def _break(self, key: str) -> Holder | None:
        return await self._adrive(self._break_steps(key))

    async def ping(self) -> None:
        await self._adrive(self._ping_steps())

    async def _close_io(self) -> None:
        for token in list(self._node_watches):
            self._drop_node(token)
        self.client.remove_listener(self._on_state)
        if self._started is not None:
            await asyncio.to_thread(self._stop_client)


class _LoopSignal:
    """`threading.Event`'s `set` (from any thread: kazoo's) and `is_set`, awaited by
    tasks: each waiter's future is set through its own loop."""

    __slots__ = ("_lock", "_set", "_waiters")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._set = False
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[bool]]] = []

    def set(self) -> None:
        with self._lock:
            self._set = True
            waiters, self._waiters = self._waiters, []
        for loop, woken in waiters:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits
                loop.call_soon_threadsafe(wake, woken)

    def is_set(self) -> bool:
        return self._set

    async def wait(self, seconds: float) -> None:
        """Until set, or `seconds` have passed."""
        loop = asyncio.get_running_loop()
        woken = new_wakeup()
        with self._lock:
            if self._set:
                return
            self._waiters.append((loop, woken))
        try:
            await woken_within(woken, seconds)
        finally:
            with self._lock, contextlib.suppress(ValueError):
                self._waiters.remove((loop, woken))


async def _reply(result: Any, timeout: float | None) -> Any:
    """kazoo's reply to one request, awaited: its value, or its error; kazoo's own
    time-out error after `timeout` seconds (None: however long it takes)."""
    if result.ready():  # answered already, or refused at once (a closed client)
        return result.get(block=False)
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[Any] = loop.create_future()

    def answered(result: Any) -> None:  # on kazoo's completion thread
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(_settle, answer, result)

    result.rawlink(answered)
    timer = None if timeout is None else loop.call_later(timeout, _time_out, answer, timeout)
    try:
        return await answer
    finally:
        if timer is not None:
            timer.cancel()


def _settle(answer: asyncio.Future[Any], result: Any) -> None:
    if answer.done():  # timed out, or its task was cancelled
        return
    if result.successful():
        answer.set_result(result.value)
    else:
        answer.set_exception(result.exception)


def _time_out(answer: asyncio.Future[Any], timeout: float) -> None:
    if not answer.done():
        answer.set_exception(KazooTimeoutError(f"no reply within {timeout} s"))
