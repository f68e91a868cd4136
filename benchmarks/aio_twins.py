"""Each asyncio provider (`locks.aio`) next to its threaded twin (`locks.backends`).

    python -m benchmarks.aio_twins [--cycles 1000] [--rounds 5] [--samples 20] [--seconds 3]
                                   [--workers 16] [--keys 100] [--only PAIR ...]
                                   [--json PATH] [--no-write] [--redraw] [--quick]

A pair is one provider type built the same way on both faces, `locks.aio.X(url)` and
`locks.backends.X(url)` (defaults for everything else), run against one server:

- mariadb: `DatabaseProvider` on a MariaDB of its own (`tests.servers.MariaDBServer`,
  its redo log flushed at every commit, as `benchmarks.database` runs it); one URL
  (`mysql+pymysql://`), from which the asyncio face picks asyncmy itself;
- postgresql: `DatabaseProvider` on a PostgreSQL of its own (`PostgreSQLServer`, fsync
  on, as `benchmarks.postgresql` runs it), psycopg 3 on both faces;
- sqlite: `DatabaseProvider` on a SQLite file (aiosqlite on the asyncio face);
- zookeeper: `ZooKeeperProvider` on a standalone ZooKeeper (`ZooKeeperServer`).

Each server is started for its pair alone and stopped after it. The asyncio face runs on
one event loop for the whole run (an `asyncio.Runner`), which idles while the threaded
face runs in this thread. Per pair, the figures (ttl 30 s, wait 30 s):

1. Uncontended cycles/s: acquire + release of one key, `--cycles` per round, `--rounds`
   rounds, the two faces interleaved round by round (as `benchmarks.harness` does), the
   median round kept; the ratio is asyncio's over threaded's.
2. Hand-off: one holder releases a fresh key while one waiter of this process waits for
   it (a task of the loop on the asyncio face, `benchmarks.aio.handoff_latencies`; a
   thread on the threaded face, `locks.measure.handoff_latencies`); the time from the
   release call to the waiter's acquire returning, `--samples` times: median and p99.
3. A small crowd: `--workers` workers (tasks on the loop, sharing one provider:
   `benchmarks.aio.crowd_tasks`; threads sharing one provider: `benchmarks.scale.
   crowd_threads`) over `--keys` keys, each looping acquire + release of a random key
   for `--seconds`: grants/s and acquire latency (call to return) p50/p99/max.

Prints a Markdown table of every figure and of the ratios (higher is better: cycles and
grants/s are asyncio's over threaded's, hand-off and p99 times threaded's over
asyncio's). Unless --no-write, writes the record (the ratios in the shape every
benchmark writes, the figures beside them) to benchmarks/results/aio_twins.json (--json
PATH: there instead, also with --no-write), appends the tables as a dated section to
docs/benchmarks.md, keeps the record in docs/img/aio_twins.json and draws
docs/img/aio_twins.png from it (`--redraw` draws it again from that file alone), as
`benchmarks.aio` does.

--only PAIR (repeatable) runs those pairs alone. --quick takes smaller defaults
(--cycles 200 --rounds 5 --samples 10 --seconds 1); as in `benchmarks.aio`, writing is
left to --no-write.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, cast

from benchmarks import aio, harness, plots, scale
from benchmarks.aio import Crowd, CrowdRatio, Uncontended, _fill, _ms
from benchmarks.harness import Contender, Ratio
from locks import aio as faces
from locks import measure as core
from locks.aio.base import AsyncProviderBase
from locks.backends import DatabaseProvider, ZooKeeperProvider
from locks.measure import bench_key, percentiles
from locks.provider import LockProvider
from tests.servers import MariaDBServer, SQLiteFile, ZooKeeperServer
from tests.servers.postgresql import PostgreSQLServer

MODULE = "benchmarks.aio_twins"
NAME = "aio_twins"
TITLE = "asyncio next to threaded: the database and ZooKeeper providers, face by face"
RESULTS = harness.RESULTS / f"{NAME}.json"
RECORD = plots.IMAGES / f"{NAME}.json"  # the newest published run, for --redraw

QUICK = {"cycles": 200, "rounds": 5, "samples": 10, "seconds": 1.0}
DEFAULTS = {"cycles": 1000, "rounds": 5, "samples": 20, "seconds": 3.0}

# how a waiter learns of a release, by pair and face ("*": either face)
_POLLS = "a process's first waiter on a key polls every ~25 ms, woken by a release made here"
WAITS = {
    ("zookeeper", "*"): "a watch on the node ahead of its own",
    ("postgresql", "*"): "LISTEN: a process's first waiter on a key sleeps until a "
    "release is announced (NOTIFY) or made here",
}


@dataclass(frozen=True)
class Pair:
    """One provider type on both faces, against one server."""

    id: str  # for --only and the ratio ids
    label: str  # the server, as the report names it
    family: str  # "database" or "zookeeper"

    @property
    def asyncio_name(self) -> str:
        return f"locks.aio {self.family} ({self.label})"

    @property
    def threaded_name(self) -> str:
        return f"locks.backends {self.family} ({self.label})"

    def waits(self, face: str) -> str:
        """How a waiter of `face` ("asyncio" or "threaded") learns of a release."""
        return WAITS.get((self.id, face)) or WAITS.get((self.id, "*")) or _POLLS

    def ratios(self) -> tuple[Ratio, ...]:
        ours, base = self.asyncio_name, self.threaded_name
        return (
            Ratio(f"{NAME}/{self.id}-vs-threaded", ours, base),
            Ratio(f"{NAME}/{self.id}-handoff-vs-threaded", ours, base, handoff=True),
        )

    def crowd_ratios(self) -> tuple[CrowdRatio, ...]:
        ours, base = self.asyncio_name, self.threaded_name
        return (
            CrowdRatio(f"{NAME}/{self.id}-crowd-vs-threaded", ours, base),
            CrowdRatio(f"{NAME}/{self.id}-crowd-p99-vs-threaded", ours, base, p99=True),
        )


PAIRS = (
    Pair("mariadb", "MariaDB", "database"),
    Pair("postgresql", "PostgreSQL", "database"),
    Pair("sqlite", "SQLite file", "database"),
    Pair("zookeeper", "ZooKeeper", "zookeeper"),
)
# every ratio a full run writes, as every benchmark declares them (`benchmarks.check`)
RATIOS = tuple(r for pair in PAIRS for r in pair.ratios())
CROWD_RATIOS = tuple(r for pair in PAIRS for r in pair.crowd_ratios())


# -- the two faces of a pair ---------------------------------------------------------


def threaded_provider(family: str, url: str) -> LockProvider:
    if family == "zookeeper":
        return ZooKeeperProvider(url)
    return DatabaseProvider(url)


async def asyncio_provider(family: str, url: str) -> AsyncProviderBase:
    """Made on the loop that will use it."""
    if family == "zookeeper":
        return faces.ZooKeeperProvider(url)
    return faces.DatabaseProvider(url)


@dataclass(frozen=True)
class ThreadedTwin(scale.Target):
    """`scale.crowd_threads`' target for any pair: `backend` is the pair's family."""

    def provider(self) -> LockProvider:
        return threaded_provider(self.backend, self.url)


def unusable(pair: Pair) -> str | None:
    """Why the asyncio face of `pair` cannot be made yet, if it cannot: its provider
    class still has abstract methods (the asyncio ZooKeeper provider was written after
    this benchmark)."""
    if pair.family != "zookeeper":
        return None
    try:
        cls = faces.ZooKeeperProvider
    except ImportError as exc:
        return f"locks.aio.ZooKeeperProvider cannot be imported ({exc})"
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(cls.__abstractmethods__))
        return f"locks.aio.ZooKeeperProvider is not usable yet (abstract: {missing})"
    return None


@contextmanager
def served(pair: Pair, workdir: Path) -> Iterator[tuple[str, str]]:
    """The pair's server started in `workdir` (a SQLite file stands in for one), as its
    URL and its version; stopped when the block ends."""
    if pair.id == "sqlite":
        yield SQLiteFile(workdir / "locks.sqlite").url, f"SQLite {sqlite3.sqlite_version} (a file)"
        return
    if pair.id == "mariadb":
        mariadb = MariaDBServer(workdir, durable=True)
        with _running(mariadb):
            version = mariadb.sql("SELECT VERSION()")
            yield mariadb.url, f"MariaDB {version} (its redo log flushed at every commit)"
    elif pair.id == "postgresql":
        postgresql = PostgreSQLServer(workdir, durable=True)
        with _running(postgresql):
            version = postgresql.sql("SHOW server_version")
            yield postgresql.url, f"PostgreSQL {version} (fsync on)"
    else:
        zookeeper = ZooKeeperServer(workdir)
        with _running(zookeeper):
            version = scale._zookeeper_version(zookeeper.port)
            yield zookeeper.hosts, f"ZooKeeper {version}"


@contextmanager
def _running(server: MariaDBServer | PostgreSQLServer | ZooKeeperServer) -> Iterator[None]:
    server.start()
    try:
        yield
    finally:
        server.stop()


# -- measuring a pair ----------------------------------------------------------------


def _row(name: str, rates: list[float], latencies: list[float], note: str) -> Uncontended:
    tail = percentiles(latencies) if latencies else None
    row = Uncontended(name, True, statistics.median(rates), rates, tail.p50 if tail else None,
                      tail.p99 if tail else None, len(latencies), note)  # fmt: skip
    print(f"  {name}: {row.cycles_per_second:,.0f} cycles/s, hand-off median "
          f"{_ms(row.handoff_ms)} ms, p99 {_ms(row.handoff_p99_ms)} ms", flush=True)  # fmt: skip
    return row


def uncontended(
    runner: asyncio.Runner,
    pair: Pair,
    tasks: aio.AsyncContender,
    threads: Contender,
    args: argparse.Namespace,
) -> list[Uncontended]:
    """Both faces' cycles, round by round (asyncio first in each), then each one's
    hand-offs."""
    task_key, thread_key = bench_key(), bench_key()
    runner.run(aio.warm_up(tasks, task_key))
    core.warm_up(threads.acquire, threads.release, thread_key)
    task_rates: list[float] = []
    thread_rates: list[float] = []
    for _ in range(args.rounds):
        task_rates.append(runner.run(aio.cycle_rate(tasks, task_key, args.cycles)))
        thread_rates.append(harness.cycle_rate(threads, thread_key, args.cycles))
    task_handoffs = runner.run(aio.handoff_latencies(tasks, args.samples))
    thread_handoffs = core.handoff_latencies(threads.acquire, threads.release, args.samples,
                                             label=threads.name)  # fmt: skip
    return [
        _row(tasks.name, task_rates, task_handoffs, pair.waits("asyncio")),
        _row(threads.name, thread_rates, thread_handoffs, pair.waits("threaded")),
    ]


async def task_crowd(pair: Pair, url: str, args: argparse.Namespace) -> Crowd:
    """The asyncio face's crowd, on a provider of its own, as the threaded one's."""
    contender = aio.ours(await asyncio_provider(pair.family, url), pair.asyncio_name)
    try:
        return await aio.crowd_tasks(contender, args.workers, args.keys, args.seconds, aio.WAIT)
    finally:
        await contender.close()


def thread_crowd(pair: Pair, url: str, args: argparse.Namespace) -> Crowd:
    row = scale.crowd_threads(ThreadedTwin(pair.family, url), args.workers, args.keys,
                              args.seconds)  # fmt: skip
    return Crowd(
        library=pair.threaded_name, ours=True, mode="threads", workers=args.workers,
        keys=args.keys, wait_s=scale.WAIT, seconds=row["seconds"], grants=row["grants"],
        grants_per_second=row["grants_per_second"], p50_ms=row["p50_ms"],
        p99_ms=row["p99_ms"], max_ms=row["max_ms"], drain_s=row["drain_s"],
        timeouts=row["timeouts"], errors=row["errors"], error=row["error"],
    )  # fmt: skip


def measure_pair(
    runner: asyncio.Runner, pair: Pair, url: str, args: argparse.Namespace
) -> tuple[list[Uncontended], list[Crowd]]:
    print(f"{pair.label}: uncontended cycles and hand-off", flush=True)
    provider = runner.run(asyncio_provider(pair.family, url))
    tasks = aio.ours(provider, pair.asyncio_name)
    tasks.note = pair.waits("asyncio")
    threads = harness.provider_contender(threaded_provider(pair.family, url), pair.threaded_name)
    try:
        rows = uncontended(runner, pair, tasks, threads, args)
    finally:
        runner.run(provider.close())
        threads.close()
    print(f"{pair.label}: crowds of {args.workers} over {args.keys} keys, {args.seconds:g} s",
          flush=True)  # fmt: skip
    crowds = [runner.run(task_crowd(pair, url, args)), thread_crowd(pair, url, args)]
    for crowd in crowds:
        aio._said(crowd)
    return rows, crowds


# -- the run ---------------------------------------------------------------------------


def run(
    args: argparse.Namespace,
) -> tuple[list[dict[str, str]], list[Uncontended], list[Crowd]]:
    """Every selected pair, one after the other, each against a server of its own; the
    asyncio face on one loop throughout."""
    done: list[dict[str, str]] = []
    measured: list[Uncontended] = []
    crowds: list[Crowd] = []
    with asyncio.Runner() as runner:
        for pair in selected(args):
            with tempfile.TemporaryDirectory(prefix="locks-bench-") as workdir, \
                    served(pair, Path(workdir)) as (url, version):  # fmt: skip
                rows, found = measure_pair(runner, pair, url, args)
            measured += rows
            crowds += found
            done.append({"id": pair.id, "label": pair.label, "asyncio": pair.asyncio_name,
                         "threaded": pair.threaded_name, "server": version})  # fmt: skip
    return done, measured, crowds


def selected(args: argparse.Namespace) -> list[Pair]:
    return [pair for pair in PAIRS if not args.only or pair.id in args.only]


def record(
    args: argparse.Namespace,
    pairs: Sequence[dict[str, str]],
    measured: Sequence[Uncontended],
    crowds: Sequence[Crowd],
    settings: dict[str, Any],
    *,
    command: str = "",
) -> dict[str, Any]:
    """As `benchmarks.aio.record` writes its run (`plots.AioTwinsResults`, once the run's
    "seconds" are added), with the pairs measured; the ratios are theirs alone."""
    chosen = [pair for pair in PAIRS if pair.id in {p["id"] for p in pairs}]
    results = {row.name: row.result() for row in measured}
    ratios = [{"id": r.id, "value": r.value(results), "compares": r.compares}
              for pair in chosen for r in pair.ratios()]  # fmt: skip
    ratios += [{"id": r.id, "value": r.value(crowds), "compares": r.compares}
               for pair in chosen for r in pair.crowd_ratios()]  # fmt: skip
    return {
        "benchmark": NAME,
        "title": TITLE,
        "stamp": harness.utc_stamp(),
        "command": command,
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "arguments": vars(args),
        "ratios": ratios,
        "settings": settings,
        "pairs": list(pairs),
        "uncontended": [asdict(row) for row in measured],
        "crowds": [asdict(crowd) for crowd in crowds],
    }


# -- the report ------------------------------------------------------------------------


def _versus(value: float | None, base: float | None) -> str:
    return f"{value / base:.2f}x" if value is not None and base else "—"


def report(saved: dict[str, Any]) -> str:
    """Markdown: the uncontended table (read back by `plots.parse_results` as any
    contender table), the crowds, the ratios, the figures in words, the machine line."""
    given = saved["arguments"]
    rows = {r["name"]: r for r in saved["uncontended"]}
    crowds = {c["library"]: c for c in saved["crowds"]}
    lines = [
        f"Uncontended and hand-off ({given['rounds']} rounds of {given['cycles']:,} cycles "
        f"per face, interleaved; {given['samples']} hand-offs to a waiter of the same "
        "process):",
        "",
        "| contender | cycles/s | vs its threaded twin | hand-off median ms | hand-off p99 ms "
        "| waits |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for pair in saved["pairs"]:
        base = rows[pair["threaded"]]["cycles_per_second"]
        for name in (pair["asyncio"], pair["threaded"]):
            r = rows[name]
            lines.append(
                f"| {name} | {r['cycles_per_second']:,.0f} "
                f"| {_versus(r['cycles_per_second'], base)} | {_ms(r['handoff_ms'])} "
                f"| {_ms(r['handoff_p99_ms'])} | {r['note'] or ''} |"
            )
    lines += [
        "",
        f"Crowds: {given['workers']} workers over {given['keys']} keys for "
        f"{given['seconds']:g} s (acquire latency from call to return):",
        "",
        "| library | workers | grants/s | vs its threaded twin | p50 ms | p99 ms | max ms "
        "| drain s | timeouts | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for pair in saved["pairs"]:
        base = crowds[pair["threaded"]]["grants_per_second"]
        for name in (pair["asyncio"], pair["threaded"]):
            c = crowds[name]
            lines.append(
                f"| {name} | {c['workers']:,} {c['mode']} | {c['grants_per_second']:,.0f} "
                f"| {_versus(c['grants_per_second'], base)} | {_ms(c['p50_ms'])} "
                f"| {_ms(c['p99_ms'])} | {_ms(c['max_ms'])} | {c['drain_s']:.2f} "
                f"| {c['timeouts']:,} | {c['errors']:,} |"
            )
    troubles = [f"- {c['library']}: {c['errors']:,} errors, the first {c['error']}; "
                f"{c['cancelled']:,} tasks cancelled" for c in saved["crowds"]
                if c["error"] or c["cancelled"]]  # fmt: skip
    if troubles:
        lines += ["", *troubles]
    lines += ["", "Ratios (higher is better):", "", "| ratio | value | compares |",
              "|---|---:|---|"]  # fmt: skip
    for r in saved["ratios"]:
        lines.append(f"| {r['id']} | {_ms(r['value'])} | {r['compares']} |")
    lines += ["", summary(saved), "", setup_note(saved)]
    return "\n".join(lines)


def summary(saved: dict[str, Any]) -> str:
    """A sentence per pair: the three figures of the asyncio face against its twin's."""
    rows = {r["name"]: r for r in saved["uncontended"]}
    crowds = {c["library"]: c for c in saved["crowds"]}
    said = []
    for pair in saved["pairs"]:
        mine, twin = rows[pair["asyncio"]], rows[pair["threaded"]]
        busy, other = crowds[pair["asyncio"]], crowds[pair["threaded"]]
        said.append(
            f"{pair['label']}: the asyncio face made {mine['cycles_per_second']:,.0f} "
            f"cycles/s, {_versus(mine['cycles_per_second'], twin['cycles_per_second'])} the "
            f"threaded face's {twin['cycles_per_second']:,.0f}; hand-off median "
            f"{_ms(mine['handoff_ms'])} ms (p99 {_ms(mine['handoff_p99_ms'])}) against "
            f"{_ms(twin['handoff_ms'])} ms (p99 {_ms(twin['handoff_p99_ms'])}); in the crowd "
            f"{busy['grants_per_second']:,.0f} grants/s, "
            f"{_versus(busy['grants_per_second'], other['grants_per_second'])} the threads' "
            f"{other['grants_per_second']:,.0f}, acquire p99 {_ms(busy['p99_ms'])} ms against "
            f"{_ms(other['p99_ms'])} ms."
        )
    return _fill(" ".join(said))


def setup_note(saved: dict[str, Any]) -> str:
    """The machine line: the run's conditions, the servers and drivers, the set-up."""
    settings = saved["settings"]
    servers = ", ".join(pair["server"] for pair in saved["pairs"])
    drivers = ", ".join(f"{name} {version}" for name, version in settings["drivers"].items())
    return _fill(
        f"{harness.run_conditions(settings, saved['seconds'])} Each pair against a server "
        f"of its own, started for it, on loopback: {servers}; {drivers}; Python "
        f"{saved['python']}. Both faces with their defaults (a database provider's pool: 10 "
        f"connections), ttl {aio.TTL:g} s, wait {aio.WAIT:g} s. The asyncio face on one "
        "event loop (`asyncio.Runner`) that idles while the threaded face runs. "
        f"`docs/img/{NAME}.json` holds the raw results of the newest run."
    )


# -- the command -----------------------------------------------------------------------


def arguments(argv: list[str] | None) -> argparse.Namespace:
    options = argparse.ArgumentParser(
        prog=f"python -m {MODULE}", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    options.add_argument("--cycles", type=int, help="per face and round (default: 1000)")
    options.add_argument("--rounds", type=int, help="(default: 5)")
    options.add_argument("--samples", type=int, help="hand-offs per face (default: 20)")
    options.add_argument("--seconds", type=float, help="each crowd's loop (default: 3)")
    options.add_argument("--workers", type=int, default=16, help="of a crowd: tasks or threads")
    options.add_argument("--keys", type=int, default=100, help="a crowd's keys")
    options.add_argument("--only", action="append", choices=[p.id for p in PAIRS],
                         help="run this pair (repeatable; default: every pair)")  # fmt: skip
    options.add_argument("--json", type=Path, help=f"default: {RESULTS}")
    options.add_argument("--no-write", action="store_true",
                         help=f"write neither {RESULTS.name} nor docs/ (but --json)")  # fmt: skip
    options.add_argument("--redraw", action="store_true",
                         help=f"measure nothing: draw the image again from {RECORD}")  # fmt: skip
    options.add_argument(
        "--quick", action="store_true",
        help="smaller defaults: " + ", ".join(f"--{k} {v:g}" for k, v in QUICK.items()),
    )  # fmt: skip
    args = options.parse_args(argv)
    for name, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ("cycles", "rounds", "workers", "keys"):
        if getattr(args, name) < 1:
            options.error(f"--{name} must be at least 1")
    if args.samples < 0 or args.seconds <= 0:
        options.error("--samples must be >= 0, --seconds > 0")
    if not args.redraw:
        for pair in selected(args):
            why = unusable(pair)
            if why:
                others = " ".join(f"--only {p.id}" for p in PAIRS if p.id != pair.id)
                options.error(f"{why}: leave the {pair.id} pair out with {others}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    if args.redraw:
        print(f"drew {plots.draw_aio_twins(load())}")
        return 0
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    pairs, measured, crowds = run(args)
    settings = {
        "cpus": os.cpu_count(),
        "cpu": scale.machine(load_before)["cpu"],
        "load_average_before": load_before,
        "load_average_after": os.getloadavg()[0],
        "drivers": {name: metadata.version(name) for name in
                    ("SQLAlchemy", "PyMySQL", "asyncmy", "psycopg", "aiosqlite", "kazoo")},
    }  # fmt: skip
    command = f"python -m {MODULE} " + " ".join(argv if argv is not None else sys.argv[1:])
    saved = record(args, pairs, measured, crowds, settings, command=command.strip())
    saved["seconds"] = round(time.perf_counter() - started, 1)
    body = report(saved)
    print(body)
    path = args.json or (None if args.no_write else RESULTS)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(saved, indent=2, default=str) + "\n")
        print(f"wrote {path}")
    if not args.no_write:
        publish(saved, body)
    return 0


def load(path: Path | None = None) -> plots.AioTwinsResults:
    path = path or RECORD
    if not path.exists():
        raise SystemExit(f"no {path}: run python -m {MODULE}")
    return cast(plots.AioTwinsResults, json.loads(path.read_text()))


def publish(saved: dict[str, Any], body: str) -> None:
    """The record kept in docs/img/aio_twins.json, the section appended to
    docs/benchmarks.md with the image drawn from that record, as `benchmarks.aio` does."""
    harness.save_results(RECORD, json.loads(json.dumps(saved, default=str)))
    results = cast(plots.AioTwinsResults, saved)
    harness.append_with_plot(TITLE, saved["command"], body, saved["stamp"],
                             lambda: plots.draw_aio_twins(results))  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
