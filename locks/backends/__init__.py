"""Backends, one module each. Server clients are optional extras, so each backend that
needs one is imported on first use: `import locks` never needs redis, kazoo or
SQLAlchemy. `local` and `file` need only the standard library."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from locks.backends.file import FileProvider
from locks.backends.local import LocalProvider

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

_LAZY = {
    "RedisProvider": ("locks.backends.redis", "redis"),
    "RedisHashProvider": ("locks.backends.redis", "redis"),
    "ZooKeeperProvider": ("locks.backends.zookeeper", "zookeeper"),
    "DatabaseProvider": ("locks.backends.database", "mysql"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'locks.backends' has no attribute {name!r}")
    module_name, extra = _LAZY[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ImportError(
            f"{name} needs the {extra!r} extra: pip install 'fallback-locks[{extra}]'"
        ) from exc
    return getattr(module, name)
