"""Configuration: TOML (or a mapping) -> a `Registry` of backends, scenario chains and
the kill-switch. Everything is checked when loaded, with no I/O: an unknown key, type,
backend or preset is a `ConfigError` naming where it is (`scenarios.funds.chain[1]`).

    [backends]
    redis = { type = "redis-hash", url = "redis://127.0.0.1:6379/0" }
    db    = { type = "database", url = "mysql+pymysql://locks:${LOCKS_DB_PASSWORD}@db/locks" }

    [scenarios]
    order = { chain = ["redis", "db"] }
    funds = { preset = "funds" }            # chain, mode and max_lease from the preset

    [switch]
    file = "/var/run/locks/switch.toml"     # force = "db" / disable = ["redis"] at run time

Backend types register by name: the built-in ones, and third-party classes published
under the entry-point group `locks.backends`.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import tomllib
from collections.abc import Callable, Iterator, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_fixed

from locks.errors import BackendUnavailable, ConfigError
from locks.fallback.breaker import Breaker
from locks.fallback.chain import FallbackChain
from locks.fallback.scenarios import PRESETS
from locks.fallback.switch import Switch
from locks.names import check_wait
from locks.provider import Lock, LockProvider
from locks.quorum import Quorum

P = ParamSpec("P")
R = TypeVar("R")

BUILT_IN_TYPES = {
    "local": "locks.backends.local:LocalProvider",
    "redis": "locks.backends.redis:RedisProvider",
    "redis-hash": "locks.backends.redis:RedisHashProvider",
    "zookeeper": "locks.backends.zookeeper:ZooKeeperProvider",
    "database": "locks.backends.database:DatabaseProvider",
    "file": "locks.backends.file:FileProvider",
    "quorum": "locks.quorum:Quorum",  # its members are other backends, named
}
ENTRY_POINT_GROUP = "locks.backends"

_TOP_KEYS = {"backends", "scenarios", "switch"}
_SCENARIO_KEYS = {"chain", "preset", "mode", "max_lease", "retries", "retry_delay",
                  "failures", "reset_timeout"}  # fmt: skip
_SWITCH_KEYS = {"file", "poll_interval", "force", "disable"}
_QUORUM_KEYS = {"type", "members", "quorum", "drift", "retry", "watchdog_ttl"}
# `${NAME}`: an environment variable; `${file:/path}`: a file's content (a mounted
# secret), its trailing newline dropped
_ENV = re.compile(r"\$\{(?:file:([^}]+)|([A-Za-z_][A-Za-z0-9_]*))\}")


def backend_types() -> dict[str, str]:
    """Type name -> `module:Class`, built-in types first, then entry points."""
    types = dict(BUILT_IN_TYPES)
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        types.setdefault(entry.name, entry.value)
    return types


def _load_class(spec: str, where: str) -> type[Any]:
    module_name, _, attribute = spec.partition(":")
    try:
        loaded = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{where}: cannot load backend class {spec!r}: {exc}") from exc
    if not isinstance(loaded, type):
        raise ConfigError(f"{where}: {spec!r} is not a class")
    return loaded


def from_config(
    source: str | os.PathLike[str] | Mapping[str, Any],
    *,
    environ: Mapping[str, str] | None = None,
) -> Registry:
    """Build a `Registry` from a TOML file path or an already parsed mapping."""
    data, env = _read(source, environ)
    return Registry(_interpolate(data, env, ""), env)


def _read(
    source: str | os.PathLike[str] | Mapping[str, Any], environ: Mapping[str, str] | None
) -> tuple[Mapping[str, Any], Mapping[str, str]]:
    """The config's mapping (a TOML file read, or the mapping given) and its environment."""
    if isinstance(source, Mapping):
        data: Mapping[str, Any] = source
    else:
        try:
            data = tomllib.loads(Path(source).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config {os.fspath(source)!r}: {exc}") from exc
    return data, os.environ if environ is None else environ


def _interpolate(value: Any, env: Mapping[str, str], where: str) -> Any:
    """Replace `${NAME}` in every string with the environment's value, and
    `${file:/path}` with the file's content (for secrets: never written in the TOML)."""
    if isinstance(value, str):

        def replace(match: re.Match[str]) -> str:
            path, name = match.group(1), match.group(2)
            if path is not None:
                try:
                    return Path(path).read_text().rstrip("\r\n")
                except OSError as exc:
                    raise ConfigError(f"{where or 'config'}: cannot read secret file "
                                      f"{path!r}: {exc.strerror}") from None  # fmt: skip
            if name not in env:
                raise ConfigError(f"{where or 'config'}: environment variable {name} is not set")
            return env[name]

        return _ENV.sub(replace, value)
    if isinstance(value, Mapping):
        return {
            k: _interpolate(v, env, f"{where}.{k}" if where else str(k)) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_interpolate(v, env, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def _table(data: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: must be a table, got {type(value).__name__}")
    return value


def _place(where: str, error: BaseException, options: Mapping[str, Any]) -> str:
    """`where`, narrowed to the key an error message starts with (`backends.db.url`)."""
    first = re.split(r"[\s:]", str(error), maxsplit=1)[0]
    return f"{where}.{first}" if first in options else where


def _unknown(keys: Mapping[str, Any], allowed: set[str], where: str) -> None:
    extra = sorted(set(keys) - allowed)
    if extra:
        place = f"{where}.{extra[0]}" if where else extra[0]
        raise ConfigError(f"{place}: unknown key (allowed: {', '.join(sorted(allowed))})")


def _is_quorum(spec: Any) -> bool:
    return isinstance(spec, Mapping) and spec.get("type") == "quorum"


class Registry:
    """The configured backends, one chain per scenario, and the shared switch."""

    chain_class: Any = FallbackChain  # the asyncio registry builds its face's chains
    quorum_class: Any = Quorum  # and quorums

    def __init__(self, data: Mapping[str, Any], environ: Mapping[str, str]) -> None:
        _unknown(data, _TOP_KEYS, "")
        self._backends: dict[str, LockProvider] = {}
        try:
            specs = _table(data, "backends", "backends")
            quorums = {name: spec for name, spec in specs.items() if _is_quorum(spec)}
            for name, spec in specs.items():  # a quorum's members first: it is made of them
                if name not in quorums:
                    self._backends[name] = self._make_backend(name, spec, f"backends.{name}")
            for name, spec in quorums.items():
                self._backends[name] = self._make_quorum(name, spec, f"backends.{name}", quorums)
            self.switch = self._make_switch(_table(data, "switch", "switch"), environ)
            self._chains = {
                name: self._make_chain(name, spec, f"scenarios.{name}")
                for name, spec in _table(data, "scenarios", "scenarios").items()
            }
        except BaseException:
            self._abandon()
            raise

    # -- building --------------------------------------------------------------------------

    def _make_backend(self, name: str, spec: Any, where: str) -> LockProvider:
        if not isinstance(spec, Mapping):
            raise ConfigError(f"{where}: must be a table with a 'type'")
        options = dict(spec)
        type_name = options.pop("type", None)
        types = backend_types()
        if type_name not in types:
            raise ConfigError(f"{where}.type: unknown backend type {type_name!r} "
                              f"(known: {', '.join(sorted(types))})")  # fmt: skip
        cls = _load_class(self._class_of(type_name, types[type_name], where), f"{where}.type")
        parameters = inspect.signature(cls).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
            accepted = {p for p in parameters if p != "name"}
            _unknown(options, accepted, where)
        try:
            provider: LockProvider = cls(name=name, **options)
        except Exception as exc:  # whatever a backend class raises, the config is at fault
            raise ConfigError(f"{_place(where, exc, options)}: {exc}") from exc
        return provider

    def _class_of(self, type_name: str, spec: str, where: str) -> str:
        """The `module:Class` that serves `type_name` here."""
        return spec

    def _make_quorum(
        self, name: str, spec: Mapping[str, Any], where: str, quorums: Mapping[str, Any]
    ) -> LockProvider:
        _unknown(spec, _QUORUM_KEYS, where)
        names = spec.get("members")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ConfigError(f"{where}.members: must be a list of backend names, "
                              'e.g. ["r1", "r2"]')  # fmt: skip
        for index, member in enumerate(names):
            if member not in self._backends:
                what = "a quorum cannot be a member" if member in quorums else "unknown backend"
                raise ConfigError(f"{where}.members[{index}]: {what} {member!r}")
        options = {k: v for k, v in spec.items() if k not in ("type", "members")}
        try:
            members = [self._backends[member] for member in names]
            return self.quorum_class(members, name=name, **options)  # type: ignore[no-any-return]
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{_place(where, exc, options)}: {exc}") from exc

    def _make_switch(self, spec: Mapping[str, Any], environ: Mapping[str, str]) -> Switch:
        _unknown(spec, _SWITCH_KEYS, "switch")
        forced, disabled = spec.get("force"), spec.get("disable") or []
        if forced is not None and not isinstance(forced, str):
            raise ConfigError("switch.force: must be one backend name")
        if not isinstance(disabled, list) or not all(isinstance(n, str) for n in disabled):
            raise ConfigError('switch.disable: must be a list of backend names, e.g. ["redis"]')
        for key, names in (("force", [forced] if forced else []), ("disable", disabled)):
            for name in names:
                if name not in self._backends:
                    raise ConfigError(f"switch.{key}: unknown backend {name!r}")
        # the config's own force/disable is the lowest layer, like the environment (which
        # replaces it when set): the watched file and code can still override it
        base: Mapping[str, str] = environ
        if not any(environ.get(name) for name in ("LOCKS_FORCE", "LOCKS_DISABLE")):
            base = {"LOCKS_FORCE": forced or "", "LOCKS_DISABLE": ",".join(disabled)}
        try:
            return Switch(
                file=spec.get("file"),
                poll_interval=spec.get("poll_interval", 1.0),
                environ=base,
                known=self._backends,
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"switch: {exc}") from exc

    def _make_chain(self, name: str, spec: Any, where: str) -> FallbackChain:
        if not isinstance(spec, Mapping):
            raise ConfigError(f"{where}: must be a table with a 'chain' or a 'preset'")
        _unknown(spec, _SCENARIO_KEYS, where)
        settings: dict[str, Any] = {}
        if "preset" in spec:
            preset = PRESETS.get(spec["preset"])
            if preset is None:
                raise ConfigError(f"{where}.preset: unknown preset {spec['preset']!r} "
                                  f"(known: {', '.join(PRESETS)})")  # fmt: skip
            settings = {"chain": list(preset.chain), "mode": preset.mode,
                        "max_lease": preset.max_lease}  # fmt: skip
        settings.update(spec)
        tiers = settings.get("chain")
        if not isinstance(tiers, list) or not tiers:
            raise ConfigError(f"{where}.chain: must be a non-empty list of backend names")
        for index, tier in enumerate(tiers):
            if tier not in self._backends:
                raise ConfigError(f"{where}.chain[{index}]: unknown backend {tier!r}")
        retries = settings.get("retries", 3)
        if isinstance(retries, bool) or not isinstance(retries, int) or not 1 <= retries <= 100:
            raise ConfigError(f"{where}.retries: must be a whole number from 1 to 100, "
                              f"got {retries!r}")  # fmt: skip
        try:
            retry_delay = check_wait(settings.get("retry_delay", 0.1), "retry_delay")
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}.retry_delay: {exc}") from exc
        try:
            retry = Retrying(
                stop=stop_after_attempt(retries),
                wait=wait_fixed(retry_delay or 0.0),
                retry=retry_if_exception_type(BackendUnavailable),
                reraise=True,
            )
            breaker = Breaker(settings.get("failures", 1), settings.get("reset_timeout", 5.0))
            chain: FallbackChain = self.chain_class(
                [self._backends[tier] for tier in tiers],
                name=name,
                mode=settings.get("mode", "fast"),
                max_lease=settings.get("max_lease", 30.0),
                retry=retry,
                breaker=breaker,
                switch=self.switch,
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{_place(where, exc, settings)}: {exc}") from exc
        return chain

    # -- using -------------------------------------------------------------------------------

    def backend(self, name: str) -> LockProvider:
        try:
            return self._backends[name]
        except KeyError:
            raise ConfigError(f"unknown backend {name!r}") from None

    def chain(self, scenario: str) -> FallbackChain:
        try:
            return self._chains[scenario]
        except KeyError:
            raise ConfigError(
                f"unknown scenario {scenario!r} (configured: {', '.join(self._chains)})"
            ) from None

    @property
    def scenarios(self) -> list[str]:
        return list(self._chains)

    def lock(
        self, scenario: str, key: str, *, ttl: float | None = None, wait: float | None = None
    ) -> Lock:
        return self.chain(scenario).lock(key, ttl=ttl, wait=wait)

    def locked(
        self,
        key_template: str,
        *,
        scenario: str = "default",
        ttl: float | None = None,
        wait: float | None = None,
    ) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """Run the decorated function under the lock named by `key_template`, formatted
        with the call's arguments: `@registry.locked("order:{order_id}", scenario="order")`."""
        chain = self.chain(scenario)  # an unknown scenario fails at decoration time
        return chain.locked(key_template, ttl=ttl, wait=wait)

    def __iter__(self) -> Iterator[str]:
        return iter(self._backends)

    def _abandon(self) -> None:
        """A config that failed half-way: free what was made."""
        self.close()

    def close(self) -> None:
        for provider in self._backends.values():
            provider.close()
        switch = getattr(self, "switch", None)
        if switch is not None:
            switch.close()
