"""The `locks` command: operate the kill-switch file and check a configuration.

    locks switch --file /var/run/locks/switch.toml force db
    locks switch --file /var/run/locks/switch.toml disable redis zk
    locks switch --file /var/run/locks/switch.toml clear
    locks switch --file /var/run/locks/switch.toml show
    locks check locks.toml            # load it as the library would, with no I/O

Every process watching the file applies the change within its poll interval.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import tomllib
from collections.abc import Sequence
from pathlib import Path

from locks.config import from_config
from locks.errors import ConfigError
from locks.names import check_name


def _write_atomically(path: Path, text: str) -> None:
    """Watchers must never read half a file: write a sibling, then rename over."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(handle, "w") as out:
        out.write(text)
    os.replace(temporary, path)


def _switch(args: argparse.Namespace) -> int:
    path = Path(args.file)
    if args.action == "show":
        print(path.read_text() if path.exists() else "(no switch file: nothing forced or disabled)")
        return 0
    for name in args.names:
        check_name(name, "backend name")
    if args.action == "force":
        if len(args.names) != 1:
            raise SystemExit("force takes exactly one backend name")
        text = f"force = {args.names[0]!r}\n".replace("'", '"')
    elif args.action == "disable":
        if not args.names:
            raise SystemExit("disable takes one or more backend names")
        text = "disable = [" + ", ".join(f'"{name}"' for name in args.names) + "]\n"
    else:  # clear
        text = "# nothing forced or disabled\n"
    tomllib.loads(text)  # what we write must parse
    _write_atomically(path, text)
    print(f"{path}: {text.strip()}")
    return 0


def _check(args: argparse.Namespace) -> int:
    try:
        registry = from_config(args.config)
    except ConfigError as exc:
        print(f"invalid: {exc}", file=sys.stderr)
        return 1
    print(f"ok: backends {', '.join(registry)}; scenarios {', '.join(registry.scenarios)}")
    registry.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="locks", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    switch = commands.add_parser("switch", help="write the kill-switch file")
    switch.add_argument("--file", required=True, help="the file the Switch watches")
    switch.add_argument("action", choices=["force", "disable", "clear", "show"])
    switch.add_argument("names", nargs="*", help="backend names")
    switch.set_defaults(run=_switch)
    check = commands.add_parser("check", help="load a configuration and report")
    check.add_argument("config")
    check.set_defaults(run=_check)
    args = parser.parse_args(argv)
    result: int = args.run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
