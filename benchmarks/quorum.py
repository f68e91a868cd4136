"""Our quorum lock (RedLock over independent members) next to pottery's `Redlock` on the
same Redis masters, next to one member alone, and a mixed quorum, in one run.

    python -m benchmarks.quorum [--cycles 2000] [--rounds 5] [--samples 20]
                                [--json PATH] [--no-write] [--quick]

Starts five independent redis-servers (no replication, no persistence), a standalone
ZooKeeper and a MariaDB (durable: redo log flushed at every commit, as in
`benchmarks.database`) on free loopback ports, and measures:

1. On the first 3 and on all 5 masters: `Quorum` over `RedisProvider` members (ours)
   and pottery's `Redlock` (one lock object per acquire, `auto_release_time=30`, its
   other defaults): uncontended acquire + release cycles/s on one thread, acquire
   latency p50/p99, and hand-off (holder releases -> a waiter blocked in another thread
   has it; median of --samples, a fresh key each). Pottery waits by retrying after a
   random sleep of 0-0.2 s (`Redlock._RETRY_DELAY`); ours waits in its members.
2. One `RedisProvider` on the first master, in the same rounds: the member a quorum
   acquire is compared with ("quorum p50 / one member's p50").
3. A mixed quorum, 2 of 3: `Quorum` over Redis (the first master), ZooKeeper and
   MariaDB, next to ZooKeeper and MariaDB alone (Redis alone is the row of 2.). If
   ZooKeeper or MariaDB cannot be started the section says so, and the rest stands.

Every contender has a key of its own, reused for all its cycles, and a ttl of 30 s. All
contenders are interleaved round by round (--rounds), as `benchmarks.harness.measure`
does, so a machine that slows down mid-run slows everyone alike. In each round every
acquire of a contender's --cycles loop is one try (`wait=0` for ours,
`acquire(blocking=False)` for pottery) timed on its own: cycles/s is the loop's rate
(median of the rounds) and p50/p99 are over the acquires of all rounds, so both figures
describe the same acquires. A one try refused on the uncontended key is counted, and
the cycle then waits for the lock as a blocking acquire would.

Appends a section to docs/benchmarks.md, draws docs/img/quorum.png and writes the raw
results to docs/img/quorum.json (what `python -m benchmarks.plots quorum` redraws
from). --no-write writes none of these; --json still writes the results. `RATIOS` go to
benchmarks/results/quorum.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import redis
from pottery import Redlock

from benchmarks import harness, plots
from benchmarks.harness import (
    Contender,
    Ratio,
    Result,
    provider_contender,
    utc_stamp,
)
from locks import measure as core
from locks.backends import DatabaseProvider, RedisProvider, ZooKeeperProvider
from locks.provider import LockProvider
from locks.quorum import Quorum
from tests.servers import MariaDBServer, RedisServer, ZooKeeperServer

TITLE = "Quorum: RedLock on 3 and 5 Redis masters next to pottery, and a mixed quorum"
MODULE = "benchmarks.quorum"
MASTERS = 5
TTL = 30.0  # s, ours and pottery's auto_release_time alike
PEER = "pottery Redlock"
OURS = "fallback-locks quorum"
ONE = "fallback-locks redis"  # one member alone, on the first master
MIXED_QUORUM = "fallback-locks quorum redis + zookeeper + mariadb"
MIXED_MEMBERS = {"zookeeper": "fallback-locks zookeeper", "mariadb": "fallback-locks database"}
# named as `measure` names its entries: "<group>: <contender>"
RATIOS = tuple(
    Ratio(f"quorum/quorum-{n}-masters-vs-pottery", f"{n} masters: {OURS}", f"{n} masters: {PEER}")
    for n in (3, MASTERS)
)


@dataclass
class Entry:
    """A contender, its one-try acquire, and what its rounds found."""

    group: str  # "3 masters", "5 masters", "one member", "mixed"
    contender: Contender  # blocking acquire (warm-up, hand-off, after a refused try)
    try_once: Callable[[str], Any]  # one try: a handle for contender.release, or None
    rates: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)  # ms, every round's acquires
    refused: int = 0

    @property
    def name(self) -> str:
        return self.contender.name


def ours(group: str, provider: LockProvider, label: str, *members: LockProvider) -> Entry:
    """One of ours: blocking acquire with wait=30, one try with wait=0; `members` are
    closed with it (a quorum closes none of its own)."""

    def try_once(key: str) -> Any:
        return provider.acquire(key, ttl=TTL, wait=0)

    return Entry(group, provider_contender(provider, label, *members), try_once)


def pottery(group: str, urls: list[str]) -> Entry:
    """pottery's Redlock over one redis-py client per master, a lock object per acquire
    as `with Redlock(...)` makes one; blocking with its own retry loop and delay."""
    masters = {redis.Redis.from_url(url) for url in urls}

    def acquire(key: str) -> Any:
        lock = Redlock(key=key, masters=masters, auto_release_time=TTL)
        if not lock.acquire(timeout=TTL):  # nobody else uses bench keys: a fault
            raise RuntimeError(f"pottery Redlock: {key!r} not acquired in {TTL} s")
        return lock

    def try_once(key: str) -> Any:
        lock = Redlock(key=key, masters=masters, auto_release_time=TTL)
        return lock if lock.acquire(blocking=False) else None

    def close() -> None:
        for client in masters:
            client.close()

    contender = Contender(PEER, acquire, lambda lock: lock.release(), close)
    return Entry(group, contender, try_once)


def quorum_entries(urls: list[str]) -> list[Entry]:
    """Ours and pottery on the first 3 and on all 5 masters, and one member alone."""
    entries = []
    for n in (3, MASTERS):
        group = f"{n} masters"
        members = [RedisProvider(url, name=f"r{i}") for i, url in enumerate(urls[:n])]
        entries.append(pottery(group, urls[:n]))
        entries.append(ours(group, Quorum(members, name=f"quorum{n}"), OURS, *members))
    entries.append(ours("one member", RedisProvider(urls[0], name="one"), ONE))
    for entry in entries:  # names are unique across the run: rows are keyed by them
        entry.contender.name = f"{entry.group}: {entry.contender.name}"
    return entries


def mixed_entries(redis_url: str, hosts: str, database_url: str) -> list[Entry]:
    """The 2-of-3 quorum over Redis, ZooKeeper and MariaDB, and those two members alone
    (each with providers of its own, so no figure shares a connection pool)."""
    members: list[LockProvider] = [
        RedisProvider(redis_url, name="redis"),
        ZooKeeperProvider(hosts, name="zookeeper"),
        DatabaseProvider(database_url, name="mariadb"),
    ]
    entries = [ours("mixed", Quorum(members, name="mixed", quorum=2), MIXED_QUORUM, *members)]
    entries.append(ours("mixed", ZooKeeperProvider(hosts), MIXED_MEMBERS["zookeeper"]))
    entries.append(ours("mixed", DatabaseProvider(database_url), MIXED_MEMBERS["mariadb"]))
    for entry in entries:
        entry.contender.name = f"mixed: {entry.contender.name}"
    return entries


def timed_cycles(entry: Entry, key: str, cycles: int) -> None:
    """One round of `entry`: `cycles` one-try acquires + releases of `key`, each acquire
    timed on its own, the loop's rate kept."""
    started = time.perf_counter()
    for _ in range(cycles):
        asked = time.perf_counter()
        handle = entry.try_once(key)
        entry.latencies.append((time.perf_counter() - asked) * 1000)
        if handle is None:  # refused on a key nobody else wants: counted, then waited for
            entry.refused += 1
            handle = entry.contender.acquire(key)
        entry.contender.release(handle)
    entry.rates.append(cycles / (time.perf_counter() - started))


def measure(entries: list[Entry], cycles: int, rounds: int, samples: int) -> list[plots.QuorumRow]:
    """Every entry warmed up, then `rounds` rounds each running every entry once, then
    each one's hand-off; all closed at the end, whatever happened."""
    keys = {entry.name: core.bench_key() for entry in entries}
    rows: list[plots.QuorumRow] = []
    try:
        for entry in entries:
            core.warm_up(entry.contender.acquire, entry.contender.release, keys[entry.name])
        for index in range(rounds):
            started = time.perf_counter()
            for entry in entries:
                timed_cycles(entry, keys[entry.name], cycles)
            took = time.perf_counter() - started
            print(f"  round {index + 1} of {rounds}: {took:.1f} s", flush=True)
        for entry in entries:
            contender = entry.contender
            handoff = (
                core.handoff_ms(contender.acquire, contender.release, samples, label=entry.name)
                if samples
                else None
            )
            tail = core.percentiles(entry.latencies)
            rows.append(
                plots.QuorumRow(
                    group=entry.group,
                    name=entry.name.split(": ", 1)[1],
                    ours=contender.ours,
                    cycles_per_second=statistics.median(entry.rates),
                    acquire_p50_ms=tail.p50,
                    acquire_p99_ms=tail.p99,
                    acquire_samples=tail.samples,
                    refused=entry.refused,
                    handoff_ms=handoff,
                )
            )
            print(
                f"  {entry.name}: {rows[-1]['cycles_per_second']:,.0f} cycles/s, acquire p50 "
                f"{tail.p50:.3f} ms p99 {tail.p99:.3f} ms, hand-off "
                f"{'—' if handoff is None else f'{handoff:.2f}'} ms, "
                f"{entry.refused} refused",
                flush=True,
            )
    finally:
        for entry in entries:
            entry.contender.close()
    return rows


# -- report -----------------------------------------------------------------------------


def _row(rows: list[plots.QuorumRow], group: str, name: str) -> plots.QuorumRow:
    return next(r for r in rows if r["group"] == group and r["name"] == name)


def _figures(row: plots.QuorumRow, base: plots.QuorumRow, hand_off: bool = False) -> str:
    """Table cells: cycles/s, p50, p99, `row`'s p50 over `base`'s (and the hand-off)."""
    cells = (
        f"{row['cycles_per_second']:,.0f} | {row['acquire_p50_ms']:.3f} "
        f"| {row['acquire_p99_ms']:.3f} | {row['acquire_p50_ms'] / base['acquire_p50_ms']:.2f}x"
    )
    if hand_off:
        cells += " | —" if row["handoff_ms"] is None else f" | {row['handoff_ms']:.2f}"
    return cells


def tables(rows: list[plots.QuorumRow], mixed_note: str | None) -> str:
    one = _row(rows, "one member", ONE)
    lines = [
        "| masters | contender | ours / pottery, cycles/s | cycles/s | acquire p50 ms "
        "| acquire p99 ms | p50 / one member's | hand-off, median ms |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for n in (3, MASTERS):
        peer, mine = _row(rows, f"{n} masters", PEER), _row(rows, f"{n} masters", OURS)
        ratio = mine["cycles_per_second"] / peer["cycles_per_second"]
        lines.append(f"| {n} | {PEER} | — | {_figures(peer, one, True)} |")
        lines.append(f"| {n} | {OURS} | {ratio:.2f}x | {_figures(mine, one, True)} |")
    lines.append(f"| 1 | {ONE} (one member) | — | {_figures(one, one, True)} |")
    lines += ["", targets(rows)]
    if mixed_note is not None:
        lines += ["", f"Mixed quorum (redis + zookeeper + mariadb): not measured, {mixed_note}"]
        return "\n".join(lines)
    mixed = _row(rows, "mixed", MIXED_QUORUM)
    lines += [
        "",
        "| mixed quorum, 2 of 3, and its members alone | cycles/s | acquire p50 ms "
        "| acquire p99 ms | quorum p50 / this p50 | hand-off, median ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in (mixed, one, *(_row(rows, "mixed", n) for n in MIXED_MEMBERS.values())):
        label = row["name"] if row is mixed else f"{row['name']} (alone)"
        # the ratio the other way round: how much the quorum adds to this member
        cells = _figures(row, mixed, True).split(" | ")
        cells[3] = f"{mixed['acquire_p50_ms'] / row['acquire_p50_ms']:.2f}x"
        lines.append(f"| {label} | {' | '.join(cells)} |")
    return "\n".join(lines)


def targets(rows: list[plots.QuorumRow]) -> str:
    """The two targets the quorum was built to, reported against, never asserted."""
    one = _row(rows, "one member", ONE)["acquire_p50_ms"]
    peer = _row(rows, f"{MASTERS} masters", PEER)["cycles_per_second"]
    speed = _row(rows, f"{MASTERS} masters", OURS)["cycles_per_second"] / peer
    p50 = {n: _row(rows, f"{n} masters", OURS)["acquire_p50_ms"] / one for n in (3, MASTERS)}

    def met(ok: bool) -> str:
        return "met" if ok else "not met"

    return (
        f"Targets: ours >= 1.5x pottery's cycles/s on {MASTERS} masters: {speed:.2f}x "
        f"({met(speed >= 1.5)}). Quorum acquire p50 <= 1.5x one member's: "
        + ", ".join(f"{n} masters {p50[n]:.2f}x ({met(p50[n] <= 1.5)})" for n in p50)
        + "."
    )


def summary(rows: list[plots.QuorumRow], mixed_note: str | None) -> str:
    """What the figures say, in plain sentences built from them."""
    one = _row(rows, "one member", ONE)["acquire_p50_ms"]
    speed = {
        n: _row(rows, f"{n} masters", OURS)["cycles_per_second"]
        / _row(rows, f"{n} masters", PEER)["cycles_per_second"]
        for n in (3, MASTERS)
    }
    p50 = {n: _row(rows, f"{n} masters", OURS)["acquire_p50_ms"] for n in (3, MASTERS)}
    text = (
        f"Ours completed {speed[3]:.1f}x pottery's cycles/s on 3 masters and "
        f"{speed[MASTERS]:.1f}x on {MASTERS}. A quorum acquire asks its members in "
        f"parallel; its p50 was {p50[3] / one:.1f}x one member's on 3 masters and "
        f"{p50[MASTERS] / one:.1f}x on {MASTERS} ({p50[3]:.2f} and {p50[MASTERS]:.2f} ms "
        f"against {one:.2f} ms)."
    )
    if mixed_note is None:
        mixed = _row(rows, "mixed", MIXED_QUORUM)["acquire_p50_ms"]
        members = [_row(rows, "one member", ONE)]
        members += [_row(rows, "mixed", n) for n in MIXED_MEMBERS.values()]
        slowest = max(members, key=lambda r: r["acquire_p50_ms"])
        text += (
            f" The mixed quorum's acquire p50 ({mixed:.2f} ms) was "
            f"{mixed / slowest['acquire_p50_ms']:.1f}x that of its slowest member alone "
            f"({slowest['name'].removeprefix('fallback-locks ')}, "
            f"{slowest['acquire_p50_ms']:.2f} ms)."
        )
    return textwrap.fill(text, 88, break_long_words=False, break_on_hyphens=False)


def setup_note(rows: list[plots.QuorumRow], settings: dict[str, Any], seconds: float) -> str:
    """How the figures above were taken, in the section itself."""
    refused = [f"{r['group']} {r['name']}: {r['refused']}" for r in rows if r["refused"]]
    text = (
        f"{harness.run_conditions(settings, seconds)} {MASTERS} independent redis-server "
        f"{settings['redis_server']} on loopback, "
        "no replication or persistence; ZooKeeper standalone; MariaDB flushing its redo log "
        f"at every commit. ttl (pottery: auto_release_time) {TTL:g} s. Cycles: "
        f"{settings['cycles']} per contender and round, {settings['rounds']} rounds, all "
        "contenders interleaved, the median round's rate; each acquire of those loops is one "
        "try (`wait=0`; pottery `acquire(blocking=False)`) timed on its own, and p50/p99 are "
        f"over all {settings['cycles'] * settings['rounds']} of them. Hand-off: median of "
        f"{settings['samples']}, a fresh key each. pottery {settings['pottery']} makes a new "
        "thread pool for every acquire and release, returns once a majority granted (the "
        "other masters' SETs still in flight), and waits with its default retry: a random "
        "sleep of 0-200 ms between tries. "
        + (
            "One-try acquires of the uncontended key refused: " + "; ".join(refused) + ". "
            if refused
            else "No one-try acquire of an uncontended key was refused. "
        )
        + "`docs/img/quorum.json` holds the raw results of the newest run."
    )
    return textwrap.fill(text, 88, break_long_words=False, break_on_hyphens=False)


# -- the run ----------------------------------------------------------------------------


def arguments(argv: list[str] | None) -> argparse.Namespace:
    options = harness.parser(__doc__, results=plots.QUORUM_RESULTS)
    args = harness.parse(options, argv)
    if args.cycles < 1 or args.rounds < 1 or args.samples < 0:
        options.error("need --cycles >= 1, --rounds >= 1 and --samples >= 0")
    return args


def start_mixed(
    workdir: Path, servers: contextlib.ExitStack
) -> tuple[ZooKeeperServer, MariaDBServer] | str:
    """ZooKeeper and MariaDB up (stopped with `servers`), or why they could not be.
    A missing binary is a `pytest.fail` in tests.servers: caught like any failure."""
    try:
        (workdir / "zookeeper").mkdir()
        (workdir / "mariadb").mkdir()
        zookeeper = ZooKeeperServer(workdir / "zookeeper")
        servers.callback(zookeeper.stop)
        mariadb = MariaDBServer(workdir / "mariadb", durable=True)
        servers.callback(mariadb.stop)
        zookeeper.start()
        mariadb.start()
    except (Exception, pytest.fail.Exception) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"mixed quorum skipped: {reason}", file=sys.stderr)
        return f"ZooKeeper or MariaDB could not be started ({reason})."
    return zookeeper, mariadb


def run(args: argparse.Namespace) -> tuple[list[plots.QuorumRow], str | None, str]:
    """Every server up, every measurement, every server down again (also on error).
    Returns the rows, why the mixed quorum was skipped (or None), redis-server's version."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="locks-bench-") as name, contextlib.ExitStack() as up:
        workdir = Path(name)
        masters = []
        for index in range(MASTERS):
            (workdir / f"redis{index}").mkdir()
            server = RedisServer(workdir / f"redis{index}")
            up.callback(server.stop)
            server.start()
            masters.append(server)
        urls = [server.url for server in masters]
        with redis.Redis.from_url(urls[0]) as client:
            version = str(client.info("server")["redis_version"])
        mixed = start_mixed(workdir, up)
        print(f"servers up in {time.perf_counter() - started:.1f} s", flush=True)
        entries = quorum_entries(urls)
        note = mixed if isinstance(mixed, str) else None
        if not isinstance(mixed, str):
            zookeeper, mariadb = mixed
            entries += mixed_entries(urls[0], zookeeper.hosts, mariadb.url)
        rows = measure(entries, args.cycles, args.rounds, args.samples)
    return rows, note, version


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    load_before = os.getloadavg()[0]  # 1-minute: other work on the machine skews figures
    started = time.perf_counter()
    rows, mixed_note, redis_version = run(args)
    elapsed = time.perf_counter() - started
    print(f"whole run {elapsed:.0f} s")
    measured = [
        Result(f"{r['group']}: {r['name']}", r["cycles_per_second"], r["handoff_ms"]) for r in rows
    ]
    harness.write_ratios("quorum", args, measured, RATIOS)
    stamp = utc_stamp()
    command = f"python -m {MODULE} " + " ".join(argv if argv is not None else sys.argv[1:])
    results = plots.QuorumResults(
        title=TITLE,
        stamp=stamp,
        command=command.strip(),
        seconds=round(elapsed, 1),
        settings={
            "cycles": args.cycles,
            "rounds": args.rounds,
            "samples": args.samples,
            "ttl": TTL,
            "cpus": os.cpu_count(),
            "pottery": metadata.version("pottery"),
            "redis_py": redis.__version__,
            "redis_server": redis_version,
            "load_average_before": load_before,
            "load_average_after": os.getloadavg()[0],
        },
        rows=rows,
        mixed_note=mixed_note,
    )
    body = "\n\n".join(
        [
            tables(rows, mixed_note),
            summary(rows, mixed_note),
            setup_note(rows, results["settings"], elapsed),
        ]
    )
    print(body)
    json_path = args.json or (None if args.no_write else plots.QUORUM_RESULTS)
    harness.save_results(json_path, results)
    if args.no_write:
        return 0
    harness.append_with_plot(TITLE, command, body, stamp,
                             lambda: plots.draw_quorum(f"{TITLE} ({stamp})", rows))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
