"""What both faces of the Redis backends share (the threaded providers in
`locks.backends.redis.provider`, the asyncio ones in `locks.aio.redis`): the two
algorithms' arguments and replies, the keys of a lock, and how Redis's errors sort."""

from __future__ import annotations

import dataclasses
import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from redis import exceptions as errors
from redis.asyncio.sentinel import MasterNotFoundError as AsyncMasterNotFoundError
from redis.sentinel import MasterNotFoundError

from locks.backends.redis import scripts
from locks.backends.redis.scripts import Script
from locks.backends.redis.topology import NotReplicated, ReplicaSync, Timeouts
from locks.names import check_count, check_name, check_seconds, redis_hash_tag
from locks.provider import Capabilities, Holder, Lease
from locks.tls import error_chain

# "This Redis cannot serve us now": unreachable, timed out, a demoted primary (READONLY),
# still loading its data (LOADING), out of memory (OOM), no primary (MASTERDOWN,
# CLUSTERDOWN, TRYAGAIN, a cluster client that reaches no node or no owner of a slot).
# The only errors that degrade a chain.
UNAVAILABLE = (
    errors.ConnectionError, errors.TimeoutError, errors.ReadOnlyError, errors.BusyLoadingError,
    errors.OutOfMemoryError, errors.ClusterDownError, errors.TryAgainError, errors.ClusterError,
    errors.RedisClusterException, OSError,
    NotReplicated,  # ours: `sync_replicas` not met, an outage of the replicas
)  # fmt: skip
# Credentials or ACLs refused: WRONGPASS/NOAUTH (AuthenticationError, which redis-py
# derives from ConnectionError: it is sorted first), NOPERM.
DENIED = (errors.AuthenticationError, errors.AuthorizationError, errors.NoPermissionError,
           errors.AuthenticationWrongNumberOfArgsError)  # fmt: skip
# inside a script, a command, key or channel the ACL forbids fails with a plain error
# (no NOPERM) carrying one of these texts: Redis 7.0 "The user executing the script
# can't run this command / publish to the channel / access at least one of the keys",
# 7.2 and later "ACL failure in script"
SCRIPT_DENIED = ("The user executing the script can't", "ACL failure in script")


@dataclass(frozen=True, slots=True)
class Keys:
    name: str  # the lock's name, as the caller gave it
    lock: str
    fence: str
    waiters: str  # the channels of processes waiting, for the release to wake (scripts.py)


def checked(  # noqa: PLR0917 - the providers' own arguments, passed on as they came
    prefix: str,
    fence_ttl: float,
    socket_timeout: float,
    connect_timeout: float,
    max_connections: int,
    pool_timeout: float,
) -> tuple[str, int, Timeouts]:
    """Both faces' arguments that are not the topology's, checked before any I/O: the
    key prefix, the fence counters' ttl in ms, the timeouts."""
    prefix = check_name(prefix, "prefix")
    if "{" in prefix or "}" in prefix:
        raise ValueError("prefix must not contain '{' or '}': they would move the hash tag")
    timeouts = Timeouts(
        socket=check_seconds(socket_timeout, "socket_timeout"),
        connect=check_seconds(connect_timeout, "connect_timeout"),
        max_connections=check_count(max_connections, "max_connections"),
        pool=check_seconds(pool_timeout, "pool_timeout"),
    )
    return prefix, ms(check_seconds(fence_ttl, "fence_ttl")), timeouts


def check_floor(floor: object) -> int:
    """A fence floor (`raise_fence`), refused before any I/O unless an int Lua keeps exact."""
    if isinstance(floor, bool) or not isinstance(floor, int) or not 0 <= floor < 2**53:
        raise ValueError(f"floor must be an int from 0 to 2**53, got {floor!r}")
    return floor


def refused(error: BaseException) -> bool:
    """Whether Redis refused credentials or permissions anywhere in `error`'s chain:
    redis-py's cluster client turns a NOPERM on CLUSTER SLOTS into "cluster mode is not
    enabled", then "cannot be connected"."""
    return any(
        isinstance(cause, DENIED)
        or (isinstance(cause, errors.ResponseError) and any(t in str(cause) for t in SCRIPT_DENIED))
        for cause in error_chain(error)
    )


def try_outcome(reply: Any) -> tuple[int, int, bool]:
    """An acquire script's reply (shapes in `locks.backends.redis.scripts`): the fence of
    a grant (0: none), the holder's pttl otherwise, and whether the holder is the caller."""
    if isinstance(reply, int):
        return (reply, 0, False) if reply > 0 else (0, -reply - 1, False)
    return 0, int(reply[0]), True


def read_holder(backend: str, key: str, reply: Any) -> Holder | None:
    """The holder in a READ_HOLDER (or BREAK) reply, of either lock type."""
    if len(reply) < 4:
        return None
    kind, pttl, fence, value = str(text(reply[0])), reply[1], reply[2], reply[3]
    if kind == "string":  # the `redis` type's value is owner/token
        owner = str(text(value)).rsplit("/", 1)[0]
    else:
        fields = [str(text(field)) for field in value[::2]]
        owners = [field for field in fields if not field.startswith("~")]
        if not owners:
            return None
        owner = owners[0]  # one owner field, beside ~token and ~fence
    return Holder(key, backend, owner, None, _int(fence), _seconds(pttl))


class Algorithm(ABC):
    """One of the two lock types' scripts and what they take and store."""

    fence_ttl_ms: int
    _sync: ReplicaSync | None  # `sync_replicas`: WAIT after each write that must last
    # the scripts, one object per class (each caches its packed heads)
    acquire_script: ClassVar[Script]
    release_script: ClassVar[Script]
    extend_script: ClassVar[Script]
    holder_script = Script(scripts.READ_HOLDER)
    break_script = Script(scripts.BREAK)
    raise_fence_script = Script(scripts.RAISE_FENCE)
    pass_on_script = Script(scripts.PASS_ON)

    def _require_replicas(self, acks: Any, what: str) -> None:
        """Raise unless the replicas acknowledged the write `acks` answers for (None:
        no WAIT was asked)."""
        if acks is not None and self._sync is not None:
            missing = self._sync.missing(acks, f"{what} not replicated")
            if missing is not None:
                raise missing

    @abstractmethod
    def _acquire_args(
        self, owner: str, token: str, ttl_ms: int, wait_ms: int, channel: str
    ) -> list[Any]:
        """ARGV of this algorithm's acquire script; `wait_ms`: how long a failed try may
        still wait (-1 for ever, 0 not at all), for which it puts `channel` (none: '')
        into the lock's waiters, so that a release wakes it."""

    @abstractmethod
    def _value(self, owner: str, token: str) -> str:
        """What this algorithm's release and extend scripts compare with the stored grant."""

    @abstractmethod
    def _held_query(self, lock: str) -> tuple[str, ...]:
        """The command that reads what this algorithm stores as its grant's identity."""

    @abstractmethod
    def _held_value(self, lease: Lease) -> str:
        """What `_held_query` answers while `lease`'s grant is on the server."""


class PlainAlgorithm(Algorithm):
    """Type `redis`: `SET key owner/token NX PX`, Lua compare-and-delete. Not reentrant.
    The algorithm's half of a provider, shared by the threaded and asyncio faces."""

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

    acquire_script = Script(scripts.PLAIN_ACQUIRE)
    release_script = Script(scripts.PLAIN_RELEASE)
    extend_script = Script(scripts.PLAIN_EXTEND)

    def _acquire_args(
        self, owner: str, token: str, ttl_ms: int, wait_ms: int, channel: str
    ) -> list[Any]:
        return [self._value(owner, token), ttl_ms, self.fence_ttl_ms, wait_ms, channel]

    def _value(self, owner: str, token: str) -> str:
        """The owner first, so the acquire script can tell the holder's own second
        acquire apart from contention."""
        return f"{owner}/{token}"

    def _held_query(self, lock: str) -> tuple[str, ...]:
        return ("GET", lock)

    def _held_value(self, lease: Lease) -> str:
        return self._value(lease.owner, lease.token)


class HashAlgorithm(Algorithm):
    """Type `redis-hash`: Redisson's algorithm, reentrant per owner. The algorithm's half
    of a provider, shared by the threaded and asyncio faces."""

    type_name = "redis-hash"
    capabilities = dataclasses.replace(PlainAlgorithm.capabilities, reentrant=True)

    acquire_script = Script(scripts.HASH_ACQUIRE)
    release_script = Script(scripts.HASH_RELEASE)
    extend_script = Script(scripts.HASH_EXTEND)

    def _acquire_args(
        self, owner: str, token: str, ttl_ms: int, wait_ms: int, channel: str
    ) -> list[Any]:
        return [token, ttl_ms, self.fence_ttl_ms, owner, wait_ms, channel]

    def _value(self, owner: str, token: str) -> str:
        return token

    def _held_query(self, lock: str) -> tuple[str, ...]:
        return ("HGET", lock, "~token")

    def _held_value(self, lease: Lease) -> str:
        return lease.token


def maybe_sent(error: BaseException) -> bool:
    """Whether the script may have reached a server: not when the connection was refused,
    no sentinel named a primary, or a cluster client found no node for the slot."""
    # each face's Sentinel has a MasterNotFoundError of its own (neither derives the other)
    if isinstance(error, (MasterNotFoundError, AsyncMasterNotFoundError,
                          errors.RedisClusterException)):  # fmt: skip
        return False
    return not isinstance(error.__context__, ConnectionRefusedError)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _seconds(pttl: Any) -> float | None:
    """PTTL's milliseconds as seconds; None for a key with no expiry (-1) or none (-2)."""
    return None if pttl is None or int(pttl) < 0 else int(pttl) / 1000


@functools.lru_cache(maxsize=4096)
def keys_of(prefix: str, key: str) -> Keys:
    """The lock key, fence key and waiters' set of `key`, sharing one hash tag."""
    base = f"{prefix}:{{{redis_hash_tag(key)}}}"
    return Keys(key, base, base + ":fence", base + ":waiters")


def ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value
