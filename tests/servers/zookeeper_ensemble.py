"""A three-node ZooKeeper ensemble on loopback (Debian's `zookeeper`), for the tests that
kill, pause and restart its members: a follower, the leader, two of three.

Each member is a `ZooKeeperServer` with an id (`myid` in its data dir) and the
`server.N=127.0.0.1:quorum:election` lines naming all three; the short tick of the
standalone server keeps sessions short, and elections too (`initLimit`/`syncLimit` in
ticks). A member is ready once `srvr` says `Mode: leader` or `Mode: follower`: it serves
only while it is part of a quorum, so a lone survivor is never "ready".
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ports import free_port
from tests.servers import ZooKeeperServer, _running, _session_server

SERVING = ("leader", "follower")


def _srvr(port: int) -> str:
    """The `srvr` four-letter answer of the server on `port` ("" if none)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"srvr")
            chunks = []
            while chunk := sock.recv(4096):
                chunks.append(chunk)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


class EnsembleMember(ZooKeeperServer):
    """One member: its own dir, id and client port; quorum and election ports are
    written in by the ensemble once every member's client port is known."""

    heap = "128m"  # three JVMs on a 2-core machine

    def __init__(self, workdir: Path, myid: int) -> None:
        super().__init__(workdir)
        self.myid = myid
        (workdir / "data" / "myid").write_text(f"{myid}\n")

    def command(self) -> list[str]:
        java, *rest = super().command()
        # timestamps in the log, to line an election up with what the clients saw
        stamps = ["-Dorg.slf4j.simpleLogger.showDateTime=true",
                  "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS"]  # fmt: skip
        return [java, *stamps, *rest]

    def mode(self) -> str | None:
        """`leader`, `follower`, or None while it does not serve (down, paused, electing)."""
        if self.process is None or self.paused:
            return None
        for line in _srvr(self.port).splitlines():
            if line.startswith("Mode: "):
                return line.removeprefix("Mode: ").strip()
        return None

    def ready(self) -> bool:
        return self.mode() in SERVING

    def launch(self) -> None:
        """Start the JVM without waiting: a member serves only once a quorum is up."""
        log = (self.workdir / f"{self.name}.log").open("ab")
        self.process = subprocess.Popen(
            self.command(), cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT
        )

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready():
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"member {self.myid} died:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"member {self.myid} never served:\n{self.log_tail()}")
            time.sleep(0.02)

    def start(self, timeout: float = 30.0) -> None:
        """Start this member and wait until it serves (the others must make a quorum)."""
        self.launch()
        self.wait_ready(timeout)

    def log_tail(self) -> str:
        return (self.workdir / f"{self.name}.log").read_text(errors="replace")[-2000:]

    def __repr__(self) -> str:
        return f"<member {self.myid} on {self.address}>"


class ZooKeeperEnsemble:
    """Three members on free 127.0.0.1 ports; kill, pause, resume or restart any of them
    (`ensemble.members[i].kill()`), find the leader, bring everything back."""

    def __init__(self, workdir: Path, size: int = 3) -> None:
        self.members: list[EnsembleMember] = []
        for myid in range(1, size + 1):
            memberdir = workdir / f"member-{myid}"
            memberdir.mkdir()
            self.members.append(EnsembleMember(memberdir, myid))
        taken = {member.port for member in self.members}
        lines = []
        for member in self.members:
            quorum, election = _ports(2, taken)
            lines.append(f"server.{member.myid}=127.0.0.1:{quorum}:{election}\n")
        peers = "".join(lines)
        for member in self.members:
            with (member.workdir / "zoo.cfg").open("a") as config:
                # a follower syncs within 2 s and is dropped after 1 s of silence
                config.write(f"initLimit=10\nsyncLimit=5\n{peers}")

    @property
    def hosts(self) -> str:
        """The connection string a client is given: every member."""
        return ",".join(member.address for member in self.members)

    url = hosts

    def start(self, timeout: float = 60.0) -> None:
        """Launch every member that is down (together: one alone never serves), resume
        the paused ones, and wait until all serve under one leader."""
        for member in self.members:
            if member.paused:
                member.resume()
            if member.process is not None and member.process.poll() is not None:
                member.process = None
            if member.process is None:
                member.launch()
        self.wait_serving(timeout)

    ensure_running = start

    def wait_serving(self, timeout: float = 60.0) -> None:
        """Wait until every member serves and exactly one of them leads."""
        deadline = time.monotonic() + timeout
        for member in self.members:
            member.wait_ready(max(deadline - time.monotonic(), 0.0))
        while [member.mode() for member in self.members].count("leader") != 1:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no single leader: {self.modes()}")
            time.sleep(0.02)

    def wait_leader(self, timeout: float = 30.0) -> EnsembleMember:
        """The leader, once there is one (after an election)."""
        deadline = time.monotonic() + timeout
        while True:
            for member in self.members:
                if member.mode() == "leader":
                    return member
            if time.monotonic() > deadline:
                raise RuntimeError(f"no leader within {timeout} s: {self.modes()}")
            time.sleep(0.02)

    def leader(self) -> EnsembleMember:
        """The member that leads now."""
        return self.wait_leader(timeout=0.0)

    def followers(self) -> list[EnsembleMember]:
        return [member for member in self.members if member.mode() == "follower"]

    def member_on(self, port: int) -> EnsembleMember:
        """The member whose client port is `port`."""
        return next(member for member in self.members if member.port == port)

    def modes(self) -> dict[int, str | None]:
        return {member.myid: member.mode() for member in self.members}

    def stop(self) -> None:
        for member in self.members:
            member.stop()


def _ports(count: int, taken: set[int]) -> list[int]:
    """`count` free loopback ports, none of them in `taken` (which they join)."""
    found: list[int] = []
    while len(found) < count:
        port = free_port()
        if port not in taken:
            taken.add(port)
            found.append(port)
    return found


@pytest.fixture(scope="session")
def zookeeper_ensemble_session(server_dir: Path) -> Iterator[ZooKeeperEnsemble]:
    """Started on first use only: three JVMs are not for runs that never ask for them."""
    yield from _session_server(ZooKeeperEnsemble, "zookeeper-ensemble", server_dir)


@pytest.fixture
def zookeeper_ensemble(
    zookeeper_ensemble_session: ZooKeeperEnsemble,
) -> Iterator[ZooKeeperEnsemble]:
    """The session's ensemble, all three serving under a leader when a test starts and
    again after it, whatever the test killed or paused."""
    yield from _running(zookeeper_ensemble_session)
