"""`benchmarks.scale`'s smallest points against the suite's servers (issue 20): the
counts must add up and release must leave nothing held. Never speed: that is the
benchmark's to report, on a machine where it means something."""

from __future__ import annotations

from pathlib import Path

import redis

from benchmarks import scale
from tests.servers import MariaDBServer, RedisServer


def test_redis_points_count_renewals_grants_and_keys_and_release_leaves_no_lock(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    ours = scale.held_leases(redis_server.url, 5, window=1.5)
    assert (ours["held"], ours["lost"], ours["failure"]) == (5, 0, None)
    assert ours["renewals_per_second"] and ours["renewals_per_second"] > 0
    assert ours["calls_per_renewal"] and ours["calls_per_renewal"] > 0
    assert ours["library"] == "fallback-locks redis"
    longer = scale.held_leases(redis_server.url, 2, window=1.0, ttl=1.5)  # a row says its ttl
    assert longer["library"] == "fallback-locks redis, watchdog_ttl 1.5 s"
    assert (longer["held"], longer["lost"], longer["period_s"]) == (2, 0, 0.5)

    peer = scale.peer_held_locks(redis_server.url, 3, window=2.5)
    assert (peer["held"], peer["lost"], peer["failure"]) == (3, 0, None)
    assert peer["threads"] >= 3  # a renewal thread per lock

    admin = redis.Redis.from_url(redis_server.url)
    try:
        crowd = scale.crowd_threads(
            scale.Target("redis", redis_server.url), 2, 1, 0.5, lambda: scale.script_calls(admin)
        )
    finally:
        admin.close()
    assert crowd["grants"] > 0 and crowd["grants_per_second"] > 0
    assert (crowd["errors"], crowd["timeouts"]) == (0, 0)
    assert crowd["p50_ms"] is not None and crowd["p99_ms"] is not None
    assert 0 < crowd["p50_ms"] <= crowd["p99_ms"]
    assert crowd["calls_per_grant"] and crowd["calls_per_grant"] >= 2  # acquire + release

    memory = scale.redis_memory(redis_server.url, 20)
    assert memory["units_per_lock"] >= 1  # the lock key, and its fence counter
    assert memory["left"]["lock keys"] == 0
    assert memory["left"]["keys without a TTL"] == 0

    results = scale.ScaleResults(
        title="t", stamp="s", command="c", seconds=1.0, settings={}, leases=[ours, peer],
        crowds=[crowd], memory=[memory],
    )  # fmt: skip
    assert scale.draw_scale("scale", results, tmp_path / "scale.png").stat().st_size > 0
    settings = {**scale.machine(0.0), "redis": "7"}
    text = scale.report(leases=[ours, peer], crowds=[crowd], memory=[memory],
                        settings=settings, seconds=1.0, plan=scale.QUICK)  # fmt: skip
    assert "| fallback-locks redis | 5 |" in text


def test_database_keeps_one_row_per_lock_and_only_free_rows_after_release(
    mariadb_server: MariaDBServer,
) -> None:
    row = scale.database_memory(mariadb_server, 20)
    assert row["units_per_lock"] == 1
    assert row["left"] == {"live rows": 0, "free rows": 20}  # kept for their fences
    assert row["bytes_per_lock"] is not None and row["bytes_per_lock"] >= 0
