"""Lua scripts of the Redis backends, loaded once per client and called by SHA.

Every script touches only keys of one lock, which share a hash tag, so all of them
run on Redis Cluster. The release channel is passed in ARGV: channels are not keys.

Both acquire scripts answer in one shape, as cheap to parse as possible on the hot
path (a bare integer):
  fence > 0                a grant under the token passed in
  -1 - pttl  (<= 0)        held by another owner for pttl more ms (-1: no expiry)
  {pttl}                   held by this very owner on the non-reentrant backend

The two lock types exclude each other on one name: each reads the other's key as held
(never a WRONGTYPE error), and both draw fences from the same counter.

A release publishes only when someone waits: an acquire that finds the lock held and
will wait for it (the last ARGV: how many ms it may still wait, -1 for ever, 0 not at
all) marks the lock's `waiting` key, which lives until after that waiter's next try of
its own (the shorter of the holder's PTTL and its wait, plus a second; a longer mark is
never shortened). A release finding no mark wakes nobody, since nobody
sleeps: a waiter that fails again marks again before it sleeps. The mark is not cleared
by a release, so the other waiters of a process that won keep their wake-ups. The mark
(`<lock key>:waiting`) is not among a script's KEYS: it shares the lock's hash tag, so
it lives on the lock's node, and usually it does not exist — declared, it would turn
every call during a Cluster slot migration into TRYAGAIN (some keys moved, some not).

Fence rule (shared by both acquire scripts): each lock has a counter key. A grant
increments it; when the increment finds no counter (first use, or the counter
expired), the counter is seeded from the server clock in microseconds, with a
`fence_ttl` expiry. So Redis memory does not grow with the number of names ever
used, and fences still strictly increase: a counter only gains 1 per grant, a grant
takes more than a microsecond of server time, so no fence ever runs ahead of the
clock, and a re-seeded counter starts above every fence handed out before.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from redis.exceptions import NoScriptError

# Computes the next fence into `fence`. KEYS[2] = fence key, ARGV[3] = fence ttl (ms).
_NEXT_FENCE = """
local fence = redis.call('INCR', KEYS[2])
if fence == 1 then
  local now = redis.call('TIME')
  fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
  redis.call('SET', KEYS[2], string.format('%d', fence), 'PX', ARGV[3])
end
"""

# What both acquire scripts return when the key is held by someone else: -1 - pttl. A key
# that vanished between two calls of a script cannot happen (a script sees one instant),
# but a negative PTTL must never turn into a positive reply, which would read as a fence.
# A caller that will wait (`waits` ms, -1 for ever) marks the lock until after its next
# try of its own: it sleeps at most pttl (-1, no expiry: it polls) and at most its wait.
_MARK = """
local wait = tonumber(waits)
if wait ~= 0 then
  local mark, waiting = math.max(pttl, 0), KEYS[1] .. ':waiting'
  if wait > 0 and wait < mark then mark = wait end
  mark = mark + 1000
  if redis.call('PTTL', waiting) < mark then
    redis.call('SET', waiting, '1', 'PX', mark)
  end
end
"""
_HELD = (
    """
local pttl = redis.call('PTTL', KEYS[1])
if pttl < -1 then pttl = 0 end
"""
    + _MARK
    + """
return -1 - pttl
"""
)

# Wakes the waiters of the lock KEYS[1] on channel ARGV[2], if its mark says any wait.
_WAKE = """
  if redis.call('EXISTS', KEYS[1] .. ':waiting') == 1 then
    redis.call('PUBLISH', ARGV[2], '1')
  end
"""

# KEYS: lock, fence.  ARGV: value (owner .. '/' .. token), ttl ms, fence ttl ms,
# waits (ms a failed try may wait: -1 for ever, 0 not at all). Telling the holder's own
# second acquire apart lets a caller that would wait forever for itself be refused
# instead of deadlocked.
# `pcall`: a lock of the `redis-hash` type under the same name is a hash, which GET
# cannot read; it simply excludes us.
PLAIN_ACQUIRE = (
    """
local waits = ARGV[4]
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
"""
    + _NEXT_FENCE
    + """
  return fence
end
local holder = redis.pcall('GET', KEYS[1])
if type(holder) == 'string' then
  local owner = string.match(ARGV[1], '^[^/]*/')
  if string.sub(holder, 1, string.len(owner)) == owner then
    local pttl = redis.call('PTTL', KEYS[1])
"""
    + _MARK
    + """
    return {pttl}
  end
end
"""
    + _HELD
)

# KEYS: lock.  ARGV: value, channel.  Returns 1 if released, 0 if not held under value.
PLAIN_RELEASE = (
    """
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
"""
    + _WAKE
    + """
  return 1
end
return 0
"""
)

# KEYS: lock.  ARGV: value, ttl ms.  Returns 1 if extended, 0 if not held under value.
PLAIN_EXTEND = """
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# The Redisson hash: field <owner> = 1, plus '~token' and '~fence' for the grant (owner
# ids never start with '~'). The server holds one grant per ownership period; nested
# levels are counted in the holder's process (locks.holds). A hash already held by this
# owner is a grant its process lost track of (a lost reply, a release not yet
# delivered): it is taken over as a new grant, with a new token and fence, so the old
# token's late release can no longer touch it.
# KEYS: lock, fence.  ARGV: token, ttl ms, fence ttl ms, owner, waits
HASH_ACQUIRE = (
    """
local waits = ARGV[5]
if redis.call('EXISTS', KEYS[1]) == 1 and not (redis.call('TYPE', KEYS[1]).ok == 'hash'
    and redis.call('HEXISTS', KEYS[1], ARGV[4]) == 1) then
"""
    + _HELD
    + """
end
"""
    + _NEXT_FENCE
    + """
redis.call('HSET', KEYS[1], ARGV[4], 1, '~token', ARGV[1], '~fence', string.format('%d', fence))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return fence
"""
)

# KEYS: lock.  ARGV: token, channel.  Returns 1 if released, 0 if not held under token.
HASH_RELEASE = (
    """
if redis.pcall('HGET', KEYS[1], '~token') == ARGV[1] then
  redis.call('DEL', KEYS[1])
"""
    + _WAKE
    + """
  return 1
end
return 0
"""
)

# KEYS: lock.  ARGV: token, ttl ms.  Returns 1 if extended, 0 if not held under token.
HASH_EXTEND = """
if redis.pcall('HGET', KEYS[1], '~token') == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# A quorum's fence floor: every later grant of this lock counts on from at least `floor`
# (a counter that is missing gets it, with the fence ttl; one that is higher keeps its
# value). Fences stay below 2^53, so Lua's numbers compare them exactly.
# KEYS: fence.  ARGV: floor, fence ttl ms.
RAISE_FENCE = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
return 1
"""

# Who holds a lock of either type, in one snapshot (for operators).
# KEYS: lock, fence.  Returns {type, pttl, fence or false, value or fields}, or {type}.
_READ_HOLDER = """
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'string' and kind ~= 'hash' then return {kind} end
local value
if kind == 'string' then value = redis.call('GET', KEYS[1])
else value = redis.call('HGETALL', KEYS[1]) end
local holder = {kind, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]), value}
"""
READ_HOLDER = _READ_HOLDER + "return holder\n"

# An operator breaking a stuck lock: the holder (as READ_HOLDER), whose grant is deleted
# and its waiters woken. The fence counter stays, so the next grant's fence is higher:
# the broken holder's renewal, release and fenced writes all fail from now on.
# KEYS: lock, fence.  ARGV: channel.
BREAK = (
    _READ_HOLDER
    + """
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[1], '1')
return holder
"""
)


class Script:
    """A Lua script called by SHA. A server that does not know it yet (first use, a
    restart, a failover, SCRIPT FLUSH, a cluster node new to this slot) answers NOSCRIPT;
    the call is then repeated as EVAL of the source, which caches it on whichever node
    ran it — one round trip, and no SCRIPT LOAD that a cluster would send to every
    primary, dead ones included."""

    __slots__ = ("sha", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(self, client: Any, keys: list[str], args: list[Any]) -> Any:
        try:
            return client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return client.execute_command("EVAL", self.source, len(keys), *keys, *args)

    def queue(self, pipe: Any, keys: list[str], args: list[Any], *, by_sha: bool) -> None:
        """Add this script's call to a pipeline (by SHA, or as EVAL after a NOSCRIPT)."""
        if by_sha:
            pipe.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
        else:
            pipe.execute_command("EVAL", self.source, len(keys), *keys, *args)


SCRIPTS = (PLAIN_ACQUIRE, PLAIN_RELEASE, PLAIN_EXTEND, HASH_ACQUIRE, HASH_RELEASE, HASH_EXTEND,
           RAISE_FENCE, READ_HOLDER, BREAK)  # fmt: skip
# what a provider sends itself: scripts by SHA (EVAL after NOSCRIPT), its ping, and the
# subscriber's wake-up channels
_DIRECT = ("evalsha", "eval", "ping", "subscribe", "unsubscribe")


def acl_rule(
    prefix: str = "locks",
    *,
    db: int = 0,
    sync_replicas: bool = False,
    aof: bool = False,
    cluster: bool = False,
) -> str:
    """The least an ACL user needs to run the Redis backends under `prefix`, for
    `ACL SETUSER <name> <rule> ><password>`: its keys and channels only, and only the
    commands sent and the ones the scripts run (Redis checks each `redis.call` against
    the caller's ACL). Read from the scripts themselves, so it cannot fall behind them.
    `db`: SELECT for a database other than 0; `sync_replicas`: WAIT (WAITAOF with
    `aof`); `cluster`: CLUSTER SLOTS and COMMAND, which redis-py's cluster client
    sends to learn the slots and where each command's keys are. Redis 7 needs the
    channel pattern: its default is no channel at all."""
    inside = {name.lower() for script in SCRIPTS
              for name in re.findall(r"redis\.p?call\('([A-Z]+)'", script)}  # fmt: skip
    commands = [*_DIRECT, *sorted(inside)]
    commands += ["select"] if db else []
    commands += (["waitaof"] if aof else ["wait"]) if sync_replicas else []
    commands += ["cluster|slots", "command"] if cluster else []
    allowed = " ".join(f"+{command}" for command in commands)
    return f"on ~{prefix}:* resetchannels &{prefix}:* -@all {allowed}"


def sentinel_acl_rule() -> str:
    """The least a sentinel user (`sentinel_username`) needs: redis-py finds the primary
    with SENTINEL MASTERS, nothing else."""
    return "on -@all +sentinel|masters"
