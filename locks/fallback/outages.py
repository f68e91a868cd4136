"""Outage clocks: since when a chain has seen a tier fail, without a gap in its watch.

Safe mode lets a lower tier grant only once the failed tier's longest lease
(`max_lease`) can have run out since the tier went down. The clock for that starts at
the first failure seen and stops (the outage is over) at the first sign of life. A gap
in the watch restarts it: if nobody looked at the tier for a while, it may have come
back, granted, and failed again unseen, and a lease granted then may still be valid.
While any tier is down, a safe chain's watcher looks at it every `WATCH_EVERY` seconds,
so the watch has no gap as long as the process runs.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

WATCH_EVERY = 0.1  # seconds between two looks at a failed tier
GAP = 2.0  # seconds without a look (beyond the slowest failing call) that restart a clock


@dataclass
class _Outage:
    since: float  # the outage clock: when this unbroken run of failures began
    seen: float  # the last failure seen
    slowest: float = 0.0  # the longest a failing call took (a hung server answers late)


class Outages:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_tier: dict[str, _Outage] = {}

    def saw_down(self, tier: str, took: float = 0.0) -> None:
        """`tier` failed a call that took `took` seconds."""
        now = time.monotonic()
        with self._lock:
            outage = self._by_tier.get(tier)
            if outage is None or now - outage.seen > GAP + outage.slowest + took:
                self._by_tier[tier] = _Outage(now, now, took)  # new, or the watch had a gap
            else:
                outage.seen = now
                outage.slowest = max(outage.slowest, took)

    def saw_up(self, tier: str) -> bool:
        """`tier` answered: its outage, if any, is over. True if it was down."""
        with self._lock:
            return self._by_tier.pop(tier, None) is not None

    def opens_at(self, tier: str, max_lease: float) -> float | None:
        """When every lease `tier` granted before it went down has run out, or None if
        it is not known to be down. A watch with a gap restarts the clock now."""
        now = time.monotonic()
        with self._lock:
            outage = self._by_tier.get(tier)
            if outage is None:
                return None
            if now - outage.seen > GAP + outage.slowest:
                outage.since = outage.seen = now
            return outage.since + max_lease

    def down(self) -> list[str]:
        with self._lock:
            return list(self._by_tier)
