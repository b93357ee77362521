-- A queue's in-flight cap shared by every node. KEYS[1]: a sorted set of the queue's leases
-- (member: lease id; score: its deadline, in ms of the callers' clocks, as task leases are)
-- and of claims' reservations (member '~token:n', holding n places); KEYS[2]: the callers
-- waiting for room (see 'reserve'); KEYS[3]: the places reservations hold beyond their one
-- member each, so that held = members + KEYS[3]. Members whose deadline passed are pruned
-- before counting: a lease nobody ends (its node crashed) frees its room when its task is due
-- again, a reservation nobody settles at its deadline.
-- ARGV[1] op, ARGV[2] now, then per op:
--   'reserve' token want cap until who: grants min(want, cap - held), held until `until`;
--     replies {granted, earliest deadline held or -1}. A caller (`who`) granted nothing
--     waits in KEYS[2] (who -> now + WAIT_MS) until a reservation of its grants something;
--     callers that do not wait leave one place per waiter, so the node that frees room
--     (and asks again first) does not keep it from the others.
--   'settle' token n, then lease/until pairs: the reservation of n replaced by the leases.
-- `inflight_end.lua` ends and moves the leases' room as lease calls end and extend them.
local op, now = ARGV[1], tonumber(ARGV[2])
local WAIT_MS = 1000
local set, starved, extra = KEYS[1], KEYS[2], KEYS[3]

-- A member longer than `zset-max-listpack-value` (64 bytes), scored +inf: it keeps the set a
-- skiplist, whose adds and removes are O(log n), where a listpack's are O(n) (with it, what
-- the cap adds to Redis's CPU per task in claims of 100 halved: examples/inflight_cost.rs).
local SENTINEL = '~ this member keeps the set a skiplist, for O(log n) adds and removes ~~'

-- Runs `cmd key ...args` in calls of at most 1,000 arguments after the key (Lua's stack
-- bounds `unpack`), rather than one call per member.
local function each(cmd, args)
  for i = 1, #args, 1000 do
    redis.call(cmd, set, unpack(args, i, math.min(i + 999, #args)))
  end
end

-- The keys outlive their last deadline by a minute, then go by themselves.
local function keep()
  local last = redis.call('ZRANGE', set, -2, -2, 'WITHSCORES')
  if last[2] then
    local ttl = string.format('%d', math.min(math.max(tonumber(last[2]) - now, 0), 1e12) + 60000)
    redis.call('PEXPIRE', set, ttl)
    redis.call('PEXPIRE', extra, ttl)
  end
end

-- The places of a reservation member beyond its own (0 for a lease).
local function beyond(member)
  local n = string.match(member, '^~%d+:(%d+)$')
  if n then return tonumber(n) - 1 end
  return 0
end

if op == 'reserve' then
  local token, want, cap, untl, who = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6], ARGV[7]
  local gone = 0
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', set, '-inf', now)) do
    gone = gone + beyond(member)
  end
  if gone > 0 then redis.call('DECRBY', extra, gone) end
  redis.call('ZREMRANGEBYSCORE', set, '-inf', now)
  redis.call('ZADD', set, 'NX', '+inf', SENTINEL)
  local held = redis.call('ZCARD', set) - 1 + math.max(0, tonumber(redis.call('GET', extra) or '0'))
  redis.call('ZREMRANGEBYSCORE', starved, '-inf', now)
  local waiting = redis.call('ZSCORE', starved, who)
  local room = cap - held
  if not waiting then
    room = room - redis.call('ZCARD', starved)
  end
  local granted = math.max(0, math.min(want, room))
  if granted > 0 then
    redis.call('ZADD', set, untl, '~' .. token .. ':' .. granted)
    redis.call('INCRBY', extra, granted - 1)
    if waiting then redis.call('ZREM', starved, who) end
  elseif want > 0 then
    redis.call('ZADD', starved, now + WAIT_MS, who)
    redis.call('PEXPIRE', starved, WAIT_MS * 10)
  end
  keep()
  local first = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
  local earliest = -1
  if first[1] ~= SENTINEL then earliest = tonumber(first[2]) end
  return {granted, earliest}
elseif op == 'settle' then
  local token, n = ARGV[3], tonumber(ARGV[4])
  if n > 0 and redis.call('ZREM', set, '~' .. token .. ':' .. n) == 1 then
    redis.call('DECRBY', extra, n - 1)
  end
  redis.call('ZADD', set, 'NX', '+inf', SENTINEL)
  local adds = {}
  for i = 5, #ARGV - 1, 2 do
    if tonumber(ARGV[i + 1]) > now then
      adds[#adds + 1] = ARGV[i + 1]
      adds[#adds + 1] = ARGV[i]
    end
  end
  each('ZADD', adds)
  keep()
  return 0
end
return redis.error_reply('belfry: unknown in-flight op ' .. tostring(op))
