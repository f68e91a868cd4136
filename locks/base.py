"""The threaded face of every backend: the calls that reach a server, made on the
calling thread, with renewal on a watchdog thread per provider. What they decide before
and after each call is shared with the asyncio face (`locks.keeper`). A backend supplies
five small primitives that act on one server grant (`_acquire`, `_release`, `_extend`,
`_is_held`, `ping`) and inherits the rest of the `LockProvider` protocol."""

from __future__ import annotations

import contextlib
import functools
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from locks.errors import BackendUnavailable, LockError
from locks.holds import Hold, holds
from locks.keeper import GONE, Attempt, Grant, LeaseKeeper, Renewal
from locks.names import check_name
from locks.owner import current_owner, new_token
from locks.provider import Holder, Lease, LostCallback, MakesLocks
from locks.watchdog import Renewable, Watchdog

__all__ = ["Grant", "ProviderBase"]


class ProviderBase(LeaseKeeper, MakesLocks, ABC):
    def __init__(self, name: str, watchdog_ttl: float = 30.0) -> None:
        super().__init__(name, watchdog_ttl)
        self._watchdog: Watchdog = Watchdog(f"locks-renew-{self.name}", self._renew_holds)

    # -- what a backend implements -------------------------------------------------

    @abstractmethod
    def _acquire(
        self, key: str, owner: str, token: str, ttl: float, deadline: float | None
    ) -> Grant | None:
        """Take `key` for `owner` under the fresh `token`, waiting until the monotonic
        `deadline` (None: forever); None if another owner still held it then. A grant
        the server finds already held by `owner` is one this process lost track of (a
        lost reply, a release not yet delivered): take it over as a new grant."""

    @abstractmethod
    def _release(self, lease: Lease) -> bool:
        """End the grant `lease` is the first level of; False if it was no longer held
        under that grant (released already, expired, or taken over)."""

    @abstractmethod
    def _extend(self, lease: Lease, ttl: float) -> bool:
        """Make the grant expire `ttl` seconds from now; False if no longer held."""

    @abstractmethod
    def _is_held(self, lease: Lease) -> bool: ...

    def _holder(self, key: str) -> Holder | None:
        """Who holds `key` now, as the server sees it (None: nobody)."""
        raise NotImplementedError(f"the {self.type_name} backend cannot say who holds a lock")

    def _break(self, key: str) -> Holder | None:
        """End whoever holds `key` now, whatever its owner, so that its next renewal,
        extend or release finds it gone and the next grant's fence is above its own;
        the holder it ended (None: nobody held it)."""
        raise NotImplementedError(f"the {self.type_name} backend cannot break a lock")

    @abstractmethod
    def ping(self) -> None:
        """Raise `BackendUnavailable` unless the backend answers."""

    def acquire(
        self,
        key: str,
        *,
        ttl: float | None = None,
        wait: float | None = None,
        on_lost: LostCallback | None = None,
    ) -> Lease | None:
        attempt, nested = self._begin(key, ttl, wait, on_lost)
        if nested is not None:
            return nested
        deadline = None if attempt.wait is None else attempt.started + attempt.wait
        grant = self._reporting(attempt.key, self._acquire, attempt.key, attempt.owner,
                                new_token(), attempt.ttl, deadline)  # fmt: skip
        return self._granted(attempt, grant)

    def start_acquire(
        self, key: str, *, ttl: float | None = None, on_lost: LostCallback | None = None
    ) -> Callable[[], Lease | None] | None:
        """One try at `key` (`wait=0`) in two halves: the request goes out now, and the
        call returned reads the answer and makes the lease (or None: held). None where
        the backend cannot split a try. A quorum asks all its members from one thread
        this way: one round trip for all, not one thread hand-off each."""
        attempt, nested = self._begin(key, ttl, 0.0, on_lost)
        if nested is not None:
            return lambda: nested
        read = self._reporting(attempt.key, self._start_try, attempt.key, attempt.owner,
                               new_token(), attempt.ttl)  # fmt: skip
        if read is None:
            return None
        return lambda: self._granted(attempt, self._reporting(attempt.key, read))

    def splits(self) -> bool:
        """Whether `start_acquire` and `start_release` send their request at once (else
        `start_acquire` returns None and `start_release` leaves all to its call)."""
        return False

    def _start_try(
        self, key: str, owner: str, token: str, ttl: float
    ) -> Callable[[], Grant | None] | None:
        """Send one try at `key` and return what reads its outcome (a grant, or None if
        held); None where this backend cannot split a try."""
        return None

    def _begin(
        self, key: str, ttl: float | None, wait: float | None, on_lost: LostCallback | None
    ) -> tuple[Attempt, Lease | None]:
        """Check the arguments (before any I/O) and take a new level of a hold the
        caller already has, if there is one."""
        attempt = self._attempt(key, ttl, wait, on_lost, current_owner())
        if attempt.domain is not None:
            hold = holds.find(attempt.domain, attempt.owner, attempt.key)
            if hold is not None:
                nested = self._reporting(attempt.key, self._nest, hold, attempt.ttl,
                                         attempt.auto, on_lost)  # fmt: skip
                if nested is not None:
                    return attempt, self._nested(attempt.key, nested)
        return attempt, None

    def release(self, lease: Lease) -> None:
        self.start_release(lease)()

    def start_release(self, lease: Lease) -> Callable[[], None]:
        """`release` in two halves: the bookkeeping, and the request where the backend
        can split it, happen now; the call returned finishes (it raises what `release`
        would). A quorum releases on all its members from one thread this way."""
        state = lease.state
        hold, retry, expired, send = self._claim_release(lease)
        if not send:  # other levels live on: nothing to tell the server
            return functools.partial(self._released, lease, expired)
        owner = hold.provider  # its connection made the grant
        assert isinstance(owner, ProviderBase)
        try:
            read = owner._reporting(lease.key, owner._start_release, hold.anchor)
        except BaseException as error:  # nothing to read: the hold is over all the same
            if isinstance(error, BackendUnavailable):
                state.release_failed()  # it may have run: a retry is safe, under the same token
            owner._forget(hold)
            raise

        def finish() -> None:
            try:
                released = owner._reporting(lease.key, read)
            except BackendUnavailable:
                state.release_failed()
                raise
            finally:
                owner._forget(hold)
            self._released(lease, expired, refused=not released, retried=retry)

        return finish

    def _start_release(self, lease: Lease) -> Callable[[], bool]:
        """Send the release of the grant `lease` anchors where the backend can split it;
        what reads its outcome (`_release`'s). By default all of it runs in that call."""
        return functools.partial(self._release, lease)

    def extend(self, lease: Lease, ttl: float | None = None) -> Lease:
        new_ttl, hold = self._extend_claim(lease, ttl)
        owner = hold.provider
        assert isinstance(owner, ProviderBase)
        with hold.lock:  # across the call: two extends never leave the expiry shorter
            target = self._extend_target(lease, hold, new_ttl)
            now = time.monotonic()
            held = target > 0 and owner._reporting(lease.key, owner._extend, hold.anchor, target)
            if held and self.capabilities.expires:
                hold.valid_until = now + target
                lease.state.renewed(min(now + new_ttl, now + target))
        return self._extended(lease, hold, new_ttl, held, now)

    def is_held(self, lease: Lease) -> bool:
        hold = self._checked_hold(lease)
        if hold is None:
            return False
        owner = hold.provider
        assert isinstance(owner, ProviderBase)
        held = bool(owner._reporting(lease.key, owner._is_held, hold.anchor))
        return self._was_held(lease, hold, held)

    def release_token(self, key: str, owner: str, token: str) -> bool:
        """Release what an acquire by `owner` under `token` may have taken when its reply
        was lost (`BackendUnavailable.ambiguous`). True if something was released; a
        token that never took the lock changes nothing."""
        key = check_name(key)
        lease = self._unknown_lease(key, owner, token)
        return bool(self._reporting(key, self._release_unknown, lease))

    def _release_unknown(self, lease: Lease) -> bool:
        """Release a grant known only by owner and token (its fence is unknown)."""
        return self._release(lease)

    def holder(self, key: str) -> Holder | None:
        """Who holds `key` on this backend right now, or None: for operators and tools.
        Reading it and acting on it is a race; take the lock instead."""
        key = check_name(key)
        return self._with_depth(self._reporting(key, self._holder, key))

    def break_lock(self, key: str, *, by: str | None = None) -> Holder | None:
        """Free `key` whoever holds it: for an operator clearing a lock whose holder is
        stuck or gone (`locks break`). The holder's next renewal, extend or release
        fails and its `on_lost` runs; the next grant's fence is above the broken one,
        so storage that checks fences refuses the old holder's writes. What the old
        holder does before it learns of it is unprotected. Returns the holder it
        ended, None if nobody held `key`. `by` names who broke it in the event logged
        (default: this user, host and process)."""
        key = check_name(key)
        return self._broke(key, self._reporting(key, self._break, key), by)

    def close(self) -> None:
        """End every lease this provider granted (their `on_lost` callbacks run), release
        their grants where the server keeps them, stop renewing, free connections."""
        self._closed = True
        self._watchdog.close()
        reachable = self.release_on_close
        for hold in self._holds():
            self._lose(hold, f"its provider {self.name!r} was closed")
            if reachable and not hold.ending:
                try:
                    self._reporting(hold.key, self._release, hold.anchor)
                except LockError:
                    reachable = False  # one failure is enough: the rest expire by themselves

    # -- holds and their levels ---------------------------------------------------------

    def _nest(
        self, hold: Hold, ttl: float, auto: bool, on_lost: LostCallback | None
    ) -> Lease | None:
        """A new level of `hold` for its owner, or None if the hold is over (the caller
        then asks the server for a grant of its own)."""
        if hold.ending:  # its last level's release is under way: let it finish first
            hold.wait_over()
            return None
        owner = hold.provider
        assert isinstance(owner, ProviderBase)
        with hold.lock:  # across the extend: two levels never leave the expiry shorter
            now = time.monotonic()
            plan = self._nest_plan(hold, ttl, auto, now)
            if plan is None:
                return None
            valid_until, target = plan
            lost = target is not None and not owner._extend(hold.anchor, target)
            if target is not None and not lost:
                hold.valid_until = now + target
            if not lost:
                lease, watch = self._stack_level(hold, ttl, auto, on_lost, now=now,
                                                 valid_until=valid_until)  # fmt: skip
        if lost:
            owner._lose(hold, GONE)
            return None
        if watch:
            owner._watchdog.watch(hold, now + ttl / 3)
        return lease

    def _renew_holds(self, items: Sequence[Renewable]) -> list[float | None]:
        """The watchdog's call for the holds due together (it watches only holds): each
        grant extended so it covers every live level, all the extends sent at once
        (`_extend_many`: one pipeline where the backend has one); for each, the time
        of its next renewal, or None when there is nothing left to renew.

        Each hold's lock is held from the first look to the outcome: a release or a new
        level slipping in between would make a refused extend read as a loss. A hold
        whose lock another thread has (adding a level, with an extend of its own) is
        renewed alone, after the rest, waiting for its lock."""
        holds_due = [item for item in items if isinstance(item, Hold)]
        assert len(holds_due) == len(items), "a provider's watchdog watches holds only"
        dues: dict[int, float | None] = {}
        busy: list[Hold] = []
        with contextlib.ExitStack() as locks:
            renewals = []
            alone = len(holds_due) == 1  # waits for its lock; in a batch, none does
            for hold in holds_due:
                if not hold.lock.acquire(blocking=alone):
                    busy.append(hold)
                    continue
                locks.callback(hold.lock.release)
                renewals.append(Renewal.look(hold))
            asked = [renewal for renewal in renewals if renewal.target is not None]
            outcomes = self._extend_many([(r.hold.anchor, r.target or 0.0) for r in asked])
            for renewal, held in zip(asked, outcomes, strict=True):
                renewal.answered(held)
            for renewal in renewals:
                renewal.settle()
        for renewal in renewals:  # outside the locks: callbacks, events, releases
            due, release = self._renewed(renewal)
            if release:  # it is lost either way; a dead server frees it by itself
                with contextlib.suppress(LockError):
                    self._reporting(renewal.hold.key, self._release, renewal.hold.anchor)
            dues[id(renewal.hold)] = due
        for hold in busy:
            dues[id(hold)] = self._renew_holds([hold])[0]
        return [dues[id(hold)] for hold in holds_due]

    def _extend_many(self, requests: Sequence[tuple[Lease, float]]) -> list[bool | None]:
        """`_extend` of each (grant, ttl): True if extended, False if the grant is gone,
        None if the backend cannot say (an error, reported). One by one here; a backend
        that can pipeline them sends them at once."""
        outcomes: list[bool | None] = []
        for lease, ttl in requests:
            try:
                outcomes.append(self._reporting(lease.key, self._extend, lease, ttl))
            except LockError:
                outcomes.append(None)
        return outcomes
