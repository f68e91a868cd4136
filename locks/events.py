"""Observer hooks. Every provider reports what happens to its leases here; the
default observer logs under the `locks` logger, others (metrics, tests) subscribe."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from locks.provider import Holder, Lease

logger = logging.getLogger("locks")
# A library's convention: nothing on stderr unless the application set up logging
# (without it Python's last-resort handler would print every warning bare).
logger.addHandler(logging.NullHandler())


class EventKind(StrEnum):
    ACQUIRED = "acquired"
    TIMED_OUT = "timed_out"  # wait ran out while another owner held the lock
    RELEASED = "released"
    EXTENDED = "extended"
    LOST = "lost"
    BACKEND_ERROR = "backend_error"
    DEGRADED = "degraded"  # a chain moved past a tier that failed (backend: that tier)
    RECOVERED = "recovered"  # a tier that had failed granted again
    BREAKER = "breaker"  # a tier's circuit breaker changed state (detail: old -> new)
    SWITCHED = "switched"  # the kill-switch changed (detail: the new state)
    RELEASE_QUEUED = "release_queued"  # a release waits for its tier to answer again
    BROKEN = "broken"  # an operator freed a held lock (detail: by whom, whose grant)


@dataclass(frozen=True, slots=True)
class Event:
    kind: EventKind
    backend: str
    key: str
    lease: Lease | None = None
    error: BaseException | None = None
    # seconds waited before an acquire, or held before a release
    duration: float | None = None
    detail: str | None = None


Observer = Callable[[Event], None]

_LEVELS = {
    EventKind.ACQUIRED: logging.DEBUG,
    EventKind.TIMED_OUT: logging.DEBUG,
    EventKind.RELEASED: logging.DEBUG,
    EventKind.EXTENDED: logging.DEBUG,
    EventKind.LOST: logging.WARNING,
    EventKind.BACKEND_ERROR: logging.WARNING,
    EventKind.DEGRADED: logging.WARNING,
    EventKind.RECOVERED: logging.INFO,
    EventKind.BREAKER: logging.INFO,
    EventKind.SWITCHED: logging.INFO,
    EventKind.RELEASE_QUEUED: logging.WARNING,
    EventKind.BROKEN: logging.WARNING,
}


def log_event(event: Event) -> None:
    """The default observer: one line per event on the `locks` logger."""
    level = _LEVELS[event.kind]
    if not logger.isEnabledFor(level):
        return
    fence = f" fence={event.lease.fence}" if event.lease is not None else ""
    detail = f" {event.detail}" if event.detail else ""
    error = f": {event.error}" if event.error is not None else ""
    logger.log(
        level, "%s %s key=%r%s%s%s", event.backend, event.kind, event.key, fence, detail, error
    )


_DEFAULT: tuple[Observer, ...] = (log_event,)
_observers = _DEFAULT
_observers_lock = threading.Lock()


def add_observer(observer: Observer) -> None:
    global _observers
    with _observers_lock:
        _observers = (*_observers, observer)


def remove_observer(observer: Observer) -> None:
    """Remove `observer` (by equality: `events.append` is a new bound method each time
    it is read, equal to the one added, never identical)."""
    global _observers
    with _observers_lock:
        _observers = tuple(o for o in _observers if o != observer)


def emit(
    kind: EventKind,
    backend: str,
    key: str,
    lease: Lease | None = None,
    *,
    error: BaseException | None = None,
    duration: float | None = None,
    detail: str | None = None,
) -> None:
    """Hand the event to every observer; an observer's failure is logged, never raised.

    Builds nothing when only the default observer listens and would not log it: this
    runs on every acquire and release."""
    observers = _observers
    if observers is _DEFAULT and not logger.isEnabledFor(_LEVELS[kind]):
        return
    event = Event(kind, backend, key, lease, error, duration, detail)
    for observer in observers:
        try:
            observer(event)
        except Exception:
            logger.exception("lock event observer %r failed", observer)


def emit_broken(backend: str, key: str, by: str, holder: Holder) -> None:
    """An operator freed `key` (`break_lock`): say who, and whose grant it was."""
    detail = f"by {by}: held by {holder.owner} with fence {holder.fence}"
    emit(EventKind.BROKEN, backend, key, detail=detail)
