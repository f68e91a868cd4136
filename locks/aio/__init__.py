"""The asyncio face: the same locks for async services, never blocking the event loop.

`async with provider.lock("order:1", wait=2) as lease:`; `await provider.acquire(...)`;
`@provider.locked("order:{order_id}")` on an `async def`. The owner is the task. The
scripts, statements, checks and bookkeeping are the threaded face's (`locks.keeper`);
only the calls that reach a server differ. See docs/asyncio.md.

Each name is imported on first use: `import locks.aio` needs no server client."""

from __future__ import annotations

from typing import TYPE_CHECKING

from locks.lazy import lazy_names

if TYPE_CHECKING:
    from locks.aio.base import AsyncProviderBase
    from locks.aio.chain import FallbackChain
    from locks.aio.config import AsyncRegistry, from_config
    from locks.aio.database import DatabaseProvider
    from locks.aio.file import FileProvider
    from locks.aio.handle import AsyncLock
    from locks.aio.local import LocalProvider
    from locks.aio.quorum import Quorum
    from locks.aio.redis import RedisHashProvider, RedisProvider
    from locks.aio.zookeeper import ZooKeeperProvider

__all__ = [
    "AsyncLock",
    "AsyncProviderBase",
    "AsyncRegistry",
    "DatabaseProvider",
    "FallbackChain",
    "FileProvider",
    "LocalProvider",
    "Quorum",
    "RedisHashProvider",
    "RedisProvider",
    "ZooKeeperProvider",
    "from_config",
]

__getattr__ = lazy_names(
    "locks.aio",
    {
        "AsyncLock": ("locks.aio.handle", None),
        "AsyncProviderBase": ("locks.aio.base", None),
        "FallbackChain": ("locks.aio.chain", None),
        "AsyncRegistry": ("locks.aio.config", None),
        "from_config": ("locks.aio.config", None),
        "LocalProvider": ("locks.aio.local", None),
        "Quorum": ("locks.aio.quorum", None),
        "FileProvider": ("locks.aio.file", None),
        "RedisProvider": ("locks.aio.redis", "redis"),
        "RedisHashProvider": ("locks.aio.redis", "redis"),
        "ZooKeeperProvider": ("locks.aio.zookeeper", "zookeeper"),
        "DatabaseProvider": ("locks.aio.database", "aio-mysql"),
    },
)
