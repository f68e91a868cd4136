"""The half of a provider that does no I/O, shared by the threaded face (`locks.base`)
and the asyncio face (`locks.aio.base`): argument checks, holds and their levels
(`locks.holds`), what a release, an extend or a renewal decides before and after its
server call, events, and how a driver's error becomes ours. Each face supplies only the
calls that reach a server, and how they wait."""

from __future__ import annotations

import dataclasses
import ssl
import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import ClassVar, NamedTuple, ParamSpec, Protocol, TypeVar

from locks.errors import AccessDenied, BackendError, BackendUnavailable, LockError, LockNotOwned
from locks.events import EventKind, emit, emit_broken
from locks.holds import Hold, holds
from locks.names import check_acquire, check_name, check_seconds, check_ttl
from locks.owner import in_this_process, new_token, who
from locks.provider import (
    Capabilities,
    Holder,
    Lease,
    LeaseState,
    LostCallback,
    check_mine,
    hold_of,
)
from locks.tls import tls_refused
from locks.watchdog import mark_lost

# why a lease is lost when a call finds its grant no longer on the server
GONE = "the backend no longer holds it"

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


class Attempt(NamedTuple):
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
class Renewal:
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
    def look(hold: Hold) -> Renewal:
        """What the renewal must do, decided under the hold's lock."""
        now = time.monotonic()
        levels = hold.levels
        renewal = Renewal(hold, now, levels)
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
            self.ended = GONE

    def settle(self) -> None:
        """Still under the lock: a hold with no next renewal is no longer watched."""
        if self.finished or self.due is None:
            self.hold.watched = False


class WatchesHolds(Protocol):
    """What a keeper asks of its face's watchdog (a thread, or a task on the loop)."""

    def watch(self, item: Hold, due: float) -> None: ...

    def unwatch(self, item: Hold) -> None: ...


class Claim(NamedTuple):
    """A release, claimed: what its server call (if any) is about."""

    hold: Hold
    retry: bool  # a retry of a release whose server call failed
    expired: bool  # the lease had run out before it was released
    send: bool  # the grant goes: its server call must be made (else other levels live on)


class LeaseKeeper:
    """The I/O-free half of every provider (see the module docstring)."""

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
    _watchdog: WatchesHolds

    def __init__(self, name: str, watchdog_ttl: float = 30.0) -> None:
        self.name = check_name(name, "name")
        self.watchdog_ttl = check_seconds(watchdog_ttl, "watchdog_ttl")
        self._closed = False
        self._domain_key: Hashable | None = None  # `_domain()`, once the backend is set up

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"

    def _domain(self) -> Hashable:
        """What makes two provider objects one lock domain (the same server and
        namespace): an owner that holds a key through one re-enters it through the
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
        (ZooKeeper: the session it was granted in expired meanwhile). No I/O."""

    def _check_hold(self, hold: Hold) -> None:
        """Raise `BackendUnavailable` if a new level of `hold` cannot be vouched for now
        (ZooKeeper: the session is in doubt). No I/O."""

    # -- before and after the server calls -------------------------------------------

    def _attempt(
        self,
        key: str,
        ttl: float | None,
        wait: float | None,
        on_lost: LostCallback | None,
        owner: str,
    ) -> Attempt:
        """An acquire's arguments checked, before any I/O."""
        key, fixed_ttl, wait = check_acquire(key, ttl, wait, on_lost)
        if self._closed:
            raise BackendUnavailable(
                f"{self.type_name} backend {self.name!r} is closed", backend=self.name,
                address=self.address,
            )  # fmt: skip
        lease_ttl = self.watchdog_ttl if fixed_ttl is None else fixed_ttl
        auto = fixed_ttl is None and self.capabilities.expires
        return Attempt(key, lease_ttl, wait, auto, on_lost, owner, time.monotonic(),
                       self._reentrancy_domain())  # fmt: skip

    def _granted(self, attempt: Attempt, grant: Grant | None) -> Lease | None:
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

    def _nested(self, key: str, nested: Lease) -> Lease:
        """A new level of a hold, vouched for by the provider that made its grant."""
        owner = nested.state.hold
        assert isinstance(owner, Hold)
        owner.provider._reporting(key, owner.provider._hand_out, nested)
        emit(EventKind.ACQUIRED, self.name, key, nested, duration=0.0)
        return nested

    def _nest_plan(
        self, hold: Hold, ttl: float, auto: bool, now: float
    ) -> tuple[float | None, float | None] | None:
        """Under `hold.lock`: None if the hold can take no new level (the caller then
        asks the server for a grant of its own); else the new level's validity and the
        ttl to extend the grant to first (None: no extend)."""
        owner = hold.provider
        if hold.ending or hold.over:
            return None
        if not hold.live(now):  # every level ended or ran out: the grant is spent
            owner._forget(hold)
            return None
        owner._check_hold(hold)
        if not owner.capabilities.expires:
            return hold.limit, None
        want = now + ttl if hold.limit is None else min(now + ttl, hold.limit)
        if auto and hold.watched and hold.valid_until is not None:
            return min(want, hold.valid_until), None  # renewed with the hold
        if hold.valid_until is None or want > hold.valid_until:
            return want, hold.target(now, ttl)
        return want, None

    def _stack_level(
        self, hold: Hold, ttl: float, auto: bool, on_lost: LostCallback | None, *,
        now: float, valid_until: float | None,
    ) -> tuple[Lease, bool]:  # fmt: skip
        """Under `hold.lock`: the new level, and whether the watchdog must now watch
        the hold."""
        anchor = hold.anchor
        state = LeaseState(valid_until, on_lost, hold)
        lease = Lease(anchor.key, self.name, anchor.owner, new_token(), anchor.fence,
                      ttl, len(hold.live(now)) + 1, now, auto, state)  # fmt: skip
        hold.add(lease)
        watch = auto and not hold.watched
        hold.watched = hold.watched or watch
        return lease, watch

    def _claim_release(self, lease: Lease) -> Claim:
        """Check and claim a release before any I/O: `LockNotOwned` if the lease has
        ended. The last live level's release sends the grant's (even if this lease
        itself ran out: an outer level's longer expiry may still hold the key on the
        server, for nobody), named by the grant's own token: it touches no other grant."""
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
        if retry:
            return Claim(hold, retry, expired, True)
        with hold.lock:
            hold.drop(state)
            last = not hold.ending and not hold.live(now)
            hold.ending = hold.ending or last
        return Claim(hold, retry, expired, last)

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

    def _extend_claim(self, lease: Lease, ttl: float | None) -> tuple[float, Hold]:
        """An extend's arguments checked before any I/O: the ttl it asks for, the hold."""
        new_ttl = check_ttl(ttl)
        check_mine(lease, self.name)
        return (lease.ttl if new_ttl is None else new_ttl), hold_of(lease, Hold)

    def _extend_target(self, lease: Lease, hold: Hold, ttl: float) -> float:
        """Under `hold.lock`: the ttl to send so the grant covers `ttl` more seconds of
        `lease` and every other live level; `LockNotOwned` if the lease has ended."""
        if hold.ending or not lease.state.live(time.monotonic()):
            raise LockNotOwned(
                f"{lease.key!r} on {self.name!r}: this lease has ended; "
                "nothing was sent to the server"
            )
        if not self.capabilities.expires:
            return ttl
        return hold.target(time.monotonic(), ttl, besides=lease.state)

    def _extended(self, lease: Lease, hold: Hold, ttl: float, held: bool, now: float) -> Lease:
        """An extend's outcome (`held`: the server extended the grant, sent at `now`):
        the lease to use from now on, or `LockNotOwned` with the hold lost."""
        if not held:
            hold.provider._lose(hold, GONE)
            raise LockNotOwned(f"{lease.key!r} on {self.name!r} is no longer held by this lease")
        emit(EventKind.EXTENDED, self.name, lease.key, lease)
        if ttl == lease.ttl:
            return lease
        copy = lease.copy(ttl)
        with hold.lock:
            hold.copied(copy)
        return copy

    def _was_held(self, lease: Lease, hold: Hold, held: bool) -> bool:
        """`is_held`'s answer: a grant gone while the lease was valid here is lost, and
        told so first."""
        if not held and lease.state.live(time.monotonic()):
            hold.provider._lose(hold, GONE)
        return held

    def _checked_hold(self, lease: Lease) -> Hold | None:
        """`is_held` before any I/O: the hold to ask about, or None if the answer is
        no without asking (ended, lost, run out, or another process's)."""
        from locks.provider import check_lease  # noqa: PLC0415 - one of two uses

        check_lease(lease, self.name)
        hold = lease.state.hold
        live = lease.state.live(time.monotonic())
        if not in_this_process(lease.owner) or not live or not isinstance(hold, Hold):
            return None
        return hold

    def _unknown_lease(self, key: str, owner: str, token: str) -> Lease:
        """A lease made from what an ambiguous acquire left (`release_token`)."""
        return Lease(key, self.name, owner, token, 0, self.watchdog_ttl, 1, 0.0, False,
                     LeaseState(None))  # fmt: skip

    def _with_depth(self, found: Holder | None) -> Holder | None:
        """`holder`'s answer, with the levels counted in this process where the server
        does not count them."""
        domain = self._reentrancy_domain()
        if found is not None and found.depth is None and domain is not None:
            hold = holds.find(domain, found.owner, found.key)  # levels are counted here
            if hold is not None:
                found = dataclasses.replace(found, depth=len(hold.live(time.monotonic())))
        return found

    def _broke(self, key: str, broken: Holder | None, by: str | None) -> Holder | None:
        """After a break: a holder in this process hears of it now; the event names who."""
        if broken is None:
            return None
        by = by or who()
        for hold in self._holds():
            if hold.key == key and hold.anchor.fence == broken.fence:
                self._lose(hold, f"it was broken by {by}")
        emit_broken(self.name, key, by, broken)
        return broken

    def bound(self, lease: Lease, seconds: float) -> None:
        """End `lease`'s hold (every level) `seconds` after it was granted, however it was
        asked for: no level stays valid past then, renewals stop there, and its grant is
        released. A safe-mode chain bounds the grants of its lower tiers this way. No I/O:
        the hold's watchdog visits it at its bound."""
        seconds = check_seconds(seconds, "seconds")
        hold = hold_of(lease, Hold)
        with hold.lock:
            limit = lease.acquired_at + seconds
            hold.limit = limit if hold.limit is None else min(hold.limit, limit)
            for level in hold.levels:
                until = level.state.valid_until
                level.state.valid_until = hold.limit if until is None else min(until, hold.limit)
            watch = not hold.watched and not hold.ending
            hold.watched = hold.watched or watch
        if watch:  # a hold that is not renewed is visited once, at its bound
            hold.provider._watchdog.watch(hold, hold.limit)

    def _renewed(self, renewal: Renewal) -> tuple[float | None, bool]:
        """A renewal's outcome, acted on outside the hold's lock: the next renewal (None:
        none), and whether the grant must now be released on the server (a bounded hold
        that reached its bound, lost either way)."""
        hold = renewal.hold
        if renewal.finished:  # released or lost meanwhile: nothing left to renew
            return None, False
        if renewal.ended is None and not renewal.levels:
            # every holder dropped its lease unreleased: the server lets it expire, and
            # nobody here can use it again
            self._forget(hold)
            return None, False
        if renewal.ended is not None:
            self._lose(hold, renewal.ended)
            return None, hold.limit is not None
        for level in renewal.overdue:
            mark_lost(level, "its validity ran out before it could be renewed")
        return renewal.due, False

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
        except Exception as error:
            reported = self._reported(key, error)
            if reported is error:
                raise
            raise reported from error

    def _reported(self, key: str, error: Exception) -> Exception:
        """What a failed server call raises (either face, `from error` where it is not
        `error`): ours as they are, a driver's translated, each reported as an event."""
        if isinstance(error, (BackendUnavailable, BackendError)):
            emit(EventKind.BACKEND_ERROR, self.name, key, error=error)
        elif not isinstance(error, LockError) and isinstance(
            error, (*self.driver_errors, *self.unavailable_errors, *self.denied_errors)
        ):
            translated = self._error(error)
            emit(EventKind.BACKEND_ERROR, self.name, key, error=translated)
            return translated
        return error
