"""`locks.aio.from_config`: the same TOML, checked by the same code (`locks.config`), with
each backend built by its asyncio provider and each scenario's chain an asyncio chain."""

from __future__ import annotations

import os
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, ParamSpec, TypeVar

from locks.aio.chain import FallbackChain
from locks.aio.handle import AsyncLock
from locks.aio.quorum import Quorum
from locks.config import Registry, _interpolate, _read
from locks.errors import ConfigError

P = ParamSpec("P")
R = TypeVar("R")

ASYNC_TYPES = {
    "local": "locks.aio.local:LocalProvider",
    "redis": "locks.aio.redis:RedisProvider",
    "redis-hash": "locks.aio.redis:RedisHashProvider",
    "database": "locks.aio.database:DatabaseProvider",
    "zookeeper": "locks.aio.zookeeper:ZooKeeperProvider",
    "file": "locks.aio.file:FileProvider",
}


def from_config(
    source: str | os.PathLike[str] | Mapping[str, Any],
    *,
    environ: Mapping[str, str] | None = None,
) -> AsyncRegistry:
    """An `AsyncRegistry` from a TOML file path or an already parsed mapping."""
    data, env = _read(source, environ)
    return AsyncRegistry(_interpolate(data, env, ""), env)


class AsyncRegistry(Registry):
    """`Registry` for tasks: `lock`, `chain` and `locked` give the asyncio face's
    objects; `await registry.close()`."""

    chain_class = FallbackChain
    quorum_class = Quorum

    def _class_of(self, type_name: str, spec: str, where: str) -> str:
        if type_name not in ASYNC_TYPES:
            raise ConfigError(
                f"{where}.type: {type_name!r} has no asyncio provider yet (locks.aio has: "
                f"{', '.join(ASYNC_TYPES)})"
            )
        return ASYNC_TYPES[type_name]

    def chain(self, scenario: str) -> FallbackChain:  # type: ignore[override]
        chain: FallbackChain = super().chain(scenario)  # type: ignore[assignment]
        return chain

    def lock(  # type: ignore[override]
        self, scenario: str, key: str, *, ttl: float | None = None, wait: float | None = None
    ) -> AsyncLock:
        return self.chain(scenario).lock(key, ttl=ttl, wait=wait)

    def locked(  # type: ignore[override]
        self,
        key_template: str,
        *,
        scenario: str = "default",
        ttl: float | None = None,
        wait: float | None = None,
    ) -> Callable[[Callable[P, Coroutine[Any, Any, R]]], Callable[P, Coroutine[Any, Any, R]]]:
        """Run the decorated `async def` under the lock named by `key_template`,
        formatted with the call's arguments, for its whole awaited body."""
        return self.chain(scenario).locked(key_template, ttl=ttl, wait=wait)

    def _abandon(self) -> None:
        """Nothing made yet has connected (construction does no I/O): only the switch's
        watcher, a thread, needs stopping."""
        switch = getattr(self, "switch", None)
        if switch is not None:
            switch.close()

    async def close(self) -> None:  # type: ignore[override]
        made: list[Any] = [*self._chains.values(), *self._backends.values()]
        for closing in made:  # the chains' watchers first, then the providers
            await closing.close()
        switch = getattr(self, "switch", None)
        if switch is not None:
            switch.close()
