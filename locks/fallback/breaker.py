"""A circuit breaker per chain tier: after `failures` consecutive failures the tier is
skipped with no I/O for `reset_timeout` seconds; then one caller probes it (half-open):
success closes the breaker (fail-back), failure opens it again."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from enum import StrEnum

from locks.names import check_seconds


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


StateListener = Callable[[BreakerState, BreakerState], None]


class Breaker:
    def __init__(
        self,
        failures: int = 1,
        reset_timeout: float = 5.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(failures, bool) or not isinstance(failures, int) or failures < 1:
            raise ValueError(f"failures must be an int >= 1, got {failures!r}")
        self.failures = failures
        self.reset_timeout = check_seconds(reset_timeout, "reset_timeout")
        self._clock = clock
        self._lock = threading.Lock()
        self._state = BreakerState.CLOSED
        self._failed = 0
        self._opened_at = 0.0
        self._listeners: list[StateListener] = []

    def fresh(self) -> Breaker:
        """A closed breaker with the same settings: a chain gives one to each tier."""
        return Breaker(self.failures, self.reset_timeout, clock=self._clock)

    def listen(self, listener: StateListener) -> None:
        """Call `listener(old, new)` on every state change (outside the breaker's lock)."""
        self._listeners.append(listener)

    @property
    def state(self) -> BreakerState:
        return self._state

    def allow(self) -> bool:
        """Whether a call may go to the tier now; True for at most one caller at a time
        once the open period is over (that caller is the half-open probe)."""
        with self._lock:
            if self._state is BreakerState.CLOSED:
                return True
            if self._state is BreakerState.HALF_OPEN:
                return False  # a probe is already under way
            if self._clock() < self._opened_at + self.reset_timeout:
                return False
            change = self._set(BreakerState.HALF_OPEN)
        self._notify(change)
        return True

    def success(self) -> None:
        with self._lock:
            self._failed = 0
            change = self._set(BreakerState.CLOSED)
        self._notify(change)

    def failure(self) -> None:
        with self._lock:
            self._failed += 1
            change = None
            if self._state is BreakerState.HALF_OPEN or self._failed >= self.failures:
                self._opened_at = self._clock()
                change = self._set(BreakerState.OPEN)
        self._notify(change)

    def release_probe(self) -> None:
        """The probe ended without a verdict (it was never sent): let the next caller probe."""
        with self._lock:
            change = None
            if self._state is BreakerState.HALF_OPEN:
                change = self._set(BreakerState.OPEN)
                self._opened_at = self._clock() - self.reset_timeout
        self._notify(change)

    def _set(self, new: BreakerState) -> tuple[BreakerState, BreakerState] | None:
        old, self._state = self._state, new
        return None if old is new else (old, new)

    def _notify(self, change: tuple[BreakerState, BreakerState] | None) -> None:
        if change is not None:
            for listener in self._listeners:
                listener(*change)
