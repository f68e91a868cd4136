"""`locks bench` against the suite's real servers, and the measuring core it shares with
benchmarks/. Figures are checked for sanity (positive, p50 <= p99), never for speed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from matplotlib.image import imread

from locks.backends import LocalProvider, RedisHashProvider
from locks.cli import main
from locks.measure import (
    acquire_percentiles,
    bench_key,
    cycle_rate,
    handoff_latencies,
    handoff_ms,
    measure_provider,
    percentiles,
    provider_ops,
)
from tests.backends import DEAD_ADDRESS
from tests.ports import free_port
from tests.servers import MariaDBServer, RedisServer

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FAST = ["--cycles", "40", "--samples", "2"]  # enough to run every code path, no more


def dead(kind: str) -> str:
    return DEAD_ADDRESS[kind].format(port=free_port())


def write_config(path: Path, backends: dict[str, str]) -> Path:
    """A TOML config with one `name = { ... }` line per backend."""
    lines = ["[backends]", *(f"{name} = {{ {spec} }}" for name, spec in backends.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


def table_rows(out: str) -> dict[str, list[str]]:
    """The printed table's rows by backend name (the lines after the dashes)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("-------"))
    rows = {}
    for line in lines[start + 1 :]:
        if not line.strip() or line.startswith("plot written"):
            break
        cells = line.split()
        rows[cells[0]] = cells[1:]
    return rows


def test_bench_measures_every_live_backend_and_names_the_dead_one(
    tmp_path: Path,
    redis_server: RedisServer,
    mariadb_server: MariaDBServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = write_config(
        tmp_path / "locks.toml",
        {
            "redis": f'type = "redis-hash", url = "{redis_server.url}"',
            "db": f'type = "database", url = "{mariadb_server.url}"',
            "local": 'type = "local"',
            "gone": f'type = "redis", url = "{dead("redis")}"',
        },
    )
    plot = tmp_path / "bench.png"
    assert main(["bench", "--config", str(config), *FAST, "--plot", str(plot)]) == 0
    out, err = capsys.readouterr()

    rows = table_rows(out)
    assert set(rows) == {"redis", "db", "local"}
    assert {name: cells[0] for name, cells in rows.items()} == {
        "redis": "redis-hash", "db": "database", "local": "local"
    }  # fmt: skip
    for name, (_type, rate, handoff, across, p50, p99) in rows.items():
        assert float(rate.replace(",", "")) > 0, name
        assert float(handoff) > 0, name
        # another process: measured where the backend excludes across processes
        assert (across == "-") == (name == "local") and (name == "local" or float(across) > 0)
        assert 0 <= float(p50) <= float(p99), name  # printed to 0.01 ms: local may show 0.00
    assert "gone: skipped" in err
    assert "gone" not in out

    data = plot.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    height, width, _channels = imread(plot).shape
    assert height > 100 and width > 100


def test_bench_exits_3_when_no_backend_answers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(
        tmp_path / "locks.toml",
        {
            "redis": f'type = "redis-hash", url = "{dead("redis-hash")}"',
            "db": f'type = "database", url = "{dead("mariadb")}"',
        },
    )
    plot = tmp_path / "bench.png"
    assert main(["bench", "--config", str(config), *FAST, "--plot", str(plot)]) == 3
    out, err = capsys.readouterr()
    assert "redis: skipped" in err and "db: skipped" in err
    assert "no backend answered" in err
    assert out == ""
    assert not plot.exists()


def test_bench_backends_option_selects_and_rejects_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(
        tmp_path / "locks.toml",
        {"local": 'type = "local"', "gone": f'type = "redis", url = "{dead("redis")}"'},
    )
    assert main(["bench", "--config", str(config), *FAST, "--backends", "local"]) == 0
    out, err = capsys.readouterr()
    assert set(table_rows(out)) == {"local"}
    assert "gone" not in err  # not selected, so not even pinged

    assert main(["bench", "--config", str(config), "--backends", "local,nope"]) == 2
    assert "unknown backend 'nope' (configured: local, gone)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["bench", "--config", str(config), "--cycles", "0"])
    assert exited.value.code == 2


def test_plot_without_matplotlib_names_the_extra_and_exits_2(tmp_path: Path) -> None:
    """A real `locks` process in which matplotlib cannot be imported (a None entry in
    sys.modules is how Python spells "this module is not importable")."""
    config = write_config(tmp_path / "locks.toml", {"local": 'type = "local"'})
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["matplotlib"] = None
        from locks.cli import main
        sys.exit(main(["bench", "--config", {str(config)!r}, "--plot", "out.png"]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "fallback-locks[plot]" in done.stderr
    assert done.stdout == ""  # refused before measuring anything
    assert not (tmp_path / "out.png").exists()


def test_measure_functions_give_sane_figures(redis_server: RedisServer) -> None:
    for provider in (LocalProvider(), RedisHashProvider(redis_server.url)):
        try:
            acquire, release = provider_ops(provider)
            key = bench_key()
            assert key.startswith("bench:")
            assert cycle_rate(acquire, release, key, 30) > 0
            latencies = handoff_latencies(acquire, release, 3, label=provider.name, settle=0.02)
            assert len(latencies) == 3 and all(ms > 0 for ms in latencies)
            assert handoff_ms(acquire, release, 1) > 0
            tail = acquire_percentiles(acquire, release, key, 50)
            assert 0 < tail.p50 <= tail.p99 and tail.samples == 50
            figures = measure_provider(provider, cycles=20, samples=1)
            assert figures.cycles_per_second > 0 and figures.handoff_ms > 0
            assert 0 < figures.acquire.p50 <= figures.acquire.p99
        finally:
            provider.close()


def test_percentiles_and_argument_checks() -> None:
    tail = percentiles([float(v) for v in range(1, 101)])
    assert tail.p50 == pytest.approx(50.5) and tail.p99 == pytest.approx(99.01)
    assert percentiles([3.0]) == percentiles([3.0])  # one sample is its own p50 and p99
    assert percentiles([3.0]).p99 == 3.0
    with pytest.raises(ValueError, match="no latencies"):
        percentiles([])
    acquire, release = provider_ops(LocalProvider())
    with pytest.raises(ValueError, match="cycles"):
        cycle_rate(acquire, release, bench_key(), 0)
    with pytest.raises(ValueError, match="samples"):
        handoff_ms(acquire, release, 0)
