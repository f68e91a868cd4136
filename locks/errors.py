"""The error hierarchy. Only `BackendUnavailable` makes a chain degrade: an outage may end
by itself, so trying the next tier keeps the service up. `BackendError` and `AccessDenied`
are answers from a server that is up and refuses or does not understand us: no retry and
no other tier fixes a configuration mistake, so they are raised, never degraded past."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class LockError(Exception):
    """Base of every error this library raises on purpose."""


class LockTimeout(LockError):
    """`wait` ran out while another owner held the lock. Never degrades a chain."""


class LockNotOwned(LockError):
    """Release or extend of a lease this owner no longer holds; nothing was changed."""


class LockLost(LockError):
    """The lease expired, its renewal failed, or it was released."""


def _restore(cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    error = cls.__new__(cls)
    BaseException.__init__(error, *args)
    error.__dict__.update(state)
    return error


class BackendUnavailable(LockError):
    """The backend could not be reached (refused, timed out, session lost).

    `ambiguous` is True when the failed call was an acquire that may have reached
    the server: the lock may have been taken under `token`, and whoever saw this
    error should release that token on `backend` once it answers again.
    """

    def __init__(
        self,
        message: str,
        *,
        backend: str,
        address: str = "",
        ambiguous: bool = False,
        key: str | None = None,
        token: str | None = None,
    ) -> None:
        super().__init__(message)
        self.backend = backend
        self.address = address
        self.ambiguous = ambiguous
        self.key = key
        self.token = token

    def __reduce__(self) -> tuple[Any, ...]:
        # keyword-only arguments defeat Exception's pickling; errors cross processes
        return (_restore, (type(self), self.args, self.__dict__))


class AllBackendsUnavailable(BackendUnavailable):
    """Every tier of a chain failed; `causes` maps each tier's name to its error."""

    def __init__(self, chain: str, causes: Mapping[str, BaseException]) -> None:
        detail = "; ".join(f"{tier}: {cause}" for tier, cause in causes.items())
        super().__init__(f"every backend of {chain!r} is unavailable ({detail})", backend=chain)
        self.causes = dict(causes)


class BackendError(LockError):
    """A backend answered with an error that is not an outage: a key of the wrong type, a
    reply that is not the server's protocol, an error nobody planned for. Never degrades.
    `backend` and `address` say where; the driver's error is the `__cause__`."""

    def __init__(self, message: str, *, backend: str, address: str = "") -> None:
        super().__init__(message)
        self.backend = backend
        self.address = address

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (type(self), self.args, self.__dict__))


class AccessDenied(BackendError):
    """The backend refused our credentials or a permission (a wrong password, a missing
    ACL or grant): a configuration error, never an outage, so it never degrades."""


class ConfigError(LockError):
    """Bad configuration: unknown key, backend type, backend or scenario name."""
