"""Quorum: one lock over independent members — RedLock (seed 004's `RedissonRedLock`)
generalised to any of our providers: five Redis masters, or Redis + ZooKeeper + a
database. It composes providers as the chain does and imports no backend.

Acquire asks every member at once, each for a fixed lease of the quorum's ttl on behalf
of the caller. The grant stands when at least `quorum` members granted and its validity
is still ahead: the time until which `quorum` of them hold it (the quorum-th latest
member expiry, each counted from when its own request was sent, so a slow round is
charged), less the drift allowance. Otherwise every member's grant is undone. Members
say "no" for contention and "unavailable" apart: with more than n - quorum unavailable
no round can win, and the acquire raises `BackendUnavailable` so a chain moves past.

Why it excludes: two leases valid at once would need two sets of `quorum` members, each
holding the key for a different owner at the same instant; with quorum > n/2 the sets
share a member, which grants one owner at a time. This rests on members keeping their
grants until they expire (a member restarted empty forgets them; docs/quorum.md says
how many may) and on every member's clock running at our rate within `drift`.

Contention: after a first round that asks everyone without waiting, a waiter waits at
one member, the gate (the first in an order every client derives from the key), and
only then asks the rest, so waiters queue instead of each grabbing a different member;
a hand-off costs the gate's wake-up (pub/sub on Redis), not a poll. A split vote (some
members, not enough) is undone and pauses for a random time below `retry`.

Fences (docs/quorum.md, "Fences"): the quorum's fence F is the highest its granting
members returned. Before the lease is returned, F becomes the fence floor of the key on
enough members (`raise_fence`) that every later majority includes one of them: that
member's next fence exceeds F, so the next quorum fence does too. ZooKeeper's czxid and
a database row's fence cannot be raised; a quorum whose members could leave no such
set while n - quorum of them are down is not fenced (its fences are 0).

One logic, two faces: `QuorumLogic` decides as steps (`locks.steps`), asking members
at once with `Each`; `locks.quorum.Quorum` drives them on threads, `locks.aio.Quorum`
on the loop.
"""

from __future__ import annotations

import inspect
import random
import threading
import time
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from locks.errors import BackendUnavailable, LockError, LockNotOwned
from locks.events import EventKind, emit, emit_broken
from locks.holds import Copies
from locks.names import check_acquire, check_name, check_seconds, check_ttl
from locks.owner import in_this_process, new_token, who
from locks.pending import Pending, PendingReleases
from locks.provider import (
    Capabilities,
    Holder,
    Lease,
    LeaseState,
    LostCallback,
    check_lease,
    check_mine,
    hold_of,
)
from locks.steps import Call, Each, Sleep, Steps, call
from locks.watchdog import mark_lost


@runtime_checkable
class RaisesFence(Protocol):
    """A member whose fence counter can be raised: every later grant of `key` on it
    carries a fence above `floor`."""

    def raise_fence(self, key: str, floor: int) -> Any: ...


def majority(members: int) -> int:
    return members // 2 + 1


def fenced_by_raising(members: Sequence[Any], quorum: int) -> bool:
    """Whether fences can be kept through any n - quorum members down: the raisable
    members still up must be able to hold the floor on n - quorum + 1 of them, so that
    every later majority includes one."""
    n = len(members)
    raisable = sum(bool(m.capabilities.fenced) and isinstance(m, RaisesFence) for m in members)
    return raisable - (n - quorum) >= n - quorum + 1


class _Guard(Protocol):
    """A grant's lock: `threading.Lock` on threads, `asyncio.Lock` on a loop (acquired
    as a step, so the asyncio face awaits it)."""

    def acquire(self) -> Any: ...

    def release(self) -> None: ...


@dataclass(eq=False)
class _Grant:
    """The quorum's record of one grant: the member leases it stands on. It is the
    lease's `state.hold`, and what the quorum's watchdog renews."""

    quorum: Any  # the QuorumLogic face that made it
    key: str
    owner: str
    ttl: float  # the members' lease length
    leases: dict[str, Lease]  # member name -> its lease
    lock: _Guard  # held across a release, an extension or a renewal of its members
    made: Copies | None = None  # the quorum's lease, once made; see `locks.holds`
    failures: dict[str, LockError] = field(default_factory=dict)  # the last renewal's
    limit: float | None = None  # no validity past this (a safe-mode chain's bound)

    @property
    def provider(self) -> Any:
        return self.quorum

    @property
    def lease(self) -> Lease | None:
        """The quorum's lease, while its holder keeps it."""
        return None if self.made is None else self.made.get()

    def renew(self) -> float | None:
        """The threaded watchdog's call."""
        return self.quorum._renew(self)  # type: ignore[no-any-return]

    def expire(self, now: float) -> float | None:
        lease = self.lease
        if lease is None or lease.state.lost or lease.state.ended:
            return None
        until = lease.state.valid_until
        if until is not None and until <= now:
            mark_lost(lease, "its renewal did not come back before its validity ran out")
            return None
        return until


@dataclass(frozen=True)
class _Request:
    """One acquire, as its rounds ask for it."""

    key: str
    owner: str
    ttl: float  # the members' lease length
    auto: bool  # renewed by the quorum's watchdog
    on_lost: LostCallback | None
    deadline: float | None
    started: float
    # member grants this acquire holds and has neither undone nor handed to a lease:
    # what a cancelled asyncio acquire leaves to undo
    held: dict[str, Lease] = field(default_factory=dict)

    def remaining(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())


@dataclass
class _Votes:
    """What one round got from the members."""

    granted: dict[str, Lease] = field(default_factory=dict)
    contended: list[str] = field(default_factory=list)  # answered "held by another owner"
    failed: dict[str, LockError] = field(default_factory=dict)  # unavailable or erring


class QuorumLogic(ABC):
    """Arguments, votes, validity, fences, renewal and loss, written once as steps; a
    face drives them and keeps its own watchdog, pending releases and grant locks."""

    type_name = "quorum"
    _async_members: ClassVar[bool]  # the face's members are asyncio providers

    def __init__(
        self,
        members: Sequence[Any],
        *,
        name: str = "quorum",
        quorum: int | None = None,
        drift: float = 0.01,
        retry: float = 0.1,
        watchdog_ttl: float = 30.0,
    ) -> None:
        """`drift`: the clock-drift allowance, a fraction of the ttl (plus 2 ms) taken
        off every validity. `retry`: the longest random pause after a split vote, and
        how long the other members are waited for once the gate member is held."""
        self.name = check_name(name, "name")
        members = list(members)
        if not members:
            raise ValueError("members must name at least one provider")
        names = [member.name for member in members]
        if len(set(names)) != len(names):
            raise ValueError(f"member names must be unique, got {names}")
        for member in members:
            self._check_member(member)
        n = len(members)
        if quorum is None:
            quorum = majority(n)
        if isinstance(quorum, bool) or not isinstance(quorum, int):
            raise TypeError(f"quorum must be an int, not {type(quorum).__name__}")
        if not majority(n) <= quorum <= n:
            raise ValueError(
                f"quorum must be from {majority(n)} (a majority of {n} members) to {n}, "
                f"got {quorum}: two smaller quorums could grant one key to two owners"
            )
        if isinstance(drift, bool) or not isinstance(drift, (int, float)) or not 0 <= drift < 0.5:
            raise ValueError(f"drift must be a fraction of the ttl from 0 to 0.5, got {drift!r}")
        self.retry = check_seconds(retry, "retry")
        self.watchdog_ttl = check_seconds(watchdog_ttl, "watchdog_ttl")
        self.drift = float(drift)
        self.quorum = quorum
        self.members = {member.name: member for member in members}
        self.address = ",".join(getattr(m, "address", "") or m.name for m in members)
        every = [member.capabilities for member in members]
        non_expiring = sum(not c.expires for c in every)
        self.capabilities = Capabilities(
            reentrant=all(c.reentrant for c in every),
            expires=non_expiring < quorum,
            renewable=non_expiring < quorum and all(c.renewable or not c.expires for c in every),
            fair=False,
            fenced=all(c.fenced for c in every) and fenced_by_raising(members, quorum),
            cross_process=all(c.cross_process for c in every),
            cross_host=True,
        )
        self._held: dict[tuple[str, str], list[_Grant]] = {}  # (owner, key) -> its live grants
        self._lock = threading.Lock()
        self._closed = False
        self._set_up()

    def __repr__(self) -> str:
        face = type(self).__name__
        return f"{face}({list(self.members)}, name={self.name!r}, quorum={self.quorum})"

    def _check_member(self, member: Any) -> None:
        if inspect.iscoroutinefunction(getattr(member, "acquire", None)) != self._async_members:
            face = "asyncio" if self._async_members else "threaded"
            raise TypeError(
                f"member {member.name!r} is not a {face} provider: a quorum's members are "
                f"of its own face ({'locks.aio.Quorum' if self._async_members else 'locks.Quorum'})"
            )
        if not member.capabilities.cross_host:
            raise ValueError(
                f"member {member.name!r} is not shared across hosts: a quorum of "
                "in-process locks excludes nobody on another host"
            )

    # -- what a face provides ---------------------------------------------------------------

    _pending: PendingReleases
    _watchdog: Any  # `Watchdog` or `TaskWatchdog`: watch(grant, due), unwatch(grant)

    def after_fork_in_child(self) -> None:
        """The parent's grants are the parent's (a face registers this with
        `start_afresh_when_forked` and adds its own parts)."""
        self._held = {}
        self._lock = threading.Lock()

    @abstractmethod
    def _set_up(self) -> None:
        """The face's own parts, once the arguments are checked: its watchdog
        (`_watchdog`), its queue of pending releases (`_pending`), what runs its calls."""

    @abstractmethod
    def _new_guard(self) -> _Guard:
        """A new grant's lock."""

    # -- asking members at once -------------------------------------------------------------

    def _ask(
        self,
        names: Iterable[str],
        method: str,
        args: Callable[[str], tuple[Any, ...]],
        owner: str,
        *,
        kwargs: dict[str, Any] | None = None,
        heard: Callable[[str, Any], None] | None = None,
    ) -> Steps[dict[str, Any]]:
        """`method(*args(name), **kwargs)` on each named member at once, as `owner`: what
        each returned, or raised. A member that answered has what waits for it sent."""

        def answered(name: str, outcome: Any) -> None:
            self._pending.answered(self.members[name])
            if heard is not None:
                heard(name, outcome)

        calls = {name: Call(self.members[name], method, args(name), kwargs) for name in names}
        outcomes: dict[str, Any] = yield Each(calls, owner, answered)
        return outcomes

    @staticmethod
    def _raise_unexpected(outcomes: dict[str, Any]) -> None:
        """A member raised something that is not a lock error (a bug, a bad argument):
        no vote can stand on it."""
        for outcome in outcomes.values():
            if isinstance(outcome, BaseException) and not isinstance(outcome, LockError):
                raise outcome

    # -- acquire ---------------------------------------------------------------------------

    def _request(
        self, key: str, ttl: float | None, wait: float | None, on_lost: LostCallback | None,
        owner: str,
    ) -> _Request:  # fmt: skip
        """The arguments checked (before any I/O), as the rounds ask for them."""
        key, fixed_ttl, wait = check_acquire(key, ttl, wait, on_lost)
        if self._closed:
            raise BackendUnavailable(f"quorum {self.name!r} is closed", backend=self.name,
                                     address=self.address)  # fmt: skip
        lease_ttl = self.watchdog_ttl if fixed_ttl is None else fixed_ttl
        auto = fixed_ttl is None and self.capabilities.expires
        started = time.monotonic()
        deadline = None if wait is None else started + wait
        return _Request(key, owner, lease_ttl, auto, on_lost, deadline, started)

    def _acquiring(self, request: _Request) -> Steps[Lease | None]:
        key, started, deadline = request.key, request.started, request.deadline
        if not self.capabilities.reentrant and self._holds(request.owner, key):
            # it would wait for itself: for ever, or until the deadline
            if deadline is not None:
                yield Sleep(max(0.0, deadline - time.monotonic()))
                emit(EventKind.TIMED_OUT, self.name, key, duration=time.monotonic() - started)
            return None
        votes = yield from self._vote(request, list(self.members), 0.0)  # all at once, no wait
        while True:
            lease = yield from self._stand(request, votes)
            if lease is not None:
                emit(EventKind.ACQUIRED, self.name, key, lease, duration=time.monotonic() - started)
                return lease
            if len(votes.failed) > len(self.members) - self.quorum:
                raise self._unavailable(votes.failed)
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                emit(EventKind.TIMED_OUT, self.name, key, duration=now - started)
                return None
            if votes.granted:  # a split vote: step aside for a random while
                pause = random.uniform(0, self.retry)
                yield Sleep(pause if deadline is None else min(pause, deadline - now))
            votes = yield from self._gated_vote(request, votes.failed)

    def _order(self, key: str) -> list[str]:
        """The members in the order every client tries them as the gate for `key`."""
        names = list(self.members)
        start = zlib.crc32(key.encode()) % len(names)
        return names[start:] + names[:start]

    def _gated_vote(self, request: _Request, down: dict[str, LockError]) -> Steps[_Votes]:
        """A round for a contended key: first wait for one member, the gate (the first
        in the key's order that answered last time), then ask the rest. Waiters queue at
        the gate, so one at a time asks the rest and votes do not split among them."""
        gate = next((name for name in self._order(request.key) if name not in down), None)
        if gate is None:
            return _Votes(failed=dict(down))
        left = request.remaining()
        wait = request.ttl if left is None else left
        try:
            lease = yield from call(self.members[gate], "acquire", request.key,
                                    ttl=request.ttl, wait=wait)  # fmt: skip
        except LockError as error:  # unavailable or erring: counted, as in any round
            return _Votes(failed={**down, gate: error})
        if lease is None:
            return _Votes(contended=[gate])
        request.held[gate] = lease
        rest = [name for name in self.members if name != gate]
        # the holder's release reaches the rest at about the time it reached the gate
        votes = yield from self._vote(request, rest, min(self.retry, request.ttl / 3))
        votes.granted[gate] = lease
        return votes

    def _vote(self, request: _Request, names: list[str], wait: float) -> Steps[_Votes]:
        """Ask the named members at once, each waiting up to `wait` for the key."""
        key, owner = request.key, request.owner

        def heard(name: str, outcome: Any) -> None:
            if isinstance(outcome, Lease):
                request.held[name] = outcome

        asked = {"ttl": request.ttl, "wait": wait}
        outcomes = yield from self._ask(names, "acquire", lambda _: (key,), owner,
                                        kwargs=asked, heard=heard)  # fmt: skip
        votes = _Votes()
        for name, outcome in outcomes.items():
            if isinstance(outcome, Lease):
                votes.granted[name] = outcome
            elif outcome is None:
                votes.contended.append(name)
            elif isinstance(outcome, LockError):
                votes.failed[name] = outcome
                if isinstance(outcome, BackendUnavailable) and outcome.ambiguous and outcome.token:
                    # it may have granted: release that token once the member answers
                    pending = Pending(key=key, owner=owner, token=outcome.token)
                    self._pending.queue(name, pending)
        try:
            self._raise_unexpected(outcomes)
        except BaseException:
            yield from self._undo_held(request)
            raise
        return votes

    def _undo_held(self, request: _Request) -> Steps[None]:
        """Undo the member grants this acquire holds."""
        leases = dict(request.held)
        yield from self._undo(leases, request.owner)
        for name in leases:
            request.held.pop(name, None)

    def _stand(self, request: _Request, votes: _Votes) -> Steps[Lease | None]:
        """The quorum's lease if the vote carries (its fence floor raised), else None
        with every member grant undone."""
        key, owner, ttl = request.key, request.owner, request.ttl
        granted = votes.granted
        valid_until = self._validity(granted.values(), ttl)
        now = time.monotonic()
        if len(granted) < self.quorum or (valid_until is not None and valid_until <= now):
            yield from self._undo_held(request)
            return None
        fence = 0
        if self.capabilities.fenced:
            fence = max(lease.fence for lease in granted.values())
            raised = yield from self._raise_floor(key, fence, votes, owner)
            if not raised or (valid_until is not None and valid_until <= time.monotonic()):
                yield from self._undo_held(request)
                return None
        grant = _Grant(self, key, owner, ttl, dict(granted), self._new_guard())
        request.held.clear()  # the grant's now
        with self._lock:
            self._held.setdefault((owner, key), []).append(grant)
        state = LeaseState(valid_until, request.on_lost, grant)
        sent_at = min(lease.acquired_at for lease in granted.values())
        depth = max(lease.depth for lease in granted.values())  # the members count levels
        lease = Lease(key, self.name, owner, new_token(), fence, ttl, depth, sent_at,
                      request.auto, state)  # fmt: skip
        grant.made = Copies(lease)
        if request.auto:
            self._watchdog.watch(grant, sent_at + ttl / 3)
        return lease

    def _validity(self, leases: Iterable[Lease], ttl: float) -> float | None:
        """Until when `quorum` of these member leases hold, less the drift allowance
        (None: they do not expire)."""
        expiries = sorted((lease.valid_until or float("inf") for lease in leases), reverse=True)
        if len(expiries) < self.quorum:
            return -float("inf")
        until: float = expiries[self.quorum - 1]
        if until == float("inf"):
            return None
        return until - self.margin(ttl)

    def margin(self, ttl: float) -> float:
        """What every validity of a lease of `ttl` is cut by: the clock-drift allowance
        (members expire by their own clocks, we count by ours)."""
        return ttl * self.drift + 0.002

    def _raise_floor(self, key: str, fence: int, votes: _Votes, owner: str) -> Steps[bool]:
        """Make `fence` the floor of `key` on enough members that every later majority
        includes one (n - quorum + 1): the granting members already at it count, the
        rest that answered are raised. False if too few could be."""
        at_floor = sum(lease.fence == fence for lease in votes.granted.values())
        behind = [name for name, lease in votes.granted.items() if lease.fence < fence]
        behind += votes.contended
        behind = [name for name in behind if isinstance(self.members[name], RaisesFence)]
        needed = len(self.members) - self.quorum + 1
        if at_floor >= needed and not behind:
            return True
        outcomes = yield from self._ask(behind, "raise_fence", lambda _: (key, fence), owner)
        self._raise_unexpected(outcomes)
        for name, outcome in outcomes.items():
            if isinstance(outcome, LockError):
                votes.failed[name] = outcome
        raised = sum(outcome is None for outcome in outcomes.values())
        return at_floor + raised >= needed

    def _undo(self, leases: dict[str, Lease], owner: str) -> Steps[dict[str, Any]]:
        """Release member grants quietly; a member that does not answer gets it queued.
        Each member's outcome: None (released), or the error it raised."""
        if not leases:
            return {}
        outcomes = yield from self._ask(list(leases), "release", lambda n: (leases[n],), owner)
        for name, outcome in outcomes.items():
            if isinstance(outcome, BackendUnavailable):
                self._pending.queue(name, Pending(lease=leases[name]))
        return outcomes

    def _unavailable(self, failed: dict[str, LockError]) -> BackendUnavailable:
        detail = "; ".join(f"{name}: {error}" for name, error in failed.items())
        return BackendUnavailable(
            f"quorum {self.name!r} cannot reach {self.quorum} of its {len(self.members)} "
            f"members: {len(failed)} failed ({detail})",
            backend=self.name, address=self.address,
        )  # fmt: skip

    # -- release, extend, renewal -----------------------------------------------------------

    def _grant_of(self, lease: Lease) -> _Grant:
        check_mine(lease, self.name)
        return hold_of(lease, _Grant)

    def _forget(self, grant: _Grant) -> None:
        self._watchdog.unwatch(grant)
        with self._lock:
            entry = (grant.owner, grant.key)
            grants = self._held.get(entry, [])
            if grant not in grants:  # forgotten already
                return
            left = [other for other in grants if other is not grant]
            if left:
                self._held[entry] = left
            else:
                self._held.pop(entry, None)

    def _holds(self, owner: str, key: str) -> bool:
        """Whether `owner` holds a live lease on `key` from this quorum."""
        now = time.monotonic()
        grants = self._held.get((owner, key), ())
        return any(g.lease is not None and g.lease.state.live(now) for g in grants)

    def _releasing(self, lease: Lease) -> Steps[None]:
        """Release on every member; one that does not answer gets it queued, so this
        raises only `LockNotOwned` for a lease that had ended or expired."""
        grant = self._grant_of(lease)
        if grant.quorum is not self:  # granted through another object of this quorum
            yield from call(grant.quorum, "release", lease)
            return
        try:
            lease.state.begin_release()
        except LookupError as ended:
            raise LockNotOwned(
                f"{lease.key!r} on {self.name!r}: this lease has ended ({ended}); "
                "nothing was sent to its members"
            ) from None
        expired = lease.state.expired(time.monotonic())
        self._forget(grant)
        yield from call(grant.lock, "acquire")
        try:
            outcomes = yield from self._undo(grant.leases, grant.owner)
        finally:
            grant.lock.release()
        if expired:
            raise LockNotOwned(
                f"{lease.key!r} on {self.name!r}: this lease had expired before its release "
                "(what its members still held, if anything, was released)"
            )
        # members that did not answer may have held it; those that refused did not
        still = sum(not isinstance(outcome, LockNotOwned) for outcome in outcomes.values())
        if still < self.quorum:  # it was lost before its release: told as a renewal would
            mark_lost(lease, f"only {still} of its members still held it at its release",
                      releasing=True)  # fmt: skip
            raise LockNotOwned(
                f"{lease.key!r} on {self.name!r} was no longer held by this lease (it was "
                "lost before its release); what its members still held was released"
            )
        emit(EventKind.RELEASED, self.name, lease.key, lease,
             duration=time.monotonic() - lease.acquired_at)  # fmt: skip

    def _extending(self, lease: Lease, ttl: float | None) -> Steps[Lease]:
        new_ttl = check_ttl(ttl)
        grant = self._grant_of(lease)
        if grant.quorum is not self:
            extended: Lease = yield from call(grant.quorum, "extend", lease, new_ttl)
            return extended
        new_ttl = lease.ttl if new_ttl is None else new_ttl
        if not lease.state.live(time.monotonic()):
            raise LockNotOwned(
                f"{lease.key!r} on {self.name!r}: this lease has ended; nothing was sent"
            )
        outcome = yield from self._prolong(grant, new_ttl)
        if outcome == "lost":
            raise LockNotOwned(f"{lease.key!r} on {self.name!r} is no longer held by this lease")
        if outcome == "unknown":
            raise self._unavailable(grant.failures)
        emit(EventKind.EXTENDED, self.name, lease.key, lease)
        if new_ttl == lease.ttl:
            return lease
        grant.ttl = new_ttl
        copy = lease.copy(new_ttl)
        if grant.made is not None:
            grant.made.add(copy)
        return copy

    def _prolong(self, grant: _Grant, ttl: float) -> Steps[str]:
        """Extend every member lease of `grant` to `ttl` from now: "held" (the validity
        moved on), "lost" (fewer than quorum can still hold it; the loss is reported) or
        "unknown" (too many members did not answer; nothing changed)."""
        lease = grant.lease
        assert lease is not None
        yield from call(grant.lock, "acquire")
        try:
            leases = dict(grant.leases)
            outcomes = yield from self._ask(list(leases), "extend",
                                            lambda n: (leases[n], ttl), grant.owner)  # fmt: skip
            self._raise_unexpected(outcomes)
            held = {n: o for n, o in outcomes.items() if isinstance(o, Lease)}
            refused = [n for n, o in outcomes.items() if isinstance(o, LockNotOwned)]
            grant.leases.update(held)
            for name in refused:
                grant.leases.pop(name, None)
            grant.failures = {n: o for n, o in outcomes.items() if isinstance(o, LockError)}
            if len(held) >= self.quorum:
                until = self._validity(held.values(), ttl)
                if until is not None:
                    lease.state.renewed(until)
                return "held"
            if len(grant.leases) >= self.quorum:
                return "unknown"
        finally:
            grant.lock.release()
        yield from self._lose(grant, f"only {len(grant.leases)} of its members still hold it")
        return "lost"

    def _renewing(self, grant: _Grant) -> Steps[float | None]:
        """The watchdog's call: the time of the next renewal, or None to stop."""
        lease = grant.lease
        if lease is None:  # its holder dropped it unreleased: its members let it expire
            self._forget(grant)
            return None
        if lease.state.lost or lease.state.ended:
            return None
        limit = grant.limit
        if limit is not None and time.monotonic() >= limit:
            yield from self._lose(grant, "it reached the bound its chain set (safe mode)")
            return None
        if not lease.auto_renew:
            return limit  # a bounded lease is visited once more, at its bound
        outcome = yield from self._prolong(grant, grant.ttl)
        now = time.monotonic()
        if outcome == "lost":
            return None
        if outcome == "held":
            due = now + grant.ttl / 3
        else:
            until = lease.state.valid_until
            if until is not None and now >= until:
                reason = "its renewal reached fewer than quorum members in time"
                yield from self._lose(grant, reason)
                return None
            due = now + min(max(grant.ttl / 30, 0.05), 1.0)
            due = due if until is None else min(due, until)
        return due if limit is None else min(due, limit)

    def bound(self, lease: Lease, seconds: float) -> None:
        """End `lease` `seconds` after it was granted, on every member too: a safe-mode
        chain bounds the grants of its lower tiers this way. A plain call on both faces
        (members' `bound` is bookkeeping)."""
        seconds = check_seconds(seconds, "seconds")
        grant = self._grant_of(lease)
        if grant.quorum is not self:
            grant.quorum.bound(lease, seconds)
            return
        limit = lease.acquired_at + seconds
        for name, member_lease in list(grant.leases.items()):
            left = max(limit - member_lease.acquired_at, 0.001)
            self.members[name].bound(member_lease, left)
        grant.limit = limit if grant.limit is None else min(grant.limit, limit)
        until = lease.state.valid_until
        lease.state.valid_until = grant.limit if until is None else min(until, grant.limit)
        if not lease.auto_renew:
            self._watchdog.watch(grant, grant.limit)

    def _lose(self, grant: _Grant, reason: str) -> Steps[None]:
        """The grant is gone: its holder is told, and what members still hold is freed."""
        self._forget(grant)
        if grant.lease is not None:
            mark_lost(grant.lease, reason)
        leases, grant.leases = grant.leases, {}
        yield from self._undo(leases, grant.owner)

    def _checking(self, lease: Lease) -> Steps[bool]:
        """`is_held`."""
        check_lease(lease, self.name)
        grant = lease.state.hold
        live = lease.state.live(time.monotonic())
        if not in_this_process(lease.owner) or not live or not isinstance(grant, _Grant):
            return False
        if grant.quorum is not self:
            held: bool = yield from call(grant.quorum, "is_held", lease)
            return held
        leases = dict(grant.leases)
        outcomes = yield from self._ask(list(leases), "is_held", lambda n: (leases[n],),
                                        grant.owner)  # fmt: skip
        self._raise_unexpected(outcomes)
        if sum(outcome is True for outcome in outcomes.values()) >= self.quorum:
            return True
        # members that did not answer may hold it; fewer than quorum besides: lost
        maybe = sum(outcome is not False for outcome in outcomes.values())
        if maybe < self.quorum and lease.state.live(time.monotonic()):
            yield from self._lose(grant, f"only {maybe} of its members may still hold it")
        return False

    def _finding(self, key: str, owner: str) -> Steps[Holder | None]:
        """`holder`: the owner that `quorum` members name, counting those that did not
        answer as possibly naming it too (a safe-mode chain asks this of its lower
        tiers, and "nobody" must be sure). None: nobody; `BackendUnavailable`: too few
        members answered to tell. For operators, acting on it is a race."""
        key = check_name(key)
        askable = [name for name, member in self.members.items() if hasattr(member, "holder")]
        outcomes = yield from self._ask(askable, "holder", lambda _: (key,), owner)
        self._raise_unexpected(outcomes)
        failed = {n: o for n, o in outcomes.items() if isinstance(o, LockError)}
        found: dict[str, list[Holder]] = {}
        for outcome in outcomes.values():
            if isinstance(outcome, Holder):
                found.setdefault(outcome.owner, []).append(outcome)
        candidates = [seen for seen in found.values() if len(seen) + len(failed) >= self.quorum]
        if candidates:
            seen = max(candidates, key=len)
            left = sorted((h.expires_in or float("inf") for h in seen), reverse=True)
            expires_in = left[min(self.quorum, len(left)) - 1]
            fence = max(h.fence or 0 for h in seen) if self.capabilities.fenced else 0
            return Holder(key, self.name, seen[0].owner, None, fence,
                          None if expires_in == float("inf") else expires_in)  # fmt: skip
        if len(failed) >= self.quorum:
            raise self._unavailable(failed)
        return None

    def _breaking(self, key: str, by: str | None, owner: str) -> Steps[Holder | None]:
        """`break_lock`: free `key` on every member (see `ProviderBase.break_lock`).
        Enough of them must answer that fewer than `quorum` can still hold the broken
        grant (else `BackendUnavailable`: break again once they answer). The holder:
        who most members named, with the highest fence."""
        key = check_name(key)
        by = by or who()
        outcomes = yield from self._ask(list(self.members), "break_lock", lambda _: (key,),
                                        owner, kwargs={"by": by})  # fmt: skip
        self._raise_unexpected(outcomes)
        failed = {n: o for n, o in outcomes.items() if isinstance(o, LockError)}
        if len(failed) >= self.quorum:
            raise self._unavailable(failed)
        found = [outcome for outcome in outcomes.values() if isinstance(outcome, Holder)]
        with self._lock:
            held = [grant for (_, name), grants in self._held.items() if name == key
                    for grant in grants]  # fmt: skip
        for grant in held:  # a holder in this process hears of it now
            yield from self._lose(grant, f"it was broken by {by}")
        if not found:
            return None
        owners = [holder.owner for holder in found]
        owner = max(owners, key=owners.count)
        fence = max(holder.fence or 0 for holder in found) if self.capabilities.fenced else 0
        broken = Holder(key, self.name, owner, None, fence, None)
        emit_broken(self.name, key, by, broken)
        return broken

    def _pinging(self, owner: str) -> Steps[None]:
        """`ping`: succeed if at least `quorum` members answer."""
        outcomes = yield from self._ask(list(self.members), "ping", lambda _: (), owner)
        self._raise_unexpected(outcomes)
        failed = {n: o for n, o in outcomes.items() if isinstance(o, LockError)}
        if len(failed) > len(self.members) - self.quorum:
            raise self._unavailable(failed)

    def pending(self, member: str) -> int:
        """How many releases wait for `member` to answer."""
        return self._pending.count(member)

    def _closing(self, reason: str) -> Steps[None]:
        """End every lease this quorum granted (their `on_lost` run) and release their
        member grants. The members may serve others and are closed by whoever made them."""
        with self._lock:
            live = [grant for listed in self._held.values() for grant in listed]
        for grant in live:
            yield from self._lose(grant, reason)
