"""The asyncio face's way into a Redis Cluster: which primary serves which slot, and one
of our pools (`AsyncPool`) per primary.

redis.asyncio's `RedisCluster` fails a call at once when a node's connections are all
busy (it has no pool to wait on: 1,000 tasks over 10 connections fail), and the
providers write packed scripts straight onto a connection, as on one server; so the
slot table is kept here. It is read with `CLUSTER SLOTS` from a node it knows at the
first call, and again when a reply says MOVED or a primary stops answering (a failover
promotes its replica, which the next read names). An ASK (a slot being migrated) is
followed for one call, with ASKING. The threaded face's client (redis-py's
`RedisCluster`) follows the same redirections."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence

from redis import exceptions as errors
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from locks.aio.redis_pool import AsyncPool

Address = tuple[str, int]


class ClusterPools:
    """The slot table and a pool per node; every pool is made by `make_pool`."""

    def __init__(
        self, startup: Sequence[Address], make_pool: Callable[[str, int], AsyncPool]
    ) -> None:
        self._startup = list(startup)
        self._make_pool = make_pool
        self._pools: dict[Address, AsyncPool] = {}
        self._slots: list[Address | None] = []  # the primary of each slot, once read
        self._stale = True  # read it (again) before the next call
        self._reading: asyncio.Task[None] | None = None  # one read at a time, shared
        self._turn = itertools.count()

    async def for_key(self, key: str) -> AsyncPool:
        """The pool of the primary that serves `key`'s slot."""
        if self._stale:
            await self.refresh()
        address = self._slots[key_slot(key.encode())]
        if address is None:
            raise errors.ClusterDownError(f"no primary serves the slot of {key!r}")
        return self.at(address)

    def at(self, address: Address) -> AsyncPool:
        pool = self._pools.get(address)
        if pool is None:
            pool = self._pools[address] = self._make_pool(*address)
        return pool

    async def redirected(self, key: str, error: errors.AskError) -> tuple[AsyncPool, bool]:
        """Where a MOVED (the table read again) or an ASK (one call, with ASKING)
        points: its pool, and whether ASKING must go first."""
        if isinstance(error, errors.MovedError):
            await self.refresh()
            return await self.for_key(key), False
        return self.at((str(error.host), int(error.port))), True

    async def refresh(self) -> None:
        """Read the slot table again; callers at the same time share one read."""
        reading = self._reading
        if reading is None or reading.done():
            reading = self._reading = asyncio.ensure_future(self._read())
        await asyncio.shield(reading)

    def some_pool(self) -> AsyncPool:
        """A pool of one of the primaries (or startup nodes), a different one each call
        while there are several: a subscriber that lost its node goes to another."""
        known = self._primaries() or self._startup
        return self.at(known[next(self._turn) % len(known)])

    def primary_pools(self) -> list[AsyncPool]:
        return [self.at(address) for address in self._primaries()]

    def forget_slots(self) -> None:
        """A primary stopped answering: the next call reads the slot table anew (a
        failover's promoted replica is named there once it takes over)."""
        self._stale = True

    async def disconnect(self) -> None:
        for pool in self._pools.values():
            await pool.disconnect()

    def _primaries(self) -> list[Address]:
        return list(dict.fromkeys(address for address in self._slots if address is not None))

    async def _read(self) -> None:
        """`CLUSTER SLOTS` from the first node that answers: the primaries last read,
        then the startup nodes."""
        failure: Exception | None = None  # the last node's
        for address in dict.fromkeys([*self._primaries(), *self._startup]):
            pool = self.at(address)
            try:
                connection = await pool.get_connection()
            except errors.RedisError as error:
                failure = error
                continue
            try:
                await connection.send_command("CLUSTER", "SLOTS")
                reply = await connection.read_response()
            except errors.ResponseError:
                await pool.release(connection)
                raise  # refused (an ACL, not a cluster): another node says the same
            except errors.RedisError as error:
                await connection.disconnect(nowait=True)
                await pool.release(connection)
                failure = error
                continue
            await pool.release(connection)
            self._slots, self._stale = _table(reply, address), False
            return
        # as redis-py's cluster client says it: nothing was sent, so nothing is ambiguous
        raise errors.RedisClusterException(f"no node of the cluster answered: {failure}")


def _table(reply: list[list[object]], asked: Address) -> list[Address | None]:
    """The primary of each slot, from a `CLUSTER SLOTS` reply; a primary with no host
    of its own (empty: it knows no other address) is the node that was asked."""
    table: list[Address | None] = [None] * REDIS_CLUSTER_HASH_SLOTS
    for entry in reply:
        start, end, node = entry[0], entry[1], entry[2]
        assert isinstance(start, int) and isinstance(end, int) and isinstance(node, list)
        host = node[0].decode() if isinstance(node[0], bytes) else str(node[0])
        primary = (host or asked[0], int(node[1]))
        table[start : end + 1] = [primary] * (end + 1 - start)
    return table
