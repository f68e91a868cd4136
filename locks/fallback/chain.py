"""FallbackChain: a LockProvider over tiers (Redis -> ZooKeeper -> database -> local, or
any order), moving down only when a tier is unavailable, never on contention.

Two tiers are two lock domains: a holder on Redis and a newcomer on ZooKeeper cannot
see each other. `mode` says what to do about it:

- `fast` degrades at once. Leases granted by a tier just before it died may overlap with
  leases the next tier grants, until they run out.
- `safe` never lets two tiers grant one key at once under crash-stop faults, across
  every process of the system (docs/semantics.md, "Safe mode"):
  1. a lower tier grants only once `max_lease` (which bounds every lease of the chain)
     has passed since the tiers above it went down, by an outage clock that restarts
     whenever the watch on them had a gap (`locks.fallback.outages`);
  2. a lower tier's grant stands only if the tiers above still fail right after it;
  3. a grant stands only if no lower tier holds the key for another owner (one read
     per lower tier: safe mode's price), or the lower tier has been down `max_lease`;
  4. a lower tier's grant is bounded by `max_lease`, whatever the backend.

The walk, the gates, the retries and the bookkeeping are `ChainLogic`'s, written once as
steps (`locks.steps`): `FallbackChain` makes their calls on the calling thread, and
`locks.aio.FallbackChain` awaits them.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import operator
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tenacity import (
    DoAttempt,
    DoSleep,
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_before_delay,
    wait_fixed,
)

from locks.errors import AllBackendsUnavailable, BackendUnavailable, LockError, LockNotOwned
from locks.events import EventKind, emit
from locks.fallback.breaker import Breaker, BreakerState
from locks.fallback.outages import WATCH_EVERY, Outages
from locks.fallback.switch import Switch
from locks.names import check_acquire, check_name, check_seconds
from locks.owner import current_owner
from locks.pending import Pending, PendingReleases
from locks.provider import Capabilities, Holder, Lease, LostCallback, MakesLocks
from locks.steps import Sleep, Steps, call, run

logger = logging.getLogger("locks")

MODES = ("fast", "safe")


def default_retry() -> Retrying:
    """3 tries 100 ms apart, on `BackendUnavailable` only."""
    return Retrying(
        stop=stop_after_attempt(3),
        wait=wait_fixed(0.1),
        retry=retry_if_exception_type(BackendUnavailable),
        reraise=True,
    )


@dataclass(frozen=True)
class _Request:
    """One acquire as it walks down the tiers."""

    key: str
    ttl: float | None
    deadline: float | None
    on_lost: LostCallback | None
    owner: str

    def remaining(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def on(self, provider: object) -> Steps[Lease | None]:
        wait = self.remaining()
        lease: Lease | None = yield from call(
            provider, "acquire", self.key, ttl=self.ttl, wait=wait, on_lost=self.on_lost
        )
        return lease


class _Again(Exception):
    """Not now: a safe-mode gate is closed until `at`, or another owner holds the key on
    a lower tier (`contended`)."""

    def __init__(
        self, tier: str, at: float, causes: dict[str, BaseException], contended: bool = False
    ) -> None:
        wait = at - time.monotonic()
        what = "held on a lower tier" if contended else f"{tier} may grant in {wait:.1f} s"
        super().__init__(f"safe mode: {what}")
        self.tier = tier
        self.at = at
        self.causes = causes  # why the tiers above it were passed over
        self.contended = contended


class ChainLogic(ABC):
    """Everything a chain decides, for both faces: its tiers, their breakers and outage
    clocks, the walk down the tiers, safe mode's gates, retries, queued releases. A
    method that needs a tier's answer is a generator of steps (`locks.steps`)."""

    type_name = "chain"

    def __init__(
        self,
        providers: Sequence[object],
        *,
        name: str = "chain",
        mode: str = "fast",
        max_lease: float = 30.0,
        retry: Retrying | None = None,
        breaker: Breaker | None = None,
        switch: Switch | None = None,
    ) -> None:
        self.name = check_name(name, "name")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.max_lease = check_seconds(max_lease, "max_lease")
        tiers: list[Any] = list(providers)
        if not tiers:
            raise ValueError("providers must name at least one tier")
        names = [provider.name for provider in tiers]
        if len(set(names)) != len(names):
            raise ValueError(f"tier names must be unique, got {names}")
        if mode == "safe":
            for provider in tiers:
                watchdog_ttl = getattr(provider, "watchdog_ttl", None)
                if provider.capabilities.expires and watchdog_ttl and watchdog_ttl > max_lease:
                    raise ValueError(
                        f"tier {provider.name!r} has watchdog_ttl={watchdog_ttl}, longer than "
                        f"max_lease={max_lease}: safe mode could not bound its leases"
                    )
                if not (hasattr(provider, "holder") and hasattr(provider, "bound")):
                    raise ValueError(
                        f"tier {provider.name!r} cannot say who holds a key or bound a lease "
                        "(holder, bound): safe mode needs both"
                    )
        self.order = names
        self.tiers: dict[str, Any] = {provider.name: provider for provider in tiers}
        self.capabilities: Capabilities = functools.reduce(
            operator.and_, (provider.capabilities for provider in tiers)
        )
        template = Breaker() if breaker is None else breaker
        self.breakers = {tier: template.fresh() for tier in names}
        for tier, tier_breaker in self.breakers.items():
            tier_breaker.listen(functools.partial(self._breaker_changed, tier))
        self.retry = default_retry() if retry is None else retry.copy(reraise=True)
        self.switch = switch
        self.counts: Counter[str] = Counter()  # ambiguous, release_queued, degraded, ...
        self._lock = threading.Lock()
        self._outages = Outages()
        self._pending = PendingReleases(self._start_flush)
        self._stop = threading.Event()  # closed: background work ends
        self._watcher: Any = None  # safe mode: what looks at failed tiers (a thread, a task)
        self._background: set[Any] = set()  # the asyncio face's tasks under way

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.order}, name={self.name!r}, mode={self.mode!r})"

    # -- what each face supplies ------------------------------------------------------------

    @abstractmethod
    def _start_flush(self, steps: Steps[None]) -> object:
        """Run queued releases apart from the caller (a thread, or a task)."""

    @abstractmethod
    def _watch_down_tiers(self) -> None:
        """Safe mode: start looking at failed tiers (`_look_at_down_tiers`) every
        WATCH_EVERY until none is down, unless that runs already."""

    # -- acquire ----------------------------------------------------------------------------

    def _request(
        self, key: str, ttl: float | None, wait: float | None, on_lost: LostCallback | None,
        owner: str,
    ) -> _Request:  # fmt: skip
        """An acquire's arguments checked, before any I/O."""
        key, ttl, wait = check_acquire(key, ttl, wait, on_lost)
        if self.mode == "safe" and ttl is not None and ttl > self.max_lease:
            raise ValueError(
                f"ttl={ttl} is longer than this safe chain's max_lease={self.max_lease}"
            )
        deadline = None if wait is None else time.monotonic() + wait
        return _Request(key, ttl, deadline, on_lost, owner)

    def _acquiring(self, request: _Request) -> Steps[Lease | None]:
        backoff = 0.02
        while True:
            try:
                return (yield from self._walk(request))
            except _Again as again:
                now = time.monotonic()
                if request.deadline is not None and now >= request.deadline:
                    if again.contended:
                        emit(EventKind.TIMED_OUT, self.name, request.key)
                        return None
                    cause = BackendUnavailable(str(again), backend=again.tier)
                    causes = {**again.causes, again.tier: cause}
                    raise AllBackendsUnavailable(self.name, causes) from None
                # look again soon: the upper tier may be back before the gate opens
                until = again.at if request.deadline is None else min(again.at, request.deadline)
                yield Sleep(max(0.0, min(until - now, backoff)))
                backoff = min(backoff * 2, 0.5)

    def _allowed(self) -> list[str]:
        """The tiers the switch lets through right now, in order."""
        return self.order if self.switch is None else self.switch.tiers(self.order)

    def _walk(self, request: _Request) -> Steps[Lease | None]:
        tiers = self._allowed()
        causes: dict[str, BaseException] = {}
        if not tiers:
            state = None if self.switch is None else self.switch.state
            causes["switch"] = BackendUnavailable(
                f"the switch ({state}) leaves chain {self.name!r} no tier", backend=self.name
            )
        for position, tier in enumerate(tiers):
            failed_above = [above for above in tiers[:position] if above in causes]
            if self.mode == "safe":
                self._check_gate(tier, failed_above, causes)
            if not (yield from self._usable(tier, causes)):
                continue
            try:
                lease = yield from self._acquire_on(tier, request)
            except BackendUnavailable as error:
                self._failed(tier)
                causes[tier] = error
                following = tiers[position + 1] if position + 1 < len(tiers) else None
                self.counts["degraded"] += 1
                detail = f"to {following}" if following else "with no tier left"
                emit(EventKind.DEGRADED, tier, request.key, error=error, detail=detail)
                continue
            except BaseException:  # no verdict on the tier (a bug, an interrupt): free the probe
                self.breakers[tier].release_probe()
                raise
            self._answered(tier)
            if lease is None:  # contention: never asks a lower tier
                return None
            if self.mode == "safe" and lease.depth == 1:
                yield from self._confirm(tier, lease, failed_above, request, causes)
            return lease
        raise AllBackendsUnavailable(self.name, causes)

    def _usable(self, tier: str, causes: dict[str, BaseException]) -> Steps[bool]:
        """Whether to try `tier` now. An open breaker skips it at no cost; once its
        reset_timeout is over, one caller probes it with a ping, which no lock can hold
        up (a probe that waited on a contended key would keep the tier looking down)."""
        breaker = self.breakers[tier]
        if not breaker.allow():
            causes[tier] = BackendUnavailable(f"{tier}: circuit open, skipped", backend=tier)
            return False
        if breaker.state is not BreakerState.HALF_OPEN:
            return True
        error = yield from self._ping(tier)
        if error is not None:
            causes[tier] = error
            return False
        return True

    def _ping(self, tier: str) -> Steps[BackendUnavailable | None]:
        """Look at `tier` and record what is seen; the error if it failed."""
        try:
            answer = yield from self._observed(tier, "ping")
        except BaseException:  # no verdict on the tier: free the probe this may be
            self.breakers[tier].release_probe()
            raise
        return answer if isinstance(answer, BackendUnavailable) else None

    def _observed(self, tier: str, method: str, *args: Any) -> Steps[Any]:
        """`method` of `tier`, recorded as a sign of life or a failure (with how long it
        took: a hung server fails slowly); the error is returned, not raised."""
        started = time.monotonic()
        try:
            answer = yield from call(self.tiers[tier], method, *args)
        except BackendUnavailable as error:
            self._failed(tier, time.monotonic() - started)
            return error
        self._answered(tier)
        return answer

    def _attempt_on(self, tier: str, request: _Request) -> Steps[Lease | None]:
        try:
            return (yield from request.on(self.tiers[tier]))
        except BackendUnavailable as error:
            if error.ambiguous and error.token:
                # the lock may have been taken: release that token once the tier answers
                self.counts["ambiguous"] += 1
                pending = Pending(key=request.key, owner=request.owner, token=error.token)
                self._pending.queue(tier, pending)
            raise

    def _acquire_on(self, tier: str, request: _Request) -> Steps[Lease | None]:
        """Acquire on one tier with retries that never run past the deadline. The first
        try runs outside tenacity: the common case, success, pays nothing for retries."""
        try:
            return (yield from self._attempt_on(tier, request))
        except BackendUnavailable as error:
            first_failure = error
        retrying = self.retry
        left = request.remaining()
        if left is not None:
            configured, by_deadline = retrying.stop, stop_before_delay(left)

            def stop(state: RetryCallState) -> bool:
                return bool(configured(state)) or bool(by_deadline(state))

            retrying = retrying.copy(stop=stop)
        # tenacity's own loop (`Retrying.__call__`), its calls and sleeps made as steps;
        # its attempt 1 is the failure above, replayed at no cost
        retrying.begin()
        state = RetryCallState(retrying, fn=None, args=(), kwargs={})
        replayed = False
        while True:
            action = retrying.iter(state)
            if isinstance(action, DoAttempt):
                if not replayed:
                    replayed = True
                    state.set_exception((type(first_failure), first_failure, None))
                    continue
                try:
                    result = yield from self._attempt_on(tier, request)
                except Exception:
                    state.set_exception(sys.exc_info())  # type: ignore[arg-type]
                else:
                    state.set_result(result)
            elif isinstance(action, DoSleep):
                state.prepare_for_next_attempt()
                yield Sleep(float(action))
            else:
                return action  # type: ignore[no-any-return]

    # -- safe mode ----------------------------------------------------------------------------

    def _check_gate(
        self, tier: str, failed_above: list[str], causes: dict[str, BaseException]
    ) -> None:
        """Raise `_Again` while a tier above `tier` that failed may still have leases out."""
        now = time.monotonic()
        for above in failed_above:
            opens_at = self._outages.opens_at(above, self.max_lease)
            if opens_at is None:  # passed over, yet not seen failing: look again soon
                raise _Again(tier, now + WATCH_EVERY, causes)
            if opens_at > now:
                raise _Again(tier, opens_at, causes)

    def _confirm(
        self,
        tier: str,
        lease: Lease,
        failed_above: list[str],
        request: _Request,
        causes: dict[str, BaseException],
    ) -> Steps[None]:
        """Let a safe-mode grant stand, or undo it and raise `_Again`: the tiers above a
        lower tier's grant must still be failing, and no tier below may hold the key for
        another owner. A lower tier's grant ends at `max_lease` whatever happens."""
        provider = self.tiers[tier]
        for above in failed_above:
            if (yield from self._ping(above)) is None:  # it is back: the grant must come from there
                yield from self._release_quietly(lease)
                raise _Again(tier, time.monotonic(), causes)
        if self.order.index(tier) > 0:
            yield from call(provider, "bound", lease, self.max_lease)
        for lower in self.order[self.order.index(tier) + 1 :]:
            if (yield from self._held_below(lower, request)):
                yield from self._release_quietly(lease)
                raise _Again(lower, time.monotonic() + 0.05, causes, contended=True)

    def _held_below(self, tier: str, request: _Request) -> Steps[bool]:
        """Whether `tier` may hold `request.key` for another owner: a read, or, if the tier
        cannot be read, whether it may still have leases out (they end by `max_lease`)."""
        found = yield from self._observed(tier, "holder", request.key)
        if isinstance(found, BackendUnavailable):
            opens_at = self._outages.opens_at(tier, self.max_lease)
            return opens_at is None or opens_at > time.monotonic()
        return found is not None and bool(found.owner != request.owner)

    def _look_at_down_tiers(self) -> Steps[bool]:
        """One look at every failed tier, so that its outage clock runs without a gap
        however rarely acquires come (and it fails back at once). False once none is
        down: the looking stops."""
        down = self._outages.down()
        if not down:
            return False
        for tier in down:
            with contextlib.suppress(LockError):
                yield from self._ping(tier)
        return True

    # -- health bookkeeping ------------------------------------------------------------------

    def _failed(self, tier: str, took: float = 0.0) -> None:
        self.breakers[tier].failure()
        self._outages.saw_down(tier, took)
        if self.mode == "safe":
            self._watch_down_tiers()

    def _answered(self, tier: str) -> None:
        self.breakers[tier].success()
        if self._outages.saw_up(tier):
            self.counts["recovered"] += 1
            emit(EventKind.RECOVERED, tier, "")
        self._pending.answered(self.tiers[tier])  # releases that waited for it to answer

    def _breaker_changed(self, tier: str, old: BreakerState, new: BreakerState) -> None:
        emit(EventKind.BREAKER, tier, "", detail=f"{old} -> {new}")

    # -- release and the rest of the protocol -------------------------------------------------

    def _tier_of(self, lease: Lease) -> Any:
        if not isinstance(lease, Lease):
            raise TypeError(f"lease must be a Lease, not {type(lease).__name__}")
        provider = self.tiers.get(lease.backend)
        if provider is None:
            raise ValueError(
                f"lease was granted by {lease.backend!r}, not by a tier of {self.name!r}"
            )
        return provider

    def _release_or_queue(self, provider: Any, lease: Lease) -> Steps[None]:
        """Release on the tier that granted it, whatever the switch or breakers say now.
        A tier that does not answer does not make this raise: the release is queued."""
        try:
            yield from call(provider, "release", lease)
        except BackendUnavailable as error:
            self._failed(provider.name)
            self.counts["release_queued"] += 1
            self._pending.queue(provider.name, Pending(lease=lease))
            emit(EventKind.RELEASE_QUEUED, provider.name, lease.key, lease, error=error)

    def _release_quietly(self, lease: Lease) -> Steps[None]:
        with contextlib.suppress(LockNotOwned):
            yield from self._release_or_queue(self.tiers[lease.backend], lease)

    def pending(self, tier: str) -> int:
        """How many releases wait for `tier` to answer."""
        return self._pending.count(tier)

    def _holder_steps(self, key: str) -> Steps[Holder | None]:
        """Who holds `key` on the first tier, in chain order, that knows of a holder
        (tiers that cannot answer or cannot tell are passed over)."""
        key = check_name(key)
        for tier in self._allowed():
            if not hasattr(self.tiers[tier], "holder"):
                continue
            with contextlib.suppress(BackendUnavailable, NotImplementedError):
                found: Holder | None = yield from call(self.tiers[tier], "holder", key)
                if found is not None:
                    return found
        return None

    def _break_steps(self, key: str, by: str | None) -> Steps[Holder | None]:
        """Free `key` on every tier that can break a lock from another process (see
        `ProviderBase.break_lock`), whatever the switch allows: a grant on any of them
        may be the stuck one. The holder found first in chain order. A tier that could
        not be asked makes it raise, once every other tier was broken: break again."""
        key = check_name(key)
        found: list[Holder] = []
        errors: list[LockError] = []
        for provider in self.tiers.values():
            if not hasattr(provider, "break_lock") or not provider.capabilities.cross_process:
                continue
            try:
                broken: Holder | None = yield from call(provider, "break_lock", key, by=by)
            except LockError as error:
                errors.append(error)
                continue
            found += [broken] if broken is not None else []
        if errors:
            raise errors[0]
        return found[0] if found else None

    def _ping_steps(self) -> Steps[None]:
        """Succeed if any tier the switch allows answers."""
        causes: dict[str, BaseException] = {}
        for tier in self._allowed():
            try:
                yield from call(self.tiers[tier], "ping")
                return
            except BackendUnavailable as error:
                causes[tier] = error
        raise AllBackendsUnavailable(self.name, causes)


class FallbackChain(ChainLogic, MakesLocks):
    """A `LockProvider` whose tiers are tried in order within one deadline; the calls
    made on the calling thread."""

    def acquire(
        self,
        key: str,
        *,
        ttl: float | None = None,
        wait: float | None = None,
        on_lost: LostCallback | None = None,
    ) -> Lease | None:
        return run(self._acquiring(self._request(key, ttl, wait, on_lost, current_owner())))

    def release(self, lease: Lease) -> None:
        """Release on the tier that granted it, whatever the switch or breakers say now.
        A tier that does not answer does not make this raise: the release is queued."""
        run(self._release_or_queue(self._tier_of(lease), lease))

    def extend(self, lease: Lease, ttl: float | None = None) -> Lease:
        return self._tier_of(lease).extend(lease, ttl)  # type: ignore[no-any-return]

    def is_held(self, lease: Lease) -> bool:
        return bool(self._tier_of(lease).is_held(lease))

    def holder(self, key: str) -> Holder | None:
        return run(self._holder_steps(key))

    def break_lock(self, key: str, *, by: str | None = None) -> Holder | None:
        return run(self._break_steps(key, by))

    def ping(self) -> None:
        run(self._ping_steps())

    def close(self) -> None:
        """Stop watching failed tiers. The tiers themselves may serve other chains and
        are closed by whoever made them."""
        self._stop.set()

    def _start_flush(self, steps: Steps[None]) -> object:
        thread = threading.Thread(target=run, args=(steps,), daemon=True)
        thread.start()
        return thread

    def _watch_down_tiers(self) -> None:
        if self._watcher is None:
            with self._lock:
                if self._watcher is None and not self._stop.is_set():
                    self._watcher = threading.Thread(
                        target=self._watch, name=f"locks-watch-{self.name}", daemon=True
                    )
                    self._watcher.start()

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_EVERY):
            if not run(self._look_at_down_tiers()):
                with self._lock:
                    if not self._outages.down():
                        self._watcher = None
                        return
