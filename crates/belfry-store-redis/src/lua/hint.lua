-- Lowers partition ARGV[2]'s entry in a queue's hint (KEYS[1]) to ARGV[1] if that is
-- earlier, and when it changed tells every node (PUBLISH ARGV[3] ARGV[4]) so the owner's
-- dispatcher looks now rather than at its next recheck. Every call counts one more version
-- of the partition (KEYS[2]), changed or not: a claim that read the version before it ran
-- sets the hint afterwards only if no call came between (`hint_claim.lua`).
redis.call('HINCRBY', KEYS[2], ARGV[2], 1)
local changed = redis.call('ZADD', KEYS[1], 'LT', 'CH', ARGV[1], ARGV[2])
if changed > 0 and ARGV[3] ~= '' then
  redis.call('PUBLISH', ARGV[3], ARGV[4])
end
return changed
