"""fallback-locks: named locks shared by processes and hosts, over Redis, ZooKeeper,
databases or a local fallback, behind one protocol."""

from locks.config import Registry, from_config
from locks.errors import (
    AccessDenied,
    AllBackendsUnavailable,
    BackendError,
    BackendUnavailable,
    ConfigError,
    LockError,
    LockLost,
    LockNotOwned,
    LockTimeout,
)
from locks.events import Event, EventKind, add_observer, remove_observer
from locks.fallback import Breaker, FallbackChain, Switch
from locks.provider import Capabilities, Holder, Lease, Lock, LockProvider
from locks.quorum import Quorum

__all__ = [
    "AccessDenied",
    "AllBackendsUnavailable",
    "BackendError",
    "BackendUnavailable",
    "Breaker",
    "Capabilities",
    "ConfigError",
    "Event",
    "EventKind",
    "FallbackChain",
    "Holder",
    "Lease",
    "Lock",
    "LockError",
    "LockLost",
    "LockNotOwned",
    "LockProvider",
    "LockTimeout",
    "Quorum",
    "Registry",
    "Switch",
    "add_observer",
    "from_config",
    "remove_observer",
]
