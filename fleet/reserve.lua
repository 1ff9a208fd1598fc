-- reserve: take a hold for one admission.
-- ARGV[9] id, ARGV[10] slots, ARGV[11] tokens, ARGV[12] slot limit (-1
-- none), ARGV[13] token limit (-1 none), ARGV[14], ... ids this replica
-- released since its last script: they are released first, so the
-- capacity they free is seen.
-- Extra reply: { code, expiry }: 1 admitted, 2 duplicate (the id already
-- holds), 0 slots full, -1 tokens full, -2 released (tombstoned), -3
-- relearning (inside the generation's relearn window: no replica is
-- admitted while running calls register again).
local id, s, t = ARGV[9], tonumber(ARGV[10]), tonumber(ARGV[11])
local slotLimit, tokenLimit = tonumber(ARGV[12]), tonumber(ARGV[13])
release_ids(14)
local code, expiry = 1, 0
local cur = redis.call('ZSCORE', K_HOLDS, id)
if cur then
  code, expiry = 2, tonumber(cur)
elseif released(id) then
  code = -2
elseif now < gen then
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
