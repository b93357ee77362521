-- Ends (ARGV[1] 'release') or moves ('extend') leases' room in a queue's in-flight set
-- (KEYS[1], with the no-room flag KEYS[2]; see inflight.lua), in the pipeline of the lease
-- scripts. Small, and sent whole (EVAL), so it never meets a node that lacks it. ARGV[2]:
-- now. release: ARGV[3] channel, ARGV[4] message, then lease ids; while nodes wait for room
-- (KEYS[2] holds them), PUBLISH channel message (a wake-up for every node). extend:
-- lease/until pairs; only a lease still live in the set moves. Replies how many changed.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local now, n = tonumber(ARGV[2]), 0
if ARGV[1] == 'release' then
  for i = 5, #ARGV, 1000 do
    n = n + redis.call('ZREM', KEYS[1], unpack(ARGV, i, math.min(i + 999, #ARGV)))
  end
  if n > 0 and redis.call('EXISTS', KEYS[2]) == 1 then redis.call('PUBLISH', ARGV[3], ARGV[4]) end
elseif ARGV[1] == 'extend' then
  for i = 3, #ARGV - 1, 2 do
    local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
    if score and tonumber(score) > now then
      redis.call('ZADD', KEYS[1], ARGV[i + 1], ARGV[i])
      local ttl = math.min(math.max(tonumber(ARGV[i + 1]) - now, 0), 1e12) + 60000
      if ttl > redis.call('PTTL', KEYS[1]) then
        redis.call('PEXPIRE', KEYS[1], string.format('%d', ttl))
      end
      n = n + 1
    end
  end
end
return n
