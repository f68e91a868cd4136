"""Running a call as another owner: on a thread of its own."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def in_thread(call: Callable[[], T]) -> T:
    """Run `call` on another thread (another owner) and return its result."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(call).result(timeout=60)
