"""`benchmarks.aio_twins` in its smallest form (it starts its own servers, as the other
benchmarks do): both faces of every pair measured (cycles, hand-offs, crowds), every
ratio a positive number, the tables printed, the record written where --json says and
nowhere else with --no-write; without it, the section, the record and the image
published to a docs/ of the test's own (never the real one), and the image drawn again
from that record by --redraw. Never speed: that is the benchmark's to report."""

from __future__ import annotations

import abc
import json
from pathlib import Path

import pytest
from matplotlib.image import imread

from benchmarks import aio_twins, harness, plots
from locks import aio

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SMALLEST = [
    "--quick", "--cycles", "20", "--rounds", "2", "--samples", "2",
    "--seconds", "0.3", "--workers", "3", "--keys", "4",
]  # fmt: skip
PAIRS = {pair.id for pair in aio_twins.PAIRS}


def names(pairs: set[str]) -> set[str]:
    """Both faces' names of `pairs`, as rows and crowds are labelled."""
    chosen = [pair for pair in aio_twins.PAIRS if pair.id in pairs]
    return {name for pair in chosen for name in (pair.asyncio_name, pair.threaded_name)}


def ratio_ids(pair: aio_twins.Pair) -> set[str]:
    return {r.id for r in pair.ratios()} | {r.id for r in pair.crowd_ratios()}


def test_the_smallest_run_measures_both_faces_of_every_pair_and_writes_only_where_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    default = tmp_path / "results" / "aio_twins.json"
    monkeypatch.setattr(aio_twins, "RESULTS", default)  # where a run without --json writes
    monkeypatch.setattr(aio_twins, "RECORD", tmp_path / "img" / "aio_twins.json")
    written = tmp_path / "run.json"
    assert aio_twins.main([*SMALLEST, "--no-write", "--json", str(written)]) == 0
    out = capsys.readouterr().out
    assert not default.exists() and not aio_twins.RECORD.exists()
    assert "appended to" not in out and "drew" not in out
    assert f"wrote {written}" in out

    saved = json.loads(written.read_text())
    assert saved["benchmark"] == "aio_twins" and saved["title"] == aio_twins.TITLE
    assert {"utc", "cpus", "python", "arguments", "settings", "seconds"} <= set(saved)
    assert saved["command"].startswith("python -m benchmarks.aio_twins --quick")
    assert [pair["id"] for pair in saved["pairs"]] == [pair.id for pair in aio_twins.PAIRS]
    assert all(pair["server"] for pair in saved["pairs"])

    rows = {row["name"]: row for row in saved["uncontended"]}
    assert set(rows) == names(PAIRS)
    for name, row in rows.items():
        assert row["cycles_per_second"] > 0 and len(row["rounds"]) == 2, name
        assert row["handoff_samples"] == 2, name
        assert 0 < row["handoff_ms"] <= row["handoff_p99_ms"] < 30_000, name

    crowds = {crowd["library"]: crowd for crowd in saved["crowds"]}
    assert set(crowds) == names(PAIRS)
    for name, crowd in crowds.items():
        assert crowd["workers"] == 3 and crowd["keys"] == 4, name
        assert crowd["mode"] == ("tasks" if name.startswith("locks.aio ") else "threads"), name
        assert crowd["grants"] > 0 and crowd["grants_per_second"] > 0, name
        assert (crowd["errors"], crowd["timeouts"], crowd["cancelled"]) == (0, 0, 0), (
            name, crowd["error"],
        )  # fmt: skip
        assert 0 < crowd["p50_ms"] <= crowd["p99_ms"] <= crowd["max_ms"], name

    ratios = {ratio["id"]: ratio for ratio in saved["ratios"]}
    expected = {ratio_id for pair in aio_twins.PAIRS for ratio_id in ratio_ids(pair)}
    assert set(ratios) == expected and len(expected) == 4 * len(PAIRS)
    for ratio_id, ratio in ratios.items():
        assert isinstance(ratio["value"], float) and ratio["value"] > 0, ratio_id

    for name in names(PAIRS):
        assert f"| {name} |" in out, name
    for ratio_id in ratios:
        assert f"| {ratio_id} |" in out, ratio_id


@pytest.fixture
def docs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A docs/ of the test's own, with a report holding an older run's section, in place
    of the real one wherever a run would write."""
    root = tmp_path / "docs"
    report = root / "benchmarks.md"
    (root / "img").mkdir(parents=True)
    report.write_text(
        "# Benchmarks\n\n"
        f"## {aio_twins.TITLE} (2000-01-01 00:00 UTC)\n\n`python -m benchmarks.aio_twins`\n\n"
        "| contender | cycles/s |\n|---|---:|\n| x | 1 |\n\n"
        f"![{aio_twins.TITLE}](img/aio_twins.png)\n"
    )
    keep_last_links = plots.keep_last_links
    monkeypatch.setattr(harness, "DOCS", root)
    monkeypatch.setattr(harness, "REPORT", report)
    monkeypatch.setattr(plots, "IMAGES", root / "img")
    monkeypatch.setattr(plots, "keep_last_links", lambda report=report: keep_last_links(report))
    monkeypatch.setattr(aio_twins, "RECORD", root / "img" / "aio_twins.json")
    monkeypatch.setattr(aio_twins, "RESULTS", tmp_path / "results" / "aio_twins.json")
    return root


def test_a_run_that_writes_publishes_its_section_record_and_image_and_redraw_redraws_it(
    docs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report, image = docs / "benchmarks.md", docs / "img" / "aio_twins.png"
    argv = [*SMALLEST, "--only", "sqlite"]  # no server to start: the writing is tested here
    assert aio_twins.main(argv) == 0
    out = capsys.readouterr().out
    assert aio_twins.RESULTS.exists()
    assert f"drew {image}" in out and f"appended to {report}" in out

    text = report.read_text()
    section = text.split(f"## {aio_twins.TITLE} (")[-1]  # the newest
    saved = json.loads(aio_twins.RECORD.read_text())
    assert saved == json.loads(aio_twins.RESULTS.read_text())  # one record, kept twice
    assert section.startswith(f"{saved['stamp']})\n\n`{saved['command']}`\n")
    assert saved["command"] == "python -m benchmarks.aio_twins " + " ".join(argv)
    assert [pair["id"] for pair in saved["pairs"]] == ["sqlite"]
    assert {r["id"] for r in saved["ratios"]} == ratio_ids(aio_twins.PAIRS[2])
    for row in (*names({"sqlite"}), *(r["id"] for r in saved["ratios"])):
        assert f"| {row} |" in section, row
    assert "One run of" in section and "`docs/img/aio_twins.json`" in section
    assert "SQLite file: the asyncio face made" in " ".join(section.split())  # the summary
    # the first table is a contender table, as `python -m benchmarks.plots` reads one
    assert [r.name for r in plots.parse_results("aio_twins", section.splitlines())] == [
        aio_twins.PAIRS[2].asyncio_name, aio_twins.PAIRS[2].threaded_name,
    ]  # fmt: skip
    assert text.count("](img/aio_twins.png)") == 1  # the older section's link dropped
    assert section.rstrip().endswith(f"![{aio_twins.TITLE}](img/aio_twins.png)")
    assert image.read_bytes().startswith(PNG_SIGNATURE)

    image.unlink()
    assert aio_twins.main(["--redraw"]) == 0
    assert f"drew {image}" in capsys.readouterr().out
    assert imread(image).shape[0] > 300  # the four panels, not an empty figure
    assert report.read_text() == text  # a redraw measures and appends nothing


def test_quick_takes_smaller_defaults_and_options_given_win() -> None:
    quick = aio_twins.arguments(["--quick", "--cycles", "7"])
    assert (quick.cycles, quick.rounds, quick.seconds) == (7, aio_twins.QUICK["rounds"], 1.0)
    assert quick.no_write is False  # writing is --no-write's call alone
    full = aio_twins.arguments(["--only", "sqlite", "--only", "mariadb"])
    assert (full.cycles, full.samples, full.seconds, full.workers) == (1000, 20, 3.0, 16)
    assert [pair.id for pair in aio_twins.selected(full)] == ["mariadb", "sqlite"]
    for wrong in (["--workers", "0"], ["--only", "redis"], ["--seconds", "0"]):
        with pytest.raises(SystemExit):
            aio_twins.arguments(wrong)


def test_an_asyncio_provider_not_written_yet_is_refused_with_the_way_around_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As locks.aio.ZooKeeperProvider was while this benchmark was written: a class with
    abstract methods left, which only fails once made, after the other pairs' servers."""

    class Unfinished(abc.ABC):
        @abc.abstractmethod
        async def _acquire(self) -> None: ...

    monkeypatch.setattr(aio, "ZooKeeperProvider", Unfinished, raising=False)
    with pytest.raises(SystemExit):
        aio_twins.arguments([])
    said = capsys.readouterr().err
    assert "abstract: _acquire" in said
    assert "--only mariadb --only postgresql --only sqlite" in said
    assert aio_twins.arguments(["--only", "sqlite"]).only == ["sqlite"]
