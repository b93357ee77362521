-- KEYS 1-11 as the prelude says, 12: the partition's owner lease (when fenced).
-- ARGV: now, max, visibility_ms, retain_ms, fence ('' for none).
-- Replies {leased {seq, record, ...}, skipped {seq...}, dead {seq...}, earliest, expired}
-- or {-1} when the fence no longer holds. `expired`: the leases this claim ended, and those
-- other scripts ended since the last claim (each lease is reported by one claim only).
--
-- Most claims take a task or two from a partition, so what a claim costs is mostly its fixed
-- calls: each ready set is read once by rank (the due tasks, and the first one not taken is
-- that set's earliest work), and the tasks taken are read and written a batch per call.
local now, max, vis, retain = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if ARGV[5] ~= '' and redis.call('GET', KEYS[12]) ~= ARGV[5] then
  return {-1}
end
local next_bucket = promote(now, 2000)
local expired = expire(now, 1000)
local kept = redis.call('HGET', KEYS[11], 'expired')
if kept then
  expired = expired + tonumber(kept)
  redis.call('HDEL', KEYS[11], 'expired')
end
local leased, skipped, dead = {}, {}, {}
local left = max
-- Late tasks skipped or dead-lettered do not count against `max`; this bounds one call's
-- work all the same, so a huge late backlog cannot hold Redis for long.
local budget = max + 1000
-- The earliest work left in the ready sets (-1: none).
local best = -1
local function consider(at)
  if at and (best < 0 or at < best) then best = at end
end

-- Takes the due tasks `seqs` (in due order) out of ready set `zkey`: leased, or, when later
-- than their late policy allows, skipped or dead.
local function take(zkey, seqs)
  redis.call('ZREM', zkey, unpack(seqs))
  local recs = redis.call('HMGET', KEYS[4], unpack(seqs))
  -- Lease ids come from the partition's counter, one block per batch (unused ones are skipped).
  local lease_id = redis.call('INCRBY', KEYS[9], #seqs) - #seqs
  local lease_until = now + vis
  local writes, leases = {}, {}
  for i, seq in ipairs(seqs) do
    budget = budget - 1
    local rec = recs[i]
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
        lease_id = lease_id + 1
        h.state = LEASED
        h.attempts = h.attempts + 1
        h.lease_until = lease_until
        h.lease_id = lease_id
        local new = pack(rec, h)
        writes[#writes + 1] = seq
        writes[#writes + 1] = new
        leases[#leases + 1] = lease_until
        leases[#leases + 1] = seq
        leased[#leased + 1] = seq
        leased[#leased + 1] = new
        left = left - 1
      end
    end
  end
  if #writes > 0 then
    redis.call('HSET', KEYS[4], unpack(writes))
    redis.call('ZADD', KEYS[3], unpack(leases))
  end
end

for _, zkey in ipairs({KEYS[1], KEYS[2]}) do
  while true do
    if left <= 0 or budget <= 0 then
      local first = redis.call('ZRANGE', zkey, 0, 0, 'WITHSCORES')
      consider(tonumber(first[2]))
      break
    end
    -- One more than can be taken: the first not taken is this set's earliest work.
    local want = math.min(left, budget, 500)
    local got = redis.call('ZRANGE', zkey, 0, want, 'WITHSCORES')
    local seqs, rest = {}, nil
    for i = 1, #got, 2 do
      local at = tonumber(got[i + 1])
      if #seqs < want and at <= now then
        seqs[#seqs + 1] = got[i]
      else
        rest = at
        break
      end
    end
    if #seqs > 0 then take(zkey, seqs) end
    -- No rest: the set held only what was taken. A rest still due is taken next round,
    -- unless this claim is full.
    if not rest then break end
    if rest > now or left <= 0 or budget <= 0 then
      consider(rest)
      break
    end
  end
end
forget_old(now, retain, max + 64)
-- The earliest instant a claim here could do something: the ready sets', the first lease
-- deadline (those just taken included), the next bucket to promote.
local first_lease = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
consider(tonumber(first_lease[2]))
if next_bucket == nil then
  local first = redis.call('ZRANGE', KEYS[10], 0, 0, 'WITHSCORES')
  next_bucket = tonumber(first[2]) or -1
end
if next_bucket >= 0 then consider(next_bucket) end
return {leased, skipped, dead, best, expired}
