"""Who holds a lock in async code: the task, not the thread.

Every task on an event loop runs on one thread: with the thread as owner, any task would
re-enter (or release) a lock another task holds. A task's id is drawn once, from the
same series as threads' (`locks.owner.new_owner`), and kept only as long as the task
is: a finished task's id is never handed to another one. A child task is another
owner, as a thread started by a thread is."""

from __future__ import annotations

import asyncio
import contextvars
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

from locks.owner import new_owner

_owners: weakref.WeakKeyDictionary[asyncio.Task[object], str] = weakref.WeakKeyDictionary()
_acting: contextvars.ContextVar[str | None] = contextvars.ContextVar("locks_acting", default=None)


@contextmanager
def acting_for_task(owner: str) -> Iterator[None]:
    """Run the block as `owner`: a quorum asks its members in tasks of their own on
    behalf of the task that called it, whose leases (and reentrancy) they must be. Set
    in the asking task's own context, so it ends with that task."""
    reset = _acting.set(owner)
    try:
        yield
    finally:
        _acting.reset(reset)


def task_owner() -> str:
    """The calling task's owner id (or whom it acts for); `RuntimeError` outside a task."""
    acting = _acting.get()
    if acting is not None:
        return acting
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("locks.aio is called from a task on a running event loop")
    owner = _owners.get(task)
    if owner is None:
        owner = _owners[task] = new_owner()
    return owner
