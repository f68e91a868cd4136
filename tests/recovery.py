"""After a server restart: how a test gets its first lease again."""

from __future__ import annotations

import pytest

from locks import BackendUnavailable, Lease, LockProvider


def recovered(provider: LockProvider, key: str, tries: int) -> Lease:
    """A lease on `key` once `provider` has dropped the connections that died with the
    server (each found dead costs one `BackendUnavailable`), within `tries` calls."""
    for _ in range(tries):
        try:
            lease = provider.acquire(key, ttl=30)
        except BackendUnavailable:
            continue
        assert lease is not None
        return lease
    pytest.fail("the provider did not recover")
