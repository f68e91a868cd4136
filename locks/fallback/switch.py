"""The kill-switch: force one backend or disable some, at run time, with no restart.

Three sources, the first that says anything wins: code (`force`, `disable`, `enable`;
`clear` hands control back), a watched TOML file (polled by mtime; stands in for a
config-centre push), and the environment (`LOCKS_FORCE`, `LOCKS_DISABLE`, comma-separated).
A file that cannot be read or parsed keeps the last good state and logs an error: a bad
push never crashes callers and never silently unlocks anything. Reading the state is one
attribute read, cheap enough for every acquire.

File format::

    force = "zk"                # only this backend
    disable = ["redis"]         # never these
"""

from __future__ import annotations

import logging
import os
import threading
import tomllib
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from locks.events import EventKind, emit
from locks.names import check_name, check_seconds

logger = logging.getLogger("locks")


@dataclass(frozen=True, slots=True)
class SwitchState:
    forced: str | None = None
    disabled: frozenset[str] = frozenset()
    source: str = "default"  # code, file, environment or default

    def tiers(self, names: Sequence[str]) -> list[str]:
        """The tiers of a chain this state lets through, in order. A forced backend the
        chain does not have leaves it none: forcing means forcing."""
        if self.forced is not None:
            return [self.forced] if self.forced in names else []
        return [name for name in names if name not in self.disabled]

    def __str__(self) -> str:
        parts = []
        if self.forced is not None:
            parts.append(f"force={self.forced}")
        if self.disabled:
            parts.append(f"disable={','.join(sorted(self.disabled))}")
        return f"{' '.join(parts) or 'all backends allowed'} (from {self.source})"


class Switch:
    def __init__(
        self,
        *,
        file: str | os.PathLike[str] | None = None,
        poll_interval: float = 1.0,
        environ: Mapping[str, str] | None = None,
        known: Collection[str] | None = None,
    ) -> None:
        self.known = None if known is None else frozenset(known)
        self.poll_interval = check_seconds(poll_interval, "poll_interval")
        self._lock = threading.Lock()
        self._code: SwitchState | None = None
        self._file: SwitchState | None = None
        self._environment = self._from_environment(os.environ if environ is None else environ)
        self._state = self._environment or SwitchState()
        self.path = None if file is None else Path(file)
        self._mtime: int | None = None
        # why the file could not be read, while it cannot (None: read, or absent): an
        # application that cannot read its switch must be seen not to obey it
        self.problem: str | None = None
        self._stop = threading.Event()
        if self.path is not None:
            self.refresh()
            threading.Thread(target=self._watch, name="locks-switch", daemon=True).start()

    @property
    def state(self) -> SwitchState:
        return self._state

    def tiers(self, names: Sequence[str]) -> list[str]:
        return self._state.tiers(names)

    # -- code -----------------------------------------------------------------------------

    def force(self, name: str) -> None:
        """Use only `name` until `clear()` (or `enable` of another forced name)."""
        self._set_code(replace(self._base(), forced=self._check(name), source="code"))

    def disable(self, *names: str) -> None:
        base = self._base()
        disabled = base.disabled | {self._check(name) for name in names}
        self._set_code(replace(base, disabled=disabled, source="code"))

    def enable(self, *names: str) -> None:
        base = self._base()
        enabled = {self._check(name) for name in names}
        forced = None if base.forced in enabled else base.forced
        self._set_code(
            replace(base, forced=forced, disabled=base.disabled - enabled, source="code")
        )

    def clear(self) -> None:
        """Drop what code said; the file (or else the environment) decides again."""
        with self._lock:
            self._code = None
            self._update()

    def _base(self) -> SwitchState:
        return self._code or self._state

    def _set_code(self, state: SwitchState) -> None:
        with self._lock:
            self._code = state
            self._update()

    def _check(self, name: str) -> str:
        check_name(name, "backend name")
        if self.known is not None and name not in self.known:
            raise ValueError(f"unknown backend {name!r}; known: {sorted(self.known)}")
        return name

    # -- file and environment ---------------------------------------------------------------

    def refresh(self) -> None:
        """Read the watched file again if it changed (the watcher thread calls this)."""
        if self.path is None:
            return
        try:
            mtime = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            mtime = None
        if mtime == self._mtime:
            return
        self._mtime = mtime
        if mtime is None:  # a removed file says nothing: the environment decides
            self.problem = None
            with self._lock:
                self._file = None
                self._update()
            return
        try:
            state = self._parse(tomllib.loads(self.path.read_text()), "file")
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, ValueError) as exc:
            self.problem = f"{type(exc).__name__}: {exc}"
            logger.error("ignoring switch file %s, keeping %s: %s", self.path, self._state, exc)
            emit(EventKind.SWITCHED, "switch", "", detail=f"unreadable, ignored: {self.problem}")
            return
        self.problem = None
        with self._lock:
            self._file = state
            self._update()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_interval):
            try:
                self.refresh()
            except Exception:  # the watcher must outlive any surprise
                logger.exception("switch file watcher failed")

    def close(self) -> None:
        self._stop.set()

    def _from_environment(self, environ: Mapping[str, str]) -> SwitchState | None:
        forced = environ.get("LOCKS_FORCE", "").strip() or None
        disabled = [name.strip() for name in environ.get("LOCKS_DISABLE", "").split(",")]
        if forced is None and not any(disabled):
            return None
        return self._parse(
            {"force": forced, "disable": [name for name in disabled if name]}, "environment"
        )

    def _parse(self, data: Mapping[str, object], source: str) -> SwitchState:
        unknown = set(data) - {"force", "disable"}
        if unknown:
            raise ValueError(f"unknown switch keys {sorted(unknown)}")
        forced = data.get("force")
        if forced is not None and not isinstance(forced, str):
            raise ValueError(f"force must be a backend name, not {forced!r}")
        disabled = data.get("disable", [])
        if not isinstance(disabled, list) or not all(isinstance(n, str) for n in disabled):
            raise ValueError(f"disable must be a list of backend names, not {disabled!r}")
        names: Iterable[str] = [*disabled, *([forced] if forced else [])]
        for name in names:
            self._check(name)
        return SwitchState(forced or None, frozenset(disabled), source)

    def _update(self) -> None:
        # under self._lock
        new = self._code or self._file or self._environment or SwitchState()
        if new != self._state:
            old, self._state = self._state, new
            logger.info("lock switch: %s (was %s)", new, old)
            emit(EventKind.SWITCHED, "switch", "", detail=str(new))
