"""What a FallbackChain costs while its first tier is healthy, and how fast it moves
away from a dead Redis and back, against real servers, in one run.

    python -m benchmarks.chain [--cycles 2000] [--rounds 5] [--samples 20]
                               [--repetitions 5] [--no-write] [--quick]

Starts its own redis-server and standalone ZooKeeper on free loopback ports.

1. Overhead: a bare `RedisHashProvider` next to a chain redis-hash -> zk -> local whose
   every acquire is served by Redis (uncontended cycles/s and hand-off).
2. Failover (mode="fast", `Breaker(reset_timeout=1.0)`): one thread loops acquire and
   release of one key on a chain redis -> zk -> local while Redis is SIGKILLed and later
   restarted. Failover is the kill to the first lease granted by "zk"; fail-back is the
   `server.start()` call to the first lease granted by "redis" again (it includes the
   time redis-server takes to answer, shown on its own). ZooKeeper's client is connected
   before the first kill, as in a process that has used the chain before.

   While Redis is down, the breaker lets one acquire probe it every `reset_timeout`, and
   that probe fails only after the chain's default retry (3 tries 100 ms apart), so the
   probe period is `reset_timeout` + 0.2 s and fail-back depends on where in it Redis
   comes back. Repetition i restarts Redis i/n of a period later (after 0.5 s on
   ZooKeeper), so the restarts spread evenly over it: the median is the typical
   fail-back, the max near the worst. The stall row is the longest gap between two
   grants while on ZooKeeper: the acquire that probed the dead Redis.

Writes `RATIOS` (the overhead) to benchmarks/results/chain.json.
"""

from __future__ import annotations

import itertools
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness import (
    Ratio,
    Result,
    arguments,
    measure,
    provider_contender,
    publish,
    table,
    write_ratios,
)
from locks import Breaker, FallbackChain, LockProvider
from locks.backends import LocalProvider, RedisHashProvider, RedisProvider, ZooKeeperProvider
from tests.servers import RedisServer, ZooKeeperServer

KEY = "bench:failover"
RESET_TIMEOUT = 1.0
PROBE_PERIOD = RESET_TIMEOUT + 0.2  # + the default retry's two 100 ms waits
BARE = "redis-hash (bare)"
CHAIN = "chain redis-hash -> zk -> local"
RATIOS = (Ratio("chain/chain-vs-redis-hash", CHAIN, BARE),)


def overhead(url: str, hosts: str, cycles: int, rounds: int, samples: int) -> list[Result]:
    tiers: list[LockProvider] = [
        RedisHashProvider(url, name="redis"),
        ZooKeeperProvider(hosts, name="zk"),
        LocalProvider(),
    ]
    contenders = [
        provider_contender(RedisHashProvider(url), BARE),
        provider_contender(FallbackChain(tiers), CHAIN, *tiers),
    ]
    return measure(contenders, cycles, rounds, samples)


@dataclass
class Outage:
    failover: float  # s from the SIGKILL to the first "zk" lease
    failback: float  # s from the start() call to the first "redis" lease
    startup: float  # s of that which start() took (redis-server answering PING)
    stall: float  # s, the longest gap between two grants while on ZooKeeper


class Looper:
    """One thread acquiring and releasing one key, recording who granted and when."""

    def __init__(self, chain: FallbackChain) -> None:
        self.chain = chain
        self.grants: list[tuple[str, float]] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                lease = self.chain.acquire(KEY, ttl=30, wait=5)
            except Exception as error:  # report, do not hide: a fast chain should not raise
                self.errors.append(error)
                time.sleep(0.01)
                continue
            if lease is None:
                self.errors.append(RuntimeError("acquire timed out on an uncontended key"))
                continue
            self.grants.append((lease.backend, time.monotonic()))
            self.chain.release(lease)

    def first(self, backend: str, after: float, timeout: float = 30.0) -> float:
        """Monotonic time of the first lease from `backend` granted after `after`."""
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            grants = self.grants[seen:]
            for tier, at in grants:
                if tier == backend and at > after:
                    return at
            seen += len(grants)
            time.sleep(0.005)
        raise RuntimeError(f"no lease from {backend!r} within {timeout} s")

    def longest_gap(self, start: float, end: float) -> float:
        times = [at for _, at in self.grants if start <= at <= end]
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)

    def __enter__(self) -> Looper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def failover_runs(server: RedisServer, hosts: str, repetitions: int) -> list[Outage]:
    redis_tier = RedisProvider(server.url, name="redis")
    zk_tier = ZooKeeperProvider(hosts, name="zk")
    local_tier = LocalProvider()
    chain = FallbackChain(
        [redis_tier, zk_tier, local_tier], breaker=Breaker(reset_timeout=RESET_TIMEOUT)
    )
    zk_tier.ping()  # connect now: the first call waits for the session
    outages = []
    try:
        with Looper(chain) as looper:
            looper.first("redis", time.monotonic() - 1)
            for repetition in range(repetitions):
                time.sleep(0.5)  # steady on Redis
                killed_at = time.monotonic()
                server.kill()
                on_zk = looper.first("zk", killed_at)
                # steady on ZooKeeper, then a restart at a different point of the
                # breaker's probe period each time
                time.sleep(0.5 + PROBE_PERIOD * repetition / repetitions)
                started_at = time.monotonic()
                server.start()
                ready_at = time.monotonic()
                on_redis = looper.first("redis", started_at)
                outage = Outage(
                    failover=on_zk - killed_at,
                    failback=on_redis - started_at,
                    startup=ready_at - started_at,
                    stall=looper.longest_gap(on_zk, started_at),
                )
                outages.append(outage)
                print(
                    f"  repetition {repetition + 1}: failover {outage.failover * 1000:.0f} ms, "
                    f"fail-back {outage.failback * 1000:.0f} ms "
                    f"(redis-server start {outage.startup * 1000:.0f} ms), "
                    f"longest stall on zk {outage.stall * 1000:.0f} ms",
                    flush=True,
                )
            tiers = {tier for tier, _ in looper.grants}
            cycles = len(looper.grants)
        if looper.errors:
            raise RuntimeError(f"the loop saw {len(looper.errors)} errors: {looper.errors[:3]}")
        print(f"  {cycles} cycles, served by {sorted(tiers)}; chain counts {dict(chain.counts)}")
    finally:
        chain.close()
        for tier in (redis_tier, zk_tier, local_tier):
            tier.close()
    return outages


def failover_table(outages: list[Outage]) -> str:
    def row(label: str, values: list[float]) -> str:
        ms = [v * 1000 for v in values]
        return f"| {label} | {statistics.median(ms):.0f} | {min(ms):.0f} | {max(ms):.0f} |"

    return "\n".join(
        [
            f"| mode fast, Breaker(reset_timeout={RESET_TIMEOUT}), {len(outages)} repetitions "
            "| median ms | min ms | max ms |",
            "|---|---:|---:|---:|",
            row("failover: SIGKILL -> first zk lease", [o.failover for o in outages]),
            row("fail-back: start() -> first redis lease", [o.failback for o in outages]),
            row("of which redis-server start", [o.startup for o in outages]),
            row("longest stall between grants while on zk", [o.stall for o in outages]),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    args = arguments(__doc__, argv, repetitions=True)

    with tempfile.TemporaryDirectory(prefix="locks-bench-") as workdir:
        (Path(workdir) / "redis").mkdir()
        (Path(workdir) / "zookeeper").mkdir()
        redis_server = RedisServer(Path(workdir) / "redis")
        zookeeper = ZooKeeperServer(Path(workdir) / "zookeeper")
        try:
            redis_server.start()
            zookeeper.start()
            print("chain overhead (every acquire served by Redis)", flush=True)
            results = overhead(
                redis_server.url, zookeeper.hosts, args.cycles, args.rounds, args.samples
            )
            print("failover and fail-back (Redis SIGKILLed, then restarted)", flush=True)
            outages = failover_runs(redis_server, zookeeper.hosts, args.repetitions)
        finally:
            redis_server.stop()
            zookeeper.stop()
    write_ratios("chain", args, results, RATIOS)
    failover = failover_table(outages)
    publish(
        "FallbackChain: overhead on a healthy Redis, failover and fail-back",
        "benchmarks.chain",
        argv,
        f"{table(results, baseline=BARE)}\n\n{failover}",
        not args.no_write,
        plot_title="FallbackChain on a healthy Redis: overhead (failover and fail-back: "
        "in the table)",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
