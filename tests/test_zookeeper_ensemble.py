"""ZooKeeper over a three-node ensemble, proven by killing its members (issue 12):
a dead follower goes unnoticed, a dead leader only puts leases in doubt while the
sessions move, and without a quorum nothing is granted and leases are lost once the
session timeout has passed; service resumes when the members come back."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import Any

import pytest

from locks import BackendUnavailable, Lease, LockLost
from locks.backends import ZooKeeperProvider
from tests import workers
from tests.servers.zookeeper_ensemble import ZooKeeperEnsemble

SPAWN = multiprocessing.get_context("spawn")
SESSION = 2.0  # seconds: the sessions in this file, so that expiry and loss come quickly


def wait_for(condition: Callable[[], object], timeout: float, step: float = 0.005) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return bool(condition())


def from_another_thread(provider: ZooKeeperProvider, key: str, wait: float = 0) -> Lease | None:
    """`provider.acquire(key, wait=wait)` by another owner: one thread's providers over the
    same ensemble share its holds (reentrancy), so a rival must be another thread."""
    result: list[Lease | BaseException | None] = []

    def run() -> None:
        try:
            result.append(provider.acquire(key, wait=wait))
        except BaseException as error:
            result.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


def connected_port(provider: ZooKeeperProvider) -> int:
    """The client port of the member this provider's session is connected through."""
    port: int = provider.client._connection._socket.getpeername()[1]
    return port


def moved(states: list[tuple[float, str]]) -> bool:
    """The connection was lost (SUSPENDED) and is back (CONNECTED, the latest state)."""
    names = [name for _, name in states]
    return "SUSPENDED" in names and names[-1] == "CONNECTED"


@dataclass
class Holder:
    """A provider holding one lease, with every connection state it went through and
    every `on_lost` call, each stamped with the monotonic time it came."""

    provider: ZooKeeperProvider
    lease: Lease
    session_id: int
    states: list[tuple[float, str]]
    lost: list[float] = field(default_factory=list)

    def seen(self, state: str) -> list[float]:
        return [at for at, name in self.states if name == state]

    def in_doubt_for(self) -> float:
        """How long the session was SUSPENDED before it was CONNECTED again."""
        suspended, connected = self.seen("SUSPENDED"), self.seen("CONNECTED")
        assert suspended and connected, self.states
        return connected[-1] - suspended[0]


class Clients:
    """The providers a test makes over the ensemble, connected before anything is killed,
    each with the connection states it goes through from then on; closed after it."""

    def __init__(self, ensemble: ZooKeeperEnsemble) -> None:
        self.ensemble = ensemble
        self.made: list[ZooKeeperProvider] = []
        self.states: dict[int, list[tuple[float, str]]] = {}

    def make(self, session: float = SESSION) -> ZooKeeperProvider:
        provider = ZooKeeperProvider(self.ensemble.hosts, session_timeout=session)
        provider.ping()
        states: list[tuple[float, str]] = []
        provider.client.add_listener(lambda state: states.append((time.monotonic(), state)))
        self.states[id(provider)] = states
        self.made.append(provider)
        return provider

    def hold(self, key: str, session: float = SESSION) -> Holder:
        provider = self.make(session)
        lost: list[float] = []
        lease = provider.acquire(key, wait=5, on_lost=lambda _: lost.append(time.monotonic()))
        assert lease is not None
        session_id = provider.client.client_id[0]
        return Holder(provider, lease, session_id, self.states[id(provider)], lost)

    def moved(self, providers: list[ZooKeeperProvider]) -> bool:
        """Each of `providers` lost its connection and has it back (a client that has not
        noticed its member's death yet still says CONNECTED)."""
        return all(moved(self.states[id(provider)]) for provider in providers)

    def connected(self) -> bool:
        return all(provider.client.state == "CONNECTED" for provider in self.made)


@pytest.fixture
def clients(zookeeper_ensemble: ZooKeeperEnsemble) -> Iterator[Clients]:
    made = Clients(zookeeper_ensemble)
    yield made
    for provider in made.made:
        provider.close()


def sample_checks(holders: list[Holder], stop: threading.Event) -> list[tuple[int, bool, str]]:
    """Call `check()` on every lease until `stop`, in a thread: (holder, in doubt or lost
    before and after the call, outcome) per call, outcome "ok" or the LockLost message."""
    samples: list[tuple[int, bool, str]] = []

    def run() -> None:
        while not stop.is_set():
            for i, holder in enumerate(holders):
                state = holder.lease.state
                before = state.suspended or state.lost
                try:
                    holder.lease.check()
                    outcome = "ok"
                except LockLost as error:
                    outcome = str(error)
                if before == (state.suspended or state.lost):  # no flip in mid-call
                    samples.append((i, before, outcome))
            time.sleep(0.002)

    threading.Thread(target=run, daemon=True).start()
    return samples


def test_a_killed_follower_goes_unnoticed_and_its_own_clients_move(
    zookeeper_ensemble: ZooKeeperEnsemble, clients: Clients, key: str
) -> None:
    ensemble = zookeeper_ensemble
    followers = ensemble.followers()
    # holders until one follower has some connected through it, and others are elsewhere
    holders: list[Holder] = []
    for i in range(40):
        holders.append(clients.hold(f"{key}:{i}"))
        ports = [connected_port(holder.provider) for holder in holders]
        victim = max(followers, key=lambda member: ports.count(member.port))
        if victim.port in ports and set(ports) - {victim.port}:
            break
    else:
        pytest.fail(f"holders never spread over a follower and another member: {ports}")
    rival = clients.make()
    on_victim = [p for p in clients.made if connected_port(p) == victim.port]
    elsewhere = [holder for holder in holders if holder.provider not in on_victim]

    victim.kill()
    killed_at = time.monotonic()
    for holder in elsewhere:  # nothing to notice: the session, and its lease, never waver
        holder.lease.check()
    assert wait_for(lambda: clients.moved(on_victim), SESSION), (
        "the victim's clients did not move within the session timeout"
    )
    moved_in = time.monotonic() - killed_at
    # a new acquire works, the held keys stay excluded, the holders keep their grants
    fresh = rival.acquire(f"{key}:fresh", wait=5)
    assert fresh is not None
    rival.release(fresh)
    for holder in holders:
        assert from_another_thread(rival, holder.lease.key) is None
        holder.lease.check()
        assert holder.provider.is_held(holder.lease)
        assert holder.provider.extend(holder.lease) is holder.lease  # a renewal: still held
        assert holder.lost == [] and not holder.lease.lost
        assert holder.provider.client.client_id[0] == holder.session_id  # the same session
    for holder in elsewhere:
        assert holder.states == [], f"a holder on a live member noticed: {holder.states}"
    for provider in on_victim:
        assert [state for _, state in clients.states[id(provider)]] == ["SUSPENDED", "CONNECTED"]
        assert connected_port(provider) != victim.port
    assert moved_in < SESSION
    for holder in holders:
        holder.provider.release(holder.lease)
        assert from_another_thread(rival, holder.lease.key) is not None  # released


def queue_behind(provider: ZooKeeperProvider, key: str, wait: float) -> list[object]:
    """Start a waiter on `key` in a thread; the list gets its lease (or error), then the
    monotonic time it came."""
    result: list[object] = []

    def run() -> None:
        try:
            result.append(provider.acquire(key, wait=wait))
        except BackendUnavailable as error:
            result.append(error)
        result.append(time.monotonic())

    threading.Thread(target=run, daemon=True).start()
    return result


def test_a_killed_leader_puts_leases_in_doubt_until_the_sessions_move(
    zookeeper_ensemble: ZooKeeperEnsemble, clients: Clients, key: str
) -> None:
    """Short sessions, so that a client slow to find the new leader loses its leases: with
    kazoo's backoff let grow to 1 s between rounds of the hosts, 1 in 16 leases of 1.5 s
    sessions was lost per election measured (1 in 2 with 1 s sessions)."""
    ensemble, session = zookeeper_ensemble, 1.5
    holders = [clients.hold(f"{key}:{i}", session) for i in range(4)]
    fences = [holder.lease.fence for holder in holders]
    rival = clients.make(session)
    waited = queue_behind(clients.make(session), holders[0].lease.key, 10.0)
    time.sleep(0.2)  # the waiter is queued behind holder 0

    stop = threading.Event()
    samples = sample_checks(holders, stop)
    leader = ensemble.leader()
    leader.kill()
    killed_at = time.monotonic()
    # every client is dropped (followers drop theirs while they elect) and comes back;
    # the rival is never let in meanwhile
    while not clients.moved(clients.made) and time.monotonic() - killed_at < 5:
        with contextlib.suppress(BackendUnavailable):
            assert from_another_thread(rival, holders[0].lease.key) is None
        time.sleep(0.01)
    time.sleep(0.05)
    stop.set()
    assert clients.moved(clients.made), [holder.states for holder in holders]
    assert ensemble.wait_leader(5) is not leader

    for holder in holders:
        assert holder.in_doubt_for() < session  # back before the session could expire
    # check() raised exactly while in doubt, and the doubt was seen
    assert all((outcome == "ok") != doubt for _, doubt, outcome in samples)
    assert any("in doubt" in outcome for _, _, outcome in samples)
    for holder, fence in zip(holders, fences, strict=True):  # the same grant, no loss
        holder.lease.check()
        assert holder.provider.is_held(holder.lease)
        assert holder.lease.fence == fence
        assert holder.lost == [] and not holder.lease.lost
        assert holder.provider.client.client_id[0] == holder.session_id
        assert from_another_thread(rival, holder.lease.key) is None

    # the waiter kept its place in the queue: it gets the lock once holder 0 lets go
    assert waited == [], f"the waiter gave up: {waited}"
    released_at = time.monotonic()
    holders[0].provider.release(holders[0].lease)
    assert wait_for(lambda: len(waited) == 2, 5)
    assert isinstance(waited[0], Lease), waited
    assert isinstance(waited[1], float) and waited[1] >= released_at


def test_without_a_quorum_nothing_is_granted_and_leases_are_lost_after_the_session(
    zookeeper_ensemble: ZooKeeperEnsemble, clients: Clients, key: str
) -> None:
    ensemble = zookeeper_ensemble
    holders = [clients.hold(f"{key}:{i}") for i in range(3)]
    asker = clients.make()
    # a holder in another process, which dies while there is no quorum: only the
    # ensemble can end its session, once it has a quorum again
    held = SPAWN.Event()
    process = SPAWN.Process(
        target=workers.hold_until_killed,
        args=("zookeeper-short-session", ensemble.hosts, f"{key}:other", 30.0, held),
    )
    process.start()
    try:
        assert held.wait(30)
        survivor, *doomed = [*ensemble.followers(), ensemble.leader()]  # the leader dies too
        for member in doomed:
            member.kill()
        killed_at = time.monotonic()
        stop = threading.Event()
        samples = sample_checks(holders, stop)

        # no acquire succeeds, and each says so within the request timeout
        while time.monotonic() - killed_at < SESSION + 0.5:
            started = time.monotonic()
            with pytest.raises(BackendUnavailable):
                asker.acquire(f"{key}:{started}", wait=5)
            assert time.monotonic() - started < asker.request_timeout + 0.5
            time.sleep(0.05)
        stop.set()
        # check() raised exactly while in doubt (or lost), and the doubt was seen
        assert all((outcome == "ok") != doubt for _, doubt, outcome in samples)
        assert any("in doubt" in outcome for _, _, outcome in samples)
        assert process.pid is not None
        os.kill(process.pid, signal.SIGKILL)
        for holder in holders:
            assert_lost_after_the_session(holder, killed_at)
        assert survivor.mode() is None  # alone, it does not serve

        # bring them back: the clients are back at once, and every key comes free
        ensemble.start()
        back_at = time.monotonic()
        assert wait_for(clients.connected, 0.8), "slow to find the ensemble again"
        assert wait_for(lambda: _granted(asker, f"{key}:after"), 5, step=0.05)
        for holder in holders:  # each provider deletes the node of its lost lease
            assert wait_for(partial(_granted, asker, holder.lease.key), 5, step=0.05)
        other = asker.acquire(f"{key}:other", wait=SESSION + 3)  # its holder's session expires
        assert other is not None, "the dead process's session never expired"
        assert time.monotonic() - back_at < SESSION + 3
        asker.release(other)
    finally:
        process.kill()
        process.join()


def assert_lost_after_the_session(holder: Holder, killed_at: float) -> None:
    """Marked lost once its session was in doubt for a whole session timeout, not
    before, and told once."""
    assert wait_for(lambda: holder.lost, 2.0), "the lease was never marked lost"
    in_doubt_since = holder.seen("SUSPENDED")[-1]
    assert holder.lost[0] - in_doubt_since >= SESSION - 0.01
    assert holder.lost[0] - killed_at < SESSION + 1.0
    assert len(holder.lost) == 1 and holder.lease.lost
    with pytest.raises(LockLost, match="lost"):
        holder.lease.check()


def _granted(provider: ZooKeeperProvider, key: str) -> bool:
    try:
        lease = provider.acquire(key, wait=0)
    except BackendUnavailable:
        return False
    if lease is None:
        return False
    provider.release(lease)
    return True


def count_under_lock(
    hosts: str, key: str, counter: str, rounds: int, *, out: Queue[Any], go: EventType
) -> None:
    """Worker: `rounds` read-sleep-write increments of `counter` under the lock, riding
    out the ensemble's failures: an acquire that fails is tried again, a release that
    fails is finished by the provider once ZooKeeper answers. Puts the port it is
    connected through, then (value read, fence, lease lost) per round, or its error."""
    provider = ZooKeeperProvider(hosts, session_timeout=SESSION)
    path = Path(counter)
    seen: list[tuple[int, int, bool]] = []
    try:
        provider.ping()
        out.put(connected_port(provider))
        go.wait(60)
        while len(seen) < rounds:
            try:
                lease = provider.acquire(key, wait=10)  # a hand-off takes milliseconds
            except BackendUnavailable:
                time.sleep(0.01)
                continue
            assert lease is not None, "10 s without the lock: a node nobody owns holds it"
            value = int(path.read_text())
            time.sleep(0.001)
            path.write_text(str(value + 1))
            seen.append((value, lease.fence, lease.lost))
            with contextlib.suppress(BackendUnavailable):
                provider.release(lease)
        out.put(seen)
    except BaseException as error:
        out.put(f"{type(error).__name__}: {error}")
        raise
    finally:
        provider.close()


def test_mutual_exclusion_across_processes_while_a_follower_then_the_leader_dies(
    zookeeper_ensemble: ZooKeeperEnsemble, key: str, tmp_path: Path
) -> None:
    """Workers whose member dies lose their connection in the middle of creates, lists
    and deletes: no grant may be doubled, and no node may be left behind (it would hold
    the lock for its live session, with nobody to release it: the workers would wait)."""
    ensemble = zookeeper_ensemble
    counter = tmp_path / "counter"
    counter.write_text("0")
    count, rounds = 4, 100
    total = count * rounds
    out: Queue[Any] = SPAWN.Queue()
    go = SPAWN.Event()
    processes = [
        SPAWN.Process(
            target=count_under_lock,
            args=(ensemble.hosts, key, str(counter), rounds),
            kwargs={"out": out, "go": go},
        )
        for _ in range(count)
    ]
    for process in processes:
        process.start()
    try:
        ports = [out.get(timeout=60) for _ in range(count)]
        # the follower most workers are connected through dies a fifth into the run and
        # comes back; then the leader dies, which drops every worker's connection
        victim = max(ensemble.followers(), key=lambda member: ports.count(member.port))
        go.set()
        assert wait_for(lambda: _read(counter) >= total // 5, 30)
        victim.kill()
        at_kills = [_read(counter)]
        victim.start()
        ensemble.leader().kill()
        at_kills.append(_read(counter))
        reports = [out.get(timeout=60) for _ in range(count)]
    finally:
        for process in processes:
            process.join(10)
            process.kill()
    seen: list[tuple[int, int, bool]] = []
    for report in reports:
        assert isinstance(report, list), report
        seen += report
    assert at_kills[-1] < total, f"the run ended before the leader died: {at_kills}"
    assert sorted(value for value, _, _ in seen) == list(range(total)), "two held it at once"
    assert _read(counter) == total
    by_value = [fence for _, fence in sorted((value, fence) for value, fence, _ in seen)]
    assert by_value == sorted(by_value) and len(set(by_value)) == total, "fences out of order"
    assert not any(lost for _, _, lost in seen)


def _read(counter: Path) -> int:
    """The counter's value (0 while a worker is rewriting it)."""
    return int(counter.read_text() or 0)
