-- ARGV: now, retain_ms, place_now, far_after_ms (0: no buckets), count, then per task: due,
-- priority, idempotency key ('' for none), record. A task due `far_after_ms` or more after
-- `place_now` waits in its far-future bucket. Replies per task {1, seq} (created) or {0, seq,
-- record, dead reason} (duplicate), then the earliest instant a claim here has something to
-- do for the tasks created (or -1).
--
-- A key names its task until the task has been finished for the retention: a key whose task
-- finished longer ago is free (that record is forgotten here and the key taken), even when no
-- claim or change on this partition has forgotten it yet (a partition holding only future
-- tasks is never claimed).
local now, retain = tonumber(ARGV[1]), tonumber(ARGV[2])
local place_now, far_after = tonumber(ARGV[3]), tonumber(ARGV[4])
local count = tonumber(ARGV[5])
local out = {}
local first = -1
local far = {}
-- Before the keys are looked up, so a key of a task forgotten now is free below.
forget_old(now, retain, 64)
for i = 0, count - 1 do
  local due = tonumber(ARGV[6 + i * 4])
  local prio = tonumber(ARGV[7 + i * 4])
  local key = ARGV[8 + i * 4]
  local rec = ARGV[9 + i * 4]
  local dup = nil
  if key ~= '' then
    local seq = redis.call('HGET', KEYS[5], key)
    local old = seq and redis.call('HGET', KEYS[4], seq)
    if old and past_retention(seq, unpack_hdr(old), now, retain) then
      redis.call('HDEL', KEYS[4], seq)
      redis.call('ZREM', KEYS[8], seq)
    elseif old then
      dup = {0, seq, old, redis.call('HGET', KEYS[7], seq) or ''}
    end
  end
  if dup then
    out[#out + 1] = dup
  else
    local n = redis.call('INCR', KEYS[9])
    local seq = struct.pack('>I8', n)
    local at = due
    if far_after > 0 and due >= place_now + far_after then
      -- A far task: bucketed (see `place`), its bucket written once per call below.
      local h = unpack_hdr(rec)
      h.state = BUCKETED
      h.bucket = bucket_of(due, place_now)
      rec = pack(rec, h)
      local entries = far[h.bucket]
      if not entries then
        entries = {}
        far[h.bucket] = entries
      end
      entries[#entries + 1] = string.format('%d', n)
      at = promote_at(h.bucket)
    elseif prio == 0 then
      -- The record as given: scheduled, in its ready set.
      redis.call('ZADD', KEYS[1], due, seq)
    else
      redis.call('ZADD', KEYS[2], due, seq)
    end
    redis.call('HSET', KEYS[4], seq, rec)
    if key ~= '' then redis.call('HSET', KEYS[5], key, seq) end
    out[#out + 1] = {1, seq}
    if first < 0 or at < first then first = at end
  end
end
for b, entries in pairs(far) do bucket_add(b, entries) end
out[#out + 1] = first
return out
