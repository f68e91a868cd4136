"""Noticing a Redis server that restarted or failed over under a provider's leases.

A Redis restarted empty (or from a snapshot older than a grant), or a replica promoted
before a grant reached it, no longer holds grants this process still counts as held;
another process may take those keys at once. Nothing on an idle connection says so:
redis-py quietly reconnects a pooled connection that died, so without this the holder
would learn at its next renewal (up to a third of its ttl later) or its release.

Every new connection of the provider (the pool's, the subscriber's) reads the server's
`run_id` (`INFO server`), which a restart or a failover changes. A run_id unlike the
last one seen (per node on a Cluster, per topology otherwise, so a failover back to an
old primary counts too) makes the provider check every lease it holds there at once,
and report each grant that is gone as lost. The check is exact: a grant still there
(restored from an AOF, or replicated before the failover) is still held.

An ACL user without `+info` cannot read the run_id: a warning says what is then lost
(the holder hears at its next renewal or release, as before), once per provider.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from typing import Any

from redis.connection import AbstractConnection
from redis.exceptions import NoPermissionError, ResponseError

logger = logging.getLogger("locks")

# INFO refused: an ACL user without +info (either face's errors: the asyncio ones are these)
REFUSED = (NoPermissionError, ResponseError)

_RUN_ID = re.compile(r"^run_id:([0-9a-fA-F]+)\s*$", re.MULTILINE)

ConnectFunc = Callable[[AbstractConnection], None]


class RunWatch:
    """The run_ids seen by one provider's connections. `changed()` runs (on the
    connecting thread, with no lock held) when a connection meets a run other than the
    last one seen where it connected, or the first one seen there (a given client's
    connections may have made grants before)."""

    def __init__(self, where: str, per_node: bool, changed: Callable[[], None]) -> None:
        self._where = where  # for the warning: the provider's name and address
        self._per_node = per_node
        self._changed = changed
        self._seen: dict[str, str] = {}
        self._lock = threading.Lock()
        self.refused = False  # the server refused INFO: restarts go unnoticed here
        self.closed = False

    def hook(self, previous: ConnectFunc | None = None) -> ConnectFunc:
        """A redis-py `redis_connect_func`: the usual handshake (or `previous`, the one
        a client had), then the run_id."""

        def connected(connection: AbstractConnection) -> None:
            if previous is None:
                connection.on_connect()  # type: ignore[no-untyped-call]
            else:
                previous(connection)
            self.connected(connection)

        return connected

    def connected(self, connection: AbstractConnection) -> None:
        if not self.asks:
            return
        connection.send_command("INFO", "server")  # type: ignore[no-untyped-call]
        try:
            reply: Any = connection.read_response()
        except REFUSED as refused:
            self.refuse(refused)
            return
        self.heard(connection, reply)

    @property
    def asks(self) -> bool:
        """Whether a new connection is to ask for the run_id (`INFO server`)."""
        return not (self.refused or self.closed)

    def heard(self, connection: Any, reply: Any) -> None:
        """`INFO server`'s reply on a new connection (either face's): `changed()` if its
        run is not the last one seen there."""
        text = reply.decode() if isinstance(reply, bytes) else str(reply)
        found = _RUN_ID.search(text)
        if found is None:  # a proxy or a server that hides it: nothing to compare
            return
        node = _node_of(connection) if self._per_node else ""
        with self._lock:
            before = self._seen.get(node)
            self._seen[node] = found.group(1)
        if before != found.group(1):
            self._changed()

    def refuse(self, error: Exception) -> None:
        with self._lock:
            if self.refused:
                return
            self.refused = True
        logger.warning(
            "%s: the server refused INFO (%s): a restart or failover of Redis that loses "
            "leases is noticed only at each lease's next renewal or release. Grant the "
            "ACL user +info (locks.backends.redis.scripts.acl_rule gives the whole rule).",
            self._where, error,
        )  # fmt: skip


def lost_in_new_run(address: str) -> str:
    """The reason a lease gone after a new run is lost with."""
    return f"{address} restarted or failed over without its grant"


def _node_of(connection: Any) -> str:
    host, port = getattr(connection, "host", None), getattr(connection, "port", None)
    return f"{host}:{port}" if host is not None else str(getattr(connection, "path", ""))
