-- bulkhead fleet pool: the part every script starts with.
--
-- KEYS[1] holds  ZSET  admission ID -> lease expiry (µs, server time)
-- KEYS[2] vals   HASH  admission ID -> "slots tokens seq"
-- KEYS[3] agg    HASH  slots, tokens (sums over vals), gen, born
-- KEYS[4] gone   ZSET  released admission ID -> tombstone expiry (µs)
-- ARGV[1] the time in µs, or "" to read Redis TIME (tests only set it)
-- ARGV[2] lease TTL µs, ARGV[3] tombstone µs, ARGV[4] reclaim batch
--
-- Every reply starts { slots, tokens, gen, born, now, reclaimed } and goes on
-- with what the operation adds. Times are integer microseconds, exact in Lua
-- doubles below 2^53.
local K_HOLDS, K_VALS, K_AGG, K_GONE = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local ttl, tomb, batch = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])

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

-- Load the aggregate, or rebuild it from vals under a new generation when
-- it is missing: the pool is new, or Redis lost its state.
local agg = redis.call('HMGET', K_AGG, 'slots', 'tokens', 'gen', 'born')
local slots, tokens, gen, born = tonumber(agg[1]), tonumber(agg[2]), agg[3], tonumber(agg[4])
local dirty = false
if not (slots and tokens and born) or type(gen) ~= 'string' then
  slots, tokens = 0, 0
  local all = redis.call('HVALS', K_VALS)
  for i = 1, #all do
    local s, t = parse(all[i])
    if s then slots, tokens = slots + s, tokens + t end
  end
  gen = string.format('%.0f', now)
  born = now
  redis.call('HSET', K_AGG, 'gen', gen, 'born', gen)
  dirty = true
end

-- Lazy reclaim of up to batch holds whose lease has run out (expiry <= now).
local reclaimed = 0
local expired = redis.call('ZRANGEBYSCORE', K_HOLDS, '-inf', now, 'LIMIT', 0, batch)
if #expired > 0 then
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

-- released reports whether id carries a live tombstone. (Expired ones are
-- dropped by release, the only script that adds them, and with the key's
-- own TTL.)
local function released(id)
  local until_ = redis.call('ZSCORE', K_GONE, id)
  return until_ and tonumber(until_) > now
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
  redis.call('ZREMRANGEBYSCORE', K_GONE, '-inf', now)
  local until_ = now + tomb
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
    redis.call('ZADD', K_GONE, until_, id)
  end
  redis.call('PEXPIRE', K_GONE, math.ceil(tomb / 1000) + 1000)
  return freed, unknown
end

-- finish writes the sums back when they changed and returns the reply.
local function finish(extra)
  if dirty then
    redis.call('HSET', K_AGG, 'slots', slots, 'tokens', tokens)
  end
  local r = { slots, tokens, gen, born, now, reclaimed }
  for i = 1, #extra do r[6 + i] = extra[i] end
  return r
end
