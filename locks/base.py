"""What every backend shares: argument checks before I/O, holds and their levels
(reentrancy, see `locks.holds`), renewal, error translation, events. A backend supplies
five small primitives that act on one server grant (`_acquire`, `_release`, `_extend`,
`_is_held`, `ping`) and inherits the rest of the `LockProvider` protocol."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import ssl
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from typing import ClassVar, NamedTuple, ParamSpec, TypeVar

from locks.errors import AccessDenied, BackendError, BackendUnavailable, LockError, LockNotOwned
from locks.events import EventKind, emit, emit_broken
from locks.holds import Hold, holds
from locks.names import check_acquire, check_name, check_seconds, check_ttl
from locks.owner import current_owner, in_this_process, new_token, who
from locks.provider import (
    Capabilities,
    Holder,
    Lease,
    LeaseState,
    LostCallback,
    MakesLocks,
    check_lease,
    check_mine,
    hold_of,
)
from locks.tls import tls_refused
from locks.watchdog import Renewable, Watchdog, mark_lost

# why a lease is lost when a call finds its grant no longer on the server
_GONE = "the backend no longer holds it"

P = ParamSpec("P")
R = TypeVar("R")

_DETAIL_MAX = 300  # characters of a driver's message kept in ours
_RETRY_CAP = 1.0  # seconds: a failing renewal is tried again at most this far apart


class Grant(NamedTuple):
    """What a backend's `_acquire` reports on success: a fresh grant on the server."""

    token: str  # the token the grant is held under (the one passed in)
    fence: int
    depth: int  # always 1: levels are counted in the process (`locks.holds`)
    sent_at: float  # monotonic time the winning request was sent: validity counts from here


class _Attempt(NamedTuple):
    """One acquire, checked, on its way to the server."""

    key: str
    ttl: float  # the lease's length (the watchdog's for an auto-renewed lease)
    wait: float | None
    auto: bool  # renewed by the watchdog
    on_lost: LostCallback | None
    owner: str
    started: float
    domain: Hashable | None  # where its holds are found again (None: not reentrant)


@dataclasses.dataclass(eq=False)
class _Renewal:
    """One hold's renewal, looked at and settled under the hold's lock, acted on after."""

    hold: Hold
    now: float
    levels: list[Lease]
    auto: list[Lease] = dataclasses.field(default_factory=list)
    overdue: list[Lease] = dataclasses.field(default_factory=list)
    want: float = 0.0
    target: float | None = None  # the ttl to extend the grant to; None: no extend
    ended: str | None = None  # why the hold is lost
    due: float | None = None  # the next renewal
    finished: bool = False  # nothing more to do (the hold was over already)

    @staticmethod
    def look(hold: Hold) -> _Renewal:
        """What the renewal must do, decided under the hold's lock."""
        now = time.monotonic()
        levels = hold.levels
        renewal = _Renewal(hold, now, levels)
        if hold.ending or hold.over:
            renewal.finished = True
            renewal.levels = []
            return renewal
        renewed = [level for level in levels if level.auto_renew]
        renewal.auto = [level for level in renewed if level.state.live(now)]
        # levels whose validity ran out before they could be renewed (the process was
        # frozen, or this thread starved): lost, and told so, never quietly dropped
        renewal.overdue = [lv for lv in renewed if not (lv.state.lost or lv.state.ended)
                           and lv.state.expired(now)]  # fmt: skip
        if hold.limit is not None and now >= hold.limit:
            renewal.ended = "it reached the bound its chain set (safe mode)"
        elif not renewal.auto:
            renewal.due = hold.limit  # a bounded hold is visited once more, at its bound
        else:
            renewal.want = max(level.ttl for level in renewal.auto)
            renewal.target = hold.target(now, renewal.want)
        return renewal

    def answered(self, held: bool | None) -> None:
        """The extend's outcome: extended, gone, or unknown (an error)."""
        hold, now, want, auto = self.hold, self.now, self.want, self.auto
        assert self.target is not None
        if held:
            hold.valid_until = now + self.target
            for level in auto:
                level.state.renewed(min(now + level.ttl, now + self.target))
            self.due = now + want / 3 if hold.limit is None else min(now + want / 3, hold.limit)
        elif held is None:  # it cannot say: try again until the validity runs out
            later = time.monotonic()
            self.overdue += [lv for lv in auto if lv.state.expired(later)]
            alive = [lv.state.valid_until for lv in auto if not lv.state.expired(later)]
            if alive:
                retry = min(max(want / 30, 0.05), _RETRY_CAP)
                self.due = min(later + retry, *[until for until in alive if until])
        else:
            self.ended = _GONE

    def settle(self) -> None:
        """Still under the lock: a hold with no next renewal is no longer watched."""
        if self.finished or self.due is None:
            self.hold.watched = False


class ProviderBase(MakesLocks, ABC):
    type_name: ClassVar[str]  # the backend type, as config names it
    capabilities: ClassVar[Capabilities]
    # The driver's errors, sorted: "cannot be reached now" (the only ones that degrade),
    # "credentials or permissions refused", and every other error the driver raises,
    # which becomes a `BackendError`. Nothing a driver raises reaches a caller raw.
    unavailable_errors: tuple[type[BaseException], ...] = ()
    denied_errors: tuple[type[BaseException], ...] = ()
    driver_errors: tuple[type[BaseException], ...] = ()
    address = ""  # where the server is, for error messages (host:port)
    release_on_close = True  # False where closing ends the grants itself

    def __init__(self, name: str, watchdog_ttl: float = 30.0) -> None:
        self.name = check_name(name, "name")
        self.watchdog_ttl = check_seconds(watchdog_ttl, "watchdog_ttl")
        self._watchdog = Watchdog(f"locks-renew-{self.name}", self._renew_holds)
        self._closed = False
        self._domain_key: Hashable | None = None  # `_domain()`, once the backend is set up

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"

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

    def _domain(self) -> Hashable:
        """What makes two provider objects one lock domain (the same server and
        namespace): a thread that holds a key through one re-enters it through the
        other. By default, only the object itself."""
        return id(self)

    def _reentrancy_domain(self) -> Hashable | None:
        """`_domain()`, worked out once; None where the backend is not reentrant."""
        if not self.capabilities.reentrant:
            return None
        if self._domain_key is None:
            self._domain_key = self._domain()
        return self._domain_key

    def _hand_out(self, lease: Lease) -> None:
        """The last look at a lease (a fresh grant, or a level of a hold this provider
        granted) before it reaches its caller, however it was acquired: raise
        `BackendUnavailable`, having ended it, if it cannot be vouched for now
        (ZooKeeper: the session it was granted in expired meanwhile)."""

    def _check_hold(self, hold: Hold) -> None:
        """Raise `BackendUnavailable` if a new level of `hold` cannot be vouched for now
        (ZooKeeper: the session is in doubt)."""

    @abstractmethod
    def ping(self) -> None:
        """Raise `BackendUnavailable` unless the backend answers."""

    # -- the protocol ---------------------------------------------------------------

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
    ) -> tuple[_Attempt, Lease | None]:
        """Check the arguments (before any I/O) and take a new level of a hold the
        caller already has, if there is one."""
        key, fixed_ttl, wait = check_acquire(key, ttl, wait, on_lost)
        if self._closed:
            raise BackendUnavailable(
                f"{self.type_name} backend {self.name!r} is closed", backend=self.name,
                address=self.address,
            )  # fmt: skip
        lease_ttl = self.watchdog_ttl if fixed_ttl is None else fixed_ttl
        auto = fixed_ttl is None and self.capabilities.expires
        attempt = _Attempt(key, lease_ttl, wait, auto, on_lost, current_owner(),
                           time.monotonic(), self._reentrancy_domain())  # fmt: skip
        if attempt.domain is not None:
            hold = holds.find(attempt.domain, attempt.owner, key)
            if hold is not None:
                nested = self._reporting(key, self._nest, hold, lease_ttl, auto, on_lost)
                if nested is not None:
                    owner = hold.provider  # its grant: its session vouches for the level
                    owner._reporting(key, owner._hand_out, nested)
                    emit(EventKind.ACQUIRED, self.name, key, nested, duration=0.0)
                    return attempt, nested
        return attempt, None

    def _granted(self, attempt: _Attempt, grant: Grant | None) -> Lease | None:
        """The lease for a fresh server grant, registered and watched; None if none."""
        key = attempt.key
        if grant is None:
            emit(EventKind.TIMED_OUT, self.name, key, duration=time.monotonic() - attempt.started)
            return None
        lease_ttl, auto = attempt.ttl, attempt.auto
        valid_until = grant.sent_at + lease_ttl if self.capabilities.expires else None
        state = LeaseState(valid_until, attempt.on_lost)
        lease = Lease(key, self.name, attempt.owner, grant.token, grant.fence, lease_ttl, 1,
                      grant.sent_at, auto, state)  # fmt: skip
        state.hold = hold = Hold(self, lease, valid_until)
        holds.add(hold, attempt.domain)
        if auto:
            hold.watched = True
            self._watchdog.watch(hold, grant.sent_at + lease_ttl / 3)
        self._reporting(key, self._hand_out, lease)
        emit(EventKind.ACQUIRED, self.name, key, lease,
             duration=time.monotonic() - attempt.started)  # fmt: skip
        return lease

    def release(self, lease: Lease) -> None:
        self.start_release(lease)()

    def start_release(self, lease: Lease) -> Callable[[], None]:
        """`release` in two halves: the bookkeeping, and the request where the backend
        can split it, happen now; the call returned finishes (it raises what `release`
        would). A quorum releases on all its members from one thread this way."""
        check_mine(lease, self.name)
        state = lease.state
        hold = hold_of(lease, Hold)
        try:
            retry = state.begin_release()
        except LookupError as ended:
            raise LockNotOwned(
                f"{lease.key!r} on {self.name!r}: this lease has ended ({ended}); "
                "nothing was sent to the server"
            ) from None
        now = time.monotonic()
        expired = state.expired(now)
        if not retry:
            with hold.lock:
                hold.drop(state)
                last = not hold.ending and not hold.live(now)
                hold.ending = hold.ending or last
            if not last:  # other levels live on: nothing to tell the server
                return functools.partial(self._released, lease, expired)
        # The last live level: the hold's grant goes, even if this lease itself ran out
        # (an outer level's longer expiry may still hold the key on the server, for
        # nobody). Named by the grant's own token, it can touch no other grant.
        owner = hold.provider  # its connection made the grant
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

    def _released(
        self, lease: Lease, expired: bool, *, refused: bool = False, retried: bool = False
    ) -> None:
        """The outcome of `lease`'s release. A live lease whose first release found its
        grant gone was lost before it (a server restarted or failed over, an operator
        broke it): it is told as lost first, as a refused renewal is, so neither its
        holder nor the metrics take it for a lease that simply ended."""
        if expired:
            raise LockNotOwned(
                f"{lease.key!r} on {self.name!r}: this lease had expired before its release "
                "(what its hold still held on the server, if anything, was released)"
            )
        if refused and retried:  # the first try may have run: nothing to tell
            raise LockNotOwned(
                f"{lease.key!r} on {self.name!r}: nothing is held under this lease now "
                "(the release that failed before may have run, or the grant was lost)"
            )
        if refused:
            mark_lost(lease, "the backend no longer held it when it was released",
                      releasing=True)  # fmt: skip
            raise LockNotOwned(
                f"{lease.key!r} on {self.name!r} was no longer held by this lease "
                "(it was lost before its release); nothing was released"
            )
        duration = time.monotonic() - lease.acquired_at
        emit(EventKind.RELEASED, self.name, lease.key, lease, duration=duration)

    def extend(self, lease: Lease, ttl: float | None = None) -> Lease:
        new_ttl = check_ttl(ttl)
        check_mine(lease, self.name)
        new_ttl = lease.ttl if new_ttl is None else new_ttl
        state = lease.state
        hold = hold_of(lease, Hold)
        owner = hold.provider
        with hold.lock:
            now = time.monotonic()
            if hold.ending or not state.live(now):
                raise LockNotOwned(
                    f"{lease.key!r} on {self.name!r}: this lease has ended; "
                    "nothing was sent to the server"
                )
            if self.capabilities.expires:
                target = hold.target(now, new_ttl, besides=state)
                held = target > 0 and owner._reporting(
                    lease.key, owner._extend, hold.anchor, target
                )
                if held:
                    hold.valid_until = now + target
                    state.renewed(min(now + new_ttl, now + target))
            else:
                held = owner._reporting(lease.key, owner._extend, hold.anchor, new_ttl)
        if not held:
            owner._lose(hold, _GONE)
            raise LockNotOwned(f"{lease.key!r} on {self.name!r} is no longer held by this lease")
        emit(EventKind.EXTENDED, self.name, lease.key, lease)
        if new_ttl == lease.ttl:
            return lease
        copy = lease.copy(new_ttl)
        with hold.lock:
            hold.copied(copy)
        return copy

    def is_held(self, lease: Lease) -> bool:
        check_lease(lease, self.name)
        hold = lease.state.hold
        live = lease.state.live(time.monotonic())
        if not in_this_process(lease.owner) or not live or not isinstance(hold, Hold):
            return False
        owner = hold.provider
        held = bool(owner._reporting(lease.key, owner._is_held, hold.anchor))
        if not held and lease.state.live(time.monotonic()):
            # its grant is gone while it was valid here: lost, and told so first
            owner._lose(hold, _GONE)
        return held

    def release_token(self, key: str, owner: str, token: str) -> bool:
        """Release what an acquire by `owner` under `token` may have taken when its reply
        was lost (`BackendUnavailable.ambiguous`). True if something was released; a
        token that never took the lock changes nothing."""
        key = check_name(key)
        lease = Lease(key, self.name, owner, token, 0, self.watchdog_ttl, 1, 0.0, False,
                      LeaseState(None))  # fmt: skip
        return bool(self._reporting(key, self._release_unknown, lease))

    def _release_unknown(self, lease: Lease) -> bool:
        """Release a grant known only by owner and token (its fence is unknown)."""
        return self._release(lease)

    def holder(self, key: str) -> Holder | None:
        """Who holds `key` on this backend right now, or None: for operators and tools.
        Reading it and acting on it is a race; take the lock instead."""
        key = check_name(key)
        found = self._reporting(key, self._holder, key)
        domain = self._reentrancy_domain()
        if found is not None and found.depth is None and domain is not None:
            hold = holds.find(domain, found.owner, key)  # levels are counted here
            if hold is not None:
                found = dataclasses.replace(found, depth=len(hold.live(time.monotonic())))
        return found

    def break_lock(self, key: str, *, by: str | None = None) -> Holder | None:
        """Free `key` whoever holds it: for an operator clearing a lock whose holder is
        stuck or gone (`locks break`). The holder's next renewal, extend or release
        fails and its `on_lost` runs; the next grant's fence is above the broken one,
        so storage that checks fences refuses the old holder's writes. What the old
        holder does before it learns of it is unprotected. Returns the holder it
        ended, None if nobody held `key`. `by` names who broke it in the event logged
        (default: this user, host and process)."""
        key = check_name(key)
        broken = self._reporting(key, self._break, key)
        if broken is None:
            return None
        by = by or who()
        for hold in self._holds():  # a holder in this process hears of it now
            if hold.key == key and hold.anchor.fence == broken.fence:
                self._lose(hold, f"it was broken by {by}")
        emit_broken(self.name, key, by, broken)
        return broken

    def bound(self, lease: Lease, seconds: float) -> None:
        """End `lease`'s hold (every level) `seconds` after it was granted, however it was
        asked for: no level stays valid past then, renewals stop there, and its grant is
        released. A safe-mode chain bounds the grants of its lower tiers this way."""
        seconds = check_seconds(seconds, "seconds")
        hold = hold_of(lease, Hold)
        owner = hold.provider
        with hold.lock:
            limit = lease.acquired_at + seconds
            hold.limit = limit if hold.limit is None else min(hold.limit, limit)
            for level in hold.levels:
                until = level.state.valid_until
                level.state.valid_until = hold.limit if until is None else min(until, hold.limit)
            watch = not hold.watched and not hold.ending
            hold.watched = hold.watched or watch
        if watch:  # a hold that is not renewed is visited once, at its bound
            owner._watchdog.watch(hold, hold.limit)

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
        lost = False
        with hold.lock:
            now = time.monotonic()
            if hold.ending or hold.over:
                return None
            if not hold.live(now):  # every level ended or ran out: the grant is spent
                owner._forget(hold)
                return None
            owner._check_hold(hold)
            valid_until = None
            if owner.capabilities.expires:
                want = now + ttl if hold.limit is None else min(now + ttl, hold.limit)
                if auto and hold.watched and hold.valid_until is not None:
                    valid_until = min(want, hold.valid_until)  # renewed with the hold
                else:
                    if hold.valid_until is None or want > hold.valid_until:
                        target = hold.target(now, ttl)
                        lost = not owner._extend(hold.anchor, target)
                        if not lost:
                            hold.valid_until = now + target
                    valid_until = want
            elif hold.limit is not None:
                valid_until = hold.limit
            if not lost:
                anchor = hold.anchor
                state = LeaseState(valid_until, on_lost, hold)
                lease = Lease(anchor.key, self.name, anchor.owner, new_token(), anchor.fence,
                              ttl, len(hold.live(now)) + 1, now, auto, state)  # fmt: skip
                hold.add(lease)
                watch = auto and not hold.watched
                hold.watched = hold.watched or watch
        if lost:
            owner._lose(hold, _GONE)
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
                renewals.append(_Renewal.look(hold))
            asked = [renewal for renewal in renewals if renewal.target is not None]
            outcomes = self._extend_many([(r.hold.anchor, r.target or 0.0) for r in asked])
            for renewal, held in zip(asked, outcomes, strict=True):
                renewal.answered(held)
            for renewal in renewals:
                renewal.settle()
        for renewal in renewals:  # outside the locks: callbacks, events, releases
            dues[id(renewal.hold)] = self._renewed(renewal)
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

    def _renewed(self, renewal: _Renewal) -> float | None:
        """A renewal's outcome, acted on outside the hold's lock."""
        hold = renewal.hold
        if renewal.finished:  # released or lost meanwhile: nothing left to renew
            return None
        if renewal.ended is None and not renewal.levels:
            # every holder dropped its lease unreleased: the server lets it expire, and
            # nobody here can use it again
            self._forget(hold)
            return None
        if renewal.ended is not None:
            self._lose(hold, renewal.ended)
            if hold.limit is not None:  # a bounded grant is ended on the server too
                # it is lost either way; a dead server frees it by itself
                with contextlib.suppress(LockError):
                    self._reporting(hold.key, self._release, hold.anchor)
            return None
        for level in renewal.overdue:
            mark_lost(level, "its validity ran out before it could be renewed")
        return renewal.due

    def _expire_hold(self, hold: Hold, now: float) -> float | None:
        """The reaper's call, while a renewal of this provider is stuck (no I/O, and not
        `hold.lock`, which the stuck renewal may hold): mark lost the auto-renewed levels
        whose validity ran out; return when the next one runs out."""
        upcoming: list[float] = []
        for level in list(hold.levels):
            state = level.state
            if not level.auto_renew or state.ended or state.lost or state.valid_until is None:
                continue
            if state.valid_until <= now:
                mark_lost(level, "its renewal did not come back before its validity ran out")
            else:
                upcoming.append(state.valid_until)
        return min(upcoming, default=None)

    def _forget(self, hold: Hold) -> None:
        """The hold is over: no new level, no renewal; whoever waits on it goes on."""
        forgotten = holds.remove(hold, self._reentrancy_domain())
        if forgotten and hold.watched:
            self._watchdog.unwatch(hold)
        hold.finish()

    def _lose(self, hold: Hold, reason: str) -> None:
        """The grant is gone: every live level is lost and told so, once."""
        self._forget(hold)
        for level in list(hold.levels):
            mark_lost(level, reason)

    def _holds(self) -> list[Hold]:
        """The holds this provider granted that are still live."""
        return holds.of(self)

    # -- shared plumbing --------------------------------------------------------------

    def _secret(self) -> str | None:
        """A password that must never appear in an error message."""
        return None

    def _secrets(self) -> list[str]:
        """Every such password (a topology may hold several)."""
        secret = self._secret()
        return [secret] if secret else []

    def _classify(self, error: BaseException) -> type[BackendUnavailable] | type[BackendError]:
        """Which of our errors a driver's error becomes. A TLS refusal (another CA,
        another host name, a certificate refused) is a misconfiguration, whatever error
        the driver wraps it in."""
        if isinstance(error, self.denied_errors) or tls_refused(error):
            return AccessDenied
        if isinstance(error, self.unavailable_errors):
            return BackendUnavailable
        return BackendError

    def _error(
        self,
        error: BaseException,
        *,
        ambiguous: bool = False,
        key: str | None = None,
        token: str | None = None,
    ) -> LockError:
        """The one place a driver's error becomes ours: it names the backend and its
        address, never a password."""
        kind = self._classify(error)
        if kind is BackendUnavailable:
            return self._unavailable(error, ambiguous=ambiguous, key=key, token=token)
        verb = "refused access" if kind is AccessDenied else "answered with an error"
        return kind(f"{self._where()} {verb}: {self._detail(error)}", backend=self.name,
                    address=self.address)  # fmt: skip

    def _unavailable(
        self,
        error: BaseException,
        *,
        ambiguous: bool = False,
        key: str | None = None,
        token: str | None = None,
    ) -> BackendUnavailable:
        """`error` as a `BackendUnavailable`, whatever its kind (also for a backend that
        knows the server cannot serve, e.g. a session that is not connected)."""
        return BackendUnavailable(
            f"{self._where()} is unavailable: {self._detail(error)}", backend=self.name,
            address=self.address, ambiguous=ambiguous, key=key, token=token,
        )  # fmt: skip

    def _refused_tls(self, address: str, error: ssl.SSLError) -> AccessDenied:
        """A TLS refusal our own handshake found (`locks.tls.handshake_refusal`) where
        the driver reported only that it reached no server."""
        denied = AccessDenied(
            f"{self._where()} refused TLS at {address}: {self._detail(error)} "
            "(check the tls_* settings and the host names)",
            backend=self.name, address=self.address,
        )  # fmt: skip
        denied.__cause__ = error
        return denied

    def _where(self) -> str:
        return f"{self.type_name} backend {self.name!r} at {self.address}"

    def _detail(self, error: BaseException) -> str:
        """The driver's error in one line, without the password."""
        cause = getattr(error, "orig", None) or error  # SQLAlchemy wraps the driver's error
        lines = str(cause).splitlines()
        detail = lines[0] if lines else ""
        for secret in self._secrets():
            detail = detail.replace(secret, "***")
        if len(detail) > _DETAIL_MAX:  # e.g. redis-py's MasterNotFoundError lists every sentinel
            detail = detail[:_DETAIL_MAX] + "..."
        return f"{type(cause).__name__}: {detail}"

    @contextmanager
    def _translated(
        self, *, ambiguous: bool = False, key: str | None = None, token: str | None = None
    ) -> Iterator[None]:
        try:
            yield
        except LockError:
            raise
        except (*self.driver_errors, *self.unavailable_errors, *self.denied_errors) as error:
            raise self._error(error, ambiguous=ambiguous, key=key, token=token) from error

    def _reporting(self, key: str, call: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run a call that may reach the server: a driver error that escaped the
        backend's own translation is translated here, and errors are reported."""
        try:
            return call(*args, **kwargs)
        except (BackendUnavailable, BackendError) as exc:
            emit(EventKind.BACKEND_ERROR, self.name, key, error=exc)
            raise
        except LockError:
            raise
        except (*self.driver_errors, *self.unavailable_errors, *self.denied_errors) as error:
            translated = self._error(error)
            emit(EventKind.BACKEND_ERROR, self.name, key, error=translated)
            raise translated from error
