"""`benchmarks.aio` in its smallest form (it starts its own redis-server, as
`benchmarks.redis` does): every contender and crowd measured, every ratio a positive
number, the table printed, the record written where --json says and nowhere else with
--no-write; without it, the section, the record and the image published to a docs/ of
the test's own (never the real one), and the image drawn again from that record by
`benchmarks.plots`. Never speed: that is the benchmark's to report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from matplotlib.image import imread

from benchmarks import aio, harness, plots

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SMALLEST = [
    "--quick", "--cycles", "20", "--rounds", "2", "--samples", "2",
    "--seconds", "0.3", "--tasks", "40", "--keys", "4", "--threads", "2", "--peer-wait", "5",
]  # fmt: skip
CONTENDERS = {aio.OURS, aio.OURS_HASH, aio.PEER, aio.PEER_LIKE_OURS, aio.REDLOCK}
CROWDS = {aio.OURS, aio.OURS_HASH, aio.OURS_MATCHED, aio.PEER, aio.THREADED}


def test_the_smallest_run_measures_everyone_and_writes_only_where_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    default = tmp_path / "results" / "aio.json"
    monkeypatch.setattr(aio, "RESULTS", default)  # where a run without --json would write
    written = tmp_path / "run.json"
    assert aio.main([*SMALLEST, "--no-write", "--json", str(written)]) == 0
    out = capsys.readouterr().out
    assert not default.exists()

    saved = json.loads(written.read_text())
    assert saved["benchmark"] == "aio"
    assert {"utc", "cpus", "python", "arguments", "settings", "seconds"} <= set(saved)
    assert saved["arguments"]["tasks"] == 40 and saved["arguments"]["quick"] is True
    assert saved["title"] == aio.TITLE and saved["command"].startswith("python -m benchmarks.aio")

    rows = {row["name"]: row for row in saved["uncontended"]}
    assert set(rows) == CONTENDERS
    for name, row in rows.items():
        assert row["cycles_per_second"] > 0 and len(row["rounds"]) == 2, name
        if name == aio.PEER_LIKE_OURS:  # it waits as PEER does: not timed twice
            assert row["handoff_ms"] is None and row["handoff_samples"] == 0
        else:
            assert row["handoff_samples"] == 2, name
            assert 0 < row["handoff_ms"] <= row["handoff_p99_ms"], name

    crowds = {crowd["library"]: crowd for crowd in saved["crowds"]}
    assert set(crowds) == CROWDS
    for name, crowd in crowds.items():
        assert crowd["grants"] > 0 and crowd["grants_per_second"] > 0, name
        assert (crowd["errors"], crowd["cancelled"]) == (0, 0), (name, crowd["error"])
        assert 0 < crowd["p50_ms"] <= crowd["p99_ms"] <= crowd["max_ms"], name
    assert crowds[aio.OURS]["workers"] == 40 and crowds[aio.THREADED]["workers"] == 2
    assert crowds[aio.OURS_MATCHED]["workers"] == 2

    ratios = {ratio["id"]: ratio for ratio in saved["ratios"]}
    assert set(ratios) == {r.id for r in (*aio.RATIOS, *aio.CROWD_RATIOS)}
    for ratio_id, ratio in ratios.items():
        assert ratio_id.startswith("aio/")
        assert isinstance(ratio["value"], float) and ratio["value"] > 0, ratio_id
        assert ratio["compares"], ratio_id

    for name in CONTENDERS:
        assert f"| {name} |" in out, name
    for ratio_id in ratios:
        assert f"| {ratio_id} |" in out, ratio_id
    assert f"wrote {written}" in out
    assert "appended to" not in out and "drew" not in out


@pytest.fixture
def docs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A docs/ of the test's own, with a report holding an older run's aio section, in
    place of the real one wherever a run or `benchmarks.plots` would write."""
    root = tmp_path / "docs"
    report = root / "benchmarks.md"
    (root / "img").mkdir(parents=True)
    report.write_text(
        "# Benchmarks\n\n"
        f"## {aio.TITLE} (2000-01-01 00:00 UTC)\n\n`python -m benchmarks.aio`\n\n"
        "| contender | cycles/s |\n|---|---:|\n| x | 1 |\n\n"
        f"![{aio.TITLE}](img/aio.png)\n"
    )
    keep_last_links = plots.keep_last_links
    monkeypatch.setattr(harness, "DOCS", root)
    monkeypatch.setattr(harness, "REPORT", report)
    monkeypatch.setattr(plots, "IMAGES", root / "img")
    monkeypatch.setattr(plots, "AIO_RESULTS", root / "img" / "aio.json")
    monkeypatch.setattr(plots, "keep_last_links", lambda report=report: keep_last_links(report))
    monkeypatch.setattr(aio, "RESULTS", tmp_path / "results" / "aio.json")
    return root


def test_a_run_that_writes_publishes_its_section_record_and_image_and_plots_redraws_it(
    docs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report, image, kept = docs / "benchmarks.md", docs / "img/aio.png", docs / "img/aio.json"
    assert aio.main(SMALLEST) == 0
    out = capsys.readouterr().out
    assert aio.RESULTS.exists()  # the ratios, where a run without --json writes them
    assert f"drew {image}" in out and f"appended to {report}" in out

    text = report.read_text()
    section = text.split(f"## {aio.TITLE} (")[-1]  # the newest
    saved = json.loads(kept.read_text())
    assert section.startswith(f"{saved['stamp']})\n\n`{saved['command']}`\n")
    assert saved["command"] == "python -m benchmarks.aio " + " ".join(SMALLEST)
    assert saved == json.loads(aio.RESULTS.read_text())  # one record, kept twice
    for row in (*CONTENDERS, *(r["id"] for r in saved["ratios"])):
        assert f"| {row} |" in section, row
    for crowd in saved["crowds"]:
        assert f"| {crowd['library']} | {crowd['workers']:,} {crowd['mode']} |" in section
    assert "One run of" in section and "`docs/img/aio.json`" in section  # the machine line
    assert f"{aio.OURS} made" in " ".join(section.split())  # the summary, however wrapped
    assert text.count("](img/aio.png)") == 1  # the older section's link dropped
    assert section.rstrip().endswith(f"![{aio.TITLE}](img/aio.png)")
    assert image.read_bytes().startswith(PNG_SIGNATURE)

    image.unlink()
    assert plots.redraw(["aio"], report) == [image]
    assert image.read_bytes().startswith(PNG_SIGNATURE)
    assert report.read_text() == text  # linked already: the report left as it was
    assert imread(image).shape[0] > 300  # the four panels, not an empty figure


def test_without_the_peer_crowd_its_ratios_are_null_not_an_error() -> None:
    """A crowd left out gives null ratios, as a contender not measured does for
    `harness.write_ratios`."""
    crowd = aio.Crowd(
        library=aio.OURS, ours=True, mode="tasks", workers=10, keys=2, wait_s=30.0,
        seconds=1.0, grants=100, grants_per_second=100.0, p50_ms=1.0, p99_ms=4.0,
        max_ms=5.0, drain_s=0.0, timeouts=0, errors=0, error=None,
    )  # fmt: skip
    threaded = aio.Crowd(**{**crowd.__dict__, "library": aio.THREADED, "p99_ms": 2.0})
    values = {r.id: r.value([crowd, threaded]) for r in aio.CROWD_RATIOS}
    assert values["aio/redis-crowd-vs-threaded-redis"] == 1.0
    assert values["aio/redis-crowd-p99-vs-threaded-redis"] == 0.5  # the base's over ours
    assert values["aio/redis-crowd-vs-redis-asyncio-lock"] is None
    assert values["aio/redis-hash-crowd-vs-threaded-redis"] is None


def test_quick_takes_smaller_defaults_and_options_given_win() -> None:
    quick = aio.arguments(["--quick", "--cycles", "7"])
    assert (quick.cycles, quick.rounds, quick.seconds) == (7, aio.QUICK["rounds"], 1.0)
    assert quick.no_write is False  # writing is --no-write's call alone
    full = aio.arguments([])
    assert (full.cycles, full.samples, full.seconds, full.tasks) == (2000, 20, 4.0, 1000)
    with pytest.raises(SystemExit):
        aio.arguments(["--tasks", "0"])
