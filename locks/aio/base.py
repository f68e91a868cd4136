"""The asyncio face of every backend: the same bookkeeping as the threaded face
(`locks.keeper`), with the calls that reach a server awaited on the loop and renewal as
a task (`locks.aio.watchdog`). The owner is the task (`locks.aio.owner`).

Cancellation never leaves a grant behind. Each backend makes its server calls finish on
the server once started, whatever happens to their caller (Redis writes a request at
once and reads its reply in the background if the caller is cancelled, undoing an
acquire's grant on the same connection; the local backend never suspends midway). An
acquire cancelled after its request went out also has the grant its token may name
released from here, in the background."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from locks.aio.handle import MakesAsyncLocks
from locks.aio.owner import task_owner
from locks.aio.watchdog import TaskWatchdog
from locks.errors import BackendUnavailable, LockError
from locks.forking import start_afresh_when_forked
from locks.holds import Hold, holds
from locks.keeper import GONE, Grant, LeaseKeeper, Renewal
from locks.names import check_name
from locks.owner import new_token
from locks.provider import Holder, Lease, LostCallback

R = TypeVar("R")

logger = logging.getLogger("locks")

AsyncLostCallback = Callable[[Lease], object]  # a plain callable, or an `async def`


class AsyncProviderBase(LeaseKeeper, MakesAsyncLocks, ABC):
    def __init__(self, name: str, watchdog_ttl: float = 30.0) -> None:
        super().__init__(name, watchdog_ttl)
        self._watchdog: TaskWatchdog = TaskWatchdog(
            f"locks-renew-{self.name}", self._renew_holds, self._end_holds
        )
        self._background: set[asyncio.Future[Any]] = set()  # kept alive until done
        # token -> the acquire's request under way for it (`_track`, `_settled`)
        self._in_flight: dict[str, asyncio.Future[Any]] = {}
        start_afresh_when_forked(self)

    def after_fork_in_child(self) -> None:
        self._background = set()  # the parent's loop's
        self._in_flight = {}

    # -- what a backend implements -------------------------------------------------

    @abstractmethod
    async def _acquire(
        self, key: str, owner: str, token: str, ttl: float, deadline: float | None
    ) -> Grant | None:
        """As the threaded face's (`locks.base.ProviderBase._acquire`), awaited."""

    @abstractmethod
    async def _release(self, lease: Lease) -> bool: ...

    async def _release_unknown(self, lease: Lease) -> bool:
        """Release a grant known only by owner and token (its fence is unknown): what an
        ambiguous or cancelled acquire may have taken."""
        return await self._release(lease)

    @abstractmethod
    async def _extend(self, lease: Lease, ttl: float) -> bool: ...

    @abstractmethod
    async def _is_held(self, lease: Lease) -> bool: ...

    async def _holder(self, key: str) -> Holder | None:
        raise NotImplementedError(f"the {self.type_name} backend cannot say who holds a lock")

    async def _break(self, key: str) -> Holder | None:
        raise NotImplementedError(f"the {self.type_name} backend cannot break a lock")

    @abstractmethod
    async def ping(self) -> None:
        """Raise `BackendUnavailable` unless the backend answers."""

    async def _close_io(self) -> None:
        """Free connections (after the leases ended)."""

    async def _extend_many(self, requests: Sequence[tuple[Lease, float]]) -> list[bool | None]:
        """As the threaded face's: one by one here; a backend that can pipeline them
        sends them at once."""
        return [await self._extend_or_unknown(lease, ttl) for lease, ttl in requests]

    async def _extend_or_unknown(self, lease: Lease, ttl: float) -> bool | None:
        """One of `_extend_many`'s outcomes: None where the backend could not answer."""
        try:
            return await self._areporting(lease.key, self._extend(lease, ttl))
        except LockError:
            return None

    # -- the protocol ---------------------------------------------------------------

    async def acquire(
        self,
        key: str,
        *,
        ttl: float | None = None,
        wait: float | None = None,
        on_lost: AsyncLostCallback | None = None,
    ) -> Lease | None:
        attempt = self._attempt(key, ttl, wait, _on_this_loop(on_lost), task_owner())
        if attempt.domain is not None:
            hold = holds.find(attempt.domain, attempt.owner, attempt.key)
            if hold is not None:
                owner = hold.provider
                assert isinstance(owner, AsyncProviderBase)
                nested = await owner._nest(hold, attempt.ttl, attempt.auto, attempt.on_lost)
                if nested is not None:
                    return self._nested(attempt.key, nested)
        deadline = None if attempt.wait is None else attempt.started + attempt.wait
        self._watchdog.attend()
        token = new_token()
        try:
            grant = await self._areporting(
                attempt.key, self._acquire(attempt.key, attempt.owner, token, attempt.ttl, deadline)
            )
        except asyncio.CancelledError:
            # the request may have reached the server: whatever it took goes
            unknown = self._unknown_lease(attempt.key, attempt.owner, token)
            self._in_background(self._release_quietly(unknown, self._release_unknown))
            raise
        return self._granted(attempt, grant)

    async def release(self, lease: Lease) -> None:
        state = lease.state
        hold, retry, expired, send = self._claim_release(lease)
        if send:
            owner = hold.provider
            assert isinstance(owner, AsyncProviderBase)
            try:
                released = await owner._areporting(lease.key, owner._release(hold.anchor))
            except BackendUnavailable:
                state.release_failed()  # it may have run: a retry is safe, under the same token
                raise
            finally:
                owner._forget(hold)
            self._released(lease, expired, refused=not released, retried=retry)
        else:  # other levels live on: nothing to tell the server
            self._released(lease, expired)

    async def extend(self, lease: Lease, ttl: float | None = None) -> Lease:
        new_ttl, hold = self._extend_claim(lease, ttl)
        owner = hold.provider
        assert isinstance(owner, AsyncProviderBase)
        async with _serial(hold):  # across the call: two extends never leave it shorter
            with hold.lock:
                target = self._extend_target(lease, hold, new_ttl)
            now = time.monotonic()
            held = target > 0 and await owner._areporting(
                lease.key, owner._extend(hold.anchor, target)
            )
            if held and self.capabilities.expires:
                with hold.lock:
                    hold.valid_until = now + target
                    lease.state.renewed(min(now + new_ttl, now + target))
        return self._extended(lease, hold, new_ttl, held, now)

    async def is_held(self, lease: Lease) -> bool:
        hold = self._checked_hold(lease)
        if hold is None:
            return False
        owner = hold.provider
        assert isinstance(owner, AsyncProviderBase)
        held = bool(await owner._areporting(lease.key, owner._is_held(hold.anchor)))
        return self._was_held(lease, hold, held)

    async def release_token(self, key: str, owner: str, token: str) -> bool:
        """As the threaded face's: release what an ambiguous acquire may have taken."""
        key = check_name(key)
        lease = self._unknown_lease(key, owner, token)
        return bool(await self._areporting(key, self._release_unknown(lease)))

    async def holder(self, key: str) -> Holder | None:
        """Who holds `key` right now (for operators: acting on it is a race)."""
        key = check_name(key)
        return self._with_depth(await self._areporting(key, self._holder(key)))

    async def break_lock(self, key: str, *, by: str | None = None) -> Holder | None:
        """As the threaded face's `break_lock`: free `key` whoever holds it."""
        key = check_name(key)
        return self._broke(key, await self._areporting(key, self._break(key)), by)

    async def close(self) -> None:
        """End every lease this provider granted (their `on_lost` run), release their
        grants, stop renewing, free connections."""
        self._closed = True
        self._watchdog.close()
        await self._background_done()
        await self._end_holds(f"its provider {self.name!r} was closed")
        await self._close_io()

    async def _end_holds(self, reason: str) -> None:
        reachable = self.release_on_close
        for hold in self._holds():
            self._lose(hold, reason)
            if reachable and not hold.ending:
                try:
                    await self._areporting(hold.key, self._release(hold.anchor))
                except LockError:
                    reachable = False  # one failure is enough: the rest expire by themselves

    # -- holds, renewal -----------------------------------------------------------------

    async def _nest(
        self, hold: Hold, ttl: float, auto: bool, on_lost: LostCallback | None
    ) -> Lease | None:
        """A new level of `hold` for its owner (the calling task), or None if the hold is
        over (the caller then asks the server for a grant of its own)."""
        while hold.ending and not hold.over:  # its release runs on, after a cancel
            await asyncio.sleep(0.001)
        async with _serial(hold):
            now = time.monotonic()
            with hold.lock:
                plan = self._nest_plan(hold, ttl, auto, now)
            if plan is None:
                return None
            valid_until, target = plan
            if target is not None:
                extended = await self._areporting(hold.key, self._extend(hold.anchor, target))
                if not extended:
                    self._lose(hold, GONE)
                    return None
                hold.valid_until = now + target
            with hold.lock:
                lease, watch = self._stack_level(hold, ttl, auto, on_lost, now=now,
                                                 valid_until=valid_until)  # fmt: skip
        if watch:
            self._watchdog.watch(hold, now + ttl / 3)
        return lease

    async def _renew_holds(self, due: Sequence[Hold]) -> list[float | None]:
        """The watchdog's call (see the threaded face's): each hold's serial lock is held
        from the first look to the outcome; a hold whose lock a task has (adding a
        level, extending) is renewed alone, after the rest."""
        dues: dict[int, float | None] = {}
        taken = [hold for hold in due if not _serial(hold).locked()]
        busy = [hold for hold in due if _serial(hold).locked()]
        for hold in taken:
            await _serial(hold).acquire()  # free: taken at once, without a suspension
        try:
            with_look = []
            for hold in taken:
                with hold.lock:
                    with_look.append(Renewal.look(hold))
            asked = [renewal for renewal in with_look if renewal.target is not None]
            requests = [(r.hold.anchor, r.target or 0.0) for r in asked]
            outcomes = await self._extend_many(requests) if requests else []
            for renewal, held in zip(asked, outcomes, strict=True):
                with renewal.hold.lock:
                    renewal.answered(held)
            for renewal in with_look:
                with renewal.hold.lock:
                    renewal.settle()
        finally:
            for hold in taken:
                _serial(hold).release()
        for renewal in with_look:  # outside the locks: callbacks, events, releases
            next_due, release = self._renewed(renewal)
            if release:  # it is lost either way; a dead server frees it by itself
                await self._release_quietly(renewal.hold.anchor)
            dues[id(renewal.hold)] = next_due
        for hold in busy:
            async with _serial(hold):
                pass
            dues[id(hold)] = (await self._renew_holds([hold]))[0]
        return [dues[id(hold)] for hold in due]

    # -- plumbing ---------------------------------------------------------------------

    async def _areporting(self, key: str, call: Awaitable[R]) -> R:
        """`_reporting` for an awaited call."""
        try:
            return await call
        except Exception as error:
            reported = self._reported(key, error)
            if reported is error:
                raise
            raise reported from error

    async def _release_quietly(
        self, lease: Lease, release: Callable[[Lease], Awaitable[bool]] | None = None
    ) -> None:
        """Release a grant that is lost either way (with `release`, by default
        `_release`); a server that cannot be reached frees it by itself."""
        with contextlib.suppress(LockError):
            await self._areporting(lease.key, (release or self._release)(lease))

    def _in_background(self, call: Awaitable[R]) -> asyncio.Future[R]:
        """Run `call` (a coroutine, or a future already running: an executor's) on its
        own, what must finish whatever happens to its caller; `close` waits for it."""
        running = asyncio.ensure_future(call, loop=asyncio.get_running_loop())
        self._background.add(running)
        running.add_done_callback(self._background.discard)
        return running

    def _track(self, token: str | None, request: asyncio.Future[Any]) -> None:
        """`request` runs in the background (its caller may be cancelled). With a
        `token`, it may make the grant the token names: a release by that token waits
        for it (`_settled`). Its error is its caller's; one whose caller was cancelled
        is read here, so that asyncio does not log it as never retrieved."""
        if token is not None:
            self._in_flight[token] = request
        request.add_done_callback(functools.partial(self._landed, token))

    def _landed(self, token: str | None, request: asyncio.Future[Any]) -> None:
        if token is not None and self._in_flight.get(token) is request:
            del self._in_flight[token]  # only its own: a try's requests follow each other
        if not request.cancelled():
            request.exception()

    async def _settled(self, token: str) -> None:
        """Once the request under way that may make `token`'s grant has answered: a
        release sent beside it could run first, find nothing, and leave the grant for
        its ttl."""
        request = self._in_flight.get(token)
        if request is not None:
            with contextlib.suppress(Exception):  # its outcome is its caller's, not ours
                await asyncio.shield(request)

    async def _background_done(self) -> None:
        """Wait for what runs in the background (each bounded by its own timeouts)."""
        while self._background:
            await asyncio.wait(list(self._background))


def _serial(hold: Hold) -> asyncio.Lock:
    """The hold's lock across awaited calls that change its grant's expiry."""
    serial = hold.serial
    if not isinstance(serial, asyncio.Lock):
        serial = hold.serial = asyncio.Lock()
    return serial


def _on_this_loop(on_lost: AsyncLostCallback | None) -> LostCallback | None:
    """`on_lost` as the bookkeeping calls it (plainly, maybe from another thread): an
    `async def` runs as a task on the loop the lease was acquired on."""
    if on_lost is None or not callable(on_lost):
        return on_lost  # check_acquire names a bad argument
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Future[object]] = set()

    def start(outcome: Awaitable[object]) -> None:
        task = asyncio.ensure_future(outcome)
        tasks.add(task)
        task.add_done_callback(finished)

    def finished(task: asyncio.Future[object]) -> None:
        tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            error = task.exception()
            logger.error("on_lost callback failed", exc_info=error)

    def call(lease: Lease) -> None:
        outcome = on_lost(lease)
        if not inspect.isawaitable(outcome):
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            start(outcome)
        else:
            loop.call_soon_threadsafe(start, outcome)

    return call
