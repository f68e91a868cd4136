"""Quorum on threads: `locks.quorum_logic.QuorumLogic` (RedLock generalised to any of
our providers; the algorithm and why it excludes are told there) with its member calls
made at once from the calling thread where a member splits its request (every request
out before any answer is read: one round trip for all) and on pool threads where it
cannot, renewal on a watchdog thread and queued releases on threads of their own."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from locks.forking import start_afresh_when_forked
from locks.owner import acting_for, current_owner
from locks.pending import PendingReleases
from locks.provider import Holder, Lease, LostCallback, MakesLocks
from locks.quorum_logic import (
    QuorumLogic,
    RaisesFence,
    _Grant,
    _Guard,
    fenced_by_raising,
    majority,
)
from locks.steps import Call, Each, Steps, run
from locks.watchdog import Watchdog

__all__ = ["Quorum", "RaisesFence", "fenced_by_raising", "majority"]

_MAX_WORKERS = 256  # member calls in flight across all callers (waiting rounds park here)


def _splits(member: Any) -> bool:
    """Whether `member` sends a request at once and reads its answer later."""
    splits = getattr(member, "splits", None)
    return splits is not None and bool(splits())


def _start(made: Call) -> Callable[[], Any] | None:
    """Send `made`'s request now and return what reads its answer, where its member
    splits that call (a try without waiting, a release); None where it cannot."""
    member: Any = made.target
    if not _splits(member):
        return None
    kwargs = made.kwargs or {}
    if made.method == "acquire" and not kwargs.get("wait"):
        return member.start_acquire(*made.args, ttl=kwargs.get("ttl"))  # type: ignore[no-any-return]
    if made.method == "release":
        return member.start_release(*made.args)  # type: ignore[no-any-return]
    return None


class Quorum(QuorumLogic, MakesLocks):
    """A `LockProvider` over independent members, granting on a quorum of them."""

    _async_members = False

    def _set_up(self) -> None:
        self._watchdog = Watchdog(f"locks-renew-{self.name}")
        self._pending = PendingReleases()
        self._pool = self._new_pool()
        start_afresh_when_forked(self)

    def _new_pool(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(_MAX_WORKERS, thread_name_prefix=f"locks-{self.name}")

    def after_fork_in_child(self) -> None:
        super().after_fork_in_child()
        self._pool = self._new_pool()  # its threads are gone

    def _new_guard(self) -> _Guard:
        return threading.Lock()

    def _each(self, step: Each) -> dict[str, Any]:
        """The calls of `step` at once: a member that splits its request sends it from
        this thread (every request out before any answer is read: one round trip for
        all); the others run on pool threads, and one of them on this thread when no
        request was split."""
        outcomes: dict[str, Any] = {}
        finishers: dict[str, Callable[[], Any]] = {}
        threaded: list[str] = []
        with acting_for(step.owner):
            for name, made in step.calls.items():
                finisher = self._caught(_start, made)
                if isinstance(finisher, BaseException):
                    outcomes[name] = finisher
                elif finisher is None:
                    threaded.append(name)
                else:
                    finishers[name] = finisher
        inline = threaded[0] if threaded and not finishers else None
        futures = {name: self._pool.submit(self._made, step, name)
                   for name in threaded if name != inline}  # fmt: skip
        if inline is not None:
            outcomes[inline] = self._caught(self._made, step, inline)
        for name, finish in finishers.items():
            outcomes[name] = self._caught(finish)
            if step.heard is not None and not isinstance(outcomes[name], BaseException):
                step.heard(name, outcomes[name])
        for name, future in futures.items():
            try:
                outcomes[name] = future.result()
            except BaseException as error:
                outcomes[name] = error
        return outcomes

    @staticmethod
    def _made(step: Each, name: str) -> Any:
        made = step.calls[name]
        with acting_for(step.owner):
            outcome = getattr(made.target, made.method)(*made.args, **(made.kwargs or {}))
        if step.heard is not None:
            step.heard(name, outcome)
        return outcome

    @staticmethod
    def _caught(made: Callable[..., Any], *args: object) -> Any:
        """What `made` returned, or raised: collected, and judged by the caller."""
        try:
            return made(*args)
        except BaseException as error:
            return error

    def _run(self, steps: Steps[Any]) -> Any:
        return run(steps, self._each)

    # -- the protocol ----------------------------------------------------------------------

    def acquire(
        self,
        key: str,
        *,
        ttl: float | None = None,
        wait: float | None = None,
        on_lost: LostCallback | None = None,
    ) -> Lease | None:
        request = self._request(key, ttl, wait, on_lost, current_owner())
        lease: Lease | None = self._run(self._acquiring(request))
        return lease

    def release(self, lease: Lease) -> None:
        """Release on every member; one that does not answer gets it queued, so this
        raises only `LockNotOwned` for a lease that had ended or expired."""
        self._run(self._releasing(lease))

    def extend(self, lease: Lease, ttl: float | None = None) -> Lease:
        extended: Lease = self._run(self._extending(lease, ttl))
        return extended

    def _renew(self, grant: _Grant) -> float | None:
        due: float | None = self._run(self._renewing(grant))
        return due

    def is_held(self, lease: Lease) -> bool:
        return bool(self._run(self._checking(lease)))

    def holder(self, key: str) -> Holder | None:
        found: Holder | None = self._run(self._finding(key, current_owner()))
        return found

    def break_lock(self, key: str, *, by: str | None = None) -> Holder | None:
        broken: Holder | None = self._run(self._breaking(key, by, current_owner()))
        return broken

    def ping(self) -> None:
        self._run(self._pinging(current_owner()))

    def close(self) -> None:
        """End every lease this quorum granted (their `on_lost` run) and release their
        member grants. The members may serve others and are closed by whoever made them."""
        self._closed = True
        self._watchdog.close()
        self._run(self._closing(f"its quorum {self.name!r} was closed"))
        self._pool.shutdown(wait=False)
