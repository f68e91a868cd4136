"""`locks bench`: how fast each configured backend is, from this machine, right now.

For every backend of the configuration (or those --backends names) that answers a
ping, one after another:

  cycles/s       uncontended acquire + release of one key, --cycles times
  hand-off ms    a holder releases while another thread waits for the key: the time
                 until the waiter's acquire returns (median of --samples); then the
                 same with the waiter in another process (a backend may wake its
                 own process's threads at once and others only by polling)
  acquire p50/99 single uncontended acquires, timed one by one (--cycles of them)

Locks are taken on keys `bench:<uuid>` with a fixed ttl of 30 s, so nothing real is
touched and a crashed run leaves nothing held for long. A backend that does not answer
its ping is skipped with a note on stderr. Compare backends within one run: figures
move with the machine and its load.

    locks bench                            # every configured backend
    locks bench --backends redis,db --cycles 5000
    locks bench --plot bench.png           # needs pip install 'fallback-locks[plot]'

Exit codes: 0 measured, 2 bad usage (or --plot without matplotlib), 3 no backend
answered.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from locks.cli import UNAVAILABLE, USAGE
from locks.cli.common import command, load, note, probe, table
from locks.config import Registry, from_config
from locks.errors import LockError
from locks.measure import SETTLE, Figures, bench_key, measure_provider, provider_ops

if TYPE_CHECKING:
    from matplotlib.figure import Figure

TTL = 30.0


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def register(commands: Any) -> None:
    parser = command(
        commands,
        "bench",
        "measure each backend: cycles/s, hand-off and acquire latency",
        __doc__,
        run,
    )
    parser.add_argument(
        "--backends",
        metavar="NAME,...",
        help="measure only these backends, comma-separated (default: all configured)",
    )
    parser.add_argument(
        "--cycles",
        type=_positive,
        default=1000,
        metavar="N",
        help="acquire+release cycles for the rate, and single acquires for p50/p99 "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--samples",
        type=_positive,
        default=10,
        metavar="N",
        help="hand-offs to time per backend, each about 50 ms (default: %(default)s)",
    )
    parser.add_argument(
        "--plot",
        metavar="OUT.png",
        type=Path,
        help="also draw the figures to a PNG (needs the 'plot' extra: matplotlib)",
    )


@dataclass(frozen=True)
class Row:
    name: str
    type: str
    figures: Figures
    handoff_processes_ms: float | None  # None: the backend excludes nothing across them


def handoff_across_processes(config: Path, name: str, samples: int) -> float:
    """Median ms from a holder's release to a waiter in another process holding the
    key: the waiter loads the same configuration in a process of its own, is told each
    key, says it is about to wait, and reports the monotonic time (one clock for every
    process of the machine) at which its acquire returned."""
    registry = from_config(config)
    ours, theirs = multiprocessing.Pipe()
    waiter = multiprocessing.get_context("spawn").Process(
        target=_waiting_process, args=(str(config), name, theirs), daemon=True
    )
    waiter.start()
    try:
        acquire, release = provider_ops(registry.backend(name), ttl=TTL)
        latencies = []
        for _ in range(samples):
            key = bench_key()
            held = acquire(key)
            ours.send(key)
            _received(ours, name)  # it is about to wait
            time.sleep(SETTLE)
            released_at = time.monotonic()
            release(held)
            latencies.append((float(_received(ours, name)) - released_at) * 1000)
        ours.send(None)
        return statistics.median(latencies)
    finally:
        waiter.join(5)
        if waiter.is_alive():
            waiter.kill()
        registry.close()


def _received(connection: Connection, name: str, timeout: float = 60.0) -> Any:
    if not connection.poll(timeout):
        raise LockError(f"{name}: the waiting process did not answer within {timeout:g} s")
    message = connection.recv()
    if isinstance(message, str) and message.startswith("error: "):
        raise LockError(f"{name}: the waiting process failed: {message[7:]}")
    return message


def _waiting_process(config: str, name: str, connection: Connection) -> None:
    """The other process of a hand-off: wait for each key it is told, say when it got it."""
    registry = from_config(config)
    try:
        acquire, release = provider_ops(registry.backend(name), ttl=TTL)
        while (key := connection.recv()) is not None:
            connection.send("waiting")
            try:
                handle = acquire(key)
            except Exception as exc:  # the parent reports it
                connection.send(f"error: {type(exc).__name__}: {exc}")
                return
            connection.send(time.monotonic())
            release(handle)
    finally:
        registry.close()


class PlotUnavailable(Exception):
    """--plot was asked for and matplotlib cannot be imported."""


def figure_class() -> type[Figure]:
    """matplotlib's Figure, imported only when a plot is asked for: the library and the
    rest of the command run without it."""
    try:
        from matplotlib.figure import Figure  # noqa: PLC0415
    except ImportError as exc:
        raise PlotUnavailable(
            "--plot needs matplotlib, which is not installed; install the 'plot' extra: "
            "pip install 'fallback-locks[plot]'"
        ) from exc
    return Figure


def selected(registry: Registry, backends: str | None) -> list[str]:
    """The backends to measure, in configuration order, or as --backends lists them."""
    configured = list(registry)
    if backends is None:
        return configured
    names = list(dict.fromkeys(name.strip() for name in backends.split(",") if name.strip()))
    if not names:
        raise ValueError("--backends: no backend named")
    unknown = [name for name in names if name not in configured]
    if unknown:
        raise ValueError(
            f"--backends: unknown backend {unknown[0]!r} (configured: {', '.join(configured)})"
        )
    return names


def measure_all(
    registry: Registry, config: Path | None, names: list[str], cycles: int, samples: int
) -> list[Row]:
    """Figures for each backend that answers; the others are named on stderr."""
    rows = []
    for name in names:
        answer = probe(registry, name)
        if not answer.reachable:
            note(f"{name}: skipped, it did not answer a ping: {answer.error}")
            continue
        note(f"measuring {name} ...")
        provider = registry.backend(name)
        try:
            figures = measure_provider(provider, cycles=cycles, samples=samples, ttl=TTL)
            across = None
            if provider.capabilities.cross_process and config is not None:
                across = handoff_across_processes(config, name, samples)
        except LockError as exc:
            note(f"{name}: skipped, it stopped answering during the run: {exc}")
            continue
        rows.append(Row(name, answer.type, figures, across))
    return rows


def report(rows: list[Row]) -> str:
    headers = ["backend", "type", "cycles/s", "hand-off ms, threads", "hand-off ms, processes",
               "acquire p50 ms", "acquire p99 ms"]  # fmt: skip
    return table(
        headers,
        [
            [
                row.name,
                row.type,
                f"{row.figures.cycles_per_second:,.0f}",
                f"{row.figures.handoff_ms:.2f}",
                "-" if row.handoff_processes_ms is None else f"{row.handoff_processes_ms:.2f}",
                f"{row.figures.acquire.p50:.2f}",
                f"{row.figures.acquire.p99:.2f}",
            ]
            for row in rows
        ],
    )


def plot(rows: list[Row], path: Path, figure: type[Figure], title: str) -> None:
    """Two panels: cycles/s per backend; hand-off median and acquire p99 per backend."""
    labels = [f"{row.name} ({row.type})" for row in rows]
    positions = list(range(len(rows)))
    drawing = figure(figsize=(11, 1.8 + 0.5 * len(rows)), layout="constrained")
    rate_axes, latency_axes = drawing.subplots(1, 2, sharey=True)

    rates = [row.figures.cycles_per_second for row in rows]
    rate_axes.barh(positions, rates, color="C0")
    if max(rates) / min(rates) > 30:  # `local` next to a server: linear hides the servers
        rate_axes.set_xscale("log")
    rate_axes.set_yticks(positions, labels)
    rate_axes.invert_yaxis()
    rate_axes.set_xlabel("acquire + release, cycles/s (higher is better)")
    for position, rate in zip(positions, rates, strict=True):
        rate_axes.annotate(f" {rate:,.0f}", (rate, position), va="center", fontsize=8)
    if rate_axes.get_xscale() == "log":
        rate_axes.set_xlim(min(rates) / 3, max(rates) * 4)
    else:
        rate_axes.set_xlim(0, max(rates) * 1.2)

    height = 0.38
    handoffs = [row.figures.handoff_ms for row in rows]
    tails = [row.figures.acquire.p99 for row in rows]
    for offset, values, colour, label in (
        (-height / 2, handoffs, "C1", "hand-off, median"),
        (height / 2, tails, "C2", "acquire p99"),
    ):
        at = [p + offset for p in positions]
        latency_axes.barh(at, values, height=height, color=colour, label=label)
        for y, value in zip(at, values, strict=True):
            latency_axes.annotate(f" {value:.2f}", (value, y), va="center", fontsize=7)
    low, high = min(handoffs + tails), max(handoffs + tails)
    if high / max(low, 1e-6) > 10:  # a local wake-up (µs) next to a database poll (ms)
        latency_axes.set_xscale("log")
        latency_axes.set_xlim(max(low, 1e-3) / 3, high * 4)
        latency_axes.set_xlabel("ms, log scale (lower is better)")
    else:
        latency_axes.set_xlim(0, high * 1.25)
        latency_axes.set_xlabel("ms (lower is better)")
    latency_axes.legend(loc="lower right", fontsize=8)
    drawing.suptitle(title, fontsize=10)
    drawing.savefig(path, dpi=100)


def run(args: argparse.Namespace) -> int:
    figure = None
    if args.plot is not None:
        try:
            figure = figure_class()  # before measuring: fail in a second, not after a minute
        except PlotUnavailable as exc:
            note(f"locks bench: {exc}")
            return USAGE
    loaded = load(args.config)
    try:
        for line in loaded.notes:
            note(line)
        names = selected(loaded.registry, args.backends)
        rows = measure_all(loaded.registry, loaded.path, names, args.cycles, args.samples)
        if not rows:
            note(f"locks bench: no backend answered ({', '.join(names)}): nothing measured")
            return UNAVAILABLE
        print(
            f"config: {loaded.source}; {args.cycles} cycles, {args.samples} hand-offs, "
            f"ttl {TTL:g} s, keys bench:<uuid>"
        )
        print(report(rows))
        if figure is not None:
            plot(rows, args.plot, figure, f"locks bench ({loaded.source})")
            print(f"plot written to {args.plot}")
        return 0
    finally:
        loaded.registry.close()
