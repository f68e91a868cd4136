"""Measuring locks side by side in one run: uncontended cycles/s and hand-off latency.

Every contender is a `Contender`: a way to acquire (blocking or one try) and release a
named lock. Ratios between contenders of one run are what we report; absolute figures
move with the machine. The timing loops are `locks.measure`, the same code as
`locks bench`; this module adds the side-by-side runs, the report and its plot.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from locks import measure as core
from locks.measure import Acquire, Release
from locks.provider import LockProvider
from tests.servers import ServerProcess

DOCS = Path(__file__).resolve().parent.parent / "docs"
REPORT = DOCS / "benchmarks.md"


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


# every Result this process measured, for the plot `publish` draws of its run
_measured: list[Result] = []


def cycle_rate(contender: Contender, key: str, cycles: int) -> float:
    """Acquire+release cycles per second on one uncontended key."""
    return core.cycle_rate(contender.acquire, contender.release, key, cycles)


def handoff_ms(contender: Contender, samples: int) -> float:
    """Median time from the holder's release call to the waiter's acquire returning."""
    return core.handoff_ms(contender.acquire, contender.release, samples, label=contender.name)


def measure(contenders: list[Contender], cycles: int, rounds: int, samples: int) -> list[Result]:
    """Medians per contender. Rounds are interleaved (each round runs every contender
    once), so a machine that slows down mid-run slows everyone alike."""
    keys = {c.name: core.bench_key() for c in contenders}
    rates: dict[str, list[float]] = {c.name: [] for c in contenders}
    try:
        for contender in contenders:
            core.warm_up(contender.acquire, contender.release, keys[contender.name])
        for _ in range(rounds):
            for contender in contenders:
                rates[contender.name].append(cycle_rate(contender, keys[contender.name], cycles))
        results = []
        for contender in contenders:
            handoff = handoff_ms(contender, samples) if samples else None
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
    return options


def arguments(description: str | None, argv: list[str] | None, repetitions: bool = False) -> Any:
    """The options every benchmark takes, parsed."""
    return parser(description, repetitions="outages to time" if repetitions else None).parse_args(
        argv
    )


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
    if _measured:
        name = module.rsplit(".", 1)[-1]
        try:
            image = plots.draw_results(name, f"{plot_title or title} ({stamp})", _measured)
        except ImportError as exc:  # the table is worth keeping without its plot
            print(f"no plot drawn ({exc}): pip install -e '.[plot]'", file=sys.stderr)
        else:
            body = f"{body}\n\n{plots.image_link(title, image)}"
            print(f"drew {image}")
    print(f"appended to {append_report(title, command.strip(), body, stamp)}")
    plots.keep_last_links()


def compare(
    argv: list[str] | None,
    *,
    module: str,
    description: str | None,
    title: str,
    server: Callable[[Path], ServerProcess],
    contenders: Callable[[Any], list[Contender]],
    baseline: str,
    no_handoff: Sequence[str] = (),
) -> int:
    """The whole of a one-server comparison: start the server, measure every contender
    in one run, report ratios to `baseline`. `no_handoff` names contenders whose waiting
    is only a spin, not worth a hand-off figure."""
    args = arguments(description, argv)
    with tempfile.TemporaryDirectory(prefix="locks-bench-") as workdir:
        running = server(Path(workdir))
        running.start()
        try:
            results = measure(contenders(running), args.cycles, args.rounds, args.samples)
        finally:
            running.stop()
    for result in results:
        if result.name in no_handoff:
            result.handoff_ms = None
    publish(title, module, argv, table(results, baseline), not args.no_write)
    return 0
