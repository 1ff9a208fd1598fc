-- renew: extend the leases of live holds.
-- ARGV[9] "1" to reinstate holds Redis no longer has, ARGV[10..] groups of
-- four: id, slots, tokens, seq (the holder's current values).
-- Extra reply: one code per group: 1 renewed (and updated when seq is
-- newer), 2 reinstated (added back, even above the limits: the call is still
-- running), -2 released (tombstoned: never resurrected), 0 lost.
local reinstate = ARGV[9] == '1'
local codes = {}
for i = 10, #ARGV - 3, 4 do
  local id = ARGV[i]
  local s, t, q = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  local code = 0
  if redis.call('ZSCORE', K_HOLDS, id) then
    redis.call('ZADD', K_HOLDS, 'XX', now + ttl, id)
    dirty = true
    local os, ot, oq = parse(redis.call('HGET', K_VALS, id))
    if os and q > oq then
      add(s - os, t - ot)
      redis.call('HSET', K_VALS, id, fmt(s, t, q))
    end
    code = 1
  elseif released(id) then
    code = -2
  elseif reinstate then
    redis.call('ZADD', K_HOLDS, now + ttl, id)
    redis.call('HSET', K_VALS, id, fmt(s, t, q))
    add(s, t)
    code = 2
  end
  codes[#codes + 1] = code
end
return finish(codes)
