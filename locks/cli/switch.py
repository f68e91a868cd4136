"""`locks switch`: write the kill-switch file that every watching process applies.

    locks switch force db                 # every tier but db is skipped
    locks switch disable redis zk         # these tiers are skipped
    locks switch clear                    # remove the file: the environment and config decide
    locks switch show

The file is the one `--file` names, else $LOCKS_SWITCH_FILE, else the configuration's
`[switch] file` (with no configuration: the embedded default's, in the per-user folder).
It is written atomically (a temporary sibling, then a rename), so a watcher never reads
half of it. The names are checked against the configuration's backends first (the
embedded default's, unless --file or $LOCKS_SWITCH_FILE names a file for another one).
"""

from __future__ import annotations

import argparse
import os
import tomllib
from pathlib import Path
from typing import Any

from locks.cli.common import (
    command,
    config_path,
    embedded_default,
    toml_string,
    write_atomically,
)
from locks.errors import ConfigError
from locks.names import check_name

SWITCH_FILE_ENV = "LOCKS_SWITCH_FILE"


def register(commands: Any) -> None:
    parser = command(commands, "switch", "force or disable backends at run time", __doc__, run)
    parser.add_argument(
        "--file",
        help=f"the switch file (default: ${SWITCH_FILE_ENV}, else [switch] file of the config)",
    )
    parser.add_argument("action", choices=["force", "disable", "clear", "show"])
    parser.add_argument("names", nargs="*", help="backend names")


def switch_file(args: argparse.Namespace) -> Path:
    if args.file:
        return Path(args.file)
    if os.environ.get(SWITCH_FILE_ENV):
        return Path(os.environ[SWITCH_FILE_ENV])
    configured = configuration(args).get("switch", {}).get("file")
    if configured:
        return Path(configured)
    raise ConfigError(
        f"no switch file: pass --file, set ${SWITCH_FILE_ENV}, or set [switch] file in the config"
    )


def configured_backends(args: argparse.Namespace) -> list[str] | None:
    """The backend names the switch file may name, if they are known: the configuration's,
    or the embedded default's when its own switch file is the one written."""
    config = config_path(args.config)
    if config is None and (args.file or os.environ.get(SWITCH_FILE_ENV)):
        return None  # a file for some application whose configuration is not here
    return list(configuration(args).get("backends", {}))


def configuration(args: argparse.Namespace) -> dict[str, Any]:
    """The configuration the other commands would load, read (not loaded): the file, or
    the embedded default, whose switch file is in the per-user folder."""
    config = config_path(args.config)
    if config is None:
        return tomllib.loads(embedded_default()[0])
    try:
        return tomllib.loads(config.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read config {str(config)!r}: {exc}") from exc


def run(args: argparse.Namespace) -> int:
    path = switch_file(args)
    if args.action == "show":
        print(path.read_text() if path.exists() else "(no switch file: nothing forced or disabled)")
        return 0
    for name in args.names:
        check_name(name, "backend name")
    known = configured_backends(args)
    unknown = [name for name in args.names if known is not None and name not in known]
    if unknown:
        raise ValueError(f"unknown backend {unknown[0]!r} (configured: {', '.join(known or [])})")
    if args.action == "clear":
        if args.names:
            raise ValueError("clear takes no backend names")
        # an empty file would still be a layer that allows everything, over the
        # environment and the config; without the file they decide again
        path.unlink(missing_ok=True)
        print(f"{path}: removed; the environment and the configuration decide")
        return 0
    if args.action == "force":
        if len(args.names) != 1:
            raise ValueError("force takes exactly one backend name")
        text = f"force = {toml_string(args.names[0])}\n"
    else:  # disable
        if not args.names:
            raise ValueError("disable takes one or more backend names")
        text = "disable = [" + ", ".join(toml_string(name) for name in args.names) + "]\n"
    tomllib.loads(text)  # what we write must parse
    write_atomically(path, text)
    print(f"{path}: {text.strip()}")
    return 0
