"""Fault campaigns on real servers, judged by the history checker (tests/checker.py).

Worker processes take keys through a provider or a chain and, while holding one, do a
fenced read-modify-write on a register kept apart from every server the nemesis harms
(a SQLite file that refuses a write whose fence is below the last it accepted for the
key and tier, and records every write). A nemesis, seeded and logged, kills, pauses and
restarts servers, kills and stops workers, expires ZooKeeper sessions and flips the
kill-switch. Every call is written to a history (one JSON Lines file per process,
merged by monotonic time), and the checker reads it.

    python -m tests.campaign --campaign redis-hash --seed 7 --seconds 60 --out /tmp/c

runs one against servers it starts itself (`make soak` runs several); the tests run
short ones with fixed seeds. A verdict that is not clean names the seed and the history.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import multiprocessing
import os
import random
import shutil
import signal
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from locks import Breaker, FallbackChain, Lease, LockError, LockLost, LockProvider, Switch, aio
from locks.aio.base import AsyncProviderBase
from locks.backends import DatabaseProvider, RedisHashProvider, ZooKeeperProvider
from locks.quorum import Quorum
from tests import checker
from tests.aio_bridge import Threaded

SPAWN = multiprocessing.get_context("spawn")
KEYS = ("c:a", "c:b")
TTLS: tuple[float | None, ...] = (None, 1.0, 2.0)  # None: a watchdog lease (1 s)
WAITS = (0.0, 0.5, 2.0)
SESSION = 2.0  # ZooKeeper session timeout of the workers, seconds
SETTLE = 3.0  # after the workers stop: every dead holder's lease has run out by then
MERGED = "merged.jsonl"  # every process's history in one, as the checker read it


# -- the register ----------------------------------------------------------------------


class Register:
    """A fenced register in a SQLite file, shared by the workers of one campaign."""

    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, timeout=30, isolation_level=None)
        self.db.executescript(
            "PRAGMA journal_mode=WAL;"
            "CREATE TABLE IF NOT EXISTS writes (ord INTEGER PRIMARY KEY AUTOINCREMENT,"
            " key TEXT, tier TEXT, fence INTEGER, token TEXT, value INTEGER, read INTEGER,"
            " accepted INTEGER);"
            "CREATE TABLE IF NOT EXISTS fences (key TEXT, tier TEXT, fence INTEGER,"
            " PRIMARY KEY (key, tier));"
            "CREATE TABLE IF NOT EXISTS current (key TEXT PRIMARY KEY, value INTEGER);"
        )

    def read(self, key: str, tier: str, fence: int) -> int:
        """The value, read under `fence`: the fence floor rises to it, so a holder whose
        lease has since run out cannot write over what a successor read."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self._raise_floor(key, tier, fence)
            row = self.db.execute("SELECT value FROM current WHERE key = ?", (key,)).fetchone()
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return 0 if row is None else int(row[0])

    def write(
        self, key: str, *, tier: str, fence: int, token: str, value: int, read: int
    ) -> tuple[bool, int]:
        """Store `value` unless a higher fence of this key and tier was seen before; the
        verdict and the write's place in the register's order."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            accepted = self._raise_floor(key, tier, fence)
            cursor = self.db.execute(
                "INSERT INTO writes (key, tier, fence, token, value, read, accepted)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (key, tier, fence, token, value, read, int(accepted)),
            )
            if accepted:
                self.db.execute("INSERT OR REPLACE INTO current VALUES (?, ?)", (key, value))
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return accepted, int(cursor.lastrowid or 0)

    def _raise_floor(self, key: str, tier: str, fence: int) -> bool:
        """False if a higher fence of this key and tier came first."""
        row = self.db.execute(
            "SELECT fence FROM fences WHERE key = ? AND tier = ?", (key, tier)
        ).fetchone()
        if row is not None and fence < int(row[0]):
            return False
        self.db.execute("INSERT OR REPLACE INTO fences VALUES (?, ?, ?)", (key, tier, fence))
        return True


# -- histories ---------------------------------------------------------------------------


class History:
    """One process's events, one JSON line each, appended and flushed as they happen (a
    killed worker loses at most the line it was writing)."""

    def __init__(self, path: Path, process: str) -> None:
        self.process = process
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()  # on_lost callbacks write from another thread

    def log(self, kind: str, f: str, /, **fields: Any) -> None:
        event = {"process": self.process, "type": kind, "f": f,
                 "mono": time.monotonic(), "wall": time.time(), **fields}  # fmt: skip
        line = (json.dumps(event) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)


def merge(folder: Path) -> list[checker.Event]:
    """Every process's history in one, in monotonic order."""
    events = []
    for path in sorted(folder.glob("*.jsonl")):
        if path.name != MERGED:
            events.extend(checker.load(path))
    return sorted(events, key=lambda event: float(event.get("mono") or 0))


# -- what the workers lock through -----------------------------------------------------


@dataclass
class Spec:
    """A campaign: what the workers lock through, and what the nemesis may do."""

    name: str
    tiers: tuple[str, ...]  # backend kinds, in chain order: redis-hash, zookeeper, mariadb
    faults: tuple[str, ...]
    mode: str = "safe"
    max_lease: float = 2.0
    variant: str = ""  # a pre-fix behaviour re-created in tests/prefix.py, to prove a point
    hold: float = 0.05  # longest a worker works under a lease, seconds
    ttls: tuple[float | None, ...] = TTLS
    outage: tuple[float, float] = (0.5, 3.0)  # how long a server stays killed or paused
    # verdicts a campaign cannot promise (fast chains overlap across tiers by design)
    excused: tuple[str, ...] = ()
    addresses: dict[str, str] = field(default_factory=dict)
    switch_file: str = ""


CAMPAIGNS = {
    "redis-hash": Spec("redis-hash", ("redis-hash",), ("kill", "pause", "worker", "stop")),
    # the asyncio face (each worker's calls made by a task of its own, tests/aio_bridge.py)
    "aio-redis-hash": Spec(
        "aio-redis-hash", ("aio-redis-hash",), ("kill", "pause", "worker", "stop")
    ),
    # a Sentinel primary killed or paused (then failed over, and demoted once it returns)
    # under synced grants: no failover may hand a held lock to a second owner
    "aio-mariadb": Spec("aio-mariadb", ("aio-mariadb",), ("kill", "pause", "worker", "stop")),
    "aio-zookeeper": Spec(
        "aio-zookeeper", ("aio-zookeeper",), ("kill", "pause", "expire", "worker")
    ),
    "redis-sentinel": Spec(
        "redis-sentinel", ("redis-sentinel",), ("kill", "pause", "worker"), outage=(0.5, 2.0)
    ),
    "aio-redis-sentinel": Spec(
        "aio-redis-sentinel",
        ("aio-redis-sentinel",),
        ("kill", "pause", "worker"),
        outage=(0.5, 2.0),
    ),
    # a Cluster: the primary of one campaign key's slot killed or paused (then failed
    # over), under synced grants; the other key's shard serves on
    "redis-cluster": Spec(
        "redis-cluster", ("redis-cluster",), ("kill", "pause", "worker"), outage=(0.5, 2.0)
    ),
    "aio-redis-cluster": Spec(
        "aio-redis-cluster",
        ("aio-redis-cluster",),
        ("kill", "pause", "worker"),
        outage=(0.5, 2.0),
    ),
    "zookeeper": Spec("zookeeper", ("zookeeper",), ("kill", "pause", "expire", "worker")),
    "mariadb": Spec("mariadb", ("mariadb",), ("kill", "pause", "worker", "stop")),
    # PostgreSQL: the same faults; waiters are woken by NOTIFY through a listening
    # connection that a kill or a pause breaks
    "postgresql": Spec("postgresql", ("postgresql",), ("kill", "pause", "worker", "stop")),
    "safe-chain": Spec("safe-chain", ("redis-hash", "zookeeper"), ("kill", "worker")),
    # a quorum over five redis-servers: one or two members killed (they come back with
    # their data) or paused at a time, holders killed and stopped
    "redis-quorum": Spec("redis-quorum", ("redis-quorum",), ("kill", "pause", "worker", "stop")),
    # the same on the asyncio face: each member asked by a task acting for the worker's
    "aio-quorum": Spec("aio-quorum", ("aio-quorum",), ("kill", "pause", "worker", "stop")),
    "fast-chain": Spec(
        "fast-chain",
        ("redis-hash", "mariadb"),
        ("kill", "pause", "switch", "worker"),
        mode="fast",
        excused=(checker.MUTUAL_EXCLUSION, checker.LOST_UPDATE),
    ),
}


def build(spec: Spec, worker: str) -> tuple[LockProvider, float]:
    """The provider (or chain) a worker locks through, and its request timeout."""
    from tests import prefix  # noqa: PLC0415 - only campaigns that prove a point use it

    providers: list[LockProvider] = []
    for kind in spec.tiers:
        address = spec.addresses[kind]
        if kind == "redis-hash":
            providers.append(RedisHashProvider(address, name="redis", watchdog_ttl=1.0))
        elif kind.startswith("aio-"):  # each worker's calls made by tasks of its own
            providers.append(Threaded(_asyncio_provider(kind, address)))
        elif kind in ("redis-sentinel", "redis-cluster"):
            synced = 0 if spec.variant == "no-sync" else 1
            providers.append(RedisHashProvider(address, name="redis", watchdog_ttl=1.0,
                                               sync_replicas=synced, sync_timeout=0.2))  # fmt: skip
        elif kind == "redis-quorum":
            members = [RedisHashProvider(url, name=f"r{i}", watchdog_ttl=1.0)
                       for i, url in enumerate(address.split("|"))]  # fmt: skip
            providers.append(Quorum(members, name="quorum", watchdog_ttl=1.0))
        elif kind == "zookeeper":
            cls = prefix.SilentZooKeeper if spec.variant == "zk-silent" else ZooKeeperProvider
            providers.append(cls(address, name="zk", session_timeout=SESSION))
        else:
            providers.append(
                DatabaseProvider(address, name="db", watchdog_ttl=1.0, socket_timeout=1.0)
            )
    timeout = 2.0  # the slowest tier's socket/request timeout, with the pool's margin
    if len(providers) == 1:
        return providers[0], timeout
    switch = (
        Switch(file=spec.switch_file, poll_interval=0.1, environ={}) if spec.switch_file else None
    )
    cls_chain = prefix.UnreadSafeChain if spec.variant == "safe-unread" else FallbackChain
    chain = cls_chain(
        providers, name=spec.name, mode=spec.mode, max_lease=spec.max_lease,
        breaker=Breaker(reset_timeout=0.5), switch=switch,
    )  # fmt: skip
    # a chain may try every tier, each within its retries: wait + one timeout per tier
    return chain, timeout * len(providers) + 0.5


def _asyncio_provider(kind: str, address: str) -> AsyncProviderBase | aio.Quorum:
    """The asyncio face of a kind, set up as its threaded twin is above."""
    if kind == "aio-quorum":
        members = [aio.RedisHashProvider(url, name=f"r{i}", watchdog_ttl=1.0)
                   for i, url in enumerate(address.split("|"))]  # fmt: skip
        return aio.Quorum(members, name="quorum", watchdog_ttl=1.0)
    if kind == "aio-redis-hash":
        return aio.RedisHashProvider(address, name="redis", watchdog_ttl=1.0)
    if kind in ("aio-redis-sentinel", "aio-redis-cluster"):
        return aio.RedisHashProvider(address, name="redis", watchdog_ttl=1.0, sync_replicas=1,
                                     sync_timeout=0.2)  # fmt: skip
    if kind == "aio-zookeeper":
        return aio.ZooKeeperProvider(address, name="zk", session_timeout=SESSION)
    return aio.DatabaseProvider(address, name="db", watchdog_ttl=1.0, socket_timeout=1.0)


def run_worker(spec: Spec, worker: str, folder: str, seed: int, stop_at: float) -> None:
    """One worker process: random acquires, fenced writes under the lease, releases."""
    logging.getLogger("locks").addHandler(logging.NullHandler())  # the history says it all
    logging.getLogger("locks").propagate = False
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    history = History(Path(folder) / f"{worker}.jsonl", worker)
    register = Register(str(Path(folder) / "register.sqlite"))
    provider, timeout = build(spec, worker)
    with contextlib.suppress(LockError):  # a ZooKeeper down at the start has no session
        _publish_session(provider, Path(folder) / f"{worker}.zk")
    rng = random.Random(seed)

    told: set[str] = set()  # tokens whose loss is in the history

    def lost(lease: Lease) -> None:
        history.log("info", "lost", key=lease.key, token=lease.token, reason=lease.state.reason)
        told.add(lease.token)

    while time.monotonic() < stop_at:
        key, ttl, wait = rng.choice(KEYS), rng.choice(spec.ttls), rng.choice(WAITS)
        history.log("invoke", "acquire", key=key, ttl=ttl, wait=wait, timeout=timeout)
        try:
            lease = provider.acquire(key, ttl=ttl, wait=wait, on_lost=lost)
        except LockError as exc:
            history.log("fail", "acquire", error=f"{type(exc).__name__}: {exc}")
            time.sleep(0.05)
            continue
        if lease is None:
            history.log("ok", "acquire", granted=False)
            continue
        history.log(
            "ok", "acquire", granted=True, tier=lease.backend, fence=lease.fence,
            token=lease.token, depth=lease.depth,
            valid_until=None if lease.auto_renew else lease.valid_until,
        )  # fmt: skip
        _critical_section(history, register, lease, rng=rng, hold=spec.hold, told=told)
        history.log("invoke", "release", key=key, token=lease.token)
        try:
            provider.release(lease)
            history.log("ok", "release")
        except LockError as exc:
            history.log("fail", "release", error=f"{type(exc).__name__}: {exc}")


def _critical_section(
    history: History,
    register: Register,
    lease: Lease,
    *,
    rng: random.Random,
    hold: float,
    told: set[str],
) -> None:
    """Read under the lease's fence, work a while, check the lease, write."""
    history.log("invoke", "read", key=lease.key, token=lease.token)
    value = register.read(lease.key, lease.backend, lease.fence)
    history.log("ok", "read", value=value)
    time.sleep(rng.uniform(0, hold))
    if not _still_valid(history, lease, told):
        return
    history.log(
        "invoke", "write", key=lease.key, tier=lease.backend, fence=lease.fence,
        token=lease.token, value=value + 1, read=value,
    )  # fmt: skip
    accepted, order = register.write(
        lease.key, tier=lease.backend, fence=lease.fence, token=lease.token,
        value=value + 1, read=value,
    )  # fmt: skip
    history.log("ok", "write", accepted=accepted, order=order)


def _still_valid(history: History, lease: Lease, told: set[str]) -> bool:
    """`check()` right before writing. A lease in doubt (a ZooKeeper session suspended)
    is waited on until it is valid again or lost, for at most a session timeout and
    more: only the outcome is recorded, so a loss nobody was told of shows as one."""
    history.log("invoke", "check", key=lease.key, token=lease.token)
    give_up = time.monotonic() + SESSION + 2.0
    while True:
        try:
            lease.check()
        except LockLost as exc:
            in_doubt = lease.state.suspended and not lease.lost
            if in_doubt and time.monotonic() < give_up:
                time.sleep(0.1)
                continue
            if lease.lost:  # its on_lost is being told: let the history say so first
                deadline = time.monotonic() + 1.0
                while lease.token not in told and time.monotonic() < deadline:
                    time.sleep(0.01)
            history.log("fail", "check", error=f"LockLost: {exc}")
            return False
        history.log("ok", "check")
        return True


def _publish_session(provider: LockProvider, path: Path) -> None:
    """Where the nemesis finds a worker's ZooKeeper session, to expire it."""
    tiers = getattr(provider, "tiers", None) or {"": provider}  # a bridged provider: {}
    for tier in tiers.values():
        zookeeper = getattr(tier, "aio", tier)  # the asyncio face's, behind its bridge
        if isinstance(zookeeper, (ZooKeeperProvider, aio.ZooKeeperProvider)):
            tier.ping()  # connected: the session exists
            session_id, password = zookeeper.client.client_id
            path.write_text(json.dumps([session_id, password.hex()]))


# -- the nemesis ------------------------------------------------------------------------


class Nemesis:
    """Faults from a seeded schedule, each logged before it is applied."""

    def __init__(
        self,
        spec: Spec,
        servers: dict[str, Any],
        workers: Workers,
        folder: Path,
        seed: int,
    ) -> None:
        self.spec = spec
        self.servers = servers  # kind -> tests.servers.ServerProcess
        self.workers = workers
        self.folder = folder
        self.rng = random.Random(seed)
        self.history = History(folder / "nemesis.jsonl", "nemesis")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nemesis", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        for server in self.servers.values():
            server.ensure_running()

    def log(self, fault: str, target: str) -> None:
        self.history.log("info", "nemesis", fault=fault, target=target)

    def _run(self) -> None:
        while not self._stop.wait(self.rng.uniform(1.0, 3.0)):
            fault = self.rng.choice(self.spec.faults)
            try:
                self._apply(fault)
            except Exception as exc:  # a fault that could not be applied is logged, not fatal
                self.log(f"{fault} failed: {exc}", "")

    def _apply(self, fault: str) -> None:
        kinds = list(self.servers)
        hold = self.rng.uniform(*self.spec.outage)
        if fault in ("kill", "pause"):
            kind = self.rng.choice(kinds)
            server = self.servers[kind]
            self.log(f"{fault} {kind}", kind)
            server.kill() if fault == "kill" else server.pause()
            self._stop.wait(hold)
            self.log(f"{'restart' if fault == 'kill' else 'resume'} {kind}", kind)
            server.start() if fault == "kill" else server.resume()
        elif fault == "worker":
            name = self.workers.kill_one(self.rng)
            self.log(f"kill {name}", name)
        elif fault == "stop":
            name, pid = self.workers.pick(self.rng)
            self.log(f"stop {name}", name)
            os.kill(pid, signal.SIGSTOP)
            self._stop.wait(hold)
            os.kill(pid, signal.SIGCONT)
            self.log(f"continue {name}", name)
        elif fault == "expire":
            self._expire_session()
        elif fault == "switch":
            tier = self.rng.choice(["redis", "db"])
            self.log(f"switch force {tier}", tier)
            Path(self.spec.switch_file).write_text(f'force = "{tier}"\n')
            self._stop.wait(hold)
            self.log("switch clear", tier)
            Path(self.spec.switch_file).write_text("")

    def _expire_session(self) -> None:
        """Expire a worker's ZooKeeper session from outside, as a long partition would:
        a second client joins it and closes it."""
        from kazoo.client import KazooClient  # noqa: PLC0415

        sessions = sorted(self.folder.glob("*.zk"))
        if not sessions:
            return
        path = self.rng.choice(sessions)
        session_id, password = json.loads(path.read_text())
        self.log(f"expire zookeeper session of {path.stem}", path.stem)
        hosts = next(a for k, a in self.spec.addresses.items() if k.endswith("zookeeper"))
        intruder = KazooClient(hosts=hosts, client_id=(session_id, bytes.fromhex(password)))
        intruder.start(timeout=5)
        intruder.stop()
        intruder.close()


class PrimaryOf:
    """A Sentinel topology as the nemesis sees one server: its current primary is what
    is killed or paused. Bringing it back waits for the failover first, so a killed
    primary never restarts empty before its replica was promoted (that loses locks by
    design, and is not what this campaign asks about)."""

    def __init__(self, topology: Any) -> None:
        self.topology = topology
        self.url = topology.url

    def kill(self) -> None:
        self.topology.primary().kill()

    def pause(self) -> None:
        self.topology.primary().pause()

    def start(self) -> None:
        self.topology.ensure_healthy()

    resume = ensure_running = start

    def stop(self) -> None:
        self.topology.stop()


class ShardPrimaryOf:
    """A Cluster as the nemesis sees one server: the primary serving the first campaign
    key's slot is what is killed or paused. Bringing a killed one back waits for its
    replica's promotion first, as `PrimaryOf` does; a paused one resumes, and is
    demoted once it hears of the failover its pause may have caused."""

    KEY = f"locks:{{{KEYS[0]}}}"

    def __init__(self, topology: Any) -> None:
        self.topology = topology
        self.url = topology.url
        self._killed: int | None = None  # the port of the primary killed

    def kill(self) -> None:
        node = self.topology.primary_of(self.KEY)
        self._killed = node.port
        node.kill()

    def pause(self) -> None:
        self.topology.primary_of(self.KEY).pause()

    def start(self) -> None:
        if self._killed is not None:
            self.topology.wait_failover(self.KEY, self._killed)
            self._killed = None
        for node in self.topology.nodes:
            if node.paused:
                node.resume()
        self.topology.ensure_healthy()

    resume = ensure_running = start

    def stop(self) -> None:
        self.topology.stop()


class Workers:
    """The worker processes of a campaign; a killed one is replaced by a new one."""

    def __init__(self, spec: Spec, folder: Path, seed: int, count: int, stop_at: float) -> None:
        self.spec, self.folder, self.seed, self.stop_at = spec, folder, seed, stop_at
        self._lock = threading.Lock()
        self._running: dict[str, Any] = {}
        self._made = 0
        for _ in range(count):
            self._start()

    def _start(self) -> None:
        self._made += 1
        name = f"w{self._made}"
        args = (self.spec, name, str(self.folder), self.seed * 1000 + self._made, self.stop_at)
        process = SPAWN.Process(target=run_worker, args=args, name=name, daemon=True)
        process.start()
        self._running[name] = process

    def pick(self, rng: random.Random) -> tuple[str, int]:
        with self._lock:
            name = rng.choice(sorted(self._running))
            return name, int(self._running[name].pid)

    def kill_one(self, rng: random.Random) -> str:
        with self._lock:
            name = rng.choice(sorted(self._running))
            process = self._running.pop(name)
            process.kill()
            process.join()
            if time.monotonic() < self.stop_at - 2:
                self._start()
            return name

    def join(self) -> list[str]:
        """Wait for every worker; the names of those that did not end cleanly."""
        failed = []
        for name, process in self._running.items():
            process.join(timeout=max(1.0, self.stop_at - time.monotonic() + 30))
            if process.is_alive():
                process.kill()
                failed.append(f"{name} hung")
            elif process.exitcode != 0:
                failed.append(f"{name} exited {process.exitcode}")
        return failed


# -- a whole campaign -------------------------------------------------------------------


@dataclass
class Outcome:
    seed: int
    folder: Path
    verdict: checker.Verdict
    failed_workers: list[str]

    @property
    def ok(self) -> bool:
        return not self.failed_workers and not self.blocking()

    def blocking(self) -> list[checker.Violation]:
        """The violations this campaign's spec does not excuse."""
        return [v for v in self.verdict.violations if v.kind not in self.excused]

    excused: tuple[str, ...] = ()

    def report(self) -> str:
        head = f"campaign seed {self.seed}, history in {self.folder}"
        if self.failed_workers:
            head += f"; workers that failed: {', '.join(self.failed_workers)}"
        if self.excused:
            head += f"; not promised by this campaign: {', '.join(self.excused)}"
        return f"{head}\n{self.verdict.summary()}"


class MembersOf:
    """A quorum's five redis-servers as the nemesis sees one server: each fault takes
    the next one or two members in turn (alternately), so every member and pair is hit;
    a killed member comes back with its data (tests.servers.redis_masters)."""

    def __init__(self, masters: Any) -> None:
        self.masters = masters
        self.url = masters.url
        self._turn = 0
        self._hit: list[Any] = []

    def _next(self) -> list[Any]:
        servers = self.masters.servers
        count = 1 + self._turn % 2
        first = self._turn * 2 % len(servers)
        self._turn += 1
        self._hit = [servers[(first + i) % len(servers)] for i in range(count)]
        return self._hit

    def kill(self) -> None:
        for server in self._next():
            server.kill()

    def pause(self) -> None:
        for server in self._next():
            server.pause()

    def start(self) -> None:
        self.masters.ensure_running()

    resume = ensure_running = start

    def stop(self) -> None:
        self.masters.stop()


def run(
    spec: Spec,
    servers: dict[str, Any],
    *,
    seed: int,
    seconds: float,
    folder: Path,
    workers: int = 4,
) -> Outcome:
    """One campaign against running `servers` (kind -> ServerProcess with `.url`)."""
    folder.mkdir(parents=True, exist_ok=True)
    spec.addresses = {kind: server.url for kind, server in servers.items()}
    if "switch" in spec.faults:
        spec.switch_file = str(folder / "switch.toml")
        Path(spec.switch_file).write_text("")
    Register(str(folder / "register.sqlite"))  # the schema, before the workers race for it
    stop_at = time.monotonic() + seconds
    crew = Workers(spec, folder, seed, workers, stop_at)
    nemesis = Nemesis(spec, servers, crew, folder, seed)
    nemesis.start()
    time.sleep(max(0.0, stop_at - time.monotonic()))
    nemesis.stop()
    failed = crew.join()
    time.sleep(SETTLE)
    history = History(folder / "campaign.jsonl", "campaign")
    for kind, detail in leftovers(spec, servers):
        history.log("info", "leftover", kind=kind, detail=detail)
    events = merge(folder)
    checker.dump(events, folder / MERGED)
    outcome = Outcome(seed, folder, checker.check(events), failed)
    outcome.excused = spec.excused
    return outcome


def _zookeeper_leftovers(hosts: str) -> Iterator[tuple[str, str]]:
    from kazoo.client import KazooClient  # noqa: PLC0415

    zk = KazooClient(hosts=hosts)
    zk.start(timeout=10)
    if zk.exists("/locks"):
        for parent in zk.get_children("/locks"):
            for child in zk.get_children(f"/locks/{parent}"):
                yield "zookeeper node", f"/locks/{parent}/{child}"
    zk.stop()
    zk.close()


def leftovers(spec: Spec, servers: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """Lock state still on the servers once every worker stopped and every lease of a
    dead one has run out: there should be none."""
    redis_kinds = ("redis-hash", "aio-redis-hash", "redis-sentinel", "aio-redis-sentinel",
                   "redis-cluster", "aio-redis-cluster", "redis-quorum", "aio-quorum")  # fmt: skip
    for kind in redis_kinds:
        if kind not in servers:
            continue
        for url in servers[kind].url.split("|"):  # a quorum: each of its members
            reader = RedisHashProvider(url)
            client = reader.client
            for raw in client.scan_iter("locks:*"):
                name = raw.decode()
                if not name.endswith((":fence", ":waiters")):  # those two expire
                    yield "redis key", f"{url}: {name} (pttl {client.pttl(name)})"
                elif client.pttl(name) < 0:
                    yield "redis key without ttl", f"{url}: {name}"
            reader.close()
    for kind in ("zookeeper", "aio-zookeeper"):
        if kind in servers:
            yield from _zookeeper_leftovers(servers[kind].url)
    live_rows = {
        # each database's rows whose lease has not run out, by its own clock
        "mariadb": "SELECT name FROM locks.locks WHERE expires_at > "
        "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))",
        "postgresql": "SELECT name FROM locks WHERE expires_at > "
        "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000 AS BIGINT)",
    }
    live_rows["aio-mariadb"] = live_rows["mariadb"]
    for kind, query in live_rows.items():
        if kind in servers:
            for name in servers[kind].sql(query).splitlines():
                if name.startswith("c:"):
                    yield "database row", name


def main(argv: list[str] | None = None) -> int:
    """`make soak`: campaigns against servers this process starts, seed after seed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--campaign", action="append", choices=sorted(CAMPAIGNS))
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--minutes", type=float, default=None, help="run seeds until then")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    from tests.servers import MariaDBServer, RedisServer, ZooKeeperServer  # noqa: PLC0415
    from tests.servers.postgresql import PostgreSQLServer  # noqa: PLC0415
    from tests.servers.redis_masters import RedisMasters  # noqa: PLC0415
    from tests.servers.redis_topologies import ClusterTopology, SentinelTopology  # noqa: PLC0415

    # absolute: servers resolve a relative data dir against their own working directory
    out = Path(args.out or tempfile.mkdtemp(prefix="locks-soak-")).resolve()
    names = args.campaign or sorted(CAMPAIGNS)
    seed = random.randrange(1 << 30) if args.seed is None else args.seed
    until = time.monotonic() + 60 * (args.minutes or 0)

    def started_at(path: Path, server: Any) -> Any:
        server.start()
        return server

    classes: dict[str, Callable[[Path], Any]] = {
        "redis-hash": lambda path: started_at(path, RedisServer(path)),
        "aio-redis-hash": lambda path: started_at(path, RedisServer(path)),
        "zookeeper": lambda path: started_at(path, ZooKeeperServer(path)),
        "aio-zookeeper": lambda path: started_at(path, ZooKeeperServer(path)),
        "mariadb": lambda path: started_at(path, MariaDBServer(path)),
        "aio-mariadb": lambda path: started_at(path, MariaDBServer(path)),
        "postgresql": lambda path: started_at(path, PostgreSQLServer(path)),
        "redis-sentinel": lambda path: PrimaryOf(started_at(path, SentinelTopology(path))),
        "aio-redis-sentinel": lambda path: PrimaryOf(started_at(path, SentinelTopology(path))),
        "redis-cluster": lambda path: ShardPrimaryOf(started_at(path, ClusterTopology(path))),
        "aio-redis-cluster": lambda path: ShardPrimaryOf(started_at(path, ClusterTopology(path))),
        "redis-quorum": lambda path: MembersOf(started_at(path, RedisMasters(path))),
        "aio-quorum": lambda path: MembersOf(started_at(path, RedisMasters(path))),
    }  # fmt: skip
    started: dict[str, Any] = {}
    try:
        # an earlier run's servers (`make soak` reuses .soak) start afresh: their data
        # would be this run's leftovers, and some refuse a directory that exists
        shutil.rmtree(out / "servers", ignore_errors=True)
        for kind, cls in classes.items():
            (out / "servers" / kind).mkdir(parents=True, exist_ok=True)
            started[kind] = cls(out / "servers" / kind)
        failures = 0
        while True:
            for name in names:
                spec = CAMPAIGNS[name]
                servers = {kind: started[kind] for kind in spec.tiers}
                folder = out / f"{name}-seed-{seed}"
                outcome = run(spec, servers, seed=seed, seconds=args.seconds, folder=folder)
                print(("OK   " if outcome.ok else "FAIL ") + f"{name}: " + outcome.report())
                failures += not outcome.ok
            if time.monotonic() >= until:
                return 1 if failures else 0
            seed += 1
    finally:
        for server in started.values():
            server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
