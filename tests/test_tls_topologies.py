"""TLS on Redis's other forms and keywords (issue 18): Sentinel (`rediss+sentinel://`
or `sentinels=` with `tls_*`) and Cluster (`rediss+cluster://` or `cluster_nodes=`),
against real TLS sentinels and cluster nodes; an encrypted client key
(`tls_key_password`), which never shows; and every TLS argument checked before any I/O.

redis-py's Sentinel and Cluster clients report a sentinel or node that refused our TLS
only as "no master found" / "cannot be connected" (the Sentinel client keeps only the
text): the provider's own handshake tells a refusal (`AccessDenied`) from an outage
(`BackendUnavailable`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypedDict

import pytest
from redis.sentinel import MasterNotFoundError

from locks import BackendUnavailable, from_config
from locks.backends import RedisHashProvider, RedisProvider
from locks.tls import tls_refused
from tests.ports import free_port
from tests.servers.tls_servers import TLSRedisServer
from tests.servers.tls_topologies import TLSClusterTopology, TLSSentinelTopology
from tests.test_tls import locks, refused, unavailable
from tests.tls import PKI, encrypted

KEY_PASSWORD = "key-secret-9d1f"


class _Files(TypedDict):
    tls_ca: Path
    tls_cert: Path
    tls_key: Path


def _files(pki: PKI) -> _Files:
    return {"tls_ca": pki.ca, "tls_cert": pki.client.cert, "tls_key": pki.client.key}


# -- Sentinel ---------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [RedisProvider, RedisHashProvider])
def test_sentinel_over_verified_tls_locks(
    redis_sentinel_tls: TLSSentinelTopology, pki: PKI, key: str, cls: type[RedisProvider]
) -> None:
    topology = redis_sentinel_tls
    locks(lambda: cls(topology.url(), name="redis"), key)
    locks(lambda: cls(sentinels=[topology.sentinel.tls_address], service=topology.service,
                      name="redis", **_files(pki)), key)  # fmt: skip


def test_sentinel_tls_from_the_toml_keys(
    redis_sentinel_tls: TLSSentinelTopology, pki: PKI, key: str, tmp_path: Path
) -> None:
    config = tmp_path / "locks.toml"
    config.write_text(
        "[backends]\n"
        f'r = {{ type = "redis", sentinels = ["{redis_sentinel_tls.sentinel.tls_address}"], '
        f'service = "{redis_sentinel_tls.service}", tls_ca = "{pki.ca}", '
        f'tls_cert = "{pki.client.cert}", tls_key = "{pki.client.key}" }}\n'
    )
    provider = from_config(config).backend("r")
    locks(lambda: provider, key)


def test_plaintext_sentinels_with_tls_data_nodes_lock(
    redis_sentinel_tls: TLSSentinelTopology, pki: PKI, key: str
) -> None:
    """`sentinel_tls = false`: the sentinels' plaintext port, the primary's TLS one."""
    topology = redis_sentinel_tls
    locks(lambda: RedisProvider(sentinels=[topology.sentinel.address], service=topology.service,
                                sentinel_tls=False, name="redis", **_files(pki)), key)  # fmt: skip


def test_sentinel_with_another_ca_is_denied(
    redis_sentinel_tls: TLSSentinelTopology, pki: PKI, key: str
) -> None:
    topology = redis_sentinel_tls
    denied = refused(lambda: RedisProvider(topology.url(ca=pki.other_ca), name="redis"), key)
    assert topology.sentinel.tls_address in str(denied)
    assert "CERTIFICATE_VERIFY_FAILED" in str(denied)
    # the driver's error, which says only that no sentinel answered
    assert isinstance(denied.__cause__, MasterNotFoundError)
    assert not tls_refused(denied.__cause__)


def test_sentinel_without_a_client_certificate_is_denied(
    redis_sentinel_tls: TLSSentinelTopology, key: str
) -> None:
    topology = redis_sentinel_tls
    denied = refused(lambda: RedisProvider(topology.url(client=False), name="redis"), key)
    assert "CERTIFICATE_REQUIRED" in str(denied)


def test_tls_data_nodes_behind_plaintext_sentinels_with_another_ca_are_denied(
    redis_sentinel_tls: TLSSentinelTopology, pki: PKI, key: str
) -> None:
    """The sentinel answers in plaintext; the primary it names refuses our TLS."""
    topology = redis_sentinel_tls
    files = _files(pki)
    files["tls_ca"] = pki.other_ca
    refused(lambda: RedisProvider(sentinels=[topology.sentinel.address], service=topology.service,
                                  sentinel_tls=False, name="redis", **files), key)  # fmt: skip


def test_sentinel_plaintext_against_the_tls_port_looks_like_an_outage(
    redis_sentinel_tls: TLSSentinelTopology, key: str
) -> None:
    """The sentinel resets a plaintext connection; redis-py says only that no sentinel
    answered, and no handshake of ours asks (on one server, one does)."""
    topology = redis_sentinel_tls
    url = f"redis+sentinel://{topology.sentinel.tls_address}/{topology.service}"
    unavailable(lambda: RedisProvider(url, name="redis"), key)


def test_sentinel_tls_against_the_plaintext_port_looks_like_an_outage(
    redis_sentinel_tls: TLSSentinelTopology, key: str
) -> None:
    """A plaintext sentinel waits for a command's end in the ClientHello: our handshake
    times out, as against a server that hangs."""
    topology = redis_sentinel_tls
    url = topology.url().replace(topology.sentinel.tls_address, topology.sentinel.address)
    unavailable(lambda: RedisProvider(url, name="redis"), key)


def test_tls_sentinels_down_degrade(pki: PKI, key: str) -> None:
    sentinels = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    unavailable(lambda: RedisProvider(sentinels=sentinels, service="locks", name="redis",
                                      **_files(pki)), key)  # fmt: skip


# -- Cluster ----------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [RedisProvider, RedisHashProvider])
def test_cluster_over_verified_tls_locks(
    redis_cluster_tls: TLSClusterTopology, pki: PKI, key: str, cls: type[RedisProvider]
) -> None:
    topology = redis_cluster_tls
    locks(lambda: cls(topology.url(), name="redis"), key)
    nodes = [node.tls_address for node in topology.nodes]
    locks(lambda: cls(cluster_nodes=nodes, name="redis", **_files(pki)), key)


def test_cluster_with_another_ca_is_denied(
    redis_cluster_tls: TLSClusterTopology, pki: PKI, key: str
) -> None:
    denied = refused(lambda: RedisProvider(redis_cluster_tls.url(ca=pki.other_ca), name="redis"),
                     key)  # fmt: skip
    assert "CERTIFICATE_VERIFY_FAILED" in str(denied)


def test_cluster_without_a_client_certificate_is_denied(
    redis_cluster_tls: TLSClusterTopology, key: str
) -> None:
    denied = refused(lambda: RedisProvider(redis_cluster_tls.url(client=False), name="redis"),
                     key)  # fmt: skip
    assert "CERTIFICATE_REQUIRED" in str(denied)


def test_cluster_plaintext_against_the_tls_ports_looks_like_an_outage(
    redis_cluster_tls: TLSClusterTopology, key: str
) -> None:
    url = "redis+cluster://" + ",".join(node.tls_address for node in redis_cluster_tls.nodes)
    unavailable(lambda: RedisProvider(url, name="redis"), key)


def test_tls_cluster_down_degrades(pki: PKI, key: str) -> None:
    nodes = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    unavailable(lambda: RedisProvider(cluster_nodes=nodes, name="redis", **_files(pki)), key)


# -- an encrypted client key --------------------------------------------------------------


def test_an_encrypted_client_key_with_its_password_locks(
    redis_tls: TLSRedisServer, pki: PKI, key: str
) -> None:
    client = encrypted(pki, pki.client, KEY_PASSWORD)
    plain = f"redis://{redis_tls.tls_address}/0"
    locks(lambda: RedisProvider(plain, name="redis", tls_ca=pki.ca, tls_cert=client.cert,
                                tls_key=client.key, tls_key_password=KEY_PASSWORD),
          key)  # fmt: skip
    url = redis_tls.tls_url().replace(str(pki.client.key), str(client.key))
    locks(lambda: RedisProvider(f"{url}&ssl_password={KEY_PASSWORD}", name="redis"), key)


@pytest.mark.parametrize("password", [None, "wrong-password"])
def test_a_key_its_password_does_not_open_is_refused_before_any_io(
    pki: PKI, password: str | None
) -> None:
    """A connection error at the first call would degrade a chain: refused here."""
    client = encrypted(pki, pki.client, KEY_PASSWORD)
    makes: list[Callable[[], RedisProvider]] = [
        lambda: RedisProvider("redis://127.0.0.1:1/0", tls_ca=pki.ca, tls_cert=client.cert,
                              tls_key=client.key, tls_key_password=password),
        lambda: RedisProvider(f"rediss://127.0.0.1:1/0?ssl_certfile={client.cert}"
                              f"&ssl_keyfile={client.key}"
                              + (f"&ssl_password={password}" if password else "")),
        lambda: RedisProvider(cluster_nodes=["127.0.0.1:1"], tls_cert=client.cert,
                              tls_key=client.key, tls_key_password=password),
    ]  # fmt: skip
    for make in makes:
        with pytest.raises(ValueError, match="tls_key_password") as raised:
            make()
        assert password is None or password not in str(raised.value)


def test_tls_files_that_do_not_exist_are_refused_before_any_io(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="do not load"):
        RedisProvider("redis://127.0.0.1:1/0", tls_ca=tmp_path / "missing.pem")
    with pytest.raises(ValueError, match="do not load"):
        RedisProvider(f"rediss://127.0.0.1:1/0?ssl_ca_certs={tmp_path / 'missing.pem'}")


def test_the_key_password_never_shows(pki: PKI, key: str) -> None:
    client = encrypted(pki, pki.client, KEY_PASSWORD)
    down = f"127.0.0.1:{free_port()}"
    for provider in (
        RedisProvider(f"redis://{down}/0", tls_ca=pki.ca, tls_cert=client.cert,
                      tls_key=client.key, tls_key_password=KEY_PASSWORD),
        RedisProvider(f"rediss://{down}/0?ssl_ca_certs={pki.ca}&ssl_certfile={client.cert}"
                      f"&ssl_keyfile={client.key}&ssl_password={KEY_PASSWORD}"),
        RedisProvider(f"rediss+sentinel://{down}/locks?ssl_ca_certs={pki.ca}&ssl_certfile="
                      f"{client.cert}&ssl_keyfile={client.key}&ssl_password={KEY_PASSWORD}"),
        RedisProvider(cluster_nodes=[down], tls_ca=pki.ca, tls_cert=client.cert,
                      tls_key=client.key, tls_key_password=KEY_PASSWORD),
    ):  # fmt: skip
        try:
            assert KEY_PASSWORD in provider.topology.secrets()
            with pytest.raises(BackendUnavailable) as raised:
                provider.acquire(key, ttl=5, wait=0)
            for text in (str(raised.value), repr(raised.value), repr(provider), str(provider)):
                assert KEY_PASSWORD not in text
        finally:
            provider.close()


# -- checked before any I/O ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tls_cert": "c.pem"}, "tls_cert and tls_key"),
        ({"tls_ca": "ca.pem", "tls_key_password": "pw"}, "tls_key_password"),
        ({"tls_check_hostname": False}, "tls_check_hostname is for TLS"),
        ({"tls_ca": ""}, "tls_ca must be a path"),
        ({"url": "rediss://127.0.0.1:1/0", "tls_ca": "ca.pem"}, "not both"),
        ({"url": "redis://127.0.0.1:1/0?ssl_ca_certs=x", "tls_ca": "ca.pem"}, "not both"),
        ({"url": "unix:///tmp/redis.sock", "tls_ca": "ca.pem"}, "unix"),
        ({"url": "redis+cluster://127.0.0.1:1?ssl_ca_certs=x"}, "rediss\\+cluster"),
        ({"url": "redis+sentinel://127.0.0.1:1/locks?ssl_ca_certs=x"}, "rediss\\+sentinel"),
        ({"url": "rediss+cluster://127.0.0.1:1?ssl_cafile=x"}, "unknown query key 'ssl_cafile'"),
        ({"url": "rediss+cluster://127.0.0.1:1?ssl_check_hostname=maybe"}, "true or false"),
        ({"url": "rediss+cluster://127.0.0.1:1?ssl_ca_certs=x", "tls_ca": "ca.pem"}, "not both"),
        ({"sentinel_tls": False}, "Sentinel topology"),
        ({"sentinels": ["127.0.0.1:1"], "service": "s", "sentinel_tls": True}, "sentinel_tls"),
    ],
)  # fmt: skip
def test_tls_arguments_are_checked_before_any_io(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RedisProvider(**kwargs)  # type: ignore[arg-type]


def test_rediss_forms_without_a_ca_verify_against_the_systems_cas(
    redis_cluster_tls: TLSClusterTopology, key: str
) -> None:
    """No CA of ours: the session's CA is not the system's, so the chain fails to
    verify — TLS is never left unverified for want of a CA."""
    hosts = ",".join(node.tls_address for node in redis_cluster_tls.nodes)
    refused(lambda: RedisProvider(f"rediss+cluster://{hosts}", name="redis"), key)


def test_a_given_client_takes_no_tls_keywords(pki: PKI) -> None:
    import redis  # noqa: PLC0415

    with pytest.raises(ValueError, match="client passed in"):
        RedisProvider(client=redis.Redis(), tls_ca=pki.ca)
