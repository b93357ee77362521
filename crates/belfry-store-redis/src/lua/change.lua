-- Changes a task that is not leased. ARGV: now, retain_ms, op, seq, value.
-- op: 'cancel' | 'reschedule' (value: new due) | 'redrive'.
-- Replies {code, state, earliest}: code 0 ok, 1 not found, 3 wrong state (state says which).
local now, retain, op, seq = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4]
expire(now, 1000)
local rec = redis.call('HGET', KEYS[4], seq)
if not rec then return {1, 0, earliest()} end
local h = unpack_hdr(rec)
local want = SCHEDULED
if op == 'redrive' then want = DEAD end
if h[2] ~= want then return {3, h[2], earliest()} end
if op == 'cancel' then
  redis.call('ZREM', ready_key(h), seq)
  finish(seq, rec, h, CANCELLED, now)
elseif op == 'reschedule' then
  redis.call('ZREM', ready_key(h), seq)
  h[6] = tonumber(ARGV[5])
  redis.call('HSET', KEYS[4], seq, pack(rec, h))
  redis.call('ZADD', ready_key(h), h[6], seq)
elseif op == 'redrive' then
  redis.call('ZREM', KEYS[6], seq)
  redis.call('HDEL', KEYS[7], seq)
  h[2] = SCHEDULED
  h[5] = 0
  h[6] = now
  redis.call('HSET', KEYS[4], seq, pack(rec, h))
  redis.call('ZADD', ready_key(h), h[6], seq)
else
  return redis.error_reply('belfry: unknown change op ' .. op)
end
forget_old(now, retain, 65)
return {0, 0, earliest()}
