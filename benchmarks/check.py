"""Rerun benchmarks and say which ratio fell below its floor or below the documented one.

    python -m benchmarks.check [--quick] [--no-run] [BENCHMARK ...]

Runs each benchmark (default: the quick ones, `QUICK`) as `python -m benchmarks.<name>
--no-write` (and --quick with --quick; the asyncio ones, `aio` and `aio_twins`, with
--json to their results file), so docs/ stays as it is, then reads the ratios it wrote
to benchmarks/results/<name>.json and compares them with benchmarks/floors.toml:
`floor` is the goal a ratio must meet, `documented` the figure docs/benchmarks.md shows
now. Ratios are compared at the two decimals the docs print. --no-run compares the
results already there (those of `make bench`, say).

Not a timed test: ratios of one run on a shared machine move by several points, so a
verdict is a prompt to rerun and look, not proof. Exit status 1 if a ratio is below its
floor, or has a floor and was not measured (a benchmark that failed vouches for nothing);
below documented only warns.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness import RESULTS

ROOT = Path(__file__).resolve().parent.parent
FLOORS = Path(__file__).resolve().parent / "floors.toml"
QUICK = ("redis", "zookeeper", "database", "postgresql")  # a few minutes together
# every benchmark that writes ratios (a module with `RATIOS`)
BENCHMARKS = (*QUICK, "chain", "quorum", "topologies", "aio", "aio_twins")
# those that keep a record of their own: under --no-write they write it only to --json
OWN_RECORD = ("aio", "aio_twins")

OK, BELOW_DOCUMENTED, BELOW_FLOOR, MISSING = "ok", "below documented", "below floor", "missing"


@dataclass(frozen=True)
class Bounds:
    """What benchmarks/floors.toml says of one ratio id (either may be absent)."""

    floor: float | None = None
    documented: float | None = None


@dataclass(frozen=True)
class Row:
    id: str
    measured: float | None
    floor: float | None
    documented: float | None

    @property
    def verdict(self) -> str:
        if self.measured is None:
            return MISSING
        shown = round(self.measured, 2)  # as the docs print it: 0.949 is no breach of 0.95
        if self.floor is not None and shown < self.floor:
            return BELOW_FLOOR
        if self.documented is not None and shown < self.documented:
            return BELOW_DOCUMENTED
        return OK

    @property
    def fails(self) -> bool:
        return self.verdict == BELOW_FLOOR or (self.verdict == MISSING and self.floor is not None)


def load_floors(path: Path = FLOORS) -> dict[str, Bounds]:
    """Ratio id -> its bounds; anything but `floor` and `documented` numbers is an error,
    so that a typo cannot leave a ratio unguarded."""
    floors = {}
    for ratio_id, entry in tomllib.loads(path.read_text()).items():
        unknown = set(entry) - {"floor", "documented"}
        values = [entry.get("floor"), entry.get("documented")]
        if unknown or not all(v is None or isinstance(v, int | float) for v in values):
            raise ValueError(f"{path}: [{ratio_id!r}] takes only numbers floor and documented")
        floors[ratio_id] = Bounds(*(None if v is None else float(v) for v in values))
    return floors


def load_measured(benchmarks: Iterable[str], results: Path = RESULTS) -> dict[str, float | None]:
    """Ratio id -> value, from each benchmark's results file; an unreadable or absent file
    gives nothing, so its ratios show up as missing."""
    measured: dict[str, float | None] = {}
    for name in benchmarks:
        path = results / f"{name}.json"
        try:
            ratios = json.loads(path.read_text())["ratios"]
            measured |= {r["id"]: r["value"] for r in ratios}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"no ratios from {path}: {type(exc).__name__}: {exc}", file=sys.stderr)
    return measured


def compare(
    measured: dict[str, float | None], floors: dict[str, Bounds], benchmarks: Iterable[str]
) -> list[Row]:
    """A row per ratio of `benchmarks` that floors.toml names or a run measured."""
    chosen = set(benchmarks)
    named = [ratio_id for ratio_id in floors if ratio_id.split("/", 1)[0] in chosen]
    rows = []
    for ratio_id in dict.fromkeys([*named, *measured]):
        bounds = floors.get(ratio_id, Bounds())
        rows.append(Row(ratio_id, measured.get(ratio_id), bounds.floor, bounds.documented))
    return rows


def render(rows: Sequence[Row]) -> str:
    def figure(value: float | None) -> str:
        return "—" if value is None else f"{value:.2f}"

    width = max([len("ratio"), *(len(row.id) for row in rows)])
    lines = [f"{'ratio':<{width}}  measured  floor  documented  verdict"]
    for row in rows:
        lines.append(
            f"{row.id:<{width}}  {figure(row.measured):>8}  {figure(row.floor):>5}  "
            f"{figure(row.documented):>10}  {row.verdict}"
        )
    return "\n".join(lines)


def status(rows: Sequence[Row]) -> int:
    return 1 if any(row.fails for row in rows) else 0


def run(name: str, quick: bool) -> None:
    """One benchmark, its old results removed first so that a failed run leaves none."""
    (RESULTS / f"{name}.json").unlink(missing_ok=True)
    command = [sys.executable, "-m", f"benchmarks.{name}", "--no-write"]
    command += ["--json", str(RESULTS / f"{name}.json")] if name in OWN_RECORD else []
    command += ["--quick"] if quick else []
    print(f"$ {' '.join(command[1:])}", flush=True)
    done = subprocess.run(command, cwd=ROOT, check=False)
    if done.returncode:
        print(f"benchmarks.{name} exited {done.returncode}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    options = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    options.add_argument(
        "benchmarks", nargs="*", metavar="BENCHMARK", help=f"of {', '.join(BENCHMARKS)}"
    )
    options.add_argument("--quick", action="store_true", help="run each with --quick")
    options.add_argument("--no-run", action="store_true", help="compare the results there")
    args = options.parse_args(argv)
    if unknown := set(args.benchmarks) - set(BENCHMARKS):
        options.error(f"no benchmark {', '.join(sorted(unknown))}: of {', '.join(BENCHMARKS)}")
    names: list[str] = args.benchmarks or list(QUICK)
    floors = load_floors(FLOORS)  # first: a broken floors file is no reason to run anything
    if not args.no_run:
        for name in names:
            run(name, args.quick)
    rows = compare(load_measured(names, RESULTS), floors, names)
    print(render(rows))
    for verdict in (BELOW_FLOOR, MISSING, BELOW_DOCUMENTED):
        if found := [row.id for row in rows if row.verdict == verdict]:
            print(f"{verdict}: {', '.join(found)}")
    return status(rows)


if __name__ == "__main__":
    sys.exit(main())
