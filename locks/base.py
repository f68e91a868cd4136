"""What every backend shares: argument checks before I/O, lease bookkeeping, the
watchdog, events. A backend supplies five small primitives (`_acquire`, `_release`,
`_extend`, `_is_held`, `ping`) and inherits the rest of the `LockProvider` protocol."""

from __future__ import annotations

import dataclasses
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ClassVar, NamedTuple, ParamSpec, TypeVar

from locks.errors import BackendUnavailable, LockNotOwned
from locks.events import EventKind, emit
from locks.names import check_acquire, check_name, check_seconds, check_ttl
from locks.owner import current_owner, in_this_process, new_token
from locks.provider import Capabilities, Holder, Lease, LeaseState, Lock, LostCallback
from locks.watchdog import mark_lost, watchdog

P = ParamSpec("P")
R = TypeVar("R")


class Grant(NamedTuple):
    """What a backend's `_acquire` reports on success."""

    token: str  # the acquisition's token (the outer one, for a reentrant grant)
    fence: int
    depth: int
    sent_at: float  # monotonic time the winning request was sent: validity counts from here


class ProviderBase(ABC):
    type_name: ClassVar[str]  # the backend type, as config names it
    capabilities: ClassVar[Capabilities]
    # the driver's errors that mean "cannot be reached now" (the only ones that degrade)
    unavailable_errors: tuple[type[BaseException], ...] = ()
    address = ""  # where the server is, for error messages (host:port)

    def __init__(self, name: str, watchdog_ttl: float = 30.0) -> None:
        self.name = check_name(name, "name")
        self.watchdog_ttl = check_seconds(watchdog_ttl, "watchdog_ttl")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"

    # -- what a backend implements -------------------------------------------------

    @abstractmethod
    def _acquire(
        self, key: str, owner: str, token: str, ttl: float, deadline: float | None
    ) -> Grant | None:
        """Take `key` for `owner` under the fresh `token`, waiting until the monotonic
        `deadline` (None: forever); None if another owner still held it then."""

    @abstractmethod
    def _release(self, lease: Lease) -> bool:
        """Undo one level of `lease`; False if this owner no longer held it."""

    @abstractmethod
    def _extend(self, lease: Lease, ttl: float) -> bool:
        """Make `lease` expire `ttl` seconds from now; False if no longer held."""

    @abstractmethod
    def _is_held(self, lease: Lease) -> bool: ...

    def _holder(self, key: str) -> Holder | None:
        """Who holds `key` now, as the server sees it (None: nobody)."""
        raise NotImplementedError(f"the {self.type_name} backend cannot say who holds a lock")

    def _granted(self, lease: Lease) -> None:  # noqa: B027 - a hook, empty by default
        """Hook: a lease was made from a grant (for backends that track their leases)."""

    @abstractmethod
    def ping(self) -> None:
        """Raise `BackendUnavailable` unless the backend answers."""

    def close(self) -> None:
        """Stop renewing this provider's leases and free its connections."""
        watchdog().forget(self)

    # -- the protocol ---------------------------------------------------------------

    def acquire(
        self,
        key: str,
        *,
        ttl: float | None = None,
        wait: float | None = None,
        on_lost: LostCallback | None = None,
    ) -> Lease | None:
        key, fixed_ttl, wait = check_acquire(key, ttl, wait, on_lost)
        lease_ttl = self.watchdog_ttl if fixed_ttl is None else fixed_ttl
        owner = current_owner()
        started = time.monotonic()
        deadline = None if wait is None else started + wait
        grant = self._reporting(key, self._acquire, key, owner, new_token(), lease_ttl, deadline)
        if grant is None:
            emit(EventKind.TIMED_OUT, self.name, key, duration=time.monotonic() - started)
            return None
        expires = self.capabilities.expires
        lease = Lease(
            key=key,
            backend=self.name,
            owner=owner,
            token=grant.token,
            fence=grant.fence,
            ttl=lease_ttl,
            depth=grant.depth,
            acquired_at=grant.sent_at,
            auto_renew=fixed_ttl is None and expires,
            state=LeaseState(grant.sent_at + lease_ttl if expires else None, on_lost),
        )
        if lease.auto_renew:
            watchdog().watch(lease, self._renew, self)
        self._granted(lease)
        emit(EventKind.ACQUIRED, self.name, key, lease, duration=time.monotonic() - started)
        return lease

    def release(self, lease: Lease) -> None:
        self._check_mine(lease)
        if lease.auto_renew:
            watchdog().unwatch(lease)
        released = self._reporting(lease.key, self._release, lease)
        lease.state.end()
        if not released:
            raise LockNotOwned(
                f"{lease.key!r} on {self.name!r} is no longer held by this lease "
                f"(it expired or was taken over); nothing was released"
            )
        emit(
            EventKind.RELEASED,
            self.name,
            lease.key,
            lease,
            duration=time.monotonic() - lease.acquired_at,
        )

    def extend(self, lease: Lease, ttl: float | None = None) -> Lease:
        new_ttl = check_ttl(ttl)
        self._check_mine(lease)
        new_ttl = lease.ttl if new_ttl is None else new_ttl
        sent_at = time.monotonic()
        if not self._reporting(lease.key, self._extend, lease, new_ttl):
            mark_lost(lease, "the backend no longer holds it")
            raise LockNotOwned(f"{lease.key!r} on {self.name!r} is no longer held by this lease")
        if self.capabilities.expires:
            lease.state.renewed(sent_at + new_ttl)
        emit(EventKind.EXTENDED, self.name, lease.key, lease)
        return lease if new_ttl == lease.ttl else dataclasses.replace(lease, ttl=new_ttl)

    def release_token(self, key: str, owner: str, token: str) -> bool:
        """Release what an acquire by `owner` under `token` may have taken when its reply
        was lost (`BackendUnavailable.ambiguous`). True if something was released; a
        token that never took the lock changes nothing."""
        key = check_name(key)
        lease = Lease(key, self.name, owner, token, 0, self.watchdog_ttl, 1, 0.0, False,
                      LeaseState(None))  # fmt: skip
        return bool(self._reporting(key, self._release_unknown, lease))

    def _release_unknown(self, lease: Lease) -> bool:
        """Release a grant known only by owner and token (fence and depth unknown)."""
        return self._release(lease)

    def is_held(self, lease: Lease) -> bool:
        self._check_lease(lease)
        if not in_this_process(lease.owner) or lease.state.ended:
            return False
        return bool(self._reporting(lease.key, self._is_held, lease))

    def holder(self, key: str) -> Holder | None:
        """Who holds `key` on this backend right now, or None: for operators and tools.
        Reading it and acting on it is a race; take the lock instead."""
        key = check_name(key)
        return self._reporting(key, self._holder, key)

    def lock(
        self,
        key: str,
        *,
        ttl: float | None = None,
        wait: float | None = None,
        on_lost: LostCallback | None = None,
    ) -> Lock:
        return Lock(self, key, ttl=ttl, wait=wait, on_lost=on_lost)

    # -- shared plumbing --------------------------------------------------------------

    def _secret(self) -> str | None:
        """A password that must never appear in an error message."""
        return None

    def _unavailable(
        self,
        error: BaseException,
        *,
        ambiguous: bool = False,
        key: str | None = None,
        token: str | None = None,
    ) -> BackendUnavailable:
        """The one place a driver's error becomes ours: it names the backend and its
        address, never a password."""
        cause = getattr(error, "orig", None) or error  # SQLAlchemy wraps the driver's error
        lines = str(cause).splitlines()
        detail = lines[0] if lines else ""
        secret = self._secret()
        if secret:
            detail = detail.replace(secret, "***")
        return BackendUnavailable(
            f"{self.type_name} backend {self.name!r} at {self.address} is unavailable: "
            f"{type(cause).__name__}: {detail}",
            backend=self.name,
            address=self.address,
            ambiguous=ambiguous,
            key=key,
            token=token,
        )

    @contextmanager
    def _translated(
        self, *, ambiguous: bool = False, key: str | None = None, token: str | None = None
    ) -> Iterator[None]:
        try:
            yield
        except self.unavailable_errors as error:
            raise self._unavailable(error, ambiguous=ambiguous, key=key, token=token) from error

    def _renew(self, lease: Lease) -> bool:
        return self._extend(lease, lease.ttl)

    def _check_lease(self, lease: Lease) -> None:
        if not isinstance(lease, Lease):
            raise TypeError(f"lease must be a Lease, not {type(lease).__name__}")
        if lease.backend != self.name:
            raise ValueError(f"lease was granted by {lease.backend!r}, not by {self.name!r}")

    def _check_mine(self, lease: Lease) -> None:
        self._check_lease(lease)
        if not in_this_process(lease.owner):
            raise LockNotOwned(
                f"{lease.key!r}: this lease belongs to the parent of this forked process"
            )

    def _reporting(self, key: str, call: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return call(*args, **kwargs)
        except BackendUnavailable as exc:
            emit(EventKind.BACKEND_ERROR, self.name, key, error=exc)
            raise
