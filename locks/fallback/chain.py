"""FallbackChain: a LockProvider over tiers (Redis -> ZooKeeper -> database -> local, or
any order), moving down only when a tier is unavailable, never on contention.

Two tiers are two lock domains: a holder on Redis and a newcomer on ZooKeeper cannot
see each other. `mode` says what to do about it:

- `fast` degrades at once. Leases granted by a tier just before it died may overlap with
  leases the next tier grants, until they run out.
- `safe` never lets two tiers grant one key at once under crash-stop faults. A lower
  tier grants nothing until `max_lease` (which bounds every ttl and watchdog ttl in the
  chain) has passed since this process first saw the upper tier fail; until then
  acquires wait within their own `wait`. For `max_lease` after a failed tier answers
  again, acquires take the key on it and on every tier that granted meanwhile.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import operator
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_before_delay,
    wait_fixed,
)

from locks.errors import AllBackendsUnavailable, BackendUnavailable, LockNotOwned
from locks.events import EventKind, emit
from locks.fallback.breaker import Breaker, BreakerState
from locks.fallback.switch import Switch
from locks.names import check_acquire, check_name, check_seconds
from locks.owner import current_owner
from locks.provider import Capabilities, Holder, Lease, Lock, LockProvider, LostCallback

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

    def on(self, provider: LockProvider) -> Lease | None:
        return provider.acquire(self.key, ttl=self.ttl, wait=self.remaining(), on_lost=self.on_lost)


@dataclass(frozen=True)
class _Pending:
    """A release that waits for its tier to answer: a lease, or a token whose acquire
    had an unknown outcome."""

    lease: Lease | None = None
    key: str = ""
    owner: str = ""
    token: str = ""


class _Closed(Exception):
    """Safe mode: a lower tier may not grant before `opens_at` (monotonic)."""

    def __init__(self, tier: str, opens_at: float, causes: dict[str, BaseException]) -> None:
        wait = opens_at - time.monotonic()
        super().__init__(f"safe mode: {tier} may grant in {wait:.1f} s")
        self.tier = tier
        self.opens_at = opens_at
        self.causes = causes  # why the tiers above it were passed over


class FallbackChain:
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
        self._down_since: dict[str, float] = {}  # first failure seen, until it answers again
        self._back_since: dict[str, float] = {}  # safe mode: answered again at
        self._served: dict[str, set[str]] = {}  # safe mode: tiers that granted while it was down
        self._shadows: dict[int, list[Lease]] = {}  # safe mode: the second lease of a key
        self._pending: dict[str, list[_Pending]] = {}

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
        while True:
            try:
                return self._walk(request)
            except _Closed as closed:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    cause = BackendUnavailable(str(closed), backend=closed.tier)
                    causes = {**closed.causes, closed.tier: cause}
                    raise AllBackendsUnavailable(self.name, causes) from None
                # look again soon: the upper tier may be back before the gate opens
                until = closed.opens_at if deadline is None else min(closed.opens_at, deadline)
                time.sleep(max(0.0, min(until - now, 0.5)))

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
            if not self.breakers[tier].allow():
                causes[tier] = BackendUnavailable(f"{tier}: circuit open, skipped", backend=tier)
                self._note_down(tier)
                continue
            try:
                lease = self._acquire_on(tier, request)
            except BackendUnavailable as error:
                self.breakers[tier].failure()
                self._note_down(tier)
                causes[tier] = error
                following = tiers[position + 1] if position + 1 < len(tiers) else None
                self.counts["degraded"] += 1
                emit(EventKind.DEGRADED, tier, request.key, error=error, detail=f"to {following}")
                continue
            except BaseException:  # no verdict on the tier (a bug, an interrupt): free the probe
                self.breakers[tier].release_probe()
                raise
            self.breakers[tier].success()
            self._note_up(tier)
            if lease is None:  # contention: never asks a lower tier
                return None
            return self._settle(tier, lease, failed_above, request)
        raise AllBackendsUnavailable(self.name, causes)

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
                    pending = _Pending(key=request.key, owner=request.owner, token=error.token)
                    self._queue(tier, pending)
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
        """Raise `_Closed` while a tier above `tier` that failed may still have leases out."""
        if not failed_above:
            return
        with self._lock:
            opens_at = max(self._down_since.get(t, 0.0) + self.max_lease for t in failed_above)
        if opens_at > time.monotonic():
            raise _Closed(tier, opens_at, causes)

    def _settle(
        self, tier: str, lease: Lease, failed_above: list[str], request: _Request
    ) -> Lease | None:
        """Record who granted while which tier was down; in safe mode, during a fail-back
        window also take the key on the tiers that served during the outage."""
        if self.mode != "safe":
            return lease
        now = time.monotonic()
        with self._lock:
            for above in failed_above:
                self._served.setdefault(above, set()).add(tier)
            back = self._back_since.get(tier)
            if back is not None and now >= back + self.max_lease:
                del self._back_since[tier]
                self._served.pop(tier, None)
                back = None
            lower = sorted(self._served.get(tier, ())) if back is not None else []
        shadows: list[Lease] = []
        for other in lower:
            try:
                shadow = request.on(self.tiers[other])
            except BackendUnavailable as error:
                logger.warning(
                    "safe fail-back: %s unavailable, not holding %r there: %s",
                    other, request.key, error,
                )  # fmt: skip
                continue
            if shadow is None:  # someone from the outage still holds it there
                for taken in (*shadows, lease):
                    self._release_quietly(taken)
                return None
            shadows.append(shadow)
        if shadows:
            with self._lock:
                self._shadows[id(lease.state)] = shadows
        return lease

    # -- health bookkeeping ------------------------------------------------------------------

    def _note_down(self, tier: str) -> None:
        with self._lock:
            self._down_since.setdefault(tier, time.monotonic())

    def _note_up(self, tier: str) -> None:
        with self._lock:
            was_down = self._down_since.pop(tier, None) is not None
            if was_down and self.mode == "safe" and self._served.get(tier):
                self._back_since[tier] = time.monotonic()
            pending = bool(self._pending.get(tier))
        if was_down:
            self.counts["recovered"] += 1
            emit(EventKind.RECOVERED, tier, "")
        if pending:
            threading.Thread(target=self._flush, args=(tier,), daemon=True).start()

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
        provider = self._tier_of(lease)
        with self._lock:
            shadows = self._shadows.pop(id(lease.state), [])
        try:
            self._release_or_queue(provider, lease)
        finally:
            for shadow in shadows:
                self._release_quietly(shadow)

    def _release_or_queue(self, provider: LockProvider, lease: Lease) -> None:
        try:
            provider.release(lease)
        except BackendUnavailable as error:
            self.counts["release_queued"] += 1
            self._queue(provider.name, _Pending(lease=lease))
            emit(EventKind.RELEASE_QUEUED, provider.name, lease.key, lease, error=error)

    def _release_quietly(self, lease: Lease) -> None:
        with contextlib.suppress(LockNotOwned):
            self._release_or_queue(self.tiers[lease.backend], lease)

    def _queue(self, tier: str, pending: _Pending) -> None:
        with self._lock:
            self._pending.setdefault(tier, []).append(pending)

    def pending(self, tier: str) -> int:
        """How many releases wait for `tier` to answer."""
        with self._lock:
            return len(self._pending.get(tier, ()))

    def _flush(self, tier: str) -> None:
        """Send the releases that waited for `tier`; those that fail again stay queued."""
        with self._lock:
            batch, self._pending[tier] = self._pending.get(tier, []), []
        provider = self.tiers[tier]
        for index, item in enumerate(batch):
            try:
                if item.lease is not None:
                    provider.release(item.lease)
                else:
                    release_token = getattr(provider, "release_token", None)
                    if release_token is not None:
                        release_token(item.key, item.owner, item.token)
            except LockNotOwned:
                continue  # it expired meanwhile: nothing left to release
            except BackendUnavailable:
                with self._lock:
                    self._pending[tier][:0] = batch[index:]
                return

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
        """Nothing of its own to free: tiers may serve other chains and are closed by
        whoever made them."""

    def lock(
        self,
        key: str,
        *,
        ttl: float | None = None,
        wait: float | None = None,
        on_lost: LostCallback | None = None,
    ) -> Lock:
        return Lock(self, key, ttl=ttl, wait=wait, on_lost=on_lost)
