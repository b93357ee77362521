-- Changes a task that is not leased. ARGV: now, retain_ms, op, seq, value, far_after_ms.
-- op: 'cancel' | 'reschedule' (value: new due; a far one waits in its bucket) | 'redrive' |
-- 'discard' (a dead letter finishes as cancelled).
-- Replies {code, state, earliest}: code 0 ok, 1 not found, 3 wrong state (state says which).
local now, retain, op, seq = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4]
local far_after = tonumber(ARGV[6] or '0')
-- Leases ended here are kept for the next claim to report (`ClaimBatch::leases_expired`).
local expired = expire(now, 1000)
if expired > 0 then redis.call('HINCRBY', KEYS[11], 'expired', expired) end
local rec = redis.call('HGET', KEYS[4], seq)
if not rec then return {1, 0, earliest()} end
local h = unpack_hdr(rec)
local ok = h.state == SCHEDULED or h.state == BUCKETED
if op == 'redrive' or op == 'discard' then ok = h.state == DEAD end
if not ok then return {3, h.state, earliest()} end
if op == 'cancel' then
  unplace(seq, h)
  finish(seq, rec, h, CANCELLED, now)
elseif op == 'reschedule' then
  unplace(seq, h)
  h.due = tonumber(ARGV[5])
  place(seq, h, now, far_after)
  redis.call('HSET', KEYS[4], seq, pack(rec, h))
elseif op == 'redrive' then
  redis.call('ZREM', KEYS[6], seq)
  redis.call('HDEL', KEYS[7], seq)
  h.attempts = 0
  h.due = now
  place(seq, h, now, 0)
  redis.call('HSET', KEYS[4], seq, pack(rec, h))
elseif op == 'discard' then
  redis.call('ZREM', KEYS[6], seq)
  redis.call('HDEL', KEYS[7], seq)
  finish(seq, rec, h, CANCELLED, now)
else
  return redis.error_reply('belfry: unknown change op ' .. op)
end
forget_old(now, retain, 65)
return {0, 0, earliest()}
