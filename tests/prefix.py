"""Defects the safety issue fixed, re-created in the test tree only (never a switch in the
library), so the campaigns and the model can show they would find them."""

from __future__ import annotations

from locks import Lease
from locks.backends import ZooKeeperProvider
from locks.fallback.chain import FallbackChain, _Request
from locks.steps import Steps


class SilentZooKeeper(ZooKeeperProvider):
    """Before the fix: with the server gone, a suspended session's leases stayed in doubt
    for ever; kazoo says LOST only once it reaches a server again."""

    def _suspended_too_long(self, since: float) -> None:
        return None


class UnreadSafeChain(FallbackChain):
    """Before the fix: safe mode trusted its own process's view. A lower tier's grant was
    neither bounded nor confirmed, and an upper tier's grant read no lower tier, so a
    process that had not seen the outage took the key back while a holder on the lower
    tier still worked."""

    def _confirm(
        self,
        tier: str,
        lease: Lease,
        failed_above: list[str],
        request: _Request,
        causes: dict[str, BaseException],
    ) -> Steps[None]:
        return
        yield  # a generator of no steps: nothing confirmed
