"""Backends, one module each. Server clients are optional extras, so each backend that
needs one is imported on first use: `import locks` never needs redis, kazoo or
SQLAlchemy. `local` and `file` need only the standard library."""

from __future__ import annotations

from typing import TYPE_CHECKING

from locks.backends.file import FileProvider
from locks.backends.local import LocalProvider
from locks.lazy import lazy_names

if TYPE_CHECKING:
    from locks.backends.database import DatabaseProvider
    from locks.backends.redis import RedisHashProvider, RedisProvider
    from locks.backends.zookeeper import ZooKeeperProvider

__all__ = [
    "DatabaseProvider",
    "FileProvider",
    "LocalProvider",
    "RedisHashProvider",
    "RedisProvider",
    "ZooKeeperProvider",
]

__getattr__ = lazy_names(
    "locks.backends",
    {
        "RedisProvider": ("locks.backends.redis", "redis"),
        "RedisHashProvider": ("locks.backends.redis", "redis"),
        "ZooKeeperProvider": ("locks.backends.zookeeper", "zookeeper"),
        "DatabaseProvider": ("locks.backends.database", "mysql"),
    },
)
