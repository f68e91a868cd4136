"""`benchmarks.check` on synthetic results (issue 20): no server, no timing. What it must
get right is the verdict and the exit status, whatever the results files hold."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
from pathlib import Path

import pytest

from benchmarks import check, harness
from benchmarks.harness import Ratio, Result
from locks import measure

FLOORS = """
["redis/redis-vs-redis-py-lock"]
floor = 1.0
documented = 0.90

["redis/redis-hash-vs-redis-py-lock"]
floor = 0.95
documented = 0.92

["redis/redis-handoff-vs-python-redis-lock"]
documented = 0.94
"""


@pytest.fixture
def place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A floors file and an empty results folder of the test's own, where the check and
    `harness.write_ratios` look."""
    floors = tmp_path / "floors.toml"
    floors.write_text(FLOORS)
    results = tmp_path / "results"
    results.mkdir()
    monkeypatch.setattr(check, "FLOORS", floors)
    monkeypatch.setattr(check, "RESULTS", results)
    monkeypatch.setattr(harness, "RESULTS", results)
    return results


def write(results: Path, benchmark: str, values: dict[str, float | None]) -> None:
    ratios = [{"id": key, "value": value, "compares": "x / y"} for key, value in values.items()]
    (results / f"{benchmark}.json").write_text(json.dumps({"ratios": ratios}))


def verdicts(capsys: pytest.CaptureFixture[str], out: str | None = None) -> dict[str, str]:
    """Ratio id -> verdict, read back from the printed table (its rows: the lines whose
    first word is an id; the summary lines start with a verdict and a colon)."""
    found = {}
    for line in (capsys.readouterr().out if out is None else out).splitlines()[1:]:
        cells = line.split()
        if cells and "/" in cells[0] and ":" not in line:
            found[cells[0]] = " ".join(cells[4:])
    return found


def test_a_ratio_below_its_floor_fails_the_check_and_is_named(
    place: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(place, "redis", {
        "redis/redis-vs-redis-py-lock": 0.93,
        "redis/redis-hash-vs-redis-py-lock": 0.97,
        "redis/redis-handoff-vs-python-redis-lock": 1.2,
    })  # fmt: skip
    assert check.main(["--no-run", "redis"]) == 1
    out = capsys.readouterr().out
    assert "\nbelow floor: redis/redis-vs-redis-py-lock\n" in out
    assert verdicts(capsys, out) == {
        "redis/redis-vs-redis-py-lock": "below floor",
        "redis/redis-hash-vs-redis-py-lock": "ok",
        "redis/redis-handoff-vs-python-redis-lock": "ok",
    }
    row = next(line for line in out.splitlines() if line.startswith("redis/redis-vs-"))
    assert row.split()[1:4] == ["0.93", "1.00", "0.90"]  # measured, floor, documented


def test_below_documented_only_warns(place: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(place, "redis", {
        "redis/redis-vs-redis-py-lock": 1.01,
        "redis/redis-hash-vs-redis-py-lock": 0.96,
        "redis/redis-handoff-vs-python-redis-lock": 0.80,  # no floor, below documented
    })  # fmt: skip
    assert check.main(["--no-run", "redis"]) == 0
    assert verdicts(capsys) == {
        "redis/redis-vs-redis-py-lock": "ok",
        "redis/redis-hash-vs-redis-py-lock": "ok",
        "redis/redis-handoff-vs-python-redis-lock": "below documented",
    }


def test_a_missing_ratio_is_reported_not_a_crash(
    place: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Absent from the file, or null (a contender not measured): missing. One with a
    floor fails the check (nothing vouches for it); one without only shows."""
    write(place, "redis", {"redis/redis-vs-redis-py-lock": None})
    assert check.main(["--no-run", "redis"]) == 1
    assert set(verdicts(capsys).values()) == {"missing"}

    write(place, "redis", {
        "redis/redis-vs-redis-py-lock": 1.0,
        "redis/redis-hash-vs-redis-py-lock": 1.0,
        "redis/new-ratio-nobody-documented": 0.5,
    })  # fmt: skip
    assert check.main(["--no-run", "redis"]) == 0
    assert verdicts(capsys) == {
        "redis/redis-vs-redis-py-lock": "ok",
        "redis/redis-hash-vs-redis-py-lock": "ok",
        "redis/redis-handoff-vs-python-redis-lock": "missing",
        "redis/new-ratio-nobody-documented": "ok",
    }


def test_no_results_file_or_a_broken_one_is_missing(
    place: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert check.main(["--no-run", "redis"]) == 1
    assert set(verdicts(capsys).values()) == {"missing"}
    (place / "redis.json").write_text("{not json")
    assert check.main(["--no-run", "redis"]) == 1
    assert set(verdicts(capsys).values()) == {"missing"}


def test_only_the_named_benchmarks_are_compared(
    place: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(place, "zookeeper", {"zookeeper/zookeeper-vs-kazoo-lock": 1.5})
    assert check.main(["--no-run", "zookeeper"]) == 0
    assert verdicts(capsys) == {"zookeeper/zookeeper-vs-kazoo-lock": "ok"}


def test_ratios_compare_at_the_two_decimals_the_docs_print() -> None:
    assert check.Row("a/b", 0.949, 0.95, None).verdict == "ok"
    assert check.Row("a/b", 0.944, 0.95, None).verdict == "below floor"
    assert check.Row("a/b", 0.944, None, 0.95).verdict == "below documented"


def test_an_unknown_benchmark_is_refused(place: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        check.main(["--no-run", "nosuch"])
    assert exited.value.code == 2


def test_a_floors_entry_with_a_typo_is_refused(tmp_path: Path) -> None:
    floors = tmp_path / "floors.toml"
    floors.write_text('["redis/redis-vs-redis-py-lock"]\nflor = 1.0\n')
    with pytest.raises(ValueError, match="floor and documented"):
        check.load_floors(floors)
    floors.write_text('["redis/redis-vs-redis-py-lock"]\nfloor = "1.0"\n')
    with pytest.raises(ValueError, match="floor and documented"):
        check.load_floors(floors)


def test_what_a_benchmark_writes_is_what_the_check_reads(place: Path) -> None:
    """`harness.write_ratios`, the one writer: higher is better both ways (hand-off is
    the base's over ours), and a contender not measured gives null, not an error."""
    ratios = (
        Ratio("redis/redis-vs-redis-py-lock", "ours", "peer"),
        Ratio("redis/redis-handoff-vs-python-redis-lock", "ours", "peer", handoff=True),
        Ratio("redis/redis-hash-vs-redis-py-lock", "absent", "peer"),
    )
    results = [Result("ours", 900.0, 2.0), Result("peer", 1000.0, 1.0)]
    args = argparse.Namespace(cycles=10, json=Path("x.json"), quick=True)
    path = harness.write_ratios("redis", args, results, ratios)
    written = json.loads(path.read_text())
    assert written["arguments"] == {"cycles": 10, "json": "x.json", "quick": True}
    assert {"utc", "cpus", "python"} <= set(written)
    assert check.load_measured(["redis"], place) == {
        "redis/redis-vs-redis-py-lock": 0.9,
        "redis/redis-handoff-vs-python-redis-lock": 0.5,
        "redis/redis-hash-vs-redis-py-lock": None,
    }


def test_quick_takes_the_smaller_defaults_and_writes_no_docs() -> None:
    quick = harness.parse(harness.parser(None), ["--quick", "--cycles", "7"])
    assert (quick.cycles, quick.rounds, quick.no_write) == (7, harness.QUICK["rounds"], True)
    full = harness.parse(harness.parser(None), [])
    assert (full.cycles, full.no_write) == (2000, False)


def test_every_floor_names_a_ratio_some_benchmark_writes() -> None:
    """Checked statically: each benchmark module declares its `RATIOS` (and the asyncio
    ones their `CROWD_RATIOS`), ids prefixed by its own name (the check picks a
    benchmark's rows by it)."""
    written: set[str] = set()
    for name in check.BENCHMARKS:
        module = importlib.import_module(f"benchmarks.{name}")
        ratios = [*module.RATIOS, *getattr(module, "CROWD_RATIOS", ())]
        assert ratios and all(r.id.startswith(f"{name}/") for r in ratios), name
        written |= {r.id for r in ratios}
    floors = check.load_floors(check.FLOORS)
    assert set(floors) <= written, set(floors) - written
    floored = {i.split("/")[0] for i, bounds in floors.items() if bounds.floor is not None}
    assert set(check.QUICK) <= floored  # issue 20's goals: each quick one has some


def test_each_benchmark_is_run_so_that_its_ratios_land_where_the_check_reads(
    place: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under --no-write the harness's benchmarks write their ratios all the same; the
    asyncio ones keep a record of their own, written only where --json says."""
    commands: list[list[str]] = []

    def ran(command: list[str], **_: object) -> argparse.Namespace:
        commands.append(command)
        return argparse.Namespace(returncode=0)

    monkeypatch.setattr(subprocess, "run", ran)
    for name in ("redis", "aio", "aio_twins"):
        check.run(name, quick=True)
    redis, aio, twins = (command[1:] for command in commands)
    assert redis == ["-m", "benchmarks.redis", "--no-write", "--quick"]
    for name, command in (("aio", aio), ("aio_twins", twins)):
        assert command[:3] == ["-m", f"benchmarks.{name}", "--no-write"]
        assert command[command.index("--json") + 1] == str(place / f"{name}.json")


def test_hand_offs_are_sampled_in_rounds_that_run_every_contender(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As the cycles are: all of one contender's samples taken before the next one's
    would let a machine's drift decide a hand-off ratio."""
    taken: list[tuple[str, int]] = []

    def latencies(_acquire: object, _release: object, n: int, *, label: str) -> list[float]:
        taken.append((label, n))
        return [float(len(taken))] * n

    monkeypatch.setattr(measure, "handoff_latencies", latencies)
    contenders = [harness.Contender(name, str, lambda _: None) for name in ("a", "b")]
    medians = harness.handoffs(contenders, samples=5, rounds=3)
    assert taken == [("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 2), ("b", 2)]
    assert set(medians) == {"a", "b"}
    assert harness.handoffs(contenders, samples=2, rounds=3)  # a round may take none
