-- host-prune: forget session hosts whose last heartbeat is older than the given age.
--
-- KEYS[1] hosts              <prefix>hosts
-- ARGV[1] stale after (ms)
--
-- Returns the ids removed.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local removed = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local ok, host = pcall(cjson.decode, all[i + 1])
  if not ok or type(host) ~= 'table' or type(host.heartbeatAt) ~= 'number'
      or now - host.heartbeatAt > tonumber(ARGV[1]) then
    redis.call('HDEL', KEYS[1], all[i])
    removed[#removed + 1] = all[i]
  end
end
return removed
