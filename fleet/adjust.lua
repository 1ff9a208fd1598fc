-- adjust: set live holds to absolute values, ordered by usage sequence.
-- ARGV[9..] groups of four: id, slots, tokens, seq.
-- Extra reply: one code per group: 1 applied, 2 stale (seq not newer), 0
-- lost (no such hold). An applied report also renews the lease.
local codes = {}
for i = 9, #ARGV - 3, 4 do
  local id = ARGV[i]
  local s, t, q = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  local os, ot, oq = parse(redis.call('HGET', K_VALS, id))
  local code = 0
  if os then
    if q <= oq then
      code = 2
    else
      add(s - os, t - ot)
      redis.call('HSET', K_VALS, id, fmt(s, t, q))
      redis.call('ZADD', K_HOLDS, 'XX', now + ttl, id)
      code = 1
    end
  end
  codes[#codes + 1] = code
end
return finish(codes)
