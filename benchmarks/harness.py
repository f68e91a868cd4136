"""Measuring locks side by side in one run: uncontended cycles/s and hand-off latency.

Every contender is a `Contender`: a way to acquire (blocking or one try) and release a
named lock. Ratios between contenders of one run are what we report; absolute figures
move with the machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from locks.provider import LockProvider
from tests.servers import ServerProcess

Acquire = Callable[[str], Any]  # blocks until held, returns a handle
Release = Callable[[Any], None]


@dataclass
class Contender:
    name: str
    acquire: Acquire
    release: Release
    close: Callable[[], None] = lambda: None


@dataclass
class Result:
    name: str
    cycles_per_second: float
    handoff_ms: float | None


def cycle_rate(contender: Contender, key: str, cycles: int) -> float:
    """Acquire+release cycles per second on one uncontended key."""
    started = time.perf_counter()
    for _ in range(cycles):
        contender.release(contender.acquire(key))
    return cycles / (time.perf_counter() - started)


def handoff_ms(contender: Contender, samples: int) -> float:
    """Median time from the holder's release call to the waiter's acquire returning."""
    latencies = []
    for _ in range(samples):
        key = f"bench:{uuid.uuid4().hex}"
        held = contender.acquire(key)
        acquired_at: list[float] = []

        def wait(key: str = key, acquired_at: list[float] = acquired_at) -> None:
            handle = contender.acquire(key)
            acquired_at.append(time.perf_counter())
            contender.release(handle)

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.05)  # let the waiter settle into its wait
        released_at = time.perf_counter()
        contender.release(held)
        waiter.join(30)
        if not acquired_at:
            raise RuntimeError(f"{contender.name}: the waiter never acquired")
        latencies.append((acquired_at[0] - released_at) * 1000)
    return statistics.median(latencies)


def measure(contenders: list[Contender], cycles: int, rounds: int, samples: int) -> list[Result]:
    """Medians per contender. Rounds are interleaved (each round runs every contender
    once), so a machine that slows down mid-run slows everyone alike."""
    keys = {c.name: f"bench:{uuid.uuid4().hex}" for c in contenders}
    rates: dict[str, list[float]] = {c.name: [] for c in contenders}
    try:
        for contender in contenders:
            cycle_rate(contender, keys[contender.name], 50)  # warm connections and scripts
        for _ in range(rounds):
            for contender in contenders:
                rates[contender.name].append(cycle_rate(contender, keys[contender.name], cycles))
        results = []
        for contender in contenders:
            handoff = handoff_ms(contender, samples) if samples else None
            rate = statistics.median(rates[contender.name])
            results.append(Result(contender.name, rate, handoff))
            print(f"  {contender.name}: {rate:,.0f} cycles/s, hand-off {handoff} ms", flush=True)
    finally:
        for contender in contenders:
            contender.close()
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


def append_report(title: str, command: str, body: str) -> Path:
    """Append a dated section to docs/benchmarks.md."""
    path = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
    if not path.exists():
        path.write_text("# Benchmarks\n\nRatios within one run are the figures to read.\n")
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with path.open("a") as out:
        out.write(f"\n## {title} ({stamp})\n\n`{command}`\n\n{body}\n")
    return path


def provider_contender(provider: LockProvider, label: str, *tiers: LockProvider) -> Contender:
    """One of ours as a contender (ttl=30, wait=30); `tiers` are closed with it, since a
    chain closes none of its own."""

    def acquire(key: str) -> Any:
        return provider.acquire(key, ttl=30, wait=30)

    def close() -> None:
        provider.close()
        for tier in tiers:
            tier.close()

    return Contender(label, acquire, provider.release, close)


def arguments(description: str | None, argv: list[str] | None, repetitions: bool = False) -> Any:
    """The options every benchmark takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--samples", type=int, default=20)
    if repetitions:
        parser.add_argument("--repetitions", type=int, default=5, help="outages to time")
    parser.add_argument("--no-write", action="store_true", help="do not append to docs/")
    return parser.parse_args(argv)


def publish(title: str, module: str, argv: list[str] | None, body: str, write: bool) -> None:
    """Print a report and, unless told not to, append it to docs/ with its command."""
    print(body)
    if write:
        command = f"python -m {module} " + " ".join(argv if argv is not None else sys.argv[1:])
        print(f"appended to {append_report(title, command.strip(), body)}")


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
