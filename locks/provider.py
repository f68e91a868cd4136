"""The protocol every backend and chain implements, the lease it grants, and the
user-facing `Lock` handle."""

from __future__ import annotations

import functools
import inspect
import re
import string
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from types import TracebackType
from typing import Any, ParamSpec, Protocol, TypeVar, cast, runtime_checkable

from locks.errors import LockLost, LockNotOwned, LockTimeout
from locks.names import check_name, check_ttl, check_wait
from locks.owner import in_this_process

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend guarantees; the contract suite runs only the tests that apply."""

    reentrant: bool
    expires: bool  # a lease ends by itself after its ttl (False: bound to a thread or session)
    renewable: bool  # ttl=None leases are kept alive by the watchdog
    fair: bool  # waiters are served first come, first served
    fenced: bool  # every grant carries a strictly increasing fence
    cross_process: bool
    cross_host: bool

    def __and__(self, other: Capabilities) -> Capabilities:
        """What two backends both guarantee: a chain offers the intersection of its tiers."""
        return Capabilities(
            **{name: getattr(self, name) and getattr(other, name) for name in _CAPABILITY_NAMES}
        )


_CAPABILITY_NAMES = tuple(Capabilities.__dataclass_fields__)

LostCallback = Callable[["Lease"], None]


class LeaseState:
    """The parts of a lease that change after it is granted, guarded by one lock and
    written only by its provider and the watchdog.

    A lease ends once: released (`ended`) or `lost`. An ended or lost lease never reaches
    the server again, except a release whose first try could not tell whether it ran
    (`retry_release`): its server call is guarded by the grant's own token, so running
    it twice changes nothing."""

    __slots__ = ("_callbacks", "_lock", "ended", "hold", "lost", "reason", "retry_release",
                 "suspended", "valid_until")  # fmt: skip

    def __init__(
        self, valid_until: float | None, on_lost: LostCallback | None = None, hold: object = None
    ) -> None:
        self._lock = threading.Lock()
        self.valid_until = valid_until
        self.lost = False
        self.ended = False  # released by its holder
        self.retry_release = False  # the release's server call failed: it may be sent again
        self.suspended = False  # its backend's session is in doubt (ZooKeeper SUSPENDED)
        self.reason = ""
        self.hold = hold  # the provider's record of the server grant this lease is a level of
        self._callbacks: list[LostCallback] = [] if on_lost is None else [on_lost]

    def renewed(self, valid_until: float) -> None:
        with self._lock:
            if not self.lost and not self.ended:
                self.valid_until = valid_until

    def begin_release(self) -> bool:
        """Claim the release: True if it is a retry of a server call that failed, False if
        it is the first; raises LookupError (with the reason) if the lease has ended."""
        with self._lock:
            if self.lost:
                raise LookupError(f"it was lost: {self.reason}")
            if self.ended and not self.retry_release:
                raise LookupError("it was released already")
            retry, self.ended, self.retry_release = self.ended, True, False
            return retry

    def release_failed(self) -> None:
        """The release's server call could not tell whether it ran: allow a retry."""
        with self._lock:
            self.retry_release = not self.lost

    def expired(self, now: float) -> bool:
        return self.valid_until is not None and now >= self.valid_until

    def live(self, now: float) -> bool:
        """Not ended, not lost, not past its validity."""
        return not (self.ended or self.lost or self.expired(now))

    def mark_lost(self, reason: str, *, releasing: bool = False) -> list[LostCallback] | None:
        """Mark the lease lost and return the callbacks to run; None if it already ended.
        `releasing`: its holder's first release found the grant gone, so it was lost
        before that release, which has claimed it (`ended`)."""
        with self._lock:
            if self.lost or (self.ended and not releasing):
                return None
            self.lost = True
            self.reason = reason
            callbacks, self._callbacks = self._callbacks, []
            return callbacks


@dataclass(frozen=True, slots=True, weakref_slot=True)
class Lease:
    """One grant of a lock. `acquired_at` is `time.monotonic()` when the acquire request
    was sent; `ttl` is the lease length in force (the watchdog ttl when `auto_renew`)."""

    key: str
    backend: str
    owner: str
    token: str
    fence: int
    ttl: float
    depth: int
    acquired_at: float
    auto_renew: bool
    state: LeaseState = field(compare=False, repr=False)

    @property
    def lost(self) -> bool:
        return self.state.lost

    def copy(self, ttl: float | None = None) -> Lease:
        """The same lease (sharing its state) as another object, with `ttl` if given:
        positional construction, several times cheaper than `dataclasses.replace`."""
        return Lease(self.key, self.backend, self.owner, self.token, self.fence,
                     self.ttl if ttl is None else ttl, self.depth, self.acquired_at,
                     self.auto_renew, self.state)  # fmt: skip

    def detached(self) -> Lease:
        """The same grant's names with a state of its own, ended: what an ended grant's
        record keeps, so it does not keep (or make a cycle with) its holder's state."""
        state = LeaseState(None)
        state.ended = True
        return Lease(self.key, self.backend, self.owner, self.token, self.fence, self.ttl,
                     self.depth, self.acquired_at, self.auto_renew, state)  # fmt: skip

    @property
    def valid_until(self) -> float | None:
        """Monotonic time after which the backend may hand the lock to someone else."""
        return self.state.valid_until

    @property
    def drift(self) -> float:
        """Safety margin for clock drift and the last round trip (1% of ttl + 2 ms)."""
        return self.ttl * 0.01 + 0.002

    def check(self) -> None:
        """Raise `LockLost` unless this lease may still be relied on right now."""
        state = self.state
        where = f"lease on {self.key!r} from {self.backend!r}"
        if not in_this_process(self.owner):
            raise LockLost(f"{where} belongs to the parent of this forked process")
        if state.lost:
            raise LockLost(f"{where} was lost: {state.reason}")
        if state.ended:
            raise LockLost(f"{where} was released")
        if state.suspended:
            raise LockLost(f"{where} is in doubt: the connection to its backend is suspended")
        valid_until = state.valid_until
        if valid_until is not None and time.monotonic() > valid_until - self.drift:
            if self.auto_renew:
                # it should have been renewed in time and was not: its holder hears of the
                # loss (on_lost) before anyone can act on it, here if nobody told it yet
                from locks.watchdog import mark_lost  # noqa: PLC0415 - watchdog imports us

                mark_lost(self, "its validity ran out before it could be renewed")
                raise LockLost(f"{where} was lost: {state.reason}")
            raise LockLost(f"{where} expired")


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a lock on one backend, as that backend sees it at this moment: for
    operators (`locks inspect`), never for deciding anything, as it may change at once."""

    key: str
    backend: str
    owner: str
    depth: int | None  # None where levels are counted in the holder's process only
    fence: int | None
    expires_in: float | None  # seconds; None where the lease is a session or a thread
    waiters: int | None = None  # known where waiters queue on the server (ZooKeeper)


@runtime_checkable
class LockProvider(Protocol):
    """A lock backend, a chain or a quorum of them. The semantics: docs/semantics.md."""

    name: str

    @property
    def capabilities(self) -> Capabilities: ...

    def acquire(
        self,
        key: str,
        *,
        ttl: float | None = None,
        wait: float | None = None,
        on_lost: LostCallback | None = None,
    ) -> Lease | None: ...

    def release(self, lease: Lease) -> None: ...

    def extend(self, lease: Lease, ttl: float | None = None) -> Lease: ...

    def is_held(self, lease: Lease) -> bool: ...

    def ping(self) -> None: ...

    def close(self) -> None: ...

    def lock(
        self,
        key: str,
        *,
        ttl: float | None = None,
        wait: float | None = None,
        on_lost: LostCallback | None = None,
    ) -> Lock: ...


class _Default(Enum):
    WAIT = "the handle's wait"


class Handle:
    """What both faces' lock handles share: their arguments, checked before any I/O,
    and what a `with` block that got nothing raises."""

    owner_kind = "thread"  # who holds a lease through the handle
    block = "with"

    def __init__(
        self,
        provider: Any,
        key: str,
        *,
        ttl: float | None = None,
        wait: float | None = None,
        on_lost: Any = None,
    ) -> None:
        self.provider = provider
        self.key = check_name(key)
        self.ttl = check_ttl(ttl)
        self.wait = check_wait(wait)
        self.on_lost = on_lost

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.key!r}, provider={self.provider.name!r}, "
            f"ttl={self.ttl}, wait={self.wait})"
        )

    def _timed_out(self, mine: bool) -> LockTimeout:
        """The error of a `with` whose acquire got nothing; `mine`: the caller held the
        lock through this handle already."""
        where = f"{self.key!r} on {self.provider.name!r}"
        if mine and not self.provider.capabilities.reentrant:
            return LockTimeout(
                f"{where} is already held by this {self.owner_kind}, and "
                f"{self.provider.name!r} is not reentrant: a nested `{self.block}` cannot "
                "take it again"
            )
        return LockTimeout(
            f"{where} stayed held by another owner for the whole wait of {self.wait} s"
        )


class Lock(Handle):
    """A named lock bound to a provider, used as `with provider.lock("order:1", wait=2) as lease:`.

    One handle may be shared by threads like a `threading.Lock`: each thread's leases
    are kept apart, and nested `with` blocks on a reentrant backend nest.
    """

    provider: LockProvider

    def __init__(
        self,
        provider: LockProvider,
        key: str,
        *,
        ttl: float | None = None,
        wait: float | None = None,
        on_lost: LostCallback | None = None,
    ) -> None:
        super().__init__(provider, key, ttl=ttl, wait=wait, on_lost=on_lost)
        self._held = threading.local()

    def _stack(self) -> list[Lease]:
        stack: list[Lease] | None = getattr(self._held, "leases", None)
        if stack is None:
            stack = self._held.leases = []
        return stack

    @property
    def lease(self) -> Lease | None:
        """The calling thread's innermost lease from this handle, if any."""
        stack = self._stack()
        return stack[-1] if stack else None

    def acquire(
        self,
        wait: float | bool | _Default | None = _Default.WAIT,
        *,
        blocking: bool | None = None,
        timeout: float = -1,
    ) -> Lease | None:
        """Acquire with the handle's `wait` (or the one given); `None` if it ran out.

        Also as `threading.Lock.acquire(blocking=True, timeout=-1)`: `acquire(False)`
        tries once, `acquire(True, timeout=2)` waits up to 2 s, `acquire(timeout=2)` too;
        the lease is truthy, None is not, so `if lock.acquire(False):` ports as is.
        `acquire(True)` waits as `acquire()` does: for the handle's `wait`."""
        if isinstance(wait, bool):  # threading's first argument is `blocking`
            blocking, wait = wait, _Default.WAIT
        if blocking is not None or timeout != -1:
            wait = _threading_wait(blocking is not False, timeout)
        lease = self.provider.acquire(
            self.key,
            ttl=self.ttl,
            wait=self.wait if isinstance(wait, _Default) else wait,
            on_lost=self.on_lost,
        )
        if lease is not None:
            self._stack().append(lease)
        return lease

    def release(self) -> None:
        """Release the calling thread's innermost lease from this handle."""
        stack = self._stack()
        if not stack:
            raise RuntimeError(f"{self!r} is not held by this thread")
        self.provider.release(stack.pop())

    def extend(self, ttl: float | None = None) -> Lease:
        stack = self._stack()
        if not stack:
            raise RuntimeError(f"{self!r} is not held by this thread")
        stack[-1] = self.provider.extend(stack[-1], ttl)
        return stack[-1]

    def locked(self) -> bool:
        """Whether the calling thread holds this lock through this handle, asked of the backend."""
        lease = self.lease
        return lease is not None and self.provider.is_held(lease)

    def __enter__(self) -> Lease:
        mine = bool(self._stack())  # this thread holds it through this handle already
        lease = self.acquire()
        if lease is None:
            raise self._timed_out(mine)
        return lease

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()


def check_lease(lease: Lease, backend: str) -> None:
    """Refuse, before any I/O, what is not a lease `backend` granted."""
    if not isinstance(lease, Lease):
        raise TypeError(f"lease must be a Lease, not {type(lease).__name__}")
    if lease.backend != backend:
        raise ValueError(f"lease was granted by {lease.backend!r}, not by {backend!r}")


def check_mine(lease: Lease, backend: str) -> None:
    """`check_lease`, and refuse a lease of the parent of this forked process."""
    check_lease(lease, backend)
    if not in_this_process(lease.owner):
        raise LockNotOwned(
            f"{lease.key!r}: this lease belongs to the parent of this forked process"
        )


H = TypeVar("H")


def hold_of(lease: Lease, kind: type[H]) -> H:
    """The provider's record of the grant `lease` is a level of; `LockNotOwned` for a
    lease made by hand, which can touch nothing."""
    hold = lease.state.hold
    if not isinstance(hold, kind):
        raise LockNotOwned(f"{lease.key!r}: this lease was never granted in this process")
    return hold


def _threading_wait(blocking: bool, timeout: float) -> float | _Default | None:
    """`threading.Lock.acquire`'s arguments as our `wait`, refused as it refuses them;
    blocking with no timeout waits as the handle does (for ever, unless it was given a
    `wait`)."""
    if not blocking:
        if timeout != -1:
            raise ValueError("timeout: a non-blocking acquire cannot have one")
        return 0.0
    if timeout == -1:
        return _Default.WAIT
    if timeout < 0:
        raise ValueError(f"timeout must be -1 (for ever) or at least 0, got {timeout!r}")
    return check_wait(timeout, "timeout")


class MakesLocks:
    """The protocol's `lock`, and the `locked` decorator, for every provider (backends,
    chains, quorums)."""

    def lock(
        self,
        key: str,
        *,
        ttl: float | None = None,
        wait: float | None = None,
        on_lost: LostCallback | None = None,
    ) -> Lock:
        return Lock(cast(LockProvider, self), key, ttl=ttl, wait=wait, on_lost=on_lost)

    def locked(
        self, key_template: str, *, ttl: float | None = None, wait: float | None = None
    ) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """Run the decorated function under the lock named by `key_template`, formatted
        with the call's arguments: `@provider.locked("order:{order_id}", wait=2)`.
        Raises `LockTimeout` when `wait` runs out."""
        check_ttl(ttl)
        check_wait(wait)

        def decorate(function: Callable[P, R]) -> Callable[P, R]:
            if inspect.iscoroutinefunction(function):
                # the lock would be taken and released around making the coroutine,
                # and the body would run unlocked
                raise TypeError(
                    f"{function.__qualname__} is a coroutine function: a thread's lock "
                    "cannot guard its awaited body (use locks.aio's providers, whose "
                    "`locked` decorates `async def`)"
                )
            key_of = key_maker(key_template, function)

            @functools.wraps(function)
            def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
                with self.lock(key_of(*args, **kwargs), ttl=ttl, wait=wait):
                    return function(*args, **kwargs)

            return wrapper

        return decorate


def key_maker(template: str, function: Callable[..., object]) -> Callable[..., str]:
    """What names the lock of one call of `function`: `template` formatted with the
    call's arguments (defaults applied). Its fields are checked now, not at the first call."""
    signature = inspect.signature(function)
    _check_template(template, signature, function)

    def key_of(*args: object, **kwargs: object) -> str:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return template.format(**bound.arguments)

    return key_of


def _check_template(template: str, signature: inspect.Signature, function: object) -> None:
    """Every field of `template` must be an argument of the function (a `KeyError` at
    the first call would name neither)."""
    for _, field_name, _, _ in string.Formatter().parse(template):
        if field_name is None:
            continue
        argument = re.split(r"[.\[]", field_name, maxsplit=1)[0]
        if argument not in signature.parameters:
            name = getattr(function, "__qualname__", repr(function))
            raise ValueError(
                f"key_template {template!r} names {{{field_name}}}, but {name} has no "
                f"argument {argument!r} (it has: {', '.join(signature.parameters) or 'none'})"
            )
