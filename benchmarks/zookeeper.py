"""Our ZooKeeper backend next to the peers, against one ZooKeeper, in one run.

    python -m benchmarks.zookeeper [--cycles 2000] [--rounds 5] [--samples 20] [--no-write]

Starts its own standalone ZooKeeper (Java, `tests.servers.ZooKeeperServer`) on a free
loopback port. Peers: kazoo's `Lock` recipe (the baseline) and tooz's kazoo driver,
each with its own client and its own parent path per lock name. Like the Redis
peers, a peer lock object is made per acquire, as `with client.Lock(path):` does;
a kazoo `Lock` reused across acquires costs the same round trips (it looks for a
node it may have left behind instead of making sure of its parent path).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from tooz import coordination

from benchmarks.harness import Contender, append_report, measure, table
from locks.backends import ZooKeeperProvider
from locks.base import ProviderBase
from tests.servers import ZooKeeperServer


def ours(provider: ProviderBase, label: str) -> Contender:
    def acquire(key: str) -> Any:
        return provider.acquire(key, wait=30)

    return Contender(label, acquire, provider.release, provider.close)


def kazoo_lock(hosts: str) -> Contender:
    client = KazooClient(hosts=hosts)
    client.start()

    def acquire(key: str) -> Any:
        lock = client.Lock(f"/bench-kazoo/{key}")
        assert lock.acquire(timeout=30)
        return lock

    def close() -> None:
        client.stop()
        client.close()

    return Contender("kazoo Lock", acquire, lambda lock: lock.release(), close)


def tooz_kazoo(hosts: str) -> Contender:
    coordinator = coordination.get_coordinator(f"kazoo://{hosts}", uuid.uuid4().hex.encode())
    coordinator.start()

    def acquire(key: str) -> Any:
        lock = coordinator.get_lock(key.encode())
        assert lock.acquire(blocking=True, timeout=30)
        return lock

    return Contender("tooz zookeeper", acquire, lambda lock: lock.release(), coordinator.stop)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--no-write", action="store_true", help="do not append to docs/")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="locks-bench-") as workdir:
        server = ZooKeeperServer(Path(workdir))
        server.start()
        try:
            hosts = server.hosts
            contenders = [
                kazoo_lock(hosts),
                tooz_kazoo(hosts),
                ours(ZooKeeperProvider(hosts), "fallback-locks zookeeper"),
            ]
            results = measure(contenders, args.cycles, args.rounds, args.samples)
        finally:
            server.stop()
    report = table(results, baseline="kazoo Lock")
    print(report)
    if not args.no_write:
        command = "python -m benchmarks.zookeeper " + " ".join(argv or sys.argv[1:])
        path = append_report("ZooKeeper: uncontended cycles and hand-off", command.strip(), report)
        print(f"appended to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
