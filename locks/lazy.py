"""Names a package imports on first use, so that `import locks` (or `locks.aio`) never
needs a server client: each backend's client is an optional extra."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_names(package: str, where: dict[str, tuple[str, str | None]]) -> Callable[[str], Any]:
    """A module `__getattr__` that imports each name of `where` (name -> (module, the
    extra it needs, or None)) when it is first read, naming the extra if it is missing."""

    def attribute(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module_name, extra = where[name]
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if extra is None:
                raise
            raise ImportError(
                f"{name} needs the {extra!r} extra: pip install 'fallback-locks[{extra}]'"
            ) from exc
        return getattr(module, name)

    return attribute
