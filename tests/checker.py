"""A Jepsen-style history checker for lock fault campaigns.

Workers take a lock and, while holding it, do a fenced read-modify-write on a shared register;
a nemesis kills and pauses servers. Every operation goes to a history, and `check` reports each
violation with the events that show it. It must be strict (a real violation is flagged) and
precise (clean histories with faults, timeouts and contention pass): a clean run means something.

History: JSON Lines, one event (a JSON object) per line; `load` and `dump` read and write it.
Every event has `process` (str: "w1", "nemesis", "campaign"), `type` ("invoke", "ok", "fail",
or "info" = outcome unknown), `f` (the operation), `mono` (time.monotonic(); system-wide on
Linux, so comparable across processes on one host) and `wall` (time.time()).

A call is an "invoke" and then one completion ("ok"/"fail"/"info") of the same process and `f`.
A process has at most one call in flight, so a completion pairs with its process's latest
unmatched invoke; an invoke never completed (its worker was killed) counts as "info".

Operations, with their fields beyond the common ones:

- acquire: invoke `key`, `ttl` (None = watchdog lease), `wait` (None = unbounded), `timeout`
  (the backend's request timeout). ok `granted` (False: wait ran out), and when granted `tier`,
  `fence` (int), `token` (unique per grant), `depth` (1 fresh, >1 a reentrant level sharing the
  outer fence), `valid_until` (monotonic; None = no expiry). fail `error` ("Class: message").
- release: invoke `key`, `token`; fail `error`.
- extend: invoke `key`, `token`, `ttl`; ok `valid_until`; fail `error`.
- read: invoke `key`, `token`; ok `value` (int).
- write: invoke `key`, `tier`, `fence`, `token`, `value` (int, the new value), `read` (int, the
  value read before); ok `accepted` (bool: the register refuses a fence below the last it
  accepted for the key and tier) and `order` (int: the register's sequence number for the write,
  accepted or not, comparable across the writes of a key).
- check: lease.check() just before a write: invoke `key`, `token`; ok, or fail `error`.
- lost (type info, no invoke): an on_lost callback ran: `key`, `token`, `reason`.
- nemesis (type info): `fault` ("kill redis", "pause mariadb", "kill w3"), `target`. Not judged;
  named next to violations. A fault containing "kill" whose target is a worker marks it killed.
- leftover (type info): written by the campaign after every worker stopped and released:
  `kind` ("zookeeper node", "redis key without ttl", "database row"), `detail`. Each one is a
  violation.

Command line: `python -m tests.checker HISTORY.jsonl [--slack S]` prints the summary and exits
0 when the history is clean, 1 when it is not.
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import json
import math
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

Event = dict[str, Any]

MUTUAL_EXCLUSION = "mutual-exclusion"
LOST_UPDATE = "lost-update"
STALE_FENCE = "stale-fence"
FENCE_ORDER = "fence-order"
SILENT_LOSS = "silent-loss"
OVERRUN = "overrun"

_REGISTER_CALLS = ("read", "write")  # a worker's calls on the campaign's shared register
LEFTOVER = "leftover"
MALFORMED = "malformed"
KINDS = (
    MUTUAL_EXCLUSION,
    LOST_UPDATE,
    STALE_FENCE,
    FENCE_ORDER,
    SILENT_LOSS,
    OVERRUN,
    LEFTOVER,
    MALFORMED,
)

SUMMARY_LINES = 50  # violations listed by `Verdict.summary`; the rest are counted
FAULT_HORIZON = 30.0  # nemesis faults this many seconds before a violation are named in it
FAULTS_NAMED = 3

_LOSS_ERRORS = ("LockLost", "LockNotOwned")  # errors that prove a lease was gone
_TYPES = frozenset({"invoke", "ok", "fail", "info"})
_STANDALONE = frozenset({"lost", "nemesis", "leftover"})  # info events that belong to no call
_CALLS = frozenset({"acquire", "release", "extend", "read", "write", "check"})
_TOKENED = frozenset({"release", "extend", "read", "write", "check"})  # calls made under a lease


def _is_str(value: object) -> bool:
    return isinstance(value, str)


def _is_num(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_opt_num(value: object) -> bool:
    return value is None or _is_num(value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_bool(value: object) -> bool:
    return isinstance(value, bool)


def _is_depth(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


_Spec = tuple[tuple[str, Callable[[object], bool]], ...]
_BASE: _Spec = (("process", _is_str), ("type", _TYPES.__contains__), ("f", _is_str))
_TIMES: _Spec = (("mono", _is_num), ("wall", _is_num))
_KEY_TOKEN: _Spec = (("key", _is_str), ("token", _is_str))
_ERROR: _Spec = (("error", _is_str),)
_FIELDS: dict[tuple[str, str], _Spec] = {
    ("acquire", "invoke"): (
        ("key", _is_str),
        ("ttl", _is_opt_num),
        ("wait", _is_opt_num),
        ("timeout", _is_num),
    ),
    ("acquire", "ok"): (("granted", _is_bool),),
    ("acquire", "fail"): _ERROR,
    ("release", "invoke"): _KEY_TOKEN,
    ("release", "fail"): _ERROR,
    ("extend", "invoke"): (*_KEY_TOKEN, ("ttl", _is_opt_num)),
    ("extend", "ok"): (("valid_until", _is_opt_num),),
    ("extend", "fail"): _ERROR,
    ("read", "invoke"): _KEY_TOKEN,
    ("read", "ok"): (("value", _is_int),),
    ("write", "invoke"): (
        *_KEY_TOKEN,
        ("tier", _is_str),
        ("fence", _is_int),
        ("value", _is_int),
        ("read", _is_int),
    ),
    ("write", "ok"): (("accepted", _is_bool), ("order", _is_int)),
    ("check", "invoke"): _KEY_TOKEN,
    ("check", "fail"): _ERROR,
    ("lost", "info"): (*_KEY_TOKEN, ("reason", _is_str)),
    ("nemesis", "info"): (("fault", _is_str), ("target", _is_str)),
    ("leftover", "info"): (("kind", _is_str), ("detail", _is_str)),
}
_GRANTED: _Spec = (
    ("tier", _is_str),
    ("fence", _is_int),
    ("token", _is_str),
    ("depth", _is_depth),
    ("valid_until", _is_opt_num),
)
# what `_name` shows of an event, per operation
_SHOWN: dict[str, tuple[str, ...]] = {
    "acquire": ("key", "tier", "fence", "depth", "granted", "error"),
    "write": ("key", "tier", "fence", "value", "read", "order", "accepted", "error"),
    "read": ("key", "token", "value", "error"),
    "lost": ("key", "token", "reason"),
    "nemesis": ("fault", "target"),
    "leftover": ("kind", "detail"),
}
_SHOWN_DEFAULT = ("key", "token", "valid_until", "error")


def _bad_fields(event: Event, spec: _Spec) -> list[str]:
    return [name for name, ok in spec if name not in event or not ok(event[name])]


@dataclass(frozen=True)
class Violation:
    """One finding: `kind` (one of KINDS), a message naming the events as `w3 acquire ok #812
    (...)` where #812 is the index in the history, and the offending events themselves."""

    kind: str
    message: str
    events: tuple[Event, ...] = ()

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


@dataclass
class Verdict:
    """Every violation found in a history of `checked` events; `ok` when there are none."""

    violations: list[Violation]
    checked: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations

    def kinds(self) -> set[str]:
        return {violation.kind for violation in self.violations}

    def summary(self) -> str:
        """Counts per kind, then the first SUMMARY_LINES violations, so a bad campaign's report
        stays readable."""
        if self.ok:
            return f"OK: no violations in {self.checked} events"
        counts = Counter(violation.kind for violation in self.violations)
        per_kind = ", ".join(f"{kind} {counts[kind]}" for kind in KINDS if counts[kind])
        count = len(self.violations)
        plural = "" if count == 1 else "s"
        lines = [f"FAIL: {count} violation{plural} in {self.checked} events: {per_kind}"]
        lines += [str(violation) for violation in self.violations[:SUMMARY_LINES]]
        if len(self.violations) > SUMMARY_LINES:
            lines.append(f"... and {len(self.violations) - SUMMARY_LINES} more")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def load(path: str | Path) -> list[Event]:
    """Read a JSON Lines history. A line that is not a JSON object (a worker killed mid-write)
    becomes an `{"unparsed", "line"}` event, so `check` reports it instead of losing it."""
    events: list[Event] = []
    with Path(path).open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                event = None
            if not isinstance(event, dict):
                event = {"unparsed": line.rstrip("\n")[:200], "line": number}
            events.append(event)
    return events


def dump(events: Iterable[Event], path: str | Path) -> None:
    """Write a history as JSON Lines, one event per line, in order."""
    with Path(path).open("w", encoding="utf-8") as out:
        for event in events:
            out.write(json.dumps(event) + "\n")


@dataclass(eq=False)
class _Call:
    """An invoke and its completion. `broken`: the invoke lacks fields, so no rule uses the call;
    `unknown`: the completion lacks fields, so its outcome counts as unknown."""

    f: str
    process: str
    index: int
    invoke: Event
    done_index: int | None = None
    done: Event | None = None
    broken: bool = False
    unknown: bool = False
    level: _Level | None = None  # the grant level its token names (calls under a lease)
    live: bool = False  # its grant had not been released yet when it was invoked

    @property
    def start(self) -> float:
        return float(self.invoke["mono"])

    @property
    def end(self) -> float | None:
        return None if self.done is None or not _is_num(self.done.get("mono")) else self.done_mono

    @property
    def done_mono(self) -> float:
        assert self.done is not None
        return float(self.done["mono"])

    @property
    def outcome(self) -> str:
        """One of ok, fail, info; info also when there is no completion or it lacks fields."""
        return "info" if self.done is None or self.unknown else str(self.done["type"])

    def field(self, name: str) -> Any:
        """A field of the completion, else of the invoke."""
        if self.done is not None and name in self.done:
            return self.done[name]
        return self.invoke.get(name)


@dataclass(eq=False)
class _Grant:
    """A fresh grant (or an orphan reentrant level) and what happened to its lease."""

    call: _Call
    process: str
    key: str
    tier: str
    fence: int
    token: str
    start: float  # acquire ok mono
    watchdog: bool
    valid_until: float | None
    fresh: bool
    released_at: float | None = None
    lost: tuple[int, float] | None = None  # (index, mono) of its first lost event
    writes: list[_Call] = field(default_factory=list)
    evidence: _Call | None = None  # the first failed call proving the lease was gone
    end: float = math.inf


@dataclass(eq=False)
class _Level:
    """One granted acquire: the fresh grant itself or a reentrant level inside it."""

    call: _Call
    grant: _Grant
    token: str
    timeout: float
    released: bool = False


def _error_name(error: str) -> str:
    head = error.split(":", 1)[0].split("(", 1)[0].strip()
    return head.rsplit(".", 1)[-1]


def _proves_loss(error: object) -> bool:
    return isinstance(error, str) and (
        error.startswith(_LOSS_ERRORS) or _error_name(error) in _LOSS_ERRORS
    )


class _Checker:
    """One pass pairs calls and tracks grants in history order; the rules then run on the
    result, each in O(n log n) so long campaigns check quickly."""

    def __init__(self, events: Sequence[Event], slack: float) -> None:
        self.events = events
        self.slack = slack
        self.found: list[tuple[int, int, Violation]] = []
        self.calls: list[_Call] = []
        self.call_at: dict[int, _Call] = {}
        self.inflight: dict[str, _Call] = {}
        self.last_call: dict[str, _Call] = {}
        self.last_mono: dict[str, float] = {}  # each process's last invoke/ok/fail
        self.grants: list[_Grant] = []
        self.levels: dict[tuple[str, str], list[_Level]] = defaultdict(list)
        self.by_token: dict[str, list[_Level]] = defaultdict(list)
        self.outer: dict[tuple[str, str], _Grant] = {}  # (process, key): unreleased fresh grant
        self.lost: list[int] = []
        self.faults: list[tuple[float, int]] = []
        self.kills: dict[str, list[float]] = defaultdict(list)
        self.targeted: dict[str, list[float]] = defaultdict(list)
        self.worker_faults: list[float] = []  # faults aimed at a worker, in time order
        self.history_end = -math.inf

    # -- reporting ----------------------------------------------------------------------

    def report(self, kind: str, message: str, indices: Sequence[int]) -> None:
        events = tuple(self.events[index] for index in indices)
        if kind not in (MALFORMED, LEFTOVER):
            message += self.recent_faults(events)
        first = min(indices, default=-1)
        self.found.append((KINDS.index(kind), first, Violation(kind, message, events)))

    def malformed(self, index: int, problem: str) -> None:
        self.report(MALFORMED, f"#{index}: {problem}", [index])

    def recent_faults(self, events: Sequence[Event]) -> str:
        monos = [float(event["mono"]) for event in events if _is_num(event.get("mono"))]
        if not monos or not self.faults:
            return ""
        last = max(monos)
        low = bisect.bisect_left(self.faults, (min(monos) - FAULT_HORIZON, -1))
        high = bisect.bisect_right(self.faults, (last, len(self.events)))
        named = [
            f"{self.events[index]['fault']} #{index} ({last - mono:.2f} s before)"
            for mono, index in self.faults[max(low, high - FAULTS_NAMED) : high]
        ]
        return f" [recent faults: {'; '.join(named)}]" if named else ""

    def name(self, index: int) -> str:
        """`w3 acquire ok #812 (key k1, tier redis, fence 17)`: who, what, where, and the
        fields that matter for the operation."""
        event = self.events[index]
        call = self.call_at.get(index)
        f = str(event.get("f"))
        parts: list[str] = []
        for name in _SHOWN.get(f, _SHOWN_DEFAULT):
            completion = call is not None and call.done_index == index
            value = call.field(name) if call is not None and completion else event.get(name)
            if name == "granted":
                if value is False:
                    parts.append("not granted")
            elif name == "accepted":
                if value is not None:
                    parts.append("accepted" if value else "rejected")
            elif value is not None and not (name == "depth" and value == 1):
                parts.append(f"{name} {value}")
        detail = f" ({', '.join(parts)})" if parts else ""
        return f"{event.get('process')} {f} {event.get('type')} #{index}{detail}"

    def call_name(self, call: _Call) -> str:
        if call.done_index is None:
            return f"{self.name(call.index)} with no completion"
        return self.name(call.done_index)

    def call_index(self, call: _Call) -> int:
        return call.index if call.done_index is None else call.done_index

    # -- pairing ------------------------------------------------------------------------

    def pair(self) -> None:
        for index, event in enumerate(self.events):
            if not isinstance(event, dict):
                self.malformed(index, f"not an event: {event!r:.80}")
                continue
            if "unparsed" in event and "process" not in event:
                self.malformed(index, f"line {event.get('line')} is not a JSON object")
                continue
            bad = _bad_fields(event, _BASE)
            if bad:
                self.malformed(index, f"cannot be paired: bad or missing {', '.join(bad)}")
                continue
            process, kind, f = str(event["process"]), str(event["type"]), str(event["f"])
            if f not in _CALLS and f not in _STANDALONE:
                self.malformed(index, f"{process} {kind} of unknown operation {f!r}")
                continue
            bad = _bad_fields(event, _TIMES) + _bad_fields(event, _FIELDS.get((f, kind), ()))
            if not _bad_fields(event, _TIMES):
                self.history_end = max(self.history_end, float(event["mono"]))
            if f in _STANDALONE:
                self.standalone(index, event, bad)
            elif kind == "invoke":
                self.invoked(index, event, bad)
            else:
                self.completed(index, event, bad)

    def standalone(self, index: int, event: Event, bad: list[str]) -> None:
        process, kind, f = str(event["process"]), str(event["type"]), str(event["f"])
        if kind != "info":
            self.malformed(index, f"{process} {f} must be of type info, not {kind}")
        elif bad:
            self.malformed(index, f"{process} {f} info lacks {', '.join(bad)}")
        elif f == "lost":
            self.lost.append(index)  # matched to its grant at the end: it may race the ok
        elif f == "nemesis":
            mono = float(event["mono"])
            self.faults.append((mono, index))
            target = str(event["target"])
            self.targeted[target].append(mono)
            if "kill" in str(event["fault"]).lower():
                self.kills[target].append(mono)
        else:
            self.report(LEFTOVER, f"{self.name(index)}: left behind after the campaign", [index])

    def invoked(self, index: int, event: Event, bad: list[str]) -> None:
        process, f = str(event["process"]), str(event["f"])
        pending = self.inflight.pop(process, None)
        if pending is not None:
            self.malformed(
                pending.index,
                f"{self.name(pending.index)} has no completion before the process's next "
                f"invoke #{index}; its outcome counts as unknown",
            )
        call = _Call(f, process, index, event, broken=bool(bad))
        self.calls.append(call)
        self.call_at[index] = call
        self.inflight[process] = call
        self.last_call[process] = call
        if bad:
            self.malformed(index, f"{process} {f} invoke lacks {', '.join(bad)}")
            return
        self.last_mono[process] = float(event["mono"])
        if f in _TOKENED:
            self.under_lease(call)

    def completed(self, index: int, event: Event, bad: list[str]) -> None:
        process, kind, f = str(event["process"]), str(event["type"]), str(event["f"])
        call = self.inflight.get(process)
        if call is None or call.f != f:
            waiting = "nothing" if call is None else f"#{call.index} ({call.f})"
            self.malformed(
                index, f"{process} {f} {kind} has no invoke to pair with ({waiting} in flight)"
            )
            return
        del self.inflight[process]
        call.done_index, call.done = index, event
        self.call_at[index] = call
        if kind != "info" and not _bad_fields(event, _TIMES):
            mono = float(event["mono"])
            self.last_mono[process] = max(self.last_mono.get(process, -math.inf), mono)
        if f == "acquire" and kind == "ok" and event.get("granted") is True:
            bad += _bad_fields(event, _GRANTED)
        if bad:
            self.malformed(index, f"{process} {f} {kind} lacks {', '.join(bad)}")
            call.unknown = True
        if call.broken or call.unknown:
            return
        if f == "acquire" and kind == "ok" and event["granted"]:
            self.granted(call)
        elif f == "extend" and kind == "ok":
            self.extended(call)
        elif kind == "fail" and f in ("release", "extend", "check") and call.level is not None:
            grant = call.level.grant
            if call.live and grant.evidence is None and _proves_loss(event["error"]):
                grant.evidence = call

    # -- grants -------------------------------------------------------------------------

    def granted(self, call: _Call) -> None:
        done = call.done
        assert done is not None
        process, key, token = call.process, str(call.invoke["key"]), str(done["token"])
        timeout = float(call.invoke["timeout"])
        depth = int(done["depth"])
        if depth > 1:
            outer = self.outer.get((process, key))
            if outer is not None:
                self.add_level(_Level(call, outer, token, timeout))
                return
            self.malformed(
                self.call_index(call),
                f"{self.call_name(call)} is a reentrant level with no outer grant of "
                f"{process} on {key}; checked as a grant of its own",
            )
        elif token in self.by_token:
            earlier = self.by_token[token][-1].call
            self.malformed(
                self.call_index(call),
                f"{self.call_name(call)} reuses the token of {self.call_name(earlier)}",
            )
        valid_until = done["valid_until"]
        grant = _Grant(
            call=call,
            process=process,
            key=key,
            tier=str(done["tier"]),
            fence=int(done["fence"]),
            token=token,
            start=call.done_mono,
            watchdog=call.invoke["ttl"] is None,
            valid_until=None if valid_until is None else float(valid_until),
            fresh=depth == 1,
        )
        self.grants.append(grant)
        self.add_level(_Level(call, grant, token, timeout))
        if grant.fresh:
            self.outer[(process, key)] = grant

    def add_level(self, level: _Level) -> None:
        self.levels[(level.call.process, level.token)].append(level)
        self.by_token[level.token].append(level)

    def under_lease(self, call: _Call) -> None:
        """Ties a call made under a lease to its grant; a release ends the innermost open level
        of its token, and the grant's window when that level is the fresh grant itself."""
        stack = self.levels.get((call.process, str(call.invoke["token"])))
        if not stack:
            self.malformed(
                call.index,
                f"{self.name(call.index)} names a token no grant of {call.process} holds",
            )
            return
        level = stack[-1]
        grant = level.grant
        call.live = grant.released_at is None
        if call.f == "release":
            open_levels = [candidate for candidate in stack if not candidate.released]
            if open_levels:
                level = open_levels[-1]
                level.released = True
                if level.call is grant.call:
                    grant.released_at = call.start
                    if self.outer.get((call.process, grant.key)) is grant:
                        del self.outer[(call.process, grant.key)]
            else:
                call.live = False  # a second release of a token is no evidence of loss
        elif call.f == "write":
            grant.writes.append(call)
        call.level = level

    def extended(self, call: _Call) -> None:
        """An extend that was sent while the lease was still valid moves its expiry."""
        if call.level is None:
            return
        grant = call.level.grant
        valid_until = call.field("valid_until")
        if grant.valid_until is not None and call.start <= grant.valid_until:
            grant.valid_until = None if valid_until is None else float(valid_until)

    def match_lost(self) -> None:
        unknown_acquires = {
            (call.process, call.invoke.get("key"))
            for call in self.calls
            if call.f == "acquire" and not call.broken and call.outcome == "info"
        }
        for index in self.lost:
            event = self.events[index]
            process, token, mono = str(event["process"]), str(event["token"]), event["mono"]
            stack = self.levels.get((process, token)) or self.by_token.get(token)
            if stack:
                grant = stack[-1].grant
                if grant.lost is None or mono < grant.lost[1]:
                    grant.lost = (index, float(mono))
            elif (process, event["key"]) not in unknown_acquires:
                self.malformed(index, f"{self.name(index)} names a token no grant holds")

    def death(self, process: str) -> float | None:
        """When a killed process stopped, else None. Killed: a nemesis kill names it, or its
        last call never completed or completed as info. Its stop is the later of the kill and
        its last invoke/ok/fail (info completions may be written later, by the campaign)."""
        kills = self.kills.get(process, [])
        last = self.last_call.get(process)
        if not kills and (last is None or last.outcome != "info"):
            return None
        return max([*kills, self.last_mono.get(process, -math.inf)])

    def windows(self) -> None:
        """A grant holds from its acquire ok until the earliest of its release invoke, its
        valid_until, its first lost event, and its process's death; else the history's end."""
        deaths = {process: self.death(process) for process in self.last_call}
        for grant in self.grants:
            ends = [self.history_end]
            for end in (grant.released_at, grant.valid_until, deaths.get(grant.process)):
                if end is not None:
                    ends.append(end)
            if grant.lost is not None:
                ends.append(grant.lost[1])
            grant.end = min(ends)

    # -- rules --------------------------------------------------------------------------

    def first_write_inside(self, grant: _Grant) -> _Call | None:
        """The grant's first write that may have reached the register inside its window."""
        for write in grant.writes:
            if write.broken or not grant.start <= write.start <= grant.end:
                continue
            outcome = write.outcome
            if outcome == "info" or (outcome == "ok" and write.field("accepted") is True):
                return write
        return None

    def mutual_exclusion(self) -> None:
        by_key: dict[str, list[tuple[_Grant, _Call]]] = defaultdict(list)
        for grant in self.grants:
            write = self.first_write_inside(grant) if grant.end > grant.start else None
            if write is not None:
                by_key[grant.key].append((grant, write))
        for key, holders in by_key.items():
            holders.sort(key=lambda holder: holder[0].start)
            active: list[tuple[float, int, _Grant, _Call]] = []
            for number, (grant, write) in enumerate(holders):
                while active and active[0][0] <= grant.start:  # touching is not overlapping
                    heapq.heappop(active)
                for _, _, other, other_write in active:
                    self.report(
                        MUTUAL_EXCLUSION,
                        f"{self.call_name(other.call)} [{other.start:.3f}, {other.end:.3f}] and "
                        f"{self.call_name(grant.call)} [{grant.start:.3f}, {grant.end:.3f}] held "
                        f"{key} at once, and both wrote: {self.call_name(other_write)} and "
                        f"{self.call_name(write)}",
                        [
                            self.call_index(other.call),
                            self.call_index(other_write),
                            self.call_index(grant.call),
                            self.call_index(write),
                        ],
                    )
                heapq.heappush(active, (grant.end, number, grant, write))

    def accepted_writes(self) -> dict[str, list[_Call]]:
        """Accepted writes per key in the register's order; a repeated order is malformed."""
        by_key: dict[str, list[_Call]] = defaultdict(list)
        for call in self.calls:
            ok = call.f == "write" and not call.broken and call.outcome == "ok"
            if ok and call.field("accepted") is True:
                by_key[str(call.invoke["key"])].append(call)
        for writes in by_key.values():
            writes.sort(key=lambda call: (int(call.field("order")), call.index))
            for before, after in pairwise(writes):
                if before.field("order") == after.field("order"):
                    self.report(
                        MALFORMED,
                        f"{self.call_name(before)} and {self.call_name(after)} have the same "
                        "register order",
                        [self.call_index(before), self.call_index(after)],
                    )
        return by_key

    def lost_updates(self, accepted: dict[str, list[_Call]]) -> None:
        """A write must have read what the previous accepted write stored; a value that a
        write of unknown outcome (sent earlier) stored is also a fair read."""
        maybe: dict[str, dict[int, float]] = defaultdict(dict)
        for call in self.calls:
            if call.f == "write" and not call.broken and call.outcome == "info":
                values = maybe[str(call.invoke["key"])]
                value = int(call.invoke["value"])
                values[value] = min(values.get(value, math.inf), call.start)
        for key, writes in accepted.items():
            for before, after in pairwise(writes):
                read, stored = after.invoke["read"], before.invoke["value"]
                if read == stored or maybe[key].get(read, math.inf) < after.start:
                    continue
                self.report(
                    LOST_UPDATE,
                    f"{self.call_name(after)} read {read}, but the write before it in the "
                    f"register's order, {self.call_name(before)}, had stored {stored}",
                    [self.call_index(before), self.call_index(after)],
                )

    def stale_fences(self, accepted: dict[str, list[_Call]]) -> None:
        for writes in accepted.values():
            highest: dict[str, _Call] = {}  # per tier: the accepted write with the top fence
            for write in writes:
                tier, fence = str(write.invoke["tier"]), int(write.invoke["fence"])
                top = highest.get(tier)
                if top is None:
                    highest[tier] = write
                    continue
                top_fence = int(top.invoke["fence"])
                if fence < top_fence or (
                    fence == top_fence and self.owner(write) != self.owner(top)
                ):
                    self.report(
                        STALE_FENCE,
                        f"{self.call_name(write)} was accepted after {self.call_name(top)} "
                        f"with fence {top_fence} on the same key and tier",
                        [self.call_index(top), self.call_index(write)],
                    )
                elif fence > top_fence:
                    highest[tier] = write

    @staticmethod
    def owner(write: _Call) -> object:
        """The grant a write was made under (reentrant levels share their outer fence)."""
        return write.invoke["token"] if write.level is None else write.level.grant

    def fence_order(self) -> None:
        """A grant completed before another started must carry a lower fence. Sorting by ok
        time and sweeping by invoke time with a running maximum keeps it O(n log n)."""
        groups: dict[tuple[str, str], list[_Grant]] = defaultdict(list)
        for grant in self.grants:
            if grant.fresh:
                groups[(grant.key, grant.tier)].append(grant)
        for grants in groups.values():
            by_ok = sorted(grants, key=lambda grant: grant.start)
            done = 0
            top: _Grant | None = None
            for grant in sorted(grants, key=lambda grant: grant.call.start):
                while done < len(by_ok) and by_ok[done].start < grant.call.start:
                    if top is None or by_ok[done].fence > top.fence:
                        top = by_ok[done]
                    done += 1
                if top is not None and top.fence >= grant.fence:
                    self.report(
                        FENCE_ORDER,
                        f"{self.call_name(top.call)} completed before "
                        f"{self.call_name(grant.call)} was invoked (#{grant.call.index}), "
                        f"yet the later grant's fence is not above {top.fence}",
                        [self.call_index(top.call), self.call_index(grant.call)],
                    )

    def silent_losses(self) -> None:
        for grant in self.grants:
            evidence = grant.evidence
            if not grant.watchdog or evidence is None or evidence.done_index is None:
                continue
            kills = self.kills.get(grant.process)
            if kills and evidence.done_mono >= min(kills):
                continue  # a worker being killed may fail in any way
            lost = grant.lost
            recorded_before = lost is not None and (
                lost[1] <= evidence.done_mono or lost[0] < evidence.done_index
            )
            if recorded_before:
                continue
            late = "" if lost is None else f" (its lost event #{lost[0]} came only after)"
            self.report(
                SILENT_LOSS,
                f"the watchdog lease of {self.call_name(grant.call)} was gone, as "
                f"{self.call_name(evidence)} shows, with no lost event before it{late}",
                [self.call_index(grant.call), evidence.done_index],
            )

    def overruns(self) -> None:
        for call in self.calls:
            end = call.end
            if call.broken or end is None:
                continue
            if call.f == "acquire":
                if call.invoke["wait"] is None:
                    continue
                wait, timeout = float(call.invoke["wait"]), float(call.invoke["timeout"])
            elif call.f in ("release", "extend", "read", "write") and call.level is not None:
                wait, timeout = 0.0, call.level.timeout
            else:
                continue
            elapsed = end - call.start
            if elapsed <= wait + timeout + self.slack or self.excused(call, end):
                continue
            self.report(
                OVERRUN,
                f"{self.call_name(call)} took {elapsed:.3f} s, over wait {wait:g} + timeout "
                f"{timeout:g} + slack {self.slack:g} (invoked #{call.index})",
                [call.index, self.call_index(call)],
            )

    def excused(self, call: _Call, end: float) -> bool:
        """A call cut by a kill, or during which the nemesis paused or killed its own process,
        may take as long as the fault lasted. The register is one SQLite file, written in
        transactions: a call on it waits for any worker the nemesis stopped inside one,
        until that worker continues or dies (a fault of that worker during the call)."""
        if self.kills.get(call.process) and self.last_call.get(call.process) is call:
            return True
        if call.f in _REGISTER_CALLS:
            faults = self.worker_faults
        else:
            faults = self.targeted.get(call.process, [])
        return bisect.bisect_right(faults, end) > bisect.bisect_left(faults, call.start)

    def run(self) -> Verdict:
        self.pair()
        self.faults.sort()
        for monos in self.targeted.values():
            monos.sort()
        workers = {call.process for call in self.calls}
        self.worker_faults = sorted(
            mono for target, monos in self.targeted.items() if target in workers for mono in monos
        )
        self.match_lost()
        self.windows()
        self.mutual_exclusion()
        accepted = self.accepted_writes()
        self.lost_updates(accepted)
        self.stale_fences(accepted)
        self.fence_order()
        self.silent_losses()
        self.overruns()
        self.found.sort(key=lambda found: found[:2])
        return Verdict([violation for _, _, violation in self.found], len(self.events))


def check(events: Sequence[Event], *, slack: float = 0.5) -> Verdict:
    """Every violation in a history (see the module docstring for the format).

    Windows: a grant holds from its acquire ok until the earliest of its release invoke, its
    valid_until (moved by an extend sent before it passed), its first lost event, and, when its
    process was killed, the process's stop; else until the history's end. Reentrant levels
    (depth > 1) belong to the open fresh grant of the same process and key. `slack` is the
    time a call may take beyond wait + timeout before it is an overrun.
    """
    return _Checker(events, slack).run()


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m tests.checker HISTORY.jsonl [--slack S]`: 0 when clean, 1 when not."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.checker", description="Check a lock campaign's history."
    )
    parser.add_argument("history", type=Path, help="a JSON Lines history")
    parser.add_argument("--slack", type=float, default=0.5, help="seconds (default 0.5)")
    args = parser.parse_args(argv)
    verdict = check(load(args.history), slack=args.slack)
    print(verdict.summary())
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
