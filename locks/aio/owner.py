"""Who holds a lock in async code: the task, not the thread.

Every task on an event loop runs on one thread: with the thread as owner, any task would
re-enter (or release) a lock another task holds. A task's id is drawn once, from the
same series as threads' (`locks.owner.new_owner`), and kept only as long as the task
is: a finished task's id is never handed to another one. A child task is another
owner, as a thread started by a thread is."""

from __future__ import annotations

import asyncio
import weakref

from locks.owner import new_owner

_owners: weakref.WeakKeyDictionary[asyncio.Task[object], str] = weakref.WeakKeyDictionary()


def task_owner() -> str:
    """The calling task's owner id; `RuntimeError` outside a task."""
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("locks.aio is called from a task on a running event loop")
    owner = _owners.get(task)
    if owner is None:
        owner = _owners[task] = new_owner()
    return owner
