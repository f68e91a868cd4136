"""What only the asyncio file provider can get wrong: an operation cut off by a
cancellation, a flock a frozen process holds kept off the loop, a task and a thread on
one name. (The contract suite and the model run over it too: kind aio-file.)"""

from __future__ import annotations

import asyncio
import fcntl
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from locks import aio
from locks.backends import FileProvider as ThreadedFile
from locks.errors import BackendUnavailable, ConfigError
from locks.provider import Lease
from tests.test_aio import Lag, LagMeter, run


def free(directory: Path, key: str) -> bool:
    provider = ThreadedFile(directory)
    lease = provider.acquire(key, ttl=5, wait=0)
    if lease is not None:
        provider.release(lease)
    provider.close()
    return lease is not None


def test_a_cancelled_acquires_grant_is_released_after_it_is_made_never_before(
    tmp_path: Path, key: str
) -> None:
    """The acquire's operation is slow (a file system that stalls: here it waits for the
    test) when its task is cancelled, and takes the name afterwards. The release that
    undoes it waits for that: run at once it would find no grant, and the grant would
    stay for its ttl."""
    go_on = threading.Event()

    async def main() -> None:
        provider = aio.FileProvider(tmp_path)
        real = provider._try_now

        def stalled(*args: Any) -> tuple[Any, float]:
            go_on.wait(10)
            return real(*args)

        provider._try_now = stalled  # type: ignore[method-assign,assignment]
        try:
            task = asyncio.create_task(provider.acquire(key, ttl=60))
            await asyncio.sleep(0.2)  # its operation is under way, on a thread
            assert not task.done()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.sleep(0.2)  # a release run at once would have run by now
            go_on.set()
        finally:
            go_on.set()
            await provider.close()  # waits for what runs in the background

    run(main)
    assert free(tmp_path, key), "the cancelled acquire's grant was left in its file"


def test_a_flock_held_by_a_frozen_process_is_waited_for_off_the_loop(
    tmp_path: Path, key: str
) -> None:
    """A name's file flock'ed by another process (frozen mid-operation): the acquire
    waits `flock_timeout` for it, then says the backend is unavailable; the loop ticks
    on all along."""

    async def main() -> Lag:
        provider = aio.FileProvider(tmp_path, flock_timeout=0.5)
        try:
            await provider.ping()
            path = provider.path_of(key)
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(descriptor, fcntl.LOCK_EX)  # as a process frozen inside `_transact`
            try:
                meter = LagMeter()
                meter.start()
                started = time.monotonic()
                with pytest.raises(BackendUnavailable, match="flock"):
                    await provider.acquire(key, ttl=10)
                assert time.monotonic() - started >= 0.4
                return await meter.stop()
            finally:
                os.close(descriptor)
        finally:
            await provider.close()

    lag = run(main)
    assert lag.within(0.1), f"the loop lagged {lag}: the flock was waited for on it"


def test_a_task_and_a_thread_exclude_each_other_and_a_release_wakes_the_waiting_task(
    tmp_path: Path, key: str
) -> None:
    threaded = ThreadedFile(tmp_path)
    held = threaded.acquire(key, ttl=30)
    assert held is not None

    async def main() -> float:
        provider = aio.FileProvider(tmp_path)
        try:
            assert await provider.acquire(key, ttl=30, wait=0) is None
            threading.Timer(0.3, threaded.release, args=(held,)).start()
            started = time.monotonic()
            lease: Lease | None = await provider.acquire(key, ttl=30, wait=5)
            assert lease is not None
            waited = time.monotonic() - started
            assert lease.fence > held.fence
            await provider.release(lease)
            return waited
        finally:
            await provider.close()

    try:
        waited = run(main)
    finally:
        threaded.close()
    assert waited < 1.0, f"the waiting task took {waited:.2f} s after a release at 0.3 s"


def test_bad_paths_are_refused_before_any_io() -> None:
    with pytest.raises(ValueError, match="path"):
        aio.FileProvider("")
    with pytest.raises(TypeError, match="path"):
        aio.FileProvider(42)  # type: ignore[arg-type]


def test_the_same_toml_gives_an_asyncio_file_backend(tmp_path: Path) -> None:
    config = {
        "backends": {"files": {"type": "file", "path": str(tmp_path)}},
        "scenarios": {"default": {"chain": ["files"]}},
    }

    async def main() -> str:
        registry = aio.from_config(config)
        try:
            async with registry.lock("default", "aio-file-config", ttl=5) as lease:
                return lease.backend
        finally:
            await registry.close()

    assert run(main) == "files"
    with pytest.raises(ConfigError):
        aio.from_config({"backends": {"files": {"type": "file"}}})  # no path
