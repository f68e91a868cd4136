"""`locks inspect NAME`: who holds this lock on each configured backend: owner, depth,
fence, time left, and how many wait where the server queues them (ZooKeeper).

A `local` backend only knows the locks of its own process, so from here it always looks
free. Exit code 0 when every backend answered, 3 when one could not be asked.
"""

from __future__ import annotations

import argparse
from typing import Any

from locks.cli import UNAVAILABLE
from locks.cli.common import backend_type, command, load, note, table
from locks.errors import BackendUnavailable, LockError
from locks.names import check_name
from locks.provider import Holder


def register(commands: Any) -> None:
    parser = command(commands, "inspect", "who holds a lock on each backend", __doc__, run)
    parser.add_argument("name", help="the lock name, exactly as the application passes it")


def describe(holder: Holder | None) -> list[str]:
    """owner, depth, fence, time left, waiters."""
    if holder is None:
        return ["free", "", "", "", ""]

    def shown(value: object) -> str:
        return "?" if value is None else str(value)

    left = "session" if holder.expires_in is None else f"{holder.expires_in:.1f} s"
    waiters = "" if holder.waiters is None else str(holder.waiters)
    return [holder.owner, shown(holder.depth), shown(holder.fence), left, waiters]


def run(args: argparse.Namespace) -> int:
    name = check_name(args.name, "name")
    loaded = load(args.config)
    registry = loaded.registry
    try:
        rows, failed = [], False
        for backend in registry:
            provider = registry.backend(backend)
            kind = backend_type(registry, backend)
            try:
                found = provider.holder(name)  # type: ignore[attr-defined]
            except LockError as exc:
                failed = True
                note(f"{backend}: {exc}")
                what = "(unavailable)" if isinstance(exc, BackendUnavailable) else "(error)"
                rows.append([backend, kind, what, "", "", "", ""])
                continue
            except (AttributeError, NotImplementedError):
                rows.append([backend, kind, "(cannot tell)", "", "", "", ""])
                continue
            if kind == "local" and found is None:
                rows.append([backend, kind, "free (in this process)", "", "", "", ""])
                continue
            rows.append([backend, kind, *describe(found)])
        print(f"{name!r} ({loaded.source})")
        print(table(["backend", "type", "holder", "depth", "fence", "left", "waiters"], rows))
        return UNAVAILABLE if failed else 0
    finally:
        registry.close()
