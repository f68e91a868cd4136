"""File backend: named locks shared by the processes of one host through a directory.

Needs nothing beyond the standard library, so a core install (no extra) has a lock that
excludes across processes. Each lock name has one small file in the directory, holding
its lease as JSON: owner, token, expiry, fence, and the name itself for whoever reads it.

- **A flock per operation, not per lease.** An operation opens the name's file, takes
  `flock` for its read-modify-write (microseconds; shared for a read) and closes it. No process
  keeps a flock while it holds a lock, so one that dies never leaves a file locked, and
  a holder that dies frees the name when its lease runs out: the lease is data, like
  the database backend's row, not a bare flock tied to a process and its forked
  children.
- **Expiry** is wall-clock time (`time.time()`): every process is on this host and
  reads one clock. A step of that clock moves every expiry with it (see the docs).
- **Fences** count on from the file's last one and never reset: a freed name keeps its
  file and its fence. A file that is new (or was removed behind our back) starts from
  the clock in microseconds, above every fence it can have given before: a grant takes
  longer than a microsecond, so no fence runs ahead of the clock.
- **File names** are a readable prefix of the name plus 128 bits of its SHA-256: no name
  can reach outside the directory, and two names never share a file.
- **Waiting** polls (the standard library has no portable file watch), from 1 ms up to
  `_MAX_PAUSE` apart. Only the first waiter of a process on a name polls, the others
  queue behind it (`Wakeups`, one per directory and process); a release by a thread of
  this process wakes the first at once.
- **Threads.** A process's threads take a per-name stripe lock before the file, so one
  thread at a time has a name's file open, and a fork never happens mid-operation: a
  child that inherited an open, flock'ed descriptor would keep the file locked for its
  whole life.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import hashlib
import json
import os
import random
import re
import tempfile
import threading
import time
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from locks.backends.wakeups import Wakeups
from locks.base import ProviderBase
from locks.keeper import Grant, LeaseKeeper
from locks.names import check_seconds
from locks.provider import Capabilities, Holder, Lease
from locks.steps import Steps, call, run

T = TypeVar("T")

_FIRST_PAUSE = 0.001  # s between a waiter's first tries
_MAX_PAUSE = 0.01  # s between later ones: the hand-off latency across processes
_QUEUED_PAUSE = 1.0  # s a queued waiter sleeps at most before it looks again
_FLOCK_PAUSE = 0.0001  # s between tries at a key's flock another process holds
_READ_MAX = 8192  # bytes; a record is under 1.2 kB (a 255-character name is <= 1020 bytes)
_PREFIX_MAX = 40  # characters of the name kept readable in its file's name
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_STRIPES = 64


@functools.lru_cache(maxsize=4096)  # a hash and a regex per operation cost more than its I/O
def file_name(key: str) -> str:
    """The file that holds `key`'s lease, inside the directory: `[A-Za-z0-9_.-]` only,
    never `.` or `..`, never hidden, unique per name."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    readable = _UNSAFE.sub("_", key[:_PREFIX_MAX]).lstrip(".")
    return f"{readable}-{digest}.lock" if readable else f"{digest}.lock"


class _Stripes:
    """Per-name locks of this process's threads, held over each file operation. Every
    one is taken before a fork and let go after it on both sides, so no descriptor of
    a key's file is open (and flock'ed) when a process forks."""

    def __init__(self) -> None:
        self.locks = [threading.Lock() for _ in range(_STRIPES)]
        os.register_at_fork(before=self._hold_all, after_in_parent=self._free_all,
                            after_in_child=self._free_all)  # fmt: skip

    def of(self, key: str) -> threading.Lock:
        return self.locks[hash(key) % _STRIPES]

    def _hold_all(self) -> None:
        for lock in self.locks:
            lock.acquire()

    def _free_all(self) -> None:
        for lock in self.locks:
            lock.release()


_stripes = _Stripes()

# one line of waiters per directory and process, whichever provider object they use, so
# a release through one wakes a waiter of another at once
_wakeups: dict[str, Wakeups] = {}
_wakeups_lock = threading.Lock()


def _wakeups_of(directory: str) -> Wakeups:
    with _wakeups_lock:
        return _wakeups.setdefault(directory, Wakeups())


_QUOTE = json.encoder.encode_basestring  # a JSON string, non-ASCII kept as it is
_DECODER = json.JSONDecoder()


class _Record(NamedTuple):
    """A name's lease as its file holds it. Free: no owner (expiry 0)."""

    name: str
    owner: str
    token: str
    fence: int
    expires: float  # wall-clock seconds

    def held(self, now: float) -> bool:
        return bool(self.owner) and self.expires > now

    def grant_of(self, lease: Lease) -> bool:
        """Whether this record is `lease`'s grant (expired or not)."""
        return bool(self.owner) and self.owner == lease.owner and self.token == lease.token

    def freed(self) -> _Record:
        """Free, and keeping its fence: the next grant counts on from it."""
        return _Record(self.name, "", "", self.fence, 0.0)

    def encode(self) -> bytes:
        # by hand: a third of json.dumps's cost; repr of a finite float is valid JSON
        return (f'{{"name":{_QUOTE(self.name)},"owner":{_QUOTE(self.owner)},'
                f'"token":{_QUOTE(self.token)},"fence":{self.fence},'
                f'"expires":{self.expires!r}}}').encode()  # fmt: skip

    @staticmethod
    def decode(raw: bytes) -> _Record | None:
        """The record in `raw`, or None for an empty or unreadable file. Only the first
        JSON value counts: a shorter record is written over a longer one before the
        file is cut to size, and a process may die in between."""
        try:
            data = _DECODER.raw_decode(raw.decode())[0]
            record = _Record(data["name"], data["owner"], data["token"], data["fence"],
                             float(data["expires"]))  # fmt: skip
        except (ValueError, KeyError, TypeError, OverflowError):
            return None
        kinds = (record.name, record.owner, record.token)
        if not all(isinstance(v, str) for v in kinds) or type(record.fence) is not int:
            return None
        return record


def _clock_fence() -> int:
    """The first fence of a file that has none: the clock in microseconds."""
    return time.time_ns() // 1000


class FileStore(LeaseKeeper):
    """Type `file`, what both faces share: the directory, the files, their flock'ed
    read-modify-writes (`_*_now`, each microseconds of system calls that may wait for a
    flock: the asyncio face runs them off its loop), and the waiting turns as steps.
    The threaded face (`FileProvider`) and the asyncio one (`locks.aio.FileProvider`)
    add only how they call and wait."""

    type_name = "file"

    capabilities = Capabilities(
        reentrant=True,
        expires=True,
        renewable=True,
        fair=False,
        fenced=True,
        cross_process=True,
        cross_host=False,
    )

    # PermissionError (a directory or file we may not write) is a configuration error,
    # never an outage; any other OSError (read-only or full file system, a directory
    # that cannot be made, a key's file left flock'ed by a frozen process) is an outage
    unavailable_errors = (OSError,)
    denied_errors = (PermissionError,)

    def _configure(self, path: str | os.PathLike[str], flock_timeout: float) -> None:
        if not isinstance(path, str | os.PathLike):
            raise TypeError(f"path must be a str or a path, not {type(path).__name__}")
        folder = os.fspath(path)
        if not isinstance(folder, str) or not folder or "\0" in folder:
            raise ValueError(f"path must name a directory, got {folder!r}")
        # absolute now: a later chdir must not move the locks
        self.directory = Path(os.path.abspath(folder))
        self.address = str(self.directory)
        self._prefix = os.path.join(self.address, "")  # file names are appended to it
        # an operation holds a name's flock for microseconds: one that waits this long
        # for it is behind a process frozen (SIGSTOP) mid-operation, an outage
        self.flock_timeout = check_seconds(flock_timeout, "flock_timeout")
        self._directory_made = False

    def path_of(self, key: str) -> Path:
        """The file that holds `key`'s lease."""
        return self.directory / file_name(key)

    def _domain(self) -> Hashable:
        return ("file", os.path.realpath(self.directory))

    # -- one operation on one file ---------------------------------------------------------

    def _make_directory(self) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._directory_made = True

    def _open(self, path: str, create: bool, exclusive: bool, give_up: float) -> int | None:
        """`path` open and flock'ed; None if it does not exist and `create` is false."""
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        while True:
            try:
                descriptor = os.open(path, flags, 0o666)
            except FileNotFoundError:
                if not create:
                    return None
                self._make_directory()  # removed meanwhile (a tmp cleaner): make it again
                descriptor = os.open(path, flags, 0o666)
            try:
                self._flock(descriptor, path, exclusive, give_up)
                if os.fstat(descriptor).st_nlink > 0:
                    return descriptor
            except BaseException:
                os.close(descriptor)
                raise
            os.close(descriptor)  # removed while we waited for it: the path is a new file

    def _flock(self, descriptor: int, path: str, exclusive: bool, give_up: float) -> None:
        """Lock the open file, trying until the monotonic `give_up`."""
        mode = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
        while True:
            try:
                fcntl.flock(descriptor, mode)
                return
            except BlockingIOError:
                if time.monotonic() >= give_up:
                    raise self._frozen(path) from None
                time.sleep(_FLOCK_PAUSE)

    def _frozen(self, path: str) -> TimeoutError:
        return TimeoutError(
            errno.ETIMEDOUT, f"still flock'ed after {self.flock_timeout:g} s "
            "(a process frozen mid-operation?)", path,
        )  # fmt: skip

    def _transact(
        self,
        key: str,
        change: Callable[[_Record | None], tuple[_Record | None, T]],
        *,
        create: bool = False,
        exclusive: bool = True,
    ) -> T:
        """Run `change` on `key`'s record (None: no file, or no record in it) under the
        file's flock; write the record it returns, if any; return its result."""
        if create and not self._directory_made:
            self._make_directory()
        path = self._prefix + file_name(key)
        give_up = time.monotonic() + self.flock_timeout  # for the stripe and the flock
        stripe = _stripes.of(key)
        if not stripe.acquire(timeout=self.flock_timeout):  # a thread here is stuck on it
            raise self._frozen(path)
        try:
            descriptor = self._open(path, create, exclusive, give_up)
            if descriptor is None:
                return change(None)[1]
            try:
                raw = os.pread(descriptor, _READ_MAX, 0)
                new, result = change(_Record.decode(raw))
                if new is not None:
                    data = new.encode()
                    os.pwrite(descriptor, data, 0)  # one write: all of it, or nothing
                    if len(data) < len(raw):
                        os.ftruncate(descriptor, len(data))
                return result
            finally:
                os.close(descriptor)  # and with it the flock
        finally:
            stripe.release()

    # -- the algorithm ---------------------------------------------------------------------

    def _wait_steps(
        self, waiter: Any, key: str, owner: str, token: str, ttl: float, *,
        deadline: float | None, left: float,
    ) -> Steps[Grant | None]:  # fmt: skip
        """A waiter's turns after a first try found `key` held for `left` more seconds:
        only the first waiter of this process on a key polls (`waiter.first`), the
        others queue behind it, woken when it leaves or when a release is made here."""
        delay = _FIRST_PAUSE
        while True:
            if waiter.first:
                # jittered backoff, never past the holder's expiry (a holder that died
                # frees the name then); a release here wakes it at once
                pause = min(random.uniform(delay / 2, delay), max(left, 0.0))
                delay = min(delay * 2, _MAX_PAUSE)
            else:  # woken when the head leaves, or when a release is made here
                pause = _QUEUED_PAUSE
            if deadline is not None:
                pause = min(pause, deadline - time.monotonic())
            yield from call(waiter, "sleep", pause)
            if waiter.first:
                grant, left = yield from call(self, "_try", key, owner, token, ttl)
                if grant is not None:
                    return grant  # type: ignore[no-any-return]
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def _try_now(self, key: str, owner: str, token: str, ttl: float) -> tuple[Grant | None, float]:
        """One try: the grant, or None and how long the holder's lease has left."""
        sent_at = time.monotonic()  # the lease's validity counts from here

        def take(record: _Record | None) -> tuple[_Record | None, tuple[Grant | None, float]]:
            now = time.time()
            if record is None:
                fence = _clock_fence()
            elif record.held(now) and record.owner != owner:
                return None, (None, record.expires - now)
            else:  # free, expired, or this owner's grant its process lost track of
                fence = record.fence + 1
            taken = _Record(key, owner, token, fence, now + ttl)
            return taken, (Grant(token, fence, 1, sent_at), 0.0)

        return self._transact(key, take, create=True)

    def _free_now(self, lease: Lease) -> bool:
        """Free `lease`'s grant (found by owner and token: a fence is not needed)."""

        def free(record: _Record | None) -> tuple[_Record | None, bool]:
            if record is None or not record.grant_of(lease):
                return None, False
            return record.freed(), True

        return self._transact(lease.key, free)

    def _extend_now(self, lease: Lease, ttl: float) -> bool:
        def extend(record: _Record | None) -> tuple[_Record | None, bool]:
            now = time.time()
            if record is None or not record.grant_of(lease) or not record.held(now):
                return None, False  # an expired grant is over: never brought back
            return record._replace(expires=now + ttl), True

        return self._transact(lease.key, extend)

    def _held_now(self, lease: Lease) -> bool:
        def held(record: _Record | None) -> tuple[None, bool]:
            return None, record is not None and record.grant_of(lease) and record.held(time.time())

        return self._transact(lease.key, held, exclusive=False)

    def _holder_now(self, key: str) -> Holder | None:
        def look(record: _Record | None) -> tuple[None, Holder | None]:
            now = time.time()
            if record is None or not record.held(now):
                return None, None
            return None, Holder(key, self.name, record.owner, None, record.fence,
                                record.expires - now)  # fmt: skip

        return self._transact(key, look, exclusive=False)

    def _end_now(self, key: str) -> Holder | None:
        """End whoever holds `key` now, whatever its owner (an operator breaking a stuck
        lock): its next extend, renewal or release finds it gone, and the next grant's
        fence is above the broken one's. The holder it ended, or None."""

        def end(record: _Record | None) -> tuple[_Record | None, Holder | None]:
            now = time.time()
            if record is None or not record.held(now):
                return None, None
            ended = Holder(key, self.name, record.owner, None, record.fence, record.expires - now)
            return record.freed(), ended

        return self._transact(key, end)

    def _probe_now(self) -> None:
        """Make the directory if it is missing, and create (and remove) a file in it."""
        with self._translated():
            self._make_directory()
            descriptor, probe = tempfile.mkstemp(prefix=".ping-", dir=self.directory)
            os.close(descriptor)
            os.unlink(probe)


class FileProvider(FileStore, ProviderBase):
    """Type `file`: one file per lock in a directory; the processes of one host."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        name: str = "file",
        watchdog_ttl: float = 30.0,
        flock_timeout: float = 1.0,
    ) -> None:
        super().__init__(name, watchdog_ttl)
        self._configure(path, flock_timeout)
        self._wakeups = _wakeups_of(self.address)

    def _acquire(
        self, key: str, owner: str, token: str, ttl: float, deadline: float | None
    ) -> Grant | None:
        grant, left = self._try(key, owner, token, ttl)
        if grant is not None or (deadline is not None and time.monotonic() >= deadline):
            return grant
        with self._wakeups.waiting(key) as waiter:
            return run(self._wait_steps(waiter, key, owner, token, ttl, deadline=deadline,
                                        left=left))  # fmt: skip

    def _try(self, key: str, owner: str, token: str, ttl: float) -> tuple[Grant | None, float]:
        return self._try_now(key, owner, token, ttl)

    def _release(self, lease: Lease) -> bool:
        released = self._free_now(lease)
        if released:
            self._wakeups.wake(lease.key)
        return released

    def _extend(self, lease: Lease, ttl: float) -> bool:
        return self._extend_now(lease, ttl)

    def _is_held(self, lease: Lease) -> bool:
        return self._held_now(lease)

    def _holder(self, key: str) -> Holder | None:
        return self._holder_now(key)

    def _break(self, key: str) -> Holder | None:
        ended = self._end_now(key)
        if ended is not None:
            self._wakeups.wake(key)
        return ended

    def ping(self) -> None:
        """Make the directory if it is missing, and create (and remove) a file in it."""
        self._probe_now()
