"""Redis backends for tasks, over `redis.asyncio`: `RedisProvider` (type `redis`) and
`RedisHashProvider` (type `redis-hash`), with the threaded providers' arguments,
scripts, keys, fences and error sorting (`locks.backends.redis.algorithms`). The
arguments are checked, and the topology worked out, by the same code as the threaded
face's (`locks.backends.redis.topology`); the client it would build is rebuilt over
`redis.asyncio` with the same settings.

One server (`redis://`, `rediss://`, `unix://`), a Sentinel-managed primary
(`redis+sentinel://`, or `sentinels=` and `service=`) or a Cluster (`redis+cluster://`
or `cluster_nodes=`, a pool per primary: `locks.aio.redis_cluster`), or a
`redis.asyncio` client of any of them passed as `client`; with `sync_replicas`, WAIT
follows each grant, renewal, fence floor and break on the connection that wrote it, in
the same write."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from typing import Any

import redis
import redis.asyncio as aioredis
from redis import exceptions as errors
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool

from locks.aio.base import AsyncProviderBase
from locks.aio.redis_cluster import ClusterPools
from locks.aio.redis_notify import AsyncNotifier
from locks.aio.redis_pool import AsyncPool
from locks.backends.redis.algorithms import (
    DENIED,
    UNAVAILABLE,
    Algorithm,
    HashAlgorithm,
    Keys,
    PlainAlgorithm,
    check_floor,
    checked,
    keys_of,
    maybe_sent,
    ms,
    read_holder,
    refused,
    text,
    try_outcome,
)
from locks.backends.redis.runs import REFUSED, RunWatch, lost_in_new_run
from locks.backends.redis.scripts import Script
from locks.backends.redis.topology import (
    DEFAULT_URL,
    ClusterTopology,
    Timeouts,
    Topology,
    pool_address,
    replica_sync,
    topology,
)
from locks.errors import AccessDenied, BackendError, BackendUnavailable, LockError
from locks.holds import Hold
from locks.keeper import Grant
from locks.names import check_name
from locks.provider import Holder, Lease
from locks.tls import tls_settings

# redis-py's threaded connection classes and their asyncio twins
_CONNECTIONS: dict[type[Any], type[Any]] = {
    redis.Connection: aioredis.Connection,
    redis.SSLConnection: aioredis.SSLConnection,
    redis.UnixDomainSocketConnection: aioredis.UnixDomainSocketConnection,
}
logger = logging.getLogger("locks")

# a script call that undoes another: (script, KEYS, ARGV)
Undo = tuple[Script, list[str], list[Any]]
# one exchange on a pool's connection, ASKING first or not: the replies it reads
OnPool = Callable[[AsyncPool, bool], Awaitable[tuple[Any, Any]]]
_REDIRECTS = 5  # MOVED or ASK followed for one call before it is an outage
# the parent's clients, in a forked child (see `after_fork_in_child`)
_LEFT_BY_PARENT: list[object] = []
# what an asyncio connection takes over from the threaded pool's settings (not its
# handshake hook, retry or maintenance-notification handler: those are the threaded
# pool's objects), and every ssl_* setting
_CARRIED = {
    "host", "port", "path", "db", "username", "password", "socket_timeout",
    "socket_connect_timeout", "socket_keepalive", "socket_keepalive_options", "client_name",
    "encoding", "encoding_errors", "decode_responses", "protocol",
}  # fmt: skip


class _AsyncSentinelPool(SentinelConnectionPool, AsyncPool):
    """Sentinel's asyncio pool (each connection asks the sentinels for the primary),
    with `AsyncPool`'s hand-off to the first waiting task."""


class _AsyncRedisBase(Algorithm, AsyncProviderBase):
    unavailable_errors = UNAVAILABLE
    denied_errors = DENIED
    driver_errors = (errors.RedisError,)

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        client: aioredis.Redis | None = None,
        name: str | None = None,
        prefix: str = "locks",
        watchdog_ttl: float = 30.0,
        socket_timeout: float = 0.5,
        connect_timeout: float = 0.25,
        max_connections: int = 10,
        pool_timeout: float = 5.0,
        fence_ttl: float = 7 * 24 * 3600.0,
        sentinels: Sequence[str] | None = None,
        service: str | None = None,
        cluster_nodes: Sequence[str] | None = None,
        db: int | None = None,
        username: str | None = None,
        password: str | None = None,
        sentinel_username: str | None = None,
        sentinel_password: str | None = None,
        sync_replicas: int = 0,
        sync_timeout: float = 0.25,
        sync_aof: bool = False,
        tls_ca: str | os.PathLike[str] | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
        tls_key_password: str | None = None,
        tls_check_hostname: bool = True,
        sentinel_tls: bool | None = None,
    ) -> None:
        """As the threaded providers' arguments (`locks.backends.RedisProvider`);
        `client` is a `redis.asyncio.Redis` or `RedisCluster` (whose settings and nodes a
        pool per primary is made from). `max_connections` bounds the requests in flight (a
        Cluster's: to each primary), not the tasks (a waiting task holds no connection): the
        loop runs the replies that come back together one after another, so it is what
        bounds a busy loop's stalls. 10 kept the p99 loop lag of 1,000 contending tasks near
        3.5 ms on a 2-core VM (50: 13 ms) for 5 % fewer grants a second."""
        super().__init__(self.type_name if name is None else name, watchdog_ttl)
        tls = tls_settings(tls_ca, tls_cert, tls_key, tls_key_password, tls_check_hostname)
        self.prefix, self.fence_ttl_ms, timeouts = checked(
            prefix, fence_ttl, socket_timeout, connect_timeout, max_connections, pool_timeout
        )
        self._sync = replica_sync(sync_replicas, sync_timeout, sync_aof, timeouts.socket)
        self.sync_replicas = sync_replicas
        self._socket_timeout = timeouts.socket
        self._cluster: ClusterPools | None = None
        self._client: aioredis.Redis | None = None
        self._db: int
        self._kind: str  # the threaded face's `Topology.kind`
        self._runs: RunWatch
        self._make_cluster: Callable[[], ClusterPools]
        self._owned, self._passwords = client is None, []
        if isinstance(client, RedisCluster):
            self._db = 0
            self._kind = "cluster"
            manager = client.nodes_manager
            nodes = [(node.host, int(node.port)) for node in manager.startup_nodes.values()]
            self.address = "cluster " + ",".join(f"{host}:{port}" for host, port in nodes)
            self._runs = RunWatch(self._where(), True, self._run_changed)
            settings = {"connection_class": aioredis.Connection, **manager.connection_kwargs}
            self._make_cluster = _cluster_maker(nodes, settings, timeouts, self._hook(None))
            self._cluster = self._make_cluster()
        elif client is not None:
            if not isinstance(client, aioredis.Redis):
                raise TypeError(
                    "client must be a redis.asyncio.Redis or RedisCluster, not "
                    f"{type(client).__name__}"
                )
            self._client = client
            pool = client.connection_pool
            kwargs = pool.connection_kwargs
            self._db = int(kwargs.get("db", 0) or 0)
            self._kind = "sentinel" if isinstance(pool, SentinelConnectionPool) else "server"
            self.address = pool_address(pool)
            self._runs = RunWatch(self._where(), False, self._run_changed)
            kwargs["redis_connect_func"] = self._hook(kwargs.get("redis_connect_func"))
        else:
            threaded = topology(
                url, client=None, sentinels=sentinels, service=service,
                cluster_nodes=cluster_nodes, db=db, username=username, password=password,
                sentinel_username=sentinel_username, sentinel_password=sentinel_password,
                tls=tls, sentinel_tls=sentinel_tls, timeouts=timeouts,
            )  # fmt: skip
            self._db, self._kind = threaded.db, threaded.kind
            self.address = threaded.address
            self._passwords = threaded.secrets()
            self._runs = RunWatch(self._where(), self._kind == "cluster", self._run_changed)
            if isinstance(threaded, ClusterTopology):
                settings = {**threaded.settings, "connection_class": _connection_class(threaded)}
                self._make_cluster = _cluster_maker(threaded.nodes, settings, timeouts,
                                                    self._hook(None))  # fmt: skip
                self._cluster = self._make_cluster()
            else:
                self._make_client = _maker(threaded, timeouts, self._hook(None))
                self._client = self._make_client()
        self._notifier = AsyncNotifier(self._pubsub, prefix, self._pass_on, self._error)

    def after_fork_in_child(self) -> None:
        # the pool's connections and its condition belong to the parent and its loop:
        # a client of our own gets a new pool (a client passed in is its owner's to renew)
        super().after_fork_in_child()
        # never closed here, nor collected: closing a connection of the parent's loop
        # takes its socket out of the epoll instance the child shares with its parent
        if self._cluster is not None:  # a given cluster client's settings made its pools
            _LEFT_BY_PARENT.append(self._cluster)
            self._cluster = self._make_cluster()
        elif self._owned:
            _LEFT_BY_PARENT.append(self._client)
            self._client = self._make_client()

    def _hook(self, previous: Callable[[Any], Any] | None) -> Callable[[Any], Awaitable[None]]:
        """Every new connection's handshake (`previous`, a given client's own, or the
        usual one), then the server's run_id read for `self._runs`
        (`locks.backends.redis.runs`: a restart or failover under held leases)."""

        async def connected(connection: Any) -> None:
            if previous is None:
                await connection.on_connect()
            else:
                done = previous(connection)
                if inspect.isawaitable(done):
                    await done
            runs = self._runs
            if not runs.asks:
                return
            await connection.send_command("INFO", "server")
            try:
                reply = await connection.read_response()
            except REFUSED as refused:
                runs.refuse(refused)
                return
            runs.heard(connection, reply)

        return connected

    def _run_changed(self) -> None:
        """A connection met a server run it had not seen: every lease held here is
        checked, in the background (not inside the connection's handshake)."""
        held = self._holds()
        if held:
            self._in_background(self._check_after_new_run(held))

    async def _check_after_new_run(self, held: list[Hold]) -> None:
        try:
            present = [await self._areporting(hold.key, self._is_held(hold.anchor))
                       for hold in held]  # fmt: skip
        except LockError:  # gone again: each lease hears at its next renewal or release
            return
        for hold, here in zip(held, present, strict=True):
            if not here:
                self._lose(hold, lost_in_new_run(self.address))

    def _pubsub(self) -> Any:
        if self._cluster is not None:  # a publish reaches every node: any one will do
            return aioredis.Redis(connection_pool=self._cluster.some_pool()).pubsub()
        return self._single().pubsub()

    @property
    def client(self) -> aioredis.Redis:
        """The `redis.asyncio` client (of one server or Sentinel primary: a Cluster's
        provider keeps a pool per primary instead, and has none)."""
        return self._single()

    def _single(self) -> aioredis.Redis:
        if self._client is None:
            raise AttributeError(f"{self.name}: a Cluster provider has a pool per primary, "
                                 "not one client")  # fmt: skip
        return self._client

    async def _pool_for(self, key: str) -> AsyncPool:
        """The pool of the server that owns `key`."""
        if self._cluster is not None:
            return await self._cluster.for_key(key)
        return self._single().connection_pool  # type: ignore[return-value]  # ours

    def _keys(self, key: str) -> Keys:
        return keys_of(self.prefix, key)

    def _domain(self) -> Hashable:
        """The threaded face's (`Topology.domain`): one lock space."""
        return ("redis", (self._kind, self.address, self._db), self.prefix)

    def _classify(self, error: BaseException) -> type[BackendUnavailable] | type[BackendError]:
        return AccessDenied if refused(error) else super()._classify(error)

    def _secrets(self) -> list[str]:
        pool = (
            self._single().connection_pool if self._cluster is None else self._cluster.some_pool()
        )
        kwargs = pool.connection_kwargs
        found = [kwargs.get("password"), kwargs.get("ssl_password"),
                 *self._passwords]  # fmt: skip
        return [str(secret) for secret in found if secret]

    async def _run(
        self, script: Script, keys: list[str], args: list[Any], undo: Undo | None = None
    ) -> Any:
        """`script`'s reply (see `_exchange`)."""
        reply, _ = await self._exchange(script, keys, args, undo, synced=False)
        return reply

    async def _run_synced(
        self, script: Script, keys: list[str], args: list[Any], undo: Undo | None = None
    ) -> tuple[Any, Any]:
        """`script`'s reply and, with `sync_replicas`, what WAIT answered for it (else
        None)."""
        return await self._exchange(script, keys, args, undo, synced=self._sync is not None)

    async def _exchange(
        self, script: Script, keys: list[str], args: list[Any], undo: Undo | None, *,
        synced: bool,
    ) -> tuple[Any, Any]:  # fmt: skip
        """`script` by its SHA (in full if the server lost it: a restart), straight onto
        a pooled connection of the server that owns keys[0], packed by us: redis-py's
        `execute_command` costs several times more Python, and with a socket timeout its
        send is a task of its own. `synced`: WAIT written behind it in the same write (it
        counts that connection's writes); its reply is the second returned.

        The request is written at once, without a suspension, so it runs on the server
        whatever happens to the caller. A caller cancelled before the replies came leaves
        them to be read in the background, after `undo` (a script call that undoes
        this one, e.g. an acquire's release) is written behind it on the same connection,
        where the server runs it after this one, always."""
        wait = self._sync.command if synced and self._sync is not None else None

        async def on(pool: AsyncPool, asking: bool) -> tuple[Any, Any]:
            connection = await pool.get_connection()
            ask = b"".join(connection.pack_command("ASKING")) if asking else b""
            waits = b"".join(connection.pack_command(*wait)) if wait else b""
            unread = [0]  # replies written for and not read yet
            try:
                packed = ask + _packed(connection, script, keys, args)
                reply, acks = await _replies(connection, packed, waits, unread, asking)
                if isinstance(reply, errors.NoScriptError):
                    # the server lost it (a restart): EVAL in full, which caches it again
                    call = connection.pack_command("EVAL", script.source, len(keys), *keys,
                                                   *args)  # fmt: skip
                    reply, acks = await _replies(connection, ask + b"".join(call), waits,
                                                 unread, asking)  # fmt: skip
            except asyncio.CancelledError:
                self._in_background(self._drain(pool, connection, undo, unread[0], ask))
                raise
            except BaseException:
                await connection.disconnect(nowait=True)  # a reply may still be on its way
                await pool.release(connection)
                raise
            await pool.release(connection)  # an error reply too: the connection is in step
            return reply, acks

        return await self._routed(keys[0], on)

    async def _command(self, key: str, *command: Any) -> Any:
        """A plain command on the server that owns `key`: its reply."""
        reply, _ = await self._routed(key, lambda pool, asking: _command_on(pool, asking, command))
        return reply

    async def _routed(self, key: str, on: OnPool) -> tuple[Any, Any]:
        """`on` the pool of `key`'s server; on a Cluster, again where a MOVED or an ASK
        reply points, and the slot table read anew after a primary stopped answering
        (a failover's promoted replica serves the next call). An error reply is raised."""
        pool, asking = await self._pool_for(key), False
        for _ in range(_REDIRECTS):
            try:
                reply, second = await on(pool, asking)
            except (errors.ConnectionError, errors.TimeoutError, OSError):
                if self._cluster is not None:
                    self._cluster.forget_slots()
                raise
            if self._cluster is None or not isinstance(reply, errors.AskError):
                if isinstance(reply, Exception):
                    raise reply
                return reply, second
            pool, asking = await self._cluster.redirected(key, reply)  # MOVED is an ASK too
        raise errors.ClusterError(f"the slot of {key!r} kept moving")

    async def _drain(
        self, pool: AsyncPool, connection: Any, undo: Undo | None, unread: int, ask: bytes
    ) -> None:
        """After a cancelled call: `undo` written behind it (with ASKING if the call had
        it), every reply read (each within the socket timeout); the connection is then
        dropped, as its parser may have been stopped inside a reply."""
        try:
            if undo is not None:
                _write(connection, ask + _packed(connection, *undo))
                unread += 1 + bool(ask)
            for _ in range(unread):
                with contextlib.suppress(errors.ResponseError):
                    await connection.read_response(disconnect_on_error=False)
        except Exception as exc:  # gone: the server frees a grant at its ttl
            logger.debug("%s: reading a cancelled call's reply failed: %s", self.name, exc)
        finally:
            await connection.disconnect(nowait=True)
            await pool.release(connection)

    async def _acquire(
        self, key: str, owner: str, token: str, ttl: float, deadline: float | None
    ) -> Grant | None:
        keys = self._keys(key)
        ttl_ms = ms(ttl)
        notifier = self._notifier
        marked = notifier.listening  # a first try's mark is heard: no second try needed
        outcome = await self._try(keys, owner, token, ttl_ms, deadline, mark=marked)
        if not isinstance(outcome, int):
            return outcome
        if not marked:
            await notifier.listen(self._socket_timeout)
            outcome = await self._try(keys, owner, token, ttl_ms, deadline, mark=True)
        while isinstance(outcome, int):
            # a lost wake-up costs at most the holder's remaining ttl
            pause = outcome / 1000 if outcome > 0 else 0.01
            if deadline is not None:
                pause = min(pause, deadline - time.monotonic())
            await notifier.wait(keys.lock, max(pause, 0.0))
            outcome = await self._try(keys, owner, token, ttl_ms, deadline, mark=True)
        return outcome

    async def _try(
        self,
        keys: Keys,
        owner: str,
        token: str,
        ttl_ms: int,
        deadline: float | None,
        *,
        mark: bool,
    ) -> Grant | int | None:
        """A Grant, None (give up), or the ms to wait before the next try."""
        sent_at = time.monotonic()
        wait_ms = -1 if deadline is None else max(0, math.ceil((deadline - sent_at) * 1000))
        channel = self._notifier.channel if mark else ""
        args = self._acquire_args(owner, token, ttl_ms, wait_ms, channel)
        try:
            # cancelled before its reply, the grant it may bring is released behind it
            undo = (self.release_script, [keys.lock], [self._value(owner, token), ""])
            script, both = self.acquire_script, [keys.lock, keys.fence]
            reply, acks = await self._run_synced(script, both, args, undo)
        except (*self.driver_errors, *self.unavailable_errors) as exc:
            raise self._error(exc, ambiguous=maybe_sent(exc), key=keys.name, token=token) from exc
        fence, pttl, own = try_outcome(reply)
        if fence:
            if acks is not None:
                await self._replicated_or_undone(keys, undo, token, acks)
            return Grant(token, fence, 1, sent_at)
        if deadline is not None and time.monotonic() >= deadline:
            return None
        if own and deadline is None:
            return None  # waiting forever for ourselves would never end
        return pttl

    async def _replicated_or_undone(self, keys: Keys, undo: Undo, token: str, acks: Any) -> None:
        """A grant the replicas did not acknowledge is taken back before anyone relies on
        it: a failover now could hand the lock to a second owner."""
        assert self._sync is not None
        missing = self._sync.missing(acks, "grant undone")
        if missing is None:
            return
        try:
            await self._run(*undo)
        except (*self.driver_errors, *self.unavailable_errors) as exc:
            raise self._error(exc, ambiguous=True, key=keys.name, token=token) from exc
        raise self._error(missing) from missing

    async def _release(self, lease: Lease) -> bool:
        keys = self._keys(lease.key)
        local = self._notifier.channel if self._notifier.waits_on(keys.lock) else ""
        args = [self._value(lease.owner, lease.token), local]
        with self._translated():
            return bool(await self._run(self.release_script, [keys.lock], args) == 1)

    async def _pass_on(self, lock: str) -> None:
        """A wake-up this process had no use for goes to the next waiting process."""
        with self._translated():
            await self._run(self.pass_on_script, [lock], [])

    async def _extend(self, lease: Lease, ttl: float) -> bool:
        """With `sync_replicas`, a renewal the replicas did not acknowledge failed: the
        expiry a promoted replica would keep is the old one."""
        args = [self._value(lease.owner, lease.token), ms(ttl)]
        with self._translated():
            lock = self._keys(lease.key).lock
            reply, acks = await self._run_synced(self.extend_script, [lock], args)
            if reply != 1:
                return False
            self._require_replicas(acks, "renewal")
        return True

    async def _extend_many(self, requests: Sequence[tuple[Lease, float]]) -> list[bool | None]:
        """The watchdog's extends in one pipeline: one round trip for hundreds. One by
        one with `sync_replicas` (each renewal waits for its replicas); on a Cluster,
        whose keys live on several primaries, each on its own and all at once."""
        if self._cluster is not None:
            extends = (self._extend_or_unknown(lease, ttl) for lease, ttl in requests)
            return list(await asyncio.gather(*extends))
        if len(requests) < 2 or self._sync is not None:
            return await super()._extend_many(requests)
        script = self.extend_script
        calls: list[tuple[list[str], list[Any]]] = [
            ([self._keys(lease.key).lock], [self._value(lease.owner, lease.token), ms(ttl)])
            for lease, ttl in requests
        ]
        try:
            with self._translated():
                pipe = self._single().pipeline(transaction=False)
                for keys, args in calls:
                    pipe.evalsha(script.sha, len(keys), *keys, *args)
                replies = await pipe.execute(raise_on_error=False)
                for index, reply in enumerate(replies):
                    if isinstance(reply, errors.NoScriptError):  # EVAL caches it again
                        replies[index] = await self._run(script, *calls[index])
                    elif isinstance(reply, Exception):
                        raise reply
        except LockError as error:
            self._reported(requests[0][0].key, error)
            return [None] * len(requests)
        return [reply == 1 for reply in replies]

    async def _is_held(self, lease: Lease) -> bool:
        lock = self._keys(lease.key).lock
        with self._translated():
            try:
                reply = await self._command(lock, *self._held_query(lock))
            except errors.ResponseError as exc:
                if str(exc).startswith("WRONGTYPE"):  # the other lock type's key
                    return False
                raise
        return text(reply) == self._held_value(lease)

    async def raise_fence(self, key: str, floor: int) -> None:
        """Make every later grant of `key` carry a fence above `floor`."""
        key, floor = check_name(key), check_floor(floor)
        with self._translated():
            _, acks = await self._run_synced(self.raise_fence_script, [self._keys(key).fence],
                                             [floor, self.fence_ttl_ms])  # fmt: skip
            self._require_replicas(acks, "fence floor")

    async def _holder(self, key: str) -> Holder | None:
        keys = self._keys(key)
        with self._translated():
            reply = await self._run(self.holder_script, [keys.lock, keys.fence], [])
        return read_holder(self.name, key, reply)

    async def _break(self, key: str) -> Holder | None:
        keys = self._keys(key)
        with self._translated():
            reply, acks = await self._run_synced(self.break_script, [keys.lock, keys.fence], [])
            self._require_replicas(acks, "break")
        self._notifier.wake_local(keys.lock)
        return read_holder(self.name, key, reply)

    async def ping(self) -> None:
        """The server answers; on a Cluster, the slot table is read and every primary in
        it answers."""
        with self._translated():
            if self._cluster is None:
                await self._single().ping()
                return
            await self._cluster.refresh()
            for pool in self._cluster.primary_pools():
                reply, _ = await _command_on(pool, False, ("PING",))
                if isinstance(reply, Exception):
                    raise reply

    async def _close_io(self) -> None:
        self._runs.closed = True  # a given client's connections keep the hook: it idles
        await self._notifier.close()
        if self._cluster is not None:  # its pools are ours, even from a given client
            await self._cluster.disconnect()
        elif self._owned and self._client is not None:
            await self._client.aclose()
            pool = self._client.connection_pool
            await pool.disconnect()
            if isinstance(pool, SentinelConnectionPool):  # the sentinels asked for the primary
                for sentinel in pool.sentinel_manager.sentinels:
                    await sentinel.aclose()


class RedisProvider(PlainAlgorithm, _AsyncRedisBase):
    __doc__ = PlainAlgorithm.__doc__


class RedisHashProvider(HashAlgorithm, _AsyncRedisBase):
    __doc__ = HashAlgorithm.__doc__


def _write(connection: Any, packed: bytes) -> None:
    """Into the connection's transport, in order, with no suspension (the transport
    sends it as the socket allows; nothing here ever writes enough to need a drain)."""
    writer = connection._writer  # redis-py's asyncio connection keeps its StreamWriter here
    if writer is None:
        raise errors.ConnectionError("Connection closed by the pool")
    writer.write(packed)


async def _command_on(pool: AsyncPool, asking: bool, command: Sequence[Any]) -> tuple[Any, None]:
    """`command` on a connection of `pool` (ASKING first if `asking`): its reply, an
    error reply returned."""
    connection = await pool.get_connection()
    try:
        ask = b"".join(connection.pack_command("ASKING")) if asking else b""
        packed = ask + b"".join(connection.pack_command(*command))
        reply, _ = await _replies(connection, packed, b"", [0], asking)
    except BaseException:
        await connection.disconnect(nowait=True)  # a reply may still be on its way
        await pool.release(connection)
        raise
    await pool.release(connection)
    return reply, None


def _packed(connection: Any, script: Script, keys: list[str], args: list[Any]) -> bytes:
    encoder = connection.encoder
    return script.pack(keys, args, encoder.encoding, encoder.encoding_errors)


def _carried(kwargs: Mapping[str, Any], names: set[str]) -> dict[str, Any]:
    """The settings an asyncio connection takes over from a threaded one's."""
    return {k: v for k, v in kwargs.items() if k in names or k.startswith("ssl_")}


def _maker(
    threaded: Topology, timeouts: Timeouts, hook: Callable[[Any], Awaitable[None]]
) -> Callable[[], aioredis.Redis]:
    """What builds the `redis.asyncio` client of the topology the threaded face worked
    out, from its client's settings (that client made no connection, and is closed)."""
    pool: Any = threaded.client().connection_pool  # type: ignore[union-attr]  # no cluster
    settings: dict[str, Any] = _carried(pool.connection_kwargs, _CARRIED)
    settings |= {"max_connections": timeouts.max_connections, "timeout": timeouts.pool,
                 "redis_connect_func": hook}  # fmt: skip
    if threaded.kind != "sentinel":
        settings["connection_class"] = _CONNECTIONS[pool.connection_class]
        threaded.close()
        return lambda: aioredis.Redis(connection_pool=AsyncPool(**settings))
    settings["ssl"] = issubclass(pool.connection_class, redis.SSLConnection)
    service, sentinels = pool.service_name, pool.sentinel_manager.sentinels
    first = sentinels[0].connection_pool
    sentinel_kwargs = _carried(first.connection_kwargs, _CARRIED - {"host", "port", "path", "db"})
    sentinel_kwargs["ssl"] = issubclass(first.connection_class, redis.SSLConnection)
    hosts = [(kwargs["host"], kwargs["port"])
             for kwargs in (s.connection_pool.connection_kwargs for s in sentinels)]  # fmt: skip
    threaded.close()

    def make() -> aioredis.Redis:
        manager = Sentinel(hosts, sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
        made = _AsyncSentinelPool(service, manager, **settings)  # type: ignore[no-untyped-call]
        return aioredis.Redis(connection_pool=made)

    return make


def _connection_class(threaded: ClusterTopology) -> type[Any]:
    tls = any(name.startswith("ssl_") for name in threaded.settings)
    return aioredis.SSLConnection if tls else aioredis.Connection


def _cluster_maker(
    nodes: Sequence[tuple[str, int]], settings: Mapping[str, Any], timeouts: Timeouts,
    hook: Callable[[Any], Awaitable[None]],
) -> Callable[[], ClusterPools]:  # fmt: skip
    """What makes a Cluster's pools: each a pool of ours to one node, with the settings
    the threaded face's cluster client would give its connections (or a given asyncio
    cluster client's)."""
    carried = _carried(settings, _CARRIED - {"host", "port", "path", "db"})
    carried |= {"connection_class": settings["connection_class"], "redis_connect_func": hook,
                "max_connections": timeouts.max_connections, "timeout": timeouts.pool}  # fmt: skip

    def pool(host: str, port: int) -> AsyncPool:
        return AsyncPool(host=host, port=port, **carried)

    return lambda: ClusterPools(nodes, pool)


async def _replies(
    connection: Any, packed: bytes, wait: bytes, unread: list[int], asking: bool = False
) -> tuple[Any, Any]:
    """`packed` (ASKING first if `asking`) and `wait` (if any) written in one go, and
    their replies read; an error reply is returned, not raised (the connection stays
    in step). `unread[0]` counts the replies written for and not read yet."""
    _write(connection, packed + wait)
    unread[0] += 1 + bool(wait) + asking
    if asking:
        await _reply(connection, unread)  # OK
    reply = await _reply(connection, unread)
    acks = await _reply(connection, unread) if wait else None
    return reply, acks


async def _reply(connection: Any, unread: list[int]) -> Any:
    try:
        reply = await connection.read_response(disconnect_on_error=False)
    except errors.ResponseError as error:
        reply = error
    unread[0] -= 1
    return reply
