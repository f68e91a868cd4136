"""Who holds a lock: this process's identity plus a serial number per thread.

Not `threading.get_ident()`: Python hands a finished thread's ident to the next
thread, which would then re-enter a lock the dead thread never released. A
forked child draws a new process identity, so it never believes it holds a
lock its parent took.
"""

from __future__ import annotations

import getpass
import itertools
import os
import random
import secrets
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_process_id = secrets.token_hex(16)
_owner_prefix = _process_id + ":"
_serials = itertools.count(1)
_local = threading.local()
_random_bits = random.getrandbits


def _new_process_identity() -> None:
    global _process_id, _owner_prefix, _serials, _local
    _process_id = secrets.token_hex(16)
    _owner_prefix = _process_id + ":"
    _serials = itertools.count(1)
    _local = threading.local()


os.register_at_fork(after_in_child=_new_process_identity)


def process_id() -> str:
    """This process's identity: random, never reused, new in a forked child."""
    return _process_id


def new_owner() -> str:
    """A fresh owner id, `<process id>:<serial>`: one per thread, or per asyncio task."""
    return f"{_owner_prefix}{next(_serials)}"


def current_owner() -> str:
    """The calling thread's owner id."""
    owner: str | None = getattr(_local, "owner", None)
    if owner is None:
        owner = _local.owner = new_owner()
    return owner


@contextmanager
def acting_for(owner: str) -> Iterator[None]:
    """Run the block as `owner`: a quorum asks its members on pool threads on behalf of
    the thread that called it, whose leases (and reentrancy) they must be."""
    previous = getattr(_local, "owner", None)
    _local.owner = owner
    try:
        yield
    finally:
        _local.owner = previous


def in_this_process(owner: str) -> bool:
    """Whether `owner` was issued by this process (False in a forked child)."""
    return owner.startswith(_owner_prefix)


def new_token() -> str:
    """A fresh random token for one acquisition: 128 bits from `random`, not `secrets`.
    A token must be unique, not secret (whoever can read the lock store can delete the
    lock anyway), and `os.urandom` is a system call on every acquire. `random` is seeded
    from the OS and reseeds itself in a forked child, so parent and child never share
    a sequence."""
    return f"{_random_bits(128):032x}"


def who() -> str:
    """A person-readable name of this process, for the events that say who did
    something (`user@host pid N`)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = f"uid {os.getuid()}"
    return f"{user}@{socket.gethostname()} pid {os.getpid()}"
