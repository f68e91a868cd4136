"""ZooKeeper with SASL (issue 18), against a server that admits SASL clients only
(tests/servers/zookeeper_sasl.py): nodes carry the SASL identity's ACL, and a refused
password is `AccessDenied`, never an outage a chain would degrade past, though kazoo
reports it only as a lost connection. Also `tls_key_password`, the other secret."""

from __future__ import annotations

import functools
import importlib.util
import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import (
    AuthFailedError,
    ConnectionDropped,
    SessionClosedRequireSaslError,
)
from kazoo.security import OPEN_ACL_UNSAFE, Permissions

from locks import (
    AccessDenied,
    BackendUnavailable,
    ConfigError,
    FallbackChain,
    from_config,
)
from locks.backends import LocalProvider, ZooKeeperProvider
from locks.events import Event, EventKind
from tests.guarded import assert_refused_by_acls, holders_node
from tests.ports import free_port
from tests.servers import ZooKeeperServer
from tests.servers.tls_servers import TLSZooKeeperServer
from tests.servers.zookeeper_sasl import USERS, SASLZooKeeperServer
from tests.threads import in_thread
from tests.tls import PKI, encrypted

PASSWORD = USERS["locker"]


@pytest.fixture
def root() -> str:
    """A root of its own: the first provider to use a root sets its ACL."""
    return f"/sasl-{uuid.uuid4().hex}"


def sasl(server: ZooKeeperServer, user: str = "locker", **options: Any) -> ZooKeeperProvider:
    """A provider authenticating as one of the server's SASL users."""
    return ZooKeeperProvider(server.url, auth="sasl", username=user, password=USERS[user],
                             **options)  # fmt: skip


def sasl_client(server: SASLZooKeeperServer, user: str) -> KazooClient:
    client = KazooClient(hosts=server.url, sasl_options={
        "mechanism": "DIGEST-MD5", "username": user, "password": USERS[user]})  # fmt: skip
    client.start(timeout=10)
    return client


def test_sasl_locks_and_its_nodes_admit_only_its_identity(
    zookeeper_sasl: SASLZooKeeperServer, root: str, key: str
) -> None:
    provider = sasl(zookeeper_sasl, root=root)
    try:
        lease = provider.acquire(key, wait=5)
        assert lease is not None and provider.is_held(lease)
        parent = provider._parent(key)
        (child,) = provider.client.get_children(parent)
        for path, perms in (
            (root, Permissions.READ | Permissions.CREATE | Permissions.DELETE),
            (parent, Permissions.READ | Permissions.CREATE | Permissions.DELETE),
            (f"{parent}/{child}", Permissions.READ),
        ):
            acls, _ = provider.client.get_acls(path)
            assert [(acl.id.scheme, acl.id.id, acl.perms) for acl in acls] == [
                ("sasl", "locker", perms)
            ], path
            assert not set(acls) & set(OPEN_ACL_UNSAFE)
        provider.release(lease)
        assert not provider.is_held(lease)
    finally:
        provider.close()


def test_no_other_client_can_delete_a_holders_node_or_take_its_lock(
    zookeeper_sasl: SASLZooKeeperServer, root: str, key: str
) -> None:
    """Another SASL user is refused by the nodes' ACLs; a client without SASL (anonymous,
    or with a digest identity) by the server itself, at its first request."""
    provider = sasl(zookeeper_sasl, root=root)
    other = sasl_client(zookeeper_sasl, "other")
    strangers = [
        KazooClient(hosts=zookeeper_sasl.url),
        KazooClient(hosts=zookeeper_sasl.url, auth_data=[("digest", "locker:x")]),
    ]
    try:
        lease = provider.acquire(key, wait=5)
        assert lease is not None
        parent, node = holders_node(provider, key)
        assert_refused_by_acls(other, parent, node)
        for stranger in strangers:
            stranger.start(timeout=10)  # the server answers the handshake, then nothing
            with pytest.raises(SessionClosedRequireSaslError):
                stranger.delete(node)
        # the same, through the provider: refused, never queued behind the holder
        intruders = [
            sasl(zookeeper_sasl, "other", root=root),
            ZooKeeperProvider(zookeeper_sasl.url, root=root),
            ZooKeeperProvider(zookeeper_sasl.url, root=root, username="locker", password="x"),
        ]
        for intruder in intruders:
            try:
                with pytest.raises(AccessDenied):
                    in_thread(functools.partial(intruder.acquire, key, wait=0))
            finally:
                intruder.close()
        assert provider.is_held(lease)
        assert [f"{parent}/{c}" for c in provider.client.get_children(parent)] == [node]
        provider.release(lease)
    finally:
        provider.close()
        for client in (other, *strangers):
            client.stop()
            client.close()


def refused_by_itself_and_through_a_chain(
    make: Callable[[], ZooKeeperProvider], key: str, events: list[Event], secret: str
) -> AccessDenied:
    """`AccessDenied` from the provider alone, and from a chain over it that neither
    grants from its lower tier nor retries."""
    provider: ZooKeeperProvider = make()
    upper: ZooKeeperProvider = make()
    lower = LocalProvider(name="sasl-local")
    chain = FallbackChain([upper, lower])
    try:
        with pytest.raises(AccessDenied) as denied:
            provider.acquire(key, wait=0)
        events.clear()
        with pytest.raises(AccessDenied) as through_chain:
            chain.acquire(key, ttl=5, wait=0)
        assert len(lower) == 0, "a lower tier granted past a refused SASL password"
        assert not [e for e in events if e.kind is EventKind.DEGRADED]
        assert len([e for e in events if e.kind is EventKind.BACKEND_ERROR]) == 1
        for error in (denied.value, through_chain.value):
            assert error.backend == "zk" and error.address == provider.address
            assert provider.address in str(error)
            assert secret not in str(error) and secret not in repr(error)
        assert secret not in repr(provider)
        with pytest.raises(AccessDenied):  # and from then on: kazoo has stopped
            provider.ping()
        return denied.value
    finally:
        chain.close()
        provider.close()
        upper.close()


# a wrong password, and a user the server does not know
@pytest.mark.parametrize("credentials", [("locker", "not-it-x7"), ("ghost", "boo-x8")])
def test_a_refused_sasl_password_is_access_denied_never_unavailable(
    zookeeper_sasl: SASLZooKeeperServer,
    key: str,
    events: list[Event],
    credentials: tuple[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Left to itself, kazoo says CONNECTED, then the server answers the SASL exchange
    with SessionClosedRequireSasl, which kills kazoo's connection thread: its calls fail
    with ConnectionLoss, then ConnectionClosedError, as if the server had gone. The
    provider hears the refusal itself, with the server's error as the cause."""
    caplog.set_level(logging.DEBUG)
    user, password = credentials
    options: dict[str, Any] = {"name": "zk", "auth": "sasl", "username": user, "password": password}
    denied = refused_by_itself_and_through_a_chain(
        lambda: ZooKeeperProvider(zookeeper_sasl.url, **options), key, events, password
    )
    assert "SASL" in str(denied) and repr(user) in str(denied)
    assert isinstance(denied.__cause__, SessionClosedRequireSaslError)
    assert password not in caplog.text


def test_a_client_passed_in_whose_sasl_is_refused_is_access_denied(
    zookeeper_sasl: SASLZooKeeperServer, key: str
) -> None:
    client = KazooClient(hosts=zookeeper_sasl.url, sasl_options={
        "mechanism": "DIGEST-MD5", "username": "locker", "password": "not-it-x14"})  # fmt: skip
    provider = ZooKeeperProvider(client=client, auth="sasl", username="locker",
                                 password="not-it-x14")  # fmt: skip
    try:
        for _ in range(2):  # the first call races the exchange; the next finds kazoo stopped
            with pytest.raises(AccessDenied):
                provider.acquire(key, wait=0)
        assert isinstance(provider._refused, SessionClosedRequireSaslError)
    finally:
        provider.close()
        client.stop()
        client.close()


def test_sasl_against_a_server_without_sasl_is_access_denied(
    zookeeper_server: ZooKeeperServer, key: str, events: list[Event]
) -> None:
    """A server without a SASL authProvider answers every SASL message with an empty
    challenge, and kazoo answers it at once, until the session expires and the server
    drops the connection ("Connection dropped in SASL"): the provider gives up after a
    few round trips instead, at once."""
    started = time.monotonic()
    options: dict[str, Any] = {
        "name": "zk",
        "auth": "sasl",
        "username": "locker",
        "password": PASSWORD,
    }
    denied = refused_by_itself_and_through_a_chain(
        lambda: ZooKeeperProvider(zookeeper_server.url, **options), key, events, PASSWORD
    )
    assert time.monotonic() - started < 5
    assert isinstance(denied.__cause__, AuthFailedError)


def test_a_connection_cut_mid_exchange_is_retried_unless_it_keeps_happening() -> None:
    """kazoo takes any connection cut during SASL for a refusal and stops for good: a
    server going down at that moment would leave the provider denied forever."""
    outcomes: list[BaseException | None] = []

    def exchange(host: str, timeout: float) -> None:  # kazoo's, as the server goes
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    def cut() -> AuthFailedError:
        error = AuthFailedError("Connection dropped in SASL")
        error.__cause__ = ConnectionDropped("socket connection broken")
        return error

    client = KazooClient(hosts="127.0.0.1:1", sasl_options={
        "mechanism": "DIGEST-MD5", "username": "locker", "password": PASSWORD})  # fmt: skip
    client._connection._authenticate_with_sasl = exchange  # before the provider hears it
    provider = ZooKeeperProvider(client=client, auth="sasl", username="locker",
                                 password=PASSWORD)  # fmt: skip
    authenticate = client._connection._authenticate_with_sasl
    outcomes.extend([cut(), cut(), None, cut(), cut(), cut()])
    for _ in range(2):  # cut twice: retried as an outage, then authenticated
        with pytest.raises(ConnectionDropped):
            authenticate("h", 1.0)
    authenticate("h", 1.0)
    assert provider._refused is None
    for _ in range(2):  # counted afresh after that
        with pytest.raises(ConnectionDropped):
            authenticate("h", 1.0)
    with pytest.raises(AuthFailedError):  # a third in a row: a server that refuses so
        authenticate("h", 1.0)
    assert isinstance(provider._refused, AuthFailedError)
    with pytest.raises(AccessDenied, match="refused SASL authentication as 'locker'"):
        provider._check_refused()
    provider.close()


@pytest.mark.parametrize("fault", ["kill", "pause"])
def test_a_sasl_server_down_is_unavailable_and_degrades(
    zookeeper_sasl: SASLZooKeeperServer, key: str, fault: str
) -> None:
    provider = sasl(zookeeper_sasl, name="zk")
    chain = FallbackChain([sasl(zookeeper_sasl, name="zk"), LocalProvider(name="sasl-down")])
    try:
        provider.ping()  # connected and authenticated once: then the server goes
        chain.tiers["zk"].ping()
        if fault == "kill":
            zookeeper_sasl.kill()
        else:
            zookeeper_sasl.pause()
        deadline = time.monotonic() + 10
        with pytest.raises(BackendUnavailable) as unavailable:
            while time.monotonic() < deadline:  # a paused server: until kazoo notices
                provider.acquire(key, wait=0)
        assert PASSWORD not in str(unavailable.value)
        lease = chain.acquire(key + ":chain", ttl=5, wait=0)
        assert lease is not None and lease.backend == "sasl-down"
        chain.release(lease)
    finally:
        zookeeper_sasl.ensure_running()
        provider.close()
        chain.close()
        for tier in chain.tiers.values():
            tier.close()


def test_a_sasl_server_never_reached_is_unavailable(key: str) -> None:
    provider = ZooKeeperProvider(f"127.0.0.1:{free_port()}", auth="sasl", username="locker",
                                 password=PASSWORD, connect_timeout=0.5)  # fmt: skip
    try:
        with pytest.raises(BackendUnavailable):
            provider.acquire(key, wait=0)
    finally:
        provider.close()


@pytest.mark.parametrize("auth", ["Digest", "SASL", "", "kerberos", None, 1])
def test_an_unknown_auth_is_refused_before_any_io(
    auth: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_client(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a client was made")

    monkeypatch.setattr("locks.backends.zookeeper_session.KazooClient", no_client)
    with pytest.raises(ValueError, match=r"^auth must be 'digest' or 'sasl'"):
        ZooKeeperProvider("127.0.0.1:1", auth=auth, username="locker", password=PASSWORD)


def test_sasl_needs_an_identity_and_pure_sasl(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="username and password"):
        ZooKeeperProvider("127.0.0.1:1", auth="sasl")
    with pytest.raises(ValueError, match="username and password"):
        ZooKeeperProvider("127.0.0.1:1", auth="sasl", username="locker")
    find_spec = importlib.util.find_spec

    def no_pure_sasl(name: str, *args: Any) -> Any:
        return None if name == "puresasl" else find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", no_pure_sasl)
    with pytest.raises(ConfigError, match=r"pip install 'fallback-locks\[zookeeper-sasl\]'"):
        ZooKeeperProvider("127.0.0.1:1", auth="sasl", username="locker", password=PASSWORD)
    # digest needs nothing more
    ZooKeeperProvider("127.0.0.1:1", username="locker", password=PASSWORD).close()


def test_sasl_from_the_toml_keys(
    zookeeper_sasl: SASLZooKeeperServer, key: str, tmp_path: Path
) -> None:
    config = tmp_path / "locks.toml"
    config.write_text(
        "[backends]\n"
        f'zk = {{ type = "zookeeper", hosts = "{zookeeper_sasl.url}", auth = "sasl", '
        'username = "locker", password = "${ZK_PASSWORD}" }\n'
    )
    registry = from_config(config, environ={"ZK_PASSWORD": PASSWORD})
    try:
        provider = registry.backend("zk")
        assert isinstance(provider, ZooKeeperProvider) and provider.auth == "sasl"
        lease = provider.acquire(key, wait=5)
        assert lease is not None
        provider.release(lease)
    finally:
        registry.close()
    config.write_text('[backends]\nzk = { type = "zookeeper", auth = "kerberos" }\n')
    with pytest.raises(ConfigError, match=r"^backends\.zk\.auth: auth must be"):
        from_config(config)


# -- tls_key_password: an encrypted client key ----------------------------------------------


@pytest.fixture(scope="module")
def encrypted_key(pki: PKI) -> tuple[Path, str]:
    """The client's key, encrypted with a password."""
    password = "key-pw-x9"
    return encrypted(pki, pki.client, password).key, password


def tls(server: TLSZooKeeperServer, pki: PKI, key: Path, password: str | None) -> ZooKeeperProvider:
    return ZooKeeperProvider(server.tls_address, name="zk", tls_ca=pki.ca,
                             tls_cert=pki.client.cert, tls_key=key, tls_key_password=password,
                             connect_timeout=1.0, root="/tls")  # fmt: skip


def test_an_encrypted_tls_key_with_its_password_locks(
    zookeeper_tls: TLSZooKeeperServer, pki: PKI, encrypted_key: tuple[Path, str], key: str
) -> None:
    path, password = encrypted_key
    provider = tls(zookeeper_tls, pki, path, password)
    try:
        lease = provider.acquire(key, wait=5)
        assert lease is not None
        provider.release(lease)
        assert password not in repr(provider)
    finally:
        provider.close()


def test_a_wrong_tls_key_password_is_refused_before_any_io_and_never_named(
    zookeeper_tls: TLSZooKeeperServer,
    pki: PKI,
    encrypted_key: tuple[Path, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """kazoo would retry its handshake as if the server were down: the key is loaded
    when the provider is made. None at all: never OpenSSL's prompt on the terminal."""
    caplog.set_level(logging.DEBUG)
    path, _ = encrypted_key
    wrong = "wrong-key-pw-x10"
    for password in (None, "", wrong):
        with pytest.raises(ValueError, match="do not load") as raised:
            tls(zookeeper_tls, pki, path, password)
        assert wrong not in str(raised.value)
    assert wrong not in caplog.text


def test_tls_key_password_needs_a_key_and_is_never_shown(pki: PKI) -> None:
    with pytest.raises(ValueError, match=r"^tls_key_password"):
        ZooKeeperProvider("127.0.0.1:1", tls_ca="/ca.pem", tls_key_password="pw-x11")
    with pytest.raises(TypeError, match=r"^tls_key_password must be a str, not int"):
        ZooKeeperProvider("127.0.0.1:1", tls_ca="/ca.pem", tls_cert="/c.pem", tls_key="/k.pem",
                          tls_key_password=1234)  # type: ignore[arg-type]  # fmt: skip
    client = encrypted(pki, pki.client, "pw-x12")
    provider = ZooKeeperProvider(
        "127.0.0.1:1", tls_ca=pki.ca, tls_cert=client.cert, tls_key=client.key,
        tls_key_password="pw-x12", auth="sasl", username="locker", password="pw-x13",
    )  # fmt: skip
    assert "pw-x12" not in repr(provider) and "pw-x13" not in repr(provider)
    # what every error message goes through: the driver's error, both secrets masked
    detail = provider._detail(OSError("key pw-x12, password pw-x13"))
    assert detail == "OSError: key ***, password ***"
