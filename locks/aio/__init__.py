"""The asyncio face: the same locks for async services, never blocking the event loop.

`async with provider.lock("order:1", wait=2) as lease:`; `await provider.acquire(...)`;
`@provider.locked("order:{order_id}")` on an `async def`. The owner is the task. The
scripts, statements, checks and bookkeeping are the threaded face's (`locks.keeper`);
only the calls that reach a server differ. See docs/asyncio.md."""

from locks.aio.base import AsyncProviderBase
from locks.aio.handle import AsyncLock
from locks.aio.local import LocalProvider
from locks.aio.redis import RedisHashProvider, RedisProvider

__all__ = [
    "AsyncLock",
    "AsyncProviderBase",
    "LocalProvider",
    "RedisHashProvider",
    "RedisProvider",
]
