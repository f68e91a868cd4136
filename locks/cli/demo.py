"""`locks demo`: the oversell story, told by real processes.

N worker processes sell from one stock of M items. Each sale reads the stock, works for
a moment, and writes the stock back one lower: a read-modify-write that two processes can
interleave. First they sell with no lock, and more items are sold than there were; then
each sale runs under the configured scenario's lock, and exactly M are sold. The demo
shows which backend served each sale and how often the chain degraded.

With no config and no servers it runs on the embedded default (redis -> a directory of
lock files -> local): Redis is absent, so the chain degrades to the lock files at once and
says so. They need no extra: a core install excludes across processes too.
With the servers of compose/ up, `--config compose/locks.toml` uses Redis; kill Redis
mid-run and watch the sales move to the next backend. Exit code 0 when the locked phase
sold exactly the stock, 1 when it oversold (or a worker failed).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from locks.cli.common import (
    DEFAULT_SCENARIO,
    command,
    load,
    milliseconds,
    probe,
    quiet_drivers,
    table,
    write_atomically,
)
from locks.config import Registry, from_config
from locks.events import Event, EventKind, add_observer

SPAWN = multiprocessing.get_context("spawn")  # workers start clean: no inherited sockets


def register(commands: Any) -> None:
    parser = command(
        commands, "demo", "oversell with no lock, then none through a scenario's lock", __doc__, run
    )
    parser.add_argument("--scenario", help=f"the scenario to lock with (default: "
                        f"{DEFAULT_SCENARIO!r} if configured, else the first)")  # fmt: skip
    parser.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    parser.add_argument("--stock", type=int, default=100, help="items to sell (default 100)")
    parser.add_argument("--work", type=float, default=2.0, metavar="MS",
                        help="milliseconds of work between read and write (default 2)")  # fmt: skip


# -- the shop every worker shares --------------------------------------------------------


class Shop:
    """The stock (a file holding a count) and a journal each worker appends one line to
    per sale (`sale <backend>`), degradation (`degraded <tier>`) or failure."""

    def __init__(self, folder: Path) -> None:
        self.stock_file = folder / "stock"
        self.journal = folder / "journal"

    def reset(self, stock: int) -> None:
        self.write_stock(stock)
        self.journal.write_text("")

    def read_stock(self) -> int:
        return int(self.stock_file.read_text())

    def write_stock(self, count: int) -> None:
        # atomic, so an unlocked reader sees an old count or a new one, never half of one
        write_atomically(self.stock_file, str(count))

    def record(self, *words: str) -> None:
        line = (" ".join(words).replace("\n", " ") + "\n").encode()
        descriptor = os.open(self.journal, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(descriptor, line)  # one O_APPEND write: lines never interleave
        finally:
            os.close(descriptor)

    def tally(self) -> Tally:
        tally = Tally()
        for line in self.journal.read_text().splitlines():
            kind, _, rest = line.partition(" ")
            if kind == "sale":
                tally.sold[rest] += 1
            elif kind == "degraded":
                tally.degraded[rest] += 1
            elif kind == "error":
                tally.errors.append(rest)
        return tally


@dataclass
class Tally:
    sold: Counter[str] = field(default_factory=Counter)  # backend -> sales
    degraded: Counter[str] = field(default_factory=Counter)  # tier skipped -> times
    errors: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.sold.values())

    def served(self) -> str:
        return " · ".join(f"{name} {count}" for name, count in self.sold.most_common()) or "-"


@dataclass(frozen=True)
class Job:
    """What a worker process is told (picklable, for spawn)."""

    folder: str
    config: str | None
    scenario: str | None  # None: sell with no lock at all
    key: str
    work: float  # seconds


def worker(job: Job, start: Any) -> None:
    """One seller, in its own process."""
    quiet_drivers()  # the parent reports
    shop = Shop(Path(job.folder))
    registry: Registry | None = None
    try:
        if job.scenario is not None and job.config is not None:
            registry = from_config(job.config)
            add_observer(lambda event: _note_degradation(shop, event))
        start.wait()
        while _sell_one(shop, registry, job.scenario, job.key, job.work):
            pass
    except Exception as exc:  # reported by the parent, which owns the terminal
        shop.record("error", f"{type(exc).__name__}: {exc}")
    finally:
        if registry is not None:
            registry.close()


def _note_degradation(shop: Shop, event: Event) -> None:
    if event.kind is EventKind.DEGRADED:
        shop.record("degraded", event.backend)


def _sell_one(
    shop: Shop, registry: Registry | None, scenario: str | None, key: str, work: float
) -> bool:
    """Sell one item; False once the stock is gone."""
    if registry is None or scenario is None:
        return _read_modify_write(shop, "none", work)
    with registry.lock(scenario, key, ttl=30, wait=60) as lease:
        return _read_modify_write(shop, lease.backend, work)


def _read_modify_write(shop: Shop, backend: str, work: float) -> bool:
    left = shop.read_stock()
    if left <= 0:
        return False
    time.sleep(work)  # checking the payment, say: the window another seller slips into
    shop.write_stock(left - 1)
    shop.record("sale", backend)
    return True


# -- the show ----------------------------------------------------------------------------


@dataclass
class Outcome:
    phase: str
    stock: int
    tally: Tally
    seconds: float

    @property
    def oversold(self) -> int:
        return max(0, self.tally.total - self.stock)


def play(phase: str, shop: Shop, job: Job, args: argparse.Namespace, progress: bool) -> Outcome:
    shop.reset(args.stock)
    start = SPAWN.Barrier(args.workers + 1)
    sellers = [
        SPAWN.Process(target=worker, args=(job, start), daemon=True) for _ in range(args.workers)
    ]
    for seller in sellers:
        seller.start()
    start.wait(timeout=120)  # every worker has loaded its config and connected
    print(f"-> {phase}: selling", flush=True)
    began = time.monotonic()
    while any(seller.is_alive() for seller in sellers):
        if progress:
            _draw(phase, shop.tally(), args.stock, end="\r")
        time.sleep(0.1)
    seconds = time.monotonic() - began
    for seller in sellers:
        seller.join()
    tally = shop.tally()
    if progress:
        _draw(phase, tally, args.stock, end="\n")
    return Outcome(phase, args.stock, tally, seconds)


def _draw(phase: str, tally: Tally, stock: int, end: str) -> None:
    width = 30
    filled = min(width, round(width * tally.total / stock))
    bar = "#" * filled + "." * (width - filled)
    degraded = sum(tally.degraded.values())
    line = f"{phase:<22} [{bar}] {tally.total:>5}/{stock} sold  {tally.served()}"
    if degraded:
        line += f"  degradations {degraded}"
    print(f"{line:<100}", end=end, file=sys.stderr, flush=True)


def _check(args: argparse.Namespace) -> None:
    for name in ("workers", "stock"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be at least 1")
    if not 0 <= args.work <= 1000:
        raise ValueError("--work must be between 0 and 1000 milliseconds")


def run(args: argparse.Namespace) -> int:
    _check(args)
    loaded = load(args.config)
    registry = loaded.registry
    try:
        for line in loaded.notes:
            print(f"note: {line}")
        scenarios = registry.scenarios
        if not scenarios:
            raise ValueError(f"{loaded.source} configures no scenario to lock with")
        if args.scenario is not None and args.scenario not in scenarios:  # bad usage: 2
            raise ValueError(f"--scenario {args.scenario!r} is not configured in "
                             f"{loaded.source} (configured: {', '.join(scenarios)})")  # fmt: skip
        scenario = args.scenario or (
            DEFAULT_SCENARIO if DEFAULT_SCENARIO in scenarios else scenarios[0]
        )
        chain = registry.chain(scenario)
        print(f"config: {loaded.source}; scenario {scenario!r}: {' -> '.join(chain.order)}")
        for tier in chain.order:
            found = probe(registry, tier)
            if found.reachable:
                print(f"  {tier:<8} {found.type:<11} answers in {milliseconds(found.latency)}")
            else:
                print(f"  {tier:<8} {found.type:<11} UNAVAILABLE: the chain will degrade "
                      f"past it ({found.error})")  # fmt: skip
            if not registry.backend(tier).capabilities.cross_process:
                print(f"  {'':<8} {'':<11} (excludes within one process only: if the chain "
                      "ever falls back to it, workers can oversell)")  # fmt: skip
    finally:
        registry.close()

    progress = sys.stderr.isatty()
    config = None if loaded.path is None else str(loaded.path)
    print(f"\n{args.workers} workers sell {args.stock} items, {args.work:g} ms of work each")
    with tempfile.TemporaryDirectory(prefix="locks-demo-") as folder:
        shop = Shop(Path(folder))
        job = Job(folder, config, None, f"demo:stock:{uuid.uuid4().hex[:8]}", args.work / 1000)
        outcomes = [
            play("no lock", shop, job, args, progress),
            play(f"scenario {scenario}", shop, replace(job, scenario=scenario), args, progress),
        ]
    rows = []
    for outcome in outcomes:
        tally = outcome.tally
        degraded = ", ".join(f"{tier} x{n}" for tier, n in tally.degraded.items())
        rows.append([
            outcome.phase, outcome.stock, tally.total, outcome.oversold,
            tally.served() if outcome.phase != "no lock" else "-",
            degraded or "0", f"{outcome.seconds:.1f} s",
        ])  # fmt: skip
    print()
    print(table(["phase", "stock", "sold", "oversold", "served by", "degradations", "time"], rows))
    locked = outcomes[1]
    for error in sorted(set(outcomes[0].tally.errors + locked.tally.errors)):
        print(f"worker failed: {error}", file=sys.stderr)
    if locked.tally.errors or locked.oversold or locked.tally.total != locked.stock:
        print(f"\nthe locked phase went wrong: sold {locked.tally.total} of {locked.stock}")
        return 1
    unlocked = outcomes[0].oversold
    print(f"\nno lock: {unlocked} sold that did not exist. With the lock: none.")
    return 0
