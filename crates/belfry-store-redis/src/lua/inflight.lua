-- A queue's in-flight cap shared by every node. KEYS[1]: a sorted set of the queue's leases
-- (member: lease id; score: its deadline, in ms of the callers' clocks, as task leases are),
-- KEYS[2]: a flag that a claim found no room since the last release. Members whose deadline
-- passed are pruned before counting: a lease nobody ends (its node crashed) frees its room
-- when its task is due again.
-- ARGV[1] op, ARGV[2] now, then per op:
--   'reserve' token want cap until: grants min(want, cap - held), held by placeholder members
--     '~token:1..granted' until `until`; replies {granted, earliest deadline held or -1}.
--   'settle' token n, then lease/until pairs: the placeholders replaced by the leases.
-- `inflight_end.lua` ends and moves the leases' room as lease calls end and extend them.
local op, now = ARGV[1], tonumber(ARGV[2])
local set, starved = KEYS[1], KEYS[2]

-- The set outlives its last deadline by a minute, then goes by itself.
local function keep()
  local last = redis.call('ZRANGE', set, -1, -1, 'WITHSCORES')
  if last[2] then
    local ttl = math.min(math.max(tonumber(last[2]) - now, 0), 1e12) + 60000
    redis.call('PEXPIRE', set, string.format('%d', ttl))
  end
end

if op == 'reserve' then
  local token, want, cap, untl = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
  redis.call('ZREMRANGEBYSCORE', set, '-inf', now)
  local held = redis.call('ZCARD', set)
  local granted = math.max(0, math.min(want, cap - held))
  for k = 1, granted do
    redis.call('ZADD', set, untl, '~' .. token .. ':' .. k)
  end
  if granted < want then
    redis.call('SET', starved, '1', 'PX', 60000)
  end
  keep()
  local first = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
  local earliest = -1
  if first[2] then earliest = tonumber(first[2]) end
  return {granted, earliest}
elseif op == 'settle' then
  local token, n = ARGV[3], tonumber(ARGV[4])
  for k = 1, n do
    redis.call('ZREM', set, '~' .. token .. ':' .. k)
  end
  for i = 5, #ARGV - 1, 2 do
    if tonumber(ARGV[i + 1]) > now then
      redis.call('ZADD', set, ARGV[i + 1], ARGV[i])
    end
  end
  keep()
  return 0
end
return redis.error_reply('belfry: unknown in-flight op ' .. tostring(op))
