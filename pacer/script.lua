-- bulkhead pacer: one decision over one or more pacer keys.
--
-- This is a transcription of step() in core.go; the two must compute the
-- same doubles and integers (equiv_test.go checks it). Times are integer
-- microseconds since the Unix epoch, exact in Lua's doubles below 2^53.
--
-- KEYS[i]  the state of pacer i: a string of four little-endian doubles,
--          level, last, next and exp (the times in µs)
-- ARGV[1]  the decision time in µs, or "" to read Redis TIME
-- ARGV[2 + 6(i-1)] .. ARGV[7 + 6(i-1)]
--          weight, qps, maxBurst, factor, maxWaitUs, capUs of pacer i
--          (capUs > 0: a queued call's slot reaches at most capUs from now;
--          a negative weight, with capUs > 0, gives weight back: Settle)
--
-- Every key is decided at the same instant; the call is recorded on every
-- key or on none: only when each delay is at most its maxWaitUs.
-- Reply: { 1 if recorded else 0, delayUs_1, levelBefore_1, delayUs_2, ... }
-- with the delays as integers and the levels as little-endian doubles, so
-- that Redis neither truncates nor reformats them.
local GRACE, HORIZON = @GRACE_US@, @HORIZON_US@

-- readable returns the value that GET replied if it can be a state, and nil
-- for no value, a value of another type (GET's WRONGTYPE error) or a string
-- of the wrong length: unreadable state counts as absent, and the decision's
-- SET replaces it (with a TTL).
local function readable(v)
  if type(v) ~= 'string' or #v ~= 32 then return nil end
  return v
end

-- integral reports whether x is a whole number of magnitude below 2^53,
-- where doubles are exact.
local function integral(x)
  return x > -9007199254740992 and x < 9007199254740992 and math.floor(x) == x
end

-- plausible reports whether a decoded state could have been written by this
-- script: a finite level >= 0, whole times in order (last <= next, and the
-- expiry after next by at least the grace period and at most two horizons'
-- queue and a horizon's drain after last), and a last drip no later than a horizon
-- after now. Anything else was not written by a decision (a crafted or
-- corrupted value) and counts as absent.
local function plausible(level, last, nxt, exp, now)
  return level == level and level >= 0 and level < math.huge
    and integral(last) and integral(nxt) and integral(exp)
    and last <= nxt and nxt + GRACE <= exp and exp - last <= 3 * HORIZON + GRACE
    and last <= now + HORIZON
end

local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local reply = { 1 }
local st = {}
local commit = true
local most = 0
for i = 1, #KEYS do
  local a = 6 * (i - 1)
  local weight = tonumber(ARGV[a + 2])
  local qps = tonumber(ARGV[a + 3])
  local burst = tonumber(ARGV[a + 4])
  local factor = tonumber(ARGV[a + 5])
  local maxWait = tonumber(ARGV[a + 6])
  local cap = tonumber(ARGV[a + 7])

  local t = now
  local level, last, nxt, exp = 0, t, 0, 0
  local v = readable(redis.pcall('GET', KEYS[i]))
  if v then
    level, last, nxt, exp = struct.unpack('<dddd', v)
    if t >= exp or not plausible(level, last, nxt, exp, t) then
      level, last, nxt = 0, t, 0
    end
  end
  local idle = last
  if nxt > idle then idle = nxt end
  local behind = 0
  if t < last then
    behind = last - t
    t = last
  end
  if nxt < t then nxt = t end
  if nxt <= t then
    level = level - (t - idle) / 1000000 * qps * factor
    if level < 0 then level = 0 end
  end
  local before = level
  level = level + weight
  if level < 0 then level = 0 end
  local delay = 0
  local iv = math.ceil(weight * 1000000 / qps)
  if level > burst or (weight > 0 and nxt > t) then
    delay = nxt - t
    local b = iv
    if cap > 0 then
      local room = t + cap - nxt
      if room < 0 then room = 0 end
      if room < b then b = room end
    end
    nxt = nxt + b
    if level > burst then level = burst else level = before end
  end
  if delay > maxWait then
    commit = false
    if maxWait <= 0 then delay = delay + behind end
  end
  if delay > most then most = delay end
  local drain = 0
  if burst > 0 then
    drain = math.ceil(burst / (qps * factor) * 1000000)
    if drain > HORIZON then drain = HORIZON end
  end
  st[i] = { level = level, t = t, nxt = nxt, delay = delay, burst = burst, iv = iv, drain = drain, cap = cap }
  reply[2 * i] = delay
  reply[2 * i + 1] = struct.pack('<d', before)
end

if commit then
  for i = 1, #KEYS do
    local s = st[i]
    -- A member that would have let the call go sooner than the largest
    -- delay books its slot at the time the call goes, as a queued call
    -- (together() in core.go); Book leaves its bookings as they are.
    if s.delay < most and s.cap <= 0 then
      s.level = s.burst
      s.nxt = s.t + most + s.iv
    end
    local exp = s.nxt + s.drain + GRACE
    -- Redis drops the key a second after its logical expiry (on the
    -- server's clock), when the state has stopped mattering anyway.
    redis.call('SET', KEYS[i], struct.pack('<dddd', s.level, s.t, s.nxt, exp),
      'PX', math.floor((exp - now + 999) / 1000) + 1000)
  end
else
  reply[1] = 0
end
return reply
