"""ZooKeeper backend: an ephemeral-sequential child per acquisition under a container
node per lock; the lowest sequence holds the lock and each waiter watches only its
predecessor, so waiters are served in arrival order and a release wakes one of them.

The lease is the session: `ttl` is accepted and has no effect, a crashed holder's node
vanishes when its session expires, and a connection that is SUSPENDED makes `check()`
raise until it is back (LOST marks the leases lost and calls `on_lost`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    OperationTimeoutError,
    SessionExpiredError,
    SessionMovedError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.paths import _prefix_root
from kazoo.protocol.serialization import Create2
from kazoo.protocol.states import KazooState
from kazoo.retry import KazooRetry
from kazoo.security import OPEN_ACL_UNSAFE

from locks.base import Grant, ProviderBase
from locks.errors import BackendUnavailable
from locks.names import check_seconds, zookeeper_node_name
from locks.provider import Capabilities, Holder, Lease
from locks.watchdog import mark_lost

logger = logging.getLogger("locks")

_UNAVAILABLE = (
    ConnectionLoss,
    SessionExpiredError,
    SessionMovedError,
    ConnectionClosedError,
    OperationTimeoutError,
    KazooTimeoutError,
)
_SEQUENCE_DIGITS = 10  # ZooKeeper appends a 10-digit counter to sequential nodes
_RECHECK = 1.0  # a waiter re-reads the queue at least this often, whatever its watch does


class _CreateContainer(Create2):  # type: ignore[misc]
    """ZooKeeper's createContainer (opcode 19), which kazoo does not offer: the server
    deletes a container node some time after its last child is gone, so lock parents
    do not pile up however many names are used."""

    type = 19


@dataclass
class _Hold:
    """One ownership period of a lock by one owner in this process."""

    node: str
    token: str
    fence: int
    depth: int = 1
    leases: list[Lease] = field(default_factory=list)


class ZooKeeperProvider(ProviderBase):
    """Type `zookeeper` (kazoo): fair, reentrant per owner, fenced by the node's czxid."""

    type_name = "zookeeper"
    unavailable_errors = _UNAVAILABLE

    capabilities = Capabilities(
        reentrant=True,
        expires=False,
        renewable=False,
        fair=True,
        fenced=True,
        cross_process=True,
        cross_host=True,
    )

    def __init__(
        self,
        hosts: str = "127.0.0.1:2181",
        *,
        client: KazooClient | None = None,
        name: str = "zookeeper",
        root: str = "/locks",
        session_timeout: float = 10.0,
        connect_timeout: float = 1.0,
        request_timeout: float = 1.0,
        watchdog_ttl: float = 30.0,
    ) -> None:
        super().__init__(name, watchdog_ttl)
        if not isinstance(root, str) or not root.startswith("/") or root.endswith("/"):
            raise ValueError(f"root must be an absolute path without a trailing '/', got {root!r}")
        self.root = root
        self.connect_timeout = check_seconds(connect_timeout, "connect_timeout")
        self.request_timeout = check_seconds(request_timeout, "request_timeout")
        self._owns_client = client is None
        if client is None:
            client = KazooClient(
                hosts=hosts,
                timeout=check_seconds(session_timeout, "session_timeout"),
                # keep reconnecting in the background; callers fail fast meanwhile
                connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0),
            )
        elif not isinstance(client, KazooClient):
            raise TypeError(f"client must be a KazooClient, not {type(client).__name__}")
        self.client = client
        self.address = client.hosts if isinstance(client.hosts, str) else hosts
        self._lock = threading.Lock()
        self._started: threading.Event | None = None
        self._holds: dict[tuple[str, str], _Hold] = {}
        # creates whose outcome is unknown and deletes that failed: (parent, token) pairs
        # whose nodes must go once ZooKeeper answers again, or they would hold the lock
        # for as long as this session lives
        self._leftovers: set[tuple[str, str]] = set()
        client.add_listener(self._on_state)

    # -- connection and errors ----------------------------------------------------------

    def _connect(self) -> None:
        """Fail at once unless connected (kazoo reconnects in the background); only the
        first call, which starts the client, waits up to `connect_timeout`."""
        if self._started is None:
            with self._lock:
                if self._started is None:
                    self._started = self.client.start_async()
                    self._started.wait(self.connect_timeout)
        if self.client.state != KazooState.CONNECTED:
            raise self._unavailable(ConnectionLoss(f"session is {self.client.state}"))

    def _get(self, async_result: Any) -> Any:
        return async_result.get(timeout=self.request_timeout)

    def _on_state(self, state: str) -> None:
        # runs on kazoo's connection thread: flag and hand work to other threads
        with self._lock:
            holds = list(self._holds.values())
            if state == KazooState.LOST:
                self._holds.clear()
        if state in (KazooState.SUSPENDED, KazooState.CONNECTED):
            for hold in holds:
                for lease in hold.leases:
                    lease.state.suspended = state == KazooState.SUSPENDED
        if state == KazooState.CONNECTED and self._leftovers:
            threading.Thread(target=self._clean_leftovers, daemon=True).start()
        elif state == KazooState.LOST and holds:
            leases = [lease for hold in holds for lease in hold.leases]
            threading.Thread(target=_lose, args=(leases,), daemon=True).start()

    # -- the algorithm ------------------------------------------------------------------

    def _parent(self, key: str) -> str:
        return f"{self.root}/{zookeeper_node_name(key)}"

    def _acquire(
        self, key: str, owner: str, token: str, ttl: float, deadline: float | None
    ) -> Grant | None:
        with self._lock:
            hold = self._holds.get((owner, key))
            if hold is not None:
                hold.depth += 1
                return Grant(hold.token, hold.fence, hold.depth, time.monotonic())
        self._connect()
        if self._leftovers:
            self._clean_leftovers()
        parent = self._parent(key)
        sent_at = time.monotonic()
        node, fence, children = self._create_node(parent, key, owner, token)
        try:
            granted = self._wait_turn(parent, node, deadline, children)
        except BaseException:
            # keep the original error; a failed delete is remembered as a leftover
            with contextlib.suppress(BackendUnavailable):
                self._delete_node(parent, node, token)
            raise
        if not granted:
            self._delete_node(parent, node, token)
            return None
        with self._lock:
            self._holds[(owner, key)] = _Hold(node, token, fence)
        return Grant(token, fence, 1, sent_at)

    def _create_node(
        self, parent: str, key: str, owner: str, token: str
    ) -> tuple[str, int, list[str]]:
        """Our ephemeral-sequential child, named after the token so that a create whose
        reply was lost can still be found, with the owner as its data (for `holder`).
        The children are listed in the same round trip: ZooKeeper answers one session's
        requests in order, so the list sent right behind the create already holds our
        node. Returns path, czxid (the fence) and the children."""
        for _ in range(3):
            try:
                with self._translated(ambiguous=True, key=key, token=token):
                    created = self.client.create_async(
                        f"{parent}/{token}-",
                        owner.encode(),
                        ephemeral=True,
                        sequence=True,
                        include_data=True,
                    )
                    listed = self.client.get_children_async(parent)
                    try:
                        path, stat = self._get(created)
                    except (KazooTimeoutError, ConnectionLoss):
                        self._leftovers.add((parent, token))
                        raise
                    children: list[str] = self._get(listed)
            except NoNodeError:
                self._create_parent(parent)
                continue
            return path, int(stat.czxid), children
        raise self._unavailable(NoNodeError(f"{parent} keeps disappearing"), key=key)

    def _create_parent(self, parent: str) -> None:
        request = _CreateContainer(
            _prefix_root(self.client.chroot, parent), b"", OPEN_ACL_UNSAFE, 4
        )
        result = self.client.handler.async_result()
        with self._translated():
            try:
                self.client._call(request, result)
                self._get(result)
            except NodeExistsError:
                pass
            except NoNodeError:  # the root itself is missing
                self._get(self.client.ensure_path_async(self.root))
                self._create_parent(parent)

    def _wait_turn(
        self, parent: str, node: str, deadline: float | None, children: list[str]
    ) -> bool:
        """Wait until `node` is the lowest child of `parent` (`children` is the list read
        with the create); False if `deadline` passed."""
        ours = node.rsplit("/", 1)[1]
        while True:
            queue = _queue(children)
            if ours not in queue:
                raise self._unavailable(SessionExpiredError(f"{node} vanished while waiting"))
            position = queue.index(ours)
            if position == 0:
                return True
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            changed = threading.Event()
            relisted: list[Any] = []

            def on_change(
                _event: Any, changed: threading.Event = changed, relisted: list[Any] = relisted
            ) -> None:
                # on kazoo's event thread: ask for the new queue before waking the waiter,
                # so the request is on the wire while the waiter is being scheduled
                relisted.append(self.client.get_children_async(parent))
                changed.set()

            with self._translated():
                predecessor = self._get(
                    self.client.exists_async(f"{parent}/{queue[position - 1]}", watch=on_change)
                )
            if predecessor is not None:
                changed.wait(_RECHECK if remaining is None else min(remaining, _RECHECK))
            with self._translated():
                listing = relisted[0] if relisted else self.client.get_children_async(parent)
                children = self._get(listing)

    def _delete_node(self, parent: str, node: str, token: str) -> bool:
        """Delete our node; False if it was already gone. If ZooKeeper does not answer,
        the node is remembered and deleted once it does."""
        try:
            with self._translated():
                self._get(self.client.delete_async(node))
            return True
        except NoNodeError:
            return False
        except BackendUnavailable:
            self._leftovers.add((parent, token))
            raise

    def _clean_leftovers(self) -> None:
        for parent, token in list(self._leftovers):
            try:
                with self._translated():
                    children = self._get(self.client.get_children_async(parent))
                    for child in children:
                        if child.startswith(token + "-"):
                            with contextlib.suppress(NoNodeError):
                                self._get(self.client.delete_async(f"{parent}/{child}"))
            except NoNodeError:
                pass
            except BackendUnavailable:
                return  # the next reconnection tries again
            self._leftovers.discard((parent, token))

    # -- the primitives the base class builds on ---------------------------------------

    def _granted(self, lease: Lease) -> None:
        with self._lock:
            hold = self._holds.get((lease.owner, lease.key))
            if hold is not None:
                hold.leases.append(lease)

    def _release(self, lease: Lease) -> bool:
        with self._lock:
            hold = self._holds.get((lease.owner, lease.key))
            if hold is None or hold.token != lease.token:
                return False
            hold.depth -= 1
            if lease in hold.leases:
                hold.leases.remove(lease)
            if hold.depth > 0:
                return True
            del self._holds[(lease.owner, lease.key)]
        return self._delete_node(self._parent(lease.key), hold.node, hold.token)

    def _release_unknown(self, lease: Lease) -> bool:
        """The node is named after the token: find it and delete it (now, or once
        ZooKeeper answers again)."""
        self._leftovers.add((self._parent(lease.key), lease.token))
        before = len(self._leftovers)
        self._connect()
        self._clean_leftovers()
        return len(self._leftovers) < before

    def _extend(self, lease: Lease, ttl: float) -> bool:
        return self._is_held(lease)

    def _is_held(self, lease: Lease) -> bool:
        with self._lock:
            hold = self._holds.get((lease.owner, lease.key))
        if hold is None or hold.token != lease.token:
            return False
        self._connect()
        with self._translated():
            return self._get(self.client.exists_async(hold.node)) is not None

    def _holder(self, key: str) -> Holder | None:
        self._connect()
        parent = self._parent(key)
        for _ in range(3):  # the head may be deleted between the list and the read
            with self._translated():
                try:
                    queue = _queue(self._get(self.client.get_children_async(parent)))
                    if not queue:
                        return None
                    data, stat = self._get(self.client.get_async(f"{parent}/{queue[0]}"))
                except NoNodeError:
                    continue
            owner = data.decode(errors="replace")
            with self._lock:  # levels are counted in the holder's process: known if ours
                hold = self._holds.get((owner, key))
                depth = hold.depth if hold is not None and hold.node.endswith(queue[0]) else None
            return Holder(key, self.name, owner, depth, int(stat.czxid), None, len(queue) - 1)
        return None

    def ping(self) -> None:
        self._connect()
        with self._translated():
            self._get(self.client.exists_async("/"))

    def close(self) -> None:
        super().close()
        self.client.remove_listener(self._on_state)
        if self._owns_client and self._started is not None:
            self.client.stop()
            self.client.close()


def _queue(children: list[str]) -> list[str]:
    """The lock's children in the order they are served: by sequence number."""
    return sorted(
        (child for child in children if child[-_SEQUENCE_DIGITS:].isdigit()),
        key=lambda child: child[-_SEQUENCE_DIGITS:],
    )


def _lose(leases: list[Lease]) -> None:
    for lease in leases:
        mark_lost(lease, "the ZooKeeper session expired")
