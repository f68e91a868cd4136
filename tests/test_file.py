"""What is particular to the file backend; the contract suite covers the rest (kind
`file`). Every test works in a directory of its own."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from locks import AccessDenied, BackendUnavailable, FallbackChain, LockNotOwned, from_config
from locks.backends import FileProvider, LocalProvider
from locks.backends.file import file_name
from tests import workers
from tests.forks import in_forked_child
from tests.threads import in_thread

SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[FileProvider]:
    made = FileProvider(tmp_path / "locks", name="files")
    yield made
    made.close()


ESCAPES = ["..", ".", "../../etc/passwd", "/etc/passwd", "a/b", "a\\b", ".hidden", "~",
           "x" * 255, "ключ/../..", "a b:c*d?e"]  # fmt: skip


@pytest.mark.parametrize("key", ESCAPES)
def test_no_name_reaches_outside_the_directory(provider: FileProvider, key: str) -> None:
    lease = provider.acquire(key, ttl=30, wait=0)
    assert lease is not None
    path = provider.path_of(key)
    assert path.parent == provider.directory and path.is_file()
    assert path.name[0] != "." and set(path.name) <= set(
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-"
    )
    assert [p.name for p in provider.directory.iterdir()] == [path.name]
    provider.release(lease)


def test_names_that_read_alike_are_two_locks(provider: FileProvider) -> None:
    names = ["a/b", "a_b", "a\\b", "A_b"]
    assert len({file_name(name) for name in names}) == len(names)
    leases = [provider.acquire(name, ttl=30, wait=0) for name in names]
    assert all(lease is not None for lease in leases)


def test_the_directory_is_made_private_on_first_use(tmp_path: Path) -> None:
    provider = FileProvider(tmp_path / "a" / "b", name="files")  # no I/O yet
    assert not (tmp_path / "a").exists()
    provider.ping()
    assert (tmp_path / "a" / "b").stat().st_mode & 0o777 == 0o700
    provider.close()


def test_two_directories_are_two_domains_and_one_directory_is_one(tmp_path: Path, key: str) -> None:
    first = FileProvider(tmp_path / "one", name="files")
    other = FileProvider(tmp_path / "two", name="files")
    (tmp_path / "link").symlink_to(tmp_path / "one")
    same = FileProvider(tmp_path / "link", name="files")  # another path to the same directory
    held = first.acquire(key, ttl=30)
    assert held is not None
    elsewhere = in_thread(lambda: other.acquire(key, ttl=30, wait=0))
    assert elsewhere is not None and elsewhere.depth == 1  # not excluded by `first`
    again = same.acquire(key, ttl=30, wait=0)  # this thread re-enters through `same`
    assert again is not None and (again.depth, again.fence) == (2, held.fence)
    assert in_thread(lambda: same.acquire(key, ttl=30, wait=0)) is None
    for provider in (first, other, same):
        provider.close()


def test_a_killed_holder_frees_the_key_when_its_ttl_runs_out(
    provider: FileProvider, key: str
) -> None:
    held = SPAWN.Event()
    ttl = 1.0  # the child's watchdog lease: renewed every ttl/3 while it lives
    child = SPAWN.Process(
        target=workers.hold_until_killed, args=("file", provider.address, key, ttl, held)
    )
    child.start()
    try:
        assert held.wait(30), "the child never took the lock"
        holder = provider.holder(key)
        seen_at = time.monotonic()
        assert holder is not None and holder.fence is not None and holder.expires_in
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        killed_at = time.monotonic()
        if holder.expires_in - (killed_at - seen_at) > 0.2:  # (a starved machine: no time left)
            # no flock outlives the process; its lease does, until it runs out
            assert provider.acquire(key, ttl=30, wait=0) is None
        lease = provider.acquire(key, ttl=30, wait=ttl + 1)
        assert lease is not None
        assert time.monotonic() - killed_at <= ttl + 1
        assert lease.fence > holder.fence
        provider.release(lease)
    finally:
        child.kill()
        child.join()


def test_fences_never_reset(provider: FileProvider, tmp_path: Path, key: str) -> None:
    """A freed name keeps its file and its fence; a new provider, another process, or a
    file removed behind the backend's back (its fence then restarts from the clock)
    still gets a higher one."""
    first = provider.acquire(key, ttl=30)
    assert first is not None
    provider.release(first)
    assert provider.path_of(key).is_file()
    fresh = FileProvider(tmp_path / "locks", name="files")
    second = fresh.acquire(key, ttl=30, wait=0)
    assert second is not None and second.fence == first.fence + 1
    fresh.release(second)

    def in_child() -> list[bool]:
        lease = fresh.acquire(key, ttl=30, wait=0)
        return [lease is not None and lease.fence == second.fence + 1]

    assert in_forked_child(in_child) == [True]
    provider.path_of(key).unlink()
    third = fresh.acquire(key, ttl=30, wait=0)
    assert third is not None and third.fence > second.fence + 1
    provider.path_of(key).write_bytes(b"\0" * 64)  # torn by a crash: no record in it
    fourth = fresh.acquire(key, ttl=30, wait=0)
    assert fourth is not None and fourth.fence > third.fence
    fresh.close()


def test_a_directory_it_may_not_write_is_access_denied(key: str) -> None:
    """A configuration error (the wrong user, the wrong mode), not an outage: it names
    the backend and the path, and a chain raises it instead of degrading. As root, the
    check runs in a child that dropped to `nobody` (root may write anywhere)."""
    with tempfile.TemporaryDirectory() as parent:
        os.chmod(parent, 0o755)
        directory = Path(parent) / "locks"
        directory.mkdir(mode=0o555)

        def as_another_user() -> list[bool]:
            if os.geteuid() == 0:
                os.setegid(65534)
                os.seteuid(65534)
            provider = FileProvider(directory, name="files")
            chain = FallbackChain([provider, LocalProvider()], name="chain")
            verdicts = []
            calls: list[Callable[[], object]] = [
                provider.ping,
                lambda: chain.acquire(key, ttl=30, wait=0),
            ]
            for call in calls:
                try:
                    call()
                    verdicts.append(False)
                except AccessDenied as error:
                    message = str(error)
                    verdicts.append("file backend 'files'" in message and str(directory) in message)
            return verdicts

        assert in_forked_child(as_another_user) == [True, True]


def test_a_directory_that_cannot_be_made_is_unavailable(key: str) -> None:
    provider = FileProvider("/dev/null/locks", name="files")  # under a file: not even root
    with pytest.raises(BackendUnavailable, match="/dev/null/locks"):
        provider.ping()
    chain = FallbackChain([provider, LocalProvider()], name="chain")
    lease = chain.acquire(key, ttl=30, wait=0)
    assert lease is not None and lease.backend == "local"  # an outage: the chain degrades
    chain.release(lease)
    provider.close()


def test_a_file_left_flocked_by_a_frozen_process_is_an_outage_not_a_hang(
    provider: FileProvider, key: str
) -> None:
    """Operations hold a name's flock for microseconds; one held longer is a process
    stopped in the middle of one. Waiting on it would run past every `wait`."""
    stuck = FileProvider(provider.directory, name="files", flock_timeout=0.2)
    lease = stuck.acquire(key, ttl=30)
    assert lease is not None
    frozen = os.open(stuck.path_of(key), os.O_RDWR)  # another open file: another holder
    fcntl.flock(frozen, fcntl.LOCK_EX)
    try:
        started = time.monotonic()
        with pytest.raises(BackendUnavailable, match="flock'ed"):
            in_thread(lambda: stuck.acquire(key, ttl=30, wait=5))
        assert time.monotonic() - started < 2
    finally:
        os.close(frozen)
    stuck.release(lease)
    stuck.close()


def test_break_ends_the_holder_and_the_next_fence_is_higher(
    provider: FileProvider, key: str
) -> None:
    assert provider._break(key) is None  # nobody holds it
    lease = provider.acquire(key, ttl=30)
    assert lease is not None
    broken = in_thread(lambda: provider._break(key))  # an operator, from another owner
    assert broken is not None
    assert (broken.owner, broken.fence) == (lease.owner, lease.fence)
    assert provider.holder(key) is None
    assert not provider.is_held(lease)
    with pytest.raises(LockNotOwned):
        provider.extend(lease, 30)
    successor = in_thread(lambda: provider.acquire(key, ttl=30, wait=0))
    assert successor is not None and successor.fence > lease.fence
    assert provider._break(key) is not None
    assert provider._break(key) is None


def test_configured_by_type_name(tmp_path: Path, key: str) -> None:
    registry = from_config({
        "backends": {"files": {"type": "file", "path": str(tmp_path / "locks")}},
        "scenarios": {"jobs": {"chain": ["files"]}},
    })  # fmt: skip
    try:
        with registry.lock("jobs", key, ttl=30, wait=0) as lease:
            assert lease.backend == "files"
        assert (tmp_path / "locks" / file_name(key)).is_file()
    finally:
        registry.close()
