"""What the subcommands share: finding and loading the configuration, and printing."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import os
import stat
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from locks.config import BUILT_IN_TYPES, Registry, from_config
from locks.errors import LockError

CONFIG_ENV = "LOCKS_CONFIG"
DEFAULT_SCENARIO = "demo"

# The embedded default, for a machine with no servers and no config: Redis where it
# usually is, then a directory of lock files every process of this user on this machine
# shares (the standard library's: no extra needed), then this process. Its kill-switch
# file is in the same per-user folder, so `locks switch` works with no config too.
EMBEDDED_DEFAULT = """
[backends]
redis = {{ type = "redis-hash", url = "redis://127.0.0.1:6379/0" }}
file  = {{ type = "file", path = {locks} }}
local = {{ type = "local" }}

[scenarios]
demo = {{ chain = ["redis", "file", "local"] }}

[switch]
file = {switch}
"""

# the client package each backend type needs (the extras of `pip install fallback-locks`)
_CLIENTS = {"redis": "redis", "redis-hash": "redis", "zookeeper": "kazoo", "database": "sqlalchemy"}


@dataclass
class Loaded:
    """A registry and where it came from, with what was left out on the way."""

    registry: Registry
    source: str  # a path, or "embedded default"
    path: Path | None  # the TOML file (written out for the embedded default), for workers
    notes: list[str]


def quiet_drivers() -> None:
    """The commands report what matters themselves: without a handler, Python would
    print every warning a driver logs (kazoo: each reconnection try to a dead
    ZooKeeper). The library's own logger has a NullHandler already."""
    for name in ("kazoo",):
        logging.getLogger(name).addHandler(logging.NullHandler())


def command(
    commands: Any,
    name: str,
    summary: str,
    doc: str | None,
    run: Callable[[argparse.Namespace], int],
    *,
    config: bool = True,
) -> argparse.ArgumentParser:
    """A subcommand whose --help shows its module's docstring as written, with --config."""
    parser: argparse.ArgumentParser = commands.add_parser(
        name,
        help=summary,
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # -v after the subcommand too (`locks status -v`); unset there, the top's stands
    parser.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="also print the library's own log")  # fmt: skip
    if config:
        add_config_option(parser)
    parser.set_defaults(run=run)
    return parser


def add_config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        help=f"a TOML configuration (default: ${CONFIG_ENV}, else ./locks.toml, else the "
        "embedded default: redis -> lock files -> local)",
    )


def default_folder() -> Path:
    """One folder per user on this machine, for the embedded default: its lock files,
    its switch file and its TOML, so `demo`, `status`, `inspect` and `switch` all see
    the same locks and the same switch."""
    folder = Path(tempfile.gettempdir()) / f"fallback-locks-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def embedded_default() -> tuple[str, list[str]]:
    """The default configuration's TOML, without the backends whose client package is
    not installed (with a note saying so)."""
    folder = default_folder()
    paths = {"locks": folder / "locks", "switch": folder / "switch.toml"}
    data = tomllib.loads(
        EMBEDDED_DEFAULT.format(**{k: toml_string(str(p)) for k, p in paths.items()})
    )
    notes = []
    for name, spec in list(data["backends"].items()):
        client = _CLIENTS.get(spec["type"])
        if client and importlib.util.find_spec(client) is None:
            notes.append(f"{name}: left out, its client {client!r} is not installed")
            del data["backends"][name]
    chain = [
        tier for tier in data["scenarios"][DEFAULT_SCENARIO]["chain"] if tier in data["backends"]
    ]
    lines = ["[backends]"]
    lines += [f"{name} = {_inline(spec)}" for name, spec in data["backends"].items()]
    lines += ["", "[scenarios]", f"{DEFAULT_SCENARIO} = {{ chain = {_inline(chain)} }}"]
    lines += ["", "[switch]", f"file = {_inline(data['switch']['file'])}", ""]
    return "\n".join(lines), notes


def _inline(value: Any) -> str:
    """A TOML inline value (strings, numbers, lists and tables of them)."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_inline(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_inline(v) for v in value) + "]"
    if isinstance(value, str):
        return toml_string(value)
    return str(value)


def toml_string(value: str) -> str:
    """A TOML basic string: JSON's escaping is valid TOML for every character."""
    return json.dumps(value, ensure_ascii=False)


def config_path(explicit: str | None) -> Path | None:
    """The configuration file to use, or None for the embedded default."""
    if explicit:
        return Path(explicit)
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV])
    local = Path("locks.toml")
    return local if local.is_file() else None


def load(explicit: str | None) -> Loaded:
    """Load the configuration the options name (see `add_config_option`)."""
    path = config_path(explicit)
    if path is not None:
        return Loaded(from_config(path), str(path), path, [])
    text, notes = embedded_default()
    written = default_folder() / "embedded.toml"
    written.write_text(text)
    return Loaded(from_config(written), "embedded default", written, notes)


def backend_type(registry: Registry, name: str) -> str:
    """The configured type of a backend, as config names it."""
    provider = registry.backend(name)
    type_name = getattr(provider, "type_name", None)
    if isinstance(type_name, str):
        return type_name
    spec = f"{type(provider).__module__}:{type(provider).__name__}"
    return next((t for t, s in BUILT_IN_TYPES.items() if s == spec), type(provider).__name__)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain text table, columns padded to their widest cell."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
             for row in cells]  # fmt: skip
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def note(message: str) -> None:
    print(message, file=sys.stderr)


@dataclass(frozen=True)
class Probe:
    """One backend's answer to a ping."""

    name: str
    type: str
    latency: float | None  # seconds; None when it did not answer
    error: str | None

    @property
    def reachable(self) -> bool:
        return self.error is None


def probe(registry: Registry, name: str) -> Probe:
    provider = registry.backend(name)
    started = time.perf_counter()
    try:
        provider.ping()
    except LockError as exc:  # down, refusing access, or not the server it should be
        return Probe(name, backend_type(registry, name), None, str(exc))
    return Probe(name, backend_type(registry, name), time.perf_counter() - started, None)


def switch_verdict(registry: Registry, name: str) -> str:
    """What the kill-switch does to this backend right now."""
    state = registry.switch.state
    if state.forced == name:
        return f"forced ({state.source})"
    if state.forced is not None:
        return f"skipped: {state.forced} is forced ({state.source})"
    if name in state.disabled:
        return f"disabled ({state.source})"
    return "-"


def milliseconds(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


def write_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    """Watchers must never read half a file: write a sibling, then rename over. The file
    keeps the mode it had, else gets `mode`: readable by the applications, which may run
    as other users (mkstemp alone would leave it 0600, and a switch nobody can read)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        mode = stat.S_IMODE(path.stat().st_mode)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(handle, mode)
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
