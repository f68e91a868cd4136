"""Stateful model tests (Hypothesis): three owners (threads) and two keys; random acquires
(wait=0; fixed 30 s, short 0.3 s or watchdog), re-entries, releases of any lease ever
granted (from any owner's thread), extends, is_held/check, the passing of time and
provider close, checked after every step against a small reference model of who holds
what, at which depth, with which fence (docs/semantics.md: leases, ended leases, levels,
closing), over every backend kind and a chain.

Time is real: every call is timed, and the model only asserts what holds whatever the
server decided within that window and a margin of `MARGIN` (a lease within the margin of
its expiry is "in doubt", and nothing that depends on it is asserted).

What the model found on the current code is kept as a plain xfail regression test; the
pre-fix subclasses at the end re-introduce two old defects, in this file only, to prove
the model notices them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import re
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from locks import Lease, LockLost, LockNotOwned, LockProvider
from locks.backends import DatabaseProvider, LocalProvider, RedisHashProvider
from locks.base import ProviderBase
from locks.holds import Hold
from locks.owner import current_owner
from locks.provider import Capabilities, Holder
from tests.backends import Backend, kinds
from tests.forks import in_forked_child
from tests.threads import in_thread

T = TypeVar("T")

OWNERS = 3
KEYS = 2
WATCHDOG_TTL = 0.6  # renewed every 0.2 s: a watchdog lease outlives any advance
TTLS: dict[str, float | None] = {"fixed": 30.0, "short": 0.3, "watchdog": None}
EXTEND_TTLS = (30.0, 0.3)
ADVANCE = 0.35  # past a short lease's 0.3 s, with room for the margin
MARGIN = 0.05  # within this of its expiry a lease is in doubt: nothing about it is asserted
MAX_ADVANCES = 3  # per example: sleeping is most of the run time
MAX_CLOSES = 1  # per example: a provider (a ZooKeeper session, a pool) costs to make
MAX_FORKS = 1  # per example: a child makes its own connections

EXPIRING_RUNS = 8  # each sleeps up to MAX_ADVANCES * ADVANCE
TIMELESS_RUNS = 40  # local and zookeeper: no sleeping
SETTINGS = settings(
    max_examples=EXPIRING_RUNS,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,  # a fixed seed: the same runs in CI and on a laptop
    database=None,
    print_blob=False,
    report_multiple_bugs=False,
)
# against a pre-fix provider: search longer, stop at the first failure, skip shrinking
PRE_FIX_SETTINGS = settings(SETTINGS, max_examples=300, phases=[Phase.explicit, Phase.generate])


# -- the reference model --------------------------------------------------------------------


class Status(Enum):
    LIVE = "live"
    DOUBT = "in doubt"  # within MARGIN of its expiry: may be either
    OVER = "expired"
    ENDED = "ended"  # released, refused, or lost with its provider


@dataclass(eq=False)
class Grant:
    """One ownership period of a key on the server, and the levels stacked on it."""

    owner: int
    fence: int
    generation: int  # which provider (they are closed and made anew) granted it
    levels: list[Level] = field(default_factory=list)
    gone: bool = False  # its last live level was released: the server freed it

    def reach(self) -> float:
        """The latest the server may still hold it: no level's release shortens it."""
        return max(level.reach() for level in self.levels)


@dataclass(eq=False)
class Level:
    """One granted lease as the model sees it; the bundle's values."""

    lease: Lease  # the latest object for it (`extend` returns one with the new ttl)
    owner: int
    key: int
    grant: Grant
    auto: bool  # renewed by the watchdog for as long as it is not released
    lo: float  # its validity ends no earlier than this (inf: not by itself)
    hi: float  # and no later than this
    pushed: float  # the latest expiry the server was ever asked to keep for it
    lost_calls: list[Lease]  # what its on_lost callback received
    ended: bool = False
    released: bool = False  # released by its holder: on_lost must never run
    release_tried: bool = False  # a release was asked for: the lease has ended, whatever came

    def reach(self) -> float:
        return math.inf if self.auto and not self.ended else self.pushed

    def __repr__(self) -> str:
        return f"<lease owner={self.owner} key={self.key} depth={self.lease.depth}>"


def status(level: Level, t0: float, t1: float, drift: float = 0.0) -> Status:
    """What `level` surely was throughout [t0, t1] (`drift`: as `check()` counts)."""
    if level.ended:
        return Status.ENDED
    if t1 < level.lo - drift - MARGIN:
        return Status.LIVE
    if t0 > level.hi - drift + MARGIN:
        return Status.OVER
    return Status.DOUBT


def caught(call: Callable[[], T]) -> Callable[[], T | LockNotOwned | LockLost]:
    """`call`, with the refusals the model predicts returned instead of raised."""

    def run() -> T | LockNotOwned | LockLost:
        try:
            return call()
        except (LockNotOwned, LockLost) as error:
            return error

    return run


def holder_of(provider: LockProvider, key: str) -> Holder | None:
    """`provider.holder(key)`: beside the protocol, on every backend and on a chain."""
    found: Holder | None = provider.holder(key)  # type: ignore[attr-defined]
    return found


@dataclass
class Subject:
    """What the machine drives: how to make a provider of one lock domain, what it
    promises, and where the fixture keeps providers to close after the test."""

    make: Callable[[], LockProvider]
    capabilities: Capabilities
    made: list[LockProvider]

    def close(self, provider: LockProvider) -> None:
        """Close it, and a chain's tiers with it (a chain's own close leaves them be)."""
        provider.close()
        for tier in getattr(provider, "tiers", {}).values():
            tier.close()
        if provider in self.made:  # closed already: the fixture need not close it again
            self.made.remove(provider)


def subject_of(backend: Backend) -> Subject:
    caps = backend.capabilities
    options = {"watchdog_ttl": WATCHDOG_TTL} if caps.renewable else {}
    return Subject(lambda: backend.make(**options), caps, backend.made)


# -- the machine ----------------------------------------------------------------------------


def model_machine(
    subject: Subject, max_advances: int = MAX_ADVANCES
) -> type[RuleBasedStateMachine]:
    """A state machine over `subject`'s providers (a closure: one per test);
    `max_advances` sleeps per run at most."""
    caps = subject.capabilities
    owners = st.integers(0, OWNERS - 1)
    ttl_kinds = st.sampled_from(list(TTLS))
    # Which lease a step takes is drawn as an index into the leases the run has, and no
    # precondition reads what the servers answered: a Bundle's size, or a precondition
    # on it, is decided by the server's timing, so the same choices would draw
    # differently on a replay and Hypothesis would stop the test as inconsistent.
    picks = st.integers(0, 2**16)
    unreleased_first = st.booleans()  # ended ones too, but not mostly them

    class LockModel(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            # an owner is a thread: each owner's calls all run on its own one
            self.pools = [
                ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"model-owner-{i}")
                for i in range(OWNERS)
            ]
            self.provider = subject.make()
            # an asyncio provider's owner is the task the bridge gives each thread
            owner_of = getattr(self.provider, "current_owner", current_owner)
            self.owner_ids = [pool.submit(owner_of).result() for pool in self.pools]
            run = uuid.uuid4().hex  # runs never meet on a shared server
            self.keys = [f"model:{run}:{i}" for i in range(KEYS)]
            self.generation = 0
            self.grants: list[Grant | None] = [None] * KEYS  # the current one per key
            self.fences: list[int | None] = [None] * KEYS  # the highest seen per key
            self.levels: list[Level] = []
            self.advances = 0
            self.closes = 0
            self.forks = 0

        def teardown(self) -> None:
            try:
                subject.close(self.provider)
            finally:
                for pool in self.pools:
                    pool.shutdown(wait=True)

        # -- helpers --------------------------------------------------------------------

        def cut(self, ttl: float) -> float:
            """What the provider takes off a lease's validity (a quorum: its drift
            allowance); nothing elsewhere."""
            margin: Callable[[float], float] | None = getattr(self.provider, "margin", None)
            return 0.0 if margin is None else margin(ttl)

        def timed(self, owner: int, call: Callable[[], T]) -> tuple[T, float, float]:
            """Run `call` on `owner`'s thread; its result and the window it ran in."""
            t0 = time.monotonic()
            result = self.pools[owner].submit(call).result(timeout=60)
            return result, t0, time.monotonic()

        def live_and_doubt(
            self, grant: Grant | None, t0: float, t1: float
        ) -> tuple[list[Level], list[Level]]:
            if grant is None:
                return [], []
            statuses = [(level, status(level, t0, t1)) for level in grant.levels]
            return (
                [level for level, seen in statuses if seen is Status.LIVE],
                [level for level, seen in statuses if seen is Status.DOUBT],
            )

        def lingering(self, grant: Grant | None, t0: float) -> bool:
            """Whether the server may still hold `grant` (for a level or past them all)."""
            return grant is not None and not grant.gone and t0 <= grant.reach() + MARGIN

        def pick(self, index: int, *, unreleased: bool) -> Level | None:
            """The `index`-th lease from the newest (modulo their number; Hypothesis
            shrinks towards 0, the newest, as it did a Bundle) among those not ended as
            far as the model knows if `unreleased` and there are any, else among all;
            None before the first grant."""
            live = [level for level in self.levels if not level.ended] if unreleased else []
            pool = live or self.levels
            return pool[-1 - index % len(pool)] if pool else None

        def snapshot(self, key: int) -> tuple[Holder | None, float, float]:
            t0 = time.monotonic()
            found = holder_of(self.provider, self.keys[key])
            return found, t0, time.monotonic()

        def unchanged(
            self,
            key: int,
            before: tuple[Holder | None, float, float],
            after: tuple[Holder | None, float, float],
            where: str,
        ) -> None:
            """A refused call changed nothing: the same holder, its expiry not pushed on."""
            (was, b0, b1), (now, a0, a1) = before, after
            if was is None:
                assert now is None, f"{where}, and then {now} held the key"
                return
            if was.expires_in is not None and a1 - b0 > was.expires_in - MARGIN:
                return  # its grant may have run out in between
            assert now is not None and (now.owner, now.fence) == (was.owner, was.fence), (
                f"{where}: the key went from {was} to {now}"
            )
            grant = self.grants[key]
            renewed = grant is not None and any(lv.auto and not lv.ended for lv in grant.levels)
            if was.expires_in is not None and now.expires_in is not None and not renewed:
                assert a0 + now.expires_in <= b1 + was.expires_in + MARGIN, (
                    f"{where}: the server's expiry went from {was.expires_in:.3f} s "
                    f"to {now.expires_in:.3f} s"
                )

        def end(self, level: Level, t1: float) -> None:
            level.ended = True
            if level.auto:  # its last renewal asked for at most a watchdog ttl
                level.pushed = max(level.pushed, t1 + WATCHDOG_TTL)

        # -- rules ----------------------------------------------------------------------

        # the rules: each picks its lease and runs a step below (steps a test can drive)

        @rule(owner=owners, key=st.integers(0, KEYS - 1), ttl=ttl_kinds)
        def acquire_any(self, owner: int, key: int, ttl: str) -> None:
            self.acquire(owner, key, ttl)

        @rule(index=picks, ttl=ttl_kinds)
        def reenter_one(self, index: int, ttl: str) -> None:
            level = self.pick(index, unreleased=True)
            if level is not None and not level.ended:
                self.reenter(level, ttl)

        @rule(index=picks, by=owners)
        def release_one(self, index: int, by: int) -> None:
            level = self.pick(index, unreleased=False)
            if level is not None:
                self.release(level, by)

        @rule(index=picks, first=unreleased_first, ttl=st.sampled_from(EXTEND_TTLS))
        def extend_one(self, index: int, first: bool, ttl: float) -> None:
            level = self.pick(index, unreleased=first)
            if level is not None:
                self.extend(level, ttl)

        @rule(index=picks, first=unreleased_first)
        def observe_one(self, index: int, first: bool) -> None:
            level = self.pick(index, unreleased=first)
            if level is not None:
                self.observe(level)

        # -- steps ----------------------------------------------------------------------

        def acquire(self, owner: int, key: int, ttl: str) -> Level | None:
            return self.take(owner, key, ttl)

        def reenter(self, level: Level, ttl: str) -> Level | None:
            """The holder of a lease acquires its key again (levels, or refusal on redis)."""
            return self.take(level.owner, level.key, ttl)

        def take(self, owner: int, key: int, ttl: str) -> Level | None:
            """Acquire with wait=0 and hold the outcome against the model."""
            seconds = TTLS[ttl]
            lost: list[Lease] = []
            name, provider = self.keys[key], self.provider
            lease, t0, t1 = self.timed(
                owner, lambda: provider.acquire(name, ttl=seconds, wait=0, on_lost=lost.append)
            )
            grant = self.grants[key]
            live, doubt = self.live_and_doubt(grant, t0, t1)
            # what the model allows: "none", a "fresh" grant, a "nested" level
            if grant is None or not self.lingering(grant, t0):
                allowed = {"fresh"}  # nobody holds it
            elif grant.owner != owner or not caps.reentrant:
                allowed = {"none"} if live else {"none", "fresh"}
            elif live:
                allowed = {"nested"}
            elif doubt:
                allowed = {"nested", "fresh"}
            else:  # its levels all ran out, its grant may linger: taken over anew
                allowed = {"fresh"}
            where = f"acquire by owner {owner} of key {key} ({ttl})"
            if lease is None:
                assert "none" in allowed, f"{where} was refused; the model expected {allowed}"
                return None
            assert (lease.key, lease.owner) == (name, self.owner_ids[owner]), where
            assert lease.auto_renew == (seconds is None and caps.expires), where
            nested = grant is not None and lease.fence == grant.fence and grant.owner == owner
            if nested:
                assert grant is not None
                assert "nested" in allowed, f"{where} re-entered; the model expected {allowed}"
                low, high = len(live) + 1, len(live) + len(doubt) + 1
                assert low <= lease.depth <= high, f"{where}: depth {lease.depth}, not {low}"
            else:
                assert "fresh" in allowed, f"{where} got a new grant; expected {allowed}"
                assert lease.depth == 1, f"{where}: a new grant at depth {lease.depth}"
                highest = self.fences[key]
                assert highest is None or lease.fence > highest, (
                    f"{where}: fence {lease.fence} after {highest}"
                )
                self.fences[key] = lease.fence
                grant = Grant(owner, lease.fence, self.generation)
                self.grants[key] = grant
            # its validity, as the model bounds it
            if not caps.expires:
                assert lease.valid_until is None, f"{where}: a {caps} lease has an expiry"
                lo = hi = math.inf
            elif seconds is None:
                lo = hi = math.inf
            else:
                lo, hi = t0 + seconds - self.cut(seconds), t1 + seconds - self.cut(seconds)
                assert lease.valid_until is not None and lo <= lease.valid_until <= hi, (
                    f"{where}: valid until {lease.valid_until}, not within [{lo}, {hi}]"
                )
            pushed = t1 + (WATCHDOG_TTL if seconds is None else seconds) if caps.expires else hi
            level = Level(lease, owner, key, grant, lease.auto_renew, lo, hi, pushed, lost)
            grant.levels.append(level)
            self.levels.append(level)
            return level

        def release(self, level: Level, by: int) -> None:
            """Any lease ever granted, from any owner's thread: the lease says whose it is.
            One that has ended is refused, and changes nothing."""
            provider = self.provider
            now = time.monotonic()
            ended = status(level, now, now) in (Status.ENDED, Status.OVER)  # and stays so
            others = [other for other in level.grant.levels if other is not level]
            # docs/semantics.md: an expired lease that is its hold's last live level is
            # refused, and what its hold still held on the server is released
            frees_its_hold = (
                not (level.release_tried or level.lease.lost)
                and self.grants[level.key] is level.grant
                and self.lingering(level.grant, now)
                and not any(status(o, now, now) is Status.LIVE for o in others)
            )
            before = self.snapshot(level.key) if ended and not frees_its_hold else None
            outcome, t0, t1 = self.timed(by, caught(lambda: provider.release(level.lease)))
            refused = isinstance(outcome, LockNotOwned)
            seen = status(level, t0, t1)
            where = f"release of {level} ({seen.value}) by owner {by}"
            if seen is Status.LIVE:
                assert not refused, f"{where} was refused: {outcome}"
            elif seen in (Status.ENDED, Status.OVER):
                assert refused, f"{where} was accepted: an ended lease must raise LockNotOwned"
            if before is not None:
                self.unchanged(level.key, before, self.snapshot(level.key), f"{where} (refused)")
            if not refused:
                seen_others = [status(other, t0, t1) for other in others]
                if not any(s in (Status.LIVE, Status.DOUBT) for s in seen_others):
                    level.grant.gone = True  # the last live level: the server freed it
                level.released = True
            level.release_tried = True
            self.end(level, t1)

        def extend(self, level: Level, ttl: float) -> None:
            """Ended or expired: refused, changes nothing (brings nothing back); live: ok."""
            provider, lease = self.provider, level.lease
            now = time.monotonic()
            ended = status(level, now, now) in (Status.ENDED, Status.OVER)
            before = self.snapshot(level.key) if ended else None
            outcome, t0, t1 = self.timed(level.owner, caught(lambda: provider.extend(lease, ttl)))
            seen = status(level, t0, t1)
            where = f"extend of {level} ({seen.value}) to {ttl} s"
            if seen is Status.LIVE:
                assert isinstance(outcome, Lease), f"{where} was refused: {outcome}"
            elif seen in (Status.ENDED, Status.OVER):
                assert isinstance(outcome, LockNotOwned), f"{where} was accepted"
            if before is not None:
                self.unchanged(level.key, before, self.snapshot(level.key), f"{where} (refused)")
            if not isinstance(outcome, Lease):
                self.end(level, t1)
                if seen is not Status.DOUBT:  # and it stays ended
                    held = self.timed(level.owner, lambda: provider.is_held(lease))[0]
                    assert not held, f"{where} was refused, yet is_held() says True"
                return
            same = ("key", "owner", "token", "fence", "depth", "auto_renew")
            assert all(getattr(outcome, a) == getattr(lease, a) for a in same), where
            assert outcome.ttl == ttl and outcome.state is lease.state, where
            if not caps.expires:
                return
            level.pushed = max(level.pushed, t1 + ttl)
            if level.auto:  # renewed on; a short extend leaves it in doubt till the next one
                if ttl < WATCHDOG_TTL:
                    level.lo = min(level.lo, t0 + ttl - self.cut(ttl))
            else:
                level.lo, level.hi = t0 + ttl - self.cut(ttl), t1 + ttl - self.cut(ttl)
                level.lease = outcome  # its ttl is the drift check() counts with

        def observe(self, level: Level) -> None:
            """`is_held` (asks the server) and `check()` (asks the lease) agree with the model."""
            provider = self.provider
            held, t0, t1 = self.timed(level.owner, lambda: provider.is_held(level.lease))
            seen = status(level, t0, t1)
            if seen is not Status.DOUBT:
                assert held == (seen is Status.LIVE), f"is_held({level}) is {held}: {seen.value}"
            outcome, t0, t1 = self.timed(level.owner, caught(level.lease.check))
            seen = status(level, t0, t1, drift=level.lease.drift)
            if seen is Status.LIVE:
                assert outcome is None, f"{level}.check() raised ({seen.value}): {outcome}"
            elif seen is not Status.DOUBT:
                assert isinstance(outcome, LockLost), f"{level}.check() passed: {seen.value}"

        @precondition(lambda self: caps.expires and self.advances < max_advances)
        @rule()
        def advance(self) -> None:
            """Let short leases (0.3 s) run out; watchdog leases are renewed through it."""
            self.advances += 1
            time.sleep(ADVANCE)

        @precondition(lambda self: self.closes < MAX_CLOSES)
        @rule()
        def close(self) -> None:
            """Close the provider: every lease it granted is lost, every key freed; the
            next steps use a new provider of the same lock domain."""
            t0 = time.monotonic()
            subject.close(self.provider)
            t1 = time.monotonic()
            for level in self.levels:
                if level.grant.generation != self.generation or level.ended:
                    continue
                if status(level, t0, t1) is Status.LIVE:
                    assert level.lease.lost, f"{level} is not lost after close"
                    assert len(level.lost_calls) == 1, f"{level}: on_lost ran {level.lost_calls}"
                with pytest.raises(LockLost):
                    level.lease.check()
                self.end(level, t1)
            self.closes += 1
            self.generation += 1
            self.grants = [None] * KEYS
            self.provider = subject.make()

        # (a run with nothing held yet forks all the same: this count is the run's own)
        @precondition(lambda self: self.forks < MAX_FORKS and not hasattr(self.provider, "tiers"))
        @rule()
        def fork(self) -> None:
            """A forked child holds nothing of its parent's: there, every lease of the
            parent fails its check and cannot be released, and a free key can be taken.
            The parent's leases are untouched (the invariants check it next)."""
            self.forks += 1
            if all(level.ended for level in self.levels):  # something for the child to see
                self.acquire(owner=0, key=0, ttl="fixed")
            provider = self.provider
            parents = [level.lease for level in self.levels if not level.ended]
            free = f"{self.keys[0]}:child"

            def child() -> list[bool]:
                verdicts = []
                for lease in parents:
                    verdicts.append(caught(lease.check)() is not None)
                    refused = caught(functools.partial(provider.release, lease))()
                    verdicts.append(isinstance(refused, LockNotOwned))
                taken = provider.acquire(free, ttl=30, wait=5)
                verdicts.append(taken is not None)
                if taken is not None:
                    provider.release(taken)
                return verdicts

            verdicts = in_forked_child(child)
            assert all(verdicts), f"a forked child saw its parent's leases as its own: {verdicts}"

        # -- invariants -----------------------------------------------------------------

        @invariant()
        def one_owner_per_key(self) -> None:
            """The model's own rule: at most one owner, one grant, holds a key."""
            now = time.monotonic()
            for key in range(KEYS):
                live = [
                    lv
                    for lv in self.levels
                    if lv.key == key and status(lv, now, now) is Status.LIVE
                ]
                assert len({(lv.owner, lv.lease.fence) for lv in live}) <= 1, live

        @invariant()
        def on_lost_runs_once_and_only_for_lost_leases(self) -> None:
            now = time.monotonic()
            for level in self.levels:
                assert len(level.lost_calls) <= 1, f"{level}: on_lost ran {len(level.lost_calls)}"
                if level.released:
                    assert not level.lost_calls, f"{level} was released, then reported lost"
                if status(level, now, now) is Status.LIVE:
                    assert not level.lease.lost, f"{level} is live, yet lost"

        @invariant()
        def holder_names_the_holder(self) -> None:
            """`holder(key)` names the owner and fence of the live grant (and its expiry
            covers every live level), or nobody."""
            for key, name in enumerate(self.keys):
                grant = self.grants[key]
                t0 = time.monotonic()
                found = holder_of(self.provider, name)
                t1 = time.monotonic()
                live, doubt = self.live_and_doubt(grant, t0, t1)
                if grant is not None and live:
                    expected = (self.owner_ids[grant.owner], grant.fence)
                    assert found is not None, (
                        f"key {key}: holder() is None, owner {grant.owner} holds it"
                    )
                    assert (found.owner, found.fence) == expected, f"key {key}: {found}"
                    if not doubt and found.depth is not None:
                        assert found.depth == len(live), f"key {key}: {found}, {len(live)} levels"
                    # the server's expiry covers every live level (renewed ones aside)
                    fixed = [level.lo for level in live if not level.auto]
                    if found.expires_in is not None and fixed:
                        assert t1 + found.expires_in >= max(fixed) - MARGIN, (
                            f"key {key}: the server lets it go in {found.expires_in:.3f} s, "
                            f"a live level counts on {max(fixed) - t1:.3f} s"
                        )
                elif not self.lingering(grant, t0):
                    assert found is None, f"key {key} is free, yet holder() says {found}"

    return LockModel


# -- the model over every backend -------------------------------------------------------------


@pytest.mark.parametrize("backend", kinds(topologies=False), indirect=True)
def test_every_backend_keeps_the_model(backend: Backend) -> None:
    """Every kind (and a chain): random steps never leave what the model allows. Where
    nothing expires, nothing sleeps: those kinds get more runs for the same time."""
    runs = EXPIRING_RUNS if backend.capabilities.expires else TIMELESS_RUNS
    settings_ = settings(SETTINGS, max_examples=runs)
    run_state_machine_as_test(model_machine(subject_of(backend)), settings=settings_)


# -- what the model found on the current code: kept as plain regression tests ---------------


@pytest.mark.parametrize(
    "backend", kinds(reentrant=True, expires=True, topologies=False), indirect=True
)
def test_releasing_an_expired_last_level_frees_its_holds_grant(backend: Backend, key: str) -> None:
    """Found by building the model: the outer level was released first, the inner one ran
    out, and the server still held the key for the outer level's 30 s, for nobody. The
    inner lease's release is refused (it had expired) and frees the grant all the same."""
    provider = backend.make()
    outer = provider.acquire(key, ttl=30)
    inner = provider.acquire(key, ttl=0.3)
    assert outer is not None and inner is not None and inner.depth == 2
    provider.release(outer)  # not the last level: nothing sent, the server keeps its 30 s
    time.sleep(ADVANCE + 0.15)  # the inner level ran out; the grant stays on the server
    before = holder_of(provider, key)
    assert before is not None and (before.owner, before.fence) == (inner.owner, inner.fence)
    with pytest.raises(LockNotOwned, match="had expired"):
        provider.release(inner)
    assert holder_of(provider, key) is None, "the key stayed held, for nobody"
    taken = in_thread(lambda: provider.acquire(key, ttl=30, wait=0))
    assert taken is not None
    provider.release(taken)


# -- proof that the model can fail: pre-fix behaviour, re-introduced here only ------------------


class _DoubleReleaseUndoesOuter(ProviderBase):
    """Pre-fix: levels were a depth counter, so releasing a nested lease twice took one
    more level off the hold (another lease's), and freed the grant at zero."""

    still_raises = False  # True: do the damage, then raise as the fixed code does

    def release(self, lease: Lease) -> None:
        hold = lease.state.hold
        if not (lease.state.ended and isinstance(hold, Hold)):
            super().release(lease)
            return
        owner = hold.provider
        assert isinstance(owner, ProviderBase)
        with hold.lock:
            live = hold.live(time.monotonic())
            if live:
                hold.levels.remove(live[0])
        if not live:
            raise LockNotOwned(f"{lease.key!r}: nothing left to count down")
        if len(live) == 1:  # the counter reached zero: the grant goes
            owner._release(hold.anchor)
            owner._forget(hold)
        if self.still_raises:
            raise LockNotOwned(f"{lease.key!r}: released twice (after the damage)")


class _NestedExtendShortensHold(ProviderBase):
    """Pre-fix: extending a nested level set the whole grant's expiry to that level's
    ttl, ignoring the other levels, which then outlived the grant."""

    def extend(self, lease: Lease, ttl: float | None = None) -> Lease:
        hold = lease.state.hold
        if ttl is None or lease.depth == 1 or not isinstance(hold, Hold):
            return super().extend(lease, ttl)
        owner = hold.provider
        assert isinstance(owner, ProviderBase)
        with hold.lock:
            now = time.monotonic()
            if hold.ending or not lease.state.live(now):
                raise LockNotOwned(f"{lease.key!r}: this lease has ended")
            if not owner._extend(hold.anchor, ttl):
                raise LockNotOwned(f"{lease.key!r} is no longer held")
            hold.valid_until = now + ttl
            lease.state.renewed(now + ttl)
        return dataclasses.replace(lease, ttl=ttl)


class DoubleReleaseLocal(_DoubleReleaseUndoesOuter, LocalProvider):
    pass


class DoubleReleaseLocalRaising(_DoubleReleaseUndoesOuter, LocalProvider):
    still_raises = True


class DoubleReleaseRedisHash(_DoubleReleaseUndoesOuter, RedisHashProvider):
    pass


class DoubleReleaseRedisHashRaising(_DoubleReleaseUndoesOuter, RedisHashProvider):
    still_raises = True


class NestedExtendRedisHash(_NestedExtendShortensHold, RedisHashProvider):
    pass


class NestedExtendDatabase(_NestedExtendShortensHold, DatabaseProvider):
    pass


def pre_fix_subject(backend: Backend, defect: type[ProviderBase]) -> Subject:
    """`backend`'s providers, made of the pre-fix subclass `defect` instead."""

    factory: Callable[..., LockProvider] = defect  # its own constructor's arguments

    def make() -> LockProvider:
        if backend.address is None:
            provider = factory()
        else:
            provider = factory(backend.address, watchdog_ttl=WATCHDOG_TTL)
        backend.made.append(provider)
        return provider

    return Subject(make, backend.capabilities, backend.made)


PRE_FIX = [
    pytest.param("local", DoubleReleaseLocal, id="local-double-release"),
    pytest.param("local", DoubleReleaseLocalRaising, id="local-double-release-raising"),
    pytest.param("redis-hash", DoubleReleaseRedisHash, id="redis-hash-double-release"),
    pytest.param(
        "redis-hash", DoubleReleaseRedisHashRaising, id="redis-hash-double-release-raising"
    ),
    pytest.param("redis-hash", NestedExtendRedisHash, id="redis-hash-nested-extend"),
    pytest.param("mariadb", NestedExtendDatabase, id="mariadb-nested-extend"),
]


@pytest.mark.parametrize(("backend", "defect"), PRE_FIX, indirect=["backend"])
def test_the_model_finds_pre_fix_behaviour(backend: Backend, defect: type[ProviderBase]) -> None:
    """The random search finds each defect. Without sleeps (`max_advances=0`) a run
    costs milliseconds: a shortened hold shows in the server's expiry at once."""
    machine = model_machine(pre_fix_subject(backend, defect), max_advances=0)
    with pytest.raises(AssertionError):
        run_state_machine_as_test(machine, settings=PRE_FIX_SETTINGS)


def defect_steps(machine: Any, defect: type[ProviderBase], broken: bool) -> None:
    """Drive `defect`'s own steps through `machine`'s rules by hand. On a `broken`
    provider the rules that see the damage fail; on the real one every step passes."""

    def fails(pattern: str) -> contextlib.AbstractContextManager[object]:
        return pytest.raises(AssertionError, match=pattern) if broken else contextlib.nullcontext()

    outer = machine.acquire(owner=0, key=0, ttl="fixed")
    inner = machine.reenter(level=outer, ttl="fixed")
    if issubclass(defect, _NestedExtendShortensHold):
        machine.extend(level=inner, ttl=0.3)
        machine.release(level=inner, by=0)
        machine.advance()  # the outer lease is live, yet the server let the key go:
        with fails(r"is_held\(.*\) is False"):
            machine.observe(level=outer)
    else:
        machine.release(level=inner, by=0)
        # released again: must be refused (or was, but the outer grant went with it)
        raises = getattr(defect, "still_raises", False)
        with fails("the key went from" if raises else "was accepted"):
            machine.release(level=inner, by=0)
    # and another owner takes the key the outer lease still holds
    with fails(re.escape("new grant; expected {'none'}")):
        machine.acquire(owner=1, key=0, ttl="fixed")


@pytest.mark.parametrize(("backend", "defect"), PRE_FIX, indirect=["backend"])
def test_the_model_reports_the_pre_fix_steps(backend: Backend, defect: type[ProviderBase]) -> None:
    """The defect's steps by hand, invariants left out so that its effect shows (another
    owner takes a key a live lease holds), not only the server's expiry, which the
    invariant sees first: they pass on the real provider, and fail on the pre-fix one."""
    for subject, broken in ((subject_of(backend), False), (pre_fix_subject(backend, defect), True)):
        machine: Any = model_machine(subject)()  # its rules, which mypy cannot see
        try:
            defect_steps(machine, defect, broken)
            if not broken:
                machine.holder_names_the_holder()
                machine.on_lost_runs_once_and_only_for_lost_leases()
        finally:
            machine.teardown()


@pytest.mark.parametrize(("backend", "defect"), PRE_FIX, indirect=["backend"])
def test_the_pre_fix_subclasses_re_create_their_defects(
    backend: Backend, defect: type[ProviderBase], key: str
) -> None:
    """Without the model: each subclass does let another owner in while the outer lease
    still counts on the key."""
    provider = pre_fix_subject(backend, defect).make()
    outer = provider.acquire(key, ttl=30)
    inner = provider.acquire(key, ttl=30)
    assert outer is not None and inner is not None and inner.depth == 2
    if isinstance(provider, _DoubleReleaseUndoesOuter):
        provider.release(inner)
        if provider.still_raises:
            with pytest.raises(LockNotOwned):
                provider.release(inner)
        else:
            provider.release(inner)  # the fixed code raises LockNotOwned here
    else:
        provider.extend(inner, 0.3)
        provider.release(inner)
        time.sleep(ADVANCE)
    outer.check()  # the outer lease believes it still holds the key...
    other = in_thread(lambda: provider.acquire(key, ttl=30, wait=0))
    assert other is not None  # ...and another owner has it
    provider.release(other)
