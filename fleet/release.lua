-- release: end the holds of ARGV[5], ARGV[6], ... and tombstone every id,
-- known or not, so that a late reserve of it is refused.
-- Extra reply: { freed, unknown }.
redis.call('ZREMRANGEBYSCORE', K_GONE, '-inf', now)
local freed, unknown = 0, 0
local until_ = now + tomb
for i = 5, #ARGV do
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
if #ARGV >= 5 then
  redis.call('PEXPIRE', K_GONE, math.ceil(tomb / 1000) + 1000)
end
return finish({ freed, unknown })
