"""TLS on every backend, against real TLS servers (issue 18): a verified connection
locks; a certificate from another CA, a certificate for another host and a missing
client certificate are misconfiguration, `AccessDenied`, never degraded past; a server
that is down is `BackendUnavailable` and degrades, TLS or not.

Where a driver cannot tell a TLS mismatch from an outage, the test asserts what it does
and says so (docs/security.md has the table):

- Redis (redis-py): a missing client certificate (TLS 1.3: our side of the handshake
  ends first) is the server's alert at our first read or, as often, an EOF at our first
  write; on the EOF the provider's own handshake reads the alert: `AccessDenied`. A
  plaintext client on the TLS port meets a reset, on which a TLS handshake of ours finds
  a TLS-only server: `AccessDenied`. A TLS client on a plaintext port times out, as
  against a server that hangs: `BackendUnavailable`. Sentinel and
  Cluster clients keep only the text of why they reached no node: the same handshake
  tells (tests/test_tls_topologies.py).
- ZooKeeper (kazoo): every TLS failure is a connect time-out; the provider's own
  handshake tells the certificate failures apart. A plaintext client on the TLS port
  and a TLS client on the plaintext port end in the server closing the connection:
  `BackendUnavailable`.
- PostgreSQL (libpq): a missing client certificate is the server's FATAL "connection
  requires a valid client certificate" (no SQLSTATE), read as a refusal by its text.

The database tests run on both faces (`face`): the asyncio provider, given the same url
and connect_args, keeps every promise the threaded one does (asyncmy for PyMySQL,
psycopg's asyncio connection for libpq's), through `tests.aio_bridge.Threaded`.
"""

from __future__ import annotations

import inspect
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from locks import (
    AccessDenied,
    BackendUnavailable,
    FallbackChain,
    LockProvider,
    aio,
    from_config,
)
from locks.backends import (
    DatabaseProvider,
    LocalProvider,
    RedisHashProvider,
    RedisProvider,
    ZooKeeperProvider,
)
from locks.backends.dialects import asyncio_url, connect_args, database_url, redacted
from locks.tls import tls_refused
from tests.aio_bridge import Threaded
from tests.ports import free_port
from tests.servers import MariaDBServer, ZooKeeperServer
from tests.servers.postgresql import PostgreSQLServer
from tests.servers.tls_servers import (
    CERT_PASSWORD,
    TLSMariaDBServer,
    TLSPostgreSQLServer,
    TLSRedisServer,
    TLSZooKeeperServer,
)
from tests.tls import CLIENT_CN, PKI, encrypted

Make = Callable[[], LockProvider]


def locks(make: Make, key: str) -> None:
    """A verified TLS connection: acquire, then release."""
    provider = make()
    try:
        lease = provider.acquire(key, ttl=30, wait=0)
        assert lease is not None
        provider.release(lease)
        assert not provider.is_held(lease)
    finally:
        provider.close()


def chained(provider: LockProvider) -> FallbackChain | Threaded:
    """`provider` over `local`, in a chain of its own face."""
    if isinstance(provider, Threaded):
        return Threaded(aio.FallbackChain([provider.aio, aio.LocalProvider()], name="chain"))
    return FallbackChain([provider, LocalProvider()], name="chain")


def refused(make: Make, key: str, *secrets: str) -> AccessDenied:
    """`AccessDenied` from the backend, and from a chain over it with `local` below:
    never granted by the next tier."""
    provider = make()
    chain = chained(make())
    try:
        with pytest.raises(AccessDenied) as denied:
            provider.acquire(key, ttl=30, wait=0)
        with pytest.raises(AccessDenied):
            chain.acquire(key + ":chain", ttl=30, wait=0)
        for secret in secrets:
            assert secret not in str(denied.value)
        return denied.value
    finally:
        provider.close()
        for tier in chain.tiers.values():
            tier.close()


def unavailable(make: Make, key: str) -> BackendUnavailable:
    """`BackendUnavailable` from the backend, and a chain over it degrades to `local`."""
    provider = make()
    chain = chained(make())
    try:
        with pytest.raises(BackendUnavailable) as raised:
            provider.acquire(key, ttl=30, wait=0)
        lease = chain.acquire(key + ":chain", ttl=30, wait=0)
        assert lease is not None and lease.backend == "local"
        chain.release(lease)
        return raised.value
    finally:
        provider.close()
        for tier in chain.tiers.values():
            tier.close()


# -- tls_refused: what only misconfiguration causes -----------------------------------


def _raised_from(cause: BaseException) -> BaseException:
    """A driver's error raised while handling `cause`, as redis-py and PyMySQL do."""
    try:
        try:
            raise cause
        except OSError:
            raise ConnectionError("Error 1 connecting") from None
    except ConnectionError as error:
        error.__context__ = cause
        return error


def _ssl_error(reason: str, cls: type[ssl.SSLError] = ssl.SSLError) -> ssl.SSLError:
    error = cls(1, f"[SSL: {reason}] {reason.lower()}")
    error.reason = reason
    return error


@pytest.mark.parametrize(
    "reason",
    ["TLSV1_ALERT_UNKNOWN_CA", "SSLV3_ALERT_BAD_CERTIFICATE", "WRONG_VERSION_NUMBER",
     "TLSV13_ALERT_CERTIFICATE_REQUIRED", "CERTIFICATE_VERIFY_FAILED"],
)  # fmt: skip
def test_a_refusing_handshake_is_misconfiguration(reason: str) -> None:
    assert tls_refused(_ssl_error(reason))
    assert tls_refused(_raised_from(_ssl_error(reason)))


def test_a_certificate_that_does_not_verify_is_misconfiguration() -> None:
    error = ssl.SSLCertVerificationError(1, "certificate verify failed")
    assert tls_refused(_raised_from(error))
    outer = RuntimeError("wrapped")
    outer.__cause__ = _raised_from(error)
    assert tls_refused(outer)


@pytest.mark.parametrize(
    "error",
    [
        _ssl_error("UNEXPECTED_EOF_WHILE_READING", ssl.SSLEOFError),
        ssl.SSLZeroReturnError(6, "TLS/SSL connection has been closed"),
        ConnectionResetError(104, "Connection reset by peer"),
        ConnectionRefusedError(111, "Connection refused"),
        TimeoutError("_ssl.c:989: The handshake operation timed out"),
        _ssl_error("SOMETHING_ELSE"),
    ],
)
def test_what_a_dying_server_also_causes_is_never_misconfiguration(error: OSError) -> None:
    assert not tls_refused(error)
    assert not tls_refused(_raised_from(error))


def test_a_looping_chain_of_errors_ends() -> None:
    first, second = ValueError("a"), ValueError("b")
    first.__context__, second.__context__ = second, first
    assert not tls_refused(first)


# -- Redis: rediss://, redis-py verifies the chain and the host name by default ----------


@pytest.mark.parametrize("cls", [RedisProvider, RedisHashProvider])
def test_redis_over_verified_tls_locks(
    redis_tls: TLSRedisServer, key: str, cls: type[RedisProvider]
) -> None:
    locks(lambda: cls(redis_tls.tls_url(), name="redis"), key)
    locks(lambda: cls(redis_tls.tls_url(host="localhost"), name="redis"), key)


def test_redis_with_another_ca_is_denied(redis_tls: TLSRedisServer, pki: PKI, key: str) -> None:
    denied = refused(lambda: RedisProvider(redis_tls.tls_url(ca=pki.other_ca), name="redis"),
                     key)  # fmt: skip
    assert redis_tls.tls_address in str(denied)
    assert isinstance(denied.__cause__, Exception) and tls_refused(denied.__cause__)


def test_redis_with_another_host_name_is_denied(
    redis_tls_wronghost: TLSRedisServer, key: str
) -> None:
    denied = refused(lambda: RedisProvider(redis_tls_wronghost.tls_url(), name="redis"), key)
    assert "mismatch" in str(denied)


def test_redis_without_a_client_certificate_is_denied(redis_tls: TLSRedisServer, key: str) -> None:
    """`tls-auth-clients yes` and no certificate: the server refuses it after our side
    of the TLS 1.3 handshake is done, and redis-py meets either its alert (at the first
    read) or, when the server has closed before redis-py's first write (`HELLO`), an
    EOF, which a dying server causes too — a race, about half each. On the EOF the
    provider's own handshake reads the alert: denied every time."""
    for attempt in range(20):
        denied = refused(lambda: RedisProvider(redis_tls.tls_url(client=False), name="redis"),
                         f"{key}:{attempt}")  # fmt: skip
        assert "CERTIFICATE_REQUIRED" in str(denied)


def test_redis_plaintext_against_the_tls_port_is_denied(
    redis_tls: TLSRedisServer, key: str
) -> None:
    """The server resets a connection that does not start a handshake, as a dying one
    may: a TLS handshake of our own finds a server that serves TLS only."""
    denied = refused(lambda: RedisProvider(f"redis://{redis_tls.tls_address}/0", name="redis"),
                     key)  # fmt: skip
    assert "serves TLS only" in str(denied) and "rediss://" in str(denied)


def test_redis_tls_against_a_plaintext_port_looks_like_an_outage(
    redis_tls: TLSRedisServer, key: str
) -> None:
    """A plaintext Redis waits for a command's end in the ClientHello: the handshake
    times out (`connect_timeout`), as against a server that hangs."""
    url = redis_tls.tls_url().replace(f":{redis_tls.tls_port}/", f":{redis_tls.port}/")
    unavailable(lambda: RedisProvider(url, name="redis"), key)


def test_redis_tls_server_down_degrades(redis_tls: TLSRedisServer, key: str) -> None:
    redis_tls.kill()
    unavailable(lambda: RedisProvider(redis_tls.tls_url(), name="redis"), key)


# -- ZooKeeper: tls_ca, tls_cert, tls_key; a handshake of our own tells why ---------------


def zookeeper(server: TLSZooKeeperServer, pki: PKI, **options: Any) -> Make:
    settings: dict[str, Any] = {
        "tls_ca": pki.ca, "tls_cert": pki.client.cert, "tls_key": pki.client.key,
        "connect_timeout": 1.0, "session_timeout": 4.0, "root": "/tls", **options,
    }  # fmt: skip
    hosts = settings.pop("hosts", server.tls_address)
    return lambda: ZooKeeperProvider(hosts, name="zk", **settings)


def test_zookeeper_over_verified_tls_locks(
    zookeeper_tls: TLSZooKeeperServer, pki: PKI, key: str
) -> None:
    locks(zookeeper(zookeeper_tls, pki), key)
    locks(zookeeper(zookeeper_tls, pki, hosts=f"localhost:{zookeeper_tls.secure_port}"), key)


def test_zookeeper_tls_from_the_toml_keys(
    zookeeper_tls: TLSZooKeeperServer, pki: PKI, key: str, tmp_path: Path
) -> None:
    config = tmp_path / "locks.toml"
    config.write_text(
        "[backends]\n"
        f'zk = {{ type = "zookeeper", hosts = "{zookeeper_tls.tls_address}", '
        f'tls_ca = "{pki.ca}", tls_cert = "{pki.client.cert}", tls_key = "{pki.client.key}", '
        "tls_check_hostname = true }\n"
    )
    registry = from_config(config)
    provider = registry.backend("zk")
    assert isinstance(provider, ZooKeeperProvider)
    assert provider.client.use_ssl and provider.client.check_hostname
    locks(lambda: provider, key)


def test_zookeeper_with_another_ca_is_denied(
    zookeeper_tls: TLSZooKeeperServer, pki: PKI, key: str
) -> None:
    denied = refused(zookeeper(zookeeper_tls, pki, tls_ca=pki.other_ca), key)
    assert zookeeper_tls.tls_address in str(denied) and "CERTIFICATE_VERIFY_FAILED" in str(denied)
    assert isinstance(denied.__cause__, ssl.SSLCertVerificationError)


def test_zookeeper_with_another_host_name_is_denied(
    zookeeper_tls_wronghost: TLSZooKeeperServer, pki: PKI, key: str
) -> None:
    denied = refused(zookeeper(zookeeper_tls_wronghost, pki), key)
    assert "mismatch" in str(denied)
    # the chain alone, when asked for: no host-name check
    locks(zookeeper(zookeeper_tls_wronghost, pki, tls_check_hostname=False), key)


def test_zookeeper_without_a_client_certificate_is_denied(
    zookeeper_tls: TLSZooKeeperServer, pki: PKI, key: str
) -> None:
    """`ssl.clientAuth=need`: the server's handshake (TLS 1.2) ends in an alert."""
    denied = refused(zookeeper(zookeeper_tls, pki, tls_cert=None, tls_key=None), key)
    assert "BAD_CERTIFICATE" in str(denied)


def test_zookeeper_plaintext_against_the_tls_port_looks_like_an_outage(
    zookeeper_tls: TLSZooKeeperServer, key: str
) -> None:
    """No TLS configured, so no handshake of ours: the server drops a connection that
    does not start one and kazoo times out, as against a dead server."""
    unavailable(lambda: ZooKeeperProvider(zookeeper_tls.tls_address, name="zk",
                                          connect_timeout=1.0), key)  # fmt: skip


def test_zookeeper_tls_against_the_plaintext_port_looks_like_an_outage(
    zookeeper_tls: TLSZooKeeperServer, pki: PKI, key: str
) -> None:
    """The plaintext port reads the ClientHello as a request and closes the connection:
    our handshake meets an EOF, which a dying server causes too."""
    unavailable(zookeeper(zookeeper_tls, pki, hosts=zookeeper_tls.address), key)


@pytest.mark.parametrize("fault", ["kill", "pause"])
def test_zookeeper_tls_server_down_degrades(
    zookeeper_tls: TLSZooKeeperServer, pki: PKI, key: str, fault: str
) -> None:
    """Refused (killed), or a handshake that never ends (paused): an outage."""
    getattr(zookeeper_tls, fault)()
    started = time.monotonic()
    unavailable(zookeeper(zookeeper_tls, pki), key)
    assert time.monotonic() - started < 15


def test_zookeeper_tls_first_reachable_host_is_asked(
    zookeeper_tls: TLSZooKeeperServer, pki: PKI, key: str
) -> None:
    """A dead member first: the handshake of ours goes to the next one."""
    from tests.ports import free_port  # noqa: PLC0415

    hosts = f"127.0.0.1:{free_port()},{zookeeper_tls.tls_address}"
    refused(zookeeper(zookeeper_tls, pki, hosts=hosts, tls_ca=pki.other_ca), key)


def test_zookeeper_tls_options_are_checked_before_any_io(pki: PKI) -> None:
    with pytest.raises(ValueError, match="tls_cert and tls_key"):
        ZooKeeperProvider("127.0.0.1:1", tls_ca=pki.ca, tls_cert=pki.client.cert)
    with pytest.raises(TypeError, match="tls_check_hostname"):
        ZooKeeperProvider("127.0.0.1:1", tls_ca=pki.ca, tls_check_hostname="no")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tls_check_hostname"):
        ZooKeeperProvider("127.0.0.1:1", tls_check_hostname=False)
    provider = ZooKeeperProvider("127.0.0.1:1", tls_ca=str(pki.ca))
    assert provider.client.use_ssl and provider.client.check_hostname
    assert provider.client.verify_certs and provider.client.ca == str(pki.ca)
    provider.close()
    plain = ZooKeeperProvider("127.0.0.1:1")
    assert not plain.client.use_ssl
    plain.close()


def test_zookeeper_tls_files_missing_are_refused_before_any_io(
    zookeeper_tls: TLSZooKeeperServer, pki: PKI, tmp_path: Path
) -> None:
    """kazoo would retry as if the server were down: the files load when the provider is
    made."""
    with pytest.raises(ValueError, match="do not load"):
        zookeeper(zookeeper_tls, pki, tls_ca=tmp_path / "missing.pem")()


def test_zookeeper_without_tls_is_untouched(zookeeper_server: ZooKeeperServer, key: str) -> None:
    locks(lambda: ZooKeeperProvider(zookeeper_server.url, name="zk"), key)


# -- databases: each test on both faces -------------------------------------------------


@pytest.fixture(params=["threaded", "asyncio"])
def face(request: pytest.FixtureRequest) -> str:
    """The database provider's face: threaded, or asyncio (called through the bridge)."""
    name: str = request.param
    return name


def provider_class(face: str) -> Any:
    return aio.DatabaseProvider if face == "asyncio" else DatabaseProvider


def database(face: str, url: str, **options: Any) -> Make:
    """A provider of `face` for `url`: the asyncio one called as a threaded one."""

    def make() -> LockProvider:
        provider = provider_class(face)(url, name="db", connect_timeout=2, **options)
        made: LockProvider = Threaded(provider) if face == "asyncio" else provider
        return made

    return make


# -- MySQL/MariaDB (PyMySQL; asyncmy on the asyncio face) ---------------------------------


def test_mariadb_over_verified_tls_locks(
    mariadb_tls: TLSMariaDBServer, pki: PKI, key: str, face: str
) -> None:
    """The `locks` user is REQUIRE SSL: a lock is TLS."""
    url = mariadb_tls.tls_url()
    locks(database(face, mariadb_tls.tls_url(query=f"ssl_ca={pki.ca}")), key)  # SQLAlchemy's
    locks(database(face, url, connect_args={"ssl_ca": str(pki.ca)}), key)
    certificate = {"ssl_ca": str(pki.ca), "ssl_cert": str(pki.client.cert),
                   "ssl_key": str(pki.client.key)}  # fmt: skip
    locks(database(face, mariadb_tls.tls_url(user=CLIENT_CN), connect_args=certificate), key)


@pytest.mark.parametrize("form", ["url", "connect_args"])
def test_mariadb_with_another_ca_is_denied(
    mariadb_tls: TLSMariaDBServer, pki: PKI, key: str, form: str, face: str
) -> None:
    """PyMySQL and asyncmy report a TLS failure as 2003, "can't connect", like a refused
    port; the `ssl.SSLCertVerificationError` it was raised from says what it is. Through
    connect_args, PyMySQL's `ssl_ca` alone verified nothing: it connected."""
    if form == "url":
        make = database(face, mariadb_tls.tls_url(query=f"ssl_ca={pki.other_ca}"))
    else:
        make = database(face, mariadb_tls.tls_url(), connect_args={"ssl_ca": str(pki.other_ca)})
    refused(make, key, mariadb_tls.password)


def test_mariadb_with_another_host_name_is_denied(
    mariadb_tls_wronghost: TLSMariaDBServer, pki: PKI, key: str, face: str
) -> None:
    url = mariadb_tls_wronghost.tls_url()
    refused(database(face, mariadb_tls_wronghost.tls_url(query=f"ssl_ca={pki.ca}")), key)
    refused(database(face, url, connect_args={"ssl_ca": str(pki.ca)}), key)
    # only when asked: the chain alone
    chain_only = {"ssl_ca": str(pki.ca), "ssl_verify_identity": False}
    locks(database(face, url, connect_args=chain_only), key)


def test_mariadb_require_x509_without_a_client_certificate_is_denied(
    mariadb_tls: TLSMariaDBServer, pki: PKI, key: str, face: str
) -> None:
    """REQUIRE X509 and no certificate: the server's 1045."""
    url = mariadb_tls.tls_url(user=CLIENT_CN, query=f"ssl_ca={pki.ca}")
    refused(database(face, url), key, CERT_PASSWORD)


def test_mariadb_plaintext_for_a_require_ssl_user_is_denied(
    mariadb_tls: TLSMariaDBServer, key: str, face: str
) -> None:
    """REQUIRE SSL and TLS turned off: the server's 1045."""
    refused(database(face, mariadb_tls.tls_url(), connect_args={"ssl_disabled": True}), key)


def test_mariadb_tls_against_a_server_without_tls_is_denied(
    mariadb_server: MariaDBServer, pki: PKI, key: str, face: str
) -> None:
    """TLS asked for, and the server offers none: PyMySQL's 2026. asyncmy asks for TLS
    whatever the server offers, and meets its plaintext: WRONG_VERSION_NUMBER."""
    refused(database(face, f"{mariadb_server.url}&ssl_ca={pki.ca}"), key)
    refused(database(face, mariadb_server.url, connect_args={"ssl_ca": str(pki.ca)}), key)


@pytest.mark.parametrize("value", ["false", "0", "true"])
def test_ssl_disabled_in_a_mariadb_url_is_refused(
    mariadb_tls: TLSMariaDBServer, value: str, face: str
) -> None:
    """SQLAlchemy passes it on as a string, which PyMySQL reads as true: TLS off (and
    asyncmy takes no such argument)."""
    with pytest.raises(ValueError, match="ssl_disabled"):
        provider_class(face)(mariadb_tls.tls_url(query=f"ssl_disabled={value}"))


def test_mariadb_tls_server_down_degrades(
    mariadb_tls: TLSMariaDBServer, pki: PKI, key: str, face: str
) -> None:
    mariadb_tls.kill()
    unavailable(database(face, mariadb_tls.tls_url(query=f"ssl_ca={pki.ca}")), key)


def _args(url: str, given: dict[str, Any], face: str = "threaded") -> dict[str, Any]:
    parse = asyncio_url if face == "asyncio" else database_url
    return connect_args(parse(url), 1.0, 2.0, given)


def test_pymysql_tls_in_connect_args_verifies_unless_told_not_to() -> None:
    url = "mysql://u:pw@db.example/locks"
    args = _args(url, {"ssl_ca": "/ca.pem"})
    assert args["ssl_verify_cert"] is True and args["ssl_verify_identity"] is True
    args = _args(url, {"ssl_cert": "/c.pem", "ssl_key": "/k.pem"})
    assert args["ssl_verify_cert"] is True and args["ssl_verify_identity"] is True
    args = _args(url, {"ssl_ca": "/ca.pem", "ssl_verify_cert": False})
    assert args["ssl_verify_cert"] is False and "ssl_verify_identity" not in args
    args = _args(url, {"ssl_ca": "/ca.pem", "ssl_verify_identity": False})
    assert args["ssl_verify_cert"] is True and args["ssl_verify_identity"] is False
    assert "ssl_verify_cert" not in _args(url, {})
    assert "ssl_verify_cert" not in _args(f"{url}?ssl_ca=/ca.pem", {})  # SQLAlchemy's form


def _asyncmy_context(**given: Any) -> ssl.SSLContext:
    """The `ssl` asyncmy gets for PyMySQL's TLS arguments `given`, and only arguments
    asyncmy takes (it would refuse PyMySQL's `ssl_*` at the first connection)."""
    import asyncmy  # noqa: PLC0415  (the asyncio extra; the rest of the module needs none)

    args = _args("mysql+pymysql://u:pw@db.example/locks", given, "asyncio")
    inspect.signature(asyncmy.connect).bind(**args)
    context = args["ssl"]
    assert isinstance(context, ssl.SSLContext)
    return context


def test_asyncmy_gets_pymysql_tls_verified_unless_told_not_to(pki: PKI) -> None:
    """The same decisions as PyMySQL's, as an `ssl.SSLContext` (asyncmy's `ssl` dict
    has no key password)."""
    context = _asyncmy_context(ssl_ca=str(pki.ca))
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    client = {"ssl_cert": str(pki.client.cert), "ssl_key": str(pki.client.key)}
    context = _asyncmy_context(**client)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    context = _asyncmy_context(ssl_ca=str(pki.ca), ssl_verify_identity=False)
    assert context.verify_mode == ssl.CERT_REQUIRED and not context.check_hostname
    context = _asyncmy_context(ssl_ca=str(pki.ca), ssl_verify_cert=False)
    assert context.verify_mode == ssl.CERT_NONE and not context.check_hostname


def test_asyncmy_gets_no_tls_where_pymysql_gets_none(pki: PKI) -> None:
    url = "mysql+pymysql://u:pw@db.example/locks"
    assert "ssl" not in _args(url, {}, "asyncio")
    # PyMySQL's `ssl_disabled`: plaintext, whatever else asks for TLS (the url too)
    assert _args(url, {"ssl_disabled": True, "ssl_ca": str(pki.ca)}, "asyncio")["ssl"] is None
    assert "ssl_disabled" not in _args(url, {"ssl_disabled": False}, "asyncio")
    # SQLAlchemy's form: its `ssl` dict, which asyncmy verifies as PyMySQL does
    assert "ssl" not in _args(f"{url}?ssl_ca={pki.ca}", {}, "asyncio")


def test_a_key_password_in_an_ssl_dict_for_asyncmy_is_refused() -> None:
    """asyncmy's `ssl` dict has no password: OpenSSL would ask for it on the terminal."""
    given = {"ssl": {"cert": "/c.pem", "key": "/k.pem", "password": "pw-x2"}}
    with pytest.raises(ValueError, match="ssl_key_password") as raised:
        _args("mysql://u:pw@h/locks", given, "asyncio")
    assert "pw-x2" not in str(raised.value)


@pytest.mark.parametrize("driver", ["pymysql", "asyncmy"])
@pytest.mark.parametrize(
    ("query", "given", "named"),
    [
        ("?ssl_verify_cert=true", {}, "ssl_verify_cert"),
        ("?ssl_verify_identity=false", {}, "ssl_verify_identity"),
        ("?ssl_disabled=false", {}, "ssl_disabled"),
        ("", {"ssl_disabled": "false"}, "ssl_disabled"),
        ("?ssl_ca=/ca.pem", {"ssl_cert": "/c.pem"}, "ssl_ca"),
        ("?ssl_key=/k.pem&ssl_key_password=x", {}, "ssl_key_password"),
    ],
)
def test_pymysql_tls_options_pymysql_would_misread_are_refused(
    driver: str, query: str, given: dict[str, Any], named: str
) -> None:
    """Refused for asyncmy too: the url and connect_args are PyMySQL's on both faces."""
    with pytest.raises(ValueError, match=named) as raised:
        _args(f"mysql+{driver}://u:pw@h/locks{query}", given)
    assert "pw" not in str(raised.value)


# -- PostgreSQL (libpq; psycopg's asyncio connection on the asyncio face) ---------------------


def test_postgresql_over_verified_tls_locks(
    postgresql_tls: TLSPostgreSQLServer, pki: PKI, key: str, face: str
) -> None:
    locks(database(face, postgresql_tls.tls_url(query=f"sslrootcert={pki.ca}")), key)
    query = f"sslmode=verify-full&sslrootcert={pki.ca}"
    locks(database(face, postgresql_tls.tls_url(query=query)), key)
    url = postgresql_tls.tls_url()
    locks(database(face, url, connect_args={"sslrootcert": str(pki.ca)}), key)
    certificate = (f"sslrootcert={pki.ca}&sslcert={pki.client.cert}"
                   f"&sslkey={pki.client.key}")  # fmt: skip
    locks(database(face, postgresql_tls.tls_url(user=CLIENT_CN, query=certificate)), key)


def test_postgresql_with_another_ca_is_denied(
    postgresql_tls: TLSPostgreSQLServer, pki: PKI, key: str, face: str
) -> None:
    make = database(face, postgresql_tls.tls_url(query=f"sslrootcert={pki.other_ca}"))
    denied = refused(make, key, postgresql_tls.password)
    assert "certificate verify failed" in str(denied)


def test_postgresql_with_another_host_name_is_denied(
    postgresql_tls_wronghost: TLSPostgreSQLServer, pki: PKI, key: str, face: str
) -> None:
    """A CA and no sslmode is verify-full: the host name is checked."""
    server = postgresql_tls_wronghost
    denied = refused(database(face, server.tls_url(query=f"sslrootcert={pki.ca}")), key)
    assert "does not match host name" in str(denied)
    url = server.tls_url()
    denied = refused(database(face, url, connect_args={"sslrootcert": str(pki.ca)}), key)
    assert "does not match host name" in str(denied)
    # a weaker sslmode with the CA, when written: the chain only (libpq's verify-ca)
    locks(database(face, server.tls_url(query=f"sslmode=require&sslrootcert={pki.ca}")), key)


def test_postgresql_cert_method_without_a_client_certificate_is_denied(
    postgresql_tls: TLSPostgreSQLServer, pki: PKI, key: str, face: str
) -> None:
    url = postgresql_tls.tls_url(user=CLIENT_CN, query=f"sslrootcert={pki.ca}")
    refused(database(face, url), key)


def test_postgresql_plaintext_against_hostssl_only_is_denied(
    postgresql_tls: TLSPostgreSQLServer, key: str, face: str
) -> None:
    """`sslmode=disable` and only `hostssl` lines: "no pg_hba.conf entry"."""
    refused(database(face, postgresql_tls.tls_url(query="sslmode=disable")), key)


def test_postgresql_tls_against_a_server_without_tls_is_denied(
    postgresql_server: PostgreSQLServer, pki: PKI, key: str, face: str
) -> None:
    """A CA given, so verify-full: "server does not support SSL" (under `prefer` it
    would have gone on in plaintext)."""
    refused(database(face, f"{postgresql_server.url}?sslrootcert={pki.ca}"), key)


def test_postgresql_tls_server_down_degrades(
    postgresql_tls: TLSPostgreSQLServer, pki: PKI, key: str, face: str
) -> None:
    postgresql_tls.kill()
    unavailable(database(face, postgresql_tls.tls_url(query=f"sslrootcert={pki.ca}")), key)


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_a_postgresql_ca_without_sslmode_means_verify_full(driver: str, face: str) -> None:
    """On the asyncio face too, whose driver is psycopg whatever the url names."""
    url = f"postgresql+{driver}://u:pw@db.example/locks"
    if face == "asyncio":
        assert asyncio_url(url).get_driver_name() == "psycopg"
    assert _args(f"{url}?sslrootcert=/ca.pem", {}, face)["sslmode"] == "verify-full"
    assert _args(url, {"sslrootcert": "/ca.pem"}, face)["sslmode"] == "verify-full"
    assert "sslmode" not in _args(f"{url}?sslrootcert=/ca.pem&sslmode=verify-ca", {}, face)
    assert (
        _args(url, {"sslrootcert": "/ca.pem", "sslmode": "require"}, face)["sslmode"] == "require"
    )
    assert "sslmode" not in _args(url, {}, face)


@pytest.fixture
def pgsslmode_set(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("PGSSLMODE", "verify-ca")
    yield


def test_pgsslmode_in_the_environment_is_left_to_libpq(pgsslmode_set: None, face: str) -> None:
    url = "postgresql://u:pw@db.example/locks?sslrootcert=/ca.pem"
    assert "sslmode" not in _args(url, {}, face)


# -- an encrypted client key: its password opens it, and never shows -----------------------

KEY_PASSWORD = "db-key-secret-51c2"


def test_mariadb_encrypted_client_key_with_its_password_locks(
    mariadb_tls: TLSMariaDBServer, pki: PKI, key: str, face: str
) -> None:
    client = encrypted(pki, pki.client, KEY_PASSWORD)
    certificate = {"ssl_ca": str(pki.ca), "ssl_cert": str(client.cert),
                   "ssl_key": str(client.key), "ssl_key_password": KEY_PASSWORD}  # fmt: skip
    locks(database(face, mariadb_tls.tls_url(user=CLIENT_CN), connect_args=certificate), key)


def test_postgresql_encrypted_client_key_with_its_password_locks(
    postgresql_tls: TLSPostgreSQLServer, pki: PKI, key: str, face: str
) -> None:
    client = encrypted(pki, pki.client, KEY_PASSWORD)
    query = (f"sslrootcert={pki.ca}&sslcert={client.cert}&sslkey={client.key}"
             f"&sslpassword={KEY_PASSWORD}")  # fmt: skip
    locks(database(face, postgresql_tls.tls_url(user=CLIENT_CN, query=query)), key)


@pytest.mark.parametrize("password", [None, "wrong-password"])
def test_a_database_key_its_password_does_not_open_is_refused_before_any_io(
    pki: PKI, password: str | None, face: str
) -> None:
    """libpq, PyMySQL and asyncmy would fail at the first connection, as if the server
    were down: refused when the provider is made."""
    provider = provider_class(face)
    client = encrypted(pki, pki.client, KEY_PASSWORD)
    given = "" if password is None else f"&sslpassword={password}"
    files = f"sslrootcert={pki.ca}&sslcert={client.cert}&sslkey={client.key}{given}"
    with pytest.raises(ValueError, match="do not load") as raised:
        provider(f"postgresql://u@127.0.0.1:1/locks?{files}")
    assert password is None or password not in str(raised.value)
    args = {"ssl_ca": str(pki.ca), "ssl_cert": str(client.cert), "ssl_key": str(client.key)}
    if password is not None:
        args["ssl_key_password"] = password
    with pytest.raises(ValueError, match="do not load") as raised:
        provider("mysql://u@127.0.0.1:1/locks", connect_args=args)
    assert password is None or password not in str(raised.value)
    with pytest.raises(ValueError, match="do not load"):
        provider(f"mysql://u@127.0.0.1:1/locks?ssl_ca={pki.ca}.missing")
    with pytest.raises(ValueError, match="do not load"):
        provider("mysql://u@127.0.0.1:1/locks", connect_args={"ssl_ca": f"{pki.ca}.missing"})


def test_a_key_password_in_a_mysql_url_is_refused(face: str) -> None:
    """SQLAlchemy passes it beside its `ssl` dict, where PyMySQL never reads it."""
    with pytest.raises(ValueError, match="connect_args") as raised:
        provider_class(face)("mysql://u@127.0.0.1:1/locks?ssl_key=/k.pem&ssl_key_password=pw-x1")
    assert "pw-x1" not in str(raised.value)


def test_database_key_passwords_never_show(pki: PKI, key: str, face: str) -> None:
    client = encrypted(pki, pki.client, KEY_PASSWORD)
    down = f"127.0.0.1:{free_port()}"
    files = f"sslrootcert={pki.ca}&sslcert={client.cert}&sslkey={client.key}"
    args = {"ssl_ca": str(pki.ca), "ssl_cert": str(client.cert), "ssl_key": str(client.key),
            "ssl_key_password": KEY_PASSWORD}  # fmt: skip
    for make in (
        database(face, f"postgresql://u:pw@{down}/locks?{files}&sslpassword={KEY_PASSWORD}"),
        database(face, f"postgresql://u:pw@{down}/locks?{files}",
                 connect_args={"sslpassword": KEY_PASSWORD}),
        database(face, f"mysql://u:pw@{down}/locks", connect_args=args),
    ):  # fmt: skip
        provider = make()
        try:
            with pytest.raises(BackendUnavailable) as raised:
                provider.acquire(key, ttl=5, wait=0)
            shown = provider.aio if isinstance(provider, Threaded) else provider
            for text in (str(raised.value), repr(raised.value), repr(shown)):
                assert KEY_PASSWORD not in text
        finally:
            provider.close()
    assert KEY_PASSWORD not in redacted(f"postgresql://u:pw@h/db?sslpassword={KEY_PASSWORD}&x=1")
