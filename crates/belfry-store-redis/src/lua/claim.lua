-- KEYS 1-11 as the prelude says, 12: the partition's owner lease (when fenced).
-- ARGV: now, max, visibility_ms, retain_ms, fence ('' for none).
-- Replies {leased {seq, record, ...}, skipped {seq...}, dead {seq...}, earliest} or {-1}
-- when the fence no longer holds.
local now, max, vis, retain = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if ARGV[5] ~= '' and redis.call('GET', KEYS[12]) ~= ARGV[5] then
  return {-1}
end
promote(now, 2000)
expire(now, 1000)
local leased, skipped, dead = {}, {}, {}
local left = max
-- Late tasks skipped or dead-lettered do not count against `max`; this bounds one call's
-- work all the same, so a huge late backlog cannot hold Redis for long.
local budget = max + 1000
for _, zkey in ipairs({KEYS[1], KEYS[2]}) do
  while left > 0 and budget > 0 do
    local seqs = redis.call('ZRANGEBYSCORE', zkey, '-inf', now, 'LIMIT', 0, left)
    if #seqs == 0 then break end
    for _, seq in ipairs(seqs) do
      budget = budget - 1
      redis.call('ZREM', zkey, seq)
      local rec = redis.call('HGET', KEYS[4], seq)
      if rec then
        local h = unpack_hdr(rec)
        local late, kind, allowed = now - h.due, late_kind(h), late_after(rec, h)
        if kind == 1 and late > allowed then
          finish(seq, rec, h, SKIPPED, now)
          skipped[#skipped + 1] = seq
        elseif kind == 2 and late > allowed then
          h.state = DEAD
          redis.call('HSET', KEYS[4], seq, pack(rec, h))
          redis.call('ZADD', KEYS[6], 0, seq)
          redis.call('HSET', KEYS[7], seq,
            'late by ' .. string.format('%d', late) .. ' ms (late policy allows '
            .. string.format('%d', allowed) .. ' ms)')
          dead[#dead + 1] = seq
        else
          h.state = LEASED
          h.attempts = h.attempts + 1
          h.lease_until = now + vis
          h.lease_id = redis.call('INCR', KEYS[9])
          local new = pack(rec, h)
          redis.call('HSET', KEYS[4], seq, new)
          redis.call('ZADD', KEYS[3], h.lease_until, seq)
          leased[#leased + 1] = seq
          leased[#leased + 1] = new
          left = left - 1
        end
      end
    end
  end
end
forget_old(now, retain, max + 64)
return {leased, skipped, dead, earliest()}
