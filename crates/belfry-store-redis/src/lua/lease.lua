-- Ends or changes leases. ARGV: now, retain_ms, op, then per task: seq, lease id, value.
-- op: 'ack' | 'nack' (value: retry at) | 'extend' (value: new deadline) | 'dead' (value:
-- reason) | 'dead_untried' (as 'dead', taking back the attempt of a claim that found the task
-- out of attempts). Replies per task 0 ok, 1 not found, 2 lease expired; then the earliest instant
-- a claim here could return something (-1: none; always -1 for 'ack').
local now, retain, op = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local out = {}
for i = 4, #ARGV, 3 do
  local seq, lease, value = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
  local code, rec, h = take_lease(seq, lease, now)
  if code == 0 then
    if op == 'ack' then
      finish(seq, rec, h, DONE, now)
    elseif op == 'nack' then
      h.state = SCHEDULED
      h.due = tonumber(value)
      redis.call('HSET', KEYS[4], seq, pack(rec, h))
      redis.call('ZADD', ready_key(h), h.due, seq)
    elseif op == 'extend' then
      h.lease_until = tonumber(value)
      redis.call('HSET', KEYS[4], seq, pack(rec, h))
      redis.call('ZADD', KEYS[3], h.lease_until, seq)
    elseif op == 'dead' or op == 'dead_untried' then
      h.state = DEAD
      if op == 'dead_untried' and h.attempts > 0 then
        h.attempts = h.attempts - 1
      end
      redis.call('HSET', KEYS[4], seq, pack(rec, h))
      redis.call('ZADD', KEYS[6], 0, seq)
      redis.call('HSET', KEYS[7], seq, value)
    else
      return redis.error_reply('belfry: unknown lease op ' .. op)
    end
  end
  out[#out + 1] = code
end
forget_old(now, retain, (#ARGV - 3) / 3 + 64)
-- An ack only ever makes work later, so its callers do not need the earliest instant.
if op == 'ack' then
  out[#out + 1] = -1
else
  out[#out + 1] = earliest()
end
return out
