"""`locks check`: load a configuration as the library would, with no I/O, and report."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from locks.cli.common import CONFIG_ENV, command, config_path
from locks.config import from_config


def register(commands: Any) -> None:
    parser = command(commands, "check", "validate a configuration (no I/O)", __doc__, run)
    parser.add_argument("file", nargs="?", help="the TOML file (or --config, as elsewhere)")


def run(args: argparse.Namespace) -> int:
    path = config_path(args.file or args.config)
    if path is None:
        print(f"locks check: no configuration to check: name a file, --config FILE, "
              f"${CONFIG_ENV}, or have ./locks.toml", file=sys.stderr)  # fmt: skip
        return 2
    registry = from_config(path)  # a ConfigError exits 1 with its message
    try:
        print(f"ok: backends {', '.join(registry)}; scenarios {', '.join(registry.scenarios)}")
    finally:
        registry.close()
    return 0
