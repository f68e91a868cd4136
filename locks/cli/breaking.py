"""`locks break NAME`: free a lock whose holder is stuck or gone, on every configured
backend (or one, `--backend`), after showing who holds it and asking.

The holder is not asked: its next renewal, extend or release fails and its `on_lost`
runs, and the next grant's fence is above its own, so storage that checks fences
refuses its late writes. Until it notices, it may still act as if it held the lock:
break only a lock whose holder you know is stuck or dead. Each break is logged as a
`broken` event naming who broke it. A `local` backend holds locks inside one process
and cannot be broken from another. Exit code 0 when every backend asked answered, 3
when one could not be reached, 2 when not confirmed.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from locks.cli import UNAVAILABLE, USAGE
from locks.cli.common import backend_type, command, load, note
from locks.cli.inspect import describe
from locks.config import Registry
from locks.errors import BackendUnavailable, LockError
from locks.names import check_name
from locks.owner import who


def register(commands: Any) -> None:
    parser = command(commands, "break", "free a stuck lock (asks first)", __doc__, run)
    parser.add_argument("name", help="the lock name, exactly as the application passes it")
    parser.add_argument("--backend", metavar="B", help="only this configured backend")
    parser.add_argument("--yes", action="store_true", help="do not ask (for scripts)")


def run(args: argparse.Namespace) -> int:
    name = check_name(args.name, "name")
    loaded = load(args.config)
    registry = loaded.registry
    try:
        backends = _breakable(registry, args.backend)
        if not args.yes and not _confirmed(registry, backends, name):
            note("not broken: answer y to break it, or pass --yes")
            return USAGE
        failed = False
        by = f"{who()} (locks break)"
        for backend in backends:
            try:
                broken = registry.backend(backend).break_lock(name, by=by)  # type: ignore[attr-defined]
            except LockError as exc:
                failed = failed or isinstance(exc, BackendUnavailable)
                print(f"{backend}: not broken: {exc}")
                continue
            if broken is None:
                print(f"{backend}: free, nothing to break")
            else:
                print(f"{backend}: broken; it was held by {broken.owner} (fence {broken.fence})")
        return UNAVAILABLE if failed else 0
    finally:
        registry.close()


def _breakable(registry: Registry, only: str | None) -> list[str]:
    """The backends to break on: `only`, or every one that can be broken from here."""
    if only is not None:
        if only not in registry:
            raise ValueError(f"backend: {only!r} is not configured (have: {', '.join(registry)})")
        if not hasattr(registry.backend(only), "break_lock") or _in_process(registry, only):
            raise ValueError(f"backend: {only!r} cannot be broken from another process")
        return [only]
    return [b for b in registry if hasattr(registry.backend(b), "break_lock")
            and not _in_process(registry, b)]  # fmt: skip


def _in_process(registry: Registry, backend: str) -> bool:
    capabilities = getattr(registry.backend(backend), "capabilities", None)
    return capabilities is not None and not capabilities.cross_process


def _confirmed(registry: Registry, backends: list[str], name: str) -> bool:
    """Show who holds `name` where it would be broken, and ask."""
    for backend in backends:
        try:
            holder = registry.backend(backend).holder(name)  # type: ignore[attr-defined]
        except (LockError, NotImplementedError) as exc:
            print(f"{backend} ({backend_type(registry, backend)}): cannot tell: {exc}")
            continue
        owner, _, fence, left, _ = describe(holder)
        held = owner if holder is None else f"held by {owner}, fence {fence}, {left} left"
        print(f"{backend} ({backend_type(registry, backend)}): {held}")
    try:
        answer = input(f"Break {name!r} on {', '.join(backends)}? [y/N] ")
    except EOFError:  # nobody to answer (a script without --yes)
        print(file=sys.stderr)
        return False
    return answer.strip().lower() in ("y", "yes")
