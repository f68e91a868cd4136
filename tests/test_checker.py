"""The history checker on hand-written histories: each violation kind must be flagged, naming the
right events, and clean histories (with faults, timeouts and contention) must pass; a checker
that cannot fail, or that cries wolf, would make every fault campaign meaningless."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.checker import (
    FENCE_ORDER,
    LEFTOVER,
    LOST_UPDATE,
    MALFORMED,
    MUTUAL_EXCLUSION,
    OVERRUN,
    SILENT_LOSS,
    STALE_FENCE,
    Event,
    Verdict,
    check,
    dump,
    load,
)

ROOT = Path(__file__).resolve().parent.parent
WALL = 1.7e9  # wall clock = WALL + mono, so histories look real
AUTO = object()  # valid_until: t_ok + ttl, or None for a watchdog lease
REDIS_FENCE = 1_700_000_000_000_000  # redis fences are time-based, ~1.7e15


class History:
    """Builds histories event by event; each method returns the index of the event a violation
    would name (the completion, or the invoke when there is none)."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def add(self, process: str, type_: str, f: str, mono: float, **fields: Any) -> int:
        self.events.append(
            {"process": process, "type": type_, "f": f, "mono": mono, "wall": WALL + mono} | fields
        )
        return len(self.events) - 1

    def call(
        self,
        process: str,
        f: str,
        t_invoke: float,
        t_done: float | None,
        invoke: dict[str, Any],
        *,
        done: dict[str, Any] | None = None,
        type_: str = "ok",
    ) -> int:
        """An invoke and, unless t_done is None (the worker was killed), its completion."""
        index = self.add(process, "invoke", f, t_invoke, **invoke)
        if t_done is None:
            return index
        return self.add(process, type_, f, t_done, **(done or {}))

    def acquire(
        self,
        process: str,
        key: str,
        t_invoke: float,
        t_ok: float,
        *,
        tier: str = "redis",
        fence: int = 1,
        token: str | None = None,
        ttl: float | None = 10.0,
        wait: float | None = 5.0,
        timeout: float = 1.0,
        valid_until: object = AUTO,
        depth: int = 1,
    ) -> int:
        if valid_until is AUTO:
            valid_until = None if ttl is None else t_ok + ttl
        invoke = {"key": key, "ttl": ttl, "wait": wait, "timeout": timeout}
        done = {
            "granted": True,
            "tier": tier,
            "fence": fence,
            "token": token or f"{process}-{tier}-{fence}",
            "depth": depth,
            "valid_until": valid_until,
        }
        return self.call(process, "acquire", t_invoke, t_ok, invoke, done=done)

    def acquire_timed_out(
        self, process: str, key: str, t_invoke: float, t_done: float, *, wait: float = 1.0
    ) -> int:
        invoke = {"key": key, "ttl": 10.0, "wait": wait, "timeout": 1.0}
        return self.call(process, "acquire", t_invoke, t_done, invoke, done={"granted": False})

    def write(
        self,
        process: str,
        key: str,
        t_invoke: float,
        t_ok: float | None,
        *,
        token: str,
        fence: int,
        read: int,
        order: int,
        tier: str = "redis",
        accepted: bool = True,
        type_: str = "ok",
    ) -> int:
        invoke = {
            "key": key,
            "tier": tier,
            "fence": fence,
            "token": token,
            "value": read + 1,
            "read": read,
        }
        done = {"accepted": accepted, "order": order} if type_ == "ok" else {}
        return self.call(process, "write", t_invoke, t_ok, invoke, done=done, type_=type_)

    def read(self, process: str, key: str, t: float, *, token: str, value: int) -> int:
        invoke = {"key": key, "token": token}
        return self.call(process, "read", t, t + 0.001, invoke, done={"value": value})

    def release(
        self,
        process: str,
        key: str,
        t_invoke: float,
        t_done: float | None,
        *,
        token: str,
        error: str | None = None,
    ) -> int:
        invoke = {"key": key, "token": token}
        if error is None:
            return self.call(process, "release", t_invoke, t_done, invoke)
        return self.call(
            process, "release", t_invoke, t_done, invoke, done={"error": error}, type_="fail"
        )

    def check(
        self, process: str, key: str, t: float, *, token: str, error: str | None = None
    ) -> int:
        invoke = {"key": key, "token": token}
        if error is None:
            return self.call(process, "check", t, t + 0.0001, invoke)
        return self.call(
            process, "check", t, t + 0.0001, invoke, done={"error": error}, type_="fail"
        )

    def lost(self, process: str, key: str, t: float, *, token: str) -> int:
        return self.add(process, "info", "lost", t, key=key, token=token, reason="expired")

    def fault(self, fault: str, target: str, t: float) -> int:
        return self.add("nemesis", "info", "nemesis", t, fault=fault, target=target)

    def kill(self, process: str, t: float) -> int:
        return self.fault(f"kill {process}", process, t)

    def leftover(self, kind: str, detail: str, t: float) -> int:
        return self.add("campaign", "info", "leftover", t, kind=kind, detail=detail)

    def hold(
        self,
        process: str,
        key: str,
        t: float,
        *,
        fence: int,
        read: int,
        order: int,
        tier: str = "redis",
        ttl: float | None = 10.0,
    ) -> float:
        """A whole critical section: acquire, read, check, write read + 1, release. Returns the
        time it ended."""
        token = f"{process}-{tier}-{fence}-{order}"
        self.acquire(process, key, t, t + 0.001, tier=tier, fence=fence, token=token, ttl=ttl)
        self.read(process, key, t + 0.002, token=token, value=read)
        self.check(process, key, t + 0.004, token=token)
        self.write(
            process, key, t + 0.005, t + 0.006, token=token, tier=tier, fence=fence, read=read,
            order=order,
        )  # fmt: skip
        self.release(process, key, t + 0.007, t + 0.008, token=token)
        return t + 0.008


def only(verdict: Verdict, kind: str) -> str:
    """The one violation of `kind`, asserting there is nothing else, as its message."""
    assert verdict.kinds() == {kind}, verdict.summary()
    assert len(verdict.violations) == 1, verdict.summary()
    return verdict.violations[0].message


def assert_clean(history: History) -> None:
    verdict = check(history.events)
    assert verdict.ok, verdict.summary()
    assert verdict.summary().startswith("OK")


# -- every kind is flagged --------------------------------------------------------------


def test_two_holders_that_both_write_break_mutual_exclusion() -> None:
    h = History()
    a = h.acquire("w1", "k1", 0.0, 0.01, tier="redis", fence=REDIS_FENCE, token="a")
    b = h.acquire("w2", "k1", 0.5, 0.6, tier="zk", fence=7, token="b")  # a chain split brain
    wa = h.write("w1", "k1", 1.0, 1.01, token="a", fence=REDIS_FENCE, read=0, order=1)
    wb = h.write("w2", "k1", 2.0, 2.01, token="b", tier="zk", fence=7, read=1, order=2)
    h.release("w1", "k1", 3.0, 3.01, token="a")
    h.release("w2", "k1", 3.5, 3.51, token="b")
    message = only(check(h.events), MUTUAL_EXCLUSION)
    assert f"w1 acquire ok #{a} (key k1, tier redis, fence {REDIS_FENCE})" in message
    assert f"w2 acquire ok #{b} (key k1, tier zk, fence 7)" in message
    assert f"w1 write ok #{wa}" in message and f"w2 write ok #{wb}" in message
    violation = check(h.events).violations[0]
    assert violation.events == tuple(h.events[index] for index in (a, wa, b, wb))


def test_a_write_of_unknown_outcome_counts_as_written() -> None:
    h = History()
    h.acquire("w1", "k1", 0.0, 0.01, fence=1, token="a")
    h.write("w1", "k1", 0.5, 0.51, token="a", fence=1, read=0, order=1)
    h.acquire("w2", "k1", 1.0, 1.01, fence=2, token="b", valid_until=None)  # w1 still holds
    wb = h.write("w2", "k1", 1.5, None, token="b", fence=2, read=1, order=0)  # killed
    h.release("w1", "k1", 2.0, 2.01, token="a")
    message = only(check(h.events), MUTUAL_EXCLUSION)
    assert f"w2 write invoke #{wb} (key k1, tier redis, fence 2, value 2, read 1)" in message
    assert "with no completion" in message


@pytest.mark.parametrize("inner", ["a", "a2"], ids=["shared-token", "own-token"])
def test_releasing_a_reentrant_level_leaves_the_outer_grant_held(inner: str) -> None:
    h = History()
    outer = h.acquire("w1", "k1", 0.0, 0.01, fence=3, token="a")
    h.acquire("w1", "k1", 0.1, 0.11, fence=3, token=inner, depth=2)
    h.release("w1", "k1", 0.3, 0.31, token=inner)
    other = h.acquire("w2", "k1", 0.32, 0.35, tier="zk", fence=1, token="b", valid_until=None)
    h.write("w1", "k1", 0.4, 0.41, token="a", fence=3, read=0, order=1)
    h.write("w2", "k1", 0.42, 0.43, token="b", tier="zk", fence=1, read=1, order=2)
    h.release("w1", "k1", 0.5, 0.51, token="a")
    h.release("w2", "k1", 0.6, 0.61, token="b")
    message = only(check(h.events), MUTUAL_EXCLUSION)
    assert f"w1 acquire ok #{outer}" in message and f"w2 acquire ok #{other}" in message


def test_a_stale_read_is_a_lost_update() -> None:
    h = History()
    h.acquire("w1", "k1", 0.0, 0.01, fence=1, token="a")
    first = h.write("w1", "k1", 0.1, 0.11, token="a", fence=1, read=0, order=1)
    h.release("w1", "k1", 0.2, 0.21, token="a")
    h.acquire("w2", "k1", 0.3, 0.31, fence=2, token="b")
    second = h.write("w2", "k1", 0.4, 0.41, token="b", fence=2, read=0, order=2)  # read 0, not 1
    h.release("w2", "k1", 0.5, 0.51, token="b")
    message = only(check(h.events), LOST_UPDATE)
    assert (
        f"w2 write ok #{second} (key k1, tier redis, fence 2, value 1, read 0, order 2" in message
    )
    assert f"w1 write ok #{first}" in message and "had stored 1" in message


@pytest.mark.parametrize("late_fence", [3, 5], ids=["lower", "equal-other-token"])
def test_an_accepted_write_with_a_stale_fence_is_flagged(late_fence: int) -> None:
    h = History()
    # w2 asked first and was granted last: no fence order between them, but the register
    # must still refuse the second writer's fence
    h.add("w2", "invoke", "acquire", 0.0, key="k1", ttl=10.0, wait=5.0, timeout=1.0)
    h.acquire("w1", "k1", 0.1, 0.5, fence=5, token="a")
    top = h.write("w1", "k1", 1.0, 1.01, token="a", fence=5, read=0, order=1)
    h.release("w1", "k1", 1.5, 1.51, token="a")
    h.add(
        "w2", "ok", "acquire", 2.0, granted=True, tier="redis", fence=late_fence, token="b",
        depth=1, valid_until=12.0,
    )  # fmt: skip
    stale = h.write("w2", "k1", 2.5, 2.51, token="b", fence=late_fence, read=1, order=2)
    h.release("w2", "k1", 3.0, 3.01, token="b")
    message = only(check(h.events), STALE_FENCE)
    assert message.startswith(f"w2 write ok #{stale} (key k1, tier redis, fence {late_fence}")
    assert f"after w1 write ok #{top}" in message and "with fence 5" in message


@pytest.mark.parametrize("later_fence", [7, 10], ids=["lower", "equal"])
def test_a_later_grant_without_a_higher_fence_breaks_fence_order(later_fence: int) -> None:
    h = History()
    first = h.acquire("w1", "k1", 0.0, 0.1, tier="zk", fence=10, token="a", valid_until=None)
    h.release("w1", "k1", 1.0, 1.01, token="a")
    later = h.acquire(
        "w2", "k1", 2.0, 2.1, tier="zk", fence=later_fence, token="b", valid_until=None
    )
    h.release("w2", "k1", 3.0, 3.01, token="b")
    h.acquire("w3", "k1", 4.0, 4.1, tier="redis", fence=1, token="c")  # other tier: unrelated
    h.release("w3", "k1", 5.0, 5.01, token="c")
    message = only(check(h.events), FENCE_ORDER)
    assert f"w1 acquire ok #{first} (key k1, tier zk, fence 10)" in message
    assert f"w2 acquire ok #{later} (key k1, tier zk, fence {later_fence})" in message


@pytest.mark.parametrize("how", ["check", "release", "lost-too-late"])
def test_a_watchdog_lease_lost_without_on_lost_is_a_silent_loss(how: str) -> None:
    h = History()
    grant = h.acquire("w1", "k1", 0.0, 0.01, fence=1, token="a", ttl=None, valid_until=None)
    h.write("w1", "k1", 0.5, 0.51, token="a", fence=1, read=0, order=1)
    if how == "release":
        evidence = h.release("w1", "k1", 3.0, 3.01, token="a", error="LockNotOwned: gone")
    else:
        evidence = h.check("w1", "k1", 3.0, token="a", error="LockLost: renewal failed")
        if how == "lost-too-late":
            h.lost("w1", "k1", 3.5, token="a")
        h.release("w1", "k1", 4.0, 4.01, token="a", error="LockNotOwned: gone")
    message = only(check(h.events), SILENT_LOSS)
    assert f"w1 acquire ok #{grant} (key k1, tier redis, fence 1)" in message
    assert f"w1 {'release' if how == 'release' else 'check'} fail #{evidence}" in message
    assert ("came only after" in message) == (how == "lost-too-late")


def test_calls_that_outlast_wait_plus_timeout_overrun() -> None:
    h = History()
    slow = h.acquire("w1", "k1", 0.0, 3.0, fence=1, token="a", wait=1.0, timeout=0.5)
    stuck = h.release("w1", "k1", 4.0, 5.2, token="a")  # bound: 0 + 0.5 + slack 0.5
    h.acquire("w2", "k1", 0.0, 100.0, fence=2, token="b", wait=None)  # unbounded: fine
    h.release("w2", "k1", 101.0, 102.5, token="b")  # exactly at the bound: fine
    verdict = check(h.events)
    assert verdict.kinds() == {OVERRUN}, verdict.summary()
    messages = [violation.message for violation in verdict.violations]
    assert len(messages) == 2
    assert messages[0].startswith(f"w1 acquire ok #{slow}") and "took 3.000 s" in messages[0]
    assert messages[1].startswith(f"w1 release ok #{stuck}") and "took 1.200 s" in messages[1]
    assert check(h.events, slack=2.0).ok


def test_a_killed_or_paused_worker_is_excused_from_overrun() -> None:
    h = History()
    h.acquire("w1", "k1", 0.0, 0.01, fence=1, token="a", ttl=1.0)
    h.release("w1", "k1", 0.5, None, token="a")  # killed in flight: no completion
    h.kill("w1", 0.6)
    h.acquire("w2", "k1", 2.0, 2.01, fence=2, token="b", wait=1.0)
    h.fault("pause w2", "w2", 2.5)
    h.release("w2", "k1", 2.4, 9.0, token="b")  # SIGSTOPped for 6 s mid-call
    assert_clean(h)


def test_a_register_call_held_up_by_a_worker_stopped_in_the_register_is_excused() -> None:
    """The register is one SQLite file: a worker the nemesis stopped inside its
    transaction holds every other worker's read and write until it continues. That stall
    is the harness's; the same read with no worker fault during it overruns."""
    for stalled in (True, False):
        h = History()
        h.acquire("w1", "k1", 0.0, 0.01, fence=1, token="a", ttl=30.0, timeout=2.0)
        h.acquire("w2", "k2", 0.0, 0.01, fence=1, token="b", ttl=30.0)
        if stalled:
            h.fault("stop w2", "w2", 0.05)
        read = h.call("w1", "read", 0.1, 3.2, {"key": "k1", "token": "a"}, done={"value": 0})
        if stalled:
            h.fault("continue w2", "w2", 3.1)
        h.release("w1", "k1", 3.3, 3.31, token="a")
        h.release("w2", "k2", 3.3, 3.31, token="b")
        if stalled:
            assert_clean(h)
        else:
            assert only(check(h.events), OVERRUN).startswith(f"w1 read ok #{read}")


def test_every_leftover_is_a_violation() -> None:
    h = History()
    h.hold("w1", "k1", 0.0, fence=1, read=0, order=1)
    node = h.leftover("zookeeper node", "/locks/k1/lock-0000000003", 9.0)
    message = only(check(h.events), LEFTOVER)
    assert f"campaign leftover info #{node} (kind zookeeper node, detail /locks/k1/" in message


def test_malformed_events_are_reported_without_hiding_a_real_violation() -> None:
    h = History()
    h.acquire("w1", "k1", 0.0, 0.01, fence=1, token="a")
    h.write("w1", "k1", 0.1, 0.11, token="a", fence=1, read=0, order=1)
    no_mono = h.add("w1", "invoke", "read", 0.15, key="k1", token="a")
    del h.events[no_mono]["mono"]
    h.add("w1", "ok", "read", 0.16, value=1)
    orphan = h.add("w9", "ok", "release", 0.17)  # nothing in flight
    unknown = h.add("w1", "info", "teleport", 0.18)
    h.release("w1", "k1", 0.2, 0.21, token="a")
    h.acquire("w2", "k1", 0.3, 0.31, fence=2, token="b")
    stale = h.write("w2", "k1", 0.4, 0.41, token="b", fence=2, read=0, order=2)
    h.release("w2", "k1", 0.5, 0.51, token="b")
    h.events.append({"unparsed": '{"process": "w3", "ty', "line": 99})
    verdict = check(h.events)
    assert verdict.kinds() == {MALFORMED, LOST_UPDATE}, verdict.summary()
    malformed = [v.message for v in verdict.violations if v.kind == MALFORMED]
    assert len(malformed) == 4, malformed
    assert any(message.startswith(f"#{no_mono}: ") and "mono" in message for message in malformed)
    assert any(
        message.startswith(f"#{orphan}: w9 release ok has no invoke") for message in malformed
    )
    assert any(
        message.startswith(f"#{unknown}: ") and "teleport" in message for message in malformed
    )
    assert any("line 99 is not a JSON object" in message for message in malformed)
    lost = [v.message for v in verdict.violations if v.kind == LOST_UPDATE]
    assert lost and f"w2 write ok #{stale}" in lost[0]


def test_the_summary_counts_every_kind_and_lists_at_most_fifty() -> None:
    h = History()
    for number in range(60):
        h.leftover("database row", f"k{number}", 1.0)
    verdict = check(h.events)
    lines = verdict.summary().splitlines()
    assert lines[0] == "FAIL: 60 violations in 60 events: leftover 60"
    assert len(lines) == 1 + 50 + 1 and lines[-1] == "... and 10 more"
    assert str(verdict) == verdict.summary() and not verdict.ok


# -- clean histories pass ---------------------------------------------------------------


def test_sequential_holders_on_one_key_are_clean() -> None:
    h = History()
    t = 0.0
    for order in range(1, 31):
        t = h.hold(f"w{order % 3}", "k1", t + 0.01, fence=order * 2, read=order - 1, order=order)
    assert_clean(h)


def test_contention_with_timed_out_acquires_is_clean() -> None:
    h = History()
    h.acquire("w1", "k1", 0.0, 0.01, fence=1, token="a")
    h.add("w3", "invoke", "acquire", 1.0, key="k1", ttl=10.0, wait=5.0, timeout=1.0)
    h.acquire_timed_out("w2", "k1", 1.0, 2.05, wait=1.0)
    h.write("w1", "k1", 2.5, 2.51, token="a", fence=1, read=0, order=1)
    h.release("w1", "k1", 3.0, 3.01, token="a")
    h.add(
        "w3", "ok", "acquire", 3.02, granted=True, tier="redis", fence=2, token="c", depth=1,
        valid_until=13.02,
    )  # fmt: skip
    h.write("w3", "k1", 3.5, 3.51, token="c", fence=2, read=1, order=2)
    h.release("w3", "k1", 4.0, 4.01, token="c")
    h.add("w2", "invoke", "acquire", 4.5, key="k1", ttl=10.0, wait=0.5, timeout=1.0)
    h.add("w2", "info", "acquire", 6.1)  # interrupted by a timeout, outcome unknown
    assert_clean(h)


def test_failing_over_from_redis_to_zookeeper_is_clean() -> None:
    h = History()
    fence = REDIS_FENCE + 17
    h.acquire("w1", "k1", 0.0, 0.01, tier="redis", fence=fence, token="a", ttl=3.0)
    h.write("w1", "k1", 0.5, 0.51, token="a", tier="redis", fence=fence, read=0, order=1)
    h.fault("kill redis", "redis", 1.0)
    h.release("w1", "k1", 1.2, 1.25, token="a", error="BackendUnavailable: connection refused")
    h.acquire("w2", "k1", 1.3, 3.2, tier="zk", fence=1001, token="b", valid_until=None)
    h.write("w2", "k1", 3.5, 3.51, token="b", tier="zk", fence=1001, read=1, order=2)
    h.release("w2", "k1", 4.0, 4.01, token="b")
    h.fault("restart redis", "redis", 5.0)
    h.acquire("w1", "k1", 6.0, 6.01, tier="redis", fence=fence + 1, token="c")  # fail-back
    h.write("w1", "k1", 6.5, 6.51, token="c", tier="redis", fence=fence + 1, read=2, order=3)
    h.release("w1", "k1", 7.0, 7.01, token="c")
    assert_clean(h)


def test_an_expired_holder_and_its_successor_are_clean() -> None:
    h = History()
    h.acquire("w1", "k1", 0.0, 0.01, fence=1, token="a", ttl=1.0)
    h.write("w1", "k1", 0.5, 0.51, token="a", fence=1, read=0, order=1)
    h.acquire("w2", "k1", 0.6, 1.05, fence=2, token="b")  # after w1's valid_until, 1.01
    h.write("w2", "k1", 1.2, 1.21, token="b", fence=2, read=1, order=2)
    h.release("w2", "k1", 1.5, 1.51, token="b")
    # w1 wakes up late: its write is refused, its release finds the lock gone
    h.write("w1", "k1", 1.8, 1.81, token="a", fence=1, read=1, order=3, accepted=False)
    h.release("w1", "k1", 2.0, 2.01, token="a", error="LockNotOwned: expired")
    assert_clean(h)


@pytest.mark.parametrize("tier", ["redis", "zk"])
def test_a_killed_holder_taken_over_after_expiry_is_clean(tier: str) -> None:
    h = History()
    ttl = 2.0 if tier == "redis" else None  # zk: the session ends some time after the kill
    h.acquire("w1", "k1", 0.0, 0.01, tier=tier, fence=1, token="a", ttl=ttl)
    h.write("w1", "k1", 0.5, 0.51, token="a", tier=tier, fence=1, read=0, order=1)
    h.write("w1", "k1", 0.8, None, token="a", tier=tier, fence=1, read=1, order=0)  # in flight
    h.kill("w1", 0.9)
    h.acquire("w2", "k1", 1.0, 5.0, tier=tier, fence=2, token="b", wait=10.0)
    # the killed write did reach the register (order 2): w2 reads its value, 2
    h.write("w2", "k1", 5.5, 5.51, token="b", tier=tier, fence=2, read=2, order=3)
    h.release("w2", "k1", 6.0, 6.01, token="b")
    assert_clean(h)


def test_a_refused_write_inside_an_overlap_is_clean() -> None:
    h = History()
    h.acquire("w1", "k1", 0.0, 0.01, fence=1, token="a")
    h.acquire("w2", "k1", 1.0, 1.01, fence=2, token="b")  # the server lost w1's key
    h.write("w2", "k1", 1.5, 1.51, token="b", fence=2, read=0, order=1)
    h.write("w1", "k1", 2.0, 2.01, token="a", fence=1, read=0, order=2, accepted=False)
    h.release("w2", "k1", 2.5, 2.51, token="b")
    h.release("w1", "k1", 3.0, 3.01, token="a", error="LockNotOwned: taken")
    assert_clean(h)


def test_touching_windows_do_not_overlap() -> None:
    h = History()
    h.acquire("w1", "k1", 0.0, 0.01, fence=1, token="a")
    h.write("w1", "k1", 0.5, 0.51, token="a", fence=1, read=0, order=1)
    h.acquire("w2", "k1", 0.2, 1.0, fence=2, token="b")
    h.release("w1", "k1", 1.0, 1.01, token="a")  # in the same instant as w2's grant
    h.write("w2", "k1", 1.5, 1.51, token="b", fence=2, read=1, order=2)
    h.release("w2", "k1", 2.0, 2.01, token="b")
    assert_clean(h)


@pytest.mark.parametrize("inner", ["a", "a2"], ids=["shared-token", "own-token"])
def test_reentrant_levels_inside_their_outer_grant_are_clean(inner: str) -> None:
    h = History()
    h.acquire("w1", "k1", 0.0, 0.01, fence=3, token="a")
    h.acquire("w1", "k1", 0.1, 0.11, fence=3, token=inner, depth=2)
    h.write("w1", "k1", 0.2, 0.21, token=inner, fence=3, read=0, order=1)
    h.release("w1", "k1", 0.3, 0.31, token=inner)  # the inner level only
    h.write("w1", "k1", 0.4, 0.41, token="a", fence=3, read=1, order=2)  # still held
    h.release("w1", "k1", 0.5, 0.51, token="a")
    h.acquire("w2", "k1", 0.45, 0.52, fence=4, token="b")
    h.write("w2", "k1", 0.6, 0.61, token="b", fence=4, read=2, order=3)
    h.release("w2", "k1", 0.7, 0.71, token="b")
    assert_clean(h)


def test_a_release_after_on_lost_is_not_a_silent_loss() -> None:
    h = History()
    h.acquire("w1", "k1", 0.0, 0.01, fence=1, token="a", ttl=None)
    h.lost("w1", "k1", 2.0, token="a")
    h.check("w1", "k1", 2.5, token="a", error="LockLost: renewal failed")
    h.release("w1", "k1", 3.0, 3.01, token="a", error="LockNotOwned: gone")
    # a second release of a released token fails on its own: not evidence either
    h.acquire("w2", "k1", 4.0, 4.01, fence=2, token="b", ttl=None)
    h.release("w2", "k1", 5.0, 5.01, token="b")
    h.release("w2", "k1", 5.1, 5.11, token="b", error="LockNotOwned: not held")
    # nor is a second release of an inner level while the outer grant is still held
    h.acquire("w3", "k1", 6.0, 6.01, fence=3, token="c", ttl=None)
    h.acquire("w3", "k1", 6.1, 6.11, fence=3, token="c2", ttl=None, depth=2)
    h.release("w3", "k1", 6.2, 6.21, token="c2")
    h.release("w3", "k1", 6.3, 6.31, token="c2", error="LockNotOwned: level released")
    h.release("w3", "k1", 6.4, 6.41, token="c")
    assert_clean(h)


def test_a_history_survives_dump_and_load(tmp_path: Path) -> None:
    h = History()
    t = 0.0
    for order in range(1, 6):
        t = h.hold("w1", "k1", t, fence=order, read=order - 1, order=order)
    h.fault("pause mariadb", "mariadb", t)
    path = tmp_path / "history.jsonl"
    dump(h.events, path)
    assert load(path) == h.events
    assert check(load(path)).ok
    with path.open("a", encoding="utf-8") as out:
        out.write('{"process": "w1", "type": "inv\n')  # torn by a kill
    assert check(load(path)).kinds() == {MALFORMED}


def long_history(events: int) -> History:
    """Four workers taking turns on ten keys, ten events per critical section."""
    h = History()
    values = [0] * 10
    t = 0.0
    for order in range(1, events // 10 + 1):
        key = order % 10
        t = h.hold(
            f"w{order % 4}", f"k{key}", t + 0.001, fence=order, read=values[key], order=order,
            ttl=None if order % 2 else 30.0,
        )  # fmt: skip
        values[key] += 1
    return h


def test_a_long_clean_history_checks_quickly() -> None:
    h = long_history(100_000)
    assert len(h.events) == 100_000
    started = time.monotonic()
    verdict = check(h.events)
    assert verdict.ok, verdict.summary()
    assert time.monotonic() - started < 5.0


def test_the_command_line_exits_by_the_verdict(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    dump(long_history(100).events, good)
    bad_history = long_history(100)
    bad_history.leftover("redis key without ttl", "lock:k1", 99.0)
    bad = tmp_path / "bad.jsonl"
    dump(bad_history.events, bad)
    for path, code, first in ((good, 0, "OK"), (bad, 1, "FAIL: 1 violation in")):
        run = subprocess.run(
            [sys.executable, "-m", "tests.checker", str(path), "--slack", "0.5"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert run.returncode == code, run.stdout + run.stderr
        assert run.stdout.startswith(first)
