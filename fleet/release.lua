-- release: end the holds of ARGV[5], ARGV[6], ... and tombstone every id,
-- known or not, so that a late reserve of it is refused.
-- Extra reply: { freed, unknown }.
local freed, unknown = release_ids(5)
return finish({ freed, unknown })
