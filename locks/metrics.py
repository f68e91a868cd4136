"""Counting observers: how often each backend granted, degraded, lost or failed, and how
long callers waited and held. `Metrics` keeps plain counters in memory; the Prometheus
adapter (extra `prometheus`) exports the same figures.

    metrics = locks.metrics.Metrics()
    locks.add_observer(metrics)
    ...
    metrics.snapshot()["counts"][("redis", "acquired")]
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

from locks.events import Event, EventKind


@dataclass
class Timing:
    count: int = 0
    total: float = 0.0
    longest: float = 0.0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.total += seconds
        self.longest = max(self.longest, seconds)


class Metrics:
    """An observer counting events per (backend, kind), with wait and hold times."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[tuple[str, str]] = Counter()
        self.waited: dict[str, Timing] = {}
        self.held: dict[str, Timing] = {}

    def __call__(self, event: Event) -> None:
        with self._lock:
            self.counts[(event.backend, str(event.kind))] += 1
            if event.duration is None:
                return
            if event.kind is EventKind.ACQUIRED:
                self.waited.setdefault(event.backend, Timing()).add(event.duration)
            elif event.kind is EventKind.RELEASED:
                self.held.setdefault(event.backend, Timing()).add(event.duration)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "counts": dict(self.counts),
                "waited": {k: Timing(v.count, v.total, v.longest) for k, v in self.waited.items()},
                "held": {k: Timing(v.count, v.total, v.longest) for k, v in self.held.items()},
            }


class PrometheusObserver:
    """Exports events as `<namespace>_events_total{backend, kind}` and the wait and hold
    times as histograms `<namespace>_wait_seconds{backend}`, `<namespace>_hold_seconds{backend}`."""

    def __init__(self, registry: Any = None, namespace: str = "locks") -> None:
        try:
            import prometheus_client  # noqa: PLC0415 - an optional extra
        except ModuleNotFoundError as exc:
            raise ImportError(
                "PrometheusObserver needs the 'prometheus' extra: "
                "pip install 'fallback-locks[prometheus]'"
            ) from exc
        registry = prometheus_client.REGISTRY if registry is None else registry
        self.events = prometheus_client.Counter(
            f"{namespace}_events", "Lock events by backend and kind",
            ["backend", "kind"], registry=registry,
        )  # fmt: skip
        self.wait = prometheus_client.Histogram(
            f"{namespace}_wait_seconds", "Time an acquire took", ["backend"], registry=registry
        )
        self.hold = prometheus_client.Histogram(
            f"{namespace}_hold_seconds", "Time a lease was held", ["backend"], registry=registry
        )

    def __call__(self, event: Event) -> None:
        self.events.labels(event.backend, str(event.kind)).inc()
        if event.duration is None:
            return
        if event.kind is EventKind.ACQUIRED:
            self.wait.labels(event.backend).observe(event.duration)
        elif event.kind is EventKind.RELEASED:
            self.hold.labels(event.backend).observe(event.duration)
