-- Small metadata, every namespace a HASH in one slot. KEYS: the namespaces' hashes.
-- ARGV: triples (key index, field, value), value '' with a flag: 'p' put or 'd' delete,
-- as (index, field, flag, value).
for i = 1, #ARGV, 4 do
  local key = KEYS[tonumber(ARGV[i])]
  if ARGV[i + 2] == 'p' then
    redis.call('HSET', key, ARGV[i + 1], ARGV[i + 3])
  else
    redis.call('HDEL', key, ARGV[i + 1])
  end
end
return #ARGV / 4
