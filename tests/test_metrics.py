"""Counting observers, in memory and for Prometheus."""

from __future__ import annotations

import threading

import prometheus_client

from locks import FallbackChain, add_observer, remove_observer
from locks.backends import LocalProvider, RedisProvider
from locks.metrics import Metrics, PrometheusObserver
from tests.ports import free_port


def test_metrics_count_outcomes_per_tier_and_time_waits_and_holds(key: str) -> None:
    dead = RedisProvider(f"redis://127.0.0.1:{free_port()}/0", name="redis")
    chain = FallbackChain([dead, LocalProvider()])
    metrics = Metrics()
    registry = prometheus_client.CollectorRegistry()
    prometheus = PrometheusObserver(registry)
    add_observer(metrics)
    add_observer(prometheus)
    try:
        lease = chain.acquire(key, ttl=5)
        assert lease is not None
        other = threading.Thread(target=lambda: chain.acquire(key, ttl=5, wait=0.05))
        other.start()
        other.join()
        chain.release(lease)
    finally:
        remove_observer(metrics)
        remove_observer(prometheus)
        dead.close()
    counts = metrics.snapshot()["counts"]
    assert counts[("redis", "backend_error")] >= 1
    assert counts[("redis", "degraded")] >= 1
    assert counts[("local", "acquired")] == 1
    assert counts[("local", "timed_out")] == 1
    assert counts[("local", "released")] == 1
    assert metrics.snapshot()["held"]["local"].count == 1
    assert metrics.snapshot()["waited"]["local"].count == 1

    def sample(name: str, **labels: str) -> float:
        value = registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    assert sample("locks_events_total", backend="local", kind="acquired") == 1
    assert sample("locks_events_total", backend="redis", kind="degraded") >= 1
    assert sample("locks_hold_seconds_count", backend="local") == 1
