"""Objects that start afresh in a forked child, where their threads are gone and a lock
one of those threads held would stay held for good."""

from __future__ import annotations

import os
import weakref
from typing import Protocol


class StartsAfresh(Protocol):
    def after_fork_in_child(self) -> None: ...


_registered: weakref.WeakSet[StartsAfresh] = weakref.WeakSet()


def start_afresh_when_forked(instance: StartsAfresh) -> None:
    """Call `instance.after_fork_in_child()` in every forked child, while it lives."""
    _registered.add(instance)


def _after_fork_in_child() -> None:
    for instance in list(_registered):
        instance.after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
