-- Reads without changing anything. ARGV: op, then by op:
--   'get' seq                      -> {record, dead reason} or {}
--   'key' idempotency key          -> {seq, record, dead reason} or {}
--   'dead' after seq ('' first), limit -> {seq, record, reason, ...}
--   'counts' now                   -> {pending, due, leased-until-after-now, dead}
--   'forecast' from, step, steps   -> counts per step
--   'due' now                      -> {tasks a claim could take now, earliest instant}
--   'earliest'                     -> earliest instant (-1: none)
local op = ARGV[1]
if op == 'get' then
  local rec = redis.call('HGET', KEYS[4], ARGV[2])
  if not rec then return {} end
  return {rec, redis.call('HGET', KEYS[7], ARGV[2]) or ''}
elseif op == 'key' then
  local seq = redis.call('HGET', KEYS[5], ARGV[2])
  if not seq then return {} end
  local rec = redis.call('HGET', KEYS[4], seq)
  if not rec then return {} end
  return {seq, rec, redis.call('HGET', KEYS[7], seq) or ''}
elseif op == 'dead' then
  local from = '-'
  if ARGV[2] ~= '' then from = '(' .. ARGV[2] end
  local seqs = redis.call('ZRANGE', KEYS[6], from, '+', 'BYLEX', 'LIMIT', 0, tonumber(ARGV[3]))
  local out = {}
  for _, seq in ipairs(seqs) do
    local rec = redis.call('HGET', KEYS[4], seq)
    if rec then
      out[#out + 1] = seq
      out[#out + 1] = rec
      out[#out + 1] = redis.call('HGET', KEYS[7], seq) or ''
    end
  end
  return out
elseif op == 'counts' then
  local now = tonumber(ARGV[2])
  local pending = redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[2])
  local due = redis.call('ZCOUNT', KEYS[1], '-inf', now) + redis.call('ZCOUNT', KEYS[2], '-inf', now)
  -- A lease that has ended is a scheduled, due task again (at its original due time).
  local ended = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
  for _, seq in ipairs(ended) do
    local rec = redis.call('HGET', KEYS[4], seq)
    if rec then
      local h = unpack_hdr(rec)
      pending = pending + 1
      if h[6] <= now then due = due + 1 end
    end
  end
  local leased = redis.call('ZCOUNT', KEYS[3], '(' .. now, '+inf')
  return {pending, due, leased, redis.call('ZCARD', KEYS[6])}
elseif op == 'forecast' then
  local from, step, steps = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
  local out = {}
  for i = 0, steps - 1 do
    local lo = from + i * step
    local hi = '(' .. string.format('%d', lo + step)
    out[#out + 1] = redis.call('ZCOUNT', KEYS[1], lo, hi) + redis.call('ZCOUNT', KEYS[2], lo, hi)
  end
  return out
elseif op == 'due' then
  -- How many tasks a claim now could take (scheduled and due, or leases ended), and the
  -- earliest instant a claim could return something.
  local now = tonumber(ARGV[2])
  local due = redis.call('ZCOUNT', KEYS[1], '-inf', now) + redis.call('ZCOUNT', KEYS[2], '-inf', now)
    + redis.call('ZCOUNT', KEYS[3], '-inf', now)
  return {due, earliest()}
elseif op == 'earliest' then
  return earliest()
end
return redis.error_reply('belfry: unknown read op ' .. tostring(op))
