-- bulkhead fleet pool: the part every script starts with.
--
-- KEYS[1] holds  ZSET  admission ID -> lease expiry (µs, server time)
-- KEYS[2] vals   HASH  admission ID -> "slots tokens seq"
-- KEYS[3] agg    HASH  slots, tokens (sums over vals); gen (the
--                      generation: its number is the end of its relearn
--                      window, µs); seq (the write sequence: every script
--                      that writes raises it by one at least, and to its
--                      own time, so it also tells when the last write was);
--                      srv (the run_id of the Redis server the state
--                      was last found on, "" when scripts may not call
--                      INFO: see here) and chk (when, µs)
-- KEYS[4] gone   ZSET  released admission ID -> tombstone expiry (µs)
-- ARGV[1] the time in µs, or "" to read Redis TIME (tests only set it)
-- ARGV[2] lease TTL µs, ARGV[3] tombstone µs, ARGV[4] reclaim batch
-- ARGV[5] the relearn window µs of a generation this script starts
-- ARGV[6] quiet µs: holds whose leases ran out while no script wrote for
--         this long start a new generation instead of being reclaimed
--         (0: off)
-- ARGV[7] the newest generation the caller has seen ("" none), ARGV[8] the
--         highest seq it has seen in it
--
-- Every reply starts { slots, tokens, gen, seq, now, reclaimed } and goes
-- on with what the operation adds. Times are integer microseconds,
-- exact in Lua doubles below 2^53.
local K_HOLDS, K_VALS, K_AGG, K_GONE = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local ttl, tomb, batch = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local relearn, quiet = tonumber(ARGV[5]), tonumber(ARGV[6])
local seenGen, seenSeq = tonumber(ARGV[7]), tonumber(ARGV[8]) or 0

-- SERVER_CHECK_GAP: a script that comes this many µs or more after the
-- last write and the last check of the server checks which server it runs
-- on (INFO, a few µs of server time: at most one script per gap pays it).
local SERVER_CHECK_GAP = 1000

local function num(x)
  return string.format('%.0f', x)
end

-- parse reads a vals entry; nil for anything this script did not write.
local function parse(v)
  if type(v) ~= 'string' then return nil end
  local s, t, q = string.match(v, '^(%d+) (%d+) (%d+)$')
  if not s then return nil end
  return tonumber(s), tonumber(t), tonumber(q)
end

local function fmt(s, t, q)
  return string.format('%.0f %.0f %.0f', s, t, q)
end

local agg = redis.call('HMGET', K_AGG, 'slots', 'tokens', 'gen', 'seq', 'srv', 'chk')
local slots, tokens = tonumber(agg[1]), tonumber(agg[2])
local gen, seq, srv = tonumber(agg[3]), tonumber(agg[4]), agg[5]
-- dirty: the script changed the state, so it raises seq.
local dirty = false

-- here returns the run_id of the server running the script, which is new
-- at every start of a Redis process (and another process's after a
-- failover), or nil when INFO is not allowed.
local function here()
  local info = redis.pcall('INFO', 'server')
  if type(info) ~= 'string' then return nil end
  return string.match(info, 'run_id:(%x+)')
end

-- start begins a new generation, whose number exceeds every one the caller
-- or the state knew, and records the server it begins on. Until it has
-- passed, which is at the end of the relearn window, no reserve is
-- admitted nor any hold reclaimed, while the holders of running calls
-- register them again.
local function start()
  gen = math.max(now + relearn, (gen or 0) + 1, (seenGen or 0) + 1)
  srv = here() or srv
  redis.call('HSET', K_AGG, 'gen', num(gen), 'srv', srv or '')
  dirty = true
end

if not (slots and tokens and gen) then
  -- The pool is new, or Redis lost its state: rebuild the sums from vals
  -- (usually empty) under a new generation.
  slots, tokens, seq = 0, 0, now
  local all = redis.call('HVALS', K_VALS)
  for i = 1, #all do
    local s, t = parse(all[i])
    if s then slots, tokens = slots + s, tokens + t end
  end
  gen = nil
  start()
elseif not seq then
  -- The state of an earlier version of these scripts: carry it on.
  seq, dirty = now, true
elseif seenGen and (seenGen > gen or (seenGen == gen and seenSeq > seq)) then
  -- The state is older than one the caller has seen: Redis came back from
  -- a snapshot, or a lagging replica took over.
  start()
else
  local last = math.max(seq, tonumber(agg[6]) or 0)
  if now < last or now - last >= SERVER_CHECK_GAP then
    -- Nothing for a while (or the clock is behind the last write): this
    -- may be another server than the one the state was last found on,
    -- which a restart or a failover takes far longer than the gap to
    -- bring in. Its state may be older than the one the replicas saw, even
    -- when this caller saw none of the writes it lost: relearn.
    local id = here()
    if id and srv and srv ~= '' and id ~= srv then
      start()
    else
      -- The same server; or one the state does not name yet (a state of
      -- an earlier version of these scripts), taken as this one; or
      -- INFO is not allowed ("": say so in the state, where the replicas
      -- see it).
      srv = id or srv or ''
      redis.call('HSET', K_AGG, 'srv', srv, 'chk', num(now))
    end
  end
end

-- Lazy reclaim of up to batch holds whose lease has run out (expiry <= now),
-- outside relearn windows. Leases that ran out while no script wrote for
-- quiet µs, after the window, are not trusted: Redis was unreachable (or
-- came back with an old state), so their holders could not renew them.
local reclaimed = 0
if now >= gen then
  local expired = redis.call('ZRANGEBYSCORE', K_HOLDS, '-inf', now, 'LIMIT', 0, batch)
  if #expired > 0 then
    if quiet > 0 and now - seq >= quiet
        and #redis.call('ZRANGEBYSCORE', K_HOLDS, '(' .. num(gen), now, 'LIMIT', 0, 1) > 0 then
      start()
    else
      local vs = redis.call('HMGET', K_VALS, unpack(expired))
      for i = 1, #expired do
        local s, t = parse(vs[i])
        if s then slots, tokens = slots - s, tokens - t end
      end
      redis.call('ZREM', K_HOLDS, unpack(expired))
      redis.call('HDEL', K_VALS, unpack(expired))
      reclaimed = #expired
      dirty = true
    end
  end
end

-- released reports whether id carries a live tombstone. (Expired ones are
-- dropped by release, the only script that adds them, and with the key's
-- own TTL.)
local function released(id)
  local expiry = redis.call('ZSCORE', K_GONE, id)
  return expiry and tonumber(expiry) > now
end

-- add changes the sums by a hold's (signed) slots and tokens.
local function add(s, t)
  slots, tokens = slots + s, tokens + t
  dirty = true
end

-- release_ids ends the holds of ARGV[first], ARGV[first + 1], ... and
-- tombstones every id, known or not, so that a late reserve of it is
-- refused. It returns how many held and how many were unknown.
local function release_ids(first)
  local freed, unknown = 0, 0
  if #ARGV < first then return freed, unknown end
  dirty = true
  redis.call('ZREMRANGEBYSCORE', K_GONE, '-inf', now)
  local expiry = now + tomb
  for i = first, #ARGV do
    local id = ARGV[i]
    local s, t = parse(redis.call('HGET', K_VALS, id))
    if s then
      add(-s, -t)
      freed = freed + 1
    else
      unknown = unknown + 1
    end
    redis.call('HDEL', K_VALS, id)
    redis.call('ZREM', K_HOLDS, id)
    redis.call('ZADD', K_GONE, expiry, id)
  end
  redis.call('PEXPIRE', K_GONE, math.ceil(tomb / 1000) + 1000)
  return freed, unknown
end

-- finish writes the sums and the next seq back when the state changed, and
-- returns the reply.
local function finish(extra)
  if dirty then
    -- (Redis writes these integers below 2^53 exactly: no exponent.)
    seq = math.max(seq + 1, now)
    redis.call('HSET', K_AGG, 'slots', slots, 'tokens', tokens, 'seq', seq)
  end
  local r = { slots, tokens, gen, seq, now, reclaimed }
  for i = 1, #extra do r[6 + i] = extra[i] end
  return r
end
