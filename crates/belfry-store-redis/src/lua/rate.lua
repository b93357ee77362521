-- A queue's rate limit shared by every node: a token bucket in one hash (KEYS[1]: tokens,
-- and the Redis server time of the last refill in microseconds), refilled by Redis's own
-- clock so nodes' clocks do not matter. ARGV: op ('take' | 'return'), count, rate per second,
-- burst. Replies the tokens granted (0 for 'return').
local op, count, rate, burst = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local saved = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(saved[1]) or burst
local at = tonumber(saved[2]) or now
if now > at then
  tokens = math.min(burst, tokens + (now - at) / 1000000 * rate)
end
local granted = 0
if op == 'take' then
  granted = math.min(count, math.floor(tokens))
  if granted < 0 then granted = 0 end
  tokens = tokens - granted
elseif op == 'return' then
  tokens = math.min(burst, tokens + count)
else
  return redis.error_reply('belfry: unknown rate op ' .. tostring(op))
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', string.format('%d', now))
-- A bucket untouched for long is full again: let it go.
redis.call('PEXPIRE', KEYS[1], math.floor(burst / rate * 1000) + 60000)
return granted
