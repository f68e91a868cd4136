"""Releases that wait for a backend to answer again: a chain's tier or a quorum's member
that was down when a lease was released, or when an acquire's outcome was unknown (its
lock may have been taken under a token nobody holds). Each is sent once the backend
answers anything; a release that fails again stays queued."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from locks.errors import BackendUnavailable, LockNotOwned
from locks.forking import start_afresh_when_forked
from locks.provider import Lease
from locks.steps import Steps, call, run

logger = logging.getLogger("locks")


@dataclass(frozen=True)
class Pending:
    """A lease to release, or a token whose acquire had an unknown outcome."""

    lease: Lease | None = None
    key: str = ""
    owner: str = ""
    token: str = ""


class PendingReleases:
    """The queues, one per backend name. `start` runs a flush (`flush_steps`) apart from
    the caller, who is on a lock's hot path: a thread of its own by default; the asyncio
    face starts a task."""

    def __init__(self, start: Callable[[Steps[None]], object] | None = None) -> None:
        self._start = _on_a_thread if start is None else start
        self._reset()
        start_afresh_when_forked(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[str, list[Pending]] = {}

    def after_fork_in_child(self) -> None:
        self._reset()  # what waits is the parent's to send, not a child's

    def queue(self, backend: str, item: Pending) -> None:
        with self._lock:
            self._queues.setdefault(backend, []).append(item)

    def count(self, backend: str) -> int:
        with self._lock:
            return len(self._queues.get(backend, ()))

    def answered(self, provider: object) -> None:
        """`provider` answered: send what waits for it. No lock taken when nothing waits."""
        if self._queues.get(getattr(provider, "name", "")):
            self._start(self.flush_steps(provider))

    def flush_steps(self, provider: object) -> Steps[None]:
        name = getattr(provider, "name", "")
        with self._lock:
            batch, self._queues[name] = self._queues.get(name, []), []
        for index, item in enumerate(batch):
            try:
                if item.lease is not None:
                    yield from call(provider, "release", item.lease)
                elif hasattr(provider, "release_token"):
                    yield from call(provider, "release_token", item.key, item.owner, item.token)
            except LockNotOwned:
                continue  # it expired meanwhile: nothing left to release
            except BackendUnavailable:
                with self._lock:
                    self._queues[name][:0] = batch[index:]
                return
            except Exception:  # a provider closed meanwhile, or a bug: said, never raised
                logger.exception("a queued release on %r failed", name)


def _on_a_thread(steps: Steps[None]) -> None:
    threading.Thread(target=run, args=(steps,), daemon=True).start()
