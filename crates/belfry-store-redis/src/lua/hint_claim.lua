-- A claim's two visits to a queue's hint (KEYS[1]: partition -> earliest work) and its
-- versions (KEYS[2]: partition -> how many times `hint.lua` lowered, or tried to lower, it).
--   'due' now -> {partition, version, ...} for every partition with work due by now
--   'settle' then per partition: partition, version read by 'due', earliest work ('-1':
--        none) -> how many entries were set
--
-- 'settle' sets a partition's entry to what the claim found only if its version is the one
-- read before the claim ran. Otherwise a put, a retry or a reschedule has called `hint.lua`
-- since, perhaps with work the claim did not see, and the entry (already lowered by that
-- call) stays: early at worst, which costs one claim that finds nothing and settles again.
-- This replaces reading every claimed partition again after setting its entry.
local op = ARGV[1]
if op == 'due' then
  local due = redis.call('ZRANGE', KEYS[1], '-inf', ARGV[2], 'BYSCORE')
  if #due == 0 then return {} end
  local out = {}
  for i = 1, #due, 500 do
    local some = {unpack(due, i, math.min(i + 499, #due))}
    local versions = redis.call('HMGET', KEYS[2], unpack(some))
    for j, p in ipairs(some) do
      out[#out + 1] = p
      out[#out + 1] = versions[j] or '0'
    end
  end
  return out
elseif op == 'settle' then
  local set = 0
  -- 500 partitions per round, so no call takes more arguments than Lua can unpack.
  for from = 2, #ARGV, 1500 do
    local parts = {}
    for i = from, math.min(from + 1499, #ARGV), 3 do parts[#parts + 1] = ARGV[i] end
    local versions = redis.call('HMGET', KEYS[2], unpack(parts))
    local adds, rems = {}, {}
    for k, p in ipairs(parts) do
      local i = from + (k - 1) * 3
      if (versions[k] or '0') == ARGV[i + 1] then
        local at = tonumber(ARGV[i + 2])
        if at < 0 then
          rems[#rems + 1] = p
        else
          adds[#adds + 1] = at
          adds[#adds + 1] = p
        end
      end
    end
    if #rems > 0 then redis.call('ZREM', KEYS[1], unpack(rems)) end
    if #adds > 0 then redis.call('ZADD', KEYS[1], unpack(adds)) end
    set = set + #rems + #adds / 2
  end
  return set
end
return redis.error_reply('belfry: unknown hint op ' .. tostring(op))
