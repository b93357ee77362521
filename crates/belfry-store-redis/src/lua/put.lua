-- ARGV: now, retain_ms, count, then per task: due, priority, idempotency key ('' for none),
-- record. Replies per task {1, seq} (created) or {0, seq, record, dead reason} (duplicate),
-- then the earliest due time of the tasks created (or -1).
local now, retain = tonumber(ARGV[1]), tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local out = {}
local first = -1
for i = 0, n - 1 do
  local due = tonumber(ARGV[4 + i * 4])
  local prio = tonumber(ARGV[5 + i * 4])
  local key = ARGV[6 + i * 4]
  local rec = ARGV[7 + i * 4]
  local dup = nil
  if key ~= '' then
    local seq = redis.call('HGET', KEYS[5], key)
    if seq then
      local old = redis.call('HGET', KEYS[4], seq)
      if old then dup = {0, seq, old, redis.call('HGET', KEYS[7], seq) or ''} end
    end
  end
  if dup then
    out[#out + 1] = dup
  else
    local seq = struct.pack('>I8', redis.call('INCR', KEYS[9]))
    redis.call('HSET', KEYS[4], seq, rec)
    if prio == 0 then
      redis.call('ZADD', KEYS[1], due, seq)
    else
      redis.call('ZADD', KEYS[2], due, seq)
    end
    if key ~= '' then redis.call('HSET', KEYS[5], key, seq) end
    out[#out + 1] = {1, seq}
    if first < 0 or due < first then first = due end
  end
end
forget_old(now, retain, 64)
out[#out + 1] = first
return out
