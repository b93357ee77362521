-- Reads without changing anything. ARGV: op, then by op:
--   'get' seq, now, retain_ms      -> {record, dead reason} or {}
--   'key' idempotency key, now, retain_ms -> {seq, record, dead reason} or {}
--     (a task finished the retention or more before `now` is not found, forgotten or not)
--   'dead' after seq ('' first), limit -> {seq, record, reason, ...}
--   'live' after (a sequence number, 0 first), want, probe budget (0: scan)
--                                  -> {next (-1: nothing live after), live count, records,
--                                      seq, record, ...}
--   'live_records' HSCAN cursor, after, count, below ('' none) -> {next cursor, seq, ...}
--                                  (of live records, after `after` and below `below`)
--   'live_read' want, sequence numbers ascending -> {seq, record, ...} (the first `want` live)
--   'counts' now                   -> {pending, due, leased-until-after-now, dead,
--                                      earliest due time of a due task (-1: none due)}
--   'forecast' from, step, steps   -> counts per step
--   'due' now                      -> {tasks a claim could take now, earliest instant (when
--                                      none is due; else -1)}
--   'earliest'                     -> earliest instant (-1: none)
local op = ARGV[1]

-- The due times of the tasks waiting in bucket `b` (each once; stale entries skipped).
local function bucketed_dues(b)
  local out, seen = {}, {}
  for _, entry in ipairs(redis.call('LRANGE', bucket_list(b), 0, -1)) do
    if not seen[entry] then
      seen[entry] = true
      local rec = redis.call('HGET', KEYS[4], struct.pack('>I8', tonumber(entry)))
      if rec then
        local h = unpack_hdr(rec)
        if h.state == BUCKETED and h.bucket == b then out[#out + 1] = h.due end
      end
    end
  end
  return out
end

-- Bucketed tasks due by `now` (only when promotion lags: buckets are promoted ahead), and
-- the earliest of their due times (-1: none).
local function bucketed_due(now)
  local n, oldest = 0, -1
  for _, b in ipairs(redis.call('ZRANGEBYSCORE', KEYS[10], '-inf', now)) do
    for _, due in ipairs(bucketed_dues(tonumber(b))) do
      if due <= now then
        n = n + 1
        if oldest < 0 or due < oldest then oldest = due end
      end
    end
  end
  return n, oldest
end

-- A listing's page of live tasks (scheduled, bucketed or leased) in sequence order (`list.rs`
-- says which way a page reads, and when). No index orders them by sequence: the ready and
-- lease sets are ordered by time, the bucket lists by arrival. So a page probes the record
-- hash sequence by sequence (cheap where live tasks are dense among the sequences given out),
-- or scans those sets and lists whole in one call (cheap where the partition holds few),
-- keeping only the page's smallest sequences, or, for a big partition, passes over the record
-- hash in steps ('live_records') and reads the smallest it found ('live_read').
local PROBE_CHUNK, SCAN_CHUNK, SCAN_ALWAYS = 128, 1000, 256

local function is_live(rec)
  local _, state = struct.unpack('>BB', rec)
  return state == SCHEDULED or state == LEASED or state == BUCKETED
end

-- The partition's live tasks, which a scan reads: its ready and lease sets' entries and the
-- tasks in its buckets (their lists may hold a few stale entries more).
local function live_count()
  return redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[2])
    + redis.call('ZCARD', KEYS[3]) + tonumber(redis.call('HGET', KEYS[11], 'all') or '0')
end

-- Appends to `out` the live records of sequences `after` + 1 on, in order, until `want` are
-- found, `budget` sequences are probed or the partition's counter is passed. Returns the last
-- sequence probed (-1: past the counter, nothing more to find).
local function live_probe(out, after, want, budget)
  local top = tonumber(redis.call('GET', KEYS[9]) or '0')
  local s, found = after, 0
  while s < top and budget > 0 do
    local n = math.min(PROBE_CHUNK, top - s, budget)
    local seqs = {}
    for i = 1, n do seqs[i] = struct.pack('>I8', s + i) end
    local recs = redis.call('HMGET', KEYS[4], unpack(seqs))
    for i = 1, n do
      if recs[i] and is_live(recs[i]) then
        out[#out + 1] = seqs[i]
        out[#out + 1] = recs[i]
        found = found + 1
        if found == want then return s + i end
      end
    end
    s = s + n
    budget = budget - n
  end
  if s >= top then return -1 end
  return s
end

-- The `count` smallest sequence numbers after `after` among the ready sets, the lease set and
-- the bucket lists, each once (a bucket list may name a task twice, or one now elsewhere),
-- ascending: a max-heap of `count`, fed a chunk at a time.
local function smallest_after(after, count)
  local heap, held = {}, {}
  local function sift(i)
    while true do
      local l, r, m = 2 * i, 2 * i + 1, i
      if l <= #heap and heap[l] > heap[m] then m = l end
      if r <= #heap and heap[r] > heap[m] then m = r end
      if m == i then return end
      heap[m], heap[i] = heap[i], heap[m]
      i = m
    end
  end
  local function offer(v)
    if v <= after or held[v] then return end
    if #heap < count then
      heap[#heap + 1] = v
      local i = #heap
      while i > 1 and heap[math.floor(i / 2)] < heap[i] do
        local up = math.floor(i / 2)
        heap[up], heap[i] = heap[i], heap[up]
        i = up
      end
    elseif v < heap[1] then
      held[heap[1]] = nil
      heap[1] = v
      sift(1)
    else
      return
    end
    held[v] = true
  end
  local function each(read, decode)
    local at = 0
    repeat
      local got = read(at, at + SCAN_CHUNK - 1)
      for _, item in ipairs(got) do offer(decode(item)) end
      at = at + SCAN_CHUNK
    until #got < SCAN_CHUNK
  end
  local function seq_number(seq) return (struct.unpack('>I8', seq)) end
  for _, key in ipairs({KEYS[1], KEYS[2], KEYS[3]}) do
    each(function(a, b) return redis.call('ZRANGE', key, a, b) end, seq_number)
  end
  for _, b in ipairs(redis.call('ZRANGE', KEYS[10], 0, -1)) do
    local list = bucket_list(tonumber(b))
    each(function(a, b2) return redis.call('LRANGE', list, a, b2) end, tonumber)
  end
  table.sort(heap)
  return heap
end

-- Appends to `out` the live records among `candidates` (ascending sequence numbers), up to
-- `want`. Returns the last sequence listed when `want` were found, else nil.
local function read_live(out, candidates, want)
  local found = 0
  for i = 1, #candidates, PROBE_CHUNK do
    local seqs = {}
    for j = i, math.min(i + PROBE_CHUNK - 1, #candidates) do
      seqs[#seqs + 1] = struct.pack('>I8', candidates[j])
    end
    local recs = redis.call('HMGET', KEYS[4], unpack(seqs))
    for j, seq in ipairs(seqs) do
      if recs[j] and is_live(recs[j]) then
        out[#out + 1] = seq
        out[#out + 1] = recs[j]
        found = found + 1
        if found == want then return candidates[i + j - 1] end
      end
    end
  end
  return nil
end

-- Appends to `out` the first `want` live records among the smallest sequences after `after`
-- that the sets and lists name, taking a few more than `want` so that stale bucket entries
-- (cancelled or moved tasks) seldom cost another scan. Returns the last sequence this covers:
-- the last listed when `want` were found, else the largest taken (-1: nothing more to find).
local function live_scan(out, after, want)
  local take = want + 64 + math.floor(want / 8)
  local candidates = smallest_after(after, take)
  local last = read_live(out, candidates, want)
  if last then return last end
  if #candidates < take then return -1 end
  return candidates[#candidates]
end

if op == 'get' or op == 'key' then
  local seq = ARGV[2]
  if op == 'key' then seq = redis.call('HGET', KEYS[5], ARGV[2]) end
  local rec = seq and redis.call('HGET', KEYS[4], seq)
  if not rec then return {} end
  if past_retention(seq, unpack_hdr(rec), tonumber(ARGV[3]), tonumber(ARGV[4])) then
    return {}
  end
  local reason = redis.call('HGET', KEYS[7], seq) or ''
  if op == 'get' then return {rec, reason} end
  return {seq, rec, reason}
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
elseif op == 'live' then
  local after, want, budget = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
  local count = live_count()
  local out = {-1, count, redis.call('HLEN', KEYS[4])}
  if budget == 0 or count <= SCAN_ALWAYS then
    out[1] = live_scan(out, after, want)
  else
    out[1] = live_probe(out, after, want, budget)
  end
  return out
elseif op == 'live_records' then
  -- One step of a pass over the record hash: the sequences of live records between bounds.
  local got = redis.call('HSCAN', KEYS[4], ARGV[2], 'COUNT', ARGV[4])
  local after, below, fields = tonumber(ARGV[3]), tonumber(ARGV[5]), got[2]
  local out = {got[1]}
  for i = 1, #fields, 2 do
    local n = struct.unpack('>I8', fields[i])
    if n > after and (not below or n < below) and is_live(fields[i + 1]) then
      out[#out + 1] = fields[i]
    end
  end
  return out
elseif op == 'live_read' then
  local out = {}
  local candidates = {}
  for i = 3, #ARGV do candidates[#candidates + 1] = tonumber(ARGV[i]) end
  read_live(out, candidates, tonumber(ARGV[2]))
  return out
elseif op == 'counts' then
  local now = tonumber(ARGV[2])
  local pending = redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[2])
    + tonumber(redis.call('HGET', KEYS[11], 'all') or '0')
  local bucketed, oldest = bucketed_due(now)
  local due = redis.call('ZCOUNT', KEYS[1], '-inf', now) + redis.call('ZCOUNT', KEYS[2], '-inf', now)
    + bucketed
  local function consider(at)
    if at and at <= now and (oldest < 0 or at < oldest) then oldest = at end
  end
  -- Each ready set's first task is its earliest (one lookup each, whatever the set's size).
  for _, key in ipairs({KEYS[1], KEYS[2]}) do
    consider(tonumber(redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2]))
  end
  -- A lease that has ended is a scheduled, due task again (at its original due time).
  local ended = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
  for _, seq in ipairs(ended) do
    local rec = redis.call('HGET', KEYS[4], seq)
    if rec then
      local h = unpack_hdr(rec)
      pending = pending + 1
      if h.due <= now then
        due = due + 1
        consider(h.due)
      end
    end
  end
  local leased = redis.call('ZCOUNT', KEYS[3], '(' .. now, '+inf')
  return {pending, due, leased, redis.call('ZCARD', KEYS[6]), oldest}
elseif op == 'forecast' then
  local from, step, steps = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
  local out = {}
  for i = 0, steps - 1 do
    local lo = from + i * step
    local hi = '(' .. string.format('%d', lo + step)
    out[#out + 1] = redis.call('ZCOUNT', KEYS[1], lo, hi) + redis.call('ZCOUNT', KEYS[2], lo, hi)
  end
  -- Buckets: one inside a step counts whole; one across a step's edge is read task by task.
  local to = from + steps * step
  local function bin(at) return math.floor((at - from) / step) + 1 end
  -- Bucket `b` holds tasks due from its first minute on, within `bucket_span(b)` minutes; it
  -- is indexed by its promotion instant, at most 5 minutes before that.
  local first = string.format('%d', from - 3600000 - 300000)
  local buckets = redis.call('ZRANGEBYSCORE', KEYS[10], '(' .. first, '(' .. string.format('%d', to))
  for _, member in ipairs(buckets) do
    local b = tonumber(member)
    local lo = b * MINUTE_MS
    local hi = lo + bucket_span(b) * MINUTE_MS - 1
    if hi < from or lo >= to then
      -- outside the forecast
    elseif lo >= from and hi < to and bin(lo) == bin(hi) then
      out[bin(lo)] = out[bin(lo)] + tonumber(redis.call('HGET', KEYS[11], member) or '0')
    else
      for _, due in ipairs(bucketed_dues(b)) do
        if due >= from and due < to then out[bin(due)] = out[bin(due)] + 1 end
      end
    end
  end
  return out
elseif op == 'due' then
  -- How many tasks a claim now could take (scheduled and due, or leases ended), and the
  -- earliest instant a claim could return something.
  -- Buckets to promote count as their tasks: the claim there promotes them first.
  local now = tonumber(ARGV[2])
  local due = redis.call('ZCOUNT', KEYS[1], '-inf', now) + redis.call('ZCOUNT', KEYS[2], '-inf', now)
    + redis.call('ZCOUNT', KEYS[3], '-inf', now)
  for _, b in ipairs(redis.call('ZRANGEBYSCORE', KEYS[10], '-inf', now)) do
    due = due + tonumber(redis.call('HGET', KEYS[11], b) or '0')
  end
  -- The earliest instant matters only where nothing is due (the caller settles a stale hint).
  if due > 0 then return {due, -1} end
  return {due, earliest()}
elseif op == 'earliest' then
  return earliest()
end
return redis.error_reply('belfry: unknown read op ' .. tostring(op))
