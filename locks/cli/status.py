"""`locks status`: one row per configured backend: does it answer, how fast, what its
circuit breaker would be after this probe, and what the kill-switch does to it.

Breakers live in each process; the column shows the state this probe leaves a fresh
process in (a backend that did not answer opens its breaker in every scenario whose
threshold one failure reaches). Exit code 0 when every backend answered, 1 otherwise.
"""

from __future__ import annotations

import argparse
from typing import Any

from locks.cli.common import (
    Probe,
    command,
    load,
    milliseconds,
    note,
    probe,
    switch_verdict,
    table,
)
from locks.config import Registry


def register(commands: Any) -> None:
    command(
        commands,
        "status",
        "reachability, latency, breaker and switch state per backend",
        __doc__,
        run,
    )


def breaker_states(registry: Registry, probes: dict[str, Probe]) -> dict[str, str]:
    """Feed each probe to every scenario's breaker of that tier; report what results."""
    states: dict[str, set[str]] = {name: set() for name in probes}
    for scenario in registry.scenarios:
        for tier, breaker in registry.chain(scenario).breakers.items():
            if probes[tier].reachable:
                breaker.success()
            else:
                breaker.failure()
            states[tier].add(str(breaker.state))
    return {name: "/".join(sorted(found)) or "(in no scenario)" for name, found in states.items()}


def run(args: argparse.Namespace) -> int:
    loaded = load(args.config)
    try:
        for line in loaded.notes:
            note(line)
        registry = loaded.registry
        probes = {name: probe(registry, name) for name in registry}
        breakers = breaker_states(registry, probes)
        rows = [
            [
                p.name,
                p.type,
                "yes" if p.reachable else "no",
                milliseconds(p.latency),
                breakers[p.name],
                switch_verdict(registry, p.name),
            ]
            for p in probes.values()
        ]
        print(f"config: {loaded.source}; switch: {registry.switch.state}")
        print(table(["backend", "type", "reachable", "latency", "breaker", "switch"], rows))
        for p in probes.values():
            if p.error:
                note(f"{p.name}: {p.error}")
        return 0 if all(p.reachable for p in probes.values()) else 1
    finally:
        loaded.registry.close()
