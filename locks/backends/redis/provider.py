"""Redis backends: `redis` (SET NX PX, one token per grant) and `redis-hash` (Redisson's
reentrant hash). Both take the fence in the acquire script, wait through pub/sub with
every wait bounded by the key's PTTL, and report a dead server as `BackendUnavailable`
within the configured socket timeouts."""

from __future__ import annotations

import functools
import hashlib
import time
from abc import abstractmethod
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import redis
from redis import exceptions as errors
from redis.backoff import NoBackoff
from redis.retry import Retry

from locks.backends.redis import scripts
from locks.backends.redis.notify import NO_RESULT, ReleaseNotifier
from locks.base import Grant, ProviderBase
from locks.errors import AccessDenied, BackendError, BackendUnavailable
from locks.names import check_name, check_seconds, redis_hash_tag
from locks.provider import Capabilities, Holder, Lease

# "This Redis cannot serve us now": unreachable, timed out, a demoted primary (READONLY),
# still loading its data (LOADING), out of memory (OOM), no primary (MASTERDOWN,
# CLUSTERDOWN, TRYAGAIN). The only errors that degrade a chain.
_UNAVAILABLE = (
    errors.ConnectionError, errors.TimeoutError, errors.ReadOnlyError, errors.BusyLoadingError,
    errors.OutOfMemoryError, errors.ClusterDownError, errors.TryAgainError, OSError,
)  # fmt: skip
# Credentials or ACLs refused: WRONGPASS/NOAUTH (AuthenticationError, which redis-py
# derives from ConnectionError: it is sorted first), NOPERM.
_DENIED = (errors.AuthenticationError, errors.AuthorizationError, errors.NoPermissionError,
           errors.AuthenticationWrongNumberOfArgsError)  # fmt: skip
# inside a script, a command the ACL forbids fails with a plain error carrying this text
_SCRIPT_DENIED = "can't run this command"


@dataclass(frozen=True, slots=True)
class _Keys:
    name: str  # the lock's name, as the caller gave it
    lock: str
    fence: str
    channel: str


class _RedisProviderBase(ProviderBase):
    """What the two Redis algorithms share: client, keys, waiting, error translation."""

    unavailable_errors = _UNAVAILABLE
    denied_errors = _DENIED
    driver_errors = (errors.RedisError,)
    acquire_lua: ClassVar[str]
    release_lua: ClassVar[str]
    extend_lua: ClassVar[str]

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        client: redis.Redis | None = None,
        name: str | None = None,
        prefix: str = "locks",
        watchdog_ttl: float = 30.0,
        socket_timeout: float = 0.5,
        connect_timeout: float = 0.25,
        max_connections: int = 50,
        pool_timeout: float = 5.0,
        fence_ttl: float = 7 * 24 * 3600.0,
    ) -> None:
        super().__init__(self.type_name if name is None else name, watchdog_ttl)
        prefix = check_name(prefix, "prefix")
        if "{" in prefix or "}" in prefix:
            raise ValueError("prefix must not contain '{' or '}': they would move the hash tag")
        self.prefix = prefix
        self.fence_ttl_ms = _ms(check_seconds(fence_ttl, "fence_ttl"))
        socket_timeout = check_seconds(socket_timeout, "socket_timeout")
        self._owns_client = client is None
        if client is None:
            if not isinstance(url, str):
                raise TypeError(f"url must be a str, not {type(url).__name__}")
            pool = redis.BlockingConnectionPool.from_url(
                url,
                max_connections=max_connections,
                timeout=check_seconds(pool_timeout, "pool_timeout"),
                socket_timeout=socket_timeout,
                socket_connect_timeout=check_seconds(connect_timeout, "connect_timeout"),
                retry=Retry(NoBackoff(), 0),  # the chain decides about retries, not redis-py
            )
            client = redis.Redis(connection_pool=pool)
        elif not isinstance(client, redis.Redis):
            raise TypeError(f"client must be a redis.Redis, not {type(client).__name__}")
        self.client = client
        self.address = _address(client)
        self._notifier = ReleaseNotifier(client, self._error, confirm_timeout=socket_timeout)
        self._acquire_script = _Script(client, self.acquire_lua)
        self._release_script = _Script(client, self.release_lua)
        self._extend_script = _Script(client, self.extend_lua)
        self._holder_script = _Script(client, scripts.READ_HOLDER)

    # -- the algorithm's part -----------------------------------------------------------

    @abstractmethod
    def _acquire_args(self, keys: _Keys, owner: str, token: str, ttl_ms: int) -> list[Any]:
        """ARGV of this algorithm's acquire script."""

    # -- shared ------------------------------------------------------------------------------

    def _keys(self, key: str) -> _Keys:
        return _keys(self.prefix, key)

    def _domain(self) -> Hashable:
        db = self.client.connection_pool.connection_kwargs.get("db", 0)
        return ("redis", self.address, db, self.prefix)

    def _classify(self, error: BaseException) -> type[BackendUnavailable] | type[BackendError]:
        if isinstance(error, errors.ResponseError) and _SCRIPT_DENIED in str(error):
            return AccessDenied
        return super()._classify(error)

    def _acquire(
        self, key: str, owner: str, token: str, ttl: float, deadline: float | None
    ) -> Grant | None:
        keys = self._keys(key)
        ttl_ms = _ms(ttl)
        outcome = self._try(keys, owner, token, ttl_ms, deadline)
        if not isinstance(outcome, int):
            return outcome

        def attempt() -> Grant | int | None:
            return self._try(keys, owner, token, ttl_ms, deadline)

        with self._notifier.waiting(keys.channel, deadline, attempt) as waiter:
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
        self, keys: _Keys, owner: str, token: str, ttl_ms: int, deadline: float | None
    ) -> Grant | int | None:
        """A Grant, None (give up), or the ms to wait before the next try."""
        sent_at = time.monotonic()
        args = self._acquire_args(keys, owner, token, ttl_ms)
        try:
            reply = self._acquire_script([keys.lock, keys.fence], args)
        except (errors.RedisError, OSError) as exc:
            # refused at connect: the script was never sent, so nothing can have been taken
            sent = not isinstance(exc.__context__, ConnectionRefusedError)
            raise self._error(exc, ambiguous=sent, key=keys.name, token=token) from exc
        # the reply shapes are described in locks.backends.redis.scripts
        if isinstance(reply, int):
            if reply > 0:
                return Grant(token, reply, 1, sent_at)
            pttl, own = -reply - 1, False
        else:
            pttl, own = int(reply[0]), True
        if deadline is not None and time.monotonic() >= deadline:
            return None
        if own and deadline is None:
            return None  # waiting forever for ourselves would never end
        return pttl

    def _script(self, script: _Script, keys: list[str], args: list[Any]) -> Any:
        with self._translated():
            return script(keys, args)

    def _holder(self, key: str) -> Holder | None:
        """Either type's holder: a lock of the other type excludes this one too."""
        keys = self._keys(key)
        reply = self._script(self._holder_script, [keys.lock, keys.fence], [])
        if len(reply) < 4:
            return None
        kind, pttl, fence, value = str(_text(reply[0])), reply[1], reply[2], reply[3]
        if kind == "string":  # the `redis` type's value is owner/token
            owner = str(_text(value)).rsplit("/", 1)[0]
        else:
            fields = [str(_text(field)) for field in value[::2]]
            owners = [field for field in fields if not field.startswith("~")]
            if not owners:
                return None
            owner = owners[0]  # one owner field, beside ~token and ~fence
        return Holder(key, self.name, owner, None, _int(fence), _seconds(pttl))

    def _secret(self) -> str | None:
        password = self.client.connection_pool.connection_kwargs.get("password")
        return str(password) if password else None

    def ping(self) -> None:
        with self._translated():
            self.client.ping()

    def close(self) -> None:
        super().close()
        self._notifier.close()
        if self._owns_client:
            self.client.close()
            self.client.connection_pool.disconnect()


class RedisProvider(_RedisProviderBase):
    """Type `redis`: `SET key owner/token NX PX`, Lua compare-and-delete. Not reentrant."""

    type_name = "redis"
    capabilities = Capabilities(
        reentrant=False,
        expires=True,
        renewable=True,
        fair=False,
        fenced=True,
        cross_process=True,
        cross_host=True,
    )

    acquire_lua = scripts.PLAIN_ACQUIRE
    release_lua = scripts.PLAIN_RELEASE
    extend_lua = scripts.PLAIN_EXTEND

    def _acquire_args(self, keys: _Keys, owner: str, token: str, ttl_ms: int) -> list[Any]:
        return [f"{owner}/{token}", ttl_ms, self.fence_ttl_ms]

    def _release(self, lease: Lease) -> bool:
        keys = self._keys(lease.key)
        args = [_plain_value(lease), keys.channel]
        return bool(self._script(self._release_script, [keys.lock], args) == 1)

    def _extend(self, lease: Lease, ttl: float) -> bool:
        args = [_plain_value(lease), _ms(ttl)]
        return bool(self._script(self._extend_script, [self._keys(lease.key).lock], args) == 1)

    def _is_held(self, lease: Lease) -> bool:
        with self._translated(), _other_type_is_not_ours():
            value = self.client.get(self._keys(lease.key).lock)
            return _text(value) == _plain_value(lease)
        return False


class RedisHashProvider(_RedisProviderBase):
    """Type `redis-hash`: Redisson's algorithm, reentrant per owner."""

    type_name = "redis-hash"
    capabilities = Capabilities(
        reentrant=True,
        expires=True,
        renewable=True,
        fair=False,
        fenced=True,
        cross_process=True,
        cross_host=True,
    )

    acquire_lua = scripts.HASH_ACQUIRE
    release_lua = scripts.HASH_RELEASE
    extend_lua = scripts.HASH_EXTEND

    def _acquire_args(self, keys: _Keys, owner: str, token: str, ttl_ms: int) -> list[Any]:
        return [token, ttl_ms, self.fence_ttl_ms, owner]

    def _release(self, lease: Lease) -> bool:
        keys = self._keys(lease.key)
        args = [lease.token, keys.channel]
        return bool(self._script(self._release_script, [keys.lock], args) == 1)

    def _extend(self, lease: Lease, ttl: float) -> bool:
        args = [lease.token, _ms(ttl)]
        return bool(self._script(self._extend_script, [self._keys(lease.key).lock], args) == 1)

    def _is_held(self, lease: Lease) -> bool:
        with self._translated(), _other_type_is_not_ours():
            return _text(self.client.hget(self._keys(lease.key).lock, "~token")) == lease.token
        return False


class _Script:
    """A Lua script called by SHA, loaded when the server does not know it yet (first
    use, a restart, SCRIPT FLUSH). Cheaper per call than redis-py's `Script`."""

    __slots__ = ("_client", "_sha", "_source")

    def __init__(self, client: redis.Redis, source: str) -> None:
        self._client = client
        self._source = source
        self._sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(self, keys: list[str], args: list[Any]) -> Any:
        try:
            return self._client.execute_command(  # type: ignore[no-untyped-call]
                "EVALSHA", self._sha, len(keys), *keys, *args
            )
        except errors.NoScriptError:
            self._client.script_load(self._source)
            return self._client.execute_command(  # type: ignore[no-untyped-call]
                "EVALSHA", self._sha, len(keys), *keys, *args
            )


@contextmanager
def _other_type_is_not_ours() -> Iterator[None]:
    """A read of the other lock type's key (WRONGTYPE) finds nothing of ours: the
    statement after the `with` runs instead of an error."""
    try:
        yield
    except errors.ResponseError as exc:
        if not str(exc).startswith("WRONGTYPE"):
            raise


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _seconds(pttl: Any) -> float | None:
    """PTTL's milliseconds as seconds; None for a key with no expiry (-1) or none (-2)."""
    return None if pttl is None or int(pttl) < 0 else int(pttl) / 1000


@functools.lru_cache(maxsize=4096)
def _keys(prefix: str, key: str) -> _Keys:
    """The lock key, fence key and release channel of `key`, sharing one hash tag."""
    base = f"{prefix}:{{{redis_hash_tag(key)}}}"
    return _Keys(key, base, base + ":fence", base + ":released")


def _plain_value(lease: Lease) -> str:
    """What the `redis` backend stores: the owner first, so the acquire script can tell
    the holder's own second acquire apart from contention."""
    return f"{lease.owner}/{lease.token}"


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _address(client: redis.Redis) -> str:
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix:{kwargs['path']}"
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
