"""What an identity other than the holder's must not do to a holder's ZooKeeper node
(tests/test_zookeeper_acl.py for digest, tests/test_zookeeper_sasl.py for SASL)."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE

from locks.backends import ZooKeeperProvider


def holders_node(provider: ZooKeeperProvider, key: str) -> tuple[str, str]:
    """The lock's parent and the holder's node, the parent's only child."""
    parent = provider._parent(key)
    (child,) = provider.client.get_children(parent)
    return parent, f"{parent}/{child}"


def assert_refused_by_acls(client: KazooClient, parent: str, node: str) -> None:
    """`client` can neither delete the holder's node, nor queue beside it, nor open its
    ACL."""
    with pytest.raises(NoAuthError):
        client.delete(node)
    with pytest.raises(NoAuthError):
        client.create(f"{parent}/sneaky-", ephemeral=True, sequence=True)
    with pytest.raises(NoAuthError):
        client.set_acls(node, list(OPEN_ACL_UNSAFE))
