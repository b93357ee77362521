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
-- A record: a fixed header (layout below, big-endian), the idempotency key, the headers,
-- then the payload from byte `payload_off` (0-based). Finished records drop the payload.
local HDR = '>BBBBI4I8I8I8BI8I4'
local HDR_LEN = 45
local SCHEDULED, LEASED, DONE, DEAD, CANCELLED, SKIPPED = 0, 1, 2, 3, 4, 5

local function unpack_hdr(rec)
  local h = {struct.unpack(HDR, rec)}
  h[12] = nil -- the position after the header
  return h
end
-- h: 1 version, 2 state, 3 priority, 4 payload kind, 5 attempts, 6 due, 7 lease deadline,
-- 8 lease id, 9 late kind, 10 late after ms, 11 payload offset
local function pack(rec, h)
  return struct.pack(HDR, h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9], h[10], h[11])
    .. string.sub(rec, HDR_LEN + 1)
end

local function ready_key(h)
  if h[3] == 0 then return KEYS[1] end
  return KEYS[2]
end

local function idem_key(rec)
  local len = struct.unpack('>I2', rec, HDR_LEN + 1)
  if len == 0 then return nil end
  return string.sub(rec, HDR_LEN + 3, HDR_LEN + 2 + len)
end

-- Ends the lease of every leased task whose deadline has come (at most `max`): scheduled
-- again, at its original due time.
local function expire(now, max)
  local ended = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, max)
  for _, seq in ipairs(ended) do
    local rec = redis.call('HGET', KEYS[4], seq)
    if rec then
      local h = unpack_hdr(rec)
      if h[2] == LEASED then
        h[2] = SCHEDULED
        h[7] = 0
        redis.call('HSET', KEYS[4], seq, pack(rec, h))
        redis.call('ZADD', ready_key(h), h[6], seq)
      end
    end
    redis.call('ZREM', KEYS[3], seq)
  end
end

-- A task reaches a final state: its record is kept (without payload) for the retention,
-- so reads and idempotency keys still find it, then forgotten.
local function finish(seq, rec, h, state, now)
  h[2] = state
  h[7] = 0
  local kept = string.sub(pack(rec, h), 1, h[11])
  redis.call('HSET', KEYS[4], seq, kept)
  redis.call('ZADD', KEYS[8], now, seq)
end

-- Forgets up to `max` tasks finished more than the retention ago: each call forgets at least
-- as many as it may finish, so finished records never pile up.
local function forget_old(now, retain_ms, max)
  local old = redis.call('ZRANGEBYSCORE', KEYS[8], '-inf', now - retain_ms, 'LIMIT', 0, max)
  for _, seq in ipairs(old) do
    local rec = redis.call('HGET', KEYS[4], seq)
    if rec then
      local key = idem_key(rec)
      if key and redis.call('HGET', KEYS[5], key) == seq then
        redis.call('HDEL', KEYS[5], key)
      end
      redis.call('HDEL', KEYS[4], seq)
    end
    redis.call('ZREM', KEYS[8], seq)
  end
end

-- The earliest instant a claim here could return something, or -1.
local function earliest()
  local best = -1
  for _, key in ipairs({KEYS[1], KEYS[2], KEYS[3]}) do
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
  if h[2] ~= LEASED or h[8] ~= lease or h[7] <= now then return 2 end
  redis.call('ZREM', KEYS[3], seq)
  return 0, rec, h
end
