"""Our ZooKeeper backend next to the peers, against one ZooKeeper, in one run.

    python -m benchmarks.zookeeper [--cycles 2000] [--rounds 5] [--samples 20] [--no-write]
                                   [--quick]

Starts its own standalone ZooKeeper (Java, `tests.servers.ZooKeeperServer`) on a free
loopback port. Peers: kazoo's `Lock` recipe (the baseline) and tooz's kazoo driver,
each with its own client and its own parent path per lock name. Like the Redis
peers, a peer lock object is made per acquire, as `with client.Lock(path):` does;
a kazoo `Lock` reused across acquires costs the same round trips (it looks for a
node it may have left behind instead of making sure of its parent path). The floor:
raw kazoo, an ephemeral node created to take a name and deleted to give it back (it
only spins to wait, so no hand-off is reported). And bare kazoo sending a cycle's own
requests (`replay_ours`: what the provider sends, with the library left out), the floor
that says how much of a cycle is ours: the queue's create is sequential and needs a
listing, which the raw floor does not send. Writes `RATIOS` to
benchmarks/results/zookeeper.json.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError
from tooz import coordination

from benchmarks.harness import Contender, Ratio, compare, provider_contender
from locks.backends import ZooKeeperProvider
from tests.servers import ZooKeeperServer

PEER = "kazoo Lock"
RAW = "raw kazoo create + delete"
REPLAY = "bare kazoo, our create + listing + delete"
OURS = "fallback-locks zookeeper"
RATIOS = (
    Ratio("zookeeper/zookeeper-vs-kazoo-create-delete", OURS, RAW),
    Ratio("zookeeper/zookeeper-vs-bare-kazoo-our-requests", OURS, REPLAY),
    Ratio("zookeeper/zookeeper-vs-kazoo-lock", OURS, PEER),
    Ratio("zookeeper/zookeeper-handoff-vs-kazoo-lock", OURS, PEER, handoff=True),
)


def _started(hosts: str) -> tuple[KazooClient, Callable[[], None]]:
    """A kazoo client of a contender's own, started, and what stops and closes it."""
    client = KazooClient(hosts=hosts)
    client.start()

    def close() -> None:
        client.stop()
        client.close()

    return client, close


def raw_create_delete(hosts: str) -> Contender:
    client, close = _started(hosts)
    client.ensure_path("/bench-raw")

    def acquire(key: str) -> Any:
        path = f"/bench-raw/{key}"
        while True:
            try:
                client.create(path, ephemeral=True)
                return path
            except NodeExistsError:
                pass  # spin: only the uncontended figure of this floor is reported

    return Contender(RAW, acquire, client.delete, close)


def replay_ours(hosts: str) -> Contender:
    """A cycle's requests as the provider sends them on a free lock, through bare kazoo:
    an ephemeral-sequential child with the owner as its data, the parent's children
    listed right behind it (the reply waited for first: ZooKeeper answers in order),
    and the child deleted. No queue to wait in, so no hand-off."""
    client, close = _started(hosts)
    parents: set[str] = set()  # made once, as the provider's parent stays

    def acquire(key: str) -> Any:
        parent = f"/bench-replay/{key}"
        if parent not in parents:
            client.ensure_path(parent)
            parents.add(parent)
        created = client.create_async(f"{parent}/n-", b"owner", ephemeral=True, sequence=True)
        listed = client.get_children_async(parent)
        listed.get()
        return created.get()

    return Contender(REPLAY, acquire, client.delete, close)


def kazoo_lock(hosts: str) -> Contender:
    client, close = _started(hosts)

    def acquire(key: str) -> Any:
        lock = client.Lock(f"/bench-kazoo/{key}")
        assert lock.acquire(timeout=30)
        return lock

    return Contender(PEER, acquire, lambda lock: lock.release(), close)


def tooz_kazoo(hosts: str) -> Contender:
    coordinator = coordination.get_coordinator(f"kazoo://{hosts}", uuid.uuid4().hex.encode())
    coordinator.start()

    def acquire(key: str) -> Any:
        lock = coordinator.get_lock(key.encode())
        assert lock.acquire(blocking=True, timeout=30)
        return lock

    return Contender("tooz zookeeper", acquire, lambda lock: lock.release(), coordinator.stop)


def main(argv: list[str] | None = None) -> int:
    def contenders(server: ZooKeeperServer) -> list[Contender]:
        return [
            raw_create_delete(server.hosts),
            replay_ours(server.hosts),
            kazoo_lock(server.hosts),
            tooz_kazoo(server.hosts),
            provider_contender(ZooKeeperProvider(server.hosts), OURS),
        ]

    return compare(
        argv,
        module="benchmarks.zookeeper",
        description=__doc__,
        title="ZooKeeper: uncontended cycles and hand-off",
        server=ZooKeeperServer,
        contenders=contenders,
        baseline=PEER,
        ratios=RATIOS,
        no_handoff=[RAW, REPLAY],  # they never wait in a queue
    )


if __name__ == "__main__":
    sys.exit(main())
