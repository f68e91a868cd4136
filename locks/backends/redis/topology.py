"""How a Redis provider reaches its data: one server, a Sentinel-managed primary or a
Cluster — given as a URL, as keyword arguments (the TOML keys) or as a redis-py client —
and the one thing a topology changes about a call: which connection runs it.

URL forms (credentials of the data nodes in the user part; sentinel credentials only as
keywords, so no URL carries two passwords):

    redis://[user:password@]host:port/db          rediss://...   unix:///path?db=0
    redis+sentinel://[user:password@]host:port,host:port/service[/db]
    redis+cluster://[user:password@]host:port,host:port

`rediss+sentinel://` and `rediss+cluster://` are the TLS forms, with redis-py's
`ssl_ca_certs`, `ssl_certfile`, `ssl_keyfile`, `ssl_password` and `ssl_check_hostname`
in the query, as `rediss://` has them; the `tls_*` keywords say the same for every form.
A TLS Sentinel topology speaks TLS to the sentinels too, unless `sentinel_tls` is False.

A cluster client connects as it is built, so it is built on first use: a provider is
made without I/O whatever its topology, and an unreachable cluster is a
`BackendUnavailable` from the first call, like any other outage.
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import AskError, ClusterError, MovedError, NoScriptError
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

from locks.backends.redis.pool import BlockingPool
from locks.backends.redis.runs import RunWatch
from locks.backends.redis.scripts import Script
from locks.names import check_seconds
from locks.tls import HandshakeProbe, TLSSettings, tls_settings

DEFAULT_URL = "redis://127.0.0.1:6379/0"
SENTINEL_SCHEME = "redis+sentinel"
CLUSTER_SCHEME = "redis+cluster"
_TLS_SCHEMES = {"rediss+sentinel": SENTINEL_SCHEME, "rediss+cluster": CLUSTER_SCHEME}
# redis-py's TLS query keys (of `rediss://`), read from the multi-host TLS forms too
_TLS_QUERY = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_password",
              "ssl_check_hostname")  # fmt: skip

Client = redis.Redis | RedisCluster


@dataclass(frozen=True, slots=True)
class Timeouts:
    """What bounds each call, whatever the topology."""

    socket: float
    connect: float
    max_connections: int
    pool: float

    def socket_kwargs(self) -> dict[str, Any]:
        return {
            "socket_timeout": self.socket,
            "socket_connect_timeout": self.connect,
            "retry": Retry(NoBackoff(), 0),  # the chain decides about retries, not redis-py
        }


class Topology:
    """One way of reaching Redis. `client()` is built once, on first use."""

    kind = "server"

    def __init__(self, address: str, build: Callable[[], Client], *, owned: bool,
                 db: int = 0, passwords: Sequence[str] = (),
                 probe: TLSProbe | None = None) -> None:  # fmt: skip
        self.address = address  # for messages: never a password
        self.db = db
        self._build = build
        self._client: Client | None = None
        self._lock = threading.Lock()
        self.owned = owned  # built here, so closed here
        self._passwords = [password for password in passwords if password]
        # where the client hides a TLS refusal behind "no node reachable": ask ourselves
        self.probe = probe
        self._watch: RunWatch | None = None

    def client(self) -> Client:
        client = self._client
        if client is None:
            with self._lock:
                if self._client is None:
                    built = self._build()
                    if self._watch is not None:
                        _watch_connections(built, self._watch)
                    self._client = built
                client = self._client
        return client

    def watch_runs(self, watch: RunWatch) -> None:
        """Have every connection made from now on read the server's run_id (`runs`)."""
        with self._lock:
            self._watch = watch
            if self._client is not None:
                _watch_connections(self._client, watch)

    def node(self, key: str) -> redis.Redis:
        """A client of the one server that owns `key`: a pipeline on it runs on one
        connection, which `WAIT` needs (it counts that connection's writes)."""
        client = self.client()
        if isinstance(client, RedisCluster):
            node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
            return client.get_redis_connection(node)
        return client

    def domain(self) -> Hashable:
        """What makes two providers one lock space (for reentrancy across them)."""
        return (self.kind, self.address, self.db)

    def secrets(self) -> list[str]:
        """Passwords that must never appear in a message."""
        client = self._client if isinstance(self, ClusterTopology) else self.client()
        found: list[str] = []
        if isinstance(client, redis.Redis):
            found.append(client.connection_pool.connection_kwargs.get("password") or "")
        elif isinstance(client, RedisCluster):
            for node in client.get_nodes():  # type: ignore[no-untyped-call]
                if node.redis_connection is not None:
                    kwargs = node.redis_connection.connection_pool.connection_kwargs
                    found.append(kwargs.get("password") or "")
        return [str(secret) for secret in [*found, *self._passwords] if secret]

    def close(self) -> None:
        client = self._client
        if client is None or not self.owned:
            return
        client.close()
        if isinstance(client, redis.Redis):
            client.connection_pool.disconnect()


@dataclass(frozen=True, slots=True)
class TLSProbe:
    """Handshakes of our own where redis-py keeps no reason: with the topology's TLS
    settings (`tls`), whether the servers refuse us; without TLS (`tls` None), whether
    they serve TLS only — a `redis://` url for a `rediss://` server."""

    tls: TLSSettings | None
    handshakes: HandshakeProbe


class _Sentinel(Topology):
    kind = "sentinel"

    def close(self) -> None:
        super().close()
        client = self._client
        if self.owned and isinstance(client, redis.Redis):
            pool = client.connection_pool
            if isinstance(pool, SentinelConnectionPool):
                for sentinel in pool.sentinel_manager.sentinels:
                    sentinel.close()


class _BlockingSentinelPool(SentinelConnectionPool, BlockingPool):
    """Sentinel's pool, but a thread past `max_connections` waits up to `pool_timeout`
    for a free connection instead of failing at once, as on one server (redis-py has
    no blocking Sentinel pool)."""


class ClusterTopology(Topology):
    kind = "cluster"
    # where to start, and what each connection to a node takes (timeouts, credentials,
    # TLS): the asyncio face makes its own pools from them (empty for a given client)
    nodes: tuple[tuple[str, int], ...] = ()
    settings: Mapping[str, Any] = MappingProxyType({})


def topology(
    url: str,
    *,
    client: Client | None,
    sentinels: Sequence[str] | None,
    service: str | None,
    cluster_nodes: Sequence[str] | None,
    db: int | None,
    username: str | None,
    password: str | None,
    sentinel_username: str | None,
    sentinel_password: str | None,
    tls: TLSSettings | None,
    sentinel_tls: bool | None,
    timeouts: Timeouts,
) -> Topology:
    """The topology the arguments describe; every argument is checked here, before I/O."""
    if sentinel_tls is not None and not isinstance(sentinel_tls, bool):
        raise TypeError(f"sentinel_tls must be true or false, got {sentinel_tls!r}")
    if client is not None:
        if tls is not None or sentinel_tls is not None:
            raise ValueError("tls_*: configure TLS on the redis-py client passed in, not here")
        return _given(client)
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, not {type(url).__name__}")
    scheme, tls = _scheme_and_tls(url, tls)
    explicit_url = url != DEFAULT_URL
    if sentinels is not None or cluster_nodes is not None:
        if sentinels is not None and cluster_nodes is not None:
            raise ValueError("give either sentinels or cluster_nodes, not both")
        if explicit_url:
            raise ValueError("give either url or sentinels/cluster_nodes, not both")
    if db is not None and (isinstance(db, bool) or not isinstance(db, int) or db < 0):
        raise ValueError(f"db must be a whole number >= 0, got {db!r}")
    credentials = {"username": _optional_str(username, "username"),
                   "password": _optional_str(password, "password")}  # fmt: skip
    if scheme == SENTINEL_SCHEME:
        parsed = _parse_multi_host(url)
        parts = [unquote(part) for part in parsed.path.strip("/").split("/") if part]
        if not parts or len(parts) > 2:
            raise ValueError(
                f"url must name the service: {SENTINEL_SCHEME}://host:port/service[/db]"
            )
        url_db = _db_text(parts[1]) if len(parts) == 2 else None
        sentinels, service = parsed.hosts, parts[0]
        db = db if db is not None else url_db
        credentials = _merge(credentials, parsed.username, parsed.password)
    elif scheme == CLUSTER_SCHEME:
        parsed = _parse_multi_host(url)
        if parsed.path.strip("/") not in ("", "0"):
            raise ValueError("a Redis Cluster has only database 0: the url must not name another")
        cluster_nodes = parsed.hosts
        credentials = _merge(credentials, parsed.username, parsed.password)
    if sentinels is not None:
        if sentinel_tls and tls is None:
            raise ValueError("sentinel_tls: give the TLS settings (tls_ca or tls_cert) too")
        return _sentinel_topology(
            _addresses(sentinels, "sentinels"), _service(service), db or 0, credentials,
            _optional_str(sentinel_username, "sentinel_username"),
            _optional_str(sentinel_password, "sentinel_password"), timeouts, tls,
            tls is not None if sentinel_tls is None else sentinel_tls,
        )  # fmt: skip
    if service is not None:
        raise ValueError("service is for a Sentinel topology: give sentinels too")
    if sentinel_tls is not None:
        raise ValueError("sentinel_tls is for a Sentinel topology: give sentinels too")
    if cluster_nodes is not None:
        if db:
            raise ValueError("a Redis Cluster has only database 0: db must be 0")
        return _cluster_topology(
            _addresses(cluster_nodes, "cluster_nodes"), credentials, timeouts, tls
        )
    return _server_topology(url, db, credentials, timeouts, tls)


def _watch_connections(client: Client, watch: RunWatch) -> None:
    """Put `watch` into the handshake of the client's connections: those made from now
    on, and those made already (a given client's), which use it when they reconnect."""
    if isinstance(client, RedisCluster):  # its nodes' handshake calls this one after its own
        client.user_on_connect_func = watch.hook(client.user_on_connect_func or _no_handshake)
        return
    pool = client.connection_pool
    kwargs = pool.connection_kwargs
    kwargs["redis_connect_func"] = watch.hook(kwargs.get("redis_connect_func"))
    # redis-py keeps them here (ConnectionPool, BlockingConnectionPool): not public
    made = [*getattr(pool, "_available_connections", ()), *getattr(pool, "_in_use_connections", ()),
            *getattr(pool, "_connections", ())]  # fmt: skip
    for connection in {id(made_one): made_one for made_one in made}.values():
        connection.redis_connect_func = watch.hook(connection.redis_connect_func)


def _no_handshake(connection: object) -> None:
    """The cluster client's own handshake has run already."""


def _given(client: Client) -> Topology:
    if isinstance(client, RedisCluster):
        nodes = ",".join(sorted(node.name for node in client.get_nodes()))  # type: ignore[no-untyped-call]
        return ClusterTopology(f"cluster {nodes}", lambda: client, owned=False)
    if not isinstance(client, redis.Redis):
        raise TypeError(
            f"client must be a redis.Redis or RedisCluster, not {type(client).__name__}"
        )
    pool = client.connection_pool
    kind = _Sentinel if isinstance(pool, SentinelConnectionPool) else Topology
    return kind(pool_address(pool), lambda: client, owned=False, db=_db_of(pool))


def _server_topology(url: str, db: int | None, credentials: dict[str, str | None],
                     timeouts: Timeouts, tls: TLSSettings | None) -> Topology:  # fmt: skip
    extra: dict[str, Any] = {key: value for key, value in credentials.items() if value}
    if db is not None:
        extra["db"] = db
    if tls is not None:
        parsed = urlsplit(url)
        if parsed.scheme == "unix":
            raise ValueError("tls_*: a unix:// socket takes no TLS")
        if parsed.scheme == "rediss" or any(k.startswith("ssl") for k in parse_qs(parsed.query)):
            raise ValueError("give TLS either in the url or as tls_* keywords, not both")
        extra |= {"connection_class": redis.SSLConnection, **_ssl_kwargs(tls.checked())}
    try:
        pool = BlockingPool.from_url(
            url, max_connections=timeouts.max_connections, timeout=timeouts.pool,
            **timeouts.socket_kwargs(), **extra,
        )  # fmt: skip
    except ValueError as exc:  # redis-py names the scheme it wants; never echo the url
        raise ValueError(f"url is not a Redis URL: {exc}") from None
    client = redis.Redis(connection_pool=pool)
    kwargs = pool.connection_kwargs
    key_password = kwargs.get("ssl_password")
    uses_tls = pool.connection_class is redis.SSLConnection
    if uses_tls and tls is None:  # rediss://: its settings, its files checked as the keys'
        tls = TLSSettings(kwargs.get("ssl_ca_certs"), kwargs.get("ssl_certfile"),
                          kwargs.get("ssl_keyfile"), key_password,
                          bool(kwargs.get("ssl_check_hostname", True))).checked()  # fmt: skip
    # a refused client certificate may reach redis-py as an EOF, as a dying server's; a
    # plaintext client on a TLS port meets a reset, as a dying server's
    verifies = kwargs.get("ssl_cert_reqs", "required") in ("required", ssl.CERT_REQUIRED)
    probe = None
    if "host" in kwargs and (verifies or not uses_tls):  # not a unix socket
        address = [(kwargs["host"], int(kwargs["port"]))]
        probe = _probe(tls if uses_tls else None, address, timeouts)
    return Topology(pool_address(pool), lambda: client, owned=True,
                    db=_db_of(pool), passwords=[key_password or ""], probe=probe)  # fmt: skip


def _sentinel_topology(  # noqa: PLR0917 - one call site, every argument checked
    sentinels: list[tuple[str, int]],
    service: str,
    db: int,
    credentials: dict[str, str | None],
    sentinel_username: str | None,
    sentinel_password: str | None,
    timeouts: Timeouts,
    tls: TLSSettings | None,
    tls_to_sentinels: bool,
) -> Topology:
    sentinel_kwargs: dict[str, Any] = {"socket_timeout": timeouts.socket,
                                       "socket_connect_timeout": timeouts.connect}  # fmt: skip
    if sentinel_username:
        sentinel_kwargs["username"] = sentinel_username
    if sentinel_password:
        sentinel_kwargs["password"] = sentinel_password
    if tls is not None and tls_to_sentinels:
        sentinel_kwargs |= {"ssl": True, **_ssl_kwargs(tls.checked())}
    manager = Sentinel(sentinels, sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
    data_kwargs: dict[str, Any] = {key: value for key, value in credentials.items() if value}
    if tls is not None:
        data_kwargs |= {"ssl": True, **_ssl_kwargs(tls.checked())}
    client = manager.master_for(  # type: ignore[no-untyped-call]
        service, db=db, connection_pool_class=_BlockingSentinelPool,
        max_connections=timeouts.max_connections, timeout=timeouts.pool,
        **timeouts.socket_kwargs(), **data_kwargs,
    )  # fmt: skip
    hosts = ",".join(f"{host}:{port}" for host, port in sentinels)
    # with every sentinel refusing our TLS, redis-py says only "no master found". (No
    # plaintext probe: the sentinels are not the data nodes whose connection failed,
    # and asking them during a failover delayed it in the tests)
    probe = _probe(tls, sentinels, timeouts) if tls is not None and tls_to_sentinels else None
    return _Sentinel(f"sentinel {hosts}/{service}", lambda: client, owned=True, db=db,
                     passwords=_secrets(sentinel_password, tls), probe=probe)  # fmt: skip


def _cluster_topology(nodes: list[tuple[str, int]], credentials: dict[str, str | None],
                      timeouts: Timeouts, tls: TLSSettings | None) -> Topology:  # fmt: skip
    kwargs = timeouts.socket_kwargs()
    retry = kwargs.pop("retry")

    credential_kwargs: dict[str, Any] = {k: v for k, v in credentials.items() if v}
    if tls is not None:  # given a url, redis-py takes TLS from its scheme, not `ssl`
        credential_kwargs |= _ssl_kwargs(tls.checked())
    scheme = "redis" if tls is None else "rediss"

    (first_host, first_port), others = nodes[0], nodes[1:]
    if ":" in first_host:
        first_host = f"[{first_host}]"

    def build() -> Client:
        return RedisCluster(
            # given a url, redis-py builds each node's pool from connection_pool_class:
            # blocking, so a thread past max_connections waits pool_timeout, as on one
            # server, instead of failing at once
            url=f"{scheme}://{first_host}:{first_port}",
            startup_nodes=[ClusterNode(host, port) for host, port in others],  # type: ignore[no-untyped-call]
            connection_pool_class=BlockingPool,
            timeout=timeouts.pool,
            retry=retry,
            # slots of a shard in failover are unserved; the others go on serving
            require_full_coverage=False,
            max_connections=timeouts.max_connections,
            **kwargs,
            **credential_kwargs,
        )

    hosts = ",".join(f"{host}:{port}" for host, port in nodes)
    # a cluster client that reaches no startup node keeps only the text of why
    probe = _probe(tls, nodes, timeouts) if tls is not None else None
    made = ClusterTopology(f"cluster {hosts}", build, owned=True, passwords=_secrets(None, tls),
                           probe=probe)  # fmt: skip
    made.nodes, made.settings = tuple(nodes), {**kwargs, **credential_kwargs}
    return made


def _scheme_and_tls(url: str, tls: TLSSettings | None) -> tuple[str, TLSSettings | None]:
    """The url's scheme without its TLS mark, and the TLS the url or the keywords ask
    for (a multi-host url carries TLS in its query; a plain one takes no query)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in _TLS_SCHEMES:
        if tls is not None:
            raise ValueError("give TLS either in the url or as tls_* keywords, not both")
        return _TLS_SCHEMES[scheme], _url_tls(url)
    if scheme in (SENTINEL_SCHEME, CLUSTER_SCHEME) and urlsplit(url).query:
        tls_form = scheme.replace("redis", "rediss", 1)
        raise ValueError(f"url: a {scheme}:// url takes no query (TLS: {tls_form}://...?ssl_...)")
    return scheme, tls


def _ssl_kwargs(tls: TLSSettings) -> dict[str, Any]:
    """redis-py's names for the TLS settings: verify the chain, always."""
    return {"ssl_ca_certs": tls.ca, "ssl_certfile": tls.cert, "ssl_keyfile": tls.key,
            "ssl_password": tls.key_password, "ssl_check_hostname": tls.check_hostname,
            "ssl_cert_reqs": "required"}  # fmt: skip


def _probe(tls: TLSSettings | None, addresses: list[tuple[str, int]],
           timeouts: Timeouts) -> TLSProbe:  # fmt: skip
    """TLS: whether the servers refuse ours. Plaintext (only for one server, whose own
    reset it asks about): whether it serves TLS only."""
    return TLSProbe(tls, HandshakeProbe(addresses, timeouts.connect))


def _secrets(password: str | None, tls: TLSSettings | None) -> list[str]:
    return [secret for secret in (password, tls and tls.key_password) if secret]


def _url_tls(url: str) -> TLSSettings:
    """The TLS settings in a `rediss+sentinel://` or `rediss+cluster://` url's query."""
    query = parse_qs(urlsplit(url).query, keep_blank_values=True)
    unknown = sorted(set(query) - set(_TLS_QUERY))
    if unknown:
        known = ", ".join(_TLS_QUERY)
        raise ValueError(f"url: unknown query key {unknown[0]!r} (TLS takes {known})")
    values = {key: values[-1] for key, values in query.items()}
    check = values.get("ssl_check_hostname", "true").lower()
    if check not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError(f"url: ssl_check_hostname must be true or false, got {check!r}")
    check_hostname = check in ("true", "1", "yes")
    ca, cert = values.get("ssl_ca_certs"), values.get("ssl_certfile")
    settings = tls_settings(ca, cert, values.get("ssl_keyfile"), values.get("ssl_password"),
                            check_hostname if ca or cert else True)  # fmt: skip
    # without a CA of its own, TLS verifies against the system's CAs
    return settings or TLSSettings(None, None, None, None, check_hostname)


@dataclass(frozen=True, slots=True)
class _MultiHost:
    hosts: list[str]
    username: str | None
    password: str | None
    path: str


def _parse_multi_host(url: str) -> _MultiHost:
    """`scheme://[user:password@]h1:p1,h2:p2/path`: urllib cannot read a host list."""
    parsed = urlsplit(url)
    netloc = parsed.netloc
    userinfo, _, hostlist = netloc.rpartition("@")
    username = password = None
    if userinfo:
        user, has_password, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if has_password else None
    hosts = [host for host in hostlist.split(",") if host]
    if not hosts:
        raise ValueError(f"url must name at least one host:port after {parsed.scheme}://")
    return _MultiHost(hosts, username, password, parsed.path)


def _addresses(hosts: Sequence[str], argument: str) -> list[tuple[str, int]]:
    if isinstance(hosts, str) or not isinstance(hosts, Sequence) or not hosts:
        raise ValueError(f"{argument} must be a non-empty list of 'host:port' strings")
    found = []
    for index, entry in enumerate(hosts):
        where = f"{argument}[{index}]"
        if not isinstance(entry, str):
            raise ValueError(f"{where} must be a 'host:port' string, not {type(entry).__name__}")
        host, _, port = entry.rpartition(":")
        host = host.strip("[]")  # [::1]:26379
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(
                f"{where} must be 'host:port' with a port from 1 to 65535, got {entry!r}"
            )
        found.append((host, int(port)))
    return found


def _service(service: str | None) -> str:
    if not isinstance(service, str) or not service or any(c in service for c in "/ \t\r\n"):
        raise ValueError(
            f"service must name the Sentinel service (e.g. 'mymaster'), got {service!r}"
        )
    return service


def _db_text(text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"the url's database must be a whole number, got {text!r}")
    return int(text)


def _optional_str(value: str | None, argument: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{argument} must be a str, not {type(value).__name__}")
    return value or None


def _merge(credentials: dict[str, str | None], username: str | None,
           password: str | None) -> dict[str, str | None]:  # fmt: skip
    """Keywords win over the url's user part."""
    return {"username": credentials["username"] or username,
            "password": credentials["password"] or password}  # fmt: skip


def _db_of(pool: redis.ConnectionPool) -> int:
    return int(pool.connection_kwargs.get("db", 0) or 0)


def pool_address(pool: Any) -> str:
    """Where a redis-py pool of either face connects, for messages (never a password):
    a Sentinel pool's sentinels and service, else its one server."""
    manager = getattr(pool, "sentinel_manager", None)
    if manager is not None:
        hosts = ",".join("{host}:{port}".format(**s.connection_pool.connection_kwargs)
                         for s in manager.sentinels)  # fmt: skip
        return f"sentinel {hosts}/{pool.service_name}"
    kwargs = pool.connection_kwargs
    if "path" in kwargs:
        return f"unix:{kwargs['path']}"
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


class NotReplicated(Exception):
    """Fewer replicas acknowledged a write than `sync_replicas` asks for."""


class ReplicaSync:
    """`sync_replicas`: after a grant or a renewal, `WAIT n timeout` (or `WAITAOF 1 n
    timeout`) on the connection that wrote it, pipelined with the script: one round trip
    plus the replicas' acknowledgement. `WAIT` counts only that connection's writes, so
    the script and the wait must share it — on a cluster, the key's own node."""

    __slots__ = ("aof", "command", "replicas")

    def __init__(self, replicas: int, timeout: float, aof: bool) -> None:
        self.replicas = replicas
        self.aof = aof
        ms = max(1, round(timeout * 1000))
        self.command: tuple[Any, ...] = (
            ("WAITAOF", 1, replicas, ms) if aof else ("WAIT", replicas, ms)
        )

    def enough(self, acks: Any) -> bool:
        if isinstance(acks, Exception):
            return False
        if self.aof:
            return int(acks[0]) >= 1 and int(acks[1]) >= self.replicas
        return int(acks) >= self.replicas

    def shortfall(self, acks: Any) -> str:
        got = acks[1] if self.aof and isinstance(acks, list) else acks
        what = "the primary's and replicas' AOF fsync" if self.aof else "replicas"
        return f"{got} of {self.replicas} {what} acknowledged in time ({self.command[0]})"

    def missing(self, acks: Any, what: str) -> Exception | None:
        """Why the write that `acks` answers for does not count (None: it does): the
        replicas' shortfall, or WAIT's own error (e.g. WAITAOF on a server that lacks it)."""
        if self.enough(acks):
            return None
        if isinstance(acks, Exception):
            return acks
        return NotReplicated(f"{what}: {self.shortfall(acks)}")

    def run(self, topology: Topology, script: Script, keys: list[str],
            args: list[Any]) -> tuple[Any, Any]:  # fmt: skip
        """(script reply, WAIT reply) from the server that owns keys[0], following a
        cluster's MOVED and ASK redirections as redis-py's cluster client does."""
        node = topology.node(keys[0])
        by_sha, asking = True, False
        for _ in range(5):
            pipe = node.pipeline(transaction=False)
            if asking:
                pipe.execute_command("ASKING")  # type: ignore[no-untyped-call]
            script.queue(pipe, keys, args, by_sha=by_sha)
            pipe.execute_command(*self.command)  # type: ignore[no-untyped-call]
            *_, reply, acks = pipe.execute(raise_on_error=False)
            if isinstance(reply, NoScriptError):
                by_sha = False
                continue
            if isinstance(reply, AskError):  # MovedError is an AskError too
                node, asking = _redirected(topology, keys[0], reply)
                continue
            if isinstance(reply, Exception):
                raise reply
            return reply, acks
        raise ClusterError(f"the slot of {keys[0]!r} kept moving")


def _redirected(topology: Topology, key: str, error: AskError) -> tuple[redis.Redis, bool]:
    """Where a MOVED (slot table refreshed) or ASK (one command, with ASKING) points."""
    cluster = topology.client()
    if not isinstance(cluster, RedisCluster):
        raise error
    if isinstance(error, MovedError):
        cluster.nodes_manager.initialize()
        return topology.node(key), False
    target = cluster.get_node(host=error.host, port=error.port)  # type: ignore[no-untyped-call]
    if target is None:
        cluster.nodes_manager.initialize()
        target = cluster.get_node(host=error.host, port=error.port)  # type: ignore[no-untyped-call]
        if target is None:
            raise error
    return cluster.get_redis_connection(target), True


def replica_sync(
    replicas: int, timeout: float, aof: bool, socket_timeout: float
) -> ReplicaSync | None:
    """The checked `sync_replicas`/`sync_timeout`/`sync_aof` arguments (None: no sync)."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise ValueError(f"sync_replicas must be a whole number >= 0, got {replicas!r}")
    if not isinstance(aof, bool):
        raise TypeError(f"sync_aof must be a bool, not {type(aof).__name__}")
    timeout = check_seconds(timeout, "sync_timeout")
    if replicas == 0:
        if aof:
            raise ValueError("sync_aof needs sync_replicas >= 1")
        return None
    if timeout >= socket_timeout:
        raise ValueError(
            f"sync_timeout ({timeout} s) must be shorter than socket_timeout ({socket_timeout} s):"
            " the reply to WAIT arrives only when it ends"
        )
    return ReplicaSync(replicas, timeout, aof)
