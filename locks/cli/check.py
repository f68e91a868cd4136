"""`locks check`: load a configuration as the library would, with no I/O, and report."""

from __future__ import annotations

import argparse
from typing import Any

from locks.config import from_config


def register(commands: Any) -> None:
    parser = commands.add_parser("check", help="validate a configuration (no I/O)",
                                 description=__doc__)  # fmt: skip
    parser.add_argument("config", help="the TOML file")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    registry = from_config(args.config)  # a ConfigError exits 1 with its message
    try:
        print(f"ok: backends {', '.join(registry)}; scenarios {', '.join(registry.scenarios)}")
    finally:
        registry.close()
    return 0
