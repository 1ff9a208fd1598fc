-- release: end the holds of ARGV[9], ARGV[10], ... and tombstone every id,
-- known or not, so that a late reserve of it is refused.
-- Extra reply: { freed, unknown }.
local freed, unknown = release_ids(9)
return finish({ freed, unknown })
