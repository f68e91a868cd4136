"""Plots for docs/: one PNG per benchmark, drawn from the run that wrote its table.

`harness.publish` draws docs/img/<X>.png after every `python -m benchmarks.X` run that
writes to docs/, and links it under the new section of docs/benchmarks.md; an image
shows only its latest run, so links to it from earlier sections are dropped.

    python -m benchmarks.plots [NAME ...]

draws the images again from the tables already in docs/benchmarks.md (the newest
section of each benchmark; all that have one if no NAME is given) and links each from
its section: for a table written by a run that drew no image, and to redraw after a
change to the plots. Failover timelines need the run's raw samples: only
`python -m benchmarks.failover` draws those. `benchmarks.topologies` and
`benchmarks.quorum`, and since they report more than a contender table holds,
`benchmarks.database`, `benchmarks.postgresql` and `benchmarks.aio`, keep their raw
results in docs/img/<X>.json, and their images are redrawn from those files.

matplotlib is imported inside the drawing functions only.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

from benchmarks.harness import DOCS, REPORT, Result

if TYPE_CHECKING:
    from matplotlib.figure import Figure

IMAGES = DOCS / "img"
OURS_COLOUR = "#1f77b4"
PEER_COLOUR = "#9a9a9a"
# benchmarks whose every contender is fallback-locks (bare next to a chain)
ALL_OURS = {"chain"}
# benchmarks.topologies' raw results, written by its run, read to redraw its image
TOPOLOGIES_RESULTS = IMAGES / "topologies.json"
# benchmarks.quorum's raw results, likewise
QUORUM_RESULTS = IMAGES / "quorum.json"
# benchmarks.database's and benchmarks.postgresql's, likewise
DATABASE_RESULTS = {name: IMAGES / f"{name}.json" for name in ("database", "postgresql")}
# benchmarks.aio's, likewise
AIO_RESULTS = IMAGES / "aio.json"

_LINK = re.compile(r"^!\[[^\]]*\]\((img/[^)\s]+\.png)\)\s*$")
_SECTION = re.compile(r"^## (?P<title>.+) \((?P<stamp>\d{4}-\d\d-\d\d \d\d:\d\d UTC)\)\s*$")
_COMMAND = re.compile(r"^`python -m benchmarks\.(?P<name>\w+)\b")


def image_link(title: str, image: Path) -> str:
    """A Markdown image line, relative to docs/ (where benchmarks.md lives)."""
    return f"![{title}](img/{image.name})"


def _figure(width: float, height: float) -> Figure:
    """A figure without pyplot: no GUI backend, no global state; PNG through Agg."""
    from matplotlib.figure import Figure  # noqa: PLC0415  # matplotlib stays optional

    return Figure(figsize=(width, height), layout="constrained")


def _save(figure: Figure, title: str, path: Path, peers: str | None = None) -> Path:
    """Title `figure`, save it at `path`; `peers` names the peers' colour in a legend
    beside ours (none when every bar is ours, or none is)."""
    if peers is not None:
        from matplotlib.patches import Patch  # noqa: PLC0415

        figure.legend(
            handles=[Patch(color=OURS_COLOUR), Patch(color=PEER_COLOUR)],
            labels=["fallback-locks", peers],
            loc="outside lower center",
            ncols=2,
            fontsize=8,
        )
    figure.suptitle(title, fontsize=10)
    figure.savefig(path, dpi=100)
    return path


def draw_results(name: str, title: str, results: Sequence[Result]) -> Path:
    """docs/img/<name>.png: cycles/s and hand-off median per contender, ours in colour."""
    IMAGES.mkdir(parents=True, exist_ok=True)
    names = [r.name for r in results]
    colours = [OURS_COLOUR if r.ours else PEER_COLOUR for r in results]
    rows = list(range(len(results)))
    figure = _figure(11, 1.6 + 0.42 * len(results))
    rate_axes, handoff_axes = figure.subplots(1, 2, sharey=True)

    rates = [r.cycles_per_second for r in results]
    rate_axes.barh(rows, rates, color=colours)  # linear: bar lengths are the ratios
    rate_axes.set_yticks(rows, names)
    rate_axes.invert_yaxis()  # the table's order, top to bottom
    rate_axes.set_xlabel("uncontended acquire + release, cycles/s (higher is better)")
    for row, rate in zip(rows, rates, strict=True):
        rate_axes.annotate(f" {rate:,.0f}", (rate, row), va="center", fontsize=8)
    rate_axes.set_xlim(right=max(rates) * 1.18)

    handoffs = [r.handoff_ms for r in results]
    shown = [h for h in handoffs if h is not None]
    handoff_axes.barh(rows, [h or 0 for h in handoffs], color=colours)
    low, high = min(shown, default=1.0), max(shown, default=1.0)
    if high / low > 10:  # a wake-up (< 1 ms) next to a poll (~50 ms or more)
        handoff_axes.set_xscale("log")
        handoff_axes.set_xlabel("hand-off, median ms, log scale (lower is better)")
        low /= 3
        handoff_axes.set_xlim(low, high * 4)
    else:
        handoff_axes.set_xlabel("hand-off, median ms (lower is better)")
        low = 0
        handoff_axes.set_xlim(0, high * 1.25)
    for row, handoff in zip(rows, handoffs, strict=True):
        label = " — (waits by spinning)" if handoff is None else f" {handoff:.2f} ms"
        handoff_axes.annotate(label, (handoff or low, row), va="center", fontsize=8)

    mixed = any(r.ours for r in results) and not all(r.ours for r in results)
    return _save(figure, title, IMAGES / f"{name}.png", "peer library" if mixed else None)


@dataclass
class Acquisition:
    """One acquire of the failover loop: when it was called (s since the start),
    which tier granted it (None: it failed), and how long it took."""

    at: float
    backend: str | None
    latency_ms: float

    @property
    def granted_at(self) -> float:
        return self.at + self.latency_ms / 1000


def draw_failover(
    title: str,
    acquisitions: Sequence[Acquisition],
    tiers: Sequence[str],
    events: Sequence[tuple[float, str]],
    path: Path | None = None,
) -> Path:
    """docs/img/failover.png: which tier served each acquire over time (top) and its
    latency (bottom), with the kill and restart marked on both."""
    path = path or IMAGES / "failover.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    figure = _figure(11, 6)
    served_axes, latency_axes = figure.subplots(
        2, 1, sharex=True, gridspec_kw={"height_ratios": [1, 2]}
    )
    levels = list(reversed(tiers))  # the first tier on top
    if any(a.backend is None for a in acquisitions):
        levels.insert(0, "failed")
    colours = {tier: f"C{i}" for i, tier in enumerate(tiers)} | {"failed": "#d62728"}
    for level in levels:
        mine = [a for a in acquisitions if (a.backend or "failed") == level]
        y = levels.index(level)
        served_axes.scatter(
            [a.granted_at for a in mine], [y] * len(mine), marker="|", s=60,
            color=colours[level], linewidths=0.8,
        )  # fmt: skip
        latency_axes.scatter(
            [a.granted_at for a in mine], [a.latency_ms for a in mine], s=6,
            color=colours[level], label=f"{level} ({len(mine)})",
        )  # fmt: skip
    served_axes.set_yticks(range(len(levels)), levels)
    served_axes.set_ylim(-0.6, len(levels) - 0.4)
    served_axes.set_ylabel("served by")
    latency_axes.set_yscale("log")
    latency_axes.set_ylabel("acquire latency, ms (log)")
    latency_axes.set_xlabel("time since the loop started, s (each mark at the grant)")
    latency_axes.legend(loc="upper right", fontsize=8, title="acquisitions", title_fontsize=8)
    for at, label in events:
        for axes in (served_axes, latency_axes):
            axes.axvline(at, color="#d62728", linestyle="--", linewidth=1)
        served_axes.annotate(
            f" {label}", (at, len(levels) - 0.45), va="top", fontsize=8, color="#d62728"
        )
    for axes in (served_axes, latency_axes):
        axes.grid(axis="x", alpha=0.3)
    return _save(figure, title, path)


class CycleRow(TypedDict):
    """One contender of `benchmarks.topologies`: medians of its run."""

    topology: str  # "Sentinel" or "Cluster"
    lock: str  # "redis-py Lock", "fallback-locks redis", "fallback-locks redis-hash"
    sync_replicas: int
    ours: bool
    cycles_per_second: float
    handoff_ms: float | None


class FailoverRow(TypedDict):
    """One topology's failovers: SIGKILL of the primary -> the client's first grant."""

    topology: str
    times_ms: list[float | None]  # per repetition; None: never granted
    median_ms: float | None
    promoted_ms: list[float]  # SIGKILL -> the topology itself names a new primary
    attempts: list[int]  # acquires the client made until its grant, per repetition
    unavailable: dict[str, int]  # BackendUnavailable raised, by the driver error under it
    ambiguous: int  # of those, raised when the acquire may have reached a server
    refused: int  # acquire(wait=0) of a fresh name answered None
    other_errors: list[str]  # anything else raised: a library bug


class TopologyResults(TypedDict):
    """docs/img/topologies.json."""

    title: str
    stamp: str
    command: str
    seconds: float
    settings: dict[str, Any]
    cycles: list[CycleRow]
    failovers: list[FailoverRow]


def _variant(row: CycleRow) -> str:
    lock = row["lock"].removeprefix("fallback-locks ")
    return f"{lock}, sync_replicas={row['sync_replicas']}" if row["sync_replicas"] else lock


def draw_topologies(
    title: str,
    cycles: Sequence[CycleRow],
    failovers: Sequence[FailoverRow],
    path: Path | None = None,
) -> Path:
    """docs/img/topologies.png: cycles/s per topology, one bar per contender (left), and
    each topology's failover times as a client saw them (right)."""
    path = path or IMAGES / "topologies.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    topologies = list(dict.fromkeys(r["topology"] for r in cycles))
    variants = list(dict.fromkeys(_variant(r) for r in cycles))
    figure = _figure(12, 5)
    rate_axes, failover_axes = figure.subplots(1, 2, gridspec_kw={"width_ratios": [2.2, 1]})

    width = 0.8 / len(variants)
    top = max(r["cycles_per_second"] for r in cycles)
    for index, variant in enumerate(variants):
        rows = [r for r in cycles if _variant(r) == variant]
        xs = [topologies.index(r["topology"]) + (index - (len(variants) - 1) / 2) * width
              for r in rows]  # fmt: skip
        rates = [r["cycles_per_second"] for r in rows]
        ours, synced = rows[0]["ours"], rows[0]["sync_replicas"] > 0
        rate_axes.bar(
            xs, rates, width * 0.92, label=variant if ours else f"{variant} (peer)",
            color=OURS_COLOUR if ours else PEER_COLOUR, alpha=0.55 if synced else 1.0,
            hatch="//" if synced else None, edgecolor="white" if synced else None,
        )  # fmt: skip
        for x, rate in zip(xs, rates, strict=True):
            rate_axes.annotate(
                f"{rate:,.0f}", (x, rate), ha="center", va="bottom", fontsize=7,
                xytext=(0, 2), textcoords="offset points",
            )  # fmt: skip
    rate_axes.set_xticks(range(len(topologies)), topologies)
    rate_axes.set_ylim(0, top * 1.15)
    rate_axes.set_ylabel("uncontended acquire + release, cycles/s (higher is better)")
    rate_axes.legend(loc="upper center", ncols=3, fontsize=7)
    rate_axes.grid(axis="y", alpha=0.3)

    names = [f["topology"] for f in failovers]
    for index, outage in enumerate(failovers):
        done = [t for t in outage["times_ms"] if t is not None]
        if done:
            median = statistics.median(done)
            failover_axes.bar(index, median, 0.6, color=OURS_COLOUR, alpha=0.35)
            failover_axes.annotate(
                f"median\n{median:,.0f} ms", (index, median / 2), ha="center", va="center",
                fontsize=8,
            )  # fmt: skip
        else:
            failover_axes.annotate("never granted", (index, 0), ha="center", fontsize=8)
        failover_axes.scatter(
            [index - 0.08] * len(done), done, s=14, color=OURS_COLOUR, zorder=3,
            label="SIGKILL -> client's first grant" if index == 0 else None,
        )  # fmt: skip
        failover_axes.scatter(
            [index + 0.08] * len(outage["promoted_ms"]), outage["promoted_ms"], s=16,
            marker="x", color="#555555", zorder=3,
            label="SIGKILL -> topology names a new primary" if index == 0 else None,
        )  # fmt: skip
    failover_axes.set_xticks(range(len(names)), names)
    failover_axes.set_xlim(-0.6, len(names) - 0.4)
    highest = max((t for f in failovers for t in [*f["times_ms"], *f["promoted_ms"]] if t),
                  default=1.0)  # fmt: skip
    failover_axes.set_ylim(0, highest * 1.3)
    failover_axes.set_ylabel("failover, ms (each repetition a mark)")
    failover_axes.legend(loc="upper center", fontsize=7)
    failover_axes.grid(axis="y", alpha=0.3)
    return _save(figure, title, path)


def _results(path: Path, module: str) -> Any:
    """A benchmark's raw results, or an exit naming the command that writes them."""
    if not path.exists():
        raise SystemExit(f"no {path}: run python -m benchmarks.{module}")
    return json.loads(path.read_text())


def load_topologies(results: Path = TOPOLOGIES_RESULTS) -> TopologyResults:
    return cast(TopologyResults, _results(results, "topologies"))


class QuorumRow(TypedDict):
    """One contender of `benchmarks.quorum`: medians and percentiles of its run."""

    group: str  # "3 masters", "5 masters", "one member", "mixed"
    name: str  # unique in the run
    ours: bool
    cycles_per_second: float  # median over the rounds
    acquire_p50_ms: float  # over every round's one-try acquires
    acquire_p99_ms: float
    acquire_samples: int
    refused: int  # one-try acquires of the uncontended key that were refused
    handoff_ms: float | None  # median; None: --samples 0


class QuorumResults(TypedDict):
    """docs/img/quorum.json."""

    title: str
    stamp: str
    command: str
    seconds: float
    settings: dict[str, Any]
    rows: list[QuorumRow]
    mixed_note: str | None  # why the mixed quorum was not measured, if it was not


def _bar_scale(axes: Any, values: Sequence[float], label: str) -> float:
    """Log scale when the bars span more than 10x (a 0.1 ms round trip next to a
    100 ms poll), else linear from 0. Returns the axis' left end, where bars start."""
    low, high = min(values, default=1.0), max(values, default=1.0)
    if low > 0 and high / low > 10:
        axes.set_xscale("log")
        axes.set_xlabel(f"{label}\nlog scale (lower is better)")
        axes.set_xlim(low / 3, high * 6)
        return low / 3
    axes.set_xlabel(f"{label}\n(lower is better)")
    axes.set_xlim(0, high * 1.3)
    return 0.0


def draw_quorum(title: str, rows: Sequence[QuorumRow], path: Path | None = None) -> Path:
    """docs/img/quorum.png: per contender, cycles/s (left), acquire p50 with its p99
    marked (middle) and hand-off (right); ours in colour, pottery in grey."""
    path = path or IMAGES / "quorum.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    names = [f"{r['group']}: {r['name']}" for r in rows]
    colours = [OURS_COLOUR if r["ours"] else PEER_COLOUR for r in rows]
    ys = list(range(len(rows)))
    figure = _figure(15, 2.0 + 0.42 * len(rows))
    rate_axes, latency_axes, handoff_axes = figure.subplots(
        1, 3, sharey=True, gridspec_kw={"width_ratios": [1.2, 1, 1]}
    )

    rates = [r["cycles_per_second"] for r in rows]
    rate_axes.barh(ys, rates, color=colours)  # linear: bar lengths are the ratios
    rate_axes.set_yticks(ys, names)
    rate_axes.invert_yaxis()  # the table's order, top to bottom
    rate_axes.set_xlabel("uncontended acquire + release, cycles/s\n(higher is better)")
    for y, rate in zip(ys, rates, strict=True):
        rate_axes.annotate(f" {rate:,.0f}", (rate, y), va="center", fontsize=8)
    rate_axes.set_xlim(right=max(rates, default=1.0) * 1.25)

    p50s, p99s = [r["acquire_p50_ms"] for r in rows], [r["acquire_p99_ms"] for r in rows]
    low = _bar_scale(latency_axes, [*p50s, *p99s], "acquire ms: p50 bar, p99 mark")
    latency_axes.barh(ys, [p50 - low for p50 in p50s], left=low, color=colours)
    latency_axes.scatter(p99s, ys, marker="|", s=120, color="#d62728", zorder=3)
    for y, p50, p99 in zip(ys, p50s, p99s, strict=True):
        latency_axes.annotate(f" {p50:.2f} / {p99:.2f}", (p99, y), va="center", fontsize=8)

    handoffs = [r["handoff_ms"] for r in rows]
    low = _bar_scale(handoff_axes, [h for h in handoffs if h is not None], "hand-off, median ms")
    handoff_axes.barh(ys, [(h or low) - low for h in handoffs], left=low, color=colours)
    for y, handoff in zip(ys, handoffs, strict=True):
        label = " — (not measured)" if handoff is None else f" {handoff:.2f} ms"
        handoff_axes.annotate(label, (handoff or low, y), va="center", fontsize=8)

    return _save(figure, title, path, "pottery Redlock (peer)")


def load_quorum(results: Path = QUORUM_RESULTS) -> QuorumResults:
    return cast(QuorumResults, _results(results, "quorum"))


class DatabaseRow(TypedDict):
    """One contender of `benchmarks.database` or `benchmarks.postgresql`; None (or
    empty) where it was not measured."""

    name: str
    ours: bool
    cycles_per_second: float | None  # uncontended, the median round
    handoff_ms: float | None  # between two threads of one process, median
    process_handoffs_ms: list[float]  # to a waiter in another process, every sample
    contended_grants_per_second: float | None  # N threads of one process on one key
    contended_p50_ms: float | None  # their acquires, from call to return
    contended_p99_ms: float | None
    waiting_queries_per_second: dict[str, float]  # by waiting threads ("1", "8")
    waiting_by_counter: dict[str, dict[str, float]]  # the same, per server counter
    waiting_connections: dict[str, int]  # server connections the waiting process held


class DatabaseResults(TypedDict):
    """docs/img/database.json, docs/img/postgresql.json."""

    title: str
    stamp: str
    command: str
    seconds: float
    settings: dict[str, Any]
    rows: list[DatabaseRow]


def median_p90(samples: Sequence[float]) -> tuple[float, float]:
    """The median and the 90th percentile (linear between order statistics)."""
    if len(samples) == 1:
        return samples[0], samples[0]
    return statistics.median(samples), statistics.quantiles(samples, n=10, method="inclusive")[8]


def load_database(name: str) -> DatabaseResults:
    return cast(DatabaseResults, _results(DATABASE_RESULTS[name], name))


def draw_database(
    name: str, title: str, rows: Sequence[DatabaseRow], path: Path | None = None
) -> Path:
    """docs/img/<name>.png: per contender, uncontended cycles/s; hand-off to another
    process (median bar, p90 mark); and, where measured, N threads on one key (grants/s,
    p99 noted) and the queries/s a waiting process sends (one bar per crowd)."""
    path = path or IMAGES / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    colours = [OURS_COLOUR if r["ours"] else PEER_COLOUR for r in rows]
    panels = [_cycles_panel, _handoff_panel]
    if any(r["contended_grants_per_second"] is not None for r in rows):
        panels.append(_contended_panel)
    if any(r["waiting_queries_per_second"] for r in rows):
        panels.append(_waiting_panel)
    figure = _figure(4.2 * len(panels) + 2.5, 2.0 + 0.5 * len(rows))
    axes_row = figure.subplots(1, len(panels), sharey=True)
    ys = list(range(len(rows)))
    axes_row[0].set_yticks(ys, [r["name"] for r in rows])
    axes_row[0].invert_yaxis()  # the table's order, top to bottom
    for panel, axes in zip(panels, axes_row, strict=True):
        panel(axes, rows, colours)
        axes.grid(axis="x", alpha=0.3)

    mixed = any(r["ours"] for r in rows) and not all(r["ours"] for r in rows)
    return _save(figure, title, path, "peer library or bare driver" if mixed else None)


def _not_measured(axes: Any, values: Sequence[object], at: float) -> None:
    for y, value in enumerate(values):
        if value is None:
            axes.annotate(" — (not measured)", (at, y), va="center", fontsize=8)


def _cycles_panel(axes: Any, rows: Sequence[DatabaseRow], colours: Sequence[str]) -> None:
    rates = [r["cycles_per_second"] for r in rows]
    axes.barh(range(len(rows)), [rate or 0 for rate in rates], color=colours)  # linear: ratios
    for y, rate in enumerate(rates):
        if rate is not None:
            axes.annotate(f" {rate:,.0f}", (rate, y), va="center", fontsize=8)
    _not_measured(axes, rates, 0)
    axes.set_xlim(0, max((r for r in rates if r), default=1.0) * 1.3)
    axes.set_xlabel("uncontended acquire + release, cycles/s\n(higher is better)")


def _handoff_panel(axes: Any, rows: Sequence[DatabaseRow], colours: Sequence[str]) -> None:
    spreads = [median_p90(r["process_handoffs_ms"]) if r["process_handoffs_ms"] else None
               for r in rows]  # fmt: skip
    shown = [value for spread in spreads if spread for value in spread]
    low = _bar_scale(axes, shown, "hand-off to another process, ms:\nmedian bar, p90 mark")
    for y, (spread, colour) in enumerate(zip(spreads, colours, strict=True)):
        if spread is not None:
            median, p90 = spread
            axes.barh(y, median - low, left=low, color=colour)
            axes.scatter([p90], [y], marker="|", s=120, color="#d62728", zorder=3)
            axes.annotate(f" {median:.2f} / {p90:.2f}", (p90, y), va="center", fontsize=8)
    _not_measured(axes, spreads, low)


def _contended_panel(axes: Any, rows: Sequence[DatabaseRow], colours: Sequence[str]) -> None:
    grants = [r["contended_grants_per_second"] for r in rows]
    axes.barh(range(len(rows)), [g or 0 for g in grants], color=colours)
    for y, r in enumerate(rows):
        rate = r["contended_grants_per_second"]
        if rate is not None:
            p99 = r["contended_p99_ms"] or 0.0
            axes.annotate(f" {rate:,.0f}/s, p99 {p99:.1f} ms", (rate, y), va="center",
                          fontsize=8)  # fmt: skip
    _not_measured(axes, grants, 0)
    axes.set_xlim(0, max((g for g in grants if g), default=1.0) * 1.7)
    axes.set_xlabel("8 threads of one process on one key, grants/s\n"
                    "(higher is better; acquire p99 noted)")  # fmt: skip


def _waiting_panel(axes: Any, rows: Sequence[DatabaseRow], colours: Sequence[str]) -> None:
    crowds = sorted({c for r in rows for c in r["waiting_queries_per_second"]}, key=int)
    height = 0.8 / len(crowds)
    top = max((q for r in rows for q in r["waiting_queries_per_second"].values()), default=1.0)
    for index, crowd in enumerate(crowds):
        offset = (index - (len(crowds) - 1) / 2) * height
        for y, (r, colour) in enumerate(zip(rows, colours, strict=True)):
            qps = r["waiting_queries_per_second"].get(crowd)
            if qps is not None:
                axes.barh(y + offset, qps, height * 0.9, color=colour,
                          alpha=1.0 if index == 0 else 0.55)  # fmt: skip
                axes.annotate(f" {qps:.1f} ({crowd} waiting)", (qps, y + offset),
                              va="center", fontsize=7)  # fmt: skip
    _not_measured(axes, [r["waiting_queries_per_second"] or None for r in rows], 0)
    axes.set_xlim(0, max(top, 1.0) * 1.7)
    axes.set_xlabel("statements/s from one waiting process\n"
                    "(INSERT+UPDATE+DELETE+SELECT; lower is better)")  # fmt: skip


class AioRow(TypedDict):
    """One contender of `benchmarks.aio`, uncontended: cycles/s and hand-off."""

    name: str
    ours: bool
    cycles_per_second: float  # the median round
    rounds: list[float]
    handoff_ms: float | None  # median; None: not timed
    handoff_p99_ms: float | None
    handoff_samples: int
    note: str | None  # how it waits


class AioCrowd(TypedDict):
    """One crowd of `benchmarks.aio`: workers looping acquire + release over keys."""

    library: str
    ours: bool
    mode: str  # "tasks" (of one loop) or "threads"
    workers: int
    keys: int
    wait_s: float
    seconds: float
    grants: int
    grants_per_second: float
    p50_ms: float | None  # acquire, from call to return
    p99_ms: float | None
    max_ms: float | None
    drain_s: float
    timeouts: int
    errors: int
    error: str | None
    cancelled: int
    note: str | None


class AioResults(TypedDict):
    """docs/img/aio.json: the record `benchmarks.aio` writes, with its section's title,
    stamp and command."""

    benchmark: str
    title: str
    stamp: str
    command: str
    utc: str
    cpus: int | None
    python: str
    seconds: float
    arguments: dict[str, Any]
    settings: dict[str, Any]
    ratios: list[dict[str, Any]]
    uncontended: list[AioRow]
    crowds: list[AioCrowd]


def load_aio(results: Path | None = None) -> AioResults:
    return cast(AioResults, _results(results or AIO_RESULTS, "aio"))


def draw_aio(results: AioResults, path: Path | None = None) -> Path:
    """docs/img/aio.png: per contender, uncontended cycles/s and hand-off (median bar,
    p99 mark) on top; per crowd, grants/s and acquire p99 (p50 marked) below; ours in
    colour, the peers in grey."""
    path = path or IMAGES / "aio.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    rows, crowds = results["uncontended"], results["crowds"]
    figure = _figure(14, 3.2 + 0.45 * (len(rows) + len(crowds)))
    (rate_axes, handoff_axes), (grant_axes, p99_axes) = figure.subplots(
        2, 2, sharey="row",
        gridspec_kw={"height_ratios": [max(len(rows), 1), max(len(crowds), 1)],
                     "width_ratios": [1.15, 1]},
    )  # fmt: skip
    _aio_uncontended(rate_axes, handoff_axes, rows)
    _aio_crowds(grant_axes, p99_axes, crowds)
    for axes in (rate_axes, handoff_axes, grant_axes, p99_axes):
        axes.grid(axis="x", alpha=0.3)
    mixed = any(r["ours"] for r in rows) and not all(r["ours"] for r in rows)
    return _save(figure, f"{results['title']} ({results['stamp']})", path,
                 "peer library" if mixed else None)  # fmt: skip


def _aio_uncontended(rate_axes: Any, handoff_axes: Any, rows: Sequence[AioRow]) -> None:
    ys = list(range(len(rows)))
    colours = [OURS_COLOUR if r["ours"] else PEER_COLOUR for r in rows]
    rates = [r["cycles_per_second"] for r in rows]
    rate_axes.barh(ys, rates, color=colours)  # linear: bar lengths are the ratios
    rate_axes.set_yticks(ys, [r["name"] for r in rows])
    rate_axes.invert_yaxis()  # the table's order, top to bottom
    rate_axes.set_xlabel("uncontended acquire + release by one task, cycles/s\n"
                         "(higher is better)")  # fmt: skip
    for y, rate in zip(ys, rates, strict=True):
        rate_axes.annotate(f" {rate:,.0f}", (rate, y), va="center", fontsize=8)
    rate_axes.set_xlim(0, max(rates, default=1.0) * 1.2)

    shown = [v for r in rows for v in (r["handoff_ms"], r["handoff_p99_ms"]) if v is not None]
    low = _bar_scale(handoff_axes, shown, "hand-off, ms: median bar, p99 mark")
    _room_for_labels(handoff_axes, shown)
    for y, (r, colour) in enumerate(zip(rows, colours, strict=True)):
        median, p99 = r["handoff_ms"], r["handoff_p99_ms"]
        if median is None:
            handoff_axes.annotate(" — (not timed)", (low, y), va="center", fontsize=8)
            continue
        handoff_axes.barh(y, median - low, left=low, color=colour)
        tip = median if p99 is None else p99
        if p99 is not None:
            handoff_axes.scatter([p99], [y], marker="|", s=120, color="#d62728", zorder=3)
        handoff_axes.annotate(f" {_short(median)} / {_short(p99)} ms", (tip, y), va="center",
                              fontsize=8)  # fmt: skip


def _aio_crowds(grant_axes: Any, p99_axes: Any, crowds: Sequence[AioCrowd]) -> None:
    cys = list(range(len(crowds)))
    crowd_colours = [OURS_COLOUR if c["ours"] else PEER_COLOUR for c in crowds]
    grants = [c["grants_per_second"] for c in crowds]
    grant_axes.barh(cys, grants, color=crowd_colours,
                    hatch=["//" if c["mode"] == "threads" else None for c in crowds],
                    edgecolor="white")  # fmt: skip
    grant_axes.set_yticks(cys, [f"{c['library']}\n{c['workers']:,} {c['mode']}, "
                                f"{c['keys']:,} keys" for c in crowds])  # fmt: skip
    grant_axes.invert_yaxis()
    grant_axes.set_xlabel("crowd: each worker loops acquire + release on a random key,\n"
                          "grants/s (higher is better; hatched: threads, not tasks)")  # fmt: skip
    for y, c in zip(cys, crowds, strict=True):
        missed = c["timeouts"] + c["cancelled"]
        extra = f", {missed:,} not granted" if missed else ""
        grant_axes.annotate(f" {c['grants_per_second']:,.0f}{extra}", (c["grants_per_second"], y),
                            va="center", fontsize=8)  # fmt: skip
    grant_axes.set_xlim(0, max(grants, default=1.0) * 1.35)

    shown = [v for c in crowds for v in (c["p50_ms"], c["p99_ms"]) if v is not None]
    low = _bar_scale(p99_axes, shown, "crowd acquire, from call to return, ms:\np99 bar, p50 mark")
    _room_for_labels(p99_axes, shown)
    for y, (c, colour) in enumerate(zip(crowds, crowd_colours, strict=True)):
        p50, p99 = c["p50_ms"], c["p99_ms"]
        if p99 is None:
            p99_axes.annotate(" — (nothing granted)", (low, y), va="center", fontsize=8)
            continue
        hatch = "//" if c["mode"] == "threads" else None
        p99_axes.barh(y, p99 - low, left=low, color=colour, hatch=hatch, edgecolor="white")
        if p50 is not None:
            p99_axes.scatter([p50], [y], marker="|", s=120, color="black", zorder=3)
        p99_axes.annotate(f" {_short(p50)} / {_short(p99)} ms", (p99, y), va="center",
                          fontsize=8)  # fmt: skip


def _short(value: float | None) -> str:
    """Milliseconds as a label: two decimals below 100, none above."""
    if value is None:
        return "—"
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}"


def _room_for_labels(axes: Any, values: Sequence[float]) -> None:
    """Past `_bar_scale`'s right end, room for a "p50 / p99 ms" label on a log scale."""
    if axes.get_xscale() == "log":
        axes.set_xlim(right=max(values, default=1.0) * 40)


class AioTwinPair(TypedDict):
    """One pair of `benchmarks.aio_twins`: a provider type on both faces, one server."""

    id: str
    label: str  # the server
    asyncio: str  # the asyncio face's name in `uncontended` and `crowds`
    threaded: str  # its threaded twin's
    server: str  # with its version


class AioTwinsResults(AioResults):
    """docs/img/aio_twins.json: `benchmarks.aio`'s record, with the pairs measured."""

    pairs: list[AioTwinPair]


# the two faces as `draw_aio_twins` draws them: (legend, hatch); threads hatched, as in aio.png
_TWIN_FACES = (("locks.aio: tasks on one loop", None), ("locks.backends: threads", "//"))
_TWIN_HEIGHT = 0.38  # of a bar: two per pair, a pair one unit apart


def draw_aio_twins(results: AioTwinsResults, path: Path | None = None) -> Path:
    """docs/img/aio_twins.png: per pair, the asyncio face (solid) next to its threaded
    twin (hatched): uncontended cycles/s and hand-off (median bar, p99 mark) on top, the
    crowd's grants/s and acquire p99 (p50 mark) below; the asyncio bar of a rate says
    its ratio to the twin's."""
    from matplotlib.patches import Patch  # noqa: PLC0415  # matplotlib stays optional

    path = path or IMAGES / "aio_twins.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    pairs = results["pairs"]
    rows = {r["name"]: r for r in results["uncontended"]}
    crowds = {c["library"]: c for c in results["crowds"]}
    faces = [(rows[p["asyncio"]], rows[p["threaded"]]) for p in pairs]
    crowd_faces = [(crowds[p["asyncio"]], crowds[p["threaded"]]) for p in pairs]
    figure = _figure(14, 3.0 + 1.3 * len(pairs))
    (rate_axes, handoff_axes), (grant_axes, p99_axes) = figure.subplots(
        2, 2, sharey=True, gridspec_kw={"width_ratios": [1.15, 1]}
    )
    _twin_rates(rate_axes, [(a["cycles_per_second"], t["cycles_per_second"]) for a, t in faces],
                "uncontended acquire + release, cycles/s\n(higher is better)")  # fmt: skip
    _twin_times(handoff_axes, [((a["handoff_ms"], a["handoff_p99_ms"]),
                                (t["handoff_ms"], t["handoff_p99_ms"])) for a, t in faces],
                "hand-off to a waiter of the same process, ms: median bar, p99 mark",
                "#d62728")  # fmt: skip
    first = crowd_faces[0][0] if crowd_faces else None
    crowd = f"{first['workers']} workers over {first['keys']} keys" if first else "a crowd"
    _twin_rates(grant_axes, [(a["grants_per_second"], t["grants_per_second"])
                             for a, t in crowd_faces],
                f"{crowd}, grants/s (higher is better)")  # fmt: skip
    _twin_times(p99_axes, [((a["p99_ms"], a["p50_ms"]), (t["p99_ms"], t["p50_ms"]))
                           for a, t in crowd_faces],
                f"{crowd}, acquire from call to return, ms:\np99 bar, p50 mark",
                "black")  # fmt: skip
    for axes in (rate_axes, grant_axes):
        axes.set_yticks(range(len(pairs)), [p["label"] for p in pairs])
    rate_axes.invert_yaxis()  # the table's order, top to bottom (shared by every panel)
    for axes in (rate_axes, handoff_axes, grant_axes, p99_axes):
        axes.grid(axis="x", alpha=0.3)
    figure.legend(
        handles=[Patch(facecolor=OURS_COLOUR, hatch=hatch, edgecolor="white")
                 for _, hatch in _TWIN_FACES],
        labels=[label for label, _ in _TWIN_FACES],
        loc="outside lower center", ncols=2, fontsize=8,
    )  # fmt: skip
    return _save(figure, f"{results['title']} ({results['stamp']})", path)


def _twin_y(pair: int, face: int) -> float:
    return pair + (face - 0.5) * (_TWIN_HEIGHT + 0.02)


def _twin_rates(axes: Any, rates: Sequence[tuple[float, float]], label: str) -> None:
    """Per pair, both faces' rates from 0 (bar lengths are the ratios)."""
    for index, pair in enumerate(rates):
        for face, (rate, (_, hatch)) in enumerate(zip(pair, _TWIN_FACES, strict=True)):
            y = _twin_y(index, face)
            axes.barh(y, rate, _TWIN_HEIGHT, color=OURS_COLOUR, hatch=hatch, edgecolor="white")
            ratio = f" ({rate / pair[1]:.2f}x)" if face == 0 and pair[1] else ""
            axes.annotate(f" {rate:,.0f}{ratio}", (rate, y), va="center", fontsize=8)
    axes.set_xlim(0, max((r for pair in rates for r in pair), default=1.0) * 1.35)
    axes.set_xlabel(label)


def _twin_times(
    axes: Any,
    times: Sequence[tuple[tuple[float | None, float | None], ...]],
    label: str,
    mark: str,
) -> None:
    """Per pair, both faces' (bar, mark) times, on `_bar_scale`'s scale, each labelled
    low / high."""
    shown = [v for pair in times for face in pair for v in face if v is not None]
    low = _bar_scale(axes, shown, label)
    _room_for_labels(axes, shown)
    for index, pair in enumerate(times):
        for face, ((bar, tick), (_, hatch)) in enumerate(zip(pair, _TWIN_FACES, strict=True)):
            y = _twin_y(index, face)
            if bar is None:
                axes.annotate(" — (not measured)", (low, y), va="center", fontsize=8)
                continue
            axes.barh(y, bar - low, _TWIN_HEIGHT, left=low, color=OURS_COLOUR, hatch=hatch,
                      edgecolor="white")  # fmt: skip
            if tick is not None:
                axes.scatter([tick], [y], marker="|", s=90, color=mark, zorder=3)
            both = sorted(v for v in (bar, tick) if v is not None)  # "p50 / p99", either way
            text = " " + " / ".join(_short(v) for v in both) + " ms"
            axes.annotate(text, (both[-1], y), va="center", fontsize=8)


# -- docs/benchmarks.md ------------------------------------------------------------------


def keep_last_links(report: Path = REPORT) -> None:
    """Leave only the last link to each image: an image shows its latest run, so a link
    under an older section would put new figures next to old numbers."""
    lines = report.read_text().splitlines(keepends=True)
    last: dict[str, int] = {}
    for index, line in enumerate(lines):
        match = _LINK.match(line)
        if match:
            last[match.group(1)] = index
    kept = [
        line
        for index, line in enumerate(lines)
        if not (match := _LINK.match(line)) or last[match.group(1)] == index
    ]
    if len(kept) != len(lines):
        # drop the blank line each removed link leaves doubled
        text = re.sub(r"\n{3,}", "\n\n", "".join(kept))
        report.write_text(text)


@dataclass
class Section:
    name: str  # X of `python -m benchmarks.X`
    title: str
    stamp: str
    start: int  # index of its heading line
    end: int  # index after its last line


def sections(lines: Sequence[str]) -> list[Section]:
    """The report's dated sections, with the benchmark each one's command ran."""
    found: list[Section] = []
    for index, line in enumerate(lines):
        heading = _SECTION.match(line)
        if heading:
            if found:
                found[-1].end = index
            found.append(Section("", heading["title"], heading["stamp"], index, len(lines)))
        elif found and not found[-1].name and (command := _COMMAND.match(line)):
            found[-1].name = command["name"]
    return found


def parse_results(name: str, lines: Sequence[str]) -> list[Result]:
    """The first contender table of a section, back into Results. The table does not
    say which rows are ours: names starting `fallback-locks` are, and every row of a
    benchmark in ALL_OURS."""
    results = []
    in_table = False
    for line in lines:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| contender |"):
            in_table = True
        elif in_table and line.startswith("|---"):
            continue
        elif in_table and line.startswith("|"):
            label, rate, _ratio, handoff = cells[:4]
            results.append(
                Result(
                    label,
                    float(rate.replace(",", "")),
                    None if handoff in ("—", "-", "") else float(handoff),
                    ours=name in ALL_OURS or label.startswith("fallback-locks"),
                )
            )
        elif in_table:
            break
    return results


OWN_REDRAW = ("failover", "scale", "aio_twins")


def redraw(names: Sequence[str], report: Path = REPORT) -> list[Path]:
    """Draw each named benchmark's image from its newest section's table, and link it
    from that section if it is not yet."""
    lines = report.read_text().splitlines(keepends=True)
    newest = {section.name: section for section in sections(lines)}
    drawn = []
    inserts: list[tuple[int, str]] = []
    # failover's, scale's and aio_twins' images are drawn by their own modules (`--redraw`)
    for name in names or [n for n in newest if n not in OWN_REDRAW]:
        if name in OWN_REDRAW:
            raise SystemExit(f"benchmarks.{name} draws its own image: "
                             f"python -m benchmarks.{name} --redraw")  # fmt: skip
        section = newest.get(name)
        if section is None:
            raise SystemExit(f"no section of benchmarks.{name} in {report}")
        body = lines[section.start : section.end]
        if name == "topologies":  # drawn from the run's raw results, not from its tables
            data = load_topologies()
            if data["stamp"] != section.stamp:
                print(f"{TOPOLOGIES_RESULTS} is of the run at {data['stamp']}, "
                      f"not of the newest section ({section.stamp})", file=sys.stderr)  # fmt: skip
            image = draw_topologies(
                f"{data['title']} ({data['stamp']})", data["cycles"], data["failovers"]
            )
        elif name == "quorum":  # likewise
            quorum = load_quorum()
            if quorum["stamp"] != section.stamp:
                print(f"{QUORUM_RESULTS} is of the run at {quorum['stamp']}, "
                      f"not of the newest section ({section.stamp})", file=sys.stderr)  # fmt: skip
            image = draw_quorum(f"{quorum['title']} ({quorum['stamp']})", quorum["rows"])
        elif name == "aio":  # likewise
            aio = load_aio()
            if aio["stamp"] != section.stamp:
                print(f"{AIO_RESULTS} is of the run at {aio['stamp']}, "
                      f"not of the newest section ({section.stamp})", file=sys.stderr)  # fmt: skip
            image = draw_aio(aio)
        elif name in DATABASE_RESULTS and DATABASE_RESULTS[name].exists():  # likewise
            database = load_database(name)
            if database["stamp"] != section.stamp:
                print(f"{DATABASE_RESULTS[name]} is of the run at {database['stamp']}, "
                      f"not of the newest section ({section.stamp})", file=sys.stderr)  # fmt: skip
            image = draw_database(
                name, f"{database['title']} ({database['stamp']})", database["rows"]
            )
        else:
            results = parse_results(name, body)
            if not results:
                raise SystemExit(f"the newest benchmarks.{name} section has no contender table")
            image = draw_results(name, f"{section.title} ({section.stamp})", results)
        drawn.append(image)
        if not any(f"](img/{image.name})" in line for line in body):
            table_end = next(
                i for i in range(section.start, section.end) if lines[i].startswith("|")
            )
            while table_end < section.end and lines[table_end].startswith("|"):
                table_end += 1
            inserts.append((table_end, f"\n{image_link(section.title, image)}\n"))
    for index, text in sorted(inserts, reverse=True):
        lines.insert(index, text)
    if inserts:
        report.write_text("".join(lines))
    keep_last_links(report)
    return drawn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("names", nargs="*", help="benchmarks to draw (redis, database, ...)")
    args = parser.parse_args(argv)
    for image in redraw(args.names):
        print(f"drew {image}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
