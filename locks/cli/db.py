"""`locks db init`: create the lock table of every database backend in the config (or of
the one `--backend` names), for deployments where the application's database user has
no CREATE privilege. Safe to run again: an existing table is left as it is.

`--print-sql` creates nothing: it prints the CREATE TABLE statement of each, for a
migration run by the table's owner (reaching the server first where it can, so that a
`mysql://` URL gets MariaDB's collation on MariaDB)."""

from __future__ import annotations

import argparse
from typing import Any

from locks.cli.common import command, load, note
from locks.errors import LockError


def register(commands: Any) -> None:
    parser = command(
        commands, "db", "database backend chores (init: create the lock table)", __doc__, run
    )
    parser.add_argument("action", choices=["init"])
    parser.add_argument("--backend", metavar="NAME", help="only this database backend")
    parser.add_argument(
        "--print-sql", action="store_true", help="print the CREATE TABLE statements, run none"
    )


def run(args: argparse.Namespace) -> int:
    # here, not at the top: the other commands must work without SQLAlchemy installed
    from locks.backends.database import DatabaseProvider  # noqa: PLC0415

    loaded = load(args.config)
    registry = loaded.registry
    try:
        names = [args.backend] if args.backend else list(registry)
        targets = {name: registry.backend(name) for name in names}
        databases = {n: p for n, p in targets.items() if isinstance(p, DatabaseProvider)}
        if args.backend and not databases:
            raise ValueError(f"backend {args.backend!r} is not a database backend")
        if not databases:
            note(f"no database backend in {loaded.source}")
            return 1
        for name, provider in databases.items():
            if args.print_sql:
                reached = True
                try:
                    provider.ping()  # the server's kind decides MySQL's collation
                except LockError:
                    reached = False
                guess = "" if reached else " (not reached: compiled from the URL alone)"
                print(f"-- {name}: {provider.address}{guess}")
                print(f"{provider.ddl()};\n")
                continue
            provider.create_table()  # BackendUnavailable exits 3 with its message
            print(f"{name}: table {provider.table_name!r} ready at {provider.address}")
        return 0
    finally:
        registry.close()
