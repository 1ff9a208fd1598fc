-- reserve: take a hold for one admission.
-- ARGV[5] id, ARGV[6] slots, ARGV[7] tokens, ARGV[8] slot limit (-1 none),
-- ARGV[9] token limit (-1 none), ARGV[10] the generation the caller knew
-- ("" none), ARGV[11] relearn window µs, ARGV[12], ... ids this replica
-- released since its last script: they are released first, so the
-- capacity they free is seen.
-- Extra reply: { code, expiry }: 1 admitted, 2 duplicate (the id already
-- holds), 0 slots full, -1 tokens full, -2 released (tombstoned), -3
-- relearning.
local id, s, t = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local slotLimit, tokenLimit = tonumber(ARGV[8]), tonumber(ARGV[9])
local seen, relearn = ARGV[10], tonumber(ARGV[11])
release_ids(12)
local code, expiry = 1, 0
local cur = redis.call('ZSCORE', K_HOLDS, id)
if cur then
  code, expiry = 2, tonumber(cur)
elseif released(id) then
  code = -2
elseif seen ~= '' and seen ~= gen and now < born + relearn then
  code = -3
elseif slotLimit >= 0 and slots + s > slotLimit then
  code = 0
elseif tokenLimit >= 0 and tokens + t > tokenLimit then
  code = -1
else
  expiry = now + ttl
  redis.call('ZADD', K_HOLDS, expiry, id)
  redis.call('HSET', K_VALS, id, fmt(s, t, 0))
  add(s, t)
end
return finish({ code, expiry })
