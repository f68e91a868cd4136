"""The five scenarios of the degradation material, as presets a config can name.

Each preset names backend roles (`redis`, `zk`, `db`, `local`): a config's backends
must be called that way for a scenario to use a preset, or the scenario lists its own
chain. `safety` says what the fallback costs; the docs repeat it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Scenario:
    chain: tuple[str, ...]
    mode: str = "fast"
    max_lease: float = 30.0
    safety: str = ""


PRESETS: dict[str, Scenario] = {
    "inventory": Scenario(
        ("redis", "db"),
        safety=(
            "Falls back to the database: still cross-host. For the leases in flight when "
            "Redis dies, two holders (one per tier) can overlap until those leases run "
            "out, so stock updates should also be guarded (fence or conditional UPDATE)."
        ),
    ),
    "order": Scenario(
        ("redis", "db"),
        safety=(
            "Falls back to the database, like inventory; a duplicate order in the overlap "
            "window is caught by a unique order number in the order table."
        ),
    ),
    "idempotent": Scenario(
        ("redis", "local"),
        safety=(
            "Falls back to a lock inside this process only: other hosts are not excluded "
            "at all. Acceptable only where the work is idempotent and the lock merely "
            "saves duplicate effort."
        ),
    ),
    "funds": Scenario(
        ("redis", "zk"),
        mode="safe",
        max_lease=30.0,
        safety=(
            "Falls back to ZooKeeper only, in safe mode: no two tiers grant one key at once "
            "under crash-stop faults, at the price of waiting up to max_lease after Redis "
            "fails. Never falls back to a local lock: with both down, acquires fail."
        ),
    ),
    "default": Scenario(
        ("redis", "local"),
        safety="Falls back to a process-local lock: as weak as idempotent; pick a scenario.",
    ),
}
