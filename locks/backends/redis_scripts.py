"""Lua scripts of the Redis backends, loaded once per client and called by SHA.

Every script touches only keys of one lock, which share a hash tag, so all of them
run on Redis Cluster. The release channel is passed in ARGV: channels are not keys.

Both acquire scripts answer in one shape, as cheap to parse as possible on the hot
path (a bare integer):
  fence > 0                a fresh grant (depth 1, under the token passed in)
  -1 - pttl  (<= 0)        held by another owner for pttl more ms (-1: no expiry)
  {fence, depth, token}    a reentrant grant inside the owner's current period
  {pttl}                   held by this very owner on a non-reentrant backend

Fence rule (shared by both acquire scripts): each lock has a counter key. A grant
increments it; when the increment finds no counter (first use, or the counter
expired), the counter is seeded from the server clock in microseconds, with a
`fence_ttl` expiry. So Redis memory does not grow with the number of names ever
used, and fences still strictly increase: a counter only gains 1 per grant, a grant
takes more than a microsecond of server time, so no fence ever runs ahead of the
clock, and a re-seeded counter starts above every fence handed out before.
"""

# Computes the next fence into `fence`. KEYS[2] = fence key, ARGV[3] = fence ttl (ms).
_NEXT_FENCE = """
local fence = redis.call('INCR', KEYS[2])
if fence == 1 then
  local now = redis.call('TIME')
  fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
  redis.call('SET', KEYS[2], string.format('%d', fence), 'PX', ARGV[3])
end
"""

# KEYS: lock, fence.  ARGV: value (owner .. '/' .. token), ttl ms, fence ttl ms
# Telling the holder's own second acquire apart lets a caller that would wait forever
# for itself be refused instead of deadlocked.
PLAIN_ACQUIRE = (
    """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
"""
    + _NEXT_FENCE
    + """
  return fence
end
local holder = redis.call('GET', KEYS[1])
local pttl = redis.call('PTTL', KEYS[1])
local owner = string.match(ARGV[1], '^[^/]*/')
if holder and string.sub(holder, 1, string.len(owner)) == owner then return {pttl} end
return -1 - pttl
"""
)

# KEYS: lock.  ARGV: value, channel.  Returns 1 if released, 0 if not held under value.
PLAIN_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '1')
  return 1
end
return 0
"""

# KEYS: lock.  ARGV: value, ttl ms.  Returns 1 if extended, 0 if not held under value.
PLAIN_EXTEND = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# The Redisson hash: field <owner> = depth, plus '~token' and '~fence' for the ownership
# period (owner ids never start with '~'), so a stale lease of an earlier period of the
# same owner cannot release or renew the current one.
# KEYS: lock, fence.  ARGV: token, ttl ms, fence ttl ms, owner
HASH_ACQUIRE = (
    """
if redis.call('EXISTS', KEYS[1]) == 0 then
"""
    + _NEXT_FENCE
    + """
  redis.call('HSET', KEYS[1], ARGV[4], 1, '~token', ARGV[1], '~fence', string.format('%d', fence))
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return fence
end
if redis.call('HEXISTS', KEYS[1], ARGV[4]) == 1 then
  local depth = redis.call('HINCRBY', KEYS[1], ARGV[4], 1)
  -- a nested grant may lengthen the lease, never shorten the outer one's
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  local period = redis.call('HMGET', KEYS[1], '~fence', '~token')
  return {tonumber(period[1]), depth, period[2]}
end
return -1 - redis.call('PTTL', KEYS[1])
"""
)

# KEYS: lock.  ARGV: owner, token, channel.
# Returns -1 if not held by this period, else the depth left (0: deleted and published).
HASH_RELEASE = """
if redis.call('HGET', KEYS[1], '~token') ~= ARGV[2]
   or redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  return -1
end
local depth = redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
if depth > 0 then return depth end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[3], '1')
return 0
"""

# KEYS: lock.  ARGV: owner, token, ttl ms.  Returns 1 if extended, 0 if not held.
HASH_EXTEND = """
if redis.call('HGET', KEYS[1], '~token') == ARGV[2]
   and redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  return redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return 0
"""
