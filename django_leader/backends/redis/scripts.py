"""The Lua scripts of the Redis backend: each lease operation is one of them, so each
check-and-write is atomic on the server, and every time in it comes from the server
(``TIME``, ``PEXPIRE``). See :mod:`django_leader.backends.redis` for the keys they use.
"""

# Shared Lua: server time in microseconds, as a number (exact: < 2^53) and as a string.
NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function str(n) return string.format('%.0f', n) end
"""

# Has the store lost state since it was last used (see "When the store forgets" in
# docs/safety.md)? Sets ``lost`` (true when
# this call noticed a loss), ``epoch`` (changes with every loss noticed) and ``fence`` (no
# lease may be taken before it, server microseconds). KEYS[3]: the store marker, a hash
# without expiry: run_id (the server process it was written by), epoch, fence.
# ARGV[4]: the lock-delay in milliseconds.
STORE = r"""
local info = redis.call('INFO', 'server')
local run_id = string.match(info, 'run_id:(%w+)')
local delay = tonumber(ARGV[4]) * 1000
local store = redis.call('HMGET', KEYS[3], 'run_id', 'epoch', 'fence')
local epoch = store[2]
local fence = tonumber(store[3]) or 0
local lost = false
local missing = not store[1]
if missing then
  -- The marker is gone: FLUSHDB/FLUSHALL, a restart without persistence, a deletion by
  -- hand, a failover to a replica that never had it, or a store (on a cluster: a slot)
  -- never used before. Without a flush since the server started, and on a server never
  -- promoted from replica (no previous replication id), what was lost was lost when it
  -- started; else at an unknown time, so count from now.
  local stats = redis.call('INFO', 'commandstats')
  local flushes = tonumber(string.match(stats, 'cmdstat_flushdb:calls=(%d+)') or '0')
                  + tonumber(string.match(stats, 'cmdstat_flushall:calls=(%d+)') or '0')
  local replid2 = string.match(redis.call('INFO', 'replication'), 'master_replid2:(%w+)')
  if replid2 and not string.match(replid2, '^0+$') then flushes = flushes + 1 end
  local since = now
  if flushes == 0 then
    since = now - tonumber(string.match(info, 'uptime_in_seconds:(%d+)')) * 1000000
  end
  epoch = str(now)
  fence = math.max(fence, since + delay)
  lost = true
elseif store[1] ~= run_id then
  -- Another server process: restarted (from a snapshot or an AOF that may be older than
  -- the last writes) or failed over to a replica that may have missed them.
  epoch = str(now)
  fence = math.max(fence, now + delay)
  lost = true
elseif fence > now then
  -- A lock-delay is running: a caller with a longer ttl (hence longer-lived peers) makes
  -- it longer, counted from when it began.
  local began = tonumber(epoch) or now
  if began + delay > fence then
    fence = began + delay
    redis.call('HSET', KEYS[3], 'fence', str(fence))
  end
end
if lost then
  redis.call('HSET', KEYS[3], 'run_id', run_id, 'epoch', epoch, 'fence', str(fence))
end
"""

# KEYS[1]: a store marker. Writes it, with no lock-delay, if it is missing (``initialize``:
# a store never used before). Returns 1 if it wrote it, 0 if it was there.
INITIALIZE = (
    NOW
    + r"""
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')
redis.call('HSET', KEYS[1], 'run_id', run_id, 'epoch', str(now), 'fence', '0')
return 1
"""
)

# KEYS: lease, meta, store, terms. ARGV: holder, ttl_ms, name, lock_delay_ms. Returns {acquired
# (0/1), holder, token, acquired_at, renewed_at, expires_at, transitions, previous_holder,
# previous_released, lock-delay left in microseconds (0 if none), 1 if this call noticed a
# loss that starts a lock-delay (2: the marker was missing)}.
ACQUIRE = (
    NOW
    + STORE
    + """
local lost_flag = '0'
if lost and fence > now then lost_flag = missing and '2' or '1' end
local current = redis.call('HMGET', KEYS[1], 'holder', 'token', 'acquired_at', 'renewed_at',
                           'expires_at')
if current[1] then
  local transitions = redis.call('HGET', KEYS[2], 'transitions') or '0'
  return {0, current[1], current[2], current[3], current[4], current[5], transitions, '', '0',
          '0', lost_flag, str(now)}
end
local meta = redis.call('HMGET', KEYS[2], 'holder', 'token', 'released', 'expires', 'epoch',
                        'acquired_at', 'renewed_at', 'transitions')
if meta[3] == '0' and tonumber(meta[4] or '0') > now then
  -- The lease key is gone (deleted by hand, evicted) but its term is not over.
  return {0, meta[1], meta[2], meta[6] or '0', meta[7] or '0', meta[4], meta[8] or '0', '',
          '0', '0', lost_flag}
end
if not meta[2] then
  -- No counter for this name: new, or its keys were deleted by hand. The store-wide
  -- registry of terms tells: nobody may take it before the last term it knows ends.
  local term = tonumber(redis.call('HGET', KEYS[4], ARGV[3]) or '0')
  if term > fence then fence = term end
end
if now < fence then
  return {0, '', '0', '0', '0', '0', meta[8] or '0', '', '0', str(fence - now), lost_flag}
end
-- A standing hand-over request (leader handover) lets in only the candidate it names.
local handover = redis.call('HMGET', KEYS[2], 'handover_to', 'handover_until')
if handover[1] and handover[1] ~= '' and tonumber(handover[2] or '0') > now
   and handover[1] ~= ARGV[1] then
  return {0, '', '0', '0', '0', '0', meta[8] or '0', '', '0', '0', lost_flag}
end
local token = tonumber(meta[2])
if not token or meta[5] ~= epoch then
  -- First use, or the counter may be older than tokens already issued (lost, restored
  -- from an older snapshot): continue from the server clock in microseconds, which is
  -- beyond every token issued before (see the module docstring).
  token = math.max(token or 0, now)
end
token = token + 1
local transitions = redis.call('HINCRBY', KEYS[2], 'transitions', 1)
local previous = meta[1] or ''
local released = meta[3] or '1'
local expires = now + tonumber(ARGV[2]) * 1000
redis.call('HSET', KEYS[2], 'token', str(token), 'holder', ARGV[1], 'released', '0',
           'name', ARGV[3], 'epoch', epoch, 'acquired_at', str(now), 'renewed_at', str(now),
           'expires', str(expires))
redis.call('HDEL', KEYS[2], 'handover_to', 'handover_until')
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'token', str(token), 'acquired_at', str(now),
           'renewed_at', str(now), 'expires_at', str(expires))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[4], ARGV[3], str(expires))
return {1, ARGV[1], str(token), str(now), str(now), str(expires), transitions, previous,
        released, '0', lost_flag}
"""
)

# KEYS: lease, meta, terms. ARGV: holder, token, ttl_ms, name. Same reply as acquire
# (acquired = renewed), then the candidate a standing hand-over request names ('' if none).
# The meta hash keeps the expiry too, so that a lease key deleted by hand or evicted still
# keeps others out until the term ends.
RENEW = (
    NOW
    + """
local current = redis.call('HMGET', KEYS[1], 'holder', 'token', 'acquired_at')
if current[1] ~= ARGV[1] or current[2] ~= ARGV[2] then return {0} end
local expires = now + tonumber(ARGV[3]) * 1000
redis.call('HSET', KEYS[1], 'renewed_at', str(now), 'expires_at', str(expires))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('HSET', KEYS[2], 'renewed_at', str(now), 'expires', str(expires))
redis.call('HSET', KEYS[3], ARGV[4], str(expires))
local transitions = redis.call('HGET', KEYS[2], 'transitions') or '0'
local handover = redis.call('HMGET', KEYS[2], 'handover_to', 'handover_until')
local to = ''
if handover[1] and tonumber(handover[2] or '0') > now then to = handover[1] end
return {1, ARGV[1], current[2], current[3], str(now), str(expires), transitions, '', '0', to}
"""
)

# RENEW for many leases at once (RedisBackend.renew_many), each renewed or refused on its
# own exactly as by RENEW, all by one reading of the server's clock. KEYS: lease, meta of
# each lease, then terms. ARGV: ttl_ms, then holder, token, name of each lease. Returns
# {now, expires, records, hand-overs}, not a table per lease (a client parses one string
# faster than 10,000 tables): records holds one line per lease, in order, "" if refused,
# else "acquired_at<TAB>transitions<TAB>1 if a hand-over request stands (else 0)"; the
# hand-over requests that stand are in hand-overs, in order (a candidate's identity is
# never parsed out of a string).
RENEW_MANY = (
    NOW
    + """
local expires = now + tonumber(ARGV[1]) * 1000
local now_s, expires_s = str(now), str(expires)
local records, handovers, terms = {}, {}, {}
for i = 1, (#KEYS - 1) / 2 do
  local lease, meta = KEYS[2 * i - 1], KEYS[2 * i]
  local holder, token, name = ARGV[3 * i - 1], ARGV[3 * i], ARGV[3 * i + 1]
  local current = redis.call('HMGET', lease, 'holder', 'token', 'acquired_at')
  if current[1] ~= holder or current[2] ~= token then
    records[i] = ''
  else
    redis.call('HSET', lease, 'renewed_at', now_s, 'expires_at', expires_s)
    redis.call('PEXPIRE', lease, ARGV[1])
    redis.call('HSET', meta, 'renewed_at', now_s, 'expires', expires_s)
    terms[#terms + 1] = name
    terms[#terms + 1] = expires_s
    local m = redis.call('HMGET', meta, 'transitions', 'handover_to', 'handover_until')
    local standing = '0'
    if m[2] and tonumber(m[3] or '0') > now then
      standing = '1'
      handovers[#handovers + 1] = m[2]
    end
    records[i] = current[3] .. '\\t' .. (m[1] or '0') .. '\\t' .. standing
  end
end
-- The registry of terms in a few commands (unpack takes a bounded number of values).
for j = 1, #terms, 1000 do
  redis.call('HSET', KEYS[#KEYS], unpack(terms, j, math.min(j + 999, #terms)))
end
return {now_s, expires_s, table.concat(records, '\\n'), handovers}
"""
)

# KEYS: lease, meta, terms. ARGV: holder, token, name, the name's wake-up channel (every
# candidate racing for it and every observer: see RedisBackend.watch). Returns the server
# time if released, else 0.
RELEASE = (
    NOW
    + """
local current = redis.call('HMGET', KEYS[1], 'holder', 'token')
if current[1] ~= ARGV[1] or current[2] ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[2], 'released', '1', 'expires', str(now))
redis.call('HSET', KEYS[3], ARGV[3], str(now))
redis.call('PUBLISH', ARGV[4], '')
return str(now)
"""
)

# The held lease in KEYS[1] as `current` (return {0} if it has no holder), and the reply
# that gives it back like acquire's, with the server time.
CURRENT = """
local current = redis.call('HMGET', KEYS[1], 'holder', 'token', 'acquired_at', 'renewed_at',
                           'expires_at')
if not current[1] or current[1] == '' then return {0} end
"""
REPLY_CURRENT = """
local transitions = redis.call('HGET', KEYS[2], 'transitions') or '0'
return {1, current[1], current[2], current[3], current[4], current[5], transitions, '', '0',
        str(now)}
"""

# KEYS: lease, meta. Returns the released lease like acquire's reply, or {0}. The term is
# not cut short (the key keeps its expiry, with no holder): the holder hears of it at its
# next renewal, and nobody may take the lease before the term ends.
FORCE_RELEASE = (
    NOW
    + CURRENT
    + """
redis.call('HSET', KEYS[1], 'holder', '')
redis.call('HSET', KEYS[2], 'released', '1')
"""
    + REPLY_CURRENT
)

# KEYS: lease, meta. Returns the current lease like acquire's reply plus the server time
# ({0} if free).
READ = NOW + CURRENT + REPLY_CURRENT


# KEYS: lease, meta. ARGV: the candidate to hand over to, the window in milliseconds.
# Sets the hand-over gate (nobody else may acquire until it ends; the holder reads it in its
# renewals) and returns the current lease like READ ({0, server time} if free).
HANDOVER = (
    NOW
    + """
redis.call('HSET', KEYS[2], 'handover_to', ARGV[1],
           'handover_until', str(now + tonumber(ARGV[2]) * 1000))
local current = redis.call('HMGET', KEYS[1], 'holder', 'token', 'acquired_at', 'renewed_at',
                           'expires_at')
if not current[1] or current[1] == '' then return {0, str(now)} end
"""
    + REPLY_CURRENT
)


# The candidate registry. KEYS: candidates (a sorted set: identity -> expiry in server
# microseconds), info (a hash: identity -> JSON of priority, host, pid, version, seq,
# joined, seen, expires), seq (a counter of joins, the queue order), order (a sorted set:
# identity -> seq, the queue in join order, so that its head is read without the rest).
# Expired candidates are dropped on the way.
DROP_EXPIRED = """
for _, who in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', str(now))) do
  redis.call('HDEL', KEYS[2], who)
  redis.call('ZREM', KEYS[4], who)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', str(now))
"""

# ARGV: identity, ttl_ms ('' to withdraw), the candidate's JSON (priority, host, pid,
# version). A candidate not in the set joins at the tail (a new seq).
ANNOUNCE = (
    NOW
    + DROP_EXPIRED
    + """
if ARGV[2] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[1])
  return 0
end
local info = cjson.decode(ARGV[3])
local known = redis.call('HGET', KEYS[2], ARGV[1])
if known and redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  local before = cjson.decode(known)
  info.seq = before.seq
  info.joined = before.joined
else
  info.seq = redis.call('INCR', KEYS[3])
  info.joined = str(now)
end
local expires = now + tonumber(ARGV[2]) * 1000
info.seen = str(now)
info.expires = str(expires)
redis.call('HSET', KEYS[2], ARGV[1], cjson.encode(info))
redis.call('ZADD', KEYS[1], str(expires), ARGV[1])
redis.call('ZADD', KEYS[4], info.seq, ARGV[1])
for _, key in ipairs({KEYS[1], KEYS[2], KEYS[4]}) do
  if redis.call('PTTL', key) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', key, ARGV[2])
  end
end
return 1
"""
)

# KEYS: candidates, info. Returns identity, JSON, identity, JSON, ... of the live ones.
CANDIDATES = (
    NOW
    + """
local found = {}
for _, who in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. str(now), '+inf')) do
  local info = redis.call('HGET', KEYS[2], who)
  if info then
    table.insert(found, who)
    table.insert(found, info)
  end
end
return found
"""
)

# KEYS: candidates, info, seq, order. ARGV: the holder ('' for none). The first live
# candidate in join order but the holder: identity, JSON; or nothing. Reads the head of the
# order and drops the entries it finds gone (expired, withdrawn by an older version), so
# that its cost does not grow with the queue.
NEXT_IN_LINE = (
    NOW
    + """
local start = 0
while true do
  local batch = redis.call('ZRANGE', KEYS[4], start, start + 7)
  if #batch == 0 then return {} end
  for _, who in ipairs(batch) do
    if who ~= ARGV[1] then
      local expires = redis.call('ZSCORE', KEYS[1], who)
      if expires and tonumber(expires) > now then
        local info = redis.call('HGET', KEYS[2], who)
        if info then return {who, info} end
      else
        redis.call('ZREM', KEYS[4], who)
        start = start - 1
      end
    end
  end
  start = start + 8
end
"""
)

# Retention (RedisBackend.prune). KEYS: lease, meta, candidates, cinfo, cseq, beat, terms,
# corder.
# ARGV: the cutoff (server microseconds), name. Forgets a name nobody holds, whose last term
# and hand-over gate ended before the cutoff and with no candidacy since: 1 if forgotten.
# Its tokens cannot go backwards: taken again, it continues from the server clock, beyond
# every token it had (see ACQUIRE).
PRUNE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local meta = redis.call('HMGET', KEYS[2], 'expires', 'handover_until')
local cutoff = tonumber(ARGV[1])
if not meta[1] or tonumber(meta[1]) >= cutoff then return 0 end
if tonumber(meta[2] or '0') >= cutoff then return 0 end
if redis.call('ZCOUNT', KEYS[3], ARGV[1], '+inf') > 0 then return 0 end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[8])
redis.call('HDEL', KEYS[7], ARGV[2])
return 1
"""
