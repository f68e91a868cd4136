"""`locks check`: load a configuration as the library would, with no I/O, and report."""

from __future__ import annotations

import argparse
from typing import Any

from locks.cli.common import command
from locks.config import from_config


def register(commands: Any) -> None:
    parser = command(commands, "check", "validate a configuration (no I/O)", __doc__, run,
                     config=False)  # fmt: skip
    parser.add_argument("config", help="the TOML file")


def run(args: argparse.Namespace) -> int:
    registry = from_config(args.config)  # a ConfigError exits 1 with its message
    try:
        print(f"ok: backends {', '.join(registry)}; scenarios {', '.join(registry.scenarios)}")
    finally:
        registry.close()
    return 0
