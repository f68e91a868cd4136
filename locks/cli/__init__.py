"""The `locks` command: one subcommand per module in this package.

Exit codes, for scripts:
    0  done, and nothing wrong was found
    1  the command ran and found a problem (an invalid config, an unreachable backend in
       `status`, an oversell under the lock in `demo`)
    2  bad usage (unknown option, missing argument, a bad name)
    3  a backend the command needed was unavailable
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from importlib import metadata

from locks.cli.common import quiet_drivers
from locks.errors import BackendUnavailable, ConfigError, LockError

OK, PROBLEM, USAGE, UNAVAILABLE = 0, 1, 2, 3

# each module has `register(commands)`, which adds its subparser and sets `run`
COMMANDS = ("demo", "status", "switch", "inspect", "breaking", "db", "check", "bench")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="locks",
        description="Named locks over Redis, ZooKeeper, databases and a local fallback.",
        epilog="Exit codes: 0 ok, 1 a problem was found, 2 bad usage, 3 a backend was unavailable.",
    )
    top.add_argument(
        "-v", "--verbose", action="store_true", help="also print the library's own log"
    )
    top.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"locks.cli.{name}").register(commands)
    return top


def _version() -> str:
    try:
        return metadata.version("fallback-locks")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    else:
        quiet_drivers()
    try:
        result: int = args.run(args)
    except ConfigError as exc:
        print(f"locks {args.command}: {exc}", file=sys.stderr)
        return PROBLEM
    except ValueError as exc:  # a bad name or duration, caught before any I/O
        print(f"locks {args.command}: {exc}", file=sys.stderr)
        return USAGE
    except BackendUnavailable as exc:
        print(f"locks {args.command}: {exc}", file=sys.stderr)
        return UNAVAILABLE
    except LockError as exc:  # a backend that answered with an error, or refused access
        print(f"locks {args.command}: {exc}", file=sys.stderr)
        return PROBLEM
    return result


if __name__ == "__main__":
    sys.exit(main())
