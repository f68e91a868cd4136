"""Redis backends: `redis` (SET NX PX, one token per grant) and `redis-hash` (Redisson's
reentrant hash). Both take the fence in the acquire script, wait through pub/sub with
every wait bounded by the key's PTTL, and report a dead server as `BackendUnavailable`
within the configured socket timeouts. The same code runs on one server, a Sentinel
primary or a Cluster (`topology`); `sync_replicas` makes each grant and renewal count
only once replicas have it."""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import redis
from redis import exceptions as errors

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
from locks.backends.redis.notify import NO_RESULT, Later, ReleaseNotifier
from locks.backends.redis.runs import RunWatch, lost_in_new_run
from locks.backends.redis.scripts import Script
from locks.backends.redis.topology import (
    DEFAULT_URL,
    Client,
    replica_sync,
    topology,
)
from locks.base import Grant, ProviderBase
from locks.errors import AccessDenied, BackendError, BackendUnavailable, LockError
from locks.holds import Hold
from locks.names import check_name
from locks.provider import Holder, Lease
from locks.tls import error_chain, tls_settings

logger = logging.getLogger("locks")


class _RedisProviderBase(Algorithm, ProviderBase):
    """What the two Redis algorithms share: client, keys, waiting, error translation."""

    unavailable_errors = UNAVAILABLE
    denied_errors = DENIED
    driver_errors = (errors.RedisError,)

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        client: Client | None = None,
        name: str | None = None,
        prefix: str = "locks",
        watchdog_ttl: float = 30.0,
        socket_timeout: float = 0.5,
        connect_timeout: float = 0.25,
        max_connections: int = 50,
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
        """TLS: a `rediss://` url (or `rediss+sentinel://`, `rediss+cluster://`), or the
        `tls_*` keywords for any form: `tls_ca` (a PEM file of CAs), `tls_cert` and
        `tls_key` (a client certificate and its key, both or neither; `tls_key_password`
        if the key is encrypted). The chain is always verified, and the host name unless
        `tls_check_hostname` is False. A Sentinel topology speaks TLS to the sentinels too
        unless `sentinel_tls` is False. A certificate that does not verify, or a server
        refusing ours, is `AccessDenied`, never an outage."""
        super().__init__(self.type_name if name is None else name, watchdog_ttl)
        tls = tls_settings(tls_ca, tls_cert, tls_key, tls_key_password, tls_check_hostname)
        self.prefix, self.fence_ttl_ms, timeouts = checked(
            prefix, fence_ttl, socket_timeout, connect_timeout, max_connections, pool_timeout
        )
        self._sync = replica_sync(sync_replicas, sync_timeout, sync_aof, timeouts.socket)
        self.sync_replicas = sync_replicas
        self.topology = topology(
            url, client=client, sentinels=sentinels, service=service,
            cluster_nodes=cluster_nodes, db=db, username=username, password=password,
            sentinel_username=sentinel_username, sentinel_password=sentinel_password,
            tls=tls, sentinel_tls=sentinel_tls, timeouts=timeouts,
        )  # fmt: skip
        self.address = self.topology.address
        self._notifier = ReleaseNotifier(
            self.topology.client, self._error, timeouts.socket, prefix, self._pass_on
        )
        self._answering = False  # the last acquire had an answer: see `splits`
        self._runs = RunWatch(self._where(), self.topology.kind == "cluster", self._run_changed)
        self.topology.watch_runs(self._runs)

    @property
    def client(self) -> Client:
        """The redis-py client (a cluster's is built on first use)."""
        with self._translated():
            return self.topology.client()

    # -- shared ------------------------------------------------------------------------------

    def _keys(self, key: str) -> Keys:
        return keys_of(self.prefix, key)

    def _domain(self) -> Hashable:
        return ("redis", self.topology.domain(), self.prefix)

    def _classify(self, error: BaseException) -> type[BackendUnavailable] | type[BackendError]:
        return AccessDenied if refused(error) else super()._classify(error)

    def _error(
        self,
        error: BaseException,
        *,
        ambiguous: bool = False,
        key: str | None = None,
        token: str | None = None,
    ) -> LockError:
        """As the base's, but where redis-py reached no sentinel or no cluster node and
        kept only the text of why, a handshake of our own tells a TLS refusal (which no
        retry fixes) from an outage."""
        probe = self.topology.probe
        if probe is not None and self._classify(error) is BackendUnavailable:
            if probe.tls is not None:
                try:
                    refusal = probe.handshakes.refusal(probe.tls.context())
                except OSError as files_error:  # files that loaded once no longer do
                    return BackendError(
                        f"{self._where()}: cannot load its TLS files: "
                        f"{self._detail(files_error)}",
                        backend=self.name, address=self.address,
                    )  # fmt: skip
                if refusal is not None:
                    return self._refused_tls(*refusal)
            elif not _timed_out(error):  # a hung server is no TLS server; never wait on it
                serves_tls = probe.handshakes.speaks_tls(b"PING\r\n")
                if serves_tls is not None:
                    return AccessDenied(
                        f"{self._where()}: {serves_tls} serves TLS only, and this provider "
                        "speaks plaintext (use rediss:// or the tls_* settings): "
                        f"{self._detail(error)}",
                        backend=self.name, address=self.address,
                    )  # fmt: skip
        return super()._error(error, ambiguous=ambiguous, key=key, token=token)

    def _acquire(
        self, key: str, owner: str, token: str, ttl: float, deadline: float | None
    ) -> Grant | None:
        keys = self._keys(key)
        ttl_ms = ms(ttl)
        notifier = self._notifier
        # listening already: this first try's mark is heard, so a failed one need not
        # be repeated once the waiter is counted (a wake-up in between is kept for it)
        marked = notifier.listening
        outcome = self._try(keys, owner, token, ttl_ms, deadline, mark=marked)
        if not isinstance(outcome, int):
            return outcome

        def attempt() -> Grant | int | None:
            return self._try(keys, owner, token, ttl_ms, deadline, mark=True)

        def claimed() -> Later[Grant | int | None]:
            """The attempt the subscriber makes for this waiter: sent, read here."""
            return self._try_later(keys, owner, token, ttl_ms, deadline)

        with notifier.waiting(keys.lock, deadline, claimed) as waiter:
            if not marked:
                outcome = attempt()
            while isinstance(outcome, int):
                # a lost wake-up costs at most the holder's remaining ttl
                pause = outcome / 1000 if outcome > 0 else 0.01
                if deadline is not None:
                    pause = min(pause, deadline - time.monotonic())
                result = waiter.wait(pause)
                outcome = attempt() if result is NO_RESULT else result
            return outcome

    def _try(
        self,
        keys: Keys,
        owner: str,
        token: str,
        ttl_ms: int,
        deadline: float | None,
        *,
        mark: bool,
    ) -> Grant | int | None:
        """A Grant, None (give up), or the ms to wait before the next try. `mark`: a
        failed try counts this provider's channel among the lock's waiters."""
        sent_at, args = self._try_args(owner, token, ttl_ms, deadline, mark=mark)
        try:
            reply, acks = self._call(
                self.acquire_script, [keys.lock, keys.fence], args, keys.name, token=token,
                owner=owner,
            )  # fmt: skip
        except (*self.driver_errors, *self.unavailable_errors) as exc:
            raise self._error(exc, ambiguous=maybe_sent(exc), key=keys.name, token=token) from exc
        return self._tried(keys, owner, token, deadline=deadline, sent_at=sent_at, reply=reply,
                           acks=acks)  # fmt: skip

    def _try_later(
        self, keys: Keys, owner: str, token: str, ttl_ms: int, deadline: float | None
    ) -> Later[Grant | int | None]:
        """A marking `_try` sent now, its reply read by whoever reads the `Later`
        returned (a woken waiter, while the subscriber goes back to listening); the
        whole `_try` run now where a call cannot be split. Either way the `Later` knows
        how to undo a grant nobody will use. Errors come ours from `_dispatch`."""

        def abandon(outcome: Grant | int | None) -> None:
            """Taken for a waiter that left meanwhile: not held for nobody till its ttl."""
            if isinstance(outcome, Grant):
                self.release_token(keys.name, owner, token)

        if not self.splits():
            outcome = self._try(keys, owner, token, ttl_ms, deadline, mark=True)
            return Later(lambda: outcome, abandon)
        sent_at, args = self._try_args(owner, token, ttl_ms, deadline, mark=True)
        read = self._dispatch(self.acquire_script, [keys.lock, keys.fence], args, keys.name,
                              token=token, owner=owner)  # fmt: skip
        return Later(lambda: self._tried(keys, owner, token, deadline=deadline, sent_at=sent_at,
                                         reply=read(), acks=None), abandon)  # fmt: skip

    def _try_args(
        self, owner: str, token: str, ttl_ms: int, deadline: float | None, *, mark: bool
    ) -> tuple[float, list[Any]]:
        """When a try is sent, and its script's ARGV."""
        sent_at = time.monotonic()
        wait_ms = -1 if deadline is None else max(0, math.ceil((deadline - sent_at) * 1000))
        channel = self._notifier.channel if mark else ""
        return sent_at, self._acquire_args(owner, token, ttl_ms, wait_ms, channel)

    def _tried(
        self,
        keys: Keys,
        owner: str,
        token: str,
        *,
        deadline: float | None,
        sent_at: float,
        reply: Any,
        acks: Any,
    ) -> Grant | int | None:
        """What an acquire script's reply means for the try (`_try`'s outcome)."""
        self._answering = True
        fence, pttl, own = try_outcome(reply)
        if fence:
            if acks is not None:
                self._replicated_or_undone(keys, owner, token, acks)
            return Grant(token, fence, 1, sent_at)
        if deadline is not None and time.monotonic() >= deadline:
            return None
        if own and deadline is None:
            return None  # waiting forever for ourselves would never end
        return pttl

    def _start_try(
        self, key: str, owner: str, token: str, ttl: float
    ) -> Callable[[], Grant | None] | None:
        """The acquire script sent now, its reply read later (a quorum sends to all its
        members before it reads from any). Not with `sync_replicas` (WAIT follows on
        the same connection) nor on a cluster."""
        keys = self._keys(key)
        sent_at = time.monotonic()
        args = self._acquire_args(owner, token, ms(ttl), 0, "")
        read = self._send(self.acquire_script, [keys.lock, keys.fence], args, key, token=token,
                          owner=owner)  # fmt: skip
        if read is None:
            return None

        def grant() -> Grant | None:
            reply = read()
            fence = reply if isinstance(reply, int) else 0
            return Grant(token, fence, 1, sent_at) if fence > 0 else None

        return grant

    def _release_args(self, keys: Keys, lease: Lease, *, hand_over: bool = False) -> list[Any]:
        """The release script's ARGV: with this provider's channel when it has waiters
        of its own on the lock, so that the release wakes them first; `hand_over`: the
        releasing thread is to wake them itself (`ReleaseNotifier.hand_over`), which
        the ARGV then says in its third place."""
        notifier = self._notifier
        if not notifier.waits_on(keys.lock):
            return [self._value(lease.owner, lease.token), ""]
        return [self._value(lease.owner, lease.token), notifier.channel, "1" if hand_over else ""]

    def _start_release(self, lease: Lease) -> Callable[[], bool]:
        keys = self._keys(lease.key)
        args = self._release_args(keys, lease, hand_over=True)
        read = self._send(self.release_script, [keys.lock], args, lease.key)
        if read is None:
            return super()._start_release(lease)
        if args[-1] != "1":
            return lambda: bool(read() == 1)
        notifier = self._notifier

        def released() -> bool:
            """The release's reply, then this process's next waiter's attempt sent from
            here: its subscriber would hear of the release a message later, and only
            then send it."""
            try:
                done = bool(read() == 1)
            except BaseException:  # it may have run, and told no waiter here
                notifier.wake_local(keys.lock)
                raise
            if done:
                notifier.hand_over(keys.lock)
            return done

        return released

    def splits(self) -> bool:
        """On one server or behind Sentinel, without `sync_replicas` (a WAIT must follow
        on the same connection); not on a cluster, whose client picks the node. And only
        once the server answered the last call: the send may have to connect, which a
        frozen server makes take a socket timeout, and a quorum sends to one member
        after another. Known without I/O."""
        return self._sync is None and self.topology.kind != "cluster" and self._answering

    def _send(
        self,
        script: Script,
        keys: list[str],
        args: list[Any],
        key: str,
        *,
        token: str | None = None,
        owner: str | None = None,
    ) -> Callable[[], Any] | None:
        """`script` sent on a connection of its own, and what reads its reply; None where
        a call cannot be split here (a cluster, or `sync_replicas`). `token` and `owner`:
        the call is an acquire of the lock KEYS[1] by them, whose outcome a failure
        leaves unknown, and which an interrupted read undoes (`_undo_behind`)."""
        if not self.splits():
            return None
        return self._dispatch(script, keys, args, key, token=token, owner=owner)

    def _dispatch(
        self,
        script: Script,
        keys: list[str],
        args: list[Any],
        key: str,
        *,
        token: str | None = None,
        owner: str | None = None,
    ) -> Callable[[], Any]:
        """`_send` on one server or behind Sentinel, at any time: straight onto a pooled
        connection, packed by us (redis-py's `execute_command` costs several times more
        Python around the same round trip); errors become ours, as `_send` says."""
        client = self.topology.client()
        assert isinstance(client, redis.Redis)
        pool = client.connection_pool
        try:
            connection = pool.get_connection()
        except (*self.driver_errors, *self.unavailable_errors) as exc:
            self._answering = False
            raise self._error(exc, key=key) from exc
        try:
            encoder = connection.encoder
            packed = script.pack(keys, args, encoder.encoding, encoder.encoding_errors)
            connection.send_packed_command([packed])  # type: ignore[no-untyped-call]
        except (*self.driver_errors, *self.unavailable_errors) as exc:
            self._answering = False
            pool.release(connection)
            maybe = token is not None and maybe_sent(exc)
            raise self._error(exc, ambiguous=maybe, key=key, token=token) from exc
        except BaseException:  # interrupted, maybe after the send: its reply must not stay
            self._undo_behind(connection, keys[0], token, owner)
            pool.release(connection)
            raise

        # the reply is due a socket timeout after the send, not after the read begins: a
        # quorum reads its members one after another, and k frozen members must cost
        # one timeout, not k
        timeout: float | None = connection.socket_timeout
        due = math.inf if timeout is None else time.monotonic() + timeout
        late = math.inf if timeout is None else 0.9 * timeout  # less left than this: look

        def read() -> Any:
            try:
                try:
                    left = due - time.monotonic()
                    if left < late and not connection.can_read(max(left, 0.0)):
                        raise errors.TimeoutError("Timeout reading from socket")
                    return connection.read_response(disconnect_on_error=False)
                except errors.NoScriptError:
                    call = [len(keys), *keys, *args]
                    connection.send_command("EVAL", script.source, *call)  # type: ignore[no-untyped-call]
                    return connection.read_response(disconnect_on_error=False)
            except (*self.driver_errors, *self.unavailable_errors) as exc:
                self._answering = False
                # a reply may still be on its way: never reuse the connection
                connection.disconnect()  # type: ignore[no-untyped-call]
                maybe = token is not None
                raise self._error(exc, ambiguous=maybe, key=key, token=token) from exc
            except BaseException:
                # interrupted before the reply was read (a signal's handler, a gevent
                # Timeout): given back open, the next call on it would read this reply
                # as its own
                self._undo_behind(connection, keys[0], token, owner)
                raise
            finally:
                pool.release(connection)

        return read

    def _call(
        self,
        script: Script,
        keys: list[str],
        args: list[Any],
        key: str,
        *,
        token: str | None = None,
        owner: str | None = None,
    ) -> tuple[Any, Any]:
        """Run `script` for the lock `key`: (its reply, None), or with `sync_replicas`
        (its reply, what WAIT answered on the same connection). `token`, `owner`: an
        acquire's, which an error leaves in doubt (`_send`). Errors may come raw from
        the driver or already ours."""  # fmt: skip
        if self._sync is not None:
            return self._sync.run(self.topology, script, keys, args)
        if self.topology.kind == "cluster":  # its client picks the node
            return script(self.topology.client(), keys, args), None
        return self._dispatch(script, keys, args, key, token=token, owner=owner)(), None

    def _undo_behind(
        self, connection: Any, lock: str, token: str | None, owner: str | None
    ) -> None:
        """Close a connection whose reply was not read; behind an acquire (`token` and
        `owner` given), write its grant's release first. The server runs the two in
        order, so whatever the interrupted acquire took is freed at once instead of at
        its ttl, as the asyncio face does for a cancelled call. No reply is read: the
        parser may have been stopped inside one. Written only on the connection as it
        is (never a new one, where the release could run before the acquire)."""
        try:
            sock = connection._sock  # written to as it is: `send_packed_command` reconnects
            if token is not None and owner is not None and sock is not None:
                # EVAL, not EVALSHA: no reply is read, so a NOSCRIPT would go unseen
                script, value = self.release_script, self._value(owner, token)
                undo = connection.pack_command("EVAL", script.source, 1, lock, value, "")
                sock.sendall(b"".join(undo))
        except Exception as exc:  # gone: the server frees a grant at its ttl
            logger.debug("%s: undoing an interrupted acquire failed: %s", self.name, exc)
        finally:
            connection.disconnect()

    def _replicated_or_undone(self, keys: Keys, owner: str, token: str, acks: Any) -> None:
        """A grant the replicas did not acknowledge is taken back before anyone relies on
        it: a failover now could hand the lock to a second owner."""
        assert self._sync is not None
        missing = self._sync.missing(acks, "grant undone")
        if missing is None:
            return
        try:
            script_args = [self._value(owner, token), ""]
            self.release_script(self.topology.client(), [keys.lock], script_args)
        except (*self.driver_errors, *self.unavailable_errors) as exc:
            raise self._error(exc, ambiguous=True, key=keys.name, token=token) from exc
        raise self._error(missing) from missing

    def _script(self, script: Script, keys: list[str], args: list[Any]) -> Any:
        with self._translated():
            return script(self.topology.client(), keys, args)

    def _release(self, lease: Lease) -> bool:
        keys = self._keys(lease.key)
        args = self._release_args(keys, lease)
        return bool(self._script(self.release_script, [keys.lock], args) == 1)

    def _pass_on(self, lock: str) -> None:
        """A wake-up this process had no use for goes to the next waiting process."""
        self._script(self.pass_on_script, [lock], [])

    def _extend(self, lease: Lease, ttl: float) -> bool:
        """With `sync_replicas`, a renewal the replicas did not acknowledge failed: the
        expiry a promoted replica would keep is the old one."""
        args = [self._value(lease.owner, lease.token), ms(ttl)]
        with self._translated():
            lock = self._keys(lease.key).lock
            reply, acks = self._call(self.extend_script, [lock], args, lease.key)
            if reply != 1:
                return False
            self._require_replicas(acks, "renewal")
        return True

    def _extend_many(self, requests: Sequence[tuple[Lease, float]]) -> list[bool | None]:
        """The watchdog's extends in one pipeline: one round trip for hundreds of
        renewals. One by one with `sync_replicas` (each renewal waits for its replicas)
        and on a cluster (whose client splits a pipeline by node)."""
        if len(requests) < 2 or self._sync is not None or self.topology.kind == "cluster":
            return super()._extend_many(requests)
        try:
            replies = self._reporting(requests[0][0].key, self._extend_pipelined, requests)
        except LockError:
            return [None] * len(requests)
        return [reply == 1 for reply in replies]

    def _extend_pipelined(self, requests: Sequence[tuple[Lease, float]]) -> list[Any]:
        script = self.extend_script
        calls = [
            ([self._keys(lease.key).lock], [self._value(lease.owner, lease.token), ms(ttl)])
            for lease, ttl in requests
        ]
        with self._translated():
            client = self.topology.client()
            pipe = client.pipeline(transaction=False)
            for keys, args in calls:
                script.queue(pipe, keys, args, by_sha=True)
            replies = pipe.execute(raise_on_error=False)
            for index, reply in enumerate(replies):
                if isinstance(reply, errors.NoScriptError):  # EVAL, which caches it again
                    replies[index] = script(client, *calls[index])
                elif isinstance(reply, Exception):
                    raise reply
        return list(replies)

    def raise_fence(self, key: str, floor: int) -> None:
        """Make every later grant of `key` carry a fence above `floor` (a quorum keeps its
        fences increasing this way). With `sync_replicas`, a floor the replicas did not
        acknowledge is an outage: a promoted replica would not have it."""
        key, floor = check_name(key), check_floor(floor)
        fence_key = self._keys(key).fence
        with self._translated():
            args = [floor, self.fence_ttl_ms]
            _, acks = self._call(self.raise_fence_script, [fence_key], args, key)
            self._require_replicas(acks, "fence floor")

    def _holder(self, key: str) -> Holder | None:
        """Either type's holder: a lock of the other type excludes this one too."""
        keys = self._keys(key)
        reply = self._script(self.holder_script, [keys.lock, keys.fence], [])
        return read_holder(self.name, key, reply)

    def _break(self, key: str) -> Holder | None:
        """With `sync_replicas`, a break the replicas did not acknowledge is an outage: a
        promoted replica would still hold the broken grant."""
        keys = self._keys(key)
        with self._translated():
            reply, acks = self._call(self.break_script, [keys.lock, keys.fence], [], key)
            self._require_replicas(acks, "break")
        self._notifier.wake_local(keys.lock)
        return read_holder(self.name, key, reply)

    def _run_changed(self) -> None:
        """A connection met a server run it had not seen (a restart, a failover): every
        lease held here is checked, on a thread of its own (a lost one's callbacks must
        not run inside a connection's handshake)."""
        held = self._holds()
        if held:
            threading.Thread(target=self._check_after_new_run, args=(held,), daemon=True,
                             name=f"locks-{self.name}-check").start()  # fmt: skip

    def _check_after_new_run(self, held: list[Hold]) -> None:
        try:
            present = self._reporting(held[0].key, self._still_held, [h.anchor for h in held])
        except LockError:  # gone again: each lease hears at its next renewal or release
            return
        except Exception:  # closed under it, which redis-py may report as anything
            if not self._runs.closed:
                logger.exception("%s: checking the leases after a new run failed", self.name)
            return
        for hold, here in zip(held, present, strict=True):
            if not here:
                self._lose(hold, lost_in_new_run(self.address))

    def _is_held(self, lease: Lease) -> bool:
        return self._still_held([lease])[0]

    def _still_held(self, leases: Sequence[Lease]) -> list[bool]:
        """Whether each grant is still on the server, read in one pipeline. The other
        lock type's key (WRONGTYPE) holds nothing of ours."""
        with self._translated():
            pipe = self.topology.client().pipeline(transaction=False)
            for lease in leases:
                pipe.execute_command(*self._held_query(self._keys(lease.key).lock))
            replies = pipe.execute(raise_on_error=False)
            for reply in replies:
                if isinstance(reply, Exception) and not str(reply).startswith("WRONGTYPE"):
                    raise reply
        return [
            not isinstance(reply, Exception) and text(reply) == self._held_value(lease)
            for lease, reply in zip(leases, replies, strict=True)
        ]

    def _secrets(self) -> list[str]:
        return self.topology.secrets()

    def ping(self) -> None:
        with self._translated():
            self.topology.client().ping()
        self._answering = True

    def close(self) -> None:
        self._runs.closed = True  # a given client's connections keep the hook: it idles
        super().close()
        self._notifier.close()
        self.topology.close()


class RedisProvider(PlainAlgorithm, _RedisProviderBase):
    __doc__ = PlainAlgorithm.__doc__


class RedisHashProvider(HashAlgorithm, _RedisProviderBase):
    __doc__ = HashAlgorithm.__doc__


def _timed_out(error: BaseException) -> bool:
    """Whether a time-out is in `error`'s chain (redis-py's Sentinel and Cluster errors
    keep only its text)."""
    return any(
        isinstance(cause, (errors.TimeoutError, TimeoutError)) or "Timeout" in str(cause)
        for cause in error_chain(error)
    )
