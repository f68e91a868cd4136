"""What this process holds: one `Hold` per grant a server made, and the levels this
process stacked on it.

Reentrancy is counted here, for every backend alike. The server sees one grant per
ownership period (depth 1 there); a nested acquire by the owner that holds a key is a
new level of its hold, a lease with a token of its own, and costs no round trip unless
the server's expiry must reach further for it. Only the release of the last live level
goes to the server, under the hold's own token. So a level released twice, or a release
replayed after it had in fact run (a reply lost, a chain's queued release), can never
undo another grant, and one level's expiry never shortens another's: the server's
expiry always covers every live level.

Holds are found by (domain, owner, key): provider objects of one lock domain (the same
server and namespace) share them, so a thread holding a key through one object
re-enters it through another instead of waiting for itself.

A hold refers to its levels weakly, as a file object is not kept open by the runtime:
a lease its holder dropped without releasing it stops counting as live, so the watchdog
stops renewing it (the server lets it expire within its ttl) and a `ResourceWarning`
names the key. The grant's identity (`anchor`) is a copy the hold keeps for itself.
"""

from __future__ import annotations

import logging
import threading
import warnings
import weakref
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, cast

from locks.forking import start_afresh_when_forked
from locks.provider import Lease, LeaseState

if TYPE_CHECKING:
    from locks.base import ProviderBase
    from locks.keeper import LeaseKeeper


logger = logging.getLogger("locks")


class Copies:
    """The lease objects its holder has of one level, referred to weakly: the level is
    live while any of them is (`extend` with a new ttl hands out a copy sharing the
    level's state, and either may be the one kept)."""

    __slots__ = ("_refs",)

    def __init__(self, lease: Lease) -> None:
        self._refs = [weakref.ref(lease, _collected(lease, self))]

    def add(self, copy: Lease) -> None:
        self._refs.append(weakref.ref(copy, _collected(copy, self)))

    def get(self) -> Lease | None:
        """One of them still referenced, or None: every one was dropped."""
        for ref in self._refs:
            lease = ref()
            if lease is not None:
                return lease
        return None


def _collected(lease: Lease, copies: Copies) -> Callable[[weakref.ref[Lease]], None] | None:
    """What runs when `lease` is collected: a warning if it was the last copy of a
    renewed lease nobody released. It runs inside the garbage collector, on any
    thread: it takes no lock."""
    if not lease.auto_renew:
        return None  # it expires by itself, as it would have if kept
    key, backend, ttl, state = lease.key, lease.backend, lease.ttl, lease.state

    def collected(_: weakref.ref[Lease]) -> None:
        if not (state.ended or state.lost) and copies.get() is None:
            message = (
                f"lease on {key!r} from {backend!r} was dropped without release: its "
                f"renewal stopped, and the backend frees it within {ttl:g} s"
            )
            logger.warning("%s", message)
            warnings.warn(message, ResourceWarning, stacklevel=1)

    return collected


class Hold:
    """One server grant: `anchor` is a copy of its first level (its token and fence are
    the ones the server knows), `levels` the levels granted on it that are still
    referenced, in order."""

    __slots__ = ("_done", "_levels", "anchor", "ending", "limit", "lock", "over", "provider",
                 "serial", "valid_until", "watched")  # fmt: skip

    def __init__(self, provider: LeaseKeeper, first: Lease, valid_until: float | None) -> None:
        self.provider = provider  # the object that made the grant: its connection serves it
        self.anchor = first.copy()  # not `first`: the holder may drop that
        self._levels = [Copies(first)]
        # when the server may give the key away, as far as this process can tell (sent
        # time of the last request that set the expiry, plus its ttl); None: no expiry
        self.valid_until = valid_until
        self.limit: float | None = None  # no level may be valid past this (safe-mode bound)
        # guards levels and expiry, and is held across the I/O that changes the server's
        # expiry, so two levels' renewals can never leave it shorter than either needs
        self.lock = threading.Lock()
        # the asyncio face's counterpart, held across its awaited calls that change the
        # server's expiry (`lock` is never held across an await); made on first use
        self.serial: object = None
        self.ending = False  # its last level is being released: it takes no new level
        self.over = False  # released, lost or closed: forgotten by the registry
        self._done: threading.Event | None = None  # made only for someone who waits
        self.watched = False

    @property
    def key(self) -> str:
        return self.anchor.key

    @property
    def levels(self) -> list[Lease]:
        """The levels still referenced by their holders, in order."""
        return [level for copies in self._levels if (level := copies.get()) is not None]

    def add(self, level: Lease) -> None:
        """Stack a new level (called under `lock`)."""
        self._levels.append(Copies(level))

    def copied(self, copy: Lease) -> None:
        """`copy` shares the state of one of the levels: it keeps that level live too."""
        for copies in self._levels:
            level = copies.get()
            if level is not None and level.state is copy.state:
                copies.add(copy)
                return

    def drop(self, state: LeaseState) -> None:
        """Unstack the level whose state is `state`, and those dropped (under `lock`)."""
        kept = []
        for copies in self._levels:
            level = copies.get()
            if level is not None and level.state is not state:
                kept.append(copies)
        self._levels = kept

    def finish(self) -> None:
        """Mark it over (callable with or without `lock` held)."""
        self.over = True
        # the anchor shares its first level's state, whose `hold` is this hold: a cycle
        # of seven objects a grant that only the garbage collector could free, whose
        # passes (every ~100 grants) lagged an asyncio loop's p99 twofold. An ended
        # hold needs its anchor's names, not its state.
        self.anchor = self.anchor.detached()
        done = self._done  # read after `over` is set: see `wait_over`
        if done is not None:
            done.set()

    def wait_over(self) -> None:
        """Wait until the hold is over (its last release is under way, and bounded by a
        socket timeout)."""
        with self.lock:
            if self._done is None:
                self._done = threading.Event()
            done = self._done
        if not self.over:  # read after the event exists: `finish` sets one or the other
            done.wait()

    def live(self, now: float) -> list[Lease]:
        return [level for level in self.levels if level.state.live(now)]

    def target(self, now: float, want: float, besides: LeaseState | None = None) -> float:
        """The ttl to send so the server's expiry covers `want` seconds and every live
        level but `besides` (called under `lock`), bounded by `limit`."""
        until = now + want
        for level in self.levels:
            valid_until = level.state.valid_until
            if valid_until is not None and level.state is not besides and level.state.live(now):
                until = max(until, valid_until)
        if self.limit is not None:
            until = min(until, self.limit)
        return until - now

    # the watchdog's protocol (`locks.watchdog.Renewable`)

    def renew(self) -> float | None:
        # only a threaded provider's watchdog calls this (the asyncio face renews itself)
        return cast("ProviderBase", self.provider)._renew_holds([self])[0]

    def expire(self, now: float) -> float | None:
        return self.provider._expire_hold(self, now)


class Holds:
    """Every live hold of this process: by (domain, owner, key) for reentrancy, and by
    provider for `close`. Each change is one dict operation, atomic in CPython, so the
    hot path takes no lock."""

    def __init__(self) -> None:
        self._reset()
        start_afresh_when_forked(self)

    def _reset(self) -> None:
        self._by_key: dict[tuple[Hashable, str, str], Hold] = {}
        self._by_provider: dict[int, dict[int, Hold]] = {}

    def after_fork_in_child(self) -> None:
        # the parent's holds are the parent's: a child has an owner identity of its own,
        # and must never release (or close) what its parent holds
        self._reset()

    def find(self, domain: Hashable, owner: str, key: str) -> Hold | None:
        return self._by_key.get((domain, owner, key))

    def add(self, hold: Hold, domain: Hashable | None) -> None:
        """Record `hold`; under `domain` too if its backend is reentrant (not None)."""
        anchor = hold.anchor
        if domain is not None:
            self._by_key[(domain, anchor.owner, anchor.key)] = hold
        self._by_provider.setdefault(id(hold.provider), {})[id(hold)] = hold

    def remove(self, hold: Hold, domain: Hashable | None) -> bool:
        """Forget `hold`; False if it was gone already."""
        mine = self._by_provider.get(id(hold.provider))
        if mine is None or mine.pop(id(hold), None) is None:
            return False
        if domain is not None:
            anchor = hold.anchor
            entry = (domain, anchor.owner, anchor.key)
            if self._by_key.get(entry) is hold:
                self._by_key.pop(entry, None)
        return True

    def of(self, provider: LeaseKeeper) -> list[Hold]:
        return list(self._by_provider.get(id(provider), {}).values())


holds = Holds()
