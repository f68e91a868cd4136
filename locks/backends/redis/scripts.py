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

Waking waiters (`locks.backends.redis.notify`): each provider listens on a channel of its
own. An acquire that finds the lock held and will wait (the last two ARGV: how many ms
it may still wait, -1 for ever, 0 not at all; and the caller's channel, '' for none)
adds its channel to the lock's `waiters` sorted set, scored by when it stops waiting:
the shorter of the holder's PTTL and its wait, plus a second (a later score is never
lowered), since by then it tries again by itself. A release (and an operator's break)
drops the scores that have passed and pops the two lowest, publishing the lock's key on
each channel: it wakes a bounded few processes, never the herd, and two, so that one
that died since it marked cannot take the only wake-up with it. A release finding no
set publishes nothing. A grant removes the caller's channel; a release by a process
with waiters of its own on the lock wakes that process first (through its channel, or
by telling it to wake them itself), and one other. A process woken with nobody left to
wake passes the wake-up on (`PASS_ON`).
The set (`<lock key>:waiters`) is not among a script's KEYS: it shares the lock's hash
tag, so it lives on the lock's node, and usually it does not exist — declared, it would
turn every call during a Cluster slot migration into TRYAGAIN (some keys moved, some
not).

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

# The server's clock in ms (Lua numbers are doubles: exact far beyond these values).
_NOW_MS = """
local clock = redis.call('TIME')
local now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"""

# What both acquire scripts return when the key is held by someone else: -1 - pttl. A key
# that vanished between two calls of a script cannot happen (a script sees one instant),
# but a negative PTTL must never turn into a positive reply, which would read as a fence.
# A caller that will wait (`waits` ms, -1 for ever) on channel `me` is counted in until
# after its next try of its own: it sleeps at most pttl (-1, no expiry: it polls) and at
# most its wait.
_MARK = (
    """
local wait = tonumber(waits)
if wait ~= 0 and me ~= '' then
  local mark, waiters = math.max(pttl, 0), KEYS[1] .. ':waiters'
  if wait > 0 and wait < mark then mark = wait end
  mark = mark + 1000
"""
    + _NOW_MS
    + """
  local score = redis.call('ZSCORE', waiters, me)
  if not score or tonumber(score) < now_ms + mark then
    redis.call('ZADD', waiters, now_ms + mark, me)
  end
  if redis.call('PTTL', waiters) < mark then
    redis.call('PEXPIRE', waiters, mark)
  end
end
"""
)
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

# A grant: the caller's process no longer waits through the set.
_GRANTED = """
if me ~= '' then redis.call('ZREM', KEYS[1] .. ':waiters', me) end
"""


def _wake(count: int) -> str:
    """Wakes up to `count` waiting processes of the lock KEYS[1] (see the module's
    docstring): publishes the lock's key on the channels with the lowest live scores."""
    return (
        """
local waiters = KEYS[1] .. ':waiters'
if redis.call('EXISTS', waiters) == 1 then
"""
        + _NOW_MS
        + f"""
  redis.call('ZREMRANGEBYSCORE', waiters, '-inf', now_ms)
  local woken = redis.call('ZPOPMIN', waiters, {count})
  for i = 1, #woken, 2 do
    redis.call('PUBLISH', woken[i], KEYS[1])
  end
end
"""
    )


_WAKE = _wake(2)

# A release: a releasing process with waiters of its own on the lock (ARGV[2], its
# channel; '' for none) is woken first, and one other process with it; else two others.
# Its own subscriber then runs its next waiter's attempt at once, and the process is
# never woken twice for one release. ARGV[3] = '1': the releasing thread sends that
# attempt itself the moment the reply is in (the fastest hand-off within a process), so
# nothing is published to it.
_RELEASE_WAKE = (
    """
  if ARGV[2] ~= '' then
    redis.call('ZREM', KEYS[1] .. ':waiters', ARGV[2])
    if ARGV[3] ~= '1' then redis.call('PUBLISH', ARGV[2], KEYS[1]) end
"""
    + _wake(1)
    + """
  else
"""
    + _WAKE
    + """
  end
"""
)

# KEYS: lock, fence.  ARGV: value (owner .. '/' .. token), ttl ms, fence ttl ms,
# waits (ms a failed try may wait: -1 for ever, 0 not at all), the caller's channel.
# Telling the holder's own second acquire apart lets a caller that would wait forever
# for itself be refused instead of deadlocked.
# `pcall`: a lock of the `redis-hash` type under the same name is a hash, which GET
# cannot read; it simply excludes us.
PLAIN_ACQUIRE = (
    """
local waits, me = ARGV[4], ARGV[5]
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
"""
    + _NEXT_FENCE
    + _GRANTED
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

# KEYS: lock.  ARGV: value, the releaser's channel if it wakes waiters of its own (''),
# '1' if it hands over to them itself (optional).  Returns 1 if released, 0 if not held
# under value.
PLAIN_RELEASE = (
    """
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
"""
    + _RELEASE_WAKE
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
# KEYS: lock, fence.  ARGV: token, ttl ms, fence ttl ms, owner, waits, the caller's channel
HASH_ACQUIRE = (
    """
local waits, me = ARGV[5], ARGV[6]
if redis.call('EXISTS', KEYS[1]) == 1 and not (redis.call('TYPE', KEYS[1]).ok == 'hash'
    and redis.call('HEXISTS', KEYS[1], ARGV[4]) == 1) then
"""
    + _HELD
    + """
end
"""
    + _NEXT_FENCE
    + _GRANTED
    + """
redis.call('HSET', KEYS[1], ARGV[4], 1, '~token', ARGV[1], '~fence', string.format('%d', fence))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return fence
"""
)

# KEYS: lock.  ARGV: token, the releaser's channel if it wakes waiters of its own (''),
# '1' if it hands over to them itself (optional).  Returns 1 if released, 0 if not held
# under token.
HASH_RELEASE = (
    """
if redis.pcall('HGET', KEYS[1], '~token') == ARGV[1] then
  redis.call('DEL', KEYS[1])
"""
    + _RELEASE_WAKE
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
# KEYS: lock, fence.
BREAK = (
    _READ_HOLDER
    + """
redis.call('DEL', KEYS[1])
"""
    + _WAKE
    + """
return holder
"""
)

# A process woken with no waiter left to use it: the next process is woken instead, if
# the lock is still free (else its holder's release wakes it).  KEYS: lock.
PASS_ON = (
    """
if redis.call('EXISTS', KEYS[1]) == 0 then
"""
    + _wake(1)
    + """
end
return 1
"""
)


class Script:
    """A Lua script called by SHA. A server that does not know it yet (first use, a
    restart, a failover, SCRIPT FLUSH, a cluster node new to this slot) answers NOSCRIPT;
    the call is then repeated as EVAL of the source, which caches it on whichever node
    ran it — one round trip, and no SCRIPT LOAD that a cluster would send to every
    primary, dead ones included."""

    __slots__ = ("_heads", "sha", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()
        self._heads: dict[tuple[int, int], bytes] = {}  # by (keys, keys + args)

    def pack(self, keys: list[str], args: list[Any], encoding: str, errors: str) -> bytes:
        """`EVALSHA sha numkeys keys... args...` in RESP, as redis-py's packer writes it
        (strings in the connection's encoding, ints in decimal) at a quarter of its cost:
        this runs on every acquire and release."""
        parts = [*keys, *args]
        shape = (len(keys), len(parts))
        head = self._heads.get(shape)
        if head is None:
            sha = self.sha.encode()
            numkeys = str(len(keys)).encode()
            head = b"*%d\r\n$7\r\nEVALSHA\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (
                len(parts) + 3, len(sha), sha, len(numkeys), numkeys)  # fmt: skip
            self._heads[shape] = head
        out = [head]
        for part in parts:
            if isinstance(part, str):
                data = part.encode(encoding, errors)
            elif isinstance(part, int) and not isinstance(part, bool):
                data = b"%d" % part
            else:  # nothing of ours sends another type: refuse rather than guess
                raise TypeError(f"a script argument must be str or int, not {part!r}")
            out.append(b"$%d\r\n%s\r\n" % (len(data), data))
        return b"".join(out)

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
           RAISE_FENCE, READ_HOLDER, BREAK, PASS_ON)  # fmt: skip
# what a provider sends itself: scripts by SHA (EVAL after NOSCRIPT), its ping, the
# subscriber's wake-up channel, and each new connection's INFO (the server's run_id,
# which tells a restart or a failover: `runs`)
_DIRECT = ("evalsha", "eval", "ping", "subscribe", "unsubscribe", "info")


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
    `aof`); `cluster`: CLUSTER SLOTS and COMMAND, which the cluster clients send to
    learn the slots and where each command's keys are, and ASKING, which follows a
    slot being migrated. Redis 7 needs the channel pattern: its default is no channel
    at all."""
    inside = {name.lower() for script in SCRIPTS
              for name in re.findall(r"redis\.p?call\('([A-Z]+)'", script)}  # fmt: skip
    commands = [*_DIRECT, *sorted(inside)]
    commands += ["select"] if db else []
    commands += (["waitaof"] if aof else ["wait"]) if sync_replicas else []
    commands += ["asking", "cluster|slots", "command"] if cluster else []
    allowed = " ".join(f"+{command}" for command in commands)
    return f"on ~{prefix}:* resetchannels &{prefix}:* -@all {allowed}"


def sentinel_acl_rule() -> str:
    """The least a sentinel user (`sentinel_username`) needs: redis-py finds the primary
    with SENTINEL MASTERS, nothing else."""
    return "on -@all +sentinel|masters"
