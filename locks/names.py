"""Argument checks made before any I/O, and the encodings that keep names in their namespace."""

from __future__ import annotations

import math
import unicodedata
from urllib.parse import quote

MAX_NAME_LENGTH = 255
# The longest duration any argument may ask for: a year. Longer ones are mistakes (use
# wait=None to wait for ever), and far longer ones overflow a server's expiry arithmetic
# (Redis PX, a BIGINT of microseconds) or `threading`'s timeouts.
MAX_SECONDS = 365 * 24 * 3600.0


def check_name(name: object, argument: str = "key") -> str:
    """Return `name` if it is a usable lock name, else raise naming `argument`."""
    if not isinstance(name, str):
        raise TypeError(f"{argument} must be a str, not {type(name).__name__}")
    if not name:
        raise ValueError(f"{argument} must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(
            f"{argument} is {len(name)} characters long; the limit is {MAX_NAME_LENGTH}"
        )
    if name.isprintable():  # the common case, checked in C
        return name
    for char in name:
        if unicodedata.category(char) in ("Cc", "Cs"):
            raise ValueError(f"{argument} must not contain control characters (found {char!r})")
    return name


def check_ttl(ttl: object, argument: str = "ttl") -> float | None:
    """`None` (watchdog lease) or a finite number of seconds > 0."""
    if ttl is None:
        return None
    return _positive_seconds(ttl, argument, allow_zero=False)


def check_wait(wait: object, argument: str = "wait") -> float | None:
    """`None` (block until acquired) or a finite number of seconds >= 0."""
    if wait is None:
        return None
    return _positive_seconds(wait, argument, allow_zero=True)


def check_acquire(
    key: object, ttl: object, wait: object, on_lost: object
) -> tuple[str, float | None, float | None]:
    """The arguments every acquire takes (a backend's or a chain's), checked before I/O."""
    checked = check_name(key), check_ttl(ttl), check_wait(wait)
    if on_lost is not None and not callable(on_lost):
        raise TypeError(f"on_lost must be callable, not {type(on_lost).__name__}")
    return checked


def check_count(value: object, argument: str) -> int:
    """A whole number of at least 1 (a pool's size); `True` is not one."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{argument} must be a whole number of at least 1, got {value!r}")
    return value


def check_seconds(value: object, argument: str) -> float:
    """A finite duration > 0 for a setting such as `watchdog_ttl` or a timeout."""
    return _positive_seconds(value, argument, allow_zero=False)


def _positive_seconds(value: object, argument: str, *, allow_zero: bool) -> float:
    # the common case first, in one test (every acquire passes here); NaN, infinities,
    # bools and anything out of range take the checks below
    # (`wait=0`, a try, is as common as a ttl)
    if (type(value) is float or type(value) is int) and (
        0 < value <= MAX_SECONDS or (allow_zero and value == 0)
    ):
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{argument} must be a number of seconds, not {type(value).__name__}")
    seconds = float(value)
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"{argument} must be finite, got {value!r}")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{argument} must be {bound} seconds, got {value!r}")
    if seconds > MAX_SECONDS:
        raise ValueError(
            f"{argument} must be at most {MAX_SECONDS:.0f} seconds (a year), got {value!r}"
        )
    return seconds


def redis_hash_tag(name: str) -> str:
    """`name` with braces escaped, so `{tag}` is the whole name and every key of a lock
    lands in one Redis Cluster slot (a name like `}x` would otherwise leave an empty tag)."""
    return name.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


def zookeeper_node_name(name: str) -> str:
    """`name` as one ZooKeeper path segment: UTF-8 percent-encoded, dots included, so no
    name can climb out of the lock root (`..`), split into segments (`/`) or carry
    characters ZooKeeper refuses. The encoding is one-to-one."""
    return quote(name, safe="-_:").replace(".", "%2E")


def _zookeeper_refuses(char: str) -> bool:
    """Characters ZooKeeper's path check refuses (PathUtils.validatePath)."""
    code = ord(char)
    return (
        code == 0
        or 0x01 <= code <= 0x1F
        or 0x7F <= code <= 0x9F
        or 0xD800 <= code <= 0xF8FF
        or 0xFFF0 <= code <= 0xFFFF
    )


def check_zookeeper_path(path: object, argument: str = "root") -> str:
    """An absolute ZooKeeper path that ZooKeeper accepts as it is: no empty, `.` or `..`
    segment, no trailing `/`, none of the characters it refuses."""
    if not isinstance(path, str):
        raise TypeError(f"{argument} must be a str, not {type(path).__name__}")
    if not path.startswith("/") or path == "/" or path.endswith("/"):
        raise ValueError(
            f"{argument} must be an absolute path without a trailing '/', got {path!r}"
        )
    for segment in path[1:].split("/"):
        if segment in ("", ".", ".."):
            raise ValueError(f"{argument} must not have an empty, '.' or '..' segment: {path!r}")
    bad = next((char for char in path if _zookeeper_refuses(char)), None)
    if bad is not None:
        raise ValueError(f"{argument} holds a character ZooKeeper refuses ({bad!r}): {path!r}")
    return path
