"""Measuring locks side by side in one run: uncontended cycles/s and hand-off latency.

Every contender is a `Contender`: a way to acquire (blocking or one try) and release a
named lock. Ratios between contenders of one run are what we report; absolute figures
move with the machine. The timing loops are `locks.measure`, the same code as
`locks bench`; this module adds the side-by-side runs, the report and its plot, and
the ratios file `benchmarks.check` compares with benchmarks/floors.toml.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from locks import measure as core
from locks.measure import Acquire, Release
from locks.provider import LockProvider
from tests.servers import ServerProcess

DOCS = Path(__file__).resolve().parent.parent / "docs"
REPORT = DOCS / "benchmarks.md"
RESULTS = Path(__file__).resolve().parent / "results"  # <benchmark>.json: each run's ratios
# --quick: enough for a stable median of the ratios, a fraction of a full run's time
QUICK = {"cycles": 500, "rounds": 7, "samples": 15}


@dataclass
class Contender:
    """A lock to time: `acquire(key)` blocks until held and returns a handle for
    `release`. `ours` marks fallback-locks itself, so plots tell it from the peers."""

    name: str
    acquire: Acquire
    release: Release
    close: Callable[[], None] = lambda: None
    ours: bool = False


@dataclass
class Result:
    name: str
    cycles_per_second: float
    handoff_ms: float | None
    ours: bool = False


@dataclass(frozen=True)
class Ratio:
    """One ratio a benchmark reports, under the id benchmarks/floors.toml gives it.
    Higher is better either way, so one floor reads alike for both: cycles/s are ours
    over the base's, hand-off times the base's over ours."""

    id: str  # "<benchmark>/<what>"
    ours: str  # contender names, as measured
    base: str
    handoff: bool = False

    @property
    def compares(self) -> str:
        if self.handoff:
            return f"median hand-off of {self.base} / of {self.ours}"
        return f"cycles/s of {self.ours} / of {self.base}"

    def value(self, results: dict[str, Result]) -> float | None:
        """None where either side was not measured (or not measurable: no hand-off)."""
        ours, base = results.get(self.ours), results.get(self.base)
        if ours is None or base is None:
            return None
        if self.handoff:
            if ours.handoff_ms is None or base.handoff_ms is None or ours.handoff_ms <= 0:
                return None
            return base.handoff_ms / ours.handoff_ms
        return ours.cycles_per_second / base.cycles_per_second if base.cycles_per_second else None


# every Result this process measured, for the plot `publish` draws of its run
_measured: list[Result] = []


def cycle_rate(contender: Contender, key: str, cycles: int) -> float:
    """Acquire+release cycles per second on one uncontended key."""
    return core.cycle_rate(contender.acquire, contender.release, key, cycles)


class Closable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=Closable)


def per_thread(connect: Callable[[], C]) -> tuple[Callable[[], C], Callable[[], None]]:
    """A bare driver's connection per thread, made by `connect` on that thread's first
    call (one serves one thread at a time), and a way to close them all: what the
    floors' contenders run their statements on."""
    local = threading.local()
    opened: list[C] = []

    def connection() -> C:
        conn: C | None = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = connect()
            opened.append(conn)
        return conn

    def close() -> None:
        for conn in opened:
            conn.close()

    return connection, close


def handoffs(contenders: list[Contender], samples: int, rounds: int) -> dict[str, float]:
    """Each contender's median hand-off (from the holder's release call to the waiter's
    acquire returning), its `samples` taken over `rounds` rounds that each run every
    contender, as the cycles are: a machine that slows down mid-run (a neighbour, a CPU
    that idles deeper) slows everyone alike."""
    found: dict[str, list[float]] = {c.name: [] for c in contenders}
    for index in range(rounds):
        share = samples * (index + 1) // rounds - samples * index // rounds
        if not share:
            continue
        for contender in contenders:
            found[contender.name] += core.handoff_latencies(
                contender.acquire, contender.release, share, label=contender.name
            )
    return {name: statistics.median(times) for name, times in found.items() if times}


def measure(
    contenders: list[Contender],
    cycles: int,
    rounds: int,
    samples: int,
    no_handoff: Collection[str] = (),
) -> list[Result]:
    """Medians per contender. Rounds are interleaved (each round runs every contender
    once), so a machine that slows down mid-run slows everyone alike; so are the
    hand-offs, in rounds of their own after the cycles. Contenders named in `no_handoff`
    only spin to wait: timing their hand-off would only burn a core."""
    keys = {c.name: core.bench_key() for c in contenders}
    rates: dict[str, list[float]] = {c.name: [] for c in contenders}
    try:
        for contender in contenders:
            core.warm_up(contender.acquire, contender.release, keys[contender.name])
        for _ in range(rounds):
            for contender in contenders:
                rates[contender.name].append(cycle_rate(contender, keys[contender.name], cycles))
        timed = [c for c in contenders if c.name not in no_handoff]
        medians = handoffs(timed, samples, rounds) if samples else {}
        results = []
        for contender in contenders:
            handoff = medians.get(contender.name)
            rate = statistics.median(rates[contender.name])
            results.append(Result(contender.name, rate, handoff, contender.ours))
            print(f"  {contender.name}: {rate:,.0f} cycles/s, hand-off {handoff} ms", flush=True)
    finally:
        for contender in contenders:
            contender.close()
    _measured.extend(results)
    return results


def table(results: list[Result], baseline: str) -> str:
    """A Markdown table with each contender's ratio to `baseline`."""
    base = next(r for r in results if r.name == baseline).cycles_per_second
    lines = [
        f"| contender | cycles/s | vs {baseline} | hand-off, median ms |",
        "|---|---:|---:|---:|",
    ]
    for r in results:
        handoff = "—" if r.handoff_ms is None else f"{r.handoff_ms:.2f}"
        lines.append(
            f"| {r.name} | {r.cycles_per_second:,.0f} | {r.cycles_per_second / base:.2f}x "
            f"| {handoff} |"
        )
    return "\n".join(lines)


def needed(contenders: list[Contender], ratios: Sequence[Ratio]) -> list[Contender]:
    """The contenders `ratios` compare, for a quick run; the others are closed unmeasured."""
    names = {name for ratio in ratios for name in (ratio.ours, ratio.base)}
    for contender in contenders:
        if contender.name not in names:
            contender.close()
    return [contender for contender in contenders if contender.name in names]


def write_ratios(
    benchmark: str, args: argparse.Namespace, results: Iterable[Result], ratios: Sequence[Ratio]
) -> Path:
    """Overwrite benchmarks/results/<benchmark>.json with this run's `ratios`, for
    `benchmarks.check`; written whatever --no-write says, since docs/ is not touched."""
    measured = {result.name: result for result in results}
    path = RESULTS / f"{benchmark}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": benchmark,
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "arguments": vars(args),
        "ratios": [
            {"id": r.id, "value": r.value(measured), "compares": r.compares} for r in ratios
        ],
    }
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"wrote {path}")
    return path


def run_conditions(settings: dict[str, Any], seconds: float) -> str:
    """The sentence every report's set-up note opens with: the run's length, the CPUs
    (and their model, where known) and the load around it."""
    model = f" ({settings['cpu']})" if "cpu" in settings else ""
    return (
        f"One run of {seconds:.0f} s on {settings['cpus']} CPUs{model}, 1-minute load "
        f"average {settings['load_average_before']:.1f} before and "
        f"{settings['load_average_after']:.1f} after."
    )


def utc_stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def append_report(title: str, command: str, body: str, stamp: str | None = None) -> Path:
    """Append a dated section to docs/benchmarks.md."""
    if not REPORT.exists():
        REPORT.write_text("# Benchmarks\n\nRatios within one run are the figures to read.\n")
    with REPORT.open("a") as out:
        out.write(f"\n## {title} ({stamp or utc_stamp()})\n\n`{command}`\n\n{body}\n")
    return REPORT


def provider_contender(provider: LockProvider, label: str, *tiers: LockProvider) -> Contender:
    """One of ours as a contender (ttl=30, wait=30); `tiers` are closed with it, since a
    chain closes none of its own."""
    acquire, release = core.provider_ops(provider, ttl=30, wait=30)

    def close() -> None:
        provider.close()
        for tier in tiers:
            tier.close()

    return Contender(label, acquire, release, close, ours=True)


def parser(
    description: str | None, *, repetitions: str | None = None, results: Path | None = None
) -> argparse.ArgumentParser:
    """The options every benchmark takes; --repetitions (`repetitions`: of what) and
    --json (`results`: its default file) where a benchmark has them."""
    options = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    options.add_argument("--cycles", type=int, default=2000, help="per contender and round")
    options.add_argument("--rounds", type=int, default=5)
    options.add_argument("--samples", type=int, default=20, help="hand-offs per contender")
    if repetitions:
        options.add_argument("--repetitions", type=int, default=5, help=repetitions)
    if results:
        options.add_argument("--json", type=Path, help=f"default: {results}")
    options.add_argument(
        "--no-write", action="store_true", help="do not append to docs/ or draw docs/img/"
    )
    options.add_argument(
        "--quick",
        action="store_true",
        help="a short run for `benchmarks.check`: only the contenders and phases its ratios "
        + "need, with smaller defaults ("
        + ", ".join(f"--{name} {value}" for name, value in QUICK.items())
        + "); implies --no-write",
    )
    return options


def parse(options: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """`options` parsed; with --quick the smaller defaults apply (options given still
    win), and nothing is written to docs/: a quick run's figures are not the report's."""
    if options.parse_known_args(argv)[0].quick:
        options.set_defaults(**QUICK, no_write=True)
    return options.parse_args(argv)


def arguments(description: str | None, argv: list[str] | None, repetitions: bool = False) -> Any:
    """The options every benchmark takes, parsed."""
    return parse(parser(description, repetitions="outages to time" if repetitions else None), argv)


def publish(
    title: str,
    module: str,
    argv: list[str] | None,
    body: str,
    write: bool,
    *,
    plot_title: str | None = None,
) -> None:
    """Print a report and, unless told not to, append it to docs/ with its command.

    When writing, the contenders this process measured are drawn to docs/img/<X>.png
    (X: the module's last name) under `plot_title` (default: the section's title: give
    one where the section reports more than the plot shows) and the section links it;
    earlier sections' links to the same image are dropped, since the file now shows this
    run."""
    print(body)
    if not write:
        return
    from benchmarks import plots  # noqa: PLC0415  # it imports this module

    command = f"python -m {module} " + " ".join(argv if argv is not None else sys.argv[1:])
    stamp = utc_stamp()
    name = module.rsplit(".", 1)[-1]

    def draw() -> Path:
        return plots.draw_results(name, f"{plot_title or title} ({stamp})", _measured)

    append_with_plot(title, command, body, stamp, draw if _measured else None)


def append_with_plot(
    title: str, command: str, body: str, stamp: str, draw: Callable[[], Path] | None
) -> None:
    """Append a section to docs/benchmarks.md, linking the image `draw` makes (the
    tables are worth keeping without it: matplotlib is an extra); earlier sections'
    links to the same image are dropped, since the file now shows this run."""
    from benchmarks import plots  # noqa: PLC0415  # it imports this module

    if draw is not None:
        try:
            image = draw()
        except ImportError as exc:
            print(f"no plot drawn ({exc}): pip install -e '.[plot]'", file=sys.stderr)
        else:
            body = f"{body}\n\n{plots.image_link(title, image)}"
            print(f"drew {image}")
    print(f"appended to {append_report(title, command.strip(), body, stamp)}")
    plots.keep_last_links()


def save_results(path: Path | None, results: Any) -> None:
    """A run's raw results as JSON, from which its plot can be drawn again (nothing
    without a path)."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {path}")


def compare(
    argv: list[str] | None,
    *,
    module: str,
    description: str | None,
    title: str,
    server: Callable[[Path], ServerProcess],
    contenders: Callable[[Any], list[Contender]],
    baseline: str,
    ratios: Sequence[Ratio],
    no_handoff: Sequence[str] = (),
) -> int:
    """The whole of a one-server comparison: start the server, measure every contender
    in one run (--quick: those `ratios` need), report ratios to `baseline` and write
    `ratios`. `no_handoff` names contenders whose waiting is only a spin, not worth a
    hand-off figure."""
    args = arguments(description, argv)
    with tempfile.TemporaryDirectory(prefix="locks-bench-") as workdir:
        running = server(Path(workdir))
        running.start()
        try:
            runners = contenders(running)
            if args.quick:
                runners = needed(runners, ratios)
            results = measure(runners, args.cycles, args.rounds, args.samples, no_handoff)
        finally:
            running.stop()
    write_ratios(module.rsplit(".", 1)[-1], args, results, ratios)
    publish(title, module, argv, table(results, baseline), not args.no_write)
    return 0
