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
"""

from __future__ import annotations

import contextlib
import functools
import logging
import operator
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from tenacity import (
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
from locks.provider import Capabilities, Holder, Lease, LockProvider, LostCallback, MakesLocks

logger = logging.getLogger("locks")
R = TypeVar("R")

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

    def on(self, provider: LockProvider) -> Lease | None:
        return provider.acquire(self.key, ttl=self.ttl, wait=self.remaining(), on_lost=self.on_lost)


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


class FallbackChain(MakesLocks):
    """A `LockProvider` whose tiers are tried in order within one deadline."""

    type_name = "chain"

    def __init__(
        self,
        providers: Sequence[LockProvider],
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
        providers = list(providers)
        if not providers:
            raise ValueError("providers must name at least one tier")
        names = [provider.name for provider in providers]
        if len(set(names)) != len(names):
            raise ValueError(f"tier names must be unique, got {names}")
        if mode == "safe":
            for provider in providers:
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
        self.tiers = {provider.name: provider for provider in providers}
        self.capabilities: Capabilities = functools.reduce(
            operator.and_, (provider.capabilities for provider in providers)
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
        self._watcher: threading.Thread | None = None  # safe mode: looks at failed tiers
        self._closed = threading.Event()
        self._pending = PendingReleases()

    def __repr__(self) -> str:
        return f"FallbackChain({self.order}, name={self.name!r}, mode={self.mode!r})"

    # -- acquire ----------------------------------------------------------------------------

    def acquire(
        self,
        key: str,
        *,
        ttl: float | None = None,
        wait: float | None = None,
        on_lost: LostCallback | None = None,
    ) -> Lease | None:
        key, ttl, wait = check_acquire(key, ttl, wait, on_lost)
        if self.mode == "safe" and ttl is not None and ttl > self.max_lease:
            raise ValueError(
                f"ttl={ttl} is longer than this safe chain's max_lease={self.max_lease}"
            )
        deadline = None if wait is None else time.monotonic() + wait
        request = _Request(key, ttl, deadline, on_lost, current_owner())
        backoff = 0.02
        while True:
            try:
                return self._walk(request)
            except _Again as again:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    if again.contended:
                        emit(EventKind.TIMED_OUT, self.name, key)
                        return None
                    cause = BackendUnavailable(str(again), backend=again.tier)
                    causes = {**again.causes, again.tier: cause}
                    raise AllBackendsUnavailable(self.name, causes) from None
                # look again soon: the upper tier may be back before the gate opens
                until = again.at if deadline is None else min(again.at, deadline)
                time.sleep(max(0.0, min(until - now, backoff)))
                backoff = min(backoff * 2, 0.5)

    def _allowed(self) -> list[str]:
        """The tiers the switch lets through right now, in order."""
        return self.order if self.switch is None else self.switch.tiers(self.order)

    def _walk(self, request: _Request) -> Lease | None:
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
            if not self._usable(tier, causes):
                continue
            try:
                lease = self._acquire_on(tier, request)
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
                self._confirm(tier, lease, failed_above, request, causes)
            return lease
        raise AllBackendsUnavailable(self.name, causes)

    def _usable(self, tier: str, causes: dict[str, BaseException]) -> bool:
        """Whether to try `tier` now. An open breaker skips it at no cost; once its
        reset_timeout is over, one caller probes it with a ping, which no lock can hold
        up (a probe that waited on a contended key would keep the tier looking down)."""
        breaker = self.breakers[tier]
        if not breaker.allow():
            causes[tier] = BackendUnavailable(f"{tier}: circuit open, skipped", backend=tier)
            return False
        if breaker.state is not BreakerState.HALF_OPEN:
            return True
        error = self._ping(tier)
        if error is not None:
            causes[tier] = error
            return False
        return True

    def _ping(self, tier: str) -> BackendUnavailable | None:
        """Look at `tier` and record what is seen; the error if it failed."""
        try:
            answer = self._observed(tier, self.tiers[tier].ping)
        except BaseException:  # no verdict on the tier: free the probe this may be
            self.breakers[tier].release_probe()
            raise
        return answer if isinstance(answer, BackendUnavailable) else None

    def _observed(self, tier: str, call: Callable[[], R]) -> R | BackendUnavailable:
        """`call` on `tier`, recorded as a sign of life or a failure (with how long it
        took: a hung server fails slowly); the error is returned, not raised."""
        started = time.monotonic()
        try:
            answer = call()
        except BackendUnavailable as error:
            self._failed(tier, time.monotonic() - started)
            return error
        self._answered(tier)
        return answer

    def _acquire_on(self, tier: str, request: _Request) -> Lease | None:
        """Acquire on one tier with retries that never run past the deadline. The first
        try runs outside tenacity: the common case, success, pays nothing for retries."""
        provider = self.tiers[tier]

        def attempt() -> Lease | None:
            try:
                return request.on(provider)
            except BackendUnavailable as error:
                if error.ambiguous and error.token:
                    # the lock may have been taken: release that token once the tier answers
                    self.counts["ambiguous"] += 1
                    pending = Pending(key=request.key, owner=request.owner, token=error.token)
                    self._pending.queue(tier, pending)
                raise

        try:
            return attempt()
        except BackendUnavailable as error:
            first_failure = error
        replayed = False

        def retried() -> Lease | None:
            # tenacity's attempt 1 is the failure above, replayed at no cost
            nonlocal replayed
            if not replayed:
                replayed = True
                raise first_failure
            return attempt()

        retrying = self.retry
        left = request.remaining()
        if left is not None:
            configured, by_deadline = retrying.stop, stop_before_delay(left)

            def stop(state: RetryCallState) -> bool:
                return bool(configured(state)) or bool(by_deadline(state))

            retrying = retrying.copy(stop=stop)
        result: Lease | None = retrying(retried)
        return result

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
    ) -> None:
        """Let a safe-mode grant stand, or undo it and raise `_Again`: the tiers above a
        lower tier's grant must still be failing, and no tier below may hold the key for
        another owner. A lower tier's grant ends at `max_lease` whatever happens."""
        provider = self.tiers[tier]
        for above in failed_above:
            if self._ping(above) is None:  # it is back: the grant must come from there
                self._release_quietly(lease)
                raise _Again(tier, time.monotonic(), causes)
        if self.order.index(tier) > 0:
            provider.bound(lease, self.max_lease)  # type: ignore[attr-defined]
        for lower in self.order[self.order.index(tier) + 1 :]:
            if self._held_below(lower, request):
                self._release_quietly(lease)
                raise _Again(lower, time.monotonic() + 0.05, causes, contended=True)

    def _held_below(self, tier: str, request: _Request) -> bool:
        """Whether `tier` may hold `request.key` for another owner: a read, or, if the tier
        cannot be read, whether it may still have leases out (they end by `max_lease`)."""
        holder = self.tiers[tier].holder  # type: ignore[attr-defined]
        found = self._observed(tier, functools.partial(holder, request.key))
        if isinstance(found, BackendUnavailable):
            opens_at = self._outages.opens_at(tier, self.max_lease)
            return opens_at is None or opens_at > time.monotonic()
        return found is not None and bool(found.owner != request.owner)

    def _watch_failed_tiers(self) -> None:
        """Safe mode: look at every failed tier until it answers, so its outage clock runs
        without a gap however rarely acquires come (and it fails back at once)."""
        while not self._closed.wait(WATCH_EVERY):
            down = self._outages.down()
            if not down:
                with self._lock:
                    if not self._outages.down():
                        self._watcher = None
                        return
                continue
            for tier in down:
                with contextlib.suppress(LockError):
                    self._ping(tier)

    # -- health bookkeeping ------------------------------------------------------------------

    def _failed(self, tier: str, took: float = 0.0) -> None:
        self.breakers[tier].failure()
        self._outages.saw_down(tier, took)
        if self.mode == "safe" and self._watcher is None:
            with self._lock:
                if self._watcher is None and not self._closed.is_set():
                    self._watcher = threading.Thread(
                        target=self._watch_failed_tiers, name=f"locks-watch-{self.name}",
                        daemon=True,
                    )  # fmt: skip
                    self._watcher.start()

    def _answered(self, tier: str) -> None:
        self.breakers[tier].success()
        if self._outages.saw_up(tier):
            self.counts["recovered"] += 1
            emit(EventKind.RECOVERED, tier, "")
        self._pending.answered(self.tiers[tier])  # releases that waited for it to answer

    def _breaker_changed(self, tier: str, old: BreakerState, new: BreakerState) -> None:
        emit(EventKind.BREAKER, tier, "", detail=f"{old} -> {new}")

    # -- release and the rest of the protocol -------------------------------------------------

    def _tier_of(self, lease: Lease) -> LockProvider:
        if not isinstance(lease, Lease):
            raise TypeError(f"lease must be a Lease, not {type(lease).__name__}")
        provider = self.tiers.get(lease.backend)
        if provider is None:
            raise ValueError(
                f"lease was granted by {lease.backend!r}, not by a tier of {self.name!r}"
            )
        return provider

    def release(self, lease: Lease) -> None:
        """Release on the tier that granted it, whatever the switch or breakers say now.
        A tier that does not answer does not make this raise: the release is queued."""
        self._release_or_queue(self._tier_of(lease), lease)

    def _release_or_queue(self, provider: LockProvider, lease: Lease) -> None:
        try:
            provider.release(lease)
        except BackendUnavailable as error:
            self._failed(provider.name)
            self.counts["release_queued"] += 1
            self._pending.queue(provider.name, Pending(lease=lease))
            emit(EventKind.RELEASE_QUEUED, provider.name, lease.key, lease, error=error)

    def _release_quietly(self, lease: Lease) -> None:
        with contextlib.suppress(LockNotOwned):
            self._release_or_queue(self.tiers[lease.backend], lease)

    def pending(self, tier: str) -> int:
        """How many releases wait for `tier` to answer."""
        return self._pending.count(tier)

    def extend(self, lease: Lease, ttl: float | None = None) -> Lease:
        return self._tier_of(lease).extend(lease, ttl)

    def is_held(self, lease: Lease) -> bool:
        return self._tier_of(lease).is_held(lease)

    def holder(self, key: str) -> Holder | None:
        """Who holds `key` on the first tier, in chain order, that knows of a holder
        (tiers that cannot answer or cannot tell are passed over)."""
        key = check_name(key)
        for tier in self._allowed():
            holder = getattr(self.tiers[tier], "holder", None)
            if holder is None:
                continue
            with contextlib.suppress(BackendUnavailable, NotImplementedError):
                found: Holder | None = holder(key)
                if found is not None:
                    return found
        return None

    def break_lock(self, key: str, *, by: str | None = None) -> Holder | None:
        """Free `key` on every tier that can break a lock from another process (see
        `ProviderBase.break_lock`), whatever the switch allows: a grant on any of them
        may be the stuck one. The holder found first in chain order. A tier that could
        not be asked makes it raise, once every other tier was broken: break again."""
        key = check_name(key)
        found: list[Holder] = []
        errors: list[LockError] = []
        for provider in self.tiers.values():
            breaks = getattr(provider, "break_lock", None)
            if breaks is None or not provider.capabilities.cross_process:
                continue
            try:
                broken: Holder | None = breaks(key, by=by)
            except LockError as error:
                errors.append(error)
                continue
            found += [broken] if broken is not None else []
        if errors:
            raise errors[0]
        return found[0] if found else None

    def ping(self) -> None:
        """Succeed if any tier the switch allows answers."""
        tiers = self._allowed()
        causes: dict[str, BaseException] = {}
        for tier in tiers:
            try:
                self.tiers[tier].ping()
                return
            except BackendUnavailable as error:
                causes[tier] = error
        raise AllBackendsUnavailable(self.name, causes)

    def close(self) -> None:
        """Stop watching failed tiers. The tiers themselves may serve other chains and
        are closed by whoever made them."""
        self._closed.set()
