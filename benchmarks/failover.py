"""A chain redis-hash -> mariadb through a Redis crash and restart, acquire by acquire.

    python -m benchmarks.failover [--duration 20] [--kill-at 5] [--restart-at 12]
                                  [--rate 50] [--no-write]

Starts its own redis-server and MariaDB (durable: fsync per commit) on free loopback
ports. One client thread loops acquire + release of one key at a steady rate (a slot
every 1/rate s; a slot missed while an acquire stalls is skipped, not made up in a
burst). Redis is SIGKILLed at --kill-at and started again at --restart-at. Every
acquisition is recorded: when, which tier granted it, how long it took.

The chain has the library's defaults, what a configuration without tuning gets: mode
"fast", 3 tries 100 ms apart per tier, `Breaker(failures=1, reset_timeout=5.0)`. So
once Redis fails, the chain skips it at no cost and probes it once per reset_timeout
(each failed probe costs the retries, ~0.2 s); fail-back comes with the first probe
after the restart, up to reset_timeout + 0.2 s later. The MariaDB tier has been
pinged before the loop (its pool is open), as in a process that has used it before.

Writes docs/img/failover.png (which tier served each acquire, and its latency, over
time) and appends a summary to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from benchmarks.harness import publish
from benchmarks.plots import Acquisition, draw_failover, image_link
from locks import Breaker, FallbackChain
from locks.backends import DatabaseProvider, RedisHashProvider
from locks.measure import bench_key, percentiles, provider_ops, warm_up
from tests.servers import MariaDBServer, RedisServer

TITLE = "FallbackChain redis-hash -> mariadb through a Redis crash and restart"
TIERS = ("redis", "mariadb")


def loop(
    chain: FallbackChain, key: str, started: float, duration: float, rate: float
) -> list[Acquisition]:
    """Acquire + release `key` once per slot of 1/rate s until `duration` has passed."""
    period = 1 / rate
    acquisitions = []
    next_slot = started
    while (now := time.perf_counter()) - started < duration:
        if next_slot > now:
            time.sleep(next_slot - now)
        called = time.perf_counter()
        try:
            lease = chain.acquire(key, ttl=30, wait=5)
        except Exception:  # AllBackendsUnavailable, or worse: plotted as "failed"
            lease = None
        took = time.perf_counter() - called
        acquisitions.append(
            Acquisition(called - started, None if lease is None else lease.backend, took * 1000)
        )
        if lease is not None:
            chain.release(lease)
        next_slot = max(next_slot + period, time.perf_counter())  # skip missed slots
    return acquisitions


class Run:
    """The loop in a thread of its own; the main thread kills and restarts Redis."""

    def __init__(self, chain: FallbackChain, duration: float, rate: float) -> None:
        self.started = time.perf_counter()
        self.acquisitions: list[Acquisition] = []
        self._thread = threading.Thread(
            target=self._run, args=(chain, duration, rate), name="failover-loop"
        )
        self._thread.start()

    def _run(self, chain: FallbackChain, duration: float, rate: float) -> None:
        self.acquisitions = loop(chain, bench_key(), self.started, duration, rate)

    def at(self, offset: float) -> float:
        """Sleep until `offset` s after the start; return the actual offset."""
        time.sleep(max(0.0, self.started + offset - time.perf_counter()))
        return self.elapsed()

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def join(self) -> list[Acquisition]:
        self._thread.join()
        return self.acquisitions


def first_grant(acquisitions: Sequence[Acquisition], backend: str, after: float) -> float | None:
    return next(
        (a.granted_at for a in acquisitions if a.backend == backend and a.granted_at > after),
        None,
    )


def longest_gap(acquisitions: Sequence[Acquisition]) -> tuple[float, float]:
    """The longest time between two consecutive grants, and when it began."""
    grants = [a.granted_at for a in acquisitions if a.backend is not None]
    gaps = [(b - a, a) for a, b in itertools.pairwise(grants)]
    return max(gaps, default=(0.0, 0.0))


def summary(
    acquisitions: Sequence[Acquisition], killed: float, restarted: float, ready: float, rate: float
) -> str:
    """Two small Markdown tables: per tier, and the moments that matter."""
    counts = Counter(a.backend or "failed" for a in acquisitions)
    lines = [
        "| served by | acquisitions | latency p50 ms | latency p99 ms |",
        "|---|---:|---:|---:|",
    ]
    for tier in (*TIERS, "failed"):
        latencies = [a.latency_ms for a in acquisitions if (a.backend or "failed") == tier]
        if not latencies and tier == "failed":
            continue
        if latencies:
            tail = percentiles(latencies)
            lines.append(f"| {tier} | {len(latencies)} | {tail.p50:.2f} | {tail.p99:.2f} |")
        else:
            lines.append(f"| {tier} | 0 | — | — |")

    def ms(value: float | None) -> str:
        return "never" if value is None else f"{value * 1000:,.0f}"

    on_db = first_grant(acquisitions, "mariadb", killed)
    back = first_grant(acquisitions, "redis", restarted)
    gap, gap_at = longest_gap(acquisitions)
    lines += [
        "",
        "| moment | ms |",
        "|---|---:|",
        f"| failover: Redis killed at {killed:.1f} s -> first mariadb grant "
        f"| {ms(None if on_db is None else on_db - killed)} |",
        f"| longest gap without a grant (from {gap_at:.1f} s) | {ms(gap)} |",
        f"| fail-back: Redis restarted at {restarted:.1f} s -> first redis grant "
        f"| {ms(None if back is None else back - restarted)} |",
        f"| of which redis-server start (until it answers PING) | {ms(ready - restarted)} |",
    ]
    reset = Breaker().reset_timeout
    lines += [
        "",
        f"{sum(counts.values())} acquisitions of one key by one client thread at {rate:g}/s. "
        "The chain has the library defaults (mode fast, 3 tries 100 ms apart, "
        f"`Breaker(failures=1, reset_timeout={reset:g})`): while Redis is down, one acquire "
        f"every {reset:g} s probes it and stalls for the retries (~0.2 s), and fail-back "
        "waits for the first probe after the restart.",
    ]
    return "\n".join(lines)


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=20.0, help="s of looping")
    parser.add_argument("--kill-at", type=float, default=5.0, help="s: SIGKILL Redis")
    parser.add_argument("--restart-at", type=float, default=12.0, help="s: start Redis again")
    parser.add_argument("--rate", type=float, default=50.0, help="acquisitions per second")
    parser.add_argument(
        "--no-write", action="store_true", help="do not append to docs/ or draw docs/img/"
    )
    args = parser.parse_args(argv)
    if not 0 < args.kill_at < args.restart_at < args.duration or args.rate <= 0:
        parser.error("need 0 < --kill-at < --restart-at < --duration and --rate > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    with tempfile.TemporaryDirectory(prefix="locks-bench-") as workdir:
        (Path(workdir) / "redis").mkdir()
        (Path(workdir) / "mariadb").mkdir()
        redis_server = RedisServer(Path(workdir) / "redis")
        mariadb = MariaDBServer(Path(workdir) / "mariadb", durable=True)
        try:
            redis_server.start()
            mariadb.start()
            redis_tier = RedisHashProvider(redis_server.url, name="redis")
            db_tier = DatabaseProvider(mariadb.url, name="mariadb")
            chain = FallbackChain([redis_tier, db_tier], name="failover")
            try:
                # the tier's pool is open and its table made, as in a process that has
                # used it before
                warm_up(*provider_ops(db_tier), bench_key(), cycles=5)
                run = Run(chain, args.duration, args.rate)
                killed = run.at(args.kill_at)
                redis_server.kill()
                print(f"  Redis killed at {killed:.2f} s", flush=True)
                restarted = run.at(args.restart_at)
                redis_server.start()
                ready = run.elapsed()
                print(f"  Redis restarted at {restarted:.2f} s, answering at {ready:.2f} s")
                acquisitions = run.join()
            finally:
                chain.close()
                redis_tier.close()
                db_tier.close()
        finally:
            redis_server.stop()
            mariadb.stop()
    body = summary(acquisitions, killed, restarted, ready, args.rate)
    if not args.no_write:
        try:
            image = draw_failover(
                f"{TITLE}: {len(acquisitions)} acquisitions at {args.rate:g}/s",
                acquisitions,
                TIERS,
                [(killed, "Redis killed"), (restarted, "Redis restarted")],
            )
        except ImportError as exc:  # the summary is worth keeping without its plot
            print(f"no plot drawn ({exc}): pip install -e '.[plot]'", file=sys.stderr)
        else:
            print(f"drew {image}")
            body = f"{body}\n\n{image_link(TITLE, image)}"
    publish(TITLE, "benchmarks.failover", argv, body, not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
