"""Our Redis providers on Redis Sentinel and on Redis Cluster, next to redis-py's own
`Lock` on the same topology, and how long a primary's crash keeps a client from a lock.

    python -m benchmarks.topologies [--cycles 2000] [--rounds 5] [--samples 20]
                                    [--repetitions 5] [--json PATH] [--no-write] [--quick]

Starts both topologies itself on free loopback ports (tests.servers.redis_topologies:
Sentinel = a primary, one replica and three sentinels; Cluster = three primaries with
one replica each), redis-server without persistence, and measures in one run:

1. Uncontended acquire + release cycles/s on one thread, and hand-off (holder releases
   -> a waiter in another thread has it, median of --samples) of `redis` and
   `redis-hash` next to redis-py's `Lock` (`master_for("locks").lock(...)` on Sentinel,
   `RedisCluster.lock(...)` on Cluster) with its defaults: it waits by polling every
   `sleep=0.1` s. All ten contenders (five per topology) are interleaved round by
   round, as `benchmarks.harness.measure` does.
2. The cost of `sync_replicas=1` (WAIT 1 after each grant, `sync_timeout=0.2`): our two
   providers with and without it, in the same rounds.
3. Failover, --repetitions times per topology, Sentinel and Cluster alternately: the
   primary that serves the lock is SIGKILLed; one client thread (our `redis` provider,
   used before the kill) loops `acquire(fresh name, wait=0)` every 5 ms, catching
   `BackendUnavailable`, until one is granted. The time from the kill to that grant is
   the failover as a client sees it. Anything else raised is counted apart: it would be
   a library bug. Between repetitions `ensure_healthy()` brings the killed node back as
   a replica; a Sentinel primary is killed no sooner than 2 x failover-timeout after its
   last failover, since the sentinels will not start another before then.

The topologies have the tests' short failure detection: Sentinel
`down-after-milliseconds 500`, Cluster `cluster-node-timeout 700`. Failover time scales
with these (production defaults are 30 s and 15 s).

Appends a section to docs/benchmarks.md, draws docs/img/topologies.png and writes the
raw results to docs/img/topologies.json (what `python -m benchmarks.plots topologies`
redraws from). --no-write writes none of these; --json still writes the results. `RATIOS`
go to benchmarks/results/topologies.json.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from redis.sentinel import Sentinel

from benchmarks import harness, plots
from benchmarks.harness import (
    Contender,
    Ratio,
    Result,
    measure,
    provider_contender,
    utc_stamp,
)
from locks import BackendUnavailable
from locks.backends import RedisHashProvider, RedisProvider
from locks.measure import bench_key
from tests.servers.redis_topologies import ClusterTopology, RedisNode, SentinelTopology

TITLE = "Topologies: Redis Sentinel and Cluster, cycles, hand-off, sync_replicas, failover"
MODULE = "benchmarks.topologies"
SYNC_TIMEOUT = 0.2
PAUSE = 0.005  # s between a failed acquire and the next, during a failover
GIVE_UP = 30.0  # s without a grant after a kill: the failover failed
# the sentinels start no failover of a primary within 2 x failover-timeout of the last
SENTINEL_REFAILOVER = 2 * 2.0 + 0.5
PEER = "redis-py Lock"
OURS = ("fallback-locks redis", "fallback-locks redis-hash")


@dataclass(frozen=True)
class Entry:
    """What a contender is: on which topology, which lock, with or without WAIT."""

    topology: str
    lock: str  # PEER or one of OURS
    sync_replicas: int = 0

    @property
    def name(self) -> str:  # unique across the run: harness.measure keys by name
        sync = f", sync_replicas={self.sync_replicas}" if self.sync_replicas else ""
        return f"{self.topology}: {self.lock}{sync}"


def _ratios() -> tuple[Ratio, ...]:
    """Each of ours against redis-py's Lock, and with sync_replicas=1 against without."""
    found = []
    for topology in ("Sentinel", "Cluster"):
        peer = Entry(topology, PEER).name
        for lock in OURS:
            short = f"{topology.lower()}-{lock.removeprefix('fallback-locks ')}"
            plain, synced = Entry(topology, lock).name, Entry(topology, lock, 1).name
            found.append(Ratio(f"topologies/{short}-vs-redis-py-lock", plain, peer))
            found.append(Ratio(f"topologies/{short}-sync-replicas-vs-without", synced, plain))
    return tuple(found)


RATIOS = _ratios()


def redis_py_lock(name: str, client: redis.Redis | RedisCluster) -> Contender:
    """redis-py's `Lock` with its defaults: SET NX PX, then a poll every 0.1 s."""

    def acquire(key: str) -> Any:
        lock = client.lock(key, timeout=30, blocking_timeout=30)
        assert lock.acquire()
        return lock

    return Contender(name, acquire, lambda lock: lock.release(), client.close)


def sentinel_client(topology: SentinelTopology) -> redis.Redis:
    hosts = [(host, int(port)) for host, port in _pairs(topology.sentinel_addresses)]
    sentinel = Sentinel(hosts)  # type: ignore[no-untyped-call]
    client: redis.Redis = sentinel.master_for(topology.service)  # type: ignore[no-untyped-call]
    return client


def cluster_client(topology: ClusterTopology) -> RedisCluster:
    nodes = [
        ClusterNode(host, int(port))  # type: ignore[no-untyped-call]
        for host, port in _pairs(topology.addresses[:3])
    ]
    return RedisCluster(startup_nodes=nodes)


def _pairs(addresses: list[str]) -> list[tuple[str, str]]:
    return [(host, port) for host, _, port in (a.rpartition(":") for a in addresses)]


def contenders(label: str) -> dict[str, Entry]:
    """The five contenders of one topology, by name."""
    entries = [Entry(label, PEER)] + [Entry(label, lock, sync) for sync in (0, 1) for lock in OURS]
    return {entry.name: entry for entry in entries}


def build(entry: Entry, url: str, client: redis.Redis | RedisCluster) -> Contender:
    if entry.lock == PEER:
        return redis_py_lock(entry.name, client)
    cls = RedisProvider if entry.lock == OURS[0] else RedisHashProvider
    provider = cls(url, sync_replicas=entry.sync_replicas, sync_timeout=SYNC_TIMEOUT)
    return provider_contender(provider, entry.name)


# -- failover ---------------------------------------------------------------------------


@dataclass
class Failover:
    """Every repetition of one topology's failover, as the client saw it."""

    topology: str
    times_ms: list[float | None] = field(default_factory=list)  # None: no grant in GIVE_UP
    attempts: list[int] = field(default_factory=list)  # acquires until the grant, per round
    promoted_ms: list[float] = field(default_factory=list)  # kill -> topology says moved
    unavailable: Counter[str] = field(default_factory=Counter)  # BackendUnavailable causes
    ambiguous: int = 0  # of those, raised after the script may have reached a server
    refused: int = 0  # acquire(wait=0) of a fresh name returned None: nobody holds it
    other_errors: list[str] = field(default_factory=list)  # not BackendUnavailable: a bug

    def median_ms(self) -> float | None:
        done = [t for t in self.times_ms if t is not None]
        return statistics.median(done) if done else None


def _cause(error: BaseException) -> str:
    """What a BackendUnavailable wraps, for counting: the driver error's class name."""
    cause = error.__cause__ or error.__context__
    return type(cause).__name__ if cause is not None else type(error).__name__


def _describe(error: BaseException) -> str:
    cause = error.__cause__ or error.__context__
    text = f"{type(error).__module__}.{type(error).__qualname__}: {error}"
    if cause is not None:
        text += f" (from {type(cause).__module__}.{type(cause).__qualname__}: {cause})"
    return text


def first_grant(
    provider: RedisProvider, names: Iterator[str], killed: float, record: Failover
) -> tuple[float | None, int]:
    """Loop `acquire(wait=0)` on fresh names until one is granted: (s since `killed`,
    attempts), or (None, attempts) after GIVE_UP."""
    attempts = 0
    while time.perf_counter() - killed < GIVE_UP:
        attempts += 1
        try:
            lease = provider.acquire(next(names), ttl=5, wait=0)
        except BackendUnavailable as exc:
            record.unavailable[_cause(exc)] += 1
            record.ambiguous += exc.ambiguous
            time.sleep(PAUSE)
            continue
        except Exception as exc:  # reported as a library bug, not hidden
            record.other_errors.append(_describe(exc))
            print(f"    NOT BackendUnavailable: {_describe(exc)}", flush=True)
            time.sleep(PAUSE)
            continue
        if lease is None:
            record.refused += 1
            continue
        granted = time.perf_counter()
        try:
            provider.release(lease)
        except Exception as exc:
            record.other_errors.append("release: " + _describe(exc))
        return granted - killed, attempts
    return None, attempts


def _warm(provider: RedisProvider, names: Iterator[str], cycles: int = 20) -> None:
    """The client has used the primary it is about to lose (connections open)."""
    for _ in range(cycles):
        lease = provider.acquire(next(names), ttl=5, wait=1)
        assert lease is not None
        provider.release(lease)


def _fresh() -> Iterator[str]:
    while True:
        yield bench_key()


def _in_slots(slots: list[tuple[int, int]]) -> Iterator[str]:
    """Fresh names whose lock key (`locks:{name}`) hashes into `slots`."""
    while True:
        name = bench_key()
        slot = key_slot(f"locks:{{{name}}}".encode())
        if any(start <= slot <= end for start, end in slots):
            yield name


def _watch(done: Callable[[], object], killed: float, into: list[float]) -> threading.Thread:
    """In a thread: when the topology itself reports the new primary (its own poll,
    50 ms apart), for comparison with what the client saw."""

    def run() -> None:
        try:
            done()
        except Exception:  # the client's figure stands without it
            return
        into.append((time.perf_counter() - killed) * 1000)

    thread = threading.Thread(target=run, name="topology-watch", daemon=True)
    thread.start()
    return thread


class FailoverRounds:
    """Kill the primary that serves the lock, time the client's first grant, repair."""

    label = ""

    def __init__(self, url: str) -> None:
        self.provider = RedisProvider(url)  # one client through every repetition
        self.record = Failover(self.label)

    def victim(self) -> tuple[RedisNode, Iterator[str], Callable[[], object]]:
        """The node to kill, fresh names it serves, and a wait for its successor."""
        raise NotImplementedError

    def repair(self) -> None:
        raise NotImplementedError

    def round(self) -> None:
        node, names, promoted = self.victim()
        _warm(self.provider, names)
        node.kill()
        killed = time.perf_counter()
        watch = _watch(promoted, killed, self.record.promoted_ms)
        took, attempts = first_grant(self.provider, names, killed, self.record)
        self.record.times_ms.append(None if took is None else took * 1000)
        self.record.attempts.append(attempts)
        watch.join(GIVE_UP)
        figure = "no grant" if took is None else f"{took * 1000:,.0f} ms"
        print(f"  {self.label} failover: {figure} ({attempts} acquires)", flush=True)
        self.repair()

    def close(self) -> None:
        self.provider.close()


class SentinelFailover(FailoverRounds):
    label = "Sentinel"

    def __init__(self, topology: SentinelTopology) -> None:
        super().__init__(topology.url)
        self.topology = topology
        self.last_kill = 0.0

    def victim(self) -> tuple[RedisNode, Iterator[str], Callable[[], object]]:
        # the sentinels would not start a failover yet: that wait is not a failover's
        early = self.last_kill + SENTINEL_REFAILOVER - time.monotonic()
        if early > 0:
            print(f"  (waiting {early:.1f} s: sentinels refuse a failover this soon)")
            time.sleep(early)
        node = self.topology.primary()
        self.last_kill = time.monotonic()
        return node, _fresh(), lambda: self.topology.wait_failover(node.port)

    def repair(self) -> None:
        self.topology.ensure_healthy()


class ClusterFailover(FailoverRounds):
    label = "Cluster"

    def __init__(self, topology: ClusterTopology) -> None:
        super().__init__(topology.url)
        self.topology = topology

    def victim(self) -> tuple[RedisNode, Iterator[str], Callable[[], object]]:
        probe = f"locks:{{{bench_key()}}}"  # the lock key of a fresh name
        node = self.topology.primary_of(probe)
        with node.admin() as client:
            shards = client.execute_command("CLUSTER", "SLOTS")
        slots = [(int(s[0]), int(s[1])) for s in shards if int(s[2][1]) == node.port]
        return node, _in_slots(slots), lambda: self.topology.wait_failover(probe, node.port)

    def repair(self) -> None:
        self.topology.ensure_healthy()


# -- report -----------------------------------------------------------------------------


def cycle_rows(entries: dict[str, Entry], measured: dict[str, Result]) -> list[plots.CycleRow]:
    return [
        plots.CycleRow(
            topology=entry.topology,
            lock=entry.lock,
            sync_replicas=entry.sync_replicas,
            ours=entry.lock != PEER,
            cycles_per_second=measured[name].cycles_per_second,
            handoff_ms=measured[name].handoff_ms,
        )
        for name, entry in entries.items()
    ]


def failover_rows(records: list[Failover]) -> list[plots.FailoverRow]:
    return [
        plots.FailoverRow(
            topology=r.topology,
            times_ms=r.times_ms,
            median_ms=r.median_ms(),
            promoted_ms=r.promoted_ms,
            attempts=r.attempts,
            unavailable=dict(r.unavailable),
            ambiguous=r.ambiguous,
            refused=r.refused,
            other_errors=r.other_errors,
        )
        for r in records
    ]


def _find(rows: list[plots.CycleRow], topology: str, lock: str, sync: int = 0) -> plots.CycleRow:
    return next(
        r
        for r in rows
        if r["topology"] == topology and r["lock"] == lock and r["sync_replicas"] == sync
    )


def tables(rows: list[plots.CycleRow], failovers: list[plots.FailoverRow]) -> str:
    topologies = list(dict.fromkeys(r["topology"] for r in rows))
    lines = [
        "| topology | contender | cycles/s | vs redis-py Lock | hand-off, median ms |",
        "|---|---|---:|---:|---:|",
    ]
    for topology in topologies:
        base = _find(rows, topology, PEER)["cycles_per_second"]
        for lock in (PEER, *OURS):
            row = _find(rows, topology, lock)
            handoff = "—" if row["handoff_ms"] is None else f"{row['handoff_ms']:.2f}"
            lines.append(
                f"| {topology} | {lock} | {row['cycles_per_second']:,.0f} "
                f"| {row['cycles_per_second'] / base:.2f}x | {handoff} |"
            )
    lines += [
        "",
        "| topology | provider | cycles/s | with sync_replicas=1 | ratio | added per cycle "
        "| hand-off with sync, ms |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for topology in topologies:
        for lock in OURS:
            plain, synced = _find(rows, topology, lock), _find(rows, topology, lock, 1)
            a, b = plain["cycles_per_second"], synced["cycles_per_second"]
            handoff = "—" if synced["handoff_ms"] is None else f"{synced['handoff_ms']:.2f}"
            lines.append(
                f"| {topology} | {lock.removeprefix('fallback-locks ')} | {a:,.0f} | {b:,.0f} "
                f"| {b / a:.2f}x | {(1 / b - 1 / a) * 1e6:,.0f} µs | {handoff} |"
            )
    lines += [
        "",
        "| failover, SIGKILL of the primary -> first grant | median ms | min ms | max ms "
        "| topology names the new primary, median ms | BackendUnavailable raised meanwhile "
        "| anything else raised, or None |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for f in failovers:
        done = [t for t in f["times_ms"] if t is not None]
        failed = len(f["times_ms"]) - len(done)
        median = "never" if not done else f"{statistics.median(done):,.0f}"
        low = "—" if not done else f"{min(done):,.0f}"
        high = "—" if not done else f"{max(done):,.0f}"
        if failed:
            median += f" ({failed} of {len(f['times_ms'])} never granted)"
        promoted = f"{statistics.median(f['promoted_ms']):,.0f}" if f["promoted_ms"] else "—"
        causes = ", ".join(f"{n} {c}" for c, n in sorted(f["unavailable"].items()))
        lines.append(
            f"| {f['topology']} ({len(f['times_ms'])} repetitions) | {median} | {low} | {high} "
            f"| {promoted} | {sum(f['unavailable'].values())} ({causes or 'none'}; "
            f"{f['ambiguous']} ambiguous) "
            f"| {len(f['other_errors']) + f['refused']} |"
        )
    return "\n".join(lines)


def setup_note(settings: dict[str, Any], seconds: float) -> str:
    """How the figures above were taken, in the section itself."""
    text = (
        f"One run of {seconds:.0f} s, both topologies up throughout. Cycles: "
        f"{settings['cycles']} per contender and round, {settings['rounds']} rounds, all ten "
        "contenders interleaved, medians; hand-off: median of "
        f"{settings['samples']}, a fresh key each. redis-py {settings['redis_py']} `Lock` has "
        "its defaults (`sleep=0.1`: a waiter polls every 100 ms). `sync_replicas=1` with "
        f"`sync_timeout={settings['sync_timeout']}`: `WAIT 1` after each grant, pipelined "
        "with the acquire script. Failover: our `redis` provider, one client used before "
        f"the kill, `acquire(fresh name, wait=0)` every {settings['failover_pause_s'] * 1000:g}"
        " ms; the topologies have the tests' failure detection (Sentinel "
        "`down-after-milliseconds 500`, Cluster `cluster-node-timeout 700`). 1-minute load "
        f"average {settings['load_average_before']:.1f} before the run, "
        f"{settings['load_average_after']:.1f} after, on {os.cpu_count()} cores. "
        "`docs/img/topologies.json` holds the raw results of the newest run."
    )
    return textwrap.fill(text, 88, break_long_words=False, break_on_hyphens=False)


def arguments(argv: list[str] | None) -> argparse.Namespace:
    options = harness.parser(
        __doc__, repetitions="failovers per topology", results=plots.TOPOLOGIES_RESULTS
    )
    return harness.parse(options, argv)


def run(args: argparse.Namespace) -> tuple[list[plots.CycleRow], list[plots.FailoverRow]]:
    """Both topologies up, every measurement, both down again."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="locks-bench-") as workdir:
        sentinel = SentinelTopology(Path(workdir) / "sentinel")
        cluster = ClusterTopology(Path(workdir) / "cluster")
        try:
            sentinel.start()
            cluster.start()
            print(f"topologies up in {time.perf_counter() - started:.1f} s", flush=True)
            entries: dict[str, Entry] = {}
            runners: list[Contender] = []
            for label, url, client in (
                ("Sentinel", sentinel.url, sentinel_client(sentinel)),
                ("Cluster", cluster.url, cluster_client(cluster)),
            ):
                mine = contenders(label)
                entries |= mine
                runners += [build(entry, url, client) for entry in mine.values()]
            results = measure(runners, args.cycles, args.rounds, args.samples)
            measured = {r.name: r for r in results}
            print(f"cycles and hand-offs done at {time.perf_counter() - started:.0f} s")

            failovers: list[FailoverRounds] = [SentinelFailover(sentinel), ClusterFailover(cluster)]
            # every failed acquire would log a backend_error: the loop counts them itself
            log = logging.getLogger("locks")
            level = log.level
            log.setLevel(logging.ERROR)
            try:
                for _ in range(args.repetitions):
                    for failover in failovers:
                        failover.round()
            finally:
                log.setLevel(level)
                for failover in failovers:
                    failover.close()
        finally:
            sentinel.stop()
            cluster.stop()
    return cycle_rows(entries, measured), failover_rows([f.record for f in failovers])


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    load_before = os.getloadavg()[0]  # 1-minute: other work on the machine skews figures
    started = time.perf_counter()
    rows, outages = run(args)
    elapsed = time.perf_counter() - started
    print(f"whole run {elapsed:.0f} s")
    measured = [
        Result(
            Entry(r["topology"], r["lock"], r["sync_replicas"]).name,
            r["cycles_per_second"],
            r["handoff_ms"],
        )
        for r in rows
    ]
    harness.write_ratios("topologies", args, measured, RATIOS)
    body = tables(rows, outages)
    stamp = utc_stamp()
    command = f"python -m {MODULE} " + " ".join(argv if argv is not None else sys.argv[1:])
    results_json = plots.TopologyResults(
        title=TITLE,
        stamp=stamp,
        command=command.strip(),
        seconds=round(elapsed, 1),
        settings={
            "cycles": args.cycles,
            "rounds": args.rounds,
            "samples": args.samples,
            "repetitions": args.repetitions,
            "sync_timeout": SYNC_TIMEOUT,
            "failover_pause_s": PAUSE,
            "redis_py": redis.__version__,
            "load_average_before": load_before,
            "load_average_after": os.getloadavg()[0],
        },
        cycles=rows,
        failovers=outages,
    )
    body += "\n\n" + setup_note(results_json["settings"], elapsed)
    print(body)
    json_path = args.json or (None if args.no_write else plots.TOPOLOGIES_RESULTS)
    harness.save_results(json_path, results_json)
    if args.no_write:
        return 0

    def draw() -> Path:
        return plots.draw_topologies(f"{TITLE} ({stamp})", rows, outages)

    harness.append_with_plot(TITLE, command, body, stamp, draw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
