"""ZooKeeper lock nodes under a digest identity (issue 18): kazoo creates nodes open to
every client unless told otherwise, and an anonymous client of the ensemble deleted a
holder's node, so the next waiter held the lock too."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from locks import AccessDenied
from locks.backends import ZooKeeperProvider
from tests.guarded import assert_refused_by_acls, holders_node
from tests.servers import ZooKeeperServer
from tests.threads import in_thread


@pytest.fixture
def root() -> str:
    """A root of its own: the first provider to use a root sets its ACL."""
    return f"/acl-{uuid.uuid4().hex}"


@pytest.fixture
def intruders(zookeeper_server: ZooKeeperServer) -> Iterator[list[KazooClient]]:
    clients = [
        KazooClient(hosts=zookeeper_server.url),
        KazooClient(hosts=zookeeper_server.url, auth_data=[("digest", "intruder:pw")]),
    ]
    for client in clients:
        client.start(timeout=10)
    yield clients
    for client in clients:
        client.stop()
        client.close()


def test_no_other_client_can_delete_a_holders_node_or_queue_for_its_lock(
    zookeeper_server: ZooKeeperServer, root: str, key: str, intruders: list[KazooClient]
) -> None:
    provider = ZooKeeperProvider(zookeeper_server.url, root=root, username="locker",
                                 password="s3cret")  # fmt: skip
    try:
        lease = provider.acquire(key, wait=5)
        assert lease is not None
        parent, node = holders_node(provider, key)
        for client in intruders:  # anonymous, and another digest identity
            assert_refused_by_acls(client, parent, node)
            with pytest.raises(NoAuthError):
                client.create(f"{root}/another-key")
        assert provider.is_held(lease)
        same = ZooKeeperProvider(zookeeper_server.url, root=root, username="locker",
                                 password="s3cret")  # fmt: skip
        assert in_thread(lambda: same.acquire(key, wait=0)) is None  # excluded, not refused
        same.close()
        provider.release(lease)
    finally:
        provider.close()


@pytest.mark.parametrize(
    ("username", "password"), [("locker", "wrong-password"), ("intruder", "pw"), (None, None)]
)
def test_a_wrong_or_missing_identity_is_access_denied_never_unavailable(
    zookeeper_server: ZooKeeperServer,
    root: str,
    key: str,
    username: str | None,
    password: str | None,
) -> None:
    owner = ZooKeeperProvider(zookeeper_server.url, root=root, username="locker",
                              password="s3cret")  # fmt: skip
    other = ZooKeeperProvider(zookeeper_server.url, root=root, username=username,
                              password=password)  # fmt: skip
    try:
        owner.ping()
        assert owner.acquire(key + ":made", wait=5) is not None  # the root exists, protected
        with pytest.raises(AccessDenied) as denied:
            other.acquire(key, wait=0)
        assert "wrong-password" not in str(denied.value)
        assert zookeeper_server.address in str(denied.value)
    finally:
        other.close()
        owner.close()


def test_half_an_identity_is_refused_before_any_io() -> None:
    with pytest.raises(ValueError, match="username and password"):
        ZooKeeperProvider("127.0.0.1:1", username="locker")
    with pytest.raises(ValueError, match="username"):
        ZooKeeperProvider("127.0.0.1:1", username="a:b", password="pw")


def test_kazoos_debug_log_never_shows_the_digest_password(
    zookeeper_server: ZooKeeperServer, root: str, caplog: pytest.LogCaptureFixture
) -> None:
    """kazoo logs each request at DEBUG, the digest `Auth` with `user:password` in it:
    the provider's clients log through a logger that masks it."""
    caplog.set_level(logging.DEBUG)
    provider = ZooKeeperProvider(zookeeper_server.url, root=root, username="app",
                                 password="digest-pw-x21")  # fmt: skip
    try:
        lease = provider.acquire("k", ttl=None, wait=5)
        assert lease is not None
        provider.release(lease)
    finally:
        provider.close()
    assert "Auth" in caplog.text  # kazoo did log the request
    assert "digest-pw-x21" not in caplog.text
