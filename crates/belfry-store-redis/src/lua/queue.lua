-- The queue registry. KEYS: 1 registry (HASH: name -> 8-byte uid + config), 2 uid counter.
-- ARGV: 'put' name config first_uid -> 1 created, 0 replaced | 'delete' name -> uid or 0 |
-- 'purge' name -> the old uid or 0 (the queue keeps its name and config under a new uid, so
-- its tasks, keyed by the old one, are gone at once).
-- first_uid: where a new namespace's counter starts (random, drawn by the caller), so that
-- task ids (which carry the uid) do not repeat across namespaces or a flushed Redis.
local op, name = ARGV[1], ARGV[2]
local old = redis.call('HGET', KEYS[1], name)
if op == 'put' then
  if old then
    redis.call('HSET', KEYS[1], name, string.sub(old, 1, 8) .. ARGV[3])
    return 0
  end
  if redis.call('EXISTS', KEYS[2]) == 0 then
    redis.call('SET', KEYS[2], ARGV[4])
  end
  local uid = redis.call('INCR', KEYS[2])
  redis.call('HSET', KEYS[1], name, struct.pack('>I8', uid) .. ARGV[3])
  return 1
elseif op == 'delete' then
  if not old then return 0 end
  redis.call('HDEL', KEYS[1], name)
  return struct.unpack('>I8', old)
elseif op == 'purge' then
  if not old then return 0 end
  local uid = redis.call('INCR', KEYS[2])
  redis.call('HSET', KEYS[1], name, struct.pack('>I8', uid) .. string.sub(old, 9))
  return struct.unpack('>I8', old)
end
return redis.error_reply('belfry: unknown queue op ' .. tostring(op))
