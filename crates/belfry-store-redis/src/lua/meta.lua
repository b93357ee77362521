-- Small metadata, every namespace a HASH in one slot. KEYS: the namespaces' hashes, then the
-- HASH of their write counts (field: a namespace's hash key), in the same slot.
-- ARGV: (key index, field, flag, value) fours: flag 'p' puts the value, 'd' deletes the field.
-- Each namespace written counts one more write, whatever the changes did. Returns how many
-- changes took effect (a put always; a delete when the field was there), then each
-- namespace's write count after this call, in KEYS order (0 for one not written), which the
-- announcements carry so that a node can tell one it missed.
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
local reply = {changed}
for index = 1, #KEYS - 1 do
  if touched[index] then
    reply[index + 1] = redis.call('HINCRBY', versions, KEYS[index], 1)
  else
    reply[index + 1] = 0
  end
end
return reply
