-- Small metadata, every namespace a HASH in one slot. KEYS: the namespaces' hashes, then the
-- HASH of their write counts (field: a namespace's hash key), in the same slot.
-- ARGV: (key index, field, flag, value) fours: flag 'p' puts the value, 'd' deletes the field.
-- Each namespace written counts one more write, whatever the changes did. Returns how many
-- changes took effect (a put always; a delete when the field was there).
local versions = KEYS[#KEYS]
local touched = {}
local changed = 0
for i = 1, #ARGV, 4 do
  local index = tonumber(ARGV[i])
  local key = KEYS[index]
  if ARGV[i + 2] == 'p' then
    redis.call('HSET', key, ARGV[i + 1], ARGV[i + 3])
    changed = changed + 1
  else
    changed = changed + redis.call('HDEL', key, ARGV[i + 1])
  end
  touched[index] = true
end
for index in pairs(touched) do
  redis.call('HINCRBY', versions, KEYS[index], 1)
end
return changed
