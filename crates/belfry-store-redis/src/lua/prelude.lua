-- Shared by every script that touches one queue's keys in one partition. KEYS, always:
--   1 h: scheduled tasks of high priority (ZSET: due ms -> 8-byte sequence)
--   2 n: scheduled tasks of normal priority (ZSET, same)
--   3 l: leased tasks (ZSET: lease deadline ms -> sequence)
--   4 t: records (HASH: sequence -> record)
--   5 k: idempotency keys (HASH: key -> sequence)
--   6 x: dead tasks (ZSET, score 0, by sequence)
--   7 r: dead reasons (HASH: sequence -> text)
--   8 f: finished tasks (ZSET: finish ms -> sequence), forgotten after the retention
--   9 s: the partition's counter (sequences and lease ids)
--  10 b: far-future buckets (ZSET: bucket number -> when to promote it, ms); bucket `n`'s sequences
--        (as decimal numbers, a few bytes each) are the LIST `KEYS[10] .. ':' .. n`
--  11 c: bucketed tasks (HASH: bucket number -> how many, 'all' -> how many in all), and
--        'expired' -> leases a script other than a claim ended, for the next claim to report
-- A record: a fixed header (layout below, big-endian), a leased task's lease, the extras
-- (late after, idempotency key, headers) when flags say so, then the payload. Finished
-- records drop the payload. `record.rs` has the layout.
--
-- Far-future tasks: a task put or rescheduled due `far_after` ms or more ahead waits in a
-- bucket (state BUCKETED, the bucket's number after the header), not in a ready set, which
-- costs ~90 bytes less per task. A bucket is named by its first minute and holds tasks due
-- from then on: a minute wide for tasks due within the hour, 10 minutes within the day, an
-- hour beyond, so sparse far tasks still share buckets. A claim first promotes every bucket
-- whose promotion instant has come (its first ms less a lead: 10 s, 1 min, 5 min as it is
-- 1, 10, 60 minutes wide): each task there still BUCKETED in this bucket becomes SCHEDULED
-- in its ready set. A cancelled or rescheduled bucketed task leaves its
-- list entry behind; promotion skips it (the record is the truth), and a bucket none counts
-- any more is dropped at once.
local HDR = '>BBBI4I8'
local HDR_LEN = 15
local LEASE = '>I8I8'
local SCHEDULED, LEASED, DONE, DEAD, CANCELLED, SKIPPED, BUCKETED = 0, 1, 2, 3, 4, 5, 6
local EXTRAS = 16
local MINUTE_MS = 60000

-- How many minutes bucket `b` may span: a bucket is named by its first minute, and one named
-- by a whole hour may hold hour-wide tasks (see `bucket_of`).
local function bucket_span(b)
  if b % 60 == 0 then return 60 elseif b % 10 == 0 then return 10 end
  return 1
end

-- When bucket `b` is promoted: ahead of its first ms by 10 s, 1 min or 5 min as it spans 1,
-- 10 or 60 minutes, so a wide bucket's many tasks move well before the first is due.
local function promote_at(b)
  local lead = 10000
  local span = bucket_span(b)
  if span == 60 then lead = 300000 elseif span == 10 then lead = 60000 end
  return math.max(b * MINUTE_MS - lead, 0)
end

-- h: state, flags, attempts, due, lease_until, lease_id, bucket, len (header and tail bytes).
local function unpack_hdr(rec)
  local _, state, flags, attempts, due = struct.unpack(HDR, rec)
  local h = {state = state, flags = flags, attempts = attempts, due = due,
    lease_until = 0, lease_id = 0, bucket = -1, len = HDR_LEN}
  if state == LEASED then
    h.lease_until, h.lease_id = struct.unpack(LEASE, rec, HDR_LEN + 1)
    h.len = HDR_LEN + 16
  elseif state == BUCKETED then
    h.bucket = struct.unpack('>I4', rec, HDR_LEN + 1)
    h.len = HDR_LEN + 4
  end
  return h
end

local function header(h)
  local out = struct.pack(HDR, 2, h.state, h.flags, h.attempts, h.due)
  if h.state == LEASED then
    out = out .. struct.pack(LEASE, h.lease_until, h.lease_id)
  elseif h.state == BUCKETED then
    out = out .. struct.pack('>I4', h.bucket)
  end
  return out
end

-- The record `rec` (read as `h`) with `h`'s header.
local function pack(rec, h)
  return header(h) .. string.sub(rec, h.len + 1)
end

-- Where the extras end (the payload starts), 0-based.
local function extras_end(rec, h)
  if bit.band(h.flags, EXTRAS) == 0 then return h.len end
  return h.len + 4 + struct.unpack('>I4', rec, h.len + 1)
end

local function late_kind(h)
  return bit.band(bit.rshift(h.flags, 2), 3)
end

local function late_after(rec, h)
  if late_kind(h) == 0 then return 0 end
  return struct.unpack('>I8', rec, h.len + 5)
end

local function idem_key(rec, h)
  if bit.band(h.flags, EXTRAS) == 0 then return nil end
  local at = h.len + 5
  if late_kind(h) ~= 0 then at = at + 8 end
  local len = struct.unpack('>I2', rec, at)
  if len == 0 then return nil end
  return string.sub(rec, at + 2, at + 1 + len)
end

local function ready_key(h)
  if bit.band(h.flags, 1) == 0 then return KEYS[1] end
  return KEYS[2]
end

-- The bucket (its first minute) of a task due at `due`, placed at `now`.
local function bucket_of(due, now)
  local width = 60
  if due - now >= 86400000 then width = 3600 elseif due - now >= 3600000 then width = 600 end
  return math.floor(due / (width * 1000)) * width / 60
end

local function bucket_list(b)
  return KEYS[10] .. ':' .. string.format('%d', b)
end

-- Counts `by` tasks into (or, negative, out of) bucket `b`; a bucket counting none is
-- dropped with its list (every entry left there is stale).
local function bucket_count(b, by)
  redis.call('HINCRBY', KEYS[11], 'all', by)
  local left = redis.call('HINCRBY', KEYS[11], string.format('%d', b), by)
  if left <= 0 then
    redis.call('HDEL', KEYS[11], string.format('%d', b))
    redis.call('ZREM', KEYS[10], string.format('%d', b))
    redis.call('DEL', bucket_list(b))
  end
end

-- Adds `entries` (sequences as decimal numbers) to bucket `b`.
local function bucket_add(b, entries)
  for i = 1, #entries, 500 do
    redis.call('RPUSH', bucket_list(b), unpack(entries, i, math.min(i + 499, #entries)))
  end
  redis.call('ZADD', KEYS[10], promote_at(b), string.format('%d', b))
  bucket_count(b, #entries)
end

-- Puts a scheduled task where it waits: its bucket when due `far_after` ms or more after
-- `now` (far_after 0: never), else its ready set. Sets h.state; the caller writes the record.
local function place(seq, h, now, far_after)
  if far_after > 0 and h.due >= now + far_after then
    h.state = BUCKETED
    h.bucket = bucket_of(h.due, now)
    bucket_add(h.bucket, {string.format('%d', struct.unpack('>I8', seq))})
  else
    h.state = SCHEDULED
    redis.call('ZADD', ready_key(h), h.due, seq)
  end
end

-- Takes a scheduled (or bucketed) task out of where it waits.
local function unplace(seq, h)
  if h.state == BUCKETED then
    bucket_count(h.bucket, -1)
  else
    redis.call('ZREM', ready_key(h), seq)
  end
end

-- Promotes buckets whose promotion instant is `now` or earlier, earliest first, reading at
-- most `budget` list entries. Returns the next bucket's promotion instant (-1: no bucket
-- left), or nil when the budget ran out first (unknown).
local function promote(now, budget)
  while budget > 0 do
    local first = redis.call('ZRANGE', KEYS[10], 0, 0, 'WITHSCORES')
    if not first[1] then return -1 end
    if tonumber(first[2]) > now then return tonumber(first[2]) end
    local b = tonumber(first[1])
    local list = bucket_list(b)
    local entries = redis.call('LPOP', list, budget)
    local moved = 0
    if entries then
      for _, entry in ipairs(entries) do
        budget = budget - 1
        local seq = struct.pack('>I8', tonumber(entry))
        local rec = redis.call('HGET', KEYS[4], seq)
        if rec then
          local h = unpack_hdr(rec)
          if h.state == BUCKETED and h.bucket == b then
            h.state = SCHEDULED
            redis.call('HSET', KEYS[4], seq, pack(rec, h))
            redis.call('ZADD', ready_key(h), h.due, seq)
            moved = moved + 1
          end
        end
      end
    end
    if redis.call('EXISTS', list) == 0 then
      -- Drained: whatever the bucket still counts (none, unless damaged) goes with it.
      local left = tonumber(redis.call('HGET', KEYS[11], first[1]) or '0')
      moved = math.max(moved, left)
      if moved > 0 then bucket_count(b, -moved) end
      redis.call('HDEL', KEYS[11], first[1])
      redis.call('ZREM', KEYS[10], first[1])
    elseif moved > 0 then
      bucket_count(b, -moved)
    end
  end
  return nil
end

-- Ends the lease of every leased task whose deadline has come (at most `max`): scheduled
-- again, at its original due time. Answers how many leases it ended.
local function expire(now, max)
  local ended = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, max)
  local n = 0
  for _, seq in ipairs(ended) do
    local rec = redis.call('HGET', KEYS[4], seq)
    if rec then
      local h = unpack_hdr(rec)
      if h.state == LEASED then
        h.state = SCHEDULED
        redis.call('HSET', KEYS[4], seq, pack(rec, h))
        redis.call('ZADD', ready_key(h), h.due, seq)
        n = n + 1
      end
    end
    redis.call('ZREM', KEYS[3], seq)
  end
  return n
end

-- A task reaches a final state: its record is kept (without payload) for the retention,
-- so reads and idempotency keys still find it, then forgotten.
local function finish(seq, rec, h, state, now)
  local kept = string.sub(rec, h.len + 1, extras_end(rec, h))
  h.state = state
  redis.call('HSET', KEYS[4], seq, header(h) .. kept)
  redis.call('ZADD', KEYS[8], now, seq)
end

-- Whether `h`, the record of `seq`, is a task that finished `retain_ms` or more before `now`
-- (the bound `forget_old` forgets by): as good as forgotten, whether or not a script forgot
-- it yet, so reads do not show it and its idempotency key is free.
local function past_retention(seq, h, now, retain_ms)
  if h.state ~= DONE and h.state ~= CANCELLED and h.state ~= SKIPPED then return false end
  local at = redis.call('ZSCORE', KEYS[8], seq)
  if not at then return false end
  return tonumber(at) <= now - retain_ms
end

-- Forgets up to `max` tasks finished the retention or more ago: each call forgets at least
-- as many as it may finish, so finished records never pile up. A few calls per 500 tasks
-- (a `redis.call` costs microseconds; a call per task was most of a small claim's time).
local function forget_old(now, retain_ms, max)
  local old = redis.call('ZRANGEBYSCORE', KEYS[8], '-inf', now - retain_ms, 'LIMIT', 0, max)
  for i = 1, #old, 500 do
    local seqs = {unpack(old, i, math.min(i + 499, #old))}
    local recs = redis.call('HMGET', KEYS[4], unpack(seqs))
    local gone, keys, owners = {}, {}, {}
    for j, seq in ipairs(seqs) do
      local rec = recs[j]
      if rec then
        gone[#gone + 1] = seq
        local key = idem_key(rec, unpack_hdr(rec))
        if key then
          keys[#keys + 1] = key
          owners[#owners + 1] = seq
        end
      end
    end
    if #keys > 0 then
      -- A key is forgotten only while it still names this task (a later put may own it).
      local now_owned = redis.call('HMGET', KEYS[5], unpack(keys))
      local drop = {}
      for j, key in ipairs(keys) do
        if now_owned[j] == owners[j] then drop[#drop + 1] = key end
      end
      if #drop > 0 then redis.call('HDEL', KEYS[5], unpack(drop)) end
    end
    if #gone > 0 then redis.call('HDEL', KEYS[4], unpack(gone)) end
    redis.call('ZREM', KEYS[8], unpack(seqs))
  end
end

-- The earliest instant a claim here could do something (a due task, an ended lease, a
-- bucket to promote), or -1.
local function earliest()
  local best = -1
  for _, key in ipairs({KEYS[1], KEYS[2], KEYS[3], KEYS[10]}) do
    local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    if first[2] then
      local at = tonumber(first[2])
      if best < 0 or at < best then best = at end
    end
  end
  return best
end

-- A leased task's lease, checked: 0 ok (with the header), 1 not found, 2 expired.
local function take_lease(seq, lease, now)
  local rec = redis.call('HGET', KEYS[4], seq)
  if not rec then return 1 end
  local h = unpack_hdr(rec)
  if h.state ~= LEASED or h.lease_id ~= lease or h.lease_until <= now then return 2 end
  redis.call('ZREM', KEYS[3], seq)
  return 0, rec, h
end
